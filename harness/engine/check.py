"""``harness suites check``: is every task of a suite gradable as packaged?

Each task runs once with the built-in ``oracle`` (its reference solution) and once with
``nop`` (nothing), as two ordinary stored runs. A task is broken when the oracle does not
pass (unsolvable as packaged: its tests, image or solution are wrong here) or nop passes
(the grader accepts an untouched state), or when it cannot run here at all (its image does
not build offline, it has no solution). One line per broken task says which and why. A task
whose oracle or nop run ended unmeasured for the host's or the model API's reasons (every
attempt discarded, none for an envelope rule) is unmeasured: no verdict, not broken.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from harness.core.outcome import first_clean
from harness.core.sla import ENVELOPE_RULES
from harness.engine.agents import NOP, ORACLE
from harness.model.attempt import AttemptRecord
from harness.model.errors import NothingToRun


@dataclass
class TaskCheck:
    """One task's verdict: ok, or broken with the reason."""

    task: str
    oracle: str = "-"  # pass | fail | unmeasured | not run
    nop: str = "-"
    reasons: list[str] = field(default_factory=list)
    attempts: dict[str, int | None] = field(default_factory=dict)  # agent -> the attempt id to `harness show`
    # not measured for a reason outside the task (the host, the model API): no verdict either way
    unmeasured: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.reasons and not self.unmeasured

    @property
    def verdict(self) -> str:
        return "broken" if self.reasons else "unmeasured" if self.unmeasured else "ok"


def _state(recs: list[AttemptRecord]) -> tuple[str, AttemptRecord | None]:
    clean = first_clean(recs)
    if clean is not None:
        return (clean.outcome or "fail"), clean
    last = max(recs, key=lambda a: a.attempt_no) if recs else None
    return ("unmeasured" if recs else "not run"), last


def _why(rec: AttemptRecord | None) -> str:
    if rec is None:
        return "no attempt"
    text = rec.grade_reason or rec.error or ", ".join(rec.reasons) or rec.failure_kind or "failed"
    return " ".join(text.split())[:400]


def _envelope_spent(recs: list[AttemptRecord]) -> bool:
    """An attempt discarded for an envelope rule (the task's own envelope too small for it)."""
    return any(r in ENVELOPE_RULES for a in recs if a.verdict != "clean" for r in (a.reasons or ()))


def _rules(recs: list[AttemptRecord]) -> str:
    counts: dict[str, int] = {}
    for a in recs:
        for r in a.reasons or ["unknown"]:
            counts[r] = counts.get(r, 0) + 1
    return ", ".join(f"{r} x{n}" for r, n in sorted(counts.items()))


def check_suite(run_one: Callable[[str], tuple[Any, list[AttemptRecord]]], task_ids: list[str]) -> tuple[list[TaskCheck], list[str]]:
    """Run the oracle, then nop (``run_one(agent)`` -> (run record, its attempts)); the checks
    per task and the run ids."""
    checks = {t: TaskCheck(t) for t in task_ids}
    run_ids = []
    for agent in (ORACLE, NOP):
        try:
            run, attempts = run_one(agent)
        except NothingToRun as e:  # e.g. no task has a solution: every task is a broken row, not an error
            run, attempts = None, []
            excluded = e.excluded
        else:
            run_ids.append(run.id)
            excluded = run.excluded or {}
        for t, why in excluded.items():
            c = checks.setdefault(t, TaskCheck(t))
            setattr(c, agent, "not run")
            line = why.splitlines()[0][:400]
            if f"cannot run: {line}" not in c.reasons:
                c.reasons.append(f"cannot run: {line}")
        by_task: dict[str, list[AttemptRecord]] = {}
        for a in attempts:
            by_task.setdefault(a.task_id, []).append(a)
        for t, recs in by_task.items():
            c = checks.setdefault(t, TaskCheck(t))
            state, rec = _state(recs)
            setattr(c, agent, state)
            c.attempts[agent] = rec.id if rec is not None else None
            if state == "unmeasured" and not _envelope_spent(recs):
                # every attempt discarded for the host or the model API: says nothing of the task
                c.unmeasured.append(f"{agent} unmeasured: {_rules(recs)} (rerun budget spent); check again on a quieter host")
            elif agent == ORACLE and state != "pass":
                c.reasons.append(f"oracle {'failed' if state == 'fail' else state}: {_why(rec)}")
            elif agent == NOP and state == "pass":
                c.reasons.append("nop passed: the grader accepts an untouched state")
            elif agent == NOP and state == "unmeasured":
                c.reasons.append(f"nop unmeasured: {_why(rec)}")
    return sorted(checks.values(), key=lambda c: c.task), run_ids
