"""Pure helpers for the inspection commands (``trials``, ``show``, ``samples``, ``gc``).

No database, Docker or CLI code: functions take AttemptRow/RunRow/SampleRow-like objects
(anything with the same attributes) and return plain data or rich renderables. The field
dictionaries below are the one place the exported names, units and meanings are defined;
``harness trials --fields`` and the commands' ``--help`` print them.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from harness.core.envelope import node_name
from harness.model.units import did_you_mean, format_size, printable
from harness.report.usage import CALL_ERROR_KIND, attempt_usage, call_cost_of, cost_text, errors_text, tokens_text

# ----------------------------------------------------------------------------- field docs

#: ``harness trials`` row: field name -> (unit, meaning). Order = column order of CSV/JSON.
#: "fraction" means a share between 0 and 1 (the table shows it as %).
TRIAL_FIELDS: dict[str, tuple[str, str]] = {
    "id": ("-", "Attempt id; `harness show ID` prints the whole record."),
    "run_id": ("-", "Run the attempt belongs to."),
    "task": ("-", "Task id."),
    "slot": ("index", "Trial slot (0..n-1) the attempt fills."),
    "attempt": ("count", "Attempt number within the slot (1 = first; >1 = rerun after a discard)."),
    "verdict": ("-", "clean (reaches the estimator) or discarded (an SLA rule was breached; kept as evidence)."),
    "reasons": ("-", "SLA rules the attempt breached (JSON list; ';'-joined in CSV; empty when clean)."),
    "outcome": ("-", "pass or fail, graded on the final state; a discarded attempt is graded too and never scored "
                     "(count passes with verdict = clean)."),
    "failure_kind": ("-", "wrong_state, crashed, timeout, oom_killed or ungradable (failed attempts only)."),
    "exit_code": ("-", "Exit status of the agent command (empty when it never ran or was killed)."),
    "timed_out": ("bool", "The agent hit its wall-clock timeout and was killed."),
    "wall_s": ("s", "Wall time of the whole attempt: container start, setup, agent, export, grading."),
    "agent_wall_s": ("s", "Wall time of the agent command."),
    "grade_wall_s": ("s", "Wall time of the grader, run inside the sandbox after the agent's processes were killed."),
    "cpuset": ("-", "Cores the attempt was pinned to (exclusive lease)."),
    "concurrent": ("count", "Attempts in flight, this one included, when it started."),
    "cpu_s": ("s", "CPU time charged to the container's cgroup during the agent phase."),
    "cpu_quota_share": ("fraction", "cpu_s / (agent-phase wall time x CPU quota in cores): how much of its quota it used."),
    "throttled_share": ("fraction", "Time the CFS quota held the cgroup back / agent-phase wall time."),
    "throttled_s": ("s", "Total time throttled by the CFS quota."),
    "nr_throttled": ("periods", "CFS periods in which the cgroup was throttled."),
    "nr_periods": ("periods", "CFS enforcement periods elapsed."),
    "memory_peak": ("bytes", "Highest memory charged to the cgroup."),
    "memory_max": ("bytes", "Memory ceiling, read back from the cgroup."),
    "memory_peak_share": ("fraction", "memory_peak / memory_max."),
    "memory_limit_hits": ("count", "Times usage hit the ceiling (v1 memory.failcnt, v2 memory.events max)."),
    "memory_high_events": ("count", "memory.high events (cgroup v2 only; empty on v1)."),
    "oom_kills": ("count", "Processes of the attempt killed by the OOM killer."),
    "pids_peak": ("count", "Most processes + threads at once."),
    "pids_max": ("count", "pids limit, read back from the cgroup."),
    "pids_limit_hits": ("count", "Forks refused at the pids limit."),
    "psi_cpu_some_s": ("s", "Per-cgroup PSI: time some task of the attempt stalled on CPU (empty where unavailable)."),
    "psi_memory_some_s": ("s", "Per-cgroup PSI: time some task stalled on memory."),
    "psi_io_some_s": ("s", "Per-cgroup PSI: time some task stalled on IO."),
    "io_read_bytes": ("bytes", "Block I/O the attempt read from disk during the agent phase (v1 blkio.throttle.io_service_bytes, "
                      "v2 io.stat; empty where unavailable). tmpfs and page-cache hits are not disk I/O."),
    "io_write_bytes": ("bytes", "Block I/O the attempt wrote to disk during the agent phase."),
    "host_disk_bytes": ("bytes", "Bytes read + written on the host's disks over the agent phase (/proc/diskstats, whole disks)."),
    "controller_stall_s": ("s", "Longest time the controller's own monitor stood still beyond one sampling interval."),
    "foreign_cpu_share": ("fraction", "Busy time on the pinned cores not charged to the attempt / (wall x pinned cores)."),
    "steal_share": ("fraction", "Hypervisor steal on the trial's pinned CPUs / (wall x those CPUs)."),
    "host_psi_cpu": ("fraction", "Share of wall time some host task stalled on CPU (host PSI some)."),
    "host_psi_memory": ("fraction", "Share of wall time some host task stalled on memory (host PSI some)."),
    "host_psi_io": ("fraction", "Share of wall time some host task stalled on IO (host PSI some)."),
    "mem_available_min": ("bytes", "Lowest host MemAvailable seen during the attempt."),
    "saturated": (
        "-",
        "Signals over their highlight threshold: throttled, memory, memory_limit, oom, pids, foreign_cpu, "
        "steal, host_memory, host_io (JSON list; ';'-joined in CSV).",
    ),
    "started_at": ("UTC ISO 8601", "When the attempt started."),
    "model_calls": ("count", "Model calls the agent made through the gateway (empty: the attempt had no gateway)."),
    "tokens_in": ("tokens", "Input tokens as the responses reported them (empty: none reported, or no gateway; never 0 for unknown)."),
    "tokens_out": ("tokens", "Output tokens as the responses reported them (empty: none reported, or no gateway)."),
    "tokens_cached": ("tokens", "Cached input tokens as the responses reported them (empty: none reported, or no gateway)."),
    "calls_without_usage": ("count", "Successful calls whose response reported no usage (their tokens are in no sum)."),
    "upstream_errors": ("count", "Calls that ended in an error: rate limited (429), 5xx, timeout, connection, auth (401/403), "
                        "another 4xx, refused by the gateway, cut off by the agent's end."),
    "wait_s": ("s", "Time the agent waited on the model: calls in flight (union), queueing in the gateway included."),
    "working_s": ("s", "agent_wall_s - wait_s: the agent's time not spent waiting on the model."),
    "cost_usd": ("USD", "Cost of the calls under --prices / $HARNESS_PRICES (empty: no table, an unpriced model, or no usage reported)."),
    "seed": ("-", "The slot's seed: the same for every attempt of the slot (a rerun repeats it)."),
    "node": ("-", "The machine the attempt ran on: hostname, and /node-id prefix on a Ray node (--executor ray)."),
}

#: trial fields that are an AttemptRow column unchanged (field -> column).
TRIAL_COLUMNS: dict[str, str] = {
    "id": "id", "run_id": "run_id", "task": "task_id", "slot": "slot", "attempt": "attempt_no", "seed": "seed",
    "verdict": "verdict", "outcome": "outcome", "failure_kind": "failure_kind", "exit_code": "exit_code",
    "timed_out": "timed_out", "wall_s": "wall_s", "agent_wall_s": "agent_wall_s", "grade_wall_s": "grade_wall_s", "cpuset": "cpuset",
    "concurrent": "concurrent", "throttled_share": "throttled_share", "nr_throttled": "nr_throttled",
    "nr_periods": "nr_periods", "memory_peak": "memory_peak", "memory_max": "memory_max",
    "memory_limit_hits": "memory_limit_hits", "memory_high_events": "memory_high_events", "oom_kills": "oom_kills",
    "pids_peak": "pids_peak", "pids_max": "pids_max", "pids_limit_hits": "pids_limit_hits",
    "foreign_cpu_share": "foreign_cpu_share", "steal_share": "steal_share", "host_psi_cpu": "host_psi_cpu",
    "host_psi_memory": "host_psi_memory", "host_psi_io": "host_psi_io", "mem_available_min": "mem_available_min",
}

#: ``harness samples`` row: field name -> (unit, meaning). Order = CSV column order.
SAMPLE_FIELDS: dict[str, tuple[str, str]] = {
    "attempt_id": ("-", "Attempt the sample belongs to."),
    "run_id": ("-", "Run of the attempt."),
    "task": ("-", "Task id of the attempt."),
    "slot": ("index", "Trial slot of the attempt."),
    "attempt": ("count", "Attempt number within the slot."),
    "t": ("s", "Seconds since the agent phase started."),
    "cpu_usage_us": ("us", "Cumulative CPU time of the container's cgroup."),
    "throttled_us": ("us", "Cumulative time throttled by the CFS quota."),
    "nr_throttled": ("periods", "Cumulative throttled CFS periods."),
    "memory_current": ("bytes", "Memory charged to the cgroup at t."),
    "pids_current": ("count", "Processes + threads at t."),
    "foreign_cpu_us": ("us", "Busy time on the pinned cores not charged to the attempt, since the agent phase started."),
    "host_mem_available": ("bytes", "Host MemAvailable at t."),
}

SAMPLE_COLUMNS = [f for f in SAMPLE_FIELDS if f not in ("attempt_id", "run_id", "task", "slot", "attempt")]


def fields_text(fields: dict[str, tuple[str, str]]) -> str:
    """The field docs as aligned plain-text lines (name, unit, meaning)."""
    w = max(map(len, fields))
    uw = max(len(u) for u, _ in fields.values())
    return "\n".join(f"{name:<{w}}  {unit:<{uw}}  {meaning}" for name, (unit, meaning) in fields.items())


def fields_help(fields: dict[str, tuple[str, str]]) -> str:
    """The field docs for a rich-markup ``--help``: one line each, 'name (unit): meaning'
    (wraps better in a narrow terminal than aligned columns; brackets escaped)."""
    lines = []
    for name, (unit, meaning) in fields.items():
        u = "" if unit == "-" else f" ({unit})"
        lines.append(f"  {name}{u}: {meaning}".replace("[", "\\["))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- thresholds


@dataclass(frozen=True)
class Thresholds:
    """When a value "stands out": SLA thresholds of the run's profile, else fixed defaults."""

    throttled_share: float = 0.10
    memory_peak_share: float = 0.90
    foreign_cpu_share: float = 0.10
    foreign_cpu_min_ms: float = 50.0  # host_cpu_contention's measurement floor: below it the share is /proc/stat's rounding
    steal_share: float = 0.05
    host_memory: float = 0.10
    host_io: float = 0.50

    @classmethod
    def from_profile(cls, profile_json: dict | None) -> "Thresholds":
        sla = (profile_json or {}).get("sla") or {}
        d = cls()

        def pick(key: str, default: float) -> float:
            v = sla.get(key)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default

        return cls(
            # an enabled envelope rule is stricter or looser than 10%: its threshold wins
            throttled_share=pick("throttled_share", d.throttled_share),
            memory_peak_share=d.memory_peak_share,
            foreign_cpu_share=pick("foreign_cpu_share", d.foreign_cpu_share),
            foreign_cpu_min_ms=pick("foreign_cpu_min_ms", d.foreign_cpu_min_ms),
            steal_share=pick("steal_share", d.steal_share),
            host_memory=pick("host_memory_pressure", d.host_memory),
            host_io=pick("host_io_pressure", d.host_io),
        )


