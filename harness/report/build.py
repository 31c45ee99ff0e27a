"""Building the :class:`~harness.model.report.Report` of a run from its stored attempts.

Records (or their columns, an AttemptTable) in, a Report out; no database, no Docker, no
CLI. Nothing is cached: ``build_report(run, attempts)`` derives every figure from the
attempts it is given (only the clean attempt of each slot is scored; unmeasured slots are
listed, never counted), so adding an attempt changes the next report. The renderers are ``harness.report.render``.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from collections import Counter
from itertools import compress
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

from pydantic import TypeAdapter

from harness.core.aggregate import FAIL, NONE, PASS, outcomes, slot_index
from harness.core.envelope import ENVELOPE_FACTS, envelope_differences, node_name
from harness.core.estimator import (
    ESTIMANDS,
    SMALL_SUITE,
    TaskOutcomes,
    buckets,
    clustered_se_pass1,
    drift_test,
    overdispersion_test,
    pass_at_k,
    pass_hat_k,
    suite_intervals,
    suite_metrics,
    wilson_interval,
)
from harness.model.attempt import FAILURE_KINDS, AttemptRecord
from harness.model.report import REPORT_SCHEMA, Report, TaskRow
from harness.model.run import RunRecord
from harness.model.table import AttemptTable
from harness.model.units import collector_paused, one_line, plural
from harness.report.usage import discard_scopes, unpriced_models, usage_of

CONF = 0.95
N_BOOT = 2000
# A task's discard rate must be this many times the other tasks' (and significant, and at
# least this many discards) before the report warns about selection bias.
BIAS_RATIO = 3.0
BIAS_MIN_DISCARDS = 3
BIAS_ALPHA = 0.05
# A run whose attempts were discarded this often (interruptions left out), however evenly
# over its tasks, is warned about too: the per-task test compares tasks with each other, so
# discards that follow what the agent did on every task would pass it unseen.
DISCARD_SHARE = 0.2
# A figure this much above the same figure with every discarded slot counted as failed is warned about.
WORST_GAP = 0.05


# =========================================================================== building


def run_ks(run: Any) -> list[int]:
    """The k values fixed for the run (always including 1)."""
    return sorted({1, *(int(k) for k in run.ks)})


def check_k(run: Any, k: int, fixed_only: bool = True) -> str | None:
    """None when k can be used for the run; otherwise the reason (for a usage error).

    Reports use only the k values the suite fixed before the run. A gate may name any
    k <= trials: its requirement is written into CI before the run, so it is not chosen after."""
    ks = run_ks(run)
    if k < 1:
        return f"k={k}: k must be >= 1"
    if k > run.trials:
        return f"k={k} exceeds the {plural(run.trials, 'trial')} per task of run {run.id}; measured k: {ks_text(ks)}"
    if fixed_only and k not in ks:
        return (
            f"k={k} was not fixed for run {run.id} (measured k: {ks_text(ks)}); k is chosen by the "
            "suite before the run, not after -- use one of those"
        )
    return None


def counts_text(d: dict[str, int]) -> str:
    """'a 2, b 1' (zero counts left out), or '–'."""
    return ", ".join(f"{k} {v}" for k, v in d.items() if v) or "–"


def ks_text(ks: Sequence[int]) -> str:
    return ", ".join(map(str, ks))


def _iso(v: Any) -> str | None:
    if v is None:
        return None
    return v.isoformat(timespec="seconds") if isinstance(v, (dt.datetime, dt.date)) else str(v)


def redact_url(url: str) -> str:
    """A base URL as a report may show it: user info and query (where a credential could
    hide) replaced, the rest kept."""
    try:
        u = urlsplit(url)
    except ValueError:
        return "(unparseable URL)"
    netloc = u.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return urlunsplit((u.scheme, netloc, u.path, "…" if u.query else "", ""))


def identity_data(run: RunRecord) -> dict[str, Any]:
    """The run's identity as the report shows it (RunIdentity, plus where, its hash, the
    named agent and the names of the gateway's secrets -- never a value)."""
    d = run.identity.model_dump(mode="json")
    d["upstreams"] = {k: redact_url(str(v)) for k, v in (d.get("upstreams") or {}).items()}
    return {**d, "suite_path": run.suite_path or "", "identity_hash": run.identity_hash or "",
            "agent_name": getattr(run, "agent_name", "") or "", "secrets": list(getattr(run, "secrets", None) or [])}


