"""The HTML report's failure review: each failing task's failed attempts, beside a passing
attempt of the same task, with what the grader said, the state diff or verifier output, the
saturation counters, the transcript and the output tails.

Bounded whatever the run's size: :func:`plan_review` picks at most ``ReviewLimits.tasks``
failing tasks (most failures first) and ``failed_per_task`` failed attempts of each (one of
each failure kind first) from the report and the attempt records, without reading a file;
:func:`read_review_artifacts` then reads the artifacts of only those attempts, each file cut
to its cap and the page to ``page_bytes``; :func:`review_section` renders the section.

Transcripts, tails, diffs and verifier output are agent-controlled. Nothing here parses them:
they are embedded as capped text in a JSON data block whose ``<``, ``>``, ``&`` and line
separators are escaped (:func:`harness.report.render.script_json`), and the page's script
parses the transcript's JSON lines in the browser and builds the conversation with
``createElement`` / ``textContent`` only. Text in the static markup is HTML-escaped.
"""

from __future__ import annotations

import html as _html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from harness.model.attempt import FAILURE_KINDS
from harness.model.units import TERMINAL_UNSAFE, format_size
from harness.report.artifacts import TRANSCRIPT, Capped, read_capped
from harness.report.layout import HtmlBlock, Section
from harness.report.render import script_json
from harness.report.views import Thresholds, diff_lines, diff_row_lines, diff_summary, pct, printable, trial_row

KiB = 1024
MiB = 1024 * KiB
TAIL_FILES = ("stdout.txt", "stderr.txt")
OPTIONAL_FILES = ("grade-stderr.txt", "verifier-stdout.txt", "verifier-stderr.txt")  # shown when present
TITLES = {TRANSCRIPT: "transcript", "stdout.txt": "stdout (tail)", "stderr.txt": "stderr (tail)", "grade-stderr.txt": "grader stderr (tail)",
          "verifier-stdout.txt": "verifier output: stdout (tail)", "verifier-stderr.txt": "verifier output: stderr (tail)"}
TRANSCRIPT_HEAD = 0.25  # of a long transcript's cap, kept from its start (the rest from its end)


@dataclass(frozen=True)
class ReviewLimits:
    """How much the failure review shows; what is left out is counted and named."""

    tasks: int = 50
    failed_per_task: int = 3
    unmeasured: int = 50
    transcript_bytes: int = 64 * KiB
    tail_bytes: int = 8 * KiB
    page_bytes: int = 4 * MiB


@dataclass
class ReviewTask:
    """One failing task as the review shows it."""

    task: str
    marks: str
    passed: int
    clean: int
    kinds: dict[str, int]
    failed: list[Any]
    failed_total: int
    passing: Any | None
    unmeasured: int = 0


@dataclass(frozen=True)
class UnmeasuredRow:
    task: str
    slot: int
    attempts: int
    reasons: list[str]
    detail: str
    last_attempt: int | None


@dataclass
class ReviewPlan:
    """Which attempts the review shows (records only; no artifact read yet)."""

    run_id: str
    tasks: list[ReviewTask]
    failing_tasks: int
    left_out_tasks: int
    left_out_failures: int
    kinds: dict[str, int]
    unmeasured: list[UnmeasuredRow] = field(default_factory=list)
    unmeasured_total: int = 0

    def attempts(self) -> list[Any]:
        """Every attempt shown, each once: per task its failed ones, then its passing one."""
        out, seen = [], set()
        for t in self.tasks:
            for a in [*t.failed, *([t.passing] if t.passing is not None else [])]:
                if a.id not in seen:
                    seen.add(a.id)
                    out.append(a)
        return out


def kind_of(a: Any) -> str:
    return a.failure_kind or "unknown"


def _slot_key(a: Any) -> tuple:
    return (a.slot, a.attempt_no, a.id or 0)


def pick_failed(fails: Sequence[Any], cap: int) -> list[Any]:
    """At most ``cap`` failed attempts, in slot order: the first of each failure kind (in
    FAILURE_KINDS order) before a second of any kind, so every kind has an example."""
    ordered = sorted(fails, key=_slot_key)
    present = {kind_of(a) for a in ordered}
    order = [k for k in FAILURE_KINDS if k in present] + sorted(present - set(FAILURE_KINDS))
    picked: list[Any] = []
    for k in order:
        if len(picked) < cap:
            picked.append(next(a for a in ordered if kind_of(a) == k))
    ids = {id(a) for a in picked}
    for a in ordered:
        if len(picked) >= cap:
            break
        if id(a) not in ids:
            picked.append(a)
            ids.add(id(a))
    return sorted(picked, key=_slot_key)