def _gt(v: float | int | None, t: float) -> bool:
    return v is not None and v > t


def saturated(row: dict[str, Any], th: Thresholds) -> list[str]:
    """Names of the signals of one trial row that are over their threshold."""
    out = []
    if _gt(row.get("throttled_share"), th.throttled_share):
        out.append("throttled")
    if _gt(row.get("memory_peak_share"), th.memory_peak_share):
        out.append("memory")
    if _gt(row.get("memory_limit_hits"), 0):
        out.append("memory_limit")
    if _gt(row.get("oom_kills"), 0):
        out.append("oom")
    if _gt(row.get("pids_limit_hits"), 0):
        out.append("pids")
    ms = row.get("foreign_cpu_ms")  # under the rule's floor, as the rule itself judges it
    if _gt(row.get("foreign_cpu_share"), th.foreign_cpu_share) and (ms is None or ms >= th.foreign_cpu_min_ms):
        out.append("foreign_cpu")
    if _gt(row.get("steal_share"), th.steal_share):
        out.append("steal")
    if _gt(row.get("host_psi_memory"), th.host_memory):
        out.append("host_memory")
    if _gt(row.get("host_psi_io"), th.host_io):
        out.append("host_io")
    return out


# ----------------------------------------------------------------------------- trial rows


def _div(a: float | int | None, b: float | int | None) -> float | None:
    if a is None or not b:
        return None
    return a / b


