"""Faults with real processes: kill -9 of the controller, Ctrl-C, leftovers, a locked store."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from conftest import missing
from harness.sandbox.owners import LABEL, LABEL_RUN
from harness.store.store import Store

HOST_RULES = {"host_cpu_contention", "host_steal", "host_memory_pressure", "host_io_pressure", "host_memory_low"}
pytestmark = pytest.mark.docker

PROBE = str(Path(__file__).parent / "suites" / "probe")


def start(tmp_path: Path, *args: str, **env_extra: str) -> subprocess.Popen:
    env = {**os.environ, "HARNESS_HOME": str(tmp_path / "home"), "PROBE_BURN": "0.6", **env_extra}
    if (tmp_path / "tmp").is_dir():
        env["TMPDIR"] = str(tmp_path / "tmp")
    return subprocess.Popen(
        [sys.executable, "-m", "harness", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
        preexec_fn=_ctrl_c_as_at_a_terminal,
    )


def _ctrl_c_as_at_a_terminal() -> None:
    """The child gets SIGINT's default disposition, as a command typed at a terminal has: a test
    run started in the background by a shell without job control (nohup, `cmd &` in a script)
    inherits SIGINT ignored, and the Ctrl-C under test would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HARNESS_HOME": str(tmp_path / "home"), "PROBE_BURN": "0.6"}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)


