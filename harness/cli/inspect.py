"""CLI commands to inspect attempts: trials, show, samples, gc.

Thin: look the records up (read-only), hand them to ``harness.report.views`` for the row
building, field docs and terminal chart, print. Nothing here writes to the store except
``gc`` (``harness.engine.gc``).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

import typer
from rich.markup import escape
from rich.panel import Panel
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from harness.cli.app import DB_HELP, EXIT_FAIL, console, die, err
from harness.cli.report import PRICES_HELP, load_prices
from harness.report.views import (
    SAMPLE_COLUMNS,
    SAMPLE_FIELDS,
    TRIAL_FIELDS,
    Thresholds,
    call_rows,
    chart,
    csv_value,
    derive_series,
    diff_lines,
    diff_row_lines,
    diff_summary,
    egress_rows,
    envelope_rows,
    fields_help,
    fields_text,
    headline,
    overlapping,
    parse_age,
    printable,
    pct,
    rule_value,
    sort_rows,
    trial_row,
    upstream_lines,
)
from harness.model.units import did_you_mean, format_size, one_line, plural, printable_line
from harness.report.artifacts import ARTIFACT_FILES, OPTIONAL_FILES, read_artifacts
from harness.report.usage import attempt_usage



def _open(db: str | None) -> Any:
    """The store for reading: nothing is written (not even a schema upgrade)."""
    from harness.store.store import Store

    return Store.open(db, mode="ro")


def _run_or_die(store: Any, run_id: str) -> Any:
    return store.get_run(run_id)


def _attempt_id(s: str) -> int:
    try:
        return int(s)
    except ValueError:
        die(f"attempt {s!r}: expected a numeric attempt id or `last`; list them with `harness trials RUN`")
    raise AssertionError  # unreachable: die raises


def _jsonable(v: Any) -> Any:
    if isinstance(v, dt.datetime):
        return v.isoformat()
    return v


# ----------------------------------------------------------------------------- trials

TRIALS_HELP = f"""One row per attempt of a run, with every saturation counter.

Verdict and reasons, outcome and failure kind, exit code, wall time, cpuset, CPU, throttling, memory, OOM kills, pids, foreign CPU, host pressure and steal. Values over their threshold stand out in color (throttled share over 10% or the profile's throttled_share rule, memory peak over 90% of the ceiling, any memory limit hit, OOM kill or pids limit hit, foreign CPU / steal / host pressure over the profile's SLA thresholds).

Examples:

  harness trials last

  harness trials r20250101-120000-ab12 --verdict discarded

  harness trials last --outcome fail --sort=-throttled_share

  harness trials last --csv > trials.csv

  harness trials last --prices prices.toml --sort=-cost_usd

For attempts whose agent called a model through the gateway, the table adds calls, tokens in/out ("-" = not reported, never 0), upstream errors, waiting time beside the agent's wall time and, with --prices, cost.

  harness trials --fields

Fields of --json / --csv (name, unit, meaning; "fraction" is a share 0..1):

