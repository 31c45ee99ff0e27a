"""Run reports, gates and comparisons, recomputed from the stored attempts every time.

Pure module: RunRow/AttemptRow-like objects in, plain JSON-serializable data out, then
renderers from that data to a rich table, Markdown (paste-ready for a PR comment), a
self-contained HTML page and JUnit XML. No database, no Docker, no CLI here; the commands
live in ``harness.commands_report``.

Nothing is cached: ``build_report(run, attempts)`` derives every figure from the attempts
it is given (only the clean attempt of each slot is scored; unmeasured slots are listed,
never counted), so adding an attempt row changes the next report.

Renderers share one layout: ``report_sections(report)`` turns the report into a list of
``Section`` objects made of ``TableBlock`` / ``TextBlock`` / ``HtmlBlock``, and each
renderer maps those blocks to its format. A later ``figures`` section (plotly, inlined so
the page stays offline) plugs in through ``render_html(report, extra_sections=[...],
head_html=...)`` without touching the tables.
"""

from __future__ import annotations

import datetime as dt
import html as _html
import math
import re
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from harness.estimator import (
    TaskOutcomes,
    buckets,
    cluster_bootstrap,
    clustered_se_pass1,
    compare_runs,
    drift_test,
    overdispersion_test,
    suite_metrics,
    wilson_interval,
)
from harness.summary import SlotView, TaskSummary, slot_views

REPORT_SCHEMA = "harness.report/1"
COMPARISON_SCHEMA = "harness.comparison/1"
FAILURE_KINDS = ("wrong_state", "crashed", "timeout", "oom_killed")
CONF = 0.95
N_BOOT = 2000
# A task's discard rate must be this many times the other tasks' (and significant, and at
# least this many discards) before the report warns about selection bias.
BIAS_RATIO = 3.0
BIAS_MIN_DISCARDS = 3
BIAS_ALPHA = 0.05


# =========================================================================== building


def task_summaries(run: Any, attempts: Iterable[Any]) -> list[TaskSummary]:
    """Slot views of every task of the run, in the run's task order."""
    views = slot_views(list(attempts), list(run.task_ids), run.trials, run.max_reruns)
    return [TaskSummary(task=t, slots=v, ks=list(run.ks)) for t, v in views.items()]


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
        return f"k={k} exceeds the {run.trials} trials per task of run {run.id}; measured k: {_ks_text(ks)}"
    if fixed_only and k not in ks:
        return (
            f"k={k} was not fixed for run {run.id} (measured k: {_ks_text(ks)}); k is chosen by the "
            "suite before the run, not after -- use one of those"
        )
    return None


def _ks_text(ks: Sequence[int]) -> str:
    return ", ".join(map(str, ks))


def _iso(v: Any) -> str | None:
    if v is None:
        return None
    return v.isoformat(timespec="seconds") if isinstance(v, (dt.datetime, dt.date)) else str(v)


def _identity(run: Any) -> dict[str, Any]:
    return {
        "suite": run.suite,
        "suite_hash": run.suite_hash,
        "suite_path": getattr(run, "suite_path", ""),
        "image": run.image,
        "image_digest": run.image_digest,
        "agent_cmd": list(getattr(run, "agent_cmd", None) or []),
        "profile": run.profile,
        "profile_json": dict(run.profile_json or {}),
        "harness_version": run.harness_version,
        "host": dict(run.host or {}),
        "cgroup_version": run.cgroup_version,
        "identity_hash": getattr(run, "identity_hash", ""),
    }


def _ci(res: Any) -> dict[str, Any]:
    return {"estimate": res.estimate, "low": res.low, "high": res.high, "n_tasks": res.n_tasks, "excluded": list(res.excluded)}


def _boot(outs: list[TaskOutcomes], metric: str, k: int, seed: int, n_boot: int) -> dict[str, Any] | None:
    try:
        return _ci(cluster_bootstrap(outs, metric, k=k, n_boot=n_boot, seed=seed, conf=CONF))  # type: ignore[arg-type]
    except ValueError:  # no task with n >= k: the figure cannot be computed
        return None


def _hypergeom_sf(x: int, total: int, marked: int, drawn: int) -> float:
    """P(X >= x) for X ~ Hypergeometric(total, marked, drawn): one-sided Fisher exact test."""
    hi = min(marked, drawn)
    if x > hi:
        return 0.0
    num = sum(math.comb(marked, i) * math.comb(total - marked, drawn - i) for i in range(max(x, 0), hi + 1))
    return num / math.comb(total, drawn)


def selection_bias(per_task: dict[str, tuple[int, int]]) -> list[dict[str, Any]]:
    """Tasks whose attempts were discarded far more often than the other tasks' attempts.

    ``per_task`` maps task -> (discarded attempts, all attempts). A task is flagged when it
    has at least BIAS_MIN_DISCARDS discards, its discard rate is at least BIAS_RATIO times
    the pooled rate of the other tasks, and a one-sided Fisher exact test gives p < BIAS_ALPHA.
    Why it matters: discarded attempts are rerun, so if discards depend on what the agent
    did (e.g. it burns CPU when it goes wrong), the clean attempts left are not a fair sample.
    """
    total_a = sum(a for _, a in per_task.values())
    total_d = sum(d for d, _ in per_task.values())
    out = []
    if len(per_task) < 2:
        return out
    for task, (d, a) in per_task.items():
        if d < BIAS_MIN_DISCARDS or a == 0:
            continue
        other_a, other_d = total_a - a, total_d - d
        if other_a == 0:
            continue
        rate, other = d / a, other_d / other_a
        if other > 0 and rate < BIAS_RATIO * other:
            continue
        p = _hypergeom_sf(d, total_a, total_d, a)
        if p >= BIAS_ALPHA:
            continue
        out.append({"task": task, "discarded": d, "attempts": a, "rate": rate, "others_rate": other, "p_value": p})
    return out


def _slot_reasons(s: SlotView) -> list[str]:
    return sorted({r for a in s.discarded for r in (a.reasons or ["unknown"])})


def _breach_lines(a: Any) -> list[str]:
    lines = []
    for r in a.rules or []:
        if isinstance(r, dict) and r.get("breached"):
            lines.append(f"{r.get('rule')}: {r.get('detail')}" if r.get("detail") else str(r.get("rule")))
    return lines


