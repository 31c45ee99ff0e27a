"""Suites and tasks: a named set of tasks plus the image and agent that run them.

A suite is a directory::

    suite.toml          name, image, dockerfile, agent_cmd, profile, trials, k, state_sql, ...
    tasks/*.toml        one task per file (sub-directories allowed); `id` = file stem
    *.sql               the common fixture (`state_sql`) and per-task fixture files
    Dockerfile          the image (build context = the suite directory)

A task's fixture is ``state_sql`` (in order), then its ``fixture`` file, then its inline
``fixture_sql``. Paths are relative to the suite directory and may not leave it.

Pure models. Loading a suite directory (reading every file once, hashing those bytes and
keeping the fixture scripts from the same bytes) is ``harness.engine.suites``.
"""

from __future__ import annotations

import re

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from harness.model.profile import EnvelopeOverride
from harness.model.run import MAX_TRIALS
from harness.model.units import StrictModel
from harness.model.state import (
    SLUG, Expectation, ExpectationsGraderSpec, FileExpectation, GraderSpec, PostgresStateSpec, SandboxOptions,
    BuildSpec, ServiceSpec, SqliteStateSpec, StateSpec, check_abs_path,
)

SUITE_FILE = "suite.toml"
TASKS_DIR = "tasks"


_Strict = StrictModel


# the short form of a task: these top-level keys are the state's and the grader's
_STATE_KEYS = ("fixture", "fixture_sql")
_GRADER_KEYS = ("expect", "unchanged", "allow")


class Task(_Strict):
    """One prompt + fixture state + how it is judged. Graded by the state it leaves, not the transcript.

    Short form (what most tasks write): ``fixture`` / ``fixture_sql`` are the state's (the
    suite's default kind), ``expect`` / ``unchanged`` / ``allow`` the expectations grader's.
    Long form: a ``[state]`` table (``kind`` = sqlite | files | postgres | container) and a
    ``[grader]`` table (``kind`` = expectations | verifier)."""

    id: str = Field(..., pattern=SLUG, description="Task id: a slug equal to the file stem (or the Harbor task directory).")
    title: str = Field(..., min_length=1, description="One line for reports.")
    prompt: str = Field(..., min_length=1, description="What the agent is given (written to the prompt file).")
    tags: list[str] = Field(default_factory=list, description="Free-form labels for filtering and reports.")
    envelope: EnvelopeOverride | None = Field(None, description="Overrides of the suite profile's envelope for this task.")
    state: StateSpec = Field(default_factory=SqliteStateSpec, description="What the agent changes (the state kind).")
    grader: GraderSpec = Field(default_factory=ExpectationsGraderSpec, description="How the final state is judged.")
    services: list[ServiceSpec] = Field(default_factory=list, description="Containers started fresh for every attempt (besides the suite's).")
    solution: str | None = Field(
        None, description="The reference solution `--agent oracle` runs: a script (native suites) or a directory "
        "with solve.sh (Harbor), relative to the suite; the agent never sees it.")
    sandbox: SandboxOptions = Field(default_factory=SandboxOptions, description="How this task's sandbox differs from the profile's.")
    image: str | None = Field(None, description="The task's own image (default: the suite's).")
    build: BuildSpec | None = Field(None, description="How the task's own image is built.")
    requested: dict[str, Any] = Field(
        default_factory=dict, description="What a foreign task format asked for, as written (e.g. Harbor [environment]); "
        "stored beside the envelope that was applied.")

    _source: Path | None = PrivateAttr(None)
    short_keys: ClassVar[tuple[str, ...]] = _STATE_KEYS + _GRADER_KEYS

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        lifted_state = {k: data.pop(k) for k in _STATE_KEYS if k in data}
        lifted_grader = {k: data.pop(k) for k in _GRADER_KEYS if k in data}
        default_kind = (info.context or {}).get("state_kind", "sqlite")
        if lifted_state:
            if "state" in data:
                raise ValueError(f"{', '.join(lifted_state)} belong(s) in [state] when the task has a [state] table")
            data["state"] = {"kind": default_kind, **lifted_state}
        elif "state" not in data and default_kind != "sqlite":
            data["state"] = {"kind": default_kind}
        elif isinstance(data.get("state"), dict) and "kind" not in data["state"]:
            data["state"] = {"kind": default_kind, **data["state"]}
        if lifted_grader:
            grader = data.get("grader")
            if grader is not None and (not isinstance(grader, dict) or grader.get("kind", "expectations") != "expectations"):
                raise ValueError(f"{', '.join(lifted_grader)} are the expectations grader's; this task's grader is "
                                 f"{grader.get('kind') if isinstance(grader, dict) else grader!r}")
            data["grader"] = {**(grader or {}), "kind": "expectations", **lifted_grader}
        return data

    @property
    def source(self) -> Path | None:
        """The task file this task was loaded from."""
        return self._source

    @property
    def state_kind(self) -> str:
        """What the agent changes (``harness.state``)."""
        return self.state.kind

    @property
    def grader_kind(self) -> str:
        """How the final state is judged (``harness.state``)."""
        return self.grader.kind

    # the expectations grader's parts, empty for a verifier
    @property
    def expect(self) -> list[Any]:
        return list(self.grader.expect) if isinstance(self.grader, ExpectationsGraderSpec) else []

    @property
    def unchanged(self) -> list[str]:
        return list(self.grader.unchanged) if isinstance(self.grader, ExpectationsGraderSpec) else []

    @property
    def allow(self) -> list[str]:
        return list(self.grader.allow) if isinstance(self.grader, ExpectationsGraderSpec) else []

    @property
    def fixture(self) -> str | None:
        return getattr(self.state, "fixture", None)

    @property
    def fixture_sql(self) -> str | None:
        return getattr(self.state, "fixture_sql", None)

    @model_validator(mode="after")
    def _conflicts(self) -> "Task":
        kind = self.state.kind
        if isinstance(self.grader, ExpectationsGraderSpec):
            if kind == "container":
                raise ValueError("a `container` state is judged by a verifier ([grader] kind = \"verifier\"), not expectations")
            want = FileExpectation if kind == "files" else Expectation
            for i, e in enumerate(self.grader.expect):
                if not isinstance(e, want):
                    raise ValueError(f"expect.{i}: a {kind} state takes "
                                     f"{'`path` expectations' if kind == 'files' else 'SQL `query` expectations'}")
            if kind in ("sqlite", "postgres"):
                for item in self.grader.allow:
                    if item.count(".") > 1 or not all(part for part in item.split(".")):
                        raise ValueError(f"allow: {item!r} is not 'table' or 'table.column'")
                allowed_tables = {a.split(".", 1)[0] for a in self.grader.allow}
                both = sorted(set(self.grader.unchanged) & allowed_tables)
                if both:
                    raise ValueError(f"table(s) {', '.join(both)} are both in `unchanged` and `allow`")
            else:
                for key in ("unchanged", "allow"):
                    for g in getattr(self.grader, key):
                        check_abs_path(g, f"{key} glob")
                both = sorted(set(self.grader.unchanged) & set(self.grader.allow))
                if both:
                    raise ValueError(f"{', '.join(both)} are both in `unchanged` and `allow`")
        names = [s.name for s in self.services]
        if isinstance(self.state, PostgresStateSpec):
            names.append(self.state.service)
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"service name(s) {', '.join(dup)} used twice")
        if self.build is not None and self.image is None:
            raise ValueError("a task with `build` needs the `image` tag it builds")
        return self