{fields_help(TRIAL_FIELDS)}
"""


def trials(
    run: Optional[str] = typer.Argument(None, help="Run id, unique prefix or `last` (default: last)."),
    task: list[str] = typer.Option([], "--task", "-t", help="Only this task (repeatable)."),
    verdict: Optional[str] = typer.Option(None, "--verdict", help="Only `clean` or `discarded` attempts."),
    outcome: Optional[str] = typer.Option(None, "--outcome", help="Only `pass` or `fail` (clean attempts)."),
    sort: Optional[str] = typer.Option(
        None, "--sort", help="Sort by any field (see --fields); a leading '-' sorts descending, e.g. --sort=-wall_s."
    ),
    json_out: bool = typer.Option(False, "--json", help="JSON list of rows (field names of --fields)."),
    csv_out: bool = typer.Option(False, "--csv", help="CSV with a header row (field names of --fields)."),
    show_fields: bool = typer.Option(False, "--fields", help="Print every field with its unit and meaning, then exit."),
    prices: Optional[Path] = typer.Option(None, "--prices", help=PRICES_HELP),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    if show_fields:
        print(fields_text(TRIAL_FIELDS))
        return
    if json_out and csv_out:
        die("--json and --csv: pick one output format")
    if verdict is not None and verdict not in ("clean", "discarded"):
        die(f"--verdict {verdict!r}: expected clean or discarded")
    if outcome is not None and outcome not in ("pass", "fail"):
        die(f"--outcome {outcome!r}: expected pass or fail")
    table_prices = load_prices(prices)
    store = _open(db)
    r = _run_or_die(store, run or "last")
    unknown = [t for t in task if t not in (r.task_ids or [])]
    if unknown:
        hint = did_you_mean(unknown[0], r.task_ids or []) if len(unknown) == 1 else ""
        die(f"run {r.id} has no task {', '.join(unknown)}{hint}; its tasks: {', '.join(r.task_ids or []) or 'none'}")
    th = Thresholds.from_profile(r.profile_json)
    rows = [trial_row(a, th, table_prices) for a in store.attempts(r.id)]
    if task:
        rows = [x for x in rows if x["task"] in task]
    if verdict:
        rows = [x for x in rows if x["verdict"] == verdict]
    if outcome:
        rows = [x for x in rows if x["verdict"] == "clean" and x["outcome"] == outcome]  # a discarded attempt may have been graded: never scored
    if sort:
        try:
            rows = sort_rows(rows, sort, TRIAL_FIELDS)
        except ValueError as e:
            die(str(e))
    if json_out:
        print(json.dumps(rows, indent=2, default=_jsonable))
        return
    if csv_out:
        w = csv.DictWriter(sys.stdout, fieldnames=list(TRIAL_FIELDS), lineterminator="\n")
        w.writeheader()
        for x in rows:
            w.writerow({k: csv_value(v) for k, v in x.items()})
        return
    from harness.report.views import trials_table

    if not rows:
        err.print(f"run {r.id}: no attempts match the filters", highlight=False)
        return
    title = f"run {r.id} · {r.suite} · profile {r.profile} · {len(rows)} attempt(s)"
    table, hidden = trials_table(rows, th, title, width=console.width, priced=table_prices is not None)
    console.print(table)
    if hidden:
        console.print(f"[dim]left out for width: {', '.join(hidden)} (widen the terminal, or --json / --csv for every field)[/]")
    console.print("[dim]details of one attempt: harness show ID   fields: harness trials --fields[/]")


# ----------------------------------------------------------------------------- show


def _attempt_dict(a: Any) -> dict[str, Any]:
    return a.model_dump(mode="json")


def _phases_text(phases: list[dict[str, Any]]) -> str:
    """The attempt's phases in order, each at its start (s after the attempt began) and for how
    long: "sandbox +0.00 0.17s · lane +0.17 0.02s · setup ...". A `lane` phase is a wait for the
    attempt before it on the same cores."""
    if not phases:
        return "- (not recorded: an older record)"

    def secs(v: Any) -> str:  # whatever the store holds (a record changed outside harness)
        return f"{v:.2f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else "?"

    return " · ".join(f"{one_line(str(p.get('name', '?')), 24)} +{secs(p.get('start_s'))} {secs(p.get('wall_s'))}s"
                      for p in phases if isinstance(p, dict))


def show(
    attempt: str = typer.Argument(..., help="Attempt id (see `harness trials RUN`), or `last`: the newest attempt of the newest run."),
    json_out: bool = typer.Option(False, "--json", help="The whole record as one JSON document."),
    prices: Optional[Path] = typer.Option(None, "--prices", help=PRICES_HELP),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Everything about one attempt, including why it was discarded.

    Identity, envelope (profile vs read back), counters, SLA rule results, grader reason and checks, the state diff against the fixture,
    stdout / stderr / transcript tails and the saturation time series as a chart. An attempt whose agent called a model through
    the gateway adds its model calls (one line each, the first 50), the upstream summary (working time = agent wall − waiting time)
    and, under an allowlist policy, the egress log.

    A discarded attempt starts with the breached rule, its measured value and threshold.

    Examples:

      harness show 42

      harness show last

      harness show 42 --json | jq .headline

      harness show 42 --db sqlite:///other/harness.db
    """
    aid = None if attempt == "last" else _attempt_id(attempt)
    table_prices = load_prices(prices)
    store = _open(db)
    if aid is None:
        aid = store.last_attempt_id(store.get_run("last").id)
    a = store.get_attempt(aid)
    r = store.get_run(a.run_id)
    siblings = store.attempts(a.run_id)
    samples = store.samples(a.id)
    th = Thresholds.from_profile(r.profile_json)
    env = a.envelope or {}
    series = derive_series(samples, env.get("cpus"), env.get("cores"), a.memory_max, a.pids_max)
    arts = read_artifacts(a.artifacts)
    beside = overlapping(a, siblings)
    doc = {
        "headline": headline(a),
        "attempt": _attempt_dict(a),
        "run": {
            "id": r.id, "suite": r.suite, "profile": r.profile, "status": r.status, "image": r.image,
            "image_digest": r.image_digest, "created_at": _jsonable(r.created_at), "identity_hash": r.identity_hash,
            "cgroup_version": r.cgroup_version,
        },
        "beside": beside,
        "trial_row": trial_row(a, th, table_prices),
        "usage": attempt_usage(a, table_prices),
        "envelope": envelope_rows(a, r.profile_json),
        "state_diff_summary": diff_summary(a.state_diff),
        "artifacts": arts,
        "samples_count": len(samples),
        "series": series,
    }
    if json_out:
        print(json.dumps(doc, indent=2, default=_jsonable))
        return
    _print_show(a, r, doc, th, table_prices)


