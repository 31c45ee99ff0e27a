"""Checks that only mean something on a live cgroup v2 kernel; run inside the guest that
`make test-cgroup2` boots (tests/guest/cgroup2.py), collected nowhere else (conftest).

The guest boots with ``systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all`` and runs
Debian's docker.io on the systemd cgroup driver (then once more on cgroupfs): a container's
cgroup is ``/system.slice/docker-<id>.scope`` (``/docker/<id>``) in the one unified hierarchy,
and every counter the harness records must be read from there.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from conftest import run_cli
from harness.measure import cgroup
from harness.model.profile import Profile
from harness.sandbox.base import SandboxSpec
from harness.sandbox.docker_sandbox import DockerSandbox
from harness.sandbox.images import SANDBOX_IMAGE

pytestmark = pytest.mark.docker

V2_FILES = ("cgroup.controllers", "cgroup.procs", "cpu.max", "cpu.stat", "cpu.pressure", "cpuset.cpus.effective",
            "memory.max", "memory.swap.max", "memory.current", "memory.peak", "memory.events", "memory.pressure",
            "memory.stat", "pids.max", "pids.current", "pids.events", "io.max", "io.stat", "io.pressure")


def prof(**kw) -> Profile:
    base = dict(name="guest", cpus=0.5, cores=1, memory="192m", pids=77, timeouts={"agent": 60})
    base.update(kw)
    return Profile.model_validate(base)


def test_the_kernel_is_unified_v2_with_the_controllers_the_harness_reads():
    assert cgroup.detect_cgroup_version() == "2"
    mounts = cgroup.parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    assert [m.fstype for m in mounts] == ["cgroup2"], mounts  # cgroup_no_v1=all: no v1 hierarchy at all
    controllers = set(Path("/sys/fs/cgroup/cgroup.controllers").read_text().split())
    assert {"cpuset", "cpu", "io", "memory", "pids"} <= controllers, controllers
    assert Path("/proc/pressure/cpu").exists()


def test_doctor_reports_v2_and_the_systemd_driver(docker_client):
    out = run_cli(Path(os.environ.get("HARNESS_GUEST_TMP", "/tmp")), "doctor", "--json", timeout=300)
    checks = {c["name"]: c for c in json.loads(out.stdout)}
    assert checks["cgroup"]["detail"].startswith("version 2"), checks["cgroup"]
    assert checks["cgroup driver"]["detail"] == "systemd (engine reports cgroup v2)", checks["cgroup driver"]
    for name in ("engine", "counters", "envelope read-back", "images", "cores"):
        assert checks[name]["status"] == "ok", checks[name]
    assert out.returncode == 0, [c for c in checks.values() if c["status"] == "fail"]


def test_a_sandbox_cgroup_is_the_containers_own_with_every_file(docker_client, trial_cpu):
    # run under both of Docker's drivers (tests/guest/inside.sh restarts the engine with cgroupfs)
    driver = docker_client.info()["CgroupDriver"]
    expected = {"systemd": "/system.slice/docker-{}.scope", "cgroupfs": "/docker/{}"}[driver]
    with DockerSandbox(docker_client, SandboxSpec(SANDBOX_IMAGE, prof(), trial_cpu)) as sb:
        cid = sb.container.id
        paths = sb.paths
        assert (paths.version, paths.driver) == (2, driver), paths
        assert paths.cgroup_path == expected.format(cid), paths.cgroup_path
        d = "/sys/fs/cgroup" + expected.format(cid)
        # one directory for every controller on v2
        assert {paths.cpu, paths.cpuacct, paths.cpuset, paths.memory, paths.pids, paths.unified, paths.blkio} == {d}
        missing = [f for f in V2_FILES if not os.path.exists(os.path.join(d, f))]
        assert not missing, f"files the reader needs are absent on this kernel: {missing}"
        assert str(sb.pid) in Path(d, "cgroup.procs").read_text().split()
        # what Docker wrote is what the reader returns
        env = sb.envelope
        assert env.ok, env.mismatches
        a = env.applied
        assert a.cgroup_version == 2
        assert Path(d, "cpu.max").read_text().split() == ["50000", "100000"]
        assert (a.cpu_quota_us, a.cpu_period_us, a.cpuset_cpus) == (50_000, 100_000, trial_cpu)
        assert a.memory_max == int(Path(d, "memory.max").read_text()) == 192 * 2**20
        assert a.swap_max == int(Path(d, "memory.swap.max").read_text()) == 0
        assert a.pids_max == int(Path(d, "pids.max").read_text()) == 77
        snap = sb._reader.read(time.monotonic())
        assert snap.pids_current >= 1 and snap.memory_current > 0 and snap.memory_peak >= snap.memory_current
        assert snap.psi_cpu is not None and snap.psi_memory is not None and snap.psi_io is not None


def test_memory_high_events_and_the_oom_kill_come_from_the_v2_events_file(docker_client, trial_cpu):
    # memory.high has no v1 counterpart and Docker does not set it: written here (as root) into
    # the container's cgroup, a workload going past it is throttled and counted as 'high'
    # events; going on to the ceiling is an OOM kill. The reader's counts must be the file's.
    with DockerSandbox(docker_client, SandboxSpec(SANDBOX_IMAGE, prof(memory="96m", timeouts={"agent": 120}), trial_cpu)) as sb:
        d = sb.paths.memory
        Path(d, "memory.high").write_text(str(16 * 2**20))
        # reading ~100 MiB of the image's files charges their page cache here, far past 16 MiB;
        # clean cache is reclaimed at the high mark (anonymous memory past it, with no swap,
        # would only be throttled, for as long as it stays there)
        grow = ("import os\nfor top in ('/usr/lib/x86_64-linux-gnu', '/usr/lib/python3.11'):\n"
                " for r, _, fs in os.walk(top):\n  for f in fs:\n   try:\n    with open(os.path.join(r, f), 'rb') as h:\n"
                "     while h.read(1 << 20): pass\n   except OSError: pass\n")
        m = sb.measured_exec(["python3", "-c", grow], timeout=120)
        assert m.result.exit_code == 0, m.result
        events = cgroup.parse_flat_keyed(Path(d, "memory.events").read_text())
        assert m.counters.memory_high_events >= 1, m.counters
        assert m.counters.memory_high_events == events["high"], (m.counters, events)
        assert m.counters.oom_kills == 0 == events["oom_kill"], m.counters
        Path(d, "memory.high").write_text("max")
        bomb = sb.measured_exec(["python3", "-c", "b=[]\nwhile True: b.append(bytearray(1<<20))"], timeout=120)
        events = cgroup.parse_flat_keyed(Path(d, "memory.events").read_text())
    c = bomb.counters
    assert c.oom_kills >= 1 and events["oom_kill"] >= c.oom_kills, (c, events)
    assert c.memory_limit_hits >= 1 and events["max"] >= c.memory_limit_hits, (c, events)
    assert c.memory_peak is not None and c.memory_peak >= 90 * 2**20, c


def test_a_refunds_run_records_v2_counters_on_every_attempt(tmp_path, docker_client):
    tasks = "duplicate-charge,fraud-flagged,cancel-unshipped"
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    # emulated, the guest kernel's own work on a core can reach the foreign-CPU rule's threshold:
    # a discarded attempt is rerun (and checked below like the others), with room for a few
    out = run_cli(tmp_path, "run", "--suite", "refunds", "--tasks", tasks, "--trials", "1", "--k", "1", "--max-reruns", "6",
                  "--db", db, "--json", env={"REFUNDBOT_THINK_SCALE": "0"}, timeout=1800)
    assert out.returncode == 0, out.stderr[-2000:]
    run_id = json.loads(out.stdout)["run_id"]
    rows = json.loads(run_cli(tmp_path, "trials", run_id, "--db", db, "--json").stdout)
    assert rows, "no attempts stored"
    clean = [r for r in rows if r["verdict"] == "clean"]
    assert {r["task"] for r in clean} == set(tasks.split(",")), [(r["task"], r["verdict"], r["reasons"]) for r in rows]
    for r in rows:
        # v2-only counters are numbers (v1 leaves memory_high_events empty); per-cgroup PSI is read
        for field in ("memory_high_events", "memory_peak", "memory_max", "pids_peak", "pids_max", "psi_cpu_some_s",
                      "psi_memory_some_s", "psi_io_some_s", "io_read_bytes", "cpu_s", "nr_periods"):
            assert r[field] is not None, (field, r)
        assert r["memory_max"] > 0 and r["pids_peak"] >= 1 and r["nr_periods"] > 0, r
    shown = json.loads(run_cli(tmp_path, "show", str(clean[0]["id"]), "--db", db, "--json").stdout)
    blob = json.dumps(shown)
    assert re.search(r'"cgroup_version": 2\b', blob), "the attempt's envelope was not read back from cgroup v2"
