"""Summaries recomputed from stored attempts (never cached numbers that can drift).

Pure given the rows: takes RunRow/AttemptRow-like objects, returns plain data.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from harness.estimator import pass_at_k, pass_hat_k


@dataclass
class SlotView:
    """One slot: its clean attempt (if any) and every discarded one."""

    task: str
    slot: int
    clean: Any | None = None
    discarded: list[Any] = field(default_factory=list)
    max_reruns: int | None = None  # the run's rerun budget; None: any discard means unmeasured

    @property
    def status(self) -> str:
        """pass / fail (its clean attempt), unmeasured (rerun budget spent without a clean
        attempt), or pending (not finished: never run, or cut short by an interruption)."""
        if self.clean is not None:
            return self.clean.outcome or "fail"
        charged = [a for a in self.discarded if "interrupted" not in (a.reasons or [])]
        if self.max_reruns is None:
            return "unmeasured" if charged else "pending"
        return "unmeasured" if len(charged) > self.max_reruns else "pending"


@dataclass
class TaskSummary:
    task: str
    slots: list[SlotView]
    ks: list[int]

    @property
    def outcomes(self) -> list[bool]:
        """Clean outcomes in trial order (unmeasured slots are left out, never scored)."""
        return [s.clean.outcome == "pass" for s in self.slots if s.clean is not None]

    @property
    def n(self) -> int:
        return len(self.outcomes)

    @property
    def c(self) -> int:
        return sum(self.outcomes)

    @property
    def unmeasured(self) -> list[SlotView]:
        return [s for s in self.slots if s.status == "unmeasured"]

    @property
    def pending(self) -> list[SlotView]:
        return [s for s in self.slots if s.status == "pending"]

    def marks(self) -> str:
        """✓ pass, ✗ fail, · unmeasured, ? not run yet — one mark per slot in trial order."""
        m = {"pass": "✓", "fail": "✗", "unmeasured": "·", "pending": "?"}
        return "".join(m[s.status] for s in self.slots)

    def metric(self, name: str, k: int) -> float | None:
        if self.n < k or self.n == 0:
            return None
        return pass_at_k(self.n, self.c, k) if name == "pass@" else pass_hat_k(self.n, self.c, k)

    def failure_kinds(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for s in self.slots:
            if s.clean is not None and s.clean.outcome != "pass":
                out[s.clean.failure_kind or "unknown"] += 1
        return dict(out)


def slot_views(attempts: Iterable[Any], task_ids: list[str], trials: int, max_reruns: int | None = None) -> dict[str, list[SlotView]]:
    """Group attempts into slots. If a slot somehow has several clean attempts (it should
    not), the first one counts and the rest are ignored, so nothing is counted twice."""
    views = {t: [SlotView(task=t, slot=i, max_reruns=max_reruns) for i in range(trials)] for t in task_ids}
    for a in sorted(attempts, key=lambda a: (a.task_id, a.slot, a.attempt_no, a.id or 0)):
        if a.task_id not in views or a.slot >= trials:
            continue
        v = views[a.task_id][a.slot]
        if a.verdict == "clean":
            if v.clean is None:
                v.clean = a
        else:
            v.discarded.append(a)
    return views


def summarize(run: Any, attempts: list[Any]) -> dict[str, Any]:
    """Per-task rows and suite metrics of a run, recomputed from its attempts."""
    views = slot_views(attempts, list(run.task_ids), run.trials, run.max_reruns)
    tasks = [TaskSummary(task=t, slots=v, ks=list(run.ks)) for t, v in views.items()]
    metrics: dict[str, float | None] = {}
    excluded: dict[str, list[str]] = {}
    for k in sorted(set([1, *run.ks])):
        for name in ("pass@", "pass^"):
            key = f"{name}{k}"
            if name == "pass^" and k == 1:
                continue
            vals = [t.metric(name, k) for t in tasks]
            ok = [v for v in vals if v is not None]
            excluded[key] = [t.task for t, v in zip(tasks, vals) if v is None]
            metrics[key] = sum(ok) / len(ok) if ok else None
    discarded = [a for a in attempts if a.verdict == "discarded"]
    reasons: dict[str, int] = defaultdict(int)
    for a in discarded:
        for r in a.reasons or ["unknown"]:
            reasons[r] += 1
    return {
        "run_id": run.id,
        "suite": run.suite,
        "profile": run.profile,
        "trials": run.trials,
        "ks": list(run.ks),
        "status": run.status,
        "identity": {
            "suite_hash": run.suite_hash,
            "image": run.image,
            "image_digest": run.image_digest,
            "profile": run.profile,
            "harness_version": run.harness_version,
            "cgroup_version": run.cgroup_version,
            "identity_hash": run.identity_hash,
        },
        "tasks": [
            {
                "task": t.task,
                "n": t.n,
                "c": t.c,
                "outcomes": t.outcomes,
                "marks": t.marks(),
                "unmeasured": [
                    {"slot": s.slot, "reasons": sorted({r for a in s.discarded for r in (a.reasons or [])})} for s in t.unmeasured
                ],
                "failure_kinds": t.failure_kinds(),
                "discarded": sum(len(s.discarded) for s in t.slots),
                "metrics": {
                    **{f"pass@{k}": t.metric("pass@", k) for k in sorted(set([1, *run.ks]))},
                    **{f"pass^{k}": t.metric("pass^", k) for k in run.ks if k > 1},
                },
            }
            for t in tasks
        ],
        "metrics": metrics,
        "excluded": {k: v for k, v in excluded.items() if v},
        "attempts": {"total": len(attempts), "clean": len(attempts) - len(discarded), "discarded": len(discarded)},
        "discard_reasons": dict(reasons),
        "unmeasured_slots": sum(len(t.unmeasured) for t in tasks),
    }
