"""Suites: a named set of tasks plus the image and agent that run them.

A suite is a directory::

    suite.toml          name, image, dockerfile, agent_cmd, profile, trials, k, state_sql, ...
    tasks/*.toml        one task per file (sub-directories allowed); `id` = file stem
    *.sql               the common fixture (`state_sql`) and per-task fixture files
    Dockerfile          the image (build context = the suite directory)

A task's fixture is ``state_sql`` (in order), then its ``fixture`` file, then its inline
``fixture_sql``; ``Suite.fixture_sql(task)`` returns that script. Paths are relative to the
suite directory and may not leave it.

Pure module: pydantic models, TOML and stdlib sqlite3 (an in-memory build of every task's
fixture at load time, so a broken fixture fails at load, not in the middle of a run).
No Docker. ``load_suite("refunds")`` resolves a built-in suite shipped in
``harness/suites/``; anything else is a path to a suite directory.
"""

from __future__ import annotations

import difflib
import hashlib
import sqlite3
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, field_validator, model_validator

from harness.profile import EnvelopeOverride, format_validation_error

SLUG = r"^[a-z0-9][a-z0-9_.-]*$"
SUITE_FILE = "suite.toml"
TASKS_DIR = "tasks"
# Never part of the content hash: caches that differ between machines and do not change the suite.
_HASH_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".git"}
_HASH_SKIP_SUFFIXES = (".pyc", ".pyo", ".swp")
_HASH_SKIP_NAMES = {".DS_Store"}


class SuiteError(ValueError):
    """A suite that cannot be used. One line per problem: ``file: key: message``."""


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
    """A loaded, validated suite: its spec, where it lives and its tasks (sorted by id)."""

    root: Path = Field(..., description="The suite directory.")
    tasks: list[Task] = Field(default_factory=list, description="Tasks, sorted by id.")

    def task(self, task_id: str) -> Task:
        """The task with this id; KeyError names the ones available."""
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise KeyError(f"suite {self.name} has no task {task_id!r}; tasks: {', '.join(t.id for t in self.tasks)}")

    @property
    def dockerfile_path(self) -> Path:
        return self.root / self.dockerfile

    def state_sql_text(self) -> str:
        """The suite's common fixture script (state_sql files in order)."""
        parts = []
        for rel in self.state_sql:
            parts.append(f"-- harness: {SUITE_FILE} state_sql {rel}\n{(self.root / rel).read_text()}")
        return "\n".join(parts)

    def fixture_sql(self, task: Task) -> str:
        """The complete SQL script that builds ``task``'s fixture: state_sql, fixture file, inline SQL."""
        parts = [self.state_sql_text()]
        if task.fixture:
            parts.append(f"-- harness: task {task.id} fixture {task.fixture}\n{(self.root / task.fixture).read_text()}")
        if task.fixture_sql:
            parts.append(f"-- harness: task {task.id} fixture_sql\n{task.fixture_sql}")
        return "\n".join(parts) + "\n"

    def hashed_files(self) -> list[Path]:
        """Files covered by :meth:`content_hash`: everything in the suite directory (it is the image
        build context, and holds suite.toml, the tasks and the SQL), minus caches."""
        return _suite_files(self.root)

    def content_hash(self) -> str:
        """sha256 over the suite's files (relative POSIX path + bytes), independent of mtimes,
        permissions and absolute location, so the same suite hashes the same on every machine."""
        h = hashlib.sha256(b"harness-suite-v1\0")
        for f in self.hashed_files():
            rel = f.relative_to(self.root).as_posix().encode()
            data = f.read_bytes()
            h.update(rel + b"\0" + str(len(data)).encode() + b"\0" + hashlib.sha256(data).digest())
        return h.hexdigest()


