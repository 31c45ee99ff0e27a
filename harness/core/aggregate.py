"""From stored attempts to per-slot and per-task views (recomputed, never cached).

Pure given the records: :func:`slot_index` groups a run's attempts (records, or an
:class:`~harness.model.table.AttemptTable` of their columns) by slot, in column passes;
:func:`slot_views` makes a view per slot of it (its clean attempt, if any, and every
discarded one); :func:`outcomes` / :func:`task_outcomes` turn it into the
:class:`~harness.model.outcomes.TaskOutcomes` every estimator, report, gate and sweep
reads; :func:`summarize` is the short summary ``run`` and ``runs`` print.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import repeat
from operator import eq
from typing import Any, Iterable

import numpy as np

from harness.core.estimator import pass_at_k, pass_hat_k
from harness.core.outcome import slot_status
from harness.model.attempt import AttemptRecord
from harness.model.outcomes import SlotStatus, TaskOutcomes
from harness.model.run import RunRecord
from harness.model.table import AttemptTable


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


# a slot's state in SlotIndex.state: its clean attempt passed, failed, or there is none
PASS, FAIL, NONE = 0, 1, -1


@dataclass(slots=True)
class SlotIndex:
    """Which attempts of a table belong to which slot, as row numbers of the table.

    Slot ``i`` of the ``t``-th task is position ``t * trials + i``. The one grouping every
    view of a run reads (slot views, task outcomes, the report): the first clean attempt of
    a slot by (attempt number, id) counts, and several clean ones are never counted twice."""

    task_ids: list[str]  # the run's tasks, each once, in run order
    trials: int
    clean: list[int]  # position -> row of the slot's counting clean attempt, or -1
    state: list[list[int]]  # per task, per slot: PASS / FAIL (its counting clean attempt), NONE
    discarded: dict[int, list[int]]  # position -> rows of the slot's discarded attempts, by (attempt number, id)
    thrown: list[int]  # rows of every attempt not clean (a stray one too), in table order
    strays: list[int]  # rows of attempts in no slot of the run (a task it does not have, a slot past its trials)
    extra_clean: list[int] = field(default_factory=list)  # rows of clean attempts after the one that counts in their slot


def slot_index(attempts: Any, task_ids: list[str], trials: int) -> SlotIndex:
    """Group a run's attempts (records, or an AttemptTable) by slot in C-level passes over
    their columns: no object per attempt or per slot. Independent of the order attempts
    arrive in."""
    table = AttemptTable.of(attempts)
    tids = list(dict.fromkeys(task_ids))
    n = len(table)
    pos = {t: i for i, t in enumerate(tids)}
    tix = np.fromiter(map(pos.get, table.col("task_id"), repeat(-1)), np.int64, n)
    slot = np.fromiter(table.col("slot"), np.int64, n)
    in_run = (tix >= 0) & (slot >= 0) & (slot < trials)
    key = tix * trials + slot
    clean = np.fromiter(map(eq, table.col("verdict"), repeat("clean")), bool, n)
    ids = table.col("id")
    if None in ids:  # records not stored yet
        ids = [0 if i is None else i for i in ids]
    attempt_no = table.col("attempt_no")
    # the counting clean attempt of each slot: the first by (slot, attempt number, id); a
    # stable sort, so equal keys keep the order given
    rows = np.flatnonzero(clean & in_run)
    if len(rows):
        rows = rows[np.lexsort((np.fromiter(ids, np.int64, n)[rows], np.fromiter(attempt_no, np.int64, n)[rows], key[rows]))]
        k = key[rows]
        first = np.ones(len(rows), bool)
        first[1:] = k[1:] != k[:-1]
    at = np.full(len(tids) * trials, -1, np.int64)
    extra: list[int] = []
    if len(rows):
        at[k[first]] = rows[first]
        extra = sorted(rows[~first].tolist())
    state = np.full(len(at), NONE, np.int64)
    has = at >= 0
    if has.any():
        passed = np.fromiter(map(eq, table.col("outcome"), repeat("pass")), bool, n)
        state[has] = np.where(passed[at[has]], PASS, FAIL)
    discarded: dict[int, list[int]] = {}
    d_rows = np.flatnonzero(~clean & in_run).tolist()
    for r, p in zip(d_rows, key[d_rows].tolist()):
        discarded.setdefault(p, []).append(r)
    for group in discarded.values():
        if len(group) > 1:
            group.sort(key=lambda r: (attempt_no[r], ids[r]))
    return SlotIndex(tids, trials, at.tolist(), state.reshape(len(tids), trials).tolist(), discarded,
                     np.flatnonzero(~clean).tolist(), np.flatnonzero(~in_run).tolist(), extra)


def slot_views(attempts: Iterable[AttemptRecord], task_ids: list[str], trials: int, max_reruns: int | None = None,
               refills: dict[str, int] | None = None) -> dict[str, list[SlotView]]:
    """Group attempts into slots (see :func:`slot_index`): each slot's clean attempt and its
    discarded ones in (attempt number, id) order. ``refills``: the run's refilled slots
    ("task/slot" -> attempt number refilled after)."""
    table = AttemptTable.of(attempts)
    ix = slot_index(table, task_ids, trials)
    refills = refills or {}
    views: dict[str, list[SlotView]] = {}
    for ti, t in enumerate(ix.task_ids):
        row = views[t] = []
        for i in range(trials):
            p = ti * trials + i
            c = ix.clean[p]
            row.append(SlotView(t, i, table[c] if c >= 0 else None, table.rows(ix.discarded.get(p, ())), max_reruns,
                                refills.get(f"{t}/{i}", 0)))
    return views


_STATUS = ("pass", "fail", "pending")  # by PASS, FAIL, NONE (-1: the last)


def outcomes(attempts: Any, ix: SlotIndex, max_reruns: int | None = None, refills: dict[str, int] | None = None) -> list[TaskOutcomes]:
    """Every task's outcomes from the slot index of ``attempts`` (records or their table),
    in the index's task order: the clean attempt of each slot in trial order; a slot without
    one is pending, or unmeasured once its rerun budget is spent (slot_status)."""
    table = AttemptTable.of(attempts)
    trials = ix.trials
    kind = table.col("failure_kind")
    # slots without a clean attempt but with discarded ones: their status asks their records
    special: dict[int, dict[int, SlotStatus]] = {}
    for p, rows in ix.discarded.items():
        if ix.clean[p] < 0:
            t, i = divmod(p, trials)
            after = refills.get(f"{ix.task_ids[t]}/{i}", 0) if refills else 0
            special.setdefault(t, {})[i] = slot_status(None, table.rows(rows), max_reruns, after)
    out = []
    for ti, t in enumerate(ix.task_ids):
        st = ix.state[ti]
        statuses: list[SlotStatus] = list(map(_STATUS.__getitem__, st))
        if NONE in st:
            for i, s in special.get(ti, {}).items():
                statuses[i] = s
            trials_ = [x == PASS for x in st if x != NONE]
        else:
            trials_ = list(map(PASS.__eq__, st))
        kinds: dict[str, int] = {}
        if FAIL in st:
            base = ti * trials
            for i, x in enumerate(st):
                if x == FAIL:
                    k = kind[ix.clean[base + i]] or "unknown"
                    kinds[k] = kinds.get(k, 0) + 1
        # built from values made here (bools, slot statuses, counts): validating them again per
        # task was a tenth of a 10^5-attempt report
        out.append(TaskOutcomes.made(t, trials_, statuses, kinds))
    return out


def task_outcomes(run: RunRecord, attempts: Iterable[AttemptRecord]) -> list[TaskOutcomes]:
    """Every task of the run, in the run's task order."""
    table = AttemptTable.of(attempts)
    return outcomes(table, slot_index(table, list(run.task_ids), run.trials), run.max_reruns, run.refills)


def metric(t: TaskOutcomes, name: str, k: int) -> float | None:
    """pass@k (``name='pass@'``) or pass^k (``'pass^'``) of one task; None when n < k."""
    if t.n < k or t.n == 0:
        return None
    return pass_at_k(t.n, t.c, k) if name == "pass@" else pass_hat_k(t.n, t.c, k)


def summarize(run: RunRecord, attempts: list[AttemptRecord]) -> dict[str, Any]:
    """Per-task rows and suite metrics of a run, recomputed from its attempts."""
    views = slot_views(attempts, list(run.task_ids), run.trials, run.max_reruns, run.refills)
    tasks = {t.task_id: t for t in task_outcomes(run, attempts)}
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
