"""Model calls of an attempt, summed; and what they cost under a price table. Pure."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from harness.model.gateway import ModelCall, UpstreamSummary


def _add(a: int | None, b: int | None) -> int | None:
    if b is None:
        return a
    return b if a is None else a + b


def busy_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals (overlapping calls count once)."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def summarize(calls: list[ModelCall], dropped: int = 0) -> UpstreamSummary:
    """Sum an attempt's calls (see :class:`UpstreamSummary`)."""
    f: dict[str, Any] = dict(calls=len(calls) + dropped, dropped=dropped)
    counts = {"rate_limited": "rate_limited", "server_error": "server_errors", "timeout": "timeouts",
              "connection": "connection_errors", "auth": "auth_errors", "client_error": "client_errors",
              "refused": "refused", "cut_off": "cut_off"}
    for k in counts.values():
        f[k] = 0
    t_in = t_out = t_cached = None
    missing = 0
    models: dict[str, None] = {}
    for c in calls:
        if c.error:
            f[counts[c.error]] += 1
        if c.tokens_in is None and c.tokens_out is None:
            missing += c.error is None  # a failed call has no usage to report
        t_in, t_out, t_cached = _add(t_in, c.tokens_in), _add(t_out, c.tokens_out), _add(t_cached, c.tokens_cached)
        if c.model:
            models.setdefault(c.model)
    f.update(
        retries=sum(c.retries for c in calls), tokens_in=t_in, tokens_out=t_out, tokens_cached=t_cached,
        calls_without_usage=missing, queued_s=round(sum(c.queued_s for c in calls), 4),
        wait_s=round(busy_seconds((c.started, c.started + c.queued_s + (c.latency_s or 0.0)) for c in calls), 4),
        bytes_in=sum(c.bytes_in for c in calls), bytes_out=sum(c.bytes_out for c in calls), models=list(models)[:20],
    )
    return UpstreamSummary(**f)


def call_cost(call: Mapping[str, Any], prices: Mapping[str, Mapping[str, float]]) -> float | None:
    """Cost of one stored call under ``prices`` (model -> per-million-token prices ``input``,
    ``output`` and optionally ``cached``); None when its model has no price or its usage is unknown."""
    p = prices.get(str(call.get("model") or ""))
    if p is None:
        return None
    t_in, t_out, t_cached = call.get("tokens_in"), call.get("tokens_out"), call.get("tokens_cached")
    if t_in is None and t_out is None:
        return None if call.get("error") is None else 0.0
    cached = t_cached or 0
    fresh = max(0, (t_in or 0) - cached) if "cached" in p else (t_in or 0)
    cost = fresh * p.get("input", 0.0) + (t_out or 0) * p.get("output", 0.0) + (cached * p["cached"] if "cached" in p else 0.0)
    return cost / 1_000_000


def attempt_cost(calls: list[Mapping[str, Any]], prices: Mapping[str, Mapping[str, float]] | None) -> float | None:
    """Sum of :func:`call_cost` over an attempt's calls; None when any call's cost is unknown
    (a partial sum would look like a real figure) or there is no price table."""
    if not prices or not calls:
        return None if not prices else 0.0
    total = 0.0
    for c in calls:
        v = call_cost(c, prices)
        if v is None:
            return None
        total += v
    return total
