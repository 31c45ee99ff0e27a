"""Model usage of attempts: calls, tokens, upstream errors, waiting time and cost. Pure.

Reads what the gateway stored on each attempt (``model_calls``, ``upstream``); an attempt
with neither had no gateway and has no usage (None, never zeros). Token sums count the
calls that reported usage (``calls_without_usage`` says how many did not); a cost is None
unless every call of every attempt summed is priced and reported its usage, so a partial
sum is never shown as a cost.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from harness.core.sla import ENVELOPE_RULES
from harness.core.upstream import attempt_cost, call_cost, summarize
from harness.model.gateway import ModelCall

#: UpstreamSummary counters of upstream errors, in display order.
ERROR_KINDS = ("rate_limited", "server_errors", "timeouts", "connection_errors", "auth_errors", "client_errors", "refused", "cut_off")
#: ModelCall.error -> the UpstreamSummary counter it is counted in.
CALL_ERROR_KIND = {"rate_limited": "rate_limited", "server_error": "server_errors", "timeout": "timeouts",
                   "connection": "connection_errors", "auth": "auth_errors", "client_error": "client_errors",
                   "refused": "refused", "cut_off": "cut_off"}

Prices = Mapping[str, Mapping[str, float]]


def upstream_of(a: Any) -> dict[str, Any] | None:
    """The attempt's UpstreamSummary as stored (summed from its calls for a record that has
    calls and no summary); None when the attempt had no gateway."""
    up = getattr(a, "upstream", None) or {}
    if up:
        return dict(up)
    calls = getattr(a, "model_calls", None) or []
    if calls:
        return summarize([ModelCall.model_validate(c) for c in calls]).model_dump(mode="json")
    return None


def _all_recorded(a: Any, up: Mapping[str, Any]) -> bool:
    kept = len(getattr(a, "model_calls", None) or [])
    return not up.get("dropped") and kept >= int(up.get("calls") or 0)


def cost_of(a: Any, prices: Prices | None) -> float | None:
    """USD of one attempt's calls; 0.0 for an attempt without a gateway, None without a price
    table, when a call is unpriced or unreported, or when not every call was recorded."""
    if prices is None:
        return None
    up = upstream_of(a)
    if up is None:
        return 0.0
    if not _all_recorded(a, up):
        return None
    return attempt_cost(list(getattr(a, "model_calls", None) or []), prices)


def unpriced_models(attempts: Iterable[Any], prices: Prices | None) -> list[str]:
    """Models called (first-seen order) the price table has no price for."""
    if prices is None:
        return []
    seen: dict[str, None] = {}
    for a in attempts:
        for c in getattr(a, "model_calls", None) or []:
            m = str(c.get("model") or "")
            if m not in prices:
                seen.setdefault(m or "(no model named)")
    return list(seen)


def call_cost_of(call: Mapping[str, Any], prices: Prices | None) -> float | None:
    return None if prices is None else call_cost(call, prices)


def upstream_errors(up: Mapping[str, Any] | None) -> int | None:
    """Calls that ended in an upstream error (any kind); None without a gateway."""
    return None if up is None else sum(int(up.get(k) or 0) for k in ERROR_KINDS)


def attempt_usage(a: Any, prices: Prices | None) -> dict[str, Any] | None:
    """One attempt's usage for ``trials`` and ``show``: the stored summary plus its upstream
    error count, working time (agent wall - wait) and cost; None without a gateway."""
    up = upstream_of(a)
    if up is None:
        return None
    wall = getattr(a, "agent_wall_s", None)
    wait = float(up.get("wait_s") or 0.0)
    return {
        **up,
        "upstream_errors": upstream_errors(up),
        "working_s": None if wall is None else round(max(0.0, wall - wait), 4),
        "cost": cost_of(a, prices),
    }


def _add(x: int | None, y: Any) -> int | None:
    if y is None:
        return x
    return int(y) if x is None else x + int(y)


def token_use(attempts: Iterable[Any], prices: Prices | None) -> dict[str, Any]:
    """TokenUse of some attempts (those without a gateway add nothing)."""
    out: dict[str, Any] = {"attempts": 0, "calls": 0, "calls_without_usage": 0, "calls_unrecorded": 0,
                           "tokens_in": None, "tokens_out": None, "tokens_cached": None}
    cost: float | None = 0.0 if prices is not None else None
    for a in attempts:
        up = upstream_of(a)
        if up is None:
            continue
        out["attempts"] += 1
        out["calls"] += int(up.get("calls") or 0)
        out["calls_without_usage"] += int(up.get("calls_without_usage") or 0)
        out["calls_unrecorded"] += int(up.get("dropped") or 0)
        for k in ("tokens_in", "tokens_out", "tokens_cached"):
            out[k] = _add(out[k], up.get(k))
        c = cost_of(a, prices)
        cost = None if cost is None or c is None else cost + c
    out["cost"] = cost
    return out


def discard_scopes(a: Any) -> list[str]:
    """The scopes (host, envelope, upstream, ...) of a discarded attempt's reasons: the scope
    its breached rule recorded, else the rule's name (upstream_*, the envelope rules)."""
    recorded = {r.get("rule"): r.get("scope") for r in (getattr(a, "rules", None) or [])
                if isinstance(r, dict) and r.get("breached") and r.get("scope")}
    scopes: dict[str, None] = {}
    for reason in getattr(a, "reasons", None) or ["unknown"]:
        scope = recorded.get(reason)
        if not scope:
            if reason.startswith("upstream_"):
                scope = "upstream"
            elif reason in ENVELOPE_RULES:
                scope = "envelope"
            elif reason == "interrupted":
                scope = "interrupted"
            else:
                scope = "host"
        scopes.setdefault(scope)
    return list(scopes)


