"""OpenTelemetry export of runs: traces over OTLP/HTTP, live (an event sink) or from the store.

One mapping, :func:`run_tree`, turns a stored run and its attempt records into span specs
(plain data, no OpenTelemetry import); :class:`OtelSink` (``harness run --otlp``) and
:func:`export_run` (``harness export RUN --otlp``) both send what it returns, so the two give
the same tree: the same trace id (derived from the run id), span ids (derived from the span's
place in the tree), names, times (from the records, never the export's clock) and attributes::

    run {suite}                                 created_at .. finished_at
      slot {task}                               per task x trial index: first attempt start .. last attempt end
        attempt                                 every attempt, discarded ones too: started_at .. finished_at
          gateway | lane | services | sandbox | setup | agent | stop | export | grade | verifier-sandbox | halt | remove
                                                every phase the record keeps, at its recorded time
            chat {model}                        (under agent) one per model call the gateway recorded

A record keeps its phases (``AttemptRecord.phases``: name, start after ``started_at``, length,
timed by the controller). A record made before phases were kept has only the durations of
setup, agent and grade: their spans have the recorded length and an estimated place
(``harness.phase.start_estimated``): back to back, in pipeline order, ending at the attempt's
end, moved earlier when a recorded model call shows the agent already running. Model-call
spans carry the gateway's own times.

Only the controller's own facts become attributes: identity, envelope (asked and read back),
counters, SLA rules, verdict, outcome. Never a secret (the records hold names only), a
transcript, a state diff, a check's detail, an egress host or other agent-controlled text;
the grader's reason and the model name an agent asked for are capped (``TEXT_CAP``).
Everything of ``opentelemetry`` is imported lazily: harness works without the ``otel`` extra.
"""

from __future__ import annotations

import calendar
import datetime as dt
import errno
import hashlib
import itertools
import logging
import os
import re
import socket
import threading
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import urlsplit, urlunsplit

from harness.core.aggregate import slot_views
from harness.engine.events import EventSink
from harness.model.attempt import AttemptRecord
from harness.model.errors import InfraError, UsageError
from harness.model.run import RunRecord

TEXT_CAP = 1024  # characters of any string attribute (the grader's reason, an error note)
NAME_CAP = 200  # characters of a model name in a span name
INSTALL_HINT = "pip install 'harness[otel]'"
BATCH = 256  # spans per OTLP request
_CTRL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_HOST = re.compile(r"^[A-Za-z0-9._\-]+$|^\[[0-9A-Fa-f:.]+\]$")
PHASES = ("setup", "agent", "grade")  # the phases whose duration an attempt record keeps, in pipeline order
OPERATIONS = {  # gateway endpoint -> gen_ai.operation.name
    "/chat/completions": "chat", "/responses": "chat", "/v1/messages": "chat",
    "/completions": "text_completion", "/embeddings": "embeddings",
}
KNOWN_ENDPOINTS = {*OPERATIONS, "/models", "/v1/models", "/v1/messages/count_tokens"}


# -- the mapping (pure) ----------------------------------------------------------------

@dataclass(frozen=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "time_ns", _in_range(self.time_ns))


@dataclass(frozen=True)
class SpanSpec:
    """One span to send: ``key`` is its place in the tree (its id derives from it)."""

    key: str
    name: str
    parent: str | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: tuple[SpanEvent, ...] = ()
    error: str | None = None  # status ERROR with this description; None: status unset
    client: bool = False  # span kind CLIENT (a model call), else INTERNAL

    def __post_init__(self) -> None:  # in OTLP's range and never ending before it starts, whatever a record held
        start = _in_range(self.start_ns)
        object.__setattr__(self, "start_ns", start)
        object.__setattr__(self, "end_ns", max(start, _in_range(self.end_ns)))


def trace_id(run_id: str) -> int:
    """The run's 128-bit trace id (the same for every export of the run)."""
    return int(hashlib.sha256(f"harness-trace:{run_id}".encode()).hexdigest()[:32], 16) or 1


def span_id(run_id: str, key: str) -> int:
    """The 64-bit id of the span at ``key`` in the run's tree."""
    return int(hashlib.sha256(f"harness-span:{run_id}:{key}".encode()).hexdigest()[:16], 16) or 1


def _text(v: Any, cap: int = TEXT_CAP) -> str:
    s = _CTRL.sub(" ", str(v))
    return s if len(s) <= cap else s[: cap - 1] + "…"


def _scalar(v: Any) -> Any:
    if isinstance(v, bool) or isinstance(v, float):
        return v
    if isinstance(v, int):
        return v if -(2 ** 63) <= v < 2 ** 63 else float(v)
    return _text(v)


