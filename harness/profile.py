"""Sandbox profiles: the resource envelope of a trial and the SLA it is judged by.

Pure module: pydantic models and TOML loading, no Docker, no database.
A profile lives in ``sandboxes/NAME.toml``; see ``sandboxes/standard.toml`` for a
commented example.
"""

from __future__ import annotations

import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

MiB = 1024 * 1024
MEMORY_FLOOR = 16 * MiB  # below this the kernel and python3 itself do not fit

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": MiB, "g": 1024 * MiB, "t": 1024 * 1024 * MiB}


def parse_size(value: int | str) -> int:
    """Parse a byte size such as ``512m``, ``1GiB``, ``2g`` or an integer number of bytes."""
    if isinstance(value, bool):
        raise ValueError("expected a size like '512m' or '1g', got a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("size must be positive")
        return value
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a size; use e.g. '256m', '1g' or bytes as an integer")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_size(n: int | float | None) -> str:
    """Human-readable binary size (``256 MiB``)."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


ByteSize = Annotated[
    int,
    BeforeValidator(parse_size),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*[kmgtKMGT]?(i?[bB])?\s*$"},
            ],
            "description": "Bytes, or a size such as '512m', '1g', '64MiB'.",
        }
    ),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Timeouts(_Strict):
    """Wall-clock limits, in seconds. A timeout kills the attempt's whole process tree."""

    setup: float = Field(30.0, gt=0, le=3600, description="Building the fixture state inside the sandbox.")
    agent: float = Field(120.0, gt=0, le=86400, description="The agent command, from start to exit.")
    grade: float = Field(30.0, gt=0, le=3600, description="Exporting and grading the final state.")


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
        description="host rule `host_steal`: CPU steal (hypervisor) over the attempt, share of wall x all cores.",
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


class EnvelopeOverride(_Strict):
    """Fields a task may override from its suite's profile (e.g. a task that needs 2 GiB)."""

    cpus: float | None = Field(None, gt=0, le=256, description="CFS quota in cores.")
    cores: int | None = Field(None, ge=1, le=256, description="Cores in the exclusive cpuset.")
    memory: ByteSize | None = Field(None, description="Memory ceiling (swap = 0 extra).")
    pids: int | None = Field(None, ge=8, le=1_000_000, description="Max processes/threads.")
    timeouts: dict[Literal["setup", "agent", "grade"], float] | None = Field(
        None, description="Per-phase timeouts in seconds."
    )


class Profile(_Strict):
    """A sandbox profile: the resource envelope pinned for every attempt and its SLA."""

    name: str = Field(..., pattern=r"^[a-z0-9][a-z0-9_.-]*$", description="Profile name (file stem).")
    description: str = Field("", description="One line on when to use this profile.")
    cpus: float = Field(1.0, gt=0, le=256, description="CPU quota in cores (CFS quota / period).")
    cores: int = Field(1, ge=1, le=256, description="Cores in the exclusive cpuset the scheduler leases. Must be >= cpus.")
    cpu_period_us: int = Field(100_000, ge=1000, le=1_000_000, description="CFS period in microseconds.")
    memory: ByteSize = Field(1024 * MiB, description="Memory ceiling in bytes (TOML accepts '512m', '1g'). Swap equals it: no swap escape.")
    pids: int = Field(256, ge=8, le=1_000_000, description="pids limit (processes + threads).")
    network: Literal["none", "bridge"] = Field("none", description="Docker network; 'none' means no egress.")
    user: str = Field("10001:10001", pattern=r"^\d+:\d+$", description="uid:gid the workload runs as (never root).")
    tmpfs: dict[str, ByteSize] = Field(
        default_factory=lambda: {"/work": 256 * MiB, "/tmp": 64 * MiB},
        description="Writable paths as size-capped tmpfs mounts: path -> size ('64m'). The root fs is read-only.",
    )
    output_cap: ByteSize = Field(1 * MiB, ge=1024, description="Bytes of stdout (and of stderr) kept per attempt; the rest is counted and dropped.")
    sample_hz: float = Field(5.0, gt=0, le=50, description="Saturation log sampling rate.")
    timeouts: Timeouts = Field(default_factory=Timeouts, description="Wall-clock timeouts per phase.")
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
        if self.user.split(":")[0] == "0":
            raise ValueError("user must not be root (uid 0)")
        return self

    def with_override(self, override: EnvelopeOverride | None) -> "Profile":
        """Return this profile with a task's envelope override applied (validated again)."""
        if override is None:
            return self
        data = self.model_dump()
        f = self.override_scale
        for key in ("cpus", "cores", "memory", "pids"):
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
        return Profile.model_validate(data)

    @property
    def quota_us(self) -> int:
        """CFS quota per period in microseconds, as Docker writes it."""
        return int(round(self.cpus * self.cpu_period_us))


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file and the key."""


def format_validation_error(source: str, err: ValidationError) -> str:
    """One line per problem: ``file: key: message``."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"{source}: {loc}: {msg}")
    return "\n".join(lines)


def load_profile_file(path: Path) -> Profile:
    """Load and validate one profile TOML file. Raises ProfileError naming the file and key."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such profile file") from None
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{path}: not valid TOML: {e}") from None
    data.setdefault("name", path.stem)
    try:
        return Profile.model_validate(data)
    except ValidationError as e:
        raise ProfileError(format_validation_error(str(path), e)) from None


def profile_dirs() -> list[Path]:
    """Where profiles are looked up, first match wins: ./sandboxes, then the built-in ones."""
    dirs = [Path.cwd() / "sandboxes"]
    builtin = Path(str(resources.files("harness") / "sandboxes"))
    if builtin.is_dir() and builtin.resolve() not in [d.resolve() for d in dirs if d.is_dir()]:
        dirs.append(builtin)
    return dirs


def available_profiles() -> dict[str, Path]:
    """Profile name -> file, across the lookup directories."""
    found: dict[str, Path] = {}
    for d in profile_dirs():
        if d.is_dir():
            for f in sorted(d.glob("*.toml")):
                found.setdefault(f.stem, f)
    return found


def load_profile(name_or_path: str) -> Profile:
    """Load a profile by name (``standard``) or by path to a TOML file."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or "/" in name_or_path:
        return load_profile_file(p)
    profiles = available_profiles()
    if name_or_path not in profiles:
        names = ", ".join(sorted(profiles)) or "none found"
        raise ProfileError(f"unknown profile {name_or_path!r}; available: {names} (or pass a path to a .toml file)")
    return load_profile_file(profiles[name_or_path])
