"""Tests for harness.core.estimator: brute force, published worked examples, scipy cross-checks."""

from __future__ import annotations

import itertools
import math
import random
import time
from fractions import Fraction

import pytest
from scipy import stats  # a [test] dependency: missing, the module fails to import (never a skip)
from pydantic import ValidationError
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.core import estimator as est
from harness.core.estimator import (
    TaskOutcomes,
    buckets,
    clopper_pearson_interval,
    cluster_bootstrap,
    clustered_se_pass1,
    drift_test,
    overdispersion_test,
    pass_at_k,
    pass_at_k_exact,
    pass_hat_k,
    pass_hat_k_exact,
    suite_metrics,
    trials_needed,
    wilson_interval,
)


def T(task_id: str, marks: str) -> TaskOutcomes:
    """TaskOutcomes from a string of ✓ (pass) and ✗ (fail)."""
    assert set(marks) <= {"✓", "✗"}
    return TaskOutcomes(task_id=task_id, trials=[m == "✓" for m in marks])


def counts(task_id: str, n: int, c: int) -> TaskOutcomes:
    return TaskOutcomes(task_id=task_id, trials=[True] * c + [False] * (n - c))


WORKED = [T("t1", "✓✓✓✓✓"), T("t2", "✓✓✓✓✗"), T("t3", "✓✗✓✗✓"), T("t4", "✗✗✓✗✗")]


# --------------------------------------------------------------------------- per-task estimators


def test_brute_force_over_all_k_subsets():
    """Every n <= 10, every c, every k <= n: the estimators equal the share of k-subsets of a
    concrete success vector with at least one pass (pass@k) / only passes (pass^k)."""
    rng = random.Random(1)
    for n in range(1, 11):
        for c in range(n + 1):
            vec = [True] * c + [False] * (n - c)
            rng.shuffle(vec)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(vec, k))
                any_pass = Fraction(sum(any(s) for s in subsets), len(subsets))
                all_pass = Fraction(sum(all(s) for s in subsets), len(subsets))
                assert pass_at_k_exact(n, c, k) == any_pass, (n, c, k)
                assert pass_hat_k_exact(n, c, k) == all_pass, (n, c, k)
                assert pass_at_k(n, c, k) == pytest.approx(float(any_pass), abs=1e-12), (n, c, k)
                assert pass_hat_k(n, c, k) == pytest.approx(float(all_pass), abs=1e-12), (n, c, k)


def test_published_example_n8_c6():
    assert pass_at_k(8, 6, 4) == 1.0
    assert pass_at_k_exact(8, 6, 4) == 1
    assert pass_hat_k_exact(8, 6, 4) == Fraction(15, 70)
    assert pass_hat_k(8, 6, 4) == pytest.approx(15 / 70, abs=1e-15)
    assert pass_hat_k(8, 6, 8) == 0.0
    assert pass_hat_k_exact(8, 6, 8) == 0


def test_exact_edges():
    assert pass_at_k(10, 0, 3) == 0.0 and pass_hat_k(10, 0, 3) == 0.0
    assert pass_at_k(10, 10, 3) == 1.0 and pass_hat_k(10, 10, 3) == 1.0
    assert pass_at_k(10, 8, 3) == 1.0  # n - c = 2 < k
    assert pass_hat_k(10, 2, 3) == 0.0  # c < k
    assert pass_at_k(7, 3, 1) == pass_hat_k(7, 3, 1) == 3 / 7


@pytest.mark.parametrize("p", [Fraction(1, 10), Fraction(1, 3), Fraction(1, 2), Fraction(9, 10)])
@pytest.mark.parametrize("n,k", [(1, 1), (5, 2), (8, 4), (10, 10), (12, 5)])
def test_unbiased(p, n, k):
    """Over the binomial distribution of c, E[pass@k] = 1-(1-p)^k and E[pass^k] = p^k."""
    pmf = [math.comb(n, c) * p**c * (1 - p) ** (n - c) for c in range(n + 1)]
    assert sum(w * pass_at_k_exact(n, c, k) for c, w in enumerate(pmf)) == 1 - (1 - p) ** k
    assert sum(w * pass_hat_k_exact(n, c, k) for c, w in enumerate(pmf)) == p**k
    fpmf = [float(w) for w in pmf]
    assert math.fsum(w * pass_at_k(n, c, k) for c, w in enumerate(fpmf)) == pytest.approx(
        float(1 - (1 - p) ** k), abs=1e-12
    )
    assert math.fsum(w * pass_hat_k(n, c, k) for c, w in enumerate(fpmf)) == pytest.approx(
        float(p**k), abs=1e-12
    )