def _sort_key(row: dict[str, Any], gate_k: int) -> tuple:
    p1 = row["pass1"]
    pk = row["metrics"].get(f"pass^{gate_k}") if gate_k > 1 else p1
    # unmeasured first (no evidence is the worst news), then lowest pass@1, then lowest pass^k
    return (0 if p1 is None else 1, -1.0 if p1 is None else p1, -1.0 if pk is None else pk, row["task"])


def build_report(
    run: Any,
    attempts: Iterable[Any],
    *,
    k: int | None = None,
    seed: int = 0,
    n_boot: int = N_BOOT,
) -> dict[str, Any]:
    """Everything a report shows, as JSON-serializable data, recomputed from ``attempts``.

    ``k`` is the gate's k (JUnit fails a task whose pass^k < 1); default the largest k of
    the run. Raises ValueError when ``k`` was not measured in the run. ``seed`` seeds the
    cluster bootstrap and the drift permutations, so the same attempts give the same report.
    """
    attempts = list(attempts)
    ks = run_ks(run)
    gate_k = max(ks) if k is None else int(k)
    problem = check_k(run, gate_k)
    if problem:
        raise ValueError(problem)
    tasks = task_summaries(run, attempts)
    outs = [TaskOutcomes(task_id=t.task, trials=t.outcomes) for t in tasks]
    sm = suite_metrics(outs, ks)
    per_metrics = {m.task_id: m for m in sm.per_task}
    bk = buckets(outs)
    bucket_of = {t: name for name in ("always", "sometimes", "never", "unmeasured") for t in getattr(bk, name)}

    # ---- per task
    rows: list[dict[str, Any]] = []
    discard_counts: dict[str, tuple[int, int]] = {}
    unmeasured: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    for t in tasks:
        m = per_metrics[t.task]
        fk = {kind: 0 for kind in FAILURE_KINDS}
        for kind, cnt in t.failure_kinds().items():
            fk[kind] = fk.get(kind, 0) + cnt
        task_attempts = sum(len(s.discarded) + (s.clean is not None) for s in t.slots)
        n_disc = sum(len(s.discarded) for s in t.slots)
        reasons: Counter[str] = Counter(r for s in t.slots for a in s.discarded for r in (a.reasons or ["unknown"]))
        discard_counts[t.task] = (n_disc, task_attempts)
        t_unmeasured = []
        for s in t.unmeasured:
            last = max(s.discarded, key=lambda a: (a.attempt_no, a.id or 0))
            item = {
                "task": t.task,
                "slot": s.slot,
                "attempts": len(s.discarded),
                "reasons": _slot_reasons(s),
                "breaches": _breach_lines(last),
                "message": last.error or "",
            }
            t_unmeasured.append(item)
            unmeasured.append(item)
        for s in t.pending:
            pending.append({"task": t.task, "slot": s.slot})
        metrics: dict[str, float | None] = {"pass@1": m.pass1}
        for kk in ks:
            if kk > 1:
                metrics[f"pass@{kk}"] = m.pass_at_k[kk]
        for kk in ks:
            if kk > 1:
                metrics[f"pass^{kk}"] = m.pass_hat_k[kk]
        ci = wilson_interval(t.c, t.n, CONF) if t.n else None
        clean_exit_wrong = sum(
            1 for s in t.slots if s.clean is not None and s.clean.outcome != "pass" and s.clean.failure_kind == "wrong_state"
        )
        rows.append(
            {
                "task": t.task,
                "marks": t.marks(),
                "outcomes": t.outcomes,
                "n": t.n,
                "c": t.c,
                "slots": len(t.slots),
                "pass1": m.pass1,
                "pass1_ci": [ci.low, ci.high] if ci else None,
                "metrics": metrics,
                "failure_kinds": fk,
                "failures": t.n - t.c,
                "clean_exit_wrong_state": clean_exit_wrong,
                "bucket": bucket_of[t.task],
                "attempts": task_attempts,
                "discarded": n_disc,
                "discard_reasons": dict(sorted(reasons.items())),
                "unmeasured": t_unmeasured,
                "pending": len(t.pending),
                "wall_s": round(sum(float(a.wall_s or 0.0) for s in t.slots for a in ([s.clean] if s.clean else []) + s.discarded), 3),
            }
        )
    rows.sort(key=lambda r: _sort_key(r, gate_k))

    # ---- suite
    measured = [o for o in outs if o.n > 0]
    try:
        se = clustered_se_pass1(outs)
    except ValueError:
        se = None
    p1 = _boot(outs, "pass@1", 1, seed, n_boot)
    if p1 is not None:
        p1["se_clustered"] = se
    by_k = []
    for kk in ks:
        if kk == 1:
            continue
        km = sm.by_k[kk]
        by_k.append(
            {
                "k": kk,
                "n_tasks": km.n_tasks,
                "excluded": list(km.excluded),
                "pass@k": _boot(outs, "pass@k", kk, seed, n_boot),
                "pass^k": _boot(outs, "pass^k", kk, seed, n_boot),
                "naive_pass@k": km.naive_pass_at_k,
                "naive_pass^k": km.naive_pass_hat_k,
            }
        )
    suite = {
        "n_tasks": len(outs),
        "measured": len(measured),
        "unmeasured_tasks": list(sm.unmeasured),
        "pass@1": p1,
        "by_k": by_k,
        "method": {
            "aggregation": "mean over tasks of per-task unbiased estimates (never mean(p)^k)",
            "ci": f"{CONF:.0%} percentile cluster bootstrap over tasks",
            "n_boot": n_boot,
            "seed": seed,
            "se": "clustered by task (pass@1)",
            "naive": "mean(pass@1)^k over the same tasks -- biased, shown only for contrast",
        },
    }

    # ---- discards
    attempts_clean = sum(1 for a in attempts if a.verdict == "clean")
    by_reason: Counter[str] = Counter(r for a in attempts if a.verdict != "clean" for r in (a.reasons or ["unknown"]))
    bias = selection_bias(discard_counts)
    for b in bias:
        reasons = next(r["discard_reasons"] for r in rows if r["task"] == b["task"])
        b["reasons"] = reasons
        b["message"] = (
            f"selection-bias risk: task {b['task']} had {b['discarded']} of {b['attempts']} attempts discarded "
            f"({b['rate']:.0%}) vs {b['others_rate']:.0%} for the other tasks (Fisher p={b['p_value']:.2g}; "
            f"reasons: {_counts_text(reasons)}); its clean trials may not be a fair sample of the task -- "
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
    for kk in ks:
        excl = sm.by_k[kk].excluded
        if excl and len(excl) < len(outs):
            warnings.append(f"k={kk}: {len(excl)} task(s) with fewer than {kk} clean trials left out: {', '.join(excl)}")
        elif excl and kk == 1:
            warnings.append("no task has a clean trial yet; no figure can be computed")
        elif excl:
            warnings.append(f"k={kk}: no task has {kk} clean trials; pass@{kk} / pass^{kk} cannot be computed")
    if drift.get("p_value") is not None and drift["p_value"] < 0.05:
        warnings.append(drift["verdict"])

    return {
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
        "identity": _identity(run),
        "ks": ks,
        "gate_k": gate_k,
        "trials": run.trials,
        "n_tasks": len(tasks),
        "conf": CONF,
        "tasks": rows,
        "suite": suite,
        "buckets": bk.model_dump(mode="json"),
        "attempts": {"total": len(attempts), "clean": attempts_clean, "discarded": len(attempts) - attempts_clean},
        "discards": {
            "total": len(attempts) - attempts_clean,
            "by_reason": dict(sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))),
            "by_task": {r["task"]: {"discarded": r["discarded"], "attempts": r["attempts"], "reasons": r["discard_reasons"]} for r in rows if r["discarded"]},
            "selection_bias": bias,
        },
        "unmeasured": unmeasured,
        "pending": pending,
        "drift": drift,
        "overdispersion": over,
        "warnings": warnings,
    }