def _image_text(image: str, digest: str | None) -> str:
    """The image, and its digest when that says more (a tag's); an image id once."""
    return image if not digest or digest == image or image.endswith(digest) else f"{image}  {digest}"


def _n(v: Any) -> str:
    return "-" if v is None else str(v)


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f} s"


def _kv_table(rows: list[tuple[str, Any]]) -> Table:
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    for k, v in rows:
        t.add_row(k, v if isinstance(v, Text) else Text(str(v)))
    return t


def _print_show(a: Any, r: Any, doc: dict[str, Any], th: Thresholds, prices: dict | None = None) -> None:
    c = console
    tr = doc["trial_row"]
    sat = set(tr["saturated"])
    c.print(Rule(f"attempt {a.id} · {a.task_id} · trial {a.slot} · attempt {a.attempt_no}", align="left"))
    hl = doc["headline"]
    style = "bold yellow" if a.verdict == "discarded" else ("bold green" if a.outcome == "pass" else "bold red")
    c.print(Text(printable_line(hl), style=style))
    if a.error:
        last = a.error.strip().splitlines()[-1][:500]
        if last not in hl:  # an infra error is already the headline
            # a clean attempt's error field holds notes only (capped evidence, masked secrets): an
            # infrastructure error always discards
            note = a.verdict == "clean" or last.startswith("slot unmeasured")
            c.print(Text(("note: " if note else "error: ") + printable(last), style="yellow" if note else "red"))

    c.print(Rule("identity", style="dim", align="left"))
    concurrent = f"{a.concurrent} in flight at start"
    concurrent += f"; overlapped attempts {', '.join(map(str, doc['beside']))}" if doc["beside"] else "; none overlapped"
    c.print(_kv_table([
        ("run", f"{r.id}  ({r.suite}, profile {r.profile}, {r.status})"),
        ("task / slot / attempt", f"{a.task_id} / {a.slot} / {a.attempt_no}"),
        ("seed", a.seed),
        ("container", a.container or "- (never started)"),
        ("image", _image_text(a.image or r.image, (r.images or {}).get(a.task_id) or r.image_digest)),
        ("cpuset", a.cpuset or "-"),
        ("node", _node_text(a.node or {})),
        ("beside it", concurrent),
        ("started / finished", f"{a.started_at:%Y-%m-%d %H:%M:%S} / {a.finished_at:%H:%M:%S} UTC"),
        ("wall / agent / setup / grade", " / ".join("-" if v is None else f"{v:.2f}s" for v in (a.wall_s, a.agent_wall_s, a.setup_wall_s, a.grade_wall_s))),
        ("phases", _phases_text(a.phases or [])),
        ("artifacts", a.artifacts or "-"),
    ]))

    c.print(Rule("envelope: profile vs read back from the kernel", style="dim", align="left"))
    et = Table(show_edge=False, pad_edge=False)
    for col in ("setting", f"profile {r.profile}", "this attempt", "read back", ""):
        et.add_column(col, no_wrap=col != "setting")
    for e in doc["envelope"]:
        mark = Text("-", style="dim") if e["match"] is None else (Text("ok", style="green") if e["match"] else Text("DIFFERS", style="bold red"))
        et.add_row(e["setting"], e["profile"] or "-", e["attempt"] or "-", e["applied"] or "not read", mark)
    c.print(et)

    c.print(Rule("counters (agent phase)", style="dim", align="left"))

    def hot(s: str, flag: str) -> Text:
        return Text(s, style="bold red" if flag in sat else "")

    c.print(_kv_table([
        ("cpu used", f"{_secs(tr['cpu_s'])}  ({pct(tr['cpu_quota_share'])} of quota)"),
        ("throttled", hot(f"{_secs(tr['throttled_s'])} ({pct(tr['throttled_share'])} of wall); periods {_n(a.nr_throttled)} of {_n(a.nr_periods)}", "throttled")),
        ("memory peak / ceiling", hot(f"{format_size(a.memory_peak)} / {format_size(a.memory_max)} ({pct(tr['memory_peak_share'])})", "memory")),
        ("memory limit hits / high events", hot(f"{_n(a.memory_limit_hits)} / {_n(a.memory_high_events)}", "memory_limit")),
        ("oom kills", hot(_n(a.oom_kills), "oom")),
        ("pids peak / limit / hits", hot(f"{_n(a.pids_peak)} / {_n(a.pids_max)} / {_n(a.pids_limit_hits)}", "pids")),
        ("cgroup psi cpu / mem / io some", " / ".join("-" if v is None else f"{v:.3f}s" for v in (tr["psi_cpu_some_s"], tr["psi_memory_some_s"], tr["psi_io_some_s"]))),
        ("foreign cpu on pinned cores", hot(pct(a.foreign_cpu_share), "foreign_cpu")),
        ("steal", hot(pct(a.steal_share), "steal")),
        ("host psi cpu / mem / io", f"{pct(a.host_psi_cpu)} / {pct(a.host_psi_memory)} / {pct(a.host_psi_io)}"),
        ("host MemAvailable min", format_size(a.mem_available_min)),
    ]))

    _print_gateway(a, doc, prices)

    c.print(Rule("SLA rules", style="dim", align="left"))
    if a.rules:
        rt = Table(show_edge=False, pad_edge=False)
        for col in ("rule", "scope", "value", "threshold", "breached"):
            rt.add_column(col, no_wrap=True)
        rt.add_column("detail", overflow="fold")
        for x in a.rules:
            b = bool(x.get("breached"))
            st = "bold red" if b else ""
            rt.add_row(
                Text(x.get("rule", "?"), style=st), x.get("scope", "-"),
                Text(rule_value(x.get("rule", ""), x.get("value")), style=st),
                rule_value(x.get("rule", ""), x.get("threshold")),
                Text("BREACHED", style=st) if b else Text("no", style="green"),
                Text(x.get("detail") or ""),
            )
        c.print(rt)
    else:
        c.print(Text("no rules recorded", style="dim"))

    c.print(Rule("grade", style="dim", align="left"))
    if a.verdict == "discarded" and not a.grade_checks:
        c.print(Text("not graded (discarded before grading)" if not a.grade_reason else a.grade_reason, style="dim"))
    else:
        oc = a.outcome or "-"
        kind = f" ({a.failure_kind})" if a.failure_kind else ""
        graded = Text(f"{oc}{kind}", style="green" if a.outcome == "pass" else "red")
        if a.verdict == "discarded":
            graded = Text.assemble("graded ", graded, Text(" — not counted: the attempt was discarded", style="yellow"))
        c.print(graded, Text(f"  exit {a.exit_code}, terminated cleanly {a.terminated_cleanly}, timed out {a.timed_out}"))
        if a.grade_reason:
            c.print(Text("reason: " + printable_line(a.grade_reason)))
        for ch in a.grade_checks or []:
            mark = Text("✓ ", style="green") if ch.get("passed") else Text("✗ ", style="red")
            c.print(Text.assemble("  ", mark, printable_line(f"{ch.get('name')} [{ch.get('kind')}]"),
                                  (printable_line(f" — {ch['detail']}") if ch.get("detail") else "")))

    _print_verifier_and_services(a, r)
    c.print(Rule("state diff vs fixture (what the agent changed)", style="dim", align="left"))
    if isinstance((a.state_diff or {}).get("files"), dict):
        fd = a.state_diff["files"]
        c.print(Text(f"{fd.get('total', 0)} path(s) differ from the fixture" if fd.get("total") else "no changes"))
        for line in diff_lines(a.state_diff):
            c.print(Text("  " + printable_line(line)))
    elif a.reward is not None and not doc["state_diff_summary"]:
        c.print(Text("judged by a verifier: see its output below and the evidence in the artifacts folder", style="dim"))
    elif not doc["state_diff_summary"]:
        if a.grade_status == "ungradable":
            c.print(Text("not available: the final state could not be read (see the grade above)", style="dim"))
        else:
            c.print(Text("no changes" if a.grade_checks else "no final state recorded", style="dim"))
    else:
        dt_ = Table(show_edge=False, pad_edge=False)
        for col in ("table", "status", "added", "removed", "changed"):
            dt_.add_column(col, justify="left" if col in ("table", "status") else "right")
        for d in doc["state_diff_summary"]:  # table names come from the agent's state: never markup
            dt_.add_row(Text(printable_line(str(d["table"]))), Text(printable_line(str(d["status"]))), f"+{d['added']}", f"-{d['removed']}", f"~{d['changed']}")
        c.print(dt_)
        for line in diff_lines(a.state_diff) + diff_row_lines(a.state_diff):
            c.print(Text("  " + printable_line(line)))

    for name in ARTIFACT_FILES:
        tail = doc["artifacts"]["tails"].get(name)
        title = f"{name} (tail)"
        if tail is None and name in OPTIONAL_FILES:
            continue
        if tail is None:
            c.print(Rule(title, style="dim", align="left"))
            c.print(Text("not present" + ("" if a.artifacts and Path(a.artifacts).exists() else " (artifacts folder gone; `harness gc` may have removed it)"), style="dim"))
        elif tail.strip():
            c.print(Panel(Text(tail), title=title, title_align="left", border_style="dim", expand=True))
        else:
            c.print(Rule(title, style="dim", align="left"))
            c.print(Text("empty", style="dim"))

    c.print(Rule(f"saturation over time ({doc['samples_count']} samples)", style="dim", align="left"))
    c.print(chart(doc["series"], th, a.memory_max, width=max(20, min(80, c.width - 40))))
    c.print(Text(f"raw samples: harness samples {a.id} --csv", style="dim"))


