"""Release gates: requirements such as ``pass^4>=0.9`` over a run's per-task outcomes.

A suite requirement averages per-task estimates over tasks with at least k clean trials;
a per-task requirement asks a share of tasks to meet it; a baseline check fails every task
that passed every trial in the baseline and no longer does. Unmeasured slots never count;
a metric that cannot be computed fails the gate.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from harness.core.estimator import ESTIMANDS, TaskOutcomes, suite_interval, suite_metrics

_REQ = re.compile(r"^\s*pass\s*(?P<sym>[@^])\s*(?P<k>[0-9]{1,12})\s*(?P<op>>=|<=|==|>|<)\s*(?P<v>[0-9]{0,30}\.?[0-9]{1,30})\s*$")  # ASCII digits only
_FRAGMENT = re.compile(r"^\s*(pass\s*[@^]\s*[0-9]+|>=|<=|==|>|<|[0-9]*\.?[0-9]+|(>=|<=|==|>|<)\s*[0-9]*\.?[0-9]+)\s*$")
_NEG = {">=": "<", ">": "<=", "<=": ">", "<": ">=", "==": "!="}
_EPS = 1e-9


@dataclass(frozen=True)
class Requirement:
    """One parsed requirement such as ``pass^4>=0.9``."""

    text: str
    sym: str  # '@' or '^'
    k: int
    op: str
    value: float

    @property
    def metric(self) -> str:
        return "pass@1" if self.k == 1 else f"pass{self.sym}{self.k}"

    def holds(self, v: float) -> bool:
        t = self.value
        return {
            ">=": v >= t - _EPS,
            ">": v > t + _EPS,
            "<=": v <= t + _EPS,
            "<": v < t - _EPS,
            "==": abs(v - t) <= _EPS,
        }[self.op]

    def describe(self, v: float) -> str:
        """'pass^4 = 0.812 < 0.9 (short by 0.088)' or 'pass^4 = 0.950 >= 0.9 (margin 0.050)'."""
        gap = abs(v - self.value)
        if self.holds(v):
            return f"{self.metric} = {v:.3f} {self.op} {self.value:.12g}" + (f" (margin {gap:.3f})" if self.op != "==" else "")
        how = {">=": "short", ">": "short", "<=": "over", "<": "over", "==": "off"}[self.op]
        return f"{self.metric} = {v:.3f} {_NEG[self.op]} {self.value:.12g} ({how} by {gap:.3f})"


def parse_requirement(text: str) -> Requirement:
    """Parse ``pass@K`` / ``pass^K`` / ``pass@1`` + operator + value in [0, 1]; ValueError if malformed."""
    m = _REQ.match(text or "")
    if not m and _FRAGMENT.match(text or ""):
        raise ValueError(f"requirement {text!r:.200}: a part of a requirement (was it split at its spaces? `make gate REQUIRE=...` "
                         "separates requirements by spaces): write each without spaces, e.g. 'pass^4>=0.9'")
    if not m:
        raise ValueError(
            f"requirement {text!r:.200}: expected METRIC OP VALUE with METRIC pass@K or pass^K (K up to 12 digits), "
            "OP one of >= > <= < ==, VALUE in [0, 1], e.g. 'pass^4>=0.9'"
        )
    k, v = int(m["k"]), float(m["v"])
    if k < 1:
        raise ValueError(f"requirement {text!r}: k must be >= 1")
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"requirement {text!r}: value {m['v']} is outside [0, 1]")
    return Requirement(text=text.strip(), sym=m["sym"], k=k, op=m["op"], value=v)


def parse_per_task(text: str) -> tuple[Requirement, float]:
    """Parse ``pass^3==1:0.9`` -> (requirement on each task, share of tasks that must meet it)."""
    cond, sep, share = (text or "").rpartition(":")
    if not sep:
        raise ValueError(f"--per-task {text!r}: expected CONDITION:SHARE, e.g. 'pass^3==1:0.9' (90% of tasks reach pass^3 == 1)")
    req = parse_requirement(cond)
    try:
        frac = float(share)
    except ValueError:
        raise ValueError(f"--per-task {text!r}: share {share!r} is not a number in [0, 1]") from None
    if not 0.0 <= frac <= 1.0:
        raise ValueError(f"--per-task {text!r}: share {frac:g} is outside [0, 1]")
    return req, frac


@dataclass
class GateCheck:
    """The outcome of one gate condition."""

    name: str
    ok: bool
    message: str
    details: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "message": self.message, "details": self.details, **self.data}


def _task_value(req: Requirement, t: TaskOutcomes) -> float | None:
    if t.n < req.k or t.n == 0:
        return None
    sm = suite_metrics([t], [req.k])
    m = sm.per_task[0]
    return m.pass1 if req.k == 1 else (m.pass_at_k if req.sym == "@" else m.pass_hat_k)[req.k]


def check_requirement(req: Requirement, tasks: list[TaskOutcomes], confidence: float | None = None,
                      estimand: str = "tasks") -> GateCheck:
    """Suite-level requirement: mean over tasks of the per-task estimate.

    Tasks with 0 < n < k cannot give the figure; they count at their worst for the
    requirement (0 for >= and >, 1 for <= and <), so a task that failed its only trials
    cannot drop out and lift the mean. With ``confidence``, the gate holds only if the
    one-sided bound at that confidence (lower for >=/>, upper for <=/<) meets the value,
    for the chosen estimand (tasks like these, or this suite)."""
    metric = "pass@1" if req.k == 1 else ("pass@k" if req.sym == "@" else "pass^k")
    short = [t.task_id for t in tasks if 0 < t.n < req.k]
    if not any(t.n >= req.k for t in tasks):
        return GateCheck(
            req.text, False,
            f"{req.metric} cannot be computed: no task has {req.k} clean trial(s) "
            f"({len(tasks)} task(s), all unmeasured or short of k) -- that is a failure, not a pass",
        )
    worst = 0.0 if req.op in (">=", ">", "==") else 1.0
    two_sided = None if confidence is None else 2 * confidence - 1
    iv = suite_interval(tasks, metric, k=req.k, conf=two_sided if two_sided and two_sided > 0 else 0.5,  # type: ignore[arg-type]
                        estimand=estimand, short_as=worst if short else None)
    est = iv.estimate
    if confidence is None:
        v, used = est, "the point estimate"
    elif req.op in (">=", ">"):
        v, used = iv.low, f"the {confidence * 100:g}% lower bound ({ESTIMANDS[estimand]}; estimate {est:.3f})"
    elif req.op in ("<=", "<"):
        v, used = iv.high, f"the {confidence * 100:g}% upper bound ({ESTIMANDS[estimand]}; estimate {est:.3f})"
    else:
        v, used = est, "the point estimate (== has no one-sided bound)"
    ok = req.holds(v) and not (short and req.op == "==")
    msg = req.describe(v) + f" over {iv.n_tasks} task(s), judged on {used}"
    if short and req.op == "==":
        msg += f"; fails: {len(short)} task(s) short of k cannot show an exact value"
    details = []
    if short:
        details.append(f"{len(short)} task(s) with fewer than {req.k} clean trials counted at their worst ({worst:g}): {', '.join(short)}")
    unmeasured = [t.task_id for t in tasks if t.n == 0]
    if unmeasured:
        details.append(f"{len(unmeasured)} unmeasured task(s) in no figure: {', '.join(unmeasured)}")
    check = GateCheck(req.text, ok, msg, details)
    check.data = {"metric": req.metric, "value": v, "estimate": est, "bound": None if confidence is None else v,
                  "confidence": confidence, "estimand": estimand if confidence is not None else None,
                  "n_tasks": iv.n_tasks, "short": short, "unmeasured": unmeasured}
    return check


def check_per_task(req: Requirement, share: float, tasks: list[TaskOutcomes], text: str) -> GateCheck:
    """At least ``share`` of the measured tasks meet ``req`` individually; a task with fewer
    than k (but some) clean trials cannot show that it does, so it counts as not meeting it."""
    vals = [(t.task_id, _task_value(req, t)) for t in tasks if t.n > 0]
    measured = [(tid, v) for tid, v in vals if v is not None]
    excluded = [tid for tid, v in vals if v is None]
    name = f"per-task {text}"
    if not measured:
        return GateCheck(name, False, f"per-task {req.metric} cannot be computed: no task has {req.k} clean trial(s) -- that is a failure, not a pass")
    used = measured + [(tid, math.nan) for tid in excluded]
    meeting = [tid for tid, v in measured if req.holds(v)]
    missing = [(tid, v) for tid, v in used if tid not in meeting]
    got = len(meeting) / len(used)
    ok = got >= share - _EPS
    need = math.ceil(share * len(used) - _EPS)
    cond = f"{req.metric} {req.op} {req.value:g}"
    if ok:
        msg = f"{len(meeting)} of {len(used)} tasks ({got:.1%}) reach {cond}; required {share:.0%}"
    else:
        msg = (
            f"{len(meeting)} of {len(used)} tasks ({got:.1%}) reach {cond} < required {share:.0%} "
            f"(short by {need - len(meeting)} task(s))"
        )
    details = []
    if missing and not ok:
        details.append("not reaching it: " + ", ".join(f"{tid} ({'short of k' if math.isnan(v) else format(v, '.3f')})"
                                                       for tid, v in sorted(missing, key=lambda x: (math.isnan(x[1]), x[1], x[0]))))
    if excluded:
        details.append(f"{len(excluded)} task(s) with fewer than {req.k} clean trials counted as not reaching it: {', '.join(excluded)}")
    return GateCheck(name, ok, msg, details)


def check_measured(tasks: list[TaskOutcomes], run_id: str = "RUN", status: str = "interrupted") -> GateCheck | None:
    """A task with no clean trial at all is in no figure: the gate cannot vouch for it."""
    none = [t for t in tasks if t.n == 0]
    if not none:
        return None
    spent = [t for t in none if t.unmeasured]  # a rerun budget spent on discards: a refill measures them
    waiting = [t for t in none if t.pending and not t.unmeasured]  # not run yet: resuming the run measures them
    how = []
    if spent:
        how.append(f"{len(spent)} spent their rerun budget on discards: once the cause is gone, "
                   f"`harness run --resume {run_id} --refill-unmeasured` measures those discarded by the host or the model API "
                   "(not a slot an envelope breach or controller_lost spent, nor one refilled once already)")
    if waiting and status == "complete":
        how.append(f"{len(waiting)} have slots with no attempt in this store, though the run is marked complete")
    elif waiting:
        how.append(f"{len(waiting)} have slots not run yet (the run is {status}): `harness run --resume {run_id}` runs them")
    return GateCheck("every task measured", False,
                     f"{len(none)} of {len(tasks)} task(s) have no clean trial and are in no figure -- a gate cannot vouch for "
                     "them" + ("; " + "; ".join(how) if how else ""),
                     [f"{t.task_id}: {t.marks()}" for t in none[:20]])


def check_pending(tasks: list[TaskOutcomes], run_id: str = "RUN", status: str = "interrupted") -> GateCheck | None:
    """Slots with no attempt yet: a run still going or stopped is resumed; one marked complete
    cannot be (its evidence is missing from this store)."""
    pending = [t for t in tasks if t.pending]
    if not pending:
        return None
    n = sum(len(t.pending) for t in pending)
    if status == "complete":
        why = (f"run {run_id} is marked complete, yet {n} slot(s) of {len(pending)} task(s) have no attempt in this store "
               "(a partial copy of the store?); a complete run cannot be resumed")
    else:
        state = {"running": "is still running (or its controller stopped without marking it)",
                 "interrupted": "was interrupted", "failed": "ended on an error"}.get(status, f"is {status}")
        why = (f"run {run_id} {state}: {n} slot(s) of {len(pending)} task(s) have not run yet; "
               f"`harness run --resume {run_id}` runs them")
    return GateCheck("every slot run", False, why + " (--allow-incomplete judges the slots measured so far)",
                     [f"{t.task_id}: {len(t.pending)} not run" for t in pending[:20]])


def check_baseline(
    base: list[TaskOutcomes], cur: list[TaskOutcomes], base_id: str, marks: dict[str, str] | None = None, base_marks: dict[str, str] | None = None
) -> GateCheck:
    """Fail on every task that passed every clean trial in the baseline and no longer does, and
    on every such task this run does not have at all (the suite lost it: dropping a task is not
    holding it). One this run has but could not measure is left to :func:`check_measured`."""
    marks, base_marks = marks or {}, base_marks or {}
    by_id = {t.task_id: t for t in cur}
    deterministic = [t for t in base if t.n > 0 and t.c == t.n]
    name = f"baseline {base_id}"
    if not deterministic:
        return GateCheck(name, True, f"no task passed every trial in baseline {base_id}; nothing to hold")
    regressed, unchecked, absent = [], [], []
    for b in deterministic:
        t = by_id.get(b.task_id)
        if t is None:
            absent.append(b.task_id)
        elif t.n == 0:
            unchecked.append(b.task_id)
        elif t.c < t.n:
            regressed.append((b.task_id, t))
    held = len(deterministic) - len(regressed) - len(unchecked) - len(absent)
    details = [
        f"{tid}: {base_marks.get(tid, '✓' * next(b.n for b in deterministic if b.task_id == tid))} → {marks.get(tid, '')} ({t.c}/{t.n})"
        for tid, t in regressed
    ]
    if unchecked:
        details.append(f"not checked (unmeasured in this run): {', '.join(unchecked)}")
    if absent:
        details.append(f"not in this run: {', '.join(absent[:50])}" + (f" and {len(absent) - 50} more" if len(absent) > 50 else ""))
    problems = []
    if regressed:
        problems.append(f"{len(regressed)} task(s) that passed every trial in baseline {base_id} no longer do: "
                        + ", ".join(tid for tid, _ in regressed))
    if absent:
        problems.append(f"{len(absent)} task(s) that passed every trial in baseline {base_id} are not in this run "
                        "(left out with --tasks, or gone from the suite; gate against a baseline of the same tasks)")
    if problems:
        return GateCheck(name, False, "; ".join(problems), details)
    return GateCheck(name, True, f"all {held} task(s) that passed every trial in baseline {base_id} still do", details)