# =========================================================================== layout


@dataclass
class TableBlock:
    """A table: header, rows of strings, per-column alignment ('l' or 'r')."""

    columns: list[str]
    rows: list[list[str]]
    align: list[str] = field(default_factory=list)
    marks_cols: tuple[int, ...] = ()  # columns holding ✓/✗/· strings (colored where the format can)

    def aligns(self) -> list[str]:
        return self.align + ["l"] * (len(self.columns) - len(self.align))


@dataclass
class TextBlock:
    """Lines of prose; style 'warn' for warnings, 'muted' for fine print."""

    lines: list[str]
    style: str = ""


@dataclass
class HtmlBlock:
    """Raw HTML, shown only by the HTML renderer (e.g. a later figures section)."""

    html: str


@dataclass
class Section:
    id: str
    title: str
    blocks: list[Any]


def f3(v: float | None) -> str:
    return "–" if v is None else f"{v:.3f}"


def fci(lo: float | None, hi: float | None) -> str:
    return "–" if lo is None or hi is None else f"[{lo:.3f}, {hi:.3f}]"


def _counts_text(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items() if v) or "–"


def failures_text(fk: dict[str, int]) -> str:
    """'wrong_state 2, timeout 1' in the fixed order of FAILURE_KINDS, then any others."""
    order = list(FAILURE_KINDS) + sorted(k for k in fk if k not in FAILURE_KINDS)
    return ", ".join(f"{k} {fk[k]}" for k in order if fk.get(k))


def _host_text(h: dict[str, Any]) -> str:
    from harness.profile import format_size

    if not h:
        return "–"
    parts = []
    if h.get("hostname"):
        parts.append(str(h["hostname"]))
    if h.get("kernel"):
        parts.append(f"kernel {h['kernel']}")
    if h.get("cpu_model"):
        parts.append(str(h["cpu_model"]))
    if h.get("logical_cpus"):
        parts.append(f"{h['logical_cpus']} CPUs")
    if h.get("memory_total"):
        parts.append(f"{format_size(h['memory_total'])} RAM")
    if "psi" in h:
        parts.append("PSI " + ("yes" if h["psi"] else "no"))
    return " · ".join(parts)


def _profile_text(name: str, p: dict[str, Any]) -> str:
    from harness.profile import format_size

    if not p:
        return name
    parts = []
    if p.get("cpus") is not None:
        parts.append(f"{p['cpus']:g} CPU" + (f" on {p['cores']} core(s)" if p.get("cores") else ""))
    if p.get("memory") is not None:
        parts.append(f"{format_size(p['memory'])} memory")
    if p.get("pids") is not None:
        parts.append(f"{p['pids']} pids")
    if p.get("network"):
        parts.append(f"network {p['network']}")
    to = p.get("timeouts") or {}
    if to.get("agent") is not None:
        parts.append(f"agent timeout {to['agent']:g}s")
    return f"{name} ({', '.join(parts)})" if parts else name


