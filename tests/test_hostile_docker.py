"""Hostile agents (the built-in `hostile` suite) against real containers.

One `harness run` executes every hostile task once, in a fixed order, with the control task
`benign` last; a `probe` run follows. While the run is in flight the test samples the
controller's RSS (psutil) and scans the host's /proc for the agents' processes. The tests
then check, per attack, the stored attempt (failure kind, kernel counters), what the agent
itself observed (its exported transcript or stdout), and that nothing outside the sandbox
changed: host files, host /tmp, the host's kernel settings, leftover processes and
containers. A slot whose attempt was discarded for host contention (other work on this
machine) still carries its measurements and grade, so the checks read attempts, not slots.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from harness.engine.images import build_images
from harness.model.grade import MAX_VERDICT_BYTES
from harness.sandbox.owners import LABEL, LABEL_OWNER, LABEL_RUN
from harness.store.store import Store

pytestmark = pytest.mark.docker

PROBE = str(Path(__file__).parent / "suites" / "probe")
MiB = 1 << 20
# run order: the attacks first, the containment probes after them (so they also show that
# the attempt after an attack is unaffected), the control last
ORDER = [
    "fork-bomb", "memory-hog", "fill-disk", "stdout-flood", "cpu-threads", "sleep-forever",
    "sigterm-orphans", "kill-init", "hijack-keeper", "network-egress", "write-system",
    "io-uring", "vsock", "vsock32", "export-symlink-passwd", "export-symlink-host", "export-special", "export-dir",
    "export-wal", "export-giant", "export-malformed", "export-at-caps",
    "state-memory-bomb", "state-slow-rows", "state-view-table", "state-huge-rows", "state-huge-wal", "state-many-tables",
    "benign",
]
EXPORT_TASKS = [t for t in ORDER if t.startswith("export-") and t != "export-at-caps"]
STATE_TASKS = [t for t in ORDER if t.startswith("state-")]
HOST_ONLY_REASONS = {"host_cpu_contention", "host_steal", "host_memory_pressure", "host_io_pressure", "host_memory_low"}
PASSWD_LINE = re.compile(rb"root:[^:\n]*:0:0:")
RSS_LIMIT = 200 * MiB  # the controller's peak RSS over the whole hostile run (measured ~95 MiB)


def _host_procs() -> dict[int, str]:
    """Host processes that belong to the hostile image: pid -> cmdline."""
    out = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "/usr/local/bin/hostile" in cmd or "hostile-orphan-" in cmd:
            out[int(p)] = cmd.strip()
    return out


def _digest(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as e:
        return f"unreadable: {e.errno}"


def _host_facts() -> dict:
    return {
        "core_pattern": Path("/proc/sys/kernel/core_pattern").read_text(),
        "hostname": Path("/proc/sys/kernel/hostname").read_text(),
        "passwd": _digest("/etc/passwd"),
        "root_listing": sorted(os.listdir("/")),
        "tmp_hostile": sorted(n for n in os.listdir("/tmp") if "hostile" in n),
    }


class Sampler(threading.Thread):
    """Samples the controller's RSS and the hostile processes on the host while it runs."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.peak_rss = 0
        self.seen: dict[int, str] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        # keep this thread on the controller's reserved core: scanning /proc on a trial's
        # core would be foreign CPU there and get attempts discarded for host contention
        try:
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        except OSError:
            pass
        while not self.stop.is_set():
            try:
                self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)
            except psutil.Error:
                pass
            self.seen.update(_host_procs())
            self.stop.wait(0.1)


def _cli(home: Path, args: list[str], env: dict, timeout: float) -> tuple[subprocess.CompletedProcess, Sampler]:
    p = subprocess.Popen(
        [sys.executable, "-m", "harness", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, cwd=home,
    )
    s = Sampler(p.pid)
    s.start()
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`harness {' '.join(args[:3])} ...` did not finish in {timeout:.0f}s; if another controller "
                    "holds the trial cores (flocks in $HARNESS_LOCK_DIR, see /proc/locks), run again when it is done")
    finally:
        s.stop.set()
        s.join(timeout=2)
        if p.poll() is None:
            p.kill()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err), s


