"""The report of one run: every figure ``harness report`` shows, recomputed from the stored
attempts. ``--format json`` prints this model (fields with ``@`` or ``^`` in their JSON name,
such as ``pass@1``, are aliases); the other formats render it. Only the clean attempt of
each slot is scored; unmeasured slots are listed, never counted.

Estimand: a suite interval is a percentile cluster bootstrap over tasks, i.e. about the
population of tasks like these; a per-task interval (Wilson) is about that task's trials.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypedDict

from harness.model.estimates import Buckets, DriftResult, OverdispersionResult
from harness.model.run import RunIdentity

REPORT_SCHEMA = "harness.report/1"


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)


class RunInfo(_M):
    id: str = Field(..., description="Run id.")
    status: str = Field(..., description="running, complete, interrupted or failed.")
    created_at: str | None = Field(None, description="ISO time the run was planned (UTC).")
    finished_at: str | None = Field(None, description="ISO time it last stopped (UTC).")
    seed: int = Field(0, description="Run seed (slot seeds derive from it).")
    concurrency: int = Field(1, description="Attempts at once.")
    max_reruns: int | None = Field(None, description="Reruns of a discarded slot before it ends unmeasured.")
    sweep_id: str | None = Field(None, description="The sweep this run belongs to.")
    note: str = Field("", description="Free text given at run time.")


class ReportIdentity(RunIdentity):
    """The run's identity, with where the suite was and its hash."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    suite_path: str = Field("", description="Where the suite directory was.")
    identity_hash: str = Field("", description="RunIdentity.hash() as stored.")
    agent_name: str = Field("", description="The suite's named agent the run used (--agent NAME), if any.")
    secrets: list[str] = Field(default_factory=list, description="Names of the secrets the model gateway held (never their values).")


class Interval(_M):
    """A suite figure with its two 95% intervals (harness.core.estimator.suite_interval)."""

    estimate: float = Field(..., description="The figure on the measured tasks.")
    low: float = Field(..., description="Lower bound over the population of tasks like these (tasks and trials vary).")
    high: float = Field(..., description="Upper bound over the population of tasks like these.")
    suite_low: float = Field(..., description="Lower bound on this fixed suite (trial noise only).")
    suite_high: float = Field(..., description="Upper bound on this fixed suite (trial noise only).")
    n_eff: float | None = Field(None, description="Effective sample size of the 'tasks like these' interval (null: one task).")
    n_tasks: int = Field(..., description="Tasks averaged (those with n >= k).")
    excluded: list[str] = Field(default_factory=list, description="Tasks left out because n < k (unmeasured included).")
    short: list[str] = Field(default_factory=list, description="Measured tasks with 0 < n < k, left out of this k.")
    sensitivity: float | None = Field(None, description="The figure with the short tasks counted as 0 (present when there are any).")
    se_clustered: float | None = Field(None, description="pass@1 only: standard error clustered by task.")


class UnmeasuredSlot(_M):
    task: str
    slot: int
    attempts: int = Field(..., description="Discarded attempts of the slot.")
    reasons: list[str] = Field(default_factory=list, description="SLA rules that discarded them.")
    breaches: list[str] = Field(default_factory=list, description="The last attempt's breached rules, measured vs threshold.")
    message: str = Field("", description="The note on the attempt that spent the budget.")


class PendingSlot(_M):
    task: str
    slot: int


class TokenUse(_M):
    """Model calls, tokens and cost of a set of attempts. A token sum counts the calls that
    reported usage; null means no call did (never 0 for unknown)."""

    attempts: int = Field(0, description="Attempts that had a model gateway.")
    calls: int = Field(0, description="Model calls they made.")
    calls_without_usage: int = Field(0, description="Successful calls whose response reported no token usage (not in the sums).")
    calls_unrecorded: int = Field(0, description="Calls not recorded (beyond the per-attempt record cap, or a record that would not validate): counted, not in the token sums.")
    tokens_in: int | None = Field(None, description="Input tokens as reported (null: none reported).")
    tokens_out: int | None = Field(None, description="Output tokens as reported (null: none reported).")
    tokens_cached: int | None = Field(None, description="Cached input tokens as reported (null: none reported).")
    cost: float | None = Field(None, description="USD under the price table; null when there is no table, a model has no "
                               "price, or some call's usage is unknown (a partial sum is never shown as the cost).")


