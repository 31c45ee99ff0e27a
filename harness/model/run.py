"""A run and its identity: what makes two runs comparable, defined once.

A run's scores are only meaningful beside its identity: the suite (by content hash), the
image (by digest), the agent command, the envelope (the whole profile), the harness
version and the cgroup version of the host that measured it. :class:`RunIdentity` is that
definition; its :meth:`~RunIdentity.hash` is stored with the run, :meth:`~RunIdentity.differences`
is what ``compare`` and ``gate --baseline`` refuse or warn on, and ``--resume`` refuses a
run whose identity the current machine would change.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

RunStatus = Literal["running", "complete", "interrupted", "failed"]
MAX_TRIALS = 10_000  # trial slots per task a run may have (a suite's trials, --trials)
MAX_SLOTS = 10_000_000  # tasks x trials of one run: every reader holds a view of each slot


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: d}


def dict_diff(a: dict | None, b: dict | None, limit: int = 8) -> str:
    """'key a vs b; ...' for the leaves that differ (nested keys dotted)."""
    fa, fb = _flatten(a or {}), _flatten(b or {})
    keys = sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))
    parts = [f"{k} {fa.get(k)!r} vs {fb.get(k)!r}" for k in keys[:limit]]
    if len(keys) > limit:
        parts.append(f"and {len(keys) - limit} more")
    return "; ".join(parts)


def _subs(s: dict[str, str]) -> str:
    return ", ".join(f"{k} -> {v}" for k, v in sorted(s.items())) or "none"


def _profile_norm(profile_json: dict[str, Any]) -> dict[str, Any]:
    """A stored profile with the defaults of fields added since it was stored filled in, so a
    profile stored by an older harness equals the same profile stored now."""
    from harness.model.profile import Profile

    try:
        return Profile.model_validate(profile_json).model_dump(mode="json")
    except ValueError:
        return dict(profile_json or {})


class RunIdentity(_M):
    """Everything that makes two runs comparable."""

    suite: str = Field(..., description="Suite name.")
    suite_hash: str = Field(..., description="sha256 over the suite directory's files.")
    image: str = Field(..., description="Image the trials ran in.")
    image_digest: str = Field("", description="Its digest (or image id when it has no repo digest).")
    agent_cmd: list[str] = Field(default_factory=list, description="The agent command.")
    profile: str = Field(..., description="Profile name.")
    profile_json: dict[str, Any] = Field(default_factory=dict, description="The whole profile: envelope, network, SLA.")
    harness_version: str = Field(..., description="Harness version.")
    cgroup_version: str = Field("", description="cgroup version of the host (1, 2, 1 (hybrid) ...).")
    host: dict[str, Any] = Field(default_factory=dict, description="Host facts: kernel, CPU model, cores, memory.")
    images: dict[str, str] = Field(default_factory=dict, description="Task id -> image digest, for tasks with their own image.")
    substitutions: dict[str, str] = Field(
        default_factory=dict, description="Foreign base image -> the local image it was built FROM instead (offline builds).")
    task_overrides: bool = Field(True, description="Tasks' own envelopes (overrides, Harbor [environment]) were applied.")
    adjustments: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Task id -> how its own envelope was fitted to this machine (cores, cpus, note).")
    agent_env: dict[str, str] = Field(default_factory=dict, description="Environment of a named agent (--agent NAME).")
    upstreams: dict[str, str] = Field(default_factory=dict, description="Model provider -> the base URL the gateway forwarded to.")

    def hash(self) -> str:
        """16 hex digits over what must be equal for scores to be comparable (host facts aside)."""
        parts: list[Any] = [self.suite_hash, self.image_digest, _profile_norm(self.profile_json), self.harness_version,
                            self.cgroup_version, self.agent_cmd]
        if self.images or self.substitutions or not self.task_overrides or self.adjustments:
            parts += [self.images, self.substitutions, self.task_overrides,
                      {t: {k: v for k, v in a.items() if k != "note"} for t, a in self.adjustments.items()}]
        if self.agent_env or self.upstreams:
            parts += [self.agent_env, self.upstreams]
        key = json.dumps(parts, sort_keys=True)
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def differences(self, other: "RunIdentity") -> tuple[list[str], list[str]]:
        """(blocking, warnings) of ``other`` (B) against this identity (A): suite or profile
        differences block a comparison; image, agent, harness, host and cgroup warn."""
        a, b = self, other
        blocking, warns = [], []
        if a.suite != b.suite:
            blocking.append(f"suite differs: A {a.suite!r} vs B {b.suite!r}")
        if a.suite_hash != b.suite_hash:
            blocking.append(f"suite_hash differs: A {a.suite_hash} vs B {b.suite_hash} (a file of the suite directory changed: "
                            "its tasks, fixtures or expectations, or an agent kept there, which is then part of the suite; "
                            "comparing two agents on the same tasks: --allow-mismatch)")
        pa, pb = _profile_norm(a.profile_json), _profile_norm(b.profile_json)
        if pa != pb:
            blocking.append(f"profile differs: A {a.profile!r} vs B {b.profile!r} ({dict_diff(pa, pb)})")
        if a.substitutions != b.substitutions:
            blocking.append(f"base images differ: A {_subs(a.substitutions)} vs B {_subs(b.substitutions)} (a score from a "
                            "substituted base is not the same eval as one from the original)")
        if a.task_overrides != b.task_overrides:
            blocking.append(f"task envelopes: A {'applied' if a.task_overrides else 'replaced by --profile'} vs "
                            f"B {'applied' if b.task_overrides else 'replaced by --profile'}")
        adj_a = {t: {k: v for k, v in x.items() if k != "note"} for t, x in a.adjustments.items()}
        adj_b = {t: {k: v for k, v in x.items() if k != "note"} for t, x in b.adjustments.items()}
        if adj_a != adj_b:
            blocking.append(f"task envelopes fitted to the machine differ: A {adj_a or 'none'} vs B {adj_b or 'none'}")
        if a.images != b.images:
            warns.append(f"task images differ: {dict_diff(a.images, b.images, limit=4)}")
        if a.image_digest != b.image_digest:
            warns.append(f"image digest differs: A {a.image} {a.image_digest or '–'} vs B {b.image} {b.image_digest or '–'}")
        if a.agent_cmd != b.agent_cmd:
            warns.append(f"agent command differs: A {' '.join(a.agent_cmd)!r} vs B {' '.join(b.agent_cmd)!r}")
        if a.agent_env != b.agent_env:
            warns.append(f"agent environment differs: {dict_diff(a.agent_env, b.agent_env, limit=4)}")
        if a.upstreams != b.upstreams:
            warns.append(f"model upstream differs: A {a.upstreams or 'none'} vs B {b.upstreams or 'none'}")
        if a.harness_version != b.harness_version:
            warns.append(f"harness version differs: A {a.harness_version} vs B {b.harness_version}")
        if a.host != b.host:
            warns.append(f"host differs: {dict_diff(a.host, b.host)}")
        if a.cgroup_version != b.cgroup_version:
            warns.append(f"cgroup version differs: A {a.cgroup_version or '–'} vs B {b.cgroup_version or '–'}")
        return blocking, warns


class RunRecord(_M):
    """One stored run: its identity (flat, as stored), its plan and its status."""

    id: str = Field(..., description="Run id, e.g. r20261201-101500-ab12.")
    created_at: dt.datetime | None = Field(None, description="When the run was planned (UTC).")
    finished_at: dt.datetime | None = Field(None, description="When it last stopped (UTC).")
    status: RunStatus = Field("running", description="running, complete, interrupted (resumable) or failed.")
    suite: str
    suite_hash: str
    suite_path: str = ""
    image: str
    image_digest: str = ""
    agent_cmd: list[str] = Field(default_factory=list)
    profile: str
    profile_json: dict[str, Any] = Field(default_factory=dict)
    harness_version: str
    host: dict[str, Any] = Field(default_factory=dict)
    cgroup_version: str = ""
    identity_hash: str = ""
    trials: int = Field(..., ge=1, le=MAX_TRIALS, description="n: trial slots per task.")
    ks: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [1], description="k values fixed before the run.")
    max_reruns: int = Field(..., ge=0, description="Reruns of a discarded slot before it ends unmeasured.")
    seed: int = 0
    concurrency: int = 1
    task_ids: list[str] = Field(default_factory=list)
    sweep_id: str | None = None
    artifacts_dir: str = ""
    note: str = ""
    images: dict[str, str] = Field(default_factory=dict, description="Task id -> image digest (tasks with their own image).")
    substitutions: dict[str, str] = Field(default_factory=dict, description="Foreign base image -> local image it was built FROM.")
    task_bases: dict[str, list[str]] = Field(default_factory=dict, description=(
        "Task id -> which of the substitutions its own images used (the references as written); empty in runs before it was kept."))
    task_overrides: bool = Field(True, description="Tasks' own envelopes were applied (False: --profile replaced them).")
    adjustments: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Task id -> its envelope fitted to this machine.")
    excluded: dict[str, str] = Field(default_factory=dict, description="Task id -> why it could not run here (not scored).")
    refills: dict[str, int] = Field(default_factory=dict, description="Slots given a fresh rerun budget by --refill-unmeasured: "
                                    "'task/slot' -> the attempt number they were refilled after (earlier attempts stay as evidence).")
    agent_name: str = Field("", description="The suite's named agent the run used (--agent NAME), if any.")
    agent_env: dict[str, str] = Field(default_factory=dict, description="Its environment (names and values; never a secret's value).")
    secrets: list[str] = Field(default_factory=list, description="Names of the secrets the gateway held (never their values).")
    upstreams: dict[str, str] = Field(default_factory=dict, description="Model provider -> the base URL the gateway forwarded to.")
    executor: str = Field("local", description="Where its attempts ran: local (this machine) or ray (a cluster's nodes).")
    ray_address: str = Field("", description="Ray runs: the cluster joined (HOST:PORT; --resume joins it again unless told otherwise).")
    nodes: dict[str, dict[str, Any]] = Field(default_factory=dict, description=(
        "Ray runs: node id -> the facts read on that node when the run was planned (see AttemptRecord.node)."))
    controller: str = Field("", description="host:pid-namespace:pid of the process running it.")
    heartbeat_at: dt.datetime | None = Field(None, description="Last sign of life of that controller (UTC).")

    @property
    def identity(self) -> RunIdentity:
        return RunIdentity(
            suite=self.suite, suite_hash=self.suite_hash, image=self.image, image_digest=self.image_digest,
            agent_cmd=list(self.agent_cmd or []), profile=self.profile, profile_json=dict(self.profile_json or {}),
            harness_version=self.harness_version, cgroup_version=self.cgroup_version, host=dict(self.host or {}),
            images=dict(self.images or {}), substitutions=dict(self.substitutions or {}), task_overrides=self.task_overrides,
            adjustments=dict(self.adjustments or {}), agent_env=dict(self.agent_env or {}), upstreams=dict(self.upstreams or {}),
        )