def _us_to_s(v: int | None) -> float | None:
    return None if v is None else v / 1e6


def _iso(t: dt.datetime | None) -> str | None:
    return None if t is None else t.isoformat()


def trial_row(a: Any, th: Thresholds, prices: dict | None = None) -> dict[str, Any]:
    """One ``harness trials`` row (keys = TRIAL_FIELDS, in order) from an AttemptRow; the
    model-usage fields are None for an attempt without a gateway, cost_usd without ``prices``."""
    row: dict[str, Any] = {f: getattr(a, c) for f, c in TRIAL_COLUMNS.items()}
    counters = a.counters or {}
    cpus = (a.envelope or {}).get("cpus")
    window = counters.get("wall_s") or a.agent_wall_s
    row["reasons"] = list(a.reasons or [])
    row["cpu_s"] = _us_to_s(a.cpu_usage_us)
    row["cpu_quota_share"] = _div(a.cpu_usage_us, (window * 1e6 * cpus) if (window and cpus) else None)
    row["throttled_s"] = _us_to_s(a.throttled_us)
    row["memory_peak_share"] = _div(a.memory_peak, a.memory_max)
    row["psi_cpu_some_s"] = _us_to_s(a.psi_cpu_some_us)
    row["psi_memory_some_s"] = _us_to_s(a.psi_memory_some_us)
    row["psi_io_some_s"] = _us_to_s(a.psi_io_some_us)
    host = getattr(a, "host_counters", None) or {}
    row["io_read_bytes"], row["io_write_bytes"] = counters.get("io_read_bytes"), counters.get("io_write_bytes")
    row["host_disk_bytes"], row["controller_stall_s"] = host.get("disk_bytes"), host.get("monitor_stall_s")
    fus = host.get("foreign_cpu_us")
    row["foreign_cpu_ms"] = fus / 1000 if isinstance(fus, (int, float)) and not isinstance(fus, bool) else None
    row["started_at"] = _iso(a.started_at)
    row["saturated"] = saturated(row, th)
    u = attempt_usage(a, prices)
    row["model_calls"] = None if u is None else u.get("calls")
    for k in ("tokens_in", "tokens_out", "tokens_cached", "calls_without_usage", "upstream_errors", "wait_s", "working_s"):
        row[k] = None if u is None else u.get(k)
    row["cost_usd"] = None if u is None or u["cost"] is None else round(u["cost"], 9)
    row["node"] = node_name(getattr(a, "node", None) or {})
    return {f: row[f] for f in TRIAL_FIELDS}



