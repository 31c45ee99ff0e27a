"""Stored rows as records: the checks every reader of the store applies, without a database
driver. A store changed outside harness is a one-line StoreError naming the row and column,
never a traceback wherever a bad value is first used.

The store (``store.py``, SQLAlchemy) and the report's SQLite read (``fastread.py``, the
standard library's sqlite3) both turn rows into records here, so both refuse the same rows.
"""

from __future__ import annotations

import collections
import functools
import json
import math
import typing
from typing import Any, Callable, Iterable

from pydantic import TypeAdapter, ValidationError

from harness.model.attempt import FAILURE_KINDS, AttemptRecord
from harness.model.errors import StoreError
from harness.model.gateway import ModelCall, UpstreamSummary
from harness.model.run import MAX_SLOTS, RunRecord
from harness.model.sla import RuleResult
from harness.model.table import AttemptTable
from harness.model.units import one_line

# the columns of the attempts' report index (ix_attempts_report): REPORT_FIELDS but rules
REPORT_INDEX_COLS = ("task_id", "slot", "attempt_no", "verdict", "reasons", "outcome", "failure_kind", "grade_reason", "error",
                     "wall_s", "agent_wall_s", "upstream", "model_calls", "node")
# what a report (table, json, markdown, junit, gate) reads of each attempt; the HTML page's
# figures and failure review read whole records
REPORT_FIELDS = (*REPORT_INDEX_COLS[:5], "rules", *REPORT_INDEX_COLS[5:])  # rules: of discarded attempts only

LISTS = ("reasons", "rules", "grade_checks", "envelope_notes", "model_calls", "egress", "phases")
DICTS = ("state_diff", "envelope", "envelope_applied", "counters", "host_counters", "grade_envelope", "rewards",
          "requested_envelope", "services", "upstream", "egress_summary", "node")


RUN_LISTS = ("agent_cmd", "ks", "task_ids", "secrets")
RUN_DICTS = ("profile_json", "host", "images", "substitutions", "task_bases", "adjustments", "excluded", "agent_env", "upstreams", "refills")
# values a column may hold besides its type's (a record's Literal fields)
ENUMS = {"verdict": ("clean", "discarded"), "outcome": ("pass", "fail", None), "failure_kind": (None, *FAILURE_KINDS)}
# whole numbers with a floor (a negative slot would index a task's slots from the end)
FLOORS = {"slot": 0, "attempt_no": 1, "wall_s": 0}


# JSON columns whose items have a record type of their own, checked at read as that type (the
# record keeps them as dicts): a report sums a call's tokens and a summary's counts, groups
# discards by a rule's scope, an export turns a call's times into spans
ITEMS: dict[str, Any] = {"model_calls": list[ModelCall], "rules": list[RuleResult], "upstream": UpstreamSummary}


@functools.lru_cache(maxsize=64)
def adapter(field: str) -> TypeAdapter:
    """Validates what an attempt's JSON column holds (its AttemptRecord field's type, or its
    items' record type)."""
    return TypeAdapter(ITEMS.get(field) or AttemptRecord.model_fields[field].annotation)


# what a run's profile holds as numbers (a store changed outside harness may hold anything)
_PROFILE_NUMBERS = ("cpus", "cores", "cpu_period_us", "memory", "pids", "storage", "io_read_bps", "io_write_bps", "output_cap",
                    "sample_hz", "override_scale")


def damaged(url: str, what: str) -> str:
    return (f"database {url}: {what[:300]} -- harness never writes that; the database was changed outside "
            "harness or is damaged (restore it from a copy, or pass another --db)")


def wrong(url: str, attempt_id: Any, column: str, value: Any, show: bool = False, what: str = "attempt") -> None:
    """Stop on a value harness never writes: named by type (a stored string may be an agent's
    text), by value for numbers and the values of a record's fixed vocabulary."""
    shown = ascii(value) if show or isinstance(value, (int, float, bool)) or value is None else f"a {type(value).__name__}"
    raise StoreError(damaged(url, f"{what} {attempt_id}: column {column} holds {shown[:60]}"))


def checked(row: dict[str, Any], url: str, kinds: dict[str, tuple[type, ...]], nullable: Callable[[str], bool],
             what: str = "attempt") -> dict[str, Any]:
    """A whole stored row, refused (one line) when a column holds what harness never writes:
    ``kinds`` the Python types each column's values may have as read, ``nullable`` whether a
    column may hold NULL; ``what`` names the row (an attempt's have floors and vocabularies)."""
    for name, v in row.items():
        ok = kinds.get(name)
        if v is not None and ok is not None and not isinstance(v, ok):
            wrong(url, row.get("id"), name, v, what=what)
    for name, v in row.items():
        if v is None and not nullable(name):
            wrong(url, row.get("id"), name, v, what=what)
    if what != "attempt":
        return row
    for name, low in FLOORS.items():
        if isinstance(row.get(name), (int, float)) and row[name] < low:
            wrong(url, row.get("id"), name, row[name])
    for name, v in row.items():  # SQLite keeps an infinity harness never writes
        if isinstance(v, float) and math.isinf(v):
            wrong(url, row.get("id"), name, v)
    for name, allowed in ENUMS.items():
        if name in row and row[name] not in allowed:
            wrong(url, row.get("id"), name, row[name], show=True)
    return row