class Usage(_M):
    """What the model gateway recorded for a task's (or the run's) attempts."""

    spent: TokenUse = Field(..., description="Every attempt, discarded ones included (discarded attempts spent tokens too).")
    scored: TokenUse = Field(..., description="The clean attempt of each slot: the attempts that reach the estimator.")
    errors: dict[str, int] = Field(default_factory=dict, description="Upstream errors by kind over every attempt: rate_limited, "
                                   "server_errors, timeouts, connection_errors, refused.")
    retries: int = Field(0, description="Times the gateway retried a call upstream.")
    wait_s: float = Field(0.0, description="Seconds agents waited on the model (summed over attempts).")
    queued_s: float = Field(0.0, description="Seconds calls were queued behind the gateway's caps (summed).")
    agent_wall_s: float | None = Field(None, description="Agent wall seconds of those attempts (null: not measured).")
    working_s: float | None = Field(None, description="agent_wall_s - wait_s: time the agents spent not waiting on the model.")
    discarded_upstream: int = Field(0, description="Attempts discarded by an upstream SLA rule (the model API failed the agent).")
    models: list[str] = Field(default_factory=list, description="Models named, first-seen order.")


class RunUsage(Usage):
    """The run's usage, with how much of it a price table covers."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    priced: bool = Field(False, description="A price table was given (--prices or $HARNESS_PRICES).")
    tasks: int = Field(0, description="Tasks with at least one attempt through the gateway.")
    tasks_priced: int = Field(0, description="Of those, tasks whose every attempt has a known cost.")
    cost_priced_tasks: float | None = Field(None, description="Spent cost summed over the priced tasks only: the run's cost "
                                            "only when tasks_priced == tasks (then it equals spent.cost).")
    unpriced_models: list[str] = Field(default_factory=list, description="Models called that the price table has no price for.")


# A report of 10^5 attempts has 10^4 task rows and their failed trials: as typed dicts they
# are checked field by field as models would be (unknown keys refused), in half the time,
# and stay the plain data every renderer reads.
_ROW = ConfigDict(extra="forbid")


class FailedTrial(TypedDict):
    """A clean trial that failed: which attempt, how, and the grader's one-line reason."""

    __pydantic_config__ = _ROW  # type: ignore[misc]
    slot: int
    attempt_id: Annotated[int | None, Field(description="`harness show ID` opens it.")]
    failure_kind: Annotated[str, Field(description="wrong_state, crashed, timeout, ...")]
    reason: Annotated[str, Field(description="The grader's first failing check (or the error), capped at 300 characters.")]


class TaskRow(TypedDict):
    """One task: its slots, counts and per-task estimates."""

    __pydantic_config__ = _ROW  # type: ignore[misc]
    task: str
    marks: Annotated[str, Field(description="One mark per slot: ✓ pass, ✗ fail, · unmeasured, ? not run.")]
    outcomes: Annotated[list[bool], Field(description="Clean outcomes in trial order.")]
    n: Annotated[int, Field(description="Clean trials.")]
    c: Annotated[int, Field(description="Passing clean trials.")]
    slots: Annotated[int, Field(description="Slots (trials per task).")]
    pass1: Annotated[float | None, Field(description="c / n.")]
    pass1_ci: Annotated[list[float] | None, Field(description="Wilson interval of the task's pass rate (over its trials).")]
    metrics: Annotated[dict[str, float | None], Field(description="pass@1, pass@k and pass^k by name.")]
    failure_kinds: Annotated[dict[str, int], Field(description="Failure kind -> clean failing trials.")]
    failures: Annotated[int, Field(description="n - c.")]
    clean_exit_wrong_state: Annotated[int, Field(description="Trials that exited 0 and left a wrong state.")]
    bucket: Annotated[str, Field(description="always, sometimes, never or unmeasured.")]
    attempts: Annotated[int, Field(description="Attempts of the task, discarded included.")]
    discarded: Annotated[int, Field(description="Discarded attempts.")]
    discard_reasons: Annotated[dict[str, int], Field(description="Reason -> discarded attempts.")]
    unmeasured: list[UnmeasuredSlot]
    pending: Annotated[int, Field(description="Slots not finished.")]
    wall_s: Annotated[float, Field(description="Wall seconds of every attempt of the task.")]
    usage: Annotated[Usage | None, Field(description="Model calls, tokens, upstream errors, waiting time and cost (null: no gateway).")]
    failed_trials: Annotated[list[FailedTrial], Field(description="The clean failing trials, with the grader's reason.")]


