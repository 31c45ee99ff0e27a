"""Event sinks: who hears about a run while it happens (the progress display; OTel: harness.engine.otel).

A sink implements any of :class:`EventSink`'s methods; the driver calls them from its own
thread (run and attempt events) and the attempt pipeline from worker threads (phases), so a
sink must be thread-safe. A sink that raises is dropped from the run with a note, never
allowed to stop it.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from harness.core.plan import Progress
from harness.model.attempt import AttemptRecord
from harness.model.run import RunRecord


class EventSink:
    """Hooks of a run; every one is optional (the defaults do nothing)."""

    def run_started(self, run: RunRecord, progress: Progress) -> None:
        """The run is stored and about to schedule its pending slots."""

    def attempt_started(self, run_id: str, task_id: str, slot: int, attempt_no: int, cpuset: list[int], node: str = "") -> None:
        """An attempt leased its cores and is about to start its sandbox (``node``: where, for
        a distributed run: hostname/node-id prefix; empty on the local executor)."""

    def phase(self, run_id: str, task_id: str, slot: int, attempt_no: int, name: str, t0: float, t1: float) -> None:
        """One phase of an attempt ended (sandbox, setup, agent, stop, grade, export, remove);
        times are ``time.monotonic()``."""

    def attempt_finished(self, record: AttemptRecord, progress: Progress) -> None:
        """An attempt's record is stored."""

    def run_finished(self, run: RunRecord, progress: Progress) -> None:
        """The run ended (complete, interrupted or failed)."""

    def notice(self, text: str) -> None:
        """Something the user should see while the run goes on (a busy core, a wait for cores)."""


class Fanout(EventSink):
    """Several sinks as one; a sink that raises is removed (once, with a line on stderr)."""

    def __init__(self, sinks: list[EventSink] | None = None):
        self._sinks = list(sinks or [])
        self._lock = threading.Lock()

    def _call(self, name: str, *args: Any) -> None:
        with self._lock:
            sinks = list(self._sinks)
        for s in sinks:
            try:
                getattr(s, name)(*args)
            except Exception as e:
                with self._lock:
                    if s in self._sinks:
                        self._sinks.remove(s)
                print(f"harness: event sink {type(s).__name__} failed in {name} ({type(e).__name__}: {e}); dropped",
                      file=sys.stderr)

    def run_started(self, *a: Any) -> None:
        self._call("run_started", *a)

    def attempt_started(self, *a: Any) -> None:
        self._call("attempt_started", *a)

    def phase(self, *a: Any) -> None:
        self._call("phase", *a)

    def attempt_finished(self, *a: Any) -> None:
        self._call("attempt_finished", *a)

    def notice(self, *a: Any) -> None:
        self._call("notice", *a)

    def run_finished(self, *a: Any) -> None:
        self._call("run_finished", *a)
