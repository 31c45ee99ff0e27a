"""Lanes: one leased cpuset shared by at most two attempts in sequence, overlapped only
where nothing is measured.

An attempt's life on its cores is: sandbox start (services, container) -> in-container work
(setup, the measured agent window, stop, grade, export) -> removal. Only the agent window is
measured (the cgroup counters, the host's view of the pinned cores), so the next attempt on
the same cores may start its sandbox while this one grades, and set up then too at the
lowest CPU weight of its cores (this one's grading has them whenever it wants them); this
one's removal may run while the next one sets up. The rules, per lane:

- a member starts its sandbox only once every member that joined before it has ended its
  agent window (or given up before it);
- it sets up then, beside an earlier member's stop, grade and export, if its sandbox took
  the lowest CPU weight of the cores (``Sandbox.yield_cpu``, asked only then; given back
  before its agent window); otherwise once no other member does in-container work (setup ..
  grade), which is then its alone until its removal begins;
- its agent window opens only once no other member does in-container work (an earlier
  one's stop, grade and export end when its removal begins) and no sandbox of the lane is
  starting or being removed; its own in-container work from then on (stop, grade, export)
  has only a later member's yielded setup beside it, and while the window is open nothing
  starts or is removed;
- a member's removal begins in the same step that ends its in-container work, so the next
  member's agent window waits for that removal to end -- or only until its processes are
  gone, where the controller can see them (``Sandbox.halt``): the engine's unmounts and
  deletes that follow run in the engine's processes, not in anything pinned to these cores,
  and the agent window's own host view of the cores still tells any contention.

So no agent window ever overlaps another attempt's presence on its cores except as an idle,
started container that runs nothing (its init process asleep). The leased cores are given
back when the lane's last member leaves. ``OPEN`` is the gate of an attempt alone on its cores
(a remote node, ``harness sandbox``): every call returns at once.

Every wait ends when ``stop`` is set (the call returns False: the attempt records why it
stopped); nothing here talks to the engine.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

WAIT_TICK_S = 0.2


class Lane:
    """The members of one leased cpuset (guarded by the executor's condition)."""

    def __init__(self, cpuset: list[int], cv: threading.Condition):
        self.cpuset = list(cpuset)
        self.cv = cv
        self.members: list[Member] = []
        self.w_owner: Member | None = None
        self.agent_member: Member | None = None
        self.transitions = 0  # sandboxes of the lane starting or being removed now
        self.retries: list[Callable[[], bool]] = []  # removals that failed: the cores stay leased until they succeed
        self.shared = False  # open to a second member (gated work on a depth-2 executor)
        self.next_seq = 0

    def join(self) -> "Member":
        m = Member(self, self.next_seq)
        self.next_seq += 1
        self.members.append(m)
        return m


class Member:
    """One attempt's place in a lane: the gate the pipeline calls at each step."""

    def __init__(self, lane: Lane, seq: int):
        self.lane = lane
        self.seq = seq
        self.post = False  # its agent window is over (or it will never open one)
        self.starting = False
        self.removal: str | None = None  # "on" while its sandbox is being removed, then "over"

    # -- waits -------------------------------------------------------------------
    def _wait(self, ok: Callable[[], bool], stop: threading.Event | None) -> bool:
        while not ok():
            if stop is not None and stop.is_set():
                return False
            self.lane.cv.wait(WAIT_TICK_S)
        return True

    def _earlier_done(self) -> bool:
        return all(m.post for m in self.lane.members if m.seq < self.seq)

    def wait_start(self, stop: threading.Event | None = None) -> bool:
        """Before the attempt begins: wait for earlier members' agent windows to end."""
        with self.lane.cv:
            if not self._wait(self._earlier_done, stop):
                return False
            self.lane.transitions += 1
            self.starting = True
            return True

    def started(self) -> None:
        """The sandbox is up (or never will be)."""
        with self.lane.cv:
            self._started()

    def _started(self) -> None:
        if self.starting:
            self.starting = False
            self.lane.transitions -= 1
            self.lane.cv.notify_all()

    def work(self, stop: threading.Event | None = None, yield_cpu: Callable[[], bool] | None = None) -> bool:
        """Before setup. While an earlier member still does in-container work (stop, grade,
        export), ``yield_cpu`` is asked to give this member's sandbox the lowest CPU weight
        of its cores (``Sandbox.yield_cpu``): when it does, this member sets up beside that
        work, which has the cores whenever it wants them. Otherwise (or alone: no weight is
        changed, so a setup never starves behind anything else) the lane's in-container work
        becomes this member's, once the earlier one's has ended, until its removal begins."""
        lane = self.lane
        with lane.cv:
            self._started()
            if not self._wait(self._earlier_done, stop):
                return False
            if lane.w_owner is not None and yield_cpu is not None and yield_cpu():
                return True
            if not self._wait(lambda: lane.w_owner is None, stop):
                return False
            lane.w_owner = self
            return True

    @contextmanager
    def agent(self, stop: threading.Event | None = None) -> Iterator[bool]:
        """The measured window: opens once no other member does in-container work and no
        sandbox of the lane is starting or being removed; the lane's in-container work is
        then this member's until its removal begins. Yields False (and opens nothing) if the
        run stopped while it waited."""
        lane = self.lane
        with lane.cv:
            ok = self._wait(lambda: lane.transitions == 0 and lane.w_owner in (None, self), stop)
            if ok:
                lane.agent_member = self
                lane.w_owner = self
        try:
            yield ok
        finally:
            with lane.cv:
                if lane.agent_member is self:
                    lane.agent_member = None
                self.post = True
                lane.cv.notify_all()

    def remove_begin(self) -> None:
        """In-container work ends and removal begins, in one step (whatever happened before;
        once per member: later calls return at once)."""
        lane = self.lane
        with lane.cv:
            if self.removal is not None:
                return
            self._started()
            self.post = True
            if lane.w_owner is self:
                lane.w_owner = None
            self._wait(lambda: lane.agent_member is None or lane.agent_member is self, None)
            lane.transitions += 1
            self.removal = "on"
            lane.cv.notify_all()

    def remove_end(self) -> None:
        with self.lane.cv:
            if self.removal == "on":
                self.removal = "over"
                self.lane.transitions -= 1
                self.lane.cv.notify_all()


class _Open:
    """The gate of an attempt alone on its cores."""

    def wait_start(self, stop: threading.Event | None = None) -> bool:
        return True

    def started(self) -> None:
        pass

    def work(self, stop: threading.Event | None = None, yield_cpu: Callable[[], bool] | None = None) -> bool:
        return True

    @contextmanager
    def agent(self, stop: threading.Event | None = None) -> Iterator[bool]:
        yield True

    def remove_begin(self) -> None:
        pass

    def remove_end(self) -> None:
        pass


OPEN = _Open()
