"""harness.measure.host on recorded /proc trees (tests/fixtures/proc/), plus HostDelta.

host_a -> host_a_end: 4 CPUs, USER_HZ 100 (1 tick = 10 000 µs), 5 s apart.
Per-CPU busy deltas (user+nice+system+irq+softirq, in ticks): cpu0 310, cpu1 250,
cpu2 180, cpu3 120; steal +40 ticks over all CPUs; host PSI cpu some +300 000 µs,
memory some +50 000 µs, io some +0.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from harness.measure.cgroup import locate, read_snapshot
from harness.model.counters import PSI, CounterDelta, HostDelta, HostSnapshot
from harness.measure.host import (
    CpuTimes,
    HostSampler,
    host_facts,
    mem_available,
    parse_cpuinfo_model,
    parse_meminfo,
    parse_proc_stat,
    read_host_snapshot,
)

FX = Path(__file__).parent / "fixtures"
PROC = FX / "proc"
GiB = 1 << 30

HOST_A = HostSnapshot(
    t=100.0,
    cpu_busy_us={0: 627_000_000, 1: 514_000_000, 2: 131_200_000, 3: 102_000_000},
    cpu_total_us={0: 4_636_000_000, 1: 4_619_000_000, 2: 4_632_200_000, 3: 4_622_700_000},
    steal_us=4_000_000,
    cpu_steal_us={0: 1_000_000, 1: 2_000_000, 2: 500_000, 3: 500_000},
    psi_cpu=PSI(some_us=120_000_000, full_us=0),
    psi_memory=PSI(some_us=5_000_000, full_us=2_000_000),
    psi_io=PSI(some_us=8_000_000, full_us=7_000_000),
    mem_available=8 * GiB,
)
HOST_A_END = HostSnapshot(
    t=105.0,
    cpu_busy_us={0: 630_100_000, 1: 516_500_000, 2: 133_000_000, 3: 103_200_000},
    cpu_total_us={0: 4_641_000_000, 1: 4_623_950_000, 2: 4_637_200_000, 3: 4_627_730_000},
    steal_us=4_400_000,
    cpu_steal_us={0: 1_100_000, 1: 2_150_000, 2: 600_000, 3: 550_000},
    psi_cpu=PSI(some_us=120_300_000, full_us=0),
    psi_memory=PSI(some_us=5_050_000, full_us=2_010_000),
    psi_io=PSI(some_us=8_000_000, full_us=7_000_000),
    mem_available=6 * GiB,
)


def test_parse_proc_stat_fixture():
    got = parse_proc_stat((PROC / "host_a" / "stat").read_text(), clk_tck=100)
    assert got == CpuTimes(HOST_A.cpu_busy_us, HOST_A.cpu_total_us, 4_000_000, HOST_A.cpu_steal_us)


def test_parse_proc_stat_guest_not_double_counted_and_other_hz():
    # user 100 includes guest 40; idle 300, iowait 20, irq 5, softirq 5, steal 30.
    text = "cpu  100 0 50 300 20 5 5 30 40 0\ncpu0 100 0 50 300 20 5 5 30 40 0\nintr 1 2 3\n"
    assert parse_proc_stat(text, clk_tck=250) == CpuTimes({0: 640_000}, {0: 2_040_000}, 120_000, {0: 120_000})


def test_parse_proc_stat_short_lines_and_offline_cpu():
    # Old kernels print 7 columns (no steal/guest); offline cpu1 has no line at all.
    text = "cpu  10 0 10 80 0 0 0\ncpu0 10 0 10 80 0 0 0\ncpu2 1 1 1 1 1 1 1\n"
    assert parse_proc_stat(text, clk_tck=100) == CpuTimes({0: 200_000, 2: 50_000}, {0: 1_000_000, 2: 70_000}, 0, {0: 0, 2: 0})


def test_parse_proc_stat_without_cpu_lines():
    with pytest.raises(ValueError, match="cpuN"):
        parse_proc_stat("intr 1\nctxt 2\n")


def test_parse_meminfo():
    m = parse_meminfo((PROC / "host_a" / "meminfo").read_text())
    assert m["MemTotal"] == 16314236 * 1024
    assert m["MemAvailable"] == 8 * GiB
    assert m["HugePages_Total"] == 0  # unitless, kept as is
    assert m["Hugepagesize"] == 2048 * 1024
    assert len(m) == 18


def test_mem_available_fallback_before_3_14():
    m = parse_meminfo("MemTotal: 4000 kB\nMemFree: 1000 kB\nBuffers: 200 kB\nCached: 300 kB\n")
    assert mem_available(m) == 1500 * 1024
    with pytest.raises(ValueError):
        mem_available({"MemTotal": 1})


def test_read_host_snapshot_fixtures():
    assert read_host_snapshot(100.0, proc_root=PROC / "host_a", clk_tck=100) == HOST_A
    assert read_host_snapshot(105.0, proc_root=PROC / "host_a_end", clk_tck=100) == HOST_A_END


def test_read_host_snapshot_cpu_psi_without_full():
    s = read_host_snapshot(1.0, proc_root=PROC / "host_old", clk_tck=100)
    assert s.psi_cpu == PSI(some_us=777, full_us=None)
    assert s.psi_memory == PSI(some_us=55, full_us=44)
    assert s.psi_io == PSI(some_us=66, full_us=33)
    assert s.cpu_busy_us == {0: 15_200_000, 1: 27_380_000}
    assert s.steal_us == 70_000 and s.cpu_steal_us == {0: 0, 1: 70_000}
    assert s.mem_available == 3_000_000 * 1024


def test_read_host_snapshot_without_psi():
    s = read_host_snapshot(1.0, proc_root=PROC / "host_nopsi", clk_tck=100)
    assert (s.psi_cpu, s.psi_memory, s.psi_io) == (None, None, None)


def test_read_host_snapshot_bad_root(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a mounted /proc"):
        read_host_snapshot(0.0, proc_root=tmp_path)


def test_host_delta_foreign_cpu_share():
    """Trial pinned to cpus 2-3 (v2_cgroupfs fixture: +2.5 s cgroup CPU over the same 5 s)."""
    tree = FX / "cgroup" / "v2_cgroupfs"
    tree_end = FX / "cgroup" / "v2_cgroupfs_end"
    a = read_snapshot(locate(4242, tree / "proc", tree), 100.0)
    b = read_snapshot(locate(4242, tree_end / "proc", tree_end), 105.0)
    cg = CounterDelta.between(a, b)
    assert cg.cpu_usage_us == 2_500_000

    d = HostDelta.between(HOST_A, HOST_A_END, pinned=[2, 3], cgroup_cpu_us=cg.cpu_usage_us,
                          mem_available_min=5 * GiB)
    # busy on cpus 2,3: (180 + 120) ticks * 10 000 µs = 3 000 000 µs; foreign = 3.0 s - 2.5 s.
    assert d.wall_s == 5.0
    assert d.pinned_cpus == [2, 3]
    assert d.pinned_busy_us == 3_000_000
    assert d.foreign_cpu_us == 500_000
    assert d.foreign_cpu_share == pytest.approx(0.05)  # 0.5 s / (5 s * 2 cpus)
    # steal on the pinned cpus 2, 3: (10 + 5) ticks = 0.15 s / (5 s * 2 cpus); the other cpus'
    # (the controller's, busy serving an agent's output) are not the trial's
    assert d.steal_share == pytest.approx(0.015)
    old = HostDelta.between(HOST_A.model_copy(update={"cpu_steal_us": {}}), HOST_A_END, pinned=[2, 3], cgroup_cpu_us=0)
    assert old.steal_share == pytest.approx(0.02)  # a snapshot without per-CPU steal: 0.4 s / (5 s * 4 cpus)
    assert HostDelta.between(HOST_A, HOST_A_END, pinned=[], cgroup_cpu_us=0).steal_share == pytest.approx(0.02)
    assert d.psi_cpu_some_share == pytest.approx(0.06)  # 0.3 s / 5 s
    assert d.psi_memory_some_share == pytest.approx(0.01)
    assert d.psi_io_some_share == 0.0
    assert d.mem_available_min == 5 * GiB


def test_host_delta_no_foreign_when_cgroup_accounts_for_all():
    d = HostDelta.between(HOST_A, HOST_A_END, pinned=[3], cgroup_cpu_us=1_300_000)
    # cpu3 busy +1.2 s < cgroup 1.3 s (tick granularity): clamped to 0, not negative.
    assert (d.pinned_busy_us, d.foreign_cpu_us, d.foreign_cpu_share) == (1_200_000, 0, 0.0)
    assert d.mem_available_min == 6 * GiB


def test_parse_cpuinfo_model():
    assert parse_cpuinfo_model((PROC / "host_a" / "cpuinfo").read_text()) == "AMD EPYC 7B13"
    assert parse_cpuinfo_model((PROC / "host_old" / "cpuinfo").read_text()) == "BCM2835"
    assert parse_cpuinfo_model("") is None


def test_host_facts_fixtures():
    assert host_facts(PROC / "host_a", sys_root=FX / "cgroup" / "v2_cgroupfs") == {
        "kernel": "6.8.0-45-generic",
        "cpu_model": "AMD EPYC 7B13",
        "logical_cpus": 4,
        "memory_total": 16314236 * 1024,
        "cgroup_version": "2",
        "psi": True,
        "hostname": "runner-a",
    }
    assert host_facts(PROC / "host_old", sys_root=FX / "cgroup" / "v1_hybrid") == {
        "kernel": "5.10.0-28-arm64",
        "cpu_model": "BCM2835",
        "logical_cpus": 2,
        "memory_total": 4030000 * 1024,
        "cgroup_version": "1 (hybrid)",
        "psi": True,
        "hostname": "old-pi",
    }
    f = host_facts(PROC / "host_nopsi", sys_root=FX / "cgroup" / "v1_nested")
    assert (f["cgroup_version"], f["psi"], f["kernel"]) == ("1", False, "4.19.0-26-amd64")


def test_live_host_snapshot_and_facts():
    a = read_host_snapshot(time.monotonic())
    b = read_host_snapshot(time.monotonic())
    assert set(a.cpu_busy_us) == set(a.cpu_total_us) and len(a.cpu_busy_us) >= 1
    assert all(b.cpu_total_us[c] >= a.cpu_total_us[c] for c in a.cpu_total_us)
    assert all(a.cpu_busy_us[c] <= a.cpu_total_us[c] for c in a.cpu_busy_us)
    assert a.mem_available > 0
    facts = host_facts()
    assert facts["kernel"] == os.uname().release
    assert facts["logical_cpus"] == len(a.cpu_busy_us)
    assert facts["cgroup_version"] in ("1", "1 (hybrid)", "2")
    assert facts["psi"] == (a.psi_cpu is not None)


@pytest.mark.parametrize("tree", ["host_a", "host_a_end", "host_old", "host_nopsi"])
def test_the_sampler_reads_what_a_host_snapshot_reads(tree):
    """The 5 Hz sample's lean host read (pinned CPUs, MemAvailable) equals the full parse."""
    full = read_host_snapshot(0.0, proc_root=PROC / tree, clk_tck=100)
    for cpus in ([0], [1, 3], sorted(full.cpu_busy_us), [0, 99]):
        got = HostSampler(cpus, proc_root=PROC / tree, clk_tck=100)
        assert got.busy_us() == {c: full.cpu_busy_us[c] for c in cpus if c in full.cpu_busy_us}
        assert got.mem_available() == full.mem_available


def test_the_sampler_on_the_live_host():
    full = read_host_snapshot(0.0)
    cpus = sorted(full.cpu_busy_us)
    busy = HostSampler(cpus).busy_us()
    assert busy.keys() == full.cpu_busy_us.keys()
    assert all(0 <= busy[c] - full.cpu_busy_us[c] < 60_000_000 for c in cpus)  # later, never less


def test_the_sampler_without_memavailable(tmp_path):
    (tmp_path / "stat").write_text("cpu  1 0 0 0 0 0 0 0\ncpu0 1 0 0 0 0 0 0 0\nintr 0\n")
    (tmp_path / "meminfo").write_text("MemTotal: 4 kB\nMemFree: 1 kB\nBuffers: 1 kB\nCached: 1 kB\n")
    assert HostSampler([0], proc_root=tmp_path, clk_tck=100).mem_available() == 3 * 1024
    with pytest.raises(FileNotFoundError):
        HostSampler([0], proc_root=tmp_path / "none").busy_us()