def _print_gateway(a: Any, doc: dict[str, Any], prices: dict | None) -> None:
    """The model gateway's record of the attempt: summary, calls, egress log (only when present)."""
    c = console
    u = doc.get("usage")
    if u is not None:
        c.print(Rule("model gateway (upstream summary)", style="dim", align="left"))
        c.print(_kv_table([(k, Text(printable(v))) for k, v in upstream_lines(u, a.agent_wall_s)]))
        rows, more = call_rows(list(a.model_calls or []), prices)
        c.print(Rule(f"model calls ({len(a.model_calls or [])} recorded)", style="dim", align="left"))
        if rows:
            ct = Table(show_edge=False, pad_edge=False)
            cols = ["#", "provider", "model", "status", "queued", "latency", "ttfb", "tokens in/out/cached", "retries"] + (["cost"] if prices is not None else []) + ["detail"]
            for col in cols:
                ct.add_column(col, no_wrap=col != "detail", overflow="fold",
                              justify="right" if col in ("#", "queued", "latency", "ttfb", "retries", "cost") else "left")
            for x in rows:  # model names and details come from the gateway's record: never markup
                st = "bold red" if x["error"] else ""
                cells = [x["n"], Text(printable_line(x["provider"])), Text(printable_line(x["model"])),
                         Text(x["status"] + (" stream" if x["stream"] else ""), style=st), x["queued"] or "-",
                         x["latency"], x["ttfb"], x["tokens"], x["retries"]] + ([x["cost"]] if prices is not None else [])
                ct.add_row(*cells, Text(printable_line(x["detail"])))
            c.print(ct)
            if more:
                c.print(Text(f"… {more} more call(s): harness show {a.id} --json for every call", style="dim"))
        else:
            c.print(Text("no call recorded", style="dim"))
    if a.egress:
        es = a.egress_summary or {}
        head = ", ".join(f"{k} {es[k]}" for k in ("allowed", "refused", "dropped") if es.get(k) is not None)
        c.print(Rule("egress log" + (f" ({head})" if head else ""), style="dim", align="left"))
        rows, more = egress_rows(list(a.egress))
        et = Table(show_edge=False, pad_edge=False)
        for col in ("host:port", "method", "verdict", "rule / reason", "bytes up / down"):
            et.add_column(col, no_wrap=col != "rule / reason", overflow="fold")
        for x in rows:  # hosts and reasons are what the agent asked for: never markup
            et.add_row(Text(printable_line(x["host"])), Text(printable_line(x["method"])),
                       Text(x["verdict"], style="green" if x["verdict"] == "allowed" else "bold red"),
                       Text(printable_line(x["why"])), x["bytes"])
        c.print(et)
        if more:
            c.print(Text(f"… {more} more connection(s): harness show {a.id} --json for all", style="dim"))