SECRET_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")


class NamedAgent(_Strict):
    """An agent a suite offers by name (``--agent NAME``)."""

    cmd: list[str] = Field(..., min_length=1, description="The command run inside the sandbox.")
    description: str = Field("", description="One line on what it is.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for it (over the suite's agent_env).")
    network: Literal["gateway", "allowlist", "bridge"] | None = Field(
        None, description="The network policy it needs (e.g. 'gateway' for an LLM agent): a run whose profile says "
        "'none' gets this one instead, recorded in the run's profile.")


class SuiteSpec(_Strict):
    """The contents of ``suite.toml`` (a Harbor dataset's optional ``harness.toml`` has the
    same keys; its tasks bring their own images)."""

    name: str = Field(..., pattern=SLUG, description="Suite name (the built-in ones equal their directory name).")
    description: str = Field("", description="One line on what the suite measures.")
    image: str | None = Field(None, min_length=1, description="Docker tag the trials run in, e.g. 'harness/refunds:latest' "
                              "(required unless every task has its own image).")
    dockerfile: str | None = Field(
        "Dockerfile",
        description="Dockerfile path relative to the suite directory; the build context is the suite "
        "directory and the file takes `ARG BASE=harness/sandbox:latest`.",
    )
    agent_cmd: list[str] | None = Field(None, min_length=1, description="The agent command run inside the container, e.g. ['refundbot'] "
                                        "(without one, every run names its agent: --agent oracle|nop or --agent-cmd).")
    agent_dir: str | None = Field(None, description="A directory of the suite mounted read-only at /harness/agent in every "
                                  "sandbox (an agent that is not in the task images).")
    profile: str = Field("standard", min_length=1, description="Default sandbox profile name.")
    trials: int = Field(8, ge=1, le=MAX_TRIALS, description="n: trial slots per task.")
    k: list[int] = Field(default_factory=lambda: [1], min_length=1, description="k values to report pass@k / pass^k for; each <= trials.")
    max_reruns: int = Field(3, ge=0, le=100, description="Reruns of a slot whose attempts are discarded (SLA breach) before it ends unmeasured.")
    state: Literal["sqlite", "files", "postgres", "container"] = Field(
        "sqlite", description="The state kind of tasks that do not name one ([state] kind).")
    state_sql: list[str] = Field(default_factory=list, description="SQL files (relative to the suite dir) building the common "
                                 "fixture of sqlite / postgres tasks: schema, then base rows.")
    agent_env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for the agent.")
    services: list[ServiceSpec] = Field(default_factory=list, description="Services started for every attempt of every task.")
    base_map: dict[str, str] = Field(default_factory=dict, description="Base images mapped to local ones for this suite's "
                                     "builds ('python:3.12-slim' = 'harness/python:bookworm'), over the defaults.")
    format: Literal["native", "harbor", "terminal-bench"] = Field("native", description="Where the suite came from.")
    agents: dict[str, NamedAgent] = Field(default_factory=dict, description="Agents a run picks by name with --agent NAME "
                                          "([agents.NAME] cmd = [...]), beside the built-in oracle and nop.")
    secrets: list[str] = Field(default_factory=list, description="Names of secrets every run needs (values come from the "
                               "controller's environment and stay with the model gateway), e.g. ['OPENAI_API_KEY'].")

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not SECRET_NAME.match(name):
                raise ValueError(f"secret {name!r}: a secret is named like an environment variable (A-Z, 0-9, _)")
        return list(dict.fromkeys(v))

    @field_validator("agents")
    @classmethod
    def _agent_names(cls, v: dict[str, "NamedAgent"]) -> dict[str, "NamedAgent"]:
        for name in v:
            if name in ("oracle", "nop") or not re.match(r"^[a-z0-9][a-z0-9_-]*$", name):
                raise ValueError(f"agent name {name!r}: lower-case letters, digits, '-', '_', and not a built-in (oracle, nop)")
        return v

    @field_validator("k")
    @classmethod
    def _k_within_trials(cls, v: list[int], info: ValidationInfo) -> list[int]:
        trials = info.data.get("trials")
        for k in v:
            if k < 1:
                raise ValueError(f"k = {k} must be >= 1")
            if trials is not None and k > trials:
                raise ValueError(f"k = {k} exceeds trials = {trials}; raise trials or drop k = {k}")
        if len(set(v)) != len(v):
            raise ValueError("k values must be distinct")
        return sorted(v)

    @field_validator("agent_env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not key or "=" in key or key.startswith("HARNESS_"):
                raise ValueError(f"{key!r} is not allowed (empty, contains '=', or a reserved HARNESS_ name)")
        return v

    @field_validator("base_map")
    @classmethod
    def _base_map(cls, v: dict[str, str]) -> dict[str, str]:
        for src, dst in v.items():
            if not src.strip() or not dst.strip():
                raise ValueError("base_map entries are 'FOREIGN' = 'LOCAL', both image references")
        return v


class Suite(SuiteSpec):
    """A loaded, validated suite: its spec, where it lives, its tasks (sorted by id), and what
    was read from disk when it was loaded. Nothing is read again later: a file changed on disk
    in the middle of a run cannot change the run (its hash was fixed from the same bytes)."""

    root: Path = Field(..., description="The suite directory.")
    tasks: list[Task] = Field(default_factory=list, description="Tasks, sorted by id.")
    content_hash: str = Field(..., description="sha256 over every file of the suite directory (relative path + bytes).")
    fixtures: dict[str, str] = Field(
        default_factory=dict,
        description="Task id -> the complete SQL fixture script (state_sql, fixture file, inline SQL), as read at load time.",
    )
    refused: dict[str, str] = Field(
        default_factory=dict,
        description="Task id -> why this task directory cannot be run here (Harbor / Terminal-Bench parts not supported): "
        "reported with every run of the suite, never scored.",
    )
    image_files: list[str] = Field(
        default_factory=list,
        description="Files of the suite directory that are image inputs (relative POSIX paths): everything but "
        "suite.toml, tasks/, fixtures, tests and solutions, which reach a trial at run time, never through the image.",
    )
    _data: dict[str, bytes] = PrivateAttr(default_factory=dict)
    _modes: dict[str, int] = PrivateAttr(default_factory=dict)

    def files_under(self, rel_dir: str) -> dict[str, tuple[bytes, int]]:
        """The files read at load time under a directory of the suite: path relative to that
        directory -> (bytes, permission bits). Runtime inputs (fixture trees, tests,
        solutions) come from here, never from the disk again."""
        prefix = rel_dir.strip("/") + "/" if rel_dir.strip("/") not in ("", ".") else ""
        return {rel[len(prefix):]: (data, self._modes.get(rel, 0o644)) for rel, data in self._data.items() if rel.startswith(prefix)}

    def file_bytes(self, rel: str) -> bytes | None:
        """One file read at load time (None when the suite has none by that path)."""
        return self._data.get(rel.strip("/"))

    def image_of(self, task: Task) -> str:
        """The image ``task`` runs in: its own, else the suite's."""
        img = task.image or self.image
        if img is None:
            raise KeyError(f"task {task.id} has no image and suite {self.name} names none")
        return img

    def task(self, task_id: str) -> Task:
        """The task with this id; KeyError names the ones available."""
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise KeyError(f"suite {self.name} has no task {task_id!r}; tasks: {', '.join(t.id for t in self.tasks)}")

    @property
    def dockerfile_path(self) -> Path | None:
        return self.root / self.dockerfile if self.dockerfile else None

    def fixture_sql(self, task: Task) -> str:
        """The complete SQL script that builds ``task``'s fixture, as read when the suite was loaded."""
        return self.fixtures[task.id]