def csv_value(v: Any) -> Any:
    """How a row value is written to CSV: lists ';'-joined, None empty, bools true/false."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return ";".join(map(str, v))
    return v


def sort_rows(rows: list[dict[str, Any]], spec: str, fields: Iterable[str]) -> list[dict[str, Any]]:
    """Sort by a field name; a leading '-' sorts descending. Empty values always go last.
    Raises ValueError naming the valid fields when the name is unknown."""
    desc = spec.startswith("-")
    name = spec.lstrip("-+")
    valid = list(fields)
    if name not in valid:
        meant = did_you_mean(name, valid)
        raise ValueError(f"--sort {spec!r}: no such field{meant}" + ("" if meant else "; the fields: `harness trials --fields`"))

    def key(r: dict[str, Any]) -> Any:
        v = r.get(name)
        if isinstance(v, list):
            v = ";".join(map(str, v))
        return v

    present = [r for r in rows if key(r) is not None]
    missing = [r for r in rows if key(r) is None]
    try:
        present.sort(key=key, reverse=desc)
    except TypeError:  # mixed types in one column: compare as text
        present.sort(key=lambda r: str(key(r)), reverse=desc)
    return present + missing


def pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:z.{digits}f}%"


def _num(v: Any) -> str:
    return "-" if v is None else str(v)


def _style(text: str, hot: bool, style: str = "bold red") -> Text:
    return Text(text, style=style if hot else "")


#: trials table columns, most important first: on a narrow terminal the tail is dropped.
_TABLE_PRIORITY = [
    "id", "task", "slot/att", "result", "throttled (n)", "mem peak (ceil)", "oom", "foreign cpu", "wall s",
    "pids peak/hits", "mem hits", "cpu s", "exit", "host psi cpu/mem/io", "steal", "cpuset",
]
#: the model-usage columns, shown only when some attempt had a gateway (after "wall s" in importance)
_USAGE_COLUMNS = ["calls", "tokens in/out", "upstream err", "wait/agent s", "cost $"]


def _tokens_cell(r: dict[str, Any]) -> str:
    if r["model_calls"] is None:
        return "-"
    return f"{tokens_text(r['tokens_in'], '-')}/{tokens_text(r['tokens_out'], '-')}"


def trials_table(rows: list[dict[str, Any]], th: Thresholds, title: str, width: int | None = None,
                 priced: bool = False) -> tuple[Table, list[str]]:
    """The rich table of ``harness trials``, saturated values in color. Columns that do not
    fit in ``width`` are left out, least important first; returns (table, hidden columns).
    Model-usage columns appear when some attempt had a gateway (cost only when ``priced``)."""
    cols: dict[str, tuple[str, list[Text]]] = {}
    gateway = any(r.get("model_calls") is not None for r in rows)
    nodes = any("/" in (r.get("node") or "") for r in rows)  # a distributed run: which node ran what
    priority = list(_TABLE_PRIORITY)
    if nodes:
        priority.insert(priority.index("result") + 1, "node")
    if gateway:
        at = priority.index("wall s") + 1
        priority[at:at] = [c for c in _USAGE_COLUMNS if priced or c != "cost $"]

    def col(name: str, justify: str, cell: Any) -> None:
        cols.setdefault(name, (justify, []))[1].append(cell if isinstance(cell, Text) else Text(str(cell)))

    for r in rows:
        sat = set(r["saturated"])
        # one column for verdict and outcome: discarded attempts have no outcome
        if r["verdict"] == "discarded":
            result = Text("discarded", style="bold yellow")
            if r["reasons"]:
                result.append("\n" + "\n".join(r["reasons"]), style="yellow")
        elif r["outcome"] == "pass":
            result = Text("pass", style="green")
        else:
            result = Text(r["outcome"] or "-", style="red")
            if r["failure_kind"]:
                result.append("\n" + r["failure_kind"], style="red")
        host = Text()
        host.append(pct(r["host_psi_cpu"]))
        host.append(" / ")
        host.append(_style(pct(r["host_psi_memory"]), "host_memory" in sat))
        host.append(" / ")
        host.append(_style(pct(r["host_psi_io"]), "host_io" in sat))
        col("id", "right", r["id"])
        col("task", "left", r["task"])
        col("slot/att", "right", f"{r['slot']}/{r['attempt']}")
        col("result", "left", result)
        if nodes:
            col("node", "left", r.get("node") or "-")
        col("exit", "right", _num(r["exit_code"]))
        col("wall s", "right", "-" if r["wall_s"] is None else f"{r['wall_s']:.2f}")
        col("cpuset", "left", r["cpuset"] or "-")
        col("cpu s", "right", "-" if r["cpu_s"] is None else f"{r['cpu_s']:.2f}")
        if gateway:
            col("wait/agent s", "right", "-" if r["wait_s"] is None else
                f"{r['wait_s']:.1f}/{'-' if r['agent_wall_s'] is None else format(r['agent_wall_s'], '.1f')}")
            col("calls", "right", _num(r["model_calls"]))
            col("tokens in/out", "right", _tokens_cell(r))
            col("upstream err", "right", _style(_num(r["upstream_errors"]), bool(r["upstream_errors"])))
            if priced:
                col("cost $", "right", "-" if r["cost_usd"] is None else cost_text(r["cost_usd"]).lstrip("$"))
        col("throttled (n)", "right", _style(f"{pct(r['throttled_share'])} ({_num(r['nr_throttled'])})", "throttled" in sat))
        col("mem peak (ceil)", "right", _style(f"{format_size(r['memory_peak'])} ({pct(r['memory_peak_share'], 0)})", "memory" in sat))
        col("mem hits", "right", _style(_num(r["memory_limit_hits"]), "memory_limit" in sat))
        col("oom", "right", _style(_num(r["oom_kills"]), "oom" in sat))
        col("pids peak/hits", "right", _style(f"{_num(r['pids_peak'])}/{_num(r['pids_limit_hits'])}", "pids" in sat))
        col("foreign cpu", "right", _style(pct(r["foreign_cpu_share"]), "foreign_cpu" in sat))
        col("host psi cpu/mem/io", "right", host)
        col("steal", "right", _style(pct(r["steal_share"]), "steal" in sat))

    return fitted_table(cols, priority, len(rows), title, width)


def fitted_table(cols: dict[str, tuple[str, list[Text]]], priority: list[str], n_rows: int, title: str,
                 width: int | None) -> tuple[Table, list[str]]:
    """A table of ``cols`` (name -> (justify, a cell per row)), in their own order, with the
    columns that fit in ``width`` whole (never cut or wrapped), taken in ``priority`` order;
    returns (table, names left out)."""

    def need(name: str) -> int:
        cells = cols[name][1] if name in cols else []
        longest = max([len(name)] + [len(line) for c in cells for line in c.plain.splitlines() or [""]])
        return longest + 3  # padding both sides and the border

    keep: list[str] = []
    used = 1
    for name in priority:
        w = need(name)
        if width is not None and used + w > width and keep:
            continue
        keep.append(name)
        used += w
    order = [n for n in cols or {n: None for n in priority} if n in keep] if cols else keep
    hidden = [n for n in priority if n not in keep]
    t = Table(title=title, title_justify="left", pad_edge=True)
    for name in order:
        t.add_column(name, justify=cols[name][0] if name in cols else "left", no_wrap=True)
    for i in range(n_rows):
        t.add_row(*[cols[name][1][i] for name in order])
    return t, hidden


# ----------------------------------------------------------------------------- show


_RULE_FMT = {
    "host_memory_low": "size",
    "memory_pressure": "count",
    "envelope_not_applied": "count",
    "infra_error": "count",
    "controller_stall": "seconds",
    **{r: "count" for r in ("upstream_rate_limited", "upstream_server_error", "upstream_timeout", "upstream_unreachable",
                            "upstream_auth", "upstream_client_error")},
}


def rule_value(rule: str, v: Any) -> str:
    """A rule's value or threshold in its unit: shares as %, sizes in MiB, counts as is."""
    if v is None:
        return "-"
    kind = _RULE_FMT.get(rule, "share")
    if kind == "size":
        return format_size(v)
    if kind == "count":
        return f"{v:g}" if isinstance(v, float) else str(v)
    if kind == "seconds":
        return f"{v:.1f} s"
    return pct(v)