def flat(prefix: str, value: Any, out: dict[str, Any] | None = None) -> dict[str, Any]:
    """``value`` as OTel attributes under ``prefix``: nested keys dotted, numbers as numbers,
    lists of scalars as homogeneous arrays, None (not measured) left out, strings capped."""
    out = {} if out is None else out
    if value is None:
        return out
    if isinstance(value, dict):
        for k, v in value.items():
            flat(f"{prefix}.{_text(k, 100)}", v, out)
    elif isinstance(value, (list, tuple)):
        items = [v for v in value if v is not None]
        if not items or any(isinstance(v, (dict, list, tuple)) for v in items):
            return out  # lists of records (rules, checks) get their own attributes or none
        kinds = {bool if isinstance(v, bool) else int if isinstance(v, int) else float if isinstance(v, float) else str for v in items}
        if kinds == {int, float}:
            items = [float(v) for v in items]
        elif len(kinds) > 1:
            items = [str(v) for v in items]
        out[prefix] = [_scalar(v) for v in items[:100]]
    else:
        out[prefix] = _scalar(value)
    return out


def _ns(t: dt.datetime | None) -> int | None:
    if t is None:
        return None
    if t.tzinfo is not None:
        t = t.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return _in_range(calendar.timegm(t.timetuple()) * 1_000_000_000 + t.microsecond * 1000)


# OTLP times are unsigned 64-bit nanoseconds (the SDK takes them as ints): whatever a stored
# record holds (a year 1 or 9999, 1e300 seconds, NaN) is sent inside [0, MAX_NS]
MAX_NS = 2**63 - 1


def _in_range(ns: int) -> int:
    return min(MAX_NS, max(0, ns))


def _s_ns(seconds: float | None) -> int:
    """Seconds (a duration or a Unix time, from a record) as nanoseconds in range; negative,
    None and NaN are 0."""
    x = (seconds or 0) * 1e9
    return MAX_NS if x >= MAX_NS else round(x) if x > 0 else 0


def _span_of(a: AttemptRecord) -> tuple[int, int]:
    """An attempt's [start, end] in ns from its record (``wall_s`` fills a missing end)."""
    start, end = _ns(a.started_at), _ns(a.finished_at)
    if start is None and end is None:
        return 0, 0
    if start is None:
        start = end - _s_ns(a.wall_s)
    if end is None:
        end = start + _s_ns(a.wall_s)
    return start, max(start, end)


def _calls(a: AttemptRecord) -> list[dict[str, Any]]:
    return [c for c in (a.model_calls or []) if isinstance(c, dict) and isinstance(c.get("started"), (int, float))]


def _phase_times(a: AttemptRecord, start: int, end: int) -> list[tuple[str, int, int, bool]]:
    """(name, start, end, estimated) of the attempt's phases, as the module docstring says."""
    kept = [p for p in (a.phases or []) if isinstance(p, dict) and isinstance(p.get("name"), str)
            and isinstance(p.get("start_s"), (int, float)) and isinstance(p.get("wall_s"), (int, float))]
    if kept:
        out = []
        for p in kept:
            s = min(end, start + _s_ns(p["start_s"]))
            out.append((p["name"][:NAME_CAP], s, min(end, s + _s_ns(p["wall_s"])), False))
        return out
    return [(n, s, e, True) for n, s, e in _estimated_phases(a, start, end)]


def _estimated_phases(a: AttemptRecord, start: int, end: int) -> list[tuple[str, int, int]]:
    durs = [(n, _s_ns(d)) for n, d in zip(PHASES, (a.setup_wall_s, a.agent_wall_s, a.grade_wall_s)) if d is not None]
    if not durs:
        return []
    t = end
    placed: list[tuple[str, int, int]] = []
    for name, d in reversed(durs):
        placed.append((name, t - d, t))
        t -= d
    placed.reverse()
    calls = _calls(a)
    agent = next((p for p in placed if p[0] == "agent"), None)
    shift = 0
    if agent is not None and calls:
        first = min(_s_ns(c["started"]) for c in calls)
        shift = max(0, agent[1] - first)
    shift = min(shift, max(0, placed[0][1] - start))  # never before the attempt started
    if placed[0][1] - shift < start:  # durations (rounded) longer than the attempt: start with it
        shift = placed[0][1] - start
    return [(n, max(start, s - shift), min(end, max(start, e - shift))) for n, s, e in placed]


def attempt_key(a: AttemptRecord) -> str:
    return f"attempt/{a.task_id}/{a.slot}/{a.attempt_no}"


def slot_key(task: str, slot: int) -> str:
    return f"slot/{task}/{slot}"


def _status_of(a: AttemptRecord) -> str | None:
    if a.verdict == "discarded":
        return "discarded: " + (", ".join(a.reasons) or "no reason recorded")
    if a.outcome == "fail":
        return f"fail: {a.failure_kind or 'unknown'}"
    if a.outcome is None:
        return "not graded"
    return None