@pytest.mark.parametrize(
    "n,c,k",
    [
        (10**6, 1, 1000),
        (10**6, 10, 5),
        (10**6, 999_990, 7),
        (10**6, 500_000, 20),
        (10**6, 3, 999_998),
        (10**6, 999_000, 2000),
    ],
)
def test_stable_at_a_million(n, c, k):
    a, h = pass_at_k(n, c, k), pass_hat_k(n, c, k)
    assert 0.0 <= a <= 1.0 and 0.0 <= h <= 1.0
    assert math.isfinite(a) and math.isfinite(h)
    if k <= 2000:
        assert a == pytest.approx(float(pass_at_k_exact(n, c, k)), rel=1e-9, abs=1e-300)
        assert h == pytest.approx(float(pass_hat_k_exact(n, c, k)), rel=1e-9, abs=1e-300)


def test_million_extreme_cases_fast_and_bounded():
    t0 = time.perf_counter()
    for n, c, k in [(10**6, 500_000, 500_000), (10**6, 10**6 - 1, 10**6 - 1), (10**6, 1, 10**6)]:
        for f in (pass_at_k, pass_hat_k):
            v = f(n, c, k)
            assert 0.0 <= v <= 1.0
    assert pass_hat_k(10**6, 10**6 - 1, 10**6 - 1) == pytest.approx(1e-6, rel=1e-9)
    assert pass_at_k(10**6, 1, 10**6) == 1.0
    assert time.perf_counter() - t0 < 5


def test_small_pass_at_k_keeps_precision():
    # 1 - ratio with ratio ~ 1: computed with expm1, so tiny values keep relative precision.
    exact = float(pass_at_k_exact(10**6, 1, 2))
    assert pass_at_k(10**6, 1, 2) == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize(
    "args,fragment",
    [
        ((3, 1, 5), "n=3 clean trials < k=5"),
        ((5, 1, 0), "k=0"),
        ((5, 1, -2), "k=-2"),
        ((0, 0, 1), "n=0"),
        ((-1, 0, 1), "n=-1"),
        ((5, 6, 1), "c=6"),
        ((5, -1, 1), "c=-1"),
        ((5.0, 1, 1), "n must be an integer"),
        ((5, 1.5, 1), "c must be an integer"),
        ((5, 1, True), "k must be an integer"),
        ((True, True, True), "n must be an integer"),
        (("5", 1, 1), "n must be an integer"),
        ((5, None, 1), "c must be an integer"),
    ],
)
@pytest.mark.parametrize("f", [pass_at_k, pass_hat_k, pass_at_k_exact, pass_hat_k_exact])
def test_value_errors(f, args, fragment):
    with pytest.raises(ValueError) as err:
        f(*args)
    assert fragment in str(err.value)
    assert f.__name__ in str(err.value)


@settings(max_examples=300, deadline=None)
@given(st.integers(-5, 300), st.integers(-5, 300), st.integers(-5, 300))
def test_property_validation(n, c, k):
    for f in (pass_at_k, pass_hat_k):
        try:
            v = f(n, c, k)
        except ValueError:
            assert n < 1 or k < 1 or not 0 <= c <= n or n < k
        else:
            assert 0.0 <= v <= 1.0


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5000).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_property_ordering(nck):
    n, c, k = nck
    assert pass_hat_k(n, c, k) <= c / n <= pass_at_k(n, c, k)


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.floats(allow_nan=True), st.booleans(), st.text(max_size=3), st.none()))
def test_property_non_integers_rejected(bad):
    for args in [(bad, 1, 1), (5, bad, 1), (5, 1, bad)]:
        with pytest.raises(ValueError):
            pass_at_k(*args)
        with pytest.raises(ValueError):
            pass_hat_k(*args)


# --------------------------------------------------------------------------- suite