def _boots(outs: list[TaskOutcomes], k: int, metrics: tuple[str, ...]) -> list[dict[str, Any] | None]:
    """Each metric's figure at ``k`` with both intervals (tasks like these; this suite), the
    tasks short of k, and the figure with those counted as 0 (so rows at different k can be
    read side by side). None for each when no task has k clean trials."""
    try:
        ivs = suite_intervals(outs, [(m, k, e) for m in metrics for e in ("tasks", "suite")], conf=CONF)  # type: ignore[misc]
    except ValueError:  # no task with n >= k: the figure cannot be computed
        return [None] * len(metrics)
    short = [t.task_id for t in outs if 0 < t.n < k]
    out = []
    for tasks, fixed in zip(ivs[::2], ivs[1::2]):
        fig: dict[str, Any] = {"estimate": tasks.estimate, "low": tasks.low, "high": tasks.high,
                               "suite_low": fixed.low, "suite_high": fixed.high, "n_eff": tasks.n_eff,
                               "n_tasks": tasks.n_tasks, "excluded": list(tasks.excluded), "short": list(short)}
        if short:
            fig["sensitivity"] = tasks.estimate * tasks.n_tasks / (tasks.n_tasks + len(short))
        out.append(fig)
    return out


def _discards_sf(x: int, r: int, total: int, slots: int) -> float:
    """P(X >= x) for the discards X of a task with ``r`` clean slots, given ``total`` discards
    over ``slots`` clean slots in all: under the null every attempt is discarded with the same
    probability, so a task's discards are negative binomial in its slots (each slot is tried
    until it is clean) and, given their sum, follow C(X+r-1, X) C(D-X+R-r-1, D-X) / C(D+R-1, D).
    Its attempts are not a fixed number to draw from (Fisher's test took them as one, and
    flagged honest runs far more often than its alpha)."""
    if x <= 0:
        return 1.0
    rest = max(0, slots - r)

    def ways(k: int, n: int) -> int:  # k discards over n slots; none at all over none
        return math.comb(k + n - 1, k) if n > 0 else int(k == 0)

    num = sum(ways(k, r) * ways(total - k, rest) for k in range(x, total + 1))
    return num / ways(total, r + rest)


def selection_bias(per_task: dict[str, tuple[int, int]]) -> list[dict[str, Any]]:
    """Tasks whose attempts were discarded far more often than the other tasks' attempts.

    ``per_task`` maps task -> (discarded attempts, all attempts). A task is flagged when it
    has at least BIAS_MIN_DISCARDS discards, its discard rate is at least BIAS_RATIO times
    the pooled rate of the other tasks, and the exact conditional test of its discards
    (:func:`_discards_sf`) stays significant at BIAS_ALPHA after Holm's correction over every
    task tested (a Fisher test per task, uncorrected, flagged a task in about half of honest
    runs with 10% of attempts discarded evenly).
    Why it matters: discarded attempts are rerun, so if discards depend on what the agent
    did (e.g. it burns CPU when it goes wrong), the clean attempts left are not a fair sample.
    """
    total_a = sum(a for _, a in per_task.values())
    total_d = sum(d for d, _ in per_task.values())
    if len(per_task) < 2:
        return []
    tested = []
    for task, (d, a) in per_task.items():
        if d < BIAS_MIN_DISCARDS or a == 0 or total_a - a == 0:
            continue
        tested.append((_discards_sf(d, max(1, a - d), total_d, max(1, total_a - total_d)), task, d, a))
    out = []
    # Holm over every task (those with too few discards to be flagged have the largest p
    # values): the i-th smallest p against alpha / (tasks - i)
    for i, (p, task, d, a) in enumerate(sorted(tested)):
        if p >= BIAS_ALPHA / (len(per_task) - i):
            break
        rate, other = d / a, (total_d - d) / (total_a - a)
        if other > 0 and rate < BIAS_RATIO * other:
            continue
        out.append({"task": task, "discarded": d, "attempts": a, "rate": rate, "others_rate": other, "p_value": p})
    return sorted(out, key=lambda b: list(per_task).index(b["task"]))


