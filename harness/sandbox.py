"""The pinned sandbox: one fresh container per attempt, under a fixed envelope.

Effects live here (Docker SDK, cgroup filesystem, host /proc). The container is kept
alive by a sleeping init (``docker-init`` running ``sleep infinity``); every workload runs
with ``exec`` so the controller can read the container's cgroup counters *before* the
container stops (its cgroup vanishes with it), kill a whole process tree on timeout while
keeping the container, and stream the final state out before removal.

Files go in through a read-only bind mount of a fresh host directory (``/harness/in``) and
come out as a tar stream produced by ``exec`` (Docker's archive API refuses a read-only
root fs). The sandbox never gets a host path it can write, nor the Docker socket.
"""

from __future__ import annotations

import atexit
import io
import os
import shutil
import signal
import socket
import tarfile
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import docker
import docker.errors
import requests
from pydantic import BaseModel, ConfigDict, Field, computed_field

from harness import cgroup, hoststats
from harness.counters import CgroupLimits, CgroupSnapshot, CounterDelta, HostDelta, HostSnapshot, Sample
from harness.profile import Profile, format_size

LABEL = "dev.harness"  # every container the harness starts carries dev.harness=1
LABEL_RUN = "dev.harness.run"
LABEL_ATTEMPT = "dev.harness.attempt"
LABEL_OWNER = "dev.harness.owner-pid"
LABEL_HOST = "dev.harness.owner-host"  # with the pid: a controller in another pid namespace or host is never "dead" to us
INPUT_DIR = "/harness/in"
PAGE = 4096


def keeper_user(workload_user: str) -> str:
    """uid:gid of the container's init and its sleeping keeper: unprivileged and never the
    workload's, so the workload can neither signal them (kill -1 would stop the container
    under the controller) nor ptrace them (a hijacked keeper is spared by kill_tree and
    could rewrite the state while it is exported)."""
    uid = 65534 if workload_user.split(":")[0] != "65534" else 65533
    return f"{uid}:{uid}"


class EngineError(RuntimeError):
    """The Docker engine cannot be reached or refused a request; the message says what to do."""


class SandboxError(RuntimeError):
    """A sandbox could not be created or used (image missing, engine error, cgroup not found)."""


def connect(timeout: float = 120) -> docker.DockerClient:
    """A Docker SDK client for the engine at DOCKER_HOST (default socket), checked with a ping."""
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
        return client
    except Exception as e:  # docker raises several unrelated types here
        raise EngineError(
            f"no Docker engine answers ({type(e).__name__}: {str(e)[:160]}); "
            "start one with `make engine` (as root) or set DOCKER_HOST"
        ) from None


def image_present(client: docker.DockerClient, image: str) -> bool:
    try:
        client.images.get(image)
        return True
    except docker.errors.ImageNotFound:
        return False


class ExecResult(BaseModel):
    """The outcome of one command run inside the sandbox."""

    model_config = ConfigDict(extra="forbid")
    cmd: list[str] = Field(..., description="The command as executed.")
    exit_code: int | None = Field(None, description="Exit status; None if it could not be read (engine error).")
    timed_out: bool = Field(False, description="The wall-clock timeout fired and the process tree was killed.")
    wall_s: float = Field(..., ge=0, description="Seconds from exec start to exit, or on a timeout until the killed tree's output closed.")
    stdout: str = Field("", description="Captured stdout (up to the profile's output_cap; truncation is marked).")
    stderr: str = Field("", description="Captured stderr (same cap).")
    stdout_bytes: int = Field(0, ge=0, description="Total bytes the command wrote to stdout, kept or not.")
    stderr_bytes: int = Field(0, ge=0, description="Total bytes written to stderr.")
    stdout_truncated: bool = Field(False, description="stdout exceeded the cap; the tail was dropped.")
    stderr_truncated: bool = Field(False, description="stderr exceeded the cap.")


