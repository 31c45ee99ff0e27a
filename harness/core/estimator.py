"""Estimators for clean trial outcomes: pass@k, pass^k, intervals, comparisons, diagnostics.

Pure module: plain data in, plain data out. No Docker, no database, no CLI. numpy only
groups a suite's tasks by their (n, c) counts; no scipy at runtime -- the special functions
it needs (normal quantile, regularized incomplete beta and gamma) are implemented here with
the standard library.

Per task with ``n`` clean trials and ``c`` passes:

* pass@k = 1 - C(n-c, k) / C(n, k)  -- "at least one of k tries passes" (Chen et al. 2021)
* pass^k = C(c, k) / C(n, k)        -- "all k tries pass" (tau-bench)

Both are unbiased for 1-(1-p)^k and p^k. Suite figures average the per-task values over
tasks (each task with its own n); they are never computed as mean(p)^k, which is reported
separately and labeled ``naive`` so reports can show how much the shortcut misleads.

Only clean trials reach this module. A task with zero clean trials is *unmeasured*: it is
listed, never counted as a pass or a fail.
"""

from __future__ import annotations

import functools
import itertools
import math
import numbers
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from fractions import Fraction

import numpy as np

from harness.model.estimates import (
    BootstrapResult,
    Buckets,
    ESTIMANDS,
    SMALL_SUITE,
    DriftResult,
    Interval,
    KMetrics,
    Metric,
    OverdispersionResult,
    SuiteInterval,
    SuiteMetrics,
    TaskMetrics,
)
from harness.model.outcomes import TaskOutcomes

__all__ = [
    "pass_at_k",
    "pass_hat_k",
    "pass_at_k_exact",
    "pass_hat_k_exact",
    "TaskOutcomes",
    "TaskMetrics",
    "KMetrics",
    "SuiteMetrics",
    "suite_metrics",
    "suite_metrics_counts",
    "Interval",
    "wilson_interval",
    "clopper_pearson_interval",
    "BootstrapResult",
    "cluster_bootstrap",
    "clustered_se_pass1",
    "Buckets",
    "buckets",
    "SuiteInterval",
    "suite_interval",
    "suite_intervals",
    "task_variance",
    "ESTIMANDS",
    "SMALL_SUITE",
    "DriftResult",
    "drift_test",
    "OverdispersionResult",
    "overdispersion_test",
    "trials_needed",
    "normal_cdf",
    "normal_ppf",
    "t_cdf",
    "t_ppf",
    "beta_cdf",
    "beta_ppf",
    "chi2_sf",
]



# --------------------------------------------------------------------------- validation


def _int(fn: str, name: str, value: object) -> int:
    # bool is an int subclass; True as "n" is always a bug upstream, never a count.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{fn}: {name} must be an integer, got {value!r} ({type(value).__name__})")
    return int(value)


def _positive(fn: str, name: str, value: object) -> int:
    """A count that must be at least 1 (replicates, permutations)."""
    n = _int(fn, name, value)
    if n < 1:
        raise ValueError(f"{fn}: {name}={n}; must be >= 1")
    return n


def _check_nck(fn: str, n: object, c: object, k: object) -> tuple[int, int, int]:
    n, c, k = _int(fn, "n", n), _int(fn, "c", c), _int(fn, "k", k)
    if n < 1:
        raise ValueError(
            f"{fn}: n={n} clean trials; need n >= 1 (a task without clean trials is unmeasured, "
            "not a pass or a fail)"
        )
    if k < 1:
        raise ValueError(f"{fn}: k={k}; k must be >= 1")
    if not 0 <= c <= n:
        raise ValueError(f"{fn}: c={c} passes is outside [0, n={n}]")
    if n < k:
        raise ValueError(
            f"{fn}: n={n} clean trials < k={k}; the estimate is undefined for this task -- "
            f"exclude it (suite_metrics does and lists it) or run at least {k} trials"
        )
    return n, c, k


def _check_cn(fn: str, c: object, n: object) -> tuple[int, int]:
    c, n = _int(fn, "c", c), _int(fn, "n", n)
    if n < 1:
        raise ValueError(f"{fn}: n={n} trials; need n >= 1 (no clean trials means unmeasured)")
    if not 0 <= c <= n:
        raise ValueError(f"{fn}: c={c} passes is outside [0, n={n}]")
    return c, n


