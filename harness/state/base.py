"""The two extension points of a task's outcome: the **state kind** (what the agent changes
and how it gets into and out of the sandbox) and the **grader** (how that state is judged).

A new state kind is a :class:`StateKind` in its own module here, registered in
``harness.state``; a new grader is a :class:`Grader`. Both only *describe* work: they return
files, commands and a :class:`GradePlan`, and the attempt pipeline
(``harness.engine.pipeline``) runs those inside sandboxes. The controller never opens
agent-controlled content; it reads one size-capped verdict (or reward).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from harness.model.grade import GradeResult
from harness.model.profile import Profile
from harness.model.sandbox import GRADE_DIR, INPUT_DIR, WORKDIR, ExecResult, ExportFile, Tree
from harness.model.state import ServiceSpec
from harness.model.suite import Suite, SuiteSpec, Task

__all__ = ["GRADE_DIR", "INPUT_DIR", "WORKDIR", "AgentInputs", "ExportFile", "GradePlan", "ServiceRun", "StateKind", "Grader"]


@dataclass(frozen=True)
class ServiceRun:
    """A service of one attempt: its spec and the files it gets at /harness/in (read-only)."""

    spec: ServiceSpec
    inputs: dict[str, bytes] = field(default_factory=dict)
    tmpfs_owner: str | None = None  # uid:gid owning its tmpfs paths (the service's user)


@dataclass(frozen=True)
class AgentInputs:
    """What a state kind puts in and around the sandbox before the agent starts."""

    files: dict[str, bytes] = field(default_factory=dict)  # plain names -> bytes, under INPUT_DIR
    setup: list[list[str]] = field(default_factory=list)  # commands that build the initial state (as the agent's user)
    env: dict[str, str] = field(default_factory=dict)  # the agent's environment, e.g. HARNESS_STATE
    tmpfs: dict[str, int] = field(default_factory=dict)  # state paths: size-capped tmpfs the agent owns
    services: list[ServiceRun] = field(default_factory=list)  # services that hold the state (a database)


@dataclass(frozen=True)
class GradePlan:
    """A grader's work for one attempt, run once the agent's processes are gone.

    ``site``: ``sandbox`` (the attempt's own sandbox), ``service`` (the service ``service``:
    a database graded where it lives) or ``separate`` (a fresh sandbox from ``image``, the
    task's by default, with ``carry`` -- exported state -- copied in first). ``verdict``: the
    command prints a :class:`~harness.model.grade.Verdict`; ``reward``: it writes a reward
    file, read back through ``reads``."""

    cmd: list[str]
    site: Literal["sandbox", "service", "separate"] = "sandbox"
    output: Literal["verdict", "reward"] = "verdict"
    files: dict[str, bytes] = field(default_factory=dict)  # written under GRADE_DIR (flat names)
    tests: Tree | None = None  # copied to /tests (the verifier's tests)
    service: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None  # default: the agent's
    workdir: str | None = None
    reset: list[str] = field(default_factory=list)  # emptied right before the command (e.g. /logs/verifier)
    reads: list[ExportFile] = field(default_factory=list)  # small files read back after the command (the reward)
    evidence: list[ExportFile] = field(default_factory=list)  # kept after the command (verifier logs)
    image: str | None = None  # a separate verifier's image
    carry: list[tuple[ExportFile, str]] = field(default_factory=list)  # separate: exported tree -> where it goes


class StateKind(ABC):
    """What the agent changes: how the suite's fixtures are checked at load time, how the
    initial state is made in the sandbox, which files are kept as evidence, and how the
    expectations grader reads it."""

    name: ClassVar[str]

    def check_suite(self, files: Any, spec: SuiteSpec, src: str, problems: list[str]) -> Any:
        """Check the suite-level fixture sources; return a context for :meth:`check_task`."""
        return None

    @abstractmethod
    def check_task(self, files: Any, src: str, task: Task, ctx: Any, problems: list[str]) -> bool:
        """Check one task's fixture (and its expectations against it); append problems, return ok."""

    def close_suite(self, ctx: Any) -> None:
        """Release what :meth:`check_suite` returned."""

    def fixture_text(self, files: Any, spec: SuiteSpec, task: Task) -> str | None:
        """The task's complete fixture script (SQL kinds), from the files read at load time."""
        return None

    def runtime_files(self, spec: SuiteSpec, task: Task) -> list[str]:
        """Suite files and directories that reach an attempt at run time (never an image input)."""
        return []

    @abstractmethod
    def prepare(self, suite: Suite, task: Task) -> AgentInputs:
        """Inputs, setup commands, environment, state paths and services for one attempt."""

    @abstractmethod
    def exports(self, suite: Suite, task: Task, profile: Profile) -> list[ExportFile]:
        """Files kept as evidence (never parsed by the controller)."""

    def carry(self, suite: Suite, task: Task) -> list[tuple[ExportFile, str]]:
        """What a separate verifier gets of the final state: exported trees and where they go."""
        return []

    @abstractmethod
    def expectations_plan(self, suite: Suite, task: Task) -> GradePlan:
        """How the expectations grader judges this kind of state (a verdict-printing program)."""


class Grader(ABC):
    """How a final state is judged: a :class:`GradePlan` run in a sandbox, and how its result reads."""

    name: ClassVar[str]

    def check_task(self, files: Any, src: str, task: Task, problems: list[str]) -> bool:
        """Check what the grader needs of the suite (a tests directory); append problems."""
        return True

    def runtime_files(self, spec: SuiteSpec, task: Task) -> list[str]:
        return []

    @abstractmethod
    def plan(self, suite: Suite, task: Task, kind: StateKind) -> GradePlan:
        """The grading work for one attempt of ``task``."""

    @abstractmethod
    def read(self, task: Task, result: ExecResult, oom_killed: bool, timeout_s: float, read_back: dict[str, bytes]) -> GradeResult:
        """Turn what the plan did (exit, capped output, the kernel's kills, files read back) into a result."""
