"""State kind ``sqlite``: the agent changes one SQLite database, ``/work/state.db``.

At load time every task's fixture is built in memory (the suite's ``state_sql``, then the
task's ``fixture`` file, then its inline ``fixture_sql``) and every expectation query is run
against it, so a broken fixture fails at load. For a run, each task's fixture database is
built once, here, from that trusted SQL; it is an input of every attempt
(``/harness/in/fixture.db``, read-only), the setup phase copies it to ``/work/state.db`` for
the agent, and the grader compares the final state with the same file -- so the state the
agent started from and the one it is graded against are the same bytes. Kept as evidence:
the final ``state.db`` (and ``-wal``) and the transcript.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
import threading
from pathlib import Path
from typing import Any

from harness.model.profile import Profile
from harness.model.sandbox import GRADE_DIR, TRANSCRIPT_FILE
from harness.model.suite import SUITE_FILE, Suite, SuiteSpec, Task
from harness.model.units import MiB
from harness.state import sqlite_grade
from harness.state.base import INPUT_DIR, WORKDIR, AgentInputs, ExportFile, GradePlan, StateKind

STATE_FILE = "state.db"
FIXTURE_FILE = "fixture.db"
STATE_PATH = f"{WORKDIR}/{STATE_FILE}"
FIXTURE_PATH = f"{INPUT_DIR}/{FIXTURE_FILE}"
EVIDENCE_CAP = 64 * MiB  # state.db and state.db-wal kept up to this size each
TRANSCRIPT_CAP = 16 * MiB  # the transcript's first 16 MiB are kept

SETUP = ["install", "-m", "0644", FIXTURE_PATH, STATE_PATH]  # a copy the agent owns and may write
GRADE_PROGRAM = "sqlite_grade.py"
GRADE_SPEC = "spec.json"
_GRADE_SOURCE = Path(sqlite_grade.__file__).read_bytes()
_BUILT: dict[tuple[str, str], bytes] = {}
_BUILT_LOCK = threading.Lock()


def build_fixture_db(sql: str) -> bytes:
    """The bytes of a SQLite database built from ``sql`` (the suite's, trusted)."""
    with tempfile.TemporaryDirectory(prefix="harness-fixture-") as d:
        path = Path(d) / "fixture.db"
        conn = sqlite3.connect(path)
        try:
            conn.executescript(sql)
            conn.commit()
        finally:
            conn.close()
        return path.read_bytes()


def _sql_error(e: sqlite3.Error) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _tables(conn: sqlite3.Connection) -> dict[str, list[str]]:
    names = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name")]
    return {n: [r[1] for r in conn.execute(f'PRAGMA table_info("{n}")')] for n in names}


class SqliteState(StateKind):
    """One SQLite file built from SQL scripts; see the module docstring."""

    name = "sqlite"

    def check_suite(self, files: Any, spec: SuiteSpec, src: str, problems: list[str]) -> sqlite3.Connection | None:
        """Build the common fixture (``state_sql`` in order) in memory; None when broken."""
        sources = list(spec.state_sql)
        if not check_sql_sources(files, sources, src, problems):
            return None
        conn = sqlite3.connect(":memory:")
        ok = True
        for i, rel in enumerate(sources):
            try:
                conn.executescript(files.text(rel))
            except sqlite3.Error as e:
                problems.append(f"{src}: state_sql.{i}: {rel}: SQL error: {_sql_error(e)}")
                ok = False
                break
        if not ok:
            conn.close()
            return None
        return conn

    def close_suite(self, ctx: Any) -> None:
        if ctx is not None:
            ctx.close()

    def check_task(self, files: Any, src: str, task: Task, base: sqlite3.Connection | None, problems: list[str]) -> bool:
        """Build the task's fixture once in memory; check its SQL, expectation queries and table names."""
        if not check_fixture_file(files, src, task, problems):
            return False
        fixture_text = files.text(task.fixture) if task.fixture is not None else None
        if base is None:
            return True  # the common fixture is broken (already reported); nothing to build on
        conn = sqlite3.connect(":memory:")
        try:
            base.backup(conn)
            for key, script in (("fixture", fixture_text), ("fixture_sql", task.fixture_sql)):
                if script is None:
                    continue
                try:
                    conn.executescript(script)
                except sqlite3.Error as e:
                    problems.append(f"{src}: {key}: SQL error: {_sql_error(e)}")
                    return False
            return _check_names(src, task, _tables(conn), problems) & _check_queries(src, task, conn, problems)
        finally:
            conn.close()

    def fixture_text(self, files: Any, spec: SuiteSpec, task: Task) -> str:
        return sql_fixture_text(files, spec, task)

    def runtime_files(self, spec: SuiteSpec, task: Task) -> list[str]:
        return [*spec.state_sql, *([task.fixture] if task.fixture else [])]

    def fixture_db(self, suite: Suite, task: Task) -> bytes:
        """The task's fixture database, built once per suite content and task."""
        key = (suite.content_hash, task.id)
        with _BUILT_LOCK:
            if key not in _BUILT:
                _BUILT[key] = build_fixture_db(suite.fixture_sql(task))
            return _BUILT[key]

    def prepare(self, suite: Suite, task: Task) -> AgentInputs:
        return AgentInputs(files={FIXTURE_FILE: self.fixture_db(suite, task)}, setup=[list(SETUP)], env={"HARNESS_STATE": STATE_PATH})

    def exports(self, suite: Suite, task: Task, profile: Profile) -> list[ExportFile]:
        return [
            ExportFile(STATE_FILE, EVIDENCE_CAP),
            ExportFile(STATE_FILE + "-wal", EVIDENCE_CAP),
            ExportFile(TRANSCRIPT_FILE, TRANSCRIPT_CAP, keep_head=True),
        ]

    def carry(self, suite: Suite, task: Task) -> list[tuple[ExportFile, str]]:
        return [(ExportFile("state", EVIDENCE_CAP, path=WORKDIR, tree=True), "/")]  # the tree's top entry is "work"

    def expectations_plan(self, suite: Suite, task: Task) -> GradePlan:
        spec = {**grade_spec(task), "state_path": STATE_PATH, "fixture_path": FIXTURE_PATH}
        return GradePlan(
            files={GRADE_PROGRAM: _GRADE_SOURCE, GRADE_SPEC: json.dumps(spec).encode()},
            cmd=["python3", "-I", "-S", f"{GRADE_DIR}/{GRADE_PROGRAM}", f"{GRADE_DIR}/{GRADE_SPEC}"],
        )


def grade_spec(task: Task) -> dict:
    """What an in-sandbox SQL grader needs of a task (JSON)."""
    return {
        "task_id": task.id,
        "expect": [e.model_dump(mode="json") for e in task.expect],
        "unchanged": list(task.unchanged),
        "allow": list(task.allow),
    }


def check_sql_sources(files: Any, sources: list[str], src: str, problems: list[str]) -> bool:
    """The suite's ``state_sql`` files exist inside the suite."""
    return all([files.check(rel, src, f"state_sql.{i}", problems) for i, rel in enumerate(sources)])


def check_fixture_file(files: Any, src: str, task: Task, problems: list[str]) -> bool:
    """A task's ``fixture`` file exists inside the suite."""
    return task.fixture is None or files.check(task.fixture, src, "fixture", problems)


def sql_fixture_text(files: Any, spec: SuiteSpec, task: Task) -> str:
    """state_sql, then the task's fixture file, then its inline SQL, as one script."""
    parts = [f"-- harness: {SUITE_FILE} state_sql {rel}\n{files.text(rel)}" for rel in spec.state_sql]
    if task.fixture:
        parts.append(f"-- harness: task {task.id} fixture {task.fixture}\n{files.text(task.fixture)}")
    if task.fixture_sql:
        parts.append(f"-- harness: task {task.id} fixture_sql\n{task.fixture_sql}")
    return "\n".join(parts) + "\n"


def _check_names(src: str, task: Task, tables: dict[str, list[str]], problems: list[str]) -> bool:
    ok = True
    for key in ("unchanged", "allow"):
        for i, item in enumerate(getattr(task, key)):
            table, _, column = item.partition(".")
            if table not in tables:
                problems.append(f"{src}: {key}.{i}: no table {table!r} in the fixture (tables: {', '.join(tables)})")
                ok = False
            elif column and column not in tables[table]:
                problems.append(f"{src}: {key}.{i}: table {table!r} has no column {column!r}")
                ok = False
    return ok


def _check_queries(src: str, task: Task, conn: sqlite3.Connection, problems: list[str]) -> bool:
    ok = True
    conn.execute("PRAGMA query_only = ON")
    for i, exp in enumerate(task.expect):
        try:
            cur = conn.execute(exp.query)
            cols = [d[0] for d in cur.description or []]
            cur.fetchall()
        except sqlite3.Error as e:
            why = _sql_error(e)
            if "readonly" in why:
                why = "it writes; expectation queries must be read-only SELECTs"
            problems.append(f"{src}: expect.{i}.query: SQL error against the fixture: {why}")
            ok = False
            continue
        if not cols:
            problems.append(f"{src}: expect.{i}.query: returns no columns (expect queries must be SELECTs)")
            ok = False
            continue
        for j, row in enumerate(exp.rows or []):
            if isinstance(row, dict):
                missing = [c for c in row if c not in cols]
                if missing:
                    problems.append(f"{src}: expect.{i}.rows.{j}: column(s) {', '.join(missing)} not in the query's columns ({', '.join(cols)})")
                    ok = False
            elif len(row) != len(cols):
                problems.append(f"{src}: expect.{i}.rows.{j}: {len(row)} values but the query returns {len(cols)} columns ({', '.join(cols)})")
                ok = False
    return ok
