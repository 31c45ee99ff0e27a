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
from typing import Any, Iterable

from harness.model.counters import CgroupLimits, CgroupSnapshot, CounterDelta, HostDelta, Sample
from harness.model.profile import Profile
from harness.model.sandbox import EnvelopeCheck, ExecResult, ExportFile, Tree



# The capabilities a root workload gets in a writable-root sandbox (a Harbor task run as
# root): enough to own and change its files. Never KILL, SETUID/SETGID or SYS_PTRACE: those
# would let it reach the sandbox's keeper (another uid) and outlive the kill before grading.
ROOT_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "NET_BIND_SERVICE")


@dataclass(frozen=True)
class SandboxSpec:
    """What one sandbox is: image, envelope, cores, labels, and where its inputs live.

    By default a *workload sandbox*: a sleeping keeper holds the container and every workload
    runs with ``exec`` as ``user``. With ``command`` it is a *service*: the container runs that
    command (or the image's own with ``command=[]``) as the image's user, and stays up until
    removed."""

    image: str
    profile: Profile
    cpuset: list[int]
    labels: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, bytes] = field(default_factory=dict)  # plain names -> bytes, read-only at /harness/in
    with_grade_dir: bool = False  # an empty, read-only /harness/grade the controller fills later
    inputs_root: Path | None = None  # host folder for the per-sandbox input folders
    user: str | None = None  # workload user (a name or uid[:gid]); default: the profile's
    writable_root: bool = False  # a writable root filesystem (its size is the profile's `storage`)
    tmpfs: dict[str, int] = field(default_factory=dict)  # extra size-capped tmpfs paths owned by the workload user
    late_dirs: tuple[str, ...] = ()  # read-only mounts that stay empty until put_tree() fills them (e.g. /tests)
    trees: dict[str, Tree] = field(default_factory=dict)  # container path -> files, read-only from the start
    network: str | None = None  # the attempt's private network (services); None: no network unless `egress`
    aliases: tuple[str, ...] = ()  # names on that network (a service's host name)
    egress: str | None = None  # also join this network to the internet (the run's `bridge` network)
    env: dict[str, str] = field(default_factory=dict)  # container environment (services)
    workdir: str | None = None  # default working directory of execs
    caps: tuple[str, ...] = ()  # capabilities added to an otherwise empty set
    command: list[str] | None = None  # a service's command ([] = the image's own); None: a workload sandbox


