"""Figures for the HTML report (plotly, bundled inline, compressed, so the page works offline).

- pass@k and pass^k against k, with their "tasks like these" intervals;
- the task x trial grid of outcomes coloured by failure kind, discarded attempts marked;
- distributions across attempts of throttled share, memory peak / ceiling, foreign CPU;
- for a sweep: score against envelope.

Pure apart from plotly: takes the report dict, the attempt rows and (for a sweep) the
sibling runs' summaries; returns HTML fragments.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
from functools import lru_cache
from typing import Any, Sequence

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from harness.core.aggregate import slot_views
from harness.report.layout import HtmlBlock, Section, TextBlock
from harness.report.render import script_json

KIND_COLORS = {
    "pass": "#2e7d32",
    "wrong_state": "#c62828",
    "crashed": "#6a1b9a",
    "timeout": "#ef6c00",
    "oom_killed": "#ad1457",
    "ungradable": "#4e342e",
    "unmeasured": "#9e9e9e",
    "pending": "#e0e0e0",
}
KINDS = list(KIND_COLORS)
_CONFIG = {"displaylogo": False, "responsive": True, "staticPlot": False}


# Records script errors and how many figures are drawn as attributes of <html> (read by the
# headless-browser test): once on load, again when the figures are drawn (after the bundle
# is decompressed, which is asynchronous).
_ERROR_PROBE = """<script>
window.__harnessErrors = [];
window.addEventListener('error', function (e) { window.__harnessErrors.push(String(e.message || e)); });
window.addEventListener('unhandledrejection', function (e) { window.__harnessErrors.push(String(e.reason)); });
window.__harnessProbe = function () {
  document.documentElement.setAttribute('data-errors', JSON.stringify(window.__harnessErrors));
  document.documentElement.setAttribute('data-figures', String(document.querySelectorAll('.js-plotly-plot .main-svg').length));
};
window.addEventListener('load', window.__harnessProbe);
</script>
"""

# The plotly bundle (4.8 MB) ships gzip-compressed and base64-encoded (2 MB) in a data
# block; the page decompresses it with the browser's own DecompressionStream, runs it, then
# draws every figure from its JSON block. Nothing is fetched: the page works offline.
_LOADER = """<script>
(function () {
  function gunzip(b64) {
    if (typeof DecompressionStream === 'undefined') {
      return Promise.reject(new Error('this browser has no DecompressionStream (gzip); open the report in a current Chrome, Edge, Firefox or Safari'));
    }
    var bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'))).text();
  }
  var parsed = new Promise(function (done) {
    if (document.readyState !== 'loading') done(); else document.addEventListener('DOMContentLoaded', done);
  });
  window.harnessPlotly = gunzip(document.getElementById('harness-plotly-gz').textContent.trim()).then(function (code) {
    var s = document.createElement('script');
    s.textContent = code;
    document.head.appendChild(s);
    if (!window.Plotly) throw new Error('the plotly bundle did not define Plotly');
    return window.Plotly;
  });
  Promise.all([window.harnessPlotly, parsed]).then(function (r) {
    var jobs = [];
    document.querySelectorAll('script[data-figure]').forEach(function (s) {
      var f = JSON.parse(s.textContent);
      jobs.push(r[0].newPlot(s.getAttribute('data-figure'), f.data, f.layout, f.config));
    });
    return Promise.all(jobs);
  }).catch(function (e) {
    window.__harnessErrors.push(String(e && e.message || e));
    document.querySelectorAll('script[data-figure]').forEach(function (s) {
      var d = document.getElementById(s.getAttribute('data-figure'));
      if (d) { d.className = 'warn'; d.textContent = 'figure not drawn: ' + String(e && e.message || e); }
    });
  }).then(function () {
    document.documentElement.setAttribute('data-figures-done', '1');
    window.__harnessProbe();
  });
})();
</script>
"""


@lru_cache(maxsize=1)
def _bundle_gz_b64() -> str:
    """plotly.min.js, gzip-compressed (deterministic: no timestamp) and base64-encoded."""
    return base64.b64encode(gzip.compress(get_plotlyjs().encode("utf-8"), 9, mtime=0)).decode("ascii")


def head_html() -> str:
    """The plotly bundle, inlined once (no CDN: the file must open offline) as compressed
    data, the loader that draws the figures once it is decompressed, and a tiny probe that
    records script errors on the page (read by the headless-browser test)."""
    return (_ERROR_PROBE + f'<script type="application/gzip+base64" id="harness-plotly-gz">{_bundle_gz_b64()}</script>\n'
            + _LOADER)


def _div(fig: go.Figure, div_id: str) -> str:
    """The figure's placeholder and its JSON, drawn by the loader once plotly is ready."""
    fig.update_layout(margin=dict(l=60, r=20, t=50, b=50), template="plotly_white", font=dict(size=12))
    spec = {**json.loads(pio.to_json(fig, validate=False)), "config": _CONFIG}
    e = html.escape(div_id)
    return (f'<div id="{e}" class="plotly-graph-div" style="width:100%;"></div>'
            f'<script type="application/json" data-figure="{e}">{script_json(spec)}</script>')


