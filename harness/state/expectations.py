"""Grader ``expectations``: must / unchanged / allow over a SQLite final state.

The grading itself is :mod:`harness.state.sqlite_grade`, a standard-library program that
this module copies into the sandbox (``/harness/grade``, written only once the agent's
processes are gone, so the agent never sees what it is graded on) and runs there as
``python3 -I -S``. What comes back is one verdict, read from a capped stream and validated
against :class:`~harness.model.grade.Verdict`.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from harness.model.grade import GradeResult, Verdict
from harness.model.sandbox import ExecResult
from harness.model.suite import Suite, Task
from harness.state import sqlite_grade
from harness.state.base import GRADE_DIR, GradeProgram, Grader
from harness.state.sqlite import FIXTURE_PATH, STATE_PATH

PROGRAM = "sqlite_grade.py"
SPEC = "spec.json"
_SOURCE = Path(sqlite_grade.__file__).read_bytes()


def grade_spec(task: Task) -> dict:
    """What the in-sandbox program needs of a task (JSON)."""
    return {
        "task_id": task.id,
        "expect": [e.model_dump(mode="json") for e in task.expect],
        "unchanged": list(task.unchanged),
        "allow": list(task.allow),
        "state_path": STATE_PATH,
        "fixture_path": FIXTURE_PATH,
    }


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1][:300] if lines else ""


class ExpectationsGrader(Grader):
    """Expectations over the final SQLite state, graded in the sandbox."""

    name = "expectations"

    def program(self, suite: Suite, task: Task) -> GradeProgram:
        return GradeProgram(
            files={PROGRAM: _SOURCE, SPEC: json.dumps(grade_spec(task)).encode()},
            cmd=["python3", "-I", "-S", f"{GRADE_DIR}/{PROGRAM}", f"{GRADE_DIR}/{SPEC}"],
        )

    def read(self, result: ExecResult, oom_killed: bool, timeout_s: float) -> GradeResult:
        wall = result.wall_s
        if oom_killed:
            return GradeResult(status="ungradable", wall_s=wall,
                               reason="the final state cannot be read within the grade envelope's memory (the grader was OOM-killed); "
                               "raise [grade] memory in the profile if the state is legitimately large")
        if result.timed_out:
            return GradeResult(status="ungradable", wall_s=wall,
                               reason=f"the final state cannot be read within the grade timeout ({timeout_s:g} s; the grader was killed)")
        if result.exit_code is None:
            return GradeResult(status="broken", wall_s=wall, reason=f"the grader could not be run: {_last_line(result.stderr)}")
        if result.exit_code in (126, 127):
            return GradeResult(status="broken", wall_s=wall,
                               reason=f"the grader could not start (exit {result.exit_code}): the image needs python3 for the sqlite grader; "
                               f"{_last_line(result.stderr or result.stdout)}")
        if result.exit_code != 0:
            return GradeResult(status="broken", wall_s=wall,
                               reason=f"the grader failed (exit {result.exit_code}): {_last_line(result.stderr)}")
        if result.stdout_truncated:
            return GradeResult(status="broken", wall_s=wall, reason=f"the grader printed more than its verdict cap ({result.stdout_bytes} bytes)")
        try:
            v = Verdict.model_validate_json(result.stdout)
        except ValidationError as e:
            return GradeResult(status="broken", wall_s=wall, reason=f"the grader's verdict is malformed: {str(e).splitlines()[0][:200]}")
        return GradeResult(status=v.status, passed=v.passed and v.status == "graded", reason=v.reason, verdict=v, wall_s=wall)
