"""From stored attempts to per-slot and per-task views (recomputed, never cached).

Pure given the records: :func:`slot_views` groups a run's attempts by slot (its clean
attempt, if any, and every discarded one); :func:`task_outcomes` turns those into the
:class:`~harness.model.outcomes.TaskOutcomes` every estimator, report, gate and sweep
reads; :func:`summarize` is the short summary ``run`` and ``runs`` print.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from harness.core.estimator import pass_at_k, pass_hat_k
from harness.core.outcome import slot_status
from harness.model.attempt import AttemptRecord
from harness.model.outcomes import SlotStatus, TaskOutcomes
from harness.model.run import RunRecord


@dataclass(slots=True)
class SlotView:
    """One slot: its clean attempt (if any) and every discarded one."""

    task: str
    slot: int
    clean: AttemptRecord | None = None
    discarded: list[AttemptRecord] = field(default_factory=list)
    max_reruns: int | None = None  # the run's rerun budget; None: any discard means unmeasured
    refilled_after: int = 0  # --refill-unmeasured: attempts up to this number no longer count against the budget

    @property
    def status(self) -> SlotStatus:
        return slot_status(self.clean, self.discarded, self.max_reruns, self.refilled_after)

    @property
    def attempts(self) -> list[AttemptRecord]:
        return ([self.clean] if self.clean is not None else []) + self.discarded


def slot_views(attempts: Iterable[AttemptRecord], task_ids: list[str], trials: int, max_reruns: int | None = None,
               refills: dict[str, int] | None = None) -> dict[str, list[SlotView]]:
    """Group attempts into slots. If a slot somehow has several clean attempts (it should
    not), the first one counts and the rest are ignored, so nothing is counted twice.
    ``refills``: the run's refilled slots ("task/slot" -> attempt number refilled after)."""
    if refills:
        views = {t: [SlotView(t, i, None, [], max_reruns, refills.get(f"{t}/{i}", 0)) for i in range(trials)] for t in task_ids}
    else:  # positional, no key per slot: 10^5 slots in a large run
        views = {t: [SlotView(t, i, None, [], max_reruns) for i in range(trials)] for t in task_ids}
    # one pass in the order given (a store reads in insertion order), then each slot's own
    # attempts put in (attempt number, id) order: no sort of the whole run
    several: list[SlotView] = []
    for a in attempts:
        row = views.get(a.task_id)
        if row is None or a.slot >= trials:
            continue
        v = row[a.slot]
        if a.verdict == "clean":
            if v.clean is None or (a.attempt_no, a.id or 0) < (v.clean.attempt_no, v.clean.id or 0):
                v.clean = a  # the first clean attempt counts
        else:
            if len(v.discarded) == 1:
                several.append(v)
            v.discarded.append(a)
    for v in several:
        v.discarded.sort(key=lambda a: (a.attempt_no, a.id or 0))
    return views


def outcomes_of(task: str, slots: list[SlotView]) -> TaskOutcomes:
    """One task's outcomes from its slot views."""
    kinds: dict[str, int] = defaultdict(int)
    trials: list[bool] = []
    statuses: list[SlotStatus] = []
    for s in slots:  # one pass (10^5 slots in a large run's report)
        c = s.clean
        if c is None:
            statuses.append(s.status)
        elif c.outcome == "pass":
            trials.append(True)
            statuses.append("pass")
        else:
            trials.append(False)
            statuses.append("fail")
            kinds[c.failure_kind or "unknown"] += 1
    # built from values made here (bools, slot statuses, counts): validating them again per
    # task was a tenth of a 10^5-attempt report
    return TaskOutcomes.model_construct(task_id=task, trials=trials, slots=statuses, failure_kinds=dict(kinds))


def task_outcomes(run: RunRecord, attempts: Iterable[AttemptRecord]) -> list[TaskOutcomes]:
    """Every task of the run, in the run's task order."""
    views = slot_views(attempts, list(run.task_ids), run.trials, run.max_reruns, run.refills)
    return [outcomes_of(t, v) for t, v in views.items()]


