"""Sandbox profiles: the resource envelope of a trial and the SLA it is judged by.

Pure models (pydantic); loading ``sandboxes/NAME.toml`` is ``harness.engine.profiles``.
See ``sandboxes/standard.toml`` for a commented example.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from harness.model.egress import parse_rule
from harness.model.units import MEMORY_FLOOR, MiB, ByteSize, StrictModel, format_size

NetworkPolicy = Literal["none", "gateway", "allowlist", "bridge"]
NETWORK_HELP = (
    "'none': only loopback (and the attempt's own services); 'gateway': also the harness's model gateway, "
    "nothing else; 'allowlist': also the hosts in `allow`, through the egress proxy, every connection logged; "
    "'bridge': unrestricted to the internet, never to the host's services, private ranges or other attempts.")

_Strict = StrictModel


class Timeouts(_Strict):
    """Wall-clock limits, in seconds. A timeout kills the attempt's whole process tree."""

    setup: float = Field(30.0, gt=0, le=3600, description="Building the fixture state inside the sandbox.")
    agent: float = Field(120.0, gt=0, le=86400, description="The agent command, from start to exit.")
    grade: float = Field(
        30.0, gt=0, le=3600,
        description="Grading the final state inside the sandbox (the grader is killed at this wall time; "
        "the attempt is then `ungradable`), and separately exporting it as evidence.",
    )


class GradeEnvelope(_Strict):
    """What grading may use. The grader runs in the attempt's own container after every agent
    process is frozen and killed, under these limits (set with the engine, read back from the
    kernel); its wall time is `timeouts.grade`."""

    memory: ByteSize = Field(
        256 * MiB,
        description="Memory the grader may use on top of what the sandbox holds when the agent has "
        "gone (its final state lives in tmpfs, which the kernel charges to the sandbox). A state the "
        "grader cannot read within it makes the attempt `ungradable`.",
    )
    cpus: float | None = Field(
        None, gt=0, le=256,
        description="CFS quota in cores while grading (at most the profile's `cores`); absent = the profile's cpus.",
    )


class SLA(_Strict):
    """Thresholds an attempt is judged by. A breach of a `host` rule means the node broke its
    promise: the attempt is discarded and its slot rerun. `envelope` rules are optional
    (null/absent disables them); a slot that keeps breaching one ends unmeasured with a
    message that the envelope is too small for the task."""

    foreign_cpu_share: float | None = Field(
        0.10, ge=0, le=1,
        description="host rule `host_cpu_contention`: busy time on the pinned cores not accounted "
        "to the trial's cgroup, as a share of wall time x pinned cores.",
    )
    foreign_cpu_min_ms: float = Field(
        50.0, ge=0, le=60_000,
        description="host_cpu_contention also needs at least this much foreign CPU time (ms): /proc/stat "
        "counts in 10 ms ticks, so on a short attempt rounding alone can look like a few percent.",
    )
    steal_share: float | None = Field(
        0.05, ge=0, le=1,
        description="host rule `host_steal`: CPU steal (hypervisor) on the trial's pinned cores over the attempt, share of wall x those cores.",
    )
    host_memory_pressure: float | None = Field(
        0.10, ge=0, le=1,
        description="host rule `host_memory_pressure`: share of the attempt's wall time in which some "
        "host task stalled on memory (PSI memory `some`).",
    )
    host_io_pressure: float | None = Field(
        0.50, ge=0, le=1,
        description="host rule `host_io_pressure`: share of wall time with some host task stalled on IO (PSI io `some`).",
    )
    controller_stall_s: float | None = Field(
        5.0, gt=0, le=3600,
        description="host rule `controller_stall`: the longest gap in the monitor's own samples beyond one "
        "sampling interval (seconds). The controller was stopped (SIGSTOP, swap, a paused VM) while the agent "
        "ran: its timing and counters of that window cannot be trusted.",
    )
    min_mem_available: ByteSize | None = Field(
        256 * MiB,
        description="host rule `host_memory_low`: lowest host MemAvailable seen during the attempt "
        "(size such as '256m').",
    )
    throttled_share: float | None = Field(
        None, ge=0, le=1,
        description="envelope rule `cpu_throttled`: throttled time / wall time of the agent. Absent = off.",
    )
    memory_pressure_events: int | None = Field(
        None, ge=0,
        description="envelope rule `memory_pressure`: memory limit hits (v1 failcnt, v2 max events). Absent = off.",
    )
    upstream_rate_limited: int | None = Field(
        0, ge=0,
        description="upstream rule `upstream_rate_limited`: model calls answered 429 during the attempt (as the agent "
        "saw them, after the gateway's own retries) above this count discard it. Absent = off.",
    )
    upstream_server_errors: int | None = Field(
        0, ge=0, description="upstream rule `upstream_server_error`: model calls answered 5xx by the provider above this count.")
    upstream_timeouts: int | None = Field(
        0, ge=0, description="upstream rule `upstream_timeout`: model calls the provider did not answer within the gateway's timeout.")
    upstream_connection_errors: int | None = Field(
        0, ge=0, description="upstream rule `upstream_unreachable`: model calls that could not reach the provider or "
        "whose answer was cut off (connection refused, reset, truncated).")
    upstream_auth_errors: int | None = Field(
        0, ge=0, description="upstream rule `upstream_auth`: calls the provider refused the key for (401/403): a missing or "
        "wrong key is the run's setup, never the agent's failure.")
    upstream_client_errors: int | None = Field(
        None, ge=0, description="upstream rule `upstream_client_error`: calls answered with another 4xx (an unknown model, "
        "a malformed request). Off by default: a request the agent got wrong is the agent's; set 0 to discard them.")
    upstream_wait_share: float | None = Field(
        None, ge=0, le=1,
        description="upstream rule `upstream_slow`: share of the agent's wall time spent waiting on the model above "
        "which the provider, not the agent, is taken to have set the pace. Absent = off (waiting time is recorded either way).")