def _print_verifier_and_services(a: Any, r: Any) -> None:
    """A verifier's reward, the services' counters, what the envelope could not enforce and
    what the task asked for, and the run's base-image substitutions."""
    c = console
    if a.reward is not None or a.rewards:
        extra = "  " + ", ".join(f"{k} {v:g}" for k, v in list(a.rewards.items())[:8]) if a.rewards else ""
        c.print(Text(f"reward {a.reward:g}{extra}" if a.reward is not None else f"reward: none{extra}"))
    if a.services:
        c.print(Rule("services (same cores as the agent; their CPU is theirs, never foreign)", style="dim", align="left"))
        st = Table(show_edge=False, pad_edge=False)
        for col in ("service", "image", "memory", "cpu used", "memory peak", "envelope"):
            st.add_column(col)
        for name, s in a.services.items():
            cnt = s.get("counters") or {}
            ap = s.get("envelope_applied") or {}
            mism = s.get("mismatches") or []
            st.add_row(name, s.get("image", "-"), format_size(ap.get("memory_max")),
                       _secs((cnt.get("cpu_usage_us") or 0) / 1e6 if cnt else None), format_size(cnt.get("memory_peak")),
                       Text("DIFFERS: " + "; ".join(mism), style="bold red") if mism else Text("ok", style="green"))
        c.print(st)
    notes = list(a.envelope_notes or [])
    if a.requested_envelope:
        notes.append("the task asked for " + json.dumps(a.requested_envelope, sort_keys=True, default=str)[:400] + " (replaced by --profile)")
    adj = (r.adjustments or {}).get(a.task_id)
    if adj:
        notes.append(f"envelope fitted to this machine: {adj.get('note', adj)}")
    subs = dict(r.substitutions or {})
    if r.task_bases:  # this task's own (an older run kept only the run's, all shown)
        mine = r.task_bases.get(a.task_id) or []
        subs = {ref: subs[ref] for ref in mine if isinstance(ref, str) and ref in subs}
    notes += [f"image built FROM {local} in place of {ref}" for ref, local in subs.items()]
    if notes:
        c.print(Rule("envelope notes", style="dim", align="left"))
        for n in notes:
            c.print(Text("  " + printable(n)))


