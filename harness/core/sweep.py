"""Sweeps (pure): how much does the score depend on the envelope itself?

One suite under several envelopes, same tasks, same seeds; every envelope is compared with
the most generous one (paired, per task). ``--headroom`` scales the kill limits (memory
ceiling, CPU quota, timeouts) of one profile by factors, to find the smallest headroom at
which envelope failures (OOM kills, timeouts) disappear and the score stops rising. Running
the sweep is ``harness.engine.sweep``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.core.aggregate import task_outcomes
from harness.core.estimator import suite_interval, wilson_interval
from harness.core.paired import compare_runs
from harness.model.attempt import AttemptRecord
from harness.model.outcomes import TaskOutcomes
from harness.model.profile import Profile
from harness.model.run import RunRecord


def scale_profile(p: Profile, factor: float) -> tuple[Profile, str]:
    """The profile with its kill limits scaled by ``factor`` (memory ceiling, CPU quota,
    timeouts). The cpuset is the guaranteed allocation and stays; a quota beyond it is
    capped at the cpuset size (said in the returned note)."""
    if factor <= 0:
        raise ValueError(f"headroom factor {factor} must be > 0")
    data = p.model_dump()
    note = ""
    cpus = round(p.cpus * factor, 4)
    if cpus > p.cores:
        note = f"CPU quota capped at the {p.cores}-core cpuset (asked {cpus:g})"
        cpus = float(p.cores)
    data.update(
        name=f"{p.name}-x{factor:g}",
        description=f"{p.name} with kill limits x{factor:g}",
        cpus=cpus,
        memory=int(p.memory * factor),
        timeouts={k: v * factor for k, v in p.timeouts.model_dump().items()},
        override_scale=p.override_scale * factor,
    )
    return Profile.model_validate(data), note


def generosity(p: Profile) -> tuple:
    """Order envelopes from starved to generous: CPU quota, memory, agent timeout, pids."""
    return (p.cpus, p.memory, p.timeouts.agent, p.pids)


@dataclass
class ProfileResult:
    """One envelope's run in a sweep, summarised from its stored attempts."""

    profile: Profile
    run_id: str
    note: str = ""
    tasks: list[TaskOutcomes] = field(default_factory=list)
    attempts: list[AttemptRecord] = field(default_factory=list)
    ks: list[int] = field(default_factory=lambda: [1])

    def outcomes(self) -> list[TaskOutcomes]:
        return self.tasks


def summarize_profile(res: ProfileResult, ks: list[int], seed: int = 0) -> dict[str, Any]:
    """pass@1 and pass^k with CIs, failure kinds, timeouts, OOM kills, discarded share."""
    outs = [o for o in res.outcomes() if o.n > 0]
    clean = [a for a in res.attempts if a.verdict == "clean"]
    kinds: dict[str, int] = {}
    for a in clean:
        if a.outcome != "pass":
            kinds[a.failure_kind or "unknown"] = kinds.get(a.failure_kind or "unknown", 0) + 1
    n = sum(o.n for o in outs)
    c = sum(o.c for o in outs)
    out: dict[str, Any] = {
        "profile": res.profile.name,
        "run_id": res.run_id,
        "note": res.note,
        "envelope": {
            "cpus": res.profile.cpus,
            "cores": res.profile.cores,
            "memory": res.profile.memory,
            "agent_timeout_s": res.profile.timeouts.agent,
            "pids": res.profile.pids,
        },
        "clean_trials": n,
        "failure_kinds": kinds,
        "timeouts": kinds.get("timeout", 0),
        "oom_killed": kinds.get("oom_killed", 0),
        "oom_kills_total": sum(a.oom_kills or 0 for a in res.attempts),
        "discarded_share": (len(res.attempts) - len(clean)) / len(res.attempts) if res.attempts else None,
        "unmeasured_slots": sum(len(t.unmeasured) for t in res.tasks),
        "metrics": {},
    }
    if not outs:
        return out
    pooled = wilson_interval(c, n)
    out["pooled_pass_rate"] = {"estimate": c / n, "low": pooled.low, "high": pooled.high}
    for metric, k in [("pass@1", 1)] + [("pass^k", k) for k in ks if k > 1]:
        key = "pass@1" if k == 1 else f"pass^{k}"
        usable = [o for o in outs if o.n >= k]
        if len(usable) < 1:
            continue
        try:
            b = suite_interval(usable, metric, k=None if k == 1 else k)
            out["metrics"][key] = {"estimate": b.estimate, "low": b.low, "high": b.high, "n_tasks": b.n_tasks}
        except ValueError as e:
            out["metrics"][key] = {"error": str(e)}
    return out


def paired_vs_reference(res: ProfileResult, ref: ProfileResult, ks: list[int], seed: int = 0) -> dict[str, Any] | None:
    """Paired difference (this - reference) per task, with a bootstrap CI and a paired test."""
    if res.run_id == ref.run_id:
        return None
    try:
        cmp = compare_runs(ref.outcomes(), res.outcomes(), ks, seed=seed)
    except ValueError as e:
        return {"n_common": 0, "error": str(e).removeprefix("compare_runs: ")}
    if not cmp.suite:
        return {"n_common": cmp.n_common, "error": "no common measured tasks"}
    p1 = cmp.suite[0]
    out = {
        "reference": ref.profile.name,
        "n_common": cmp.n_common,
        "delta_pass1": p1.delta,
        "low": p1.low,
        "high": p1.high,
        "test": cmp.test.method,
        "p_value": cmp.test.p_value,
        "points": round(100 * p1.delta, 1),
    }
    for d in cmp.suite[1:]:
        if d.metric == "pass^k":
            out[f"delta_pass^{d.k}"] = {"delta": d.delta, "low": d.low, "high": d.high}
    return out


def profile_result(run: RunRecord, attempts: list[AttemptRecord], note: str = "") -> ProfileResult:
    """One envelope's result from its stored run and attempts."""
    profile = Profile.model_validate(run.profile_json)
    return ProfileResult(profile=profile, run_id=run.id, note=note, tasks=task_outcomes(run, attempts), attempts=attempts,
                         ks=list(run.ks))