def plan_review(report: dict[str, Any], attempts: Sequence[Any], limits: ReviewLimits = ReviewLimits()) -> ReviewPlan:
    """Pick what the review shows from the report (its failing trials, in its order) and the
    run's attempt records. Reads no file; one pass over the records."""
    trials = int(report.get("trials") or 0)
    rows = report["tasks"]
    failing = [t for t in rows if t.get("failed_trials")]
    order = sorted(failing, key=lambda t: -len(t["failed_trials"]))  # stable: report order (worst first) on ties
    shown = order[: max(0, limits.tasks)]
    wanted = {f["attempt_id"] for t in shown for f in t["failed_trials"] if f.get("attempt_id") is not None}
    shown_tasks = {t["task"] for t in shown}
    unm_rows = list(report.get("unmeasured") or [])
    unm_keys = {(u["task"], u["slot"]) for u in unm_rows[: max(0, limits.unmeasured)]}
    by_id: dict[int, Any] = {}
    passing: dict[str, Any] = {}
    last_discard: dict[tuple[str, int], Any] = {}
    for a in attempts:
        if a.id in wanted:
            by_id[a.id] = a
        if a.verdict == "clean" and a.outcome == "pass" and a.task_id in shown_tasks and a.slot < trials:
            cur = passing.get(a.task_id)
            if cur is None or _slot_key(a) < _slot_key(cur):
                passing[a.task_id] = a
        if a.verdict != "clean" and (a.task_id, a.slot) in unm_keys:
            cur = last_discard.get((a.task_id, a.slot))
            if cur is None or _slot_key(a) > _slot_key(cur):
                last_discard[(a.task_id, a.slot)] = a
    kinds: dict[str, int] = {}
    for t in rows:
        for k, v in (t.get("failure_kinds") or {}).items():
            if v:
                kinds[k] = kinds.get(k, 0) + v
    tasks = []
    for t in shown:
        fails = [by_id[f["attempt_id"]] for f in t["failed_trials"] if f.get("attempt_id") in by_id]
        tasks.append(ReviewTask(
            task=t["task"], marks=t["marks"], passed=t["c"], clean=t["n"], kinds=dict(t.get("failure_kinds") or {}),
            failed=pick_failed(fails, limits.failed_per_task), failed_total=len(t["failed_trials"]),
            passing=passing.get(t["task"]), unmeasured=len(t.get("unmeasured") or []),
        ))
    left = order[len(shown):]
    unmeasured = []
    for u in unm_rows[: max(0, limits.unmeasured)]:
        last = last_discard.get((u["task"], u["slot"]))
        detail = "; ".join([*u.get("breaches", []), *([u["message"]] if u.get("message") else [])])
        unmeasured.append(UnmeasuredRow(task=u["task"], slot=u["slot"], attempts=u.get("attempts", 0), reasons=list(u.get("reasons") or []),
                                        detail=detail, last_attempt=None if last is None else last.id))
    return ReviewPlan(
        run_id=report["run"]["id"], tasks=tasks, failing_tasks=len(failing), left_out_tasks=len(left),
        left_out_failures=sum(len(t["failed_trials"]) for t in left), kinds=kinds,
        unmeasured=unmeasured, unmeasured_total=len(unm_rows),
    )


# ----------------------------------------------------------------------------- artifacts


def read_attempt_artifacts(a: Any, limits: ReviewLimits) -> dict[str, Capped | None]:
    """The capped artifact texts of one attempt (None: the file is absent)."""
    base = Path(a.artifacts) if a.artifacts else None
    out: dict[str, Capped | None] = {}
    for name in (TRANSCRIPT, *TAIL_FILES, *OPTIONAL_FILES):
        if base is None:
            out[name] = None
        elif name == TRANSCRIPT:
            out[name] = read_capped(base / name, limits.transcript_bytes, head_share=TRANSCRIPT_HEAD, controls=True)
        else:
            out[name] = read_capped(base / name, limits.tail_bytes)
    return out


@dataclass
class ReviewArtifacts:
    """What the page embeds: per attempt id, its capped files (as escaped JSON), or why not."""

    files: dict[int, dict[str, Capped | None]] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)
    folder_gone: set[int] = field(default_factory=set)
    json: dict[int, str] = field(default_factory=dict)

    def data_json(self) -> str:
        """The page's data block: ``{"attempts": {ID: {"files": {NAME: capped | null}}}}``,
        already escaped for a <script> element."""
        return '{"attempts":{' + ",".join(f'"{i}":{s}' for i, s in self.json.items()) + "}}"


def read_review_artifacts(plan: ReviewPlan, limits: ReviewLimits = ReviewLimits()) -> ReviewArtifacts:
    """Read the artifacts of the attempts the plan shows (and no other), worst task first,
    until the page budget is spent; an attempt over the rest of the budget is not embedded."""
    out = ReviewArtifacts()
    left = limits.page_bytes
    for a in plan.attempts():
        files = read_attempt_artifacts(a, limits)
        if a.artifacts and not Path(a.artifacts).is_dir():
            out.folder_gone.add(a.id)
        blob = script_json({"files": {k: (v.as_dict() if v is not None else None) for k, v in files.items()}})
        if len(blob) > left:
            out.skipped[a.id] = f"not embedded: the page's {format_size(limits.page_bytes)} budget for artifacts is spent"
            continue
        left -= len(blob)
        out.files[a.id] = files
        out.json[a.id] = blob
    return out


# ----------------------------------------------------------------------------- rendering


