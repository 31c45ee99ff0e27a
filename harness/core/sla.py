"""The SLA judge: is an attempt clean, or did the infrastructure spoil it?

Pure module. Every rule is data: name, scope, measured value, threshold, and whether it
was breached. ``host`` rules mean the node broke its promise (discard and rerun the slot);
``envelope`` rules mean the envelope itself starved the task (discard; a slot that keeps
breaching ends unmeasured with a message that the envelope is too small for the task).
``upstream`` rules mean the model API broke its promise during the attempt (429s, 5xx,
timeouts, connection errors the agent saw): discard and rerun the slot, like a host breach.
"""

from __future__ import annotations

from harness.model.counters import CounterDelta, HostDelta
from harness.model.gateway import UpstreamSummary
from harness.model.profile import SLA
from harness.model.sla import Judgement, RuleResult, Scope
from harness.model.units import format_size

ENVELOPE_RULES = ("cpu_throttled", "memory_pressure")  # the envelope starved the task (not the host)
UPSTREAM_RULES = (  # rule, SLA field, summary field, what
    ("upstream_rate_limited", "upstream_rate_limited", "rate_limited", "calls answered 429"),
    ("upstream_server_error", "upstream_server_errors", "server_errors", "calls answered 5xx"),
    ("upstream_timeout", "upstream_timeouts", "timeouts", "calls timed out"),
    ("upstream_unreachable", "upstream_connection_errors", "connection_errors", "calls cut off or unreachable"),
    ("upstream_auth", "upstream_auth_errors", "auth_errors", "calls whose key the provider refused"),
    ("upstream_client_error", "upstream_client_errors", "client_errors", "calls answered another 4xx"),
)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _max_rule(rule: str, scope: Scope, value: float | None, threshold: float | None, fmt=_pct, what: str = "") -> RuleResult | None:
    if threshold is None:
        return None
    if value is None:
        return RuleResult(rule=rule, scope=scope, value=None, threshold=threshold, breached=False, detail=f"{what} not measurable here")
    breached = value > threshold
    op = ">" if breached else "<="
    return RuleResult(rule=rule, scope=scope, value=value, threshold=threshold, breached=breached, detail=f"{what} {fmt(value)} {op} {fmt(threshold)}")


OWN_IO_SHARE = 0.5  # an attempt that did at least this share of the host's disk bytes owns its io stall


def _own_share(stall_us: int | None, host: HostDelta, counters: CounterDelta) -> float | None:
    """The attempt's own PSI stall (per-cgroup, microseconds) as a share of its wall time."""
    wall = counters.wall_s if counters.wall_s > 0 else host.wall_s
    return stall_us / (wall * 1e6) if stall_us is not None and wall > 0 else None


def _io_rule(sla: SLA, host: HostDelta, counters: CounterDelta | None) -> RuleResult | None:
    """host_io_pressure, with the attempt's own io stall taken out when the attempt itself did
    most of the disk traffic: an agent cannot get its failures discarded by thrashing the disk."""
    value = host.psi_io_some_share
    what = "host io PSI some"
    own_bytes = None if counters is None or counters.io_read_bytes is None else (counters.io_read_bytes or 0) + (counters.io_write_bytes or 0)
    if value is not None and own_bytes is not None and host.disk_bytes and own_bytes >= OWN_IO_SHARE * host.disk_bytes:
        own = _own_share(counters.psi_io_some_us, host, counters)
        value = max(0.0, value - (value if own is None else own))
        what = (f"host io PSI some less the attempt's own (it did {min(1.0, own_bytes / host.disk_bytes):.0%} of the disks' "
                f"{format_size(host.disk_bytes)})")
    return _max_rule("host_io_pressure", "host", value, sla.host_io_pressure, what=what)


