"""What a sandbox reports: one command's result, the envelope read back from the kernel,
and the record of ``harness sandbox exec`` (one command as one attempt)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field

from harness.model.counters import CgroupLimits, CounterDelta, HostDelta, Sample

# Paths inside every sandbox (the agent protocol)
INPUT_DIR = "/harness/in"  # read-only for the whole attempt: prompt and the state kind's inputs
GRADE_DIR = "/harness/grade"  # read-only, empty until every agent process is gone; then the grader's files
WORKDIR = "/work"  # the agent's writable work directory
TRANSCRIPT_FILE = "transcript.jsonl"  # the agent's optional transcript, under WORKDIR
TESTS_DIR = "/tests"  # a verifier's tests, copied in only once the agent is gone (Harbor's path)
SOLUTION_DIR = "/solution"  # the reference solution, present only for `--agent oracle`
AGENT_DIR = "/harness/agent"  # a suite's agent directory (read-only), when it has one
LOGS_DIR = "/logs"  # Harbor's agent / verifier / artifacts folders

Tree = dict[str, tuple[bytes, int]]  # relative path -> (bytes, permission bits)


@dataclass(frozen=True)
class ExportFile:
    """A file (or with ``tree``, a directory kept as ``NAME.tar``) copied out of a sandbox:
    ``name`` is what it is kept as, ``path`` where it is (default: the work directory's
    ``name``), ``cap`` the bytes kept; over the cap, the first ``cap`` bytes (``keep_head``)
    or nothing."""

    name: str
    cap: int
    keep_head: bool = False
    path: str | None = None
    tree: bool = False




class ExecResult(BaseModel):
    """The outcome of one command run inside the sandbox."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    cmd: list[str] = Field(..., description="The command as executed.")
    exit_code: int | None = Field(None, description="Exit status; None if it could not be read (engine error).")
    timed_out: bool = Field(False, description="The wall-clock timeout fired and the process tree was killed.")
    wall_s: float = Field(..., ge=0, description="Seconds from exec start to exit, or on a timeout until the killed tree's output closed.")
    stdout: str = Field("", description="Captured stdout (up to the profile's output_cap; truncation is marked).")
    stderr: str = Field("", description="Captured stderr (same cap).")
    stdout_bytes: int = Field(0, ge=0, description="Total bytes the command wrote to stdout, kept or not.")
    stderr_bytes: int = Field(0, ge=0, description="Total bytes written to stderr.")
    stdout_truncated: bool = Field(False, description="stdout exceeded the cap; its first and last halves were kept, the middle dropped and marked.")
    stderr_truncated: bool = Field(False, description="stderr exceeded the cap (kept as stdout is).")
    start_error: str | None = Field(None, description="Why the command never started, in one line (the engine could not "
                                    "execute it; it is also stderr): exit_code is then 127 when it is not there (not on the "
                                    "PATH, no such file), 126 when it is there but cannot be executed, as a shell reports it.")


class EnvelopeCheck(BaseModel):
    """The envelope read back from the kernel compared with the profile."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    applied: CgroupLimits | None = Field(None, description="Limits read from the container's cgroup.")
    expected: dict[str, Any] = Field(default_factory=dict, description="What the profile asked for, in the same units.")
    mismatches: list[str] = Field(default_factory=list, description="One line per limit that differs (empty = applied).")

    @property
    def ok(self) -> bool:
        return self.applied is not None and not self.mismatches


class AttemptResult(BaseModel):
    """What `harness sandbox exec` prints: one attempt of one command under one envelope."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    container: str = Field(..., description="Container name (removed after the attempt).")
    image: str = Field(..., description="Image the sandbox ran.")
    profile: str = Field(..., description="Profile name.")
    cpuset: list[int] = Field(..., description="Exclusive cores leased to the attempt.")
    exec: ExecResult | None = Field(None, description="The command's result (None if the sandbox never started).")
    kind: str = Field(..., description="ok | crashed | timeout | oom_killed | infra_error.")
    envelope: EnvelopeCheck | None = Field(None, description="Limits read back vs the profile.")
    counters: CounterDelta | None = Field(None, description="cgroup deltas over the command.")
    host: HostDelta | None = Field(None, description="Host contention over the command.")
    samples: list[Sample] = Field(default_factory=list, description="Saturation log during the command.")
    error: str | None = Field(None, description="Why the attempt could not run (infra_error).")

    # the headline numbers at the top level too, for `jq .exit_code` and friends
    @computed_field(description="The command's exit status (same as exec.exit_code).")
    @property
    def exit_code(self) -> int | None:
        return self.exec.exit_code if self.exec else None

    @computed_field(description="Seconds the command ran (same as exec.wall_s).")
    @property
    def wall_s(self) -> float | None:
        return self.exec.wall_s if self.exec else None

    @computed_field(description="The wall-clock timeout fired (same as exec.timed_out).")
    @property
    def timed_out(self) -> bool:
        return bool(self.exec and self.exec.timed_out)