def usage_of(attempts: list[Any], scored: list[Any], prices: Prices | None) -> dict[str, Any] | None:
    """Usage of ``attempts`` (every attempt of a task or run) with the ``scored`` ones (the
    clean attempt of each slot) summed apart; None when none of them had a gateway."""
    ups = [(a, up) for a in attempts if (up := upstream_of(a)) is not None]
    if not ups:
        return None
    errors = {k: sum(int(up.get(k) or 0) for _, up in ups) for k in ERROR_KINDS}
    walls = [a.agent_wall_s for a, _ in ups if getattr(a, "agent_wall_s", None) is not None]
    wait = round(sum(float(up.get("wait_s") or 0.0) for _, up in ups), 3)
    agent_wall = round(sum(walls), 3) if walls else None
    models: dict[str, None] = {}
    for _, up in ups:
        for m in up.get("models") or []:
            models.setdefault(str(m))
    return {
        "spent": token_use(attempts, prices),
        "scored": token_use(scored, prices),
        "errors": errors,
        "retries": sum(int(up.get("retries") or 0) for _, up in ups),
        "wait_s": wait,
        "queued_s": round(sum(float(up.get("queued_s") or 0.0) for _, up in ups), 3),
        "agent_wall_s": agent_wall,
        "working_s": None if agent_wall is None else round(max(0.0, agent_wall - wait), 3),
        "discarded_upstream": sum(1 for a in attempts if a.verdict != "clean" and "upstream" in discard_scopes(a)),
        "models": list(models)[:20],
    }


# ----------------------------------------------------------------------------- text


def tokens_text(v: int | None, none: str = "–") -> str:
    """A token count with thousands separators; ``none`` when not reported (never 0)."""
    return none if v is None else f"{v:,}"


def cost_text(v: float | None, none: str = "–") -> str:
    """USD: cents from a dollar up, four decimals from a cent, three significant digits below
    (so a small cost never rounds to $0.0000); ``none`` when unknown."""
    if v is None:
        return none
    if v == 0 or v >= 1:
        return f"${v:.2f}"
    if v >= 0.01:
        return f"${v:.4f}"
    digits = 2 - math.floor(math.log10(v))  # three significant digits, in fixed notation
    return "$" + f"{v:.{digits}f}".rstrip("0")


def errors_text(errors: Mapping[str, int]) -> str:
    """'rate_limited 3, timeouts 1' (zero counts left out), or 'none'."""
    return ", ".join(f"{k} {errors[k]}" for k in ERROR_KINDS if errors.get(k)) or "none"
