"""Lanes (harness.engine.lanes) through the local executor: two attempts share a lane of
cores, and no agent window ever overlaps another attempt's sandbox start, in-container work
or removal on the same cores; the only in-container work two attempts do at once is a setup
that yielded its CPU weight beside the grading of the one before it, after that one's agent
window. Real threads and real waits; the attempts are scripted steps
with seeded random lengths (no engine: what is checked is the executor's ordering)."""

from __future__ import annotations

import random
import threading
import time

from harness.engine.executor import LocalExecutor, Work
from harness.engine.lanes import OPEN
from harness.engine.scheduler import CpuPool


def _scripted(log: list, lock: threading.Lock, rng: random.Random, key: str, fail_at: str | None = None, yielded: bool = True):
    lengths = {p: rng.uniform(0.001, 0.02) for p in ("start", "setup", "agent", "grade", "remove")}

    def step(cpuset: list[int], name: str) -> None:
        t0 = time.monotonic()
        time.sleep(lengths[name])
        with lock:
            log.append((tuple(cpuset), key, name, t0, time.monotonic()))

    def run(cpuset: list[int], gate):  # the order AttemptPipeline calls its gate in
        try:
            if fail_at == "start":
                return key, True, None
            step(cpuset, "start")
            gate.started()
            def yield_cpu() -> bool:
                with lock:
                    log.append((tuple(cpuset), key, "yield", time.monotonic(), time.monotonic()))
                return yielded

            if not gate.work(yield_cpu=yield_cpu):
                return key, True, None
            step(cpuset, "setup")
            if fail_at == "setup":
                return key, True, None
            with gate.agent() as ok:
                assert ok
                step(cpuset, "agent")
            step(cpuset, "grade")
            return key, True, None
        finally:
            gate.remove_begin()
            try:
                step(cpuset, "remove")
            finally:
                gate.remove_end()

    return Work(key=key, cores=1, run=run, gated=True)


def _run_all(cpus: list[int], concurrency: int, works: list[Work], depth: int = 2) -> list:
    ex = LocalExecutor(CpuPool(cpus=cpus, reserved=[], cross_process=False), concurrency, threading.Event(), depth=depth)
    for w in works:
        ex.submit(w)
    done = [ex.results(timeout=30) for _ in works]
    ex.close(timeout=5)
    assert all(d is not None and d.error is None and not d.not_started for d in done), done
    assert ex.pool.in_use() == 0, "a lane kept its cores"
    return done


def _check(log: list) -> tuple[int, int]:
    """No agent window overlaps another attempt's step on the same cores; of in-container
    steps (setup, agent, grade) on one lane, only a (yielded) setup overlaps another's
    grade, and then the grading one's agent window ended before that setup began. Returns
    how many pairs of attempts overlapped at all (the pipelining) and how many setups
    overlapped a grade."""
    overlapped, setup_grade = set(), set()
    for cores in {c for c, *_ in log}:
        mine = [e for e in log if e[0] == cores]
        agent_end = {k: e for _, k, n, _, e in mine if n == "agent"}
        for _, k1, n1, s1, e1 in mine:
            for _, k2, n2, s2, e2 in mine:
                if k1 == k2 or not (s1 < e2 and s2 < e1):
                    continue
                overlapped.add(frozenset((k1, k2)))
                assert n1 != "agent", f"{k1}'s agent window overlaps {k2}'s {n2}"
                work = ("setup", "agent", "grade")
                if n1 in work and n2 in work:
                    assert {n1, n2} == {"setup", "grade"}, f"{k1}'s {n1} overlaps {k2}'s {n2}"
                    if n1 == "setup":
                        assert agent_end[k2] <= s1, f"{k1}'s setup began before {k2}'s agent window ended"
                        setup_grade.add((k1, k2))
    return len(overlapped), len(setup_grade)


