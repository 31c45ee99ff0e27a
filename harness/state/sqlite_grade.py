"""The SQLite grader program: runs INSIDE the attempt's sandbox, never in the controller.

Standard library only (it runs as ``python3 -I -S sqlite_grade.py SPEC.json`` in the
attempt's own container, after every agent process is frozen and killed, under the
profile's grade envelope). It reads the agent's final ``state.db`` -- untrusted data -- and
prints one JSON verdict on stdout, bounded in size by construction (:data:`MAX_VERDICT_BYTES`);
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

import json
import os
import sqlite3
import stat
import sys
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
MAX_VERDICT_BYTES = 192 * 1024  # the verdict is made to fit this; the controller refuses more
EXIT_BROKEN = 70


class Unreadable(Exception):
    """The final state cannot be read as a SQLite database (the message says why)."""


# --------------------------------------------------------------------------- values


def _cut(v: Any) -> Any:
    """A value as stored in the verdict: JSON-safe and short."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        head = b[: MAX_VALUE_CHARS // 2].hex()
        return f"x'{head}'" + (f"…({len(b)} bytes)" if len(b) > MAX_VALUE_CHARS // 2 else "")
    if isinstance(v, str) and len(v) > MAX_VALUE_CHARS:
        return v[:MAX_VALUE_CHARS] + f"…({len(v)} chars)"
    if isinstance(v, float) and v != v:  # NaN is not JSON
        return "NaN"
    return v


def _name(s: str) -> str:
    """A table or column name as stored in the verdict (names can be as long as the agent likes)."""
    return s if len(s) <= 100 else s[:100] + "…"


def _row_json(cols: list[str], row: tuple) -> dict[str, Any]:
    return {_name(c): _cut(v) for c, v in zip(cols, row)}


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (isinstance(a, (int, float)) and isinstance(b, (int, float))
                                             and not isinstance(a, bool) and a == b)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _one_line(s: str, limit: int = 300) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


# --------------------------------------------------------------------------- opening


def open_final_state(path: str) -> sqlite3.Connection:
    """Open the agent's final state read-only, never through a symlink. A ``-wal`` file beside
    it (the agent switched to WAL mode) is read in place, so every commit counts, without
    checkpointing: the state and its WAL stay as the agent left them (a stale ``-shm`` index
    is removed first, so SQLite rebuilds it from the WAL). Raises :class:`Unreadable`, or
    FileNotFoundError when there is no state at all."""
    st = os.lstat(path)  # FileNotFoundError: no final state
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        raise Unreadable(f"{NOT_READABLE} ({os.path.basename(path)} is not a regular file)")
    if st.st_size:
        with open(path, "rb") as f:
            if f.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                raise Unreadable(f"{NOT_READABLE} (no SQLite header)")
    try:
        wst = os.lstat(path + "-wal")
    except FileNotFoundError:
        wst = None
    if wst is not None and stat.S_ISREG(wst.st_mode) and wst.st_size > 0:
        shm = path + "-shm"
        if os.path.lexists(shm):
            if os.path.isdir(shm) and not os.path.islink(shm):
                raise Unreadable(f"{NOT_READABLE} ({os.path.basename(shm)} is a directory)")
            os.unlink(shm)
        uri = f"file:{quote(os.path.abspath(path))}?mode=ro"
    else:  # no WAL (or not a plain file: ignored): the file is all there is
        uri = f"file:{quote(os.path.abspath(path))}?mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True)
        conn.execute("PRAGMA trusted_schema = OFF")
        conn.execute("PRAGMA temp_store = MEMORY")  # sorts count against the grade envelope, not a full /tmp
        conn.execute("PRAGMA query_only = ON")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as e:
        raise Unreadable(f"{NOT_READABLE} ({_one_line(str(e))})") from None
    return conn


def open_fixture(path: str) -> sqlite3.Connection:
    """The task's fixture database (built by the harness from the suite's SQL: trusted), read-only."""
    return sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=ro&immutable=1", uri=True)


def _tables(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name")]


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

    Rows are matched by primary key (rowid for tables without one). Only the columns of the
    fixture's table are read from the final state: a column the agent added is reported by
    name, never evaluated (a generated column can cost anything to compute)."""
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
    added, removed, changed, outside = _Capped(), _Capped(), _Capped(), _Capped()
    q = _ident(table)
    if key:
        key_sql = "_rowid_" if key == [ROWID] else ", ".join(_ident(k) for k in key)
        vals = [c for c in common if c not in key]
        sel = f"SELECT {key_sql}{''.join(', ' + _ident(c) for c in vals)} FROM {q} ORDER BY {key_sql}"
        nk = len(key)
        before: dict[tuple, tuple] = {}
        for row in fx.execute(sel):
            before[tuple(row[:nk])] = row
        shown = key + vals
        for row in st.execute(sel):
            k = tuple(row[:nk])
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
    else:  # no key at all (a WITHOUT ROWID table whose key the agent dropped): rows as values
        sel = f"SELECT {', '.join(_ident(c) for c in common) or 'NULL'} FROM {q}"
        bc = Counter(fx.execute(sel))
        ac = Counter(st.execute(sel))
        for t in (ac - bc).elements():
            added.add(_row_json(common, t))
        for t in (bc - ac).elements():
            removed.add(_row_json(common, t))
    if not (added.n or removed.n or changed.n or td["columns_added"] or td["columns_removed"]):
        return None
    td.update(
        added=added.items, removed=removed.items, changed=changed.items,
        counts={"added": added.n, "removed": removed.n, "changed": changed.n},
        truncated=added.n > len(added.items) or removed.n > len(removed.items) or changed.n > len(changed.items),
        changed_outside_allowed=outside.n, outside_allowed=outside.items,
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
        "truncated": n > len(rows), "changed_outside_allowed": 0, "outside_allowed": [],
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
            out.append(_whole_table(fx, table, "removed"))
        elif table not in f_tables:
            out.append(_whole_table(st, table, "added"))
        else:
            td = _table_diff(fx, st, table, allowed_cols.get(table, set()))
            if td is not None:
                out.append(td)
    return out


# --------------------------------------------------------------------------- messages


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
        return [f"table {t} dropped"]
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
    return out


# --------------------------------------------------------------------------- expectations


def _norm(v: Any) -> Any:
    return int(v) if isinstance(v, bool) else v


def _row_tuple(row: tuple | list) -> tuple:
    return tuple(_norm(v) for v in row)


def _fmt_row(row: tuple) -> str:
    return "(" + ", ".join(_fmt(v) for v in row) + ")"


def check_expectation(conn: sqlite3.Connection, exp: dict[str, Any]) -> tuple[bool, str | None]:
    """Run one expectation's query on the final state; (passed, detail)."""
    name = exp["name"]
    try:
        cur = conn.execute(exp["query"])
        cols = [d[0] for d in cur.description or []]
        got = cur.fetchmany(MAX_QUERY_ROWS + 1)
    except sqlite3.Error as e:
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
    return {"name": name[:200], "kind": kind, "passed": passed, "detail": detail}


def _verdict(status: str, passed: bool, reason: str | None, checks: list[dict], diff: list[dict] | None) -> dict[str, Any]:
    lines: list[str] = []
    for td in diff or []:
        lines += describe_table_diff(td)
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
        },
    }


