"""Grader ``expectations``: must / unchanged / allow over the final state, any other change an
extra effect.

The state kind supplies the program (``StateKind.expectations_plan``): for ``sqlite`` and
``files`` a standard-library program copied into the sandbox (``/harness/grade``, written
only once the agent's processes are gone, so the agent never sees what it is graded on) and
run there as ``python3 -I -S``; for ``postgres`` a program run in the database's own service
container. What comes back is one verdict, read from a capped stream and validated against
:class:`~harness.model.grade.Verdict`.
"""

from __future__ import annotations

from pydantic import ValidationError

from harness.model.grade import GradeResult, Verdict
from harness.model.sandbox import ExecResult
from harness.model.suite import Suite, Task
from harness.state.base import GradePlan, Grader, StateKind
from harness.state.sqlite import FIXTURE_PATH, STATE_PATH
from harness.state.sqlite import grade_spec as _sql_spec


def grade_spec(task: Task) -> dict:
    """The sqlite grader's spec for ``task`` (JSON): its expectations and the standard paths."""
    return {**_sql_spec(task), "state_path": STATE_PATH, "fixture_path": FIXTURE_PATH}


def last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1][:300] if lines else ""


def killed(result: ExecResult, oom_killed: bool, timeout_s: float) -> GradeResult | None:
    """The grader was stopped by the grade envelope: the state is ``ungradable`` within it."""
    wall = result.wall_s
    if oom_killed:
        return GradeResult(status="ungradable", wall_s=wall,
                           reason="the final state cannot be read within the grade envelope's memory (the grader was OOM-killed); "
                           "raise [grade] memory in the profile if the state is legitimately large")
    if result.timed_out:
        return GradeResult(status="ungradable", wall_s=wall,
                           reason=f"the final state cannot be read within the grade timeout ({timeout_s:g} s; the grader was killed)")
    return None


class ExpectationsGrader(Grader):
    """Expectations over the final state, graded where the state is (see the module docstring)."""

    name = "expectations"

    def plan(self, suite: Suite, task: Task, kind: StateKind) -> GradePlan:
        return kind.expectations_plan(suite, task)

    def read(self, task: Task, result: ExecResult, oom_killed: bool, timeout_s: float, read_back: dict[str, bytes]) -> GradeResult:
        wall = result.wall_s
        stopped = killed(result, oom_killed, timeout_s)
        if stopped is not None:
            return stopped
        if result.exit_code is None:
            return GradeResult(status="broken", wall_s=wall, reason=f"the grader could not be run: {last_line(result.stderr)}")
        if result.exit_code in (126, 127):
            return GradeResult(status="broken", wall_s=wall,
                               reason=f"the grader could not start (exit {result.exit_code}): the image needs python3 for the "
                               f"{task.state_kind} grader; {last_line(result.stderr or result.stdout)}")
        if result.exit_code != 0:
            return GradeResult(status="broken", wall_s=wall,
                               reason=f"the grader failed (exit {result.exit_code}): {last_line(result.stderr)}")
        # the grader ran to the end on the agent's state: a verdict it could not hand over is the
        # state's doing (graded ungradable, a failure), never a discard the agent could choose
        if result.stdout_truncated:
            return GradeResult(status="ungradable", wall_s=wall,
                               reason=f"the grader's verdict on this state is over its cap ({result.stdout_bytes} bytes)")
        try:
            v = Verdict.model_validate_json(result.stdout)
        except ValidationError as e:
            return GradeResult(status="ungradable", wall_s=wall,
                               reason=f"the grader's verdict on this state is malformed: {str(e).splitlines()[0][:200]}")
        return GradeResult(status=v.status, passed=v.passed and v.status == "graded", reason=v.reason, verdict=v, wall_s=wall)
