"""Paired comparison of two runs on their common tasks, and the power of such comparisons.

Pure module, like ``harness.core.estimator``: plain data in, plain data out.

The test asks "did anything change between A and B?" without assuming a distribution. Under
that null, a task's clean trials in A and in B are draws from one pass rate, so pooling them
and dealing them back with their sizes (n_a to A, n_b to B) gives an outcome as likely as the
one observed. The deals are done per task (stratified), so tasks never mix, and each task's
number of passes in A's share follows the hypergeometric distribution exactly -- whatever n
each run has. Every metric and k in the comparison is studentized by its permutation standard
deviation and adjusted together (max-T, Westfall & Young 1993), so testing pass@1, pass@4 and
pass^4 at once keeps the family's false-positive rate at alpha.

The interval printed beside each delta inverts the same test: delta ± (critical max-T value ×
permutation sd). Its half-width is the *noise floor*: how far the figure moves on these tasks
and trial counts when nothing changed. So "beyond the noise floor", "the interval excludes 0"
and "adjusted p <= alpha" are one statement.
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Iterable, Sequence

from harness.core.estimator import _int, _ks, _positive, _prob, _task_value, _tasks, normal_cdf, normal_ppf, t_ppf
from harness.model.estimates import Comparison, SignificanceTest, SuiteDelta, TaskDelta
from harness.model.outcomes import TaskOutcomes

__all__ = ["compare_runs", "power_paired", "tasks_needed_paired", "aa_floor"]

# Relative tolerance when an observed statistic is compared with permuted ones: the same
# outcome summed in another order must count as a tie.
_TIE = 1e-9


def _log_hypergeom(x: int, total: int, marked: int, drawn: int) -> float:
    lc = lambda n, r: math.lgamma(n + 1) - math.lgamma(r + 1) - math.lgamma(n - r + 1)  # noqa: E731
    return lc(marked, x) + lc(total - marked, drawn - x) - lc(total, drawn)


class _Stratum:
    """One task's null distribution: the count of passes x dealt to A, its pmf, and each
    metric's delta (B - A) at every x."""

    def __init__(self, a: TaskOutcomes, b: TaskOutcomes, specs: Sequence[tuple[str, int]]):
        na, nb = a.n, b.n
        total, passes = na + nb, a.c + b.c
        self.xs = list(range(max(0, passes - nb), min(passes, na) + 1))
        logs = [_log_hypergeom(x, total, passes, na) for x in self.xs]
        top = max(logs)
        w = [math.exp(v - top) for v in logs]
        s = math.fsum(w)
        self.pmf = [v / s for v in w]
        cum, acc = [], 0.0
        for v in self.pmf:
            acc += v
            cum.append(acc)
        self.cum = cum
        self.observed = a.c - self.xs[0]
        self.contrib: dict[tuple[str, int], list[float] | None] = {}
        for metric, k in specs:
            if min(na, nb) < k:
                self.contrib[(metric, k)] = None
                continue
            self.contrib[(metric, k)] = [_task_value(metric, nb, passes - x, k) - _task_value(metric, na, x, k) for x in self.xs]

    def var(self, spec: tuple[str, int]) -> float:
        d = self.contrib[spec]
        if d is None or len(d) < 2:
            return 0.0
        mean = math.fsum(p * v for p, v in zip(self.pmf, d))
        return max(0.0, math.fsum(p * (v - mean) ** 2 for p, v in zip(self.pmf, d)))


def _extremes(strata: Sequence[_Stratum], spec: tuple[str, int]) -> tuple[float, float, float, float]:
    """(largest B - A sum, its probability, smallest sum, its probability): every task at one
    end of its support (fewest passes dealt to A gives the largest B - A)."""
    top = bottom = 0.0
    p_top = p_bottom = 1.0
    for s in strata:
        d = s.contrib[spec]
        if d is None:
            continue
        top, bottom = top + d[0], bottom + d[-1]
        if len(d) > 1:
            p_top, p_bottom = p_top * s.pmf[0], p_bottom * s.pmf[-1]
    return top, p_top, bottom, p_bottom


