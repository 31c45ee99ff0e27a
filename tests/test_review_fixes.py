"""Faults a code review and an attack pass found, one test each (no engine needed here; the
ones that need real containers are in test_faults_docker.py).

Fakes here stand for failures that cannot be caused for real in a unit test, and say so in
their names (an engine stream that never ends, a cgroup read that fails once, a removal
the engine refuses twice)."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import shutil
import sqlite3
import stat
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.core.plan import pending_slots
from harness.core import outcome
from harness.engine.executor import LocalExecutor, Work
from harness.engine.gc import collect
from harness.engine.runner import HEARTBEAT_STALE_S, _refuse_live_owner
from harness.engine.scheduler import CpuPool, LeaseCancelled, allowed_cpus, pin_process
from harness.engine.suites import load_suite
from harness.measure.cgroup import SampleCounters
from harness.measure.monitor import Monitor
from harness.model.attempt import AttemptRecord
from harness.model.counters import CgroupSnapshot, HostSnapshot
from harness.model.errors import LeaseTimeout, RunError, SchedulerError, StoreError
from harness.model.run import RunRecord
from harness.model.units import utcnow
from harness.sandbox.docker_sandbox import _Pump
from harness.sandbox.owners import LiveRegistry, controller_host, controller_id, input_folder, pid_namespace, sweep_input_folders
from harness.state import state_kind
from harness.store.store import Store

FIXTURES = Path(__file__).parent / "fixtures" / "suites"


def run_record(run_id: str = "r1", **kw) -> RunRecord:
    fields = dict(id=run_id, created_at=utcnow(), status="complete", suite="s", suite_hash="h", image="i", profile="p",
                  harness_version="0", trials=2, ks=[1], max_reruns=1, task_ids=["t"])
    fields.update(kw)
    return RunRecord(**fields)


def dead_pid() -> int:
    p = os.fork()
    if p == 0:
        os._exit(0)
    os.waitpid(p, 0)
    return p


# ---------------------------------------------------------------------------- the executor


def test_reruns_of_discarded_slots_run_in_parallel_not_one_by_one():
    """Workers used to exit while a discarded slot waited to be requeued, so the last reruns
    ran serially. Workers now live until the driver stops them."""
    stop = threading.Event()
    ex = LocalExecutor(CpuPool(cpus=[0, 1], reserved=[], cross_process=False), 2, stop)
    spans: dict[tuple[str, int], tuple[float, float]] = {}

    def job(key: tuple[str, int]) -> Work:
        def run(cpuset: list[int]):
            t0 = time.monotonic()
            time.sleep(0.3)
            spans[key] = (t0, time.monotonic())
            return ("discarded" if key[1] == 1 else "clean"), True, None
        return Work(key=key, cores=1, run=run)

    for slot in ("a", "b"):
        ex.submit(job((slot, 1)))
    outstanding = 2
    while outstanding:
        done = ex.results(timeout=5)
        assert done is not None, "a worker went away"
        outstanding -= 1
        if done.result == "discarded":  # the driver requeues the slot, a little later
            time.sleep(0.25)
            ex.submit(job((done.key[0], 2)))
            outstanding += 1
    ex.close(timeout=5)
    (a0, a1), (b0, b1) = spans[("a", 2)], spans[("b", 2)]
    assert min(a1, b1) > max(a0, b0), "the two reruns did not overlap"


def test_no_attempt_starts_after_the_run_stops():
    stop = threading.Event()
    pool = CpuPool(cpus=[0], reserved=[], cross_process=False)
    ex = LocalExecutor(pool, 1, stop)
    started = []
    ex.submit(Work(key="first", cores=1, run=lambda c: (time.sleep(0.3), started.append("first"))[1:] + (True, None)))
    ex.submit(Work(key="second", cores=1, run=lambda c: (started.append("second"), True, None)))
    time.sleep(0.05)
    ex.stop()  # Ctrl-C: the clean-up has begun
    got = [ex.results(timeout=5) for _ in range(2)]
    ex.close(timeout=5)
    assert started == ["first"]
    assert [d.key for d in got if d.not_started] == ["second"]
    assert pool.in_use() == 0


def _one_core_held_back(tries: list[int], fails: int) -> tuple[CpuPool, LocalExecutor]:
    """An executor over one core whose first attempt's removal fails ``fails`` times (each try
    appended to ``tries``), then succeeds: the attempt is done, its core held back."""

    def removal_failing_fake() -> bool:
        tries.append(1)
        return len(tries) > fails

    pool = CpuPool(cpus=[0], reserved=[], cross_process=False)
    ex = LocalExecutor(pool, 1, threading.Event())
    ex.submit(Work(key="x", cores=1, run=lambda c: ("rec", False, removal_failing_fake)))
    assert ex.results(timeout=5).result == "rec"
    return pool, ex


def test_a_sandbox_that_could_not_be_removed_keeps_its_cores_until_it_is():
    """Failed removals used to be forgotten (and the core handed to the next attempt while
    the container might still run). Now the cores stay leased and the removal is retried."""
    tries: list[int] = []
    pool, ex = _one_core_held_back(tries, fails=2)  # an engine that refuses twice, then removes it
    assert pool.in_use() == 1 and ex.quarantined == [[0]]
    for _ in range(2):
        ex.retry_quarantined()
        assert pool.in_use() == 1 and ex.quarantined == [[0]]
    ex.retry_quarantined()  # the third try removes it: only now is the core free
    assert pool.in_use() == 0 and ex.quarantined == [] and len(tries) == 3
    ex.close(timeout=5)


def test_work_waiting_for_cores_held_back_by_a_failed_removal_gets_them_once_it_succeeds():
    """Every core held back by a removal that failed (the engine away) while the next work was
    already waiting for one: the wait retries the removal, or the run would wait forever (a CI
    run hung so after an engine restart that outlasted the first retry)."""
    tries: list[int] = []
    pool, ex = _one_core_held_back(tries, fails=3)  # an engine away for the first three tries
    ex.submit(Work(key="y", cores=1, run=lambda c: ("next", True, None)))
    got = ex.results(timeout=20)
    assert got.key == "y" and got.result == "next" and len(tries) >= 4 and ex.quarantined == []
    ex.close(timeout=5)
    assert pool.in_use() == 0


# ---------------------------------------------------------------------------- the sandbox's own threads


def test_a_finished_commands_output_is_not_changed_by_its_reader_thread():
    """The exec reader thread could still append to the buffers while they were read."""
    ticks = threading.Event()

    def endless_stream_fake():  # an engine stream that keeps talking after the command was killed
        while True:
            ticks.set()
            yield b"x" * 10, None
            time.sleep(0.001)

    pump = _Pump(endless_stream_fake(), cap=10**9).start()
    ticks.wait(2)
    time.sleep(0.05)
    (out, cut), _err, counts, _e = pump.close()
    time.sleep(0.05)
    assert pump.kept("out") == (out, cut) and pump.counts["out"] == counts["out"] == len(out) and cut == 0


def test_the_monitor_survives_a_read_error():
    """A read error used to end the monitor thread silently (the rest of the log was lost)."""
    calls = []
    snap = CgroupSnapshot(t=0.0, cpu_usage_us=0)

    def flaky_reader_fake() -> SampleCounters:  # a cgroup file that fails to read once
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("garbled cgroup file")
        return SampleCounters(0, None, None, None, None)

    host = HostSnapshot(t=0.0, cpu_total_us={0: 0}, cpu_busy_us={0: 0}, steal_us=0, mem_available=1 << 30)
    mon = Monitor(flaky_reader_fake, [0], hz=50)
    mon.start(time.monotonic(), host, snap)
    time.sleep(0.4)
    mon.stop()
    assert mon.errors == 1 and "garbled" in mon.last_error
    assert len(mon.samples) >= 5  # sampling went on after the error


def test_the_live_sandboxes_are_only_read_under_their_lock():
    reg = LiveRegistry()
    reg.add("a", object())
    done = threading.Event()
    with reg._lock:  # another thread is adding or removing a sandbox right now
        t = threading.Thread(target=lambda: (reg.remove_all(lambda x: None), done.set()), daemon=True)
        t.start()
        assert not done.wait(0.3), "the registry was read while it was being changed"
    assert done.wait(5)


def test_every_controller_thread_is_kept_off_the_trial_cores():
    """Threads started before the controller pinned itself (the progress display's) used to
    keep the whole machine's cores and show up as foreign CPU on a trial's core."""
    cpus = allowed_cpus()
    started, release = threading.Event(), threading.Event()
    tid: list[int] = []

    def progress_thread() -> None:
        tid.append(threading.get_native_id())
        started.set()
        release.wait(5)

    t = threading.Thread(target=progress_thread, daemon=True)
    t.start()
    started.wait(5)
    try:
        pin_process([cpus[0]])
        assert os.sched_getaffinity(tid[0]) == {cpus[0]}
        assert os.sched_getaffinity(0) == {cpus[0]}
    finally:
        release.set()
        pin_process(cpus)


# ---------------------------------------------------------------------------- suites


def test_fixtures_are_not_read_again_after_the_suite_was_hashed(tmp_path):
    d = tmp_path / "tiny"
    shutil.copytree(FIXTURES / "tiny", d)
    suite = load_suite(d)
    task = suite.task("cancel-one")
    before = suite.fixture_sql(task)
    (d / "sql" / "rows.sql").write_text("-- edited in the middle of the run\n")
    (d / "sql" / "cancel-one.sql").write_text("-- edited too\n")
    assert suite.fixture_sql(task) == before
    inputs = state_kind("sqlite").prepare(suite, task)
    rows = sqlite3.connect(":memory:")
    rows.deserialize(inputs.files["fixture.db"])
    assert rows.execute("SELECT count(*) FROM orders").fetchone()[0] > 0  # built from what was hashed
    assert load_suite(d).content_hash != suite.content_hash


# ---------------------------------------------------------------------------- core leases


def _two_cores(tmp_path: Path, monkeypatch) -> CpuPool:
    monkeypatch.setenv("HARNESS_LOCK_DIR", str(tmp_path / "locks"))
    return CpuPool(cpus=[0, 1], reserved=[0])


def test_a_lease_wait_ends_on_its_timeout_and_when_the_run_stops(tmp_path, monkeypatch):
    holder = _two_cores(tmp_path, monkeypatch)
    held = holder.lease(1)  # another controller holds core 1
    waiter = CpuPool(cpus=[0, 1], reserved=[0])
    t0 = time.monotonic()
    with pytest.raises(LeaseTimeout):
        waiter.lease(1, timeout=0.5)
    assert time.monotonic() - t0 < 2
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(LeaseCancelled):
        waiter.lease(1, stop=stop)
    assert time.monotonic() - t0 < 2
    assert waiter.in_use() == 0
    holder.release(held)
    assert waiter.lease(1, timeout=2) == [1]


def test_a_lease_takes_free_cores_another_controller_does_not_hold(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_LOCK_DIR", str(tmp_path / "locks"))
    other = CpuPool(cpus=[0, 1, 2, 3], reserved=[0])
    assert other.lease(1) == [1]  # another controller holds the lowest trial core
    mine = CpuPool(cpus=[0, 1, 2, 3], reserved=[0])
    assert mine.lease(2, timeout=1) == [2, 3]
    with pytest.raises(LeaseTimeout):
        mine.lease(1, timeout=0.3)


def test_the_lock_folder_is_never_used_through_a_symlink(tmp_path, monkeypatch):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    os.chmod(target, 0o700)
    (tmp_path / "locks").symlink_to(target)
    monkeypatch.setenv("HARNESS_LOCK_DIR", str(tmp_path / "locks"))
    with pytest.raises(SchedulerError, match="is a symlink"):
        CpuPool(cpus=[0, 1], reserved=[0]).lease(1)
    assert stat.S_IMODE(target.stat().st_mode) == 0o700  # not chmod-ed through the link
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_lock_file_is_never_followed_or_chmod_ed(tmp_path, monkeypatch, link):
    locks = tmp_path / "locks"
    locks.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("root's own file\n")
    os.chmod(secret, 0o600)
    if link == "symlink":
        (locks / "cpu1.lock").symlink_to(secret)
    else:
        os.link(secret, locks / "cpu1.lock")
    monkeypatch.setenv("HARNESS_LOCK_DIR", str(locks))
    with pytest.raises(SchedulerError, match="cpu1.lock"):
        CpuPool(cpus=[0, 1], reserved=[0]).lease(1)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert secret.read_text() == "root's own file\n"


# ---------------------------------------------------------------------------- the store


def test_a_run_id_prefix_is_matched_literally(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path}/h.db")
    store.add_run(run_record("ab_1"))
    store.add_run(run_record("abx1"))
    assert store.get_run("ab_").id == "ab_1"  # '_' used to match any character: ambiguous
    with pytest.raises(StoreError, match="no such run"):
        store.get_run("%")  # '%' used to match every run
    with pytest.raises(StoreError, match="ambiguous"):
        store.get_run("ab")


def _db_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_read_only_commands_write_nothing_to_the_store(tmp_path):
    """trials / show / samples / report / runs / gate used to add missing columns (ALTER
    TABLE) and create tables in an older database."""
    db = tmp_path / "h.db"
    store = Store.open(f"sqlite:///{db}")
    store.add_run(run_record("r-old", task_ids=["t"], trials=1))
    aid = store.add_attempt(AttemptRecord(run_id="r-old", task_id="t", slot=0, attempt_no=1, seed=0, verdict="clean", outcome="pass"))
    store.engine.dispose()
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.execute("ALTER TABLE attempts DROP COLUMN grade_wall_s")  # a database from an older harness
    conn.execute("DROP TABLE attempt_claims")
    conn.commit()
    conn.close()
    before = _db_digest(db)
    url = f"sqlite:///{db}"
    cli = CliRunner()
    for args in (["trials", "r-old"], ["show", str(aid)], ["samples", str(aid)], ["report", "r-old"], ["runs"],
                 ["gate", "r-old", "--require", "pass@1>=0.5"], ["trials", "r-old", "--json"]):
        r = cli.invoke(app, [*args, "--db", url])
        assert r.exit_code == 0, (args, r.output)
    assert _db_digest(db) == before
    cols = {r[1] for r in sqlite3.connect(db).execute("PRAGMA table_info(attempts)")}
    assert "grade_wall_s" not in cols


def test_gc_keeps_resumable_runs_and_recovers_runs_whose_controller_died(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    store = Store.open(f"sqlite:///{tmp_path}/h.db")
    old = utcnow() - dt.timedelta(days=40)
    folders = {}
    for rid, status, ctl in (("r-int", "interrupted", ""), ("r-dead", "running", f"{controller_host()}:{dead_pid()}"),
                             ("r-live", "running", controller_id()), ("r-done", "complete", "")):
        folders[rid] = tmp_path / "home" / "runs" / rid
        (folders[rid] / "t").mkdir(parents=True)
        (folders[rid] / "t" / "stdout.txt").write_text("evidence")
        store.add_run(run_record(rid, created_at=old, status=status, controller=ctl, artifacts_dir=str(folders[rid]),
                                 heartbeat_at=utcnow()))
    res = collect(store, dt.timedelta(days=30))
    assert res["recovered"] == ["r-dead"] and store.get_run("r-dead").status == "interrupted"
    assert res["skipped_running"] == ["r-live"]
    assert sorted(res["kept_interrupted"]) == ["r-dead", "r-int"]
    assert folders["r-int"].is_dir() and folders["r-dead"].is_dir() and folders["r-live"].is_dir()
    assert not folders["r-done"].exists()
    res = collect(store, dt.timedelta(days=30), include_interrupted=True)
    assert not folders["r-int"].exists() and not folders["r-dead"].exists()


# ---------------------------------------------------------------------------- resume ownership


def test_resume_tells_a_live_controller_in_another_pid_namespace_from_a_dead_one():
    """Ownership used to be host:pid, judged by this namespace's pids: pid 1 of another
    container looked alive here, and a live controller elsewhere looked dead."""
    other_ns = f"{controller_host().split(':')[0]}:4026530000:1"
    fresh = run_record(status="running", controller=other_ns, heartbeat_at=utcnow())
    with pytest.raises(RunError, match="another host or pid namespace"):
        _refuse_live_owner(fresh)
    stale = fresh.model_copy(update={"heartbeat_at": utcnow() - dt.timedelta(seconds=HEARTBEAT_STALE_S + 5)})
    _refuse_live_owner(stale)  # silent for too long: dead
    _refuse_live_owner(run_record(status="running", controller=f"{controller_host()}:{dead_pid()}", heartbeat_at=utcnow()))
    with pytest.raises(RunError, match="still being run by process"):
        _refuse_live_owner(run_record(status="running", controller=controller_id(), heartbeat_at=utcnow()))


def test_an_attempt_that_kills_its_controller_every_time_ends_unmeasured():
    """Claims left by a dead controller become controller_lost attempts, charged to the slot:
    resuming again and again cannot repeat the same attempt forever."""
    lost = [outcome.controller_lost("r", "t", 0, n, 7, "h:1:2", utcnow(), utcnow()) for n in (1, 2)]
    pend = pending_slots(lost, ["t"], trials=1, max_reruns=1, run_seed=0)
    assert pend.slots == [] and pend.progress.unmeasured == 1
    pend = pending_slots(lost[:1], ["t"], trials=1, max_reruns=1, run_seed=0)
    assert [(s.slot, s.attempts, s.budget_used) for s in pend.slots] == [(0, 1, 1)]
    # and --refill-unmeasured keeps it unmeasured (the attempt may have killed its controller), so
    # `harness run` does not advise it for such slots
    from harness.engine.runner import refill_plan

    run = run_record("r", task_ids=["t"], trials=1).model_copy(update={"max_reruns": 1})
    assert refill_plan(run, lost) == ({}, ["t/0"])


# ---------------------------------------------------------------------------- input folders


def test_input_folders_of_a_dead_controller_are_swept(tmp_path):
    mine = input_folder(tmp_path, "harness-live")
    leaked = tmp_path / f"{pid_namespace()}-{dead_pid()}-harness-dead"
    (leaked / "in").mkdir(parents=True)
    (leaked / "in" / "prompt.txt").write_text("x")
    other_ns = tmp_path / f"4026530000-{dead_pid()}-harness-elsewhere"
    other_ns.mkdir()
    assert sweep_input_folders(tmp_path) == [leaked.name]
    assert mine.is_dir() and other_ns.is_dir() and not leaked.exists()


# ---------------------------------------------------------------------------- found by a review and an attack pass


def test_an_interrupted_attempt_keeps_the_rules_that_discarded_it():
    rec = AttemptRecord(run_id="r", task_id="t", slot=0, attempt_no=1, seed=0, verdict="discarded", reasons=["infra_error"],
                        rules=[{"rule": "infra_error", "scope": "host", "breached": True, "detail": "container died"}])
    out = outcome.interrupted(rec)
    assert out.reasons == ["interrupted"] and [r["rule"] for r in out.rules] == ["infra_error", "interrupted"]
    assert outcome.charged([out]) == 0
    # an attempt discarded for the host before the interrupt ran to its end: not "cut short"
    host = rec.model_copy(update={"reasons": ["host_cpu_contention"]})
    assert not outcome.cut_short(host) and outcome.cut_short(rec)


def test_records_a_failed_store_could_not_take_are_stored_at_resume(tmp_path):
    from harness.engine.prepare import Prepared
    from harness.engine.runner import Runner
    from harness.model.profile import Profile

    store = Store.open(f"sqlite:///{tmp_path}/h.db")
    run = run_record("r-u", artifacts_dir=str(tmp_path / "runs" / "r-u"), trials=2)
    store.add_run(run)
    (tmp_path / "runs" / "r-u").mkdir(parents=True)
    kept = [AttemptRecord(run_id="r-u", task_id="t", slot=i, attempt_no=1, seed=0, verdict="clean", outcome="pass") for i in range(2)]
    store.add_attempt(kept[0])  # the first one made it before the store failed
    (tmp_path / "runs" / "r-u" / "unsaved-attempts.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in kept))
    runner = Runner(store, run, suite=None, profile=Profile(name="p"), prepared=Prepared(tasks=[], profiles={}, images={}), client=None,
                    pool=CpuPool(cpus=[0], cross_process=False))
    runner._import_unsaved()
    assert sorted((a.slot, a.attempt_no) for a in store.attempts("r-u")) == [(0, 1), (1, 1)]  # each once
    assert (tmp_path / "runs" / "r-u" / "unsaved-attempts.jsonl.imported").is_file()


def test_show_never_passes_agent_text_to_the_terminal_as_markup_or_escapes(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path}/h.db")
    store.add_run(run_record("r-esc", task_ids=["t"], trials=1))
    evil = "[/] \x1b[2J\x1b[32mclean: pass [/bold]"
    art = tmp_path / "a"
    art.mkdir()
    (art / "stdout.txt").write_text(f"hello {evil}\n")
    aid = store.add_attempt(AttemptRecord(
        run_id="r-esc", task_id="t", slot=0, attempt_no=1, seed=0, verdict="clean", outcome="fail", failure_kind="wrong_state",
        grade_reason="extra effect: new table [/] (1 row)", artifacts=str(art),
        state_diff={"tables": [{"table": evil, "status": "added", "counts": {"added": 1}}], "tables_total": 1,
                    "lines": [f"new table {evil} (1 row)"], "lines_total": 1}))
    r = CliRunner().invoke(app, ["show", str(aid), "--db", f"sqlite:///{tmp_path}/h.db"])
    assert r.exit_code == 0, r.output
    assert "\x1b[2J" not in r.output and "[/]" in r.output


def test_the_values_of_rows_added_and_removed_are_shown_cut_and_counted():
    from types import SimpleNamespace

    from harness.report.review import _diff_html
    from harness.report.views import diff_row_lines

    rows = [{"id": i, "amount_cents": 15000 + i, "body": "x" * 500 + "\n<script>alert(1)</script>"} for i in range(1, 8)]
    sd = {"tables": [
        {"table": "refunds", "status": "changed", "key": ["id"], "counts": {"added": 30, "removed": 1, "changed": 0},
         "added": rows, "removed": [{"id": 99, "amount_cents": None}], "changed": []},
        {"table": "ghost", "status": "added", "counts": {"added": 3}},  # a new table: counted by the grader's line only
    ], "lines": ["refunds +30 rows (id=1, 2, 3 …)", "refunds -1 row (id=99)"]}
    got = diff_row_lines(sd)
    assert got[0].startswith("refunds +(id=1) amount_cents=15001, body=\"xxx") and len(got[0]) < 300
    assert "\n" not in "".join(got)  # a string value stays on its line
    assert sum(1 for x in got if x.startswith("refunds +(")) == 5
    assert "refunds +… 25 more row(s) added" in got
    assert "refunds -(id=99) amount_cents=NULL" in got
    assert not any(x.startswith("ghost") for x in got)
    page = _diff_html(SimpleNamespace(state_diff=sd, reward=None, grade_checks=[], grade_status="ok"))
    assert "amount_cents=15001" in page and "<script>" not in page


def test_a_damaged_stored_diff_gives_no_row_lines_rather_than_an_error():
    from harness.report.views import diff_row_lines

    assert diff_row_lines({"tables": [{"table": "t", "status": "changed", "added": ["not a row", 3], "counts": None},
                                          {"table": "u", "status": "changed", "added": [], "counts": ["x"]},
                                          {"table": "v", "status": "changed", "removed": [], "counts": {"removed": "many"}}]}) == []
    assert diff_row_lines({"tables": ["x", None]}) == []
    assert diff_row_lines(None) == []


def test_a_file_name_with_a_newline_cannot_forge_a_line_of_the_files_diff():
    from harness.report.views import diff_lines
    from harness.state.files_grade import _line

    forged = "notes.txt\n/app/config.json unchanged"
    line = _line({"path": forged, "change": "added", "detail": None})
    assert "\n" not in line and line.startswith('"notes.txt\\n/app') and line.endswith('" added')
    assert _line({"path": "/app/a b.txt", "change": "removed", "detail": None}) == "/app/a b.txt removed"
    assert _line({"path": " /app/x", "change": "removed", "detail": None}) == '" /app/x" removed'
    # controls too, from the name as it is (its cleaned form made a\x1bb and a\x01b look the same)
    a, b = (_line({"path": "\ufffd", "raw": f"/app/a{c}b", "change": "added", "detail": None}) for c in "\x1b\x01")
    assert a == '"/app/a\\u001bb" added' and b == '"/app/a\\u0001b" added'
    # a line a grader of an older harness stored raw is still shown as one line
    got = diff_lines({"files": {"total": 1, "lines": [forged + " added"]}})
    assert got == ["notes.txt\\n/app/config.json unchanged added"]
    assert diff_lines({"lines": ["t +1 row\nforged"], "lines_total": 1}) == ["t +1 row\\nforged"]


def test_a_child_that_exits_before_it_is_watched_is_still_waited_for():
    """The in-sandbox finish program dropped its Popen object at once; when the child was done
    before pidfd_open (a quick command, a host that stalled us: seen as host_steal attempts
    in CI), the object's finalizer had reaped it and the export died with ProcessLookupError."""
    import io
    import runpy
    import select
    import signal
    import subprocess as real
    import sys
    from types import SimpleNamespace

    from harness.sandbox.finish import FINISH

    class StalledHostPopen(real.Popen):  # stands for the stall: returns only once the child is a zombie
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            while Path(f"/proc/{self.pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z":
                time.sleep(0.005)

    ns = {"os": os, "io": io, "runpy": runpy, "select": select, "signal": signal, "sys": sys, "time": time,
          "subprocess": SimpleNamespace(Popen=StalledHostPopen, DEVNULL=real.DEVNULL)}
    exec(FINISH[FINISH.index("def run("):FINISH.index("\ndef refuse(")], ns)
    rc, timed_out, out, err, n_out, n_err = ns["run"](["sh", "-c", "echo hi; exit 3"], 10, 100, {}, "/")
    assert (rc, timed_out, out, err, n_out) == (3, False, b"hi\n", b"", 3)