def wait_attempts(db: Path, n: int, timeout: float = 120) -> str:
    """Wait until the run in ``db`` has stored ``n`` attempts; return its id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db.exists():
            try:
                c = sqlite3.connect(db)
                rows = c.execute("select run_id, count(*) from attempts group by run_id").fetchall()
                c.close()
                if rows and rows[0][1] >= n:
                    return rows[0][0]
            except sqlite3.Error:
                pass
        time.sleep(0.1)
    raise AssertionError(f"run did not store {n} attempts in {timeout}s")


def run_containers(client, run_id: str) -> list:
    return client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"})


def assert_each_slot_once(store: Store, run_id: str, tasks: int, trials: int) -> None:
    atts = store.attempts(run_id)
    clean = Counter((a.task_id, a.slot) for a in atts if a.verdict == "clean")
    assert len(clean) == tasks * trials, sorted(clean)
    assert set(clean.values()) == {1}, "a slot was filled twice"
    keys = Counter((a.task_id, a.slot, a.attempt_no) for a in atts)
    assert set(keys.values()) == {1}, "duplicate attempt numbers"


def test_kill_9_then_resume_fills_every_slot_exactly_once(docker_client, tmp_path):
    """kill -9 in the middle of an attempt (as the OOM killer would): the run stays 'running',
    its container and input folder are left behind. The resume records the lost attempt
    (controller_lost, charged to the slot), removes the leftovers, and fills every slot once."""
    db = tmp_path / "h.db"
    (tmp_path / "tmp").mkdir()
    p = start(tmp_path, "run", "--suite", PROBE, "--trials", "5", "--max-reruns", "20", "--db", f"sqlite:///{db}")
    run_id = wait_attempts(db, 3)
    deadline = time.monotonic() + 30
    while not run_containers(docker_client, run_id) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)  # inside the agent
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    inputs = tmp_path / "home" / "inputs"
    assert any(inputs.iterdir()), "the killed controller left its attempt's input folder"
    r = run_cli(tmp_path, "run", "--resume", run_id, "--db", f"sqlite:///{db}", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["run_id"] == run_id
    assert all(t["n"] == 5 for t in out["tasks"])
    store = Store.open(f"sqlite:///{db}", mode="ro")
    assert_each_slot_once(store, run_id, tasks=2, trials=5)
    assert store.get_run(run_id).status == "complete"
    assert not run_containers(docker_client, run_id)
    lost = [a for a in store.attempts(run_id) if a.reasons == ["controller_lost"]]
    assert len(lost) == 1 and lost[0].verdict == "discarded" and "found by --resume" in lost[0].error
    assert list(inputs.iterdir()) == []  # swept at the resume's start
    assert not [n for n in os.listdir(tmp_path / "tmp") if n.startswith("harness-in")]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_removes_containers_fast_and_run_is_resumable(docker_client, tmp_path, sig):
    db = tmp_path / "h.db"
    p = start(tmp_path, "run", "--suite", PROBE, "--trials", "3", "--max-reruns", "20", "--db", f"sqlite:///{db}")
    run_id = wait_attempts(db, 2)
    # wait until an attempt's container is up, then interrupt in the middle of it
    deadline = time.monotonic() + 30
    while not run_containers(docker_client, run_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    p.send_signal(sig)
    p.wait(timeout=30)
    assert time.monotonic() - t0 < 10
    assert p.returncode != 0
    assert not run_containers(docker_client, run_id)
    store = Store.open(f"sqlite:///{db}", mode="ro")
    assert store.get_run(run_id).status == "interrupted"
    r = run_cli(tmp_path, "run", "--resume", run_id, "--db", f"sqlite:///{db}", "--json")
    assert r.returncode == 0, r.stderr
    assert_each_slot_once(store, run_id, tasks=2, trials=3)
    # an attempt cut short by Ctrl-C is kept as evidence, marked interrupted, never scored
    for a in store.attempts(run_id):
        if "interrupted" in (a.reasons or []):
            assert a.verdict == "discarded"


def test_startup_sweep_removes_leftovers_of_a_dead_controller(docker_client, tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    left = docker_client.containers.run(
        "harness/sandbox:latest", ["sleep", "600"], detach=True, network_mode="none",
        labels={LABEL: "1", "dev.harness.owner-pid": dead, LABEL_RUN: "r-dead"},
    )
    r = run_cli(tmp_path, "run", "--suite", PROBE, "--trials", "1", "--k", "1", "--tasks", "append", "--db", f"sqlite:///{tmp_path}/h.db", "--json")
    assert r.returncode == 0, r.stderr
    assert not run_containers(docker_client, "r-dead")
    try:
        left.remove(force=True)
    except Exception:
        pass


def test_read_only_store_is_a_clear_error(docker_client, tmp_path):
    db = tmp_path / "h.db"
    Store.open(f"sqlite:///{db}")  # an existing store...
    url = f"sqlite:///file:{db}?mode=ro&uri=true"  # ...opened read-only by the driver
    r = run_cli(tmp_path, "run", "--suite", PROBE, "--trials", "1", "--k", "1", "--db", url)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "read-only" in r.stderr and "--db" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_locked_store_is_a_clear_error(docker_client, tmp_path):
    db = tmp_path / "h.db"
    Store.open(f"sqlite:///{db}")
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        r = run_cli(tmp_path, "run", "--suite", PROBE, "--trials", "1", "--k", "1", "--db", f"sqlite:///{db}")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "locked" in r.stderr, r.stderr


def _restart_engine() -> None:
    """Stop the running dockerd (SIGTERM, by its pid) and start it again with docker/engine.sh."""
    pid = int(subprocess.run(["pgrep", "-xo", "dockerd"], capture_output=True, text=True, check=True).stdout.split()[0])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("dockerd did not stop")
    engine = Path(__file__).resolve().parent.parent / "docker" / "engine.sh"
    subprocess.run(["bash", str(engine)], check=True, capture_output=True, timeout=120)


def test_engine_restart_mid_run_is_infra_error_and_the_run_completes(docker_client, tmp_path):
    if os.geteuid() != 0:
        missing("restarting the engine needs root")
    db = tmp_path / "h.db"
    p = start(tmp_path, "run", "--suite", PROBE, "--trials", "4", "--max-reruns", "20", "--db", f"sqlite:///{db}", "--json")
    run_id = wait_attempts(db, 2)
    _restart_engine()
    out, errs = p.communicate(timeout=300)
    assert p.returncode == 0, errs
    doc = json.loads(out)
    assert all(t["n"] == 4 for t in doc["tasks"])
    store = Store.open(f"sqlite:///{db}", mode="ro")
    assert_each_slot_once(store, run_id, tasks=2, trials=4)
    infra = [a for a in store.attempts(run_id) if "infra_error" in (a.reasons or [])]
    assert infra, "the attempt cut by the restart is kept as a discarded infra_error"
    assert all(a.verdict == "discarded" and a.error for a in infra)


def test_container_removed_from_outside_is_infra_error_not_a_crash(docker_client, tmp_path):
    db = tmp_path / "h.db"
    p = start(tmp_path, "run", "--suite", PROBE, "--tasks", "append", "--trials", "1", "--k", "1", "--max-reruns", "2",
              "--agent-cmd", "python3 -c 'import time; time.sleep(4)'", "--db", f"sqlite:///{db}", "--json")
    deadline = time.monotonic() + 60
    victim = None
    while victim is None and time.monotonic() < deadline:
        found = docker_client.containers.list(filters={"label": [f"{LABEL}=1", "dev.harness.attempt"], "status": "running"})  # an attempt, not the start-up probe
        victim = found[0] if found else None
        time.sleep(0.05)
    assert victim is not None
    time.sleep(1.0)  # inside the agent's sleep
    victim.remove(force=True)
    out, errs = p.communicate(timeout=120)
    assert p.returncode == 0, errs
    run_id = json.loads(out)["run_id"]
    atts = Store.open(f"sqlite:///{db}", mode="ro").attempts(run_id)
    first = atts[0]
    assert first.verdict == "discarded" and first.reasons == ["infra_error"], (first.verdict, first.reasons, first.error)
    assert "container died" in first.error
    # the slot was rerun in a fresh container until clean (a busy host may discard a rerun for contention: kept as evidence)
    assert atts[-1].verdict == "clean", [(a.verdict, a.reasons) for a in atts]
    assert all(set(a.reasons) <= HOST_RULES for a in atts[1:-1]), [(a.verdict, a.reasons) for a in atts]


def test_a_new_attempt_never_starts_after_the_interrupt_cleanup(docker_client, tmp_path):
    """The cleanup used to race a worker about to start its next sandbox: once stopped, an
    attempt whose sandbox starts anyway is removed at once and recorded as interrupted."""
    from harness.engine.events import EventSink
    from harness.engine.pipeline import AttemptJob, AttemptPipeline
    from harness.engine.profiles import load_profile
    from harness.engine.suites import load_suite
    from harness.model.run import RunRecord
    from harness.sandbox.docker_backend import DockerBackend

    suite = load_suite(PROBE)
    stop = threading.Event()
    pipeline = AttemptPipeline(DockerBackend(docker_client, inputs_root=tmp_path / "inputs"), EventSink(), stop)
    run = RunRecord(id="r-stop", suite="probe", suite_hash=suite.content_hash, image=suite.image, agent_cmd=list(suite.agent_cmd),
                    profile="standard", harness_version="0", trials=1, max_reruns=0, task_ids=["append"])
    job = AttemptJob(run=run, suite=suite, task=suite.task("append"), profile=load_profile("standard"), slot=0, attempt_no=1,
                     seed=1, cpuset=[min(os.sched_getaffinity(0))], concurrent=1, artifacts=tmp_path / "a")
    stop.set()  # Ctrl-C's cleanup ran just before this attempt's sandbox came up
    out = pipeline.run(job)
    assert out.removed and out.record.verdict == "discarded"
    assert "stopped before the agent started" in out.record.error
    assert out.record.exit_code is None  # the agent never ran
    assert not run_containers(docker_client, "r-stop")


def test_sweep_stops_on_sigterm_like_on_ctrl_c(docker_client, tmp_path):
    db = tmp_path / "h.db"
    p = start(tmp_path, "sweep", "--suite", PROBE, "--headroom", "1,2", "--trials", "3", "--k", "1", "--db", f"sqlite:///{db}",
              PROBE_BURN="3")
    run_id = wait_attempts(db, 1)
    deadline = time.monotonic() + 30
    while not run_containers(docker_client, run_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    assert time.monotonic() - t0 < 10, "sweep ignored SIGTERM"
    assert p.returncode == 130
    assert not docker_client.containers.list(all=True, filters={"label": [f"{LABEL}=1", f"dev.harness.owner-pid={p.pid}"]})
    assert Store.open(f"sqlite:///{db}", mode="ro").get_run(run_id).status == "interrupted"


def test_deleting_the_store_mid_run_fails_loudly_and_keeps_the_records(docker_client, tmp_path):
    db = tmp_path / "h.db"
    p = start(tmp_path, "run", "--suite", PROBE, "--trials", "4", "--max-reruns", "20", "--db", f"sqlite:///{db}", "--json")
    run_id = wait_attempts(db, 1)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    out, errs = p.communicate(timeout=120)
    assert p.returncode == 3, (p.returncode, out, errs)
    assert "was deleted while in use" in errs and run_id in errs, errs
    assert "Traceback" not in errs
    kept = tmp_path / "home" / "runs" / run_id / "unsaved-attempts.jsonl"
    assert kept.is_file() and json.loads(kept.read_text().splitlines()[0])["run_id"] == run_id
    assert str(kept) in errs
    assert not run_containers(docker_client, run_id)


def test_a_transcript_over_its_cap_does_not_throw_away_the_state(docker_client, tmp_path):
    """Export caps used to be one total: a big transcript cost the attempt its final state."""
    agent = "\n".join([
        "import os, sqlite3",
        "c = sqlite3.connect(os.environ['HARNESS_STATE'])",
        "c.execute('insert into log(seed, seen) values (1, 0)')",
        "c.commit()",
        "with open(os.environ['HARNESS_TRANSCRIPT'], 'w') as f:",
        "    for _ in range(70):",
        "        f.write('{\"x\": \"' + 'y' * 1000000 + '\"}\\n')",
    ])
    r = run_cli(tmp_path, "run", "--suite", PROBE, "--tasks", "append", "--trials", "1", "--k", "1",
                "--agent-cmd", f"python3 -c {shlex.quote(agent)}", "--db", f"sqlite:///{tmp_path}/h.db", "--json")
    assert r.returncode == 0, r.stderr
    run_id = json.loads(r.stdout)["run_id"]
    atts = Store.open(f"sqlite:///{tmp_path}/h.db", mode="ro").attempts(run_id)
    # writing 70 MB may be discarded for host I/O pressure on a loaded machine and rerun: the clean one counts
    clean = [a for a in atts if a.verdict == "clean"]
    assert len(clean) == 1, [(a.verdict, a.reasons) for a in atts]
    a = clean[0]
    assert a.outcome == "pass", (a.grade_reason, a.error)
    d = Path(a.artifacts)
    assert (d / "state.db").is_file()
    assert (d / "transcript.jsonl").stat().st_size == 16 * 1024 * 1024
    assert "kept the first 16 MiB of 'transcript.jsonl'" in a.error