def _best_p(strata: Sequence[_Stratum], spec: tuple[str, int]) -> float:
    """The smallest two-sided mid-p any outcome of these tasks can give: that of the most
    extreme outcome (half its probability, and half the opposite one's when it is as extreme)."""
    if not any(s.contrib[spec] is not None and len(s.contrib[spec]) > 1 for s in strata):
        return 1.0
    top, p_top, bottom, p_bottom = _extremes(strata, spec)
    if abs(abs(top) - abs(bottom)) <= _TIE * max(abs(top), abs(bottom), 1e-12):
        return min(1.0, 0.5 * (p_top + p_bottom))
    return min(1.0, 0.5 * (p_top if abs(top) > abs(bottom) else p_bottom))


def compare_runs(
    a_tasks: Iterable[TaskOutcomes],
    b_tasks: Iterable[TaskOutcomes],
    ks: Iterable[int],
    seed: int = 0,
    *,
    n_perm: int = 4000,
    conf: float = 0.95,
) -> Comparison:
    """Paired comparison of run A (baseline) and run B (candidate) on their common tasks.

    Deltas are B - A, each the mean of per-task deltas over the common tasks with n >= k in
    both runs. The family tested together is pass@1, and pass@k and pass^k for each k >= 2
    in ``ks``. ``n_perm`` seeded deals of each task's pooled trials give, per member, the
    adjusted two-sided p-value, the noise floor and the interval (see the module docstring).
    Tasks only in A or only in B, and common tasks unmeasured in either run, are listed and
    not compared.
    """
    fn = "compare_runs"
    a_list = _tasks(fn + " (run A)", a_tasks)
    b_list = _tasks(fn + " (run B)", b_tasks)
    ks = _ks(fn, ks)
    seed = _int(fn, "seed", seed)
    n_perm = _positive(fn, "n_perm", n_perm)
    conf = _prob(fn, "conf", conf)
    alpha = 1 - conf
    b_by_id = {t.task_id: t for t in b_list}
    a_ids = {t.task_id for t in a_list}
    only_a = [t.task_id for t in a_list if t.task_id not in b_by_id]
    only_b = [t.task_id for t in b_list if t.task_id not in a_ids]
    pairs: list[tuple[TaskOutcomes, TaskOutcomes]] = []
    unmeasured: list[str] = []
    for a in a_list:
        b = b_by_id.get(a.task_id)
        if b is None:
            continue
        if a.n == 0 or b.n == 0:
            unmeasured.append(a.task_id)
        else:
            pairs.append((a, b))
    if not pairs:
        raise ValueError(
            f"{fn}: runs A and B share no task measured in both ({len(only_a)} only in A, "
            f"{len(only_b)} only in B, {len(unmeasured)} unmeasured); nothing to compare"
        )

    specs: list[tuple[str, int]] = [("pass@1", 1)]
    specs += [(m, k) for k in ks if k >= 2 for m in ("pass@k", "pass^k")]
    specs = [s for s in specs if any(min(a.n, b.n) >= s[1] for a, b in pairs)]
    strata = [_Stratum(a, b, specs) for a, b in pairs]

    # Observed deltas, and each member's permutation sd (exact: a sum of per-task variances).
    obs: dict[tuple[str, int], float] = {}
    sd: dict[tuple[str, int], float] = {}
    used: dict[tuple[str, int], int] = {}
    for spec in specs:
        rows = [s for s in strata if s.contrib[spec] is not None]
        used[spec] = len(rows)
        obs[spec] = math.fsum(s.contrib[spec][s.observed] for s in rows) / len(rows)
        sd[spec] = math.sqrt(math.fsum(s.var(spec) for s in rows)) / len(rows)
    live = [spec for spec in specs if sd[spec] > 0]

    # Seeded deals: one draw per task per deal, shared by every member (that is what makes
    # the max over members a valid family-wise statistic).
    rng = random.Random(f"compare/{seed}")
    max_t = [0.0] * n_perm
    if live:
        sums = {spec: [0.0] * n_perm for spec in live}
        for s in strata:
            if len(s.xs) < 2:
                continue
            idx = rng.choices(range(len(s.xs)), cum_weights=s.cum, k=n_perm)
            for spec in live:
                d = s.contrib[spec]
                if d is None:
                    continue
                acc = sums[spec]
                sums[spec] = [v + d[i] for v, i in zip(acc, idx)]
        for spec in live:
            scale = used[spec] * sd[spec]
            max_t = [max(m, abs(v) / scale) for m, v in zip(max_t, sums[spec])]
    # Mid-p (Lancaster): ties with the observed statistic count half. An exact permutation
    # test of a discrete statistic is conservative (0.02-0.04 at alpha = 0.05 on 16 tasks);
    # mid-p brings it to nominal. crit: the smallest permuted value whose mid-p is <= alpha.
    ranked = sorted(max_t, reverse=True)
    crit, above, i = math.inf, 0, 0
    while i < n_perm:
        j = i
        while j < n_perm and ranked[j] >= ranked[i] * (1 - _TIE):
            j += 1
        if (1 + above + 0.5 * (j - i)) / (1 + n_perm) > alpha:
            break
        crit, above, i = ranked[i], above + (j - i), j

    suite: list[SuiteDelta] = []
    p_of: dict[tuple[str, int], float] = {}
    for spec in specs:
        metric, k = spec
        rows = [(a, b) for (a, b), s in zip(pairs, strata) if s.contrib[spec] is not None]
        va = [_task_value(metric, a.n, a.c, k) for a, _ in rows]
        vb = [_task_value(metric, b.n, b.c, k) for _, b in rows]
        delta = obs[spec]
        if sd[spec] > 0:
            z = abs(delta) / sd[spec]
            over = sum(1 for m in max_t if m > z * (1 + _TIE))
            ties = sum(1 for m in max_t if z * (1 - _TIE) <= m <= z * (1 + _TIE))
            p = min(1.0, (1 + over + 0.5 * ties) / (1 + n_perm))
            beyond = p <= alpha + 1e-12
            if math.isfinite(crit):
                floor = crit * sd[spec]
            else:  # no deal reaches alpha: the floor is as far as Δ can go on these tasks
                top, _, bottom, _ = _extremes(strata, spec)
                floor = max(abs(top), abs(bottom)) / used[spec]
            # the printed interval agrees with the test at the edge (discreteness, rounding)
            floor = min(floor, abs(delta) * (1 - 1e-12)) if beyond else max(floor, abs(delta))
        else:
            p, beyond, floor = 1.0, False, 0.0
        p_of[spec] = p
        suite.append(
            SuiteDelta(
                metric=metric, k=k, a=math.fsum(va) / len(va), b=math.fsum(vb) / len(vb), delta=delta,
                low=max(-1.0, delta - floor), high=min(1.0, delta + floor), conf=conf,
                n_tasks=len(rows), excluded=[a.task_id for (a, b), s in zip(pairs, strata) if s.contrib[spec] is None],
                noise_floor=min(floor, 2.0), p_value=p, beyond_noise=beyond,  # the interval is clipped to [-1, 1]
            )
        )

    per_task = [
        TaskDelta(
            task_id=a.task_id, n_a=a.n, c_a=a.c, n_b=b.n, c_b=b.c,
            pass1_a=a.c / a.n, pass1_b=b.c / b.n, delta_pass1=b.c / b.n - a.c / a.n,
            delta_pass_hat_k={
                k: _task_value("pass^k", b.n, b.c, k) - _task_value("pass^k", a.n, a.c, k) if min(a.n, b.n) >= k else None
                for k in ks
            },
        )
        for a, b in pairs
    ]
    p1 = ("pass@1", 1)
    informative = sum(1 for s in strata if len(s.xs) > 1)
    best = _best_p(strata, p1)
    if sd[p1] == 0:
        test = SignificanceTest(method="none", statistic=obs[p1], p_value=1.0, n_informative=0,
                                detail="no task's pooled trials mix passes and failures: nothing could move between A and B")
    else:
        fam = f", adjusted for {len(live)} metrics" if len(live) > 1 else ""
        test = SignificanceTest(
            method="stratified_permutation", statistic=obs[p1], p_value=p_of[p1], n_informative=informative,
            detail=f"stratified permutation test, {n_perm} seeded deals (seed {seed}){fam}: mean pass@1 delta "
            f"{obs[p1]:+z.3f}, p={p_of[p1]:.3g}",
        )
    return Comparison(
        n_common=len(pairs), only_in_a=only_a, only_in_b=only_b, unmeasured=unmeasured,
        per_task=per_task, suite=suite, test=test, n_perm=n_perm, seed=seed, conf=conf, best_p=best,
    )