def report_sections(r: dict[str, Any]) -> list[Section]:
    """The report as format-neutral sections, in reading order."""
    idn = r["identity"]
    ks = r["ks"]
    hk = [k for k in ks if k > 1]
    gk = r["gate_k"]
    conf = f"{r['conf']:.0%}"
    sections: list[Section] = []

    # ---- identity
    ident = TableBlock(
        columns=["", ""],
        rows=[
            ["run", f"{r['run']['id']} ({r['run']['status']}, created {r['run']['created_at'] or '–'})"],
            ["suite", f"{idn['suite']} · hash {idn['suite_hash'] or '–'}"],
            ["image", f"{idn['image']} · digest {idn['image_digest'] or '–'}"],
            ["agent", " ".join(idn["agent_cmd"]) or "–"],
            ["profile", _profile_text(idn["profile"], idn["profile_json"])],
            ["host", _host_text(idn["host"])],
            ["cgroup", f"v{idn['cgroup_version']}" if idn["cgroup_version"] else "–"],
            ["harness", f"{idn['harness_version']} · identity {idn['identity_hash'] or '–'}"],
            ["design", f"{r['n_tasks']} tasks × {r['trials']} trials · k = {_ks_text(ks)} · gate k = {gk} · seed {r['run']['seed']}"],
        ],
    )
    if r["run"].get("note"):
        ident.rows.append(["note", r["run"]["note"]])
    sections.append(Section("identity", "Run identity", [ident]))

    # ---- warnings early: they change how the numbers should be read
    if r["warnings"]:
        sections.append(Section("warnings", "Warnings", [TextBlock(list(r["warnings"]), style="warn")]))

    # ---- suite
    s = r["suite"]
    srows: list[list[str]] = []
    p1 = s["pass@1"]
    if p1:
        se = p1.get("se_clustered")
        srows.append(["pass@1", f3(p1["estimate"]), fci(p1["low"], p1["high"]), "–", f"SE {f3(se)} (clustered by task)" if se is not None else "SE – (needs 2 measured tasks)", str(p1["n_tasks"])])
    else:
        srows.append(["pass@1", "–", "–", "–", "no measured task", "0"])
    for b in s["by_k"]:
        k = b["k"]
        for name, naive in ((f"pass@{k}", b["naive_pass@k"]), (f"pass^{k}", b["naive_pass^k"])):
            v = b["pass@k"] if name.startswith("pass@") else b["pass^k"]
            naive_label = f"1−(1−mean p)^{k}" if name.startswith("pass@") else f"mean(p)^{k}"
            if v is None:
                srows.append([name, "–", "–", "–", f"no task has {k} clean trials", "0"])
            else:
                srows.append([name, f3(v["estimate"]), fci(v["low"], v["high"]), f"{f3(naive)} ({naive_label})", "", str(v["n_tasks"])])
    suite_tbl = TableBlock(
        columns=["metric", "value", f"{conf} CI", "naive (biased)", "note", "tasks"],
        rows=srows,
        align=["l", "r", "r", "r", "l", "r"],
    )
    sections.append(
        Section(
            "suite",
            "Suite",
            [
                suite_tbl,
                TextBlock(
                    [
                        f"Values are means over tasks of per-task unbiased estimates; CIs are {conf} cluster-bootstrap "
                        f"intervals over tasks ({s['method']['n_boot']} replicates, seed {s['method']['seed']}). "
                        "The naive column is mean(pass@1)^k -- a shortcut that ignores that failures cluster by task; "
                        "it is labeled naive and is not the suite's pass^k.",
                    ],
                    style="muted",
                ),
            ],
        )
    )

    # ---- tasks
    cols = ["task", "trials", "c/n", "pass@1", f"{conf} CI (Wilson)"] + [f"pass^{k}" for k in hk] + ["failures", "discarded"]
    trows = []
    for t in r["tasks"]:
        ci = t["pass1_ci"]
        fail = failures_text(t["failure_kinds"])
        if t["unmeasured"]:
            fail = (fail + "; " if fail else "") + f"{len(t['unmeasured'])} unmeasured"
        trows.append(
            [t["task"], t["marks"], f"{t['c']}/{t['n']}", f3(t["pass1"]), fci(*(ci or (None, None)))]
            + [f3(t["metrics"].get(f"pass^{k}")) for k in hk]
            + [fail or "–", str(t["discarded"]) if t["discarded"] else "–"]
        )
    sections.append(
        Section(
            "tasks",
            "Tasks (worst first)",
            [
                TableBlock(cols, trows, align=["l", "l", "r", "r", "r"] + ["r"] * len(hk) + ["l", "r"], marks_cols=(1,)),
                TextBlock(["✓ pass · ✗ fail · · unmeasured (not scored) · ? not run; one mark per trial slot in trial order"], style="muted"),
            ],
        )
    )

    # ---- buckets
    bk = r["buckets"]
    blines = []
    for name, label in (("always", "always pass"), ("sometimes", "sometimes pass (flaky)"), ("never", "never pass"), ("unmeasured", "unmeasured")):
        ts = bk[name]
        blines.append(f"{label}: {len(ts)}" + (f" — {', '.join(ts)}" if ts else ""))
    sections.append(Section("buckets", "Buckets", [TextBlock(blines)]))

    # ---- attempts & discards
    a, d = r["attempts"], r["discards"]
    dblocks: list[Any] = [
        TextBlock(
            [
                f"attempts {a['total']}: clean {a['clean']}, discarded {a['discarded']}"
                + (f" — by reason: {_counts_text(d['by_reason'])}" if d["by_reason"] else "")
            ]
        )
    ]
    if d["by_task"]:
        flagged = {b["task"] for b in d["selection_bias"]}
        dblocks.append(
            TableBlock(
                ["task", "discarded", "attempts", "rate", "reasons", ""],
                [
                    [t, str(v["discarded"]), str(v["attempts"]), f"{v['discarded'] / v['attempts']:.0%}", _counts_text(v["reasons"]), "selection-bias risk" if t in flagged else ""]
                    for t, v in sorted(d["by_task"].items(), key=lambda kv: (-kv[1]["discarded"] / kv[1]["attempts"], kv[0]))
                ],
                align=["l", "r", "r", "r", "l", "l"],
            )
        )
    sections.append(Section("discards", "Discarded attempts", dblocks))

    # ---- unmeasured
    if r["unmeasured"] or r["pending"]:
        ublocks: list[Any] = []
        if r["unmeasured"]:
            ublocks.append(
                TableBlock(
                    ["task", "slot", "attempts", "reasons", "detail"],
                    [
                        [u["task"], str(u["slot"]), str(u["attempts"]), ", ".join(u["reasons"]) or "–", "; ".join([*u["breaches"], u["message"]] if u["message"] else u["breaches"]) or "–"]
                        for u in r["unmeasured"]
                    ],
                    align=["l", "r", "r", "l", "l"],
                )
            )
        if r["pending"]:
            per: dict[str, list[str]] = defaultdict(list)
            for p in r["pending"]:
                per[p["task"]].append(str(p["slot"]))
            ublocks.append(TextBlock(["never ran: " + "; ".join(f"{t} (trials {', '.join(v)})" for t, v in per.items())], style="warn"))
        sections.append(Section("unmeasured", "Unmeasured slots", ublocks))

    # ---- diagnostics
    dr, ov = r["drift"], r["overdispersion"]
    sections.append(
        Section(
            "diagnostics",
            "Diagnostics",
            [
                TextBlock(
                    [
                        f"drift (early vs late trials): {dr['verdict']}",
                        f"overdispersion (across tasks): {ov['verdict']}",
                    ]
                )
            ],
        )
    )
    return sections


# =========================================================================== renderers


