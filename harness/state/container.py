"""State kind ``container``: the sandbox's own filesystem, as a Harbor task has it.

The root filesystem is writable (the image's files, as built); the agent changes whatever
it may, and a verifier judges the result where it is (``shared``) or, in ``separate`` mode,
in a fresh sandbox that gets only ``/logs/artifacts`` and the task's declared ``artifacts``.
Kept as evidence: the artifacts, ``/logs/agent`` and ``/logs/artifacts`` (each a tar, within
its cap, links kept as links).
"""

from __future__ import annotations

import posixpath
from typing import Any

from harness.model.errors import SuiteError
from harness.model.profile import Profile
from harness.model.sandbox import LOGS_DIR
from harness.model.state import ContainerStateSpec
from harness.model.suite import Suite, Task
from harness.model.units import MiB
from harness.state.base import AgentInputs, ExportFile, GradePlan, StateKind

ARTIFACT_CAP = 64 * MiB
LOGS_CAP = 16 * MiB


def _spec(task: Task) -> ContainerStateSpec:
    assert isinstance(task.state, ContainerStateSpec)
    return task.state


class ContainerState(StateKind):
    """The sandbox's writable root; see the module docstring."""

    name = "container"

    def check_task(self, files: Any, src: str, task: Task, ctx: Any, problems: list[str]) -> bool:
        return True

    def prepare(self, suite: Suite, task: Task) -> AgentInputs:
        return AgentInputs()

    def _artifacts(self, task: Task) -> list[tuple[ExportFile, str]]:
        paths = [f"{LOGS_DIR}/artifacts", *_spec(task).artifacts]
        out = []
        for i, p in enumerate(dict.fromkeys(paths)):
            name = "logs-artifacts" if i == 0 else f"artifact-{i}"
            out.append((ExportFile(name, ARTIFACT_CAP, path=p, tree=True), posixpath.dirname(p) or "/"))
        return out

    def exports(self, suite: Suite, task: Task, profile: Profile) -> list[ExportFile]:
        return [f for f, _ in self._artifacts(task)] + [ExportFile("logs-agent", LOGS_CAP, path=f"{LOGS_DIR}/agent", tree=True)]

    def carry(self, suite: Suite, task: Task) -> list[tuple[ExportFile, str]]:
        return self._artifacts(task)

    def expectations_plan(self, suite: Suite, task: Task) -> GradePlan:
        # the task model refuses expectations on a container state when the suite is loaded
        raise SuiteError(f"task {task.id}: a `container` state is judged by a verifier ([grader] kind = \"verifier\"), not expectations")