class EnvelopeCheck(BaseModel):
    """The envelope read back from the kernel compared with the profile."""

    model_config = ConfigDict(extra="forbid")
    applied: CgroupLimits | None = Field(None, description="Limits read from the container's cgroup.")
    expected: dict[str, Any] = Field(default_factory=dict, description="What the profile asked for, in the same units.")
    mismatches: list[str] = Field(default_factory=list, description="One line per limit that differs (empty = applied).")

    @property
    def ok(self) -> bool:
        return self.applied is not None and not self.mismatches


def expected_limits(profile: Profile, cpuset: list[int]) -> dict[str, Any]:
    """The cgroup values a correctly applied envelope has."""
    mem = profile.memory // PAGE * PAGE
    return {
        "cpu_quota_us": profile.quota_us,
        "cpu_period_us": profile.cpu_period_us,
        "cpuset_cpus": sorted(cpuset),
        "memory_max": mem,
        "memsw_max": mem,
        "pids_max": profile.pids,
    }


def check_envelope(profile: Profile, cpuset: list[int], applied: CgroupLimits | None) -> EnvelopeCheck:
    """Compare read-back limits with the profile. Unknown values (None) of optional limits such
    as memsw on a kernel without swap accounting are not mismatches; a missing cgroup is."""
    exp = expected_limits(profile, cpuset)
    if applied is None:
        return EnvelopeCheck(applied=None, expected=exp, mismatches=["cgroup not readable"])
    mism = []
    for key, want in exp.items():
        got = getattr(applied, key)
        if key == "memsw_max" and got is None:
            continue  # no swap accounting: swap cannot be used beyond memory anyway
        if key in ("memory_max", "memsw_max") and got is not None:
            got = got // PAGE * PAGE
        if key == "cpuset_cpus" and got is not None:
            got = sorted(got)
        if got != want:
            mism.append(f"{key}: profile {want}, kernel {got}")
    return EnvelopeCheck(applied=applied, expected=exp, mismatches=mism)


class Monitor:
    """Samples the cgroup and host counters in a background thread (the saturation log).

    Cheap by design: a handful of small file reads per sample, no Docker API calls."""

    def __init__(self, reader: Callable[[float], CgroupSnapshot], pinned: list[int], hz: float):
        self._reader = reader
        self._pinned = pinned
        self._interval = 1.0 / hz
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="harness-monitor", daemon=True)
        self.samples: list[Sample] = []
        self.mem_available_min: int | None = None
        self.pids_peak: int | None = None
        self.t0 = time.monotonic()
        self._host0: HostSnapshot | None = None
        self._cg0: CgroupSnapshot | None = None

    def start(self, t0: float, host0: HostSnapshot, cg0: CgroupSnapshot) -> None:
        self.t0, self._host0, self._cg0 = t0, host0, cg0
        self._thread.start()

    def _sample(self) -> None:
        t = time.monotonic()
        try:
            cg = self._reader(t)
        except (OSError, cgroup.CgroupError):
            return  # the container is going away; the exact end reading is taken elsewhere
        host = hoststats.read_host_snapshot(t)
        busy = sum(host.cpu_busy_us.get(c, 0) - self._host0.cpu_busy_us.get(c, 0) for c in self._pinned)
        foreign = max(0, busy - (cg.cpu_usage_us - self._cg0.cpu_usage_us))
        self.samples.append(
            Sample(
                t=round(t - self.t0, 4),
                cpu_usage_us=cg.cpu_usage_us,
                throttled_us=cg.throttled_us,
                nr_throttled=cg.nr_throttled,
                memory_current=cg.memory_current,
                pids_current=cg.pids_current,
                foreign_cpu_us=foreign,
                host_mem_available=host.mem_available,
            )
        )
        if self.mem_available_min is None or host.mem_available < self.mem_available_min:
            self.mem_available_min = host.mem_available
        if cg.pids_current is not None and (self.pids_peak is None or cg.pids_current > self.pids_peak):
            self.pids_peak = cg.pids_current

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)