@pytest.fixture(scope="module")
def hostile(docker_client, tmp_path_factory):
    """Build the image (skipped when unchanged), run every hostile task once, then a probe run."""
    build_images(suites=["hostile"], log=lambda m: None)  # skipped when unchanged
    root = tmp_path_factory.mktemp("hostile")
    hosttmp = root / "hosttmp"  # the controller's TMPDIR: nothing may appear here
    hosttmp.mkdir()
    sentinel = root / "sentinel.txt"
    sentinel.write_text("the host's own file\n")
    sentinel_stat = sentinel.stat()
    db = f"sqlite:///{root}/h.db"
    env = {
        **os.environ,
        "HARNESS_HOME": str(root / "home"),
        "TMPDIR": str(hosttmp),
        # core leases must stay shared with every other controller on this machine
        "HARNESS_LOCK_DIR": os.environ.get("HARNESS_LOCK_DIR", str(Path(tempfile.gettempdir()) / "harness-cpu-locks")),
    }
    before = _host_facts()
    t0 = time.monotonic()
    r, sampler = _cli(root, ["run", "--suite", "hostile", "--tasks", ",".join(ORDER), "--trials", "1",
                             "--max-reruns", "0", "--concurrency", "1", "--db", db, "--json"], env, timeout=600)
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    after_run = _host_procs()
    probe, _ = _cli(root, ["run", "--suite", PROBE, "--tasks", "append", "--trials", "1", "--k", "1", "--max-reruns", "2",
                           "--db", db, "--json"], {**env, "PROBE_BURN": "0.6"}, timeout=120)
    store = Store.open(db, mode="ro")
    rows = {a.task_id: a for a in store.attempts(out["run_id"])}
    inputs = root / "home" / "inputs"
    return {
        "out": out, "rows": rows, "sampler": sampler, "wall": wall, "cli_pid": sampler.proc.pid,
        "after_run_procs": after_run, "before": before, "after": _host_facts(),
        "hosttmp": sorted(os.listdir(hosttmp)), "sentinel": (sentinel, sentinel_stat),
        "inputs": sorted(os.listdir(inputs)) if inputs.is_dir() else [],
        "probe": probe, "store": store, "artifacts": Path(store.get_run(out["run_id"]).artifacts_dir),
    }


def row(h, task):
    return h["rows"][task]


def art(h, task) -> Path:
    return Path(row(h, task).artifacts)


def transcript(h, task, name="transcript.jsonl") -> list[dict]:
    """The agent's own records, from the exported transcript (or stdout.txt)."""
    lines = (art(h, task) / name).read_text(errors="replace").splitlines()
    return [json.loads(x) for x in lines if x.startswith("{")]


def last(h, task, name="transcript.jsonl") -> dict:
    recs = transcript(h, task, name)
    assert recs, f"{task}: no records in {name}"
    return recs[-1]


# --------------------------------------------------------------------------- every attempt


def test_every_task_ran_once_without_engine_errors(hostile):
    assert set(hostile["rows"]) == set(ORDER)
    for task, a in hostile["rows"].items():
        assert "infra_error" not in (a.reasons or []), (task, a.error)
        assert set(a.reasons or []) <= HOST_ONLY_REASONS, (task, a.reasons)
        assert a.envelope_applied, task  # the envelope was read back from the kernel
        assert "grading failed" not in (a.error or "") and "Traceback" not in (a.error or ""), (task, a.error)
        assert a.grade_reason or a.outcome == "pass", task


