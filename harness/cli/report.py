"""CLI commands that read the store: report, gate, compare.

Thin: open the store read-only, load the run and its attempts, call ``harness.report``,
print. Every figure is recomputed from the stored attempts on each call.
"""

from __future__ import annotations

import json
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Any, Optional, Sequence

import typer
from rich.console import Console
from rich.markup import escape

from harness.cli.app import DB_HELP, EXIT_FAIL, console, die, err
from harness.model.attempt import AttemptRecord
from harness.model.run import RunRecord
from harness.model.units import collector_paused


class ReportFormat(str, Enum):
    table = "table"
    json = "json"
    markdown = "markdown"
    html = "html"
    junit = "junit"


PRICES_HELP = ("Price table (TOML, USD per million tokens: \\[models.\"gpt-4o-mini\"] input = 0.15, output = 0.60, "
               "cached = 0.075) for the cost of model calls. Default: $HARNESS_PRICES. Without one, costs are unknown.")


def load_prices(path: Path | None) -> dict[str, dict[str, float]] | None:
    """The price table of --prices or $HARNESS_PRICES (None when neither); a bad file exits 2."""
    from harness.report.prices import prices_from_option

    return prices_from_option(path)


class CompareFormat(str, Enum):
    table = "table"
    json = "json"
    markdown = "markdown"


def _store(db: str | None) -> Any:
    from harness.store.store import Store

    return Store.open(db, mode="ro")


def _lean_sqlite(db: str | None, run_ref: str) -> tuple[RunRecord, Sequence[AttemptRecord], int] | None:
    """A report's read of a SQLite store without SQLAlchemy (``harness.store.fastread``): the
    run, its attempts' report fields and its late records; None when the store must answer."""
    from harness.store.fastread import report_read

    with collector_paused(freeze=True):  # as _load: what is loaded lives until exit
        return report_read(db, run_ref)


def _load(store: Any, run_ref: str, lean: bool = False) -> tuple[RunRecord, Sequence[AttemptRecord]]:
    """The run (id, unique prefix or `last`) and its attempts; unknown run -> exit 2. ``lean``:
    only the fields a report reads (REPORT_FIELDS), as an AttemptTable of columns, for every
    format but html."""
    from harness.store.store import REPORT_FIELDS

    run = store.get_run(run_ref)
    # what is loaded lives until exit: frozen, the cycle collector does not walk it again and
    # again while the report allocates (at 10^5 attempts that was most of the build time), nor
    # once more when it resumes (a full collection: 0.25 s)
    with collector_paused(freeze=True):
        attempts = store.attempts(run.id, REPORT_FIELDS if lean else None)
    return run, attempts


def _print_rich(renderable: Any, out: Optional[Path]) -> None:
    """Print to the terminal, or as plain wide text when piped or written to --out."""
    if out is not None:
        with out.open("w", encoding="utf-8") as f:
            Console(file=f, width=160, color_system=None, soft_wrap=False).print(renderable)
        return
    if console.is_terminal:
        console.print(renderable)
    else:
        Console(file=sys.stdout, width=_pipe_width(), color_system=None).print(renderable)


def _pipe_width() -> int:
    """Columns of text written to a pipe: $COLUMNS when it is set (as --help honours it), else 160."""
    try:
        return max(40, int(os.environ.get("COLUMNS", "")))
    except ValueError:
        return 160


def _emit(text: str | bytes, out: Optional[Path]) -> None:
    """Write ``text`` (str, or UTF-8 bytes as pydantic-core serializes: no decode of a large
    report only to encode it again) to ``out``, else to stdout with a final newline."""
    if out is None:
        if isinstance(text, bytes):
            sys.stdout.flush()
            sys.stdout.buffer.write(text if text.endswith(b"\n") else text + b"\n")
            sys.stdout.buffer.flush()
            return
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        return
    try:
        if isinstance(text, bytes):
            out.write_bytes(text)
        else:
            out.write_text(text, encoding="utf-8")
    except OSError as e:
        die(f"cannot write --out {out}: {e.strerror}; choose another path")


