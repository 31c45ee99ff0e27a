"""``make bench``: ratios measured side by side in one run, each against its own baseline.

Never an absolute time as a pass/fail: every figure is printed next to the baseline it is
compared with, both measured here and now, interleaved so drift hits both equally.

  1. per-attempt overhead: harness ``run_command`` (``sandbox exec`` of a no-op: the command
     starts with its container) vs a bare docker-py ``containers.run`` of the same image under
     the same envelope (no network asked for, as the harness asks), beside the same harness
     through an exec (as an attempt's phases run), that design's floor (raw docker-py:
     sleeping init, one exec, forced removal) and a bare run with network_mode none;
  2. sampling cost: controller CPU spent by the monitor per attempt-second, as a share of one core;
  2b. controller scale model: controller CPU and memory per concurrent attempt (monitors of N
     sandboxes sharing cores: a bench-only mode), and the concurrency that fills one core;
  3. run throughput: attempts/s of ``harness run`` (no-op agent, whole pipeline: setup,
     agent, export, grade, judge, store) vs a per-trial ``docker-compose up / exec / down``
     loop doing the same work, the way compose-based harnesses run trials;
  4. estimator: suite metrics for 10^5 tasks x 100 trials vs a plain Python pass over the data;
     and `harness report` (json) of one run of 10^5 attempts vs a raw sqlite3 SELECT of its rows;
  5. report query: summarising one run in a SQLite store of 10^6 attempts vs a raw sqlite3
     query of the same rows;
  6. model gateway: one call through the gateway vs the same call made directly to the same
     bench upstream (a local HTTP server answering like a provider, not a model), interleaved
     from one container; and what the gateway adds to an attempt (attach, token, records, detach);
  7. Ray executor: what one attempt costs through a one-node Ray cluster on this machine vs the
     local executor (the slope of wall time over two run sizes, so joining the cluster and
     planning cancel out), interleaved; and Ray's own memory at idle.

Usage: python -m harness.cli.bench [--rounds N] [--json]   (``make bench``)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import shutil
import sys
import time
from pathlib import Path

from harness.engine.command import run_command
from harness.engine.profiles import load_profile
from harness.engine.scheduler import CpuPool
from harness.measure.monitor import Monitor
from harness.sandbox.base import SandboxSpec
from harness.sandbox.docker_backend import DockerBackend
from harness.sandbox import docker_sandbox
from harness.sandbox.docker_sandbox import DockerSandbox, connect
from harness.sandbox.images import SANDBOX_IMAGE
from harness.sandbox.owners import LABEL


def _bare_kwargs(prof, cpuset, lean: bool) -> dict:
    """The envelope as plain docker-py arguments. ``lean``: no network asked for as the harness
    asks (NetworkDisabled: loopback only, no network sandbox and its prestart hook); otherwise
    network_mode none, as most callers write it."""
    return dict(
        cpu_period=prof.cpu_period_us,
        cpu_quota=prof.quota_us,
        cpuset_cpus=",".join(map(str, cpuset)),
        mem_limit=prof.memory,
        memswap_limit=prof.memory,
        pids_limit=prof.pids,
        read_only=True,
        tmpfs={p: f"size={s}" for p, s in prof.tmpfs.items()},
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        network_mode="none",
        user=prof.user,
        labels={LABEL: "1", "dev.harness.bench": "bare"},
        **({"network_disabled": True} if lean else {}),
    )


def _bare_run(client, prof, cpuset, lean: bool = False) -> None:
    client.containers.run(SANDBOX_IMAGE, ["true"], remove=True, **_bare_kwargs(prof, cpuset, lean))


def _keeper_floor(client, prof, cpuset) -> None:
    """The least a measured sandbox costs: a sleeping init kept alive (so its cgroup can be read
    after the workload ends), the workload as one exec, a forced removal of the running
    container -- raw docker-py, nothing read, nothing recorded."""
    c = client.containers.run(SANDBOX_IMAGE, ["sleep", "infinity"], detach=True, init=True, **_bare_kwargs(prof, cpuset, True))
    try:
        ex = client.api.exec_create(c.id, ["true"])
        client.api.exec_start(ex["Id"])
    finally:
        c.remove(force=True)


def bench_overhead(client, rounds: int) -> dict:
    with CpuPool.for_host().leased(1) as cpuset:
        return _overhead(client, load_profile("standard"), cpuset, rounds)


def _overhead(client, prof, cpuset, rounds: int) -> dict:
    """harness run_command of a no-op vs raw docker-py paths of the same image and envelope,
    interleaved (the order rotates each round): containers.run with network_mode none (what
    most callers write), the same with no network asked for at all (the cheapest bare run: the
    baseline of the goal), and the keeper design's floor (sleeping init + one exec + forced
    removal). The harness runs a lone command started with its container (the launcher, no
    exec); the same harness through exec, as an attempt's phases run, is measured beside it."""
    backend = DockerBackend(client)

    def harness() -> None:
        r = run_command(backend, SANDBOX_IMAGE, prof, cpuset, ["true"])
        assert r.kind == "ok", r.error

    def harness_exec() -> None:
        docker_sandbox.ONESHOT = False
        try:
            harness()
        finally:
            docker_sandbox.ONESHOT = True

    paths = {
        "bare": lambda: _bare_run(client, prof, cpuset),
        "bare_lean": lambda: _bare_run(client, prof, cpuset, lean=True),
        "keeper_floor": lambda: _keeper_floor(client, prof, cpuset),
        "harness": harness,
        "harness_exec": harness_exec,
    }
    for f in paths.values():  # warm every path once (image layers in page cache, SDK connection pool)
        f()
    t: dict[str, list[float]] = {k: [] for k in paths}
    names = list(paths)
    for i in range(rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            t0 = time.perf_counter()
            paths[name]()
            t[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in t.items()}
    per_round = lambda a, b: _spread([x / y for x, y in zip(t[a], t[b])], "{:.3f}")  # noqa: E731
    return {
        "name": "per-attempt overhead, no-op command",
        "harness_s": _spread(t["harness"]) + "  (harness sandbox exec's path: the command starts with its container, no exec)",
        "baseline_s": _spread(t["bare_lean"]) + "  (containers.run, no network asked for: loopback only, as the harness asks)",
        "ratio": round(med["harness"] / med["bare_lean"], 3),
        "per-round ratio": per_round("harness", "bare_lean") + "  (goal <= 1.10)",
        "harness_through_exec_s": _spread(t["harness_exec"]) + "  (the same through an exec into a sleeping keeper, as an attempt's phases run)",
        "exec_ratio": per_round("harness_exec", "bare_lean"),
        "keeper_floor_s": _spread(t["keeper_floor"]) + "  (sleeping init + exec of the no-op + forced removal, raw docker-py)",
        "floor_ratio": per_round("keeper_floor", "bare_lean") + "  (the exec design's own price over the bare run)",
        "exec_over_floor": per_round("harness_exec", "keeper_floor") + "  (what the harness's code adds on that design: limits and counters read, monitor, record)",
        "bare_network_none_s": _spread(t["bare"]) + "  (containers.run with network_mode none, as most callers write it)",
        "ratio_vs_network_none": round(med["harness"] / med["bare"], 3),
        "rounds": rounds,
    }


def bench_sampling(client, seconds: float = 5.0, hz: float = 5.0, repeats: int = 5) -> dict:
    """The sampling cost, repeated: the figure moves between runs, so its median and spread."""
    with CpuPool.for_host().leased(1) as cpuset:
        runs = [_sampling(client, load_profile("standard"), cpuset, seconds, hz) for _ in range(repeats)]
    out = dict(sorted(runs, key=lambda r: r["share_of_one_core_pct"])[len(runs) // 2])  # the median run
    shares = [r["share_of_one_core_pct"] for r in runs]
    out["share_of_one_core_pct"] = _spread(shares, "{:.3f}") + "  (goal <= 0.5)"
    out["per_sample_us"] = _spread([r["per_sample_us"] for r in runs], "{:.0f}")
    out.pop("controller_cpu_per_attempt_second", None)
    return out


def _sampling(client, prof, cpuset, seconds: float, hz: float) -> dict:
    from harness.measure import host as hoststats

    with DockerSandbox(client, SandboxSpec(image=SANDBOX_IMAGE, profile=prof, cpuset=cpuset)) as sb:
        cg0 = sb.snapshot()
        host0 = hoststats.read_host_snapshot(time.monotonic())
        # baseline: the same process idling for the same time without a monitor
        c0 = time.process_time()
        time.sleep(seconds)
        idle_cpu = time.process_time() - c0
        mon = Monitor(sb._reader, cpuset, hz)  # as measured_exec samples
        c0 = time.process_time()
        mon.start(time.monotonic(), host0, cg0)
        time.sleep(seconds)
        mon.stop()
        n = len(mon.samples)  # the log's models are built when it is read: part of the cost
        mon_cpu = time.process_time() - c0
    per_sample_us = (mon_cpu - idle_cpu) / max(1, n) * 1e6
    share = (mon_cpu - idle_cpu) / seconds
    return {
        "name": f"sampling cost at {hz:g} Hz",
        "samples": n,
        "controller_cpu_per_attempt_second": round(share, 5),
        "share_of_one_core_pct": round(100 * share, 3),
        "per_sample_us": round(per_sample_us, 1),
        "baseline": "same process idling without a monitor, same duration",
    }


def bench_controller_scale(client, levels: tuple[int, ...] = (8, 32, 64, 128), seconds: float = 6.0, hz: float = 5.0) -> dict:
    """Scale model of the controller: its CPU and memory with N concurrent attempts' monitors.

    Bench-only core sharing (no ``run`` option offers it: a real attempt leases exclusive
    cores): N sleeping sandboxes all on the same cores, each watched by its own monitor at
    ``hz`` exactly as ``measured_exec`` watches an agent. The controller's CPU over the window
    (this process, ``process_time``), less the same window idle, divided by N is the CPU per
    concurrent attempt; one core / that share is the concurrency that saturates one controller
    core. RSS is read before and after the monitors start."""
    import psutil

    from harness.measure import host as hoststats

    prof = load_profile("standard")
    pool = CpuPool.for_host()
    shared = list(pool.cpus[len(pool.reserved):] or pool.cpus)
    me = psutil.Process()
    rows = []
    sandboxes: list = []
    try:
        for n in levels:
            while len(sandboxes) < n:
                sb = DockerSandbox(client, SandboxSpec(image=SANDBOX_IMAGE, profile=prof, cpuset=shared,
                                                       labels={"dev.harness.bench": "scale"}))
                sb.start()
                sandboxes.append(sb)
            c0 = time.process_time()
            time.sleep(seconds)
            idle = time.process_time() - c0
            rss0 = me.memory_info().rss
            mons = []
            try:
                for sb in sandboxes:  # started before the window: what is measured is sampling alone
                    m = Monitor(sb._reader, shared, hz)
                    m.start(time.monotonic(), hoststats.read_host_snapshot(time.monotonic()), sb.snapshot())
                    mons.append(m)
                base = sum(len(m.samples) for m in mons)
                c0 = time.process_time()
                time.sleep(seconds)
                now = sum(len(m.samples) for m in mons)  # the models of the window's samples are built here: counted
                busy = time.process_time() - c0 - idle
                rss1 = me.memory_info().rss
            finally:
                for m in mons:
                    m.stop()
            samples = now - base
            rows.append({"n": n, "cpu_share": busy / seconds, "per_attempt": busy / seconds / n, "samples": samples,
                         "expected": int(n * seconds * hz), "rss_mib_per_attempt": (rss1 - rss0) / 2**20 / n})
    finally:
        for sb in sandboxes:
            sb.remove()
    per = [r["per_attempt"] for r in rows]
    med = statistics.median(per)
    return {
        "name": f"controller scale model: N concurrent attempts' monitors at {hz:g} Hz (bench-only shared cores, {seconds:g} s windows)",
        "controller CPU, share of one core": "; ".join(f"N={r['n']}: {100 * r['cpu_share']:.1f}% "
                                                         f"({r['samples']}/{r['expected']} samples)" for r in rows),
        "CPU per concurrent attempt (% of a core)": _spread([100 * x for x in per], "{:.3f}"),
        "memory per concurrent attempt (MiB RSS)": "; ".join(f"N={r['n']}: {r['rss_mib_per_attempt']:.2f}" for r in rows),
        "attempts that saturate one controller core": f"{1 / med:.0f} (goal >= 256)" if med > 0 else "-",
        "baseline": "the same process idling for the same window, same sandboxes up",
    }


NOOP_AGENT = "import os, sqlite3; sqlite3.connect(os.environ['HARNESS_STATE']).execute('select count(*) from log').fetchone()"


def _noop_suite(root: Path) -> Path:
    d = root / "noop"
    (d / "tasks").mkdir(parents=True)
    (d / "Dockerfile").write_text("ARG BASE=harness/sandbox:latest\nFROM ${BASE}\n")
    (d / "schema.sql").write_text("CREATE TABLE log (id INTEGER PRIMARY KEY, note TEXT);\n")
    (d / "suite.toml").write_text(
        'name = "noop"\nimage = "harness/sandbox:latest"\n'
        f"agent_cmd = [\"python3\", \"-c\", {json.dumps(NOOP_AGENT)}]\n"
        'trials = 1\nk = [1]\nmax_reruns = 5\nstate_sql = ["schema.sql"]\n'
    )
    (d / "tasks" / "noop.toml").write_text(
        'id = "noop"\ntitle = "no-op"\nprompt = "nothing"\nunchanged = ["log"]\n'
        '[[expect]]\nname = "log"\nquery = "SELECT count(*) FROM log"\nrows = [[0]]\n'
    )
    return d


COMPOSE = """services:
  agent:
    image: harness/sandbox:latest
    command: ["sleep", "infinity"]
    init: true
    read_only: true
    network_mode: none
    cpus: 1.0
    cpuset: "{cpuset}"
    mem_limit: 512m
    memswap_limit: 512m
    pids_limit: 256
    cap_drop: [ALL]
    security_opt: [no-new-privileges]
    tmpfs: ["/work:uid=10001,gid=10001", "/tmp"]
    labels: {{dev.harness.bench: compose}}
"""


def bench_throughput(client, trials: int, repeats: int = 3) -> dict:
    """Attempts/s: harness run (whole pipeline) vs a docker-compose up/exec/down loop, the two
    interleaved ``repeats`` times (each repeat: the run, the run at twice the trials, the loop)."""
    import subprocess
    import tempfile

    compose = shutil.which("docker-compose")
    # not leased: the harness run below leases the trial core itself (a lease here would make
    # it wait for us); the compose loop runs after it on the same core
    pool = CpuPool.for_host()
    cpuset = pool.cpus[len(pool.reserved):][:1]
    with tempfile.TemporaryDirectory(prefix="harness-bench-") as tmp:
        root = Path(tmp)
        suite = _noop_suite(root)
        env = {**os.environ, "HARNESS_HOME": str(root / "home")}

        def harness_run(n: int) -> tuple[float, int]:
            t0 = time.perf_counter()
            r = subprocess.run(
                [sys.executable, "-m", "harness", "run", "--suite", str(suite), "--trials", str(n), "--db", f"sqlite:///{root}/b.db", "--json"],
                capture_output=True, text=True, env=env, cwd=root,
            )
            wall = time.perf_counter() - t0
            if r.returncode != 0:
                raise RuntimeError(r.stderr[-500:])
            return wall, json.loads(r.stdout)["attempts"]["total"]

        setup = "import sqlite3; sqlite3.connect('/work/state.db').executescript('CREATE TABLE log (id INTEGER PRIMARY KEY, note TEXT);')"
        if compose is not None:
            (root / "c").mkdir()
            (root / "c" / "docker-compose.yml").write_text(COMPOSE.format(cpuset=",".join(map(str, cpuset))))

        def compose_loop(rep: int) -> float:
            t0 = time.perf_counter()
            for i in range(trials):
                base = [compose, "-p", f"hb{os.getpid()}r{rep}t{i}", "-f", str(root / "c" / "docker-compose.yml")]
                subprocess.run([*base, "up", "-d"], check=True, capture_output=True)
                subprocess.run([*base, "exec", "-T", "agent", "python3", "-c", setup], check=True, capture_output=True)
                subprocess.run([*base, "exec", "-T", "-e", "HARNESS_STATE=/work/state.db", "agent", "python3", "-c", NOOP_AGENT],
                               check=True, capture_output=True)
                subprocess.run([*base, "exec", "-T", "agent", "cat", "/work/state.db"], check=True, capture_output=True)
                subprocess.run([*base, "down", "-t", "0"], check=True, capture_output=True)
            return time.perf_counter() - t0

        h_rate, steady, c_rate, ratio, steady_ratio = [], [], [], [], []
        for rep in range(repeats):
            h_wall, attempts = harness_run(trials)
            # the same run at twice the trials: the slope leaves out what a run pays once (start-up,
            # planning, the agent-command check in a fresh home), which the compose loop never pays
            h2_wall, attempts2 = harness_run(2 * trials)
            h_rate.append(attempts / h_wall)
            steady.append((attempts2 - attempts) / max(1e-9, h2_wall - h_wall))
            if compose is not None:
                c_rate.append(trials / compose_loop(rep))
                ratio.append(h_rate[-1] / c_rate[-1])
                steady_ratio.append(steady[-1] / c_rate[-1])
        out = {
            "name": f"run throughput, {trials} no-op trials (setup + agent + export + grade + store), {repeats} repeats",
            "harness_attempts_per_s": _spread(h_rate, "{:.3f}") + "  (whole runs: start-up included)",
            "harness_steady_attempts_per_s": _spread(steady, "{:.3f}") + f"  (slope of {trials} -> {2 * trials} trials: start-up left out)",
        }
        if compose is None:
            out["baseline"] = "docker-compose not installed (apt-get install docker-compose); no ratio"
            return out
        out.update(
            compose_attempts_per_s=_spread(c_rate, "{:.3f}"),
            baseline="docker-compose up -d / exec setup / exec agent / exec cat state / down, per trial, same image and limits",
            ratio=round(statistics.median(ratio), 2),
            **{"per-repeat ratio": _spread(ratio, "{:.2f}") + "  (goal >= 6)",
               "steady_ratio": _spread(steady_ratio, "{:.2f}")},
        )
        return out


def bench_report_query(n_attempts: int = 1_000_000, run_attempts: int = 200) -> dict:
    """Summarise one run inside a store of ``n_attempts`` attempts vs a raw sqlite3 query."""
    import sqlite3
    import tempfile

    from harness.core.aggregate import summarize
    from harness.store.orm import RunRow
    from harness.store.store import Store

    with tempfile.TemporaryDirectory(prefix="harness-bench-db-") as tmp:
        path = Path(tmp) / "big.db"
        store = Store.open(f"sqlite:///{path}")
        runs = n_attempts // run_attempts
        with store.session() as s:
            for i in range(runs):
                s.add(RunRow(id=f"run{i:06d}", suite="bench", suite_hash="x", image="i", profile="p", harness_version="0",
                             trials=8, ks=[1, 2, 4, 8], max_reruns=3, task_ids=[f"t{j}" for j in range(run_attempts // 8)]))
            s.commit()
        con = sqlite3.connect(path)
        rng = random.Random(0)
        rows = []
        for i in range(runs):
            for j in range(run_attempts):
                outcome = "pass" if rng.random() < 0.6 else "fail"
                rows.append((f"run{i:06d}", f"t{j // 8}", j % 8, 1, j, "clean", outcome))
            if len(rows) >= 200_000:
                _insert(con, rows)
                rows = []
        _insert(con, rows)
        con.commit()
        target = f"run{runs // 2:06d}"
        t0 = time.perf_counter()
        s = summarize(store.get_run(target), store.attempts(target))
        h = time.perf_counter() - t0
        assert s["attempts"]["total"] == run_attempts
        t0 = time.perf_counter()
        con.execute("select task_id, slot, attempt_no, verdict, outcome, failure_kind, reasons from attempts where run_id = ?", (target,)).fetchall()
        b = time.perf_counter() - t0
        con.close()
    return {
        "name": f"report of one {run_attempts}-attempt run in a store of {n_attempts:,} attempts (SQLite)",
        "harness_summary_s": round(h, 4),
        "baseline_s": round(b, 5),
        "baseline": "raw sqlite3 SELECT of the same run's attempt rows (indexed by run_id)",
        "ratio": round(h / b, 1),
    }


_JSON_COLS = ("reasons", "rules", "grade_checks", "state_diff", "envelope", "envelope_applied", "counters", "host_counters", "grade_envelope",
              "rewards", "envelope_notes", "requested_envelope", "services")
_EMPTY = ("[]", "[]", "[]", "{}", "{}", "{}", "{}", "{}", "{}", "{}", "[]", "{}", "{}")


def _insert(con, rows) -> None:
    """Bulk-insert minimal attempt rows (the columns the summary reads, defaults for the rest:
    every other NOT NULL column of today's table gets an empty value of its kind)."""
    from harness.model.attempt import AttemptRecord

    cols = ["run_id", "task_id", "slot", "attempt_no", "seed", "verdict", "outcome", *_JSON_COLS,
            "cpuset", "image", "container", "artifacts", "concurrent", "terminated_cleanly", "timed_out", "wall_s"]
    fill = [*_EMPTY, "", "", "", "", 1, 1, 0, 0.0]
    for _, name, _type, notnull, default, _pk in con.execute("pragma table_info(attempts)").fetchall():
        if notnull and default is None and name not in cols and name not in ("id", "started_at", "finished_at"):
            f = AttemptRecord.model_fields.get(name)
            v = f.get_default(call_default_factory=True) if f is not None and not f.is_required() else ""
            cols.append(name)
            fill.append(json.dumps(v) if isinstance(v, (list, dict)) else v)
    marks = ",".join("?" * len(cols))
    con.executemany(
        f"insert into attempts ({', '.join(cols)}, started_at, finished_at) values ({marks}, datetime('now'), datetime('now'))",
        [(*r, *fill) for r in rows],
    )


def settle(busy_below: float = 10.0, max_s: float = 30.0, step_s: float = 0.5) -> float:
    """Wait (at most ``max_s``) until the host's CPUs are nearly idle -- what an earlier bench
    left running (the engine removing containers, a build's cleanup) no longer runs beside
    the next one -- and return the busy share (%) last seen, printed beside a bench whose
    goal is an absolute time."""
    import psutil

    end = time.monotonic() + max_s
    busy = psutil.cpu_percent(interval=step_s)
    while busy >= busy_below and time.monotonic() < end:
        busy = psutil.cpu_percent(interval=step_s)
    return busy


def _spread(xs: list[float], fmt: str = "{:.4f}") -> str:
    return f"median {fmt.format(statistics.median(xs))} (min {fmt.format(min(xs))}, max {fmt.format(max(xs))}, n={len(xs)})"


def bench_estimator(tasks: int = 100_000, trials: int = 100, repeats: int = 5) -> dict:
    """Suite pass@1 / pass@k / pass^k at k = 1, 4, 8 from a tasks x trials outcome matrix (the
    vectorized path: counts, then each distinct (n, c) once) vs a plain Python sum over the
    same outcomes as lists; both repeated, medians and spread."""
    import numpy as np

    from harness.core.estimator import TaskOutcomes, suite_metrics, suite_metrics_counts

    rng = np.random.default_rng(0)
    outcomes = rng.random((tasks, trials)) < rng.random(tasks)[:, None]
    ids = [f"t{i}" for i in range(tasks)]
    lists = outcomes.tolist()
    est, base, via_records = [], [], []
    records = [TaskOutcomes(task_id=t, trials=row) for t, row in zip(ids, lists)]
    busy = settle()
    for _ in range(repeats):
        t0 = time.perf_counter()
        suite_metrics(records, [1, 4, 8])
        via_records.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        suite_metrics_counts(ids, np.full(tasks, trials), outcomes.sum(axis=1), [1, 4, 8])
        est.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        s = 0
        for row in lists:
            s += sum(row)
        base.append(time.perf_counter() - t0)
    return {
        "name": f"estimator, {tasks} tasks x {trials} trials, k in 1,4,8 (goal <= 0.1 s)",
        "estimator_s": _spread(est) + "  (suite_metrics_counts: the outcome matrix summed, then the figures)",
        "from TaskOutcomes records_s": _spread(via_records) + "  (suite_metrics, what a report calls: counting the lists is most of it)",
        "baseline_s": _spread(base),
        "baseline": "a plain Python sum over the same outcomes",
        "ratio": round(statistics.median(est) / statistics.median(base), 3),
        "host_busy_before": f"{busy:.0f}%  (all CPUs, after waiting up to 30 s for what earlier benches left to end)",
    }


def bench_report_scale(tasks: int = 12_500, trials: int = 8, repeats: int = 5) -> dict:
    """`harness report RUN --format json` of one run of tasks x trials attempts (10^5), in a
    SQLite store the bench makes: a real no-op run's attempt row, replicated by SQL with
    per-row outcomes and CPU counters, vs a raw sqlite3 SELECT * of the same rows."""
    import sqlite3
    import subprocess
    import tempfile

    from harness.store.store import REPORT_FIELDS

    with tempfile.TemporaryDirectory(prefix="harness-bench-report-") as tmp:
        root = Path(tmp)
        db = root / "r.db"
        env = {**os.environ, "HARNESS_HOME": str(root / "home")}
        r = subprocess.run([sys.executable, "-m", "harness", "run", "--suite", str(_noop_suite(root)), "--trials", "1",
                            "--db", f"sqlite:///{db}", "--json"], capture_output=True, text=True, env=env, cwd=root)
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-500:])
        run_id = json.loads(r.stdout)["run_id"]
        con = sqlite3.connect(db)
        cols = [c[1] for c in con.execute("pragma table_info(attempts)") if c[1] != "id"]
        tmpl = con.execute("select min(id) from attempts where verdict = 'clean'").fetchone()[0]
        last = con.execute("select max(id) from attempts").fetchone()[0]
        pick = "(g.i * 2654435761) % 100"
        expr = {"task_id": f"'t' || (g.i / {trials})", "slot": f"g.i % {trials}",
                "outcome": f"case when {pick} < 60 then 'pass' else 'fail' end",
                "failure_kind": f"case when {pick} < 60 then null else 'wrong_state' end",
                "grade_reason": f"case when {pick} < 60 then null else 'log: expected [[0]], got [[1]]' end",
                "cpu_usage_us": "a.cpu_usage_us + g.i", "wall_s": "a.wall_s + g.i * 1e-6",
                "counters": "json_set(a.counters, '$.cpu_usage_us', a.cpu_usage_us + g.i)",
                "rules": "json_set(a.rules, '$[0].value', g.i * 1e-6)"}
        con.execute(f"insert into attempts ({', '.join(cols)}) with recursive g(i) as (select 0 union all select i + 1 from g "
                    f"where i + 1 < {tasks * trials}) select {', '.join(expr.get(c, 'a.' + c) for c in cols)} "
                    f"from g, attempts a where a.id = {tmpl}")
        con.execute("delete from attempts where run_id = ? and id <= ?", (run_id, last))  # the no-op run's own
        con.execute("update runs set task_ids = ?, trials = ?, ks = ? where id = ?",
                    (json.dumps([f"t{i}" for i in range(tasks)]), trials, json.dumps([1, 2, 4, 8]), run_id))
        con.commit()
        n = con.execute("select count(*) from attempts where run_id = ?", (run_id,)).fetchone()[0]
        code = ("import json, sys, time; t0 = time.perf_counter(); from harness.cli import main; sys.argv = ['harness', 'report', "
                f"{run_id!r}, '--format', 'json', '--db', {f'sqlite:///{db}'!r}, '--out', {str(root / 'r.json')!r}]\n"
                "try:\n    main()\nexcept SystemExit as e:\n    code = e.code or 0\nelse:\n    code = 0\n"
                "print(time.perf_counter() - t0, file=sys.stderr)\nsys.exit(code)")
        # the same report in its phases (what `harness report` calls, one after the other), and
        # the columns it reads fetched by raw sqlite3: where the time goes, and what no reader
        # of these rows in Python avoids
        phases = ("import time; T = time.perf_counter; t0 = T()\nimport harness.cli.commands\n"
                  "from harness.cli.report import _lean_sqlite\nfrom harness.report.build import build_report\n"
                  "from harness.model.units import collector_paused\nt1 = T()\n"
                  f"run, attempts, late = _lean_sqlite({f'sqlite:///{db}'!r}, {run_id!r}); t2 = T()\n"
                  "with collector_paused(freeze=True):\n    rep = build_report(run, attempts, late=late)\nt3 = T()\n"
                  "type(rep).__pydantic_serializer__.to_json(rep, by_alias=True, indent=2); t4 = T()\n"
                  "print(t1 - t0, t2 - t1, t3 - t2, t4 - t3)")
        # its load through the store instead (SQLAlchemy, imported on the way: what the report
        # read without it saves; the store answers whenever that read cannot)
        via_store = ("import time; T = time.perf_counter\nimport harness.cli.commands\n"
                     "from harness.cli.report import _load, _store\nfrom harness.model.units import collector_paused\nt1 = T()\n"
                     f"store = _store({f'sqlite:///{db}'!r}); run, attempts = _load(store, {run_id!r}, lean=True)\n"
                     "late = len(store.late_attempts(run.id)); print(T() - t1)")
        # its two queries: the columns of the report index, and the rules of discarded attempts
        cols = ", ".join(("id", *(f for f in REPORT_FIELDS if f != "rules")))
        h, b, ph, fetch, store_load = [], [], [], [], []
        busy = settle()  # the engine's removal of the run's containers, page cache writeback
        for _ in range(repeats):
            (root / "r.json").unlink(missing_ok=True)
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root)
            if p.returncode != 0 or not (root / "r.json").exists():
                raise RuntimeError(p.stderr[-500:])
            h.append(float(p.stderr.strip().splitlines()[-1]))
            p = subprocess.run([sys.executable, "-c", phases], capture_output=True, text=True, env=env, cwd=root)
            if p.returncode != 0:
                raise RuntimeError(p.stderr[-500:])
            ph.append([float(x) for x in p.stdout.split()])
            p = subprocess.run([sys.executable, "-c", via_store], capture_output=True, text=True, env=env, cwd=root)
            if p.returncode != 0:
                raise RuntimeError(p.stderr[-500:])
            store_load.append(float(p.stdout.strip()))
            t0 = time.perf_counter()
            con.execute("select * from attempts where run_id = ?", (run_id,)).fetchall()
            b.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            con.execute(f"select {cols} from attempts where run_id = ? order by id", (run_id,)).fetchall()
            con.execute("select id, rules from attempts where run_id = ? and verdict != 'clean'", (run_id,)).fetchall()
            fetch.append(time.perf_counter() - t0)
        con.close()
    names = ("imports", "load", "build", "json")
    med = [statistics.median(x[i] for x in ph) for i in range(4)]
    return {
        "name": f"report of one run of {n:,} attempts ({tasks} tasks x {trials} trials), SQLite (goal <= 1 s)",
        "harness_report_json_s": _spread(h, "{:.2f}") + "  (in-process: imports, store, load, build, json)",
        "phases_s": ", ".join(f"{nm} {_spread([x[i] for x in ph], '{:.2f}')}" for i, nm in enumerate(names)),
        "phase_shares": ", ".join(f"{nm} {m / sum(med):.0%}" for nm, m in zip(names, med)),
        "raw_fetch_of_its_columns_s": _spread(fetch, "{:.2f}") + "  (raw sqlite3, the load's two queries: the floor of its load)",
        "load_through_the_store_s": _spread(store_load, "{:.2f}") + "  (SQLAlchemy, imported on the way: what a report on PostgreSQL "
                                                                   "or an older SQLite schema pays)",
        "baseline_s": _spread(b, "{:.2f}"),
        "baseline": "raw sqlite3 SELECT * of the same run's attempt rows",
        "ratio": round(statistics.median(h) / statistics.median(b), 2),
        "host_busy_before": f"{busy:.0f}%  (all CPUs, after waiting up to 30 s for what earlier benches left to end)",
    }


def _kind_suites(root: Path) -> dict[str, tuple[Path, list[str]]]:
    """One no-op task per state kind / grader: suite directory and extra `run` arguments."""
    files = root / "files"
    (files / "tasks").mkdir(parents=True)
    (files / "fx" / "data").mkdir(parents=True)
    (files / "fx" / "config.json").write_text('{"port": 80}\n')
    (files / "fx" / "data" / "keep.txt").write_text("keep\n")
    (files / "suite.toml").write_text('name = "bench-files"\nimage = "harness/sandbox:latest"\ndockerfile = ""\nstate = "files"\n'
                                      'agent_cmd = ["python3", "-c", "pass"]\ntrials = 1\nk = [1]\nmax_reruns = 5\n')
    (files / "tasks" / "noop.toml").write_text('id = "noop"\ntitle = "no-op"\nprompt = "nothing"\nunchanged = ["/work/app/**"]\n'
                                               '[state]\npath = "/work/app"\nfixture = "fx"\n'
                                               '[[expect]]\npath = "/work/app/config.json"\njson = "port"\nequals = 80\n')
    pg = root / "pg"
    (pg / "tasks").mkdir(parents=True)
    (pg / "schema.sql").write_text("CREATE TABLE log (id int PRIMARY KEY, note text);\n")
    (pg / "suite.toml").write_text('name = "bench-pg"\nimage = "harness/postgres:15"\ndockerfile = ""\nstate = "postgres"\n'
                                   'agent_cmd = ["python3", "-c", "pass"]\ntrials = 1\nk = [1]\nmax_reruns = 5\nstate_sql = ["schema.sql"]\n')
    (pg / "tasks" / "noop.toml").write_text('id = "noop"\ntitle = "no-op"\nprompt = "nothing"\nunchanged = ["log"]\n'
                                            '[[expect]]\nname = "log"\nquery = "SELECT count(*) FROM log"\nrows = [[0]]\n')
    harbor = root / "harbor" / "noop"
    for sub in ("environment", "tests"):
        (harbor / sub).mkdir(parents=True)
    (harbor / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 30.0\n[agent]\ntimeout_sec = 30.0\n'
                                      '[environment]\ncpus = 1\nmemory_mb = 512\nallow_internet = false\n')
    (harbor / "instruction.md").write_text("nothing\n")
    (harbor / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
    (harbor / "tests" / "test.sh").write_text("#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n")
    sep = root / "harbor-sep" / "noop-sep"
    shutil.copytree(harbor, sep)
    (sep / "task.toml").write_text((harbor / "task.toml").read_text().replace("[verifier]\n", '[verifier]\nenvironment_mode = "separate"\n'))
    return {"sqlite (baseline)": (_noop_suite(root), []), "files": (files, []), "postgres (a service per attempt)": (pg, []),
            "verifier, shared (Harbor task)": (root / "harbor", ["--agent", "nop"]),
            "verifier, separate container": (root / "harbor-sep", ["--agent", "nop"])}


def bench_state_kinds(rounds: int = 3, trials: int = 5) -> dict:
    """Per-attempt wall time of a no-op agent under each state kind / grader, interleaved."""
    import subprocess
    import tempfile

    from harness.store.store import Store

    with tempfile.TemporaryDirectory(prefix="harness-bench-kinds-") as tmp:
        root = Path(tmp)
        suites = _kind_suites(root)
        env = {**os.environ, "HARNESS_HOME": str(root / "home")}
        per: dict[str, list[float]] = {name: [] for name in suites}
        for rnd in range(rounds + 1):  # round 0 builds images and warms caches: not counted
            for name, (suite, extra) in suites.items():
                db = f"sqlite:///{root}/k.db"
                r = subprocess.run([sys.executable, "-m", "harness", "run", "--suite", str(suite), "--trials", str(trials), "--db", db,
                                    "--json", *extra], capture_output=True, text=True, env=env, cwd=root)
                if r.returncode not in (0, 1):
                    raise RuntimeError(f"{name}: {r.stderr[-500:]}")
                if rnd == 0:
                    continue
                run_id = json.loads(r.stdout)["run_id"]
                # the attempt's own time: a lane's wait for the attempt before it is that one's cost
                walls = [a.wall_s - sum(float(p.get("wall_s") or 0.0) for p in a.phases if p.get("name") == "lane")
                         for a in Store.open(db, mode="ro").attempts(run_id) if a.verdict == "clean"]
                per[name].append(statistics.median(walls))
    base = statistics.median(per["sqlite (baseline)"])
    out: dict = {"name": f"attempt wall time per state kind, no-op agent ({rounds} interleaved rounds x {trials} trials; "
                         "per-round medians; lane waits left out)"}
    for name, meds in per.items():
        m = statistics.median(meds)
        out[name] = f"{m:.3f} s  ratio {m / base:.2f}x  (rounds {min(meds):.3f}-{max(meds):.3f} s)"
    return out


def bench_task_builds(suite: str = "ops") -> dict:
    """A Harbor suite's per-task images: built from scratch (bases present) vs the cached check
    every run does."""
    from harness.engine.suites import load_suite
    from harness.engine.taskimages import build_task_images

    from harness.sandbox.images import remove_image

    client = connect()
    s = load_suite(suite)
    for t in s.tasks:  # from scratch: the images removed, and every step built again (no layer cache)
        remove_image(client, t.image or "")
    t0 = time.perf_counter()
    out = build_task_images(client, s, list(s.tasks), force=True, nocache=True)
    forced = time.perf_counter() - t0
    t0 = time.perf_counter()
    build_task_images(client, s, list(s.tasks))
    cached = time.perf_counter() - t0
    slow = max(out.built, key=lambda b: b[1]) if out.built else None
    return {
        "name": f"per-task image builds of the {suite} suite ({len(s.tasks)} tasks, offline, bases mapped, pip/apt inside, no layer cache)",
        "from_scratch_s": round(forced, 2),
        "cached_check_s": round(cached, 3),
        "slowest_task": f"{slow[0]} {slow[1]:.1f} s" if slow else "-",
        "baseline": "the same call when every image is up to date (what each run pays)",
        "ratio": round(forced / cached, 1) if cached else None,
    }


_CALLER = r"""
import json, os, statistics, sys, time, urllib.request
n = int(sys.argv[1]); body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "hi"}]}).encode()
def call(url, tok):
    t = time.perf_counter()
    req = urllib.request.Request(url, data=body, headers={"Authorization": "Bearer " + tok, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
    return time.perf_counter() - t
via, direct = [], []
for i in range(n):  # interleaved, so drift hits both equally
    via.append(call(os.environ["VIA"], os.environ["TOK"]))
    direct.append(call(os.environ["DIRECT"], "x"))
print(json.dumps({"via": via, "direct": direct}))
"""


def _bench_upstream():
    """A local HTTP server answering like a provider (fixed body with usage): the bench's upstream."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = json.dumps({"id": "bench", "choices": [{"message": {"role": "assistant", "content": "ok"}}],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 1}}).encode()

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("0.0.0.0", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def bench_gateway(client, calls: int = 300, rounds: int = 15) -> dict:
    from harness.sandbox.gateway import API_PORT, GATEWAY_NAME, Gateway, new_token

    srv = _bench_upstream()
    port = srv.server_address[1]
    pool = CpuPool.for_host()
    run_id = f"rbench-gw-{os.getpid()}"
    gw = Gateway(client, run_id, list(pool.reserved) or list(pool.cpus), {"concurrency": 64},
                 {"openai": (f"http://host.docker.internal:{port}/v1", "bench-key")})
    backend = DockerBackend(client)
    per_attempt = []
    try:
        gw.start()
        net = backend.network({"dev.harness.run": run_id})
        try:
            for _ in range(rounds):  # what an attempt pays for its gateway: attach, token, records back, detach
                t = time.perf_counter()
                ip = gw.attach(net.name)
                tok = new_token(run_id)
                gw.register(tok, "bench/0/1", "gateway", [], ip)
                gw.close(tok)
                gw.detach(net.name)
                per_attempt.append(time.perf_counter() - t)
            ip = gw.attach(net.name)
            tok = new_token(run_id)
            gw.register(tok, "bench/0/1", "gateway", [], ip)
            c = client.containers.create(SANDBOX_IMAGE, ["python3", "-c", _CALLER, str(calls)], network=net.name,
                                         labels={LABEL: "1", "dev.harness.run": run_id},
                                         environment={"VIA": f"http://{GATEWAY_NAME}:{API_PORT}/openai/v1/chat/completions",
                                                      "DIRECT": f"http://host.docker.internal:{port}/v1/chat/completions", "TOK": tok},
                                         extra_hosts={"host.docker.internal": "host-gateway"})
            client.networks.get("bridge").connect(c)
            c.start()
            c.wait(timeout=600)
            out = json.loads(c.logs(stdout=True, stderr=False).decode().strip().splitlines()[-1])
            c.remove(force=True)
            recorded = len(gw.close(tok)[0])
            gw.detach(net.name)
        finally:
            net.remove()
    finally:
        gw.stop()
        srv.shutdown()
    via, direct = out["via"], out["direct"]
    med_v, med_d = statistics.median(via), statistics.median(direct)
    return {
        "name": f"model gateway: a call through it vs the same call direct ({calls} each, interleaved)",
        "call via gateway median / p99 (ms)": f"{1000 * med_v:.2f} / {1000 * _pct(via, 0.99):.2f}",
        "call direct median / p99 (ms)": f"{1000 * med_d:.2f} / {1000 * _pct(direct, 0.99):.2f}",
        "added per call, median (ms)": round(1000 * (med_v - med_d), 2),
        "ratio (median)": round(med_v / med_d, 2) if med_d else None,
        "calls recorded by the gateway": recorded,
        f"per attempt, median of {rounds} (ms) [min-max]": f"{1000 * statistics.median(per_attempt):.0f} "
                                                          f"[{1000 * min(per_attempt):.0f}-{1000 * max(per_attempt):.0f}]",
    }


def _ray_memory() -> dict:
    """RSS and USS (MiB) of this machine's Ray processes (raylet, GCS, workers, agents)."""
    import psutil

    rss = uss = 0
    n = 0
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if p.pid == os.getpid() or not any(x in cmd for x in ("raylet", "gcs_server", "ray::", "ray/_private", "ray/dashboard")):
                continue
            mi = p.memory_full_info()
            rss, uss, n = rss + mi.rss, uss + mi.uss, n + 1
        except (psutil.Error, OSError):
            continue
    return {"processes": n, "rss_mib": round(rss / 2**20, 1), "uss_mib": round(uss / 2**20, 1)}


def bench_ray(rounds: int = 3, small: int = 4, large: int = 16) -> dict:
    """Per-attempt cost of the Ray executor over the local one: for each executor, wall time
    of `harness run` with ``small`` and ``large`` no-op trials, one attempt at a time; the
    slope (large - small) / (large - small trials) is the time per attempt with the fixed
    costs (start-up, joining the cluster, node checks) cancelled. Rounds interleave the two."""
    import subprocess
    import tempfile

    from harness.engine import ray_executor as rx
    from harness.model.errors import RunError

    try:
        address = rx.connect(None, cores=1)  # a one-node cluster here, offering one harness core
    except RunError as e:
        return {"name": "Ray executor", "baseline": f"{e}; not measured"}
    try:
        time.sleep(5)
        idle = _ray_memory()
        per: dict[str, list[float]] = {"local": [], "ray": []}
        with tempfile.TemporaryDirectory(prefix="harness-bench-ray-") as tmp:
            root = Path(tmp)
            suite = _noop_suite(root)
            env = {**os.environ, "HARNESS_HOME": str(root / "home")}

            def wall(executor: str, n: int) -> float:
                extra = ["--executor", "ray", "--ray-address", address] if executor == "ray" else ["--concurrency", "1"]
                t0 = time.perf_counter()
                r = subprocess.run([sys.executable, "-m", "harness", "run", "--suite", str(suite), "--trials", str(n), "--json",
                                    "--db", f"sqlite:///{root}/b.db", *extra], capture_output=True, text=True, env=env, cwd=root)
                if r.returncode != 0:
                    raise RuntimeError(r.stderr[-500:])
                return time.perf_counter() - t0

            for i in range(rounds):
                order = ["local", "ray"] if i % 2 == 0 else ["ray", "local"]
                for ex in order:
                    per[ex].append((wall(ex, large) - wall(ex, small)) / (large - small))
        over = [(r - l) * 1000 for r, l in zip(per["ray"], per["local"])]
        med_l, med_r = statistics.median(per["local"]), statistics.median(per["ray"])
        return {
            "name": f"Ray executor, one-node cluster here ({rounds} interleaved rounds, slope of {small} -> {large} no-op trials)",
            "local_s_per_attempt": f"{med_l:.3f} (spread {min(per['local']):.3f}-{max(per['local']):.3f})",
            "ray_s_per_attempt": f"{med_r:.3f} (spread {min(per['ray']):.3f}-{max(per['ray']):.3f})",
            "ray_overhead_ms_per_attempt": f"{statistics.median(over):.0f} (spread {min(over):.0f}-{max(over):.0f}; goal <= 50)",
            "ratio": round(med_r / med_l, 3),
            "ray_idle_memory": f"{idle['rss_mib']} MiB RSS, {idle['uss_mib']} MiB USS over {idle['processes']} processes",
            "baseline": "the local executor (--concurrency 1), same suite, same machine, same run of the bench",
        }
    finally:
        rx.shutdown()


BEGIN, END = "<!-- bench table: written by make bench -->", "<!-- end of bench table -->"


def markdown_table(results: list[dict]) -> str:
    """One row per figure: what was measured, then every value the bench printed for it."""
    def cell(v: object) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| what | figures (harness, baseline, ratio; spread where repeated) |", "|---|---|"]
    for r in results:
        rest = "<br>".join(f"{cell(k)}: **{cell(v)}**" if "ratio" in k else f"{cell(k)}: {cell(v)}" for k, v in r.items() if k != "name")
        lines.append(f"| {cell(r.get('name', ''))} | {rest} |")
    return "\n".join(lines)


def write_readme_table(readme: Path, results: list[dict]) -> None:
    """Replace the text between the bench markers of ``readme`` with this run's table."""
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme}: no bench markers ({BEGIN} ... {END}); add them where the table goes")
    head, rest = text.split(BEGIN, 1)
    if END not in rest:
        raise SystemExit(f"{readme}: the end marker comes before the start marker")
    _, tail = rest.split(END, 1)
    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    readme.write_text(f"{head}{BEGIN}\n_Last `make bench`: {stamp}, {os.cpu_count()} CPUs._\n\n"
                      f"{markdown_table([dict(r) for r in results])}\n{END}{tail}")


def _bytecode_as_installed() -> None:
    """The harness commands a bench times load compiled bytecode, as an installed package
    does (pip compiles it at install): harness's modules are compiled now, and a
    PYTHONDONTWRITEBYTECODE the caller set is not passed on, or every command would compile
    them again (~0.05 s of each command's start-up)."""
    import compileall

    import harness

    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    compileall.compile_dir(str(Path(harness.__file__).parent), quiet=1)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="harness.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", "30")))
    ap.add_argument("--trials", type=int, default=int(os.environ.get("BENCH_TRIALS", "20")), help="no-op trials for the throughput comparison")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--readme", type=Path, default=None,
                    help="also rewrite the table between the bench markers of this README (make bench passes README.md)")
    args = ap.parse_args(argv)
    _bytecode_as_installed()
    client = connect()
    benches = [
        lambda: bench_overhead(client, args.rounds),
        lambda: bench_sampling(client),
        lambda: bench_controller_scale(client),
        lambda: bench_throughput(client, args.trials),
        lambda: bench_state_kinds(),
        lambda: bench_task_builds(),
        lambda: bench_estimator(),
        lambda: bench_report_scale(),
        lambda: bench_report_query(),
        lambda: bench_gateway(client),
        lambda: bench_ray(),
    ]
    results = []
    for bench in benches:  # each printed as it ends; one that fails says so and the rest still run
        try:
            r = bench()
        except Exception as ex:  # noqa: BLE001 - a bench's failure is a figure of its own
            r = {"name": f"FAILED: {bench.__code__.co_names[0] if bench.__code__.co_names else 'bench'}",
                 "error": f"{type(ex).__name__}: {str(ex)[:300]}"}
        results.append(r)
        if not args.json:
            print(f"== {r['name']}", flush=True)
            for k, v in r.items():
                if k != "name":
                    print(f"   {k:38} {v}", flush=True)
    if args.readme is not None:
        write_readme_table(args.readme, results)
    if args.json:
        print(json.dumps(results, indent=2))
    if any(r["name"].startswith("FAILED") for r in results):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