def _prob(fn: str, name: str, value: object, *, closed: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{fn}: {name} must be a number, got {value!r}")
    v = float(value)
    ok = (0.0 <= v <= 1.0) if closed else (0.0 < v < 1.0)
    if not ok:
        bounds = "[0, 1]" if closed else "(0, 1)"
        raise ValueError(f"{fn}: {name}={value!r} must be in {bounds}")
    return v


def _ks(fn: str, ks: Iterable[object]) -> list[int]:
    if isinstance(ks, numbers.Integral) and not isinstance(ks, bool):
        ks = [ks]
    out = sorted({_int(fn, "k", k) for k in ks})
    if not out:
        raise ValueError(f"{fn}: ks is empty; pass the k values fixed by the suite, e.g. [1, 4]")
    if out[0] < 1:
        raise ValueError(f"{fn}: k={out[0]}; every k must be >= 1")
    return out


# --------------------------------------------------------------------------- per-task estimators


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task: the chance that at least one of k trials passes.

    ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021), from ``n`` clean trials of which ``c``
    passed. Computed in log space from the product form
    ``C(n-c,k)/C(n,k) = prod_{i=n-c+1..n} (1 - k/i) = prod_{j=0..k-1} (1 - c/(n-j))``
    (whichever has fewer factors) with ``log1p``/``fsum``/``expm1``, so it neither overflows
    nor loses small values at n = 10^6. Exact at the edges: 0 when c = 0, 1 when n - c < k.

    Raises ValueError (naming the values) for non-integers or bools, n < 1, k < 1,
    c outside [0, n], or n < k -- never a silent 1.0.
    """
    n, c, k = _check_nck("pass_at_k", n, c, k)
    if c == 0:
        return 0.0
    if n - c < k:
        return 1.0
    if k == 1:
        return c / n
    if c <= k:
        log_ratio = math.fsum(math.log1p(-k / i) for i in range(n - c + 1, n + 1))
    else:
        log_ratio = math.fsum(math.log1p(-c / (n - j)) for j in range(k))
    return min(1.0, max(0.0, -math.expm1(log_ratio)))


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k for one task: the chance that all of k trials pass.

    ``C(c, k) / C(n, k)`` (tau-bench), from ``n`` clean trials of which ``c`` passed.
    Computed in log space from the product form
    ``prod_{i=0..k-1} (c-i)/(n-i) = prod_{i=c+1..n} (1 - k/i)`` (whichever has fewer
    factors). Exact at the edges: 0 when c < k, 1 when c = n.

    Raises ValueError (naming the values) for non-integers or bools, n < 1, k < 1,
    c outside [0, n], or n < k.
    """
    n, c, k = _check_nck("pass_hat_k", n, c, k)
    if c < k:
        return 0.0
    if c == n:
        return 1.0
    if k == 1:
        return c / n
    # each factor's log taken the accurate way: log1p of a small deficit, or log of the ratio
    # itself when the factor is far from 1 (1 - x for x near 1 would lose digits: c << n)
    if k <= n - c:
        log_ratio = math.fsum(_log_ratio(c - i, n - i) for i in range(k))
    else:
        log_ratio = math.fsum(_log_ratio(i - k, i) for i in range(c + 1, n + 1))
    return min(1.0, max(0.0, math.exp(log_ratio)))


def _log_ratio(a: int, b: int) -> float:
    """log(a / b) for 0 < a <= b, to full precision whether a / b is near 1 or near 0."""
    d = b - a
    return math.log1p(-d / b) if 2 * d < b else math.log(a / b)


def pass_at_k_exact(n: int, c: int, k: int) -> Fraction:
    """pass@k as an exact ``Fraction``: ``1 - C(n-c, k) / C(n, k)``. Same validation as pass_at_k."""
    n, c, k = _check_nck("pass_at_k_exact", n, c, k)
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def pass_hat_k_exact(n: int, c: int, k: int) -> Fraction:
    """pass^k as an exact ``Fraction``: ``C(c, k) / C(n, k)``. Same validation as pass_hat_k."""
    n, c, k = _check_nck("pass_hat_k_exact", n, c, k)
    return Fraction(math.comb(c, k), math.comb(n, k))


# --------------------------------------------------------------------------- helpers on tasks


def _tasks(fn: str, tasks: Iterable[TaskOutcomes]) -> list[TaskOutcomes]:
    out = list(tasks)
    # checked by C-level passes (a report asks a dozen estimators about 10^5 tasks); the loop
    # below runs only to name what is wrong
    if all(map(isinstance, out, itertools.repeat(TaskOutcomes))):
        ids = [t.task_id for t in out]
        if len(set(ids)) == len(ids):
            return out
    seen: set[str] = set()
    for t in out:
        if not isinstance(t, TaskOutcomes):
            raise ValueError(f"{fn}: expected TaskOutcomes, got {type(t).__name__}")
        if t.task_id in seen:
            raise ValueError(f"{fn}: task {t.task_id} appears twice; merge its trials into one TaskOutcomes")
        seen.add(t.task_id)
    return out


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


@functools.lru_cache(maxsize=65536)  # a suite has few distinct (n, c): 10^5 tasks, a few hundred calls
def _task_value(metric: str, n: int, c: int, k: int) -> float:
    if metric == "pass@1":
        return c / n
    if metric == "pass@k":
        return pass_at_k(n, c, k)
    return pass_hat_k(n, c, k)


def _metric_k(fn: str, metric: object, k: object) -> tuple[str, int]:
    if metric not in ("pass@1", "pass@k", "pass^k"):
        raise ValueError(f"{fn}: metric={metric!r}; use 'pass@1', 'pass@k' or 'pass^k'")
    if metric == "pass@1":
        if k is not None and _int(fn, "k", k) != 1:
            raise ValueError(f"{fn}: metric 'pass@1' takes k=1 or no k, got k={k}")
        return "pass@1", 1
    if k is None:
        raise ValueError(f"{fn}: metric {metric!r} needs k")
    k = _int(fn, "k", k)
    if k < 1:
        raise ValueError(f"{fn}: k={k}; k must be >= 1")
    return str(metric), k


def _quantile(sorted_xs: Sequence[float], q: float) -> float:
    # Linear interpolation between order statistics (numpy's default, "type 7").
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    frac = pos - lo
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * frac


def _bootstrap_mean(values: Sequence[float], n_boot: int, rng: random.Random, conf: float) -> Interval:
    m = len(values)
    reps = sorted(math.fsum(rng.choices(values, k=m)) / m for _ in range(n_boot))
    alpha = 1.0 - conf
    return Interval(_quantile(reps, alpha / 2), _quantile(reps, 1 - alpha / 2))


# --------------------------------------------------------------------------- suite aggregation


def suite_metrics(tasks: Iterable[TaskOutcomes], ks: Iterable[int]) -> SuiteMetrics:
    """Suite pass@1, pass@k and pass^k: per-task unbiased values averaged over tasks.

    Each task uses its own n. At each k, tasks with n < k are excluded from that k and
    listed in ``by_k[k].excluded``; tasks with no clean trial are listed in ``unmeasured``.
    The naive mean(pass@1)^k (and 1 - (1 - mean pass@1)^k) over the same tasks is returned
    beside each figure, labeled naive, so reports can show the difference.
    """
    fn = "suite_metrics"
    tasks = _tasks(fn, tasks)
    return suite_metrics_counts([t.task_id for t in tasks], [len(t.trials) for t in tasks],
                                [sum(t.trials) for t in tasks], ks, _fn=fn, _checked_ids=True)


