"""`harness run` end to end with real containers, a real SQLite store and the probe suite."""

from __future__ import annotations

import json
import signal
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import missing
from harness.sandbox.images import SANDBOX_IMAGE
from harness.sandbox.owners import LABEL
from harness.store.store import Store
from harness.core.aggregate import summarize

pytestmark = pytest.mark.docker

PROBE = str(Path(__file__).parent / "suites" / "probe")


def harness(tmp_path: Path, *args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    e = {**os.environ, "HARNESS_HOME": str(tmp_path / "home"), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=timeout, env=e, cwd=tmp_path
    )


def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/h.db"


def test_small_run_stores_every_attempt_and_summary_equals_recount(docker_client, tmp_path):
    r = harness(tmp_path, "run", "--suite", PROBE, "--trials", "3", "--db", db_url(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {"run_id", "suite", "profile", "trials", "tasks", "metrics"} <= set(out)
    assert out["suite"] == "probe" and out["trials"] == 3
    assert {"pass@1", "pass@3", "pass^3"} <= set(out["metrics"])

    store = Store.open(db_url(tmp_path), mode="ro")
    attempts = store.attempts(out["run_id"])
    clean = [a for a in attempts if a.verdict == "clean"]
    assert len(clean) == 2 * 3  # every slot filled exactly once
    for a in attempts:
        assert a.cpu_usage_us and a.cpu_usage_us > 0
        assert a.memory_peak and a.pids_peak
        assert a.foreign_cpu_share is not None and a.mem_available_min
        assert a.envelope_applied["memory_max"] == a.envelope["memory"]
        assert store.samples(a.id), "saturation samples stored"
        art = Path(a.artifacts)
        assert (art / "state.db").exists() and (art / "stdout.txt").exists() and (art / "transcript.jsonl").exists()

    # recount by hand from the stored rows
    by_task: dict[str, list[bool]] = {}
    for a in sorted(clean, key=lambda a: (a.task_id, a.slot)):
        by_task.setdefault(a.task_id, []).append(a.outcome == "pass")
    for t in out["tasks"]:
        assert t["outcomes"] == by_task[t["task"]]
        assert (t["n"], t["c"]) == (len(by_task[t["task"]]), sum(by_task[t["task"]]))
    per_task_p1 = [sum(v) / len(v) for v in by_task.values()]
    assert out["metrics"]["pass@1"] == pytest.approx(sum(per_task_p1) / len(per_task_p1))
    # and the stored summary recomputes the same document
    again = summarize(store.get_run(out["run_id"]), attempts)
    assert again["metrics"] == out["metrics"]


def test_a_run_in_the_terminal_prints_its_plan_and_its_table(docker_client, tmp_path):
    # what `make demo` shows (no --json): the plan line on stderr, the per-task table and the
    # suite line on stdout (a name shadowed in the printing code once broke every such run)
    r = harness(tmp_path, "run", "--suite", PROBE, "--trials", "1", "--k", "1", "--db", db_url(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "(2 tasks x 1 trial)" in r.stderr, r.stderr[-2000:]
    assert "1 trial ·" in r.stdout and "suite (mean over tasks): pass@1" in r.stdout, r.stdout[-2000:]


def test_an_agent_at_its_ceiling_fails_as_oom_killed_never_as_the_engines_error(docker_client, tmp_path):
    # tmpfs pages (memory of no process) up to the ceiling, then more: where the OOM killer may
    # take the sandbox's keeper (a controller without CAP_SYS_RESOURCE, as here) the container
    # ends with it; the kernel counted the kill in the agent's cgroup, so the attempt is the
    # agent's OOM failure -- it used to be discarded as an engine error and rerun, and the slot
    # ended unmeasured: a failing agent could dodge its score
    fill = "head -c 60m /dev/zero > /work/a; head -c 60m /dev/zero > /dev/shm/b; head -c 16m /dev/zero > /tmp/c; sleep 1"
    r = harness(tmp_path, "run", "--suite", PROBE, "--trials", "2", "--k", "1", "--profile", "tight", "--max-reruns", "1",
                "--agent-cmd", f"sh -c '{fill}'", "--db", db_url(tmp_path), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    atts = Store.open(db_url(tmp_path), mode="ro").attempts(json.loads(r.stdout)["run_id"])
    scored = [a for a in atts if a.verdict == "clean"]
    assert len(scored) == 4, [(a.verdict, a.reasons, a.error) for a in atts]
    for a in scored:
        assert (a.outcome, a.failure_kind) == ("fail", "oom_killed"), (a.verdict, a.reasons, a.error, a.grade_reason)
        assert a.oom_kills and a.oom_kills >= 1
    # on a loaded host the container and its cgroup may go before the counters are read: then
    # nothing measured the window and the attempt is discarded, charged, and named for what the
    # engine saw -- never an engine restart
    for a in atts:
        if a.verdict != "clean":
            assert "the engine saw an OOM kill" in (a.error or ""), a.error


def test_fresh_state_per_attempt_and_extra_effects_fail(docker_client, tmp_path):
    r = harness(tmp_path, "run", "--suite", PROBE, "--trials", "3", "--db", db_url(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    tasks = {t["task"]: t for t in out["tasks"]}
    # the appender saw 0 rows in every attempt: no attempt sees another's leftovers
    assert tasks["append"]["outcomes"] == [True, True, True]
    store = Store.open(db_url(tmp_path), mode="ro")
    for a in store.attempts(out["run_id"]):
        final = sqlite3.connect(Path(a.artifacts) / "state.db")
        assert final.execute("select seen from log").fetchall() == [(0,)]
    # an extra effect fails with the grader's reason, as wrong_state (the agent exited 0)
    assert tasks["extra-effect"]["outcomes"] == [False, False, False]
    ee = [a for a in store.attempts(out["run_id"]) if a.task_id == "extra-effect"]
    assert all(a.failure_kind == "wrong_state" and a.exit_code == 0 for a in ee)
    assert all("audit" in a.grade_reason for a in ee), [a.grade_reason for a in ee]


def _spinner(client, cpus: str, seconds: float):
    return client.containers.run(
        SANDBOX_IMAGE,
        ["python3", "-c", f"import time\nt=time.time()\nwhile time.time()-t<{seconds}: pass"],
        detach=True,
        cpuset_cpus=cpus,
        network_mode="none",
        labels={"dev.harness.test": "noisy-neighbor"},  # not dev.harness=1: the run's sweep would remove it
    )


def _trial_cores() -> str:
    cpus = sorted(os.sched_getaffinity(0))
    return ",".join(map(str, cpus[1:] if len(cpus) > 1 else cpus))


def test_noisy_neighbor_attempts_are_discarded_and_rerun(docker_client, tmp_path):
    nb = _spinner(docker_client, _trial_cores(), 5)
    try:
        time.sleep(0.3)
        r = harness(
            tmp_path, "run", "--suite", PROBE, "--tasks", "append", "--trials", "3", "--max-reruns", "12",
            "--db", db_url(tmp_path), "--json", env={"PROBE_BURN": "0.8"},
        )
    finally:
        nb.remove(force=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    store = Store.open(db_url(tmp_path), mode="ro")
    attempts = store.attempts(out["run_id"])
    discarded = [a for a in attempts if a.verdict == "discarded"]
    assert discarded, "attempts beside a spinning neighbor must be discarded"
    assert all("host_cpu_contention" in a.reasons for a in discarded), [a.reasons for a in discarded]
    rule = next(x for x in discarded[0].rules if x["rule"] == "host_cpu_contention")
    assert rule["value"] > rule["threshold"] and rule["breached"]
    # every slot still ends with exactly one clean attempt
    assert out["tasks"][0]["n"] == 3
    assert len([a for a in attempts if a.verdict == "clean"]) == 3
    assert out["attempts"]["discarded"] == len(discarded)


def test_a_busy_host_ends_the_run_non_zero_and_refill_completes_it(docker_client, tmp_path):
    # a spinning neighbour on the trial cores, no reruns: every slot ends unmeasured, the run
    # exits 3 naming host_cpu_contention; with the neighbour gone, --refill-unmeasured fills them
    strict = {"PROBE_BURN": "0.8", "HARNESS_MAX_UNMEASURED": "0", "HARNESS_PROBE_S": "0.3"}
    nb = _spinner(docker_client, _trial_cores(), 120)
    try:
        time.sleep(0.3)
        r = harness(
            tmp_path, "run", "--suite", PROBE, "--tasks", "append", "--trials", "2", "--k", "1,2", "--max-reruns", "0",
            "--db", db_url(tmp_path), "--json", env=strict,
        )
    finally:
        nb.remove(force=True)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "busy trial cores" in r.stderr and "python3" in r.stderr  # the pre-run probe named the neighbour
    assert "2 of 2 slot(s) unmeasured" in r.stderr and "host_cpu_contention" in r.stderr
    assert f"--refill-unmeasured --db {db_url(tmp_path)}" in r.stderr.replace("\n", "")  # a command to copy, with its store
    out = json.loads(r.stdout)
    t = out["tasks"][0]
    assert t["n"] == 0 and t["outcomes"] == []
    assert [u["reasons"] for u in t["unmeasured"]] == [["host_cpu_contention"], ["host_cpu_contention"]]
    assert out["unmeasured_slots"] == 2
    run_id = out["run_id"]
    r = harness(tmp_path, "run", "--resume", run_id, "--refill-unmeasured", "--db", db_url(tmp_path), "--json", env=strict)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["tasks"][0]["n"] == 2 and out["unmeasured_slots"] == 0 and out["status"] == "complete"
    store = Store.open(db_url(tmp_path), mode="ro")
    atts = store.attempts(run_id)
    assert len([a for a in atts if "host_cpu_contention" in a.reasons]) >= 2  # the evidence stays
    assert store.get_run(run_id).refills == {"append/0": 1, "append/1": 1}
    r = harness(tmp_path, "run", "--resume", run_id, "--refill-unmeasured", "--db", db_url(tmp_path), env=strict)
    assert r.returncode == 2 and "no unmeasured slot to refill" in r.stderr


def test_wait_quiet_waits_for_a_busy_core(docker_client, tmp_path):
    nb = _spinner(docker_client, _trial_cores(), 3)
    try:
        time.sleep(0.3)
        r = harness(tmp_path, "run", "--suite", PROBE, "--tasks", "append", "--trials", "1", "--k", "1", "--wait-quiet", "60",
                    "--db", db_url(tmp_path), env={"HARNESS_PROBE_S": "0.3", "HARNESS_MAX_UNMEASURED": "0"})
    finally:
        nb.remove(force=True)
    assert r.returncode == 0, r.stderr
    assert "waiting up to" in r.stderr and "python3" in r.stderr and "quiet now" in r.stderr, r.stderr


def _agent_running() -> bool:
    """The probe suite's agent (its script names PROBE_BURN) runs somewhere on this host."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            if b"PROBE_BURN" in cmdline and b"-m\x00harness" not in cmdline:  # the agent, not the controller
                return True
        except OSError:
            continue
    return False


def test_a_stalled_controller_discards_the_attempt(docker_client, tmp_path):
    # SIGSTOP the controller for 7 s while an agent runs: its timing and samples of that window
    # cannot be trusted, so the attempt is discarded (controller_stall) and the slot rerun
    cmd = [sys.executable, "-m", "harness", "run", "--suite", PROBE, "--tasks", "append", "--trials", "1", "--k", "1",
           "--max-reruns", "2", "--agent-env", "PROBE_BURN=4", "--db", db_url(tmp_path), "--json"]
    env = {**os.environ, "HARNESS_HOME": str(tmp_path / "home")}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not _agent_running() and time.monotonic() < deadline:  # the agent phase, not the setup before it
            time.sleep(0.05)
        time.sleep(0.5)
        p.send_signal(signal.SIGSTOP)
        time.sleep(7)
        p.send_signal(signal.SIGCONT)
        stdout, stderr = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
    assert p.returncode == 0, stderr
    run_id = json.loads(stdout)["run_id"]
    atts = Store.open(db_url(tmp_path), mode="ro").attempts(run_id)
    stalled = [a for a in atts if "controller_stall" in a.reasons]
    assert stalled, [(a.verdict, a.reasons) for a in atts]
    rule = next(x for x in stalled[0].rules if x["rule"] == "controller_stall")
    assert rule["value"] > 5.0 and rule["breached"] and rule["scope"] == "host"
    assert [a.verdict for a in atts].count("clean") == 1

def test_no_containers_left_behind(docker_client):
    assert not docker_client.containers.list(all=True, filters={"label": f"{LABEL}=1"})


def test_rows_committed_in_wal_mode_are_graded(docker_client, tmp_path):
    suite = str(Path(__file__).parent / "suites" / "wal")
    r = harness(tmp_path, "run", "--suite", suite, "--db", db_url(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["tasks"][0]["outcomes"] == [True], out
    store = Store.open(db_url(tmp_path), mode="ro")
    a = [a for a in store.attempts(out["run_id"]) if a.verdict == "clean"][0]
    assert (Path(a.artifacts) / "state.db-wal").stat().st_size > 0  # the raw WAL is kept as evidence


def test_concurrent_attempts_never_share_a_core(docker_client, tmp_path):
    """With no core reserved, both cores take trials at once: two lanes, exclusive cpusets.
    On a lane the next attempt starts its sandbox and sets up while the one before grades, but no agent
    window overlaps any other attempt's life on its core (read back from the stored phases):
    every attempt was halted (its processes gone) before its removal."""
    if len(os.sched_getaffinity(0)) < 2:
        missing("needs two cores (CI/HARNESS_REQUIRE_DOCKER machines have them)")
    r = harness(tmp_path, "run", "--suite", PROBE, "--trials", "4", "--k", "1,2", "--reserve-cores", "0", "--max-reruns", "30",
                "--db", db_url(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    store = Store.open(db_url(tmp_path), mode="ro")
    run = store.get_run(out["run_id"])
    assert run.concurrency == 2
    atts = store.attempts(out["run_id"])
    assert max(a.concurrent for a in atts) >= 2, "two attempts ran at once"
    by_core: dict[str, list] = {}
    for a in atts:
        t0 = a.started_at.timestamp()
        agent = [(t0 + p["start_s"], t0 + p["start_s"] + p["wall_s"]) for p in a.phases if p["name"] == "agent"]
        # its life on the core ends when its processes are gone (halt); the engine's removal after that runs elsewhere
        halted = [p for p in a.phases if p["name"] == "halt"]
        on_core = a.phases[:a.phases.index(halted[0]) + 1] if halted else a.phases
        life = (t0 + a.phases[0]["start_s"], t0 + max(p["start_s"] + p["wall_s"] for p in on_core))
        by_core.setdefault(a.cpuset, []).append((a.id, agent, life))
    assert len(by_core) == 2 and all(len(c.split(",")) == 1 for c in by_core)
    assert all([p["name"] for p in a.phases][-2:] == ["halt", "remove"] for a in atts), [a.phases for a in atts]
    overlapped = 0
    for lane in by_core.values():
        for i, agent, life in lane:
            for j, _, other in lane:
                if i == j:
                    continue
                overlapped += life[0] < other[1] and other[0] < life[1]
                for s, e in agent:
                    assert e <= other[0] or s >= other[1], f"attempt {i}'s agent window overlaps attempt {j} on its core"
    assert overlapped, "no two attempts on one core overlapped: the lanes did not pipeline"
    assert all(t["n"] == 4 for t in out["tasks"])


def test_an_agent_that_exits_127_fast_is_graded_not_excused(docker_client, tmp_path):
    """Exit 127 within a second with 'not found' on stderr used to make the attempt an
    infra_error (discarded, rerun, then unmeasured): an agent could excuse its failures."""
    agent = ("python3 -c \"import os, sqlite3, sys; c = sqlite3.connect(os.environ['HARNESS_STATE']); "
             "c.execute('insert into log(seed, seen) values (1, 5)'); c.commit(); print('sh: 1: tool: not found', file=sys.stderr); "
             "os._exit(127)\"")
    r = subprocess.run([sys.executable, "-m", "harness", "run", "--suite", PROBE, "--tasks", "append", "--trials", "1", "--k", "1",
                        "--agent-cmd", agent, "--db", db_url(tmp_path), "--json"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "HARNESS_HOME": str(tmp_path / "home")}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (a,) = Store.open(db_url(tmp_path), mode="ro").attempts(json.loads(r.stdout)["run_id"])
    assert a.verdict == "clean" and a.outcome == "fail" and a.failure_kind == "crashed" and a.exit_code == 127, (a.reasons, a.error)


def test_a_run_that_fails_before_its_first_attempt_is_not_left_running(docker_client, tmp_path, monkeypatch):
    """The engine failing in the start-up sweep (a container another controller removed
    between the listing and its inspect, an engine that went away) was a traceback, and the
    stored run stayed 'running' with its controller gone. Now it is one EngineError and the
    run is 'failed' (resumable). The engine here really is unreachable: a port nobody serves."""
    import docker

    from harness.engine.runner import RunOptions, Runner
    from harness.model.errors import EngineError

    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "home"))
    runner = Runner.plan(RunOptions(suite=PROBE, trials=1, ks=[1]), db=db_url(tmp_path))
    runner.backend.client = docker.DockerClient(base_url="tcp://127.0.0.1:9", version="1.41", timeout=5)  # the discard port: nothing listens
    with pytest.raises(EngineError, match="dead controllers left behind"):
        runner.execute()
    assert Store.open(db_url(tmp_path), mode="ro").get_run(runner.run.id).status == "failed"


def test_run_require_gates_the_run_it_just_made(docker_client, tmp_path):
    # probe: `append` passes, `extra-effect` leaves a wrong state -> pass^2 = 0.5, pass@1 = 0.5
    r = harness(tmp_path, "run", "--suite", PROBE, "--trials", "2", "--k", "1,2", "--max-reruns", "6",
                "--require", "pass^2>=0.5", "--require", "pass@1>=0.9", "--db", db_url(tmp_path), "--json")
    assert r.returncode == 1, r.stderr  # the agent fell short of a requirement: the gate's exit, not an error
    out = json.loads(r.stdout)
    gate = out["gate"]
    assert gate["run_id"] == out["run_id"] and gate["ok"] is False
    by_name = {c["name"]: c["ok"] for c in gate["checks"]}
    assert by_name["pass^2>=0.5"] is True and by_name["pass@1>=0.9"] is False
    # the same judgement as `harness gate` of the stored run
    g = harness(tmp_path, "gate", out["run_id"], "--require", "pass^2>=0.5", "--require", "pass@1>=0.9",
                "--db", db_url(tmp_path), "--json")
    assert g.returncode == 1 and json.loads(g.stdout)["checks"] == gate["checks"]
    t = harness(tmp_path, "run", "--suite", PROBE, "--trials", "2", "--k", "1", "--max-reruns", "6",
                "--require", "pass^2>=0.5", "--db", db_url(tmp_path))
    assert t.returncode == 0, t.stderr
    assert "gate passed" in t.stdout and "pass^2>=0.5" in t.stdout
    # the gate's k was fixed before the run: it is one of the run's k, so the report shows it
    assert Store.open(db_url(tmp_path), mode="ro").runs(limit=1)[0].ks == [1, 2]
