"""Scale-out on a real Ray cluster: two nodes on this machine (Ray's own cluster utility:
separate raylets, object stores, ports and temp dirs, one Docker engine), drivers run as a
user runs them (`python -m harness run --executor ray --ray-address ...`).

- the outcomes of `refunds` on the cluster equal a local run with the same seeds, slot for slot;
- a Ray worker killed mid-attempt, a node removed mid-attempt, a driver killed mid-run then
  resumed: every slot filled exactly once, the lost attempt stored as infra_error, no
  container of the run left running;
- an attempt whose node goes silent past its budget is presumed lost and rerun; the record
  that arrives afterwards is kept as late evidence and never counted.

Without Ray these tests skip on a developer's machine and fail under CI / HARNESS_REQUIRE_DOCKER.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.sandbox.owners import LABEL_ATTEMPT, LABEL_OWNER, LABEL_RUN
from harness.store.store import Store
from tests.conftest import missing

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.ray_cluster]  # `make test-ray`

TASKS = "already-refunded,duplicate-charge,partial-line-item"
SLOW_AGENT = "sh -c 'sleep 2; exec refundbot'"  # the reference agent, 2 s later: time to kill something mid-attempt


def _cluster(home: Path, nodes: int = 2):
    try:
        from ray.cluster_utils import Cluster
    except ImportError:
        missing("ray is not installed (pip install 'harness[ray]'; `make test` installs it)")
    old = {k: os.environ.get(k) for k in ("HARNESS_HOME", "RAY_USAGE_STATS_ENABLED")}
    os.environ.update(HARNESS_HOME=str(home), RAY_USAGE_STATS_ENABLED="0")  # what the nodes' workers inherit
    try:
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"harness_core": 1}, "include_dashboard": False})
        for _ in range(nodes - 1):
            c.add_node(num_cpus=1, resources={"harness_core": 1})
        c.wait_for_nodes()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return c


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, docker_client):
    c = _cluster(tmp_path_factory.mktemp("nodes"))
    yield c
    c.shutdown()


def harness(home: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HARNESS_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=timeout, env=env)


def start(home: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "HARNESS_HOME": str(home)}
    return subprocess.Popen([sys.executable, "-m", "harness", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def new_run(home: Path, timeout: float = 120) -> str:
    """The id of the run a driver just stored in ``home``'s store."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if (home / "harness.db").is_file():
            try:
                runs = Store.open(f"sqlite:///{home / 'harness.db'}", mode="ro").runs(1)
            except Exception:
                runs = []
            if runs:
                return runs[0].id
        time.sleep(0.1)
    raise AssertionError("the driver stored no run")


def running_container(client, home: Path, timeout: float = 120, where=lambda c: True):
    """The first running container of the run just started in ``home`` that ``where`` accepts."""
    run_id = new_run(home, timeout)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for c in client.containers.list(filters={"label": [f"{LABEL_RUN}={run_id}"], "status": "running"}):
            if where(c):
                return c
        time.sleep(0.1)
    raise AssertionError(f"no attempt container of run {run_id} started")


def attempts(home: Path, run_id: str):
    return Store.open(f"sqlite:///{home / 'harness.db'}", mode="ro").attempts(run_id)


def assert_exactly_once(home: Path, run_id: str, slots: int, client) -> list:
    atts = attempts(home, run_id)
    by_slot: dict = {}
    for a in atts:
        by_slot.setdefault((a.task_id, a.slot), []).append(a)
    assert len(by_slot) == slots, f"{len(by_slot)} slots have attempts, expected {slots}"
    for key, xs in by_slot.items():
        clean = [a for a in xs if a.verdict == "clean"]
        assert len(clean) <= 1, f"slot {key}: {len(clean)} clean attempts"
        if not clean:  # a busy host may still spend a budget: then visibly unmeasured, for the host, never lost
            last = max(xs, key=lambda a: a.attempt_no)
            assert "slot unmeasured" in (last.error or "") and all(r.startswith("host_") for r in last.reasons), \
                f"slot {key}: no clean attempt and not unmeasured for the host: {[(a.attempt_no, a.reasons) for a in xs]}"
        assert sorted(a.attempt_no for a in xs) == list(range(1, len(xs) + 1)), f"slot {key}: attempt numbers {[a.attempt_no for a in xs]}"
    left = client.containers.list(all=True, filters={"label": [f"{LABEL_RUN}={run_id}"]})
    assert left == [], f"containers of the run left: {[c.name for c in left]}"
    return atts


