"""Renderers of reports and comparisons: a rich table (terminal), Markdown (paste-ready for
a PR comment), a self-contained HTML page and JUnit XML. Each takes the report's JSON data
(``Report.data()``) or a comparison, lays it out with ``harness.report.layout`` and prints
nothing itself."""

from __future__ import annotations

import datetime as dt
import html as _html
import json
import re
import xml.etree.ElementTree as ET
from typing import Any, Sequence

from harness.model.units import plural
from harness.report.build import counts_text, ks_text
from harness.report.layout import HtmlBlock, Section, TableBlock, TextBlock, comparison_sections, f3, failures_text, fci, report_sections
from harness.report.usage import cost_text, errors_text, tokens_text
from harness.report.views import printable


def script_json(obj: Any) -> str:
    """``obj`` as JSON text that is safe inside an HTML <script> element whatever its strings
    hold: every ``<``, ``>`` and ``&`` escaped (so no ``</script>`` or ``<!--`` can end or bend
    the element), and everything beyond ASCII too (U+2028/2029, lone surrogates). The
    page reads it back with ``JSON.parse(element.textContent)``."""
    s = json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


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


# what Markdown would act on in text a report carries (an agent's words among it): HTML tags,
# links and images (a viewer fetches an image: a tracking pixel), code spans, @mentions (a PR
# comment notifies whoever is named), escapes; all shown as the characters they are
_MD_ACTIVE = re.compile(r"[<>\[\]`\\|]|(?<![\w.+-])@")
_MD_AS = {"<": "&lt;", ">": "&gt;", "@": "&#64;"}


def _md_text(s: str) -> str:
    """Text for a Markdown line: one printable line (no terminal escapes or bidi overrides,
    which a PR comment pasted from a terminal would carry), with Markdown's syntax inert."""
    return _MD_ACTIVE.sub(lambda m: _MD_AS.get(m.group(), "\\" + m.group()), _one_line(s))