def test_suite_worked_example():
    m = suite_metrics(WORKED, ks=[1, 5])
    assert m.pass1 == pytest.approx(0.65)
    assert m.by_k[5].pass_at_k == pytest.approx(1.0)
    assert m.by_k[5].pass_hat_k == pytest.approx(0.25)
    assert m.by_k[5].excluded == []
    assert m.by_k[5].naive_pass_hat_k == pytest.approx(0.65**5)
    assert m.by_k[5].naive_pass_at_k == pytest.approx(1 - 0.35**5)
    assert m.by_k[1].pass_at_k == m.by_k[1].pass_hat_k == pytest.approx(0.65)
    assert [t.pass_hat_k[5] for t in m.per_task] == [1.0, 0.0, 0.0, 0.0]


def test_suite_each_task_own_n_and_exclusions():
    tasks = [counts("a", 10, 7), counts("b", 3, 3), counts("c", 0, 0), counts("d", 4, 1)]
    m = suite_metrics(tasks, ks=[4, 1])
    assert list(m.by_k) == [1, 4]
    assert m.unmeasured == ["c"]
    assert m.pass1 == pytest.approx((0.7 + 1 + 0.25) / 3)
    k4 = m.by_k[4]
    assert k4.excluded == ["b", "c"]
    assert k4.n_tasks == 2
    assert k4.pass_hat_k == pytest.approx((float(pass_hat_k_exact(10, 7, 4)) + 0) / 2)
    assert k4.pass_at_k == pytest.approx((float(pass_at_k_exact(10, 7, 4)) + 1.0) / 2)
    assert m.per_task[1].pass_hat_k[4] is None
    m_none = suite_metrics([counts("x", 2, 1)], ks=[3])
    assert m_none.by_k[3].pass_hat_k is None and m_none.by_k[3].excluded == ["x"]


def test_vectorized_suite_equals_exact_enumeration():
    """suite_metrics_counts (the vectorized path suite_metrics uses): on random suites of
    mixed n (0..12, unmeasured tasks included), every per-task value and every suite mean
    equals the exact Fraction computed by enumeration over the same tasks."""
    rng = random.Random(7)
    for _ in range(40):
        T_ = rng.randint(1, 60)
        ns = [rng.randint(0, 12) for _ in range(T_)]
        cs = [rng.randint(0, n) for n in ns]
        ks = sorted(rng.sample(range(1, 13), rng.randint(1, 4)))
        ids = [f"t{i}" for i in range(T_)]
        m = est.suite_metrics_counts(ids, ns, cs, ks)
        assert m.unmeasured == [t for t, n in zip(ids, ns) if n == 0]
        meas = [(n, c) for n, c in zip(ns, cs) if n]
        if meas:
            assert m.pass1 == pytest.approx(float(sum(Fraction(c, n) for n, c in meas) / len(meas)), rel=1e-12)
        for k in ks:
            inc = [(n, c) for n, c in zip(ns, cs) if n >= k]
            assert m.by_k[k].n_tasks == len(inc)
            assert m.by_k[k].excluded == [t for t, n in zip(ids, ns) if n < k]
            if inc:
                exact_at = sum(pass_at_k_exact(n, c, k) for n, c in inc) / len(inc)
                exact_hat = sum(pass_hat_k_exact(n, c, k) for n, c in inc) / len(inc)
                assert m.by_k[k].pass_at_k == pytest.approx(float(exact_at), rel=1e-12, abs=1e-300)
                assert m.by_k[k].pass_hat_k == pytest.approx(float(exact_hat), rel=1e-12, abs=1e-300)
            else:
                assert m.by_k[k].pass_hat_k is None
        for t, n, c in zip(m.per_task, ns, cs):
            assert (t.n, t.c) == (n, c)
            for k in ks:
                assert t.pass_hat_k[k] == (pass_hat_k(n, c, k) if n >= k else None)
                assert t.pass_at_k[k] == (pass_at_k(n, c, k) if n >= k else None)
        # the TaskOutcomes entry point is the same computation
        same = suite_metrics([counts(t, n, c) for t, n, c in zip(ids, ns, cs)], ks)
        assert same.by_k == m.by_k and same.pass1 == m.pass1 and same.per_task == m.per_task


