"""The SLA judge on plain data: every rule is data, breaches name value and threshold."""

from __future__ import annotations

from harness.model.counters import CounterDelta, HostDelta
from harness.model.profile import SLA
from harness.core.sla import judge


def host(**kw) -> HostDelta:
    base = dict(wall_s=2.0, pinned_cpus=[1], foreign_cpu_us=0, foreign_cpu_share=0.0, steal_share=0.0,
                psi_cpu_some_share=0.0, psi_memory_some_share=0.0, psi_io_some_share=0.0, mem_available_min=8 << 30)
    base.update(kw)
    return HostDelta(**base)


def counters(**kw) -> CounterDelta:
    base = dict(wall_s=2.0, cpu_usage_us=1_000_000, throttled_share=0.0, memory_limit_hits=0)
    base.update(kw)
    return CounterDelta(**base)


def test_quiet_attempt_is_clean_and_every_rule_is_recorded():
    j = judge(SLA(), host(), counters(), [])
    assert j.verdict == "clean"
    names = {r.rule for r in j.rules}
    assert {"envelope_not_applied", "host_cpu_contention", "host_steal", "host_memory_pressure", "host_io_pressure", "host_memory_low"} <= names


def test_foreign_cpu_breach_names_value_and_threshold():
    j = judge(SLA(), host(foreign_cpu_share=0.48, foreign_cpu_us=960_000), counters(), [])
    assert j.verdict == "discarded" and j.reasons == ["host_cpu_contention"]
    r = j.breaches[0]
    assert (r.scope, r.value, r.threshold) == ("host", 0.48, 0.10)
    assert "48.0% > 10.0%" in r.detail


def test_tick_rounding_on_a_short_attempt_is_not_contention():
    # 20 ms of foreign time on a 0.1 s attempt is 20%, but below the 50 ms measurement floor
    j = judge(SLA(), host(wall_s=0.1, foreign_cpu_share=0.2, foreign_cpu_us=20_000), counters(), [])
    assert j.verdict == "clean"
    assert "floor" in next(r for r in j.rules if r.rule == "host_cpu_contention").detail


def test_envelope_not_applied_and_infra_error():
    assert judge(SLA(), host(), counters(), ["pids_max: profile 64, kernel 128"]).reasons == ["envelope_not_applied"]
    j = judge(SLA(), None, None, None, infra_error="image missing")
    assert j.verdict == "discarded" and j.reasons == ["infra_error"]


def test_envelope_rules_are_off_by_default_and_scoped_envelope_when_on():
    c = counters(throttled_share=0.7, memory_limit_hits=40)
    assert judge(SLA(), host(), c, []).verdict == "clean"
    j = judge(SLA(throttled_share=0.5, memory_pressure_events=10), host(), c, [])
    assert sorted(j.reasons) == ["cpu_throttled", "memory_pressure"]
    assert j.only_envelope


def test_unmeasurable_values_never_breach():
    j = judge(SLA(), host(psi_memory_some_share=None, psi_io_some_share=None), counters(), [])
    assert j.verdict == "clean"
    assert any("not measurable" in r.detail for r in j.rules)


def test_low_host_memory():
    j = judge(SLA(min_mem_available="1g"), host(mem_available_min=100 << 20), counters(), [])
    assert j.reasons == ["host_memory_low"]