def _attempt_attributes(a: AttemptRecord) -> dict[str, Any]:
    at: dict[str, Any] = {
        "harness.run_id": a.run_id, "harness.task.id": a.task_id, "harness.slot": a.slot, "harness.attempt_no": a.attempt_no,
        "harness.seed": a.seed, "harness.cpuset": a.cpuset, "harness.verdict": a.verdict, "harness.scored": a.verdict == "clean",
        "harness.wall_s": float(a.wall_s), "harness.concurrent": a.concurrent, "harness.image": _text(a.image),
        "harness.timed_out": a.timed_out, "harness.terminated_cleanly": a.terminated_cleanly,
        "harness.interrupted": a.interrupted,
    }
    if a.reasons:
        at["harness.discard.reasons"] = [_text(r, 100) for r in a.reasons]
    fired = [r for r in a.rules if isinstance(r, dict) and r.get("breached")]
    if fired:
        at["harness.sla.fired"] = [_text(r.get("rule", "?"), 100) for r in fired]
    for r in a.rules:
        if not isinstance(r, dict) or not r.get("rule"):
            continue
        p = f"harness.sla.rule.{_text(r['rule'], 100)}"
        flat(p, {"scope": r.get("scope"), "value": r.get("value"), "threshold": r.get("threshold"), "breached": bool(r.get("breached"))}, at)
        if r.get("breached") and r.get("detail"):
            at[f"{p}.detail"] = _text(r["detail"])
    for k, v in (("harness.outcome", a.outcome), ("harness.failure_kind", a.failure_kind), ("harness.grade.status", a.grade_status),
                 ("harness.grade.reason", a.grade_reason), ("harness.grade.wall_s", a.grade_wall_s), ("harness.reward", a.reward),
                 ("harness.exit_code", a.exit_code), ("harness.agent_wall_s", a.agent_wall_s), ("harness.setup_wall_s", a.setup_wall_s),
                 ("harness.monitor_errors", a.monitor_errors), ("harness.container", a.container or None), ("harness.error", a.error)):
        if v is not None:
            at[k] = _scalar(v)
    if a.grade_checks:  # counts only: a check's detail quotes the agent's state
        at["harness.grade.checks"] = len(a.grade_checks)
        at["harness.grade.checks_failed"] = sum(1 for c in a.grade_checks if isinstance(c, dict) and not c.get("passed"))
    flat("harness.envelope.requested", a.envelope, at)
    flat("harness.envelope.applied", a.envelope_applied, at)
    flat("harness.envelope.task", a.requested_envelope, at)
    if a.envelope_notes:
        flat("harness.envelope.notes", list(a.envelope_notes), at)
    flat("harness.grade.envelope", a.grade_envelope, at)
    flat("harness.counters", a.counters, at)
    flat("harness.host_counters", a.host_counters, at)
    for name, svc in (a.services or {}).items():
        if isinstance(svc, dict):
            flat(f"harness.service.{_text(name, 100)}", {k: svc.get(k) for k in ("image", "envelope_applied", "mismatches", "counters")}, at)
    if a.services:
        at["harness.services"] = [_text(n, 100) for n in a.services]
    up = dict(a.upstream or {})
    if up:
        up["models"] = [_text(m, NAME_CAP) for m in (up.get("models") or [])[:20]]  # named by the agent: capped
        flat("harness.upstream", up, at)
        # the attempt's model use summed, under the GenAI names too (calls past the record cap included)
        for k, name in (("tokens_in", "gen_ai.usage.input_tokens"), ("tokens_out", "gen_ai.usage.output_tokens")):
            if up.get(k) is not None:
                at[name] = up[k]
    if a.egress_summary:  # counts only: the hosts asked for are the agent's choice
        flat("harness.egress", a.egress_summary, at)
    flat("harness.node", a.node, at)
    return at


def _evaluation(a: AttemptRecord, t: int) -> SpanEvent | None:
    """The grade as the GenAI ``gen_ai.evaluation.result`` event (None: not graded). A
    discarded attempt's event has no score: the harness does not count it, and a dashboard
    that averages scores must not either (what its grader said is ``harness.grade.outcome``)."""
    if a.outcome is None and a.grade_status != "broken":
        return None
    scored = a.verdict == "clean"
    at: dict[str, Any] = {"gen_ai.evaluation.name": "harness.grade", "harness.scored": scored}
    if a.outcome is not None and scored:
        at["gen_ai.evaluation.score.value"] = 1.0 if a.outcome == "pass" else 0.0
        at["gen_ai.evaluation.score.label"] = "pass" if a.outcome == "pass" else (a.failure_kind or "fail")
    elif a.outcome is not None:
        at["gen_ai.evaluation.score.label"] = "not_scored"
        at["harness.grade.outcome"] = a.outcome
    else:
        at["error.type"] = "grader_broken"
    if a.grade_status:
        at["harness.grade.status"] = a.grade_status
    if a.grade_reason:
        at["gen_ai.evaluation.explanation"] = _text(a.grade_reason)
    if a.reward is not None:
        at["harness.reward"] = float(a.reward)
    return SpanEvent("gen_ai.evaluation.result", t, at)


