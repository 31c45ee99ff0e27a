"""A report's read of one run from a SQLite store, with the standard library's sqlite3.

`harness report` (every format but html) reads a run and the report fields of its attempts
(:data:`~harness.store.records.REPORT_FIELDS`). Through the store that costs SQLAlchemy's
import, ~0.18 s of a 10^5-attempt report's ~0.95 s. This module answers the same read
without it: the same queries as ``Store.attempts(run, REPORT_FIELDS)`` and ``Store.get_run``,
and the same checks (``harness.store.records``), so both refuse the same rows.

It answers only what it is sure of: a SQLite file named by a plain URL (no query, and no
character a URL or an SQLite URI would read otherwise: ``%``, ``#``, ``?``), with every column
this harness defines, a run id (or unique prefix, or ``last``) it finds, and no late records
(an attempt recorded lost whose record came afterwards: rare, and the store's to read).
Anything else (another database, an older schema, no such run, a row it would refuse, a lock
held longer than half a second, a driver error) returns None, and the caller reads through
the store, whose answer (or one-line error) is the reference.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sqlite3
from typing import Any, Iterable

from harness.model.errors import StoreError
from harness.model.run import RunRecord
from harness.model.table import AttemptTable
from harness.store.records import DICTS, ENUMS, LISTS, REPORT_FIELDS, checked, lean_columns, run_record
from harness.store.urls import default_url, sqlite_path

_INT, _STR, _NUM, _BOOL, _TIME = (int,), (str,), (int, float), (bool, int), (dt.datetime,)
_LIST, _DICT, _ANY = (list,), (dict,), (object,)
# the Python types of each column's values as read, and the columns that may not hold NULL,
# as orm.py declares them (tests/test_fastread.py holds the two equal)
RUN_KINDS: dict[str, tuple[type, ...]] = {
    "id": _STR, "created_at": _TIME, "finished_at": _TIME, "status": _STR, "suite": _STR, "suite_hash": _STR,
    "suite_path": _STR, "image": _STR, "image_digest": _STR, "agent_cmd": _LIST, "profile": _STR, "profile_json": _DICT,
    "harness_version": _STR, "host": _DICT, "cgroup_version": _STR, "identity_hash": _STR, "trials": _INT, "ks": _LIST,
    "max_reruns": _INT, "seed": _INT, "concurrency": _INT, "task_ids": _LIST, "sweep_id": _STR, "artifacts_dir": _STR,
    "note": _STR, "images": _DICT, "substitutions": _DICT, "task_bases": _DICT, "task_overrides": _BOOL,
    "adjustments": _DICT, "excluded": _DICT, "refills": _DICT, "agent_name": _STR, "agent_env": _DICT, "secrets": _LIST,
    "upstreams": _DICT, "executor": _STR, "ray_address": _STR, "nodes": _ANY, "controller": _STR, "heartbeat_at": _TIME,
}
RUN_NOT_NULL = frozenset({
    "id", "created_at", "status", "suite", "suite_hash", "suite_path", "image", "image_digest", "profile", "harness_version",
    "cgroup_version", "identity_hash", "trials", "max_reruns", "seed", "concurrency", "artifacts_dir", "note",
    "task_overrides", "agent_name", "executor", "ray_address", "controller",
})
ATTEMPT_KINDS: dict[str, tuple[type, ...]] = {
    "id": _INT, "run_id": _STR, "task_id": _STR, "slot": _INT, "attempt_no": _INT, "verdict": _STR, "reasons": _LIST,
    "rules": _LIST, "outcome": _STR, "failure_kind": _STR, "grade_reason": _STR, "error": _STR, "wall_s": _NUM,
    "agent_wall_s": _NUM, "upstream": _DICT, "model_calls": _LIST, "node": _DICT,
}
ATTEMPT_NOT_NULL = frozenset({"id", "run_id", "task_id", "slot", "attempt_no", "verdict", "wall_s"})
_JSON = (_LIST, _DICT, _ANY)
# how SQLAlchemy stores a DateTime in SQLite; anything else is the store's to judge
_STORED_TIME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{6})?")


# a path it opens as the store would (no URL escapes, fragments, queries, authorities, controls)
_PLAIN_PATH = re.compile(r"(?!//)[^%#?\x00-\x1f\x7f]+")
# how long it waits on a writer's lock before it leaves the wait to the store (10 s)
LOCK_WAIT_S = 0.5


class _NotMine(Exception):
    """What this read leaves to the store."""


def report_read(url: str | None, ref: str, fields: Iterable[str] = REPORT_FIELDS) -> tuple[RunRecord, AttemptTable, int] | None:
    """The run ``ref`` names (id, unique prefix, ``last``), its attempts' ``fields`` as
    ``Store.attempts(run, fields)`` gives them, and its late records' count (0: a run that has
    any is left to the store); or None when the store must answer (see the module docstring)."""
    url = url or default_url()
    path = sqlite_path(url)
    if path is None or _PLAIN_PATH.fullmatch(url.removeprefix("sqlite:///")) is None or not ref.strip():
        return None
    try:
        if not path.is_file():
            return None
        con = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=LOCK_WAIT_S)
    except (OSError, ValueError, sqlite3.Error):
        return None
    try:
        run = _run(con, url, ref)
        if run is None:
            return None
        if _has_late(con, run.id):
            return None
        return run, _attempts(con, url, run.id, list(fields)), 0
    except (_NotMine, StoreError, sqlite3.Error, ValueError, TypeError, RecursionError, OverflowError):
        return None
    finally:
        con.close()


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute("SELECT * FROM pragma_table_info(?)", (table,))}


def _run(con: sqlite3.Connection, url: str, ref: str) -> RunRecord | None:
    if not set(RUN_KINDS) <= _columns(con, "runs"):
        raise _NotMine
    cols = list(RUN_KINDS)
    q = f"SELECT {', '.join(cols)} FROM runs"
    rows = con.execute(f"{q} WHERE id = ?", (ref,)).fetchall()
    if not rows:
        like = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = con.execute(f"{q} WHERE id LIKE ? ESCAPE '\\' LIMIT 2", (like,)).fetchall()
        if len(rows) != 1:
            for r in rows:  # the store reads (and checks) both before it looks for the newest
                _run_row(dict(zip(cols, r)), url)
            rows = con.execute(f"{q} ORDER BY created_at DESC LIMIT 1").fetchall() if ref in ("last", "latest") else []
    if not rows:
        return None  # no such run, or an ambiguous prefix: the store says which
    return [_run_row(dict(zip(cols, r)), url) for r in rows][0]  # each checked, as the store checks every row it reads


def _run_row(row: dict[str, Any], url: str) -> RunRecord:
    for name, kind in RUN_KINDS.items():
        v = row[name]
        if v is None:
            continue
        if kind in _JSON:
            if type(v) is not str:
                raise _NotMine
            row[name] = json.loads(v)
        elif kind is _TIME:
            if type(v) is not str or not _STORED_TIME.fullmatch(v):
                raise _NotMine
            row[name] = dt.datetime.fromisoformat(v)
        elif kind is _BOOL:
            if v not in (0, 1) or type(v) is not int:
                raise _NotMine
            row[name] = bool(v)
    return run_record(checked(row, url, RUN_KINDS, lambda n: n not in RUN_NOT_NULL, "run"), url)


def _attempts(con: sqlite3.Connection, url: str, run_id: str, fields: list[str]) -> AttemptTable:
    """``Store._lean_attempts`` on a SQLite store with every column: the same statements."""
    wanted = [n for n in dict.fromkeys(["id", *fields]) if n != "rules"]
    if not set(wanted) | {"rules"} <= set(ATTEMPT_KINDS) or not set(wanted) | {"rules", "run_id"} <= _columns(con, "attempts"):
        raise _NotMine
    json_names = [n for n in wanted if ATTEMPT_KINDS[n] in _JSON]
    first: dict[str, Any] = {}
    if json_names:
        got = con.execute(f"SELECT {', '.join(f'CAST({n} AS TEXT)' for n in json_names)} FROM attempts WHERE run_id = ? "
                          "ORDER BY id LIMIT 1", (run_id,)).fetchall()
        first = dict(zip(json_names, got[0])) if got else {}
    exprs: list[str] = []
    params: list[Any] = []
    decoded: list[tuple[int, Any]] = []
    coded: dict[int, list[Any]] = {}
    for name in wanted:
        c = name
        vals: list[Any] = []
        if ATTEMPT_KINDS[name] in _JSON:
            empty = [] if name in LISTS else {} if name in DICTS else None
            decoded.append((len(exprs), empty))
            c = f"CAST({name} AS TEXT)"
            if first:
                vals = list(dict.fromkeys(v for v in (first.get(name), json.dumps(empty)) if v is not None))
        elif name in ENUMS:
            vals = [v for v in ENUMS[name] if v is not None]
        if vals:
            coded[len(exprs)] = vals
            c = "CASE " + " ".join(f"WHEN ({c} = ?) THEN {i}" for i in range(len(vals))) + f" ELSE CAST({c} AS TEXT) END"
            params.extend(vals)
        exprs.append(c)
    names = list(wanted)
    if "rules" in fields:
        decoded.append((len(names), []))
        names.append("rules")
    rows = con.execute(f"SELECT {', '.join(exprs)} FROM attempts WHERE run_id = ? ORDER BY id", (*params, run_id)).fetchall()

    def rules() -> list[tuple[int, Any]]:
        return con.execute("SELECT id, CAST(rules AS TEXT) FROM attempts WHERE id IN "
                           "(SELECT id FROM attempts WHERE run_id = ? AND verdict != 'clean')", (run_id,)).fetchall()

    return lean_columns(rows, names, decoded, [], coded, rules if "rules" in fields else None, ATTEMPT_KINDS,
                        lambda n: n not in ATTEMPT_NOT_NULL, url)


def _has_late(con: sqlite3.Connection, run_id: str) -> bool:
    """Whether the run has records that arrived after their attempt was recorded lost."""
    if con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'late_attempts'").fetchone() is None:
        return False
    return con.execute("SELECT 1 FROM late_attempts WHERE run_id = ? LIMIT 1", (run_id,)).fetchone() is not None
