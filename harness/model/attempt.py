"""The attempt record: one container execution of one slot, immutable once made.

The attempt pipeline returns one (it never raises); the store maps it to a row and never
deletes it. Only a ``clean`` attempt reaches the estimator; a ``discarded`` one keeps the
SLA rules that discarded it. Counters are flattened for queries and kept whole in
``counters`` / ``host_counters``; ``None`` always means "not measured", never zero.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.model.counters import Sample

Verdict = Literal["clean", "discarded"]
Outcome = Literal["pass", "fail"]
FAILURE_KINDS = ("wrong_state", "crashed", "timeout", "oom_killed", "ungradable")

# the counters of the agent phase copied to their own columns (CounterDelta field names)
COUNTER_COLUMNS = (
    "cpu_usage_us", "nr_periods", "nr_throttled", "throttled_us", "throttled_share", "memory_peak",
    "memory_limit_hits", "memory_high_events", "oom_kills", "pids_peak", "pids_limit_hits",
    "psi_cpu_some_us", "psi_memory_some_us", "psi_io_some_us",
)


class AttemptRecord(BaseModel):
    """One attempt of one slot (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    id: int | None = Field(None, description="Store id (None until stored).")
    run_id: str = Field(..., description="The run.")
    task_id: str = Field(..., description="The task.")
    slot: int = Field(..., ge=0, description="Trial index within the task.")
    attempt_no: int = Field(..., ge=1, description="Attempt number within the slot (1, 2, ... across reruns and resumes).")
    seed: int = Field(..., description="The slot's seed (same for every attempt of the slot).")
    verdict: Verdict = Field(..., description="clean: reaches the estimator; discarded: kept as evidence, slot rerun.")
    reasons: list[str] = Field(default_factory=list, description="Breached SLA rules (discarded attempts).")
    rules: list[dict[str, Any]] = Field(default_factory=list, description="Every SLA rule evaluated: rule, scope, value, threshold, breached, detail.")
    outcome: Outcome | None = Field(None, description="pass / fail of a graded attempt (only a clean one is scored).")
    failure_kind: str | None = Field(None, description="wrong_state, crashed, timeout, oom_killed or ungradable.")
    grade_status: str | None = Field(None, description="graded, ungradable or broken (None: not graded).")
    grade_reason: str | None = Field(None, description="One line: the first failing check, or why the state could not be graded.")
    grade_checks: list[dict[str, Any]] = Field(default_factory=list, description="The grader's checks (name, kind, passed, detail).")
    state_diff: dict[str, Any] = Field(default_factory=dict, description="Final state vs fixture, capped (see harness.model.grade.StateDiff).")
    grade_wall_s: float | None = Field(None, description="Seconds the grader ran in the sandbox.")
    reward: float | None = Field(None, description="The verifier's reward (verifier-graded tasks); pass = reward >= the task's threshold.")
    rewards: dict[str, float] = Field(default_factory=dict, description="Every value of a reward.json (a flat JSON object).")
    grade_envelope: dict[str, Any] = Field(default_factory=dict, description="The grade envelope read back from the kernel.")
    exit_code: int | None = Field(None, description="The agent's exit status (None: not read).")
    terminated_cleanly: bool = Field(False, description="The agent exited 0 before its timeout.")
    timed_out: bool = Field(False, description="The agent's wall-clock timeout fired.")
    wall_s: float = Field(0.0, ge=0, description="Seconds from sandbox start to the record, grading included.")
    agent_wall_s: float | None = Field(None, description="Seconds the agent ran.")
    setup_wall_s: float | None = Field(None, description="Seconds the setup phase ran.")
    cpuset: str = Field("", description="Exclusive cores leased to the attempt, e.g. '1'.")
    concurrent: int = Field(1, ge=0, description="Attempts in flight when this one started (itself included).")
    image: str = Field("", description="Image the sandbox ran.")
    container: str = Field("", description="Container name (removed after the attempt).")
    envelope: dict[str, Any] = Field(default_factory=dict, description="The profile values this attempt ran under.")
    envelope_applied: dict[str, Any] = Field(default_factory=dict, description="Limits read back from the kernel.")
    envelope_notes: list[str] = Field(default_factory=list, description="Parts of the envelope that could not be enforced here "
                                      "(e.g. a writable root's size on a storage driver without quotas).")
    requested_envelope: dict[str, Any] = Field(default_factory=dict, description="What the task itself asked for (a Harbor "
                                               "task's [environment]) when --profile replaced it.")
    services: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Per-attempt services: name -> image, "
                                                "limits read back and counters over the agent phase (their CPU is not foreign).")
    model_calls: list[dict[str, Any]] = Field(default_factory=list, description="Calls the agent made through the model "
                                              "gateway (harness.model.gateway.ModelCall), in order.")
    upstream: dict[str, Any] = Field(default_factory=dict, description="The calls summed (UpstreamSummary): tokens as reported "
                                     "(null = not reported), upstream errors, waiting time. Empty: the attempt had no gateway.")
    egress: list[dict[str, Any]] = Field(default_factory=list, description="Connections asked of the egress proxy "
                                         "(allowlist policy): host, port, allowed or refused and why (EgressEvent).")
    egress_summary: dict[str, Any] = Field(default_factory=dict, description="allowed / refused / dropped counts of `egress`.")
    cpu_usage_us: int | None = None
    nr_periods: int | None = None
    nr_throttled: int | None = None
    throttled_us: int | None = None
    throttled_share: float | None = None
    memory_peak: int | None = None
    memory_max: int | None = None
    memory_limit_hits: int | None = None
    memory_high_events: int | None = None
    oom_kills: int | None = None
    pids_peak: int | None = None
    pids_max: int | None = None
    pids_limit_hits: int | None = None
    psi_cpu_some_us: int | None = None
    psi_memory_some_us: int | None = None
    psi_io_some_us: int | None = None
    foreign_cpu_share: float | None = None
    steal_share: float | None = None
    host_psi_cpu: float | None = None
    host_psi_memory: float | None = None
    host_psi_io: float | None = None
    mem_available_min: int | None = None
    counters: dict[str, Any] = Field(default_factory=dict, description="cgroup deltas of the agent phase (CounterDelta).")
    host_counters: dict[str, Any] = Field(default_factory=dict, description="Host contention over the agent phase (HostDelta).")
    monitor_errors: int | None = Field(None, description="Saturation samples lost to a read error.")
    error: str | None = Field(None, description="What went wrong (infrastructure), or notes (export refusals, unmeasured slot).")
    artifacts: str = Field("", description="Folder holding stdout, stderr and the exported final state.")
    node: dict[str, Any] = Field(default_factory=dict, description=(
        "The machine the attempt ran on (executor, node id, hostname, kernel, cgroup version, CPU model, engine version, "
        "image id and inputs hash), read there."))
    phases: list[dict[str, Any]] = Field(default_factory=list, description=(
        "The attempt's phases as the controller timed them, in order: name (gateway, lane, services, sandbox, setup, "
        "agent, stop, export, grade, verifier-sandbox, halt: its processes killed, remove), start_s (seconds after started_at, the controller's monotonic "
        "clock) and wall_s. Empty in records made before phases were kept."))
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    samples: list[Sample] = Field(default_factory=list, exclude=True, description="The saturation log (stored in its own table).")

    @property
    def interrupted(self) -> bool:
        """Cut short by the controller being stopped: evidence, never charged to the slot."""
        return "interrupted" in self.reasons
