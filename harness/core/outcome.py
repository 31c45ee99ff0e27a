"""Outcome policy, in one place: what an attempt's measurements mean.

* a command's kind (``harness sandbox exec``): kernel counters first, exit status second;
* an agent command that could not start is an infrastructure problem, never a score of 0;
* a graded attempt's outcome and failure kind (an OOM kill counts even when the agent
  caught it; a clean exit with a wrong state is ``wrong_state``, the dangerous one);
* which discarded attempts are charged to a slot's rerun budget, and a slot's status.

Pure: records and results in, values out.
"""

from __future__ import annotations

from typing import Iterable

from harness.core.sla import ENVELOPE_RULES
from harness.model.attempt import AttemptRecord
from harness.model.grade import GradeResult
from harness.model.outcomes import SlotStatus
from harness.model.sandbox import ExecResult

# reasons of discarded attempts that are not the slot's doing: never charged to its budget
UNCHARGED = ("interrupted",)


def classify_command(exec_result: ExecResult | None, oom_kills: int | None, engine_oom: bool = False) -> str:
    """ok, crashed, timeout, oom_killed or infra_error for one finished command. The kernel's
    OOM count decides first: a command the memory ceiling took is its own failure even where
    its exit status was lost with the container (its keeper taken by the same ceiling), and
    where the cgroup went before it was read, the engine's word that the ceiling ended it."""
    if ((oom_kills or 0) > 0 or engine_oom) and exec_result is not None:
        return "oom_killed"
    if exec_result is None or exec_result.exit_code is None and not exec_result.timed_out:
        return "infra_error"
    if exec_result.timed_out:
        return "timeout"
    return "ok" if exec_result.exit_code == 0 else "crashed"


def agent_start_failure(res: ExecResult) -> str | None:
    """Why the agent never ran (None if it did), from what the engine says -- never from what
    the agent printed or its exit status (an agent could make its own failures look like a
    harness problem). A command missing from the image is refused before the run starts."""
    if res.exit_code is None and not res.timed_out:
        return f"agent exec failed: {res.stderr.strip()[-300:]}"
    return None


def graded_outcome(exit_code: int | None, timed_out: bool, oom_kills: int | None, grade: GradeResult,
                   agent_timeout: float | None = None) -> tuple[str, str | None, str | None]:
    """(outcome, failure kind, reason) of an attempt whose grade is ``graded`` or ``ungradable``.

    The agent phase decides first (an OOM kill, then a timeout), and the reason says so
    first; then the state: ungradable, or wrong (``wrong_state`` after a clean exit,
    ``crashed`` after a non-zero one). A crashed agent that left the right state passes:
    the state is what is graded."""
    left = f"; the state it left: {grade.reason}" if grade.reason else ""
    if (oom_kills or 0) > 0:
        return "fail", "oom_killed", f"the agent was OOM-killed (its memory ceiling){left}"
    if timed_out:
        at = f" at its {agent_timeout:g} s timeout" if agent_timeout else " at its timeout"
        return "fail", "timeout", f"the agent was killed{at}{left}"
    if grade.status == "ungradable":
        return "fail", "ungradable", grade.reason
    if not grade.passed:
        return "fail", "wrong_state" if exit_code == 0 else "crashed", grade.reason
    return "pass", None, None


INTERRUPTED_DETAIL = "the controller was stopped (Ctrl-C / SIGTERM) during this attempt; not scored, not charged to the rerun budget"


def interrupted(record: AttemptRecord, detail: str = INTERRUPTED_DETAIL) -> AttemptRecord:
    """An attempt the controller cut short by stopping (its sandbox removed under it):
    evidence, but not the slot's fault, so not scored and not charged to its rerun budget.
    Its reason is ``interrupted`` (what the interrupt did to it is not an infrastructure
    fault); the rules it was judged by are kept, with the ``interrupted`` rule added."""
    rule = {"rule": "interrupted", "scope": "host", "value": None, "threshold": None, "breached": True, "detail": detail}
    return record.model_copy(update={"verdict": "discarded", "reasons": ["interrupted"], "rules": list(record.rules) + [rule]})


def cut_short(record: AttemptRecord) -> bool:
    """Did this attempt end because its sandbox went away (what an interrupt does to the
    attempts in flight), rather than run to its end?"""
    return record.verdict == "discarded" and "infra_error" in record.reasons


