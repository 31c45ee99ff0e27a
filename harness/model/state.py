"""What a task declares about its state and how it is judged, as discriminated unions.

* **state kind** (``kind``): ``sqlite`` (one SQLite file), ``files`` (directory trees at
  declared paths), ``postgres`` (a per-attempt PostgreSQL service), ``container`` (the
  sandbox's own writable filesystem, as a Harbor task has it).
* **grader** (``kind``): ``expectations`` (must / unchanged / allow over the state; any other
  change is an extra effect) or ``verifier`` (a command run after the agent, Harbor's
  ``tests/test.sh``, writing a reward).
* **services**: containers started fresh for every attempt on a private network.

Pure models; how each kind is prepared, exported and graded is ``harness.state``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from harness.model.units import MiB, ByteSize, StrictModel

SLUG = r"^[a-z0-9][a-z0-9_.-]*$"
SERVICE_NAME = r"^[a-z][a-z0-9-]{0,62}$"  # a DNS label: what the agent connects to
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


_Strict = StrictModel


def check_env(v: dict[str, str]) -> dict[str, str]:
    """Environment variable names a task may set (HARNESS_* is the harness's own)."""
    for key in v:
        if not ENV_NAME.match(key) or key.startswith("HARNESS_"):
            raise ValueError(f"{key!r} is not allowed as an environment variable (a name like FOO_BAR, not HARNESS_*)")
    return v


def check_abs_path(p: str, what: str = "path") -> str:
    if not p.startswith("/") or "\0" in p or any(part == ".." for part in p.split("/")):
        raise ValueError(f"{what} {p!r} must be an absolute path without '..'")
    return p.rstrip("/") or "/"


# --------------------------------------------------------------------------- expectations


class Expectation(_Strict):
    """Something that MUST be true of a SQL final state (sqlite, postgres): a query and its result."""

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


class FileExpectation(_Strict):
    """Something that MUST be true of a file of a ``files`` final state. Exactly one test:
    ``exists``, ``equals`` (whole content), ``contains``, ``matches`` (a regular expression,
    searched), or a ``json`` / ``toml`` key path with ``equals`` (the value there) or
    ``exists`` (whether the key is there)."""

    name: str | None = Field(None, description="Label for the grade's reason (default: the path and the test).")
    path: str = Field(..., description="Absolute path in the sandbox, inside one of the state's declared paths.")
    exists: bool | None = Field(None, description="The path exists (true) or is absent (false); with json/toml: the key.")
    equals: Any = Field(None, description="The file's whole content (a string), or with json/toml the value at the key path.")
    contains: str | list[str] | None = Field(None, description="Text (or every text of a list) the file contains.")
    matches: str | None = Field(None, description="A Python regular expression found in the file (re.search, MULTILINE).")
    json_key: str | None = Field(None, alias="json", description="A key path into the file parsed as JSON: 'server.port', 'items[0].name'.")
    toml_key: str | None = Field(None, alias="toml", description="A key path into the file parsed as TOML.")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return check_abs_path(v)

    @field_validator("matches")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"not a valid regular expression: {e}") from None
        return v

    @model_validator(mode="after")
    def _one_test(self) -> "FileExpectation":
        if self.json_key is not None and self.toml_key is not None:
            raise ValueError("give at most one of `json` or `toml`")
        keyed = self.json_key is not None or self.toml_key is not None
        tests = [k for k in ("exists", "equals", "contains", "matches") if getattr(self, k) is not None]
        if len(tests) != 1:
            raise ValueError("give exactly one of `exists`, `equals`, `contains` or `matches`" if not tests else
                             f"give exactly one test, not {' and '.join(tests)}")
        if keyed and tests[0] not in ("equals", "exists"):
            raise ValueError("with `json` / `toml` the test is `equals` (the value) or `exists` (the key)")
        if not keyed and tests[0] == "equals" and not isinstance(self.equals, str):
            raise ValueError("`equals` on a whole file takes a string; for a value inside JSON or TOML give `json` or `toml`")
        return self

    @property
    def key_path(self) -> str | None:
        return self.json_key if self.json_key is not None else self.toml_key

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        where = self.path + (f" {self.key_path}" if self.key_path else "")
        test = next(k for k in ("exists", "equals", "contains", "matches") if getattr(self, k) is not None)
        return f"{where} {test}"


def _expectation_kind(v: Any) -> str:
    if isinstance(v, dict):
        return "file" if "path" in v else "sql"
    return "file" if isinstance(v, FileExpectation) else "sql"


AnyExpectation = Annotated[
    Union[Annotated[Expectation, Tag("sql")], Annotated[FileExpectation, Tag("file")]],
    Discriminator(_expectation_kind),
]


# --------------------------------------------------------------------------- state kinds


