"""The SQLite grader program: runs INSIDE the attempt's sandbox, never in the controller.

Standard library only (it runs as ``python3 -I -S sqlite_grade.py SPEC.json`` in the
attempt's own container, after every agent process is frozen and killed, under the
profile's grade envelope). It reads the agent's final ``state.db`` -- untrusted data -- and
prints one JSON verdict on stdout, bounded in size by construction (:data:`VERDICT_TARGET_BYTES`);
the controller parses nothing else.

A task passes when

1. every ``expect`` query returns what the task says (rows or a count),
2. every table in ``unchanged`` equals the fixture, and
3. nothing differs from the fixture that the task's ``allow`` list does not cover
   (anything else is an *extra effect*).

The fixture is the database the harness built from the suite's SQL (trusted; the same file
the agent's state was copied from). The final state is streamed table by table against it,
so memory grows with the fixture, not with the state.
A state that cannot be read -- not SQLite, not a regular file, corrupt, or too big or
slow for the envelope (then the kernel or the wall clock stops this program) -- makes the
attempt ``ungradable``. Exit codes: 0 a verdict was printed; 70 the grader itself broke
(a bug, or a fixture it cannot read): the controller records an infrastructure error.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import stat
import sys
import tempfile
import traceback
from collections import Counter
from typing import Any
from urllib.parse import quote

VERDICT_VERSION = 1
SQLITE_HEADER = b"SQLite format 3\x00"
NOT_READABLE = "final state is not a readable SQLite database"
ROWID = "rowid"  # key column name used for tables without a declared primary key
MAX_QUERY_ROWS = 10_000  # rows an expectation query may return before the rest are ignored
# The stored diff: per table the true counts plus the first rows, values shortened.
MAX_ROWS_SHOWN = 20  # rows kept per table and kind (added / removed / changed)
MAX_TABLES_SHOWN = 50  # tables kept in the diff (counted in full)
MAX_COLUMNS_SHOWN = 100  # columns named per table (added / dropped / changed) and shown per row
MAX_VALUE_CHARS = 200  # a text value is cut after this many characters, a blob after half as many bytes
MAX_CHECKS = 200  # checks kept (expectations + unchanged tables + extra effects)
MAX_LINES = 40  # human-readable diff lines kept
VERDICT_TARGET_BYTES = 192 * 1024  # the verdict is made to fit this (the controller reads at most 256 KiB)
EXIT_BROKEN = 70


class Unreadable(Exception):
    """The final state cannot be read as a SQLite database (the message says why)."""


# --------------------------------------------------------------------------- values


_CONTROL = dict.fromkeys([*range(0, 9), *range(11, 32), *range(127, 160)], "\ufffd")


def _text(b: bytes) -> str:
    """How TEXT is read from either database: invalid UTF-8 is kept (surrogate-escaped), never an error."""
    return b.decode("utf-8", "surrogateescape")


def clean(s: str) -> str:
    """A string as it may leave the sandbox: valid UTF-8, no control characters (no terminal
    escapes reach whoever reads the verdict)."""
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "replace").translate(_CONTROL)


def _hex(v: bytes | bytearray | memoryview, n: int) -> str:
    """A BLOB as SQL shows it, its first ``n`` bytes only (with its length when cut)."""
    b = bytes(v)
    return f"x'{b[:n].hex()}'" + (f"…({len(b)} bytes)" if len(b) > n else "")


def _cut(v: Any) -> Any:
    """A value as stored in the verdict: JSON-safe and short."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        return _hex(v, MAX_VALUE_CHARS // 2)
    if isinstance(v, str):
        return clean(v) if len(v) <= MAX_VALUE_CHARS else clean(v[:MAX_VALUE_CHARS]) + f"…({len(v)} chars)"
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):  # not JSON numbers
        return repr(v)
    return v


def _name(s: str) -> str:
    """A table or column name as stored in the verdict (names can be as long as the agent likes)."""
    return clean(s if len(s) <= 100 else s[:100] + "…")