def _e(v: Any) -> str:
    """Agent-influenced text for the markup: control characters replaced, HTML-escaped,
    and anything that is not valid UTF-8 (a lone surrogate) replaced."""
    s = printable(str(v)).encode("utf-8", "replace").decode("utf-8")
    return _html.escape(s, quote=True)


def _num(v: Any) -> str:
    return "–" if v is None else str(v)


def _secs(v: float | None) -> str:
    return "–" if v is None else f"{v:.3f} s"


def saturation_rows(a: Any, th: Thresholds) -> list[tuple[str, str, bool]]:
    """The attempt's cgroup and host counters as (label, value, over its threshold);
    '–' = not measured (never 0)."""
    r = trial_row(a, th)
    hot = set(r["saturated"])
    c = a.counters or {}
    psi_full = c.get("psi_memory_full_us")
    rows = [
        ("CPU used", f"{_secs(r['cpu_s'])} ({pct(r['cpu_quota_share'])} of quota)", False),
        ("CPU throttled", f"{_secs(r['throttled_s'])} ({pct(r['throttled_share'])} of wall); periods {_num(a.nr_throttled)} of {_num(a.nr_periods)}",
         "throttled" in hot),
        ("memory peak / limit", f"{format_size(a.memory_peak)} / {format_size(a.memory_max)} ({pct(r['memory_peak_share'])})", "memory" in hot),
        ("memory limit hits / high events", f"{_num(a.memory_limit_hits)} / {_num(a.memory_high_events)}", "memory_limit" in hot),
        ("OOM events / kills", f"{_num(c.get('oom_events'))} / {_num(a.oom_kills)}", "oom" in hot),
        ("pids peak / limit / refused forks", f"{_num(a.pids_peak)} / {_num(a.pids_max)} / {_num(a.pids_limit_hits)}", "pids" in hot),
        ("PSI some cpu / memory / io", " / ".join(_secs(r[k]) for k in ("psi_cpu_some_s", "psi_memory_some_s", "psi_io_some_s"))
         + ("" if psi_full is None else f"; memory full {_secs(psi_full / 1e6)}"), False),
        ("block I/O read / written", f"{format_size(r['io_read_bytes'])} / {format_size(r['io_write_bytes'])}", False),
        ("foreign CPU on its cores / steal", f"{pct(a.foreign_cpu_share)} / {pct(a.steal_share)}", bool({"foreign_cpu", "steal"} & hot)),
        ("host PSI cpu / memory / io", f"{pct(a.host_psi_cpu)} / {pct(a.host_psi_memory)} / {pct(a.host_psi_io)}", bool({"host_memory", "host_io"} & hot)),
        ("host MemAvailable min", format_size(a.mem_available_min), False),
    ]
    if a.monitor_errors:
        rows.append(("samples lost to read errors", str(a.monitor_errors), True))
    return rows


def _kv(rows: Sequence[tuple[str, str, bool]]) -> str:
    return '<table class="kv">' + "".join(
        f'<tr><td>{_e(k)}</td><td{" class=hot" if hot else ""}>{_e(v)}</td></tr>' for k, v, hot in rows) + "</table>"


def _grade_html(a: Any) -> str:
    outcome = "pass" if a.outcome == "pass" else f"fail ({kind_of(a)})"
    wall = " / ".join("–" if v is None else f"{v:.2f} s" for v in (a.wall_s, a.agent_wall_s, a.grade_wall_s))
    rows = [("outcome", outcome, a.outcome != "pass"), ("grader's reason", a.grade_reason or "–", False),
            ("exit / timed out", f"{_num(a.exit_code)} / {'yes' if a.timed_out else 'no'}", bool(a.timed_out)),
            ("wall / agent / grade", wall, False), ("seed / cores", f"{a.seed} / {a.cpuset or '–'}", False)]
    if a.reward is not None:
        rows.append(("verifier reward", f"{a.reward:g}" + "".join(f"; {k} {v:g}" for k, v in list((a.rewards or {}).items())[:8]), False))
    if a.error:
        rows.append(("note" if a.verdict == "clean" else "error", a.error.strip().splitlines()[-1][:500] if a.error.strip() else "–", False))
    out = [_kv(rows)]
    failed = [c for c in a.grade_checks or [] if not c.get("passed")]
    if failed:
        out.append('<ul class="checks">' + "".join(
            f"<li>✗ {_e(c.get('name'))} [{_e(c.get('kind'))}]" + (f" — {_e(c['detail'])}" if c.get("detail") else "") + "</li>"
            for c in failed[:10]) + (f"<li>… {len(failed) - 10} more failed check(s)</li>" if len(failed) > 10 else "") + "</ul>")
    return "".join(out)


