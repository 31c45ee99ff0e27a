"""The store: runs, attempts, claims and saturation samples, as records in and records out.

SQLite by default at ``./.harness/harness.db``; any SQLAlchemy URL through ``--db`` or
``HARNESS_DB`` (e.g. ``postgresql+psycopg://user@host/harness``). Attempts are never deleted
by the harness (``gc --purge`` is the one explicit exception). Each attempt is written with
its samples in one transaction, which also drops its claim, so a crash loses at most the
attempts in flight -- and their claims say they existed.

Two modes. ``rw`` (runs, gc) creates tables, adds columns a newer harness defines (never
drops one) and checks on every write that the SQLite file it opened is still the one on
disk. ``ro`` (every read-only command) writes nothing at all: a SQLite store is opened
read-only, and only the columns the database has are selected.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal

from sqlalchemy import JSON, Boolean, DateTime, Float, Integer, String, Text, case, cast, create_engine, delete, event, func, inspect, or_, select, text, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from harness.model.attempt import AttemptRecord
from harness.model.counters import Sample
from harness.model.errors import StoreError, StoreLost
from harness.model.run import RunRecord
from harness.model.table import AttemptTable
from harness.model.units import collector_paused, one_line, utcnow
from harness.store.orm import AttemptRow, Base, ClaimRow, LateRow, RunRow, SampleRow, pg_report_index
from harness.store.records import (DICTS, ENUMS, LISTS, REPORT_FIELDS, RUN_DICTS, RUN_LISTS, attempt_record, checked, damaged, lean_columns,
                                   lean_type, run_record, validated, wrong)
from harness.store.urls import default_url, harness_home, is_default_store, missing_database, sqlite_path, url_hint

SCHEMA_VERSION = 2
Mode = Literal["rw", "ro"]
__all__ = ["REPORT_FIELDS", "Store", "StoreError", "StoreLost", "default_url", "harness_home", "is_default_store", "lean_type",
           "missing_database", "url_hint"]
_SAMPLE_COLS = ("t", "cpu_usage_us", "throttled_us", "nr_throttled", "memory_current", "pids_current", "foreign_cpu_us", "host_mem_available")


def _pragmas(write: bool):
    def apply(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        if write:
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=10000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()
    return apply


def _escape_like(s: str) -> str:
    return s.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class Store:
    """A handle on the database; ``Store.open(url, mode)``."""

    def __init__(self, engine: Engine, url: str, mode: Mode, path: Path | None):
        self.engine = engine
        self.url = url
        self.mode = mode
        self.path = path
        self.Session = sessionmaker(engine, expire_on_commit=False)
        self._file_id: tuple[int, int] | None = None
        if path is not None and mode == "rw":
            st = path.stat()
            self._file_id = (st.st_dev, st.st_ino)
        self._cols: dict[str, set[str]] = {}

    @classmethod
    def open(cls, url: str | None = None, mode: Mode = "rw") -> "Store":
        url = url or default_url()
        path = sqlite_path(url)
        engine_url = url
        ro_uri: str | None = None
        if path is not None:
            try:
                path.exists()
            except (OSError, ValueError) as e:  # a name too long for the file system, a NUL in it
                raise StoreError(f"database {url}: {path} cannot name a file here ({getattr(e, 'strerror', None) or e})") from None
            if path.is_dir():
                raise StoreError(f"database {url}: {path} is a directory; name a database file in it, "
                                 f"e.g. --db sqlite:///{path / 'harness.db'}")
            if mode == "ro":
                if not path.exists():
                    raise StoreError(f"no harness database at {path}; run `harness run --suite refunds` first or pass --db{url_hint(url)}")
                # opened by its own URI (the name escaped: a '#' or '%' in it is a character of
                # the name, not a fragment or an escape), read-only: nothing is ever created
                ro_uri = f"{path.absolute().as_uri()}?mode=ro"
            elif is_default_store(path):  # the default store: its folder is ours to make
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise StoreError(f"cannot create {path.parent} for the database: {e.strerror}; pass --db or set HARNESS_DB") from None
            elif not path.parent.is_dir():  # a named store: a mistyped folder is not made at the root of the disk
                raise StoreError(f"database {url}: folder {path.parent} does not exist; create it first "
                                 f"(mkdir -p {path.parent}) or fix the path{url_hint(url)}")
        try:
            if ro_uri is not None:
                engine = create_engine("sqlite://", poolclass=NullPool,
                                       creator=lambda: sqlite3.connect(ro_uri, uri=True, check_same_thread=False))
            else:
                engine = create_engine(engine_url)
        except (SQLAlchemyError, ImportError, ValueError) as e:
            raise StoreError(f"cannot use database URL {url!r}: {e}{url_hint(url)}") from None
        if engine.dialect.name == "sqlite":
            event.listen(engine, "connect", _pragmas(mode == "rw"))
        elif engine.dialect.name == "postgresql":
            pg_report_index()
        try:
            if mode == "rw":
                Base.metadata.create_all(engine)
                _add_missing_columns(engine)
                _add_missing_indexes(engine)
                if engine.dialect.name == "sqlite":
                    # a real write now, so a read-only or locked store fails before a run starts
                    with engine.begin() as conn:
                        conn.exec_driver_sql(f"PRAGMA user_version = {SCHEMA_VERSION}")
            else:
                with engine.connect() as conn:
                    if not inspect(conn).has_table("runs"):
                        raise StoreError(f"database {url} has no harness tables; is it a harness database? pass --db or set HARNESS_DB")
        except OperationalError as e:
            raise StoreError(_explain(url, e)) from None
        except SQLAlchemyError as e:
            raise StoreError(f"database {url} cannot be read ({str(getattr(e, 'orig', e)).splitlines()[0]}); "
                             "is it a harness database? pass --db or set HARNESS_DB") from None
        return cls(engine, url, mode, path)

    def session(self) -> Session:
        return self.Session()

    def artifacts_root(self) -> Path:
        return harness_home() / "runs"

    # -- integrity -------------------------------------------------------------
    def check(self) -> None:
        """Raise :class:`StoreLost` when the SQLite file this store opened was deleted or
        replaced (its writes would go nowhere)."""
        if self._file_id is None or self.path is None:
            return
        try:
            st = self.path.stat()
        except FileNotFoundError:
            raise StoreLost(f"the store {self.path} was deleted while in use; nothing written since is in it "
                            "(records not stored are kept beside the run's artifacts)") from None
        if (st.st_dev, st.st_ino) != self._file_id:
            raise StoreLost(f"the store {self.path} was replaced by another file while in use; "
                            "records not stored are kept beside the run's artifacts")

    def _tx(self) -> "_Tx":
        if self.mode != "rw":
            raise StoreError(f"database {self.url} was opened read-only")
        self.check()
        return _Tx(self)

    def _columns(self, table: str) -> set[str]:
        """The columns ``table`` has in this database (an older one may lack new ones)."""
        if table not in self._cols:
            try:
                self._cols[table] = {c["name"] for c in inspect(self.engine).get_columns(table)}
            except SQLAlchemyError:
                self._cols[table] = set()
        return self._cols[table]

    def _select(self, row: Any) -> Any:
        have = self._columns(row.__tablename__)
        return select(*[c for c in row.__table__.columns if c.name in have])

    def _read(self, stmt: Any, tuples: bool = False) -> list[Any]:
        """Rows as dicts (``tuples``: as tuples, in the statement's column order). A failure is
        a usage error for a reader (wrong --db) and the store failing under a run for a writer
        (exit 3)."""
        with self._read_errors():
            if tuples:  # Core, not the ORM session: no ORM loading step per row
                with self.engine.connect() as c:
                    res = c.execute(stmt)
                    if not any(getattr(res._metadata, "_processors", None) or [True]):
                        return res.cursor.fetchall()  # the driver's own tuples: no Row per row when nothing converts
                    return res.all()
            with self.session() as s:
                return [dict(m) for m in s.execute(stmt).mappings()]

    @contextmanager
    def _read_errors(self) -> Iterator[None]:
        """A read's failure as one line: a usage error for a reader (wrong --db, a damaged
        store), the store failing under a run for a writer (exit 3)."""
        err = StoreLost if self.mode == "rw" else StoreError
        try:
            yield
        except OperationalError as e:
            if _UNDECODABLE in str(e.orig):
                raise StoreError(damaged(self.url, _undecodable(str(e.orig)))) from None
            raise err(_explain(self.url, e)) from None
        except RecursionError:  # JSON nested deeper than any record harness writes
            raise StoreError(damaged(self.url, "a stored JSON value is nested too deeply")) from None
        except (ValueError, TypeError) as e:  # a value the column's type cannot decode (JSON, a date)
            raise StoreError(damaged(self.url, f"a stored value cannot be decoded ({type(e).__name__})")) from None
        except self.engine.dialect.loaded_dbapi.Error as e:  # the driver's own, from the cursor's tuples
            if _UNDECODABLE in str(e):
                raise StoreError(damaged(self.url, _undecodable(str(e)))) from None
            raise err(f"database {self.url}: {type(e).__name__}: {one_line(str(e).splitlines()[0] if str(e) else '', 200)}") from None
        except SQLAlchemyError as e:
            raise err(f"database {self.url} cannot be read ({str(getattr(e, 'orig', e)).splitlines()[0]}); "
                      "is it a harness database? pass --db or set HARNESS_DB") from None

    # -- writes ----------------------------------------------------------------
    def add_run(self, run: RunRecord) -> None:
        with self._tx() as s:
            s.add(RunRow(**run.model_dump()))

    def add_attempt(self, record: AttemptRecord) -> int:
        """Insert one attempt and its samples in one transaction (dropping its claim); the id."""
        with self._tx() as s:
            row = AttemptRow(**record.model_dump(exclude={"id", "samples"}))
            s.add(row)
            s.flush()
            if record.samples:
                s.execute(SampleRow.__table__.insert(), [{**x.model_dump(), "attempt_id": row.id} for x in record.samples])
            s.execute(delete(ClaimRow).where(ClaimRow.run_id == record.run_id, ClaimRow.task_id == record.task_id,
                                             ClaimRow.slot == record.slot, ClaimRow.attempt_no == record.attempt_no))
            return row.id

    def add_late(self, record: AttemptRecord) -> None:
        """Keep the record of an attempt already recorded as lost (see :class:`~harness.store.orm.LateRow`)."""
        with self._tx() as s:
            s.add(LateRow(run_id=record.run_id, task_id=record.task_id, slot=record.slot, attempt_no=record.attempt_no,
                          received_at=utcnow(), record=record.model_dump(mode="json")))

    def late_attempts(self, run_id: str) -> list[AttemptRecord]:
        """Records that arrived after their attempt was recorded lost (evidence, never scored)."""
        if "late_attempts" not in inspect(self.engine).get_table_names():
            return []
        rows = self._read(select(LateRow.__table__).where(LateRow.run_id == run_id).order_by(LateRow.id))
        out = []
        for r in rows:
            what = f"late record {r.get('id')}"
            if not isinstance(r["record"], dict):
                raise StoreError(damaged(self.url, f"{what}: column record holds a {type(r['record']).__name__}"))
            out.append(validated(AttemptRecord, dict(r["record"]), self.url, what))
        return out

    def claim_attempt(self, run_id: str, task_id: str, slot: int, attempt_no: int, seed: int, controller: str) -> None:
        """Say that an attempt starts now (see :class:`~harness.store.orm.ClaimRow`)."""
        with self._tx() as s:
            s.add(ClaimRow(run_id=run_id, task_id=task_id, slot=slot, attempt_no=attempt_no, seed=seed,
                           controller=controller, started_at=utcnow()))

    def orphan_claims(self, run_id: str) -> list[dict[str, Any]]:
        """Claims of ``run_id`` left by a controller that died (no record was stored)."""
        if "attempt_claims" not in inspect(self.engine).get_table_names():
            return []
        return self._read(select(ClaimRow.__table__).where(ClaimRow.run_id == run_id).order_by(ClaimRow.task_id, ClaimRow.slot))

    def claim_run(self, run_id: str, expected_controller: str | None, controller: str) -> bool:
        """Compare-and-swap the run's controller: True when this process now owns the run,
        False when another controller claimed it first (two `--resume` at once)."""
        cond = RunRow.controller.is_(None) if expected_controller is None else RunRow.controller == expected_controller
        if expected_controller == "":
            cond = or_(RunRow.controller.is_(None), RunRow.controller == "")
        with self._tx() as s:
            res = s.execute(update(RunRow).where(RunRow.id == run_id, cond).values(
                controller=controller, status="running", finished_at=None, heartbeat_at=utcnow()))
            return res.rowcount == 1

    def update_run(self, run_id: str, **fields: Any) -> None:
        with self._tx() as s:
            r = s.get(RunRow, run_id)
            if r is None:
                raise StoreError(f"run {run_id!r}: no such run")
            for k, v in fields.items():
                setattr(r, k, v)

    def set_run_status(self, run_id: str, status: str, finished: bool = True) -> None:
        with self._tx() as s:
            r = s.get(RunRow, run_id)
            if r is not None:
                r.status = status
                if finished:
                    r.finished_at = utcnow()

    def heartbeat(self, run_id: str) -> None:
        """The running controller is alive (``--resume`` from elsewhere waits while it is fresh)."""
        with self._tx() as s:
            s.execute(update(RunRow).where(RunRow.id == run_id).values(heartbeat_at=utcnow()))

    def purge_runs(self, ids: list[str]) -> dict[str, int]:
        """Delete the rows of these runs (``gc --purge``): samples, claims, attempts, runs."""
        with self._tx() as s:
            att = select(AttemptRow.id).where(AttemptRow.run_id.in_(ids))
            out = {"samples": s.execute(delete(SampleRow).where(SampleRow.attempt_id.in_(att))).rowcount}
            s.execute(delete(ClaimRow).where(ClaimRow.run_id.in_(ids)))
            if "late_attempts" in inspect(self.engine).get_table_names():
                late = s.execute(delete(LateRow).where(LateRow.run_id.in_(ids))).rowcount
                if late:
                    out["late attempts"] = late
            out["attempts"] = s.execute(delete(AttemptRow).where(AttemptRow.run_id.in_(ids))).rowcount
            out["runs"] = s.execute(delete(RunRow).where(RunRow.id.in_(ids))).rowcount
            return out

    # -- reads -----------------------------------------------------------------
    def _run_records(self, stmt: Any) -> list[RunRecord]:
        return [run_record(_checked(r, self.url, RunRow), self.url) for r in self._read(stmt)]

    def get_run(self, ref: str) -> RunRecord:
        """A run by id, unique id prefix, or ``last``."""
        if not ref.strip():
            raise StoreError("no run named (an empty run id): give a run id, a unique prefix of it, or `last`; list runs with `harness runs`")
        try:
            ref.encode("utf-8")
        except UnicodeEncodeError:  # bytes the terminal could not decode (argv keeps them as surrogates)
            raise StoreError(f"run {ascii(ref)[:80]}: no such run (it is not UTF-8 text); list runs with `harness runs`") from None
        q = self._select(RunRow)
        rows = self._run_records(q.where(RunRow.id == ref))
        if rows:
            return rows[0]
        rows = self._run_records(q.where(RunRow.id.like(_escape_like(ref) + "%", escape="\\")).limit(2))
        if len(rows) == 1:
            return rows[0]
        if ref in ("last", "latest"):
            last = self._run_records(q.order_by(RunRow.created_at.desc()).limit(1))
            if last:
                return last[0]
        hint = "ambiguous prefix" if rows else "no such run"
        raise StoreError(f"run {ref!r}: {hint}; list runs with `harness runs`")

    def runs(self, limit: int = 50) -> list[RunRecord]:
        return self._run_records(self._select(RunRow).order_by(RunRow.created_at.desc()).limit(limit))

    def runs_in_sweep(self, sweep_id: str) -> list[RunRecord]:
        return self._run_records(self._select(RunRow).where(RunRow.sweep_id == sweep_id).order_by(RunRow.created_at))

    def runs_before(self, cutoff: dt.datetime) -> list[RunRecord]:
        return self._run_records(self._select(RunRow).where(RunRow.created_at < cutoff).order_by(RunRow.created_at))

    def runs_with_identity(self, identity_hash: str, limit: int = 12) -> list[RunRecord]:
        """Runs with this identity hash (nothing changed but the seed), newest first."""
        return self._run_records(self._select(RunRow).where(RunRow.identity_hash == identity_hash)
                                 .order_by(RunRow.created_at.desc()).limit(limit))

    def runs_with_status(self, status: str) -> list[RunRecord]:
        return self._run_records(self._select(RunRow).where(RunRow.status == status).order_by(RunRow.created_at))

    def attempts(self, run_id: str, fields: Iterable[str] | None = None) -> list[Any]:
        """Every attempt of a run, in insertion order: whole :class:`AttemptRecord` objects,
        or with ``fields`` lean read-only tuples that have those attributes only.

        A row holding what harness never writes (a store changed outside harness) is a
        StoreError naming the attempt and column, never a traceback further on.

        ``fields`` (e.g. :data:`REPORT_FIELDS`): a lean read for reports of large runs. Only
        those columns are read, each distinct JSON value is decoded once (a run's attempts
        share their node facts, empty lists and so on), and ``rules`` is read for discarded
        attempts only (what a clean one passed is not evidence a report shows). The records
        are read-only tuples with AttemptRecord's attribute names (:func:`lean_type`); a field
        not read is an AttributeError, never a default."""
        if fields is None:
            rows = self._read(self._select(AttemptRow).where(AttemptRow.run_id == run_id).order_by(AttemptRow.id))
            return [attempt_record(_checked(r, self.url), self.url) for r in rows]
        return self._lean_attempts(run_id, list(fields))

    def _lean_attempts(self, run_id: str, fields: list[str]) -> AttemptTable:
        have = self._columns(AttemptRow.__tablename__)
        table = AttemptRow.__table__
        wanted = [n for n in dict.fromkeys(["id", *fields]) if n != "rules"]
        for name in wanted:
            if name not in table.c:
                raise ValueError(f"not a column of the attempts table: {name}")
        # SQLite: a value most rows share comes back as a small integer (0, 1, ...), one object
        # Python already has, instead of a new string per row (a 10^5-row fetch makes a
        # quarter less): an enum's vocabulary, and a JSON column's empty value and its value in
        # the run's first attempt (the node facts every attempt of a local run shares)
        json_names = [n for n in wanted if n in have and isinstance(table.c[n].type, JSON)]
        first: dict[str, Any] = {}
        sqlite = self.engine.dialect.name == "sqlite"
        if sqlite and json_names:
            got = self._read(select(*(cast(table.c[n], Text) for n in json_names)).where(AttemptRow.run_id == run_id)
                             .order_by(AttemptRow.id).limit(1), tuples=True)
            first = dict(zip(json_names, got[0])) if got else {}
        cols, names, decoded, absent = [], [], [], []
        coded: dict[int, list[Any]] = {}  # column index -> the values its codes stand for
        for name in wanted:
            if name not in have:  # a database older than the field: its default, as whole records get
                absent.append((name, AttemptRecord.model_fields[name].get_default(call_default_factory=True)))
                continue
            c = table.c[name]
            vals: list[Any] = []
            if isinstance(c.type, JSON):
                empty = [] if name in LISTS else {} if name in DICTS else None
                decoded.append((len(names), empty))
                c = cast(c, Text)  # text on every backend (psycopg would decode json itself)
                if first:
                    vals = list(dict.fromkeys(v for v in (first.get(name), json.dumps(empty)) if v is not None))
            elif name in ENUMS and sqlite:
                vals = [v for v in ENUMS[name] if v is not None]
            if vals:  # anything else comes back as text (an integer stored there too: never taken for a code)
                coded[len(names)] = vals
                c = case(*((c == v, i) for i, v in enumerate(vals)), else_=cast(c, Text))
            cols.append(c.label(name))
            names.append(name)
        rules = None
        if "rules" in fields and "rules" in have:
            # what a clean attempt passed is not evidence a report shows; leaving rules out of the
            # main query lets it read the report index alone (ix_attempts_report), which finds
            # the discarded ones too: only their rows are read
            discarded = select(AttemptRow.id).where(AttemptRow.run_id == run_id, AttemptRow.verdict != "clean")
            rules = select(AttemptRow.id, cast(AttemptRow.rules, Text)).where(AttemptRow.id.in_(discarded.scalar_subquery()))
            decoded.append((len(names), []))
            names.append("rules")
        with collector_paused():  # 10^5 rows of new objects
            return self._lean_rows(select(*cols).where(AttemptRow.run_id == run_id).order_by(AttemptRow.id), names, decoded,
                                   absent, rules, coded)

    def _lean_rows(self, stmt: Any, names: list[str], decoded: list[tuple[int, Any]], absent: list[tuple[str, Any]],
                   rules: Any = None, coded: dict[int, list[Any]] | None = None) -> AttemptTable:
        rows = self._read(stmt, tuples=True)
        return lean_columns(rows, names, decoded, absent, coded, None if rules is None else lambda: self._read(rules, tuples=True),
                            _kinds(AttemptRow), functools.partial(_nullable, AttemptRow), self.url)


    def last_attempt_id(self, run_id: str) -> int:
        """The newest attempt of a run (the highest id: ids grow as attempts are stored)."""
        rows = self._read(select(func.max(AttemptRow.id)).where(AttemptRow.run_id == run_id), tuples=True)
        if not rows or rows[0][0] is None:
            raise StoreError(f"run {run_id} has no attempt stored yet")
        return int(rows[0][0])

    def get_attempt(self, attempt_id: int) -> AttemptRecord:
        rows = self._read(self._select(AttemptRow).where(AttemptRow.id == attempt_id))
        if not rows:
            raise StoreError(f"attempt {attempt_id}: no such attempt; list them with `harness trials RUN`")
        return attempt_record(_checked(rows[0], self.url), self.url)

    def samples(self, attempt_id: int) -> list[Sample]:
        rows = self._read(select(*[SampleRow.__table__.c[c] for c in _SAMPLE_COLS])
                          .where(SampleRow.attempt_id == attempt_id).order_by(SampleRow.t))
        return [validated(Sample, r, self.url, f"a sample of attempt {attempt_id}") for r in rows]

    def iter_samples(self, attempt_id: int | None = None, run_id: str | None = None) -> Iterator[dict[str, Any]]:
        """Samples of one attempt or of every attempt of a run, with the attempt's identity,
        ordered by attempt and time (streamed)."""
        q = (
            select(SampleRow.__table__, AttemptRow.run_id, AttemptRow.task_id, AttemptRow.slot, AttemptRow.attempt_no)
            .join(AttemptRow, SampleRow.attempt_id == AttemptRow.id)
            .where(AttemptRow.id == attempt_id if attempt_id is not None else AttemptRow.run_id == run_id)
            .order_by(SampleRow.attempt_id, SampleRow.t, SampleRow.id)
        )
        kinds = {**_kinds(AttemptRow), **_kinds(SampleRow)}
        with self._read_errors():
            with self.session() as s:
                for m in s.execute(q).mappings().yield_per(2000):
                    row = dict(m)
                    for name, v in row.items():  # as every reader: what harness never writes is refused
                        ok = kinds.get(name)
                        if v is not None and ok is not None and not isinstance(v, ok):
                            wrong(self.url, row.get("attempt_id"), name, v)
                    yield row

    def counts(self, ids: list[str]) -> dict[str, tuple[int, int]]:
        """run id -> (attempts, samples)."""
        with self.session() as s:
            na = dict(s.execute(select(AttemptRow.run_id, func.count()).where(AttemptRow.run_id.in_(ids)).group_by(AttemptRow.run_id)).all())
            ns = dict(s.execute(
                select(AttemptRow.run_id, func.count(SampleRow.id)).join(SampleRow, SampleRow.attempt_id == AttemptRow.id)
                .where(AttemptRow.run_id.in_(ids)).group_by(AttemptRow.run_id)).all())
        return {i: (na.get(i, 0), ns.get(i, 0)) for i in ids}


@functools.lru_cache(maxsize=256)
def _nullable(row: Any, name: str) -> bool:
    c = row.__table__.c.get(name)
    return c is None or bool(c.nullable) or isinstance(c.type, JSON)


@functools.lru_cache(maxsize=8)
def _kinds(row: Any) -> dict[str, tuple[type, ...]]:
    """Column -> the Python types its values may have as read (JSON: list or dict)."""
    out: dict[str, tuple[type, ...]] = {}
    for c in row.__table__.columns:
        t = c.type
        if isinstance(t, JSON):
            lists, dicts = (LISTS, DICTS) if row is AttemptRow else (RUN_LISTS, RUN_DICTS)
            out[c.name] = (list,) if c.name in lists else (dict,) if c.name in dicts else (object,)
        elif isinstance(t, Boolean):
            out[c.name] = (bool, int)
        elif isinstance(t, Float):
            out[c.name] = (int, float)
        elif isinstance(t, Integer):  # BigInteger too
            out[c.name] = (int,)
        elif isinstance(t, DateTime):
            out[c.name] = (dt.datetime,)
        elif isinstance(t, String):  # Text too
            out[c.name] = (str,)
    return out


_UNDECODABLE = "Could not decode to UTF-8"


def _undecodable(msg: str) -> str:
    """The driver's 'Could not decode to UTF-8 column X with text ...' without the text."""
    col = msg.split(" column ", 1)[1].split(" with text", 1)[0] if " column " in msg else "?"
    return f"column {one_line(col.strip(), 60)} holds bytes that are not UTF-8 text"