def _check_out(out: Optional[Path]) -> None:
    if out is not None and out.parent and not out.parent.exists():
        die(f"--out {out}: directory {out.parent} does not exist; create it or choose another path")


def report(
    run: str = typer.Argument("last", help="Run id, a unique prefix of it, or `last`."),
    fmt: ReportFormat = typer.Option(ReportFormat.table, "--format", "-f", help="table (terminal), json, markdown (PR comment), html (single file), junit (CI)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write to this file instead of stdout."),
    k: Optional[int] = typer.Option(None, "--k", help="The gate's k: junit fails a task whose pass^k < 1, and tasks sort by it. Default: the run's largest k."),
    prices: Optional[Path] = typer.Option(None, "--prices", help=PRICES_HELP),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Report one run, recomputed from its stored attempts.

    Nothing is cached: every figure comes from the attempts as stored now.

    Identity of the run; per-task ✓/✗ rows, worst first, with pass@1 and its
    Wilson CI, pass^k and failure kinds; suite pass@1 / pass@k / pass^k with
    CIs (tasks like these; this suite) beside the naive mean(p)^k; buckets; discarded
    attempts by reason and task (selection-bias warning for a task discarded
    far more than the rest); unmeasured slots; drift and overdispersion. For a run
    whose agents called a model through the gateway: calls, tokens spent (every
    attempt) and in scored attempts, upstream errors and discards, waiting time
    and, with --prices, cost (unknown where a model has no price).

    Examples:

      harness report last

      harness report r20261207-1419 --format markdown > comment.md

      harness report last --format html --out report.html

      harness report last --format junit --k 4 --out junit.xml

      harness report last --format json | jq '.suite.by_k'

      harness report last --prices prices.toml --format markdown
    """
    from harness.report.build import build_report, check_k
    from harness.report.render import render_html, render_junit, render_markdown, render_table

    _check_out(out)
    if fmt is ReportFormat.html and out is None and sys.stdout.isatty():  # a 2 MB page is not for a terminal
        die("--format html writes a self-contained page of a few MB: give --out report.html (or pipe it: > report.html)")
    table = load_prices(prices)
    store: Any = None
    got = _lean_sqlite(db, run) if fmt is not ReportFormat.html else None
    if got is not None:
        row, attempts, late = got
    else:
        store = _store(db)
        row, attempts = _load(store, run, lean=fmt is not ReportFormat.html)
        late = len(store.late_attempts(row.id))
    if k is not None:
        problem = check_k(row, k)
        if problem:
            die(f"--k {k}: {problem}")
    with collector_paused(freeze=True):  # the report lives until exit, as the attempts do
        report_ = build_report(row, attempts, k=k, prices=table, late=late)
    if fmt is ReportFormat.json:  # serialized by pydantic-core (the values of data(); small floats may print as 0.00008)
        _emit(type(report_).__pydantic_serializer__.to_json(report_, by_alias=True, indent=2), out)  # model_dump_json, as bytes
        if out is not None:
            err.print(f"wrote {fmt.value} report of run {row.id} to {out}", highlight=False)
        return
    data = report_.data()
    if fmt is ReportFormat.table:
        _print_rich(render_table(data), out)
    elif fmt is ReportFormat.markdown:
        _emit(render_markdown(data), out)
    elif fmt is ReportFormat.html:
        from harness.report.figures import figure_sections, head_html
        from harness.report.review import review_sections

        sections = [*figure_sections(data, attempts, _sweep_of(store, row)), *review_sections(data, attempts)]
        _emit(render_html(data, extra_sections=sections, head_html=head_html()), out)
    else:
        _emit(render_junit(data), out)
    if out is not None:
        err.print(f"wrote {fmt.value} report of run {row.id} to {out}", highlight=False)


def _sweep_of(store: Any, row: RunRecord) -> dict[str, Any] | None:
    """The sweep a run belongs to, summarised per envelope (for the score-vs-envelope figure)."""
    if not row.sweep_id:
        return None
    from harness.core.sweep import generosity, profile_result, summarize_profile

    results = [profile_result(r, store.attempts(r.id)) for r in store.runs_in_sweep(row.sweep_id)]
    results.sort(key=lambda r: generosity(r.profile))
    ks = list(row.ks)
    return {"sweep_id": row.sweep_id, "ks": ks, "profiles": [summarize_profile(r, ks) for r in results]}


def gate(
    run: str = typer.Argument(..., help="Run id, a unique prefix of it, or `last`."),
    require: list[str] = typer.Option([], "--require", "-r", help="Suite requirement METRIC OP VALUE, e.g. 'pass^4>=0.9' (repeatable)."),
    per_task: list[str] = typer.Option([], "--per-task", help="CONDITION:SHARE, e.g. 'pass^4==1:0.9' = at least 90% of tasks reach pass^4 == 1 (repeatable)."),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="Fail on any task that passed every trial in this run and no longer does, or that this run does not have."),
    confidence: Optional[float] = typer.Option(None, "--confidence", help="Gate suite requirements on the one-sided bound at this "
                                               "confidence (e.g. 0.95: the lower bound for >=) instead of the point estimate."),
    estimand: Optional[str] = typer.Option(None, "--estimand", help="With --confidence: 'tasks' (tasks like these; the default) or "
                                           "'suite' (this fixed suite, trial noise only)."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    allow_incomplete: bool = typer.Option(False, "--allow-incomplete", help="Judge a run in progress or interrupted on the "
                                          "slots measured so far (by default its slots not run yet fail the gate)."),
    json_out: bool = typer.Option(False, "--json", help="Print the checks as JSON."),
) -> None:
    """Check a run against requirements (exit 1 if one fails).

    Exit codes: 0 every requirement holds, 1 one does not (or a task has no clean trial, or
    slots have not run), 2 a usage error (no such run, a k the run did not fix).

    METRIC OP VALUE: METRIC is pass@K or pass^K (pass@1 = single-try rate),
    OP one of >= > <= < ==, VALUE in [0, 1]; K may be any k up to the run's trials (the
    requirement is written into CI before the run, so it is not chosen after).
    Suite figures average per-task estimates over tasks with at least K clean
    trials; a task with fewer than K (but some) clean trials counts at its
    worst (0 for >=). By default the point estimate is judged; with
    --confidence 0.95 the one-sided 95% bound is (the message says which).
    Unmeasured slots are never counted; a task with no clean trial at all
    fails the gate (it is in no figure), and so does a metric that cannot be
    computed. A run in progress or interrupted fails while slots are
    not run yet (`harness run --resume RUN` runs them; --allow-incomplete
    judges what is measured). Usage errors (bad requirement, k not
    measured, unknown run) exit 2.

    Examples:

      harness gate last --require 'pass^4>=0.9'

      harness gate last --require 'pass@1>=0.8' --require 'pass^8>=0.5'

      harness gate last --require 'pass^4>=0.9' --confidence 0.95

      harness gate last --per-task 'pass^4==1:0.9'

      harness gate last --baseline r20261207-1419 --require 'pass^4>=0.9'
    """
    from harness.report.build import check_k
    from harness.report.gate import parse_per_task, parse_requirement

    if confidence is not None and not 0.5 < confidence < 1:
        die(f"--confidence {confidence:g}: use a level strictly between 0.5 and 1, e.g. 0.95")
    if estimand is not None and estimand not in ("tasks", "suite"):
        die(f"--estimand {estimand!r}: use 'tasks' (tasks like these) or 'suite' (this fixed suite)")
    if estimand is not None and confidence is None:
        die("--estimand chooses the interval a --confidence bound is read from; pass --confidence too")
    if confidence is not None and not require:
        die("--confidence bounds a suite requirement: give --require 'pass^4>=0.9' with it (--per-task and --baseline judge counts)")
    estimand = estimand or "tasks"
    if not require and not per_task and baseline is None:
        die("nothing to check: pass --require 'pass^4>=0.9', --per-task 'pass^4==1:0.9' or --baseline RUN")
    try:
        reqs = [parse_requirement(r) for r in require]
        pts = [(parse_per_task(p), p) for p in per_task]
    except ValueError as e:
        die(str(e))
    store = _store(db)
    row, attempts = _load(store, run)
    for req in [*reqs, *(r for (r, _), _ in pts)]:
        problem = check_k(row, req.k, fixed_only=False)
        if problem:
            die(f"requirement {req.text!r}: {problem}")
    brow, battempts = _load(store, baseline) if baseline is not None else (None, [])
    checks, notes = judge(row, attempts, reqs, pts, confidence, estimand, brow, battempts, baseline, allow_incomplete)
    if json_out:
        print(json.dumps(gate_doc(row, checks, notes), indent=2, ensure_ascii=False))
    else:
        print_gate(row, checks, notes)
    if any(not c.ok for c in checks):
        raise typer.Exit(EXIT_FAIL)


def judge(row: RunRecord, attempts: list[Any], reqs: list[Any], pts: list[tuple[tuple[Any, float], str]],
          confidence: float | None = None, estimand: str = "tasks", brow: RunRecord | None = None,
          battempts: list[Any] = (), baseline: str | None = None, allow_incomplete: bool = False) -> tuple[list[Any], list[str]]:
    """The gate's checks of a run (and its notes); a bad --baseline exits 2. A run with slots
    not run yet (in progress or interrupted) fails unless ``allow_incomplete``: a release gate
    that passes on the first half of a suite has not judged the suite."""
    from harness.core.aggregate import task_outcomes
    from harness.report.gate import GateCheck, check_baseline, check_measured, check_pending, check_per_task, check_requirement

    outs = task_outcomes(row, attempts)
    checks = [check_requirement(r, outs, confidence, estimand) for r in reqs]
    checks += [check_per_task(r, share, outs, text) for (r, share), text in pts]
    unmeasured = check_measured(outs, row.id, row.status)
    if unmeasured is not None:
        checks.append(unmeasured)
    pending = check_pending(outs, row.id, row.status)
    if pending is not None and not allow_incomplete:
        checks.append(pending)
    if row.excluded:  # a task that could not run is not a task that passed
        checks.append(GateCheck("every task ran", False, f"{len(row.excluded)} task(s) of the suite could not run here and are in "
                                "no figure", [f"{t}: {why.splitlines()[0][:200]}" for t, why in sorted(row.excluded.items())]))
    notes: list[str] = []
    if row.status != "complete" and (allow_incomplete or pending is None):
        notes.append(f"run {row.id} is {row.status}; judging the slots measured so far")
    # what the report warns of the sample the figures rest on, said where CI reads it too
    from harness.report.build import build_report

    notes += [w for w in build_report(row, attempts).warnings if w.startswith("selection-bias")]
    if brow is not None:
        if brow.id == row.id:
            die(f"--baseline {baseline} is run {row.id} itself; pass an earlier run")
        if brow.suite != row.suite:
            die(f"--baseline {brow.id} ran suite {brow.suite}, run {row.id} ran suite {row.suite}; a baseline must be a run of the same suite")
        if brow.suite_hash != row.suite_hash:
            notes.append(f"baseline {brow.id} ran suite {brow.suite} ({brow.suite_hash}), this run {row.suite} ({row.suite_hash}); tasks matched by id")
        bouts = task_outcomes(brow, list(battempts))
        checks.append(
            check_baseline(bouts, outs, brow.id, marks={t.task_id: t.marks() for t in outs},
                           base_marks={t.task_id: t.marks() for t in bouts})
        )
    return checks, notes


def gate_doc(row: RunRecord, checks: list[Any], notes: list[str]) -> dict[str, Any]:
    return {"run_id": row.id, "ok": all(c.ok for c in checks), "checks": [c.as_dict() for c in checks], "notes": notes}


def print_gate(row: RunRecord, checks: list[Any], notes: list[str]) -> None:
    failed = [c for c in checks if not c.ok]
    for n in notes:
        err.print(f"[yellow]note:[/] {escape(n)}", highlight=False)
    for c in checks:
        mark = "[green]ok  [/]" if c.ok else "[bold red]FAIL[/]"
        console.print(f"{mark} {escape(c.name)}: {escape(c.message)}", highlight=False, soft_wrap=True)
        for d in c.details:
            console.print(f"       {d}", highlight=False, soft_wrap=True, markup=False)
    if failed:
        console.print(f"[bold red]gate failed[/]: {len(failed)} of {len(checks)} check(s) unmet for run {row.id}", highlight=False)
    else:
        console.print(f"[bold green]gate passed[/]: {len(checks)} check(s) hold for run {row.id}", highlight=False)


def compare(
    run_a: str = typer.Argument(..., help="Baseline run (id, unique prefix or `last`)."),
    run_b: str = typer.Argument(..., help="Candidate run; deltas are B − A."),
    allow_mismatch: bool = typer.Option(False, "--allow-mismatch", help="Compare even when the suite or profile differ."),
    fmt: CompareFormat = typer.Option(CompareFormat.table, "--format", "-f", help="table, json or markdown."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Paired comparison of two runs on their common tasks (deltas B − A).

    Per-task deltas; suite deltas (pass@1, pass@k, pass^k) with the noise
    floor -- how far each moves on these tasks and trial counts when nothing
    changed -- and the interval and p-value of one stratified permutation
    test, adjusted for every metric shown (beyond the floor <=> CI excludes
    0 <=> adjusted p <= 0.05); the A/A floor from stored runs with A's
    identity when there are any; tasks only in A or B. Warns when seeds,
    agent, images or machines differ. Refuses (exit 2) when the suite
    (name or hash) or the profile differ, saying what differs, unless
    --allow-mismatch; other identity differences (image digest, agent,
    harness version, host, cgroup version) are printed as warnings.

    Examples:

      harness compare r20261207-1419 last

      harness compare r20261207-14 r20261208-09 --format markdown > c.md

      harness compare r20261207-1419 last --allow-mismatch --format json
    """
    from harness.report.compare import build_comparison, identity_differences
    from harness.report.render import render_comparison_markdown, render_comparison_table

    store = _store(db)
    a, att_a = _load(store, run_a)
    b, att_b = _load(store, run_b)
    if a.id == b.id:
        die(f"run {a.id} compared with itself; pass two different runs")
    blocking, _ = identity_differences(a, b, att_a, att_b)
    if blocking and not allow_mismatch:
        die(f"runs {a.id} and {b.id} are not comparable: " + "; ".join(blocking) + " -- pass --allow-mismatch to compare anyway")
    if a.trials != b.trials:  # only for runs that will be compared
        err.print(
            f"[yellow]warning:[/] runs have {a.trials} and {b.trials} trials per task; per-task rates are comparable, "
            "pass^k intervals are not equally tight",
            highlight=False,
        )
    try:
        stored = [(r, store.attempts(r.id)) for r in store.runs_with_identity(a.identity_hash) if r.id not in (a.id, b.id)] \
            if a.identity_hash else []
        data = build_comparison(a, att_a, b, att_b, stored=stored)
    except ValueError as e:  # no common measured task
        die(str(e).removeprefix("compare_runs: "))
    if fmt is CompareFormat.json:
        for w in data["identity"]["warnings"]:  # the table and markdown show them inline
            err.print(f"[yellow]warning:[/] {escape(w)}", highlight=False, soft_wrap=True)
        print(json.dumps(data, indent=2, ensure_ascii=False))
    elif fmt is CompareFormat.markdown:
        sys.stdout.write(render_comparison_markdown(data))
    else:
        _print_rich(render_comparison_table(data), None)


def register(app: typer.Typer) -> None:
    app.command()(report)
    app.command()(gate)
    app.command()(compare)