def _diff_html(a: Any) -> str:
    sd = a.state_diff or {}
    if isinstance(sd.get("files"), dict):
        fd = sd["files"]
        head = f"{fd.get('total', 0)} path(s) differ from the fixture" if fd.get("total") else "no path differs from the fixture"
        lines = diff_lines(sd, limit=40)
        return f"<h4>state diff (files)</h4><p>{_e(head)}</p>" + (f'<pre class="diff">{_e(chr(10).join(lines))}</pre>' if lines else "")
    summary = diff_summary(sd)
    if summary or sd.get("lines") or sd.get("schema_changes"):
        rows = "".join(f"<tr><td>{_e(d['table'])}</td><td>{_e(d['status'])}</td><td class=r>+{d['added']}</td>"
                       f"<td class=r>-{d['removed']}</td><td class=r>~{d['changed']}</td></tr>" for d in summary)
        table = ('<table class="grid"><thead><tr><th>table</th><th>status</th><th class=r>added</th><th class=r>removed</th>'
                 f"<th class=r>changed</th></tr></thead><tbody>{rows}</tbody></table>") if rows else ""
        lines = diff_lines(sd, limit=40) + [f"schema: {x}" for x in (sd.get("schema_changes") or [])[:10]] + diff_row_lines(sd)
        cut = " (cut by the grader: counts are complete, rows are the first ones)" if sd.get("truncated") else ""
        return f"<h4>state diff vs the fixture{_e(cut)}</h4>{table}" + (f'<pre class="diff">{_e(chr(10).join(lines))}</pre>' if lines else "")
    if a.reward is not None or (a.grade_checks and any(c.get("kind") in ("reward", "test") for c in a.grade_checks)):
        return '<h4>state diff</h4><p class="muted">judged by a verifier: its output is below</p>'
    if a.grade_status == "ungradable":
        return '<h4>state diff</h4><p class="muted">not available: the final state could not be read (see the reason above)</p>'
    return '<h4>state diff</h4><p class="muted">' + ("no change from the fixture" if a.grade_checks else "no final state recorded") + "</p>"


def _file_slot(a: Any, name: str, title: str, art: ReviewArtifacts, optional: bool) -> str:
    files = art.files.get(a.id)
    if files is None:
        return ""
    c = files.get(name)
    if c is None:
        if optional:
            return ""
        why = ""
        if a.id in art.folder_gone:
            why = " (the artifacts folder is gone; `harness gc` may have removed it)"
        elif name == TRANSCRIPT and a.artifacts and (Path(a.artifacts) / "logs-agent.tar").is_file():
            why = " as transcript.jsonl: the agent's logs are in logs-agent.tar in the artifacts folder (not opened by the report)"
        return f'<h4>{_e(title)}</h4><p class="muted">not present{_e(why)}</p>'
    cls = "transcript" if name == TRANSCRIPT else "blob"
    tag = "div" if name == TRANSCRIPT else "pre"
    size = f" · {format_size(c.size)}" + (f", {format_size(c.kept)} kept" if c.truncated else "")
    return (f'<h4>{_e(title)}<span class="muted">{_e(size)}</span></h4>'
            f'<{tag} class="{cls}" data-file="{_e(name)}"><span class="muted">open the attempt to load it</span></{tag}>')


def _side_html(a: Any, role: str, th: Thresholds, art: ReviewArtifacts, anchor: bool) -> str:
    label = "failed" if role == "fail" else "passing"
    ident = f' id="attempt-{a.id}"' if anchor else ""
    title = (f'<div class="side-title"{ident}><b>{label}</b>: attempt #{a.id} · trial {a.slot}'
             f'{f" (attempt {a.attempt_no} of the slot)" if a.attempt_no > 1 else ""} · '
             f'<a href="#attempt-{a.id}">link</a> · <code>harness show {a.id}</code></div>')
    parts = [title, _grade_html(a), _diff_html(a), "<h4>saturation (cgroup and host counters, agent phase)</h4>",
             _kv(saturation_rows(a, th))]
    if a.id in art.skipped:
        parts.append(f'<p class="warn">artifacts {_e(art.skipped[a.id])}: <code>harness show {a.id}</code></p>')
    for name in (TRANSCRIPT, *TAIL_FILES, *OPTIONAL_FILES):
        parts.append(_file_slot(a, name, TITLES[name], art, optional=name in OPTIONAL_FILES))
    return f'<div class="side side-{role}" data-attempt="{a.id}">' + "".join(parts) + "</div>"


def _marks_html(s: str) -> str:
    cls = {"✓": "pass", "✗": "fail", "·": "unm", "?": "pend"}
    return '<span class="marks">' + "".join(f'<span class="{cls.get(ch, "")}">{_e(ch)}</span>' for ch in s) + "</span>"