def ungradable(reason: str) -> dict[str, Any]:
    """The verdict on a state that cannot be read."""
    detail = _one_line(reason)
    return _verdict("ungradable", False, detail, [_check("readable final state", "state", False, detail)], None)


def grade_connections(spec: dict[str, Any], fx: sqlite3.Connection, st: sqlite3.Connection) -> dict[str, Any]:
    """The verdict on an open final state ``st`` against the fixture ``fx``. sqlite3 errors
    from ``st`` propagate (the caller makes them ``ungradable``)."""
    unchanged = list(spec.get("unchanged") or [])
    allow = list(spec.get("allow") or [])
    diff = diff_states(fx, st, allow)
    by_table = {td["table"]: td for td in diff}
    checks = []
    for exp in spec.get("expect") or []:
        ok, detail = check_expectation(st, exp)
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
            # view that answers the expectation) or changing its columns is an extra effect
            extra += [x for x in describe_table_diff(td) if x == f"table {td['table']} dropped" or " column(s) " in x]
            continue
        extra += describe_table_diff(td, only_outside_allowed=True)
    more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
    checks.append(_check("no extra effects", "extra_effects", not extra,
                         _one_line(f"extra effect: {extra[0]}{more}") if extra else None))
    failed = next((c for c in checks if not c["passed"]), None)
    return _verdict("graded", failed is None, failed["detail"] if failed else None, checks, diff)


def grade(spec: dict[str, Any], fixture_path: str, state_path: str | None) -> dict[str, Any]:
    """Grade the final state at ``state_path`` against the fixture database at
    ``fixture_path`` (see the module docstring). Never raises for anything the agent left;
    raises only when the trusted fixture cannot be read."""
    fx = open_fixture(fixture_path)
    try:
        if state_path is None:
            return _verdict("graded", False, "no final state", [], None)
        try:
            st = open_final_state(state_path)
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
        finally:
            st.close()
    finally:
        fx.close()


def fit(verdict: dict[str, Any]) -> str:
    """The verdict as compact JSON of at most MAX_VERDICT_BYTES (rows are dropped if needed)."""
    text = json.dumps(verdict, separators=(",", ":"), ensure_ascii=False, default=str)
    diff = verdict.get("diff")
    while len(text.encode()) > MAX_VERDICT_BYTES and diff and diff["tables"]:
        for td in diff["tables"]:
            for kind in ("added", "removed", "changed", "outside_allowed"):
                td[kind] = td[kind][: len(td[kind]) // 2]
            td["truncated"] = True
        diff["truncated"] = True
        if all(not td[k] for td in diff["tables"] for k in ("added", "removed", "changed", "outside_allowed")):
            diff["tables"] = diff["tables"][: len(diff["tables"]) // 2]
        text = json.dumps(verdict, separators=(",", ":"), ensure_ascii=False, default=str)
    if len(text.encode()) > MAX_VERDICT_BYTES:  # checks and lines are bounded; this is the last resort
        verdict["checks"] = verdict["checks"][:10]
        if diff:
            diff["lines"] = diff["lines"][:5]
        text = json.dumps(verdict, separators=(",", ":"), ensure_ascii=False, default=str)
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
    except Exception:  # the grader broke on something it trusts: not the agent's fault
        traceback.print_exc(limit=4, file=sys.stderr)
        return EXIT_BROKEN
    sys.stdout.write(fit(verdict))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