def _call_span(a: AttemptRecord, i: int, c: dict[str, Any], parent: str, end_cap: int) -> SpanSpec:
    endpoint = c.get("endpoint") if c.get("endpoint") in KNOWN_ENDPOINTS else "other"  # a refused call's path is the agent's
    op = OPERATIONS.get(endpoint)
    model = _text(c["model"], NAME_CAP) if c.get("model") else None
    provider = _text(c.get("provider") or "unknown", 40)
    start = _s_ns(c["started"])
    lat = c.get("latency_s")
    end = start + _s_ns(lat) if isinstance(lat, (int, float)) else max(start, end_cap)
    at: dict[str, Any] = {"gen_ai.provider.name": provider, "gen_ai.system": provider, "harness.model_call.endpoint": endpoint,
                          "harness.model_call.index": i}
    if op:
        at["gen_ai.operation.name"] = op
    if model:
        at["gen_ai.request.model"] = model
    tin, tout, cached = c.get("tokens_in"), c.get("tokens_out"), c.get("tokens_cached")
    if tin is not None:
        # the conventions count cached input in input_tokens; Anthropic reports it apart
        at["gen_ai.usage.input_tokens"] = tin + (cached or 0) if provider == "anthropic" else tin
    if tout is not None:
        at["gen_ai.usage.output_tokens"] = tout
    if cached is not None:
        at["gen_ai.usage.cache_read.input_tokens"] = cached
    if c.get("status") is not None:
        at["http.response.status_code"] = c["status"]
    if c.get("error"):
        at["error.type"] = _text(c["error"], 40)
    for k in ("stream", "queued_s", "latency_s", "ttfb_s", "retries", "bytes_in", "bytes_out"):
        if c.get(k) is not None:
            at[f"harness.model_call.{k}"] = _scalar(c[k])
    name = f"{op} {model}" if op and model else op or f"gateway {endpoint}"
    err = f"{c['error']} (HTTP {c.get('status')})" if c.get("error") else None
    return SpanSpec(f"{attempt_key(a)}/call/{i}", name, parent, start, max(start, end), at, error=err, client=True)


def attempt_spans(a: AttemptRecord) -> list[SpanSpec]:
    """The attempt's span, its phases and its model calls."""
    key = attempt_key(a)
    start, end = _span_of(a)
    phases = _phase_times(a, start, end)
    specs: list[SpanSpec] = []
    agent_key = None
    grade_end = end
    seen: dict[str, int] = {}
    for name, s, e, estimated in phases:
        seen[name] = seen.get(name, 0) + 1  # a phase twice (e.g. export before and after grading): its own key
        pk = f"{key}/phase/{name}" + (f"/{seen[name]}" if seen[name] > 1 else "")
        at: dict[str, Any] = {"harness.phase": name, "harness.phase.duration_s": round(max(0, e - s) / 1e9, 6),
                              "harness.phase.start_estimated": estimated}
        err = None
        if name == "agent":
            agent_key = pk
            if a.timed_out:
                err = "timed out"
            elif a.exit_code not in (0, None):
                err = f"exit {a.exit_code}"
        if name == "grade":
            grade_end = e
            if a.grade_status in ("ungradable", "broken"):
                err = f"grade {a.grade_status}"
        specs.append(SpanSpec(pk, name, key, s, e, at, error=err))
    ev = _evaluation(a, grade_end)
    specs.insert(0, SpanSpec(key, "attempt", slot_key(a.task_id, a.slot), start, end, _attempt_attributes(a),
                             events=(ev,) if ev else (), error=_status_of(a)))
    agent_end = next((e for n, _, e, _ in phases if n == "agent"), end)
    for i, c in enumerate(_calls(a)):
        specs.append(_call_span(a, i, c, agent_key or key, agent_end))
    return specs


def slot_spans(run: RunRecord, attempts: Iterable[AttemptRecord]) -> list[SpanSpec]:
    """One span per slot that has at least one attempt."""
    out = []
    for task, views in slot_views(attempts, list(run.task_ids), run.trials, run.max_reruns, run.refills).items():
        for v in views:
            atts = v.attempts
            if not atts:
                continue
            times = [_span_of(a) for a in atts]
            status = v.status
            at: dict[str, Any] = {"harness.run_id": run.id, "harness.task.id": task, "harness.slot": v.slot, "harness.seed": atts[0].seed,
                                  "harness.slot.status": status, "harness.slot.attempts": len(atts),
                                  "harness.slot.discarded": len(v.discarded)}
            if v.clean is not None:
                at["harness.slot.clean_attempt_no"] = v.clean.attempt_no
                if v.clean.outcome:
                    at["harness.outcome"] = v.clean.outcome
                if v.clean.failure_kind:
                    at["harness.failure_kind"] = v.clean.failure_kind
            err = None
            if status == "unmeasured":
                err = "unmeasured: rerun budget spent without a clean attempt"
            elif status == "fail":
                err = f"fail: {v.clean.failure_kind if v.clean else 'unknown'}"
            out.append(SpanSpec(slot_key(task, v.slot), f"slot {task}", "run", min(t[0] for t in times), max(t[1] for t in times), at,
                                error=err))
    return out