def rule_line(r: dict[str, Any]) -> str:
    """'RULE — measured vs threshold' for one stored rule result, e.g.
    'host_cpu_contention — foreign CPU on pinned cores 48.2% > 10.0% (230 ms)'."""
    rule = r.get("rule") or "?"
    detail = r.get("detail") or ""
    if rule in ("infra_error", "envelope_not_applied"):  # the detail is the message itself
        return f"{rule} — {detail or 'no detail recorded'}"
    value = rule_value(rule, r.get("value"))
    if detail and value in detail:
        return f"{rule} — {detail}"
    low_is_bad = rule == "host_memory_low"
    op = ("<" if low_is_bad else ">") if r.get("breached") else (">=" if low_is_bad else "<=")
    measured = f"{value} {op} {rule_value(rule, r.get('threshold'))}"
    return f"{rule} — {measured}" + (f" ({detail})" if detail else "")


def headline(a: Any) -> str:
    """One line on what happened: the breached rules of a discarded attempt with value and
    threshold, or the outcome and grader reason of a clean one."""
    if a.verdict == "discarded":
        breached = [r for r in (a.rules or []) if r.get("breached")]
        if breached:
            return "discarded: " + "; ".join(rule_line(r) for r in breached)
        return "discarded: " + (", ".join(a.reasons or []) or "no rule recorded")
    if a.outcome == "pass":
        return "clean: pass"
    kind = f" ({a.failure_kind})" if a.failure_kind else ""
    return f"clean: fail{kind}" + (f" — {a.grade_reason}" if a.grade_reason else "")


def overlapping(a: Any, others: Iterable[Any]) -> list[int]:
    """Ids of the attempts (same run) whose [started_at, finished_at] overlaps this one's."""
    out = []
    for o in others:
        if o.id == a.id or o.started_at is None or o.finished_at is None:
            continue
        if o.started_at < a.finished_at and a.started_at < o.finished_at:
            out.append(o.id)
    return sorted(out)


def _cpuset_list(s: str) -> list[int]:
    out: list[int] = []
    for part in (s or "").split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return sorted(out)


def envelope_rows(a: Any, run_profile: dict | None) -> list[dict[str, Any]]:
    """The envelope, setting by setting: the run's profile, this attempt's envelope (the
    profile with any task override) and the limits read back from the kernel."""
    env = a.envelope or {}
    prof = run_profile or {}
    ap = a.envelope_applied or {}

    def quota(e: dict) -> str | None:
        if e.get("cpus") is None:
            return None
        period = int(e.get("cpu_period_us") or 100_000)
        return f"{round(e['cpus'] * period)}/{period}"

    applied_quota = None
    if ap.get("cpu_period_us"):
        q = ap.get("cpu_quota_us")
        applied_quota = f"{q}/{ap['cpu_period_us']}" if q is not None else "unlimited"
    cpuset_applied = ",".join(map(str, ap["cpuset_cpus"])) if ap.get("cpuset_cpus") is not None else None
    rows = [
        ("cpu quota/period us", quota(prof), quota(env), applied_quota),
        ("cpuset", f"{prof['cores']} leased" if prof.get("cores") else None, a.cpuset or None, cpuset_applied),
        ("memory", _size(prof.get("memory")), _size(env.get("memory")), _size(ap.get("memory_max")) if ap else None),
        (
            "memory + swap",
            _size(prof.get("memory")),
            _size(env.get("memory")),
            _size(ap.get("memsw_max")) if ap.get("memsw_max") is not None else None,
        ),
        ("pids", _num(prof.get("pids")), _num(env.get("pids")), _num(ap.get("pids_max")) if ap else None),
    ]
    out = []
    for name, p, e, applied in rows:
        if applied is None:
            match = None
        elif name == "cpuset":
            match = _cpuset_list(a.cpuset) == (ap.get("cpuset_cpus") or [])
        else:
            match = e == applied
        out.append({"setting": name, "profile": p, "attempt": e, "applied": applied, "match": match})
    if env.get("timeouts"):
        t = env["timeouts"]
        pt = prof.get("timeouts") or {}
        out.append({
            "setting": "timeouts s (setup/agent/grade)",
            "profile": "/".join(_g(pt.get(k)) for k in ("setup", "agent", "grade")),
            "attempt": "/".join(_g(t.get(k)) for k in ("setup", "agent", "grade")),
            "applied": None,
            "match": None,
        })
    return out


