"""The Docker sandbox backend: one fresh container per attempt, under a fixed envelope.

The container is kept alive by a sleeping init (``docker-init`` running ``sleep infinity``
as an unprivileged keeper uid); every workload runs with ``exec`` so the controller can read
the container's cgroup counters *before* the container stops (its cgroup vanishes with it),
kill a whole process tree on timeout while keeping the container, grade the final state
inside it, and stream files out before removal.

Files go in through read-only bind mounts of fresh host folders: ``/harness/in`` (the
agent's inputs) and ``/harness/grade`` (empty until every agent process is gone; then the
grader's files). Files come out as a tar stream written by a small program run with
``exec`` (Docker's archive API refuses a read-only root fs), per file size-capped. The
sandbox never gets a host path it can write, nor the Docker socket.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

import docker
import docker.errors
import requests

from harness.core.envelope import check_envelope
from harness.measure import cgroup
from harness.measure import host as hoststats
from harness.measure.monitor import Monitor
from harness.model.counters import CgroupLimits, CgroupSnapshot, CounterDelta, HostDelta
from harness.model.errors import EngineError, SandboxError
from harness.model.sandbox import GRADE_DIR, INPUT_DIR, WORKDIR, EnvelopeCheck, ExecResult
from harness.model.units import format_size
from harness.sandbox.base import Command, Exported, Measured, Sandbox, SandboxBackend, SandboxSpec
from harness.sandbox.owners import (
    LABEL,
    LABEL_HOST,
    LABEL_OWNER,
    LABEL_RUN,
    LiveRegistry,
    controller_host,
    input_folder,
    pid_alive,
    sweep_input_folders,
)

EXPORT_MANIFEST = ".harness-export.json"

LIVE = LiveRegistry()  # the sandboxes this process holds
PENDING = LiveRegistry()  # containers whose removal failed; retried by retry_removals()


def keeper_user(workload_user: str) -> str:
    """uid:gid of the container's init and its sleeping keeper: unprivileged and never the
    workload's, so the workload can neither signal them (kill -1 would stop the container
    under the controller) nor ptrace them (a hijacked keeper is spared by kill_tree and
    could rewrite the state while it is exported)."""
    uid = 65534 if workload_user.split(":")[0] != "65534" else 65533
    return f"{uid}:{uid}"


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


def _is_running(pid: int) -> bool:
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
        return st.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class _Pump:
    """Collects one exec's demuxed output in a reader thread, each stream capped.

    ``close()`` stops collection and returns what was kept: after it, the reader thread
    (which may still be draining a killed command's pipe) changes nothing the caller reads."""

    def __init__(self, stream: Any, cap: int, on_stdout: Any = None):
        self._stream = stream
        self._cap = cap
        self._on_stdout = on_stdout
        self._lock = threading.Lock()
        self._closed = False
        self.bufs = {"out": bytearray(), "err": bytearray()}
        self.counts = {"out": 0, "err": 0}
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="harness-exec-pump", daemon=True)

    def start(self) -> "_Pump":
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            for out, err in self._stream:
                with self._lock:
                    if self._closed:
                        return
                    for key, chunk in (("out", out), ("err", err)):
                        if not chunk:
                            continue
                        self.counts[key] += len(chunk)
                        if key == "out" and self._on_stdout is not None:
                            self._on_stdout(chunk)
                            continue
                        room = self._cap - len(self.bufs[key])
                        if room > 0:
                            self.bufs[key] += chunk[:room]
        except BaseException as e:  # the stream breaks when the engine goes away
            with self._lock:
                self.error = e

    def close(self) -> tuple[bytes, bytes, dict[str, int], BaseException | None]:
        with self._lock:
            self._closed = True
            return bytes(self.bufs["out"]), bytes(self.bufs["err"]), dict(self.counts), self.error