def test_no_agent_stretches_its_attempt_past_the_timeouts(hostile):
    for task, a in hostile["rows"].items():
        t = a.envelope["timeouts"]
        assert a.wall_s <= t["agent"] + 2 * t["grade"] + 5, (task, a.wall_s)  # grading and export each bounded


# --------------------------------------------------------------------------- resources


def test_fork_bomb_stops_at_the_pids_limit(hostile):
    a = row(hostile, "fork-bomb")
    assert a.pids_max == 64
    assert a.pids_limit_hits > 0
    assert a.pids_peak <= a.pids_max
    assert a.failure_kind == "timeout" and a.timed_out
    assert 4.9 <= a.agent_wall_s <= 6.0


def test_memory_past_the_ceiling_is_oom_killed(hostile):
    a = row(hostile, "memory-hog")
    assert a.oom_kills >= 1
    assert a.failure_kind == "oom_killed"
    assert a.memory_peak <= a.memory_max == 512 * MiB
    # what the agent saw: it never got its 512 MiB
    assert last(hostile, "memory-hog")["mib"] < 512


def test_filling_every_writable_path_stops_at_the_tmpfs_sizes(hostile):
    a = row(hostile, "fill-disk")
    paths = last(hostile, "fill-disk")["paths"]
    assert paths["/work"]["stopped_by"] == "ENOSPC" and paths["/work"]["bytes"] <= 256 * MiB
    assert paths["/tmp"]["stopped_by"] == "ENOSPC" and paths["/tmp"]["bytes"] <= 64 * MiB
    # Docker's private /dev/shm is writable (64 MiB, charged to the memory cgroup)
    assert paths["/dev/shm"]["bytes"] <= 64 * MiB
    for p in ("/", "/etc", "/var/tmp", "/run", "/harness/in", "/opt/hostile"):
        assert paths[p]["bytes"] == 0 and paths[p]["stopped_by"] in ("EROFS", "EACCES"), (p, paths[p])
    assert last(hostile, "fill-disk")["home"] == "/work"
    assert a.memory_peak < a.memory_max and not a.oom_kills
    assert a.failure_kind == "wrong_state" and a.exit_code == 0


def test_stdout_flood_is_capped_and_the_controller_stays_small(hostile):
    a = row(hostile, "stdout-flood")
    out = (art(hostile, "stdout-flood") / "stdout.txt").read_bytes()
    err = (art(hostile, "stdout-flood") / "stderr.txt").read_bytes()
    cap = a.envelope["output_cap"]
    assert len(out) <= cap + 200 and len(err) <= cap + 200
    dropped = int(re.search(rb"\[harness: truncated, (\d+) bytes dropped here", out).group(1))
    assert dropped >= 256 * MiB, dropped  # the agent really wrote a lot (how much depends on the machine's speed)
    assert re.search(rb"\[harness: truncated, \d+ bytes dropped here", err)
    assert a.failure_kind == "timeout"
    peak = hostile["sampler"].peak_rss
    print(f"stdout-flood: {dropped / MiB:.0f} MiB dropped; controller peak RSS {peak / MiB:.0f} MiB")
    assert peak < RSS_LIMIT, peak


def test_threads_cannot_take_more_than_the_quota(hostile):
    a = row(hostile, "cpu-threads")
    c = a.counters
    assert a.envelope["cpus"] == 0.5
    assert c["cpu_usage_us"] / 1e6 / c["wall_s"] <= 0.5 * 1.15, c
    assert a.nr_throttled > 0 and a.throttled_share > 0
    assert a.pids_peak >= 40  # the threads did start
    seen = last(hostile, "cpu-threads")
    assert len(seen["affinity"]) == 1 and seen["affinity_after"] == seen["affinity"]
    assert seen["nice_up"] == "EPERM"
    assert a.failure_kind == "timeout"


def test_sleeping_forever_times_out(hostile):
    a = row(hostile, "sleep-forever")
    assert a.failure_kind == "timeout" and a.timed_out
    assert 3.9 <= a.agent_wall_s <= 4.5
    assert a.wall_s < 10  # kill, export and removal are quick


