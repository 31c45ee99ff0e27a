"""Results of the estimators (``harness.core.estimator``): per-task and suite figures,
intervals, comparisons and diagnostics, with the estimand of each field in its description."""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, computed_field

Metric = Literal["pass@1", "pass@k", "pass^k"]



class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class TaskMetrics(_Model):
    """Per-task estimates within a suite."""

    task_id: str = Field(description="Task id.")
    n: int = Field(ge=0, description="Clean trials.")
    c: int = Field(ge=0, description="Passing clean trials.")
    pass1: float | None = Field(description="c / n; null when the task is unmeasured (n = 0).")
    pass_at_k: dict[int, float | None] = Field(
        description="pass@k for each requested k; null when n < k."
    )
    pass_hat_k: dict[int, float | None] = Field(
        description="pass^k for each requested k; null when n < k."
    )


class KMetrics(_Model):
    """Suite-level estimates at one k."""

    k: int = Field(ge=1, description="Number of tries.")
    n_tasks: int = Field(ge=0, description="Tasks with n >= k, the ones averaged.")
    excluded: list[str] = Field(
        description="Tasks with n < k (unmeasured tasks included), left out of this k."
    )
    pass_at_k: float | None = Field(
        description="Mean over included tasks of per-task pass@k; null if no task has n >= k."
    )
    pass_hat_k: float | None = Field(
        description="Mean over included tasks of per-task pass^k; null if no task has n >= k."
    )
    naive_pass_at_k: float | None = Field(
        description="NAIVE, biased: 1 - (1 - mean pass@1)^k over the same tasks. "
        "Shown only to contrast with pass_at_k; do not report it as pass@k."
    )
    naive_pass_hat_k: float | None = Field(
        description="NAIVE, biased: (mean pass@1)^k over the same tasks. Understates reliability "
        "when failures cluster by task (Jensen); shown only to contrast with pass_hat_k."
    )


class SuiteMetrics(_Model):
    """Suite-level pass@1, pass@k and pass^k: per-task values averaged over tasks."""

    n_tasks: int = Field(ge=0, description="All tasks given, measured or not.")
    unmeasured: list[str] = Field(description="Tasks with no clean trial; excluded everywhere.")
    pass1: float | None = Field(
        description="Mean over measured tasks of c/n (each task weighs the same, whatever its n)."
    )
    by_k: dict[int, KMetrics] = Field(description="Estimates for each requested k.")
    # (task ids, each task's distinct-(n, c) index, the pairs' values): set by the estimator,
    # so that per_task costs nothing until a caller asks for it
    _per_task_source: Any = PrivateAttr(default=None)

    @computed_field(description="Per-task estimates, in input order (built on first access).")  # type: ignore[prop-decorator]
    @cached_property
    def per_task(self) -> list[TaskMetrics]:
        if self._per_task_source is None:
            return []
        ids, inverse, tables = self._per_task_source
        return [tables.task(t, j) for t, j in zip(ids, inverse)]


class Interval(NamedTuple):
    """A two-sided confidence interval."""

    low: float
    high: float


Estimand = Literal["tasks", "suite"]
ESTIMANDS: dict[str, str] = {
    "tasks": "over the population of tasks like these (tasks and trials both vary)",
    "suite": "on this fixed suite of tasks (trial noise only)",
}
# Below this many tasks the "tasks like these" interval rests on too few tasks to trust its
# width; reports warn.
SMALL_SUITE = 8