def test_vectorized_suite_input_errors():
    with pytest.raises(ValueError, match="outside"):
        est.suite_metrics_counts(["a", "b"], [3, 2], [1, 3], [1])
    with pytest.raises(ValueError, match="appears twice"):
        est.suite_metrics_counts(["a", "a"], [3, 2], [1, 1], [1])
    with pytest.raises(ValueError, match="one of each"):
        est.suite_metrics_counts(["a", "b"], [3], [1], [1])
    with pytest.raises(ValueError, match="integers"):
        est.suite_metrics_counts(["a"], [3.5], [1], [1])
    with pytest.raises(ValueError, match=">= 0"):
        est.suite_metrics_counts(["a"], [-1], [0], [1])
    empty = est.suite_metrics_counts([], [], [], [1, 4])
    assert empty.n_tasks == 0 and empty.pass1 is None and empty.by_k[4].pass_hat_k is None and empty.per_task == []


def test_suite_input_errors():
    with pytest.raises(ValueError, match="appears twice"):
        suite_metrics([counts("a", 2, 1), counts("a", 3, 1)], ks=[1])
    with pytest.raises(ValueError, match="k=0"):
        suite_metrics([counts("a", 2, 1)], ks=[0])
    with pytest.raises(ValueError, match="ks is empty"):
        suite_metrics([counts("a", 2, 1)], ks=[])


def test_task_outcomes_rejects_non_bools():
    with pytest.raises(ValidationError):
        TaskOutcomes(task_id="a", trials=[1, 0])
    with pytest.raises(ValidationError):
        TaskOutcomes(task_id="a", trials=["yes"])


def test_buckets():
    b = buckets(WORKED + [T("t5", "✗✗"), TaskOutcomes(task_id="t6", trials=[])])
    assert b.always == ["t1"]
    assert b.sometimes == ["t2", "t3", "t4"]
    assert b.never == ["t5"]
    assert b.unmeasured == ["t6"]


# --------------------------------------------------------------------------- intervals


def test_wilson_reference_values():
    lo, hi = wilson_interval(10, 10)
    assert lo == pytest.approx(0.7225, abs=5e-5) and hi == 1.0
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=5e-5)
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(1 - hi)


def test_wilson_matches_textbook_formula():
    z = stats.norm.ppf(0.95)
    for c, n in [(3, 7), (1, 20), (19, 20), (50, 100)]:
        p = c / n
        center = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        lo, hi = wilson_interval(c, n, conf=0.90)
        assert lo == pytest.approx(center - half, abs=1e-12)
        assert hi == pytest.approx(center + half, abs=1e-12)


def test_clopper_pearson_vs_scipy():
    cases = [(c, n) for n in (1, 2, 5, 10, 30) for c in range(n + 1)]
    cases += [(1, 1000), (999, 1000), (500, 1000), (3, 100_000), (17, 250)]
    for conf in (0.95, 0.8):
        a2 = (1 - conf) / 2
        for c, n in cases:
            lo, hi = clopper_pearson_interval(c, n, conf)
            ref_lo = 0.0 if c == 0 else stats.beta.ppf(a2, c, n - c + 1)
            ref_hi = 1.0 if c == n else stats.beta.ppf(1 - a2, c + 1, n - c)
            assert lo == pytest.approx(ref_lo, rel=1e-8, abs=1e-14), (c, n, conf)
            assert hi == pytest.approx(ref_hi, rel=1e-8, abs=1e-14), (c, n, conf)
            assert lo <= c / n <= hi


def test_special_functions_vs_scipy():
    for p in (1e-300, 1e-10, 0.001, 0.025, 0.3, 0.5, 0.8, 0.975, 1 - 1e-12):
        assert est.normal_ppf(p) == pytest.approx(stats.norm.ppf(p), rel=1e-12, abs=1e-15)
    for x, a, b in [(0.3, 2, 5), (0.9, 0.5, 0.5), (0.01, 50, 3), (0.5, 200, 180)]:
        assert est.beta_cdf(x, a, b) == pytest.approx(stats.beta.cdf(x, a, b), rel=1e-10)
    for x, df in [(0.5, 1), (3.84, 1), (12.0, 5), (80.0, 40), (300.0, 200), (1e-4, 3)]:
        assert est.chi2_sf(x, df) == pytest.approx(stats.chi2.sf(x, df), rel=1e-9)