def fig_pass_vs_k(report: dict[str, Any]) -> go.Figure | None:
    """pass@k and pass^k against k with their "tasks like these" intervals, naive (p̄)^k dashed."""
    suite = report["suite"]
    p1 = suite.get("pass@1") or {}
    if p1.get("estimate") is None:
        return None
    ks, at, at_lo, at_hi, hat, hat_lo, hat_hi, naive = [1], [p1["estimate"]], [p1["low"]], [p1["high"]], [p1["estimate"]], [p1["low"]], [p1["high"]], [p1["estimate"]]
    for row in suite["by_k"]:
        a, h = row.get("pass@k"), row.get("pass^k")
        if not a or not h or a.get("estimate") is None:
            continue
        ks.append(row["k"])
        at.append(a["estimate"]), at_lo.append(a["low"]), at_hi.append(a["high"])
        hat.append(h["estimate"]), hat_lo.append(h["low"]), hat_hi.append(h["high"])
        naive.append(row.get("naive_pass^k"))
    fig = go.Figure()
    for name, y, lo, hi, color in (("pass@k (capability)", at, at_lo, at_hi, "#1565c0"), ("pass^k (reliability)", hat, hat_lo, hat_hi, "#c62828")):
        fig.add_trace(
            go.Scatter(
                x=ks, y=y, name=name, mode="lines+markers", line=dict(color=color),
                error_y=dict(type="data", symmetric=False, array=[h - v for h, v in zip(hi, y)], arrayminus=[v - l for v, l in zip(y, lo)]),
            )
        )
    fig.add_trace(go.Scatter(x=ks, y=naive, name="naive (mean pass@1)^k — biased", mode="lines", line=dict(color="#c62828", dash="dot")))
    fig.update_layout(title="pass@k and pass^k against k (95% CI over tasks like these)", xaxis_title="k", yaxis_title="score", yaxis=dict(range=[0, 1.05]), xaxis=dict(tickvals=ks))
    return fig


def slot_grid(attempts: Sequence[Any], task_ids: list[str], trials: int, max_reruns: int | None = None) -> tuple[list[list[str]], list[list[int]]]:
    """Per task x slot: the clean outcome's kind (pass / failure kind), or unmeasured /
    pending exactly as the report counts them, and the number of discarded attempts."""
    views = slot_views(attempts, task_ids, trials, max_reruns)
    kinds, disc = [], []
    for t in task_ids:
        row_k, row_d = [], []
        for v in views[t]:
            if v.clean is not None:
                row_k.append("pass" if v.clean.outcome == "pass" else (v.clean.failure_kind or "wrong_state"))
            else:
                row_k.append(v.status)
            row_d.append(len(v.discarded))
        kinds.append(row_k)
        disc.append(row_d)
    return kinds, disc


def fig_grid(report: dict[str, Any], attempts: Sequence[Any]) -> go.Figure:
    """The task x trial grid, coloured by outcome / failure kind; a ring marks slots that
    needed reruns (discarded attempts), with the count in the hover."""
    order = [t["task"] for t in report["tasks"]]  # report order: worst first
    trials = report["trials"]
    kinds, disc = slot_grid(attempts, order, trials, report["run"].get("max_reruns"))
    z = [[KINDS.index(k) for k in row] for row in kinds]
    n = len(KINDS)
    scale = []
    for i, k in enumerate(KINDS):
        scale += [[i / n, KIND_COLORS[k]], [(i + 1) / n, KIND_COLORS[k]]]
    hover = [[f"{t} · trial {i}<br>{k}" + (f"<br>{d} discarded attempt(s) before" if d else "") for i, (k, d) in enumerate(zip(kr, dr))] for t, kr, dr in zip(order, kinds, disc)]
    fig = go.Figure(
        go.Heatmap(
            z=z, x=list(range(trials)), y=order, colorscale=scale, zmin=0, zmax=n, showscale=False, xgap=2, ygap=2,
            text=hover, hoverinfo="text",
        )
    )
    xs, ys, labels = [], [], []
    for t, dr in zip(order, disc):
        for i, d in enumerate(dr):
            if d:
                xs.append(i), ys.append(t), labels.append(str(d))
    if xs:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers+text", text=labels, textfont=dict(color="white", size=10),
                                 marker=dict(symbol="circle-open", size=16, color="black", line=dict(width=2)), name="discarded attempts (count)", hoverinfo="skip"))
    for k in KINDS:  # legend entries for the colours
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", marker=dict(size=12, color=KIND_COLORS[k], symbol="square"), name=k))
    fig.update_layout(
        title="outcome of every slot (task × trial), worst tasks on top",
        xaxis=dict(title="trial index", dtick=1), yaxis=dict(autorange="reversed"),
        height=max(320, 28 * len(order) + 170), legend=dict(orientation="h", y=-0.35 if len(order) < 6 else -0.15),
    )
    return fig


