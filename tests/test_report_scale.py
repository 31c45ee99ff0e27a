"""The report's fast paths give what the plain definitions give: slots grouped in one pass
(any input order), per-task n and c computed once per object, suite intervals summed over
distinct (n, c) pairs."""

from __future__ import annotations

import math
import random

import pytest

from harness.core.aggregate import slot_views
from harness.core.estimator import ESTIMANDS, _task_value, normal_ppf, suite_interval, t_ppf
from harness.model.attempt import AttemptRecord
from harness.model.outcomes import TaskOutcomes


def _attempts(rng: random.Random) -> list[AttemptRecord]:
    out, i = [], 0
    for t in range(6):
        for slot in range(4):
            for no in range(1, rng.randint(1, 4) + 1):
                i += 1
                clean = rng.random() < 0.5
                out.append(AttemptRecord(id=i, run_id="r", task_id=f"t{t}", slot=slot, attempt_no=no, seed=slot,
                                         verdict="clean" if clean else "discarded", outcome="pass" if clean else None,
                                         reasons=[] if clean else ["host_cpu_contention"]))
    return out


def test_slot_views_do_not_depend_on_the_order_attempts_arrive_in():
    rng = random.Random(7)
    for _ in range(20):
        atts = _attempts(rng)
        ref = slot_views(sorted(atts, key=lambda a: (a.task_id, a.slot, a.attempt_no, a.id)), [f"t{t}" for t in range(6)], 4, 3)
        shuffled = atts[:]
        rng.shuffle(shuffled)
        got = slot_views(shuffled, [f"t{t}" for t in range(6)], 4, 3)
        for t in ref:
            for a, b in zip(ref[t], got[t]):
                assert (a.clean and a.clean.id) == (b.clean and b.clean.id)  # the first clean attempt by number counts
                assert [x.id for x in a.discarded] == [x.id for x in b.discarded]
                assert [x.attempt_no for x in b.discarded] == sorted(x.attempt_no for x in b.discarded)


def test_n_and_c_follow_a_copy_with_new_trials():
    t = TaskOutcomes(task_id="a", trials=[True, False, True])
    assert (t.n, t.c) == (3, 2)
    u = t.model_copy(update={"trials": [False]})
    assert (u.n, u.c) == (1, 0) and (t.n, t.c) == (3, 2)
    assert t == TaskOutcomes(task_id="a", trials=[True, False, True])  # a cached count is not a field


def _plain(tasks: list[TaskOutcomes], metric: str, k: int, estimand: str, conf: float = 0.95) -> tuple[float, float, float]:
    """suite_interval's definition, one task at a time."""
    inc = [t for t in tasks if t.n >= k]
    values = [_task_value(metric, t.n, t.c, k) for t in inc]
    T = len(values)
    m = math.fsum(values) / T
    cap = max(1.0, sum(t.n for t in inc) / k)
    if estimand == "tasks":
        var = math.fsum((v - m) ** 2 for v in values) / (T - 1) / T
        z = t_ppf(0.5 + conf / 2, T - 1)
    else:
        from harness.core.estimator import _task_variance
        var = math.fsum(_task_variance(metric, t.n, t.c, k) for t in inc) / (T * T)
        z = normal_ppf(0.5 + conf / 2)
    n_eff = cap if var <= 0 or m * (1 - m) <= 0 else max(1.0, min(cap, m * (1 - m) / var))
    denom = 1 + z * z / n_eff
    center = (m + z * z / (2 * n_eff)) / denom
    half = z / denom * math.sqrt(max(0.0, m * (1 - m)) / n_eff + z * z / (4 * n_eff * n_eff))
    return m, max(0.0, min(center - half, m)), min(1.0, max(center + half, m))


@pytest.mark.parametrize("metric,k", [("pass@1", 1), ("pass@k", 4), ("pass^k", 4), ("pass^k", 8)])
@pytest.mark.parametrize("estimand", sorted(ESTIMANDS))
def test_a_suite_interval_over_distinct_pairs_is_the_interval_over_tasks(metric, k, estimand):
    rng = random.Random(11)
    tasks = []
    for i in range(400):
        n = rng.choice([3, 5, 8, 8, 8])
        p = rng.random()
        tasks.append(TaskOutcomes(task_id=f"t{i}", trials=[rng.random() < p for _ in range(n)]))
    got = suite_interval(tasks, metric, k=k, estimand=estimand)  # type: ignore[arg-type]
    m, low, high = _plain(tasks, metric, k, estimand)
    assert got.estimate == pytest.approx(m, abs=1e-12)
    assert (got.low, got.high) == (pytest.approx(low, abs=1e-9), pytest.approx(high, abs=1e-9))
    assert got.excluded == [t.task_id for t in tasks if t.n < k]


def test_the_collector_is_paused_inside_and_left_as_it_was_found():
    import gc

    from harness.model.units import collector_paused

    seen = []
    assert gc.isenabled()
    with collector_paused():
        seen.append(gc.isenabled())
    assert seen == [False] and gc.isenabled()
    with pytest.raises(RuntimeError):
        with collector_paused():
            raise RuntimeError("boom")
    assert gc.isenabled()  # resumed whatever happened inside
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # off before: still off (a caller's own pause is not undone)
    finally:
        gc.enable()