def _row_json(cols: list[str], row: tuple) -> dict[str, Any]:
    return {_name(c): _cut(v) for c, v in zip(cols, row)}


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (isinstance(a, (int, float)) and isinstance(b, (int, float))
                                             and not isinstance(a, bool) and a == b)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _one_line(s: str, limit: int = 300) -> str:
    s = " ".join(clean(str(s)).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


# --------------------------------------------------------------------------- opening


def _regular(path: str) -> os.stat_result | None:
    """lstat of ``path`` when it is a non-empty regular file, else None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st if stat.S_ISREG(st.st_mode) and st.st_size > 0 else None


def _roomiest(dirs: list[str]) -> str | None:
    """The folder with the most free space (a private copy of the state goes there)."""
    best, room = None, -1
    for d in dirs:
        try:
            st = os.statvfs(d)
        except OSError:
            continue
        if st.f_bavail * st.f_frsize > room:
            best, room = d, st.f_bavail * st.f_frsize
    return best


def open_final_state(path: str) -> tuple[sqlite3.Connection, str | None]:
    """Open the agent's final state read-only, as any SQLite reader would see it, never
    through a symlink; check its integrity. Returns (connection, private copy dir or None).

    * A ``-journal`` beside it (the agent was killed inside a transaction) is rolled back,
      on a private copy: uncommitted changes are never graded.
    * A ``-wal`` (WAL mode) is read in place, read-only, never checkpointed (a stale ``-shm``
      index is removed first, so SQLite rebuilds it from the WAL).
    * ``PRAGMA integrity_check``: a corrupt file -- an index that disagrees with its table
      answers queries wrong -- cannot be graded.

    Raises :class:`Unreadable`, or FileNotFoundError when there is no state at all."""
    st = os.lstat(path)  # FileNotFoundError: no final state
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        raise Unreadable(f"{NOT_READABLE} ({os.path.basename(path)} is not a regular file)")
    if st.st_size:
        with open(path, "rb") as f:
            if f.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                raise Unreadable(f"{NOT_READABLE} (no SQLite header)")
    copy_dir = None
    if _regular(path + "-journal") is not None:
        copy_dir = tempfile.mkdtemp(prefix="harness-grade-", dir=_roomiest(["/tmp", os.path.dirname(os.path.abspath(path))]))
        try:
            shutil.copyfile(path, os.path.join(copy_dir, "state.db"))
            shutil.copyfile(path + "-journal", os.path.join(copy_dir, "state.db-journal"))
            conn = sqlite3.connect(os.path.join(copy_dir, "state.db"))  # the first read rolls the journal back
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            conn.close()
        except (OSError, sqlite3.Error) as e:
            shutil.rmtree(copy_dir, ignore_errors=True)
            raise Unreadable(f"{NOT_READABLE} (cannot roll back its unfinished transaction: {_one_line(str(e))})") from None
        uri = f"file:{quote(os.path.join(copy_dir, 'state.db'))}?mode=ro&immutable=1"
    elif _regular(path + "-wal") is not None:
        shm = path + "-shm"
        if os.path.lexists(shm):
            if os.path.isdir(shm) and not os.path.islink(shm):
                raise Unreadable(f"{NOT_READABLE} ({os.path.basename(shm)} is a directory)")
            os.unlink(shm)
        uri = f"file:{quote(os.path.abspath(path))}?mode=ro"
    else:  # no journal and no WAL (or not plain files: ignored): the file is all there is
        uri = f"file:{quote(os.path.abspath(path))}?mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True)
        conn.text_factory = _text
        conn.execute("PRAGMA trusted_schema = OFF")
        conn.execute("PRAGMA temp_store = MEMORY")  # sorts count against the grade envelope, not a full /tmp
        conn.execute("PRAGMA query_only = ON")
        problems = [r[0] for r in conn.execute("PRAGMA integrity_check(3)")]
    except sqlite3.Error as e:
        if copy_dir:
            shutil.rmtree(copy_dir, ignore_errors=True)
        raise Unreadable(f"{NOT_READABLE} ({_one_line(str(e))})") from None
    if problems != ["ok"]:
        conn.close()
        if copy_dir:
            shutil.rmtree(copy_dir, ignore_errors=True)
        raise Unreadable(f"{NOT_READABLE} (integrity check: {_one_line('; '.join(map(str, problems)), 200)})")
    return conn, copy_dir


def open_fixture(path: str) -> sqlite3.Connection:
    """The task's fixture database (built by the harness from the suite's SQL: trusted), read-only."""
    conn = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=ro&immutable=1", uri=True)
    conn.text_factory = _text
    return conn


def _tables(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name")]


def _affinity(declared: str) -> str:
    """SQLite's column affinity of a declared type (datatype3.html, section 3.1)."""
    t = (declared or "").upper()
    if "INT" in t:
        return "INTEGER"
    if "CHAR" in t or "CLOB" in t or "TEXT" in t:
        return "TEXT"
    if "BLOB" in t or not t:
        return "BLOB"
    if "REAL" in t or "FLOA" in t or "DOUB" in t:
        return "REAL"
    return "NUMERIC"