def outcomes(home: Path, run_id: str) -> dict:
    return {(a.task_id, a.slot): a.outcome for a in attempts(home, run_id) if a.verdict == "clean"}


PARITY = ",".join(sorted(p.stem for p in (Path(__file__).parent.parent / "harness" / "suites" / "refunds" / "tasks").glob("*.toml"))[:8])


def test_refunds_on_two_nodes_equals_a_local_run_slot_for_slot(cluster, tmp_path, docker_client):
    # one trial of 8 tasks on each side: both nodes get work, and every slot's seed gives the
    # same outcome as the local run's
    ray = harness(tmp_path, "run", "--suite", "refunds", "--tasks", PARITY, "--trials", "1", "--k", "1", "--executor", "ray",
                  "--ray-address", cluster.address, "--json")
    assert ray.returncode == 0, ray.stderr[-3000:]
    local = harness(tmp_path, "run", "--suite", "refunds", "--tasks", PARITY, "--trials", "1", "--k", "1", "--json")
    assert local.returncode == 0, local.stderr[-3000:]
    rid, lid = json.loads(ray.stdout)["run_id"], json.loads(local.stdout)["run_id"]
    atts = assert_exactly_once(tmp_path, rid, 8, docker_client)
    assert outcomes(tmp_path, rid) == outcomes(tmp_path, lid)
    nodes = {a.node.get("node_id") for a in atts}
    assert len(nodes) == 2 and "" not in nodes, f"attempts ran on {nodes}"
    for a in atts:
        assert a.node["executor"] == "ray" and a.node["cgroup_version"] and a.node["engine_version"] and a.node["image_inputs"]
        assert Path(a.artifacts, "stdout.txt").is_file(), "the node's artifacts did not reach the driver"
        assert a.artifacts.startswith(str(tmp_path / "runs")), a.artifacts
    store = Store.open(f"sqlite:///{tmp_path / 'harness.db'}", mode="ro")
    r, loc = store.get_run(rid), store.get_run(lid)
    assert r.executor == "ray" and len(r.nodes) == 2 and loc.executor == "local"
    assert r.identity_hash == loc.identity_hash, "the same eval on the same kind of machine must have one identity"
    shown = harness(tmp_path, "trials", rid, "--json")
    assert shown.returncode == 0 and all(row["node"] for row in json.loads(shown.stdout))


def test_a_worker_killed_mid_attempt_loses_no_slot_and_leaves_no_container(cluster, tmp_path, docker_client):
    p = start(tmp_path, "run", "--suite", "refunds", "--tasks", TASKS, "--trials", "1", "--k", "1", "--max-reruns", "8", "--executor", "ray",
              "--ray-address", cluster.address, "--agent-cmd", SLOW_AGENT, "--json")
    try:
        c = running_container(docker_client, tmp_path)
        run_id, victim, who = c.labels[LABEL_RUN], int(c.labels[LABEL_OWNER]), c.labels[LABEL_ATTEMPT]
        os.kill(victim, signal.SIGKILL)  # the Ray worker running the attempt; its container runs on
        out, err = p.communicate(timeout=600)
    finally:
        p.kill()
    assert p.returncode == 0, err[-3000:]
    atts = assert_exactly_once(tmp_path, run_id, 3, docker_client)
    task, slot, no = who.split("/")
    lost = [a for a in atts if (a.task_id, a.slot, a.attempt_no) == (task, int(slot), int(no))]
    assert len(lost) == 1 and lost[0].verdict == "discarded" and lost[0].reasons == ["infra_error"]
    assert lost[0].rules[0]["rule"] == "worker_lost" and str(victim) in lost[0].error
    # the next attempt on that core removed the dead worker's container before it started
    assert any("which died holding it" in (a.error or "") and c.name in (a.error or "") for a in atts), \
        [a.error for a in atts if a.error]