def _checked(row: dict[str, Any], url: str, table: Any = AttemptRow) -> dict[str, Any]:
    """A whole stored row of ``table``, refused (one line) when a column holds what harness never writes."""
    return checked(row, url, _kinds(table), functools.partial(_nullable, table), "run" if table is RunRow else "attempt")


class _Tx:
    """One write transaction. Any database error in it (in the body or at commit) means the
    store failed under the writer: :class:`StoreLost` (exit 3), with the database named."""

    def __init__(self, store: Store):
        self.store = store
        self.s: Session | None = None

    def __enter__(self) -> Session:
        self.s = self.store.session()
        self.s.begin()
        return self.s

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        assert self.s is not None
        try:
            if et is None:
                self.s.commit()
            else:
                self.s.rollback()
        except SQLAlchemyError as e:
            self.s.rollback()
            raise StoreLost(_explain_any(self.store.url, e)) from None
        finally:
            self.s.close()
        if isinstance(ev, SQLAlchemyError):
            raise StoreLost(_explain_any(self.store.url, ev)) from None


def _explain_any(url: str, e: SQLAlchemyError) -> str:
    if isinstance(e, OperationalError):
        return _explain(url, e)
    if isinstance(e, IntegrityError):
        return (f"database {url}: a row that must be unique already exists ({str(e.orig)[:200]}); "
                "is another controller running the same run?")
    return f"database {url}: {str(getattr(e, 'orig', None) or e).splitlines()[0][:300]}"