def discards_as_failures(attempts: AttemptTable, ix: Any, ks: list[int]) -> dict[str, Any] | None:
    """The run's figures if every slot with a discarded attempt (interruptions aside) had
    failed: a bound an agent cannot raise by having attempts discarded, as it can the figures
    themselves when it can cause a discard (a discard is rerun on the premise that the agent
    did not cause it). None when no attempt was discarded."""
    reasons = attempts.col("reasons")
    hit = {p for p, rows in ix.discarded.items() if any("interrupted" not in (reasons[r] or ()) for r in rows)}
    if not hit:
        return None
    outs = []
    for ti, task in enumerate(ix.task_ids):
        base = ti * ix.trials
        trials = [False if base + i in hit else x == PASS for i, x in enumerate(ix.state[ti]) if x != NONE or base + i in hit]
        outs.append(TaskOutcomes.made(task, trials, [], {}))
    sm = suite_metrics(outs, ks)
    figures: dict[str, Any] = {"pass@1": sm.pass1}
    for k in ks:
        if k > 1:
            figures[f"pass@{k}"] = sm.by_k[k].pass_at_k
            figures[f"pass^{k}"] = sm.by_k[k].pass_hat_k
    return {"slots": len(hit), "figures": figures}


def _breach_lines(a: Any) -> list[str]:
    lines = []
    for r in a.rules or []:
        if isinstance(r, dict) and r.get("breached"):
            lines.append(f"{r.get('rule')}: {r.get('detail')}" if r.get("detail") else str(r.get("rule")))
    return lines


def _pair_figures(n: int, c: int, ks: list[int]) -> tuple[dict[str, float | None], list[float] | None]:
    """A task's figures, which depend on its (clean trials, passes) only: pass@1, pass@k and
    pass^k at each k > 1 (None where n < k), and pass@1's Wilson interval. Computed once per
    distinct pair (a suite of 10^5 tasks has a few dozen) and shared by the rows that have it."""
    metrics: dict[str, float | None] = {"pass@1": c / n if n else None}
    for kk in ks:
        if kk > 1:
            metrics[f"pass@{kk}"] = pass_at_k(n, c, kk) if n >= kk else None
    for kk in ks:
        if kk > 1:
            metrics[f"pass^{kk}"] = pass_hat_k(n, c, kk) if n >= kk else None
    ci = wilson_interval(c, n, CONF) if n else None
    return metrics, [ci.low, ci.high] if ci else None


def _sort_key(row: dict[str, Any], gate_k: int) -> tuple:
    p1 = row["pass1"]
    pk = row["metrics"].get(f"pass^{gate_k}") if gate_k > 1 else p1
    # unmeasured first (no evidence is the worst news), then lowest pass@1, then lowest pass^k
    return (0 if p1 is None else 1, -1.0 if p1 is None else p1, -1.0 if pk is None else pk, row["task"])