def metric(t: TaskOutcomes, name: str, k: int) -> float | None:
    """pass@k (``name='pass@'``) or pass^k (``'pass^'``) of one task; None when n < k."""
    if t.n < k or t.n == 0:
        return None
    return pass_at_k(t.n, t.c, k) if name == "pass@" else pass_hat_k(t.n, t.c, k)


def summarize(run: RunRecord, attempts: list[AttemptRecord]) -> dict[str, Any]:
    """Per-task rows and suite metrics of a run, recomputed from its attempts."""
    views = slot_views(attempts, list(run.task_ids), run.trials, run.max_reruns, run.refills)
    tasks = {t: outcomes_of(t, v) for t, v in views.items()}
    ks = sorted(set([1, *run.ks]))
    metrics: dict[str, float | None] = {}
    excluded: dict[str, list[str]] = {}
    for k in ks:
        for name in ("pass@", "pass^"):
            key = f"{name}{k}"
            if name == "pass^" and k == 1:
                continue
            vals = [metric(t, name, k) for t in tasks.values()]
            ok = [v for v in vals if v is not None]
            excluded[key] = [t for t, v in zip(tasks, vals) if v is None]
            metrics[key] = sum(ok) / len(ok) if ok else None
    discarded = [a for a in attempts if a.verdict == "discarded"]
    reasons: dict[str, int] = defaultdict(int)
    for a in discarded:
        for r in a.reasons or ["unknown"]:
            reasons[r] += 1
    ident = run.identity
    return {
        "run_id": run.id,
        "suite": run.suite,
        "profile": run.profile,
        "trials": run.trials,
        "ks": list(run.ks),
        "status": run.status,
        "identity": {
            "suite_hash": ident.suite_hash,
            "image": ident.image,
            "image_digest": ident.image_digest,
            "profile": ident.profile,
            "harness_version": ident.harness_version,
            "cgroup_version": ident.cgroup_version,
            "identity_hash": run.identity_hash,
        },
        "tasks": [
            {
                "task": task,
                "n": t.n,
                "c": t.c,
                "outcomes": list(t.trials),
                "marks": t.marks(),
                "unmeasured": [
                    {"slot": s.slot, "reasons": sorted({r for a in s.discarded for r in (a.reasons or [])})}
                    for s in views[task] if s.status == "unmeasured"
                ],
                "failure_kinds": dict(t.failure_kinds),
                "discarded": sum(len(s.discarded) for s in views[task]),
                "metrics": {
                    **{f"pass@{k}": metric(t, "pass@", k) for k in ks},
                    **{f"pass^{k}": metric(t, "pass^", k) for k in run.ks if k > 1},
                },
            }
            for task, t in tasks.items()
        ],
        "metrics": metrics,
        "excluded": {k: v for k, v in excluded.items() if v},
        "attempts": {"total": len(attempts), "clean": len(attempts) - len(discarded), "discarded": len(discarded)},
        "discard_reasons": dict(reasons),
        "unmeasured_slots": sum(len(t.unmeasured) for t in tasks.values()),
        "model": _model_use(attempts),
    }


def _model_use(attempts: list[AttemptRecord]) -> dict[str, Any] | None:
    """Model calls of the run's attempts summed (None: no attempt had the gateway)."""
    ups = [a.upstream for a in attempts if a.upstream]
    if not ups:
        return None

    def total(key: str) -> int | None:
        vals = [u.get(key) for u in ups if u.get(key) is not None]
        return sum(vals) if vals else None

    errors = sum(u.get(k, 0) for u in ups for k in ("rate_limited", "server_errors", "timeouts", "connection_errors",
                                                     "auth_errors", "client_errors", "refused", "cut_off"))
    return {"calls": total("calls"), "tokens_in": total("tokens_in"), "tokens_out": total("tokens_out"),
            "tokens_cached": total("tokens_cached"), "calls_without_usage": total("calls_without_usage"),
            "upstream_errors": errors, "wait_s": round(sum(u.get("wait_s", 0.0) for u in ups), 2),
            "upstream_discards": sum(1 for a in attempts if any(r.startswith("upstream_") for r in a.reasons))}