@dataclass
class Measured:
    """A command's result with what the kernel measured while it ran."""

    result: ExecResult
    counters: CounterDelta | None
    host: HostDelta | None
    samples: list[Sample]


_LIVE: dict[str, "Sandbox"] = {}
_LIVE_LOCK = threading.Lock()


def _remove_live_at_exit() -> None:
    for sb in list(_LIVE.values()):
        sb.remove()


atexit.register(_remove_live_at_exit)


def remove_all_live() -> int:
    """Remove every container this process still holds (Ctrl-C path). Returns how many."""
    live = list(_LIVE.values())
    threads = [threading.Thread(target=sb.remove) for sb in live]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=15)
    return len(live)


def sweep_containers(client: docker.DockerClient, run_id: str | None = None, only_dead_owners: bool = False) -> list[str]:
    """Remove containers the harness left behind (by label). With ``only_dead_owners``, keep
    those whose owning controller process is still alive on this host."""
    filters = {"label": [f"{LABEL}=1"] + ([f"{LABEL_RUN}={run_id}"] if run_id else [])}
    removed = []
    for c in client.containers.list(all=True, filters=filters):
        if only_dead_owners:
            owner = c.labels.get(LABEL_OWNER, "")
            host = c.labels.get(LABEL_HOST)
            if host is not None and host != _controller_host():
                continue  # another host or pid namespace: its pids mean nothing here
            if owner.isdigit() and _pid_alive(int(owner)):
                continue
        try:
            c.remove(force=True)
            removed.append(c.name)
        except docker.errors.NotFound:
            pass
    return removed


def sweep_unowned(client: docker.DockerClient, run_id: str) -> list[str]:
    """Remove this run's containers that no sandbox of this process holds any more (a
    removal that failed while the engine was restarting). Live sandboxes are left alone."""
    removed = []
    try:
        found = client.containers.list(all=True, filters={"label": [f"{LABEL}=1", f"{LABEL_RUN}={run_id}"]})
    except Exception:
        return removed
    with _LIVE_LOCK:
        live = set(_LIVE)
    for c in found:
        if c.name in live:
            continue
        try:
            c.remove(force=True)
            removed.append(c.name)
        except Exception:
            pass
    return removed


def _controller_host() -> str:
    """hostname plus this pid namespace's inode: pids are only comparable within it."""
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = "?"
    return f"{socket.gethostname()}:{ns}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@dataclass