def build_report(
    run: RunRecord,
    attempts: Iterable[AttemptRecord],
    *,
    k: int | None = None,
    seed: int = 0,
    n_boot: int = N_BOOT,
    prices: Mapping[str, Mapping[str, float]] | None = None,
    late: int = 0,
) -> Report:
    """Everything a report shows, recomputed from ``attempts``.

    ``k`` is the gate's k (JUnit fails a task whose pass^k < 1); default the largest k of
    the run. Raises ValueError when ``k`` was not measured in the run. ``seed`` seeds the
    drift permutations, so the same attempts give the same report.
    ``prices`` (model -> USD per million input/output/cached tokens, see
    ``harness.report.prices``) prices the model calls; without it every cost is null.
    ``late`` counts the records of attempts presumed lost that arrived afterwards (the store's).
    """
    with collector_paused():  # 10^5 attempts make 10^4 task rows and their failed trials
        return _build(run, AttemptTable.of(attempts), k, seed, n_boot, prices, late)


def _build(run: RunRecord, attempts: AttemptTable, k: int | None, seed: int, n_boot: int,
           prices: Mapping[str, Mapping[str, float]] | None, late: int) -> Report:
    ks = run_ks(run)
    gate_k = max(ks) if k is None else int(k)
    problem = check_k(run, gate_k)
    if problem:
        raise ValueError(problem)
    ix = slot_index(attempts, list(run.task_ids), run.trials)
    refills = getattr(run, "refills", None)
    outs = outcomes(attempts, ix, run.max_reruns, refills)
    sm = suite_metrics(outs, ks)
    pair_memo: dict[tuple[int, int], tuple[dict[str, float | None], list[float] | None]] = {}
    bk = buckets(outs)
    bucket_of = {t: name for name in ("always", "sometimes", "never", "unmeasured") for t in getattr(bk, name)}

    # ---- per task: from the columns and the slot index (10^5 attempts: no object per attempt
    # or per slot; a discarded attempt's record is made when it is read)
    trials = run.trials
    ids, wall_s, failure_kind = attempts.col("id"), attempts.col("wall_s"), attempts.col("failure_kind")
    grade_reason, error = attempts.col("grade_reason"), attempts.col("error")
    disc_of: dict[int, list[int]] = {}  # task -> positions of its slots with discarded attempts
    for p in ix.discarded:
        disc_of.setdefault(p // trials, []).append(p)
    rows: list[dict[str, Any]] = []
    discard_counts: dict[str, tuple[int, int]] = {}
    unmeasured: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    # a run without a gateway has no usage anywhere: asked once, not per task (10^5 attempts)
    gateway = any(attempts.col("upstream")) or any(attempts.col("model_calls"))
    by_task_attempts: dict[str, list[int]] = {}  # task -> rows of every attempt of it (what it spent), in table order
    for r, task_id in enumerate(attempts.col("task_id") if gateway else ()):
        by_task_attempts.setdefault(task_id, []).append(r)
    scored_all: list[AttemptRecord] = []
    for ti, t in enumerate(outs):
        base = ti * trials
        at = ix.clean[base:base + trials]
        st = ix.state[ti]
        fk = {kind: 0 for kind in FAILURE_KINDS}
        for kind, cnt in t.failure_kinds.items():
            fk[kind] = fk.get(kind, 0) + cnt
        failed_trials = [{"slot": i, "attempt_id": ids[r], "failure_kind": failure_kind[r] or "",
                          "reason": (grade_reason[r] or error[r] or "")[:300]}
                         for i, (x, r) in enumerate(zip(st, at)) if x == FAIL] if FAIL in st else []
        clean_rows = [r for r in at if r >= 0] if NONE in st else at
        positions = disc_of.get(ti, ())
        n_disc = 0
        reasons: dict[str, int] = {}
        t_unmeasured = []
        if positions:  # a slot's attempts in slot order: its clean one, then its discarded ones
            wall = 0.0
            for i in range(trials):
                if at[i] >= 0:
                    wall += float(wall_s[at[i]] or 0.0)
                for r in ix.discarded.get(base + i, ()):
                    wall += float(wall_s[r] or 0.0)
            for p in sorted(positions):
                discarded = attempts.rows(ix.discarded[p])
                n_disc += len(discarded)
                for a in discarded:
                    for r in a.reasons or ["unknown"]:
                        reasons[r] = reasons.get(r, 0) + 1
                if t.slots[p - base] != "unmeasured":
                    continue
                last = max(discarded, key=lambda a: (a.attempt_no, a.id or 0))
                item = {
                    "task": t.task_id,
                    "slot": p - base,
                    "attempts": len(discarded),
                    "reasons": sorted({r for a in discarded for r in (a.reasons or ["unknown"])}),
                    "breaches": _breach_lines(last),
                    "message": last.error or "",
                }
                t_unmeasured.append(item)
                unmeasured.append(item)
        else:
            wall = sum(map(wall_s.__getitem__, clean_rows), 0.0)
        task_attempts = n_disc + len(clean_rows)
        discard_counts[t.task_id] = (n_disc, task_attempts)
        t_pending = t.pending if "pending" in t.slots else []
        for i in t_pending:
            pending.append({"task": t.task_id, "slot": i})
        metrics, pass1_ci = pair_memo.get((t.n, t.c)) or pair_memo.setdefault((t.n, t.c), _pair_figures(t.n, t.c, ks))
        usage = None
        if gateway:
            scored = attempts.rows(clean_rows)
            scored_all += scored
            usage = usage_of(attempts.rows(by_task_attempts.get(t.task_id, ())), scored, prices)
        rows.append(
            {
                "task": t.task_id,
                "marks": t.marks(),
                "outcomes": list(t.trials),
                "n": t.n,
                "c": t.c,
                "slots": trials,
                "pass1": metrics["pass@1"],
                "pass1_ci": pass1_ci,
                "metrics": metrics,
                "failure_kinds": fk,
                "failures": t.n - t.c,
                "clean_exit_wrong_state": t.failure_kinds.get("wrong_state", 0),
                "bucket": bucket_of[t.task_id],
                "attempts": task_attempts,
                "discarded": n_disc,
                "discard_reasons": dict(sorted(reasons.items())),
                "unmeasured": t_unmeasured,
                "pending": len(t_pending),
                "wall_s": round(wall, 3),
                "usage": usage,
                "failed_trials": failed_trials,
            }
        )
    rows.sort(key=lambda r: _sort_key(r, gate_k))

    # ---- suite
    measured = [o for o in outs if o.n > 0]
    try:
        se = clustered_se_pass1(outs)
    except ValueError:
        se = None
    p1 = _boots(outs, 1, ("pass@1",))[0]
    if p1 is not None:
        p1["se_clustered"] = se
    by_k = []
    for kk in ks:
        if kk == 1:
            continue
        km = sm.by_k[kk]
        at_k, hat_k = _boots(outs, kk, ("pass@k", "pass^k"))
        by_k.append(
            {
                "k": kk,
                "n_tasks": km.n_tasks,
                "excluded": list(km.excluded),
                "pass@k": at_k,
                "pass^k": hat_k,
                "naive_pass@k": km.naive_pass_at_k,
                "naive_pass^k": km.naive_pass_hat_k,
            }
        )
    worst = discards_as_failures(attempts, ix, ks)
    suite = {
        "discards_as_failures": worst,
        "n_tasks": len(outs),
        "measured": len(measured),
        "unmeasured_tasks": list(sm.unmeasured),
        "pass@1": p1,
        "by_k": by_k,
        "method": {
            "aggregation": "mean over tasks of per-task unbiased estimates (never mean(p)^k)",
            "ci": f"{CONF:.0%} Wilson score interval at the effective sample size (design effect), "
                  "n_eff capped at clean trials / k",
            "estimands": {"low/high": ESTIMANDS["tasks"] + "; t on tasks - 1 df",
                          "suite_low/suite_high": ESTIMANDS["suite"] + "; each task's binomial variance"},
            "short": "tasks with fewer than k clean trials are left out of that k; 'sensitivity' counts them as 0",
            "se": "clustered by task (pass@1)",
            "naive": "mean(pass@1)^k over the same tasks -- biased, shown only for contrast",
        },
    }

    # ---- discards
    thrown = attempts.rows(ix.thrown)
    attempts_clean = len(attempts) - len(thrown)
    by_reason: Counter[str] = Counter(r for a in thrown for r in (a.reasons or ["unknown"]))
    by_scope: Counter[str] = Counter(sc for a in thrown for sc in discard_scopes(a))
    usage = _run_usage(list(attempts), scored_all, rows, prices) if gateway else None
    bias = selection_bias(discard_counts)
    for b in bias:
        reasons = next(r["discard_reasons"] for r in rows if r["task"] == b["task"])
        b["reasons"] = reasons
        b["message"] = (
            f"selection-bias risk: task {b['task']} had {b['discarded']} of {b['attempts']} attempts discarded "
            f"({b['rate']:.0%}) vs {b['others_rate']:.0%} for the other tasks (Fisher p={b['p_value']:.2g}; "
            f"reasons: {counts_text(reasons)}); its clean trials may not be a fair sample of the task -- "
            "if the discards depend on what the agent did, fix the envelope or the host rather than trusting its rate"
        )

    # ---- diagnostics
    drift = drift_test(outs, seed=seed).model_dump(mode="json")
    over = overdispersion_test(outs).model_dump(mode="json")
    if over.get("p_value") is not None:
        over["summary"] = "failures cluster by task" if over["p_value"] < 0.05 else "failures spread evenly"
    else:
        over["summary"] = "not testable"

    # ---- warnings, most important first
    warnings: list[str] = [b["message"] for b in bias]
    if worst is not None:
        now = {"pass@1": sm.pass1, **{f"pass^{k}": sm.by_k[k].pass_hat_k for k in ks if k > 1}}
        gaps = [(m, v, worst["figures"].get(m)) for m, v in now.items() if v is not None and worst["figures"].get(m) is not None]
        if any(v - w >= WORST_GAP for _, v, w in gaps):
            warnings.append(
                f"selection-bias bound: had the {worst['slots']} slot(s) with a discarded attempt failed, "
                + ", ".join(f"{m} would be {w:.3f} (reported {v:.3f})" for m, v, w in gaps)
                + " -- a discard is rerun on the premise that the agent did not cause it; an agent that can cause one "
                "(an upstream error it provokes) chooses which attempts are scored")
    charged = [a for a in thrown if "interrupted" not in (a.reasons or ())]  # an interruption says nothing of the agent
    if len(charged) >= BIAS_MIN_DISCARDS and len(charged) >= DISCARD_SHARE * len(attempts):
        why = Counter(r for a in charged for r in (a.reasons or ["unknown"]))
        warnings.append(
            f"selection-bias risk: {len(charged)} of {len(attempts)} attempts ({len(charged) / len(attempts):.0%}) were discarded and "
            f"rerun (reasons: {counts_text(dict(why.most_common(6)))}); the scored attempts are a fair sample only if what "
            f"discarded them did not depend on what the agent did -- read them (`harness trials {run.id} --verdict discarded`) "
            "before trusting the figures")
    status = getattr(run, "status", "complete")
    if status != "complete":
        warnings.append(f"run {run.id} is {status}, not complete; figures cover the slots measured so far")
    if unmeasured:
        envelope = [u for u in unmeasured if "envelope is too small" in (u["message"] or "")]
        w = f"{len(unmeasured)} unmeasured slot(s) (rerun budget spent without a clean attempt) are not scored"
        if envelope:
            w += f"; {len(envelope)} of them because the envelope is too small for the task"
        warnings.append(w)
    if pending:
        warnings.append(f"{len(pending)} slot(s) never ran (run interrupted?); they are not scored")
    refills = dict(getattr(run, "refills", None) or {})
    if refills:
        warnings.append(f"{len(refills)} slot(s) were given a fresh rerun budget (--refill-unmeasured) after discards for host or "
                        f"upstream reasons ({', '.join(sorted(refills)[:6])}{', …' if len(refills) > 6 else ''}); their earlier "
                        "discarded attempts stay as evidence")
    if 0 < len(measured) < SMALL_SUITE:
        warnings.append(f"only {len(measured)} measured task(s): the 'tasks like these' interval rests on fewer than "
                        f"{SMALL_SUITE} tasks and says little about tasks beyond them; read the 'this suite' interval for these tasks only")
    if any(b["k"] > run.trials / 2 for b in by_k):
        warnings.append(f"the 'this suite' interval under-covers for k > trials/2 (here k up to {max(b['k'] for b in by_k)} "
                        f"of {run.trials} trials): pass@k barely moves from a task's count, so its trial noise is understated")
    not_run = dict(getattr(run, "excluded", None) or {})
    if not_run:
        listed = "; ".join(f"{t}: {why.splitlines()[0][:160]}" for t, why in sorted(not_run.items())[:10])
        warnings.insert(0, f"{len(not_run)} task(s) could not run here and are in no figure: {listed}")
    for kk in ks:
        excl = sm.by_k[kk].excluded
        if excl and len(excl) < len(outs):
            short = [t.task_id for t in outs if 0 < t.n < kk]
            short_set = set(short)
            none = [t for t in excl if t not in short_set]
            if short:
                warnings.append(f"k={kk}: {len(short)} measured task(s) with fewer than {kk} clean trials left out of pass@{kk}/pass^{kk}"
                                f" (the table gives the figure counting them as 0): {', '.join(short)}"
                                + (f"; and {len(none)} unmeasured" if none else ""))
        elif excl and kk == 1:
            warnings.append("no task has a clean trial yet; no figure can be computed")
        elif excl:
            warnings.append(f"k={kk}: no task has {kk} clean trials; pass@{kk} / pass^{kk} cannot be computed")
    if drift.get("p_value") is not None and drift["p_value"] < 0.05:
        warnings.append(drift["verdict"])
    nodes = node_summary(attempts, getattr(run, "executor", "local") or "local")
    if nodes is not None and nodes["differ"]:
        warnings.insert(0, "scored attempts ran on machines that differ in what a trial measures ("
                        + "; ".join(nodes["differ"]) + "): the figures mix environments")
    if late:
        warnings.append(f"{late} record(s) of attempts presumed lost arrived late; kept as evidence, never scored")
    if ix.extra_clean:  # harness never writes them either: one slot, one clean attempt
        first = attempts[ix.extra_clean[0]]
        warnings.insert(0, f"{len(ix.extra_clean)} clean attempt(s) came after the one that counts in their slot (e.g. task "
                           f"{one_line(first.task_id, 60)!r} slot {first.slot}, attempt {first.id}): a store changed outside harness "
                           "or two controllers on one run; kept, never scored")
    strays = attempts.rows(ix.strays)
    if strays:  # harness never writes them: a store changed outside it, or two runs mixed
        first = strays[0]
        warnings.insert(0, f"{len(strays)} stored attempt(s) belong to no slot of this run (a task it does not have or a slot "
                           f"beyond its {run.trials} trials; e.g. task {one_line(first.task_id, 60)!r} slot {first.slot}): kept, never scored")

    report = Report.model_validate({
        "schema": REPORT_SCHEMA,
        "run": {
            "id": run.id,
            "status": status,
            "created_at": _iso(getattr(run, "created_at", None)),
            "finished_at": _iso(getattr(run, "finished_at", None)),
            "seed": getattr(run, "seed", 0),
            "concurrency": getattr(run, "concurrency", 1),
            "max_reruns": getattr(run, "max_reruns", None),
            "sweep_id": getattr(run, "sweep_id", None),
            "note": getattr(run, "note", "") or "",
        },
        "identity": identity_data(run),
        "ks": ks,
        "gate_k": gate_k,
        "trials": run.trials,
        "n_tasks": len(outs),
        "not_run": not_run,
        "conf": CONF,
        "tasks": [],
        "suite": suite,
        "buckets": bk.model_dump(mode="json"),
        "attempts": {"total": len(attempts), "clean": attempts_clean, "discarded": len(attempts) - attempts_clean},
        "discards": {
            "total": len(attempts) - attempts_clean,
            "by_reason": dict(sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))),
            "by_scope": dict(sorted(by_scope.items(), key=lambda kv: (-kv[1], kv[0]))),
            "by_task": {r["task"]: {"discarded": r["discarded"], "attempts": r["attempts"], "reasons": r["discard_reasons"]} for r in rows if r["discarded"]},
            "selection_bias": bias,
        },
        "unmeasured": unmeasured,
        "pending": pending,
        "drift": drift,
        "overdispersion": over,
        "usage": usage,
        "nodes": nodes,
        "late_attempts": late,
        "warnings": warnings,
    })
    # The task rows are set in as made: every value in them was made above from values checked
    # where they were read (the store's columns, the slot index, the estimators), and at 10^4
    # tasks validating them once more was a twentieth of the report. A row holding nested
    # records (a task's usage, its unmeasured slots) is validated whole; the tests validate
    # every row of the reports of random runs (tests/test_report_columns.py).
    return report.model_copy(update={"tasks": [_task_row().validate_python(r) if r["usage"] is not None or r["unmeasured"] else r
                                               for r in rows]})