def shown_url(url: str) -> str:
    """A URL as an error line may show it: user info (a token is often put there) and query
    replaced, control characters out, capped at 200 characters."""
    try:
        u = urlsplit(url)
        host = u.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = ("***@" if u.username or u.password else "") + host + (f":{u.port}" if u.port is not None else "")
        return _text(urlunsplit((u.scheme, netloc, u.path, "…" if u.query else "", "")), 200)
    except ValueError:
        return _text(re.sub(r"//[^/]*@", "//***@", url.split("?", 1)[0]), 200)


def run_attributes(run: RunRecord) -> dict[str, Any]:
    at: dict[str, Any] = {
        "harness.run_id": run.id, "harness.suite": run.suite, "harness.suite_hash": run.suite_hash, "harness.image": run.image,
        "harness.image_digest": run.image_digest, "harness.profile": run.profile, "harness.version": run.harness_version,
        "harness.cgroup_version": run.cgroup_version, "harness.identity_hash": run.identity_hash, "harness.run.status": run.status,
        "harness.trials": run.trials, "harness.ks": list(run.ks), "harness.max_reruns": run.max_reruns, "harness.run.seed": run.seed,
        "harness.concurrency": run.concurrency, "harness.executor": run.executor, "harness.tasks": len(run.task_ids),
    }
    for k, v in (("harness.agent_cmd", list(run.agent_cmd)), ("harness.agent_name", run.agent_name), ("harness.secrets", list(run.secrets)),
                 ("harness.agent_env", sorted(run.agent_env)), ("harness.sweep_id", run.sweep_id), ("harness.note", run.note),
                 ("harness.ray_address", run.ray_address), ("harness.task_overrides", run.task_overrides)):
        if v not in (None, "", []):
            flat(k, v, at)
    flat("harness.host", run.host, at)
    flat("harness.nodes", run.nodes, at)
    flat("harness.images", run.images, at)
    flat("harness.substitutions", run.substitutions, at)
    flat("harness.excluded", {t: why.splitlines()[0] if why else "" for t, why in (run.excluded or {}).items()}, at)
    flat("harness.upstreams", {p: shown_url(u) for p, u in (run.upstreams or {}).items()}, at)
    return at


def run_span(run: RunRecord, attempts: Iterable[AttemptRecord]) -> SpanSpec:
    ends = [_span_of(a)[1] for a in attempts]
    start = _ns(run.created_at)
    if start is None:
        start = min((_span_of(a)[0] for a in attempts), default=0)
    end = _ns(run.finished_at) or max(ends, default=start)
    err = {"failed": "the run failed", "interrupted": "the run was interrupted (resumable)"}.get(run.status)
    return SpanSpec("run", f"run {run.suite}", None, start, max(start, end, *ends), run_attributes(run), error=err)


def iter_tree(run: RunRecord, attempts: list[AttemptRecord]) -> Iterator[SpanSpec]:
    """Every span of a run: the run, its slots, then each attempt's spans as they are made."""
    atts = [a for a in attempts if a.run_id == run.id]
    yield run_span(run, atts)
    yield from slot_spans(run, atts)
    for a in sorted(atts, key=lambda a: (a.task_id, a.slot, a.attempt_no)):
        yield from attempt_spans(a)


def run_tree(run: RunRecord, attempts: list[AttemptRecord]) -> list[SpanSpec]:
    """:func:`iter_tree` as a list."""
    return list(iter_tree(run, attempts))


# -- the command line's inputs ---------------------------------------------------------

def traces_url(text: str) -> str:
    """The OTLP/HTTP traces URL of ``--otlp``: a collector's base (http://host:4318) or its
    full .../v1/traces URL. Anything else is a usage error (exit 2)."""
    raw = (text or "").strip()
    hint = "give the OTLP/HTTP endpoint of a collector, e.g. http://localhost:4318 (or its .../v1/traces URL)"
    try:
        u = urlsplit(raw)
        port = u.port
    except ValueError as e:
        raise UsageError(f"--otlp {shown_url(raw)!r}: {e}; {hint}") from None
    host = u.hostname or ""
    if u.scheme not in ("http", "https") or not (_HOST.match(host) or ":" in host and _HOST.match(f"[{host}]")) \
            or u.fragment or any(c.isspace() for c in raw):
        raise UsageError(f"--otlp {shown_url(raw)!r} is not an http(s) URL of a collector; {hint}")
    if port == 0:
        raise UsageError(f"--otlp {shown_url(raw)!r}: port 0; {hint}")
    path = u.path.rstrip("/")
    if not path.endswith("/v1/traces"):
        path += "/v1/traces"
    return urlunsplit((u.scheme, u.netloc, path, u.query, ""))


