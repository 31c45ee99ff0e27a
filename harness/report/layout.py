"""The report's layout, shared by every format: sections of table and text blocks.

``report_sections(report)`` turns a report (its JSON data) into :class:`Section` objects made
of :class:`TableBlock` / :class:`TextBlock` / :class:`HtmlBlock`; each renderer in
``harness.report.render`` maps those blocks to its format. The figures (plotly, inlined so the
page stays offline) and the failure review (``harness.report.review``) plug into the HTML
through ``render_html(..., extra_sections=...)``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from harness.model.attempt import FAILURE_KINDS
from harness.model.units import format_size, plural
from harness.report.build import ks_text, counts_text
from harness.report.usage import cost_text, errors_text, tokens_text

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
    return "–" if v is None else f"{v:z.3f}"


def fci(lo: float | None, hi: float | None) -> str:
    return "–" if lo is None or hi is None else f"[{lo:z.3f}, {hi:z.3f}]"


def failures_text(fk: dict[str, int]) -> str:
    """'wrong_state 2, timeout 1' in the fixed order of FAILURE_KINDS, then any others."""
    order = list(FAILURE_KINDS) + sorted(k for k in fk if k not in FAILURE_KINDS)
    return ", ".join(f"{k} {fk[k]}" for k in order if fk.get(k))


def _host_text(h: dict[str, Any]) -> str:
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
            ["agent", (" ".join(idn["agent_cmd"]) or "–") + (f" (agent {idn['agent_name']})" if idn.get("agent_name") else "")],
            ["profile", _profile_text(idn["profile"], idn["profile_json"])],
            ["host", _host_text(idn["host"])],
            ["cgroup", f"v{idn['cgroup_version']}" if idn["cgroup_version"] else "–"],
            ["harness", f"{idn['harness_version']} · identity {idn['identity_hash'] or '–'}"],
            ["design", f"{plural(r['n_tasks'], 'task')} × {plural(r['trials'], 'trial')} · k = {ks_text(ks)} · gate k = {gk} · seed {r['run']['seed']}"],
        ],
    )
    if idn.get("images"):
        ident.rows.append(["task images", f"{len(idn['images'])} built per task (digests in the JSON report)"])
    for ref, local in (idn.get("substitutions") or {}).items():
        ident.rows.append(["base substituted", f"{ref} -> {local}"])
    if idn.get("images") and idn.get("task_overrides") is not False:
        ident.rows.append(["task envelopes", "each task's own (Harbor [environment]; what it does not set comes from the profile): "
                                             "see `harness show` per attempt"])
    if idn.get("task_overrides") is False:
        ident.rows.append(["task envelopes", "replaced by --profile (what each task asked for is stored with its attempts)"])
    for task, adj in (idn.get("adjustments") or {}).items():
        ident.rows.append(["fitted to this machine", f"{task}: {adj.get('note') or adj}"])
    if idn.get("upstreams") or idn.get("secrets"):
        ups = ", ".join(f"{p} -> {u}" for p, u in sorted((idn.get("upstreams") or {}).items())) or "–"
        ident.rows.append(["model gateway", f"{ups} · secrets held: {', '.join(idn.get('secrets') or []) or 'none'} (names only)"])
    nodes = r.get("nodes") or {}
    if nodes.get("executor") == "ray" or len(nodes.get("nodes") or []) > 1:
        per = ", ".join(f"{n['node']} ({n['attempts']} attempts, {n['discarded']} discarded)" for n in nodes["nodes"])
        ident.rows.append(["nodes", f"executor {nodes.get('executor', 'local')}: {per}"
                           + (f" · differ: {'; '.join(nodes['differ'])}" if nodes.get("differ") else " · same kernel, cgroups, CPU and engine")])
    if r.get("late_attempts"):
        ident.rows.append(["late records", f"{r['late_attempts']} (attempts presumed lost whose record came afterwards; evidence only)"])
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
        srows.append(["pass@1", f3(p1["estimate"]), fci(p1["low"], p1["high"]), fci(p1["suite_low"], p1["suite_high"]), "–",
                      f"SE {f3(se)} (clustered by task)" if se is not None else "SE – (needs 2 measured tasks)", str(p1["n_tasks"])])
    else:
        srows.append(["pass@1", "–", "–", "–", "–", "no measured task", "0"])
    for b in s["by_k"]:
        k = b["k"]
        for name, naive in ((f"pass@{k}", b["naive_pass@k"]), (f"pass^{k}", b["naive_pass^k"])):
            v = b["pass@k"] if name.startswith("pass@") else b["pass^k"]
            naive_label = f"1−(1−mean p)^{k}" if name.startswith("pass@") else f"mean(p)^{k}"
            if v is None:
                srows.append([name, "–", "–", "–", "–", f"no task has {k} clean trials", "0"])
            else:
                note = ""
                if v.get("short"):
                    note = (f"{len(v['short'])} task(s) with fewer than {k} clean trials left out ({', '.join(v['short'][:4])}"
                            f"{', …' if len(v['short']) > 4 else ''}); {f3(v['sensitivity'])} counting them as 0")
                srows.append([name, f3(v["estimate"]), fci(v["low"], v["high"]), fci(v["suite_low"], v["suite_high"]),
                              f"{f3(naive)} ({naive_label})", note, str(v["n_tasks"])])
    suite_tbl = TableBlock(
        columns=["metric", "value", f"{conf} CI, tasks like these", f"{conf} CI, this suite", "naive (biased)", "note", "tasks"],
        rows=srows,
        align=["l", "r", "r", "r", "r", "l", "r"],
    )
    sections.append(
        Section(
            "suite",
            "Suite",
            [
                suite_tbl,
                TextBlock(
                    [
                        "Values are means over tasks of per-task unbiased estimates. Two intervals answer two questions: "
                        "'tasks like these' is over the population of tasks this suite samples (tasks and trials both vary: "
                        "quote it for the agent); 'this suite' is on these fixed tasks, trial noise only (use it to ask whether "
                        "a change beat noise on this suite). Both are Wilson score intervals at the effective sample size, "
                        "capped at clean trials / k. "
                        "The naive column is mean(pass@1)^k -- a shortcut that ignores how failures spread over tasks "
                        "(when they cluster by task it understates pass^k; when they spread evenly it is close); "
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
    dlines = [
        f"attempts {a['total']}: clean {a['clean']}, discarded {a['discarded']}"
        + (f" — by reason: {counts_text(d['by_reason'])}" if d["by_reason"] else "")
    ]
    scopes = d.get("by_scope") or {}
    if r.get("usage") is not None or scopes.get("upstream"):
        order = ["host", "envelope", "upstream"] + sorted(k for k in scopes if k not in ("host", "envelope", "upstream"))
        dlines.append("discarded by scope: " + ", ".join(f"{k} {scopes.get(k, 0)}" for k in order)
                      + " (upstream: the model API failed the agent; an attempt breaching two scopes counts in both)")
    dblocks: list[Any] = [TextBlock(dlines)]
    if d["by_task"]:
        flagged = {b["task"] for b in d["selection_bias"]}
        drows = [
            [t, str(v["discarded"]), str(v["attempts"]), f"{v['discarded'] / v['attempts']:.0%}", counts_text(v["reasons"]), "selection-bias risk" if t in flagged else ""]
            for t, v in sorted(d["by_task"].items(), key=lambda kv: (-kv[1]["discarded"] / kv[1]["attempts"], kv[0]))
        ]
        cols, align = ["task", "discarded", "attempts", "rate", "reasons", "flag"], ["l", "r", "r", "r", "l", "l"]
        if not flagged:  # no empty trailing column
            cols, align, drows = cols[:-1], align[:-1], [row[:-1] for row in drows]
        dblocks.append(TableBlock(cols, drows, align=align))
    sections.append(Section("discards", "Discarded attempts", dblocks))

    # ---- model usage (only for a run whose attempts went through a model gateway)
    if r.get("usage") is not None:
        sections.append(usage_section(r))

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



def _tok_pair(t: dict[str, Any]) -> str:
    return f"{tokens_text(t['tokens_in'])} / {tokens_text(t['tokens_out'])}"


def usage_lines(u: dict[str, Any]) -> list[str]:
    """The run's usage in sentences: calls and errors, tokens spent vs scored, waiting, cost."""
    sp, sc = u["spent"], u["scored"]
    def toks(t: dict[str, Any]) -> str:
        return f"in {tokens_text(t['tokens_in'])} · out {tokens_text(t['tokens_out'])} · cached {tokens_text(t['tokens_cached'])}"

    lines = [
        f"model calls {sp['calls']} over {sp['attempts']} attempt(s) · upstream errors: {errors_text(u['errors'])}"
        + (f" · gateway retries {u['retries']}" if u["retries"] else "")
        + f" · attempts discarded for upstream reasons: {u['discarded_upstream']}",
        f"tokens spent (every attempt, discarded included): {toks(sp)}",
        f"tokens in scored attempts (the clean attempt of each slot): {toks(sc)}",
    ]
    if sp["calls_without_usage"]:
        lines.append(f"{sp['calls_without_usage']} call(s) did not report token usage: the sums count only the calls that did "
                     "(– = none reported, never 0)")
    if sp["calls_unrecorded"]:
        lines.append(f"{sp['calls_unrecorded']} call(s) not recorded (beyond the per-attempt record cap, or a record the gateway could not make) are counted but not in the token sums")
    wait = f"waiting on the model {u['wait_s']:.1f} s"
    if u["agent_wall_s"] is not None:
        wait += f" of {u['agent_wall_s']:.1f} s agent wall (working {u['working_s']:.1f} s)"
    if u["queued_s"]:
        wait += f"; queued in the gateway {u['queued_s']:.1f} s"
    lines.append(wait)
    if not u["priced"]:
        lines.append("cost: no price table (pass --prices FILE or set $HARNESS_PRICES)")
    elif sp["cost"] is not None:
        lines.append(f"cost {cost_text(sp['cost'])} spent · {cost_text(sc['cost'])} in scored attempts" if sc["cost"] is not None
                     else f"cost {cost_text(sp['cost'])} spent")
    else:
        why = []
        if u["unpriced_models"]:
            why.append("no price for " + ", ".join(u["unpriced_models"]))
        if sp["calls_without_usage"]:
            why.append("usage not reported by some calls")
        if sp["calls_unrecorded"]:
            why.append("calls beyond the record cap")
        subtotal = f"; {cost_text(u['cost_priced_tasks'])} over the priced tasks only" if u["cost_priced_tasks"] is not None else ""
        lines.append(f"cost unknown: {u['tasks_priced']} of {u['tasks']} tasks priced"
                     + (f" ({'; '.join(why)})" if why else "") + subtotal)
    if u["models"]:
        lines.append("models: " + ", ".join(u["models"]))
    return lines