def _g(v: Any) -> str:
    return "-" if v is None else (f"{v:g}" if isinstance(v, (int, float)) else str(v))


def _size(v: Any) -> str | None:
    return None if v is None else format_size(v)


def _as(v: Any, kind: type) -> Any:
    """A stored diff's part as the grader writes it, or empty: a store changed outside harness
    may hold anything there, and what cannot be read is left out, not a traceback."""
    return v if isinstance(v, kind) else kind()


def _count(v: Any, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def diff_summary(state_diff: dict | None) -> list[dict[str, Any]]:
    """Per table: status and rows added / removed / changed (the full counts; the stored
    diff keeps only the first rows)."""
    out = []
    for td in _as(_as(state_diff, dict).get("tables"), list):
        if not isinstance(td, dict):
            continue
        counts = _as(td.get("counts"), dict)
        out.append({
            "table": td.get("table"),
            "status": td.get("status"),
            **{k: _count(counts.get(k), len(_as(td.get(k), list))) for k in ("added", "removed", "changed")},
            "columns_added": list(_as(td.get("columns_added"), list)),
            "columns_removed": list(_as(td.get("columns_removed"), list)),
        })
    return out


def diff_lines(state_diff: dict | None, limit: int = 12) -> list[str]:
    """Human phrases for the state diff (the grader's wording), at most ``limit``; for a
    ``files`` state, one per changed path."""
    sd = _as(state_diff, dict)
    if isinstance(sd.get("files"), dict):
        fd = sd["files"]
        lines = [_one(x) for x in _as(fd.get("lines"), list)]
        total = max(_count(fd.get("total"), 0), len(lines))
        shown = lines[:limit]
        return shown + ([f"… {total - len(shown)} more path(s)"] if total > len(shown) else [])
    lines = [_one(x) for x in _as(sd.get("lines"), list)]
    if not lines:  # a record from an older harness: counts only
        return [_one(f"{d['table']}: {d['status']} +{d['added']} -{d['removed']} ~{d['changed']}") for d in diff_summary(state_diff)][:limit]
    total = max(_count(sd.get("lines_total"), 0), len(lines))
    shown = lines[:limit]
    return shown + ([f"… {total - len(shown)} more"] if total > len(shown) else [])


def _one(x: Any) -> str:
    """A stored diff line as one line: a newline in it (a file name's, in a store an older
    grader wrote) is shown escaped, never as a line of its own."""
    return str(x).replace("\r", "\\r").replace("\n", "\\n")


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _cell(v: Any, width: int = 60) -> str:
    return _cut(json.dumps(v, ensure_ascii=False) if isinstance(v, str) else ("NULL" if v is None else str(v)), width)


def diff_row_lines(state_diff: dict | None, rows: int = 5, width: int = 300) -> list[str]:
    """The values of rows the agent added or removed, as the grader stored them (the first
    ``rows`` of each table; the stored diff keeps the first 20): ``refunds +(id=1) amount_cents=15000,
    method="original"``. Strings quoted on one line, each value and line cut."""
    out = []
    for td in _as(_as(state_diff, dict).get("tables"), list):
        if not isinstance(td, dict) or td.get("status") != "changed":
            continue
        key = [k for k in _as(td.get("key"), list) if isinstance(k, str)]
        counts = _as(td.get("counts"), dict)
        for sign, kind in (("+", "added"), ("-", "removed")):
            got = [r for r in _as(td.get(kind), list) if isinstance(r, dict)]
            shown = got[:rows]
            for r in shown:
                ident = ", ".join(f"{k}={_cell(r.get(k), 40)}" for k in key if k in r)
                vals = ", ".join(f"{c}={_cell(v)}" for c, v in r.items() if c not in key)
                out.append(_cut(_one(f"{td.get('table')} {sign}({ident}) {vals}" if ident else f"{td.get('table')} {sign} {vals}"), width))
            more = max(_count(counts.get(kind), 0), len(got)) - len(shown)
            if more > 0:
                out.append(_one(f"{td.get('table')} {sign}… {more} more row(s) {kind}"))
    return out


# ----------------------------------------------------------------------------- model gateway

MAX_CALL_LINES = 50  # model calls listed by `harness show` (the rest are counted)


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}s"