def parse_headers(items: list[str], url: str | None = None) -> dict[str, str]:
    """``--otlp-header KEY=VALUE`` (repeatable) as a dict. Errors name the key, never the value.

    With ``url`` (the ``--otlp`` URL): a URL carrying user info beside an authorization header
    is refused -- the HTTP client would send the URL's Basic credentials instead of the header."""
    out: dict[str, str] = {}
    env_keys: set[str] = set()
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError("--otlp-header: expected KEY=VALUE, e.g. --otlp-header 'authorization=Bearer ...' (the value is not shown)")
        if not _TOKEN.match(key):
            raise UsageError(f"--otlp-header {_text(key, 60)!r}=...: not an HTTP header name")
        if "\r" in value or "\n" in value:
            raise UsageError(f"--otlp-header {key}=...: the value has a line break")
        out[key.lower()] = value
    for var in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"):
        # the SDK drops a malformed entry in silence (an auth header would vanish): refused here
        for item in filter(None, (x.strip() for x in os.environ.get(var, "").split(","))):
            key, sep, _ = item.partition("=")
            if not sep or not _TOKEN.match(key.strip()):
                raise UsageError(f"${var}: expected KEY=VALUE[,KEY=VALUE...], e.g. 'authorization=Bearer%20...' "
                                 "(an entry is not; the value is not shown)")
            env_keys.add(key.strip().lower())
    if url is not None and "authorization" in {*out, *env_keys}:
        try:
            u = urlsplit(url)
            userinfo = u.username is not None or u.password is not None
        except ValueError:
            userinfo = False
        if userinfo:
            raise UsageError(f"--otlp {shown_url(url)!r} carries credentials (user info) and an authorization header is "
                             "also given: the URL's would be sent instead; give one of them")
    return out


DEFAULT_TIMEOUT_MS = 10_000
_TIMEOUT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")


def export_timeout() -> float:
    """Seconds an export request may take: ``$OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`` or
    ``$OTEL_EXPORTER_OTLP_TIMEOUT`` in milliseconds, as the OpenTelemetry specification
    defines them (default 10000). The Python SDK reads them as seconds (10000 would be
    2.8 hours a request), so harness reads them itself and hands the SDK seconds. Anything
    but a positive number of milliseconds is a usage error (exit 2) naming the variable."""
    for var in _TIMEOUT_VARS:
        raw = os.environ.get(var, "").strip()
        if not raw:
            continue
        try:
            ms = float(raw)
        except ValueError:
            ms = float("nan")
        if not (0 < ms < float("inf")):
            raise UsageError(f"${var}={_text(raw, 40)!r}: expected the export timeout in milliseconds "
                             f"(a positive number, e.g. {DEFAULT_TIMEOUT_MS}, the default)")
        return ms / 1000
    return DEFAULT_TIMEOUT_MS / 1000


def _hint(reason: str) -> str:
    """What to check, for the reason an export failed (:meth:`_Reasons.reason`)."""
    if reason.startswith("HTTP "):
        return "the collector answered but refused them: see its logs (an authorization header? a path other than /v1/traces?)"
    if reason == "TLS error":
        return "is that an https:// URL of a plain-HTTP port (or a certificate this host does not trust)?"
    if reason == "timed out":
        return (f"it did not answer within the export timeout ({export_timeout():g} s; "
                "$OTEL_EXPORTER_OTLP_TIMEOUT sets it, in milliseconds)")
    if reason == "host name not resolved":
        return "is the host name right?"
    return "is it running and is that its OTLP/HTTP port (4318)?"


def otlp_options(otlp: str, header_items: list[str]) -> tuple[str, dict[str, str]]:
    """``--otlp`` and ``--otlp-header`` checked (with ``$OTEL_EXPORTER_OTLP_*`` and the extra
    installed), before anything is stored: the traces URL and the headers; a usage error
    (exit 2) otherwise."""
    url = traces_url(otlp)
    headers = parse_headers(header_items, url)
    export_timeout()
    require_otel()
    return url, headers


def unreachable(endpoint: str) -> str | None:
    """Why no TCP connection to the collector can be made, known in milliseconds (a refused
    port, a host name that does not resolve), where the SDK retries until the whole export
    timeout has passed (~8 s by default) -- or None: it connects, it is slow to say (the SDK
    decides within its timeout), or a proxy stands between (the SDK goes through it)."""
    u = urlsplit(endpoint)
    host = u.hostname or ""
    try:
        port = u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        return None
    if urllib.request.getproxies() and not urllib.request.proxy_bypass(host):
        return None
    try:
        with socket.create_connection((host, port), timeout=min(3.0, export_timeout())):
            return None
    except socket.gaierror:
        return "host name not resolved"
    except ConnectionRefusedError:
        return "connection refused"
    except OSError as e:  # a timeout (slow, not refused) is the SDK's to judge
        return "no route to host" if e.errno == errno.EHOSTUNREACH else None


