"""Executors: where attempts run. The driver (``harness.engine.runner``) owns the plan, the
slot bookkeeping and the store; an executor only runs the attempts it is given and hands
back what came of each, in completion order.

Interface: :meth:`Executor.submit` work, :meth:`Executor.results` what finished,
:meth:`Executor.stop` (no new attempt starts; those in flight finish or are interrupted).
The local executor is a pool of worker threads on this machine's cores; a distributed one
(Ray) implements the same three calls with remote tasks.
"""

from __future__ import annotations

import queue
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable

from harness.engine.lanes import Lane, Member
from harness.engine.scheduler import POLL_S, CpuPool, LeaseCancelled, pin_process
from harness.model.errors import LeaseTimeout

QUARANTINE_RETRY_S = 1.0  # how often a worker waiting for cores retries the removals that held some back


@dataclass(frozen=True)
class Work:
    """One attempt to run: the slot (the driver's key), the cores it needs, and the callable
    that runs it on a cpuset (it returns ``(result, removed, retry_remove)``). ``gated`` work
    is called ``run(cpuset, gate)`` and may share a lane (see :mod:`harness.engine.lanes`)
    with the attempt before and after it; other work has its cores to itself."""

    key: Any
    cores: int
    run: Callable[..., tuple[Any, bool, Callable[[], bool] | None]]
    not_before: float = 0.0  # time.monotonic() before which it must not start (a rerun's backoff)
    spec: Any = None  # what a remote executor ships instead of ``run`` (picklable; see harness.engine.node)
    gated: bool = False


@dataclass(frozen=True)
class Done:
    """What came of one piece of work: its result, or why it never ran (``not_started``),
    or the exception that escaped it (a controller bug: the driver stops the run)."""

    key: Any
    result: Any = None
    not_started: bool = False
    error: BaseException | None = None
    late: bool = False  # the record of an attempt the executor already reported lost: evidence, never counted