@functools.lru_cache(maxsize=16)
def lean_type(fields: tuple[str, ...]) -> type:
    """A read-only record of an attempt holding only ``fields`` (AttemptRecord's names): a
    named tuple. Reading any other attribute is an AttributeError that names the field, never
    a default that would pass for a stored value: whoever reads it must add it to the fields."""
    unknown = [f for f in fields if f not in AttemptRecord.model_fields]
    if unknown:
        raise ValueError(f"not fields of an attempt record: {', '.join(unknown)}")

    def __getattr__(self: Any, name: str) -> Any:
        where = "not read by this lean read (add it to the fields read)" if name in AttemptRecord.model_fields else "not a field"
        raise AttributeError(f"attempt record field {name!r}: {where}")

    base = collections.namedtuple("LeanAttempt", fields)  # type: ignore[misc]
    return type("LeanAttempt", (base,), {"__slots__": (), "__getattr__": __getattr__,
                                         "__doc__": f"An attempt's {', '.join(fields)} (read-only)."})


def attempt_record(row: dict[str, Any], url: str) -> AttemptRecord:
    """A stored row as a record, validated (~20 us): a store changed outside harness is a
    one-line StoreError here, not a traceback wherever a bad value is first used."""
    _empties(row, LISTS, DICTS)
    row["samples"] = []
    rec = validated(AttemptRecord, row, url, f"attempt {row.get('id')}")
    for k in ITEMS:
        if getattr(rec, k):
            validated_as(adapter(k).validate_python, getattr(rec, k), url, f"attempt {row.get('id')}: column {k}")
    return rec


def _empties(row: dict[str, Any], lists: tuple[str, ...], dicts: tuple[str, ...]) -> None:
    """NULL in a JSON column (a column added after the row was written) as its empty value."""
    for k in lists:
        if row.get(k) is None:
            row[k] = []
    for k in dicts:
        if row.get(k) is None:
            row[k] = {}


def run_record(row: dict[str, Any], url: str) -> RunRecord:
    _empties(row, RUN_LISTS, RUN_DICTS)
    if row.get("task_overrides") is None:
        row["task_overrides"] = True
    for k in ("controller", "note", "suite_path", "artifacts_dir", "cgroup_version", "identity_hash", "image_digest", "agent_name"):
        if row.get(k) is None:
            row[k] = ""
    run = validated(RunRecord, row, url, f"run {one_line(str(row.get('id')), 60)}")
    for k in _PROFILE_NUMBERS:
        v = run.profile_json.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise StoreError(damaged(url, f"run {one_line(run.id, 60)}: profile_json.{k} holds a {type(v).__name__}"))
    if len(run.task_ids) * run.trials > MAX_SLOTS:  # every reader would hold a view of each slot
        raise StoreError(damaged(url, f"run {one_line(run.id, 60)}: {len(run.task_ids):,} tasks x {run.trials:,} trials "
                                       f"is more than the {MAX_SLOTS:,} slots a run may have"))
    if any(k > run.trials for k in run.ks):  # a run never fixes a k beyond its trials
        raise StoreError(damaged(url, f"run {one_line(run.id, 60)}: ks {run.ks} exceed its {run.trials} trials"))
    return run


@functools.lru_cache(maxsize=8)
def _none_ok(model: Any) -> frozenset[str]:
    """Fields of ``model`` that may hold None (the rest take their default when a row has NULL)."""
    return frozenset(n for n, f in model.model_fields.items()
                     if f.annotation is Any or type(None) in typing.get_args(f.annotation) or f.annotation is type(None))


def validated(model: Any, row: dict[str, Any], url: str, what: str) -> Any:
    """``model`` from a stored row: NULL in a field that cannot hold it takes the field's
    default (a column added after the row was written); anything else harness never writes is
    a StoreError naming the field and the kind of problem, never the stored value."""
    ok = _none_ok(model)
    for k in [k for k, v in row.items() if v is None and k not in ok and k in model.model_fields]:
        if not model.model_fields[k].is_required():
            del row[k]
    return validated_as(model.model_validate, row, url, what)


def validated_as(validate: Any, row: Any, url: str, what: str) -> Any:
    try:
        return validate(row)
    except ValidationError as e:
        first = e.errors(include_input=False, include_url=False)[0]
        loc = ".".join(str(x) for x in first.get("loc", ())) or "?"
        raise StoreError(damaged(url, f"{what}: field {one_line(loc, 80)}: {one_line(first.get('msg', ''), 120)}")) from None


