"""The run's model gateway container, and the run's `bridge` network kept away from the host.

:class:`Gateway` starts ``harness/gateway:latest`` once per run on the controller's reserved
cores (never an attempt's), with the harness's own ``gateway_server.py`` copied in. It is on
the engine's default bridge (its way to the providers) and is connected to each attempt's
private network under the name ``harness-gateway`` while that attempt runs. The controller
talks to its admin port through the host's loopback only; provider keys travel that way
(never in its environment, so never in ``docker inspect``) and live in its memory only.

:class:`EgressNetwork` is the run's network for the ``bridge`` policy: a user-defined bridge
with inter-container traffic off, plus host firewall rules (set by a short-lived helper
container with the host's network namespace, so only the engine is needed) that refuse
traffic from it to the host itself and to private, link-local and shared address ranges.
"""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import tarfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from harness.model.errors import SandboxError
from harness.model.gateway import EgressEvent, ModelCall
from harness.sandbox.images import GATEWAY_IMAGE, ensure_local_base, host_ca_bundle, image_id
from harness.sandbox import seccomp
from harness.sandbox.owners import LABEL, LABEL_HOST, LABEL_OWNER, LABEL_RUN, controller_host

GATEWAY_NAME = "harness-gateway"  # the gateway's host name on every attempt network
API_PORT, PROXY_PORT, ADMIN_PORT = 8080, 3128, 8700
APP_DIR = "/opt/harness-gateway"
PRIVATE_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10",
                  "192.0.0.0/24", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4")


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime = len(data), 0o444, int(time.time())
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _labels(run_id: str, role: str) -> dict[str, str]:
    # the owner's host too: a controller in another pid namespace never takes a live run's gateway for a dead one's
    return {LABEL: "1", LABEL_OWNER: str(os.getpid()), LABEL_HOST: controller_host(), LABEL_RUN: run_id, "dev.harness.role": role}