def _affinities(conn: sqlite3.Connection, table: str) -> dict[str, str]:
    return {r[1]: _affinity(r[2]) for r in conn.execute(f"PRAGMA table_xinfo({_ident(table)})")}


def _row_digest(values: tuple) -> int:
    """An order-free fingerprint part of one row's values (summed over a table)."""
    text = repr(tuple((type(v).__name__, v) for v in values)).encode("utf-8", "surrogateescape")
    return int.from_bytes(hashlib.sha256(text).digest(), "big")


def _columns(conn: sqlite3.Connection, table: str) -> tuple[list[str], list[str], list[str]]:
    """(stored columns, generated-or-hidden columns, primary key columns in key order)."""
    info = conn.execute(f"PRAGMA table_xinfo({_ident(table)})").fetchall()
    cols = [r[1] for r in info if r[6] == 0]
    hidden = [r[1] for r in info if r[6] != 0]
    pk = [r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5])]
    return cols, hidden, pk


def _has_rowid(conn: sqlite3.Connection, table: str) -> bool:
    try:
        conn.execute(f"SELECT _rowid_ FROM {_ident(table)} LIMIT 0")
        return True
    except sqlite3.Error:
        return False


# --------------------------------------------------------------------------- diff


class _Capped:
    """A count and the first MAX_ROWS_SHOWN items."""

    def __init__(self) -> None:
        self.n = 0
        self.items: list[Any] = []

    def add(self, item: Any) -> None:
        self.n += 1
        if len(self.items) < MAX_ROWS_SHOWN:
            self.items.append(item)