def suite_metrics_counts(task_ids: Sequence[str], n: object, c: object, ks: Iterable[int], *,
                         _fn: str = "suite_metrics_counts", _checked_ids: bool = False) -> SuiteMetrics:
    """:func:`suite_metrics` from each task's clean trials ``n`` and passes ``c`` (sequences
    or integer arrays, in task order): the sufficient statistics, vectorized.

    Exact in the same way as the scalar estimators, because it *is* them: every distinct
    (n, c) pair is evaluated once with :func:`pass_at_k` / :func:`pass_hat_k` and the suite
    mean is ``fsum(value x tasks with that pair) / tasks``. A suite has few distinct pairs
    (at most (trials + 1) per distinct n), so 10^5 tasks cost array passes, not 10^5 calls.
    ``per_task`` is built on first access.
    """
    fn = _fn
    ks = _ks(fn, ks)
    ids = list(task_ids)
    if not _checked_ids and len(set(ids)) != len(ids):
        dup = next(t for t, m in Counter(ids).items() if m > 1)
        raise ValueError(f"{fn}: task {dup} appears twice; merge its trials into one entry")
    na, ca = _counts_array(fn, "n", n), _counts_array(fn, "c", c)
    if not len(na) == len(ca) == len(ids):
        raise ValueError(f"{fn}: {len(ids)} task ids, {len(na)} n values and {len(ca)} c values; one of each per task")
    if len(ids) and ((ca < 0).any() or (ca > na).any()):
        i = int(np.flatnonzero((ca < 0) | (ca > na))[0])
        raise ValueError(f"{fn}: task {ids[i]}: c={int(ca[i])} passes is outside [0, n={int(na[i])}]")
    # one code per distinct (n, c) pair; the scalar estimators run once per pair
    top = int(na.max(initial=0)) + 1
    if top < 2**31:  # one int64 code per pair
        keys, inverse = np.unique(na * top + ca, return_inverse=True)
    else:
        keys, inverse = np.unique(np.stack([na, ca], axis=1), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    first = np.zeros(len(keys), dtype=np.int64)
    first[inverse] = np.arange(len(ids))  # any task of each pair: they share (n, c)
    pairs = [(int(na[i]), int(ca[i])) for i in first]
    measured = na > 0
    tables = _PairTables(pairs, ks)
    by_k: dict[int, KMetrics] = {}
    for k in ks:
        inc = na >= k
        n_inc = int(inc.sum())
        excluded = [ids[i] for i in np.flatnonzero(~inc)]
        if not n_inc:
            by_k[k] = KMetrics(k=k, n_tasks=0, excluded=excluded, pass_at_k=None, pass_hat_k=None,
                               naive_pass_at_k=None, naive_pass_hat_k=None)
            continue
        w = np.bincount(inverse[inc], minlength=len(keys)).tolist()
        p1 = _weighted_mean(tables.pass1, w, n_inc)
        by_k[k] = KMetrics(
            k=k, n_tasks=n_inc, excluded=excluded,
            pass_at_k=_weighted_mean(tables.at[k], w, n_inc),
            pass_hat_k=_weighted_mean(tables.hat[k], w, n_inc),
            naive_pass_at_k=1.0 - (1.0 - p1) ** k, naive_pass_hat_k=p1**k,
        )
    n_meas = int(measured.sum())
    pass1 = _weighted_mean(tables.pass1, np.bincount(inverse[measured], minlength=len(keys)).tolist(), n_meas) if n_meas else None
    out = SuiteMetrics(n_tasks=len(ids), unmeasured=[ids[i] for i in np.flatnonzero(~measured)], pass1=pass1, by_k=by_k)
    out._per_task_source = (ids, inverse.tolist(), tables)
    return out


class _PairTables:
    """pass@1, pass@k and pass^k of each distinct (n, c) pair (None where n < k or n = 0)."""

    def __init__(self, pairs: list[tuple[int, int]], ks: list[int]):
        self.pairs, self.ks = pairs, ks
        self.pass1 = [c / n if n else None for n, c in pairs]
        self.at = {k: [pass_at_k(n, c, k) if n >= k else None for n, c in pairs] for k in ks}
        self.hat = {k: [pass_hat_k(n, c, k) if n >= k else None for n, c in pairs] for k in ks}

    def __eq__(self, other: object) -> bool:  # SuiteMetrics compares its private source too
        return isinstance(other, _PairTables) and (self.pairs, self.ks) == (other.pairs, other.ks)

    def task(self, task_id: str, j: int) -> TaskMetrics:
        n, c = self.pairs[j]
        return TaskMetrics.model_construct(task_id=task_id, n=n, c=c, pass1=self.pass1[j], pass_at_k={k: self.at[k][j] for k in self.ks},
                           pass_hat_k={k: self.hat[k][j] for k in self.ks})


def _weighted_mean(values: list, weights: list[int], total: int) -> float:
    return math.fsum(v * w for v, w in zip(values, weights) if w) / total


def _counts_array(fn: str, name: str, xs: object) -> np.ndarray:
    a = np.asarray(xs)
    if a.ndim != 1 or not (a.size == 0 or np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"{fn}: {name} must be a one-dimensional sequence of integers (one per task), got dtype {a.dtype}")
    a = a.astype(np.int64, copy=False)
    if a.size and name == "n" and (a < 0).any():
        raise ValueError(f"{fn}: n={int(a[a < 0][0])} clean trials; must be >= 0")
    return a


def buckets(tasks: Iterable[TaskOutcomes]) -> Buckets:
    """Split tasks into always / sometimes / never pass; tasks with no clean trial are unmeasured."""
    out: dict[str, list[str]] = {"always": [], "sometimes": [], "never": [], "unmeasured": []}
    for t in _tasks("buckets", tasks):
        n, c = t.n, t.c
        key = "unmeasured" if n == 0 else "always" if c == n else "never" if c == 0 else "sometimes"
        out[key].append(t.task_id)
    return Buckets(**out)


# --------------------------------------------------------------------------- intervals


def wilson_interval(c: int, n: int, conf: float = 0.95) -> Interval:
    """Wilson score interval for a per-task pass rate c/n (no continuity correction).

    Stays inside [0, 1] and is sensible at c = 0 and c = n (10/10 gives a lower bound of
    about 0.72 at 95%). Raises ValueError for n < 1 or c outside [0, n].
    """
    c, n = _check_cn("wilson_interval", c, n)
    conf = _prob("wilson_interval", "conf", conf)
    z = normal_ppf(0.5 + conf / 2)
    z2 = z * z
    p = c / n
    denom = 1 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    low = 0.0 if c == 0 else max(0.0, center - half)
    high = 1.0 if c == n else min(1.0, center + half)
    return Interval(low, high)


def clopper_pearson_interval(c: int, n: int, conf: float = 0.95) -> Interval:
    """Clopper-Pearson ("exact") interval for a per-task pass rate c/n.

    Bounds are beta quantiles: low = Beta(alpha/2; c, n-c+1), high = Beta(1-alpha/2; c+1, n-c),
    computed with this module's own incomplete beta (continued fraction) and bisection.
    Conservative: coverage is at least ``conf``. Raises ValueError for n < 1 or c outside [0, n].
    """
    c, n = _check_cn("clopper_pearson_interval", c, n)
    conf = _prob("clopper_pearson_interval", "conf", conf)
    a2 = (1 - conf) / 2
    # Closed forms at the edges: Beta(q; 1, n) and Beta(q; n, 1) invert analytically.
    if c == 0:
        low = 0.0
    elif c == n:
        low = a2 ** (1 / n)
    else:
        low = beta_ppf(a2, c, n - c + 1)
    if c == n:
        high = 1.0
    elif c == 0:
        high = -math.expm1(math.log(a2) / n)
    else:
        high = beta_ppf(1 - a2, c + 1, n - c)
    return Interval(low, high)


def cluster_bootstrap(
    tasks: Iterable[TaskOutcomes],
    metric: Metric,
    k: int | None = None,
    n_boot: int = 2000,
    seed: int = 0,
    conf: float = 0.95,
) -> BootstrapResult:
    """Percentile cluster-bootstrap interval for a suite figure, resampling whole tasks.

    ``metric`` is 'pass@1' (k omitted or 1), 'pass@k' or 'pass^k'. Tasks with n < k are
    left out (and listed). Trials stay with their task, so the interval reflects how much
    the figure depends on which tasks are in the suite. Seeded: the same inputs and seed
    give the same interval.
    """
    fn = "cluster_bootstrap"
    metric, k = _metric_k(fn, metric, k)
    n_boot = _int(fn, "n_boot", n_boot)
    if n_boot < 1:
        raise ValueError(f"{fn}: n_boot={n_boot}; need at least 1 replicate")
    seed = _int(fn, "seed", seed)
    conf = _prob(fn, "conf", conf)
    tasks = _tasks(fn, tasks)
    inc = [t for t in tasks if t.n >= k]
    if not inc:
        raise ValueError(f"{fn}: no task has at least {k} clean trial(s); nothing to estimate {metric} from")
    values = [_task_value(metric, t.n, t.c, k) for t in inc]
    ci = _bootstrap_mean(values, n_boot, random.Random(seed), conf)
    return BootstrapResult(
        metric=metric, k=k, estimate=_mean(values), low=ci.low, high=ci.high, conf=conf,
        n_boot=n_boot, seed=seed, n_tasks=len(inc), excluded=[t.task_id for t in tasks if t.n < k],
    )


def _estimator_values(metric: str, n: int, k: int) -> list[float]:
    # The per-task estimate at every possible count of passes j = 0..n.
    if metric == "pass@1":
        return [j / n for j in range(n + 1)]
    if metric == "pass@k":
        return [pass_at_k(n, j, k) for j in range(n + 1)]
    return [pass_hat_k(n, j, k) for j in range(n + 1)]


def task_variance(metric: Metric, n: int, c: int, k: int | None = None) -> float:
    """Variance of one task's unbiased estimate from n trials, plugged in at p = (c + 1/2) / (n + 1).

    Exact under Binomial(n, p): ``sum_j P(j) f(j)^2 - (sum_j P(j) f(j))^2`` over j = 0..n passes,
    with f the task's pass@1, pass@k or pass^k at j. The smoothing keeps the plug-in off 0 and 1
    (a task that passed 8 of 8 still has trial noise). This is the "this suite" estimand: the
    tasks are fixed, only the trials vary.
    """
    fn = "task_variance"
    metric, k = _metric_k(fn, metric, k)
    n, c, k = _check_nck(fn, n, c, k)
    return _task_variance(metric, n, c, k)


@functools.lru_cache(maxsize=65536)
def _task_variance(metric: str, n: int, c: int, k: int) -> float:
    p = (c + 0.5) / (n + 1)
    if metric == "pass@1":
        return p * (1 - p) / n
    lp, lq, ln = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    m1 = m2 = 0.0
    for j, f in enumerate(_estimator_values(metric, n, k)):
        if f == 0.0:
            continue
        w = math.exp(ln - math.lgamma(j + 1) - math.lgamma(n - j + 1) + j * lp + (n - j) * lq)
        m1 += w * f
        m2 += w * f * f
    return max(0.0, m2 - m1 * m1)


def _wilson_at(m: float, n_eff: float, z: float) -> Interval:
    z2 = z * z
    denom = 1 + z2 / n_eff
    center = (m + z2 / (2 * n_eff)) / denom
    half = z / denom * math.sqrt(max(0.0, m * (1 - m)) / n_eff + z2 / (4 * n_eff * n_eff))
    low = 0.0 if m <= 0.0 else max(0.0, center - half)
    high = 1.0 if m >= 1.0 else min(1.0, center + half)
    return Interval(min(low, m), max(high, m))


def suite_interval(
    tasks: Iterable[TaskOutcomes],
    metric: Metric,
    k: int | None = None,
    conf: float = 0.95,
    estimand: str = "tasks",
    short_as: float | None = None,
) -> SuiteInterval:
    """A suite figure (mean over tasks of the per-task unbiased estimate) with its interval.

    The interval is a Wilson score interval at an effective sample size n_eff = m(1-m)/Var(m)
    (the design-effect-adjusted interval of Korn & Graubard 1998, in the Wilson form), with
    Var(m) for the chosen estimand:

    * ``"tasks"`` -- over the population of tasks like these: the between-task sample variance
      over T (the tasks' spread includes their trial noise), t quantile on T - 1 df. With one
      task the spread is unknown and the interval is [0, 1].
    * ``"suite"`` -- on this fixed suite: trial noise only, sum of each task's ``task_variance``
      over T^2, normal quantile. What "did this change beat noise on our suite" needs. It
      under-covers when k > n/2 (pass@k can barely move from c = 0); the report warns.

    n_eff is capped at (clean trials of the tasks used) / k: every-task-passes suites get a
    width from their trials instead of a zero-width interval. Tasks with n < k are left out
    and listed, unless ``short_as`` is given (a gate's worst case: such tasks count at that
    value with no variance). Seeded nothing: the interval is a function of the counts.
    """
    return suite_intervals(tasks, [(metric, k, estimand)], conf=conf, short_as=short_as)[0]


def suite_intervals(
    tasks: Iterable[TaskOutcomes],
    figures: Iterable[tuple[Metric, int | None, str]],
    conf: float = 0.95,
    short_as: float | None = None,
) -> list[SuiteInterval]:
    """:func:`suite_interval` of each ``(metric, k, estimand)`` in ``figures``, in order, from
    one pass over the tasks (a report asks for a dozen figures of 10^5 tasks). Raises the
    ValueError of the first figure that cannot be computed."""
    fn = "suite_interval"
    conf = _prob(fn, "conf", conf)
    if short_as is not None:
        short_as = _prob(fn, "short_as", short_as, closed=True)
    asked = []
    for metric, k, estimand in figures:
        metric, k = _metric_k(fn, metric, k)
        if estimand not in ESTIMANDS:
            raise ValueError(f"{fn}: estimand={estimand!r}; use one of {', '.join(ESTIMANDS)}")
        asked.append((metric, k, estimand))
    tasks = _tasks(fn, tasks)
    nc = [(t.n, t.c) for t in tasks]
    # the figure depends on each task's (n, c) only: every sum runs over the distinct pairs,
    # each weighted by how many tasks have it (10^5 tasks, a few dozen pairs)
    all_pairs = Counter(nc)
    by_k: dict[int, tuple[dict[tuple[int, int], int], list[int], list[str]]] = {}
    out = []
    for metric, k, estimand in asked:
        if k not in by_k:
            short_k = [i for i, (n, _) in enumerate(nc) if 0 < n < k] if short_as is not None else []
            low_ns = {n for n, _ in all_pairs if n < k and not (short_as is not None and n > 0)}
            by_k[k] = ({x: w for x, w in all_pairs.items() if x[0] >= k}, short_k,
                       [t.task_id for t, (n, _) in zip(tasks, nc) if n in low_ns] if low_ns else [])
        pairs, short, excluded = by_k[k]
        out.append(_interval(pairs, [nc[i][0] for i in short], [tasks[i].task_id for i in short], excluded,
                             metric, k, conf, estimand, short_as))
    return out


def _interval(pairs: dict[tuple[int, int], int], short_ns: list[int], short_ids: list[str], excluded: list[str],
              metric: str, k: int, conf: float, estimand: str, short_as: float | None) -> SuiteInterval:
    fn = "suite_interval"
    if not pairs and not short_ns:
        raise ValueError(f"{fn}: no task has at least {k} clean trial(s); nothing to estimate {metric} from")
    weighted = [(_task_value(metric, n, c, k), w) for (n, c), w in pairs.items()]
    if short_ns:
        weighted.append((float(short_as or 0.0), len(short_ns)))
    T = sum(w for _, w in weighted)
    m = min(1.0, max(0.0, math.fsum(v * w for v, w in weighted) / T))
    cap = max(1.0, (sum(n * w for (n, _), w in pairs.items()) + sum(short_ns)) / k)
    if estimand == "tasks":
        if T < 2:
            low, high, n_eff = 0.0, 1.0, None
        else:
            var = math.fsum(w * (v - m) ** 2 for v, w in weighted) / (T - 1) / T
            n_eff = cap if var <= 0 or m * (1 - m) <= 0 else max(1.0, min(cap, m * (1 - m) / var))
            low, high = _wilson_at(m, n_eff, t_ppf(0.5 + conf / 2, T - 1))
    else:
        var = math.fsum(_task_variance(metric, n, c, k) * w for (n, c), w in pairs.items()) / (T * T)
        n_eff = cap if var <= 0 or m * (1 - m) <= 0 else max(1.0, min(cap, m * (1 - m) / var))
        low, high = _wilson_at(m, n_eff, normal_ppf(0.5 + conf / 2))
    return SuiteInterval(
        metric=metric, k=k, estimand=estimand, estimate=m, low=low, high=high, conf=conf, n_tasks=T,
        n_eff=n_eff, excluded=list(excluded), counted_short=list(short_ids),
    )



def clustered_se_pass1(tasks: Iterable[TaskOutcomes]) -> float:
    """Clustered standard error of suite pass@1, with trials clustered by task.

    Suite pass@1 is the mean over measured tasks of c/n, so the cluster-robust variance is
    ``sum_i (p_i - mean)^2 / (m (m - 1))`` over the m measured tasks. Unlike the iid
    ``sqrt(p(1-p)/N)`` over all N trials, this does not shrink by adding trials to the
    same tasks when failures cluster by task. Raises ValueError with fewer than 2 measured tasks.
    """
    fn = "clustered_se_pass1"
    ps = [t.c / t.n for t in _tasks(fn, tasks) if t.n > 0]
    m = len(ps)
    if m < 2:
        raise ValueError(f"{fn}: {m} measured task(s); a clustered standard error needs at least 2")
    mu = _mean(ps)
    return math.sqrt(math.fsum((p - mu) ** 2 for p in ps) / (m * (m - 1)))


# --------------------------------------------------------------------------- diagnostics


def _cochran_q(tasks: Sequence[TaskOutcomes]) -> tuple[float, int, float, int] | None:
    # Blocks must share the number of trials; use the most common n >= 2 (ties: the larger n).
    counts = Counter(t.n for t in tasks if t.n >= 2)
    if not counts:
        return None
    n_star = max(counts, key=lambda n: (counts[n], n))
    rows = [t.trials for t in tasks if t.n == n_star]
    T = n_star
    col = list(map(sum, zip(*rows)))  # passes per trial index
    row = list(map(sum, rows))
    N = sum(row)
    denom = T * N - sum(r * r for r in row)
    if denom == 0:  # every block all-pass or all-fail: no within-task variation to test
        return 0.0, T - 1, 1.0, len(rows)
    q = (T - 1) * (T * sum(x * x for x in col) - N * N) / denom
    return q, T - 1, chi2_sf(q, T - 1), len(rows)


def drift_test(
    tasks: Iterable[TaskOutcomes], n_perm: int = 5000, seed: int = 0, alpha: float = 0.05
) -> DriftResult:
    """Test whether success depends on the trial index (early vs late trials).

    Main test: within-task permutation of early-half (first n//2 trials) vs late-half
    success, pooled over tasks with n >= 2; the null shuffles each task's trials, so each
    task keeps its own pass rate. The p-value is exact: the null distribution of the pooled
    early passes is the convolution of the tasks' hypergeometric laws (one per distinct
    (n, c), raised to its multiplicity by FFT, the groups combined pairwise); below 1e-12 it is
    reported as 1e-12, the FFT's rounding floor.
    ``n_perm`` and ``seed`` are accepted for compatibility and not used (``n_perm`` = 0 in
    the result: no Monte Carlo draws).
    Also Cochran's Q over trial indices, with the tasks sharing the most common n as blocks.
    Returns statistic (late - early rate), p-value, both rates, Q and a one-line verdict.
    """
    fn = "drift_test"
    tasks = _tasks(fn, tasks)
    n_perm = _positive(fn, "n_perm", n_perm)
    seed = _int(fn, "seed", seed)
    alpha = _prob(fn, "alpha", alpha)
    used = [t for t in tasks if t.n >= 2]
    cq = _cochran_q(tasks)
    q, df, qp, qn = cq if cq else (None, None, None, 0)
    if not used:
        return DriftResult(
            statistic=None, p_value=None, early_rate=None, late_rate=None, n_tasks=0, n_perm=0,
            seed=seed, cochran_q=None, cochran_df=None, cochran_p_value=None, cochran_n_tasks=0,
            verdict="drift not testable: no task has 2 or more clean trials",
        )

    E = sum(t.n // 2 for t in used)
    L = sum(t.n - t.n // 2 for t in used)
    C = sum(t.c for t in used)
    x_obs = sum(sum(t.trials[: t.n // 2]) for t in used)
    early, late = x_obs / E, (C - x_obs) / L
    # late - early = (C*E - X*(E+L)) / (E*L): compare the integer numerators for exact ties.
    obs = abs(C * E - x_obs * (E + L))

    p = _drift_exact_p(used, C, E, L, obs)

    if p < alpha:
        direction = "fell" if late < early else "rose"
        verdict = (
            f"drift: pass rate {direction} from {early:.0%} in early trials to {late:.0%} in late "
            f"trials (permutation p{'<' if p <= P_FLOOR else '='}{p:.3g}); check caches, shared state and host load across trials"
        )
    elif qp is not None and qp < alpha:
        verdict = (
            f"trial indices differ (Cochran's Q={q:.2f}, df={df}, p={qp:.3g}) without an early-vs-late "
            f"trend (early {early:.0%}, late {late:.0%}, p={p:.3g})"
        )
    else:
        verdict = f"no drift detected: early trials {early:.0%}, late trials {late:.0%} (p={p:.3g})"
    return DriftResult(
        statistic=late - early, p_value=p, early_rate=early, late_rate=late, n_tasks=len(used),
        n_perm=0, seed=seed, cochran_q=q, cochran_df=df, cochran_p_value=qp, cochran_n_tasks=qn,
        verdict=verdict,
    )


def _drift_exact_p(used: Sequence[TaskOutcomes], C: int, E: int, L: int, obs: int) -> float:
    """P(|C*E - X*(E+L)| >= obs) for X = the sum over tasks of independent
    Hypergeometric(n, c, n//2) early-pass counts: the exact within-task permutation p-value.

    Each distinct (n, c) law is raised to its multiplicity by FFT at its own length, then the
    groups' laws are convolved pairwise (a tree: log2(groups) rounds at the full length).
    Float error is about 1e-15 absolute, so a p-value below P_FLOOR is returned as P_FLOOR
    (the verdict says "p < ...")."""
    laws = []
    for (n, c), m in Counter((t.n, t.c) for t in used).items():
        h = n // 2
        total = math.comb(n, h)
        pmf = np.array([math.comb(c, x) * math.comb(n - c, h - x) / total if max(0, h - (n - c)) <= x <= min(h, c) else 0.0
                        for x in range(h + 1)])
        laws.append(_fft_power(pmf, m))
    while len(laws) > 1:
        laws = [_fft_convolve(laws[i], laws[i + 1]) if i + 1 < len(laws) else laws[i] for i in range(0, len(laws), 2)]
    dist = np.clip(laws[0], 0.0, None)
    dist /= dist.sum()
    x = np.arange(len(dist), dtype=np.float64)
    # compare integer numerators (exact ties): the statistic is linear in X
    extreme = np.abs(float(C) * E - x * (E + L)) >= obs - 0.5
    return float(min(1.0, max(dist[extreme].sum(), P_FLOOR)))


P_FLOOR = 1e-12  # below this the FFT's rounding, not the data, decides the drift p-value


def _fft_size(n: int) -> int:
    size = 1
    while size < n:
        size *= 2
    return size


def _fft_power(pmf: np.ndarray, m: int) -> np.ndarray:
    """The m-fold convolution of a pmf with itself (as log-magnitude and phase, so a zero
    coefficient is a clean -inf rather than a NaN)."""
    out_len = m * (len(pmf) - 1) + 1
    size = _fft_size(out_len)
    f = np.fft.rfft(pmf, n=size)
    with np.errstate(divide="ignore"):
        mag = m * np.log(np.abs(f))
    return np.fft.irfft(np.exp(mag) * np.exp(1j * m * np.angle(f)), n=size)[:out_len]


def _fft_convolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out_len = len(a) + len(b) - 1
    size = _fft_size(out_len)
    return np.fft.irfft(np.fft.rfft(a, n=size) * np.fft.rfft(b, n=size), n=size)[:out_len]


def overdispersion_test(tasks: Iterable[TaskOutcomes], alpha: float = 0.05) -> OverdispersionResult:
    """Tarone's Z test for binomial overdispersion across tasks, plus a chi-square heterogeneity test.

    Null: every task has the same pass rate (the pooled one), so failures are spread evenly.
    Tarone: ``Z = (S - sum n) / sqrt(2 sum n(n-1))`` with ``S = sum (c - n p)^2 / (p (1 - p))``,
    its p-value one-sided (upper normal tail: only clustering is tested for). Pearson:
    ``X^2 = sum (c - n p)^2 / (n p (1 - p))`` on T - 1 degrees of freedom (the 2 x T table's
    homogeneity statistic), upper-tail p. A large Z means failures cluster by task; then the
    suite's pass^k sits *above* mean(pass@1)^k (Jensen: the mean of p^k is at least the k-th
    power of the mean p), so the naive figure understates reliability there, and both sit far
    below pass@1. Needs at least one task with 2 or more clean trials.
    """
    fn = "overdispersion_test"
    alpha = _prob(fn, "alpha", alpha)
    used = [t for t in _tasks(fn, tasks) if t.n > 0]
    N = sum(t.n for t in used)
    C = sum(t.c for t in used)
    pairs = sum(t.n * (t.n - 1) for t in used)
    none = dict(statistic=None, p_value=None, chi2=None, chi2_df=None, chi2_p_value=None)
    if not used or pairs == 0:
        return OverdispersionResult(
            **none, pooled_rate=C / N if N else None, n_tasks=len(used),
            verdict="overdispersion not testable: no task has 2 or more clean trials",
        )
    p = C / N
    if C == 0 or C == N:
        return OverdispersionResult(
            **none, pooled_rate=p, n_tasks=len(used),
            verdict=f"no variation: every clean trial {'passed' if C else 'failed'}",
        )
    pq = p * (1 - p)
    s = math.fsum((t.c - t.n * p) ** 2 for t in used) / pq  # Tarone's S
    x2 = math.fsum((t.c - t.n * p) ** 2 / t.n for t in used) / pq  # Pearson's X^2 (each task by its own n)
    z = (s - N) / math.sqrt(2 * pairs)
    pz = 0.5 * math.erfc(z / math.sqrt(2))  # upper normal tail, accurate for large z
    df = len(used) - 1
    chi_p = chi2_sf(x2, df) if df > 0 else None
    if pz < alpha:
        verdict = f"failures cluster by task (overdispersed: Tarone Z={z:.2f}, one-sided p={pz:.3g})"
    else:
        verdict = f"failures spread evenly across tasks (no overdispersion: Tarone Z={z:.2f}, one-sided p={pz:.3g})"
    return OverdispersionResult(
        statistic=z, p_value=pz, chi2=x2, chi2_df=df if df > 0 else None, chi2_p_value=chi_p,
        pooled_rate=p, n_tasks=len(used), verdict=verdict,
    )


# --------------------------------------------------------------------------- sample size


def trials_needed(p1: float, p2: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Trials per run to detect pass rates p1 vs p2 (two-sided two-proportion z-test, normal approx).

    ``n = (z_{1-a/2} sqrt(2 pbar qbar) + z_{power} sqrt(p1 q1 + p2 q2))^2 / (p1 - p2)^2``,
    rounded up. Assumes independent trials; when failures cluster by task, trials on the
    same tasks are worth less -- use harness.core.paired.tasks_needed_paired with the per-task delta spread.
    """
    fn = "trials_needed"
    p1 = _prob(fn, "p1", p1, closed=True)
    p2 = _prob(fn, "p2", p2, closed=True)
    alpha = _prob(fn, "alpha", alpha)
    power = _prob(fn, "power", power)
    if p1 == p2:
        raise ValueError(f"{fn}: p1 = p2 = {p1}; there is no difference to detect")
    za, zb = normal_ppf(1 - alpha / 2), normal_ppf(power)
    pbar = (p1 + p2) / 2
    num = za * math.sqrt(2 * pbar * (1 - pbar)) + zb * math.sqrt(p1 * (1 - p1) + p2 * (1 - p2))
    return max(1, math.ceil(num * num / (p1 - p2) ** 2 - 1e-9))


# --------------------------------------------------------------------------- special functions


def normal_cdf(x: float) -> float:
    """Standard normal CDF."""
    return 0.5 * math.erfc(-x / math.sqrt(2))


_A = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
      1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)
_B = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
      6.680131188771972e01, -1.328068155288572e01)
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
      -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00)


def normal_ppf(p: float) -> float:
    """Standard normal quantile: Acklam's rational approximation plus one Halley step
    (close to full double precision). Raises ValueError outside (0, 1)."""
    p = _prob("normal_ppf", "p", p)

    def tail(q: float) -> float:
        r = math.sqrt(-2 * math.log(q))
        return (((((_C[0] * r + _C[1]) * r + _C[2]) * r + _C[3]) * r + _C[4]) * r + _C[5]) / (
            (((_D[0] * r + _D[1]) * r + _D[2]) * r + _D[3]) * r + 1
        )

    if p < 0.02425:
        x = tail(p)
    elif p > 1 - 0.02425:
        x = -tail(1 - p)
    else:
        q = p - 0.5
        r = q * q
        x = (((((_A[0] * r + _A[1]) * r + _A[2]) * r + _A[3]) * r + _A[4]) * r + _A[5]) * q / (
            ((((_B[0] * r + _B[1]) * r + _B[2]) * r + _B[3]) * r + _B[4]) * r + 1
        )
    # One Halley step on e = Phi(x) - p. For x > 0, Phi(x) - p = (1 - p) - sf(x), with 1 - p
    # exact (Sterbenz) and sf from erfc, so the upper tail keeps its precision.
    e = normal_cdf(x) - p if x <= 0 else (1 - p) - 0.5 * math.erfc(x / math.sqrt(2))
    u = e * math.sqrt(2 * math.pi) * math.exp(x * x / 2)
    return x - u / (1 + x * u / 2)


_FPMIN = 1e-300
_EPS = 1e-15


def _betacf(a: float, b: float, x: float) -> float:
    # Continued fraction for the incomplete beta (modified Lentz; Numerical Recipes 6.4).
    qab, qap, qam = a + b, a + 1, a - 1
    c = 1.0
    d = 1 - qab * x / qap
    d = 1 / (d if abs(d) > _FPMIN else _FPMIN)
    h = d
    for m in range(1, 100000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1 + aa * d
        d = 1 / (d if abs(d) > _FPMIN else _FPMIN)
        c = 1 + aa / c
        c = c if abs(c) > _FPMIN else _FPMIN
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1 + aa * d
        d = 1 / (d if abs(d) > _FPMIN else _FPMIN)
        c = 1 + aa / c
        c = c if abs(c) > _FPMIN else _FPMIN
        delta = d * c
        h *= delta
        if abs(delta - 1) < _EPS:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def beta_cdf(x: float, a: float, b: float) -> float:
    """Regularized incomplete beta I_x(a, b), the CDF of Beta(a, b) at x (a, b > 0)."""
    if not (a > 0 and b > 0):
        raise ValueError(f"beta_cdf: a={a}, b={b}; both must be > 0")
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1 - math.exp(log_front) * _betacf(b, a, 1 - x) / b


def beta_ppf(q: float, a: float, b: float) -> float:
    """Quantile of Beta(a, b): the x with I_x(a, b) = q, by bisection to float resolution."""
    q = _prob("beta_ppf", "q", q, closed=True)
    if q == 0:
        return 0.0
    if q == 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(2000):
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:
            break
        if beta_cdf(mid, a, b) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def t_cdf(x: float, df: float) -> float:
    """CDF of Student's t with ``df`` degrees of freedom (via the regularized incomplete beta)."""
    if not df > 0:
        raise ValueError(f"t_cdf: df={df}; must be > 0")
    if x == 0:
        return 0.5
    tail = 0.5 * beta_cdf(df / (df + x * x), df / 2, 0.5)
    return 1 - tail if x > 0 else tail


@functools.lru_cache(maxsize=256)  # a report asks the same (q, df) for each of its intervals
def t_ppf(q: float, df: float) -> float:
    """Quantile of Student's t with ``df`` degrees of freedom, by bisection on t_cdf."""
    q = _prob("t_ppf", "q", q)
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -t_ppf(1 - q, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < q:
        hi *= 2
        if hi > 1e12:
            return math.inf
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:
            break
        if t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _gamma_p_series(a: float, x: float) -> float:
    term = total = 1 / a
    ap = a
    for _ in range(100000):
        ap += 1
        term *= x / ap
        total += term
        if abs(term) < abs(total) * _EPS:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _gamma_q_cf(a: float, x: float) -> float:
    b = x + 1 - a
    c = 1 / _FPMIN
    d = 1 / b
    h = d
    for i in range(1, 100000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1 / (d if abs(d) > _FPMIN else _FPMIN)
        c = b + an / c
        c = c if abs(c) > _FPMIN else _FPMIN
        delta = d * c
        h *= delta
        if abs(delta - 1) < _EPS:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def chi2_sf(x: float, df: int) -> float:
    """Upper-tail probability of the chi-square distribution with df degrees of freedom."""
    if df <= 0:
        raise ValueError(f"chi2_sf: df={df}; must be > 0")
    if x <= 0:
        return 1.0
    a, y = df / 2, x / 2
    if y < a + 1:
        return max(0.0, 1 - _gamma_p_series(a, y))
    return min(1.0, _gamma_q_cf(a, y))
