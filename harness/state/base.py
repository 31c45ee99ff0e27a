"""The two extension points of a task's outcome: the **state kind** (what the agent changes
and how it gets into and out of the sandbox) and the **grader** (how that state is judged).

A new state kind (say ``files``, or a per-attempt service) is a :class:`StateKind` in its
own module here, registered in ``harness.state``; a new grader (say a verifier command) is a
:class:`Grader`. Both only *describe* work: they return files and commands, and the attempt
pipeline (``harness.engine.pipeline``) runs those inside the sandbox. The controller never
opens agent-controlled content; it reads one size-capped verdict.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from harness.model.grade import GradeResult
from harness.model.profile import Profile
from harness.model.sandbox import GRADE_DIR, INPUT_DIR, WORKDIR, ExecResult
from harness.model.suite import Suite, Task

__all__ = ["GRADE_DIR", "INPUT_DIR", "WORKDIR", "AgentInputs", "ExportFile", "GradeProgram", "StateKind", "Grader"]


@dataclass(frozen=True)
class AgentInputs:
    """What a state kind puts in the sandbox before the agent starts."""

    files: dict[str, bytes] = field(default_factory=dict)  # plain names -> bytes, under INPUT_DIR
    setup: list[str] | None = None  # a command that builds the initial state (run as the agent's user)
    env: dict[str, str] = field(default_factory=dict)  # the agent's environment, e.g. HARNESS_STATE


@dataclass(frozen=True)
class ExportFile:
    """A file kept as evidence after the attempt (plain name under the work directory)."""

    name: str
    cap: int  # bytes kept
    keep_head: bool = False  # over the cap: keep the first `cap` bytes (True) or nothing (False)


@dataclass(frozen=True)
class GradeProgram:
    """A grader's work: files written under GRADE_DIR once the agent is gone, and the command."""

    files: dict[str, bytes]
    cmd: list[str]


class StateKind(ABC):
    """What the agent changes: how the suite's fixture is checked at load time, how the
    initial state is made in the sandbox, and which files are kept as evidence."""

    name: ClassVar[str]

    @abstractmethod
    def check_suite(self, files: Any, sources: list[str], src: str, problems: list[str]) -> Any:
        """Check the suite-level fixture sources; return a context for :meth:`check_task`."""

    @abstractmethod
    def check_task(self, files: Any, src: str, task: Task, ctx: Any, problems: list[str]) -> bool:
        """Check one task's fixture against the suite's; append problems, return ok."""

    def close_suite(self, ctx: Any) -> None:
        """Release what :meth:`check_suite` returned."""

    @abstractmethod
    def fixture_text(self, files: Any, sources: list[str], task: Task) -> str:
        """The task's complete fixture, from the files read at load time."""

    @abstractmethod
    def prepare(self, suite: Suite, task: Task) -> AgentInputs:
        """Inputs, setup command and environment for one attempt of ``task``."""

    @abstractmethod
    def exports(self, profile: Profile) -> list[ExportFile]:
        """Files kept as evidence (never parsed by the controller)."""


class Grader(ABC):
    """How a final state is judged: a program run in the sandbox that prints one verdict."""

    name: ClassVar[str]

    @abstractmethod
    def program(self, suite: Suite, task: Task) -> GradeProgram:
        """The grading program for one attempt of ``task``."""

    @abstractmethod
    def read(self, result: ExecResult, oom_killed: bool, timeout_s: float) -> GradeResult:
        """Turn what the program did (exit, capped stdout, whether the kernel killed it) into a result."""