def require_otel() -> None:
    """The ``otel`` extra is installed, or a usage error saying how to install it."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise UsageError(f"--otlp needs the OpenTelemetry SDK and its OTLP exporter: {INSTALL_HINT}") from None


# -- sending (the SDK, lazily) ---------------------------------------------------------

class _Reasons(logging.Handler):
    """Keeps the SDK's own log lines (they would reach stderr with tracebacks) to make one
    short reason of a failed export; nothing of a header is in them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines = (self.lines + [record.getMessage()])[-20:]
        except Exception:
            pass

    def reason(self) -> str:
        text = " ".join(self.lines)
        m = re.search(r"code: (\d+), reason: ([^\n]{0,60})", text)
        if m:  # the collector's reason phrase: its text, never its control characters
            return _text(f"HTTP {m.group(1)} {m.group(2).strip()}", 80)
        for needle, why in (("Connection refused", "connection refused"), ("timed out", "timed out"),
                            ("Name or service not known", "host name not resolved"), ("Failed to resolve", "host name not resolved"),
                            ("No route to host", "no route to host"), ("SSL", "TLS error"), ("Connection reset", "connection reset"),
                            # the SDK's own line when the deadline passed with no other reason logged
                            ("due to timeout", "timed out")):
            if needle in text:
                return why
        return "no answer"


def _quiet_sdk() -> _Reasons:
    handler = _Reasons()
    log = logging.getLogger("opentelemetry")
    for h in list(log.handlers):
        if isinstance(h, _Reasons):
            log.removeHandler(h)
    log.addHandler(handler)
    log.propagate = False
    return handler


