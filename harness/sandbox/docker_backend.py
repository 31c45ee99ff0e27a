"""The Docker sandbox backend: sandboxes, per-attempt networks, and cleaning up after
controllers that died (every container and network the harness makes is labelled)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

from harness.model.errors import EngineError, SandboxError
from harness.sandbox import seccomp
from harness.sandbox.base import Network, SandboxBackend, SandboxSpec
from harness.sandbox.docker_sandbox import LIVE, PENDING, DockerSandbox, remove_all_live, retry_removals
from harness.sandbox.owners import LABEL, LABEL_HOST, LABEL_OWNER, LABEL_RUN, controller_host, owner_dead, pid_alive, sweep_input_folders


def _labels(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {LABEL: "1", LABEL_OWNER: str(os.getpid()), LABEL_HOST: controller_host(), **(extra or {})}


class DockerNetwork(Network):
    """A user-defined bridge network marked internal: no route out, names resolve inside."""

    def __init__(self, client: docker.DockerClient, labels: dict[str, str]):
        self.client = client
        self.name = f"harness-net-{uuid.uuid4().hex[:12]}"
        try:
            # internal: no route out; inhibit_ipv4: the host has no address on it either, so
            # nothing listening on the host (on any of its addresses) is reachable from here
            self.net = client.networks.create(self.name, driver="bridge", internal=True, labels=_labels(labels),
                                              options={"com.docker.network.bridge.inhibit_ipv4": "true"})
        except (docker.errors.DockerException, requests.RequestException) as e:
            raise SandboxError(f"the engine refused a private network for the attempt: {str(e)[:200]}") from None

    def remove(self) -> bool:
        for _ in range(3):
            try:
                self.net.remove()
                return True
            except docker.errors.NotFound:
                return True
            except (docker.errors.DockerException, requests.RequestException):
                continue
        return False


class DockerBackend(SandboxBackend):
    """Sandboxes as Docker containers on the engine ``client`` talks to."""

    def __init__(self, client: docker.DockerClient, inputs_root: Path | None = None):
        self.client = client
        self.inputs_root = inputs_root

    def sandbox(self, spec: SandboxSpec) -> DockerSandbox:
        if spec.inputs_root is None and self.inputs_root is not None:
            spec = SandboxSpec(**{**spec.__dict__, "inputs_root": self.inputs_root})
        return DockerSandbox(self.client, spec)

    def network(self, labels: dict[str, str]) -> DockerNetwork:
        return DockerNetwork(self.client, labels)

    def sweep_dead_owners(self) -> list[str]:
        try:
            removed = sweep_containers(self.client, only_dead_owners=True)
            removed += sweep_networks(self.client, only_dead_owners=True)
        except (docker.errors.DockerException, requests.RequestException, OSError) as e:
            raise EngineError(f"the engine failed while removing what dead controllers left behind: {str(e)[:200]}; "
                              "check it with `harness doctor`") from None
        if self.inputs_root is not None:
            removed += sweep_input_folders(self.inputs_root.resolve())
        return removed

    def remove_orphans_of(self, holders: list[str]) -> list[str] | None:
        """Remove the containers of controllers (host:pid-namespace:pid) that died holding a
        core; the names removed, or None when some of theirs could not be (one still alive
        is not an orphan)."""
        dead = {h for h in holders if owner_dead(h)}
        if not dead:
            return []
        try:
            removed, left = _remove_where(self.client, {"label": [f"{LABEL}=1"]},
                                          lambda labels: f"{labels.get(LABEL_HOST, '')}:{labels.get(LABEL_OWNER, '')}" in dead)
        except (docker.errors.DockerException, requests.RequestException):
            return None
        sweep_networks(self.client, only_dead_owners=True)
        return None if left else removed

    def sweep_run(self, run_id: str, held_too: bool = False) -> list[str]:
        if held_too:
            try:
                return sweep_containers(self.client, run_id=run_id) + sweep_networks(self.client, run_id=run_id)
            except Exception:  # the engine is down: the start-up sweep of the next run removes them
                return []
        return sweep_unowned(self.client, run_id)

    def remove_held(self) -> int:
        return remove_all_live()

    def retry_removals(self) -> list[str]:
        return retry_removals()

    def ping(self) -> bool:
        try:
            self.client.ping()
            return True
        except Exception:
            return False

    def check_command(self, image: str, command: str, profile: Any, user: str | None = None,
                      cpus: list[int] | None = None) -> str | None:
        """Why ``command`` is not an executable on the image's PATH, or None. The probe runs on
        ``cpus`` (the controller's reserved cores), never where trials are measured."""
        # a file on the PATH, as the engine's exec looks it up (no shell: `command -v` would also
        # answer for a shell built-in such as `true` or `echo`, and by name, not by file)
        probe = ('case $1 in */*) [ -f "$1" ] && [ -x "$1" ];; *) IFS=:; for d in $PATH; do '
                 '[ -f "${d:-.}/$1" ] && [ -x "${d:-.}/$1" ] && exit 0; done; exit 1;; esac')
        c = None
        who = user or profile.user
        try:
            c = self.client.containers.run(
                image, ["sh", "-c", probe, "sh", command], detach=True, user=who, working_dir="/",
                cpuset_cpus=",".join(map(str, cpus)) if cpus else None,
                network_mode="none", network_disabled=True, read_only=True, cap_drop=["ALL"],
                security_opt=[seccomp.security_opt(), "no-new-privileges"],
                mem_limit=profile.memory, pids_limit=64, log_config={"type": "none"}, labels=_labels(),
            )
            if c.wait(timeout=60).get("StatusCode") == 0:
                return None
            return (f"the agent command {command!r} is not an executable file on the PATH of image {image} "
                    f"(as user {who}); check --agent-cmd or agent_cmd in suite.toml")
        except docker.errors.ImageNotFound:
            return f"image {image} not found; build it with `make images` (or `harness images build`)"
        except (docker.errors.DockerException, requests.RequestException) as e:
            raise EngineError(f"the engine could not start a container from {image} to check the agent command: {str(e)[:200]}") from None
        finally:
            if c is not None:
                try:
                    c.remove(force=True)
                except (docker.errors.DockerException, requests.RequestException):
                    pass  # labelled: the next start-up sweep removes it


def _owner_dead(labels: dict[str, str]) -> bool:
    """Is the controller that made this object gone? False when it cannot be told from here."""
    owner = labels.get(LABEL_OWNER, "")
    host = labels.get(LABEL_HOST)
    here = controller_host()
    if host is not None and host != here and not _legacy_host(host, here):
        return False  # another host or pid namespace: its pids mean nothing here
    return not (owner.isdigit() and pid_alive(int(owner)))


def force_remove(c: Any) -> None:
    """Remove a container whatever its state. A paused one (frozen by a controller killed
    between freezing and thawing it) is thawed first: on cgroup v1 the engine waits for a
    frozen process to die, which it never does, and hangs every later call on it."""
    if c.status == "paused" or (c.attrs.get("State") or {}).get("Paused"):
        try:
            c.unpause()
        except docker.errors.NotFound:
            return
        except (docker.errors.DockerException, requests.RequestException):
            pass
    c.remove(force=True)


def sweep_containers(client: docker.DockerClient, run_id: str | None = None, only_dead_owners: bool = False) -> list[str]:
    """Remove containers the harness left behind (by label). With ``only_dead_owners``, keep
    those whose owning controller process is still alive (or cannot be judged from here)."""
    filters = {"label": [f"{LABEL}=1"] + ([f"{LABEL_RUN}={run_id}"] if run_id else [])}
    removed, _ = _remove_where(client, filters, lambda labels: not only_dead_owners or _owner_dead(labels), keep_going=False)
    return removed


def _remove_where(client: docker.DockerClient, filters: dict, which: Any, keep_going: bool = True) -> tuple[list[str], bool]:
    """Remove the containers matching ``filters`` whose labels ``which`` accepts: (names
    removed, whether one could not be). With ``keep_going`` False an engine error is raised."""
    removed, left = [], False
    # ignore_removed: another controller may remove a listed container before it is inspected
    for c in client.containers.list(all=True, filters=filters, ignore_removed=True):
        if not which(c.labels):
            continue
        try:
            force_remove(c)
            removed.append(c.name)
        except docker.errors.NotFound:
            pass
        except (docker.errors.DockerException, requests.RequestException):
            if not keep_going:
                raise
            left = True
    return removed, left


def sweep_networks(client: docker.DockerClient, run_id: str | None = None, only_dead_owners: bool = False) -> list[str]:
    """Remove the harness's per-attempt networks left behind (their containers must be gone)."""
    filters = {"label": [f"{LABEL}=1"] + ([f"{LABEL_RUN}={run_id}"] if run_id else [])}
    removed = []
    try:
        nets = client.networks.list(filters=filters)
    except (docker.errors.DockerException, requests.RequestException):
        return removed
    for n in nets:
        if only_dead_owners and not _owner_dead(n.attrs.get("Labels") or {}):
            continue
        try:
            n.remove()
            removed.append(n.name)
        except (docker.errors.DockerException, requests.RequestException):
            pass
    return removed


def _legacy_host(label: str, here: str) -> bool:
    """Labels written by an older harness carried 'host:pid:[inode]' for the namespace."""
    host, _, ns = label.partition(":")
    return ns.startswith("pid:[") and f"{host}:{ns[5:-1]}" == here


def sweep_unowned(client: docker.DockerClient, run_id: str) -> list[str]:
    """Remove this run's containers that no sandbox of this process holds any more (a
    removal that failed while the engine was restarting). Live sandboxes are left alone."""
    removed = []
    try:
        found = client.containers.list(all=True, filters={"label": [f"{LABEL}=1", f"{LABEL_RUN}={run_id}"]}, ignore_removed=True)
    except Exception:
        return removed
    live = LIVE.names()
    for c in found:
        if c.name in live:
            continue
        try:
            c.remove(force=True)
            removed.append(c.name)
            PENDING.discard(c.name)
        except Exception:
            pass
    return removed