# --------------------------------------------------------------------------- processes


def test_orphans_that_ignore_sigterm_are_killed_in_and_out_of_the_container(hostile):
    a = row(hostile, "sigterm-orphans")
    spawned = last(hostile, "sigterm-orphans", "stdout.txt")["spawned"]
    assert len(spawned) == 3
    assert not a.timed_out and a.agent_wall_s < 3  # the exec ended soon after the agent did
    run_id = hostile["out"]["run_id"]
    marker = f"hostile-orphan-{run_id}"
    # the host did see them (the scan works) ...
    assert any(marker in c for c in hostile["sampler"].seen.values())
    # ... and none of them, nor any agent process, outlived the run
    assert not any(marker in c for c in hostile["after_run_procs"].values())
    assert not _host_procs()
    # the orphans flipped state.db between a symlink and a copy until they were killed: it is
    # graded as whichever it was when they died, never while they still ran
    # (a symlink, the fixture's copy, or an empty file when one orphan copied it mid-swap)
    assert a.failure_kind in ("wrong_state", "ungradable"), (a.failure_kind, a.grade_reason)


def test_the_workload_cannot_kill_the_containers_init(hostile):
    a = row(hostile, "kill-init")
    seen = last(hostile, "kill-init")
    assert seen["signals"]["kill(1, SIGTERM)"] == "EPERM"
    assert "sleep infinity" in seen["after"]  # the keeper survived kill -1
    assert (art(hostile, "kill-init") / "state.db").is_file()  # the container lived on to export
    assert a.failure_kind == "wrong_state" and a.exit_code == 0


def test_the_keeper_cannot_be_hijacked_to_outlive_the_kill(hostile):
    seen = last(hostile, "hijack-keeper")
    assert seen["event"] == "hijack", seen
    assert seen["keeper"] and all(v.startswith("attach:E") for v in seen["hijack"].values()), seen
    assert "10001" not in seen["uids"].values()  # init and keeper run as another uid
    text = (art(hostile, "hijack-keeper") / "transcript.jsonl").read_text()
    assert "survived-kill-tree" not in text


# --------------------------------------------------------------------------- network, system


def test_no_network_egress(hostile):
    seen = last(hostile, "network-egress")
    assert seen["interfaces"] == ["lo"]
    assert seen["reached"] == []
    for addr, res in seen["tcp"].items():
        want = ("ENETUNREACH", "EHOSTUNREACH") if addr.startswith("172.17.0.1") else ("ECONNREFUSED",)
        assert res in want, (addr, res)
    assert seen["udp"]["172.17.0.1:53"] in ("ENETUNREACH", "EHOSTUNREACH")
    assert seen["raw_icmp"] == "EPERM" and seen["packet"] == "EPERM"
    assert set(seen["unix"].values()) == {"ENOENT"}
    assert seen["abstract_sockets"] == []  # the host's abstract sockets are in another netns
    assert row(hostile, "network-egress").failure_kind == "wrong_state"


def test_root_fs_proc_and_sys_are_not_writable(hostile):
    seen = last(hostile, "write-system")
    for path, res in seen["writes"].items():
        assert res in ("EROFS", "EACCES", "EPERM", "ENOENT"), (path, res)
    for path in ("/etc/hostile-created", "/usr/local/bin/hostile-created", "/harness/in/hostile-created"):
        assert seen["writes"][path] == "EROFS", path
    for path in ("/proc/sys/kernel/core_pattern", "/sys/fs/cgroup/memory/memory.limit_in_bytes", "/usr/bin/tar"):
        if Path("/sys/fs/cgroup/memory").is_dir() or "cgroup" not in path:
            assert seen["writes"][path] in ("EROFS", "EACCES"), path
    assert set(seen["calls"].values()) == {"EPERM"}, seen["calls"]
    assert seen["uid"] == 10001
    # the host's kernel settings the agent went for are unchanged
    assert hostile["after"]["core_pattern"] == hostile["before"]["core_pattern"]
    assert hostile["after"]["hostname"] == hostile["before"]["hostname"]