def call_rows(calls: Sequence[dict[str, Any]], prices: dict | None = None, limit: int = MAX_CALL_LINES) -> tuple[list[dict[str, str]], int]:
    """The first ``limit`` stored model calls as display strings (model, status/error,
    latency, ttfb, tokens in/out/cached, retries, cost, detail) and how many more there are."""
    out = []
    for i, c in enumerate(calls[:limit], 1):
        status = str(c.get("status")) if c.get("status") is not None else "-"
        if c.get("error"):
            status += f" {c['error']}"
        tokens = "/".join(tokens_text(c.get(k), "-") for k in ("tokens_in", "tokens_out", "tokens_cached"))
        cost = call_cost_of(c, prices)
        out.append({
            "n": str(i), "provider": str(c.get("provider") or "-"), "model": str(c.get("model") or "-"), "status": status, "stream": "yes" if c.get("stream") else "",
            "latency": _s(c.get("latency_s")), "ttfb": _s(c.get("ttfb_s")),
            "queued": _s(c.get("queued_s")) if c.get("queued_s") else "", "tokens": tokens,
            "retries": str(c.get("retries") or 0), "cost": "-" if cost is None else cost_text(cost),
            "detail": str(c.get("detail") or ""), "error": "yes" if c.get("error") else "",
        })
    return out, max(0, len(calls) - limit)


def upstream_lines(u: dict[str, Any], agent_wall_s: float | None) -> list[tuple[str, str]]:
    """The attempt's upstream summary as (label, value) lines; working time = agent wall - wait."""
    errs = {k: int(u.get(k) or 0) for k in CALL_ERROR_KIND.values()}
    calls = f"{u.get('calls', 0)}"
    if u.get("dropped"):
        calls += f" ({u['dropped']} beyond the record cap: counted, not listed or in the sums)"
    tokens = " / ".join(tokens_text(u.get(k), "-") for k in ("tokens_in", "tokens_out", "tokens_cached"))
    if u.get("calls_without_usage"):
        tokens += f"  ({u['calls_without_usage']} call(s) reported no usage; - = none reported, never 0)"
    wait = float(u.get("wait_s") or 0.0)
    timing = f"{wait:.2f}s"
    if agent_wall_s is not None:
        timing += f" of {agent_wall_s:.2f}s agent wall; working {max(0.0, agent_wall_s - wait):.2f}s"
    lines = [
        ("calls", calls),
        ("tokens in / out / cached", tokens),
        ("upstream errors", errors_text(errs) + (f"; gateway retries {u['retries']}" if u.get("retries") else "")),
        ("waiting on the model", timing + (f"; queued in the gateway {float(u['queued_s']):.2f}s" if u.get("queued_s") else "")),
        ("bytes sent / received", f"{format_size(u.get('bytes_in'))} / {format_size(u.get('bytes_out'))}"),
        ("models", ", ".join(u.get("models") or []) or "-"),
    ]
    if "cost" in u:
        lines.append(("cost", cost_text(u["cost"], "-") + ("" if u["cost"] is not None else " (no price table, a model without a price, or usage not reported)")))
    return lines


def egress_rows(events: Sequence[dict[str, Any]], limit: int = MAX_CALL_LINES) -> tuple[list[dict[str, str]], int]:
    """The first ``limit`` egress events as display strings and how many more there are."""
    out = []
    for e in events[:limit]:
        allowed = bool(e.get("allowed"))
        why = (f"rule {e['rule']}" if e.get("rule") else "") if allowed else (e.get("reason") or "refused")
        out.append({
            "host": f"{e.get('host', '?')}:{e.get('port', '?')}", "method": str(e.get("method") or ""),
            "verdict": "allowed" if allowed else "refused", "why": str(why),
            "bytes": f"{format_size(e.get('bytes_up') or 0)} / {format_size(e.get('bytes_down') or 0)}" if allowed else "",
        })
    return out, max(0, len(events) - limit)


# ----------------------------------------------------------------------------- time series


def derive_series(samples: Sequence[Any], cpus: float | None, cores: int | None, memory_max: int | None, pids_max: int | None) -> dict[str, Any]:
    """Per-interval rates from the cumulative saturation log.

    Returns ``{"t": [...], "cpu": [...], "throttled": [...], "foreign": [...], "memory": [...],
    "memory_bytes": [...], "pids": [...]}``: cpu = CPU used / (interval x quota cores),
    throttled = throttled time / interval, foreign = others' busy time on the pinned cores /
    (interval x cores), memory = memory_current / ceiling, pids = pids_current / pids limit.
    Rates need two samples, so interval series start at the second sample (foreign CPU is
    counted from the agent's start and has a first point too)."""
    ss = sorted(samples, key=lambda s: s.t)
    out: dict[str, list] = {k: [] for k in ("t", "cpu", "throttled", "foreign", "memory", "memory_bytes", "pids")}
    prev = None
    for s in ss:
        out["t"].append(s.t)
        out["memory_bytes"].append(s.memory_current)
        out["memory"].append(_div(s.memory_current, memory_max))
        out["pids"].append(_div(s.pids_current, pids_max))
        if prev is None:
            dt_ = s.t
            out["cpu"].append(None)
            out["throttled"].append(None)
            f0 = s.foreign_cpu_us
            out["foreign"].append(_div(f0, dt_ * 1e6 * (cores or 1)) if dt_ > 0 else None)
        else:
            dt_ = s.t - prev.t
            if dt_ <= 0:
                out["cpu"].append(None)
                out["throttled"].append(None)
                out["foreign"].append(None)
            else:
                dcpu = None if s.cpu_usage_us is None or prev.cpu_usage_us is None else max(0, s.cpu_usage_us - prev.cpu_usage_us)
                out["cpu"].append(_div(dcpu, dt_ * 1e6 * cpus) if cpus else None)
                dthr = None if s.throttled_us is None or prev.throttled_us is None else max(0, s.throttled_us - prev.throttled_us)
                out["throttled"].append(_div(dthr, dt_ * 1e6))
                dfor = None if s.foreign_cpu_us is None or prev.foreign_cpu_us is None else max(0, s.foreign_cpu_us - prev.foreign_cpu_us)
                out["foreign"].append(_div(dfor, dt_ * 1e6 * (cores or 1)))
        prev = s
    return out