def test_interval_errors():
    with pytest.raises(ValueError, match="n=0"):
        wilson_interval(0, 0)
    with pytest.raises(ValueError, match="c=11"):
        clopper_pearson_interval(11, 10)
    with pytest.raises(ValueError, match="conf"):
        wilson_interval(1, 10, conf=1.5)


def test_cluster_bootstrap_reproducible_and_sane():
    rng = random.Random(7)
    tasks = [
        TaskOutcomes(task_id=f"t{i}", trials=[rng.random() < p for _ in range(6)])
        for i, p in enumerate([0.1, 0.5, 0.9, 1.0, 0.0, 0.7] * 5)
    ]
    r1 = cluster_bootstrap(tasks, "pass^k", 4, n_boot=500, seed=3)
    r2 = cluster_bootstrap(tasks, "pass^k", 4, n_boot=500, seed=3)
    r3 = cluster_bootstrap(tasks, "pass^k", 4, n_boot=500, seed=4)
    assert r1 == r2
    assert (r1.low, r1.high) != (r3.low, r3.high)
    assert r1.low <= r1.estimate <= r1.high
    assert r1.estimate == pytest.approx(suite_metrics(tasks, [4]).by_k[4].pass_hat_k)
    p1 = cluster_bootstrap(tasks, "pass@1", n_boot=500)
    assert p1.k == 1 and p1.low <= p1.estimate <= p1.high
    # The bootstrap SE should be close to the clustered SE of pass@1.
    se = clustered_se_pass1(tasks)
    width = p1.high - p1.low
    assert 0.6 * (2 * 1.96 * se) < width < 1.4 * (2 * 1.96 * se)


def test_cluster_bootstrap_excludes_short_tasks_and_validates():
    tasks = [counts("a", 5, 2), counts("b", 2, 2), counts("c", 0, 0)]
    r = cluster_bootstrap(tasks, "pass@k", 3, n_boot=50)
    assert r.n_tasks == 1 and r.excluded == ["b", "c"]
    with pytest.raises(ValueError, match="metric"):
        cluster_bootstrap(tasks, "pass@2", 2)
    with pytest.raises(ValueError, match="needs k"):
        cluster_bootstrap(tasks, "pass^k")
    with pytest.raises(ValueError, match="at least 9"):
        cluster_bootstrap(tasks, "pass^k", 9)


def test_clustered_se_pass1():
    tasks = [counts("a", 10, 10), counts("b", 10, 0), counts("c", 4, 2), counts("d", 0, 0)]
    ps = [1.0, 0.0, 0.5]
    mu = sum(ps) / 3
    expected = math.sqrt(sum((p - mu) ** 2 for p in ps) / (3 * 2))
    assert clustered_se_pass1(tasks) == pytest.approx(expected)
    with pytest.raises(ValueError, match="1 measured task"):
        clustered_se_pass1([counts("a", 3, 1)])


# --------------------------------------------------------------------------- suite intervals


def test_task_variance_matches_enumeration():
    # Exact: sum over j of Binomial(n, p) weights times the estimator's square, minus the mean's square.
    for n, c, k, metric in [(8, 6, 4, "pass^k"), (8, 1, 4, "pass@k"), (5, 5, 1, "pass@1"), (10, 0, 3, "pass^k")]:
        p = Fraction(2 * c + 1, 2 * (n + 1))
        f = {"pass@1": lambda j: Fraction(j, n), "pass@k": lambda j: pass_at_k_exact(n, j, k),
             "pass^k": lambda j: pass_hat_k_exact(n, j, k)}[metric]
        w = [math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(n + 1)]
        m1 = sum(wj * f(j) for j, wj in enumerate(w))
        m2 = sum(wj * f(j) ** 2 for j, wj in enumerate(w))
        assert est.task_variance(metric, n, c, k) == pytest.approx(float(m2 - m1 * m1), rel=1e-9)


def test_t_quantiles_against_scipy():
    for df in (1, 2, 7, 15, 49, 300):
        for q in (0.6, 0.9, 0.975, 0.995):
            assert est.t_ppf(q, df) == pytest.approx(stats.t.ppf(q, df), rel=1e-9)
            assert est.t_cdf(est.t_ppf(q, df), df) == pytest.approx(q, abs=1e-12)


