"""Grading by outcome: the state a trial leaves behind, compared with its fixture.

Pure module (stdlib sqlite3 + pydantic models; no Docker). A task passes when

1. every ``expect`` query returns what the task says (rows or a count),
2. every table in ``unchanged`` equals the fixture, and
3. the full diff final-vs-fixture has nothing the task's ``allow`` list does not cover
   (anything else is an *extra effect*).

The final state comes from untrusted code, so it is opened read-only and immutable, its
size is capped, its header checked, schema functions distrusted and every read bounded in
time; a file that cannot be read is a failing grade, never an exception. The grader never
sees the transcript.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field

from harness.profile import MiB, format_size
from harness.suite import Expectation, Task

DEFAULT_MAX_BYTES = 256 * MiB  # the default /work tmpfs: a state file cannot legitimately be larger
DEFAULT_TIME_LIMIT = 20.0  # seconds for reading one state (snapshot or expectation queries)
SQLITE_HEADER = b"SQLite format 3\x00"
NOT_READABLE = "final state is not a readable SQLite database"
ROWID = "rowid"  # key column name used for tables without a declared primary key
_MAX_QUERY_ROWS = 10_000


class StateError(Exception):
    """A state file that cannot be read as a SQLite database (the message says why)."""


class State(dict):
    """A snapshot: table -> rows (column -> value), rows sorted by key.

    ``key_columns[table]`` identify a row: the primary key, or ``rowid`` (then included in
    the rows) for tables without one. ``columns[table]`` lists the table's real columns."""

    def __init__(self, tables: dict[str, list[dict[str, Any]]] | None = None,
                 key_columns: dict[str, list[str]] | None = None, columns: dict[str, list[str]] | None = None):
        super().__init__(tables or {})
        self.key_columns: dict[str, list[str]] = dict(key_columns or {})
        self.columns: dict[str, list[str]] = dict(columns or {})


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RowChange(_M):
    """One row present before and after whose values differ."""

    key: dict[str, Any] = Field(..., description="Key column(s) -> value identifying the row.")
    columns: list[str] = Field(..., description="Columns whose value changed.")
    before: dict[str, Any] = Field(..., description="Changed columns' values in the fixture.")
    after: dict[str, Any] = Field(..., description="Changed columns' values in the final state.")


class TableDiff(_M):
    """Differences of one table between fixture and final state."""

    table: str = Field(..., description="Table name.")
    status: Literal["changed", "added", "removed"] = Field(
        "changed", description="'added': the table is new (not in the fixture); 'removed': dropped.")
    key: list[str] = Field(default_factory=list, description="Columns rows are matched by (primary key, or rowid).")
    added: list[dict[str, Any]] = Field(default_factory=list, description="Rows only in the final state.")
    removed: list[dict[str, Any]] = Field(default_factory=list, description="Rows only in the fixture.")
    changed: list[RowChange] = Field(default_factory=list, description="Rows in both whose values differ.")
    columns_added: list[str] = Field(default_factory=list, description="Columns only in the final state.")
    columns_removed: list[str] = Field(default_factory=list, description="Columns only in the fixture.")

    @property
    def empty(self) -> bool:
        return self.status == "changed" and not (
            self.added or self.removed or self.changed or self.columns_added or self.columns_removed)


class StateDiff(_M):
    """Per-table differences final vs fixture; tables without differences are omitted."""

    tables: list[TableDiff] = Field(default_factory=list, description="Tables that differ, sorted by name.")

    @property
    def empty(self) -> bool:
        return not self.tables

    def table(self, name: str) -> TableDiff | None:
        return next((t for t in self.tables if t.table == name), None)


class Check(_M):
    """One graded condition."""

    name: str = Field(..., description="Expectation name, 'unchanged: TABLE' or 'no extra effects'.")
    kind: Literal["state", "expect", "unchanged", "extra_effects"] = Field(
        ..., description="Which part it checks: 'state' (the final state could be read), an expectation, "
        "an unchanged table, or the extra-effects diff.")
    passed: bool = Field(..., description="Whether the condition holds.")
    detail: str | None = Field(None, description="One line on what was found when it failed.")


class Grade(_M):
    """The outcome of grading one final state."""

    passed: bool = Field(..., description="All checks passed.")
    reason: str | None = Field(None, description="One line: the first failing check (None when passed).")
    checks: list[Check] = Field(default_factory=list, description="Every check in order: expectations, unchanged tables, extra effects.")
    diff: StateDiff | None = Field(None, description="Final state vs fixture (None when the final state could not be read).")


# --------------------------------------------------------------------------- building / reading


def build_state(sql: str, path: Path) -> Path:
    """Build a fresh SQLite file at ``path`` from a SQL script (replacing any existing file)."""
    path = Path(path)
    for p in (path, path.with_name(path.name + "-journal")):
        p.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    try:
        conn.executescript(sql)
        conn.commit()
    finally:
        conn.close()
    return path