class GatewayLimits(_Strict):
    """The model gateway's limits, per provider, so parallel attempts do not trip the
    provider's own rate limits (calls wait in the gateway instead; the wait is recorded as
    the attempt's waiting time)."""

    concurrency: int = Field(8, ge=1, le=4096, description="Calls in flight to one provider at once.")
    rate: float | None = Field(None, gt=0, le=1_000_000, description="Calls per minute to one provider (token bucket); absent = no cap.")
    timeout: float = Field(300.0, gt=0, le=3600, description="Seconds an upstream call may take (a stream: between bytes) before the gateway gives up.")
    retries: int = Field(0, ge=0, le=10, description="Times the gateway retries a 429/5xx/connection error before the agent sees it "
                         "(only before any byte reached the agent); each retry is recorded with the call.")
    per_attempt: int | None = Field(None, ge=1, le=4096, description="Calls in flight one attempt may hold at once per provider "
                                    "(default: half of concurrency, at least 1), so one attempt cannot starve the others.")
    server_tools: bool = Field(False, description="Forward tools the provider runs itself (web search/fetch, code execution, "
                               "MCP servers): they reach the internet from the provider's side, past the network policy.")


class EnvelopeOverride(_Strict):
    """Fields a task may override from its suite's profile (e.g. a task that needs 2 GiB)."""

    cpus: float | None = Field(None, gt=0, le=256, description="CFS quota in cores.")
    cores: int | None = Field(None, ge=1, le=256, description="Cores in the exclusive cpuset.")
    memory: ByteSize | None = Field(None, description="Memory ceiling (swap = 0 extra).")
    pids: int | None = Field(None, ge=8, le=1_000_000, description="Max processes/threads.")
    timeouts: dict[Literal["setup", "agent", "grade"], float] | None = Field(
        None, description="Per-phase timeouts in seconds."
    )
    network: NetworkPolicy | None = Field(None, description="Network policy of the sandbox: " + NETWORK_HELP)
    allow: list[str] | None = Field(None, description="Allowlist entries (network = 'allowlist'): names, '*.domain', CIDRs, ':ports'.")
    storage: ByteSize | None = Field(None, description="Writable root filesystem size (tasks with a writable root).")