def _md_table(b: TableBlock) -> list[str]:
    if not any(b.columns):  # key/value block: a list reads better than a headerless table
        return [f"- **{_md_text(row[0])}**: {_md_text(' · '.join(row[1:]))}" for row in b.rows]
    cols = b.columns
    out = ["| " + " | ".join(_md_text(c) for c in cols) + " |"]
    out.append("|" + "|".join("---:" if a == "r" else ":---" for a in b.aligns()) + "|")
    for row in b.rows:
        cells = [_md_text(c) for c in row]
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
    u = report.get("usage")
    if u is not None:
        sp = u["spent"]
        cost = cost_text(sp["cost"]) if sp["cost"] is not None else (
            f"unknown ({u['tasks_priced']} of {u['tasks']} tasks priced)" if u["priced"] else "– (no price table)")
        line = (f"tokens spent in **{tokens_text(sp['tokens_in'])}** / out **{tokens_text(sp['tokens_out'])}** · "
                f"{sp['calls']} model calls · upstream errors: {errors_text(u['errors'])} · cost {cost}")
        lines += [line, ""]
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
                    lines += ["\n>\n".join(f"> ⚠️ {_md_text(x)}" for x in b.lines), ""]
                elif b.style == "muted":
                    lines += [f"<sub>{_md_text(x)}</sub>" for x in b.lines] + [""]
                else:
                    lines += [f"- {_md_text(x)}" for x in b.lines] + [""]
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
h3 { font-size: 15px; margin: 18px 0 6px; } h4 { font-size: 13px; margin: 12px 0 4px; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; background: var(--head); padding: 0 3px; }
.review-filter { position: sticky; top: 0; background: var(--bg); border-bottom: 1px solid var(--line); padding: 6px 0; z-index: 1; }
.review-filter label { margin-right: 12px; white-space: nowrap; }
.kind { display: inline-block; padding: 0 6px; border-radius: 8px; color: #fff; font-size: 12px; background: #57606a; }
.k-wrong_state { background: #c62828; } .k-crashed { background: #6a1b9a; } .k-timeout { background: #ef6c00; }
.k-oom_killed { background: #ad1457; } .k-ungradable { background: #4e342e; }
details.rattempt { border: 1px solid var(--line); border-radius: 6px; margin: 6px 0; }
details.rattempt > summary { cursor: pointer; padding: 4px 8px; overflow-wrap: anywhere; }
details.rattempt[open] > summary { border-bottom: 1px solid var(--line); background: var(--head); }
.pair { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 10px; padding: 8px; }
@media (max-width: 900px) { .pair { grid-template-columns: minmax(0, 1fr); } }
.side { min-width: 0; border-left: 4px solid var(--line); padding-left: 8px; }
.side-fail { border-left-color: var(--bad); } .side-pass { border-left-color: var(--ok); } .side-none { color: var(--muted); }
.side table { width: 100%; table-layout: fixed; } .side td { overflow-wrap: anywhere; }
td.hot { color: var(--bad); font-weight: 600; }
pre.blob, pre.diff, .msg-body { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; white-space: pre-wrap;
        overflow-wrap: anywhere; margin: 4px 0; }
pre.blob, pre.diff { background: var(--head); border: 1px solid var(--line); padding: 6px; max-height: 420px; overflow: auto; }
.conv { max-height: 640px; overflow: auto; border: 1px solid var(--line); padding: 4px; }
.msg { border-radius: 6px; padding: 4px 8px; margin: 4px 0; background: var(--head); }
.msg-role { font-weight: 600; font-size: 12px; }
.role-assistant { background: #ddf4ff; } .role-user { background: #fff8c5; } .role-system { background: #eaeef2; }
.role-tool_call { background: #fbefff; } .role-tool_result { background: #f6f8fa; border: 1px solid var(--line); }
.role-error { background: #ffebe9; } .role-raw { background: #fff; border: 1px dashed var(--line); }
.gap { text-align: center; padding: 4px; }
"""


def _html_marks(s: str) -> str:
    cls = {"✓": "pass", "✗": "fail", "·": "unm", "?": "pend"}
    return '<span class="marks">' + "".join(f'<span class="{cls.get(ch, "")}">{_html.escape(ch)}</span>' for ch in s) + "</span>"


def _e(s: Any) -> str:
    """Text for HTML: escaped, and control characters and bidi overrides replaced as in the
    terminal (a raw ESC is a parse error in HTML and shows as a box, or not at all)."""
    return _html.escape(printable(str(s)))


def _html_block(b: Any) -> str:
    e = _e
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
    """One self-contained HTML page (inline CSS and scripts, no network references).

    ``extra_sections`` are appended after the tables (the figures and the failure review go
    here); ``head_html`` is inserted into <head> (e.g. the inlined plotly bundle -- never a
    CDN link).
    """
    e = _e
    idn = report["identity"]
    title = f"harness report · {idn['suite']} · run {report['run']['id']}"
    body = [
        f"<h1>{e(title)}</h1>",
        f'<div class="sub">profile {e(idn["profile"])} · {plural(report["n_tasks"], "task")} × {plural(report["trials"], "trial")} · '
        f'k = {e(ks_text(report["ks"]))} · recomputed from {report["attempts"]["total"]} stored attempts</div>',
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

    A task with fewer than k clean trials fails when one of them failed (pass^k < 1 either
    way); when all passed or none is clean it is an ``error`` (type ``unmeasured``) if slots
    ended unmeasured, ``skipped`` if they are not run yet (unmeasured slots are never counted
    as a pass or a fail, and never read as fine). The ✓/✗ string and failure kinds are in
    the failure message.
    """
    k = report["gate_k"]
    idn = report["identity"]
    metric = f"pass^{k}" if k > 1 else "pass@1"
    suite_name = f"harness.{idn['suite']}"
    cases = []
    failures = skipped = errors = 0
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
        for f in t.get("failed_trials") or []:
            detail.append(f"trial {f['slot']} ({f['failure_kind'] or 'fail'}, attempt {f['attempt_id']}): {printable(f['reason']) or '–'}")
        if t["unmeasured"]:
            detail.append("unmeasured slots: " + "; ".join(f"trial {u['slot']} ({', '.join(u['reasons'])})" for u in t["unmeasured"]))
        if t["discarded"]:
            detail.append(f"discarded attempts: {t['discarded']} ({counts_text(t['discard_reasons'])})")
        tu = t.get("usage")
        if tu is not None:
            detail.append(_junit_usage_text(tu))
            _junit_props(tc, _usage_props(tu))
        if v is None and t["n"] > 0 and t["c"] < t["n"]:
            # fewer than k clean trials, but a failed one already shows that not every try passes
            failures += 1
            first = next((f for f in t.get("failed_trials") or [] if f["reason"]), None)
            msg = (f"{metric} < 1: {t['n'] - t['c']} of {t['n']} clean trial(s) failed (fewer than k={k} clean trials): {t['marks']}"
                   + (f" ({fk})" if fk else "") + (f"; trial {first['slot']}: {printable(first['reason'])[:200]}" if first else ""))
            ET.SubElement(tc, "failure", message=msg, type=metric).text = "\n".join(detail)
        elif v is None and (t["unmeasured"] or not t["n"]):
            # slots the infrastructure spoiled keep the task from being judged: an error, as a CI
            # reading only JUnit must see (skipped reads as fine; the gate fails such a task too)
            errors += 1
            why = f"{t['n']} clean trial(s), all passing, < k={k}" if t["n"] else "no clean trial"
            ET.SubElement(tc, "error", message=f"{why}, {len(t['unmeasured'])} slot(s) unmeasured; {metric} cannot be judged "
                          f"({t['marks']})", type="unmeasured").text = "\n".join(detail)
        elif v is None:  # slots not run yet (a run in progress or interrupted)
            skipped += 1
            ET.SubElement(tc, "skipped", message=f"{t['n']} clean trial(s), all passing, < k={k}; {metric} cannot be judged yet "
                          f"({t['marks']})").text = "\n".join(detail)
        elif v < 1.0 - 1e-12:
            failures += 1
            msg = f"{metric} = {f3(v)} < 1: {t['marks']}" + (f" ({fk})" if fk else "")
            first = next((f for f in t.get("failed_trials") or [] if f["reason"]), None)
            if first:
                msg += f"; trial {first['slot']}: {printable(first['reason'])[:200]}"
            ET.SubElement(tc, "failure", message=msg, type=metric).text = "\n".join(detail)
        cases.append(tc)
    # the suite's time is the run's wall time (its attempts overlap); the sum of the cases' until it finished
    wall = _wall_s(report["run"]["created_at"], report["run"]["finished_at"])
    suite_time = f"{total_time if wall is None else wall:.3f}"
    root = ET.Element("testsuites", name="harness", tests=str(len(cases)), failures=str(failures), skipped=str(skipped), errors=str(errors), time=suite_time)
    ts = ET.SubElement(
        root, "testsuite", name=suite_name, tests=str(len(cases)), failures=str(failures), skipped=str(skipped), errors=str(errors),
        time=suite_time, timestamp=report["run"]["created_at"] or "", hostname=str(idn["host"].get("hostname", "")),
    )
    props = ET.SubElement(ts, "properties")
    for name, value in (
        ("run_id", report["run"]["id"]), ("suite_hash", idn["suite_hash"]), ("image", idn["image"]),
        ("image_digest", idn["image_digest"]), ("profile", idn["profile"]), ("harness_version", idn["harness_version"]),
        ("cgroup_version", idn["cgroup_version"]), ("trials", str(report["trials"])), ("ks", ks_text(report["ks"])),
        ("gate_metric", metric),
    ):
        ET.SubElement(props, "property", name=name, value=str(value or ""))
    u = report.get("usage")
    if u is not None:
        for name, value in _usage_props(u).items():
            ET.SubElement(props, "property", name=name, value=value)
        if u["priced"]:
            ET.SubElement(props, "property", name="cost_tasks_priced", value=f"{u['tasks_priced']} of {u['tasks']}")
    ts.extend(cases)
    ET.indent(root)
    # only text and attribute values can hold a character XML 1.0 forbids (a grade reason's
    # U+FFFF, a control, a lone surrogate): the markup itself is ASCII, so the whole is cleaned
    return _XML_FORBIDDEN.sub("\ufffd", '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n")


def _wall_s(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    try:
        w = (dt.datetime.fromisoformat(end) - dt.datetime.fromisoformat(start)).total_seconds()
    except (TypeError, ValueError):
        return None
    return w if w >= 0 else None


# what XML 1.0 does not allow in a document (https://www.w3.org/TR/xml/#charsets)
_XML_FORBIDDEN = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _usage_props(u: dict[str, Any]) -> dict[str, str]:
    """Usage as JUnit properties; an unknown value (tokens not reported, cost not priced) is
    left out, never written as 0."""
    sp, sc = u["spent"], u["scored"]
    vals: dict[str, Any] = {
        "model_calls": sp["calls"], "tokens_in": sp["tokens_in"], "tokens_out": sp["tokens_out"],
        "tokens_cached": sp["tokens_cached"], "tokens_in_scored": sc["tokens_in"], "tokens_out_scored": sc["tokens_out"],
        "calls_without_usage": sp["calls_without_usage"], "upstream_errors": sum(u["errors"].values()),
        **{f"upstream_{k}": v for k, v in u["errors"].items() if v},
        "upstream_discards": u["discarded_upstream"], "wait_s": f"{u['wait_s']:.3f}",
        "cost_usd": None if sp["cost"] is None else f"{sp['cost']:.6f}",
    }
    return {k: str(v) for k, v in vals.items() if v is not None}


def _junit_props(tc: ET.Element, props: dict[str, str]) -> None:
    p = ET.SubElement(tc, "properties")
    for name, value in props.items():
        ET.SubElement(p, "property", name=name, value=value)


def _junit_usage_text(u: dict[str, Any]) -> str:
    sp = u["spent"]
    return (f"model usage: {sp['calls']} calls, tokens in {tokens_text(sp['tokens_in'])} / out {tokens_text(sp['tokens_out'])}, "
            f"upstream errors: {errors_text(u['errors'])}, upstream discards {u['discarded_upstream']}, "
            f"wait {u['wait_s']:.1f} s, cost {cost_text(sp['cost'])}")



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
                parts.append(_FitTable(b))
            elif isinstance(b, TextBlock):
                style = {"warn": "yellow", "muted": "dim"}.get(b.style, "")
                parts.extend(Text(("⚠ " if b.style == "warn" else "") + _one_line(line), style=style) for line in b.lines)
    return parts


class _FitTable:
    """A table block for a terminal. A figure is never cut ("+0.2…" reads as another number):
    its column keeps the width of its longest value, and where the terminal is too narrow for
    all of them each row is printed as ``column value`` pairs that wrap instead."""

    def __init__(self, block: TableBlock):
        self.b = block
        # each column's longest value, measured once
        self.longest = [max((len(_one_line(r[i])) for r in block.rows if i < len(r)), default=0) for i in range(len(block.columns))]

    def _needed(self) -> int:
        widths = []
        for i, col in enumerate(self.b.columns):
            if self._figure(i):
                widths.append(max(self.longest[i], max((len(w) for w in col.split()), default=0)))
            else:  # a task id or words: folds, down to a readable minimum
                widths.append(min(max(self.longest[i], len(col)), 12))
        return sum(widths) + 3 * len(widths) + 1

    def _figure(self, i: int) -> bool:
        return self.b.aligns()[i] == "r" or i in self.b.marks_cols

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        b = self.b
        kv = not any(b.columns)
        if not kv and options.max_width < self._needed():
            for row in b.rows:  # pairs packed into lines, never split between a name and its value
                line = Text(_one_line(row[0]), style="bold")
                for i, (col, cell) in enumerate(zip(b.columns[1:], row[1:]), start=1):
                    pair = Text(f"{_one_line(col)} " if col else "", style="dim")
                    pair.append_text(_rich_marks(cell) if i in b.marks_cols else Text(_one_line(cell)))
                    if line.cell_len + 2 + pair.cell_len > options.max_width and line.cell_len > 2:
                        yield line
                        line = Text("  ")
                    else:
                        line.append("  ")
                    line.append_text(pair)
                yield line
            return
        t = Table(show_header=not kv, box=None if kv else box.HEAVY_HEAD, pad_edge=False)
        for i, (col, al) in enumerate(zip(b.columns, b.aligns())):
            figure = not kv and self._figure(i)
            t.add_column(col, justify="right" if al == "r" else "left", no_wrap=figure, overflow="fold",
                         min_width=self.longest[i] if figure else None)
        for row in b.rows:
            # Text, never markup: a cell may carry a task's id or a grader's words, and
            # "[bold]x[/]" is shown as those characters; a newline would split the row
            cells: list[Any] = [Text(_one_line(c)) for c in row]
            for i in b.marks_cols:
                cells[i] = _rich_marks(row[i])
            t.add_row(*cells)
        yield t


def _one_line(s: Any) -> str:
    return printable(str(s)).replace("\r", " ").replace("\n", " ").replace("\t", " ")


def render_comparison_markdown(c: dict[str, Any]) -> str:
    lines = [f"### harness compare: A `{c['a']['run_id']}` → B `{c['b']['run_id']}` (`{c['b']['suite']}`, {c['n_common']} common tasks)", ""]
    for sec in comparison_sections(c):
        lines += [f"#### {sec.title}", ""]
        for b in sec.blocks:
            if isinstance(b, TableBlock):
                lines += _md_table(b) + [""]
            elif isinstance(b, TextBlock):
                lines += (["\n>\n".join(f"> ⚠️ {_md_text(x)}" for x in b.lines)] if b.style == "warn"
                          else [f"- {_md_text(x)}" for x in b.lines]) + [""]
    return "\n".join(lines).rstrip() + "\n"