class Executor(ABC):
    """Runs attempts; see the module docstring."""

    @abstractmethod
    def submit(self, work: Work) -> None: ...

    @abstractmethod
    def results(self, timeout: float) -> Done | None:
        """The next finished piece of work, or None after ``timeout`` seconds."""

    @abstractmethod
    def stop(self) -> None:
        """Start nothing new; work waiting for cores comes back ``not_started``."""

    @abstractmethod
    def close(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the workers to end."""

    def late(self, timeout: float) -> list[Done]:
        """Once the driver has every result it waits for: records of attempts already
        reported lost that arrive within ``timeout`` s (each ``late``); none for a local pool."""
        return []


Clear = Callable[[dict[int, str]], bool]  # holders that died on these cores -> is nothing of theirs left?


def lease_clean(pool: CpuPool, cores: int, timeout: float | None, stop: threading.Event, clear: Clear | None,
                quarantine: Callable[[list[int], Callable[[], bool]], None]) -> list[int]:
    """Lease ``cores`` cores, and before handing them out remove what a holder that died on
    them left running (its containers keep running after the kernel drops its lock). Cores
    whose leftovers cannot be removed yet are quarantined and others are leased instead."""
    while True:
        cpuset = pool.lease(cores, timeout=timeout, stop=stop)
        stale = pool.take_stale(cpuset)
        if not stale or clear is None:
            return cpuset
        try:
            if clear(stale):
                return cpuset
        except Exception:
            pass
        quarantine(cpuset, lambda s=stale: clear(s))


class OrphanClearer:
    """The ``clear`` of an executor over a sandbox backend: removes the sandboxes of holders
    that died on a core, and keeps a note per core for the record of the attempt that gets it."""

    def __init__(self, backend: Any):
        self.backend = backend
        self._notes: dict[int, str] = {}
        self._lock = threading.Lock()

    def __call__(self, held: dict[int, str]) -> bool:
        removed = self.backend.remove_orphans_of(sorted(set(held.values())))
        if removed is None:
            return False
        with self._lock:
            for core, holder in held.items():
                self._notes[core] = (f"core {core} was last held by {holder}, which died holding it; before this attempt "
                                     f"its containers were removed ({', '.join(removed) if removed else 'none was left'})")
        return True

    def notes(self, cpuset: list[int]) -> list[str]:
        """The notes for the cores just leased (each given once)."""
        with self._lock:
            return [self._notes.pop(c) for c in cpuset if c in self._notes]


class LocalExecutor(Executor):
    """``concurrency`` lanes of exclusive cores leased from ``pool``, each worked by ``depth``
    threads: with depth 2, gated work overlaps the next attempt's sandbox start and setup (at
    the lowest CPU weight) with this one's grade and removal (never with an agent window; see
    :mod:`harness.engine.lanes`).
    A sandbox whose removal failed keeps its cores leased (they are quarantined) until a
    retry removes it; ``before_attempt`` runs in the worker before each attempt (the driver
    waits there for an engine that went away); ``clear`` removes what a holder that died on a
    core left there (see :func:`lease_clean`)."""

    def __init__(self, pool: CpuPool, concurrency: int, stop: threading.Event,
                 before_attempt: Callable[[], None] | None = None, lease_timeout: float | None = None,
                 clear: Clear | None = None, depth: int = 1):
        if depth not in (1, 2):
            raise ValueError("a lane holds one or two attempts")
        self.depth = depth
        self._lanes: list[Lane] = []
        self._lanes_cv = threading.Condition()
        self.pool = pool
        self._clear = clear
        self.concurrency = concurrency
        self._stop = stop
        self._before = before_attempt
        self._lease_timeout = lease_timeout
        self._todo: "queue.Queue[Work | None]" = queue.Queue()
        self._done: "queue.Queue[Done]" = queue.Queue()
        self._quarantine: list[tuple[list[int], Callable[[], bool]]] = []
        self._qlock = threading.Lock()
        self._busy = 0
        if pool.reserved:
            pin_process(list(pool.reserved))  # before the workers start: they inherit it
        self._threads = [threading.Thread(target=self._worker, name=f"harness-worker-{i}", daemon=True)
                         for i in range(concurrency * depth)]
        for t in self._threads:
            t.start()

    def submit(self, work: Work) -> None:
        self._todo.put(work)

    def results(self, timeout: float) -> Done | None:
        try:
            return self._done.get(timeout=timeout)
        except queue.Empty:
            return None

    def stop(self) -> None:
        self._stop.set()
        for _ in self._threads:
            self._todo.put(None)

    def close(self, timeout: float) -> None:
        self.stop()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self.retry_quarantined()

    @property
    def quarantined(self) -> list[list[int]]:
        with self._qlock:
            return [c for c, _ in self._quarantine]

    def _quarantined(self, cpuset: list[int], retry: Callable[[], bool]) -> None:
        with self._qlock:
            self._quarantine.append((cpuset, retry))

    def retry_quarantined(self) -> None:
        """Retry the removals that failed; give back the cores of every sandbox now gone."""
        with self._qlock:
            items, self._quarantine = self._quarantine, []
        keep = []
        for cpuset, retry in items:
            try:
                gone = retry()
            except Exception:
                gone = False
            if gone:
                self.pool.release(cpuset)
            else:
                keep.append((cpuset, retry))
        with self._qlock:
            self._quarantine.extend(keep)

    def _worker(self) -> None:
        while True:
            work = self._todo.get()
            if work is None:
                return
            with self._qlock:
                self._busy += 1
            try:
                self._done.put(Done(work.key, not_started=True) if self._stop.is_set() else self._attempt(work))
            finally:
                with self._qlock:  # only once its result is where the driver will look
                    self._busy -= 1

    def in_flight(self) -> int:
        """Pieces of work taken by a worker whose result is not yet in :meth:`results`."""
        with self._qlock:
            return self._busy

    def _attempt(self, work: Work) -> Done:
        self.retry_quarantined()
        try:
            while time.monotonic() < work.not_before and not self._stop.is_set():
                self._stop.wait(min(0.5, work.not_before - time.monotonic()))  # waits without a core leased
            if self._stop.is_set():
                return Done(work.key, not_started=True)
            if self._before is not None:
                self._before()
            lane, member = self._place(work)
        except LeaseCancelled:
            return Done(work.key, not_started=True)
        except BaseException as e:
            return Done(work.key, error=e)
        removed = True
        retry = None
        try:
            if not member.wait_start(self._stop) or self._stop.is_set():
                return Done(work.key, not_started=True)
            result, removed, retry = work.run(lane.cpuset, member) if work.gated else work.run(lane.cpuset)
            return Done(work.key, result=result)
        except BaseException as e:  # a bug in the controller: the driver stops the run, keeps the data
            return Done(work.key, error=e)
        finally:
            member.remove_begin()  # whatever the work did not get to (a no-op after a finished attempt)
            member.remove_end()
            self._leave(lane, member, None if removed or retry is None else retry)

    def _place(self, work: Work) -> tuple[Lane, Member]:
        """A lane for ``work``: new cores when some are free, else a place behind the attempt
        on a lane of the same size (gated work, depth 2), else wait for either."""
        deadline = None if self._lease_timeout is None else time.monotonic() + self._lease_timeout
        retried = time.monotonic()
        while True:
            if self._quarantine and time.monotonic() - retried >= QUARANTINE_RETRY_S:
                # cores held back by a removal that failed (the engine was away) come back once it
                # succeeds: retried while waiting, or a run whose every core is held back waits forever
                retried = time.monotonic()
                self.retry_quarantined()
            try:
                cpuset = lease_clean(self.pool, work.cores, 0.0, self._stop, self._clear, self._quarantined)
            except LeaseTimeout:
                pass
            else:
                with self._lanes_cv:
                    lane = Lane(cpuset, self._lanes_cv)
                    lane.shared = work.gated and self.depth > 1
                    self._lanes.append(lane)
                    return lane, lane.join()
            with self._lanes_cv:
                for lane in self._lanes:
                    if (work.gated and lane.shared and len(lane.cpuset) == work.cores
                            and len(lane.members) < self.depth and not lane.retries):
                        return lane, lane.join()
                if self._stop.is_set():
                    raise LeaseCancelled("the run stopped while waiting for cores")
                if deadline is not None and time.monotonic() >= deadline:
                    raise LeaseTimeout("no free cores within the lease timeout (another controller holds them?); "
                                       "wait for it, or lower --concurrency")
                self._lanes_cv.wait(POLL_S * 4)  # a release here notifies at once; one elsewhere is polled for

    def _leave(self, lane: Lane, member: Member, retry: Callable[[], bool] | None) -> None:
        """The member is done; the lane's last member gives its cores back (or quarantines
        them while a removal that failed has not succeeded yet)."""
        with self._lanes_cv:
            lane.members.remove(member)
            if retry is not None:
                lane.retries.append(retry)
            last = not lane.members
            if last:
                self._lanes.remove(lane)
            else:
                self._lanes_cv.notify_all()
                return
        if not lane.retries:
            self.pool.release(lane.cpuset)
        else:
            with self._qlock:
                self._quarantine.append((lane.cpuset, lambda rs=list(lane.retries): all([r() for r in rs])))
        with self._lanes_cv:
            self._lanes_cv.notify_all()  # a worker waiting for cores looks again