class SuiteInterval(_Model):
    """A suite figure with a score (Wilson) interval at an effective sample size.

    n_eff = m(1 - m) / Var(m), where Var(m) is the variance of the suite mean m for the
    estimand: between-task spread over T tasks ("tasks", t quantile on T - 1 df) or trial
    noise only ("suite": each task's exact estimator variance under Binomial(n, p), p
    smoothed as (c + 1/2) / (n + 1), normal quantile). n_eff is capped at (clean trials) / k,
    so a suite where every task passes every trial still gets a width from its trials."""

    metric: Metric = Field(description="pass@1, pass@k or pass^k.")
    k: int = Field(ge=1, description="k of the metric (1 for pass@1).")
    estimand: Estimand = Field(description="tasks: tasks like these; suite: this fixed suite.")
    estimate: float = Field(description="Mean per-task estimate over the tasks used.")
    low: float = Field(description="Lower bound.")
    high: float = Field(description="Upper bound.")
    conf: float = Field(gt=0, lt=1, description="Two-sided confidence level.")
    n_tasks: int = Field(ge=1, description="Tasks averaged (n >= k, plus short tasks when counted).")
    n_eff: float | None = Field(description="Effective sample size of the Wilson interval; null when one task "
                                "leaves the between-task spread unknown (the interval is then [0, 1]).")
    excluded: list[str] = Field(description="Tasks with n < k (unmeasured included), not averaged.")
    counted_short: list[str] = Field(default_factory=list, description="Tasks with 0 < n < k counted at a fixed "
                                     "value (a gate's worst case) instead of left out.")


class BootstrapResult(_Model):
    """A suite-level figure with a percentile cluster-bootstrap interval (tasks resampled)."""

    metric: Metric = Field(description="pass@1, pass@k or pass^k.")
    k: int = Field(ge=1, description="k of the metric (1 for pass@1).")
    estimate: float = Field(description="The figure on the original tasks.")
    low: float = Field(description="Lower percentile bound.")
    high: float = Field(description="Upper percentile bound.")
    conf: float = Field(gt=0, lt=1, description="Confidence level.")
    n_boot: int = Field(ge=1, description="Bootstrap replicates.")
    seed: int = Field(description="Seed of the resampling RNG; same seed, same interval.")
    n_tasks: int = Field(ge=1, description="Tasks resampled (those with n >= k).")
    excluded: list[str] = Field(description="Tasks left out because n < k (unmeasured included).")


class Buckets(_Model):
    """Tasks by how reliably they pass across their clean trials."""

    always: list[str] = Field(description="Every clean trial passed.")
    sometimes: list[str] = Field(description="At least one pass and one fail: the flaky ones.")
    never: list[str] = Field(description="Every clean trial failed.")
    unmeasured: list[str] = Field(description="No clean trial at all.")


class TaskDelta(_Model):
    """Per-task change from run A to run B (delta = B - A)."""

    task_id: str = Field(description="Task id.")
    n_a: int = Field(ge=1, description="Clean trials in run A.")
    c_a: int = Field(ge=0, description="Passes in run A.")
    n_b: int = Field(ge=1, description="Clean trials in run B.")
    c_b: int = Field(ge=0, description="Passes in run B.")
    pass1_a: float = Field(description="c_a / n_a.")
    pass1_b: float = Field(description="c_b / n_b.")
    delta_pass1: float = Field(description="pass1_b - pass1_a.")
    delta_pass_hat_k: dict[int, float | None] = Field(
        description="pass^k(B) - pass^k(A) per k; null when either run has n < k for this task."
    )


class SuiteDelta(_Model):
    """Suite-level change from A to B on the common tasks, with the interval that inverts
    the stratified permutation test (see Comparison)."""

    metric: Metric = Field(description="pass@1, pass@k or pass^k.")
    k: int = Field(ge=1, description="k of the metric (1 for pass@1).")
    a: float = Field(description="Run A's figure over the tasks used here.")
    b: float = Field(description="Run B's figure over the same tasks.")
    delta: float = Field(description="b - a (mean of per-task deltas).")
    low: float = Field(description="Lower bound of the interval of delta: delta minus the noise floor.")
    high: float = Field(description="Upper bound of the interval of delta: delta plus the noise floor.")
    noise_floor: float = Field(ge=0, description="Half-width of the interval: how far delta moves when nothing "
                               "changed (each task's pooled trials dealt back at random), at the family's "
                               "max-T critical value. 0 when no task used here can move.")
    p_value: float = Field(ge=0, le=1, description="Two-sided permutation p-value, adjusted (max-T) for every "
                           "metric and k in the comparison.")
    beyond_noise: bool = Field(description="|delta| beyond the noise floor; the same as the interval excluding 0 "
                               "and as p_value <= 1 - conf.")
    conf: float = Field(gt=0, lt=1, description="Confidence level.")
    n_tasks: int = Field(ge=1, description="Common measured tasks with n >= k in both runs.")
    excluded: list[str] = Field(description="Common measured tasks with n < k in either run.")