def test_two_attempts_share_a_lane_and_never_overlap_an_agent_window():
    log: list = []
    lock = threading.Lock()
    rng = random.Random(7)
    works = [_scripted(log, lock, rng, f"a{i}") for i in range(60)]
    _run_all([0, 1], 2, works)
    assert len({k for _, k, *_ in log}) == 60
    pairs, setup_grade = _check(log)
    assert pairs > 10, "attempts on one lane never overlapped: nothing was pipelined"
    assert setup_grade > 0, "no setup ever ran beside the grading of the attempt before it"


def test_a_setup_that_could_not_yield_its_cpu_waits_for_the_grading_before_it():
    """Where a sandbox cannot take the lowest CPU weight (its cgroup is not writable from
    here), its setup never runs beside the grading of the attempt before it."""
    log: list = []
    lock = threading.Lock()
    rng = random.Random(7)
    works = [_scripted(log, lock, rng, f"y{i}", yielded=i % 2 == 0) for i in range(40)]
    _run_all([0], 1, works)
    _, setup_grade = _check(log)
    assert setup_grade > 0
    for _, k, n, s, e in log:  # an odd attempt (not yielded) set up beside no grading
        if n == "setup" and int(k[1:]) % 2:
            assert not any(n2 == "grade" and s < e2 and s2 < e for _, k2, n2, s2, e2 in log if k2 != k), k


def test_attempts_that_end_early_leave_the_lane_usable():
    """An attempt whose sandbox never started, or whose setup failed, still lets the next
    one through (nothing waits forever on a member that gave up)."""
    log: list = []
    lock = threading.Lock()
    rng = random.Random(11)
    works = [_scripted(log, lock, rng, f"b{i}", fail_at=rng.choice([None, None, "start", "setup"])) for i in range(40)]
    _run_all([0], 1, works)
    _check(log)


def test_depth_one_never_overlaps_attempts_on_a_core():
    log: list = []
    lock = threading.Lock()
    rng = random.Random(3)
    works = [_scripted(log, lock, rng, f"c{i}") for i in range(20)]
    _run_all([0], 1, works, depth=1)
    assert _check(log) == (0, 0)
    # alone on its lane, an attempt is never asked to yield its CPU (nothing else works there)
    assert not any(n == "yield" for _, _, n, *_ in log)


def test_ungated_work_has_its_cores_to_itself():
    """Work that does not call a gate (a remote node's) never shares a lane."""
    spans: list = []

    def run(cpuset):
        t0 = time.monotonic()
        time.sleep(0.02)
        spans.append((t0, time.monotonic()))
        return "r", True, None

    _run_all([0], 1, [Work(key=i, cores=1, run=run) for i in range(6)])
    spans.sort()
    assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:]))


def test_the_open_gate_never_waits():
    assert OPEN.wait_start() and OPEN.work()
    with OPEN.agent() as ok:
        assert ok
    OPEN.started(), OPEN.remove_begin(), OPEN.remove_end()


def test_a_stop_ends_the_waits():
    """A second member waiting for the first one's agent window returns not_started once
    the run stops (Ctrl-C), and the first one's cores are given back."""
    stop = threading.Event()
    pool = CpuPool(cpus=[0], reserved=[], cross_process=False)
    ex = LocalExecutor(pool, 1, stop, depth=2)
    in_agent = threading.Event()

    def long_agent(cpuset, gate):
        try:
            gate.started()
            gate.work()
            with gate.agent(stop):
                in_agent.set()
                stop.wait(10)
            return "first", True, None
        finally:
            gate.remove_begin()
            gate.remove_end()

    ex.submit(Work(key="first", cores=1, run=long_agent, gated=True))
    ex.submit(Work(key="second", cores=1, run=lambda c, g: ("second", True, None), gated=True))
    assert in_agent.wait(5)
    time.sleep(0.1)  # the second is waiting behind the first's agent window
    ex.stop()
    got = {d.key: d for d in (ex.results(timeout=5) for _ in range(2))}
    ex.close(timeout=5)
    assert got["first"].result == "first" and got["second"].not_started
    assert pool.in_use() == 0