# The finish program, run in the sandbox as the workload's user once the agent is gone:
# optionally a command first (the grader: its own session, its own wall clock, its output
# in files), then a tar of plain regular files of the work directory, each cut at its cap,
# then a manifest. One exec for both, so grading costs no extra round trip.
_FINISH = r"""
import io, json, os, runpy, select, signal, stat, subprocess, sys, tarfile, time
spec = json.loads(sys.argv[1])
out = tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT)
man = {}

def member(name, f, size):
    ti = tarfile.TarInfo(name)
    ti.size = size
    ti.mode = 0o644
    out.addfile(ti, f)

def run(cmd, timeout, cap):
    # (exit status, timed out, stdout, stderr, bytes written to each): output through pipes,
    # the first cap + 1 bytes of each kept, the rest drained; the child is killed with its
    # whole session at the timeout. Nothing is written to disk (the agent may have filled it).
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    if cmd[:3] == ["python3", "-I", "-S"] and len(cmd) > 3 and cmd[3].endswith(".py"):
        # a python program under the same flags as this one: fork and run it, instead of
        # paying for a second interpreter start
        pid = os.fork()
        if pid == 0:
            os.setsid()
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for fd in (out_r, err_r, out_w, err_w):
                os.close(fd)
            sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb"), write_through=True)
            sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb"), write_through=True)
            sys.argv = cmd[3:]
            code = 0
            try:
                runpy.run_path(cmd[3], run_name="__main__")
            except SystemExit as x:
                code = x.code if isinstance(x.code, int) else (0 if x.code is None else 1)
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 70
            try:
                sys.stdout.flush()
            finally:
                os._exit(code)
    else:
        pid = subprocess.Popen(cmd, stdout=out_w, stderr=err_w, stdin=subprocess.DEVNULL, cwd="/tmp", start_new_session=True).pid
    os.close(out_w)
    os.close(err_w)
    pidfd = os.pidfd_open(pid)
    bufs, counts, open_fds = {out_r: bytearray(), err_r: bytearray()}, {out_r: 0, err_r: 0}, {out_r, err_r}
    deadline, timed_out, exited = time.monotonic() + timeout, False, False
    while open_fds or not exited:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            os.killpg(pid, signal.SIGKILL)
            break
        ready, _, _ = select.select(list(open_fds) + ([] if exited else [pidfd]), [], [], left)
        for fd in ready:
            if fd == pidfd:
                exited = True
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.discard(fd)
                continue
            counts[fd] += len(chunk)
            room = cap + 1 - len(bufs[fd])
            if room > 0:
                bufs[fd] += chunk[:room]
    rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    for fd in (out_r, err_r, pidfd):
        os.close(fd)
    return rc, timed_out, bytes(bufs[out_r]), bytes(bufs[err_r]), counts[out_r], counts[err_r]

cmd = spec.get("cmd")
if cmd:
    t0 = time.monotonic()
    rc, to, o, e, no, ne = run(cmd, spec["timeout"], spec["cap"])
    man[".command"] = {"exit_code": 128 - rc if rc < 0 else rc, "timed_out": to, "wall_s": round(time.monotonic() - t0, 4),
                       "out_bytes": no, "err_bytes": ne}
    member(".harness-cmd-out", io.BytesIO(o), len(o))
    member(".harness-cmd-err", io.BytesIO(e), len(e))
for name, cap, keep in spec["files"]:
    p = os.path.join(spec["workdir"], name)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        continue
    except OSError as e:
        man[name] = {"refused": "cannot stat: " + (e.strerror or str(e))}
        continue
    if not stat.S_ISREG(st.st_mode):
        man[name] = {"refused": "not a regular file"}
        continue
    if st.st_size > cap and not keep:
        man[name] = {"refused": "over the cap", "size": st.st_size}
        continue
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        man[name] = {"refused": "cannot open: " + (e.strerror or str(e))}
        continue
    with os.fdopen(fd, "rb") as f:
        member(name, f, min(st.st_size, cap))
    man[name] = {"size": st.st_size, "kept": min(st.st_size, cap)}
data = json.dumps(man).encode()
member(".harness-export.json", io.BytesIO(data), len(data))
out.close()
"""