class SqliteStateSpec(_Strict):
    """One SQLite database, ``/work/state.db``, built from the suite's ``state_sql``, then the
    task's ``fixture`` file, then its inline ``fixture_sql``."""

    kind: Literal["sqlite"] = "sqlite"
    fixture: str | None = Field(None, description="Path of a .sql file, relative to the suite directory, applied after state_sql.")
    fixture_sql: str | None = Field(None, description="Inline SQL applied after state_sql (and after `fixture`).")


class FilesStateSpec(_Strict):
    """Directory trees at declared paths: each path is a size-capped tmpfs the agent owns,
    filled from a fixture directory of the suite before the agent starts."""

    kind: Literal["files"] = "files"
    paths: dict[str, str | None] = Field(
        ..., min_length=1,
        description="Sandbox path -> fixture directory (relative to the suite; empty string = start empty). "
        "Short form: `path` and `fixture`.")
    size: ByteSize = Field(64 * MiB, description="Size of each path's tmpfs (what the agent may write there).")
    max_files: int = Field(10_000, ge=1, le=1_000_000, description="Entries the grader reads per path before the state is ungradable.")

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any) -> Any:
        if isinstance(data, dict) and "path" in data:
            data = dict(data)
            if "paths" in data:
                raise ValueError("give `paths` or `path` (with `fixture`), not both")
            data["paths"] = {data.pop("path"): data.pop("fixture", None)}
        elif isinstance(data, dict) and "fixture" in data:
            raise ValueError("`fixture` goes with `path` (or use `paths = { \"/work/app\" = \"fixtures/app\" }`)")
        return data

    @field_validator("paths")
    @classmethod
    def _paths(cls, v: dict[str, str | None]) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for p, fx in v.items():
            p = check_abs_path(p, "state path")
            if p in ("/", "/proc", "/sys", "/dev", "/harness", "/tmp") or p.startswith(("/proc/", "/sys/", "/dev/", "/harness/")):
                raise ValueError(f"state path {p!r} is reserved")
            out[p] = fx or None
        keys = sorted(out)
        for a, b in zip(keys, keys[1:]):
            if b.startswith(a + "/"):
                raise ValueError(f"state paths {a!r} and {b!r} overlap")
        return out


class PostgresStateSpec(_Strict):
    """A PostgreSQL database served by a fresh service container per attempt (host ``service``),
    seeded from the suite's ``state_sql`` then the task's ``fixture`` / ``fixture_sql``; graded in
    that container with the same SQL expectations and extra-effect diff as ``sqlite``."""

    kind: Literal["postgres"] = "postgres"
    fixture: str | None = Field(None, description="Path of a .sql file (PostgreSQL dialect), relative to the suite directory.")
    fixture_sql: str | None = Field(None, description="Inline SQL applied after state_sql (and after `fixture`).")
    service: str = Field("db", pattern=SERVICE_NAME, description="Host name the agent connects to.")
    image: str = Field("harness/postgres:15", min_length=1, description="Image of the database service (built by `harness images build`).")
    memory: ByteSize = Field(256 * MiB, description="Memory ceiling of the database service.")


class ContainerStateSpec(_Strict):
    """The sandbox's own filesystem (a Harbor task): the root is writable, the agent changes
    what it likes, and a verifier judges it where it is (or, in ``separate`` mode, the
    declared ``artifacts`` copied into a fresh container)."""

    kind: Literal["container"] = "container"
    artifacts: list[str] = Field(default_factory=list, description="Paths kept as evidence (and copied to a separate verifier).")

    @field_validator("artifacts")
    @classmethod
    def _abs(cls, v: list[str]) -> list[str]:
        return [check_abs_path(p, "artifact") for p in v]


StateSpec = Annotated[
    Union[SqliteStateSpec, FilesStateSpec, PostgresStateSpec, ContainerStateSpec],
    Field(discriminator="kind"),
]
STATE_KINDS = ("sqlite", "files", "postgres", "container")


# --------------------------------------------------------------------------- graders


class ExpectationsGraderSpec(_Strict):
    """must / unchanged / allow over the final state: every ``expect`` holds, every ``unchanged``
    item equals the fixture, and nothing changed that ``allow`` does not cover (an extra
    effect fails the task). SQL kinds name tables ('table', 'table.column'); ``files`` names
    paths and globs ('/work/app/*.json', '/work/app/data/**')."""

    kind: Literal["expectations"] = "expectations"
    expect: list[AnyExpectation] = Field(default_factory=list, description="What must be true after the run.")
    unchanged: list[str] = Field(default_factory=list, description="Tables (SQL) or path globs (files) that must equal the fixture.")
    allow: list[str] = Field(
        default_factory=list,
        description="What the agent may change: 'table' or 'table.column' (SQL), path globs (files). "
        "Any other difference from the fixture is an extra effect and fails the task.",
    )