def fig_distributions(attempts: Sequence[Any]) -> go.Figure | None:
    """Histograms across attempts, clean vs discarded: throttled share, memory peak / ceiling,
    foreign CPU share on the pinned cores."""
    rows = [a for a in attempts if a.cpu_usage_us is not None]
    if not rows:
        return None
    fig = make_subplots(rows=1, cols=3, subplot_titles=("CPU throttled share of wall", "memory peak / ceiling", "foreign CPU on pinned cores"))
    for verdict, color in (("clean", "#1565c0"), ("discarded", "#ef6c00")):
        sel = [a for a in rows if a.verdict == verdict]
        if not sel:
            continue
        series = [
            [a.throttled_share for a in sel if a.throttled_share is not None],
            [a.memory_peak / a.memory_max for a in sel if a.memory_peak and a.memory_max],
            [a.foreign_cpu_share for a in sel if a.foreign_cpu_share is not None],
        ]
        for col, xs in enumerate(series, start=1):
            fig.add_trace(
                go.Histogram(x=xs, name=verdict, marker_color=color, opacity=0.7, nbinsx=20, showlegend=(col == 1), legendgroup=verdict,
                             xbins=dict(start=0, end=1.0001, size=0.05)),
                row=1, col=col,
            )
    fig.update_layout(barmode="overlay", title="saturation across attempts (share, 0–1)", height=340)
    for col in (1, 2, 3):
        fig.update_xaxes(range=[0, 1], row=1, col=col)
        fig.update_yaxes(title_text="attempts" if col == 1 else None, row=1, col=col)
    return fig


def fig_sweep(sweep_rows: Sequence[dict[str, Any]], ks: Sequence[int]) -> go.Figure | None:
    """Score against envelope for the runs of one sweep (pass@1 and the largest pass^k)."""
    if len(sweep_rows) < 2:
        return None
    names = [r["profile"] for r in sweep_rows]
    fig = go.Figure()
    kmax = max([k for k in ks if k > 1], default=None)
    keys = [("pass@1", "#1565c0")] + ([(f"pass^{kmax}", "#c62828")] if kmax else [])
    for key, color in keys:
        ys, lo, hi = [], [], []
        for r in sweep_rows:
            m = r["metrics"].get(key) or {}
            ys.append(m.get("estimate")), lo.append(m.get("low")), hi.append(m.get("high"))
        fig.add_trace(
            go.Scatter(
                x=names, y=ys, name=key, mode="lines+markers", line=dict(color=color),
                error_y=dict(type="data", symmetric=False,
                             array=[(h - y) if None not in (h, y) else 0 for h, y in zip(hi, ys)],
                             arrayminus=[(y - l) if None not in (l, y) else 0 for l, y in zip(lo, ys)]),
            )
        )
    fig.add_trace(go.Bar(x=names, y=[r["timeouts"] + r["oom_killed"] for r in sweep_rows], name="timeouts + OOM kills", yaxis="y2", marker_color="#bdbdbd", opacity=0.5))
    fig.update_layout(
        title="score against envelope (same tasks, same seeds)", xaxis_title="envelope (starved → generous)",
        yaxis=dict(title="score", range=[0, 1.05]), yaxis2=dict(title="envelope failures", overlaying="y", side="right", rangemode="tozero", tickformat="d", dtick=max(1, -(-max([r["timeouts"] + r["oom_killed"] for r in sweep_rows] or [0]) // 5))),
        legend=dict(orientation="h", y=-0.2), height=380,
    )
    return fig


def figure_sections(report: dict[str, Any], attempts: Sequence[Any], sweep: dict[str, Any] | None = None) -> list[Section]:
    """The 'figures' section(s) to append to the HTML report."""
    blocks: list[Any] = []
    f = fig_pass_vs_k(report)
    if f is not None:
        blocks.append(HtmlBlock(_div(f, "fig-pass-vs-k")))
    else:
        blocks.append(TextBlock(["no clean trials yet: nothing to plot against k"], style="muted"))
    blocks.append(HtmlBlock(_div(fig_grid(report, attempts), "fig-grid")))
    d = fig_distributions(attempts)
    if d is not None:
        blocks.append(HtmlBlock(_div(d, "fig-saturation")))
    sections = [Section(id="figures", title="Figures", blocks=blocks)]
    if sweep is not None:
        s = fig_sweep(sweep["profiles"], sweep["ks"])
        if s is not None:
            sections.append(Section(id="sweep", title=f"Sweep {sweep['sweep_id']}: score against envelope", blocks=[HtmlBlock(_div(s, "fig-sweep"))]))
    return sections
