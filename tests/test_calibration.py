"""Calibration of the statistics by seeded simulation with known truth (fast: pure Python).

A regression in the intervals or the paired test fails here. Bands allow 3 standard errors
of simulation error around the target (coverage 0.95, false-positive rate 0.05), so they are
wide enough not to flake and narrow enough to catch a broken method: the old percentile
bootstrap fails the coverage band at 8 tasks (see the last test).
"""

from __future__ import annotations

import math
import random

import pytest

from harness.core.estimator import cluster_bootstrap, suite_interval
from harness.core.paired import compare_runs
from harness.model.outcomes import TaskOutcomes

# Task pass rates drawn from Beta(a, b): flat, U-shaped, mostly-pass, mostly-fail, near-certain.
MODELS = [(1, 1), (0.5, 0.5), (5, 1), (2, 5), (0.3, 0.1)]
TRIALS = 8


def truth(a: float, b: float, metric: str, k: int) -> float:
    """The population value of the metric under Beta(a, b) (its moments, exactly)."""
    if metric == "pass@1":
        return a / (a + b)
    prod = math.prod(((b + j) if metric == "pass@k" else (a + j)) / (a + b + j) for j in range(k))
    return 1 - prod if metric == "pass@k" else prod


def draw(rng: random.Random, ps: list[float], n: int = TRIALS) -> list[TaskOutcomes]:
    return [TaskOutcomes(task_id=f"t{i}", trials=[rng.random() < p for _ in range(n)]) for i, p in enumerate(ps)]


def coverage(tasks: int, model: tuple[float, float], metric: str, k: int, reps: int, seed: int, method=None) -> float:
    rng = random.Random(seed)
    target = truth(*model, metric, k)
    hit = 0
    for _ in range(reps):
        outs = draw(rng, [rng.betavariate(*model) for _ in range(tasks)])
        iv = method(outs) if method else suite_interval(outs, metric, k)
        hit += iv.low <= target <= iv.high
    return hit / reps


def band(reps: int, target: float) -> tuple[float, float]:
    se = math.sqrt(target * (1 - target) / reps)
    return target - 3 * se, target + 3 * se


@pytest.mark.parametrize("tasks", [8, 16])
@pytest.mark.parametrize("metric,k", [("pass@1", 1), ("pass@k", 4), ("pass^k", 4)])
def test_tasks_like_these_interval_covers(tasks, metric, k):
    reps = 250
    low, _ = band(reps, 0.95)
    covs = [coverage(tasks, m, metric, k, reps, seed=31 * tasks + i) for i, m in enumerate(MODELS)]
    if tasks == 8 and metric == "pass@1":
        # Known limit (docs/statistics.md): pass@1 from 8 tasks under the near-certain model
        # covers about 0.92, not 0.95; the other models are inside the band.
        assert min(covs[:-1]) >= low and covs[-1] >= band(reps, 0.92)[0], dict(zip(MODELS, covs))
        return
    assert min(covs) >= low, dict(zip(MODELS, covs))
    assert max(covs) <= 1.0


def test_tasks_like_these_interval_covers_at_50_tasks():
    reps = 200
    low, high = band(reps, 0.95)
    covs = [coverage(50, m, "pass@1", 1, reps, seed=50 + i) for i, m in enumerate(MODELS[:3])]
    assert low <= min(covs) and max(covs) <= high + 0.01, covs


@pytest.mark.parametrize("metric,k", [("pass@1", 1), ("pass^k", 4)])
def test_this_suite_interval_covers_trial_noise(metric, k):
    # Fixed suites (pass rates drawn once), trials redrawn: the truth is the suite's own mean.
    rng = random.Random(77)
    hits = reps = 0
    for model in MODELS:
        ps = [rng.betavariate(*model) for _ in range(16)]
        target = sum(p if metric == "pass@1" else p**k for p in ps) / len(ps)
        for _ in range(60):
            iv = suite_interval(draw(rng, ps), metric, k, estimand="suite")
            hits += iv.low <= target <= iv.high
            reps += 1
    low, _ = band(reps, 0.95)
    assert hits / reps >= low


def null_rejection(tasks: int, na: int, nb: int, model, reps: int, seed: int, ks=(1,)) -> float:
    rng = random.Random(seed)
    rejected = 0
    for r in range(reps):
        ps = [rng.betavariate(*model) for _ in range(tasks)]
        cmp = compare_runs(draw(rng, ps, na), draw(rng, ps, nb), list(ks), seed=r, n_perm=300)
        rejected += any(s.p_value <= 0.05 for s in cmp.suite)
    return rejected / reps


@pytest.mark.parametrize("na,nb", [(8, 8), (8, 5)])
def test_paired_test_false_positive_rate(na, nb):
    # Null true (A and B share each task's pass rate), equal and unequal trial counts.
    reps = 500
    rates = [null_rejection(16, na, nb, m, reps, seed=na * 10 + nb + i) for i, m in enumerate(MODELS[:2])]
    low, high = band(reps * len(rates), 0.05)
    mean = sum(rates) / len(rates)
    assert low <= mean <= high, rates
    assert max(rates) <= band(reps, 0.05)[1], rates


def test_family_of_metrics_keeps_its_false_positive_rate():
    # pass@1, pass@4 and pass^4 tested at once: any rejection counts against the family.
    reps = 300
    rate = null_rejection(16, 8, 8, (1, 1), reps, seed=5, ks=(1, 4))
    low, high = band(reps, 0.05)
    assert rate <= high, rate


def test_paired_test_has_power():
    # +15 points on every task's rate, 16 tasks, 8 trials: the test must see it most of the time.
    rng = random.Random(12)
    found = 0
    for r in range(150):
        ps = [rng.betavariate(2, 2) * 0.8 for _ in range(16)]
        cmp = compare_runs(draw(rng, ps), draw(rng, [p + 0.15 for p in ps]), [1], seed=r, n_perm=300)
        found += cmp.suite[0].beyond_noise
    assert found / 150 >= 0.6


def test_old_percentile_bootstrap_fails_the_band_at_8_tasks():
    # Why the method changed: the percentile cluster bootstrap, near-certain tasks, 8 tasks.
    reps = 200
    cov = coverage(8, (0.3, 0.1), "pass@k", 4, reps, seed=3,
                   method=lambda outs: cluster_bootstrap(outs, "pass@k", 4, n_boot=300))
    assert cov < band(reps, 0.95)[0]