def _open_readonly(path: Path, max_bytes: int, time_limit: float) -> sqlite3.Connection:
    path = Path(path)
    if path.is_symlink() or not path.is_file():
        raise StateError(f"{path} is not a regular file")
    size = path.stat().st_size
    if size > max_bytes:
        raise StateError(f"final state is {format_size(size)}, over the cap of {format_size(max_bytes)}")
    with open(path, "rb") as f:
        if f.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
            raise StateError(f"{NOT_READABLE} (no SQLite header)")
    uri = f"file:{quote(str(path.resolve()))}?mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        deadline = time.monotonic() + time_limit
        # Returning non-zero aborts the statement: bounds the time a crafted file can cost us.
        conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        conn.execute("PRAGMA trusted_schema = OFF")
        conn.execute("PRAGMA query_only = ON")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as e:
        raise StateError(f"{NOT_READABLE} ({_one_line(str(e))})") from None
    return conn


def snapshot_state(path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, time_limit: float = DEFAULT_TIME_LIMIT) -> State:
    """Read every table of a SQLite file: ``{table: [row dicts]}`` (a :class:`State`).

    Opens read-only and immutable (the file may come from untrusted code). Raises
    :class:`StateError` when the file is missing, larger than ``max_bytes``, not SQLite,
    corrupt, or slower to read than ``time_limit`` seconds."""
    conn = _open_readonly(Path(path), max_bytes, time_limit)
    try:
        state = State()
        names = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name")]
        for name in names:
            q = _ident(name)
            info = conn.execute(f"PRAGMA table_info({q})").fetchall()
            columns = [r[1] for r in info]
            pk = [r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5])]
            if pk:
                select = f"SELECT * FROM {q} ORDER BY {', '.join(_ident(c) for c in pk)}"
                key = pk
            else:
                select = f"SELECT _rowid_ AS {ROWID}, * FROM {q} ORDER BY _rowid_"
                key = [ROWID]
            cur = conn.execute(select)
            cols = [d[0] for d in cur.description]
            state[name] = [dict(zip(cols, row)) for row in cur]
            state.key_columns[name] = key
            state.columns[name] = columns
        return state
    except sqlite3.Error as e:
        raise StateError(f"{NOT_READABLE} ({_one_line(str(e))})") from None
    finally:
        conn.close()


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# --------------------------------------------------------------------------- diff


