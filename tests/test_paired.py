"""Tests for harness.core.paired: the stratified permutation test against exact enumeration,
the interval/test agreement, and the power helpers against scipy's noncentral t."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from scipy import stats  # a [test] dependency: missing, the module fails to import (never a skip)

from harness.core.paired import aa_floor, compare_runs, power_paired, tasks_needed_paired
from harness.model.outcomes import TaskOutcomes


def counts(task_id: str, n: int, c: int) -> TaskOutcomes:
    return TaskOutcomes(task_id=task_id, trials=[True] * c + [False] * (n - c))


def exact_mid_p(a: list[TaskOutcomes], b: list[TaskOutcomes]) -> float:
    """Two-sided mid-p of the mean pass@1 delta by enumerating every deal of every task."""
    supports = []
    for x, y in zip(a, b):
        total, passes = x.n + y.n, x.c + y.c
        opts = []
        for xa in range(max(0, passes - y.n), min(passes, x.n) + 1):
            w = math.comb(passes, xa) * math.comb(total - passes, x.n - xa) / math.comb(total, x.n)
            opts.append((w, (passes - xa) / y.n - xa / x.n))
        supports.append(opts)
    obs = abs(sum(y.c / y.n - x.c / x.n for x, y in zip(a, b)))
    over = tie = 0.0
    for combo in itertools.product(*supports):
        w = math.prod(c[0] for c in combo)
        s = abs(sum(c[1] for c in combo))
        if s > obs + 1e-12:
            over += w
        elif s >= obs - 1e-12:
            tie += w
    return over + 0.5 * tie


def test_one_trial_per_task_is_a_mid_p_sign_test():
    # 8 tasks pass only in B, 2 only in A, 10 agree: only the 10 discordant tasks can move,
    # each to either side with probability 1/2 -- the exact (mid-p) McNemar test.
    a = [counts(f"x{i}", 1, 0) for i in range(8)] + [counts(f"y{i}", 1, 1) for i in range(2)]
    b = [counts(f"x{i}", 1, 1) for i in range(8)] + [counts(f"y{i}", 1, 0) for i in range(2)]
    a += [counts(f"z{i}", 1, i % 2) for i in range(10)] + [counts("a_only", 1, 1)]
    b += [counts(f"z{i}", 1, i % 2) for i in range(10)] + [counts("b_only", 1, 0)]
    r = compare_runs(a, b, ks=[1], n_perm=40000)
    mid = 2 * (math.comb(10, 0) + math.comb(10, 1) + 0.5 * math.comb(10, 2)) / 1024
    assert r.test.method == "stratified_permutation"
    assert r.test.p_value == pytest.approx(mid, abs=0.005)
    assert r.test.n_informative == 10 and r.n_common == 20
    assert r.only_in_a == ["a_only"] and r.only_in_b == ["b_only"]
    assert r.suite[0].delta == pytest.approx(6 / 20)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_monte_carlo_p_matches_enumeration_with_unequal_n(seed):
    rng = random.Random(seed)
    a, b = [], []
    for i in range(5):
        na, nb = rng.randint(2, 5), rng.randint(1, 4)
        a.append(counts(f"t{i}", na, rng.randint(0, na)))
        b.append(counts(f"t{i}", nb, rng.randint(0, nb)))
    r = compare_runs(a, b, ks=[1], n_perm=40000, seed=seed)
    assert r.test.p_value == pytest.approx(exact_mid_p(a, b), abs=0.008)


def test_interval_agrees_with_the_test_and_is_reproducible():
    rng = random.Random(9)
    for trial in range(40):
        T_ = rng.randint(3, 20)
        a, b = [], []
        for i in range(T_):
            p = rng.random()
            shift = rng.choice([0.0, 0.0, 0.3])
            a.append(TaskOutcomes(task_id=f"t{i}", trials=[rng.random() < p for _ in range(rng.randint(1, 8))]))
            b.append(TaskOutcomes(task_id=f"t{i}", trials=[rng.random() < min(1, p + shift) for _ in range(rng.randint(1, 8))]))
        r = compare_runs(a, b, ks=[1, 2, 4], n_perm=600, seed=trial)
        for s in r.suite:
            excludes = s.low > 0 or s.high < 0
            assert s.beyond_noise == excludes == (s.p_value <= 0.05), s
            assert s.low <= s.delta <= s.high
            assert s.high - s.delta == pytest.approx(min(s.noise_floor, 1 - s.delta), abs=1e-12) or s.high == 1.0
        assert r == compare_runs(a, b, ks=[1, 2, 4], n_perm=600, seed=trial)


def test_family_adjustment_raises_p_values():
    rng = random.Random(4)
    a = [TaskOutcomes(task_id=f"t{i}", trials=[rng.random() < 0.5 for _ in range(8)]) for i in range(16)]
    b = [TaskOutcomes(task_id=f"t{i}", trials=[rng.random() < 0.65 for _ in range(8)]) for i in range(16)]
    alone = compare_runs(a, b, ks=[1], n_perm=3000).suite[0]
    family = compare_runs(a, b, ks=[1, 2, 4], n_perm=3000)
    assert [(s.metric, s.k) for s in family.suite] == [("pass@1", 1), ("pass@k", 2), ("pass^k", 2), ("pass@k", 4), ("pass^k", 4)]
    assert family.suite[0].p_value >= alone.p_value - 1e-9
    assert family.suite[0].noise_floor > alone.noise_floor


def test_nothing_can_move_and_too_few_tasks():
    same = compare_runs([counts("a", 4, 4), counts("b", 4, 0)], [counts("a", 4, 4), counts("b", 3, 0)], ks=[1])
    assert same.test.method == "none" and same.suite[0].noise_floor == 0.0 and not same.suite[0].beyond_noise
    tiny = compare_runs([counts("a", 1, 0), counts("b", 1, 0)], [counts("a", 1, 1), counts("b", 1, 1)], ks=[1])
    assert tiny.best_p == pytest.approx(0.5 * (0.25 + 0.25))  # mid-p of every task at its extreme, either way
    assert tiny.suite[0].noise_floor == pytest.approx(1.0)  # nothing reaches alpha: the floor is the largest possible |Δ|
    assert tiny.suite[0].delta == 1.0 and not tiny.suite[0].beyond_noise
    big = compare_runs([counts(f"t{i}", 4, 0) for i in range(6)], [counts(f"t{i}", 4, 4) for i in range(6)], ks=[2], n_perm=2000)
    assert big.best_p == pytest.approx((1 / 70) ** 6)
    assert big.suite[0].beyond_noise and big.suite[0].p_value < 0.001


def test_compare_errors_and_unmeasured():
    with pytest.raises(ValueError, match="share no task"):
        compare_runs([counts("a", 2, 1)], [counts("b", 2, 1)], ks=[1])
    r = compare_runs(
        [counts("a", 2, 1), counts("u", 0, 0), counts("v", 3, 1)],
        [counts("a", 2, 2), counts("u", 3, 1), counts("v", 3, 1)],
        ks=[3],
    )
    assert r.unmeasured == ["u"] and r.n_common == 2
    assert [s.excluded for s in r.suite if s.k == 3] == [["a"], ["a"]]
    with pytest.raises(ValueError, match="n_perm"):
        compare_runs([counts("a", 2, 1)], [counts("a", 2, 1)], ks=[1], n_perm=0)


def test_aa_floor():
    assert aa_floor([]) is None
    f = aa_floor([0.02, -0.05, 0.01])
    assert f["pairs"] == 3 and f["max_abs_delta"] == 0.05
    assert f["rms_delta"] == pytest.approx(math.sqrt((0.02**2 + 0.05**2 + 0.01**2) / 3))


def test_power_against_noncentral_t():
    for T_, delta, sd in [(8, 0.1, 0.15), (16, 0.1, 0.2), (30, 0.05, 0.15), (50, 0.02, 0.1)]:
        df, ncp = T_ - 1, delta * math.sqrt(T_) / sd
        crit = stats.t.ppf(0.975, df)
        exact = stats.nct.sf(crit, df, ncp) + stats.nct.cdf(-crit, df, ncp)
        assert power_paired(delta, sd, T_) == pytest.approx(exact, abs=0.01)
    need = tasks_needed_paired(0.1, 0.3)
    assert power_paired(0.1, 0.3, need) >= 0.8 > power_paired(0.1, 0.3, need - 1)
    with pytest.raises(ValueError, match="no difference"):
        tasks_needed_paired(0.0, 0.3)
    with pytest.raises(ValueError, match="sd"):
        power_paired(0.1, 0, 10)
    with pytest.raises(ValueError, match="at least 2"):
        power_paired(0.1, 0.2, 1)