def controller_lost(run_id: str, task_id: str, slot: int, attempt_no: int, seed: int, controller: str, started_at, now) -> AttemptRecord:
    """The record of an attempt whose controller died while it ran (found at resume): charged
    to the slot, so an attempt that kills its controller every time ends unmeasured."""
    detail = (f"the controller ({controller}) stopped while this attempt ran (killed, out of memory, or its machine "
              "went down); found by --resume, charged to the rerun budget")
    rule = {"rule": "controller_lost", "scope": "host", "value": 1, "threshold": 0, "breached": True, "detail": detail}
    return AttemptRecord(run_id=run_id, task_id=task_id, slot=slot, attempt_no=attempt_no, seed=seed, verdict="discarded",
                         reasons=["controller_lost"], rules=[rule], error=detail, started_at=started_at, finished_at=now)


def attempt_lost(run_id: str, task_id: str, slot: int, attempt_no: int, seed: int, rule: str, detail: str, started_at, now,
                 node: dict | None = None) -> AttemptRecord:
    """The record the driver makes for an attempt whose node or worker was lost (``rule``:
    node_lost, worker_lost, no_result): an infrastructure error, charged, and the slot rerun."""
    r = {"rule": rule, "scope": "host", "value": 1, "threshold": 0, "breached": True, "detail": detail}
    return AttemptRecord(run_id=run_id, task_id=task_id, slot=slot, attempt_no=attempt_no, seed=seed, verdict="discarded",
                         reasons=["infra_error"], rules=[r], error=detail, started_at=started_at, finished_at=now, node=dict(node or {}))


def charged(attempts: Iterable[AttemptRecord], after: int = 0) -> int:
    """Discarded attempts that count against a slot's rerun budget: those numbered after
    ``after`` (a refill, ``--refill-unmeasured``, gives the slot a fresh budget from there;
    the attempts before it stay as evidence)."""
    return sum(1 for a in attempts if a.verdict != "clean" and a.attempt_no > after and not any(r in UNCHARGED for r in a.reasons))


REFILLABLE_SCOPES = ("host", "upstream")
# host rules an attempt can cause itself: charged so that it ends unmeasured, never refilled
NOT_REFILLABLE = ("controller_lost",)


def refillable(attempts: Iterable[AttemptRecord], after: int = 0) -> bool:
    """May an unmeasured slot get a fresh rerun budget? Only when every charged discard since
    the last refill was the machine's or the model API's fault: an envelope breach is the
    agent's own doing (it would be re-rolled until it passes), and so is a controller that
    died during the attempt. A record without rules counts only as an infrastructure error."""
    atts = [a for a in attempts if a.verdict != "clean" and a.attempt_no > after and not any(r in UNCHARGED for r in a.reasons)]

    def ok(a: AttemptRecord) -> bool:
        if any(r in NOT_REFILLABLE for r in a.reasons):
            return False
        breached = [r for r in a.rules if r.get("breached")]
        if not breached:
            return bool(a.reasons) and set(a.reasons) <= {"infra_error"}
        return all(r.get("scope") in REFILLABLE_SCOPES and r.get("rule") not in NOT_REFILLABLE for r in breached)

    return bool(atts) and all(ok(a) for a in atts)


def unmeasured_note(record: AttemptRecord, budget_used: int, max_reruns: int, task_id: str) -> str:
    """The note on the attempt that spent a slot's rerun budget."""
    if record.reasons and all(r in ENVELOPE_RULES for r in record.reasons):
        return f"slot unmeasured after {budget_used} attempts: the envelope is too small for task {task_id}"
    return f"slot unmeasured after {budget_used} attempts (rerun budget {max_reruns} spent)"


def first_clean(attempts: Iterable[AttemptRecord]) -> AttemptRecord | None:
    """The clean attempt that fills a slot: the first by attempt number (there should be one)."""
    clean = sorted((a for a in attempts if a.verdict == "clean"), key=lambda a: (a.attempt_no, a.id or 0))
    return clean[0] if clean else None


def slot_status(clean: AttemptRecord | None, discarded: list[AttemptRecord], max_reruns: int | None, after: int = 0) -> SlotStatus:
    """pass / fail (its clean attempt), unmeasured (rerun budget spent without a clean
    attempt), or pending (not finished: never run, or cut short by an interruption)."""
    if clean is not None:
        return "pass" if clean.outcome == "pass" else "fail"
    n = charged(discarded, after)
    if max_reruns is None:
        return "unmeasured" if n else "pending"
    return "unmeasured" if n > max_reruns else "pending"
