"""The 5 Hz sampling path reads kernel files it holds open (HeldFile: one pread per read):
the same values as reading the path, fresh on every read, never cut, no descriptor left
behind, and a cgroup removed under an open descriptor is a vanished cgroup."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.measure.cgroup import CgroupError, HeldFile, SnapshotReader, locate
from harness.measure.host import HostSampler
from harness.measure.monitor import Monitor
from harness.model.counters import CgroupSnapshot, HostSnapshot

FX = Path(__file__).parent / "fixtures" / "cgroup"
PID = 4242


def _fds() -> list[str]:
    """What this process holds open, by target (fd numbers get reused)."""
    out = []
    for n in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{n}"))
        except OSError:  # the directory's own descriptor, closed by now
            pass
    return sorted(out)


def _opened(before: list[str], after: list[str]) -> list[str]:
    rest = list(after)
    for t in before:
        if t in rest:
            rest.remove(t)
    return sorted(rest)


def test_a_held_kernel_file_is_generated_afresh_on_every_read():
    f = HeldFile("/proc/thread-self/schedstat")  # this thread's run time: grows between two reads
    try:
        a = int(f.read().split()[0])
        t = time.thread_time() + 0.02
        while time.thread_time() < t:
            pass
        b = int(f.read().split()[0])
        assert b > a
    finally:
        f.close()


def test_a_held_file_longer_than_its_buffer_is_read_whole(tmp_path):
    p = tmp_path / "long"
    text = "".join(f"cpu{i} {i} 0 0 0 0 0 0\n" for i in range(5000))  # /proc/stat of a very big host
    p.write_text(text)
    f = HeldFile(str(p), size=1024)
    assert f.read() == text
    p.write_text("short\n")  # rewritten in place (same inode): the next read sees it
    assert f.read() == "short\n"
    f.close()
    f.close()  # twice is harmless


def test_a_held_kernel_file_longer_than_its_buffer_is_one_whole_read():
    """Each growth is a new read from offset 0: the text of one generation, never two spliced."""
    f = HeldFile("/proc/meminfo", size=64)
    try:
        held = f.read()
    finally:
        f.close()
    with open("/proc/meminfo") as g:
        whole = g.read()
    assert [line.split(":")[0] for line in held.splitlines()] == [line.split(":")[0] for line in whole.splitlines()]
    assert held.endswith("\n") and len(held.splitlines()) > 10


def test_a_cgroup_removed_under_the_descriptor_reads_none(monkeypatch):
    """ENODEV is what a kernfs file answers once its cgroup is removed (the docker test below
    removes a real one): the read answers None, which the sampler reports as vanished."""
    f = HeldFile("/proc/meminfo")
    assert f.read()

    def pread_enodev_fake(fd, n, off):
        raise OSError(errno.ENODEV, "No such device")

    monkeypatch.setattr(os, "pread", pread_enodev_fake)
    assert f.read() is None
    monkeypatch.undo()
    f.close()


def test_a_held_file_read_after_close_is_an_error_never_a_file_opened_again():
    before = _fds()
    f = HeldFile("/proc/meminfo")
    f.read()
    f.close()
    with pytest.raises(CgroupError, match="closed"):
        f.read()
    assert _fds() == before


def test_a_held_file_that_is_absent_reads_none_and_holds_nothing(tmp_path):
    before = _fds()
    f = HeldFile(str(tmp_path / "nope"))
    assert f.read() is None
    assert _fds() == before


def test_with_no_descriptor_left_a_read_is_a_lost_sample_and_the_next_one_opens_again():
    """EMFILE (a low ulimit -n): a CgroupError saying so (the monitor counts one lost sample),
    and once descriptors are free again the file is opened and read."""
    code = textwrap.dedent("""
        import os, resource
        from harness.measure.cgroup import CgroupError, HeldFile
        f = HeldFile("/proc/meminfo")
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(map(int, os.listdir("/proc/self/fd"))) + 1, hard))
        fill = []
        try:
            while True:  # take every free number below the limit
                fill.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        try:
            f.read()
        except CgroupError as e:
            print("lost:", "Too many open files" in str(e) and "ulimit -n" in str(e))
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for fd in fill:
            os.close(fd)
        print("then:", "MemAvailable:" in f.read())
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["lost:", "True", "then:", "True"]