class Gateway:
    """One run's gateway (see the module docstring)."""

    def __init__(self, client: docker.DockerClient, run_id: str, cpuset: list[int], limits: dict[str, Any],
                 providers: dict[str, tuple[str, str | None]]):
        self.client = client
        self.run_id = run_id
        self.cpuset = cpuset
        self.limits = limits
        self.providers = providers  # name -> (base URL, key or None)
        self.admin_token = secrets.token_hex(16)
        self.container: Any = None
        self.admin_url = ""
        self.name = f"harness-gw-{run_id[:24]}"
        self.restarts = 0
        self._lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------
    def start(self, log: Any = None) -> None:
        if image_id(self.client, GATEWAY_IMAGE) is None:
            ensure_local_base(self.client, GATEWAY_IMAGE, log=log)
        here = Path(__file__).resolve().parent
        files = {"gateway_server.py": (here / "gateway_server.py").read_bytes(),
                 "egress.py": (here.parent / "model" / "egress.py").read_bytes()}
        files["admin-token"] = self.admin_token.encode()  # a file, not the environment (which `docker inspect` shows)
        env: dict[str, str] = {}
        ca = host_ca_bundle()
        if ca:
            files["ca.pem"] = ca  # the controller's trust (a corporate proxy's CA included)
            env["SSL_CERT_FILE"] = f"{APP_DIR}/ca.pem"
        try:
            self._uplink()
            self.container = self.client.containers.create(
                GATEWAY_IMAGE, name=self.name, detach=True, labels=_labels(self.run_id, "gateway"), environment=env or None,
                network=self.uplink_name,
                cpuset_cpus=",".join(map(str, self.cpuset)), mem_limit="1g", memswap_limit="1g", pids_limit=4096,
                read_only=False, cap_drop=["ALL"], security_opt=[seccomp.security_opt(), "no-new-privileges"], ports={f"{ADMIN_PORT}/tcp": ("127.0.0.1", None)},
                extra_hosts={"host.docker.internal": "host-gateway"}, sysctls={"net.ipv4.ip_forward": "0"},
                log_config={"type": "json-file", "config": {"max-size": "1m"}}, stop_signal="SIGKILL")
            self.container.put_archive(APP_DIR, _tar(files))  # root-owned, read-only to the gateway (nobody)
            self.container.start()
            self.container.reload()
            port = self.container.attrs["NetworkSettings"]["Ports"][f"{ADMIN_PORT}/tcp"][0]["HostPort"]
        except (docker.errors.DockerException, requests.RequestException, KeyError, IndexError, TypeError) as e:
            self.stop()
            raise SandboxError(f"the model gateway could not start: {str(e)[:300]}") from None
        self.admin_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                self._admin("GET", "/admin/health")
                break
            except SandboxError:
                if time.monotonic() > deadline:
                    tail = self.logs()
                    self.stop()
                    raise SandboxError(f"the model gateway did not answer within 20 s: {tail}") from None
                time.sleep(0.1)
        self._admin("POST", "/admin/config", {
            "providers": {n: {"base": b, "key": k} for n, (b, k) in self.providers.items()}, "limits": self.limits})

    def _uplink(self) -> None:
        """The gateway's own way out: a network of its own (no other container on it, inter-container
        traffic off), so nothing but the host reaches its admin port and nothing but attempts its API."""
        self.uplink_name = f"harness-uplink-{self.run_id[:24]}"
        if any(n.name == self.uplink_name for n in self.client.networks.list(names=[self.uplink_name])):
            return
        self.client.networks.create(self.uplink_name, driver="bridge", labels=_labels(self.run_id, "uplink"),
                                    options={"com.docker.network.bridge.enable_icc": "false"})

    def alive(self) -> bool:
        try:
            return bool(self.container is not None and self.client.api.inspect_container(self.container.id)["State"]["Running"])
        except (docker.errors.DockerException, requests.RequestException, KeyError):
            return False

    def revive(self) -> bool:
        """Start the gateway again if it died (its attempts in flight lose their records and
        are discarded; the next ones get the new one). True when it was restarted."""
        with self._lock:
            if self.alive():
                return False
            self.stop()
            self.admin_token = secrets.token_hex(16)
            self.start()
            self.restarts += 1
            return True

    def logs(self) -> str:
        try:
            return self.container.logs(tail=5).decode(errors="replace").strip()[-400:]
        except Exception:
            return ""

    def stop(self) -> bool:
        if self.container is None:
            return True
        try:
            self.container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except (docker.errors.DockerException, requests.RequestException):
            return False
        self.container = None
        try:
            name = getattr(self, "uplink_name", "")
            for n in self.client.networks.list(names=[name]) if name else []:
                if n.name == name:
                    n.remove()
        except (docker.errors.DockerException, requests.RequestException):
            pass  # the run's sweep removes it
        return True

    # -- the admin API ---------------------------------------------------------
    def _admin(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.admin_url + path, data=data, method=method,
                                     headers={"X-Harness-Admin": self.admin_token, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - our own loopback port
                data = r.read(MAX_ADMIN_REPLY + 1)
            if len(data) > MAX_ADMIN_REPLY:
                raise SandboxError(f"gateway admin {path}: reply over {MAX_ADMIN_REPLY >> 20} MiB")
            return json.loads(data)
        except urllib.error.HTTPError as e:
            raise SandboxError(f"gateway admin {path}: HTTP {e.code} {e.read(300).decode(errors='replace')}") from None
        except (OSError, ValueError) as e:
            raise SandboxError(f"gateway admin {path}: {type(e).__name__}: {e}") from None

    def attach(self, network: str) -> str:
        """Connect the gateway to an attempt's private network; its address there."""
        try:
            self.client.api.connect_container_to_network(self.container.id, network, aliases=[GATEWAY_NAME])
            attrs = self.client.api.inspect_container(self.container.id)  # a fresh document: workers attach at once
            return str(attrs["NetworkSettings"]["Networks"][network]["IPAddress"])
        except (docker.errors.DockerException, requests.RequestException, KeyError) as e:
            raise SandboxError(f"the model gateway could not join the attempt's network: {str(e)[:200]}") from None

    def detach(self, network: str) -> None:
        try:
            self.client.api.disconnect_container_from_network(self.container.id, network, force=True)
        except (docker.errors.DockerException, requests.RequestException):
            pass  # the network's removal (or the sweep) takes it along

    def register(self, token: str, attempt: str, policy: str, allow: list[str], ip: str) -> None:
        self._admin("POST", "/admin/attempts", {"token": token, "attempt": attempt, "policy": policy, "allow": allow, "ip": ip})

    def close(self, token: str) -> tuple[list[ModelCall], list[EgressEvent], int, int]:
        """End an attempt's token; its calls and egress log (validated), and how many were dropped."""
        out = self._admin("POST", "/admin/attempts/close", {"token": token})
        calls, bad_c = _valid(ModelCall, out.get("calls", []))
        egress, bad_e = _valid(EgressEvent, out.get("egress", []))
        return calls, egress, int(out.get("dropped_calls", 0)) + bad_c, int(out.get("dropped_egress", 0)) + bad_e

    def ping(self) -> None:
        """Tell the gateway the controller is alive (it exits after two minutes without a word)."""
        try:
            self._admin("GET", "/admin/health", timeout=5)
        except SandboxError:
            pass


MAX_ADMIN_REPLY = 16 << 20  # what the controller reads of one gateway reply (2000 capped records fit many times)


def _valid(model: Any, items: Any) -> tuple[list[Any], int]:
    """Records that validate, and how many did not (counted as dropped: one bad record never
    loses the others). A record whose strings an agent shaped (a model name with a lone
    surrogate, one longer than its field) is kept with those strings cleaned and cut: dropping
    it would hide the call, and its 429, from the SLA rules."""
    out, bad = [], 0
    for item in items[:5000] if isinstance(items, list) else []:
        try:
            out.append(model.model_validate(item))
        except ValueError:
            try:
                out.append(model.model_validate(_cleaned(model, item)))
            except ValueError:
                bad += 1
    return out, bad


_SURROGATE = re.compile("[\ud800-\udfff]")


def _cleaned(model: Any, item: Any) -> Any:
    """``item`` with every string made valid UTF-8 (a lone surrogate becomes U+FFFD) and cut to
    its field's max_length; anything else as it was (and still validated)."""
    if not isinstance(item, dict):
        return item
    out = dict(item)
    for name, field in model.model_fields.items():
        v = out.get(name)
        if isinstance(v, str):
            v = _SURROGATE.sub("\ufffd", v)
            cap = next((m.max_length for m in field.metadata if getattr(m, "max_length", None) is not None), None)
            out[name] = v[:cap] if cap is not None else v
    return out


def new_token(run_id: str) -> str:
    """A per-attempt token: useless outside this run's gateway, and there only while the attempt runs."""
    return f"hx-{run_id[-8:]}-{secrets.token_urlsafe(24)}"


class EgressNetwork:
    """The run's network for attempts under ``bridge`` (see the module docstring)."""

    def __init__(self, client: docker.DockerClient, run_id: str, nameservers: list[str]):
        self.client = client
        self.run_id = run_id
        self.ifname = "hx" + secrets.token_hex(5)
        self.name = f"harness-egress-{run_id[:24]}"
        self.nameservers = nameservers
        self.net: Any = None

    def create(self) -> None:
        self.sweep_stale()
        try:
            self.net = self.client.networks.create(
                self.name, driver="bridge", labels=_labels(self.run_id, "egress"),
                options={"com.docker.network.bridge.enable_icc": "false", "com.docker.network.bridge.name": self.ifname})
        except (docker.errors.DockerException, requests.RequestException) as e:
            raise SandboxError(f"the engine refused the run's bridge network: {str(e)[:200]}") from None
        try:
            self._firewall("-I")
        except SandboxError:
            self.remove()
            raise

    def _rules(self) -> list[list[str]]:
        tag = ["-m", "comment", "--comment", f"harness:{self.run_id}"]
        rules = [["INPUT", "-i", self.ifname, *tag, "-j", "DROP"],  # the host itself, on any of its addresses
                 ["DOCKER-USER", "-i", self.ifname, "-o", self.ifname, *tag, "-j", "DROP"]]  # other attempts
        rules += [["DOCKER-USER", "-i", self.ifname, "-d", r, *tag, "-j", "DROP"] for r in PRIVATE_RANGES]
        for ns in self.nameservers:  # the host's resolvers stay reachable (names resolve), port 53 only
            rules += [["DOCKER-USER", "-i", self.ifname, "-d", ns, "-p", p, "--dport", "53", *tag, "-j", "RETURN"] for p in ("udp", "tcp")]
        return rules

    def _firewall(self, op: str) -> None:
        script = "set -e\n" + "\n".join("iptables -w 5 " + " ".join([op, *r]) for r in self._rules())
        if op == "-D":
            script = script.replace("set -e\n", "")
        self._helper(script)

    def _helper(self, script: str) -> str:
        if image_id(self.client, GATEWAY_IMAGE) is None:
            ensure_local_base(self.client, GATEWAY_IMAGE)
        try:
            out = self.client.containers.run(GATEWAY_IMAGE, ["sh", "-c", script], network_mode="host", user="0:0", remove=True,
                                              cap_drop=["ALL"], cap_add=["NET_ADMIN", "NET_RAW"], labels=_labels(self.run_id, "firewall"),
                                              security_opt=[seccomp.security_opt(), "no-new-privileges"],
                                              stderr=True, stdout=True)
        except docker.errors.ContainerError as e:
            raise SandboxError(f"could not set the firewall rules that keep `bridge` attempts off the host: "
                               f"{(e.stderr or b'').decode(errors='replace')[-300:]}") from None
        except (docker.errors.DockerException, requests.RequestException) as e:
            raise SandboxError(f"could not run the firewall helper: {str(e)[:200]}") from None
        return out.decode(errors="replace") if isinstance(out, bytes) else str(out)

    def sweep_stale(self) -> None:
        """Remove the firewall rules of runs whose bridge network is gone (a controller killed mid-run)."""
        try:
            listing = self._helper("iptables -w 5 -S INPUT; iptables -w 5 -S DOCKER-USER")
            live = {n.attrs.get("Options", {}).get("com.docker.network.bridge.name") for n in self.client.networks.list()}
        except (SandboxError, docker.errors.DockerException, requests.RequestException):
            return
        stale = []
        for line in listing.splitlines():
            parts = line.split()
            if len(parts) < 4 or parts[0] != "-A" or "harness:" not in line or "-i" not in parts:
                continue
            ifname = parts[parts.index("-i") + 1]
            if ifname.startswith("hx") and ifname not in live:
                stale.append("iptables -w 5 -D " + " ".join(parts[1:]))
        if stale:
            try:
                self._helper("\n".join(stale))
            except SandboxError:
                pass

    def remove(self) -> None:
        if self.net is None:
            return
        try:
            self._firewall("-D")
        except SandboxError:
            pass  # the sweep removes rules whose network is gone
        try:
            self.net.remove()
        except (docker.errors.DockerException, requests.RequestException):
            pass
        self.net = None


def host_nameservers() -> list[str]:
    """IPv4 nameservers of the host's resolv.conf (what the engine's resolver forwards to)."""
    out = []
    try:
        for line in Path("/etc/resolv.conf").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver" and parts[1].count(".") == 3 and not parts[1].startswith("127."):
                out.append(parts[1])
    except OSError:
        pass
    return out


def firewall_check(client: docker.DockerClient) -> str | None:
    """Why the `bridge` policy cannot be kept off the host here (None when it can): the
    firewall helper must run with NET_ADMIN in the host's network namespace and find the
    engine's DOCKER-USER chain (an engine with iptables disabled, or rootless, has none)."""
    probe = EgressNetwork(client, "doctor", [])
    try:
        probe._helper("iptables -w 5 -S DOCKER-USER >/dev/null && iptables -w 5 -S INPUT >/dev/null")
    except SandboxError as e:
        return str(e)
    return None
