"""harness.measure.cgroup on recorded and hand-written cgroup trees (tests/fixtures/cgroup/README.md).

Expected values are written out from the fixture files, never recomputed by the code
under test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import missing

from harness.measure.cgroup import (
    CgroupError,
    CgroupMount,
    CgroupPaths,
    SnapshotReader,
    detect_cgroup_version,
    guess_driver,
    locate,
    parse_cpu_max,
    parse_cpuset,
    parse_flat_keyed,
    parse_max_value,
    parse_mountinfo,
    parse_proc_cgroup,
    parse_psi,
    parse_v1_bytes_limit,
    parse_v1_quota,
    read_limits,
    read_snapshot,
    write_limits,
)
from harness.model.counters import PSI, CgroupLimits, CgroupSnapshot, CounterDelta

FX = Path(__file__).parent / "fixtures" / "cgroup"
PID = 4242

V1_ID = "bc010e91511912a77c2e81a3f27232ad9c71ffa45a645c24c21aef80819524f3"
V2_ID = "d41254dfe5bf4ecd4b67439e8a881f95b3d7689ab8f188f6aa8bd4d02ecc5f6a"
SD_ID = "35f95d053f6256a15931ba759eaadd3d9b59d74aa47e730a1cd95832a717472e"
OLD_ID = "76d27e2e44ce4060f7f9e3b89e76148dd4384dfeba4bf5eb66e639373786167d"
OUTER = "8225ac9a77b7bfe0b311611c3a740b1c18ce99f912d089e1607930ce766b0684"
INNER = "7b614d98f34a23c95b549f80c6a5f93e43210e1184bb3a33c0d39cdf9045aaaf"
OUTER2 = "fe1d2456a6464914839b3b0ed1b41612c67ef9d8f3cde8a76d7e43b73d356c5a"
INNER2 = "d6b6d8d83f8ef2b388a23cd21f04b3a3c0d99252f1df7cac48aa464a51f4fdce"


def at(tree: str) -> CgroupPaths:
    return locate(PID, proc_root=FX / tree / "proc", sys_root=FX / tree)


def cg(tree: str, rel: str) -> str:
    return os.path.normpath(str(FX / tree / "sys/fs/cgroup" / rel))


def text(tree: str, rel: str) -> str:
    return (FX / tree / rel).read_text()


# --------------------------------------------------------------------------- /proc/<pid>/cgroup


def test_parse_proc_cgroup_v1_hybrid():
    p = f"/docker/{V1_ID}"
    assert parse_proc_cgroup(text("v1_hybrid", f"proc/{PID}/cgroup")) == {
        "name=systemd": p, "pids": p, "blkio": p, "freezer": p, "devices": p,
        "memory": p, "cpuset": p, "cpuacct": p, "cpu": p, "": p,
    }


def test_parse_proc_cgroup_comounted_and_named():
    got = parse_proc_cgroup("5:cpu,cpuacct:/a/b\n10:net_cls,net_prio:/a/b\n1:name=systemd:/x.slice\n0::/\n")
    assert got == {"cpu": "/a/b", "cpuacct": "/a/b", "net_cls": "/a/b", "net_prio": "/a/b",
                   "name=systemd": "/x.slice", "": "/"}


def test_parse_proc_cgroup_v2_only_and_colon_in_path():
    assert parse_proc_cgroup(f"0::/system.slice/docker-{SD_ID}.scope\n") == {
        "": f"/system.slice/docker-{SD_ID}.scope"
    }
    assert parse_proc_cgroup("0::/odd:name\n") == {"": "/odd:name"}


def test_parse_proc_cgroup_malformed():
    with pytest.raises(CgroupError, match="malformed"):
        parse_proc_cgroup("4 memory /docker/x\n")


# --------------------------------------------------------------------------- mountinfo


def test_parse_mountinfo_v1_hybrid_real():
    mounts = parse_mountinfo(text("v1_hybrid", "proc/self/mountinfo"))
    assert mounts == [
        CgroupMount(mount_point="/sys/fs/cgroup/cpu", root="/", fstype="cgroup", controllers=("cpu",)),
        CgroupMount(mount_point="/sys/fs/cgroup/cpuacct", root="/", fstype="cgroup", controllers=("cpuacct",)),
        CgroupMount(mount_point="/sys/fs/cgroup/cpuset", root="/", fstype="cgroup", controllers=("cpuset",)),
        CgroupMount(mount_point="/sys/fs/cgroup/memory", root="/", fstype="cgroup", controllers=("memory",)),
        CgroupMount(mount_point="/sys/fs/cgroup/devices", root="/", fstype="cgroup", controllers=("devices",)),
        CgroupMount(mount_point="/sys/fs/cgroup/freezer", root="/", fstype="cgroup", controllers=("freezer",)),
        CgroupMount(mount_point="/sys/fs/cgroup/blkio", root="/", fstype="cgroup", controllers=("blkio",)),
        CgroupMount(mount_point="/sys/fs/cgroup/pids", root="/", fstype="cgroup", controllers=("pids",)),
        CgroupMount(mount_point="/sys/fs/cgroup/systemd", root="/", fstype="cgroup", controllers=("name=systemd",)),
        CgroupMount(mount_point="/sys/fs/cgroup/unified", root="/", fstype="cgroup2", controllers=()),
    ]


def test_parse_mountinfo_v2():
    assert parse_mountinfo(text("v2_cgroupfs", "proc/self/mountinfo")) == [
        CgroupMount(mount_point="/sys/fs/cgroup", root="/", fstype="cgroup2", controllers=()),
    ]


def test_parse_mountinfo_nested_roots_and_options():
    mounts = {m.mount_point: m for m in parse_mountinfo(text("v1_nested", "proc/self/mountinfo"))}
    assert len(mounts) == 12
    assert mounts["/sys/fs/cgroup/cpu,cpuacct"] == CgroupMount(
        mount_point="/sys/fs/cgroup/cpu,cpuacct", root=f"/docker/{OUTER}", fstype="cgroup",
        controllers=("cpu", "cpuacct"),
    )
    # "xattr" is a mount flag, not a controller.
    assert mounts["/sys/fs/cgroup/systemd"].controllers == ("name=systemd",)
    assert mounts["/sys/fs/cgroup/net_cls,net_prio"].controllers == ("net_cls", "net_prio")


def test_parse_mountinfo_octal_escapes_and_optional_fields():
    line = r"40 31 0:37 /a\040b /mnt/cg\040root rw,relatime shared:5 master:1 - cgroup2 cgroup2 rw" + "\n"
    assert parse_mountinfo(line) == [
        CgroupMount(mount_point="/mnt/cg root", root="/a b", fstype="cgroup2", controllers=())
    ]


def test_parse_mountinfo_malformed():
    with pytest.raises(CgroupError, match="separator"):
        parse_mountinfo("40 31 0:37 / /sys/fs/cgroup rw cgroup2 cgroup2 rw\n")


# --------------------------------------------------------------------------- file-format parsers


def test_parse_flat_keyed_v2_cpu_stat():
    assert parse_flat_keyed(text("v2_cgroupfs", f"sys/fs/cgroup/docker/{V2_ID}/cpu.stat")) == {
        "usage_usec": 8123456, "user_usec": 6100000, "system_usec": 2023456,
        "core_sched.force_idle_usec": 0, "nr_periods": 1200, "nr_throttled": 85,
        "throttled_usec": 2345678, "nr_bursts": 0, "burst_usec": 0,
    }


def test_parse_flat_keyed_v1_cpu_stat_and_oom_control():
    assert parse_flat_keyed(text("v1_hybrid_end", f"sys/fs/cgroup/cpu/docker/{V1_ID}/cpu.stat")) == {
        "nr_periods": 42, "nr_throttled": 32, "throttled_time": 1500416581, "nr_bursts": 0, "burst_time": 0,
    }
    assert parse_flat_keyed(text("v1_hybrid_end", f"sys/fs/cgroup/memory/docker/{V1_ID}/memory.oom_control")) == {
        "oom_kill_disable": 0, "under_oom": 0, "oom_kill": 1,
    }


def test_parse_flat_keyed_events_and_stat():
    d = f"sys/fs/cgroup/docker/{V2_ID}/"
    assert parse_flat_keyed(text("v2_cgroupfs", d + "memory.events")) == {
        "low": 0, "high": 0, "max": 12, "oom": 1, "oom_kill": 1, "oom_group_kill": 0,
    }
    assert parse_flat_keyed(text("v2_cgroupfs", d + "pids.events")) == {"max": 0}
    stat = parse_flat_keyed(text("v2_cgroupfs", d + "memory.stat"))
    assert stat["anon"] == 150994944 and stat["file"] == 41943040 and stat["pgmajfault"] == 12
    assert len(stat) == 56
    v1stat = parse_flat_keyed(text("v1_hybrid", f"sys/fs/cgroup/memory/docker/{V1_ID}/memory.stat"))
    assert v1stat["hierarchical_memory_limit"] == 67108864


def test_parse_flat_keyed_skips_non_numeric_and_blank():
    assert parse_flat_keyed("a 1\n\nb max\nc 2 3\nd 4\n") == {"a": 1, "d": 4}


def test_parse_psi_with_full():
    got = parse_psi(text("v1_hybrid_end", f"sys/fs/cgroup/unified/docker/{V1_ID}/cpu.pressure"))
    assert got == PSI(some_us=1591905, full_us=1512270)


def test_parse_psi_without_full_line():
    got = parse_psi(text("v2_old_kernel", f"sys/fs/cgroup/docker/{OLD_ID}/cpu.pressure"))
    assert got == PSI(some_us=5120, full_us=None)


def test_parse_psi_empty_and_malformed():
    assert parse_psi("") is None
    with pytest.raises(CgroupError, match="total="):
        parse_psi("some avg10=0.00 avg60=0.00 avg300=0.00\n")


def test_parse_cpu_max():
    assert parse_cpu_max("max 100000\n") == (None, 100000)
    assert parse_cpu_max("150000 100000\n") == (150000, 100000)
    assert parse_cpu_max("50000") == (50000, None)
    with pytest.raises(CgroupError):
        parse_cpu_max("")


def test_parse_max_value():
    assert parse_max_value("max\n") is None
    assert parse_max_value("256\n") == 256
    assert parse_max_value("0\n") == 0
    with pytest.raises(CgroupError):
        parse_max_value("\n")


def test_parse_v1_limits():
    assert parse_v1_bytes_limit("9223372036854771712\n") is None  # 4 KiB pages
    assert parse_v1_bytes_limit("9223372036854710272\n") is None  # 64 KiB pages
    assert parse_v1_bytes_limit("67108864\n") == 67108864
    assert parse_v1_quota("-1\n") is None
    assert parse_v1_quota("50000\n") == 50000


def test_parse_cpuset():
    assert parse_cpuset("0-3,5,7-8\n") == [0, 1, 2, 3, 5, 7, 8]
    assert parse_cpuset("1\n") == [1]
    assert parse_cpuset("\n") == []
    assert parse_cpuset("3,1,2-3") == [1, 2, 3]
    with pytest.raises(CgroupError):
        parse_cpuset("5-2")


def test_guess_driver():
    assert guess_driver(f"/system.slice/docker-{SD_ID}.scope") == "systemd"
    assert guess_driver(f"/docker/{V2_ID}") == "cgroupfs"
    assert guess_driver("/user.slice/user-1000.slice/session-3.scope") == "cgroupfs"
    assert guess_driver(f"/docker-{SD_ID}.scope") == "cgroupfs"  # no enclosing .slice


# --------------------------------------------------------------------------- locate


def test_locate_v2_cgroupfs():
    d = cg("v2_cgroupfs", f"docker/{V2_ID}")
    assert at("v2_cgroupfs") == CgroupPaths(
        version=2, driver="cgroupfs", cgroup_path=f"/docker/{V2_ID}",
        cpu=d, cpuacct=d, cpuset=d, memory=d, pids=d, unified=d, blkio=d,
    )


def test_locate_v2_systemd():
    d = cg("v2_systemd", f"system.slice/docker-{SD_ID}.scope")
    assert at("v2_systemd") == CgroupPaths(
        version=2, driver="systemd", cgroup_path=f"/system.slice/docker-{SD_ID}.scope",
        cpu=d, cpuacct=d, cpuset=d, memory=d, pids=d, unified=d, blkio=d,
    )


def test_locate_v1_hybrid():
    assert at("v1_hybrid") == CgroupPaths(
        version=1, driver="cgroupfs", cgroup_path=f"/docker/{V1_ID}",
        cpu=cg("v1_hybrid", f"cpu/docker/{V1_ID}"),
        cpuacct=cg("v1_hybrid", f"cpuacct/docker/{V1_ID}"),
        cpuset=cg("v1_hybrid", f"cpuset/docker/{V1_ID}"),
        memory=cg("v1_hybrid", f"memory/docker/{V1_ID}"),
        pids=cg("v1_hybrid", f"pids/docker/{V1_ID}"),
        unified=cg("v1_hybrid", f"unified/docker/{V1_ID}"),
    )


def test_locate_v1_nested_mount_root():
    d = f"cpu,cpuacct/docker/{INNER}"
    assert at("v1_nested") == CgroupPaths(
        version=1, driver="cgroupfs", cgroup_path=f"/docker/{OUTER}/docker/{INNER}",
        cpu=cg("v1_nested", d), cpuacct=cg("v1_nested", d),
        cpuset=cg("v1_nested", f"cpuset/docker/{INNER}"),
        memory=cg("v1_nested", f"memory/docker/{INNER}"),
        pids=cg("v1_nested", f"pids/docker/{INNER}"),
        unified=None,
    )


def test_locate_v2_nested_mount_root():
    d = cg("v2_nested", f"docker/{INNER2}")
    assert at("v2_nested") == CgroupPaths(
        version=2, driver="cgroupfs", cgroup_path=f"/docker/{OUTER2}/docker/{INNER2}",
        cpu=d, cpuacct=d, cpuset=d, memory=d, pids=d, unified=d, blkio=d,
    )


def _copy(tree: str, tmp_path: Path) -> Path:
    dst = tmp_path / tree
    shutil.copytree(FX / tree, dst)
    return dst


def test_locate_error_pid_gone(tmp_path):
    with pytest.raises(CgroupError, match=r"proc/999/cgroup not found.*container exited"):
        locate(999, proc_root=FX / "v2_cgroupfs" / "proc", sys_root=FX / "v2_cgroupfs")


def test_locate_error_missing_memory_line(tmp_path):
    root = _copy("v1_hybrid", tmp_path)
    f = root / f"proc/{PID}/cgroup"
    f.write_text("".join(l for l in f.read_text().splitlines(True) if ":memory:" not in l))
    with pytest.raises(CgroupError, match=r"controller 'memory' has no line in .*4242/cgroup"):
        locate(PID, proc_root=root / "proc", sys_root=root)


def test_locate_error_missing_v1_mount(tmp_path):
    root = _copy("v1_hybrid", tmp_path)
    f = root / "proc/self/mountinfo"
    f.write_text("".join(l for l in f.read_text().splitlines(True) if "cgroup/cpuacct" not in l))
    with pytest.raises(CgroupError, match=r"controller 'cpuacct': no cgroup v1 mount"):
        locate(PID, proc_root=root / "proc", sys_root=root)


def test_locate_v1_without_pids_controller_is_none(tmp_path):
    root = _copy("v1_hybrid", tmp_path)
    f = root / f"proc/{PID}/cgroup"
    f.write_text("".join(l for l in f.read_text().splitlines(True) if ":pids:" not in l))
    assert locate(PID, proc_root=root / "proc", sys_root=root).pids is None


def test_locate_error_container_dir_gone(tmp_path):
    root = _copy("v2_cgroupfs", tmp_path)
    shutil.rmtree(root / f"sys/fs/cgroup/docker/{V2_ID}")
    with pytest.raises(CgroupError, match=r"no directory on the host.*container may have exited"):
        locate(PID, proc_root=root / "proc", sys_root=root)


def test_locate_error_v2_without_cgroup2_mount(tmp_path):
    root = _copy("v2_cgroupfs", tmp_path)
    f = root / "proc/self/mountinfo"
    f.write_text("".join(l for l in f.read_text().splitlines(True) if "cgroup2" not in l))
    with pytest.raises(CgroupError, match="no cgroup2 mount"):
        locate(PID, proc_root=root / "proc", sys_root=root)


def test_locate_error_path_outside_mount_root(tmp_path):
    root = _copy("v2_nested", tmp_path)
    (root / f"proc/{PID}/cgroup").write_text("0::/elsewhere/x\n")
    with pytest.raises(CgroupError, match="path outside the mount root"):
        locate(PID, proc_root=root / "proc", sys_root=root)


def test_locate_error_foreign_cgroup_namespace(tmp_path):
    root = _copy("v2_cgroupfs", tmp_path)
    (root / f"proc/{PID}/cgroup").write_text(f"0::/../../docker/{V2_ID}\n")
    with pytest.raises(CgroupError, match="outside this process's cgroup namespace.*--cgroupns=host"):
        locate(PID, proc_root=root / "proc", sys_root=root)


def test_locate_error_no_lines(tmp_path):
    root = _copy("v2_cgroupfs", tmp_path)
    (root / f"proc/{PID}/cgroup").write_text("1:name=systemd:/x\n")
    with pytest.raises(CgroupError, match="neither v1 controller lines nor a v2"):
        locate(PID, proc_root=root / "proc", sys_root=root)


def test_detect_cgroup_version():
    assert detect_cgroup_version(FX / "v2_cgroupfs") == "2"
    assert detect_cgroup_version(FX / "v1_hybrid") == "1 (hybrid)"
    assert detect_cgroup_version(FX / "v1_nested") == "1"


# --------------------------------------------------------------------------- limits


def test_read_limits_v2_cgroupfs():
    assert read_limits(at("v2_cgroupfs")) == CgroupLimits(
        cgroup_version=2, cpu_quota_us=150000, cpu_period_us=100000, cpuset_cpus=[2, 3],
        memory_max=536870912, memsw_max=536870912, swap_max=0, pids_max=256,
    )


def test_read_limits_v2_systemd_unlimited():
    assert read_limits(at("v2_systemd")) == CgroupLimits(
        cgroup_version=2, cpu_quota_us=None, cpu_period_us=100000, cpuset_cpus=[0, 1, 2, 3, 4, 5, 6, 7],
        memory_max=None, memsw_max=None, swap_max=None, pids_max=None,
    )


def test_read_limits_v2_old_kernel():
    assert read_limits(at("v2_old_kernel")) == CgroupLimits(
        cgroup_version=2, cpu_quota_us=100000, cpu_period_us=100000, cpuset_cpus=[1, 3],
        memory_max=268435456, memsw_max=536870912, swap_max=268435456, pids_max=128,
    )


def test_read_limits_v2_cpuset_fallback(tmp_path):
    root = _copy("v2_old_kernel", tmp_path)
    d = root / f"sys/fs/cgroup/docker/{OLD_ID}"
    (d / "cpuset.cpus.effective").unlink()
    (d / "cpuset.cpus").write_text("0-1\n")
    assert read_limits(locate(PID, root / "proc", root)).cpuset_cpus == [0, 1]


def test_read_limits_v1_hybrid_real():
    assert read_limits(at("v1_hybrid")) == CgroupLimits(
        cgroup_version=1, cpu_quota_us=50000, cpu_period_us=100000, cpuset_cpus=[1],
        memory_max=67108864, memsw_max=67108864, swap_max=0, pids_max=16,
    )


def test_read_limits_v1_nested_no_memsw():
    assert read_limits(at("v1_nested")) == CgroupLimits(
        cgroup_version=1, cpu_quota_us=200000, cpu_period_us=100000, cpuset_cpus=[0, 2],
        memory_max=2147483648, memsw_max=None, swap_max=None, pids_max=None,
    )


# --------------------------------------------------------------------------- snapshots

V2_START = CgroupSnapshot(
    t=100.0, cpu_usage_us=8123456, nr_periods=1200, nr_throttled=85, throttled_us=2345678,
    memory_current=201326592, memory_peak=536870912, memory_limit_hits=12, memory_high_events=0,
    oom_events=1, oom_kills=1, pids_current=14, pids_peak=37, pids_limit_hits=0,
    psi_cpu=PSI(some_us=912345, full_us=801234), psi_memory=PSI(some_us=45000, full_us=30500),
    psi_io=PSI(some_us=12000, full_us=9800),
)
V2_END = CgroupSnapshot(
    t=105.0, cpu_usage_us=10623456, nr_periods=1250, nr_throttled=100, throttled_us=2845678,
    memory_current=184549376, memory_peak=536870912, memory_limit_hits=20, memory_high_events=0,
    oom_events=2, oom_kills=2, pids_current=9, pids_peak=40, pids_limit_hits=3,
    psi_cpu=PSI(some_us=1162345, full_us=1001234), psi_memory=PSI(some_us=95000, full_us=70500),
    psi_io=PSI(some_us=12400, full_us=10100),
)
V1_START = CgroupSnapshot(
    t=0.0, cpu_usage_us=25148, nr_periods=3, nr_throttled=0, throttled_us=0,
    memory_current=491520, memory_peak=4083712, memory_limit_hits=0, memory_high_events=None,
    oom_events=None, oom_kills=0, pids_current=1, pids_peak=9, pids_limit_hits=0,
    psi_cpu=PSI(some_us=16011, full_us=6541), psi_memory=PSI(some_us=0, full_us=0),
    psi_io=PSI(some_us=106, full_us=82),
)
V1_END = CgroupSnapshot(
    t=16.0, cpu_usage_us=1700377, nr_periods=42, nr_throttled=32, throttled_us=1500416,
    memory_current=466944, memory_peak=67108864, memory_limit_hits=0, memory_high_events=None,
    oom_events=None, oom_kills=1, pids_current=1, pids_peak=16, pids_limit_hits=9,
    psi_cpu=PSI(some_us=1591905, full_us=1512270), psi_memory=PSI(some_us=7647, full_us=1790),
    psi_io=PSI(some_us=1479, full_us=990),
)


def test_snapshot_v2_cgroupfs_start_and_end():
    assert read_snapshot(at("v2_cgroupfs"), 100.0) == V2_START
    assert SnapshotReader(at("v2_cgroupfs_end")).read(105.0) == V2_END


def test_snapshot_v2_systemd():
    assert read_snapshot(at("v2_systemd"), 1.5) == CgroupSnapshot(
        t=1.5, cpu_usage_us=4532100, nr_periods=0, nr_throttled=0, throttled_us=0,
        memory_current=73400320, memory_peak=98566144, memory_limit_hits=0, memory_high_events=0,
        oom_events=0, oom_kills=0, pids_current=6, pids_peak=11, pids_limit_hits=0,
        psi_cpu=PSI(some_us=2301, full_us=1100), psi_memory=PSI(some_us=0, full_us=0),
        psi_io=PSI(some_us=734, full_us=611),
    )


def test_snapshot_v2_old_kernel_missing_files_are_none():
    assert read_snapshot(at("v2_old_kernel"), 2.0) == CgroupSnapshot(
        t=2.0, cpu_usage_us=5000000, nr_periods=500, nr_throttled=10, throttled_us=150000,
        memory_current=52428800, memory_peak=None, memory_limit_hits=0, memory_high_events=0,
        oom_events=0, oom_kills=0, pids_current=4, pids_peak=None, pids_limit_hits=0,
        psi_cpu=PSI(some_us=5120, full_us=None), psi_memory=PSI(some_us=0, full_us=0),
        psi_io=PSI(some_us=88, full_us=80),
    )


def test_snapshot_v1_hybrid_real_start_and_end():
    assert read_snapshot(at("v1_hybrid"), 0.0) == V1_START
    assert read_snapshot(at("v1_hybrid_end"), 16.0) == V1_END


def test_snapshot_v1_nested_old_kernel():
    assert read_snapshot(at("v1_nested"), 3.0) == CgroupSnapshot(
        t=3.0, cpu_usage_us=98765432, nr_periods=2100, nr_throttled=400, throttled_us=31250000,
        memory_current=1073741824, memory_peak=2147483648, memory_limit_hits=57, memory_high_events=None,
        oom_events=None, oom_kills=None, pids_current=23, pids_peak=None, pids_limit_hits=0,
        psi_cpu=None, psi_memory=None, psi_io=None,
    )


def test_snapshot_v2_no_cpu_controller(tmp_path):
    """cpu.stat exists without the cpu controller but lacks the CFS counters: None, not 0."""
    root = _copy("v2_systemd", tmp_path)
    d = root / f"sys/fs/cgroup/system.slice/docker-{SD_ID}.scope"
    (d / "cpu.stat").write_text("usage_usec 77\nuser_usec 50\nsystem_usec 27\n")
    s = read_snapshot(locate(PID, root / "proc", root), 0.0)
    assert (s.cpu_usage_us, s.nr_periods, s.nr_throttled, s.throttled_us) == (77, None, None, None)


def test_snapshot_reader_cgroup_vanished(tmp_path):
    root = _copy("v2_cgroupfs", tmp_path)
    reader = SnapshotReader(locate(PID, root / "proc", root))
    shutil.rmtree(root / f"sys/fs/cgroup/docker/{V2_ID}")
    with pytest.raises(CgroupError, match="vanished.*read the final counters before stopping"):
        reader.read(1.0)


def test_snapshot_reader_optional_file_appearing_later_stays_none(tmp_path):
    """Path discovery happens once: files missing at construction are not re-probed."""
    root = _copy("v2_old_kernel", tmp_path)
    reader = SnapshotReader(locate(PID, root / "proc", root))
    (root / f"sys/fs/cgroup/docker/{OLD_ID}/memory.peak").write_text("1\n")
    assert reader.read(0.0).memory_peak is None


@pytest.mark.parametrize("tree", sorted(p.name for p in FX.iterdir() if p.is_dir()))
def test_a_sample_reads_what_a_snapshot_reads(tree):
    """The 5 Hz sample reads fewer files than a snapshot, never other values."""
    reader = SnapshotReader(at(tree))
    snap, s = reader.read(0.0), reader.sample()
    assert s == (snap.cpu_usage_us, snap.throttled_us, snap.nr_throttled, snap.memory_current, snap.pids_current)


def test_a_sample_of_a_vanished_cgroup_says_so(tmp_path):
    root = _copy("v1_hybrid", tmp_path)
    reader = SnapshotReader(locate(PID, root / "proc", root))
    for d in (root / "sys/fs/cgroup").glob("cpu*"):
        for usage in d.rglob("cpuacct.usage"):
            usage.unlink()
    with pytest.raises(CgroupError, match="vanished"):
        reader.sample()


# --------------------------------------------------------------------------- deltas


def test_counter_delta_v2():
    d = CounterDelta.between(V2_START, V2_END)
    assert d.throttled_share == pytest.approx(0.1)  # 500000 µs / 5 s
    assert d.model_copy(update={"throttled_share": None}) == CounterDelta(
        wall_s=5.0, cpu_usage_us=2500000, nr_periods=50, nr_throttled=15, throttled_us=500000,
        throttled_share=None, memory_peak=536870912, memory_limit_hits=8, memory_high_events=0,
        oom_events=1, oom_kills=1, pids_peak=40, pids_limit_hits=3,
        psi_cpu_some_us=250000, psi_memory_some_us=50000, psi_memory_full_us=40000, psi_io_some_us=400,
    )


def test_counter_delta_v1_real():
    d = CounterDelta.between(read_snapshot(at("v1_hybrid"), 0.0), read_snapshot(at("v1_hybrid_end"), 16.0))
    assert d.throttled_share == pytest.approx(0.093776)  # 1500416 µs / 16 s
    assert d.model_copy(update={"throttled_share": None}) == CounterDelta(
        wall_s=16.0, cpu_usage_us=1675229, nr_periods=39, nr_throttled=32, throttled_us=1500416,
        throttled_share=None, memory_peak=67108864, memory_limit_hits=0, memory_high_events=None,
        oom_events=None, oom_kills=1, pids_peak=16, pids_limit_hits=9,
        psi_cpu_some_us=1575894, psi_memory_some_us=7647, psi_memory_full_us=1790, psi_io_some_us=1373,
    )


def test_counter_delta_v2_old_kernel_uses_sampled_pids_peak():
    s = read_snapshot(at("v2_old_kernel"), 0.0)
    d = CounterDelta.between(s, s.model_copy(update={"t": 2.0}), pids_peak_sampled=9)
    assert (d.pids_peak, d.memory_peak, d.throttled_share) == (9, None, 0.0)


# --------------------------------------------------------------------------- live (this machine)


def test_live_self_cgroup():
    """Reads this test process's own cgroup: works on v1, hybrid and v2 without Docker."""
    paths = locate("self")
    assert paths.version in (1, 2)
    for d in (paths.cpu, paths.cpuacct, paths.memory):
        assert os.path.isdir(d)
    reader = SnapshotReader(paths)
    a = reader.read(time.monotonic())
    sum(range(200_000))
    b = reader.read(time.monotonic())
    assert b.cpu_usage_us >= a.cpu_usage_us > 0
    assert a.memory_current is None or a.memory_current > 0
    limits = read_limits(paths)
    assert limits.cgroup_version == paths.version
    if detect_cgroup_version() == "1 (hybrid)":
        assert paths.unified is not None and os.path.isdir(paths.unified)