def _task_html(i: int, t: ReviewTask, run_id: str, th: Thresholds, art: ReviewArtifacts, anchored: set[int]) -> str:
    kinds = ", ".join(f"{k} {v}" for k, v in t.kinds.items() if v)
    extra = f" · {t.unmeasured} unmeasured slot(s), not scored" if t.unmeasured else ""
    out = [f'<div class="rtask" id="review-task-{i}"><h3>{_e(t.task)} {_marks_html(t.marks)} '
           f'<span class="muted">{t.passed}/{t.clean} clean trials passed · {_e(kinds)}{_e(extra)}</span></h3>']
    if t.failed_total > len(t.failed):
        out.append(f'<p class="muted">showing {len(t.failed)} of {t.failed_total} failed attempts; all of them: '
                   f"<code>harness trials {_e(run_id)} --task {_e(t.task)} --outcome fail</code></p>")
    for a in t.failed:
        reason = printable(a.grade_reason or a.error or "")
        reason = reason if len(reason) <= 160 else reason[:159] + "…"
        k = kind_of(a)
        pass_side = (_side_html(t.passing, "pass", th, art, anchor=t.passing.id not in anchored) if t.passing is not None else
                     f'<div class="side side-none"><b>no passing attempt</b>: none of the {t.clean} clean trials of this task passed</div>')
        if t.passing is not None:
            anchored.add(t.passing.id)
        out.append(
            f'<details class="rattempt" id="attempt-{a.id}" data-kind="{_e(k)}" data-attempt="{a.id}">'
            f'<summary><span class="kind k-{_e(k)}">{_e(k)}</span> trial {a.slot} · attempt #{a.id}'
            + (f" · {_e(reason)}" if reason else "") + "</summary>"
            f'<div class="pair">{_side_html(a, "fail", th, art, anchor=False)}{pass_side}</div></details>'
        )
    out.append("</div>")
    return "".join(out)


def _filter_html(plan: ReviewPlan) -> str:
    shown: dict[str, int] = {}
    for t in plan.tasks:
        for a in t.failed:
            shown[kind_of(a)] = shown.get(kind_of(a), 0) + 1
    order = [k for k in FAILURE_KINDS if k in shown] + sorted(set(shown) - set(FAILURE_KINDS))
    boxes = "".join(f'<label><input type="checkbox" data-kind="{_e(k)}" checked> <span class="kind k-{_e(k)}">{_e(k)}</span> '
                    f"{shown[k]} shown of {plan.kinds.get(k, shown[k])}</label>" for k in order)
    return (f'<div class="review-filter" hidden><b>failure kind</b> {boxes} <button type="button" data-set="all">all</button> '
            f'<button type="button" data-set="none">none</button> <span class="review-count muted" data-run="{sum(plan.kinds.values())}"></span></div>')


def _unmeasured_html(plan: ReviewPlan) -> str:
    if not plan.unmeasured_total:
        return ""
    rows = "".join(
        f"<tr><td>{_e(u.task)}</td><td class=r>{u.slot}</td><td class=r>{u.attempts}</td><td>{_e(', '.join(u.reasons) or '–')}</td>"
        f"<td>{_e(u.detail or '–')}</td><td>{'–' if u.last_attempt is None else f'<code>harness show {u.last_attempt}</code>'}</td></tr>"
        for u in plan.unmeasured)
    more = plan.unmeasured_total - len(plan.unmeasured)
    note = (f'<p class="muted">{more} more unmeasured slot(s): <code>harness trials {_e(plan.run_id)} --verdict discarded</code></p>'
            if more > 0 else "")
    return ('<h3>Unmeasured slots (every attempt discarded: not scored, neither pass nor fail)</h3><table class="grid"><thead><tr>'
            "<th>task</th><th class=r>slot</th><th class=r>attempts</th><th>reasons</th><th>detail</th><th>last attempt</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>{note}")


def review_html(plan: ReviewPlan, art: ReviewArtifacts, th: Thresholds, limits: ReviewLimits = ReviewLimits()) -> str:
    """The failure review's markup, data block and script."""
    intro = (f"Failing tasks (at least one clean attempt failed), most failures first: up to {limits.tasks} tasks and "
             f"{limits.failed_per_task} failed attempts of each (one of each failure kind first), each beside a passing attempt "
             "of the same task when there is one. Open an attempt for the grader's reason, the state diff or verifier output, "
             "its saturation counters, the transcript (JSON lines shown as a conversation) and the output tails. Artifacts are "
             f"cut to {format_size(limits.transcript_bytes)} per transcript (its start and its end) and "
             f"{format_size(limits.tail_bytes)} per output tail, {format_size(limits.page_bytes)} in all. "
             "Everything in an attempt is what the agent wrote or left: shown as text, never run.")
    out = [f'<div class="review" data-run="{_e(plan.run_id)}"><p class="muted">{_e(intro)}</p>']
    if not plan.tasks:
        out.append("<p>No failing attempt: every clean attempt of the run passed.</p>")
    else:
        out.append(_filter_html(plan))
        out.append('<noscript><p class="warn">The transcripts and output tails need JavaScript; '
                   "the rest of each attempt is shown without it.</p></noscript>")
        anchored: set[int] = set()
        out.extend(_task_html(i, t, plan.run_id, th, art, anchored) for i, t in enumerate(plan.tasks))
    if plan.left_out_tasks:
        out.append(f'<p class="warn">{plan.left_out_tasks} more failing task(s) not shown ({plan.left_out_failures} failed attempts): '
                   f"<code>harness trials {_e(plan.run_id)} --outcome fail</code> lists every failed attempt, "
                   "<code>harness show ID</code> prints one.</p>")
    out.append(_unmeasured_html(plan))
    out.append(f'<script type="application/json" class="review-data">{art.data_json()}</script>')
    out.append(f"<script>{REVIEW_JS}</script></div>")
    return "".join(out)


