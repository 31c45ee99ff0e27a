"""The sandbox backend interface: one fresh, pinned, measured sandbox per attempt.

A backend makes :class:`Sandbox` objects from a :class:`SandboxSpec`. The attempt pipeline
uses only this interface, so another backend (a VM, a remote engine) is one module here:
implement :class:`SandboxBackend` and :class:`Sandbox`, and the pipeline, the SLA judge and
the store stay as they are. The Docker backend is ``harness.sandbox.docker_sandbox``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from harness.model.counters import CgroupLimits, CgroupSnapshot, CounterDelta, HostDelta, Sample
from harness.model.profile import Profile
from harness.model.sandbox import EnvelopeCheck, ExecResult


@dataclass(frozen=True)
class SandboxSpec:
    """What one sandbox is: image, envelope, cores, labels, and where its inputs live."""

    image: str
    profile: Profile
    cpuset: list[int]
    labels: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, bytes] = field(default_factory=dict)  # plain names -> bytes, read-only at /harness/in
    with_grade_dir: bool = False  # an empty, read-only /harness/grade the controller fills later
    inputs_root: Path | None = None  # host folder for the per-sandbox input folders


@dataclass
class Measured:
    """A command's result with what the kernel measured while it ran."""

    result: ExecResult
    counters: CounterDelta | None
    host: HostDelta | None
    samples: list[Sample]
    monitor_errors: int = 0


@dataclass(frozen=True)
class Command:
    """A command run inside the sandbox right before an export, in the same exec: in its own
    session, stopped at ``timeout`` seconds of wall time; ``cap`` bytes of each stream kept."""

    cmd: list[str]
    timeout: float
    cap: int


@dataclass(frozen=True)
class Exported:
    """Files copied out of a sandbox: name -> bytes kept (written to the destination folder),
    what was refused or cut (one line each), the result of the command run first (if any),
    and whether the export ran to its end."""

    files: dict[str, int]
    problems: list[str]
    truncated: list[str] = field(default_factory=list)
    command: ExecResult | None = None
    complete: bool = True


class Sandbox(ABC):
    """One sandbox under one envelope. ``start`` reads the envelope back from the kernel;
    ``remove`` is idempotent and reports whether the sandbox is really gone."""

    name: str
    envelope: EnvelopeCheck | None

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def exec(self, cmd: list[str], timeout: float, env: dict[str, str] | None = None, workdir: str | None = None,
             cap: int | None = None) -> ExecResult: ...

    @abstractmethod
    def measured_exec(self, cmd: list[str], timeout: float, env: dict[str, str] | None = None,
                      workdir: str | None = None) -> Measured: ...

    @abstractmethod
    def snapshot(self) -> CgroupSnapshot | None:
        """The sandbox's cgroup counters now (None if unreadable)."""

    @abstractmethod
    def kill_tree(self) -> int:
        """Freeze the workload, SIGKILL every process of it, thaw; returns how many were signalled."""

    @abstractmethod
    def workload_alive(self) -> bool:
        """Does any workload process (anything but the sandbox's own keeper) still run?"""

    @abstractmethod
    def alive(self) -> bool:
        """Is the sandbox still there (not removed or killed from outside)?"""

    @abstractmethod
    def set_envelope(self, memory: int, cpu_quota_us: int) -> CgroupLimits | None:
        """Change the memory ceiling and CPU quota (for grading); the limits read back."""

    @abstractmethod
    def put_grade_files(self, files: dict[str, bytes]) -> None:
        """Write files into the sandbox's read-only /harness/grade (only once the agent is gone)."""

    @abstractmethod
    def export(self, files: Iterable[tuple[str, int, bool]], timeout: float, dest: Path, then: Command | None = None) -> Exported:
        """Copy plain regular files out of the work directory into ``dest``: (name, cap,
        keep_head) each; with ``then``, run that command first (the grader), in the same exec."""

    @abstractmethod
    def remove(self) -> bool:
        """Remove the sandbox; True when it is gone (False: removal failed, retry later)."""


class SandboxBackend(ABC):
    """Makes sandboxes and cleans up after dead controllers."""

    @abstractmethod
    def sandbox(self, spec: SandboxSpec) -> Sandbox: ...

    @abstractmethod
    def sweep_dead_owners(self) -> list[str]:
        """Remove sandboxes (and input folders) whose controller process is dead."""

    @abstractmethod
    def sweep_run(self, run_id: str, held_too: bool = False) -> list[str]:
        """Remove the sandboxes of ``run_id`` this process does not hold (failed removals);
        with ``held_too``, every sandbox of the run (the interrupt path)."""

    @abstractmethod
    def remove_held(self) -> int:
        """Remove every sandbox this process holds now (Ctrl-C); returns how many."""

    @abstractmethod
    def retry_removals(self) -> list[str]:
        """Try again the removals that failed; the sandboxes now gone."""

    @abstractmethod
    def ping(self) -> bool:
        """Does the engine answer?"""

    @abstractmethod
    def check_command(self, image: str, command: str, profile: Profile) -> str | None:
        """Why ``command`` cannot be started in ``image`` as the profile's user (not an
        executable file on its PATH), or None. Decided by the harness before a run, never
        from what a workload prints."""