def test_live_snapshot_is_cheap():
    """A snapshot costs about what opening and reading its files costs (measured here, in the
    same run: never an absolute time, which an emulated guest would miss). `make bench`
    reports what sampling costs a core."""
    reader = SnapshotReader(locate("self"))
    paths: list[str] = []

    def walk(v):
        if isinstance(v, str) and v.startswith("/sys/"):
            paths.append(v)
        elif isinstance(v, tuple):
            for x in v:
                walk(x)

    for v in vars(reader).values():
        walk(v)
    assert paths

    def raw():
        for p in paths:
            try:
                with open(p, "rb") as f:
                    f.read()
            except OSError:
                pass

    n, ratios = 200, []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            reader.read(0.0)
        t1 = time.perf_counter()
        for _ in range(n):
            raw()
        ratios.append((t1 - t0) / (time.perf_counter() - t1))
    # parsing on top of the reads stays within a small multiple of the reads (about 1x here)
    assert min(ratios) < 3.0, f"a snapshot took {min(ratios):.1f}x the open+read of its {len(paths)} files"


@pytest.mark.docker
def test_live_docker_container_limits_read_back(docker_client):
    from harness.sandbox.docker_sandbox import image_present

    if not image_present(docker_client, "harness/base:bookworm"):
        missing("image harness/base:bookworm not built; run `make images`")
    cpus = os.sched_getaffinity(0)
    cpu = max(cpus)
    run = subprocess.run(
        ["docker", "run", "-d", "--rm", "--network", "none", "--cpus", "0.5", "--cpuset-cpus", str(cpu),
         "--memory", "64m", "--memory-swap", "64m", "--pids-limit", "32",
         "harness/base:bookworm", "sleep", "30"],
        capture_output=True, text=True, check=True,
    )
    cid = run.stdout.strip()
    try:
        pid = subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", cid],
                             capture_output=True, text=True, check=True).stdout.strip()
        paths = locate(int(pid))
        assert cid in paths.cgroup_path
        limits = read_limits(paths)
        assert (limits.cpu_quota_us, limits.cpu_period_us) == (50000, 100000)
        assert limits.cpuset_cpus == [cpu]
        assert (limits.memory_max, limits.memsw_max, limits.swap_max) == (67108864, 67108864, 0)
        assert limits.pids_max == 32
        snap = SnapshotReader(paths).read(time.monotonic())
        assert snap.cpu_usage_us > 0 and snap.pids_current == 1
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)