# ----------------------------------------------------------------------------- samples

SAMPLES_HELP = f"""Export the ~5 Hz saturation time series of an attempt or a run.

A number is an attempt id; anything else is a run id, unique prefix or `last` (then every
attempt's samples, ordered by attempt and time). Counters are cumulative as the kernel
reports them; rates are differences between rows.

Examples:

  harness samples 42

  harness samples last --jsonl --out samples.jsonl

  harness samples r20250101-120000-ab12 --csv -o run.csv

Columns (name, unit, meaning):

{fields_help(SAMPLE_FIELDS)}
"""


def samples(
    target: str = typer.Argument(..., help="Attempt id (a number), or run id / unique prefix / `last`."),
    csv_out: bool = typer.Option(False, "--csv", help="CSV with a header row (the default)."),
    jsonl: bool = typer.Option(False, "--jsonl", help="One JSON object per line."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write to this file instead of stdout."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    if csv_out and jsonl:
        die("--csv and --jsonl: pick one output format")
    store = _open(db)
    if target.isdigit():
        a = store.get_attempt(int(target))
        found = store.iter_samples(attempt_id=a.id)
        what = f"attempt {a.id}"
    else:
        r = _run_or_die(store, target)
        found = store.iter_samples(run_id=r.id)
        what = f"run {r.id}"

    def rows() -> Iterator[dict[str, Any]]:
        for m in found:
            d = {"attempt_id": m["attempt_id"], "run_id": m["run_id"], "task": m["task_id"], "slot": m["slot"], "attempt": m["attempt_no"]}
            # a value that is not a finite number (a store changed outside harness) is empty,
            # never the non-JSON Infinity / NaN
            d.update({k: None if isinstance(m[k], float) and not math.isfinite(m[k]) else m[k] for k in SAMPLE_COLUMNS})
            yield d

    try:
        fh = open(out, "w", newline="") if out else sys.stdout
    except OSError as e:
        die(f"--out {out}: cannot write ({e.strerror}); pick another path")
    n = 0
    attempts: set[int] = set()
    try:
        if jsonl:
            for d in rows():
                fh.write(json.dumps(d) + "\n")
                n += 1
                attempts.add(d["attempt_id"])
        else:
            w = csv.DictWriter(fh, fieldnames=list(SAMPLE_FIELDS), lineterminator="\n")
            w.writeheader()
            for d in rows():
                w.writerow({k: csv_value(v) for k, v in d.items()})
                n += 1
                attempts.add(d["attempt_id"])
    finally:
        if out:
            fh.close()
        else:
            fh.flush()
    if out:
        none = "" if n else " (no samples stored: attempts shorter than one sample interval have none)"
        err.print(f"wrote {plural(n, 'sample')} from {plural(len(attempts), 'attempt')} of {what} to {out}{none}", highlight=False)
    elif n == 0:
        err.print(f"{what}: no samples stored (attempts shorter than one sample interval have none)", highlight=False)


# ----------------------------------------------------------------------------- gc


def gc(
    older_than: str = typer.Option(..., "--older-than", help="Age of runs to collect: a number and w, d, h or min (4w, 30d, 12h, 90min)."),
    purge: bool = typer.Option(False, "--purge", help="Also delete those runs' rows (runs, attempts, samples). Default: keep every row."),
    include_interrupted: bool = typer.Option(False, "--include-interrupted", help="Also collect interrupted runs (their artifacts are needed to inspect a resumed run)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only print what would be freed / deleted."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Free disk: remove old runs' artifacts (rows kept unless --purge).

    Removes the artifact folders (stdout, stderr, final state, transcripts) of runs created
    before the given age and prints what that frees. Rows stay unless --purge: attempts are
    evidence and are never deleted unless asked. Runs still being run are never touched;
    interrupted runs (resumable) keep their artifacts unless --include-interrupted. A run
    left marked running by a controller that died is marked interrupted first.

    Examples:

      harness gc --older-than 30d --dry-run

      harness gc --older-than 30d

      harness gc --older-than 90d --purge
    """
    from harness.engine.gc import collect, nothing_stored
    from harness.store.store import Store, is_default_store, missing_database

    try:
        age = parse_age(older_than)
    except ValueError as e:
        die(str(e))
    # gc never creates a database, and a dry run never writes to one: the default store before
    # the first run has nothing to collect (as `harness runs` lists nothing, exit 0); a named
    # database that does not exist is refused as every read command refuses it (exit 2)
    path = missing_database(db)
    if path is not None and is_default_store(path):
        result = {"older_than": older_than, **nothing_stored(age, purge=purge, dry_run=dry_run)}
    else:
        store = Store.open(db, mode="ro" if dry_run or path is not None else "rw")
        result = {"older_than": older_than, **collect(store, age, purge=purge, dry_run=dry_run, include_interrupted=include_interrupted)}
    report = result["runs"]
    if json_out:
        print(json.dumps(result, indent=2))
    else:
        if path is not None:
            console.print(f"no runs yet (no database at {path}): nothing to collect", highlight=False)
        verb = "would free" if dry_run else "freed"
        for rid in result["recovered"]:
            console.print(f"[yellow]run {rid}[/] was marked running but its controller is gone: "
                          f"{'would be ' if dry_run else ''}marked interrupted (resume it with `harness run --resume {rid}`)", highlight=False)
        if report:
            t = Table(title=f"runs created before {result['cutoff'].replace('T', ' ')} UTC ({older_than} ago)", title_justify="left")
            cols = ["run", "created", "status", "artifacts", "files"] + (["attempts", "samples"] if purge else [])
            for col in cols:
                t.add_column(col, justify="left" if col in ("run", "created", "status") else "right")
            for e in report:
                cells = [e["run_id"], (e["created_at"] or "-").replace("T", " "), e["status"],
                         format_size(e["bytes"]) if e["folder_exists"] else "gone", str(e["files"])]
                if purge:
                    cells += [str(e["attempts"]), str(e["samples"])]
                t.add_row(*cells)
            console.print(t)
        freed, folders = result["freed_bytes"], result["folders"]
        line = f"{verb} {format_size(freed)} ({freed} bytes) in {folders} artifact folder(s)"
        if purge:
            d = result["rows_deleted"]
            line += f"; {'would delete' if dry_run else 'deleted'} rows of {d['runs']} run(s), {d['attempts']} attempt(s), {d['samples']} sample(s)"
        else:
            line += "; every row kept (add --purge to delete the runs' rows too)"
        console.print(line, highlight=False)
        if result["skipped_running"]:
            console.print(f"[yellow]skipped {len(result['skipped_running'])} run(s) still being run[/]: {', '.join(result['skipped_running'])}", highlight=False)
        if result["kept_interrupted"]:
            console.print(f"[yellow]kept {len(result['kept_interrupted'])} interrupted run(s)[/] (resumable; --include-interrupted collects them): "
                          f"{', '.join(result['kept_interrupted'])}", highlight=False)
        for p in result["problems"]:
            err.print(f"[yellow]warning:[/] {escape(p)}", highlight=False)
    if result["problems"]:
        raise typer.Exit(EXIT_FAIL)


def register(app: typer.Typer) -> None:
    app.command(help=TRIALS_HELP)(trials)
    app.command()(show)
    app.command(help=SAMPLES_HELP)(samples)
    app.command()(gc)


def _node_text(node: dict) -> str:
    """Where an attempt ran, as `harness show` prints it."""
    if not node:
        return "- (not recorded by this harness version)"
    from harness.core.envelope import node_name

    parts = [f"{k} {node[k]}" for k in ("kernel", "cgroup_version", "cpu_model", "engine_version") if node.get(k)]
    return f"{node_name(node)} ({node.get('executor', 'local')}): " + ", ".join(parts)