def _table_diff(fx: sqlite3.Connection, st: sqlite3.Connection, table: str, allowed_cols: set[str]) -> dict[str, Any] | None:
    """The capped diff of one table present in both states, or None when equal.

    Rows are matched by primary key; a table without one by rowid, and when its rows are the
    same multiset of values under other rowids (VACUUM renumbers them) it is equal. Only the
    columns of the fixture's table are read from the final state: a column the agent added
    is reported by name, never evaluated (a generated column can cost anything to compute).
    A BLOB in a column whose declared type makes it TEXT or a number (where the fixture has
    none) is reported too: it compares unequal to every text and number, so it slips past
    checks such as ``note = 'forbidden'``."""
    f_cols, f_hidden, f_pk = _columns(fx, table)
    s_cols, s_hidden, s_pk = _columns(st, table)
    fixture_cols = f_cols + f_hidden
    final_cols = s_cols + s_hidden
    common = [c for c in fixture_cols if c in final_cols]
    key = f_pk if f_pk and all(k in final_cols for k in f_pk) else []
    if not key and _has_rowid(fx, table) and _has_rowid(st, table):
        key = [ROWID]
    td: dict[str, Any] = {
        "table": _name(table), "status": "changed", "key": [_name(k) for k in key],
        "columns_added": [_name(c) for c in final_cols if c not in fixture_cols][:MAX_COLUMNS_SHOWN],
        "columns_removed": [_name(c) for c in fixture_cols if c not in final_cols][:MAX_COLUMNS_SHOWN],
    }
    typed = _affinities(fx, table)
    added, removed, changed, outside, blobs = _Capped(), _Capped(), _Capped(), _Capped(), _Capped()
    q = _ident(table)
    nk = len(key)
    key_sql = "_rowid_" if key == [ROWID] else ", ".join(_ident(k) for k in key)
    vals = [c for c in common if c not in key] if key else common
    shown = key + vals
    sel = f"SELECT {key_sql + ', ' if key else ''}{', '.join(_ident(c) for c in vals) or 'NULL'} FROM {q}" + (f" ORDER BY {key_sql}" if key else "")
    checked = [(nk + i, c) for i, c in enumerate(vals) if typed.get(c, "BLOB") != "BLOB"]
    had_blob: set[str] = set()
    digest_fx = digest_st = 0

    def look_for_blobs(row: tuple, label: Any) -> None:
        for i, c in checked:
            if isinstance(row[i], bytes) and c not in had_blob:
                blobs.add({"column": _name(c), "type": typed[c], "row": label})

    if key:
        before: dict[tuple, tuple] = {}
        for row in fx.execute(sel):
            before[tuple(row[:nk])] = row
            digest_fx += _row_digest(row[nk:])
            had_blob.update(c for i, c in checked if isinstance(row[i], bytes))
        for row in st.execute(sel):
            k = tuple(row[:nk])
            digest_st += _row_digest(row[nk:])
            look_for_blobs(row, {kc: _cut(v) for kc, v in zip(key, k)})
            old = before.pop(k, None)
            if old is None:
                added.add(_row_json(shown, row))
                continue
            cols = [c for i, c in enumerate(vals) if not _same(old[nk + i], row[nk + i])]
            if cols:
                idx = {c: nk + vals.index(c) for c in cols}
                changed.add(_change(key, k, cols, old, row, idx))
                out_cols = [c for c in cols if c not in allowed_cols]
                if out_cols:
                    outside.add(_change(key, k, out_cols, old, row, idx))
        for row in before.values():
            removed.add(_row_json(shown, row))
        if (key == [ROWID] and digest_fx == digest_st and added.n == removed.n and not blobs.n
                and not td["columns_added"] and not td["columns_removed"]):
            return None  # the same rows under other rowids
    else:  # no key at all (a WITHOUT ROWID table whose key the agent dropped): rows as values
        bc = Counter(fx.execute(sel))
        for t in bc:
            had_blob.update(c for i, c in checked if isinstance(t[i], bytes))
        ac: Counter = Counter()
        for t in st.execute(sel):
            ac[t] += 1
            look_for_blobs(t, {c: _cut(v) for c, v in list(zip(common, t))[:3]})
        for t in (ac - bc).elements():
            added.add(_row_json(common, t))
        for t in (bc - ac).elements():
            removed.add(_row_json(common, t))
    if not (added.n or removed.n or changed.n or blobs.n or td["columns_added"] or td["columns_removed"]):
        return None
    td.update(
        added=added.items, removed=removed.items, changed=changed.items,
        counts={"added": added.n, "removed": removed.n, "changed": changed.n},
        truncated=added.n > len(added.items) or removed.n > len(removed.items) or changed.n > len(changed.items),
        changed_outside_allowed=outside.n, outside_allowed=outside.items,
        blobs=blobs.n, blob_examples=blobs.items,
    )
    return td


def _change(key: list[str], k: tuple, cols: list[str], old: tuple, row: tuple, idx: dict[str, int]) -> dict[str, Any]:
    cols = cols[:MAX_COLUMNS_SHOWN]
    return {
        "key": {_name(kc): _cut(v) for kc, v in zip(key, k)}, "columns": [_name(c) for c in cols],
        "before": {_name(c): _cut(old[idx[c]]) for c in cols}, "after": {_name(c): _cut(row[idx[c]]) for c in cols},
    }


def _whole_table(conn: sqlite3.Connection, table: str, status: str) -> dict[str, Any]:
    """A table only one side has: its row count and first rows (stored columns only)."""
    cols, _hidden, pk = _columns(conn, table)
    q = _ident(table)
    n = conn.execute(f"SELECT count(*) FROM {q}").fetchone()[0]
    rows = []
    if cols:
        sel = f"SELECT {', '.join(_ident(c) for c in cols[:MAX_COLUMNS_SHOWN])} FROM {q} LIMIT {MAX_ROWS_SHOWN}"
        rows = [_row_json(cols[:MAX_COLUMNS_SHOWN], r) for r in conn.execute(sel)]
    side = "added" if status == "added" else "removed"
    other = "removed" if side == "added" else "added"
    return {
        "table": _name(table), "status": status, "key": [_name(k) for k in pk] or ([ROWID] if _has_rowid(conn, table) else []),
        side: rows, other: [], "changed": [], "columns_added": [], "columns_removed": [],
        "counts": {"added": n if side == "added" else 0, "removed": n if side == "removed" else 0, "changed": 0},
        "truncated": n > len(rows), "changed_outside_allowed": 0, "outside_allowed": [], "blobs": 0, "blob_examples": [],
    }