def test_a_sample_skips_a_malformed_throttling_value_and_refuses_a_malformed_usage(tmp_path):
    """As a snapshot skips a malformed cpu.stat line; a usage that is not a number is a lost
    sample (CgroupError, counted by the monitor), never a ValueError out of the sampler."""
    root = _copy("v2_systemd", tmp_path)
    d = root / f"sys/fs/cgroup/system.slice/docker-{SD_ID}.scope"
    (d / "cpu.stat").write_text("usage_usec 77\nnr_throttled x\nthrottled_usec 1.5\n")
    reader = SnapshotReader(locate(PID, root / "proc", root))
    s = reader.sample()
    assert (s.cpu_usage_us, s.nr_throttled, s.throttled_us) == (77, None, None)
    (d / "cpu.stat").write_text("usage_usec 7x7\n")
    with pytest.raises(CgroupError, match="no usage_usec line with a number"):
        reader.sample()


def test_write_limits_v2_writes_the_unified_files_and_keeps_the_period(tmp_path):
    d = tmp_path / "cg"
    d.mkdir()
    for f, v in {"memory.max": "268435456\n", "memory.swap.max": "max\n", "cpu.max": "100000 50000\n"}.items():
        (d / f).write_text(v)
    p = CgroupPaths(version=2, driver="cgroupfs", cgroup_path="/x", cpu=str(d), cpuacct=str(d), memory=str(d), unified=str(d))
    got = write_limits(p, 300 << 20, 25_000)
    assert (d / "memory.max").read_text() == str(300 << 20)
    assert (d / "memory.swap.max").read_text() == "0"
    assert (d / "cpu.max").read_text() == "25000 50000"
    assert (got.memory_max, got.swap_max, got.cpu_quota_us, got.cpu_period_us) == (300 << 20, 0, 25_000, 50_000)