def test_suite_interval_all_pass_has_width_from_trials():
    tasks = [counts(f"t{i}", 8, 8) for i in range(16)]
    for estimand in ("tasks", "suite"):
        iv = est.suite_interval(tasks, "pass^k", 4, estimand=estimand)
        assert iv.estimate == 1.0 and iv.high == 1.0
        assert 0.8 < iv.low < 0.95  # capped n_eff = 16 * 8 / 4 = 32 trials' worth, never certainty
        assert iv.n_eff == 32.0


def test_suite_interval_one_task_and_short_tasks():
    one = est.suite_interval([counts("a", 8, 5)], "pass@1")
    assert (one.low, one.high) == (0.0, 1.0) and one.n_eff is None  # the spread between tasks is unknown
    tasks = [counts("a", 8, 8), counts("b", 8, 8), counts("c", 2, 0), counts("d", 0, 0)]
    iv = est.suite_interval(tasks, "pass^k", 3)
    assert iv.estimate == 1.0 and iv.excluded == ["c", "d"] and iv.counted_short == []
    worst = est.suite_interval(tasks, "pass^k", 3, short_as=0.0)
    assert worst.estimate == pytest.approx(2 / 3) and worst.counted_short == ["c"] and worst.excluded == ["d"]
    with pytest.raises(ValueError, match="estimand"):
        est.suite_interval(tasks, "pass@1", estimand="population")
    with pytest.raises(ValueError, match="at least 9"):
        est.suite_interval(tasks, "pass^k", 9)


def test_suite_interval_contains_estimate_and_narrows_with_tasks():
    rng = random.Random(3)
    widths = []
    for T_ in (8, 32, 128):
        tasks = [TaskOutcomes(task_id=f"t{i}", trials=[rng.random() < p for _ in range(8)])
                 for i, p in enumerate(rng.betavariate(2, 2) for _ in range(T_))]
        iv = est.suite_interval(tasks, "pass@1")
        fixed = est.suite_interval(tasks, "pass@1", estimand="suite")
        assert iv.low <= iv.estimate <= iv.high and fixed.low <= fixed.estimate <= fixed.high
        assert fixed.high - fixed.low < iv.high - iv.low  # trial noise alone is the smaller part
        widths.append(iv.high - iv.low)
    assert widths[0] > widths[1] > widths[2]


# --------------------------------------------------------------------------- diagnostics


def test_drift_detected_and_not():
    rng = random.Random(0)
    drifting = [
        TaskOutcomes(task_id=f"t{i}", trials=[rng.random() < (0.9 if j < 5 else 0.3) for j in range(10)])
        for i in range(30)
    ]
    r = drift_test(drifting, n_perm=2000, seed=1)
    assert r.p_value < 0.01
    assert r.early_rate > r.late_rate and r.statistic == pytest.approx(r.late_rate - r.early_rate)
    assert r.verdict.startswith("drift: pass rate fell")
    assert r.cochran_p_value is not None and r.cochran_p_value < 0.01
    assert r.cochran_df == 9 and r.cochran_n_tasks == 30
    assert drift_test(drifting, n_perm=2000, seed=1) == r

    steady = [
        TaskOutcomes(task_id=f"t{i}", trials=[rng.random() < p for _ in range(10)])
        for i, p in enumerate([0.2, 0.5, 0.8, 0.95] * 8)
    ]
    s = drift_test(steady, n_perm=2000, seed=1)
    assert s.p_value > 0.05
    assert s.verdict.startswith("no drift detected")