def _worker_node(cluster):
    return next(n for n in cluster.list_all_nodes() if n is not cluster.head_node)


def test_a_node_lost_mid_attempt_is_rerun_elsewhere(tmp_path, tmp_path_factory, docker_client):
    import psutil

    c = _cluster(tmp_path_factory.mktemp("nodes"))
    try:
        node = _worker_node(c)
        raylet = node.all_processes["raylet"][0].process.pid

        def on_that_node(ct) -> bool:
            try:
                return psutil.Process(int(ct.labels[LABEL_OWNER])).ppid() == raylet
            except (psutil.Error, ValueError):
                return False

        p = start(tmp_path, "run", "--suite", "refunds", "--tasks", TASKS, "--trials", "1", "--k", "1", "--max-reruns", "8", "--executor", "ray",
                  "--ray-address", c.address, "--agent-cmd", SLOW_AGENT, "--json")
        try:
            ct = running_container(docker_client, tmp_path, timeout=180, where=on_that_node)
            run_id, who = ct.labels[LABEL_RUN], ct.labels[LABEL_ATTEMPT]
            c.remove_node(node, allow_graceful=False)
            out, err = p.communicate(timeout=600)
        finally:
            p.kill()
        assert p.returncode == 0, err[-3000:]
        atts = assert_exactly_once(tmp_path, run_id, 3, docker_client)
        task, slot, no = who.split("/")
        lost = next(a for a in atts if (a.task_id, a.slot, a.attempt_no) == (task, int(slot), int(no)))
        assert lost.verdict == "discarded" and lost.reasons == ["infra_error"]
        assert lost.rules[0]["rule"] in ("node_lost", "worker_lost"), lost.rules
        later = [a for a in atts if a.started_at and a.started_at > lost.started_at]
        assert later and all(a.node["node_id"] == c.head_node.node_id for a in later), "attempts after the loss ran on the dead node"
    finally:
        c.shutdown()