def render_table(report: dict[str, Any]) -> Any:
    """The report as rich renderables (a ``rich.console.Group``) for a terminal."""
    from rich.console import Group
    from rich.text import Text

    idn = report["identity"]
    title = Text(f"harness report · {idn['suite']} · run {report['run']['id']} · profile {idn['profile']}", style="bold")
    return Group(title, *_rich_sections(report_sections(report)))


def _rich_marks(s: str) -> Any:
    from rich.text import Text

    t = Text()
    for ch in s:
        t.append(ch, style={"✓": "green", "✗": "red", "·": "dim", "?": "dim"}.get(ch, ""))
    return t


def _md_cell(s: str) -> str:
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _md_table(b: TableBlock) -> list[str]:
    if not any(b.columns):  # key/value block: a list reads better than a headerless table
        return [f"- **{_md_cell(row[0])}**: {_md_cell(' · '.join(row[1:]))}" for row in b.rows]
    cols = b.columns
    out = ["| " + " | ".join(_md_cell(c) for c in cols) + " |"]
    out.append("|" + "|".join("---:" if a == "r" else ":---" for a in b.aligns()) + "|")
    for row in b.rows:
        cells = [_md_cell(c) for c in row]
        for i in b.marks_cols:
            cells[i] = f"`{row[i]}`"
        out.append("| " + " | ".join(cells) + " |")
    return out


def render_markdown(report: dict[str, Any]) -> str:
    """GitHub-flavoured Markdown, paste-ready for a PR comment (identity folded in <details>)."""
    idn = report["identity"]
    lines = [f"### harness report: `{idn['suite']}` · run `{report['run']['id']}` · profile `{idn['profile']}`", ""]
    # headline: the figures a reviewer looks for first
    s = report["suite"]
    head = []
    if s["pass@1"]:
        head.append(f"pass@1 **{f3(s['pass@1']['estimate'])}** {fci(s['pass@1']['low'], s['pass@1']['high'])}")
    for b in s["by_k"]:
        if b["pass^k"]:
            head.append(f"pass^{b['k']} **{f3(b['pass^k']['estimate'])}** {fci(b['pass^k']['low'], b['pass^k']['high'])} (naive {f3(b['naive_pass^k'])})")
    if head:
        lines += [" · ".join(head), ""]
    for sec in report_sections(report):
        if sec.id == "identity":
            lines += ["<details><summary>Run identity</summary>", ""]
            lines += _md_table(sec.blocks[0])
            lines += ["", "</details>", ""]
            continue
        lines += [f"#### {sec.title}", ""]
        for b in sec.blocks:
            if isinstance(b, TableBlock):
                lines += _md_table(b) + [""]
            elif isinstance(b, TextBlock):
                if b.style == "warn":
                    lines += ["\n>\n".join(f"> ⚠️ {x}" for x in b.lines), ""]
                elif b.style == "muted":
                    lines += [f"<sub>{_html.escape(x, quote=False)}</sub>" for x in b.lines] + [""]
                else:
                    lines += [f"- {x}" for x in b.lines] + [""]
    return "\n".join(lines).rstrip() + "\n"


_CSS = """
:root { --fg:#1f2328; --muted:#656d76; --line:#d0d7de; --bg:#ffffff; --head:#f6f8fa;
        --ok:#1a7f37; --bad:#cf222e; --warn-bg:#fff8c5; --warn-line:#d4a72c; }
* { box-sizing: border-box; }
body { font: 14px/1.5 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: var(--fg);
       background: var(--bg); margin: 0 auto; padding: 24px; max-width: 1200px; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 28px 0 8px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
.sub { color: var(--muted); margin-bottom: 16px; }
table { border-collapse: collapse; margin: 8px 0; width: auto; }
th, td { border: 1px solid var(--line); padding: 4px 10px; vertical-align: top; }
th { background: var(--head); text-align: left; font-weight: 600; }
td.r, th.r { text-align: right; font-variant-numeric: tabular-nums; }
table.kv td:first-child { color: var(--muted); white-space: nowrap; }
.marks { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; letter-spacing: 1px; white-space: nowrap; }
.pass { color: var(--ok); } .fail { color: var(--bad); } .unm, .pend { color: var(--muted); }
.warn { background: var(--warn-bg); border-left: 4px solid var(--warn-line); padding: 6px 10px; margin: 6px 0; }
.muted { color: var(--muted); font-size: 12px; }
ul { margin: 4px 0; padding-left: 20px; }
footer { margin-top: 32px; color: var(--muted); font-size: 12px; }
"""


def _html_marks(s: str) -> str:
    cls = {"✓": "pass", "✗": "fail", "·": "unm", "?": "pend"}
    return '<span class="marks">' + "".join(f'<span class="{cls.get(ch, "")}">{_html.escape(ch)}</span>' for ch in s) + "</span>"


def _html_block(b: Any) -> str:
    e = _html.escape
    if isinstance(b, HtmlBlock):
        return b.html
    if isinstance(b, TextBlock):
        if b.style == "warn":
            return "".join(f'<div class="warn">⚠ {e(x)}</div>' for x in b.lines)
        if b.style == "muted":
            return "".join(f'<p class="muted">{e(x)}</p>' for x in b.lines)
        return "<ul>" + "".join(f"<li>{e(x)}</li>" for x in b.lines) + "</ul>"
    if isinstance(b, TableBlock):
        kv = not any(b.columns)
        out = [f'<table class="{"kv" if kv else "grid"}">']
        if not kv:
            out.append("<thead><tr>" + "".join(f'<th class="{a}">{e(c)}</th>' for c, a in zip(b.columns, b.aligns())) + "</tr></thead>")
        out.append("<tbody>")
        for row in b.rows:
            cells = []
            for i, (c, a) in enumerate(zip(row, b.aligns())):
                inner = _html_marks(c) if i in b.marks_cols else e(c)
                cells.append(f'<td class="{a}">{inner}</td>')
            out.append("<tr>" + "".join(cells) + "</tr>")
        out.append("</tbody></table>")
        return "".join(out)
    raise TypeError(f"unknown block {type(b).__name__}")


