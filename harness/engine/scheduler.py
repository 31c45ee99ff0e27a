"""Exclusive cpuset leases: cores reserved for the controller, each other core leased to one lane
(harness.engine.lanes: at most two attempts of one run in sequence, never overlapping an agent
window) and to no other controller.

The pool is built from the CPUs this process may use (``os.sched_getaffinity``) minus the
reserved ones; each attempt leases ``cores`` of them and gives them back when its container
is gone. Leases are also exclusive *across processes*: each leased core holds an ``flock``
on ``$HARNESS_LOCK_DIR/cpu<N>.lock`` (default in the temp dir), so two ``harness run`` on
one machine queue for cores instead of sharing them. The kernel drops the lock when a
process dies, so a killed controller never leaves a core locked — but its container may
still run there: a lease writes its holder (host:pid-namespace:pid) into the lock file and
a clean release empties it, so the next lease of that core finds the name of a holder that
died holding it (:meth:`CpuPool.take_stale`) and removes what it left before using the core.

The lock folder is shared by every user of the machine, so it is opened with care: never
through a symlink, lock files never followed, hard-linked or chmod-ed unless this process
just created them. A wait for cores polls, so it ends on a timeout or when the run stops.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import harness
from harness.model.errors import LeaseTimeout, SchedulerError
from harness.model.units import one_line
from harness.sandbox.owners import controller_id

POLL_S = 0.05


class LeaseCancelled(Exception):
    """The run stopped while this lease was waiting for cores."""


def lock_dir() -> Path:
    """Where the per-core lock files live ($HARNESS_LOCK_DIR, default <tmp>/harness-cpu-locks)."""
    return Path(os.environ.get("HARNESS_LOCK_DIR", Path(tempfile.gettempdir()) / "harness-cpu-locks"))


def _open_lock_dir(d: Path) -> int:
    """An fd of the lock folder: created world-writable and sticky (like /tmp) when missing,
    refused when it is a symlink or not a directory, chmod-ed only when it is ours."""
    try:
        os.mkdir(d, 0o1777)
    except FileExistsError:
        pass
    except OSError as e:
        raise SchedulerError(f"cannot create the core-lock folder {d}: {e.strerror}; set HARNESS_LOCK_DIR to a folder you can write") from None
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        what = "is a symlink" if e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(d) else f"cannot be opened ({e.strerror})"
        raise SchedulerError(f"the core-lock folder {d} {what}; remove it or set HARNESS_LOCK_DIR") from None
    st = os.fstat(fd)
    if st.st_uid == os.geteuid():
        os.fchmod(fd, 0o1777)  # through the fd: the folder itself, never what a path points to
    elif st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
        os.close(fd)
        raise SchedulerError(f"the core-lock folder {d} is world-writable without the sticky bit and not yours; "
                             "remove it or set HARNESS_LOCK_DIR")
    return fd


def _open_lock_file(dir_fd: int, d: Path, name: str) -> int:
    """An fd of one core's lock file, never through a symlink or a hard link (read-write, so
    the holder can be written in; read-only where another user's umask left it so)."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=dir_fd)
        os.fchmod(fd, 0o666)  # ours, just made: the umask must not lock other users out
        return fd
    except FileExistsError:
        pass
    except OSError as e:
        raise SchedulerError(f"cannot create the core lock {d / name}: {e.strerror}; set HARNESS_LOCK_DIR to a folder you can write") from None
    try:
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except PermissionError:
            fd = os.open(name, (flags & ~os.O_RDWR) | os.O_RDONLY, dir_fd=dir_fd)
    except OSError as e:
        what = "is a symlink" if e.errno == errno.ELOOP else f"cannot be opened ({e.strerror})"
        raise SchedulerError(f"the core lock {d / name} {what}; remove it or set HARNESS_LOCK_DIR") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise SchedulerError(f"the core lock {d / name} is not a plain file (a hard link or a device); remove it or set HARNESS_LOCK_DIR")
    return fd


# the CPUs this process could run on when it started (taskset, a container's cpuset), before
# pin_process() kept it to its reserved cores: what the trials may use is read from this
_START_CPUS = sorted(harness.START_CPUS)


def allowed_cpus() -> list[int]:
    """CPUs this process may run on (honours taskset / container cpusets), as it started:
    pinning the controller to its reserved cores does not shrink the machine."""
    return list(_START_CPUS)


def default_reserved(cpus: list[int]) -> int:
    """Cores kept for the controller and the host: 1 when the machine has more than one."""
    return 1 if len(cpus) > 1 else 0