def _memory_rule(sla: SLA, host: HostDelta, counters: CounterDelta | None) -> RuleResult | None:
    """host_memory_pressure, less the attempt's own memory stall (its reclaim against its own
    ceiling shows in the host's PSI too): an agent cannot get discarded by thrashing its memory."""
    value, what = host.psi_memory_some_share, "host memory PSI some"
    own = _own_share(counters.psi_memory_some_us, host, counters) if counters is not None else None
    if value is not None and own is not None:
        value, what = max(0.0, value - own), f"host memory PSI some less the attempt's own ({own:.1%})"
    return _max_rule("host_memory_pressure", "host", value, sla.host_memory_pressure, what=what)


def judge(
    sla: SLA,
    host: HostDelta | None,
    counters: CounterDelta | None,
    envelope_mismatches: list[str] | None,
    infra_error: str | None = None,
    upstream: UpstreamSummary | None = None,
    agent_wall_s: float | None = None,
) -> Judgement:
    """Evaluate every rule of ``sla`` on one attempt's measurements."""
    rules: list[RuleResult] = []
    if infra_error:
        rules.append(RuleResult(rule="infra_error", scope="host", value=1, threshold=0, breached=True, detail=infra_error[:300]))
        return Judgement(verdict="discarded", rules=rules)
    mism = envelope_mismatches or []
    rules.append(
        RuleResult(
            rule="envelope_not_applied",
            scope="host",
            value=len(mism),
            threshold=0,
            breached=bool(mism),
            detail="; ".join(mism) if mism else "limits read back equal the profile",
        )
    )
    if host is not None:
        contention = _max_rule("host_cpu_contention", "host", host.foreign_cpu_share, sla.foreign_cpu_share, what="foreign CPU on pinned cores")
        if contention is not None:
            ms = host.foreign_cpu_us / 1000
            contention.detail += f" ({ms:.0f} ms)"
            if contention.breached and ms < sla.foreign_cpu_min_ms:
                contention.breached = False
                contention.detail += f", below the {sla.foreign_cpu_min_ms:.0f} ms measurement floor"
        cands = [
            contention,
            _max_rule("host_steal", "host", host.steal_share, sla.steal_share, what="steal"),
            _memory_rule(sla, host, counters),
            _io_rule(sla, host, counters),
        ]
        if host.monitor_stall_s is not None:
            cands.append(_max_rule("controller_stall", "host", host.monitor_stall_s, sla.controller_stall_s,
                                   fmt=lambda x: f"{x:.1f} s", what="the controller stood still for"))
        rules += [r for r in cands if r is not None]
        if sla.min_mem_available is not None and host.mem_available_min is not None:
            low = host.mem_available_min < sla.min_mem_available
            rules.append(
                RuleResult(
                    rule="host_memory_low",
                    scope="host",
                    value=host.mem_available_min,
                    threshold=sla.min_mem_available,
                    breached=low,
                    detail=f"MemAvailable min {format_size(host.mem_available_min)} {'<' if low else '>='} {format_size(sla.min_mem_available)}",
                )
            )
    if counters is not None:
        r = _max_rule("cpu_throttled", "envelope", counters.throttled_share, sla.throttled_share, what="throttled share")
        if r:
            rules.append(r)
        if sla.memory_pressure_events is not None:
            r = _max_rule(
                "memory_pressure",
                "envelope",
                counters.memory_limit_hits,
                sla.memory_pressure_events,
                fmt=lambda x: f"{x:.0f}",
                what="memory limit hits",
            )
            if r:
                rules.append(r)
    if upstream is not None and upstream.calls:
        for rule, field, attr, what in UPSTREAM_RULES:
            r = _max_rule(rule, "upstream", getattr(upstream, attr), getattr(sla, field), fmt=lambda x: f"{x:.0f}",
                          what=f"{what} (of {upstream.calls})")
            if r:
                rules.append(r)
        if sla.upstream_wait_share is not None and agent_wall_s:
            r = _max_rule("upstream_slow", "upstream", min(1.0, upstream.wait_s / agent_wall_s), sla.upstream_wait_share,
                          what=f"waiting on the model {upstream.wait_s:.1f} s of {agent_wall_s:.1f} s,")
            if r:
                rules.append(r)
    verdict = "discarded" if any(r.breached for r in rules) else "clean"
    return Judgement(verdict=verdict, rules=rules)