def render_html(report: dict[str, Any], *, extra_sections: Sequence[Section] = (), head_html: str = "") -> str:
    """One self-contained HTML page (inline CSS, no scripts, no network references).

    ``extra_sections`` are appended after the tables (the later figures section goes here);
    ``head_html`` is inserted into <head> (e.g. an inlined plotly bundle -- never a CDN link).
    """
    e = _html.escape
    idn = report["identity"]
    title = f"harness report · {idn['suite']} · run {report['run']['id']}"
    body = [
        f"<h1>{e(title)}</h1>",
        f'<div class="sub">profile {e(idn["profile"])} · {report["n_tasks"]} tasks × {report["trials"]} trials · '
        f'k = {e(_ks_text(report["ks"]))} · recomputed from {report["attempts"]["total"]} stored attempts</div>',
    ]
    for sec in [*report_sections(report), *extra_sections]:
        body.append(f'<section id="{e(sec.id)}"><h2>{e(sec.title)}</h2>')
        body.extend(_html_block(b) for b in sec.blocks)
        body.append("</section>")
    body.append(f"<footer>{e(report['schema'])} · harness {e(str(idn['harness_version']))}</footer>")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{e(title)}</title>\n<style>{_CSS}</style>\n{head_html}</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


def render_junit(report: dict[str, Any]) -> str:
    """JUnit XML: one testcase per task, failing when its pass^k (k = gate_k) is below 1.

    A task with fewer than k clean trials cannot be judged and is ``skipped`` (unmeasured
    slots are never counted as a pass or a fail). The ✓/✗ string and failure kinds are in
    the failure message.
    """
    k = report["gate_k"]
    idn = report["identity"]
    metric = f"pass^{k}" if k > 1 else "pass@1"
    suite_name = f"harness.{idn['suite']}"
    cases = []
    failures = skipped = 0
    total_time = 0.0
    for t in sorted(report["tasks"], key=lambda x: x["task"]):
        tc = ET.Element("testcase", classname=suite_name, name=t["task"], time=f"{t['wall_s']:.3f}")
        total_time += t["wall_s"]
        v = t["metrics"].get(metric) if k > 1 else t["pass1"]
        fk = failures_text(t["failure_kinds"])
        detail = [
            f"trials: {t['marks']} ({t['c']}/{t['n']} clean trials passed)",
            f"pass@1 = {f3(t['pass1'])}, {metric} = {f3(v)}",
            f"failure kinds: {fk or 'none'}",
        ]
        if t["unmeasured"]:
            detail.append("unmeasured slots: " + "; ".join(f"trial {u['slot']} ({', '.join(u['reasons'])})" for u in t["unmeasured"]))
        if t["discarded"]:
            detail.append(f"discarded attempts: {t['discarded']} ({_counts_text(t['discard_reasons'])})")
        if v is None:
            skipped += 1
            ET.SubElement(tc, "skipped", message=f"unmeasured: {t['n']} clean trial(s) < k={k}; {metric} cannot be computed ({t['marks']})").text = "\n".join(detail)
        elif v < 1.0 - 1e-12:
            failures += 1
            msg = f"{metric} = {f3(v)} < 1: {t['marks']}" + (f" ({fk})" if fk else "")
            ET.SubElement(tc, "failure", message=msg, type=metric).text = "\n".join(detail)
        cases.append(tc)
    root = ET.Element("testsuites", name="harness", tests=str(len(cases)), failures=str(failures), skipped=str(skipped), errors="0", time=f"{total_time:.3f}")
    ts = ET.SubElement(
        root, "testsuite", name=suite_name, tests=str(len(cases)), failures=str(failures), skipped=str(skipped), errors="0",
        time=f"{total_time:.3f}", timestamp=report["run"]["created_at"] or "", hostname=str(idn["host"].get("hostname", "")),
    )
    props = ET.SubElement(ts, "properties")
    for name, value in (
        ("run_id", report["run"]["id"]), ("suite_hash", idn["suite_hash"]), ("image", idn["image"]),
        ("image_digest", idn["image_digest"]), ("profile", idn["profile"]), ("harness_version", idn["harness_version"]),
        ("cgroup_version", idn["cgroup_version"]), ("trials", str(report["trials"])), ("ks", _ks_text(report["ks"])),
        ("gate_metric", metric),
    ):
        ET.SubElement(props, "property", name=name, value=str(value or ""))
    ts.extend(cases)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# =========================================================================== gate


_REQ = re.compile(r"^\s*pass\s*(?P<sym>[@^])\s*(?P<k>\d+)\s*(?P<op>>=|<=|==|>|<)\s*(?P<v>[0-9]*\.?[0-9]+)\s*$")
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
            return f"{self.metric} = {v:.3f} {self.op} {self.value:g}" + (f" (margin {gap:.3f})" if self.op != "==" else "")
        how = {">=": "short", ">": "short", "<=": "over", "<": "over", "==": "off"}[self.op]
        return f"{self.metric} = {v:.3f} {_NEG[self.op]} {self.value:g} ({how} by {gap:.3f})"


def parse_requirement(text: str) -> Requirement:
    """Parse ``pass@K`` / ``pass^K`` / ``pass@1`` + operator + value in [0, 1]; ValueError if malformed."""
    m = _REQ.match(text or "")
    if not m:
        raise ValueError(
            f"requirement {text!r}: expected METRIC OP VALUE with METRIC pass@K or pass^K, "
            "OP one of >= > <= < ==, VALUE in [0, 1], e.g. 'pass^4>=0.9'"
        )
    k, v = int(m["k"]), float(m["v"])
    if k < 1:
        raise ValueError(f"requirement {text!r}: k must be >= 1")
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"requirement {text!r}: value {v:g} is outside [0, 1]")
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

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "message": self.message, "details": self.details}


def _task_value(req: Requirement, t: TaskOutcomes) -> float | None:
    if t.n < req.k or t.n == 0:
        return None
    sm = suite_metrics([t], [req.k])
    m = sm.per_task[0]
    return m.pass1 if req.k == 1 else (m.pass_at_k if req.sym == "@" else m.pass_hat_k)[req.k]