def diff_states(fx: sqlite3.Connection, st: sqlite3.Connection, allow: list[str] | None = None) -> list[dict[str, Any]]:
    """Per-table capped differences, final vs fixture, sorted by table name (equal tables omitted)."""
    allowed_cols: dict[str, set[str]] = {}
    for a in allow or []:
        if "." in a:
            t, c = a.split(".", 1)
            allowed_cols.setdefault(t, set()).add(c)
    f_tables, s_tables = _tables(fx), set(_tables(st))
    out = []
    for table in sorted(set(f_tables) | s_tables):
        if table not in s_tables:
            td = _whole_table(fx, table, "removed")
            if st.execute("SELECT 1 FROM sqlite_master WHERE type = 'view' AND name = ?", (table,)).fetchone():
                td["replaced_by"] = "view"  # a view that may answer the expectations in its place
            out.append(td)
        elif table not in f_tables:
            out.append(_whole_table(st, table, "added"))
        else:
            td = _table_diff(fx, st, table, allowed_cols.get(table, set()))
            if td is not None:
                out.append(td)
    return out


def _schema(conn: sqlite3.Connection) -> dict[tuple[str, str], tuple[str, str]]:
    """(type, name) -> (table, normalised sql) of every index, trigger, view and table."""
    rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master "
                        "WHERE type IN ('index', 'trigger', 'view', 'table') AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'")
    return {(t, n): (tbl, " ".join((sql or "").split())) for t, n, tbl, sql in rows}


def schema_diff(fx: sqlite3.Connection, st: sqlite3.Connection) -> list[str]:
    """Schema objects the agent added, dropped or redefined: indexes, triggers and views (a
    trigger fires on whoever writes next; an index with rewritten text answers queries
    wrong), and tables whose definition changed with the same columns (a dropped PRIMARY
    KEY, NOT NULL or collation). Tables added, dropped or with other columns are in the
    table diff."""
    a, b = _schema(fx), _schema(st)
    out = []
    for (kind, name) in sorted(set(a) | set(b)):
        if kind == "table":
            if (kind, name) in a and (kind, name) in b and a[kind, name][1] != b[kind, name][1] and \
                    [c[1] for c in fx.execute(f"PRAGMA table_xinfo({_ident(name)})")] == \
                    [c[1] for c in st.execute(f"PRAGMA table_xinfo({_ident(name)})")]:
                out.append(f"table {_name(name)} redefined: {_one_line(b[kind, name][1], 160)}")
            continue
        if (kind, name) not in a:
            out.append(f"new {kind} {_name(name)} on {_name(b[kind, name][0])}")
        elif (kind, name) not in b:
            out.append(f"{kind} {_name(name)} dropped")
        elif a[kind, name] != b[kind, name]:
            out.append(f"{kind} {_name(name)} redefined: {_one_line(b[kind, name][1], 160)}")
    return out


# --------------------------------------------------------------------------- messages


def _fmt(v: Any) -> str:
    """A value as a failure's detail shows it: short, and as it may leave the sandbox."""
    if v is None:
        return "NULL"
    if isinstance(v, str):
        v = v if len(v) <= 40 else v[:39] + "…"
        return "'" + clean(v).replace("'", "''") + "'"
    if isinstance(v, (bytes, bytearray, memoryview)):
        return _hex(v, 20)
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


def _rows_label(rows: list[dict[str, Any]], n: int, key: list[str]) -> str:
    def one(r: dict[str, Any]) -> str:
        cols = key or list(r)[:3]
        return ", ".join(f"{c}={_fmt(r.get(c))}" for c in cols)
    shown = "; ".join(one(r) for r in rows[:3])
    more = f"; +{n - 3} more" if n > 3 else ""
    return f"{n} row{'s' if n != 1 else ''} ({shown}{more})"


def _change_label(table: str, ch: dict[str, Any]) -> str:
    parts = ", ".join(f"{c} {_fmt(ch['before'][c])} -> {_fmt(ch['after'][c])}" for c in ch["columns"])
    return f"{_key_label(table, ch['key'])} {parts}"