class KFigures(_M):
    k: int
    n_tasks: int = Field(..., description="Tasks with n >= k.")
    excluded: list[str] = Field(default_factory=list)
    pass_at_k: Interval | None = Field(None, alias="pass@k", description="Mean per-task pass@k with its interval.")
    pass_hat_k: Interval | None = Field(None, alias="pass^k", description="Mean per-task pass^k with its interval.")
    naive_pass_at_k: float | None = Field(None, alias="naive_pass@k", description="1-(1-mean p)^k: biased, for contrast only.")
    naive_pass_hat_k: float | None = Field(None, alias="naive_pass^k", description="(mean p)^k: biased, for contrast only.")


class SuiteFigures(_M):
    n_tasks: int
    discards_as_failures: dict[str, Any] | None = Field(None, description=(
        "The figures (pass@1, pass@k, pass^k by name) had every slot with a discarded attempt (interruptions aside) "
        "failed, with the number of such slots: a bound an agent cannot raise by having attempts discarded. Null "
        "when none was discarded."))
    measured: int = Field(..., description="Tasks with at least one clean trial.")
    unmeasured_tasks: list[str] = Field(default_factory=list)
    pass1: Interval | None = Field(None, alias="pass@1")
    by_k: list[KFigures] = Field(default_factory=list)
    method: dict[str, Any] = Field(default_factory=dict, description="Aggregation, interval method, replicates, seed.")


class AttemptCounts(_M):
    total: int
    clean: int
    discarded: int


class SelectionBias(_M):
    task: str
    discarded: int
    attempts: int
    rate: float
    others_rate: float
    p_value: float = Field(..., description="One-sided Fisher exact test against the other tasks.")
    reasons: dict[str, int] = Field(default_factory=dict)
    message: str


class TaskDiscards(_M):
    discarded: int
    attempts: int
    reasons: dict[str, int] = Field(default_factory=dict)


class Discards(_M):
    total: int
    by_reason: dict[str, int] = Field(default_factory=dict)
    by_scope: dict[str, int] = Field(default_factory=dict, description="Discarded attempts by the scope of their breached "
                                     "rules: host, envelope, upstream (an attempt breaching two scopes counts in both).")
    by_task: dict[str, TaskDiscards] = Field(default_factory=dict)
    selection_bias: list[SelectionBias] = Field(default_factory=list)


class Overdispersion(OverdispersionResult):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    summary: str = Field("", description="One line for the report.")


class NodeRow(_M):
    """One machine a run's attempts ran on."""

    node: str = Field(..., description="hostname, or hostname/node-id prefix for a Ray node.")
    attempts: int
    clean: int
    discarded: int
    facts: dict[str, Any] = Field(default_factory=dict, description="Its facts that change what a trial measures (cgroup version, kernel, ...).")


class Nodes(_M):
    """Where a run's attempts ran (from each attempt's own node facts)."""

    executor: str = Field(..., description="local or ray.")
    nodes: list[NodeRow]
    differ: list[str] = Field(default_factory=list, description=(
        "Facts that differ between the machines of the run's scored attempts: such a run mixes environments "
        "(flagged here; `compare` refuses it without --allow-mismatch)."))


class Report(_M):
    """Everything a report shows (see the module docstring)."""

    schema_: str = Field(REPORT_SCHEMA, alias="schema", description="Format id of this document.")
    run: RunInfo
    identity: ReportIdentity
    ks: list[int] = Field(..., description="k values fixed for the run (1 always included).")
    gate_k: int = Field(..., description="The gate's k: JUnit fails a task whose pass^k < 1.")
    trials: int
    n_tasks: int
    not_run: dict[str, str] = Field(default_factory=dict, description="Tasks that could not run here (no image, refused): in no figure.")
    conf: float
    tasks: list[TaskRow] = Field(..., description="Worst first: unmeasured, then by pass@1, then pass^k.")
    suite: SuiteFigures
    buckets: Buckets
    attempts: AttemptCounts
    discards: Discards
    unmeasured: list[UnmeasuredSlot] = Field(default_factory=list)
    pending: list[PendingSlot] = Field(default_factory=list)
    drift: DriftResult
    overdispersion: Overdispersion
    usage: RunUsage | None = Field(None, description="Model calls, tokens, upstream errors, waiting time and cost of the run "
                                   "(null: no attempt went through a model gateway).")
    nodes: Nodes | None = Field(None, description="The machines the attempts ran on (null: records older than per-attempt node facts).")
    late_attempts: int = Field(0, description="Records of attempts that arrived after their attempt was recorded lost (evidence, never scored).")
    warnings: list[str] = Field(default_factory=list, description="Most important first.")

    def data(self) -> dict[str, Any]:
        """The report as JSON-ready data, with the JSON names (``pass@1``, ``schema``)."""
        return self.model_dump(mode="json", by_alias=True)