class SignificanceTest(_Model):
    """A paired test of 'A and B have the same per-task pass rate'."""

    method: Literal["stratified_permutation", "none"] = Field(
        description="stratified_permutation: each task's clean trials of A and B pooled and dealt back "
        "with their sizes (seeded deals), the statistic studentized and max-T adjusted over the family; "
        "none when no task's pooled trials mix passes and failures (nothing can move)."
    )
    statistic: float = Field(description="Mean per-task pass@1 delta (B - A).")
    p_value: float = Field(ge=0, le=1, description="Two-sided permutation p-value, adjusted for the family.")
    n_informative: int = Field(
        ge=0, description="Tasks whose pooled trials mix passes and failures (the only ones that can move)."
    )
    detail: str = Field(description="One line a report can print.")


class Comparison(_Model):
    """Paired comparison of run A (baseline) and run B (candidate) on their common tasks."""

    n_common: int = Field(ge=0, description="Tasks measured in both runs (the ones compared).")
    only_in_a: list[str] = Field(description="Tasks present only in run A.")
    only_in_b: list[str] = Field(description="Tasks present only in run B.")
    unmeasured: list[str] = Field(
        description="Common tasks without a clean trial in at least one run; not compared."
    )
    per_task: list[TaskDelta] = Field(description="Per-task deltas, in run A's order.")
    suite: list[SuiteDelta] = Field(
        description="pass@1, then pass@k and pass^k for each k >= 2: the family tested together."
    )
    test: SignificanceTest = Field(description="The pass@1 member of the family, as one line.")
    n_perm: int = Field(ge=0, description="Seeded deals drawn.")
    seed: int = Field(description="Seed of the deals; same runs and seed, same p-values.")
    conf: float = Field(gt=0, lt=1, description="Confidence level of the intervals (alpha = 1 - conf).")
    best_p: float = Field(ge=0, le=1, description="The smallest pass@1 p-value any outcome of these tasks and "
                          "trial counts could give (before adjustment); above alpha, no difference here can be "
                          "significant, however large.")


class DriftResult(_Model):
    """Do outcomes depend on the trial index (e.g. a warming cache, a degrading host)?"""

    statistic: float | None = Field(
        description="late_rate - early_rate (pooled); negative means late trials pass less."
    )
    p_value: float | None = Field(
        description="Two-sided within-task permutation p-value for statistic; null if untestable."
    )
    early_rate: float | None = Field(description="Pass rate over the first half (n // 2) of each task's trials.")
    late_rate: float | None = Field(description="Pass rate over the remaining trials of each task.")
    n_tasks: int = Field(ge=0, description="Tasks with n >= 2 used by the permutation test.")
    n_perm: int = Field(ge=0, description="Monte Carlo permutations drawn.")
    seed: int = Field(description="Seed of the permutation RNG.")
    cochran_q: float | None = Field(description="Cochran's Q over trial indices; null if untestable.")
    cochran_df: int | None = Field(description="Degrees of freedom of Q (trials per task - 1).")
    cochran_p_value: float | None = Field(description="Chi-square p-value of Q.")
    cochran_n_tasks: int = Field(ge=0, description="Tasks (blocks) with the common n used by Q.")
    verdict: str = Field(description="One line a report can print.")


class OverdispersionResult(_Model):
    """Are failures concentrated in some tasks, beyond what a single pass rate explains?"""

    statistic: float | None = Field(description="Tarone's Z; large positive means overdispersion.")
    p_value: float | None = Field(description="One-sided p-value of Z (upper tail of the normal).")
    chi2: float | None = Field(description="Pearson's chi-square heterogeneity statistic sum (c - n p)^2 / (n p q) "
                                "(each task divided by its own n).")
    chi2_df: int | None = Field(description="Degrees of freedom of chi2 (measured tasks - 1).")
    chi2_p_value: float | None = Field(description="Upper-tail chi-square p-value.")
    pooled_rate: float | None = Field(description="All passes / all clean trials.")
    n_tasks: int = Field(ge=0, description="Measured tasks used.")
    verdict: str = Field(description="One line a report can print.")
