"""The Docker sandbox: one fresh container per attempt (and per service), under a fixed envelope.

A *workload sandbox* is kept alive by a sleeping init (``docker-init`` running ``sleep
infinity`` as an unprivileged keeper uid); every workload runs with ``exec`` so the
controller can read the container's cgroup counters *before* the container stops (its
cgroup vanishes with it), kill a whole process tree on timeout while keeping the container,
grade the final state inside it, and copy files out before removal. A sandbox whose only
workload is one command (``run_once``: ``harness sandbox exec``) starts it with the container
instead, under the same keeper (``harness.sandbox.launcher``). A *service* runs its own
command and stays up until the attempt removes it.

Files go in through read-only bind mounts of fresh host folders: ``/harness/in`` (the
agent's inputs), ``/harness/grade`` and other late directories (empty until every agent
process is gone), input trees (``/solution``, an agent directory). A writable-root sandbox
(a Harbor task) gets copies instead where the task expects writable files (``/tests``).
Files come out as described in ``harness.sandbox.finish``. The sandbox never gets a host
path it can write, nor the Docker socket.
"""

from __future__ import annotations

import atexit
import functools
import io
import json
import os
import re
import select
import shutil
import signal
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import Any, Iterable

import docker
import docker.errors
import requests
from docker.models.containers import _create_container_args
from docker.types.daemon import CancellableStream

from harness.core.envelope import check_envelope
from harness.measure import cgroup
from harness.measure import host as hoststats
from harness.measure.monitor import Monitor
from harness.model.counters import CgroupLimits, CgroupSnapshot, CounterDelta, HostDelta
from harness.model.errors import EngineError, SandboxError
from harness.model.sandbox import GRADE_DIR, INPUT_DIR, WORKDIR, EnvelopeCheck, ExecResult
from harness.model.units import format_size, printable_line
from harness.sandbox import launcher, seccomp
from harness.sandbox.base import Command, Exported, ExportFile, Measured, Sandbox, SandboxSpec, Tree
from harness.sandbox.finish import FINISH, check_names, finish_spec, read_archive, read_finish_stream, stream_limit
from harness.sandbox.owners import HOSTS, LABEL, LABEL_HOST, LABEL_OWNER, LiveRegistry, controller_host, input_folder

LIVE = LiveRegistry()  # the sandboxes this process holds
PENDING = LiveRegistry()  # containers whose removal failed; retried by retry_removals()
ROOT = "0:0"
KEEPER_WAIT_S = 10.0  # how long a started container's init may take to fork its keeper
ENGINE_CATCHUP_S = 10.0  # how long the engine may take to record the exit of an init the kernel saw end
HALT_WAIT_S = 1.0  # how long a halted container's processes may take to be gone before removal alone decides
# how long an exec may take to get a pid before its exit is polled for instead (the engine hands
# the stream over first; ~40 ms here, seconds in an emulated guest)
PID_WAIT_S = 30.0
NO_DNS = "198.51.100.53"  # TEST-NET-2: an upstream resolver nobody has; internal networks only


def keeper_user(workload_user: str) -> str:
    """uid:gid of the container's init and its sleeping keeper: unprivileged and never the
    workload's, so the workload can neither signal them (kill -1 would stop the container
    under the controller) nor ptrace them (a hijacked keeper is spared by kill_tree and
    could rewrite the state while it is exported)."""
    uid = 65534 if workload_user.split(":")[0] not in ("65534", "nobody") else 65533
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


def _state(path: str) -> str:
    """The state letter of /proc/.../stat ('' when it is gone); the comm before it may hold
    anything, so it is read after the last ')'."""
    try:
        return Path(path).read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _is_running(pid: int) -> bool:
    """Whether any thread of process ``pid`` still runs. A process whose leader thread has
    exited reads as a zombie while its other threads go on (or are still exiting: closing a
    million files takes seconds of CPU), so a zombie leader's threads are looked at too."""
    st = _state(f"/proc/{pid}/stat")
    if st != "Z":
        return st not in ("", "X")
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    return any(_state(f"/proc/{pid}/task/{t}/stat") not in ("", "Z", "X") for t in tids)


CAP_SYS_RESOURCE = 24


@functools.lru_cache(maxsize=1)
def can_spare_from_oom_killer() -> bool:
    """Whether this process may lower another's oom_score_adj (CAP_SYS_RESOURCE in effect:
    root on a host, not root in a container that dropped it). Read once: every sandbox start asks."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _gone_within(fd: int, wait_s: float) -> bool:
    """Whether the process of pidfd ``fd`` has ended within ``wait_s`` (a pidfd polls readable
    once its process has exited; a pid namespace's init exits only after every other task
    of the namespace, every thread, is gone)."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(max(0, int(wait_s * 1000))))


def _write_tree(root: Path, files: Tree) -> None:
    """Write trusted files (the suite's) into a host folder of ours."""
    for rel, (data, mode) in files.items():
        parts = PurePosixPath(rel).parts
        if not parts or any(p in ("..", "") for p in parts) or PurePosixPath(rel).is_absolute():
            raise SandboxError(f"file name {rel!r} must be a relative path inside its directory")
        fp = root.joinpath(*parts)
        fp.parent.mkdir(parents=True, exist_ok=True)
        for d in [fp.parent, *fp.parent.parents]:
            if d == root or root not in d.parents:
                break
            os.chmod(d, 0o755)
        fp.write_bytes(data)
        fp.chmod(0o555 if mode & 0o111 else 0o444)