def check_requirement(req: Requirement, tasks: list[TaskOutcomes]) -> GateCheck:
    """Suite-level requirement: mean over tasks with n >= k of the per-task estimate."""
    vals = [(t.task_id, _task_value(req, t)) for t in tasks]
    used = [v for _, v in vals if v is not None]
    excluded = [tid for tid, v in vals if v is None]
    if not used:
        return GateCheck(
            req.text, False,
            f"{req.metric} cannot be computed: no task has {req.k} clean trial(s) "
            f"({len(tasks)} task(s), all unmeasured or short of k) -- that is a failure, not a pass",
        )
    v = math.fsum(used) / len(used)
    ok = req.holds(v)
    msg = req.describe(v) + f" over {len(used)} task(s)"
    details = [f"{len(excluded)} task(s) with fewer than {req.k} clean trials left out: {', '.join(excluded)}"] if excluded else []
    return GateCheck(req.text, ok, msg, details)


def check_per_task(req: Requirement, share: float, tasks: list[TaskOutcomes], text: str) -> GateCheck:
    """At least ``share`` of the tasks (those with n >= k) meet ``req`` individually."""
    vals = [(t.task_id, _task_value(req, t)) for t in tasks]
    used = [(tid, v) for tid, v in vals if v is not None]
    excluded = [tid for tid, v in vals if v is None]
    name = f"per-task {text}"
    if not used:
        return GateCheck(name, False, f"per-task {req.metric} cannot be computed: no task has {req.k} clean trial(s) -- that is a failure, not a pass")
    meeting = [tid for tid, v in used if req.holds(v)]
    missing = [(tid, v) for tid, v in used if not req.holds(v)]
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
        details.append("not reaching it: " + ", ".join(f"{tid} ({v:.3f})" for tid, v in sorted(missing, key=lambda x: (x[1], x[0]))))
    if excluded:
        details.append(f"{len(excluded)} task(s) with fewer than {req.k} clean trials left out: {', '.join(excluded)}")
    return GateCheck(name, ok, msg, details)


def check_baseline(
    base: list[TaskOutcomes], cur: list[TaskOutcomes], base_id: str, marks: dict[str, str] | None = None, base_marks: dict[str, str] | None = None
) -> GateCheck:
    """Fail on every task that passed every clean trial in the baseline and no longer does."""
    marks, base_marks = marks or {}, base_marks or {}
    by_id = {t.task_id: t for t in cur}
    deterministic = [t for t in base if t.n > 0 and t.c == t.n]
    name = f"baseline {base_id}"
    if not deterministic:
        return GateCheck(name, True, f"no task passed every trial in baseline {base_id}; nothing to hold")
    regressed, unchecked = [], []
    for b in deterministic:
        t = by_id.get(b.task_id)
        if t is None or t.n == 0:
            unchecked.append(b.task_id)
        elif t.c < t.n:
            regressed.append((b.task_id, t))
    held = len(deterministic) - len(regressed) - len(unchecked)
    details = [
        f"{tid}: {base_marks.get(tid, '✓' * next(b.n for b in deterministic if b.task_id == tid))} → {marks.get(tid, '')} ({t.c}/{t.n})"
        for tid, t in regressed
    ]
    if unchecked:
        details.append(f"not checked (absent or unmeasured in this run): {', '.join(unchecked)}")
    if regressed:
        msg = (
            f"{len(regressed)} task(s) that passed every trial in baseline {base_id} no longer do: "
            + ", ".join(tid for tid, _ in regressed)
        )
        return GateCheck(name, False, msg, details)
    return GateCheck(name, True, f"all {held} task(s) that passed every trial in baseline {base_id} still do", details)


# =========================================================================== compare


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: d}


def _dict_diff(a: dict, b: dict, limit: int = 8) -> str:
    fa, fb = _flatten(a or {}), _flatten(b or {})
    keys = sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))
    parts = [f"{k} {fa.get(k)!r} vs {fb.get(k)!r}" for k in keys[:limit]]
    if len(keys) > limit:
        parts.append(f"and {len(keys) - limit} more")
    return "; ".join(parts)


def identity_differences(a: Any, b: Any) -> tuple[list[str], list[str]]:
    """(blocking, warnings): suite or profile differences block a comparison; the rest warn."""
    blocking, warns = [], []
    if a.suite != b.suite:
        blocking.append(f"suite differs: A {a.suite!r} vs B {b.suite!r}")
    if a.suite_hash != b.suite_hash:
        blocking.append(f"suite_hash differs: A {a.suite_hash} vs B {b.suite_hash} (tasks, fixtures or expectations changed)")
    if (a.profile_json or {}) != (b.profile_json or {}):
        blocking.append(f"profile differs: A {a.profile!r} vs B {b.profile!r} ({_dict_diff(a.profile_json, b.profile_json)})")
    if a.image_digest != b.image_digest:
        warns.append(f"image digest differs: A {a.image} {a.image_digest or '–'} vs B {b.image} {b.image_digest or '–'}")
    if list(a.agent_cmd or []) != list(b.agent_cmd or []):
        warns.append(f"agent command differs: A {' '.join(a.agent_cmd or [])!r} vs B {' '.join(b.agent_cmd or [])!r}")
    if a.harness_version != b.harness_version:
        warns.append(f"harness version differs: A {a.harness_version} vs B {b.harness_version}")
    if (a.host or {}) != (b.host or {}):
        warns.append(f"host differs: {_dict_diff(a.host, b.host)}")
    if a.cgroup_version != b.cgroup_version:
        warns.append(f"cgroup version differs: A {a.cgroup_version or '–'} vs B {b.cgroup_version or '–'}")
    return blocking, warns