class Profile(_Strict):
    """A sandbox profile: the resource envelope pinned for every attempt and its SLA."""

    name: str = Field(..., pattern=r"^[a-z0-9][a-z0-9_.-]*$", description="Profile name (file stem).")
    description: str = Field("", description="One line on when to use this profile.")
    cpus: float = Field(1.0, gt=0, le=256, description="CPU quota in cores (CFS quota / period).")
    cores: int = Field(1, ge=1, le=256, description="Cores in the exclusive cpuset the scheduler leases. Must be >= cpus.")
    cpu_period_us: int = Field(100_000, ge=1000, le=1_000_000, description="CFS period in microseconds.")
    memory: ByteSize = Field(1024 * MiB, description="Memory ceiling in bytes (TOML accepts '512m', '1g'). Swap equals it: no swap escape.")
    pids: int = Field(256, ge=8, le=1_000_000, description="pids limit (processes + threads).")
    network: NetworkPolicy = Field("none", description="Network policy: " + NETWORK_HELP)
    allow: list[str] = Field(default_factory=list, description="Where `allowlist` lets an attempt connect: 'api.example.com', "
                             "'*.example.com', '10.0.0.0/8', each optionally ':443', ':80,443', ':8000-8100' or ':*' (no port = 80 and 443).")
    gateway: GatewayLimits = Field(default_factory=GatewayLimits, description="The model gateway's per-provider limits.")
    storage: ByteSize | None = Field(
        None, description="Size of a writable root filesystem (tasks that have one, e.g. Harbor's). Enforced where the "
        "engine's storage driver has quotas (overlay2 on xfs with pquota); elsewhere recorded as requested and "
        "reported `not enforced` with every attempt.")
    io_read_bps: ByteSize | None = Field(
        None, ge=1024 * 1024, description="Disk read limit in bytes per second ('20m') on the disk that holds the engine's "
        "data root (cgroup v1 blkio.throttle.read_bps_device, v2 io.max rbps); read back from the kernel. Absent = no limit.")
    io_write_bps: ByteSize | None = Field(
        None, ge=1024 * 1024, description="Disk write limit in bytes per second (v1 blkio.throttle.write_bps_device, v2 io.max "
        "wbps). Absent = no limit. tmpfs writes (/work, /tmp) are memory, not disk.")
    user: str = Field("10001:10001", pattern=r"^\d+:\d+$", description="uid:gid the workload runs as (never root).")
    tmpfs: dict[str, ByteSize] = Field(
        default_factory=lambda: {"/work": 256 * MiB, "/tmp": 64 * MiB},
        description="Writable paths as size-capped tmpfs mounts: path -> size ('64m'). The root fs is read-only.",
    )
    output_cap: ByteSize = Field(1 * MiB, ge=1024, description="Bytes of stdout (and of stderr) kept per attempt; the rest is counted and dropped.")
    sample_hz: float = Field(5.0, gt=0, le=50, description="Saturation log sampling rate.")
    timeouts: Timeouts = Field(default_factory=Timeouts, description="Wall-clock timeouts per phase.")
    grade: GradeEnvelope = Field(default_factory=GradeEnvelope, description="The grader's envelope (memory, CPU).")
    override_scale: float = Field(
        1.0, gt=0, le=100,
        description="Factor applied to a task's own envelope overrides (memory, cpus, timeouts) too; "
        "set by `harness sweep --headroom` so tasks with overrides are scaled like the rest.",
    )
    sla: SLA = Field(default_factory=SLA, description="Thresholds for the SLA judge.")

    @field_validator("memory")
    @classmethod
    def _memory(cls, n: int) -> int:
        if n < MEMORY_FLOOR:
            raise ValueError(f"memory {format_size(n)} is below the floor of {format_size(MEMORY_FLOOR)}")
        return n

    @field_validator("tmpfs")
    @classmethod
    def _tmpfs(cls, v: dict[str, int]) -> dict[str, int]:
        out = {}
        for path, n in v.items():
            if not str(path).startswith("/") or ".." in str(path) or str(path) in ("/", "/proc", "/sys", "/dev"):
                raise ValueError(f"tmpfs path {path!r} must be an absolute path other than /, /proc, /sys, /dev")
            if n < MiB:
                raise ValueError(f"tmpfs {path} size {format_size(n)} is below 1 MiB")
            out[str(path)] = n
        return out

    @model_validator(mode="after")
    def _conflicts(self) -> "Profile":
        if self.cpus > self.cores:
            raise ValueError(
                f"cpus = {self.cpus} exceeds cores = {self.cores}: the quota cannot be used on a "
                f"cpuset that small; raise cores to {int(-(-self.cpus // 1))} or lower cpus"
            )
        if self.grade.cpus is not None and self.grade.cpus > self.cores:
            raise ValueError(f"grade.cpus = {self.grade.cpus} exceeds cores = {self.cores}: grading runs on the attempt's cpuset")
        if self.user.split(":")[0] == "0":
            raise ValueError("user must not be root (uid 0)")
        if self.network == "allowlist" and not self.allow:
            raise ValueError("network = \"allowlist\" needs `allow` entries (e.g. allow = [\"pypi.org\", \"*.pythonhosted.org\"])")
        if self.allow and self.network != "allowlist":
            raise ValueError(f"`allow` is only used with network = \"allowlist\" (this profile's network is {self.network!r})")
        return self

    @field_validator("allow")
    @classmethod
    def _allow(cls, v: list[str]) -> list[str]:
        for e in v:
            parse_rule(e)  # raises ValueError naming the entry
        return [e.strip() for e in v]

    def with_override(self, override: EnvelopeOverride | None) -> "Profile":
        """Return this profile with a task's envelope override applied (validated again)."""
        if override is None:
            return self
        data = self.model_dump()
        f = self.override_scale
        for key in ("cpus", "cores", "memory", "pids", "network", "allow", "storage"):
            val = getattr(override, key)
            if val is not None:
                data[key] = val
        if f != 1.0:  # headroom sweeps scale the task's own kill limits as well
            if override.memory is not None:
                data["memory"] = int(override.memory * f)
            if override.cpus is not None:
                data["cpus"] = min(round(override.cpus * f, 4), float(data["cores"]))
        if override.timeouts:
            data["timeouts"] = {**data["timeouts"], **{k: v * f for k, v in override.timeouts.items()}}
        if data["grade"]["cpus"] is not None and data["grade"]["cpus"] > data["cores"]:
            data["grade"]["cpus"] = float(data["cores"])  # grading runs on the task's (smaller) cpuset
        return Profile.model_validate(data)

    @property
    def quota_us(self) -> int:
        """CFS quota per period in microseconds, as Docker writes it."""
        return int(round(self.cpus * self.cpu_period_us))

    @property
    def grade_quota_us(self) -> int:
        """CFS quota per period while grading."""
        return int(round((self.grade.cpus or self.cpus) * self.cpu_period_us))
