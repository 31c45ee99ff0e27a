"""The verdict a grader prints inside the sandbox: the only agent-influenced data the
controller parses. Read from a size-capped stream, then validated against these models,
whose lists and strings are bounded too."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_VERDICT_BYTES = 256 * 1024  # what the controller reads of a grader's stdout; a verdict must fit


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class Check(_M):
    """One graded condition."""

    name: str = Field(..., max_length=300, description="Expectation name, 'unchanged: TABLE', 'no extra effects' or 'readable final state'.")
    kind: Literal["state", "expect", "unchanged", "extra_effects", "reward", "test"] = Field(
        ..., description="What it checks: 'state' (the final state could be read), an expectation, an unchanged table or "
        "path, the extra-effects diff, a verifier's reward, or one test of a verifier's report.")
    passed: bool = Field(..., description="Whether the condition holds.")
    detail: str | None = Field(None, max_length=600, description="One line on what was found when it failed.")


class RowChange(_M):
    """One row present before and after whose values differ (values shortened)."""

    key: dict[str, Any] = Field(..., description="Key column(s) -> value identifying the row.")
    columns: list[str] = Field(..., description="Columns whose value changed.")
    before: dict[str, Any] = Field(..., description="Changed columns' values in the fixture.")
    after: dict[str, Any] = Field(..., description="Changed columns' values in the final state.")


class DiffCounts(_M):
    added: int = Field(0, ge=0, description="Rows only in the final state (all of them, shown or not).")
    removed: int = Field(0, ge=0, description="Rows only in the fixture.")
    changed: int = Field(0, ge=0, description="Rows in both whose values differ.")


class TableDiff(_M):
    """Differences of one table between fixture and final state: true counts, first rows."""

    table: str = Field(..., max_length=1000, description="Table name.")
    status: Literal["changed", "added", "removed"] = Field(
        "changed", description="'added': the table is new (not in the fixture); 'removed': dropped.")
    key: list[str] = Field(default_factory=list, description="Columns rows are matched by (primary key, or rowid).")
    counts: DiffCounts = Field(default_factory=DiffCounts, description="How many rows differ, in full.")
    added: list[dict[str, Any]] = Field(default_factory=list, max_length=20, description="First rows only in the final state.")
    removed: list[dict[str, Any]] = Field(default_factory=list, max_length=20, description="First rows only in the fixture.")
    changed: list[RowChange] = Field(default_factory=list, max_length=20, description="First changed rows.")
    columns_added: list[str] = Field(default_factory=list, max_length=100, description="Columns only in the final state (first 100).")
    columns_removed: list[str] = Field(default_factory=list, max_length=100, description="Columns only in the fixture (first 100).")
    truncated: bool = Field(False, description="More rows differ than are shown.")
    changed_outside_allowed: int = Field(0, ge=0, description="Changed rows with a column the task does not allow.")
    outside_allowed: list[RowChange] = Field(default_factory=list, max_length=20, description="First of those, with only the disallowed columns.")
    replaced_by: Literal["view"] | None = Field(None, description="A dropped table whose name a view now has.")
    blobs: int = Field(0, ge=0, description="BLOB values in columns whose declared type makes them TEXT or a number (none in the fixture).")
    blob_examples: list[dict[str, Any]] = Field(default_factory=list, max_length=20, description="First of those: column, type, row.")


class StateDiff(_M):
    """Per-table differences final vs fixture, capped: at most 50 tables, 20 rows of each kind
    per table, text values cut at 200 characters; the counts are always complete."""

    tables: list[TableDiff] = Field(default_factory=list, max_length=50, description="Tables that differ, sorted by name.")
    tables_total: int = Field(0, ge=0, description="How many tables differ (shown or not).")
    truncated: bool = Field(False, description="Some tables or rows are not shown.")
    lines: list[str] = Field(default_factory=list, max_length=40, description="The differences in words, first 40.")
    lines_total: int = Field(0, ge=0, description="How many such lines there are.")
    schema_changes: list[str] = Field(default_factory=list, max_length=40, description="Indexes, triggers, views added, dropped "
                                      "or redefined, and tables redefined (first 40); always extra effects.")
    schema_changes_total: int = Field(0, ge=0, description="How many schema changes there are.")

    @property
    def empty(self) -> bool:
        return self.tables_total == 0 and self.schema_changes_total == 0

    def table(self, name: str) -> TableDiff | None:
        return next((t for t in self.tables if t.table == name), None)


class FileChange(_M):
    """One path of a ``files`` state that differs from the fixture."""

    path: str = Field(..., max_length=1100, description="Absolute path in the sandbox (shortened).")
    change: Literal["added", "removed", "modified", "type", "mode"] = Field(..., description="What happened to it.")
    detail: str | None = Field(None, max_length=300, description="Sizes, file types or modes before -> after.")


class FilesDiff(_M):
    """Paths final vs fixture, capped: the first 200 changes, the count complete."""

    changes: list[FileChange] = Field(default_factory=list, max_length=200, description="Changed paths, sorted.")
    total: int = Field(0, ge=0, description="How many paths differ (shown or not).")
    truncated: bool = Field(False, description="Some changes are not shown.")
    lines: list[str] = Field(default_factory=list, max_length=40, description="The differences in words, first 40.")

    @property
    def empty(self) -> bool:
        return self.total == 0


class Verdict(_M):
    """What a grader prints: graded (pass or fail, with the checks and the capped diff) or
    ungradable (the agent left a state that cannot be read within the grade envelope)."""

    version: Literal[1] = Field(1, description="Verdict format version.")
    status: Literal["graded", "ungradable"] = Field(..., description="Whether the final state could be graded.")
    passed: bool = Field(..., description="All checks passed (always false when ungradable).")
    reason: str | None = Field(None, max_length=600, description="One line: the first failing check (None when passed).")
    checks: list[Check] = Field(default_factory=list, max_length=200, description="Checks in order, first 200.")
    checks_total: int = Field(0, ge=0, description="How many checks there were.")
    diff: StateDiff | None = Field(None, description="Final state vs fixture, per table (SQL kinds; None when not read).")
    files: FilesDiff | None = Field(None, description="Final state vs fixture, per path (the files kind).")


class GradeResult(_M):
    """The grade phase as the controller saw it (the verdict, or why there is none)."""

    status: Literal["graded", "ungradable", "broken"] = Field(
        ..., description="graded / ungradable as the verdict says; ungradable also when the grader was killed by the "
        "envelope (memory, wall clock); broken: the grader failed on its own (an infrastructure error).")
    passed: bool = Field(False, description="The task passed.")
    reason: str | None = Field(None, description="One line on the grade (the failing check, or why ungradable/broken).")
    verdict: Verdict | None = Field(None, description="The verdict as printed, when there was one.")
    wall_s: float = Field(0.0, ge=0, description="Seconds the grader ran.")
    reward: float | None = Field(None, description="A verifier's reward.")
    rewards: dict[str, float] = Field(default_factory=dict, description="Every value of a reward.json.")
    checks: list[Check] = Field(default_factory=list, max_length=200, description="Checks of a verifier (reward, report tests).")