def _jsonable(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return "x'" + bytes(v).hex() + "'"
    return v


def _row_json(row: dict[str, Any]) -> dict[str, Any]:
    return {k: _jsonable(v) for k, v in row.items()}


def _columns_of(state: dict, table: str) -> list[str]:
    cols = getattr(state, "columns", {}).get(table)
    if cols is not None:
        return cols
    rows = state.get(table) or []
    return [c for c in rows[0] if c != ROWID] if rows else []


def _key_of(before: dict, after: dict, table: str) -> list[str]:
    for s in (before, after):
        k = s.key_columns.get(table) if isinstance(s, State) else None
        if k:
            return k
    rows = (before.get(table) or []) + (after.get(table) or [])
    if rows and all("id" in r for r in rows):
        return ["id"]
    return []  # no key: rows are compared as whole values (added/removed only)


def diff_states(before: dict[str, list[dict[str, Any]]], after: dict[str, list[dict[str, Any]]]) -> StateDiff:
    """Per-table differences ``after`` vs ``before``: rows added / removed / changed, matched by
    primary key (rowid for tables without one), with the changed columns."""
    out: list[TableDiff] = []
    for table in sorted(set(before) | set(after)):
        key = _key_of(before, after, table)
        if table not in after:
            out.append(TableDiff(table=table, status="removed", key=key, removed=[_row_json(r) for r in before[table]]))
            continue
        if table not in before:
            out.append(TableDiff(table=table, status="added", key=key, added=[_row_json(r) for r in after[table]]))
            continue
        cb, ca = _columns_of(before, table), _columns_of(after, table)
        td = TableDiff(table=table, key=key,
                       columns_added=[c for c in ca if c not in cb],
                       columns_removed=[c for c in cb if c not in ca])
        common = [c for c in cb if c in ca]
        b_rows, a_rows = before[table], after[table]
        if key and all(all(k in r for k in key) for r in b_rows + a_rows):
            bi = {tuple(r[k] for k in key): r for r in b_rows}
            ai = {tuple(r[k] for k in key): r for r in a_rows}
            td.added = [_row_json(ai[k]) for k in ai if k not in bi]
            td.removed = [_row_json(bi[k]) for k in bi if k not in ai]
            for k in bi:
                if k in ai:
                    cols = [c for c in common if c not in key and not _same(bi[k].get(c), ai[k].get(c))]
                    if cols:
                        td.changed.append(RowChange(
                            key={kc: _jsonable(v) for kc, v in zip(key, k)}, columns=cols,
                            before={c: _jsonable(bi[k].get(c)) for c in cols},
                            after={c: _jsonable(ai[k].get(c)) for c in cols}))
        else:
            td.key = []
            bc = Counter(_freeze(r, common) for r in b_rows)
            ac = Counter(_freeze(r, common) for r in a_rows)
            td.added = [_row_json(dict(t)) for t in (ac - bc).elements()]
            td.removed = [_row_json(dict(t)) for t in (bc - ac).elements()]
        if not td.empty:
            out.append(td)
    return StateDiff(tables=out)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (isinstance(a, (int, float)) and isinstance(b, (int, float))
                                             and not isinstance(a, bool) and a == b)


def _freeze(row: dict[str, Any], cols: list[str]) -> tuple:
    return tuple((c, row.get(c)) for c in cols)


# --------------------------------------------------------------------------- messages


def _one_line(s: str, limit: int = 300) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _fmt(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, str):
        v = v if len(v) <= 40 else v[:39] + "…"
        return "'" + v.replace("'", "''") + "'"
    return str(v)


def _singular(table: str) -> str:
    if table.endswith("ies"):
        return table[:-3] + "y"
    if table.endswith("sses") or table.endswith("ches") or table.endswith("shes"):
        return table[:-2]
    return table[:-1] if table.endswith("s") and not table.endswith("ss") else table


def _key_label(table: str, key: dict[str, Any]) -> str:
    if len(key) == 1:
        (col, val), = key.items()
        return f"{_singular(table)} {_fmt(val)}" if col != ROWID else f"{_singular(table)} rowid {val}"
    return f"{_singular(table)} (" + ", ".join(f"{k}={_fmt(v)}" for k, v in key.items()) + ")"


def _rows_label(rows: list[dict[str, Any]], key: list[str]) -> str:
    def one(r: dict[str, Any]) -> str:
        cols = key or list(r)[:3]
        return ", ".join(f"{c}={_fmt(r.get(c))}" for c in cols)
    shown = "; ".join(one(r) for r in rows[:3])
    more = f"; +{len(rows) - 3} more" if len(rows) > 3 else ""
    return f"{len(rows)} row{'s' if len(rows) != 1 else ''} ({shown}{more})"


def _change_label(table: str, ch: RowChange, columns: list[str] | None = None) -> str:
    cols = columns or ch.columns
    parts = ", ".join(f"{c} {_fmt(ch.before[c])} -> {_fmt(ch.after[c])}" for c in cols)
    return f"{_key_label(table, ch.key)} {parts}"


def describe_table_diff(td: TableDiff, allowed_columns: set[str] | None = None) -> list[str]:
    """Short phrases for a table's differences, skipping updates confined to ``allowed_columns``."""
    t = td.table
    if td.status == "added":
        return [f"new table {t} ({len(td.added)} row{'s' if len(td.added) != 1 else ''})"]
    if td.status == "removed":
        return [f"table {t} dropped"]
    out = []
    if td.columns_added:
        out.append(f"{t} new column(s) {', '.join(td.columns_added)}")
    if td.columns_removed:
        out.append(f"{t} column(s) dropped: {', '.join(td.columns_removed)}")
    if td.added:
        out.append(f"{t} +{_rows_label(td.added, td.key)}")
    if td.removed:
        out.append(f"{t} -{_rows_label(td.removed, td.key)}")
    for ch in td.changed:
        cols = [c for c in ch.columns if not allowed_columns or c not in allowed_columns]
        if cols:
            out.append(f"{t} changed: {_change_label(t, ch, cols)}")
    return out


# --------------------------------------------------------------------------- grading


def _norm(v: Any) -> Any:
    return int(v) if isinstance(v, bool) else v


def _row_tuple(row: tuple | list) -> tuple:
    return tuple(_norm(v) for v in row)


def _fmt_row(row: tuple) -> str:
    return "(" + ", ".join(_fmt(v) for v in row) + ")"


def check_expectation(conn: sqlite3.Connection, exp: Expectation) -> tuple[bool, str | None]:
    """Run one expectation's query on the final state; (passed, detail)."""
    try:
        cur = conn.execute(exp.query)
        cols = [d[0] for d in cur.description or []]
        got = cur.fetchmany(_MAX_QUERY_ROWS + 1)
    except sqlite3.Error as e:
        return False, f"{exp.name}: query failed on the final state: {_one_line(str(e), 160)}"
    n = len(got)
    found = f"{n}{'+' if n > _MAX_QUERY_ROWS else ''}"
    if exp.count is not None:
        if n != exp.count:
            return False, f"{exp.name}: expected {exp.count} row{'s' if exp.count != 1 else ''}, found {found}"
        return True, None
    assert exp.rows is not None
    if exp.rows and isinstance(exp.rows[0], dict):
        names = list(exp.rows[0])
        missing = [c for c in names if c not in cols]
        if missing:
            return False, f"{exp.name}: query has no column(s) {', '.join(missing)}"
        idx = [cols.index(c) for c in names]
        want = [_row_tuple([r.get(c) for c in names]) for r in exp.rows]  # type: ignore[union-attr]
        have = [_row_tuple([row[i] for i in idx]) for row in got]
    else:
        want = [_row_tuple(r) for r in exp.rows]  # type: ignore[arg-type]
        have = [_row_tuple(row) for row in got]
    if len(want) != len(have):
        shown = ", ".join(_fmt_row(r) for r in have[:3]) + (", …" if len(have) > 3 else "")
        return False, (f"{exp.name}: expected {len(want)} row{'s' if len(want) != 1 else ''}, found {found}"
                       + (f": {shown}" if have else ""))
    if exp.ordered:
        for i, (w, h) in enumerate(zip(want, have)):
            if w != h:
                return False, f"{exp.name}: row {i}: expected {_fmt_row(w)}, found {_fmt_row(h)}"
        return True, None
    missing_rows = list((Counter(want) - Counter(have)).elements())
    extra_rows = list((Counter(have) - Counter(want)).elements())
    if missing_rows:
        return False, f"{exp.name}: expected {_fmt_row(missing_rows[0])}, found {_fmt_row(extra_rows[0])}"
    return True, None


def grade(task: Task, fixture_db: Path, final_db: Path | None, *, max_bytes: int = DEFAULT_MAX_BYTES,
          time_limit: float = DEFAULT_TIME_LIMIT, fixture: State | None = None) -> Grade:
    """Grade a final state against the task's fixture (see module docstring).

    Never raises for a bad final state: a missing, oversized or unreadable file is a failing
    grade. Raises :class:`StateError` only if ``fixture_db`` (built by the harness) is unreadable.
    ``fixture`` may pass an already-taken snapshot of ``fixture_db``."""
    if final_db is None or not Path(final_db).exists():
        return Grade(passed=False, reason="no final state")
    before = fixture if fixture is not None else snapshot_state(fixture_db)
    try:
        after = snapshot_state(final_db, max_bytes=max_bytes, time_limit=time_limit)
        conn = _open_readonly(Path(final_db), max_bytes, time_limit)
    except StateError as e:
        msg = str(e)
        reason = msg if msg.startswith("final state is ") and "over the cap" in msg else NOT_READABLE
        return Grade(passed=False, reason=reason,
                     checks=[Check(name="readable final state", kind="state", passed=False, detail=_one_line(msg))])
    diff = diff_states(before, after)
    checks: list[Check] = []
    try:
        for exp in task.expect:
            ok, detail = check_expectation(conn, exp)
            checks.append(Check(name=exp.name, kind="expect", passed=ok, detail=detail))
    finally:
        conn.close()

    for table in task.unchanged:
        td = diff.table(table)
        if td is None:
            checks.append(Check(name=f"unchanged: {table}", kind="unchanged", passed=True))
        else:
            what = describe_table_diff(td)
            first = what[0].removeprefix(f"{table} changed: ").removeprefix(f"{table} ") if what else "differs"
            more = f" (and {len(what) - 1} more)" if len(what) > 1 else ""
            checks.append(Check(name=f"unchanged: {table}", kind="unchanged", passed=False,
                                detail=_one_line(f"{table} changed but must be unchanged: {first}{more}")))

    allowed_tables = {a for a in task.allow if "." not in a}
    allowed_cols: dict[str, set[str]] = {}
    for a in task.allow:
        if "." in a:
            t, c = a.split(".", 1)
            allowed_cols.setdefault(t, set()).add(c)
    extra: list[str] = []
    for td in diff.tables:
        if td.table in allowed_tables or td.table in task.unchanged:
            continue
        extra += describe_table_diff(td, allowed_cols.get(td.table))
    more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
    checks.append(Check(name="no extra effects", kind="extra_effects", passed=not extra,
                        detail=_one_line(f"extra effect: {extra[0]}{more}") if extra else None))

    failed = next((c for c in checks if not c.passed), None)
    return Grade(passed=failed is None, reason=failed.detail if failed else None, checks=checks, diff=diff)


__all__ = [
    "DEFAULT_MAX_BYTES", "NOT_READABLE", "Check", "Grade", "RowChange", "State", "StateDiff", "StateError",
    "TableDiff", "build_state", "check_expectation", "diff_states", "grade", "snapshot_state",
]