BARS = "▁▂▃▄▅▆▇█"


def _bucket_max(values: Sequence[float | None], width: int) -> list[float | None]:
    n = len(values)
    if n <= width:
        return list(values)
    out = []
    for i in range(width):
        chunk = [v for v in values[i * n // width : (i + 1) * n // width] if v is not None]
        out.append(max(chunk) if chunk else None)
    return out


def sparkline(values: Sequence[float | None], hi: float = 1.0, width: int = 60) -> str:
    """Unicode bars on a fixed 0..hi scale (values above hi clip to full height); a missing
    value is a space. Longer series are bucketed to ``width`` by their maximum, so a short
    spike is never averaged away."""
    out = []
    for v in _bucket_max(values, width):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            out.append(" ")
            continue
        frac = max(0.0, min(1.0, v / hi)) if hi > 0 else 0.0
        out.append(BARS[min(len(BARS) - 1, int(frac * (len(BARS) - 1) + 0.5))])
    return "".join(out)


def chart(series: dict[str, Any], th: Thresholds, memory_max: int | None, width: int = 60) -> Group | Text:
    """The saturation log as sparklines on fixed scales (0..100% of the quota / ceiling)."""
    t = series.get("t") or []
    if not t:
        return Text("no samples (the attempt ended before the first sample, or never started)", style="dim")
    lines = []
    specs = [
        ("cpu (of quota)", "cpu", 1.0, None),
        ("throttled", "throttled", 1.0, th.throttled_share),
        ("memory (of ceiling)", "memory", 1.0, th.memory_peak_share),
        ("pids (of limit)", "pids", 1.0, None),
        ("foreign cpu", "foreign", 1.0, th.foreign_cpu_share),
    ]
    label_w = max(len(s[0]) for s in specs)
    for label, key, hi, hot in specs:
        vals = series.get(key) or []
        present = [v for v in vals if v is not None]
        line = Text(f"{label:<{label_w}} ", style="bold")
        if not present:
            line.append("(not measured)", style="dim")
            lines.append(line)
            continue
        mx = max(present)
        mean = sum(present) / len(present)
        line.append("▕", style="dim")
        line.append(sparkline(vals, hi, width), style="red" if hot is not None and mx > hot else "cyan")
        line.append("▏", style="dim")
        extra = ""
        if key == "memory" and memory_max:
            peak_b = max((b for b in series.get("memory_bytes") or [] if b is not None), default=None)
            extra = f" ({format_size(peak_b)} of {format_size(memory_max)})"
        line.append(f" max {pct(mx, 0)} mean {pct(mean, 0)}{extra}")
        lines.append(line)
    lines.append(Text(f"{'':<{label_w}}  {t[0]:.1f}s … {t[-1]:.1f}s, {len(t)} samples; bars on a 0–100% scale", style="dim"))
    return Group(*lines)


def tail_text(data: bytes | str | None, max_lines: int = 15, max_chars: int = 2000, before: int = 0) -> str | None:
    """The last lines of an artifact file (None when absent), without control characters.
    ``before``: bytes of the file before ``data`` (not read, so their lines are not counted)."""
    if data is None:
        return None
    s = printable(data.decode("utf-8", "replace") if isinstance(data, bytes) else data)
    lines = s.rstrip("\n").splitlines()
    cut = lines[-max_lines:]
    out = "\n".join(cut)
    if len(out) > max_chars:
        out = "…" + out[-max_chars:]
    elif len(lines) > max_lines or before:
        more = f" and {format_size(before)} before them" if before else ""
        out = f"… ({max(0, len(lines) - max_lines)} earlier lines{more})\n" + out
    return out


# ----------------------------------------------------------------------------- gc

_AGE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(w|d|h|min|m)\s*$", re.IGNORECASE)
_AGE_UNITS = {"w": dt.timedelta(weeks=1), "d": dt.timedelta(days=1), "h": dt.timedelta(hours=1), "min": dt.timedelta(minutes=1)}


def parse_age(s: str) -> dt.timedelta:
    """'4w', '30d', '12h', '90min' -> timedelta. Raises ValueError with the accepted forms; a bare
    'm' is refused (a minute or a month? what it collects is deleted)."""
    m = _AGE_RE.match(s or "")
    if not m:
        raise ValueError(f"--older-than {s!r}: expected a number with a unit w, d, h or min, e.g. 4w, 30d, 12h, 90min")
    n, unit = float(m.group(1)), m.group(2).lower()
    if unit == "m":
        raise ValueError(f"--older-than {s!r}: 'm' could be minutes or months; write {m.group(1)}min for minutes, "
                         f"or days ({m.group(1)}m as months is about {round(n * 30.44)}d)")
    return n * _AGE_UNITS[unit]