@pytest.mark.parametrize("tree", sorted(p.name for p in FX.iterdir() if p.is_dir()))
def test_a_held_sample_reads_what_a_sample_reads(tree):
    reader = SnapshotReader(locate(PID, proc_root=FX / tree / "proc", sys_root=FX / tree))
    before = _fds()
    held = reader.held()
    try:
        assert held.sample() == reader.sample() == held.sample()
    finally:
        held.close()
    assert _fds() == before


def test_the_monitor_holds_its_files_only_while_it_samples():
    reader = SnapshotReader(locate(PID, proc_root=FX / "v1_hybrid" / "proc", sys_root=FX / "v1_hybrid"))
    want = reader.sample()
    before = _fds()
    host = HostSnapshot(t=0.0, cpu_total_us={0: 0}, cpu_busy_us={0: 0}, steal_us=0, mem_available=1 << 30)
    mon = Monitor(reader, [0], hz=50)
    mon.start(time.monotonic(), host, CgroupSnapshot(t=0.0, cpu_usage_us=0))
    deadline = time.monotonic() + 10
    while len(mon._rows) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    during = _fds()
    mon.stop()
    assert mon.errors == 0, mon.last_error
    opened = _opened(before, during)  # v1: usage, cpu.stat, memory, pids; /proc/stat, /proc/meminfo
    assert len(opened) == 6 and "/proc/stat" in opened and "/proc/meminfo" in opened, opened
    assert sum("v1_hybrid" in t for t in opened) == 4, opened
    assert _fds() == before
    s = mon.samples
    assert len(s) >= 3 and s is mon.samples
    assert all((x.cpu_usage_us, x.throttled_us, x.nr_throttled, x.memory_current, x.pids_current) == tuple(want) for x in s)
    assert all(x.host_mem_available > 0 for x in s) and [x.t for x in s] == sorted(x.t for x in s)


def test_the_host_sampler_releases_its_files(tmp_path):
    (tmp_path / "stat").write_text("cpu  1 0 0 0 0 0 0 0\ncpu0 1 0 0 0 0 0 0 0\nintr 0\n")
    (tmp_path / "meminfo").write_text("MemTotal: 4 kB\nMemFree: 1 kB\nMemAvailable: 2 kB\n")
    before = _fds()
    h = HostSampler([0], proc_root=tmp_path, clk_tck=100)
    assert (h.busy_us(), h.mem_available()) == ({0: 10_000}, 2048)
    assert _opened(before, _fds()) == sorted([str(tmp_path / "stat"), str(tmp_path / "meminfo")])
    h.close()
    assert _fds() == before


@pytest.mark.docker
def test_a_cgroup_removed_under_a_held_descriptor_is_vanished(docker_client):
    from harness.engine.profiles import load_profile
    from harness.sandbox.docker_sandbox import DockerSandbox, SandboxSpec
    from harness.sandbox.images import SANDBOX_IMAGE

    cpu = max(os.sched_getaffinity(0))
    sb = DockerSandbox(docker_client, SandboxSpec(image=SANDBOX_IMAGE, profile=load_profile("standard"), cpuset=[cpu]))
    sb.start()
    held = None
    try:
        reader = sb._reader
        assert isinstance(reader, SnapshotReader)
        held = reader.held()
        a = held.sample()
        sb.exec(["sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"], timeout=60)
        b = held.sample()
        assert b.cpu_usage_us > a.cpu_usage_us and b.pids_current == reader.sample().pids_current
    finally:
        sb.remove()
    try:
        with pytest.raises(CgroupError, match="vanished"):
            held.sample()
    finally:
        held.close()
