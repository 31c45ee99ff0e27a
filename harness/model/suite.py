"""Suites and tasks: a named set of tasks plus the image and agent that run them.

A suite is a directory::

    suite.toml          name, image, dockerfile, agent_cmd, profile, trials, k, state_sql, ...
    tasks/*.toml        one task per file (sub-directories allowed); `id` = file stem
    *.sql               the common fixture (`state_sql`) and per-task fixture files
    Dockerfile          the image (build context = the suite directory)

A task's fixture is ``state_sql`` (in order), then its ``fixture`` file, then its inline
``fixture_sql``. Paths are relative to the suite directory and may not leave it.

Pure models. Loading a suite directory (reading every file once, hashing those bytes and
keeping the fixture scripts from the same bytes) is ``harness.engine.suites``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from harness.model.profile import EnvelopeOverride

SLUG = r"^[a-z0-9][a-z0-9_.-]*$"
SUITE_FILE = "suite.toml"
TASKS_DIR = "tasks"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Expectation(_Strict):
    """Something that MUST be true of the final state: a SQL query and its expected result."""

    name: str = Field(..., min_length=1, description="Short label used in the grade's reason, e.g. 'refunds'.")
    query: str = Field(..., min_length=1, description="A read-only SQL query run against the final state.")
    rows: list[Any] | None = Field(
        None,
        description="Expected result rows: arrays (positional, all columns of the query) or tables "
        "(column name -> value; only the named columns are compared). Order-insensitive unless "
        "`ordered = true`. TOML has no null: test for NULL in the query (`x IS NULL`).",
    )
    count: int | None = Field(None, ge=0, description="Expected number of result rows (instead of `rows`).")
    ordered: bool = Field(False, description="Compare `rows` in order (the query should have ORDER BY).")

    @field_validator("rows", mode="before")
    @classmethod
    def _rows_shape(cls, v: Any) -> Any:
        if v is None:
            return v
        if not isinstance(v, list):
            raise ValueError("must be an array of rows: arrays (positional) or tables (column = value)")
        kinds = {type(r) for r in v}
        if not kinds <= {list, dict} or len(kinds) > 1:
            raise ValueError("rows must be all arrays (positional) or all tables (column = value), not a mix")
        for i, r in enumerate(v):
            for val in (r.values() if isinstance(r, dict) else r):
                if not isinstance(val, (int, float, str, bool)):
                    raise ValueError(f"row {i}: {val!r} is not a number, string or boolean "
                                     "(quote dates; test for NULL in the query with `x IS NULL`)")
        if kinds == {dict} and len({tuple(r) for r in v}) > 1:
            raise ValueError("all table rows must name the same columns")
        return v

    @model_validator(mode="after")
    def _one_of(self) -> "Expectation":
        if (self.rows is None) == (self.count is None):
            raise ValueError("give exactly one of `rows` or `count`")
        if self.ordered and self.rows is None:
            raise ValueError("`ordered` only applies to `rows`")
        return self


class Task(_Strict):
    """One prompt + fixture state + expectations. Graded by the state it leaves, not the transcript."""

    id: str = Field(..., pattern=SLUG, description="Task id: a slug equal to the file stem.")
    title: str = Field(..., min_length=1, description="One line for reports.")
    prompt: str = Field(..., min_length=1, description="What the agent is given (written to the prompt file).")
    fixture_sql: str | None = Field(None, description="Inline SQL applied after the suite's state_sql (and after `fixture`).")
    fixture: str | None = Field(None, description="Path of a .sql file, relative to the suite directory, applied after state_sql.")
    tags: list[str] = Field(default_factory=list, description="Free-form labels for filtering and reports.")
    envelope: EnvelopeOverride | None = Field(None, description="Overrides of the suite profile's envelope for this task.")
    expect: list[Expectation] = Field(default_factory=list, description="What must be true after the run.")
    unchanged: list[str] = Field(default_factory=list, description="Tables that must equal the fixture exactly.")
    allow: list[str] = Field(
        default_factory=list,
        description="What the agent may change: 'table' (any row change) or 'table.column' (updates of that "
        "column only). Any other difference from the fixture is an extra effect and fails the task.",
    )

    _source: Path | None = PrivateAttr(None)

    @property
    def source(self) -> Path | None:
        """The task file this task was loaded from."""
        return self._source

    @property
    def state_kind(self) -> str:
        """What the agent changes (``harness.state``): one SQLite database."""
        return "sqlite"

    @property
    def grader(self) -> str:
        """How the final state is judged (``harness.state``): the expectations above."""
        return "expectations"

    @model_validator(mode="after")
    def _conflicts(self) -> "Task":
        allowed_tables = {a.split(".", 1)[0] for a in self.allow}
        both = sorted(set(self.unchanged) & allowed_tables)
        if both:
            raise ValueError(f"table(s) {', '.join(both)} are both in `unchanged` and `allow`")
        return self

    @field_validator("allow")
    @classmethod
    def _allow_shape(cls, v: list[str]) -> list[str]:
        for item in v:
            if item.count(".") > 1 or not all(part for part in item.split(".")):
                raise ValueError(f"{item!r} is not 'table' or 'table.column'")
        return v


class SuiteSpec(_Strict):
    """The contents of ``suite.toml``."""

    name: str = Field(..., pattern=SLUG, description="Suite name (the built-in ones equal their directory name).")
    description: str = Field("", description="One line on what the suite measures.")
    image: str = Field(..., min_length=1, description="Docker tag the trials run in, e.g. 'harness/refunds:latest'.")
    dockerfile: str = Field(
        "Dockerfile",
        description="Dockerfile path relative to the suite directory; the build context is the suite "
        "directory and the file takes `ARG BASE=harness/sandbox:latest`.",
    )
    agent_cmd: list[str] = Field(..., min_length=1, description="The agent command run inside the container, e.g. ['refundbot'].")
    profile: str = Field("standard", min_length=1, description="Default sandbox profile name.")
    trials: int = Field(8, ge=1, le=10_000, description="n: trial slots per task.")
    k: list[int] = Field(default_factory=lambda: [1], min_length=1, description="k values to report pass@k / pass^k for; each <= trials.")
    max_reruns: int = Field(3, ge=0, le=100, description="Reruns of a slot whose attempts are discarded (SLA breach) before it ends unmeasured.")
    state_sql: list[str] = Field(..., min_length=1, description="SQL files (relative to the suite dir) building the common fixture: schema, then base rows.")
    agent_env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for the agent.")

    @field_validator("k")
    @classmethod
    def _k_within_trials(cls, v: list[int], info: ValidationInfo) -> list[int]:
        trials = info.data.get("trials")
        for k in v:
            if k < 1:
                raise ValueError(f"k = {k} must be >= 1")
            if trials is not None and k > trials:
                raise ValueError(f"k = {k} exceeds trials = {trials}; raise trials or drop k = {k}")
        if len(set(v)) != len(v):
            raise ValueError("k values must be distinct")
        return sorted(v)

    @field_validator("agent_env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not key or "=" in key or key.startswith("HARNESS_"):
                raise ValueError(f"{key!r} is not allowed (empty, contains '=', or a reserved HARNESS_ name)")
        return v


class Suite(SuiteSpec):
    """A loaded, validated suite: its spec, where it lives, its tasks (sorted by id), and what
    was read from disk when it was loaded. Nothing is read again later: a file changed on disk
    in the middle of a run cannot change the run (its hash was fixed from the same bytes)."""

    root: Path = Field(..., description="The suite directory.")
    tasks: list[Task] = Field(default_factory=list, description="Tasks, sorted by id.")
    content_hash: str = Field(..., description="sha256 over every file of the suite directory (relative path + bytes).")
    fixtures: dict[str, str] = Field(
        default_factory=dict,
        description="Task id -> the complete fixture script (state_sql, fixture file, inline SQL), as read at load time.",
    )
    image_files: list[str] = Field(
        default_factory=list,
        description="Files of the suite directory that are image inputs (relative POSIX paths): everything but "
        "suite.toml, tasks/ and the fixture files, which reach a trial at run time, never through the image.",
    )

    def task(self, task_id: str) -> Task:
        """The task with this id; KeyError names the ones available."""
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise KeyError(f"suite {self.name} has no task {task_id!r}; tasks: {', '.join(t.id for t in self.tasks)}")

    @property
    def dockerfile_path(self) -> Path:
        return self.root / self.dockerfile

    def fixture_sql(self, task: Task) -> str:
        """The complete SQL script that builds ``task``'s fixture, as read when the suite was loaded."""
        return self.fixtures[task.id]