def test_io_uring_is_refused_by_the_seccomp_profile(hostile):
    seen = last(hostile, "io-uring")
    # EPERM from the filter for all three (reachable, enter on fd -1 would say EBADF)
    assert (seen["setup"], seen["enter"], seen["register"]) == ("EPERM", "EPERM", "EPERM"), seen
    assert row(hostile, "io-uring").failure_kind == "wrong_state"


def test_vsock_sockets_are_refused_by_the_seccomp_profile(hostile):
    seen = last(hostile, "vsock")
    assert seen["socket_stream"] in ("EPERM", "EAFNOSUPPORT"), seen
    assert seen["socket_dgram"] in ("EPERM", "EAFNOSUPPORT"), seen
    assert seen["connect"] == "no socket", seen  # nothing reached the VM host (CID 2)
    # the family's upper 32 bits set (the kernel reads an int): refused as well
    assert seen.get("socket_hi32", "EPERM") == "EPERM", seen
    assert row(hostile, "vsock").failure_kind == "wrong_state"


def test_the_i386_abi_reaches_neither_vsock_nor_io_uring_nor_namespaces(hostile):
    seen = last(hostile, "vsock32")
    if "skipped" in seen:
        # only where the machine has no i386 entry point; on x86_64 a skip would hide a regression
        assert os.uname().machine != "x86_64", seen
        pytest.skip(seen["skipped"])
    # the i386 entry point (int 0x80) works: the refusals below are the seccomp profile's
    assert seen["getpid"].startswith("ok:") and seen["socket_inet"].endswith(":domain=2"), seen
    # socketcall(SYS_SOCKET, {40, ...}) opened AF_VSOCK and reached CID 2 before the fix
    assert seen["socketcall_vsock_stream"] == seen["socketcall_vsock_dgram"] == seen["socketcall_inet"] == "ENOSYS", seen
    assert seen["socket_vsock"] == seen["socket_vsock_hi32"] == "EPERM", seen
    assert seen["opened_vsock"] == [], seen
    assert (seen["io_uring_setup"], seen["io_uring_enter"], seen["io_uring_register"]) == ("EPERM",) * 3, seen
    assert seen["unshare_newuser"] == seen["clone_newuser"] == seen["setns"] == "EPERM", seen
    assert seen["clone3"] == "ENOSYS", seen
    assert seen["x32_socket_vsock"] == "killed:SIGSYS", seen  # x32 is outside the filter: the caller dies
    assert row(hostile, "vsock32").failure_kind == "wrong_state"


# --------------------------------------------------------------------------- export escapes


@pytest.mark.parametrize("task", EXPORT_TASKS)
def test_export_escapes_fail_the_grade_cleanly(hostile, task):
    """The grader reads the state in the sandbox and refuses what is not a plain SQLite file
    (ungradable); the export keeps only plain files, size-capped."""
    a = row(hostile, task)
    assert a.outcome == "fail" and a.exit_code == 0
    if task == "export-wal":  # the WAL symlink is ignored: the state itself is the untouched fixture
        assert a.failure_kind == "wrong_state" and a.grade_reason.startswith("job done: expected"), a.grade_reason
    elif task == "export-giant":  # 100 MiB of zeros after a header: not a readable database
        assert a.failure_kind == "ungradable" and a.grade_reason.startswith("final state is not a readable SQLite database"), a.grade_reason
    else:
        assert a.failure_kind == "ungradable", (task, a.failure_kind, a.grade_reason)
        assert a.grade_reason.startswith("final state is not a readable SQLite database"), a.grade_reason
    d = art(hostile, task)
    assert {p.name for p in d.iterdir()} <= {"state.db", "transcript.jsonl", "stdout.txt", "stderr.txt", "grade-stderr.txt"}
    for p in d.iterdir():
        st = p.lstat()
        assert stat.S_ISREG(st.st_mode), (p, st.st_mode)
        assert st.st_size <= 64 * MiB, p
        assert not PASSWD_LINE.search(p.read_bytes()), f"{p} holds passwd content"