def aa_floor(deltas: Sequence[float]) -> dict[str, float | int] | None:
    """The empirical A/A floor from stored pairs of runs with nothing changed but the seed:
    how many pairs, and the largest and the root-mean-square |delta| seen between them."""
    ds = [abs(float(d)) for d in deltas]
    if not ds:
        return None
    return {"pairs": len(ds), "max_abs_delta": max(ds), "rms_delta": math.sqrt(math.fsum(d * d for d in ds) / len(ds))}


# --------------------------------------------------------------------------- power


def _finite(fn: str, name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
        raise ValueError(f"{fn}: {name} must be a finite number, got {v!r}")
    return float(v)


def _nct_cdf(t: float, df: int, ncp: float) -> float:
    # Abramowitz & Stegun 26.7.10: the noncentral t as a normal, accurate from about 8 df.
    return normal_cdf((t * (1 - 1 / (4 * df)) - ncp) / math.sqrt(1 + t * t / (2 * df)))


def power_paired(delta: float, sd: float, tasks: int, alpha: float = 0.05) -> float:
    """Power of a two-sided paired t-test over ``tasks`` tasks to detect a mean per-task delta.

    ``sd`` is the standard deviation of per-task deltas (their spread across tasks, trial noise
    included). Noncentral t with tasks - 1 df and noncentrality delta sqrt(tasks) / sd, by the
    normal approximation of Abramowitz & Stegun 26.7.10; accurate from about 8 tasks (at 2-4
    tasks it overstates power).
    """
    fn = "power_paired"
    delta, sd = _finite(fn, "delta", delta), _finite(fn, "sd", sd)
    tasks = _int(fn, "tasks", tasks)
    if tasks < 2:
        raise ValueError(f"{fn}: tasks={tasks}; a paired t-test needs at least 2 tasks")
    if sd <= 0:
        raise ValueError(f"{fn}: sd={sd}; the spread of per-task deltas must be > 0")
    alpha = _prob(fn, "alpha", alpha)
    df = tasks - 1
    crit = t_ppf(1 - alpha / 2, df)
    ncp = abs(delta) * math.sqrt(tasks) / sd
    return min(1.0, (1 - _nct_cdf(crit, df, ncp)) + _nct_cdf(-crit, df, ncp))


def tasks_needed_paired(delta: float, sd: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Fewest tasks for a two-sided paired t-test to reach ``power`` at a mean per-task delta.

    The smallest T >= 2 with ``power_paired(delta, sd, T, alpha) >= power`` (noncentral t, so
    the small-sample penalty of estimating sd is counted, unlike the normal formula).
    """
    fn = "tasks_needed_paired"
    delta, sd = _finite(fn, "delta", delta), _finite(fn, "sd", sd)
    if delta == 0:
        raise ValueError(f"{fn}: delta=0; there is no difference to detect")
    if sd <= 0:
        raise ValueError(f"{fn}: sd={sd}; the spread of per-task deltas must be > 0")
    alpha = _prob(fn, "alpha", alpha)
    power = _prob(fn, "power", power)
    z = normal_ppf(1 - alpha / 2) + normal_ppf(power)
    t = max(2, math.ceil((z * sd / delta) ** 2) - 1)
    while t > 2 and power_paired(delta, sd, t - 1, alpha) >= power:
        t -= 1
    while power_paired(delta, sd, t, alpha) < power:
        t += 1
    return t
