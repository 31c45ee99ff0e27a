"""Planning a run (pure): ids, seeds, k, and which slots are still to fill.

A slot's seed depends on the run seed, the task and the trial index only, so a rerun of the
slot, a resumed run and the same slot under another envelope all see the same seed. k is
fixed before the run (by the suite or ``--k``), never chosen after.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from dataclasses import dataclass, field
from typing import Iterable

from harness.core.outcome import charged, first_clean
from harness.model.attempt import AttemptRecord
from harness.model.errors import RunError
from harness.model.units import plural


def slot_seed(run_seed: int, task_id: str, slot: int) -> int:
    """The seed of a slot (31 bits)."""
    h = hashlib.sha256(f"{run_seed}:{task_id}:{slot}".encode()).hexdigest()
    return int(h[:8], 16) & 0x7FFFFFFF


def new_run_id(now: dt.datetime | None = None) -> str:
    return (now or dt.datetime.now()).strftime("r%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def resolve_ks(requested: list[int] | None, suite_ks: list[int], trials: int, suite_name: str) -> list[int]:
    """The k values of a run: ``--k`` or the suite's, each between 1 and the trials."""
    ks = sorted(set(requested)) if requested else list(suite_ks)
    if any(k < 1 for k in ks):
        raise RunError(f"--k {','.join(map(str, ks))}: every k must be >= 1")
    too_big = [k for k in ks if k > trials]
    if too_big:
        src = "--k" if requested else f"suite {suite_name} (suite.toml: k)"
        raise RunError(
            f"k = {','.join(map(str, too_big))} from {src} exceeds {plural(trials, 'trial')} per task; "
            f"raise --trials to {max(too_big)} or pass --k {','.join(str(k) for k in ks if k <= trials) or '1'}"
        )
    return ks


@dataclass
class SlotState:
    """The driver's bookkeeping for one slot still to fill."""

    task_id: str
    slot: int
    seed: int
    attempts: int = 0  # highest attempt number so far
    budget_used: int = 0  # attempts that count against max_reruns (interrupted ones do not)


@dataclass
class Progress:
    """Counts the progress display shows."""

    total_slots: int
    passed: int = 0
    failed: int = 0
    discarded: int = 0
    unmeasured: int = 0
    attempts: int = 0

    @property
    def slots_done(self) -> int:
        return self.passed + self.failed + self.unmeasured


@dataclass
class Pending:
    """What is left of a run: the slots to fill and the counts so far. Slots are in trial-major
    order (trial 0 of every task, then trial 1, ...): a run cut short has measured every task
    about equally, not the first tasks fully and the last not at all, and a drift of the host
    over the run falls on every task alike rather than on the tasks that happened to run last."""

    slots: list[SlotState] = field(default_factory=list)
    progress: Progress = field(default_factory=lambda: Progress(0))


def pending_slots(attempts: Iterable[AttemptRecord], task_ids: list[str], trials: int, max_reruns: int, run_seed: int,
                  refills: dict[str, int] | None = None) -> Pending:
    """Slots still to fill from what the store holds (nothing, for a new run). A slot with a
    clean attempt, or whose rerun budget is spent, is done; the others continue with the next
    attempt number, so no slot is filled twice."""
    prog = Progress(total_slots=len(task_ids) * trials)
    by_slot: dict[tuple[str, int], list[AttemptRecord]] = {}
    for a in attempts:
        by_slot.setdefault((a.task_id, a.slot), []).append(a)
    out = []
    for i in range(trials):
        for task in task_ids:
            atts = by_slot.get((task, i), [])
            clean = first_clean(atts)
            prog.attempts += len(atts)
            prog.discarded += sum(1 for a in atts if a.verdict != "clean")
            if clean is not None:
                if clean.outcome == "pass":
                    prog.passed += 1
                else:
                    prog.failed += 1
                continue
            used = charged(atts, (refills or {}).get(f"{task}/{i}", 0))
            if used > max_reruns:
                prog.unmeasured += 1
                continue
            out.append(SlotState(task_id=task, slot=i, seed=slot_seed(run_seed, task, i),
                                 attempts=max([a.attempt_no for a in atts], default=0), budget_used=used))
    return Pending(slots=out, progress=prog)
