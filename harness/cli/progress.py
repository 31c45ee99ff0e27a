"""The progress display of ``harness run`` / ``sweep``: an event sink (``harness.engine.events``).

On a terminal: a rich progress bar. Piped (CI logs): a line per discarded attempt and a
count line every 10 s. ``HARNESS_PROGRESS=1`` forces the bar.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from harness.cli.app import err
from harness.engine.events import EventSink


class ProgressDisplay(EventSink):
    """A progress bar (or log lines) fed by run events. Use as a context manager."""

    def __init__(self, total: int, quiet: bool = False):
        self.total = total
        self.quiet = quiet
        self.t0 = time.monotonic()
        self._last = 0.0
        self._lock = threading.Lock()
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("[green]✓{task.fields[p]}[/] [red]✗{task.fields[f]}[/] [yellow]discarded {task.fields[d]}[/] [dim]unmeasured {task.fields[u]}[/]"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=err,
            disable=quiet or not err.is_terminal and os.environ.get("HARNESS_PROGRESS") != "1",
            transient=False,
        )
        self.tid = self.bar.add_task("slots", total=total, p=0, f=0, d=0, u=0)

    def __enter__(self) -> "ProgressDisplay":
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)

    def _show(self, prog: Any, record: Any = None) -> None:
        with self._lock:
            self.bar.update(self.tid, completed=prog.slots_done, p=prog.passed, f=prog.failed, d=prog.discarded, u=prog.unmeasured)
            if not self.bar.disable or self.quiet:
                return
            now = time.monotonic()
            if record is not None and record.verdict == "discarded":
                err.print(f"  discarded {record.task_id} trial {record.slot} attempt {record.attempt_no}: {', '.join(record.reasons)}",
                          highlight=False)
            if now - self._last > 10 or prog.slots_done == self.total:
                self._last = now
                err.print(f"  {prog.slots_done}/{self.total} slots  ✓{prog.passed} ✗{prog.failed} discarded {prog.discarded} "
                          f"unmeasured {prog.unmeasured}  {now - self.t0:.0f}s", highlight=False)

    def run_started(self, run: Any, progress: Any) -> None:
        self._show(progress)

    def attempt_finished(self, record: Any, progress: Any) -> None:
        self._show(progress, record)


def sigterm_as_interrupt() -> None:
    """CI cancellation and `timeout` send SIGTERM: clean up as for Ctrl-C."""

    def _term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