class DockerSandbox(Sandbox):
    """One container under one envelope (see the module docstring)."""

    def __init__(self, client: docker.DockerClient, spec: SandboxSpec):
        self.client = client
        self.spec = spec
        self.profile = spec.profile
        self.cpuset = list(spec.cpuset)
        self.image = spec.image
        self.name = f"harness-{uuid.uuid4().hex[:12]}"
        self.container: Any = None
        self.pid: int | None = None
        self.paths: cgroup.CgroupPaths | None = None
        self.envelope: EnvelopeCheck | None = None
        self._reader: cgroup.SnapshotReader | None = None
        self._folder: Path | None = None
        self._keep_pids: set[int] = set()
        self._removed = False
        # start and remove exclude each other: a removal asked for while the container is
        # being created (Ctrl-C) waits for it, so it always finds the container it must remove
        self._lock = threading.RLock()

    def __enter__(self) -> "DockerSandbox":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # -- lifecycle -------------------------------------------------------------
    def _mounts(self) -> dict[str, dict[str, str]]:
        spec = self.spec
        if not spec.inputs and not spec.with_grade_dir:
            return {}
        root = spec.inputs_root or Path(os.environ.get("HARNESS_HOME", ".harness")) / "inputs"
        try:
            self._folder = input_folder(root.resolve(), self.name)
        except OSError as e:
            raise SandboxError(f"cannot make the input folder under {root}: {e}; set HARNESS_HOME to a folder you own") from None
        volumes = {}
        indir = self._folder / "in"
        indir.mkdir(mode=0o755)
        os.chmod(indir, 0o755)
        for fname, data in spec.inputs.items():
            if "/" in fname or fname.startswith(".") or not fname:
                raise SandboxError(f"input name {fname!r} must be a plain file name")
            fp = indir / fname
            fp.write_bytes(data)
            fp.chmod(0o444)
        volumes[str(indir)] = {"bind": INPUT_DIR, "mode": "ro"}
        if spec.with_grade_dir:
            gdir = self._folder / "grade"
            gdir.mkdir(mode=0o755)
            os.chmod(gdir, 0o755)
            volumes[str(gdir)] = {"bind": GRADE_DIR, "mode": "ro"}
        return volumes

    def start(self) -> None:
        """Create and start the container, locate its cgroup and read the envelope back."""
        with self._lock:
            if self._removed:
                raise SandboxError(f"sandbox {self.name} was removed before it started")
            self._start()

    def _start(self) -> None:
        p = self.profile
        LIVE.add(self.name, self)
        try:
            volumes = self._mounts()
        except BaseException:
            self.remove()
            raise
        uid, gid = p.user.split(":")
        tmpfs = {}
        for path, size in p.tmpfs.items():
            opts = f"size={size},mode=1777" if path == "/tmp" else f"size={size},uid={uid},gid={gid},mode=0700"
            tmpfs[path] = opts + ",nosuid,nodev"
        labels = {LABEL: "1", LABEL_OWNER: str(os.getpid()), LABEL_HOST: controller_host(), **self.spec.labels}
        try:
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
        except (docker.errors.DockerException, requests.RequestException) as e:
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

    def remove(self) -> bool:
        """Kill and remove the container (idempotent) and its input folder. A removal the
        engine refuses is retried a few times, then left to :func:`retry_removals`; the
        return value says whether the container is gone."""
        with self._lock:
            return self._remove()

    def _remove(self) -> bool:
        if self._removed:
            return True
        gone = False
        for delay in (0.0, 0.2, 0.5, 1.0):
            time.sleep(delay)
            try:
                if self.container is not None:
                    self.container.remove(force=True)
                else:
                    self.client.api.remove_container(self.name, force=True)
                gone = True
            except docker.errors.NotFound:
                gone = True
            except Exception:  # the engine may be restarting
                continue
            break
        LIVE.discard(self.name)
        if gone:
            self._removed = True
            PENDING.discard(self.name)
        else:
            PENDING.add(self.name, self)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        return gone

    # -- counters --------------------------------------------------------------
    def snapshot(self) -> CgroupSnapshot | None:
        if self._reader is None:
            return None
        try:
            return self._reader.read(time.monotonic())
        except (OSError, cgroup.CgroupError):
            return None

    def alive(self) -> bool:
        if self.container is None or self._removed:
            return False
        if self.pid is not None and not _is_running(self.pid):
            return False  # its init is gone: the container is being removed or was killed
        try:
            self.container.reload()
            return self.container.status == "running"
        except Exception:  # NotFound, engine down, connection reset
            return False

    def set_envelope(self, memory: int, cpu_quota_us: int) -> CgroupLimits | None:
        try:
            self.container.update(mem_limit=memory, memswap_limit=memory, cpu_quota=cpu_quota_us)
        except (docker.errors.DockerException, requests.RequestException) as e:
            raise SandboxError(f"the engine refused the grade envelope for {self.name}: {str(e)[:200]}") from None
        try:
            return cgroup.read_limits(self.paths) if self.paths else None
        except (OSError, cgroup.CgroupError):
            return None

    def put_grade_files(self, files: dict[str, bytes]) -> None:
        if self._folder is None or not (self._folder / "grade").is_dir():
            raise SandboxError(f"sandbox {self.name} was started without a grade folder")
        for fname, data in files.items():
            if "/" in fname or fname.startswith(".") or not fname:
                raise SandboxError(f"grade file name {fname!r} must be a plain file name")
            fp = self._folder / "grade" / fname
            fp.write_bytes(data)
            fp.chmod(0o444)

    # -- processes -------------------------------------------------------------
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

    def workload_alive(self) -> bool:
        return any(p not in self._keep_pids and _is_running(p) for p in self._procs())

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
            if not self.workload_alive():
                break
            time.sleep(0.02)
        return killed

    # -- exec ------------------------------------------------------------------
    def exec(self, cmd: list[str], timeout: float, env: dict[str, str] | None = None, workdir: str | None = None,
             cap: int | None = None, on_stdout: Any = None) -> ExecResult:
        """Run ``cmd`` in the container with a wall-clock timeout. On timeout, or when the
        command exits but leaves processes holding its output open, the whole workload
        process tree is killed. Output beyond ``cap`` bytes per stream is counted and dropped.
        ``on_stdout`` receives raw stdout bytes instead of the capped buffer (for exports)."""
        cap = self.profile.output_cap if cap is None else cap
        workdir = workdir or (WORKDIR if WORKDIR in self.profile.tmpfs else "/tmp")
        api = self.client.api
        t0 = time.monotonic()
        try:
            ex = api.exec_create(self.container.id, cmd, environment=env or {}, workdir=workdir, user=self.profile.user)
            stream = api.exec_start(ex["Id"], stream=True, demux=True)
        except (docker.errors.DockerException, requests.RequestException) as e:
            return ExecResult(cmd=cmd, exit_code=None, wall_s=time.monotonic() - t0, stderr=f"engine error: {str(e)[:300]}")
        pump = _Pump(stream, cap, on_stdout).start()
        timed_out = False
        exited_at: float | None = None
        deadline = t0 + timeout
        next_poll = t0 + 0.2
        while pump.thread.is_alive():
            pump.thread.join(timeout=0.02)
            now = time.monotonic()
            if not pump.thread.is_alive():
                break
            if now >= deadline:
                timed_out = True
                self.kill_tree()
                pump.thread.join(timeout=5)
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
                    pump.thread.join(timeout=5)
                    break
        wall = (exited_at or time.monotonic()) - t0
        out_b, err_b, counts, error = pump.close()
        exit_code = None
        try:
            info = api.exec_inspect(ex["Id"])
            exit_code = info.get("ExitCode")
            if info.get("Running"):
                exit_code = None
        except (docker.errors.DockerException, requests.RequestException):
            pass

        def text(key: str, b: bytes) -> tuple[str, bool]:
            trunc = counts[key] > len(b) and not (key == "out" and on_stdout)
            s = b.decode("utf-8", errors="replace")
            if trunc:
                s += f"\n[harness: truncated, {counts[key] - len(b)} more bytes dropped; cap {format_size(cap)}]"
            return s, trunc

        out, out_tr = text("out", out_b)
        err, err_tr = text("err", err_b)
        if error is not None and exit_code is None:
            err += f"\n[harness: output stream broke: {type(error).__name__}: {str(error)[:200]}]"
        return ExecResult(
            cmd=cmd, exit_code=exit_code, timed_out=timed_out,
            wall_s=round(wall, 4),  # on a timeout: until the tree was killed, so slow kills show
            stdout=out, stderr=err, stdout_bytes=counts["out"], stderr_bytes=counts["err"],
            stdout_truncated=out_tr, stderr_truncated=err_tr,
        )

    def measured_exec(self, cmd: list[str], timeout: float, env: dict[str, str] | None = None, workdir: str | None = None) -> Measured:
        """``exec`` under the monitor: cgroup and host readings right before and right after
        the command (before anything else touches the container), and the saturation log."""
        t0 = time.monotonic()
        host0 = hoststats.read_host_snapshot(t0)
        cg0 = self.snapshot()
        mon = None
        if cg0 is not None and self._reader is not None:
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
        return Measured(result=res, counters=counters, host=host, samples=mon.samples if mon else [],
                        monitor_errors=mon.errors if mon else 0)

    # -- files out -------------------------------------------------------------
    def export(self, files: Iterable[tuple[str, int, bool]], timeout: float, dest: Path, then: Command | None = None) -> Exported:
        """Copy plain regular files out of the work directory into ``dest``, as a tar stream
        written in the sandbox (never the archive API), spooled to disk and copied member by
        member (the controller never holds a file in memory). Symlinks, devices, FIFOs and
        directories are refused; a file over its cap is cut (``keep_head``) or not kept, and
        either is reported. With ``then``, that command runs first, in the same exec (see
        :class:`Command`)."""
        spec = [(n, int(c), bool(k)) for n, c, k in files]
        for n, _, _ in spec:
            if "/" in n or n.startswith(".") or not n:
                raise ValueError(f"export name {n!r} must be a plain file name")
        cmd_cap = then.cap if then else 0
        limit = sum(c for _, c, _ in spec) + 2 * cmd_cap + 1024 * 1024  # members, headers and the manifest
        sink = tempfile.SpooledTemporaryFile(max_size=1024 * 1024, prefix="harness-export-")
        over = [False]

        def collect(chunk: bytes) -> None:
            if sink.tell() + len(chunk) > limit:
                over[0] = True
                return
            sink.write(chunk)

        workdir = WORKDIR if WORKDIR in self.profile.tmpfs else "/tmp"
        prog = {"files": spec, "workdir": workdir}
        if then is not None:
            prog.update(cmd=then.cmd, timeout=then.timeout, cap=then.cap)
        res = self.exec(["python3", "-I", "-S", "-c", _FINISH, json.dumps(prog)], timeout=timeout + (then.timeout if then else 0),
                        cap=64 * 1024, on_stdout=collect)
        problems: list[str] = []
        if res.timed_out:
            problems.append(f"export timed out after {timeout:.0f}s")
        if over[0]:
            problems.append(f"export stream larger than {format_size(limit)}; cut off")
        caps = {n: c for n, c, _ in spec}
        kept: dict[str, int] = {}
        cmd_out: dict[str, bytes] = {}
        manifest: dict[str, Any] = {}
        complete = False
        sink.seek(0)
        try:
            with tarfile.open(fileobj=sink, mode="r|") as tf:
                for m in tf:
                    if not m.isreg():
                        problems.append(f"refused {m.name!r}: not a regular file")
                        continue
                    if m.name == EXPORT_MANIFEST and m.size <= 64 * 1024:
                        f = tf.extractfile(m)
                        manifest = json.loads(f.read()) if f else {}
                        complete = True
                        continue
                    if m.name in (".harness-cmd-out", ".harness-cmd-err") and then is not None and m.size <= cmd_cap + 1:
                        f = tf.extractfile(m)
                        cmd_out[m.name[-3:]] = f.read() if f else b""
                        continue
                    if m.name not in caps:
                        problems.append(f"refused unexpected member {m.name!r}")
                        continue
                    if m.size > caps[m.name]:
                        problems.append(f"refused {m.name!r}: {format_size(m.size)} over the cap")
                        continue
                    f = tf.extractfile(m)
                    try:
                        with open(dest / m.name, "wb") as out:
                            if f is not None:
                                shutil.copyfileobj(f, out, 1024 * 1024)
                        kept[m.name] = m.size
                    except OSError as e:
                        problems.append(f"could not keep {m.name!r}: {e.strerror or e}")
        except (tarfile.TarError, ValueError) as e:
            problems.append(f"malformed export stream ({e}; exit {res.exit_code}: {res.stderr.strip()[-200:]})")
        finally:
            sink.close()
        manifest = manifest if isinstance(manifest, dict) else {}
        truncated = []
        for name, info in manifest.items():
            if not isinstance(info, dict) or name not in caps:
                continue
            if "refused" in info:
                size = f" ({format_size(info['size'])})" if isinstance(info.get("size"), int) else ""
                problems.append(f"refused {name!r}: {info['refused']}{size}"[:300])
            elif isinstance(info.get("size"), int) and isinstance(info.get("kept"), int) and info["kept"] < info["size"]:
                truncated.append(name)
                problems.append(f"kept the first {format_size(info['kept'])} of {name!r} ({format_size(info['size'])})")
        command = _command_result(then, manifest.get(".command"), cmd_out, res) if then is not None else None
        if res.exit_code not in (0, None) and not res.timed_out and not problems and command is None:
            problems.append(f"export failed (exit {res.exit_code}): {res.stderr.strip()[-200:]}")
        return Exported(files=kept, problems=problems, truncated=truncated, command=command, complete=complete)