def test_export_refusals_name_what_was_refused(hostile):
    err = {t: row(hostile, t).error or "" for t in EXPORT_TASKS}
    for t in ("export-symlink-passwd", "export-symlink-host"):
        assert "refused 'state.db': not a regular file" in err[t]
        assert "refused 'transcript.jsonl': not a regular file" in err[t]
        assert "is not a regular file" in row(hostile, t).grade_reason
    assert "refused 'state.db': not a regular file" in err["export-special"]  # a FIFO
    assert "refused 'state.db': not a regular file" in err["export-dir"]  # a directory
    assert "refused 'state.db-wal': not a regular file" in err["export-wal"]
    assert "refused 'state.db': over the cap (100.0 MiB)" in err["export-giant"]
    assert "kept the first 16 MiB of 'transcript.jsonl' (1 TiB)" in err["export-giant"]  # per file: the rest is kept
    assert row(hostile, "export-giant").wall_s < 20  # the 1 TiB sparse transcript is never read in full
    made = last(hostile, "export-special", "stdout.txt")["made"]
    assert made["mknod char 1:3"] == "EPERM" and made["mknod block 8:0"] == "EPERM"
    assert last(hostile, "export-symlink-passwd", "stdout.txt")["made"]["hardlink /etc/passwd"] == "EXDEV"


# --------------------------------------------------------------------------- crafted final states


def test_crafted_states_are_graded_in_the_sandbox_within_its_envelope(hostile):
    """States built to hurt their reader: each ends within the grade timeout (+ a few s),
    the controller stays small, the verdict is ungradable or the right grade, the stored
    diff is under its cap."""
    peak = hostile["sampler"].peak_rss
    for task in STATE_TASKS:
        a = row(hostile, task)
        t = a.envelope["timeouts"]
        made = last(hostile, task, "stdout.txt")
        print(f"{task}: state {made.get('size')} B, wal {made.get('wal', 0)} B -> {a.failure_kind}: {a.grade_reason} "
              f"(grade {a.grade_wall_s} s, attempt {a.wall_s} s)")  # None when the grade never ran: shown, not a crash
        # graded either way; a discard for host noise (steal on a shared VM) keeps its grade as evidence
        assert (a.verdict == "clean" or set(a.reasons) <= HOST_ONLY_REASONS) and a.outcome == "fail", (task, a.verdict, a.reasons, a.error)
        assert a.failure_kind in ("ungradable", "wrong_state"), (task, a.failure_kind)
        assert a.grade_wall_s is not None and a.grade_wall_s <= t["grade"] + 3, (task, a.grade_wall_s, a.error)
        assert a.wall_s <= t["agent"] + 2 * t["grade"] + 5, (task, a.wall_s)
        assert len(json.dumps(a.state_diff)) < MAX_VERDICT_BYTES, task
        assert len(json.dumps(a.grade_checks)) < MAX_VERDICT_BYTES, task
    print(f"controller peak RSS over the whole hostile run: {peak / MiB:.0f} MiB")
    assert peak < RSS_LIMIT, peak


def test_a_state_that_cannot_be_read_in_the_envelope_is_ungradable(hostile):
    bomb, slow = row(hostile, "state-memory-bomb"), row(hostile, "state-slow-rows")
    assert bomb.failure_kind == "ungradable" and "grade envelope" in bomb.grade_reason, bomb.grade_reason
    assert slow.failure_kind == "ungradable" and "grade timeout" in slow.grade_reason, slow.grade_reason
    assert slow.grade_wall_s >= slow.envelope["timeouts"]["grade"]  # the wall clock stopped it, not a callback
    assert bomb.grade_envelope["memory_for_grader"] == 256 * MiB and bomb.grade_envelope["memory_max"] > 256 * MiB