class _Emitter:
    """A tracer provider whose spans get the planned ids and recorded times of SpanSpecs."""

    def __init__(self, run: RunRecord, processor: Any):
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanLimits, TracerProvider
        from opentelemetry.sdk.trace.id_generator import IdGenerator
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON

        planned = threading.local()

        class _Planned(IdGenerator):
            def generate_trace_id(self) -> int:
                return planned.trace

            def generate_span_id(self) -> int:
                return planned.span

        self._planned = planned
        self._lock = threading.Lock()
        self.run_id = run.id
        self.trace = trace_id(run.id)
        self.provider = TracerProvider(
            sampler=ALWAYS_ON, id_generator=_Planned(), shutdown_on_exit=False,
            # the instance is the run: its live trace and every later export of it say the same
            resource=Resource.create({"service.name": "harness", "service.version": run.harness_version, "harness.run_id": run.id,
                                      "service.instance.id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"harness:run:{run.id}"))}),
            span_limits=SpanLimits(max_span_attributes=4096, max_attribute_length=TEXT_CAP, max_events=16, max_event_attributes=64))
        self.provider.add_span_processor(processor)
        import harness

        self.tracer = self.provider.get_tracer("harness", harness.__version__)

    def emit(self, specs: Iterable[SpanSpec]) -> int:
        from opentelemetry.context import Context
        from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags, set_span_in_context

        n = 0
        with self._lock:
            for s in specs:
                ctx = Context()
                if s.parent is not None:
                    parent = SpanContext(self.trace, span_id(self.run_id, s.parent), is_remote=False,
                                         trace_flags=TraceFlags(TraceFlags.SAMPLED))
                    ctx = set_span_in_context(NonRecordingSpan(parent), ctx)
                self._planned.trace, self._planned.span = self.trace, span_id(self.run_id, s.key)
                span = self.tracer.start_span(s.name, context=ctx, kind=SpanKind.CLIENT if s.client else SpanKind.INTERNAL,
                                              attributes=s.attributes, start_time=s.start_ns, record_exception=False,
                                              set_status_on_exception=False)
                for ev in s.events:
                    span.add_event(ev.name, ev.attributes, timestamp=ev.time_ns)
                if s.error is not None:
                    span.set_status(Status(StatusCode.ERROR, _text(s.error, 200)))
                span.end(end_time=s.end_ns)
                n += 1
        return n


def _exporter(endpoint: str, headers: dict[str, str]) -> Any:
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # headers also from $OTEL_EXPORTER_OTLP_HEADERS as the SDK reads them; the timeout in milliseconds, as the spec has it
    return OTLPSpanExporter(endpoint=endpoint, headers=headers or None, compression=Compression.Gzip, timeout=export_timeout())


def export_run(run: RunRecord, attempts: list[AttemptRecord], endpoint: str, headers: dict[str, str] | None = None) -> int:
    """Send every span of a stored run to ``endpoint`` (a traces URL); the number sent. Spans
    go out in batches of BATCH as they are made (a run of 10^5 attempts is never held as SDK
    spans at once); all are sent when it returns; a collector that does not take a batch is
    an InfraError (exit 3) saying how many were sent before."""
    require_otel()
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExportResult

    why = unreachable(endpoint)
    if why:
        raise InfraError(f"the OTLP collector at {shown_url(endpoint)} did not take the spans of run {run.id} ({why}); {_hint(why)}")
    reasons = _quiet_sdk()
    exporter = _exporter(endpoint, headers or {})

    class _Batches(SpanProcessor):
        """Exports synchronously, like the SDK's SimpleSpanProcessor, BATCH spans at a time; a
        failed export is kept (a processor must not raise) and stops the export."""

        def __init__(self) -> None:
            self.batch: list[Any] = []
            self.sent = 0
            self.failed = False

        def on_end(self, span: Any) -> None:
            self.batch.append(span)
            if len(self.batch) >= BATCH:
                self.flush()

        def flush(self) -> None:
            if self.batch and not self.failed:
                if exporter.export(self.batch) is SpanExportResult.SUCCESS:
                    self.sent += len(self.batch)
                else:
                    self.failed = True
            self.batch = []

    batches = _Batches()
    emitter = _Emitter(run, batches)
    specs = iter_tree(run, attempts)
    try:
        while not batches.failed:
            chunk = list(itertools.islice(specs, BATCH))
            if not chunk:
                break
            emitter.emit(chunk)
        batches.flush()
        if batches.failed:
            why = reasons.reason()
            before = f"; {batches.sent} spans were sent before" if batches.sent else ""
            raise InfraError(f"the OTLP collector at {shown_url(endpoint)} did not take the spans of run {run.id} "
                             f"({why}){before}; {_hint(why)}")
    finally:
        exporter.shutdown()
        emitter.provider.shutdown()
    return batches.sent


class OtelSink(EventSink):
    """``harness run --otlp``: each attempt's spans are sent as its record is stored, the slots'
    and the run's when it ends (with any attempt of the run not sent yet, e.g. of an earlier
    session of a resumed run), so the tree equals ``harness export``'s. Sending happens on a
    background thread; a collector that does not take spans is noted once (``note``) and
    the run goes on: it loses nothing, the spans can be sent later from the store."""

    def __init__(self, endpoint: str, headers: dict[str, str], store: Any, note: Callable[[str], None]):
        require_otel()
        self.endpoint, self.headers, self.store, self.note = endpoint, headers, store, note
        self._emitter: _Emitter | None = None
        self._guard: Any = None
        self._run: RunRecord | None = None
        self._sent: set[str] = set()
        self._finished = False
        self._lock = threading.Lock()

    def _start(self, run: RunRecord) -> None:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

        reasons = _quiet_sdk()
        sink = self

        class _Guarded(SpanExporter):
            """Stops sending after the first failure (said once): a collector that is down must
            neither slow the run nor fill stderr."""

            def __init__(self, inner: Any):
                self.inner, self.failed, self.sent, self.closed = inner, False, 0, False

            def export(self, spans: Any) -> Any:
                if self.failed:
                    return SpanExportResult.FAILURE
                result = self.inner.export(spans)
                if result is SpanExportResult.SUCCESS:
                    self.sent += len(spans)
                else:
                    self.failed = True
                    sink._failed(reasons.reason())
                return result

            def shutdown(self) -> None:
                if not self.closed:
                    self.closed = True
                    self.inner.shutdown()

            def force_flush(self, timeout_millis: int = 30000) -> bool:
                return True

        self._guard = _Guarded(_exporter(self.endpoint, self.headers))
        processor = BatchSpanProcessor(self._guard, max_queue_size=1 << 16, schedule_delay_millis=1000, max_export_batch_size=BATCH)
        self._emitter = _Emitter(run, processor)
        self._run = run
        why = unreachable(self.endpoint)
        if why:  # said now, before the first attempt; nothing is sent, nothing waits on it at the end
            self._guard.failed = True
            self._failed(why)

    def _failed(self, why: str) -> None:
        run = self._run.id if self._run else "RUN"
        self.note(f"otlp: the collector at {shown_url(self.endpoint)} did not take spans ({why}; {_hint(why)}); the run goes on and keeps "
                  f"everything in the store (send its spans later: harness export {run} --otlp URL)")

    def _emit(self, specs: list[SpanSpec]) -> None:
        if self._emitter is None or self._guard.failed:
            return
        self._emitter.emit(specs)
        self._sent.update(s.key for s in specs)

    def run_started(self, run: RunRecord, progress: Any) -> None:
        with self._lock:
            if self._emitter is None:
                self._start(run)

    def attempt_finished(self, record: AttemptRecord, progress: Any) -> None:
        with self._lock:
            if self._emitter is not None and record.run_id == self._run.id:
                self._emit(attempt_spans(record))

    def run_finished(self, run: RunRecord, progress: Any) -> None:
        with self._lock:
            self._finish(run)

    def _finish(self, run: RunRecord | None) -> None:
        if self._emitter is None or self._finished:
            return
        self._finished = True
        run = run or self.store.get_run(self._run.id)
        self._emit([s for s in run_tree(run, self.store.attempts(run.id)) if s.key not in self._sent])

    def close(self) -> None:
        """Send what is left (the run's end, if run_finished never came) and wait until it is sent."""
        with self._lock:
            if self._emitter is None:
                return
            try:
                self._finish(None)
            except Exception as e:  # the store went away: what was sent stays sent
                self.note(f"otlp: the end of run {self._run.id} could not be read from the store ({type(e).__name__}); "
                          "spans of its slots and the run not sent")
            if self._guard.failed:
                self._guard.shutdown()  # abort a retry in flight: nothing more will be taken
            self._emitter.provider.shutdown()
            if not self._guard.failed and self._guard.sent:
                self.note(f"otlp: {self._guard.sent} spans of run {self._run.id} sent to {shown_url(self.endpoint)}")
            self._emitter = None
