"""Network policies against real containers: what an attempt can reach under `gateway`,
`allowlist` and `bridge`, through `harness run` as a user runs it.

Each test writes a one-task suite whose agent (tests/netprobe.py) tries a list of targets
and prints what happened; the test upstream (tests/testupstream.py, a real HTTP server on
this host — not a model) stands in for a provider and doubles as "a service the host
listens on". Another attempt is stood in for by a container on a network of its own.
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import psutil
import pytest

from harness.store.store import Store
from conftest import run_cli
from testupstream import TestUpstream

pytestmark = pytest.mark.docker
HERE = Path(__file__).parent


def _host_ips() -> list[str]:
    ips = []
    for addrs in psutil.net_if_addrs().values():
        ips += [a.address for a in addrs if a.family == socket.AF_INET and not a.address.startswith("127.")]
    return ips


def _suite(tmp: Path, probe: dict) -> Path:
    root = tmp / "netprobe"
    (root / "tasks").mkdir(parents=True)
    (root / "agent").mkdir()
    shutil.copy(HERE / "netprobe.py", root / "agent" / "netprobe.py")
    (root / "schema.sql").write_text("CREATE TABLE t (x INTEGER);\n")
    (root / "suite.toml").write_text(
        'name = "netprobe"\nimage = "harness/sandbox:latest"\ndockerfile = "Dockerfile"\n'
        'agent_cmd = ["python3", "/harness/agent/netprobe.py"]\nagent_dir = "agent"\n'
        'trials = 1\nk = [1]\nmax_reruns = 0\nstate_sql = ["schema.sql"]\n'
        f"[agent_env]\nPROBE = '{json.dumps(probe)}'\n")
    (root / "Dockerfile").write_text("ARG BASE=harness/sandbox:latest\nFROM ${BASE}\n")
    (root / "tasks" / "probe.toml").write_text('id = "probe"\ntitle = "Probe the network"\nprompt = "probe the network"\nunchanged = ["t"]\n')
    return root


def _profile(tmp: Path, network: str, allow: list[str] | None = None) -> Path:
    text = (HERE.parent / "sandboxes" / "standard.toml").read_text()
    text = text.replace('network = "none"', f'network = "{network}"' + (f"\nallow = {json.dumps(allow)}" if allow else ""))
    p = tmp / f"{network}.toml"
    p.write_text(text)
    return p


@pytest.fixture()
def other_attempt(docker_client):
    """A container on a private network of its own, listening on 8000: another attempt."""
    net = docker_client.networks.create("harness-test-other", driver="bridge", internal=True,
                                        labels={"dev.harness.test": "1"})
    c = docker_client.containers.run("harness/sandbox:latest", ["python3", "-m", "http.server", "8000"], detach=True,
                                     network="harness-test-other", labels={"dev.harness.test": "1"})
    c.reload()
    ip = c.attrs["NetworkSettings"]["Networks"]["harness-test-other"]["IPAddress"]
    bridge_peer = docker_client.containers.run("harness/sandbox:latest", ["python3", "-m", "http.server", "8000"], detach=True,
                                               labels={"dev.harness.test": "1"})
    bridge_peer.reload()
    peer_ip = bridge_peer.attrs["NetworkSettings"]["IPAddress"]
    try:
        yield ip, peer_ip
    finally:
        c.remove(force=True)
        bridge_peer.remove(force=True)
        net.remove()


def _run(tmp: Path, suite: Path, *args: str) -> tuple[dict, object, list]:
    res = run_cli(tmp, "run", "--suite", str(suite), "--json", *args)
    assert res.returncode in (0, 1), res.stderr[-3000:]
    summary = json.loads(res.stdout)
    store = Store.open(f"sqlite:///{tmp / 'home' / 'harness.db'}")
    attempts = store.attempts(summary["run_id"])
    # what the probe saw does not depend on the SLA verdict (a busy host may discard the attempt)
    ran = [a for a in attempts if a.exit_code == 0]
    assert ran, [(a.reasons, a.error) for a in attempts]
    seen = json.loads((Path(ran[-1].artifacts) / "stdout.txt").read_text())
    return seen, ran[-1], attempts


def _refused(result: str) -> bool:
    return result != "connected"


def test_gateway_policy_reaches_the_gateway_and_nothing_else(tmp_path, docker_client, other_attempt):
    other_ip, peer_ip = other_attempt
    with TestUpstream() as up:
        host_targets = [["172.17.0.1", up.port], *[[ip, up.port] for ip in _host_ips()]]
        probe = {"tcp": [*host_targets, [other_ip, 8000], [peer_ip, 8000], ["1.1.1.1", 443], ["harness-gateway", 3128]],
                 "dns": ["example.com", "pypi.org", "harness-gateway"], "calls": ["test-echo", "test-nousage"],
                 "gw_ports": [up.port]}
        seen, att, _ = _run(tmp_path, _suite(tmp_path, probe), "--network", "gateway",
                            "--upstream", f"openai=http://host.docker.internal:{up.port}/v1")
        # the gateway answered both calls; the test upstream saw exactly those two, without the token
        assert [c["status"] for c in seen["calls"]] == [200, 200], seen["calls"]
        assert len(up.requests) == 2, up.requests
        assert all("authorization" not in r["headers"] for r in up.requests), "no key given: nothing to inject"
        reported = up.reported
    # nothing else: host services (every address), other attempts, the internet, outside names
    for target, result in seen["tcp"].items():
        if target.startswith("harness-gateway"):
            continue  # the proxy port answers (and refuses a `gateway` attempt: see the allowlist test)
        assert _refused(result), f"{target} reachable under gateway: {result}"
    assert seen["dns"]["harness-gateway"][0].isdigit()
    assert not seen["dns"]["example.com"][0].isdigit() and not seen["dns"]["pypi.org"][0].isdigit(), seen["dns"]
    # tokens recorded equal what the upstream reported; null stays null
    calls = att.model_calls
    assert [c["model"] for c in calls] == ["test-echo", "test-nousage"]
    echo = reported[0]
    assert calls[0]["tokens_in"] == echo["prompt_tokens"] and calls[0]["tokens_out"] == echo["completion_tokens"]
    assert calls[0]["tokens_cached"] == echo["prompt_tokens_details"]["cached_tokens"]
    assert reported[1] is None and calls[1]["tokens_in"] is None and calls[1]["tokens_out"] is None
    assert att.upstream["calls"] == 2 and att.upstream["calls_without_usage"] == 1
    assert att.upstream["tokens_in"] == echo["prompt_tokens"]
    assert att.envelope["network"] == "gateway"


def test_allowlist_admits_named_hosts_and_logs_every_connection(tmp_path, docker_client):
    with TestUpstream() as up, TestUpstream() as other:
        allowed = f"http://host.docker.internal:{up.port}/v1/models"
        refused_port = f"http://host.docker.internal:{other.port}/v1/models"
        probe = {"proxy": [allowed, refused_port, "https://example.org/", "http://169.254.169.254/latest/meta-data/"],
                 "tcp": [["172.17.0.1", up.port]]}
        prof = _profile(tmp_path, "allowlist", [f"host.docker.internal:{up.port}"])
        seen, att, _ = _run(tmp_path, _suite(tmp_path, probe), "--profile", str(prof))
        assert seen["proxy"][allowed] == 200, seen
        assert len(up.requests) == 1 and not other.requests
    assert seen["proxy"][refused_port] == 403 and _refused(seen["tcp"][f"172.17.0.1:{up.port}"])
    assert "HTTPS_PROXY" in seen["env"]
    ev = {(e["host"], e["port"]): e for e in att.egress}
    assert ev[("host.docker.internal", up.port)]["allowed"] and ev[("host.docker.internal", up.port)]["rule"]
    for key in (("host.docker.internal", other.port), ("example.org", 443), ("169.254.169.254", 80)):
        assert key in ev and not ev[key]["allowed"] and ev[key]["reason"], (key, att.egress)
    assert att.egress_summary == {"allowed": 1, "refused": 3, "dropped": 0}


def test_bridge_reaches_out_but_never_the_host_or_other_attempts(tmp_path, docker_client, other_attempt):
    other_ip, peer_ip = other_attempt
    with TestUpstream() as up:
        probe = {"tcp": [["172.17.0.1", up.port], *[[ip, up.port] for ip in _host_ips()], [other_ip, 8000], [peer_ip, 8000],
                         ["169.254.169.254", 80]], "gw_ports": [up.port, 22]}
        seen, att, _ = _run(tmp_path, _suite(tmp_path, probe), "--network", "bridge")
        assert not up.requests
    assert seen["default_route"] is True, "bridge is the policy with a way out"
    for target, result in seen["tcp"].items():
        assert _refused(result), f"{target} reachable under bridge: {result}"
    assert att.envelope["network"] == "bridge"
    # the run's firewall rules and network are gone with it
    assert not docker_client.networks.list(filters={"label": f"dev.harness.run={att.run_id}"})


def test_a_gateway_that_died_is_started_again(docker_client):
    from harness.sandbox.gateway import Gateway, new_token

    gw = Gateway(docker_client, "rtest-revive-0001", [0], {"concurrency": 2}, {"openai": ("http://127.0.0.1:9/v1", None)})
    net = docker_client.networks.create("harness-test-revive", driver="bridge", internal=True, labels={"dev.harness.test": "1"})
    try:
        gw.start()
        assert not gw.revive(), "a live gateway is left alone"
        docker_client.api.kill(gw.container.id)
        assert not gw.alive() and gw.revive() and gw.restarts == 1
        ip = gw.attach(net.name)
        tok = new_token("rtest-revive-0001")
        gw.register(tok, "t/0/1", "gateway", [], ip)
        assert gw.close(tok) == ([], [], 0, 0)
        gw.detach(net.name)
    finally:
        gw.stop()
        net.remove()
    assert not docker_client.containers.list(all=True, filters={"label": "dev.harness.run=rtest-revive-0001"})


def test_a_call_in_flight_when_the_agent_times_out_is_waiting_time(tmp_path, docker_client):
    with TestUpstream() as up:
        text = (HERE.parent / "sandboxes" / "standard.toml").read_text().replace("agent = 60", "agent = 3")
        prof = tmp_path / "short.toml"
        prof.write_text(text)
        res = run_cli(tmp_path, "run", "--suite", str(_suite(tmp_path, {"calls": ["test-slow-8"]})), "--json", "--profile", str(prof),
                      "--network", "gateway", "--upstream", f"openai=http://host.docker.internal:{up.port}/v1")
    assert res.returncode in (0, 1), res.stderr[-2000:]
    (a, *_) = Store.open(f"sqlite:///{tmp_path / 'home' / 'harness.db'}").attempts(json.loads(res.stdout)["run_id"])
    assert a.timed_out
    (call,) = a.model_calls
    assert call["error"] == "cut_off" and call["latency_s"] >= 2.0
    assert a.upstream["wait_s"] >= 2.0 and a.upstream["cut_off"] == 1
    if a.verdict == "clean":
        assert "waiting on the model" in a.grade_reason


def test_a_key_the_provider_refuses_is_the_runs_setup_not_the_agents_failure(tmp_path, docker_client):
    with TestUpstream(key="sk-the-right-key-0000") as up:  # the run passes no key: every call is answered 401
        seen, a, attempts = _run(tmp_path, _suite(tmp_path, {"calls": ["test-echo"]}), "--network", "gateway",
                                 "--upstream", f"openai=http://host.docker.internal:{up.port}/v1")
    assert seen["calls"][0]["status"] == 401
    assert all(x.verdict == "discarded" and "upstream_auth" in x.reasons for x in attempts), [x.reasons for x in attempts]
    assert a.upstream["auth_errors"] == 1