def test_a_killed_driver_resumed_fills_every_slot_once(cluster, tmp_path, docker_client):
    p = start(tmp_path, "run", "--suite", "refunds", "--tasks", TASKS, "--trials", "1", "--k", "1", "--max-reruns", "8", "--executor", "ray",
              "--ray-address", cluster.address, "--agent-cmd", SLOW_AGENT)
    try:
        ct = running_container(docker_client, tmp_path)
        run_id = ct.labels[LABEL_RUN]
        time.sleep(0.5)
        p.send_signal(signal.SIGKILL)  # no clean-up at all: Ray ends the driver's workers, their containers stay
        p.wait(timeout=30)
    finally:
        p.kill()
    r = harness(tmp_path, "run", "--resume", run_id, "--ray-address", cluster.address, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    atts = assert_exactly_once(tmp_path, run_id, 3, docker_client)
    lost = [a for a in atts if a.reasons == ["controller_lost"]]
    assert len(lost) >= 1, "the attempt that was running when the driver died is not on record"
    assert Store.open(f"sqlite:///{tmp_path / 'harness.db'}", mode="ro").get_run(run_id).status == "complete"


def test_a_silent_node_is_presumed_lost_and_its_late_record_is_evidence_only(cluster, tmp_path, docker_client):
    """SIGSTOP the worker of a running attempt past the attempt's budget: the driver records
    it lost (no_result) and reruns the slot; SIGCONT: its record arrives late, is stored
    beside the run as evidence, and the slot still has exactly one counted attempt."""
    prof = tmp_path / "quick.toml"
    prof.write_text('cpus = 1.0\ncores = 1\nmemory = "512m"\npids = 256\n[tmpfs]\n"/work" = "64m"\n"/tmp" = "64m"\n'
                    "[timeouts]\nsetup = 5\nagent = 6\ngrade = 2\n")
    env_margin = {"HARNESS_RAY_MARGIN_S": "0"}  # budget = 5 + 6 + 2*2 = 15 s after the cores are leased
    os.environ.update(env_margin)
    try:
        p = start(tmp_path, "run", "--suite", "refunds", "--tasks", "already-refunded", "--trials", "1", "--k", "1",
                  "--profile", str(prof), "--executor", "ray", "--ray-address", cluster.address, "--agent-cmd", SLOW_AGENT, "--json")
    finally:
        os.environ.pop("HARNESS_RAY_MARGIN_S")
    try:
        ct = running_container(docker_client, tmp_path)
        run_id, worker = ct.labels[LABEL_RUN], int(ct.labels[LABEL_OWNER])
        os.kill(worker, signal.SIGSTOP)
        try:
            end = time.monotonic() + 60
            while time.monotonic() < end and not any(a.rules and a.rules[0].get("rule") == "no_result" for a in attempts(tmp_path, run_id)):
                time.sleep(0.5)
        finally:
            os.kill(worker, signal.SIGCONT)
        out, err = p.communicate(timeout=300)
    finally:
        p.kill()
    assert p.returncode == 0, err[-3000:]
    atts = assert_exactly_once(tmp_path, run_id, 1, docker_client)
    assert [a.rules[0]["rule"] for a in atts if a.verdict != "clean"] == ["no_result"]
    late = Store.open(f"sqlite:///{tmp_path / 'harness.db'}", mode="ro").late_attempts(run_id)
    assert len(late) == 1 and (late[0].task_id, late[0].slot, late[0].attempt_no) == ("already-refunded", 0, 1)
    assert json.loads(out)["attempts"]["total"] == 2, "the late record was counted as an attempt"


def test_doctor_checks_every_node_and_a_node_that_overstates_its_cores_refuses_the_run(cluster, tmp_path):
    r = harness(tmp_path, "doctor", "--executor", "ray", "--ray-address", cluster.address, "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    groups = json.loads(r.stdout)
    nodes = [k for k in groups if k != "cluster"]
    assert len(nodes) == 2 and {c["name"] for c in groups["cluster"]} >= {"ray", "cluster"}
    for n in nodes:
        checks = {c["name"]: c["status"] for c in groups[n]}
        assert checks["counters"] == "ok" and checks["envelope read-back"] == "ok" and checks["harness_core"] == "ok", groups[n]
    old = os.environ.get("HARNESS_HOME")
    os.environ["HARNESS_HOME"] = str(tmp_path / "nodes")
    try:
        bad = cluster.add_node(num_cpus=1, resources={"harness_core": 4})  # this machine leases 1 core
        cluster.wait_for_nodes()
    finally:
        if old is None:
            os.environ.pop("HARNESS_HOME")
        else:
            os.environ["HARNESS_HOME"] = old
    try:
        r = harness(tmp_path, "doctor", "--executor", "ray", "--ray-address", cluster.address)
        assert r.returncode == 1 and "offers 4 but has 1 cores to lease" in " ".join(r.stdout.split()), r.stdout[-3000:]
        r = harness(tmp_path, "run", "--suite", "refunds", "--tasks", "already-refunded", "--trials", "1", "--k", "1",
                    "--executor", "ray", "--ray-address", cluster.address)
        assert r.returncode == 2 and f"({bad.node_id[:12]}): offers 4 harness_core but has only 1 cores to lease" in r.stderr, r.stderr
        assert not (tmp_path / "harness.db").exists() or Store.open(f"sqlite:///{tmp_path / 'harness.db'}", mode="ro").runs(5) == []
    finally:
        cluster.remove_node(bad)