@pytest.mark.parametrize("before, new", [(256 << 20, 512 << 20), (512 << 20, 128 << 20), (None, 128 << 20)])
def test_write_limits_v1_orders_memsw_so_it_never_falls_below_memory(tmp_path, monkeypatch, before, new):
    """The kernel refuses memory.limit_in_bytes above memsw, and memsw below the limit: a
    raise writes memsw first, a lowering writes it last (an unlimited limit counts as higher)."""
    d = tmp_path / "mem"
    d.mkdir()
    unlimited = str(0x7FFFFFFFFFFFF000)
    (d / "memory.limit_in_bytes").write_text(str(before) if before else unlimited)
    (d / "memory.memsw.limit_in_bytes").write_text(str(before) if before else unlimited)
    (d / "cpu.cfs_quota_us").write_text("100000")
    (d / "cpu.cfs_period_us").write_text("100000")
    order = []
    import harness.measure.cgroup as cg
    real = cg._write

    def kernel_like(path, value):  # the kernel's rule, checked at each step
        lim = int((d / "memory.limit_in_bytes").read_text())
        sw = int((d / "memory.memsw.limit_in_bytes").read_text())
        name = os.path.basename(path)
        if name == "memory.limit_in_bytes":
            assert int(value) <= sw, "limit above memsw"
        if name == "memory.memsw.limit_in_bytes":
            assert int(value) >= lim, "memsw below the limit"
        order.append(name)
        real(path, value)

    monkeypatch.setattr(cg, "_write", kernel_like)
    p = CgroupPaths(version=1, driver="cgroupfs", cgroup_path="/x", cpu=str(d), cpuacct=str(d), memory=str(d))
    got = write_limits(p, new, 50_000)
    assert (got.memory_max, got.memsw_max, got.cpu_quota_us) == (new, new, 50_000)
    assert order[-1] == "cpu.cfs_quota_us"