def _suite_files(root: Path) -> list[Path]:
    out = []
    for f in root.rglob("*"):
        rel = f.relative_to(root)
        if any(part in _HASH_SKIP_DIRS for part in rel.parts):
            continue
        if f.is_file() and f.name not in _HASH_SKIP_NAMES and not f.name.endswith(_HASH_SKIP_SUFFIXES):
            out.append(f)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def _format_error(src: str, err: ValidationError, model: type[BaseModel]) -> str:
    """format_validation_error, plus a "did you mean" for misspelt keys."""
    lines = format_validation_error(src, err).splitlines()
    nested = {"expect": Expectation, "envelope": EnvelopeOverride}
    out = []
    for line, e in zip(lines, err.errors()):
        if e["type"] == "extra_forbidden":
            loc = e["loc"]
            owner = model if len(loc) == 1 else nested.get(str(loc[0]), None)
            if owner is not None:
                close = difflib.get_close_matches(str(loc[-1]), list(owner.model_fields), n=1)
                if close:
                    line += f" (did you mean {close[0]!r}?)"
        out.append(line)
    return "\n".join(out)


def _display(path: Path) -> str:
    """A path as errors show it: relative to the working directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _inside(root: Path, rel: str) -> Path | None:
    """``root/rel`` if it stays inside ``root``, else None."""
    p = (root / rel).resolve()
    try:
        p.relative_to(root.resolve())
    except ValueError:
        return None
    return p


def _read_toml(path: Path, problems: list[str]) -> dict[str, Any] | None:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        problems.append(f"{_display(path)}: not valid TOML: {e}")
    except (OSError, UnicodeDecodeError) as e:
        problems.append(f"{_display(path)}: cannot read: {e}")
    return None


def _sql_error(e: sqlite3.Error) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _tables(conn: sqlite3.Connection) -> dict[str, list[str]]:
    names = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    return {n: [r[1] for r in conn.execute(f'PRAGMA table_info("{n}")')] for n in names}


def builtin_suites_dir() -> Path:
    return Path(str(resources.files("harness") / "suites"))


def builtin_suites() -> list[str]:
    """Names of the suites shipped in ``harness/suites/``."""
    d = builtin_suites_dir()
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if (p / SUITE_FILE).is_file())


def resolve_suite_dir(name_or_path: str | Path) -> Path:
    """A built-in suite name (``refunds``) or a path to a suite directory -> the directory."""
    s = str(name_or_path)
    if "/" not in s and s in builtin_suites():
        return builtin_suites_dir() / s
    p = Path(s)
    if p.is_dir():
        return p
    if p.is_file() and p.name == SUITE_FILE:
        return p.parent
    raise SuiteError(
        f"unknown suite {s!r}: not a built-in suite ({', '.join(builtin_suites()) or 'none'}) "
        f"and not a directory with a {SUITE_FILE}"
    )


def load_suite(name_or_path: str | Path) -> Suite:
    """Load and validate a suite. Raises :class:`SuiteError` listing every problem found, one
    line each, naming the file and the key (``tasks/a.toml: expect.0.rows: ...``)."""
    root = resolve_suite_dir(name_or_path)
    problems: list[str] = []
    suite_toml = root / SUITE_FILE
    if not suite_toml.is_file():
        raise SuiteError(f"{_display(suite_toml)}: missing; a suite directory needs a {SUITE_FILE}")
    spec: SuiteSpec | None = None
    data = _read_toml(suite_toml, problems)
    if data is not None:
        try:
            spec = SuiteSpec.model_validate(data)
        except ValidationError as e:
            problems.append(_format_error(_display(suite_toml), e, SuiteSpec))

    base: sqlite3.Connection | None = None
    if spec is not None:
        base = _check_suite_files(root, suite_toml, spec.dockerfile, spec.state_sql, problems)
    elif data is not None:
        # suite.toml has other problems; still check its files when those keys are well-formed,
        # so one load reports as much as possible.
        sql, df = data.get("state_sql"), data.get("dockerfile", "Dockerfile")
        if isinstance(sql, list) and sql and all(isinstance(x, str) for x in sql) and isinstance(df, str):
            base = _check_suite_files(root, suite_toml, df, sql, problems)

    tasks = _load_tasks(root, base, problems)
    if base is not None:
        base.close()
    if problems or spec is None:
        raise SuiteError("\n".join(problems))
    return Suite(**spec.model_dump(), root=root, tasks=tasks)


def _check_suite_files(root: Path, suite_toml: Path, dockerfile: str, state_sql: list[str],
                       problems: list[str]) -> sqlite3.Connection | None:
    """Check dockerfile and state_sql; return an in-memory db with the common fixture built."""
    src = _display(suite_toml)
    df = _inside(root, dockerfile)
    if df is None:
        problems.append(f"{src}: dockerfile: {dockerfile!r} is outside the suite directory (the build context)")
    elif not df.is_file():
        problems.append(f"{src}: dockerfile: no such file {_display(root / dockerfile)}")
    conn = sqlite3.connect(":memory:")
    ok = True
    for i, rel in enumerate(state_sql):
        p = _inside(root, rel)
        if p is None:
            problems.append(f"{src}: state_sql.{i}: {rel!r} is outside the suite directory")
            ok = False
        elif not p.is_file():
            problems.append(f"{src}: state_sql.{i}: no such file {_display(root / rel)}")
            ok = False
        elif ok:
            try:
                conn.executescript(p.read_text())
            except sqlite3.Error as e:
                problems.append(f"{src}: state_sql.{i}: {rel}: SQL error: {_sql_error(e)}")
                ok = False
    if not ok:
        conn.close()
        return None
    return conn


def _load_tasks(root: Path, base: sqlite3.Connection | None, problems: list[str]) -> list[Task]:
    tdir = root / TASKS_DIR
    files = sorted(tdir.rglob("*.toml")) if tdir.is_dir() else []
    if not files:
        problems.append(f"{_display(tdir)}: no task files (tasks/*.toml)")
    tasks: list[Task] = []
    seen: dict[str, Path] = {}
    for f in files:
        src = _display(f)
        data = _read_toml(f, problems)
        if data is None:
            continue
        try:
            task = Task.model_validate(data)
        except ValidationError as e:
            problems.append(_format_error(src, e, Task))
            continue
        task._source = f
        if task.id != f.stem:
            problems.append(f"{src}: id: {task.id!r} must equal the file stem {f.stem!r}")
            continue
        if task.id in seen:
            problems.append(f"{src}: id: duplicate task id {task.id!r} (also in {_display(seen[task.id])})")
            continue
        seen[task.id] = f
        if _check_task_fixture(root, src, task, base, problems):
            tasks.append(task)
    return sorted(tasks, key=lambda t: t.id)


def _check_task_fixture(root: Path, src: str, task: Task, base: sqlite3.Connection | None, problems: list[str]) -> bool:
    """Build the task's fixture once in memory; check its SQL, expectation queries and table names."""
    fixture_text = None
    if task.fixture is not None:
        p = _inside(root, task.fixture)
        if p is None:
            problems.append(f"{src}: fixture: {task.fixture!r} is outside the suite directory")
            return False
        if not p.is_file():
            problems.append(f"{src}: fixture: no such file {_display(root / task.fixture)}")
            return False
        fixture_text = p.read_text()
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
        tables = _tables(conn)
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
        conn.execute("PRAGMA query_only = ON")
        for i, exp in enumerate(task.expect):
            try:
                cur = conn.execute(exp.query)
                cols = [d[0] for d in cur.description or []]
                cur.fetchall()
            except sqlite3.Error as e:
                problems.append(f"{src}: expect.{i}.query: SQL error against the fixture: {_sql_error(e)}")
                ok = False
                continue
            if not cols:
                problems.append(f"{src}: expect.{i}.query: returns no columns (expect queries must be SELECTs)")
                ok = False
                continue
            if exp.rows:
                for j, row in enumerate(exp.rows):
                    if isinstance(row, dict):
                        missing = [c for c in row if c not in cols]
                        if missing:
                            problems.append(f"{src}: expect.{i}.rows.{j}: column(s) {', '.join(missing)} not in the query's columns ({', '.join(cols)})")
                            ok = False
                    elif len(row) != len(cols):
                        problems.append(f"{src}: expect.{i}.rows.{j}: {len(row)} values but the query returns {len(cols)} columns ({', '.join(cols)})")
                        ok = False
        return ok
    finally:
        conn.close()