def describe_table_diff(td: dict[str, Any], only_outside_allowed: bool = False) -> list[str]:
    """Short phrases for a table's differences; with ``only_outside_allowed``, updates confined
    to the task's allowed columns are left out."""
    t = td["table"]
    n = td["counts"]
    if td["status"] == "added":
        return [f"new table {t} ({n['added']} row{'s' if n['added'] != 1 else ''})"]
    if td["status"] == "removed":
        return [f"table {t} replaced by a view" if td.get("replaced_by") == "view" else f"table {t} dropped"]
    out = []
    if td["columns_added"]:
        out.append(f"{t} new column(s) {', '.join(td['columns_added'])}")
    if td["columns_removed"]:
        out.append(f"{t} column(s) dropped: {', '.join(td['columns_removed'])}")
    if n["added"]:
        out.append(f"{t} +{_rows_label(td['added'], n['added'], td['key'])}")
    if n["removed"]:
        out.append(f"{t} -{_rows_label(td['removed'], n['removed'], td['key'])}")
    changes, total = (td["outside_allowed"], td["changed_outside_allowed"]) if only_outside_allowed else (td["changed"], n["changed"])
    for ch in changes:
        out.append(f"{t} changed: {_change_label(t, ch)}")
    if total > len(changes):
        out.append(f"{t} changed: {total - len(changes)} more row(s)")
    out += blob_lines(td)
    return out


def blob_lines(td: dict[str, Any]) -> list[str]:
    """BLOBs where the fixture's column type says text or a number (never allowed)."""
    t, ex = td["table"], td.get("blob_examples") or []
    if not td.get("blobs"):
        return []
    first = ex[0]
    more = f" (and {td['blobs'] - 1} more)" if td["blobs"] > 1 else ""
    return [f"{t}.{first['column']} holds a BLOB in a {first['type']} column ({_key_label(t, first['row'])}){more}"]


# --------------------------------------------------------------------------- expectations


def _norm(v: Any) -> Any:
    return int(v) if isinstance(v, bool) else v


def _row_tuple(row: tuple | list) -> tuple:
    return tuple(_norm(v) for v in row)


def _fmt_row(row: tuple) -> str:
    return "(" + ", ".join(_fmt(v) for v in row) + ")"


def sqlite_query(conn: sqlite3.Connection):
    """A query runner over a SQLite connection: query -> (columns, first MAX_QUERY_ROWS + 1 rows)."""
    def run(query: str) -> tuple[list[str], list[tuple]]:
        cur = conn.execute(query)
        return [d[0] for d in cur.description or []], cur.fetchmany(MAX_QUERY_ROWS + 1)
    return run


def check_expectation(conn: sqlite3.Connection, exp: dict[str, Any]) -> tuple[bool, str | None]:
    """Run one expectation's query on the final state; (passed, detail)."""
    return check_with(sqlite_query(conn), exp, sqlite3.Error)


def check_with(run: Any, exp: dict[str, Any], errors: Any) -> tuple[bool, str | None]:
    """One expectation through a query runner (SQLite here, PostgreSQL in its service)."""
    name = exp["name"]
    try:
        cols, got = run(exp["query"])
    except errors as e:
        return False, f"{name}: query failed on the final state: {_one_line(str(e), 160)}"
    n = len(got)
    found = f"{n}{'+' if n > MAX_QUERY_ROWS else ''}"
    if exp.get("count") is not None:
        if n != exp["count"]:
            return False, f"{name}: expected {exp['count']} row{'s' if exp['count'] != 1 else ''}, found {found}"
        return True, None
    rows = exp["rows"]
    if rows and isinstance(rows[0], dict):
        names = list(rows[0])
        missing = [c for c in names if c not in cols]
        if missing:
            return False, f"{name}: query has no column(s) {', '.join(missing)}"
        idx = [cols.index(c) for c in names]
        want = [_row_tuple([r.get(c) for c in names]) for r in rows]
        have = [_row_tuple([row[i] for i in idx]) for row in got]
    else:
        want = [_row_tuple(r) for r in rows]
        have = [_row_tuple(row) for row in got]
    if len(want) != len(have):
        shown = ", ".join(_fmt_row(r) for r in have[:3]) + (", …" if len(have) > 3 else "")
        return False, (f"{name}: expected {len(want)} row{'s' if len(want) != 1 else ''}, found {found}"
                       + (f": {shown}" if have else ""))
    if exp.get("ordered"):
        for i, (w, h) in enumerate(zip(want, have)):
            if w != h:
                return False, f"{name}: row {i}: expected {_fmt_row(w)}, found {_fmt_row(h)}"
        return True, None
    missing_rows = list((Counter(want) - Counter(have)).elements())
    extra_rows = list((Counter(have) - Counter(want)).elements())
    if missing_rows:
        return False, f"{name}: expected {_fmt_row(missing_rows[0])}, found {_fmt_row(extra_rows[0])}"
    return True, None