def _command_result(then: Command, info: Any, out: dict[str, bytes], res: ExecResult) -> ExecResult:
    """The ``then`` command's result as the finish program reported it; when the program
    itself did not get that far (killed), what the exec says."""
    if not isinstance(info, dict) or not isinstance(info.get("exit_code"), int):
        return ExecResult(cmd=then.cmd, exit_code=res.exit_code if not res.timed_out else None, timed_out=res.timed_out,
                          wall_s=res.wall_s, stderr=res.stderr)

    def text(key: str) -> tuple[str, bool]:
        b = out.get(key, b"")
        return b[: then.cap].decode("utf-8", errors="replace"), len(b) > then.cap

    o, o_tr = text("out")
    e, e_tr = text("err")
    return ExecResult(cmd=then.cmd, exit_code=info["exit_code"], timed_out=bool(info.get("timed_out")),
                      wall_s=max(0.0, float(info.get("wall_s") or 0.0)), stdout=o, stderr=e,
                      stdout_bytes=int(info.get("out_bytes") or 0), stderr_bytes=int(info.get("err_bytes") or 0),
                      stdout_truncated=o_tr, stderr_truncated=e_tr)


def remove_all_live() -> int:
    """Remove every container this process still holds (Ctrl-C path). Returns how many."""
    return LIVE.remove_all(lambda sb: sb.remove())