class VerifierGraderSpec(_Strict):
    """A command run after the agent has gone (Harbor's ``tests/test.sh``): the tests are
    copied in only then, the command runs under the grade envelope and timeout, and the
    reward it writes (``/logs/verifier/reward.txt``: a float, or ``reward.json``: a flat JSON
    object) decides: pass = reward >= ``threshold``."""

    kind: Literal["verifier"] = "verifier"
    tests: str | None = Field(None, description="Directory of the suite copied to /tests after the agent has finished.")
    extra: dict[str, str] = Field(default_factory=dict, description="More files for /tests: name there -> file of the suite "
                                  "(Terminal-Bench's run-tests.sh beside its tests/).")
    command: list[str] = Field(default_factory=lambda: ["bash", "/tests/test.sh"], min_length=1,
                               description="The verifier command (run from the task's working directory).")
    mode: Literal["shared", "separate"] = Field(
        "shared", description="shared: in the agent's own container (Harbor's default); separate: in a fresh "
        "container from the task image with only the exported state copied in.")
    threshold: float = Field(1.0, description="Pass when the reward is at least this.")
    reward: Literal["file", "exit"] = Field(
        "file", description="file: read the reward file the command writes; exit: reward 1 when it exits 0 "
        "(Terminal-Bench's run-tests.sh), else 0.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment of the verifier command.")
    user: str | None = Field(None, description="User the verifier runs as (default: the agent's).")
    image: str | None = Field(None, description="Image of a separate verifier (default: the task's own).")
    build: "BuildSpec | None" = Field(None, description="How a separate verifier's image is built (Harbor: tests/Dockerfile).")

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v)


GraderSpec = Annotated[Union[ExpectationsGraderSpec, VerifierGraderSpec], Field(discriminator="kind")]


# --------------------------------------------------------------------------- services and sandbox


class ServiceSpec(_Strict):
    """A container started fresh for every attempt on the attempt's private network (no
    egress), reachable by ``name`` from the agent, pinned to the attempt's own cores (its CPU
    is reported per service and never counted as foreign), removed with the attempt."""

    name: str = Field(..., pattern=SERVICE_NAME, description="Host name of the service on the attempt's network.")
    image: str = Field(..., min_length=1, description="Image (local; build it FROM a harness base).")
    command: list[str] | None = Field(None, description="Command (default: the image's).")
    env: dict[str, str] = Field(default_factory=dict, description="Environment of the service.")
    health: list[str] | None = Field(None, description="A command run in the service until it exits 0 (healthy).")
    health_timeout: float = Field(30.0, gt=0, le=600, description="Seconds to become healthy; then the attempt is an infra_error.")
    memory: ByteSize = Field(256 * MiB, description="Memory ceiling of the service.")
    cpus: float | None = Field(None, gt=0, le=256, description="CFS quota in cores (default: the attempt's).")
    pids: int = Field(256, ge=8, le=100_000, description="pids limit of the service.")
    user: str | None = Field(None, description="User the service runs as (default: the image's).")
    tmpfs: dict[str, ByteSize] = Field(default_factory=lambda: {"/tmp": 64 * MiB}, description="Writable tmpfs paths (the root is read-only).")
    writable_root: bool = Field(False, description="Give the service a writable root filesystem (only if it cannot run otherwise).")

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v)


class SandboxOptions(_Strict):
    """How a task's sandbox differs from the profile's (Harbor tasks: a writable root, the
    task's own user, working directory and environment)."""

    user: str | None = Field(None, description="User the agent runs as: a name or uid[:gid] of the image ('root' for Harbor's default).")
    workdir: str | None = Field(None, description="Working directory of the agent and the verifier.")
    writable_root: bool = Field(False, description="The root filesystem is writable (its size is the profile's `storage`).")
    env: dict[str, str] = Field(default_factory=dict, description="Environment of the agent.")
    logs: bool = Field(False, description="Create /logs/agent, /logs/verifier and /logs/artifacts (Harbor) for the agent's user.")

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v)


class BuildSpec(_Strict):
    """A task's own image: a Dockerfile and its context inside the suite, built per task with
    foreign bases mapped to local ones (``harness.sandbox.basemap``)."""

    context: str = Field(..., description="Build context directory, relative to the suite.")
    dockerfile: str = Field("Dockerfile", description="Dockerfile, relative to the context.")
    image: str | None = Field(None, description="A prebuilt image instead of a Dockerfile (Harbor `docker_image`).")
    timeout: float = Field(600.0, gt=0, description="Seconds the build may take.")


VerifierGraderSpec.model_rebuild()