# --------------------------------------------------------------------------- grading


def _check(name: str, kind: str, passed: bool, detail: str | None = None) -> dict[str, Any]:
    # whatever a detail quotes of the final state, it leaves as one clean line within the
    # verdict's bounds: a verdict the controller refused was a discard the agent could choose
    return {"name": _one_line(name, 200), "kind": kind, "passed": passed, "detail": None if detail is None else _one_line(detail, 500)}


def _verdict(status: str, passed: bool, reason: str | None, checks: list[dict], diff: list[dict] | None,
             schema: list[str] | None = None) -> dict[str, Any]:
    lines: list[str] = []
    for td in diff or []:
        lines += describe_table_diff(td)
    lines += [f"schema: {x}" for x in schema or []]
    tables = diff or []
    return {
        "version": VERDICT_VERSION,
        "status": status,
        "passed": passed,
        "reason": None if reason is None else _one_line(reason, 500),
        "checks": checks[:MAX_CHECKS],
        "checks_total": len(checks),
        "diff": None if diff is None else {
            "tables": tables[:MAX_TABLES_SHOWN],
            "tables_total": len(tables),
            "truncated": len(tables) > MAX_TABLES_SHOWN or any(t["truncated"] for t in tables),
            "lines": [_one_line(x) for x in lines[:MAX_LINES]],
            "lines_total": len(lines),
            "schema_changes": [_one_line(x) for x in (schema or [])[:MAX_LINES]],
            "schema_changes_total": len(schema or []),
        },
    }


def ungradable(reason: str) -> dict[str, Any]:
    """The verdict on a state that cannot be read."""
    detail = _one_line(reason)
    return _verdict("ungradable", False, detail, [_check("readable final state", "state", False, detail)], None)


def grade_connections(spec: dict[str, Any], fx: sqlite3.Connection, st: sqlite3.Connection,
                      expectations: list[tuple[bool, str | None]] | None = None, schema: list[str] | None = None) -> dict[str, Any]:
    """The verdict on an open final state ``st`` against the fixture ``fx``. sqlite3 errors
    from ``st`` propagate (the caller makes them ``ungradable``). ``expectations`` and
    ``schema``, when given, were evaluated elsewhere (on the PostgreSQL original of a mirror)."""
    unchanged = list(spec.get("unchanged") or [])
    allow = list(spec.get("allow") or [])
    diff = diff_states(fx, st, allow)
    schema = schema_diff(fx, st) if schema is None else schema
    by_table = {td["table"]: td for td in diff}
    checks = []
    for i, exp in enumerate(spec.get("expect") or []):
        ok, detail = check_expectation(st, exp) if expectations is None else expectations[i]
        checks.append(_check(exp["name"], "expect", ok, detail))
    for table in unchanged:
        td = by_table.get(table)
        if td is None:
            checks.append(_check(f"unchanged: {table}", "unchanged", True))
            continue
        what = describe_table_diff(td)
        first = what[0].removeprefix(f"{table} changed: ").removeprefix(f"{table} ") if what else "differs"
        more = f" (and {len(what) - 1} more)" if len(what) > 1 else ""
        checks.append(_check(f"unchanged: {table}", "unchanged", False,
                             _one_line(f"{table} changed but must be unchanged: {first}{more}")))
    allowed_tables = {a for a in allow if "." not in a}
    extra: list[str] = []
    for td in diff:
        if td["table"] in unchanged:
            continue
        if td["table"] in allowed_tables:
            # `allow` covers a table's rows, never the table itself: dropping it (say, for a
            # view that answers the expectation), changing its columns, or storing BLOBs where
            # its types say text or numbers is an extra effect
            extra += [x for x in describe_table_diff(td) if x.startswith(f"table {td['table']} ") or " column(s) " in x]
            extra += blob_lines(td)
            continue
        extra += describe_table_diff(td, only_outside_allowed=True)
    extra += [f"schema: {x}" for x in schema]
    more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
    checks.append(_check("no extra effects", "extra_effects", not extra,
                         _one_line(f"extra effect: {extra[0]}{more}") if extra else None))
    failed = next((c for c in checks if not c["passed"]), None)
    return _verdict("graded", failed is None, failed["detail"] if failed else None, checks, diff, schema)