def test_drift_p_value_is_the_exact_permutation_distribution():
    """Tiny suites: the p-value equals the share of all within-task orderings (every
    permutation of every task's trials, enumerated) at least as extreme as the observed."""
    rng = random.Random(3)
    for _ in range(12):
        tasks = [TaskOutcomes(task_id=f"t{i}", trials=[rng.random() < 0.5 for _ in range(rng.randint(2, 5))]) for i in range(3)]
        r = drift_test(tasks)
        E = sum(t.n // 2 for t in tasks)
        L = sum(t.n - t.n // 2 for t in tasks)
        C = sum(t.c for t in tasks)
        x_obs = sum(sum(t.trials[: t.n // 2]) for t in tasks)
        obs = abs(C * E - x_obs * (E + L))
        perms = [list(itertools.permutations(t.trials)) for t in tasks]
        hits = total = 0
        for combo in itertools.product(*perms):
            x = sum(sum(p[: len(p) // 2]) for p in combo)
            hits += abs(C * E - x * (E + L)) >= obs
            total += 1
        assert r.p_value == pytest.approx(hits / total, abs=1e-12)
        assert r.n_perm == 0


def test_drift_at_scale_and_calibrated_under_the_null():
    """10^4 tasks give a p-value in [0, 1] (the FFT path at a large support); under the null
    (no drift) over 200 seeded suites the rejection rate at 0.05 is within 3 SE of 0.05."""
    rng = random.Random(5)
    big = [TaskOutcomes(task_id=f"t{i}", trials=[rng.random() < 0.6 for _ in range(8)]) for i in range(10_000)]
    assert 0.0 <= drift_test(big).p_value <= 1.0
    rej = 0
    for s in range(200):
        r2 = random.Random(100 + s)
        ps = [r2.random() for _ in range(20)]
        tasks = [TaskOutcomes(task_id=f"t{i}", trials=[r2.random() < p for _ in range(8)]) for i, p in enumerate(ps)]
        rej += drift_test(tasks).p_value <= 0.05
    assert rej / 200 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 200)


def test_cochran_q_hand_computed():
    rows = ["✓✓✗", "✓✗✗", "✓✓✓", "✗✗✗", "✓✗✗", "✓✓✗"]
    tasks = [T(f"t{i}", r) for i, r in enumerate(rows)]
    # Columns: 5, 3, 1; rows: 2, 1, 3, 0, 1, 2; N = 9; T = 3.
    q = 2 * (3 * (25 + 9 + 1) - 81) / (3 * 9 - (4 + 1 + 9 + 0 + 1 + 4))
    r = drift_test(tasks, n_perm=200)
    assert r.cochran_q == pytest.approx(q)
    assert r.cochran_p_value == pytest.approx(stats.chi2.sf(q, 2))


def test_drift_untestable():
    r = drift_test([T("a", "✓"), T("b", "✗")])
    assert r.p_value is None and "not testable" in r.verdict


def test_overdispersion():
    clustered = [counts(f"p{i}", 8, 8) for i in range(10)] + [counts(f"f{i}", 8, 0) for i in range(10)]
    r = overdispersion_test(clustered)
    assert r.p_value < 1e-6 and r.verdict.startswith("failures cluster by task")
    assert r.chi2_p_value < 1e-6

    even = [counts(f"t{i}", 8, 4 + (i % 3) - 1) for i in range(20)]
    r = overdispersion_test(even)
    assert r.p_value > 0.5 and r.verdict.startswith("failures spread evenly")

    rng = random.Random(3)
    binomial = [TaskOutcomes(task_id=f"t{i}", trials=[rng.random() < 0.6 for _ in range(8)]) for i in range(40)]
    assert overdispersion_test(binomial).p_value > 0.05


def test_overdispersion_matches_formula():
    tasks = [counts("a", 5, 5), counts("b", 6, 1), counts("c", 4, 2)]
    N, C = 15, 8
    p = C / N
    s = ((5 - 5 * p) ** 2 + (1 - 6 * p) ** 2 + (2 - 4 * p) ** 2) / (p * (1 - p))
    z = (s - N) / math.sqrt(2 * (20 + 30 + 12))
    x2 = ((5 - 5 * p) ** 2 / 5 + (1 - 6 * p) ** 2 / 6 + (2 - 4 * p) ** 2 / 4) / (p * (1 - p))  # Pearson: each task by its n
    r = overdispersion_test(tasks)
    assert r.statistic == pytest.approx(z)
    assert r.chi2 == pytest.approx(x2) and r.chi2_df == 2 and r.chi2 != pytest.approx(s)
    assert "one-sided p=" in r.verdict
    assert overdispersion_test([counts("a", 4, 4), counts("b", 3, 3)]).p_value is None


def test_overdispersion_chi2_is_pearsons_homogeneity_test():
    """Against scipy's Pearson chi-square on the 2 x T table of passes and failures (no
    continuity correction): statistic and p-value agree; Tarone's S (not divided by n) would
    give a p-value orders of magnitude smaller and fire on nearly every run."""
    rng = random.Random(11)
    for _ in range(20):
        tasks = [counts(f"t{i}", n, rng.randint(0, n)) for i, n in enumerate(rng.choices([4, 8, 16], k=rng.randint(3, 12)))]
        if sum(t.c for t in tasks) in (0, sum(t.n for t in tasks)):
            continue
        table = [[t.c for t in tasks], [t.n - t.c for t in tasks]]
        if any(sum(col) == 0 for col in zip(*table)):
            continue
        chi, pval, dof, _ = stats.chi2_contingency(table, correction=False)
        r = overdispersion_test(tasks)
        assert r.chi2 == pytest.approx(chi, rel=1e-9) and r.chi2_df == dof
        assert r.chi2_p_value == pytest.approx(pval, rel=1e-6, abs=1e-300)


def test_pass_hat_k_keeps_its_digits_when_few_trials_pass():
    for n, c, k in [(10**6, 3, 2), (10**6, 10, 5), (10**5, 2, 2), (10**6, 999_990, 7), (50, 25, 25), (10**4, 5000, 3)]:
        exact = float(pass_hat_k_exact(n, c, k))
        assert pass_hat_k(n, c, k) == pytest.approx(exact, rel=1e-13), (n, c, k)


# --------------------------------------------------------------------------- sample size


def test_sample_size_helpers():
    za, zb = stats.norm.ppf(0.975), stats.norm.ppf(0.8)
    p1, p2 = 0.6, 0.7
    pbar = 0.65
    n = (za * math.sqrt(2 * pbar * (1 - pbar)) + zb * math.sqrt(p1 * (1 - p1) + p2 * (1 - p2))) ** 2 / 0.01
    assert trials_needed(0.6, 0.7) == math.ceil(n)
    assert trials_needed(0.5, 0.6) > trials_needed(0.5, 0.8)
    with pytest.raises(ValueError, match="no difference"):
        trials_needed(0.5, 0.5)
    with pytest.raises(ValueError, match="power"):
        trials_needed(0.5, 0.6, power=1.0)



def test_suite_metrics_compare_and_dump_with_their_per_task():
    a = est.suite_metrics_counts(["x", "y"], [4, 3], [2, 3], [1, 2])
    b = suite_metrics([counts("x", 4, 2), counts("y", 3, 3)], [1, 2])
    assert a == b
    d = a.model_dump()
    assert [t["task_id"] for t in d["per_task"]] == ["x", "y"] and d["per_task"][0]["pass_hat_k"][2] == pytest.approx(1 / 6)


def test_drift_p_value_floor_and_large_suites():
    """A certain drift (every task fails its first half, passes its second) is below the FFT's
    rounding: reported at the floor, with '<' in the verdict; a suite of many distinct (n, c)
    still gives a p-value that matches the exact enumeration of a small one."""
    r = drift_test([TaskOutcomes(task_id=f"t{i}", trials=[False] * 10 + [True] * 10) for i in range(300)])
    assert r.p_value == est.P_FLOOR and "p<" in r.verdict
    rng = random.Random(9)
    many = [TaskOutcomes(task_id=f"t{i}", trials=[rng.random() < 0.5 for _ in range(rng.randint(2, 60))]) for i in range(3000)]
    assert 0.0 < drift_test(many).p_value <= 1.0


@pytest.mark.parametrize("call", [
    lambda ts: est.suite_metrics(ts, ks=[1]),
    lambda ts: est.buckets(ts),
    lambda ts: est.suite_intervals(ts, [("pass@1", 1, "tasks")]),
    lambda ts: est.clustered_se_pass1(ts),
    lambda ts: est.drift_test(ts, seed=0),
    lambda ts: est.overdispersion_test(ts),
    lambda ts: est.cluster_bootstrap(ts, "pass@1", 1, n_boot=10, seed=0),
], ids=["suite_metrics", "buckets", "suite_intervals", "clustered_se_pass1", "drift_test", "overdispersion_test", "cluster_bootstrap"])
def test_every_estimator_names_a_duplicate_task_or_a_wrong_entry(call):
    good = [counts(f"t{i}", 4, i % 5) for i in range(5)]
    call(good)  # accepted as given
    with pytest.raises(ValueError, match="task t3 appears twice"):
        call([*good, counts("t3", 2, 1)])
    with pytest.raises(ValueError, match="expected TaskOutcomes, got dict"):
        call([*good[:2], {"task_id": "x", "trials": [True]}, *good[2:]])
