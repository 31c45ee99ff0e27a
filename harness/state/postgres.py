"""State kind ``postgres``: the agent changes a PostgreSQL database served, for every attempt,
by a fresh service container on the attempt's private network.

The service (``harness/postgres:15``, built by ``harness images build``) starts an empty
cluster in its tmpfs, seeds it from the task's complete fixture script (``state_sql``, the
``fixture`` file, ``fixture_sql``: PostgreSQL dialect, read at load time) as the role the
agent connects as, and keeps a copy its role cannot reach. The agent gets ``PGHOST``,
``PGUSER``, ``PGDATABASE`` and ``DATABASE_URL``. Grading runs in that service container
(:mod:`harness.state.postgres_grade`) with the same SQL expectations and extra-effect diff
as ``sqlite``; the final database is kept as evidence (``final.sql``, a pg_dump).

A fixture that fails to load stops the service before it is healthy: the attempt is an
infrastructure error whose reason names the SQL error (``harness suites check`` shows it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.model.profile import Profile
from harness.model.sandbox import GRADE_DIR, TRANSCRIPT_FILE
from harness.model.state import PostgresStateSpec, ServiceSpec
from harness.model.suite import Suite, SuiteSpec, Task
from harness.model.units import MiB
from harness.state import postgres_grade, sqlite_grade
from harness.state.base import AgentInputs, ExportFile, GradePlan, ServiceRun, StateKind
from harness.state.sqlite import check_fixture_file, check_sql_sources, grade_spec, sql_fixture_text

PG_UID = "10100:10100"  # the postgres user of harness/postgres (fixed in its Dockerfile)
PG_TMPFS = 512 * MiB  # the cluster's tmpfs (charged to the service's memory as it fills)
DUMP_PATH = "/pg/final.sql"
DUMP_CAP = 64 * MiB
_SOURCES = {"postgres_grade.py": Path(postgres_grade.__file__).read_bytes(), "sqlite_grade.py": Path(sqlite_grade.__file__).read_bytes()}


def _spec(task: Task) -> PostgresStateSpec:
    assert isinstance(task.state, PostgresStateSpec)
    return task.state


class PostgresState(StateKind):
    """A per-attempt PostgreSQL service; see the module docstring."""

    name = "postgres"

    def check_suite(self, files: Any, spec: SuiteSpec, src: str, problems: list[str]) -> Any:
        return check_sql_sources(files, list(spec.state_sql), src, problems)

    def check_task(self, files: Any, src: str, task: Task, ctx: Any, problems: list[str]) -> bool:
        return check_fixture_file(files, src, task, problems)

    def fixture_text(self, files: Any, spec: SuiteSpec, task: Task) -> str:
        return sql_fixture_text(files, spec, task)

    def runtime_files(self, spec: SuiteSpec, task: Task) -> list[str]:
        return [*spec.state_sql, *([task.fixture] if task.fixture else [])]

    def service(self, task: Task) -> ServiceSpec:
        s = _spec(task)
        return ServiceSpec(name=s.service, image=s.image, command=None, health=["harness-pg", "health"], health_timeout=60,
                           memory=s.memory, pids=128, user=PG_UID, tmpfs={"/pg": PG_TMPFS, "/tmp": 64 * MiB})

    def prepare(self, suite: Suite, task: Task) -> AgentInputs:
        s = _spec(task)
        url = f"postgresql://agent@{s.service}:5432/app"
        run = ServiceRun(spec=self.service(task), inputs={"fixture.sql": suite.fixture_sql(task).encode()}, tmpfs_owner=PG_UID)
        env = {"PGHOST": s.service, "PGPORT": "5432", "PGUSER": "agent", "PGDATABASE": "app", "DATABASE_URL": url, "HARNESS_STATE": url}
        return AgentInputs(env=env, services=[run])

    def exports(self, suite: Suite, task: Task, profile: Profile) -> list[ExportFile]:
        return [ExportFile(TRANSCRIPT_FILE, 16 * MiB, keep_head=True)]

    def expectations_plan(self, suite: Suite, task: Task) -> GradePlan:
        spec = {**grade_spec(task), "dump_path": DUMP_PATH, "scratch": "/pg"}
        return GradePlan(
            site="service", service=_spec(task).service, user=PG_UID,
            files={**_SOURCES, "spec.json": json.dumps(spec).encode()},
            cmd=["python3", "-I", f"{GRADE_DIR}/postgres_grade.py", f"{GRADE_DIR}/spec.json"],  # -S off: psycopg2 is in dist-packages
            evidence=[ExportFile("final.sql", DUMP_CAP, keep_head=True, path=DUMP_PATH)],
        )