def tree_tar(files: Tree, top: str) -> bytes:
    """A tar of ``files`` under the directory ``top`` (for the engine's put-archive)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        ti = tarfile.TarInfo(top)
        ti.type, ti.mode = tarfile.DIRTYPE, 0o755
        tf.addfile(ti)
        dirs = {top}
        for rel, (data, mode) in sorted(files.items()):
            parts = PurePosixPath(rel).parts
            for i in range(1, len(parts)):
                d = "/".join((top, *parts[:i]))
                if d not in dirs:
                    dti = tarfile.TarInfo(d)
                    dti.type, dti.mode = tarfile.DIRTYPE, 0o755
                    tf.addfile(dti)
                    dirs.add(d)
            ti = tarfile.TarInfo("/".join((top, *parts)))
            ti.size, ti.mode = len(data), 0o755 if mode & 0o111 else 0o644
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


class _ExitWatch:
    """The exit of an exec's own process, seen the moment it happens (a pidfd; Linux >= 5.3).
    ``of`` returns None when it cannot be watched from here (no pidfd, or the engine's pid is
    not this container's in this pid namespace): the caller polls the engine instead."""

    def __init__(self, fd: int | None):
        self.fd = fd
        self.at: float | None = None if fd is not None else time.monotonic()
        self._poll = select.poll() if fd is not None else None
        if self._poll is not None:
            self._poll.register(fd, select.POLLIN)

    @classmethod
    def of(cls, sb: "DockerSandbox", api: Any, exec_id: str, until: float) -> "_ExitWatch | None":
        """``until``: the exec's own deadline (its timeout is enforced by the caller past it)."""
        if not hasattr(os, "pidfd_open"):
            return None
        deadline = min(time.monotonic() + PID_WAIT_S, until)
        while True:  # the engine hands the stream over before it has started the process
            try:
                info = api.exec_inspect(exec_id)
            except (docker.errors.DockerException, requests.RequestException):
                return None
            pid = int(info.get("Pid") or 0)
            if pid > 0:
                break
            if not info.get("Running") and info.get("ExitCode") is not None:
                return cls(None)  # done before it was seen
            if time.monotonic() > deadline:
                return None
            time.sleep(0.005)
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return cls(None)  # already gone
        except OSError:  # e.g. EINVAL from an engine whose exec pid is not a process leader (seen under cgroup v2)
            return None
        if pid not in sb._procs():  # another pid namespace than the engine's: not ours to watch
            os.close(fd)
            return None
        return cls(fd)

    def exited(self, wait_s: float) -> bool:
        if self.at is not None:
            return True
        if self._poll is not None and self._poll.poll(int(wait_s * 1000)):
            self.at = time.monotonic()
        return self.at is not None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _Pump:
    """Collects one exec's demuxed output in a reader thread, each stream capped: past the cap,
    its first half and its last half are kept (a long run's end is where it failed) and what
    lay between is counted and dropped, marked where it was.

    ``close()`` stops collection and returns what was kept: after it, the reader thread
    (which may still be draining a killed command's pipe) changes nothing the caller reads."""

    def __init__(self, stream: Any, cap: int, on_stdout: Any = None):
        self._stream = stream
        self._cap = cap
        self._tail_cap = cap // 2
        self._on_stdout = on_stdout
        self._lock = threading.Lock()
        self._closed = False
        self.bufs = {"out": bytearray(), "err": bytearray()}  # the head, up to cap - tail_cap
        self.tails = {"out": bytearray(), "err": bytearray()}  # the last bytes past the head (trimmed as it grows)
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
                        self._keep(key, chunk)
        except BaseException as e:  # the stream breaks when the engine goes away
            with self._lock:
                self.error = e

    def _keep(self, key: str, chunk: bytes) -> None:
        head = self.bufs[key]
        room = self._cap - self._tail_cap - len(head)
        if room > 0:
            head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self._tail_cap:
            tail = self.tails[key]
            tail += chunk[-2 * self._tail_cap:]
            if len(tail) > 2 * self._tail_cap:  # trimmed in halves: amortized, not per chunk
                del tail[:len(tail) - self._tail_cap]

    def kept(self, key: str) -> tuple[bytes, int]:
        """(the bytes kept, how many were dropped between head and tail) of a stream: all of it
        up to the cap, else its head and its last ``cap // 2`` bytes."""
        head, tail = bytes(self.bufs[key]), bytes(self.tails[key])
        if self.counts[key] <= self._cap:
            return head + tail, 0
        tail = tail[-self._tail_cap:] if self._tail_cap else b""
        return head + tail, self.counts[key] - len(head) - len(tail)

    def close(self) -> tuple[tuple[bytes, int], tuple[bytes, int], dict[str, int], BaseException | None]:
        with self._lock:
            self._closed = True
            return self.kept("out"), self.kept("err"), dict(self.counts), self.error


def _rendered(b: bytes, cut: int, cap: int, raw: bool = False) -> tuple[str, bool]:
    """(text, truncated) of one kept stream: where ``cut`` bytes were dropped, a marker says so."""
    if not cut or raw:
        return b.decode("utf-8", errors="replace"), False
    at = len(b) - (cap // 2)  # where the dropped middle was
    head, tail = b[:at].decode("utf-8", errors="replace"), b[at:].decode("utf-8", errors="replace")
    return (f"{head}\n[harness: truncated, {cut} bytes dropped here; cap {format_size(cap)}: "
            f"its first and last halves kept]\n{tail}"), True


_DATA_DEVICE: dict[int, tuple[str, str] | None] = {}


def start_failure(cmd: list[str], engine_said: str) -> tuple[int, str]:
    """(exit status, one line) for a command the engine could not start, from what the engine
    wrote in its place ("OCI runtime exec failed: ... exec: "x": executable file not found in
    $PATH: unknown", exit 126 whatever the cause): 127 when the command is not there, 126 when
    it is there but cannot be executed (permission denied, a directory, a noexec mount), as a
    shell has it."""
    lines = engine_said.strip().splitlines()
    text = lines[-1].strip() if lines else ""
    why = re.sub(r"^.*?unable to start container process: ", "", text)
    why = re.sub(r'^exec: "(?:[^"\\]|\\.)*": ', "", why).removesuffix(": unknown").strip()
    name = printable_line(cmd[0] if cmd else "")
    why = printable_line(why[:200]) or "the engine gave no reason"
    if re.search(r"not found|no such file", why, re.I):
        return 127, f"command not found in the sandbox: {name} ({why})"
    return 126, f"command cannot be executed in the sandbox: {name} ({why})"


def data_device(client: Any) -> tuple[str, str] | None:
    """(device node, 'MAJ:MIN') of the disk under the engine's data root, where a container's
    image layers and writable root live: what a profile's disk limits apply to. None when it
    is on no block device here. Asked of the engine once per client."""
    key = id(client)
    if key not in _DATA_DEVICE:
        try:
            root = client.info().get("DockerRootDir") or "/var/lib/docker"
        except (docker.errors.DockerException, requests.RequestException):
            return None
        _DATA_DEVICE[key] = hoststats.block_device_of(root)
    return _DATA_DEVICE[key]


# run_once starts a lone command with its container (harness.sandbox.launcher); HARNESS_ONESHOT=0
# runs it through exec as every other workload (for comparison)
ONESHOT = os.environ.get("HARNESS_ONESHOT", "1") != "0"
_NO_LAUNCHER: set[str] = set()  # images (in this process) found without the launcher's tools
# per engine (its URL), where its containers' cgroups lie, the container id left as {id}: learnt
# from one located the usual way (the init's /proc/PID/cgroup), so a one-shot start can find its
# init from the cgroup alone, without asking the engine (an inspect) for its pid
_CGROUP_LAYOUT: dict[str, cgroup.CgroupPaths] = {}


class _NeverStarted(Exception):
    """The launcher found the command missing or not executable, before its fork (``code``)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class _NoLauncher(Exception):
    """The launcher could not run in this image (``lacks``: it said it lacks its tools)."""

    def __init__(self, image: str, lacks: bool = True):
        super().__init__(image)
        self.lacks = lacks


@functools.lru_cache(maxsize=64)
def _image_sets_home(client: Any, image: str) -> bool:
    try:
        env = client.api.inspect_image(image)["Config"].get("Env") or []
    except (docker.errors.DockerException, requests.RequestException, KeyError, TypeError):
        return False
    return any(str(e).startswith("HOME=") and str(e) != "HOME=" for e in env)  # an empty HOME is filled in, as unset


def _at_birth(first: CgroupSnapshot, t: float) -> CgroupSnapshot:
    """The counters of a cgroup at its creation, at time ``t``: every count zero (where the
    first reading has it at all), so a delta from it covers the cgroup's whole life."""
    zero = {k: 0 for k, v in first.model_dump().items() if isinstance(v, int) and k != "t"}
    for k in ("psi_cpu", "psi_memory", "psi_io"):
        psi = getattr(first, k)
        if psi is not None:
            zero[k] = psi.model_copy(update={"some_us": 0, "full_us": None if psi.full_us is None else 0})
    return first.model_copy(update={**zero, "t": t})


def _attach(api: Any, cid: str) -> Any:
    """``api.attach(cid, stdout=True, stderr=True, stream=True, demux=True)`` without the
    inspect docker-py makes first to learn whether the container has a tty (~1.6 ms): a
    workload container never has one. Its output frames, demultiplexed, as (stdout, stderr)."""
    resp = api._post(api._url("/containers/{0}/attach", cid), headers={"Connection": "Upgrade", "Upgrade": "tcp"},
                     params={"logs": 0, "stdout": 1, "stderr": 1, "stream": 1}, stream=True)
    return CancellableStream(api._read_from_socket(resp, True, tty=False, demux=True), resp)


class _Once:
    """One command started with its container: what the launcher is given, and what it started."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None):
        self.cmd = list(cmd)
        self.env = dict(env or {})
        self.stream: Any = None  # the container's attach stream, opened before it starts
        self.t0: float | None = None  # right before the engine starts it: the counters' window
        self.started: float | None = None  # once the engine has started it
        self.host0: Any = None
        self.workload: int | None = None  # host pid of the command

    def kwargs(self, sb: "DockerSandbox", kw: dict[str, Any]) -> dict[str, Any]:
        env = {**(kw.get("environment") or {}), **self.env}
        # a HOME as the engine would give an exec under the workload's uid (its passwd entry),
        # unless the image or the caller set one: the container itself starts as root
        if env.get("HOME") == "":  # filled in by the engine under exec, as an unset one
            env.pop("HOME")
        set_home = "HOME" not in env and not _image_sets_home(sb.client, sb.image)
        argv = launcher.argv(sb.user, set_home, env, self.cmd)
        # stdin open and never written: the keeper blocks reading it (launcher)
        return dict(entrypoint=argv[:-len(self.cmd)], command=self.cmd, user=ROOT, init=False, stdin_open=True, cap_add=launcher.CAPS,
                    working_dir=sb._workdir(), environment=env or None)

    def create_start(self, sb: "DockerSandbox", kw: dict[str, Any]) -> Any:
        api = sb.client.api
        # containers.create's own conversion of run()'s arguments, without the inspect it makes
        # after (the start below is followed by one anyway)
        args = _create_container_args({**{k: v for k, v in kw.items() if k != "detach"}, "image": sb.image, "version": api._version})
        c = sb.client.containers.prepare_model({"Id": api.create_container(**args)["Id"]})
        sb.container = c  # a failed attach or start still finds it to remove
        self.stream = _attach(api, c.id)
        self.t0 = time.monotonic()
        self.host0 = hoststats.read_host_snapshot(self.t0)
        c.start()
        self.started = time.monotonic()  # the command's clock: its wall and its timeout
        return c


class DockerSandbox(Sandbox):
    """One container under one envelope (see the module docstring)."""

    def __init__(self, client: docker.DockerClient, spec: SandboxSpec):
        self.client = client
        self.spec = spec
        self.profile = spec.profile
        self.cpuset = list(spec.cpuset)
        self.image = spec.image
        self.user = spec.user or spec.profile.user
        self.service = spec.command is not None
        self.name = f"harness-{uuid.uuid4().hex[:12]}"
        self.container: Any = None
        self.pid: int | None = None
        self.paths: cgroup.CgroupPaths | None = None
        self.envelope: EnvelopeCheck | None = None
        self._reader: cgroup.SnapshotReader | None = None
        self._folder: Path | None = None
        self._late: dict[str, Path] = {}
        self._keep_pids: set[int] = set()
        self._removed = False
        self._halted = False  # halt() saw every process of it end
        self._yielded: str | None = None  # the CPU weight it had before yield_cpu()
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
        bind_trees = {} if spec.writable_root else spec.trees
        folders = bool(spec.inputs or spec.with_grade_dir or spec.late_dirs or bind_trees)
        if not folders and not self.isolated:
            return {}
        root = spec.inputs_root or Path(os.environ.get("HARNESS_HOME", ".harness")) / "inputs"
        try:
            self._folder = input_folder(root.resolve(), self.name)
        except OSError as e:
            raise SandboxError(f"cannot make the input folder under {root}: {e}; set HARNESS_HOME to a folder you own") from None
        volumes: dict[str, dict[str, str]] = {}
        if self.isolated:  # the engine writes no /etc/hosts for a sandbox without a network
            hosts = self._folder / "hosts"
            hosts.write_bytes(HOSTS)
            hosts.chmod(0o444)
            volumes[str(hosts)] = {"bind": "/etc/hosts", "mode": "ro"}
        if not folders:
            return volumes

        def folder(sub: str, at: str) -> Path:
            d = self._folder / sub
            d.mkdir(mode=0o755)
            os.chmod(d, 0o755)
            volumes[str(d)] = {"bind": at, "mode": "ro"}
            return d

        indir = folder("in", INPUT_DIR)
        for fname, data in spec.inputs.items():
            if "/" in fname or fname.startswith(".") or not fname:
                raise SandboxError(f"input name {fname!r} must be a plain file name")
            fp = indir / fname
            fp.write_bytes(data)
            fp.chmod(0o444)
        late = list(spec.late_dirs) + ([GRADE_DIR] if spec.with_grade_dir else [])
        if spec.writable_root:
            late = [d for d in late if d == GRADE_DIR]  # the others are copied in (put_tree)
        for i, at in enumerate(dict.fromkeys(late)):
            self._late[at] = folder(f"late{i}", at)
        for i, (at, files) in enumerate(bind_trees.items()):
            _write_tree(folder(f"tree{i}", at), files)
        return volumes

    def start(self) -> None:
        """Create and start the container, locate its cgroup and read the envelope back."""
        with self._lock:
            if self._removed:
                raise SandboxError(f"sandbox {self.name} was removed before it started")
            self._start()

    def _run_kwargs(self, volumes: dict[str, dict[str, str]]) -> dict[str, Any]:
        p, spec = self.profile, self.spec
        uid, _, gid = self.user.partition(":")
        owner = f"uid={uid},gid={gid or uid}," if uid.isdigit() else ""
        tmpfs = {}
        paths = {} if spec.writable_root else dict(p.tmpfs)
        paths.update(spec.tmpfs)
        for path, size in paths.items():
            opts = f"size={size},mode=1777" if path == "/tmp" else f"size={size},{owner}mode=0755"
            tmpfs[path] = opts + ",nosuid,nodev"
        labels = {LABEL: "1", LABEL_OWNER: str(os.getpid()), LABEL_HOST: controller_host(), **spec.labels}
        kw: dict[str, Any] = dict(
            name=self.name, detach=True, init=True, cpu_period=p.cpu_period_us, cpu_quota=p.quota_us,
            cpuset_cpus=",".join(str(c) for c in self.cpuset), mem_limit=p.memory, memswap_limit=p.memory,
            pids_limit=p.pids, read_only=not spec.writable_root, tmpfs=tmpfs, cap_drop=["ALL"], cap_add=list(spec.caps) or None,
            # no-new-privileges would also empty the capabilities of a root workload's execs (the
            # keeper is not root); a root workload has nothing to gain by execve beyond the
            # bounding set, which is ROOT_CAPS, so it runs without it and keeps those capabilities;
            # every container gets the harness's seccomp profile (harness.sandbox.seccomp)
            security_opt=[seccomp.security_opt()] + ([] if spec.caps and not self.service else ["no-new-privileges"]),
            labels=labels, volumes=volumes, ipc_mode="private",
            stop_signal="SIGKILL", environment=dict(spec.env) or None,
        )
        if self.service:
            kw.update(command=spec.command or None, user=spec.user, log_config={"type": "json-file", "config": {"max-size": "1m"}})
        else:
            # the workload's directory is private to its uid; execs set it
            kw.update(command=["sleep", "infinity"], user=keeper_user(self.user), working_dir="/", log_config={"type": "none"})
        if spec.writable_root and p.storage:
            kw["storage_opt"] = {"size": str(p.storage)}
        if p.io_read_bps is not None or p.io_write_bps is not None:
            dev = data_device(self.client)
            if dev is not None:
                if p.io_read_bps is not None:
                    kw["device_read_bps"] = [{"Path": dev[0], "Rate": int(p.io_read_bps)}]
                if p.io_write_bps is not None:
                    kw["device_write_bps"] = [{"Path": dev[0], "Rate": int(p.io_write_bps)}]
        if spec.network:
            kw.update(network=spec.network, networking_config={
                spec.network: self.client.api.create_endpoint_config(aliases=list(spec.aliases) or None)})
            if not spec.egress:
                # names outside the attempt must not resolve: the engine's resolver forwards them
                # from the container's own namespace, which has no route, and a non-loopback
                # upstream is never tried from the host's (loopback ones would be); fail in ~1 s
                kw.update(dns=[NO_DNS], dns_opt=["timeout:1", "attempts:1"])
        elif spec.egress:
            kw["network"] = spec.egress
        else:
            # its own network namespace with loopback only, as network_mode none, without the
            # engine's network sandbox: Docker 20.10 re-executes dockerd as a prestart hook for
            # every container it networks ('none' included), 80 ms of engine CPU per container
            kw.update(network_mode="none", network_disabled=True)
        return kw

    @property
    def isolated(self) -> bool:
        """No network at all (the profile's ``none``): loopback only, /etc/hosts ours."""
        return not self.spec.network and not self.spec.egress

    def _start(self, once: "_Once | None" = None) -> None:
        p = self.profile
        LIVE.add(self.name, self)
        try:
            volumes = self._mounts()
        except BaseException:
            self.remove()
            raise
        self.storage_note: str | None = None
        kw = self._run_kwargs(volumes)
        if once is not None:
            kw.update(once.kwargs(self, kw))
        try:
            try:
                self.container = self.client.containers.run(self.image, **kw) if once is None else once.create_start(self, kw)
            except docker.errors.APIError as e:
                if "storage_opt" not in kw or "storage" not in str(e).lower() and "quota" not in str(e).lower():
                    raise
                kw.pop("storage_opt")  # the storage driver has no quotas: recorded, not enforced
                self.storage_note = (f"storage {format_size(p.storage)} not enforced: the engine's storage driver has no "
                                     f"per-container quota ({str(e.explanation or e)[:120]})")
                self.container = self.client.containers.run(self.image, **kw)
            if self.spec.network and self.spec.egress:
                self.client.networks.get(self.spec.egress).connect(self.container)
            found = self._init_from_cgroup() if once is not None else None
            if found is None:
                self.container.reload()
                self.pid = int(self.container.attrs["State"]["Pid"])
            else:
                self.pid, self.paths = found
        except docker.errors.ImageNotFound:
            self.remove()
            raise SandboxError(f"image {self.image} not found; build it with `make images`") from None
        except (docker.errors.DockerException, requests.RequestException) as e:
            self.remove()
            if once is not None and once.started is None and isinstance(e, docker.errors.APIError):
                # the engine's own refusal to create or start it (no /bin/sh?): nothing ran (a
                # lost answer may hide a start that happened: that is no fallback)
                raise _NoLauncher(self.image, lacks=False) from None
            raise SandboxError(f"engine refused to start a container from {self.image}: {str(e)[:300]}") from None
        if not self.pid:
            st = self.container.attrs.get("State") or {}
            self.remove()
            if once is not None and not st.get("OOMKilled"):  # its launcher ended before the keeper had the command
                self._launcher_ended(st.get("ExitCode"))
            raise SandboxError(f"container {self.name} did not start (State.Pid is 0): {self.logs_tail()}")
        try:
            if self.paths is None:
                self.paths = cgroup.locate(self.pid)
                self._learn_layout()
            self._reader = cgroup.SnapshotReader(self.paths)
            applied = cgroup.read_limits(self.paths)
        except (OSError, cgroup.CgroupError):
            applied = None
        dev = data_device(self.client) if p.io_read_bps is not None or p.io_write_bps is not None else None
        self.envelope = check_envelope(p, self.cpuset, applied, dev[1] if dev else None)
        if once is not None:
            # the init's child becomes the keeper; the workload is its fork, found before the
            # keeper is spared from the OOM killer (a fork made after would inherit that)
            keeper, once.workload = self._launched()
            self._keep_pids = {self.pid, keeper}
        else:
            # the init and its sleeping child survive kill_tree(); everything else is the workload
            self._keep_pids = {self.pid, self._keeper()} if not self.service else set()
        self._spare_from_oom_killer()
        if self.spec.writable_root:
            for at, files in self.spec.trees.items():
                self.put_tree(at, files)

    def _learn_layout(self) -> None:
        cid = self.container.id
        fields = {k: v for k, v in self.paths.model_dump().items() if isinstance(v, str) and k != "driver"}
        if all(cid in v for k, v in fields.items()):
            _CGROUP_LAYOUT[self.client.api.base_url] = self.paths.model_copy(update={k: v.replace(cid, "{id}") for k, v in fields.items()})

    def _init_from_cgroup(self) -> tuple[int, cgroup.CgroupPaths] | None:
        """(host pid of the init, its cgroup) of a container just started, read from its cgroup
        where this engine's layout is known (``_CGROUP_LAYOUT``): the process in it that is pid 1
        of the container's namespace. None where the layout is unknown or nothing answers to
        it (the init already ended): the engine is asked instead."""
        layout = _CGROUP_LAYOUT.get(self.client.api.base_url)
        if layout is None:
            return None
        cid = self.container.id
        paths = layout.model_copy(update={k: v.replace("{id}", cid) for k, v in layout.model_dump().items()
                                          if isinstance(v, str) and "{id}" in v})
        try:
            procs = Path(paths.memory, "cgroup.procs").read_text().split()
        except OSError:
            return None
        for p in procs:
            # NSpid lists the pid in this namespace and in each below: the container's is the second
            nspid = launcher.status_field(int(p), "NSpid:")
            if nspid is not None and len(nspid) >= 2 and nspid[1] == "1":
                return int(p), paths
        return None

    def _launched(self) -> tuple[int, int]:
        """(keeper, workload) host pids of a one-shot container (``harness.sandbox.launcher``),
        once the keeper has forked the workload. Raises
        ``_NoLauncher`` when the image lacks the launcher's tools."""
        if self.paths is None and _is_running(self.pid):  # (an init already gone says why below)
            self.remove()
            raise SandboxError(f"container {self.name}: its processes cannot be seen from here (a remote engine?)")
        deadline = time.monotonic() + KEEPER_WAIT_S
        while True:
            found = launcher.launched(self.pid)
            if found is not None:
                return found
            init_gone = not _is_running(self.pid)
            if init_gone or time.monotonic() > deadline:
                got = self._final_state()
                st = got[0] if not isinstance(got, str) else {}
                ended = self.how_it_ended(got) or "no word from its engine"
                self.remove()
                if init_gone and not st.get("OOMKilled"):
                    # the init ended before its keeper held the command: its exit code says
                    # whether the command can have started (the command, if it was forked at
                    # all, had no keeper and ended with the init within milliseconds)
                    self._launcher_ended(st.get("ExitCode"))
                if not init_gone:  # a launcher the controller cannot follow here: exec from now on
                    _NO_LAUNCHER.add(self.image)
                raise SandboxError(f"container {self.name}: its launcher started no command ({ended})")
            time.sleep(0.0005)

    def _launcher_ended(self, code: Any) -> None:
        """The init ended (``code``) before its keeper was seen holding the command: the launcher
        stopped before its fork (its own statuses, or a shell's error before it), or its keeper
        ended (``KEEPER_ENDED``) or it was killed (128 + the signal: the memory ceiling) at a
        moment the command may already have been forked: never run again through exec, then."""
        if code in (launcher.NOT_FOUND, launcher.NOT_EXECUTABLE):
            raise _NeverStarted(code)
        if isinstance(code, int) and 0 <= code < 128 and code != launcher.KEEPER_ENDED:
            raise _NoLauncher(self.image, code == launcher.NO_LAUNCHER)
        if code == launcher.KEEPER_ENDED:
            _NO_LAUNCHER.add(self.image)  # a keeper that ends by itself: this image's commands run through exec from now on
        raise SandboxError(f"container {self.name}: its launcher ended (exit code {code}) before it was seen holding the "
                           "command, which may have started: not run again")

    def _keeper(self) -> int:
        """The pid of the init's one child, ``sleep infinity``, once the init has forked it.
        The engine reports the container started once its init runs, which may be before that
        fork: a keeper missing from ``_keep_pids`` would be taken for the workload and killed by
        kill_tree(), and the container would die with it (the likely cause of a CI run whose
        container was gone right after its agent's kill_tree; not reproduced on demand here)."""
        deadline = time.monotonic() + KEEPER_WAIT_S
        while True:
            kids = self._children(self.pid)
            if kids:
                return kids[0]
            running = _is_running(self.pid)
            if not running or time.monotonic() > deadline:
                alive = "still runs" if running else "is gone"
                self.remove()
                raise SandboxError(f"container {self.name}: its init started no keeper process within {KEEPER_WAIT_S:g} s "
                                   f"(the init {alive})")
            time.sleep(0.002)

    def _spare_from_oom_killer(self) -> None:
        """The init and its keeper are never the memory ceiling's victims: a workload that fills
        its tmpfs mounts (memory of no process) up to the limit left the keeper, as small as
        any other process, as likely a victim as itself; the init then ended and the container
        with it. Set from the host, where the controller may lower oom_score_adj
        (CAP_SYS_RESOURCE; `harness doctor` says when it may not). Without it, a container the
        ceiling took down is still the agent's OOM failure (the kernel's count says so), never
        the engine's (see the pipeline)."""
        self.oom_spared = False
        if not can_spare_from_oom_killer():
            return
        try:
            for pid in self._keep_pids:
                Path(f"/proc/{pid}/oom_score_adj").write_text("-1000")
        except OSError:
            return
        self.oom_spared = True

    @property
    def notes(self) -> list[str]:
        """Parts of the envelope not enforced here (recorded with the attempt)."""
        note = getattr(self, "storage_note", None)
        if note is None and self.spec.writable_root and self.profile.storage is None:
            note = "writable root without a size limit (the profile sets no `storage`)"
        return [note] if note else []

    def logs_tail(self, lines: int = 5) -> str:
        """The last lines a service printed (its log is kept, capped at 1 MiB)."""
        try:
            raw = self.container.logs(tail=lines).decode("utf-8", errors="replace") if self.container is not None else ""
        except (docker.errors.DockerException, requests.RequestException):
            return ""
        return " | ".join(x.strip() for x in raw.strip().splitlines() if x.strip())[-600:]

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
        if self._halted and self.container is not None:
            # halted from the host: once the engine has recorded the exit, removal is a plain
            # one (a forced removal of a container it still calls running kills and waits again)
            try:
                self.client.api.wait(self.container.id, timeout=2)
            except Exception:  # still running after all, gone, the engine slow or away: removal decides
                pass
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

    def _final_state(self) -> tuple[dict[str, Any], bool] | str:
        """The engine's State of a container that is no longer alive, and whether the engine
        had still not recorded its end ``ENGINE_CATCHUP_S`` after its init exited; or why not."""
        if self.container is None or self._removed:
            return "removed by the harness" if self._removed else ""
        deadline = time.monotonic() + ENGINE_CATCHUP_S
        while True:
            try:
                self.container.reload()
            except docker.errors.NotFound:
                return "removed (the engine no longer has it)"
            except (docker.errors.DockerException, requests.RequestException) as e:
                return f"the engine did not answer: {str(e)[:120]}"
            st = self.container.attrs.get("State") or {}
            # The kernel knows first: an init that is gone while the engine still says running
            # means the engine has not handled the exit yet (slow hosts take a while); wait for it.
            lagging = st.get("Status") == "running" and self.pid is not None and not _is_running(self.pid)
            if not lagging or time.monotonic() >= deadline:
                return st, lagging
            time.sleep(0.05)

    def yield_cpu(self) -> bool:
        if self.paths is None or self._yielded is not None:
            return False
        try:
            self._yielded = cgroup.set_cpu_weight(self.paths, cgroup.LOWEST_CPU_WEIGHT[self.paths.version])
        except (OSError, cgroup.CgroupError):  # not ours to write (a read-only /sys/fs/cgroup): nothing overlaps it
            return False
        return True

    def reclaim_cpu(self) -> None:
        if self._yielded is None or self.paths is None:
            return
        try:
            cgroup.set_cpu_weight(self.paths, self._yielded)
        except (OSError, cgroup.CgroupError) as e:
            raise SandboxError(f"the CPU weight of {self.name} could not be given back ({e})") from None
        self._yielded = None

    def oom_killed(self) -> bool:
        got = self._final_state()
        return not isinstance(got, str) and bool(got[0].get("OOMKilled"))

    def how_it_ended(self, got: tuple[dict[str, Any], bool] | str | None = None) -> str:
        """The engine's account of the container's end (``got``: a ``_final_state()`` already read)."""
        got = self._final_state() if got is None else got
        if isinstance(got, str):
            return got
        st, lagging = got
        parts = [f"status {st.get('Status')}", f"exit code {st.get('ExitCode')}", f"OOM-killed {bool(st.get('OOMKilled'))}"]
        if st.get("Error"):
            parts.append(f"engine error {str(st['Error'])[:120]!r}")
        if lagging:
            parts.append(f"but its init has exited and the engine had not recorded the end within {ENGINE_CATCHUP_S:g} s")
        return ", ".join(parts)

    def set_envelope(self, memory: int, cpu_quota_us: int) -> CgroupLimits | None:
        if self.paths is not None:
            # the kernel's files directly, read back: the engine's update would write the same
            # files after a round trip through dockerd and runc (~30 ms of every attempt's grade
            # on the critical path). Where they are not ours to write, the engine does it.
            try:
                return cgroup.write_limits(self.paths, memory, cpu_quota_us)
            except (OSError, cgroup.CgroupError):
                pass
        try:
            self.container.update(mem_limit=memory, memswap_limit=memory, cpu_quota=cpu_quota_us)
        except (docker.errors.DockerException, requests.RequestException) as e:
            raise SandboxError(f"the engine refused the grade envelope for {self.name}: {str(e)[:200]}") from None
        try:
            return cgroup.read_limits(self.paths) if self.paths else None
        except (OSError, cgroup.CgroupError):
            return None

    # -- files in --------------------------------------------------------------
    def put_grade_files(self, files: dict[str, bytes]) -> None:
        for fname in files:
            if "/" in fname or fname.startswith(".") or not fname:
                raise SandboxError(f"grade file name {fname!r} must be a plain file name")
        self.put_tree(GRADE_DIR, {k: (v, 0o444) for k, v in files.items()})

    def put_tree(self, dest: str, files: Tree) -> None:
        if dest in self._late:
            _write_tree(self._late[dest], files)
            return
        if not self.spec.writable_root:
            raise SandboxError(f"sandbox {self.name} has no late directory {dest} (declare it when the sandbox is made)")
        reset = self.exec(["sh", "-c", 'rm -rf -- "$1" && mkdir -p -- "$1"', "sh", dest], timeout=60, user=ROOT, workdir="/")
        if reset.exit_code != 0:
            raise SandboxError(f"cannot make {dest} in {self.name}: {(reset.stderr or reset.stdout).strip()[-200:]}")
        parent, top = os.path.split(dest.rstrip("/"))
        self._put(parent or "/", tree_tar(files, top))

    def put_archive(self, dest: str, tar_path: Path) -> None:
        if not self.spec.writable_root:
            raise SandboxError(f"sandbox {self.name} has a read-only root; files reach it through its mounts")
        mk = self.exec(["mkdir", "-p", "--", dest], timeout=60, user=ROOT, workdir="/")
        if mk.exit_code != 0:
            raise SandboxError(f"cannot make {dest} in {self.name}: {(mk.stderr or mk.stdout).strip()[-200:]}")
        with open(tar_path, "rb") as f:
            self._put(dest, f)

    def _put(self, dest: str, data: Any) -> None:
        try:
            if not self.container.put_archive(dest, data):
                raise SandboxError(f"the engine refused to copy files into {dest} of {self.name}")
        except (docker.errors.DockerException, requests.RequestException) as e:
            raise SandboxError(f"copying files into {dest} of {self.name} failed: {str(e)[:200]}") from None

    # -- processes -------------------------------------------------------------
    def _procs(self) -> list[int]:
        """Host pids of every process in the container's cgroup (cgroup.procs, v1 and v2)."""
        if self.paths is None:
            return []
        try:
            return [int(x) for x in Path(self.paths.memory, "cgroup.procs").read_text().split()]
        except OSError:
            return []

    _children = staticmethod(launcher.children)

    def workload_alive(self) -> bool:
        return any(p not in self._keep_pids and _is_running(p) for p in self._procs())

    def kill_tree(self) -> int:
        """SIGKILL every process of the workload (all but the init and its sleep), including
        orphans that left the exec's process group. The cgroup is frozen first, so a fork
        bomb cannot outrun the kill. Returns how many processes were signalled."""
        if self.paths is None or self.service:
            return 0
        if not [p for p in self._procs() if p not in self._keep_pids]:
            return 0  # nothing left: no need to freeze
        killed = 0
        frozen = False
        try:
            self.container.pause()
            frozen = True
        except (docker.errors.DockerException, requests.RequestException):
            pass  # killed unfrozen below; it may be paused all the same (a timed-out answer), so it is thawed either way
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
            try:
                self.container.unpause()
            except (docker.errors.DockerException, requests.RequestException):
                pass  # not paused (the pause was refused), or the engine is gone
        # SIGKILL is delivered once thawed; wait briefly until they are gone
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if not self.workload_alive():
                break
            time.sleep(0.02)
        return killed

    def halt(self, wait_s: float = HALT_WAIT_S) -> bool:
        """SIGKILL the container's init from the host (a pid namespace dies with its init: the
        kernel kills the rest), through a pidfd taken while the pid is still in the container's
        cgroup, so a reused pid is never signalled; then wait until nothing of it runs. The
        engine's removal that follows finds an exited container. False where the pid or the
        cgroup cannot be seen from here (a remote engine), or something still runs."""
        with self._lock:
            if self._removed or not self.pid or self.paths is None:
                return False
            try:
                fd = os.pidfd_open(self.pid)
            except ProcessLookupError:
                fd = None
            except OSError:
                return False
            deadline = time.monotonic() + wait_s
            try:
                if fd is not None and self.pid in self._procs():
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    # the init ends last: once it has, no task of its namespace is left (a
                    # thread still exiting holds it back, which the cgroup's process list
                    # would not show: its leader reads as a zombie)
                    if not _gone_within(fd, wait_s):
                        return False
            except ProcessLookupError:
                pass
            except OSError:
                return False
            finally:
                if fd is not None:
                    os.close(fd)
            while any(_is_running(p) for p in self._procs()):
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.002)
            self._halted = True
            return True

    def healthy(self, cmd: list[str] | None, timeout: float, stop: Any = None) -> str | None:
        """Poll a service: it must keep running, and ``cmd`` (when given) must exit 0 in it."""
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            if stop is not None and stop.is_set():
                return "the controller was stopped while the service started"
            if not self.alive():
                return f"exited before it was healthy ({self.how_it_ended() or 'no word from its engine'}): {self.logs_tail() or 'no output'}"
            if cmd is None:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return f"not healthy after {timeout:g} s (health check: {last or 'no output'})"
            res = self.exec(cmd, timeout=min(10.0, max(1.0, left)), cap=4096, user=self.spec.user or "")
            if res.exit_code == 0:
                return None
            last = ((res.stderr or res.stdout).strip().splitlines() or [f"exit {res.exit_code}"])[-1][:200]
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    # -- exec ------------------------------------------------------------------
    def exec(self, cmd: list[str], timeout: float, env: dict[str, str] | None = None, workdir: str | None = None,
             cap: int | None = None, user: str | None = None, on_stdout: Any = None, stop_at_exit: bool = False) -> ExecResult:
        """Run ``cmd`` in the container with a wall-clock timeout. On timeout, or when the
        command exits but leaves processes holding its output open, the whole workload
        process tree is killed. Output beyond ``cap`` bytes per stream is counted and dropped.
        ``on_stdout`` receives raw stdout bytes instead of the capped buffer (for exports).
        ``user`` '' runs as the image's user (services). ``stop_at_exit`` (the agent): the
        moment the command's own process exits, whatever it left running is frozen and killed
        (its exit is watched through a pidfd; where none can be had, the engine is asked every
        50 ms), so nothing it started can change the state after it ended."""
        cap = self.profile.output_cap if cap is None else cap
        workdir = workdir or self._workdir()
        user = self.user if user is None else user
        api = self.client.api
        t0 = time.monotonic()
        try:
            ex = api.exec_create(self.container.id, cmd, environment=env or {}, workdir=workdir, user=user)
            stream = api.exec_start(ex["Id"], stream=True, demux=True)
        except (docker.errors.DockerException, requests.RequestException) as e:
            return ExecResult(cmd=cmd, exit_code=None, wall_s=time.monotonic() - t0, stderr=f"engine error: {str(e)[:300]}")
        pump = _Pump(stream, cap, on_stdout).start()
        timed_out = False
        exited_at: float | None = None
        deadline = t0 + timeout
        next_poll = t0 + 0.2
        stop_at_exit = stop_at_exit and not self.service
        watch = _ExitWatch.of(self, api, ex["Id"], deadline) if stop_at_exit else None
        # without a pidfd the engine is asked: for the agent often and with no grace after its exit
        poll_s, grace_s = (0.05, 0.0) if stop_at_exit else (0.2, 0.5)
        while pump.thread.is_alive():
            if watch is not None:
                if watch.exited(0.02):
                    exited_at = watch.at
                    self.kill_tree()  # its orphans stop with it; the pipe drains what they wrote
                    pump.thread.join(timeout=5)
                    break
            else:
                pump.thread.join(timeout=0.02)
            now = time.monotonic()
            if not pump.thread.is_alive():
                break
            if now >= deadline:
                timed_out = True
                # a very short timeout can come before the engine has started the process: freezing
                # the cgroup while runc is still putting it there deadlocks the engine, so the kill
                # waits for the process to exist (or for the exec to end)
                self._started(ex["Id"], PID_WAIT_S)
                self._kill_exec(ex["Id"])
                pump.thread.join(timeout=5)
                break
            if now >= next_poll:
                next_poll = now + poll_s
                try:
                    if not api.exec_inspect(ex["Id"])["Running"]:
                        exited_at = exited_at or now
                except (docker.errors.DockerException, requests.RequestException):
                    break
                if exited_at and now - exited_at >= grace_s:
                    # the command exited; orphans still hold its stdout open
                    self._kill_exec(ex["Id"])
                    pump.thread.join(timeout=5)
                    break
        if watch is not None:
            if exited_at is None and not timed_out and watch.exited(0):
                exited_at = watch.at
            watch.close()
        if stop_at_exit:
            self.kill_tree()  # orphans that let go of the output (nothing left: one read of cgroup.procs)
        wall = (exited_at or time.monotonic()) - t0
        (out_b, out_cut), (err_b, err_cut), counts, error = pump.close()
        exit_code = None
        never_started = False
        try:
            info = api.exec_inspect(ex["Id"])
            exit_code = info.get("ExitCode")
            if info.get("Running"):
                exit_code = None
            # no process was ever made (no pid): what came on stdout is the engine's, not the command's
            never_started = exit_code == 126 and not info.get("Pid") and not timed_out
        except (docker.errors.DockerException, requests.RequestException):
            pass
        if never_started:
            exit_code, why = start_failure(cmd, out_b.decode("utf-8", errors="replace"))
            return ExecResult(cmd=cmd, exit_code=exit_code, wall_s=round(wall, 4), stderr=why + "\n",
                              stderr_bytes=len(why.encode()) + 1, start_error=why)

        out, out_tr = _rendered(out_b, out_cut, cap, raw=bool(on_stdout))
        err, err_tr = _rendered(err_b, err_cut, cap)
        if error is not None and exit_code is None:
            err += f"\n[harness: output stream broke: {type(error).__name__}: {str(error)[:200]}]"
        return ExecResult(
            cmd=cmd, exit_code=exit_code, timed_out=timed_out,
            wall_s=round(wall, 4),  # on a timeout: until the tree was killed, so slow kills show
            stdout=out, stderr=err, stdout_bytes=counts["out"], stderr_bytes=counts["err"],
            stdout_truncated=out_tr, stderr_truncated=err_tr,
        )

    def _started(self, exec_id: str, wait_s: float) -> None:
        """Return once the engine reports the exec's process (a pid) or its end, or after ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                info = self.client.api.exec_inspect(exec_id)
            except (docker.errors.DockerException, requests.RequestException):
                return
            if info.get("Pid") or not info.get("Running"):
                return
            time.sleep(0.005)

    def _kill_exec(self, exec_id: str) -> None:
        """Stop a timed-out exec: in a workload sandbox the whole workload tree; in a service
        only that exec's process tree (the service itself keeps running)."""
        if not self.service:
            self.kill_tree()
            return
        try:
            pid = self.client.api.exec_inspect(exec_id).get("Pid")
        except (docker.errors.DockerException, requests.RequestException):
            return
        if pid:
            for p in [pid, *self._descendants(pid)]:
                try:
                    os.kill(p, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def _descendants(self, pid: int) -> list[int]:
        out, todo = [], [pid]
        while todo:
            kids = self._children(todo.pop())
            out += kids
            todo += kids
        return out

    def measured_exec(self, cmd: list[str], timeout: float, env: dict[str, str] | None = None, workdir: str | None = None,
                      also: list["DockerSandbox"] | None = None) -> Measured:
        """``exec`` under the monitor: cgroup and host readings right before and right after
        the command (before anything else touches the container), and the saturation log.
        ``also``: services on the same cores, read at the same instants; their CPU is
        accounted to them (``Measured.services``), never as foreign."""
        also = also or []
        t0 = time.monotonic()
        host0 = hoststats.read_host_snapshot(t0)
        svc0 = [s.snapshot() for s in also]
        cg0 = self.snapshot()
        mon = self._monitor(t0, host0, cg0)
        try:
            res = self.exec(cmd, timeout=timeout, env=env, workdir=workdir, stop_at_exit=True)
        finally:
            if mon:
                mon.stop()
        return self._accounted(res, mon, host0, cg0, also, svc0)

    def _monitor(self, t0: float, host0: Any, cg0: CgroupSnapshot | None) -> Monitor | None:
        if cg0 is None or self._reader is None:
            return None
        mon = Monitor(self._reader, self.cpuset, self.profile.sample_hz)
        mon.start(t0, host0, cg0)
        return mon

    def _accounted(self, res: ExecResult, mon: Monitor | None, host0: Any, cg0: CgroupSnapshot | None,
                   also: list["DockerSandbox"], svc0: list[CgroupSnapshot | None], read: tuple[Any, Any] | None = None) -> Measured:
        """The second readings, right after the command (or ``read``: those readings, of the
        cgroup and the host, already taken), and what lay between them and the first."""
        cg1, host1 = read if read is not None else (self.snapshot(), None)
        svc1 = [s.snapshot() for s in also]
        if host1 is None:
            host1 = hoststats.read_host_snapshot(time.monotonic())
        counters = host = None
        services: dict[str, CounterDelta | None] = {}
        for s, a, b in zip(also, svc0, svc1):
            services[s.name] = CounterDelta.between(a, b, None) if a is not None and b is not None else None
        if cg0 is not None and cg1 is not None:
            counters = CounterDelta.between(cg0, cg1, mon.pids_peak if mon else None)
            own = counters.cpu_usage_us + sum(d.cpu_usage_us for d in services.values() if d is not None)
            host = HostDelta.between(host0, host1, self.cpuset, own, mon.mem_available_min if mon else None)
            if mon is not None:
                host = host.model_copy(update={"monitor_stall_s": round(mon.stall_s, 3)})
        return Measured(result=res, counters=counters, host=host, samples=mon.samples if mon else [],
                        monitor_errors=mon.errors if mon else 0, services=services)

    # -- one command, started with the container ---------------------------------
    def _workdir(self) -> str:
        return self.spec.workdir or (WORKDIR if WORKDIR in self.profile.tmpfs and not self.spec.writable_root else "/tmp")

    def run_once(self, cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> Measured:
        """Start the sandbox with ``cmd`` as its workload, measured as ``measured_exec`` measures
        it, without an exec (``harness.sandbox.launcher``): the counters cover the cgroup from
        its birth, the launcher's few milliseconds included. Where the launcher cannot serve (a
        service, a writable root, added capabilities, a user given by name, an image without
        its tools), the sandbox starts as usual and the command runs through ``measured_exec``."""
        if not self._once_serves(cmd):
            return super().run_once(cmd, timeout, env)
        once = _Once(cmd, env)
        fallback: _NoLauncher | None = None
        with self._lock:
            if self._removed:
                raise SandboxError(f"sandbox {self.name} was removed before it started")
            try:
                self._start(once)
            except _NeverStarted as e:  # the launcher's word, before any of the command's code ran
                why = launcher.never_started(e.code, cmd) or ""
                res = ExecResult(cmd=list(cmd), exit_code=127 if e.code == launcher.NOT_FOUND else 126, wall_s=0.0,
                                 stderr=why + "\n", stderr_bytes=len(why.encode()) + 1, start_error=why)
                return Measured(result=res, counters=None, host=None, samples=[])
            except _NoLauncher as e:  # the command never ran: it runs through exec instead
                fallback = e
        if fallback is not None:  # (outside the lock: a removal may come while the command runs)
            return self._through_exec(cmd, timeout, env, fallback.lacks)
        try:
            return self._measure_once(once, timeout)
        except _NoLauncher as e:  # its launcher's fork ended still root: the command never ran
            return self._through_exec(cmd, timeout, env, e.lacks)

    def _through_exec(self, cmd: list[str], timeout: float, env: dict[str, str] | None, lacks: bool) -> Measured:
        """The command, which never ran, through exec in a new container (``lacks``: this image
        is remembered to lack the launcher)."""
        if lacks:
            _NO_LAUNCHER.add(self.image)
        with self._lock:
            self._remove()  # (a no-op where the failed start already removed it)
            self._renew()
            self._start()
        return self.measured_exec(cmd, timeout, env=env)

    def _once_serves(self, cmd: list[str]) -> bool:
        return (ONESHOT and not self.service and self.isolated and not self.spec.writable_root and not self.spec.caps
                and hasattr(os, "pidfd_open") and self.image not in _NO_LAUNCHER and launcher.eligible(self.user, cmd))

    def _renew(self) -> None:
        """A removed sandbox made new again, under a new name (its one-shot start found no launcher)."""
        self.name = f"harness-{uuid.uuid4().hex[:12]}"
        self.container, self.pid, self.paths, self.envelope, self._reader = None, None, None, None, None
        self._keep_pids, self._removed, self._halted = set(), False, False

    @staticmethod
    def _ended_within(pid: int, until: float) -> bool:
        """Whether process ``pid`` (every thread of it) has exited by ``until``: seen through a
        pidfd the moment it happens, or, where none can be had, read from the kernel every 20 ms."""
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return True
        except OSError:
            while not (launcher.exit_status(pid) is not None and not _is_running(pid)):
                if time.monotonic() >= until:
                    return False
                time.sleep(0.02)
            return True
        try:
            return _gone_within(fd, max(0.0, until - time.monotonic()))
        finally:
            os.close(fd)

    def _measure_once(self, once: "_Once", timeout: float) -> Measured:
        assert once.stream is not None and once.workload is not None and once.t0 is not None
        cap = self.profile.output_cap
        pump = _Pump(once.stream, cap).start()
        t0 = once.t0
        first = self.snapshot()
        cg0 = _at_birth(first, t0) if first is not None else None
        mon = self._monitor(t0, once.host0, cg0)
        timed_out = False
        exited_at: float | None = None
        started = once.started or t0
        try:
            if self._ended_within(once.workload, started + timeout):
                exited_at = time.monotonic()
            else:
                timed_out = True
                self.kill_tree()
                self._ended_within(once.workload, time.monotonic() + 5.0)
            self.kill_tree()  # whatever it left running ends with it, before the second reading
        finally:
            if mon:
                mon.stop()
        status = launcher.exit_status(once.workload)
        if status is not None and launcher.still_root(once.workload):
            # the launcher's own fork ended before it dropped to the workload's uid (a setpriv
            # without these options): the command never ran; it runs through exec instead
            self.halt()
            pump.thread.join(timeout=5)
            pump.close()
            raise _NoLauncher(self.image)
        exit_code = launcher.exit_code(status) if status is not None else None
        wall = (exited_at or time.monotonic()) - started
        read = (self.snapshot(), hoststats.read_host_snapshot(time.monotonic()))  # the second readings
        # the keeper holds the command's status until the init ends: where it did not (the
        # memory ceiling took the keeper, a controller without CAP_SYS_RESOURCE cannot spare it),
        # the status went with it, and the record says so (from the engine's account, read once)
        got = self._final_state() if status is None else None
        self.halt()  # the engine ends the attach stream once the container has exited
        measured = self._accounted(ExecResult(cmd=once.cmd, exit_code=None, wall_s=0.0), mon, once.host0, cg0, [], [], read)
        lost = None
        if got is not None:
            lost = f"[harness: the command's exit status was lost: {self.how_it_ended(got) or 'the container ended'}]"
            measured.engine_oom = not isinstance(got, str) and bool(got[0].get("OOMKilled"))
            if not measured.engine_oom and not (measured.counters and measured.counters.oom_kills):
                # no memory ceiling took its keeper: a keeper that reaped it or ended by itself (a
                # shell or a sleep the launcher does not know): this image's commands run through
                # exec from now on
                _NO_LAUNCHER.add(self.image)
        pump.thread.join(timeout=5)
        (out_b, out_cut), (err_b, err_cut), counts, error = pump.close()
        out, out_tr = _rendered(out_b, out_cut, cap)
        err, err_tr = _rendered(err_b, err_cut, cap)
        if error is not None or pump.thread.is_alive():
            err += f"\n[harness: output stream {'broke: ' + type(error).__name__ if error else 'did not end'}]"
        if lost:
            err += ("\n" if err and not err.endswith("\n") else "") + lost
        measured.result = ExecResult(cmd=once.cmd, exit_code=exit_code, timed_out=timed_out, wall_s=round(wall, 4),
                                     stdout=out, stderr=err, stdout_bytes=counts["out"], stderr_bytes=counts["err"],
                                     stdout_truncated=out_tr, stderr_truncated=err_tr)
        return measured

    # -- files out -------------------------------------------------------------
    def export(self, files: Iterable[ExportFile], timeout: float, dest: Path, then: Command | None = None,
               reset: list[str] | None = None, env: dict[str, str] | None = None, cwd: str | None = None,
               user: str | None = None, kill_after: bool = False) -> Exported:
        """Copy files out into ``dest`` (``harness.sandbox.finish``). With ``then``, that command
        runs first: ``reset`` directories emptied, then the command as ``user`` in ``cwd``
        with ``env``; ``kill_after`` kills whatever it left running before anything is read."""
        spec = check_names(files)
        if self.spec.writable_root:
            return self._export_archive(spec, timeout, dest, then, reset, env, cwd, user, kill_after)
        limit = stream_limit(spec, then)
        sink = tempfile.SpooledTemporaryFile(max_size=1024 * 1024, prefix="harness-export-")
        over = [False]

        def collect(chunk: bytes) -> None:
            if sink.tell() + len(chunk) > limit:
                over[0] = True
                return
            sink.write(chunk)

        workdir = WORKDIR if WORKDIR in self.profile.tmpfs else "/tmp"
        prog = finish_spec(spec, workdir, then, reset, env, cwd or self.spec.workdir, kill_after)
        res = self.exec(["python3", "-I", "-S", "-c", FINISH, json.dumps(prog)], timeout=timeout + (then.timeout if then else 0),
                        cap=64 * 1024, on_stdout=collect, user=user)
        problems: list[str] = []
        if res.timed_out:
            problems.append(f"export timed out after {timeout:.0f}s")
        if over[0]:
            problems.append(f"export stream larger than {format_size(limit)}; cut off")
        try:
            return read_finish_stream(sink, spec, dest, then, res, problems)
        finally:
            sink.close()

    def _export_archive(self, spec: list[ExportFile], timeout: float, dest: Path, then: Command | None, reset: list[str] | None,
                        env: dict[str, str] | None, cwd: str | None, user: str | None, kill_after: bool) -> Exported:
        """A writable-root sandbox: nothing in it is trusted to copy files; the engine does."""
        problems: list[str] = []
        command = None
        unreset: list[str] = []
        if then is not None:
            for p in reset or []:
                # the parent too: an agent may have made it a link or taken its permissions away
                # (an exec'd root has no capabilities: it must own its way back in, parent first)
                # (what the agent left there is moved aside as evidence, not deleted)
                r = self.exec(["sh", "-c", 'd=$(dirname -- "$1"); if [ -L "$d" ]; then rm -f -- "$d"; fi; mkdir -p -- "$d" && '
                               'chmod 0755 -- "$d" && rm -rf -- "$1.before-grading" && { mv -- "$1" "$1.before-grading" 2>/dev/null; '
                               'rm -rf -- "$1"; } && mkdir -p -- "$1" && chmod 0777 -- "$1"', "sh", p], timeout=60, user=ROOT, workdir="/")
                if r.exit_code != 0:
                    unreset.append(p)
                    problems.append(f"could not empty {p}: {(r.stderr or r.stdout).strip()[-200:]}")
            if unreset:  # what the agent left there must not be read as the command's output
                command = ExecResult(cmd=then.cmd, exit_code=None, timed_out=False, wall_s=0.0,
                                     stderr=f"could not empty {', '.join(unreset)}: the command did not run")
                spec = [f for f in spec if not any((f.path or "") == p or (f.path or "").startswith(p.rstrip("/") + "/") for p in unreset)]
            else:
                command = self.exec(then.cmd, timeout=then.timeout, env=env, workdir=cwd, cap=then.cap, user=user)
            if kill_after:
                self.kill_tree()
        kept: dict[str, int] = {}
        truncated: list[str] = []
        deadline = time.monotonic() + timeout
        for f in spec:
            if time.monotonic() > deadline:
                problems.append(f"export timed out after {timeout:.0f}s")
                break
            path = f.path or f"{self.spec.workdir or WORKDIR}/{f.name}"
            try:
                chunks, _stat = self.container.get_archive(path)
            except docker.errors.NotFound:
                continue
            except (docker.errors.DockerException, requests.RequestException) as e:
                problems.append(f"could not copy {path}: {str(e)[:200]}")
                continue
            read_archive(chunks, f, dest, problems, kept, truncated, f.cap + (64 * 1024 * 1024 if f.tree else 1024 * 1024))
        return Exported(files=kept, problems=problems, truncated=truncated, command=command, complete=True)


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


def engine_facts(client: docker.DockerClient) -> dict[str, str]:
    """The engine's version and cgroup driver, as the engine reports them ({} when it cannot)."""
    try:
        info = client.info()
        return {"engine_version": str(client.version().get("Version", "")), "cgroup_driver": str(info.get("CgroupDriver", ""))}
    except Exception:
        return {}