def _add_missing_columns(engine: Engine) -> None:
    """Forward-only schema upgrade: add columns a newer harness defines to an older database
    (nullable, so old rows stay valid). Nothing is ever dropped."""
    insp = inspect(engine)
    with engine.begin() as conn:
        for table in Base.metadata.sorted_tables:
            have = {c["name"] for c in insp.get_columns(table.name)}
            for col in table.columns:
                if col.name not in have:
                    ddl = col.type.compile(dialect=engine.dialect)
                    conn.execute(text(f'ALTER TABLE {table.name} ADD COLUMN "{col.name}" {ddl}'))


def _add_missing_indexes(engine: Engine) -> None:
    """Forward-only: create the indexes a newer harness defines on a table an older one made
    (create_all makes them with new tables only)."""
    insp = inspect(engine)
    for table in Base.metadata.sorted_tables:
        have = {ix["name"] for ix in insp.get_indexes(table.name)}
        for ix in table.indexes:
            if ix.name not in have:
                with engine.begin() as conn:  # each its own: a dialect's ddl_if may skip it
                    ix.create(conn, checkfirst=True)


def _explain(url: str, e: OperationalError) -> str:
    msg = str(e.orig) if getattr(e, "orig", None) else str(e)
    if "readonly" in msg or "read-only" in msg:
        return f"database {url} is read-only ({msg}); make it writable or pass --db / HARNESS_DB"
    if "locked" in msg:
        return f"database {url} is locked by another process ({msg}); wait for it or use another --db"
    if "unable to open" in msg:
        return f"cannot open database {url} ({msg}); check the path or pass --db / HARNESS_DB"
    return f"database {url}: {msg}"