@dataclass
class Measured:
    """A command's result with what the kernel measured while it ran."""

    result: ExecResult
    counters: CounterDelta | None
    host: HostDelta | None
    samples: list[Sample]
    monitor_errors: int = 0
    services: dict[str, CounterDelta | None] = field(default_factory=dict)  # services on the same cores, same instants
    engine_oom: bool = False  # the container ended before it was read, and the engine says the memory ceiling ended it


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
    spec: SandboxSpec
    envelope: EnvelopeCheck | None

    @property
    def notes(self) -> list[str]:
        """Parts of the envelope not enforced here (recorded with the attempt)."""
        return []

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def exec(self, cmd: list[str], timeout: float, env: dict[str, str] | None = None, workdir: str | None = None,
             cap: int | None = None, user: str | None = None) -> ExecResult: ...

    @abstractmethod
    def measured_exec(self, cmd: list[str], timeout: float, env: dict[str, str] | None = None,
                      workdir: str | None = None, also: list["Sandbox"] | None = None) -> Measured:
        """``exec`` under the monitor; ``also``: services on the same cores, read at the same instants."""

    def run_once(self, cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> Measured:
        """Start the sandbox with ``cmd`` as its one workload and measure it; a backend that can
        start the command with the sandbox (no exec) does so."""
        self.start()
        return self.measured_exec(cmd, timeout, env=env)

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

    def how_it_ended(self) -> str:
        """For a sandbox that is no longer alive: what its engine says of its end ("" when unknown)."""
        return ""

    def yield_cpu(self) -> bool:
        """Give this sandbox the lowest CPU weight among its siblings, so that whatever else
        runs on its cores (an earlier attempt's grading) has them whenever it wants them;
        False when that cannot be done here (nothing changed)."""
        return False

    def reclaim_cpu(self) -> None:
        """Undo :meth:`yield_cpu` (a no-op if it did nothing); raises SandboxError if the
        weight cannot be given back."""

    def oom_killed(self) -> bool:
        """For a sandbox that is no longer alive: whether its engine saw the kernel's OOM
        killer act in it (False when unknown)."""
        return False

    @abstractmethod
    def set_envelope(self, memory: int, cpu_quota_us: int) -> CgroupLimits | None:
        """Change the memory ceiling and CPU quota (for grading); the limits read back."""

    @abstractmethod
    def put_grade_files(self, files: dict[str, bytes]) -> None:
        """Write files into the sandbox's read-only /harness/grade (only once the agent is gone)."""

    @abstractmethod
    def put_tree(self, dest: str, files: Tree) -> None:
        """Place files under ``dest``: a late directory of the spec (read-only mount, filled
        now), or, in a writable-root sandbox, copied in (``dest`` replaced)."""

    @abstractmethod
    def put_archive(self, dest: str, tar_path: Path) -> None:
        """Unpack a tar (made by :meth:`export`) under ``dest`` in a writable-root sandbox."""

    @abstractmethod
    def export(self, files: Iterable[ExportFile], timeout: float, dest: Path, then: Command | None = None,
               reset: list[str] | None = None, env: dict[str, str] | None = None, cwd: str | None = None,
               user: str | None = None, kill_after: bool = False) -> Exported:
        """Copy files out into ``dest`` (see :class:`ExportFile`): plain regular files only, never
        through a link; with ``then``, run that command first (the grader): ``reset``
        directories emptied, then the command as ``user`` in ``cwd`` with ``env``, and with
        ``kill_after`` whatever it left running killed before anything is read."""

    @abstractmethod
    def healthy(self, cmd: list[str] | None, timeout: float, stop: "Any" = None) -> str | None:
        """Wait until a service runs and ``cmd`` exits 0 in it; None, or why it never did."""

    def halt(self) -> bool:
        """Kill every process of the sandbox, its keeper too, and wait until none runs; the
        sandbox itself stays for :meth:`remove`. True only when this side can tell that nothing
        of it runs on its cores any more (what is left of a removal is then the engine's own
        bookkeeping). The default tells nothing: removal alone says when it is over."""
        return False

    @abstractmethod
    def remove(self) -> bool:
        """Remove the sandbox; True when it is gone (False: removal failed, retry later)."""


class Network(ABC):
    """An attempt's private network: its services and its sandbox reach each other by name,
    nothing else."""

    name: str

    @abstractmethod
    def remove(self) -> bool:
        """Remove it (its members must be gone); True when it is."""


class SandboxBackend(ABC):
    """Makes sandboxes and cleans up after dead controllers."""

    @abstractmethod
    def sandbox(self, spec: SandboxSpec) -> Sandbox: ...

    @abstractmethod
    def network(self, labels: dict[str, str]) -> "Network":
        """A fresh private network (no egress) for one attempt and its services."""

    @abstractmethod
    def sweep_dead_owners(self) -> list[str]:
        """Remove sandboxes (and input folders) whose controller process is dead."""

    @abstractmethod
    def remove_orphans_of(self, holders: list[str]) -> list[str] | None:
        """Remove the sandboxes of controllers (host:pid-namespace:pid) that died while holding
        a core; the names removed, or None when some of theirs are still there."""

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
    def check_command(self, image: str, command: str, profile: Profile, user: str | None = None) -> str | None:
        """Why ``command`` cannot be started in ``image`` as the profile's user (not an
        executable file on its PATH), or None. Decided by the harness before a run, never
        from what a workload prints."""