def test_a_view_in_place_of_the_checked_table_fails(hostile):
    a = row(hostile, "state-view-table")
    assert a.failure_kind == "wrong_state" and "table job replaced by a view" in a.grade_reason, a.grade_reason


def test_evidence_at_its_caps_is_copied_out_without_holding_it_in_memory(hostile):
    a = row(hostile, "export-at-caps")
    d = art(hostile, "export-at-caps")
    assert (d / "state.db").stat().st_size > 55 * MiB and (d / "transcript.jsonl").stat().st_size == 16 * MiB
    assert a.failure_kind == "wrong_state"
    assert hostile["sampler"].peak_rss < RSS_LIMIT  # used to hold the whole export stream twice (~470 MiB at the caps)


def test_huge_rows_wal_and_schemas_get_a_grade_and_a_capped_diff(hostile):
    for task in ("state-huge-rows", "state-huge-wal", "state-many-tables"):
        a = row(hostile, task)
        assert a.failure_kind in ("wrong_state", "ungradable"), (task, a.grade_reason)
    many = row(hostile, "state-many-tables")
    if many.failure_kind == "wrong_state":
        assert many.state_diff["tables_total"] == 20000 and len(many.state_diff["tables"]) <= 50
    wal = row(hostile, "state-huge-wal")
    if wal.failure_kind == "wrong_state":  # the WAL's commits were graded: 100 new rows
        assert wal.state_diff["tables"][0]["counts"]["added"] == 100


def test_no_artifact_is_a_link_device_or_outside_the_run_folder(hostile):
    root = hostile["artifacts"]
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath, n)
            st = p.lstat()
            assert stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode), p
            assert p.resolve().is_relative_to(root.resolve()), p
            if stat.S_ISREG(st.st_mode) and p.name != "fixture.db":
                assert not PASSWD_LINE.search(p.read_bytes()), f"{p} holds passwd content"


# --------------------------------------------------------------------------- the host and the next attempt


def test_nothing_outside_the_sandbox_changed(hostile, docker_client):
    b, a = hostile["before"], hostile["after"]
    assert a == b
    sentinel, st = hostile["sentinel"]
    assert sentinel.read_text() == "the host's own file\n"
    assert (sentinel.stat().st_mtime_ns, sentinel.stat().st_ino) == (st.st_mtime_ns, st.st_ino)
    assert hostile["hosttmp"] == []  # nothing was added to the controller's TMPDIR
    assert hostile["inputs"] == []  # every per-attempt input folder was removed
    run_id = hostile["out"]["run_id"]
    assert not docker_client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"})
    mine = docker_client.containers.list(all=True, filters={"label": [f"{LABEL}=1", f"{LABEL_OWNER}={hostile['cli_pid']}"]})
    assert not mine
    docker_client.ping()


def test_the_next_attempts_are_unaffected(hostile):
    a = row(hostile, "benign")
    assert a.outcome == "pass" and a.exit_code == 0, a.grade_reason
    seen = last(hostile, "benign")
    assert seen["work"] == ["state.db"] and seen["tmp"] == [] and seen["dev_shm"] == []
    assert sorted(seen["procs"]) == ["/sbin/docker-init -- sleep infinity", "python3 /usr/local/bin/hostile", "sleep infinity"]
    # a different suite afterwards passes too
    p = hostile["probe"]
    assert p.returncode == 0, p.stderr[-2000:]
    attempts = hostile["store"].attempts(json.loads(p.stdout)["run_id"])
    assert attempts and all(x.outcome == "pass" and "infra_error" not in (x.reasons or []) for x in attempts)