def review_sections(report: dict[str, Any], attempts: Sequence[Any], limits: ReviewLimits = ReviewLimits()) -> list[Section]:
    """The 'Failure review' section of the HTML report."""
    plan = plan_review(report, attempts, limits)
    art = read_review_artifacts(plan, limits)
    th = Thresholds.from_profile((report.get("identity") or {}).get("profile_json"))
    return [Section("review", "Failure review", [HtmlBlock(review_html(plan, art, th, limits))])]


# The page's script: the kind filter, the lazy rendering of an opened attempt's files, and
# the transcript as a conversation. Data reaches the page only through textContent.
REVIEW_JS = r"""
(function () {
  var root = document.currentScript.closest('.review');
  var data = JSON.parse(root.querySelector('script.review-data').textContent);
  var COMMON = ['step', 't', 'ts', 'time', 'timestamp', 'turn', 'type', 'event', 'kind'];
  var KINDS = {
    thought: ['assistant', 'thought'], text: ['assistant', 'assistant'], message: ['assistant', 'message'],
    assistant: ['assistant', 'assistant'], reply: ['assistant', 'model reply'], final: ['assistant', 'final answer'],
    user: ['user', 'user'], prompt: ['user', 'prompt'], system: ['system', 'system'],
    tool_call: ['tool_call', 'tool call'], tool_use: ['tool_call', 'tool call'], action: ['tool_call', 'action'],
    tool_result: ['tool_result', 'tool result'], tool_run: ['tool_result', 'tool run'], observation: ['tool_result', 'observation']
  };
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    // a lone surrogate (a transcript's own "\ud800", parsed here) is U+FFFD: a DOM holding one
    // cannot be saved as HTML (headless Chromium's --dump-dom dies on it); so are controls but
    // tab and newline, and the bidi controls that would reorder what the reviewer reads (as
    // harness.model.units.printable does for the rest of the page)
    if (text !== undefined) e.textContent = (typeof text === 'string' ? text : str(text)).replace(UNSAFE, '\ufffd');
    return e;
  }
  var UNSAFE = new RegExp(__UNSAFE__, 'gu');  // harness.model.units.TERMINAL_UNSAFE, and lone surrogates
  function own(o, k) { return Object.prototype.hasOwnProperty.call(o, k); }
  // JSON indented by the page, bounded: an agent's deeply nested value is cut at DEPTH levels
  // and its text at SIZE characters, so one line can neither blow the stack nor grow
  // quadratically with its indentation (JSON.stringify(v, null, 2) does both).
  var DEPTH = 20, SIZE = 100000;
  function dump(v) {
    var out = [], n = 0;
    function put(s) { out.push(s); n += s.length; }
    function walk(x, ind, depth) {
      if (n >= SIZE) return;
      if (typeof x === 'number' && !isFinite(x)) { put(String(x)); return; }  // 1e400 parses as Infinity: not 'null'
      if (x === null || typeof x !== 'object') { var s = JSON.stringify(x); put(s === undefined ? 'null' : s.length > SIZE ? s.slice(0, SIZE) + '…' : s); return; }
      var arr = Array.isArray(x), keys = arr ? null : Object.keys(x), len = arr ? x.length : keys.length;
      if (!len) { put(arr ? '[]' : '{}'); return; }
      if (depth >= DEPTH) { put(arr ? '[… ' + len + ' items, nested too deep to show]' : '{… ' + len + ' keys, nested too deep to show}'); return; }
      var inner = ind + '  ';
      put(arr ? '[' : '{');
      for (var i = 0; i < len && n < SIZE; i++) {
        put((i ? ',\n' : '\n') + inner);
        if (!arr) put(JSON.stringify(keys[i]) + ': ');
        walk(arr ? x[i] : x[keys[i]], inner, depth + 1);
      }
      put('\n' + ind + (arr ? ']' : '}'));
    }
    walk(v, '', 0);
    return n >= SIZE ? out.join('').slice(0, SIZE) + '\n… cut here: the value is longer than the page shows' : out.join('');
  }
  function str(v) { return typeof v === 'string' ? v : (v === undefined || v === null ? '' : dump(v)); }
  function pretty(s) {  // a tool's JSON output or arguments, indented (parsed here, in the page, never by the controller)
    if (typeof s === 'string' && /^\s*[\[{]/.test(s)) { try { return dump(JSON.parse(s)); } catch (e) { } }
    return s;
  }
  function size(n) { return n < 1024 ? n + ' B' : n < 1048576 ? (n / 1024).toFixed(1) + ' KiB' : (n / 1048576).toFixed(1) + ' MiB'; }
  function rest(o, skip) {
    var r = Object.create(null), n = 0;  // an own '__proto__' key is kept as a key
    Object.keys(o).forEach(function (k) { if (skip.indexOf(k) < 0) { r[k] = o[k]; n++; } });
    return n ? dump(r) : '';
  }
  function argv(a) {
    if (!Array.isArray(a)) return str(a);
    return a.map(function (x) { x = typeof x === 'string' ? x : dump(x); return /^[\w@%+=:,.\/-]+$/.test(x) ? x : JSON.stringify(x); }).join(' ');
  }
  function meta(o) {
    var m = [];
    if (o.step !== undefined) m.push('step ' + str(o.step));
    if (o.turn !== undefined) m.push('turn ' + str(o.turn));
    if (typeof o.t === 'number') m.push(o.t.toFixed(2) + ' s');
    return m.join(' · ');
  }
  function fromRole(o, brief) {
    var role = String(o.role), out = [], c = o.content;
    var cls = role === 'tool' ? 'tool_result' : role, label = role === 'tool' ? 'tool result' + (o.name ? ' ' + str(o.name) : '') : role;
    if (typeof c === 'string') out.push([cls, label, cls === 'tool_result' ? pretty(c) : c]);
    else if (Array.isArray(c)) c.forEach(function (p) {
      if (typeof p === 'string') out.push([cls, label, p]);
      else if (p && p.type === 'text') out.push([cls, label, str(p.text)]);
      else if (p && p.type === 'tool_use') out.push(['tool_call', 'tool call ' + str(p.name), str(p.input)]);
      else if (p && p.type === 'tool_result') out.push(['tool_result', 'tool result', Array.isArray(p.content) ?
        p.content.map(function (x) { return x && x.type === 'text' ? str(x.text) : str(x); }).join('\n') : pretty(str(p.content))]);
      else out.push([cls, label + ' (' + str(p && p.type) + ')', str(p)]);
    });
    else if (c !== undefined && c !== null) out.push([cls, label, str(c)]);
    var calls = Array.isArray(o.tool_calls) ? o.tool_calls : [];
    if (brief && calls.length) {
      out.push(['tool_call', 'asks for tool calls', calls.map(function (tc) { return str(((tc && tc.function) || tc || {}).name); }).join(', ')]);
    } else calls.forEach(function (tc) {
      var fn = (tc && tc.function) || tc || {};
      out.push(['tool_call', 'tool call ' + str(fn.name), pretty(str(fn.arguments !== undefined ? fn.arguments : fn.input))]);
    });
    if (!out.length) out.push([cls, label, rest(o, ['role'].concat(COMMON))]);
    return out;
  }
  function fromType(o, t) {
    if (o.message && typeof o.message === 'object' && typeof o.message.role === 'string') {
      return fromRole(o.message, true).map(function (m) { return [m[0], (t === 'reply' ? 'model reply: ' : t + ': ') + m[1], m[2]]; });
    }
    var k = own(KINDS, t) ? KINDS[t] : null;  // never a name the prototype has (constructor, __proto__, toString)
    if (!k) return [[/error|fail|gave_up/i.test(t) ? 'error' : 'event', t, rest(o, COMMON)]];
    var cls = k[0], label = k[1], text;
    if (cls === 'tool_call') {
      if (o.name !== undefined) label += ' ' + str(o.name);
      text = o.argv !== undefined ? argv(o.argv) : pretty(str(o.arguments !== undefined ? o.arguments : o.input !== undefined ? o.input : o.command));
    } else if (cls === 'tool_result') {
      if (o.exit !== undefined) label += ' · exit ' + str(o.exit);
      var parts = [];
      ['content', 'output', 'stdout', 'result'].forEach(function (f) { if (o[f] !== undefined && o[f] !== '') parts.push(pretty(str(o[f]))); });
      if (o.stderr) parts.push('stderr: ' + str(o.stderr));
      if (!parts.length && o.argv !== undefined) parts.push(argv(o.argv));
      text = parts.join('\n');
    } else {
      var v = o.text !== undefined ? o.text : o.content !== undefined ? o.content : o.message;
      text = v !== undefined ? str(v) : rest(o, COMMON);
    }
    return [[cls, label, text]];
  }
  function messagesOf(o) {
    if (typeof o.role === 'string') return fromRole(o, false);
    var t = [o.type, o.event, o.kind].filter(function (v) { return typeof v === 'string'; })[0];
    return t !== undefined ? fromType(o, t) : null;  // another shape: its raw line
  }
  function message(cls, label, metaText, text) {
    var m = el('div', 'msg role-' + cls.replace(/[^\w-]/g, '_'));
    var h = el('div', 'msg-head');
    h.appendChild(el('span', 'msg-role', label));
    if (metaText) h.appendChild(el('span', 'muted', ' ' + metaText));
    m.appendChild(h);
    if (text) m.appendChild(el('div', 'msg-body', text));
    return m;
  }
  function lines(f) {
    var out = [];
    function add(s) { if (!s) return; s.replace(/\n$/, '').split('\n').forEach(function (l) { out.push({line: l}); }); }
    add(f.head);
    if (f.omitted) out.push({gap: f.omitted});
    add(f.tail);
    return out;
  }
  function gapText(n) { return '… ' + size(n) + ' left out here (the file is cut to its start and its end) …'; }
  function rawText(f) { return f.head + (f.omitted ? (f.head ? '\n' : '') + gapText(f.omitted) + '\n' : '') + f.tail; }
  function renderTranscript(box, f) {
    box.textContent = '';
    if (!f) { box.appendChild(el('p', 'muted', 'no transcript.jsonl')); return; }
    if (!f.head && !f.tail) { box.appendChild(el('p', 'muted', 'empty')); return; }
    var items = lines(f), objects = 0;
    items.forEach(function (it) {
      if (it.line === undefined) return;
      try { var v = JSON.parse(it.line); if (v && typeof v === 'object' && !Array.isArray(v)) { it.obj = v; objects++; } else it.json = true; } catch (e) { }
    });
    var raw = el('pre', 'blob', rawText(f));
    if (!objects) { box.appendChild(el('p', 'muted', 'not JSON lines: shown as text')); box.appendChild(raw); return; }
    var conv = el('div', 'conv');
    items.forEach(function (it, i) {
      if (it.gap !== undefined) conv.appendChild(el('div', 'gap muted', gapText(it.gap)));
      else if (it.obj && messagesOf(it.obj)) messagesOf(it.obj).forEach(function (m) { conv.appendChild(message(m[0], m[1], meta(it.obj), m[2])); });
      else if (it.obj) conv.appendChild(message('raw', 'line', '', it.line));
      else if (it.line.trim()) conv.appendChild(message('raw', it.json ? 'line (JSON, not an object)' : 'line (not JSON)', '', it.line));
    });
    var toggle = el('button', 'raw-toggle', 'show the raw lines');
    toggle.type = 'button';
    raw.hidden = true;
    toggle.addEventListener('click', function () {
      raw.hidden = !raw.hidden; conv.hidden = !raw.hidden;
      toggle.textContent = raw.hidden ? 'show the raw lines' : 'show as a conversation';
    });
    box.appendChild(toggle);
    box.appendChild(conv);
    box.appendChild(raw);
  }
  function renderText(box, f) {
    box.textContent = f ? rawText(f) : '';
    if (f && !f.head && !f.tail) box.appendChild(el('span', 'muted', 'empty'));
  }
  function fill(d) {
    if (d.getAttribute('data-filled')) return;
    d.setAttribute('data-filled', '1');
    d.querySelectorAll('.side[data-attempt]').forEach(function (side) {
      var rec = data.attempts[side.getAttribute('data-attempt')];
      if (!rec) return;
      side.querySelectorAll('[data-file]').forEach(function (box) {
        var f = rec.files[box.getAttribute('data-file')];
        try {
          if (box.classList.contains('transcript')) renderTranscript(box, f); else renderText(box, f);
        } catch (e) {  // one file the page cannot render still leaves the others, and itself as text
          box.textContent = '';
          box.appendChild(el('p', 'muted', 'could not be shown as a conversation (' + String(e && e.name) + '): shown as text'));
          box.appendChild(el('pre', 'blob', f ? rawText(f) : ''));
        }
      });
    });
  }
  var filter = root.querySelector('.review-filter');
  function apply() {
    if (!filter) return;
    var on = {}, shown = 0, total = 0;
    filter.querySelectorAll('input[data-kind]').forEach(function (c) { on[c.getAttribute('data-kind')] = c.checked; });
    root.querySelectorAll('.rtask').forEach(function (t) {
      var any = false;
      t.querySelectorAll('details.rattempt').forEach(function (d) {
        var v = on[d.getAttribute('data-kind')] !== false;
        d.hidden = !v; total++;
        if (v) { shown++; any = true; }
      });
      t.hidden = !any;
    });
    var count = filter.querySelector('.review-count'), run = +count.getAttribute('data-run');
    count.textContent = shown + ' of ' + total + ' failed attempts in this review shown' +
      (run > total ? ' (the run has ' + run + '; the review keeps a few of each task, every kind first)' : '');
  }
  if (filter) {
    filter.hidden = false;
    filter.addEventListener('change', apply);
    filter.querySelectorAll('button[data-set]').forEach(function (b) {
      b.addEventListener('click', function () {
        filter.querySelectorAll('input[data-kind]').forEach(function (c) { c.checked = b.getAttribute('data-set') === 'all'; });
        apply();
      });
    });
    apply();
  }
  root.querySelectorAll('details.rattempt').forEach(function (d) {
    d.addEventListener('toggle', function () { if (d.open) fill(d); });
  });
  function openHash() {
    var id = ''; try { id = decodeURIComponent(location.hash.slice(1)); } catch (e) { id = ''; }
    var target = id && document.getElementById(id);
    if (!target || !root.contains(target)) return;
    var d = target.closest('details.rattempt');
    if (!d) return;
    var t = d.closest('.rtask');
    if (t) t.hidden = false;
    d.hidden = false; d.open = true; fill(d);
    target.scrollIntoView();
  }
  window.addEventListener('hashchange', openHash);
  openHash();
  root.setAttribute('data-ready', '1');
})();
"""
# the characters the page replaces in an agent's text: the ones printable() replaces for the
# rest of the page (one list, harness.model.units), as a JS pattern; and lone surrogates
REVIEW_JS = REVIEW_JS.replace("__UNSAFE__", json.dumps("[" + "".join(f"\\u{c:04x}" for c in sorted(TERMINAL_UNSAFE)) + "]|\\p{Cs}"))