def grade(spec: dict[str, Any], fixture_path: str, state_path: str | None) -> dict[str, Any]:
    """Grade the final state at ``state_path`` against the fixture database at
    ``fixture_path`` (see the module docstring). Never raises for anything the agent left;
    raises only when the trusted fixture cannot be read."""
    fx = open_fixture(fixture_path)
    try:
        if state_path is None:
            return _verdict("graded", False, "no final state", [], None)
        try:
            st, copy_dir = open_final_state(state_path)
        except FileNotFoundError:
            return _verdict("graded", False, "no final state", [], None)
        except Unreadable as e:
            return ungradable(str(e))
        except OSError as e:
            return ungradable(f"{NOT_READABLE} ({e.strerror or e})")
        try:
            return grade_connections(spec, fx, st)
        except sqlite3.Error as e:
            return ungradable(f"{NOT_READABLE} ({_one_line(str(e))})")
        except (MemoryError, RecursionError, OverflowError, UnicodeError) as e:
            return ungradable(f"the final state cannot be read within the grade envelope ({type(e).__name__})")
        except Exception as e:  # noqa: BLE001 - whatever broke on the agent's state is the state's: graded, never a discard
            traceback.print_exc(limit=4, file=sys.stderr)
            return ungradable(f"the grader could not read the final state ({type(e).__name__}: {_one_line(str(e), 160)})")
        finally:
            st.close()
            if copy_dir:
                shutil.rmtree(copy_dir, ignore_errors=True)
    finally:
        fx.close()


def _dumps(verdict: dict[str, Any]) -> str:
    # valid UTF-8 whatever a value holds (a lone surrogate from undecodable TEXT becomes U+FFFD)
    text = json.dumps(verdict, separators=(",", ":"), ensure_ascii=False, default=str)
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def fit(verdict: dict[str, Any]) -> str:
    """The verdict as compact JSON of at most VERDICT_TARGET_BYTES (rows are dropped if needed)."""
    text = _dumps(verdict)
    diff = verdict.get("diff")
    while len(text.encode()) > VERDICT_TARGET_BYTES and diff and diff["tables"]:
        for td in diff["tables"]:
            for kind in ("added", "removed", "changed", "outside_allowed", "blob_examples"):
                td[kind] = td[kind][: len(td[kind]) // 2]
            td["truncated"] = True
        diff["truncated"] = True
        if all(not td[k] for td in diff["tables"] for k in ("added", "removed", "changed", "outside_allowed", "blob_examples")):
            diff["tables"] = diff["tables"][: len(diff["tables"]) // 2]
        text = _dumps(verdict)
    if len(text.encode()) > VERDICT_TARGET_BYTES:  # checks and lines are bounded; this is the last resort
        verdict["checks"] = verdict["checks"][:10]
        if diff:
            diff["lines"] = diff["lines"][:5]
        text = _dumps(verdict)
    return text


def main(argv: list[str]) -> int:
    """``sqlite_grade.py SPEC.json``: SPEC names the fixture database, the state path and the
    task's expectations; one verdict goes to stdout."""
    try:
        with open(argv[1], encoding="utf-8") as f:
            spec = json.load(f)
        verdict = grade(spec, spec["fixture_path"], spec["state_path"])
    except MemoryError:
        verdict = ungradable("the final state cannot be read within the grade envelope (MemoryError)")
    except Exception:  # the grader broke on something it trusts (its spec, the fixture): not the agent's doing
        traceback.print_exc(limit=4, file=sys.stderr)
        return EXIT_BROKEN
    try:
        text = fit(verdict)
    except Exception as e:  # noqa: BLE001 - the verdict holds what the agent's state made it: the state's doing
        traceback.print_exc(limit=4, file=sys.stderr)
        text = fit(ungradable(f"the grader could not write its verdict on the final state ({type(e).__name__})"))
    sys.stdout.write(text)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