def usage_section(r: dict[str, Any]) -> Section:
    """Model calls, tokens, upstream errors, waiting time and cost: the run, then per task."""
    u = r["usage"]
    rows = []
    for t in sorted(r["tasks"], key=lambda x: x["task"]):
        tu = t.get("usage")
        if tu is None:
            rows.append([t["task"], "–", "–", "–", "–", "–", "–", "–", "–"])
            continue
        sp, sc = tu["spent"], tu["scored"]
        rows.append([
            t["task"], str(sp["calls"]), _tok_pair(sp), tokens_text(sp["tokens_cached"]), _tok_pair(sc),
            errors_text(tu["errors"]) if any(tu["errors"].values()) else "–", str(tu["discarded_upstream"]) if tu["discarded_upstream"] else "–",
            f"{tu['wait_s']:.1f}", cost_text(sp["cost"]),
        ])
    table = TableBlock(
        ["task", "calls", "tokens spent in / out", "cached", "scored in / out", "upstream errors", "upstream discards", "wait s", "cost"],
        rows, align=["l", "r", "r", "r", "r", "l", "r", "r", "r"],
    )
    note = ("tokens as the responses reported them (– = not reported, never 0); spent counts every attempt, scored only "
            "the clean attempt of each slot; a cost is – when a model has no price or a call reported no usage")
    return Section("usage", "Model usage", [TextBlock(usage_lines(u)), table, TextBlock([note], style="muted")])


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
        [s["metric"], f3(s["a"]), f3(s["b"]), f"{s['delta']:+z.3f}", f"±{f3(s['noise_floor'])}", fci(s["low"], s["high"]),
         f"{s['p_value']:.3g}", "beyond noise" if s["beyond_noise"] else "within noise", str(s["n_tasks"])]
        for s in c["suite"]
    ]
    t = c["test"]
    lines = [f"paired test ({t['method']}): {t['detail']}",
             "noise floor: how far Δ moves on these tasks and trial counts when nothing changed (each task's pooled "
             "trials dealt back at random); Δ beyond it ⇔ the CI excludes 0 ⇔ adjusted p ≤ 0.05"]
    if c.get("cannot_be_significant"):
        lines.append(c["cannot_be_significant"])
    aa = c.get("aa_pairs")
    if aa:
        lines.append(f"stored A/A pairs (runs with A's identity, nothing changed but the seed): {aa['pairs']} pair(s), "
                     f"largest |Δ pass@1| {f3(aa['max_abs_delta'])}, rms {f3(aa['rms_delta'])}")
    secs.append(
        Section(
            "suite",
            "Suite (B − A, common tasks)",
            [
                TableBlock(["metric", "A", "B", "Δ", "noise floor", "95% CI of Δ", "adj. p", "", "tasks"], srows,
                           align=["l", "r", "r", "r", "r", "r", "r", "l", "r"]),
                TextBlock(lines),
            ],
        )
    )
    rows = []
    for p in c["per_task"]:
        rows.append(
            [p["task"], p["marks_a"], p["marks_b"], f"{p['c_a']}/{p['n_a']}", f"{p['c_b']}/{p['n_b']}", f3(p["pass1_a"]), f3(p["pass1_b"]), f"{p['delta_pass1']:+z.3f}"]
            + [("–" if p["delta_pass_hat_k"].get(f"pass^{k}") is None else f"{p['delta_pass_hat_k'][f'pass^{k}']:+z.3f}") for k in hk]
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
