"""The tables (SQLAlchemy 2 typed ORM). Columns are only ever added, never dropped: an older
database gains new columns on the next write-mode open, and read-only opens select only the
columns a database has."""

from __future__ import annotations

import datetime as dt
import functools

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from harness.model.units import utcnow
from harness.store.records import REPORT_INDEX_COLS


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
    images: Mapped[dict] = mapped_column(JSON, default=dict)
    substitutions: Mapped[dict] = mapped_column(JSON, default=dict)
    task_bases: Mapped[dict] = mapped_column(JSON, default=dict)
    task_overrides: Mapped[bool] = mapped_column(Boolean, default=True)
    adjustments: Mapped[dict] = mapped_column(JSON, default=dict)
    excluded: Mapped[dict] = mapped_column(JSON, default=dict)
    refills: Mapped[dict] = mapped_column(JSON, default=dict)
    agent_name: Mapped[str] = mapped_column(String(64), default="")
    agent_env: Mapped[dict] = mapped_column(JSON, default=dict)
    secrets: Mapped[list] = mapped_column(JSON, default=list)
    upstreams: Mapped[dict] = mapped_column(JSON, default=dict)
    executor: Mapped[str] = mapped_column(String(16), default="local")
    ray_address: Mapped[str] = mapped_column(String(256), default="")
    nodes: Mapped[dict] = mapped_column(JSON, default=dict)
    controller: Mapped[str] = mapped_column(String(128), default="")  # host:pid-namespace:pid
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)


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
    outcome: Mapped[str | None] = mapped_column(String(8), nullable=True)  # pass|fail
    failure_kind: Mapped[str | None] = mapped_column(String(32), nullable=True)
    grade_status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    grade_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    grade_checks: Mapped[list] = mapped_column(JSON, default=list)
    state_diff: Mapped[dict] = mapped_column(JSON, default=dict)
    grade_wall_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    reward: Mapped[float | None] = mapped_column(Float, nullable=True)
    rewards: Mapped[dict] = mapped_column(JSON, default=dict)
    grade_envelope: Mapped[dict] = mapped_column(JSON, default=dict)
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
    envelope: Mapped[dict] = mapped_column(JSON, default=dict)
    envelope_applied: Mapped[dict] = mapped_column(JSON, default=dict)
    envelope_notes: Mapped[list] = mapped_column(JSON, default=list)
    requested_envelope: Mapped[dict] = mapped_column(JSON, default=dict)
    services: Mapped[dict] = mapped_column(JSON, default=dict)
    model_calls: Mapped[list] = mapped_column(JSON, default=list)
    upstream: Mapped[dict] = mapped_column(JSON, default=dict)
    egress: Mapped[list] = mapped_column(JSON, default=list)
    egress_summary: Mapped[dict] = mapped_column(JSON, default=dict)
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
    monitor_errors: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    artifacts: Mapped[str] = mapped_column(Text, default="")
    node: Mapped[dict] = mapped_column(JSON, default=dict)
    phases: Mapped[list] = mapped_column(JSON, default=list)
    started_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    finished_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)

    __table_args__ = (
        Index("ix_attempts_run_task_slot", "run_id", "task_id", "slot"),
        # a slot's attempt numbers are unique: a second controller on the same run fails loudly
        Index("ux_attempts_slot_attempt", "run_id", "task_id", "slot", "attempt_no", unique=True),
        # what a report reads of every attempt (store.REPORT_FIELDS but rules, which it reads
        # for discarded attempts only), so a report is answered from this index: an attempt row
        # is ~5 KB of evidence on overflow pages, and reading its last columns from the table
        # read all of them (0.85 s for 10^5 attempts, 0.26 s from here). PostgreSQL has no
        # btree order for json: the same columns ride along as INCLUDE there (pg_report_index).
        Index("ix_attempts_report", "run_id", "id", *REPORT_INDEX_COLS).ddl_if(dialect="sqlite"),
    )


@functools.lru_cache(maxsize=1)
def pg_report_index() -> Index:
    """PostgreSQL's report index, added to the attempts table when a PostgreSQL store is first
    opened: declared with the table, its dialect option would load SQLAlchemy's PostgreSQL
    dialect in every command that touches a store (17 ms), SQLite ones included."""
    t = AttemptRow.__table__
    return Index("ix_attempts_report_pg", t.c.run_id, t.c.id, postgresql_include=list(REPORT_INDEX_COLS)).ddl_if(dialect="postgresql")


class ClaimRow(Base):
    """An attempt that started and has no record yet. Deleted in the transaction that stores
    the record; one left behind means its controller died while it ran (``--resume`` turns
    it into a ``controller_lost`` attempt, charged to the slot)."""

    __tablename__ = "attempt_claims"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    slot: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt_no: Mapped[int] = mapped_column(Integer, primary_key=True)
    seed: Mapped[int] = mapped_column(BigInteger, default=0)
    controller: Mapped[str] = mapped_column(String(128), default="")
    started_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class LateRow(Base):
    """The record of an attempt that arrived after the executor had reported it lost (its
    node was presumed dead and the slot rerun): kept as evidence, never scored or counted."""

    __tablename__ = "late_attempts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), index=True)
    task_id: Mapped[str] = mapped_column(String(128))
    slot: Mapped[int] = mapped_column(Integer)
    attempt_no: Mapped[int] = mapped_column(Integer)
    received_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    record: Mapped[dict] = mapped_column(JSON, default=dict)


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
