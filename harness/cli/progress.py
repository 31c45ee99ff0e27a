"""The progress display of ``harness run`` / ``sweep``: an event sink (``harness.engine.events``).

On a terminal: a rich progress bar. Piped (CI logs): a line per discarded attempt and a
count line every 10 s. ``HARNESS_PROGRESS=1`` forces the bar. A distributed run (``--executor
ray``) also shows one line per node: attempts running there, cores they lease, attempts
finished and discarded there.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.markup import escape
from rich.table import Table

from harness.cli.app import err
from harness.engine.events import EventSink


class _NodeBar(Progress):
    """The progress bar, with the per-node table under it (when there are nodes)."""

    nodes_table: Any = None

    def get_renderables(self) -> Any:
        yield self.make_tasks_table(self.tasks)
        table = self.nodes_table() if self.nodes_table is not None else None
        if table is not None:
            yield table


def node_name(hostname: str, node_id: str) -> str:
    return f"{hostname or '?'}/{node_id[:8]}"


class ProgressDisplay(EventSink):
    """A progress bar (or log lines) fed by run events. Use as a context manager."""

    def __init__(self, total: int, quiet: bool = False):
        self.total = total
        self.quiet = quiet
        self.t0 = time.monotonic()
        self._last = 0.0
        self._lock = threading.Lock()
        self.nodes: dict[str, dict[str, Any]] = {}  # node -> running {attempt: cores}, done, discarded
        self.bar = _NodeBar(
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
        self.bar.nodes_table = self._nodes_table

    def _node(self, name: str) -> dict[str, Any]:
        return self.nodes.setdefault(name, {"running": {}, "done": 0, "discarded": 0})

    def _nodes_table(self) -> Table | None:
        with self._lock:
            if not self.nodes:
                return None
            t = Table(box=None, show_header=True, header_style="dim", pad_edge=False)
            for col in ("node", "running", "leased cores", "finished", "discarded"):
                t.add_column(col, justify="left" if col == "node" else "right")
            for name, n in sorted(self.nodes.items()):
                t.add_row(name, str(len(n["running"])), str(sum(n["running"].values())), str(n["done"]), str(n["discarded"]))
            return t

    def _node_lines(self) -> list[str]:
        return [f"    node {name}: running {len(n['running'])} (cores {sum(n['running'].values())}), finished {n['done']}, "
                f"discarded {n['discarded']}" for name, n in sorted(self.nodes.items())]

    def __enter__(self) -> "ProgressDisplay":
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)

    _prog: Any = None

    def _show(self, prog: Any, record: Any = None) -> None:
        self._prog = prog
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
                for line in self._node_lines():
                    err.print(line, highlight=False)

    def run_started(self, run: Any, progress: Any) -> None:
        self._show(progress)

    def notice(self, text: str) -> None:
        # a warning, not progress: on stderr also beside --json
        err.print(f"[yellow]{escape(text)}[/]", highlight=False, soft_wrap=True)

    def attempt_started(self, run_id: str, task_id: str, slot: int, attempt_no: int, cpuset: list[int], node: str = "") -> None:
        if node:
            with self._lock:
                self._node(node)["running"][(task_id, slot, attempt_no)] = len(cpuset)
            if self._prog is not None:
                self._show(self._prog)  # the 10-s lines also while attempts run, not only as one ends

    def attempt_finished(self, record: Any, progress: Any) -> None:
        info = getattr(record, "node", None) or {}
        if info.get("node_id"):
            with self._lock:
                n = self._node(node_name(info.get("hostname", ""), info["node_id"]))
                n["running"].pop((record.task_id, record.slot, record.attempt_no), None)
                n["done"] += 1
                n["discarded"] += record.verdict != "clean"
        self._show(progress, record)


def sigterm_as_interrupt() -> None:
    """CI cancellation and `timeout` send SIGTERM: clean up as for Ctrl-C."""

    def _term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