class Sandbox:
    """One container under one envelope. Use as a context manager: the container is removed
    on exit, also on errors and Ctrl-C.

    ``inputs`` are files (name -> bytes) placed read-only under /harness/in."""

    client: docker.DockerClient
    image: str
    profile: Profile
    cpuset: list[int]
    labels: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, bytes] = field(default_factory=dict)
    name: str = ""
    container: Any = None
    pid: int | None = None
    paths: Any = None
    envelope: EnvelopeCheck | None = None
    _reader: Any = None
    _indir: str | None = None
    _keep_pids: set[int] = field(default_factory=set)
    _removed: bool = False

    def __enter__(self) -> "Sandbox":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        """Create and start the container, locate its cgroup and read the envelope back."""
        p = self.profile
        self.name = self.name or f"harness-{uuid.uuid4().hex[:12]}"
        volumes = {}
        if self.inputs:
            self._indir = tempfile.mkdtemp(prefix="harness-in-")
            os.chmod(self._indir, 0o755)
            for fname, data in self.inputs.items():
                if "/" in fname or fname.startswith("."):
                    raise SandboxError(f"input name {fname!r} must be a plain file name")
                fp = Path(self._indir, fname)
                fp.write_bytes(data)
                fp.chmod(0o444)
            volumes[self._indir] = {"bind": INPUT_DIR, "mode": "ro"}
        uid, gid = p.user.split(":")
        tmpfs = {}
        for path, size in p.tmpfs.items():
            opts = f"size={size},mode=1777" if path == "/tmp" else f"size={size},uid={uid},gid={gid},mode=0700"
            tmpfs[path] = opts + ",nosuid,nodev"
        labels = {LABEL: "1", LABEL_OWNER: str(os.getpid()), LABEL_HOST: _controller_host(), **self.labels}
        try:
            with _LIVE_LOCK:
                _LIVE[self.name] = self
            self.container = self.client.containers.run(
                self.image,
                command=["sleep", "infinity"],
                name=self.name,
                detach=True,
                init=True,
                user=keeper_user(p.user),
                working_dir="/",  # the workload's directory is private to its uid; execs set it
                cpu_period=p.cpu_period_us,
                cpu_quota=p.quota_us,
                cpuset_cpus=",".join(str(c) for c in self.cpuset),
                mem_limit=p.memory,
                memswap_limit=p.memory,
                pids_limit=p.pids,
                read_only=True,
                tmpfs=tmpfs,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                network_mode=p.network,
                labels=labels,
                volumes=volumes,
                ipc_mode="private",
                stop_signal="SIGKILL",
                log_config={"type": "none"},
            )
            self.container.reload()
            self.pid = int(self.container.attrs["State"]["Pid"])
        except docker.errors.ImageNotFound:
            self.remove()
            raise SandboxError(f"image {self.image} not found; build it with `make images`") from None
        except docker.errors.DockerException as e:
            self.remove()
            raise SandboxError(f"engine refused to start a container from {self.image}: {str(e)[:300]}") from None
        if not self.pid:
            self.remove()
            raise SandboxError(f"container {self.name} did not start (State.Pid is 0)")
        try:
            self.paths = cgroup.locate(self.pid)
            self._reader = cgroup.SnapshotReader(self.paths)
            applied = cgroup.read_limits(self.paths)
        except (OSError, cgroup.CgroupError):
            applied = None
        self.envelope = check_envelope(p, self.cpuset, applied)
        # the init and its sleeping child survive kill_tree(); everything else is the workload
        self._keep_pids = {self.pid, *self._children(self.pid)}

    def remove(self) -> None:
        """Kill and remove the container (idempotent) and the input directory."""
        if self._removed:
            return
        self._removed = True
        try:
            if self.container is not None:
                self.container.remove(force=True)
            else:
                try:
                    self.client.api.remove_container(self.name, force=True)
                except docker.errors.NotFound:
                    pass
        except docker.errors.NotFound:
            pass
        except Exception:
            # the engine may be down; the label sweep at the next start removes it
            pass
        finally:
            with _LIVE_LOCK:
                _LIVE.pop(self.name, None)
            if self._indir:
                shutil.rmtree(self._indir, ignore_errors=True)

    # -- counters --------------------------------------------------------------
    def snapshot(self) -> CgroupSnapshot | None:
        """Read the container's cgroup counters now (None if the cgroup is gone)."""
        if self._reader is None:
            return None
        try:
            return self._reader.read(time.monotonic())
        except (OSError, cgroup.CgroupError):
            return None

    def alive(self) -> bool:
        """Is the container still running (not removed or killed from outside)?"""
        if self.container is None or self._removed:
            return False
        try:
            self.container.reload()
            return self.container.status == "running"
        except Exception:  # NotFound, engine down, connection reset
            return False

    def _procs(self) -> list[int]:
        """Host pids of every process in the container's cgroup (cgroup.procs, v1 and v2)."""
        if self.paths is None:
            return []
        try:
            return [int(x) for x in Path(self.paths.memory, "cgroup.procs").read_text().split()]
        except OSError:
            return []

    @staticmethod
    def _children(pid: int) -> list[int]:
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            return [int(k) for k in kids]
        except OSError:
            return []

    def kill_tree(self) -> int:
        """SIGKILL every process of the workload (all but the init and its sleep), including
        orphans that left the exec's process group. The cgroup is frozen first, so a fork
        bomb cannot outrun the kill. Returns how many processes were signalled."""
        if self.paths is None:
            return 0
        if not [p for p in self._procs() if p not in self._keep_pids]:
            return 0  # nothing left: no need to freeze
        killed = 0
        frozen = False
        try:
            self.container.pause()
            frozen = True
        except docker.errors.DockerException:
            pass
        try:
            for _ in range(5):
                victims = [p for p in self._procs() if p not in self._keep_pids]
                if not victims:
                    break
                for p in victims:
                    try:
                        os.kill(p, signal.SIGKILL)
                        killed += 1
                    except (ProcessLookupError, PermissionError):
                        pass
                if not frozen:
                    time.sleep(0.02)
                else:
                    break
        finally:
            if frozen:
                try:
                    self.container.unpause()
                except docker.errors.DockerException:
                    pass
        # SIGKILL is delivered once thawed; wait briefly until they are gone
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if not [p for p in self._procs() if p not in self._keep_pids and _is_running(p)]:
                break
            time.sleep(0.02)
        return killed

    # -- exec ------------------------------------------------------------------
    def exec(
        self,
        cmd: list[str],
        timeout: float,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        cap: int | None = None,
        on_stdout: Callable[[bytes], None] | None = None,
    ) -> ExecResult:
        """Run ``cmd`` in the container with a wall-clock timeout. On timeout, or when the
        command exits but leaves processes holding its output open, the whole workload
        process tree is killed. Output beyond ``cap`` bytes per stream is counted and dropped.
        ``on_stdout`` receives raw stdout bytes instead of the capped buffer (for exports)."""
        cap = self.profile.output_cap if cap is None else cap
        workdir = workdir or ("/work" if "/work" in self.profile.tmpfs else "/tmp")
        api = self.client.api
        t0 = time.monotonic()
        try:
            ex = api.exec_create(self.container.id, cmd, environment=env or {}, workdir=workdir, user=self.profile.user)
            stream = api.exec_start(ex["Id"], stream=True, demux=True)
        except (docker.errors.DockerException, requests.RequestException) as e:
            return ExecResult(cmd=cmd, exit_code=None, wall_s=time.monotonic() - t0, stderr=f"engine error: {str(e)[:300]}")
        bufs = {"out": bytearray(), "err": bytearray()}
        counts = {"out": 0, "err": 0}
        errors: list[BaseException] = []

        def pump() -> None:
            try:
                for out, err in stream:
                    for key, chunk in (("out", out), ("err", err)):
                        if not chunk:
                            continue
                        counts[key] += len(chunk)
                        if key == "out" and on_stdout is not None:
                            on_stdout(chunk)
                            continue
                        room = cap - len(bufs[key])
                        if room > 0:
                            bufs[key] += chunk[:room]
            except BaseException as e:  # the stream breaks when the engine goes away
                errors.append(e)

        th = threading.Thread(target=pump, name="harness-exec-pump", daemon=True)
        th.start()
        timed_out = False
        exited_at: float | None = None
        deadline = t0 + timeout
        next_poll = t0 + 0.2
        while th.is_alive():
            th.join(timeout=0.02)
            now = time.monotonic()
            if not th.is_alive():
                break
            if now >= deadline:
                timed_out = True
                self.kill_tree()
                th.join(timeout=5)
                break
            if now >= next_poll:
                next_poll = now + 0.2
                try:
                    if not api.exec_inspect(ex["Id"])["Running"]:
                        exited_at = exited_at or now
                except (docker.errors.DockerException, requests.RequestException):
                    break
                if exited_at and now - exited_at > 0.5:
                    # the command exited; orphans still hold its stdout open
                    self.kill_tree()
                    th.join(timeout=5)
                    break
        wall = (exited_at or time.monotonic()) - t0
        exit_code = None
        try:
            info = api.exec_inspect(ex["Id"])
            exit_code = info.get("ExitCode")
            if info.get("Running"):
                exit_code = None
        except (docker.errors.DockerException, requests.RequestException):
            pass

        def text(key: str) -> tuple[str, bool]:
            b = bytes(bufs[key])
            trunc = counts[key] > len(b) and not (key == "out" and on_stdout)
            s = b.decode("utf-8", errors="replace")
            if trunc:
                s += f"\n[harness: truncated, {counts[key] - len(b)} more bytes dropped; cap {format_size(cap)}]"
            return s, trunc

        out, out_tr = text("out")
        err, err_tr = text("err")
        if errors and exit_code is None:
            err += f"\n[harness: output stream broke: {type(errors[0]).__name__}: {str(errors[0])[:200]}]"
        return ExecResult(
            cmd=cmd,
            exit_code=exit_code,
            timed_out=timed_out,
            wall_s=round(wall, 4),  # on a timeout: until the tree was killed, so slow kills show
            stdout=out,
            stderr=err,
            stdout_bytes=counts["out"],
            stderr_bytes=counts["err"],
            stdout_truncated=out_tr,
            stderr_truncated=err_tr,
        )

    def measured_exec(self, cmd: list[str], timeout: float, env: dict[str, str] | None = None, workdir: str | None = None) -> "Measured":
        """``exec`` under the monitor: cgroup and host readings right before and right after
        the command (before anything else touches the container), and the saturation log."""
        t0 = time.monotonic()
        host0 = hoststats.read_host_snapshot(t0)
        cg0 = self.snapshot()
        mon = None
        if cg0 is not None:
            mon = Monitor(self._reader.read, self.cpuset, self.profile.sample_hz)
            mon.start(t0, host0, cg0)
        try:
            res = self.exec(cmd, timeout=timeout, env=env, workdir=workdir)
        finally:
            if mon:
                mon.stop()
        cg1 = self.snapshot()
        host1 = hoststats.read_host_snapshot(time.monotonic())
        counters = host = None
        if cg0 is not None and cg1 is not None:
            counters = CounterDelta.between(cg0, cg1, mon.pids_peak if mon else None)
            host = HostDelta.between(host0, host1, self.cpuset, counters.cpu_usage_us, mon.mem_available_min if mon else None)
        return Measured(result=res, counters=counters, host=host, samples=mon.samples if mon else [])

    # -- files out -------------------------------------------------------------
    def export(self, names: Iterable[str], workdir: str = "/work", max_bytes: int = 64 * 1024 * 1024, timeout: float = 30) -> tuple[dict[str, bytes], list[str]]:
        """Stream regular files out of the container as a tar produced by exec (never the
        archive API). Only plain regular files with plain names are accepted: symlinks,
        devices, directories, path traversal and anything over ``max_bytes`` in total are
        refused and reported. Returns (files, problems)."""
        names = [n for n in names]
        for n in names:
            if "/" in n or n.startswith(".") or not n:
                raise ValueError(f"export name {n!r} must be a plain file name")
        # --ignore-failed-read: a missing file (no transcript) is not an error
        cmd = ["tar", "-c", "-f", "-", "--ignore-failed-read", "-C", workdir, "--", *names]
        sink = io.BytesIO()
        over = [False]

        def collect(chunk: bytes) -> None:
            if sink.tell() + len(chunk) > max_bytes + 1024 * 1024:
                over[0] = True
                return
            sink.write(chunk)

        res = self.exec(cmd, timeout=timeout, cap=64 * 1024, on_stdout=collect)
        problems: list[str] = []
        if res.timed_out:
            problems.append(f"export timed out after {timeout:.0f}s")
        if over[0]:
            problems.append(f"final state larger than {format_size(max_bytes)}; not kept")
            return {}, problems
        files: dict[str, bytes] = {}
        sink.seek(0)
        try:
            with tarfile.open(fileobj=sink, mode="r|") as tf:
                for m in tf:
                    if m.name not in names:
                        problems.append(f"refused unexpected member {m.name!r}")
                        continue
                    if not m.isreg():
                        problems.append(f"refused {m.name!r}: not a regular file")
                        continue
                    if m.size > max_bytes:
                        problems.append(f"refused {m.name!r}: {format_size(m.size)} over the cap")
                        continue
                    f = tf.extractfile(m)
                    files[m.name] = f.read() if f else b""
        except tarfile.TarError as e:
            problems.append(f"malformed export stream ({e}; tar exit {res.exit_code}: {res.stderr.strip()[-200:]})")
        return files, problems


