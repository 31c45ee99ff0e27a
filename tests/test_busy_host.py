"""A busy host handled visibly (issue 13, item 7), without an engine: the core probe, the
lock holder's line, refills, the controller-stall and own-I/O rules, the disk parsers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.core import outcome
from harness.core.aggregate import slot_views
from harness.core.plan import pending_slots
from harness.core.sla import judge
from harness.engine import scheduler
from harness.engine.runner import refill_plan
from harness.engine.scheduler import CpuPool
from harness.measure import cgroup
from harness.measure.host import CoreProbe, busy_cores, parse_diskstats
from harness.model.attempt import AttemptRecord
from harness.model.counters import CounterDelta, HostDelta
from harness.model.profile import SLA
from harness.model.run import RunRecord

runner = CliRunner()


def test_probe_names_the_process_that_keeps_a_core_busy():
    core = sorted(os.sched_getaffinity(0))[-1]
    spin = subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        busy = busy_cores([core], 0.3)
    finally:
        spin.kill()
        spin.wait()
    assert core in busy, busy
    share, who = busy[core]
    assert share > 0.8 and any(f"pid {spin.pid} " in w for w in who), who
    time.sleep(0.2)
    after = busy_cores([core], 0.3)  # the spinner is gone (other work on a shared machine may not be)
    assert not any(f"pid {spin.pid} " in w for w in after.get(core, (0, []))[1])


def test_a_probe_begun_early_waits_only_for_what_is_left_of_it():
    # a run begins its probe of the trial cores at start-up and takes the result just before
    # its first lease: start-up longer than the probe costs no wait of its own
    core = sorted(os.sched_getaffinity(0))[-1]
    probe = CoreProbe([core])
    spin = subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.6)  # the start-up
        t0 = time.monotonic()
        busy = probe.result(0.3)
        waited = time.monotonic() - t0
    finally:
        spin.kill()
        spin.wait()
    assert waited < 0.1, waited  # the probe was older than its length: read at once
    assert core in busy and any(f"pid {spin.pid} " in w for w in busy[core][1]), busy
    t0 = time.monotonic()
    CoreProbe([core]).result(0.3)
    assert time.monotonic() - t0 >= 0.3  # a fresh probe still lasts its length


def _pre_run_check(core: int, early: CoreProbe | None) -> tuple[float, list[str]]:
    """Runner._quiet_check on one trial core: (seconds it took, its notices)."""
    from types import SimpleNamespace

    from harness.engine.runner import Runner

    r = Runner.__new__(Runner)  # the check reads only these
    r.pool, r._stop = SimpleNamespace(cpus=[core], reserved=[]), threading.Event()
    r._probe, r._early_probe = CoreProbe([core]), None
    r.take_probe(early)
    notices: list[str] = []
    t0 = time.monotonic()
    r._quiet_check(SimpleNamespace(notice=notices.append), None)
    return time.monotonic() - t0, notices


def _check_beside_a_spinner(core: int, early: CoreProbe | None) -> tuple[float, list[str], int]:
    """The pre-run check while a spinner has held ``core`` for 0.4 s: (seconds, notices, its pid)."""
    spin = subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.4)
        took, notices = _pre_run_check(core, early)
    finally:
        spin.kill()
        spin.wait()
    return took, notices, spin.pid


def test_a_probe_begun_before_the_engine_spares_the_pre_run_wait(monkeypatch):
    # the CLI begins a probe of every core as soon as it is kept to the reserved cores; quiet
    # over that window, the check before the first lease does not wait its 0.3 s out again
    monkeypatch.setenv("HARNESS_PROBE_S", "0.3")
    core = sorted(os.sched_getaffinity(0))[-1]
    early = CoreProbe()
    time.sleep(0.4)  # the imports and the plan
    took, notices = _pre_run_check(core, early)
    assert took < 0.1 and notices == [], (took, notices)
    took, notices = _pre_run_check(core, None)  # none begun early: the run's own probe is waited out
    assert took >= 0.25 and notices == [], (took, notices)


def test_a_neighbour_that_began_late_in_a_long_start_up_is_still_named(monkeypatch):
    # an early probe spanning a long, quiet start-up would average a neighbour that began near
    # its end away (an attack pass found it): past twice the probe's length it is not used
    monkeypatch.setenv("HARNESS_PROBE_S", "0.3")
    core = sorted(os.sched_getaffinity(0))[-1]
    early = CoreProbe()
    time.sleep(1.2)  # a long start-up, quiet
    _, notices, pid = _check_beside_a_spinner(core, early)
    assert len(notices) == 1 and f"pid {pid} " in notices[0], notices


def test_a_core_busy_early_is_probed_again_and_a_busy_one_still_named(monkeypatch):
    # busy in the early window (it may be the plan's own image build): the run's own probe
    # decides; busy there too, the neighbour is named as before
    monkeypatch.setenv("HARNESS_PROBE_S", "0.3")
    core = sorted(os.sched_getaffinity(0))[-1]
    _, notices, pid = _check_beside_a_spinner(core, CoreProbe())
    assert len(notices) == 1 and "busy trial cores" in notices[0] and f"pid {pid} " in notices[0], notices
    early = CoreProbe()
    spin = subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", "while True: pass"])
    time.sleep(0.4)
    spin.kill()
    spin.wait()
    took, notices = _pre_run_check(core, early)  # gone by the run's own probe
    assert notices == [] and took >= 0.25, (took, notices)


def test_a_lease_waiting_for_another_controller_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_LOCK_DIR", str(tmp_path))
    monkeypatch.setattr(scheduler, "WAIT_NOTICE_S", 0.0)
    core = sorted(os.sched_getaffinity(0))[0]
    holder = CpuPool(cpus=[core])
    holder.note = "r-holder\x1b[31m"  # a run id is printed: no terminal escapes get through
    got = holder.lease(1)
    lines: list[str] = []
    waiter = CpuPool(cpus=[core])
    waiter.on_wait = lines.append
    t = threading.Thread(target=lambda: waiter.release(waiter.lease(1, timeout=5)))
    t.start()
    time.sleep(0.6)
    holder.release(got)
    t.join(timeout=10)
    assert lines and lines[0].startswith(f"waiting for core {core} held by pid {os.getpid()} (run r-holder")
    assert "\x1b" not in lines[0]


def att(slot: int, no: int, verdict: str = "discarded", reasons=("host_cpu_contention",), scope: str = "host", outcome_="pass") -> AttemptRecord:
    rules = [{"rule": r, "scope": scope, "breached": True} for r in reasons] if verdict != "clean" else []
    return AttemptRecord(run_id="r", task_id="t", slot=slot, attempt_no=no, seed=slot, verdict=verdict,
                         reasons=list(reasons) if verdict != "clean" else [], rules=rules,
                         outcome=outcome_ if verdict == "clean" else None)


def run_record(**kw) -> RunRecord:
    return RunRecord(id="r", suite="s", suite_hash="h", image="i", agent_cmd=["a"], profile="p", profile_json={},
                     trials=3, ks=[1], max_reruns=0, task_ids=["t"], harness_version="0", **kw)


def test_refill_only_slots_discarded_by_the_host_or_the_upstream():
    atts = [att(0, 1), att(1, 1, reasons=("cpu_throttled",), scope="envelope"), att(2, 1, verdict="clean")]
    refills, kept = refill_plan(run_record(), atts)
    assert refills == {"t/0": 1} and kept == ["t/1"]  # an envelope breach is the agent's own: not re-rolled
    run = run_record(refills=refills)
    views = slot_views(atts, ["t"], 3, 0, run.refills)["t"]
    assert [v.status for v in views] == ["pending", "unmeasured", "pass"]
    pend = pending_slots(atts, ["t"], 3, 0, 0, run.refills)
    assert [(s.slot, s.attempts, s.budget_used) for s in pend.slots] == [(0, 1, 0)]  # attempt 2 next, fresh budget
    # refilled and discarded again: unmeasured again, and kept so (a slot is refilled once)
    again = atts + [att(0, 2)]
    assert slot_views(again, ["t"], 3, 0, run.refills)["t"][0].status == "unmeasured"
    assert refill_plan(run, again) == ({}, ["t/0", "t/1"])
    assert outcome.refillable([att(0, 1, reasons=("upstream_rate_limited",), scope="upstream")])
    # what an agent can cause itself is never refilled: a dead controller, reasons without rules
    assert not outcome.refillable([att(0, 1, reasons=("controller_lost",))])
    bare = AttemptRecord(run_id="r", task_id="t", slot=0, attempt_no=1, seed=0, verdict="discarded", reasons=["cpu_throttled"])
    assert not outcome.refillable([bare])
    assert outcome.refillable([bare.model_copy(update={"reasons": ["infra_error"]})])


def host(**kw) -> HostDelta:
    return HostDelta(**{"wall_s": 10.0, "pinned_cpus": [1], **kw})


def counters(**kw) -> CounterDelta:
    return CounterDelta(**{"wall_s": 10.0, "cpu_usage_us": 5_000_000, **kw})


def test_controller_stall_is_a_host_breach():
    j = judge(SLA(), host(monitor_stall_s=6.2), counters(), [])
    r = next(x for x in j.rules if x.rule == "controller_stall")
    assert j.verdict == "discarded" and r.breached and r.scope == "host" and "6.2 s" in r.detail
    assert judge(SLA(), host(monitor_stall_s=0.3), counters(), []).verdict == "clean"
    assert judge(SLA(controller_stall_s=None), host(monitor_stall_s=60), counters(), []).verdict == "clean"


def test_an_attempts_own_disk_traffic_is_not_host_io_pressure():
    # the attempt did 90% of the disks' bytes and stalled 7 of its 10 s on io itself
    own = counters(io_read_bytes=900 << 20, io_write_bytes=0, psi_io_some_us=7_000_000)
    j = judge(SLA(), host(psi_io_some_share=0.8, disk_bytes=1000 << 20), own, [])
    r = next(x for x in j.rules if x.rule == "host_io_pressure")
    assert not r.breached and r.value == pytest.approx(0.1) and "less the attempt's own" in r.detail
    # the same host pressure with the attempt doing little of the traffic is the host's
    other = counters(io_read_bytes=10 << 20, io_write_bytes=0, psi_io_some_us=7_000_000)
    assert judge(SLA(), host(psi_io_some_share=0.8, disk_bytes=1000 << 20), other, []).verdict == "discarded"


def test_disk_parsers():
    assert cgroup.parse_v1_bps_device("254:0 2097152\n8:0 1048576\n") == {"254:0": 2097152, "8:0": 1048576}
    rd, wr = cgroup.parse_io_max("254:0 rbps=2097152 wbps=max riops=max wiops=max\n8:16 rbps=max wbps=1048576 riops=max wiops=max\n")
    assert rd == {"254:0": 2097152} and wr == {"8:16": 1048576}
    v1 = "254:0 Read 4096\n254:0 Write 8192\n254:0 Sync 0\n254:0 Total 12288\n7:0 Read 100\nTotal 12388\n"
    assert cgroup.parse_io_bytes(v1, 1) == (4196, 8192)
    assert cgroup.parse_io_bytes("254:0 rbytes=10 wbytes=20 rios=1 wios=2 dbytes=0 dios=0\n", 2) == (10, 20)
    stats = ("   7       0 loop0 10 0 800 0 0 0 0 0 0 0 0\n 254       0 vda 100 0 2000 0 50 0 1000 0 0 0 0\n"
             " 254       1 vda1 100 0 2000 0 50 0 1000 0 0 0 0\n")
    assert parse_diskstats(stats, {"vda", "loop0"}) == (2000 + 1000) * 512


def test_options_are_checked_before_anything_runs():
    r = runner.invoke(app, ["run", "--suite", "refunds", "--refill-unmeasured"])
    assert r.exit_code == 2 and "give --resume RUN with it" in r.output
    r = runner.invoke(app, ["run", "--suite", "refunds", "--wait-quiet", "-1"])
    assert r.exit_code == 2
    r = runner.invoke(app, ["run", "--suite", "refunds", "--max-unmeasured", "1.5"])
    assert r.exit_code == 2


def test_an_attempts_own_memory_stall_is_not_host_memory_pressure():
    # an agent thrashing against its own ceiling: 3.6 of its 10 s stalled on memory, host PSI 0.36
    own = counters(psi_memory_some_us=3_600_000)
    j = judge(SLA(), host(psi_memory_some_share=0.36), own, [])
    r = next(x for x in j.rules if x.rule == "host_memory_pressure")
    assert not r.breached and r.value == pytest.approx(0.0) and "less the attempt's own" in r.detail
    assert judge(SLA(), host(psi_memory_some_share=0.36), counters(psi_memory_some_us=0), []).verdict == "discarded"


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e9", "soon"])
def test_a_bad_probe_length_is_a_usage_error_before_anything_is_stored(value, tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_PROBE_S", value)
    r = runner.invoke(app, ["run", "--suite", "refunds", "--db", f"sqlite:///{tmp_path}/h.db"])
    assert r.exit_code == 2 and "HARNESS_PROBE_S" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "h.db").exists()