def pin_process(cpus: list[int]) -> None:
    """Keep every thread of this process (the progress display's, the SDK's, the monitors')
    on ``cpus``, so none of them shows up as foreign CPU on a trial's cores. Threads started
    later inherit the mask of the thread that starts them."""
    if not cpus:
        return
    mask = set(cpus)
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, mask)
        except OSError:  # a thread that just ended
            pass


WAIT_NOTICE_S = 60.0  # a lease waiting for another controller's cores says so at once, when the holder changes, and this often


def describe_holder(text: str) -> str:
    """A lock file's text ("host:ns:pid" and "run R" lines) as "pid N (run R)", printable."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    who = lines[0].rsplit(":", 1)[-1] if lines else "?"
    run = next((ln[4:] for ln in lines[1:] if ln.startswith("run ")), "")
    return f"pid {one_line(who)}" + (f" (run {one_line(run)})" if run else "")


@dataclass
class CpuPool:
    """A pool of cores leased exclusively to concurrent attempts."""

    cpus: list[int]
    reserved: list[int] = field(default_factory=list)

    cross_process: bool = True

    def __post_init__(self) -> None:
        self._free = [c for c in self.cpus if c not in self.reserved]
        self._leased: set[int] = set()
        self._fds: dict[int, int] = {}
        self._stale: dict[int, str] = {}  # core -> the holder that died holding its lock (see take_stale)
        self._cv = threading.Condition()
        self.peak_in_use = 0
        self.note = ""  # the run id, written into the lock files beside this controller's id
        self.on_wait: Any = None  # called with one line while a lease waits for another controller's cores
        self._waited = 0.0
        self._wait_line = ""

    @classmethod
    def for_host(cls, reserve: int | None = None, cpus: list[int] | None = None) -> "CpuPool":
        cpus = cpus if cpus is not None else allowed_cpus()
        n = default_reserved(cpus) if reserve is None else reserve
        if n < 0 or n >= len(cpus):
            raise SchedulerError(
                f"cannot reserve {n} of {len(cpus)} cores for the controller: at least one core must be left for trials"
            )
        return cls(cpus=cpus, reserved=cpus[:n])

    @property
    def size(self) -> int:
        return len(self.cpus) - len(self.reserved)

    def capacity(self, cores: int) -> int:
        """How many attempts of ``cores`` cores fit at once."""
        return self.size // cores

    def concurrency(self, cores: int, requested: int | None = None) -> int:
        """Concurrency = what fits; a requested value can only lower it."""
        fit = self.capacity(cores)
        if fit < 1:
            raise SchedulerError(
                f"the envelope needs {cores} exclusive cores but only {self.size} are available for trials "
                f"({len(self.cpus)} on this machine, {len(self.reserved)} reserved); lower `cores` or --reserve-cores"
            )
        if requested is None:
            return fit
        if requested < 1:
            raise SchedulerError("--concurrency must be at least 1")
        return min(fit, requested)

    def lease(self, cores: int, timeout: float | None = None, stop: threading.Event | None = None) -> list[int]:
        """Wait until ``cores`` cores are free here and not held by another controller, and
        lease them (the lowest free numbers whose locks are to be had). Raises
        :class:`LeaseTimeout` after ``timeout`` seconds and :class:`LeaseCancelled` once
        ``stop`` is set."""
        if cores > self.size:
            raise SchedulerError(f"the envelope needs {cores} cores; only {self.size} are available for trials")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cv:
                while len(self._free) < cores:
                    self._check(deadline, stop)
                    left = None if deadline is None else deadline - time.monotonic()
                    self._cv.wait(timeout=0.2 if left is None else max(0.0, min(0.2, left)))
                got = self._lock_some(sorted(self._free), cores) if self.cross_process else sorted(self._free)[:cores]
                if got:
                    for c in got:
                        self._free.remove(c)
                        self._leased.add(c)
                    self.peak_in_use = max(self.peak_in_use, len(self._leased))
                    return got
            # other controllers hold too many of the free cores: say so, wait for them, then try again
            self._say_wait(sorted(self._free))
            self._check(deadline, stop)
            time.sleep(POLL_S * 4)

    def _say_wait(self, cores: list[int]) -> None:
        """Tell ``on_wait`` who holds the cores a lease waits for (again when it changes, or every WAIT_NOTICE_S)."""
        if self.on_wait is None:
            return
        held = self.holders(cores)
        line = "waiting for " + "; ".join(f"core {c} held by {h}" for c, h in sorted(held.items()))
        if held and (line != self._wait_line or time.monotonic() - self._waited > WAIT_NOTICE_S):
            self._waited, self._wait_line = time.monotonic(), line
            self.on_wait(line)

    def _check(self, deadline: float | None, stop: threading.Event | None) -> None:
        if stop is not None and stop.is_set():
            raise LeaseCancelled("the run stopped while waiting for cores")
        if deadline is not None and time.monotonic() >= deadline:
            raise LeaseTimeout("no free cores within the lease timeout (another controller holds them?); "
                               "wait for it, or lower --concurrency")

    def _lock_some(self, candidates: list[int], cores: int) -> list[int]:
        """Take the flocks of ``cores`` of ``candidates`` without waiting (lowest first),
        skipping cores another controller holds; [] (nothing held) when too few are free.
        flock is per open file, so two pools in one process also exclude each other."""
        d = lock_dir()
        dir_fd = _open_lock_dir(d)
        taken: list[int] = []
        try:
            for c in candidates:
                if len(taken) == cores:
                    break
                fd = _open_lock_file(dir_fd, d, f"cpu{c}.lock")
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                except BaseException:
                    os.close(fd)
                    raise
                self._fds[c] = fd
                self._mark(c, fd)
                taken.append(c)
            if len(taken) < cores:
                self._unlock(taken)
                return []
            return taken
        except BaseException:
            self._unlock(taken)
            raise
        finally:
            os.close(dir_fd)

    @contextmanager
    def leased(self, cores: int, timeout: float | None = None) -> Iterator[list[int]]:
        """``with pool.leased(1) as cpuset:`` — a lease given back however the block ends."""
        got = self.lease(cores, timeout=timeout)
        try:
            yield got
        finally:
            self.release(got)

    def holders(self, cores: list[int]) -> dict[int, str]:
        """Who holds these cores' locks now, as "pid N (run R)" (read, never locked): the cores
        another controller is using. A lock file left by a dead holder is not "held"."""
        out = {}
        d = lock_dir()
        for c in cores:
            if c in self._fds:
                continue
            try:
                fd = os.open(os.path.join(d, f"cpu{c}.lock"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    continue  # nobody holds it
                except BlockingIOError:
                    pass
                text = os.pread(fd, 512, 0).decode("utf-8", "replace")
            except OSError:
                continue
            finally:
                os.close(fd)
            if text.strip():  # empty: a controller probing or releasing it this instant, named on the next look
                out[c] = describe_holder(text)
        return out

    def _mark(self, core: int, fd: int) -> None:
        """Read who held this core's lock before (a holder that released it cleanly leaves it
        empty), then write this process in (and the run, on a second line)."""
        try:
            prev = (os.pread(fd, 512, 0).decode("utf-8", "replace").strip().splitlines() or [""])[0].strip()
            if prev:
                self._stale[core] = prev
            text = f"{controller_id()}\n{('run ' + self.note) if self.note else ''}\n".encode()
            os.pwrite(fd, text, 0)  # written, then cut to length: a reader never sees it empty while held
            os.ftruncate(fd, len(text))
        except OSError:
            pass  # a read-only lock file: no holder names, the start-up sweep still runs

    def take_stale(self, cores: list[int]) -> dict[int, str]:
        """Cores of ``cores`` whose previous holder died while holding them -> that holder
        (host:pid-namespace:pid); each is reported once."""
        with self._cv:
            return {c: self._stale.pop(c) for c in cores if c in self._stale}

    def _unlock(self, cores: list[int]) -> None:
        for c in cores:
            fd = self._fds.pop(c, None)
            if fd is not None:
                try:
                    os.ftruncate(fd, 0)  # released cleanly: nothing of ours runs there any more
                    with self._cv:
                        prev = self._stale.pop(c, None)
                    if prev:  # a dead holder nobody cleared up after (doctor, sandbox exec, a partial lease): keep its name
                        os.pwrite(fd, f"{prev}\n".encode(), 0)
                except OSError:
                    pass
                os.close(fd)  # closing drops the flock

    def lock_exact(self, cores: list[int], timeout: float | None = None, stop: threading.Event | None = None) -> None:
        """Take the cross-process locks of specific cores (``sandbox exec --cpuset``), waiting
        for any controller that holds them. Released by :meth:`unlock_exact`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._lock_some(sorted(cores), len(cores)):
            self._say_wait(sorted(cores))
            self._check(deadline, stop)
            time.sleep(POLL_S * 4)

    def unlock_exact(self, cores: list[int]) -> None:
        self._unlock(cores)

    def release(self, got: list[int]) -> None:
        self._unlock(got)
        with self._cv:
            for c in got:
                if c not in self._leased:
                    raise RuntimeError(f"core {c} released but not leased")
                self._leased.discard(c)
                self._free.append(c)
            self._cv.notify_all()

    def in_use(self) -> int:
        with self._cv:
            return len(self._leased)
