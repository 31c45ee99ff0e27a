"""The store: runs, attempts and saturation samples (SQLAlchemy 2, typed ORM).

SQLite by default at ``./.harness/harness.db``; any SQLAlchemy URL through ``--db`` or
``HARNESS_DB`` (e.g. ``postgresql+psycopg://user@host/harness``). Attempts are never
deleted by the harness: a discarded attempt stays with its reasons. Each attempt is
written with its samples in one transaction, so a crash loses at most the attempt in flight.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any, Iterator

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    BigInteger,
    String,
    Text,
    create_engine,
    event,
    select,
    func,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship, sessionmaker

DEFAULT_HOME = ".harness"
SCHEMA_VERSION = 1


class StoreError(RuntimeError):
    """The store cannot be opened or written; the message names the database and what to do."""


def harness_home() -> Path:
    """Project-local folder for the default database and run artifacts (HARNESS_HOME)."""
    return Path(os.environ.get("HARNESS_HOME", DEFAULT_HOME))


def default_url() -> str:
    return os.environ.get("HARNESS_DB") or f"sqlite:///{harness_home() / 'harness.db'}"


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class RunRow(Base):
    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="running")  # running|complete|interrupted|failed
    suite: Mapped[str] = mapped_column(String(128))
    suite_hash: Mapped[str] = mapped_column(String(80))
    suite_path: Mapped[str] = mapped_column(Text, default="")
    image: Mapped[str] = mapped_column(String(256))
    image_digest: Mapped[str] = mapped_column(String(128), default="")
    agent_cmd: Mapped[list] = mapped_column(JSON, default=list)
    profile: Mapped[str] = mapped_column(String(64))
    profile_json: Mapped[dict] = mapped_column(JSON, default=dict)
    harness_version: Mapped[str] = mapped_column(String(32))
    host: Mapped[dict] = mapped_column(JSON, default=dict)
    cgroup_version: Mapped[str] = mapped_column(String(32), default="")
    identity_hash: Mapped[str] = mapped_column(String(80), default="")
    trials: Mapped[int] = mapped_column(Integer)
    ks: Mapped[list] = mapped_column(JSON, default=list)
    max_reruns: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(BigInteger, default=0)
    concurrency: Mapped[int] = mapped_column(Integer, default=1)
    task_ids: Mapped[list] = mapped_column(JSON, default=list)
    sweep_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    artifacts_dir: Mapped[str] = mapped_column(Text, default="")
    note: Mapped[str] = mapped_column(Text, default="")
    controller: Mapped[str] = mapped_column(String(128), default="")  # host:pid of the process running it
    attempts: Mapped[list["AttemptRow"]] = relationship(back_populates="run", order_by="AttemptRow.id")


class AttemptRow(Base):
    __tablename__ = "attempts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    task_id: Mapped[str] = mapped_column(String(128))
    slot: Mapped[int] = mapped_column(Integer)
    attempt_no: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(BigInteger)
    verdict: Mapped[str] = mapped_column(String(16))  # clean|discarded
    reasons: Mapped[list] = mapped_column(JSON, default=list)
    rules: Mapped[list] = mapped_column(JSON, default=list)
    outcome: Mapped[str | None] = mapped_column(String(8), nullable=True)  # pass|fail (clean only)
    failure_kind: Mapped[str | None] = mapped_column(String(32), nullable=True)
    grade_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    grade_checks: Mapped[list] = mapped_column(JSON, default=list)
    state_diff: Mapped[dict] = mapped_column(JSON, default=dict)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    terminated_cleanly: Mapped[bool] = mapped_column(Boolean, default=False)
    timed_out: Mapped[bool] = mapped_column(Boolean, default=False)
    wall_s: Mapped[float] = mapped_column(Float, default=0.0)
    agent_wall_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    setup_wall_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    cpuset: Mapped[str] = mapped_column(String(64), default="")
    concurrent: Mapped[int] = mapped_column(Integer, default=1)
    image: Mapped[str] = mapped_column(String(256), default="")
    container: Mapped[str] = mapped_column(String(64), default="")
    envelope: Mapped[dict] = mapped_column(JSON, default=dict)  # profile values actually used
    envelope_applied: Mapped[dict] = mapped_column(JSON, default=dict)  # read back from the kernel
    # counters (agent phase), flattened for queries
    cpu_usage_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    nr_periods: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    nr_throttled: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    throttled_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    throttled_share: Mapped[float | None] = mapped_column(Float, nullable=True)
    memory_peak: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    memory_max: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    memory_limit_hits: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    memory_high_events: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    oom_kills: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pids_peak: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pids_max: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pids_limit_hits: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    psi_cpu_some_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    psi_memory_some_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    psi_io_some_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    foreign_cpu_share: Mapped[float | None] = mapped_column(Float, nullable=True)
    steal_share: Mapped[float | None] = mapped_column(Float, nullable=True)
    host_psi_cpu: Mapped[float | None] = mapped_column(Float, nullable=True)
    host_psi_memory: Mapped[float | None] = mapped_column(Float, nullable=True)
    host_psi_io: Mapped[float | None] = mapped_column(Float, nullable=True)
    mem_available_min: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    counters: Mapped[dict] = mapped_column(JSON, default=dict)
    host_counters: Mapped[dict] = mapped_column(JSON, default=dict)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    artifacts: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    finished_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    run: Mapped[RunRow] = relationship(back_populates="attempts")
    samples: Mapped[list["SampleRow"]] = relationship(back_populates="attempt", order_by="SampleRow.t")

    __table_args__ = (
        Index("ix_attempts_run_task_slot", "run_id", "task_id", "slot"),
        # a slot's attempt numbers are unique: a second controller on the same run fails loudly
        Index("ux_attempts_slot_attempt", "run_id", "task_id", "slot", "attempt_no", unique=True),
    )


class SampleRow(Base):
    __tablename__ = "samples"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id"), index=True)
    t: Mapped[float] = mapped_column(Float)
    cpu_usage_us: Mapped[int] = mapped_column(BigInteger)
    throttled_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    nr_throttled: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    memory_current: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    pids_current: Mapped[int | None] = mapped_column(Integer, nullable=True)
    foreign_cpu_us: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    host_mem_available: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    attempt: Mapped[AttemptRow] = relationship(back_populates="samples")


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


class Store:
    """A handle on the database. ``Store.open(url)`` creates tables if needed."""

    def __init__(self, engine: Engine, url: str):
        self.engine = engine
        self.url = url
        self.Session = sessionmaker(engine, expire_on_commit=False)

    @classmethod
    def open(cls, url: str | None = None, create: bool = True) -> "Store":
        url = url or default_url()
        if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
            path = Path(url.removeprefix("sqlite:///"))
            if not create and not path.exists():
                raise StoreError(f"no harness database at {path}; run `harness run --suite refunds` first or pass --db")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StoreError(f"cannot create {path.parent} for the database: {e.strerror}; pass --db or set HARNESS_DB") from None
        try:
            engine = create_engine(url, future=True)
        except (SQLAlchemyError, ImportError, ValueError) as e:
            raise StoreError(f"cannot use database URL {url!r}: {e}") from None
        if engine.dialect.name == "sqlite":
            event.listen(engine, "connect", _sqlite_pragmas)
        try:
            if create:
                Base.metadata.create_all(engine)
                _add_missing_columns(engine)
                if engine.dialect.name == "sqlite":
                    # a real write now, so a read-only or locked store fails before a run starts
                    with engine.begin() as conn:
                        conn.exec_driver_sql(f"PRAGMA user_version = {SCHEMA_VERSION}")
            else:
                with engine.connect():
                    pass
                try:  # a database from an older harness: add new columns (never drops anything)
                    _add_missing_columns(engine)
                except OperationalError:
                    pass  # read-only: reads of old columns still work
        except OperationalError as e:
            raise StoreError(_explain(url, e)) from None
        return cls(engine, url)

    def session(self) -> Session:
        return self.Session()

    def artifacts_root(self) -> Path:
        return harness_home() / "runs"

    # -- writes ----------------------------------------------------------------
    def add_run(self, run: RunRow) -> None:
        with self._tx() as s:
            s.add(run)

    def add_attempt(self, attempt: AttemptRow, samples: list[dict]) -> int:
        """Insert one attempt and its samples in one transaction; returns the attempt id."""
        with self._tx() as s:
            s.add(attempt)
            s.flush()
            if samples:
                s.bulk_insert_mappings(SampleRow, [{**x, "attempt_id": attempt.id} for x in samples])
            return attempt.id

    def claim_run(self, run_id: str, expected_controller: str | None, controller: str) -> bool:
        """Compare-and-swap the run's controller: True when this process now owns the run,
        False when another controller claimed it first (two `--resume` at once)."""
        from sqlalchemy import or_, update

        cond = RunRow.controller.is_(None) if expected_controller is None else RunRow.controller == expected_controller
        if expected_controller == "":
            cond = or_(RunRow.controller.is_(None), RunRow.controller == "")
        with self._tx() as s:
            res = s.execute(update(RunRow).where(RunRow.id == run_id, cond).values(controller=controller, status="running", finished_at=None))
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

    def _tx(self) -> "_Tx":
        return _Tx(self)

    # -- reads -----------------------------------------------------------------
    def get_run(self, run_id: str) -> RunRow:
        with self.session() as s:
            r = s.get(RunRow, run_id)
            if r is None:
                # allow unique prefixes of run ids
                rows = s.scalars(select(RunRow).where(RunRow.id.like(f"{run_id}%"))).all()
                if len(rows) == 1:
                    return rows[0]
                if run_id in ("last", "latest"):
                    r = s.scalars(select(RunRow).order_by(RunRow.created_at.desc()).limit(1)).first()
                    if r is not None:
                        return r
                hint = "ambiguous prefix" if rows else "no such run"
                raise StoreError(f"run {run_id!r}: {hint}; list runs with `harness runs`")
            return r

    def attempts(self, run_id: str) -> list[AttemptRow]:
        with self.session() as s:
            return list(s.scalars(select(AttemptRow).where(AttemptRow.run_id == run_id).order_by(AttemptRow.id)))

    def get_attempt(self, attempt_id: int) -> AttemptRow:
        with self.session() as s:
            a = s.get(AttemptRow, attempt_id)
            if a is None:
                raise StoreError(f"attempt {attempt_id}: no such attempt; list them with `harness trials RUN`")
            return a

    def samples(self, attempt_id: int) -> list[SampleRow]:
        with self.session() as s:
            return list(s.scalars(select(SampleRow).where(SampleRow.attempt_id == attempt_id).order_by(SampleRow.t)))

    def runs(self, limit: int = 50) -> list[RunRow]:
        with self.session() as s:
            return list(s.scalars(select(RunRow).order_by(RunRow.created_at.desc()).limit(limit)))

    def attempt_counts(self, run_id: str) -> dict[str, int]:
        with self.session() as s:
            rows = s.execute(
                select(AttemptRow.verdict, func.count()).where(AttemptRow.run_id == run_id).group_by(AttemptRow.verdict)
            ).all()
            return {v: n for v, n in rows}


class _Tx:
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
        except OperationalError as e:
            self.s.rollback()
            raise StoreError(_explain(self.store.url, e)) from None
        finally:
            self.s.close()
        if isinstance(ev, OperationalError):
            raise StoreError(_explain(self.store.url, ev)) from None
        if isinstance(ev, IntegrityError):
            raise StoreError(
                f"database {self.store.url}: a row that must be unique already exists ({str(ev.orig)[:200]}); "
                "is another controller running the same run?"
            ) from None


def _add_missing_columns(engine: Engine) -> None:
    """Forward-only schema upgrade: add columns a newer harness defines to an older database
    (nullable, so old rows stay valid). Nothing is ever dropped."""
    from sqlalchemy import inspect, text

    insp = inspect(engine)
    with engine.begin() as conn:
        for table in Base.metadata.sorted_tables:
            have = {c["name"] for c in insp.get_columns(table.name)}
            for col in table.columns:
                if col.name not in have:
                    ddl = col.type.compile(dialect=engine.dialect)
                    conn.execute(text(f'ALTER TABLE {table.name} ADD COLUMN "{col.name}" {ddl}'))


def _explain(url: str, e: OperationalError) -> str:
    msg = str(e.orig) if getattr(e, "orig", None) else str(e)
    if "readonly" in msg or "read-only" in msg:
        return f"database {url} is read-only ({msg}); make it writable or pass --db / HARNESS_DB"
    if "locked" in msg:
        return f"database {url} is locked by another process ({msg}); wait for it or use another --db"
    if "unable to open" in msg:
        return f"cannot open database {url} ({msg}); check the path or pass --db / HARNESS_DB"
    return f"database {url}: {msg}"


def iter_chunks(items: list, n: int) -> Iterator[list]:
    for i in range(0, len(items), n):
        yield items[i : i + n]