@functools.cache
def _task_row() -> TypeAdapter[TaskRow]:
    return TypeAdapter(TaskRow)


def node_summary(attempts: Sequence[AttemptRecord], executor: str) -> dict[str, Any] | None:
    """Where the attempts ran, per machine, and what differs between the machines of the
    scored ones (None when no record carries node facts)."""
    # grouped by the facts object first: a lean read shares one decoded dict per distinct value
    # (C-level passes over 10^5 attempts: map, zip, Counter, compress)
    table = AttemptTable.of(attempts)
    nodes = table.col("node")
    clean_of = Counter(map(id, compress(nodes, map("clean".__eq__, table.col("verdict")))))
    by_id = dict(zip(map(id, nodes), nodes))
    groups = {i: [by_id[i], n, clean_of.get(i, 0)] for i, n in Counter(map(id, nodes)).items() if by_id[i]}  # id(node) -> [node, attempts, clean]
    if not groups:
        return None
    rows: dict[str, dict[str, Any]] = {}
    for node, n, clean in groups.values():
        name = node_name(node)
        r = rows.setdefault(name, {"node": name, "attempts": 0, "clean": 0, "discarded": 0,
                                   "facts": {k: node.get(k) for k in ENVELOPE_FACTS if node.get(k) not in (None, "")}})
        r["attempts"] += n
        r["clean"] += clean
        r["discarded"] += n - clean
    differ = envelope_differences([node for node, _, clean in groups.values() if clean], [clean for _, _, clean in groups.values() if clean])
    return {"executor": executor, "nodes": sorted(rows.values(), key=lambda r: r["node"]), "differ": differ}


def _run_usage(attempts: list[AttemptRecord], scored: list[AttemptRecord], rows: list[dict[str, Any]],
               prices: Mapping[str, Mapping[str, float]] | None) -> dict[str, Any] | None:
    """The run's usage (see RunUsage); None when no attempt went through a gateway."""
    usage = usage_of(attempts, scored, prices)
    if usage is None:
        return None
    with_calls = [r for r in rows if r["usage"] is not None]
    priced = [r for r in with_calls if r["usage"]["spent"]["cost"] is not None]
    return {
        **usage,
        "priced": prices is not None,
        "tasks": len(with_calls),
        "tasks_priced": len(priced),
        "cost_priced_tasks": round(sum(r["usage"]["spent"]["cost"] for r in priced), 6) if priced else None,
        "unpriced_models": unpriced_models(attempts, prices),
    }