def _is_running(pid: int) -> bool:
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
        return st.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class AttemptResult(BaseModel):
    """What `harness sandbox exec` prints: one attempt of one command under one envelope."""

    model_config = ConfigDict(extra="forbid")
    container: str = Field(..., description="Container name (removed after the attempt).")
    image: str = Field(..., description="Image the sandbox ran.")
    profile: str = Field(..., description="Profile name.")
    cpuset: list[int] = Field(..., description="Exclusive cores leased to the attempt.")
    exec: ExecResult | None = Field(None, description="The command's result (None if the sandbox never started).")
    kind: str = Field(..., description="ok | crashed | timeout | oom_killed | infra_error.")
    envelope: EnvelopeCheck | None = Field(None, description="Limits read back vs the profile.")
    counters: CounterDelta | None = Field(None, description="cgroup deltas over the command.")
    host: HostDelta | None = Field(None, description="Host contention over the command.")
    samples: list[Sample] = Field(default_factory=list, description="Saturation log during the command.")
    error: str | None = Field(None, description="Why the attempt could not run (infra_error).")

    # the headline numbers at the top level too, for `jq .exit_code` and friends
    @computed_field(description="The command's exit status (same as exec.exit_code).")
    @property
    def exit_code(self) -> int | None:
        return self.exec.exit_code if self.exec else None

    @computed_field(description="Seconds the command ran (same as exec.wall_s).")
    @property
    def wall_s(self) -> float | None:
        return self.exec.wall_s if self.exec else None

    @computed_field(description="The wall-clock timeout fired (same as exec.timed_out).")
    @property
    def timed_out(self) -> bool:
        return bool(self.exec and self.exec.timed_out)