def build_comparison(run_a: Any, attempts_a: Iterable[Any], run_b: Any, attempts_b: Iterable[Any], *, seed: int = 0) -> dict[str, Any]:
    """Paired comparison of run A (baseline) and run B (candidate), deltas B - A, as plain data.

    Raises ValueError when the runs share no task measured in both.
    """
    ta, tb = task_summaries(run_a, attempts_a), task_summaries(run_b, attempts_b)
    oa = [TaskOutcomes(task_id=t.task, trials=t.outcomes) for t in ta]
    ob = [TaskOutcomes(task_id=t.task, trials=t.outcomes) for t in tb]
    ks = sorted(set(run_ks(run_a)) & set(run_ks(run_b))) or [1]
    cmp = compare_runs(oa, ob, ks, seed=seed)
    marks_a = {t.task: t.marks() for t in ta}
    marks_b = {t.task: t.marks() for t in tb}
    blocking, warns = identity_differences(run_a, run_b)
    per_task = []
    for d in cmp.per_task:
        per_task.append(
            {
                "task": d.task_id,
                "marks_a": marks_a[d.task_id],
                "marks_b": marks_b[d.task_id],
                "n_a": d.n_a, "c_a": d.c_a, "n_b": d.n_b, "c_b": d.c_b,
                "pass1_a": d.pass1_a, "pass1_b": d.pass1_b, "delta_pass1": d.delta_pass1,
                "delta_pass_hat_k": {f"pass^{k}": v for k, v in d.delta_pass_hat_k.items() if k > 1},
            }
        )
    per_task.sort(key=lambda x: (x["delta_pass1"], x["task"]))
    suite = [
        {"metric": "pass@1" if s.k == 1 else f"pass{s.metric[4]}{s.k}", **s.model_dump(mode="json", exclude={"metric"})}
        for s in cmp.suite
    ]
    return {
        "schema": COMPARISON_SCHEMA,
        "a": {"run_id": run_a.id, **_identity(run_a)},
        "b": {"run_id": run_b.id, **_identity(run_b)},
        "ks": ks,
        "identity": {"blocking": blocking, "warnings": warns},
        "n_common": cmp.n_common,
        "only_in_a": cmp.only_in_a,
        "only_in_b": cmp.only_in_b,
        "unmeasured": cmp.unmeasured,
        "per_task": per_task,
        "suite": suite,
        "test": cmp.test.model_dump(mode="json"),
    }


def comparison_sections(c: dict[str, Any]) -> list[Section]:
    hk = [k for k in c["ks"] if k > 1]
    secs: list[Section] = []
    notes = []
    if c["identity"]["blocking"]:
        notes += [f"compared despite: {x}" for x in c["identity"]["blocking"]]
    notes += c["identity"]["warnings"]
    if notes:
        secs.append(Section("identity", "Identity differences", [TextBlock(notes, style="warn")]))
    srows = [
        [s["metric"], f3(s["a"]), f3(s["b"]), f"{s['delta']:+.3f}", fci(s["low"], s["high"]), str(s["n_tasks"])]
        for s in c["suite"]
    ]
    t = c["test"]
    secs.append(
        Section(
            "suite",
            "Suite (B − A, common tasks)",
            [
                TableBlock(["metric", "A", "B", "Δ", "95% CI of Δ (paired bootstrap)", "tasks"], srows, align=["l", "r", "r", "r", "r", "r"]),
                TextBlock([f"paired test ({t['method']}): {t['detail']}"]),
            ],
        )
    )
    rows = []
    for p in c["per_task"]:
        rows.append(
            [p["task"], p["marks_a"], p["marks_b"], f"{p['c_a']}/{p['n_a']}", f"{p['c_b']}/{p['n_b']}", f3(p["pass1_a"]), f3(p["pass1_b"]), f"{p['delta_pass1']:+.3f}"]
            + [("–" if p["delta_pass_hat_k"].get(f"pass^{k}") is None else f"{p['delta_pass_hat_k'][f'pass^{k}']:+.3f}") for k in hk]
        )
    secs.append(
        Section(
            "tasks",
            "Tasks (largest drop first)",
            [TableBlock(["task", "A", "B", "c/n A", "c/n B", "pass@1 A", "pass@1 B", "Δ pass@1"] + [f"Δ pass^{k}" for k in hk], rows, align=["l", "l", "l", "r", "r", "r", "r", "r"] + ["r"] * len(hk), marks_cols=(1, 2))],
        )
    )
    other = []
    if c["only_in_a"]:
        other.append(f"only in A ({len(c['only_in_a'])}): {', '.join(c['only_in_a'])}")
    if c["only_in_b"]:
        other.append(f"only in B ({len(c['only_in_b'])}): {', '.join(c['only_in_b'])}")
    if c["unmeasured"]:
        other.append(f"unmeasured in A or B, not compared ({len(c['unmeasured'])}): {', '.join(c['unmeasured'])}")
    if other:
        secs.append(Section("other", "Tasks not compared", [TextBlock(other)]))
    return secs


def render_comparison_table(c: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.text import Text

    parts: list[Any] = [Text(f"harness compare · A {c['a']['run_id']} ({c['a']['suite']}, {c['a']['profile']}) → B {c['b']['run_id']} ({c['b']['suite']}, {c['b']['profile']})", style="bold")]
    parts.extend(_rich_sections(comparison_sections(c)))
    return Group(*parts)


def _rich_sections(sections: list[Section]) -> list[Any]:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    for sec in sections:
        parts.append(Text(""))
        parts.append(Text(sec.title, style="bold underline"))
        for b in sec.blocks:
            if isinstance(b, TableBlock):
                kv = not any(b.columns)
                t = Table(show_header=not kv, box=None if kv else box.HEAVY_HEAD, pad_edge=False)
                for i, (col, al) in enumerate(zip(b.columns, b.aligns())):
                    t.add_column(col, justify="right" if al == "r" else "left", no_wrap=i == 0 or col in ("trials", "A", "B"))
                for row in b.rows:
                    cells: list[Any] = list(row)
                    for i in b.marks_cols:
                        cells[i] = _rich_marks(row[i])
                    t.add_row(*cells)
                parts.append(t)
            elif isinstance(b, TextBlock):
                style = {"warn": "yellow", "muted": "dim"}.get(b.style, "")
                parts.extend(Text(("⚠ " if b.style == "warn" else "") + line, style=style) for line in b.lines)
    return parts


def render_comparison_markdown(c: dict[str, Any]) -> str:
    lines = [f"### harness compare: A `{c['a']['run_id']}` → B `{c['b']['run_id']}` (`{c['b']['suite']}`, {c['n_common']} common tasks)", ""]
    for sec in comparison_sections(c):
        lines += [f"#### {sec.title}", ""]
        for b in sec.blocks:
            if isinstance(b, TableBlock):
                lines += _md_table(b) + [""]
            elif isinstance(b, TextBlock):
                lines += (["\n>\n".join(f"> ⚠️ {x}" for x in b.lines)] if b.style == "warn" else [f"- {x}" for x in b.lines]) + [""]
    return "\n".join(lines).rstrip() + "\n"