def retry_removals() -> list[str]:
    """Try again to remove containers whose removal failed; returns the ones now gone."""
    done = []
    for sb in PENDING.snapshot():
        if sb.remove():
            done.append(sb.name)
    return done


def _remove_live_at_exit() -> None:
    for sb in LIVE.snapshot() + PENDING.snapshot():
        try:
            sb.remove()
        except Exception:
            pass


atexit.register(_remove_live_at_exit)


class DockerBackend(SandboxBackend):
    """Sandboxes as Docker containers on the engine ``client`` talks to."""

    def __init__(self, client: docker.DockerClient, inputs_root: Path | None = None):
        self.client = client
        self.inputs_root = inputs_root

    def sandbox(self, spec: SandboxSpec) -> DockerSandbox:
        if spec.inputs_root is None and self.inputs_root is not None:
            spec = SandboxSpec(**{**spec.__dict__, "inputs_root": self.inputs_root})
        return DockerSandbox(self.client, spec)

    def sweep_dead_owners(self) -> list[str]:
        removed = sweep_containers(self.client, only_dead_owners=True)
        if self.inputs_root is not None:
            removed += sweep_input_folders(self.inputs_root.resolve())
        return removed

    def sweep_run(self, run_id: str, held_too: bool = False) -> list[str]:
        if held_too:
            try:
                return sweep_containers(self.client, run_id=run_id)
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

    def check_command(self, image: str, command: str, profile: Any) -> str | None:
        probe = 'p=$(command -v -- "$1") && [ -f "$p" ] && [ -x "$p" ]'
        c = None
        try:
            c = self.client.containers.run(
                image, ["sh", "-c", probe, "sh", command], detach=True, user=profile.user, working_dir="/",
                network_mode="none", read_only=True, cap_drop=["ALL"], security_opt=["no-new-privileges"],
                mem_limit=profile.memory, pids_limit=64, log_config={"type": "none"},
                labels={LABEL: "1", LABEL_OWNER: str(os.getpid()), LABEL_HOST: controller_host()},
            )
            if c.wait(timeout=60).get("StatusCode") == 0:
                return None
            return (f"the agent command {command!r} is not an executable file on the PATH of image {image} "
                    f"(as uid {profile.user}); check --agent-cmd or agent_cmd in suite.toml")
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


def sweep_containers(client: docker.DockerClient, run_id: str | None = None, only_dead_owners: bool = False) -> list[str]:
    """Remove containers the harness left behind (by label). With ``only_dead_owners``, keep
    those whose owning controller process is still alive (or cannot be judged from here)."""
    filters = {"label": [f"{LABEL}=1"] + ([f"{LABEL_RUN}={run_id}"] if run_id else [])}
    removed = []
    here = controller_host()
    for c in client.containers.list(all=True, filters=filters):
        if only_dead_owners:
            owner = c.labels.get(LABEL_OWNER, "")
            host = c.labels.get(LABEL_HOST)
            if host is not None and host != here and not _legacy_host(host, here):
                continue  # another host or pid namespace: its pids mean nothing here
            if owner.isdigit() and pid_alive(int(owner)):
                continue
        try:
            c.remove(force=True)
            removed.append(c.name)
        except docker.errors.NotFound:
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
        found = client.containers.list(all=True, filters={"label": [f"{LABEL}=1", f"{LABEL_RUN}={run_id}"]})
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
