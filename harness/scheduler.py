"""Exclusive cpuset leases: never two attempts on one core, cores reserved for the controller.

The pool is built from the CPUs this process may use (``os.sched_getaffinity``) minus the
reserved ones; each attempt leases ``cores`` of them and gives them back when its container
is gone. Leases are also exclusive *across processes*: each leased core holds an ``flock``
on ``$HARNESS_LOCK_DIR/cpu<N>.lock`` (default in the temp dir), so two ``harness run`` on
one machine queue for cores instead of sharing them. The kernel drops the lock when a
process dies, so a killed controller never leaves a core locked.
"""


from __future__ import annotations

import fcntl
import os
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator


def lock_dir() -> Path:
    """Where the per-core lock files live ($HARNESS_LOCK_DIR, default <tmp>/harness-cpu-locks)."""
    d = Path(os.environ.get("HARNESS_LOCK_DIR", Path(tempfile.gettempdir()) / "harness-cpu-locks"))
    d.mkdir(parents=True, exist_ok=True)
    try:
        os.chmod(d, 0o1777)
    except OSError:
        pass
    return d


class SchedulerError(ValueError):
    """The envelope cannot be scheduled on this machine; the message says what would fit."""


def allowed_cpus() -> list[int]:
    """CPUs this process may run on (honours taskset / container cpusets)."""
    return sorted(os.sched_getaffinity(0))


def default_reserved(cpus: list[int]) -> int:
    """Cores kept for the controller and the host: 1 when the machine has more than one."""
    return 1 if len(cpus) > 1 else 0


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
        self._cv = threading.Condition()
        self.peak_in_use = 0

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

    def lease(self, cores: int, timeout: float | None = None) -> list[int]:
        """Block until ``cores`` free cores exist and lease them (lowest numbers first)."""
        if cores > self.size:
            raise SchedulerError(f"the envelope needs {cores} cores; only {self.size} are available for trials")
        with self._cv:
            ok = self._cv.wait_for(lambda: len(self._free) >= cores, timeout=timeout)
            if not ok:
                raise TimeoutError(f"no {cores} free cores within {timeout}s")
            got = sorted(self._free)[:cores]
            for c in got:
                self._free.remove(c)
                self._leased.add(c)
            self.peak_in_use = max(self.peak_in_use, len(self._leased))
        if self.cross_process:
            try:
                self._lock_cores(got)
            except BaseException:
                self.release(got)  # roll back the in-process lease and any locks taken
                raise
        return got

    @contextmanager
    def leased(self, cores: int) -> Iterator[list[int]]:
        """``with pool.leased(1) as cpuset:`` — a lease given back however the block ends."""
        got = self.lease(cores)
        try:
            yield got
        finally:
            self.release(got)

    def _lock_cores(self, cores: list[int]) -> None:
        # ascending order on every process: no lock-order deadlock between controllers.
        # flock is per open file, so two pools in one process also exclude each other.
        for c in sorted(cores):
            path = lock_dir() / f"cpu{c}.lock"
            try:
                fd = os.open(path, os.O_CREAT | os.O_RDONLY, 0o666)
            except OSError as e:
                raise SchedulerError(f"cannot open the core lock {path}: {e.strerror}; set HARNESS_LOCK_DIR to a directory you can write") from None
            try:
                os.fchmod(fd, 0o666)  # the umask must not lock other users out
            except OSError:
                pass
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._fds[c] = fd

    def lock_exact(self, cores: list[int]) -> None:
        """Take the cross-process locks of specific cores (``sandbox exec --cpuset``), waiting
        for any controller that holds them. Released by :meth:`unlock_exact`."""
        self._lock_cores(cores)

    def unlock_exact(self, cores: list[int]) -> None:
        for c in cores:
            fd = self._fds.pop(c, None)
            if fd is not None:
                os.close(fd)

    def release(self, got: list[int]) -> None:
        for c in got:
            fd = self._fds.pop(c, None)
            if fd is not None:
                os.close(fd)  # closing drops the flock
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