def classify(exec_result: ExecResult | None, counters: CounterDelta | None) -> str:
    """Failure kind of a finished command, from kernel counters first and exit status second:
    an OOM kill counts even when the agent caught it and exited 0."""
    if exec_result is None or exec_result.exit_code is None and not exec_result.timed_out:
        return "infra_error"
    if counters is not None and (counters.oom_kills or 0) > 0:
        return "oom_killed"
    if exec_result.timed_out:
        return "timeout"
    return "ok" if exec_result.exit_code == 0 else "crashed"


def run_command(
    client: docker.DockerClient,
    image: str,
    profile: Profile,
    cpuset: list[int],
    cmd: list[str],
    env: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    timeout: float | None = None,
) -> AttemptResult:
    """Run one command as one attempt in a fresh sandbox and return its record. Never raises
    for engine or workload failures: they are recorded as ``infra_error``."""
    sb = Sandbox(client, image, profile, cpuset, labels=labels or {})
    try:
        sb.start()
    except SandboxError as e:
        sb.remove()
        return AttemptResult(container=sb.name, image=image, profile=profile.name, cpuset=cpuset, kind="infra_error", error=str(e))
    try:
        m = sb.measured_exec(cmd, timeout=timeout or profile.timeouts.agent, env=env)
        return AttemptResult(
            container=sb.name,
            image=image,
            profile=profile.name,
            cpuset=cpuset,
            exec=m.result,
            kind=classify(m.result, m.counters),
            envelope=sb.envelope,
            counters=m.counters,
            host=m.host,
            samples=m.samples,
        )
    finally:
        sb.remove()