def lean_columns(rows: list[tuple], names: list[str], decoded: list[tuple[int, Any]], absent: list[tuple[str, Any]],
                 coded: dict[int, list[Any]] | None, rules: Callable[[], Iterable[tuple[int, Any]]] | None,
                 kinds: dict[str, tuple[type, ...]], nullable: Callable[[str], bool], url: str) -> AttemptTable:
    """A lean read's fetched ``rows`` (tuples in ``names`` order, the id first) as an
    AttemptTable, each column checked to hold what harness writes (a StoreError naming the
    attempt and column otherwise).

    ``decoded``: (position, empty value) of JSON columns, fetched as text; ``coded``: position
    -> the values the small integers in that column stand for; ``absent``: (field, default)
    of fields the database has no column for; ``rules``: when ``names`` ends with rules, what
    reads (id, rules text) of the discarded attempts (asked only when there is one)."""
    # tuple.__new__ straight from C (namedtuple's _make is a Python frame per row)
    make = functools.partial(tuple.__new__, lean_type(tuple(names + [n for n, _ in absent])))
    if not rows:
        return AttemptTable({n: [] for n in [*names, *(n for n, _ in absent)]}, make)
    coded = coded or {}
    # column by column (C-level map/set over 10^5 values, not a Python loop per row): each
    # column checked to hold what harness writes, each distinct JSON text decoded once
    cols_: list[Any] = list(zip(*rows))  # a tuple per column (not copied to a list: it is only read)
    if rules is not None:  # the last of names: by id; None (an empty list) for a clean attempt
        # a run with no discarded attempt (the common case) asks for none
        iv = names.index("verdict") if "verdict" in names else None
        clean = None if iv is None else coded[iv].index("clean") if iv in coded else "clean"
        by_id = {} if iv is not None and set(cols_[iv]) <= {clean} else dict(rules())
        cols_.append(list(map(by_id.get, cols_[0])) if by_id else [None] * len(rows))
        json_at = dict(decoded)
    for i, name in enumerate(names):
        col = cols_[i]
        if i in json_at:
            empty = json_at[i]
            memo: dict[Any, Any] = {None: empty}
            vals = coded.get(i, ())
            for v in set(col) - {None}:
                try:
                    got = json.loads(vals[v] if type(v) is int else v)
                except (ValueError, RecursionError):  # RecursionError: nested deeper than any record
                    raise StoreError(damaged(url, f"attempt {cols_[0][col.index(v)]}: column {name} is not JSON")) from None
                if got is None:  # JSON null: what whole records make of it
                    got = empty
                elif empty is not None and not isinstance(got, type(empty)):
                    wrong(url, cols_[0][col.index(v)], name, got)
                try:  # what it holds, too (each distinct text once)
                    adapter(name).validate_python(got)
                except ValidationError as e:
                    first = e.errors(include_input=False, include_url=False)[0]
                    loc = ".".join(str(x) for x in first.get("loc", ()))
                    raise StoreError(damaged(url, f"attempt {cols_[0][col.index(v)]}: column {name}"
                                                        f"{'[' + one_line(loc, 60) + ']' if loc else ''}: {one_line(first.get('msg', ''), 120)}")) from None
                memo[v] = got
            cols_[i] = list(map(memo.__getitem__, col))
            continue
        if name in ENUMS:  # its vocabulary, so its type too
            vals = coded.get(i)
            allowed = {*range(len(vals)), *(v for v in ENUMS[name] if v is None)} if vals else set(ENUMS[name])
            bad = set(col) - allowed
            if bad:
                v = next(iter(bad))
                wrong(url, cols_[0][col.index(v)], name, v, show=True)
            if vals:
                cols_[i] = list(map({**dict(enumerate(vals)), None: None}.__getitem__, col)) if None in allowed \
                    else list(map(vals.__getitem__, col))
            continue
        ok = kinds.get(name)
        if ok is not None and name != "id":  # the rowid is an integer whatever was written
            bad_types = set(map(type, col)) - {type(None)}
            for t in bad_types:
                if not issubclass(t, ok):  # SQLite keeps whatever was written into a column
                    v = next(x for x in col if type(x) is t)
                    wrong(url, cols_[0][col.index(v)], name, v)
        if not nullable(name) and None in col:  # scans in C, as min() below
            wrong(url, cols_[0][col.index(None)], name, None)
        low = FLOORS.get(name)
        if low is not None and min(col) < low:
            v = next(x for x in col if x < low)
            wrong(url, cols_[0][col.index(v)], name, v)
        if ok == (int, float):  # an infinity SQLite keeps and harness never writes (scans in C)
            for v in (math.inf, -math.inf):
                if v in col:
                    wrong(url, cols_[0][col.index(v)], name, v)
    columns = dict(zip(names, cols_))
    for name, v in absent:
        columns[name] = [v] * len(rows)
    return AttemptTable(columns, make)
