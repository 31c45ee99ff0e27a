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

from harness.model.attempt import AttemptRecord
from harness.model.grade import GradeResult
from harness.model.outcomes import SlotStatus
from harness.model.sandbox import ExecResult

# reasons of discarded attempts that are not the slot's doing: never charged to its budget
UNCHARGED = ("interrupted",)
ENVELOPE_REASONS = ("cpu_throttled", "memory_pressure")


def classify_command(exec_result: ExecResult | None, oom_kills: int | None) -> str:
    """ok, crashed, timeout, oom_killed or infra_error for one finished command."""
    if exec_result is None or exec_result.exit_code is None and not exec_result.timed_out:
        return "infra_error"
    if (oom_kills or 0) > 0:
        return "oom_killed"
    if exec_result.timed_out:
        return "timeout"
    return "ok" if exec_result.exit_code == 0 else "crashed"


def agent_start_failure(res: ExecResult, agent_cmd: list[str]) -> str | None:
    """Why the agent command never ran (None if it did): exit 126/127 within 2 s with a
    'not found' / 'permission denied' message is a wrong command, not an agent scoring 0."""
    if res.exit_code is None and not res.timed_out:
        return f"agent exec failed: {res.stderr.strip()[-300:]}"
    if res.exit_code in (126, 127) and not res.timed_out and res.wall_s < 2:
        out = (res.stdout + res.stderr).strip()
        if not out or "not found" in out or "permission denied" in out.lower() or "exec failed" in out:
            return (
                f"the agent command {list(agent_cmd)!r} could not be started (exit {res.exit_code}): {out[-200:]}; "
                "check --agent-cmd or agent_cmd in suite.toml"
            ).strip()
    return None


def graded_outcome(exit_code: int | None, timed_out: bool, oom_kills: int | None, grade: GradeResult) -> tuple[str, str | None, str | None]:
    """(outcome, failure kind, reason) of an attempt whose grade is ``graded`` or ``ungradable``.

    The agent phase decides first (an OOM kill, then a timeout); then the state: ungradable,
    or wrong (``wrong_state`` after a clean exit, ``crashed`` after a non-zero one). A
    crashed agent that left the right state passes: the state is what is graded."""
    if (oom_kills or 0) > 0:
        return "fail", "oom_killed", grade.reason or "agent killed before finishing"
    if timed_out:
        return "fail", "timeout", grade.reason or "agent killed before finishing"
    if grade.status == "ungradable":
        return "fail", "ungradable", grade.reason
    if not grade.passed:
        return "fail", "wrong_state" if exit_code == 0 else "crashed", grade.reason
    return "pass", None, None


def interrupted(record: AttemptRecord) -> AttemptRecord:
    """A discarded attempt cut short because the controller was stopped: evidence, but not
    the slot's fault, so not scored and not charged to its rerun budget."""
    rule = {"rule": "interrupted", "scope": "host", "value": None, "threshold": None, "breached": True,
            "detail": "the controller was stopped (Ctrl-C / SIGTERM) during this attempt; not scored, not charged to the rerun budget"}
    return record.model_copy(update={"reasons": ["interrupted"], "rules": [rule]})


def controller_lost(run_id: str, task_id: str, slot: int, attempt_no: int, seed: int, controller: str, started_at, now) -> AttemptRecord:
    """The record of an attempt whose controller died while it ran (found at resume): charged
    to the slot, so an attempt that kills its controller every time ends unmeasured."""
    detail = (f"the controller ({controller}) stopped while this attempt ran (killed, out of memory, or its machine "
              "went down); found by --resume, charged to the rerun budget")
    rule = {"rule": "controller_lost", "scope": "host", "value": 1, "threshold": 0, "breached": True, "detail": detail}
    return AttemptRecord(run_id=run_id, task_id=task_id, slot=slot, attempt_no=attempt_no, seed=seed, verdict="discarded",
                         reasons=["controller_lost"], rules=[rule], error=detail, started_at=started_at, finished_at=now)


def charged(attempts: Iterable[AttemptRecord]) -> int:
    """Discarded attempts that count against a slot's rerun budget."""
    return sum(1 for a in attempts if a.verdict != "clean" and not any(r in UNCHARGED for r in a.reasons))


def unmeasured_note(record: AttemptRecord, budget_used: int, max_reruns: int, task_id: str) -> str:
    """The note on the attempt that spent a slot's rerun budget."""
    if record.reasons and all(r in ENVELOPE_REASONS for r in record.reasons):
        return f"slot unmeasured after {budget_used} attempts: the envelope is too small for task {task_id}"
    return f"slot unmeasured after {budget_used} attempts (rerun budget {max_reruns} spent)"


def slot_status(clean: AttemptRecord | None, discarded: list[AttemptRecord], max_reruns: int | None) -> SlotStatus:
    """pass / fail (its clean attempt), unmeasured (rerun budget spent without a clean
    attempt), or pending (not finished: never run, or cut short by an interruption)."""
    if clean is not None:
        return "pass" if clean.outcome == "pass" else "fail"
    n = charged(discarded)
    if max_reruns is None:
        return "unmeasured" if n else "pending"
    return "unmeasured" if n > max_reruns else "pending"
