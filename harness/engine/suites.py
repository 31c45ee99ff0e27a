"""Loading a suite directory into a :class:`~harness.model.suite.Suite`.

Every file of the directory is read once, here: the content hash is taken over those bytes,
and each task's fixture script is kept from the same bytes, so a file edited on disk in the
middle of a run changes nothing about the run. Every problem is reported at once, one line
each, naming the file and the key (``tasks/a.toml: expect.0.rows: ...``); the state kind of
the tasks checks its own part (for SQLite: every fixture is built in memory, every
expectation query is run against it), so a broken fixture fails at load, not mid-run.

``load_suite("refunds")`` resolves a built-in suite shipped in ``harness/suites/``; anything
else is a path to a suite directory.
"""

from __future__ import annotations

import hashlib
import tomllib
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ValidationError

from harness.model.errors import SuiteError
from harness.model.suite import SUITE_FILE, TASKS_DIR, Suite, SuiteSpec, Task
from harness.model.units import format_validation_error
from harness.state import state_kind

# Never part of the content hash: caches that differ between machines and do not change the suite.
_HASH_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".git"}
_HASH_SKIP_SUFFIXES = (".pyc", ".pyo", ".swp")
_HASH_SKIP_NAMES = {".DS_Store"}


class SuiteFiles:
    """The files of a suite directory, read once: relative POSIX path -> bytes."""

    def __init__(self, root: Path):
        self.root = root
        self.data: dict[str, bytes] = {}
        for f in root.rglob("*"):
            rel = f.relative_to(root)
            if any(part in _HASH_SKIP_DIRS for part in rel.parts):
                continue
            if f.is_file() and f.name not in _HASH_SKIP_NAMES and not f.name.endswith(_HASH_SKIP_SUFFIXES):
                self.data[rel.as_posix()] = f.read_bytes()
        self.data = dict(sorted(self.data.items()))

    def content_hash(self) -> str:
        """sha256 over the files (relative POSIX path + bytes), independent of mtimes,
        permissions and absolute location, so the same suite hashes the same on every machine."""
        h = hashlib.sha256(b"harness-suite-v1\0")
        for rel, data in self.data.items():
            h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + hashlib.sha256(data).digest())
        return h.hexdigest()

    def key(self, rel: str) -> str:
        return PurePosixPath(rel).as_posix().removeprefix("./")

    def inside(self, rel: str) -> bool:
        """``rel`` stays inside the suite directory (symlinks resolved)."""
        try:
            (self.root / rel).resolve().relative_to(self.root.resolve())
            return True
        except ValueError:
            return False

    def has(self, rel: str) -> bool:
        return self.key(rel) in self.data

    def text(self, rel: str) -> str:
        return self.data[self.key(rel)].decode("utf-8", errors="replace")

    def display(self, rel: str) -> str:
        return display(self.root / rel)


def display(path: Path) -> str:
    """A path as errors show it: relative to the working directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _format_error(src: str, err: ValidationError, model: type[BaseModel]) -> str:
    return format_validation_error(src, err, model)


def _read_toml(files: SuiteFiles, rel: str, problems: list[str]) -> dict[str, Any] | None:
    try:
        return tomllib.loads(files.data[rel].decode("utf-8"))
    except tomllib.TOMLDecodeError as e:
        problems.append(f"{files.display(rel)}: not valid TOML: {e}")
    except UnicodeDecodeError as e:
        problems.append(f"{files.display(rel)}: cannot read: {e}")
    return None


def builtin_suites_dir() -> Path:
    return Path(str(resources.files("harness") / "suites"))


def builtin_suites() -> list[str]:
    """Names of the suites shipped in ``harness/suites/``."""
    d = builtin_suites_dir()
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if (p / SUITE_FILE).is_file())


def resolve_suite_dir(name_or_path: str | Path) -> Path:
    """A built-in suite name (``refunds``) or a path to a suite directory -> the directory."""
    s = str(name_or_path)
    if "/" not in s and s in builtin_suites():
        return builtin_suites_dir() / s
    p = Path(s)
    if p.is_dir():
        return p
    if p.is_file() and p.name == SUITE_FILE:
        return p.parent
    raise SuiteError(
        f"unknown suite {s!r}: not a built-in suite ({', '.join(builtin_suites()) or 'none'}) "
        f"and not a directory with a {SUITE_FILE}"
    )


def load_suite(name_or_path: str | Path) -> Suite:
    """Load and validate a suite. Raises :class:`SuiteError` listing every problem found."""
    root = resolve_suite_dir(name_or_path)
    if not (root / SUITE_FILE).is_file():
        raise SuiteError(f"{display(root / SUITE_FILE)}: missing; a suite directory needs a {SUITE_FILE}")
    files = SuiteFiles(root)
    problems: list[str] = []
    spec: SuiteSpec | None = None
    data = _read_toml(files, SUITE_FILE, problems)
    if data is not None:
        try:
            spec = SuiteSpec.model_validate(data)
        except ValidationError as e:
            problems.append(_format_error(files.display(SUITE_FILE), e, SuiteSpec))
    kind = state_kind("sqlite")
    base: Any = None
    if spec is not None:
        _check_dockerfile(files, spec.dockerfile, problems)
        base = kind.check_suite(files, spec.state_sql, files.display(SUITE_FILE), problems)
    elif data is not None:
        # suite.toml has other problems; still check its files when those keys are well-formed,
        # so one load reports as much as possible.
        sql, df = data.get("state_sql"), data.get("dockerfile", "Dockerfile")
        if isinstance(sql, list) and sql and all(isinstance(x, str) for x in sql) and isinstance(df, str):
            _check_dockerfile(files, df, problems)
            base = kind.check_suite(files, sql, files.display(SUITE_FILE), problems)
    try:
        tasks = _load_tasks(files, kind, base, problems)
    finally:
        kind.close_suite(base)
    if problems or spec is None:
        raise SuiteError("\n".join(problems))
    runtime = {SUITE_FILE, *spec.state_sql, *(t.fixture for t in tasks if t.fixture)}
    image_files = [rel for rel in files.data if rel not in runtime and not rel.startswith(f"{TASKS_DIR}/")]
    return Suite(
        **spec.model_dump(),
        root=root,
        tasks=tasks,
        content_hash=files.content_hash(),
        fixtures={t.id: kind.fixture_text(files, spec.state_sql, t) for t in tasks},
        image_files=image_files,
    )


def _check_dockerfile(files: SuiteFiles, dockerfile: str, problems: list[str]) -> None:
    src = files.display(SUITE_FILE)
    if not files.inside(dockerfile):
        problems.append(f"{src}: dockerfile: {dockerfile!r} is outside the suite directory (the build context)")
    elif not files.has(dockerfile):
        problems.append(f"{src}: dockerfile: no such file {files.display(dockerfile)}")


def _load_tasks(files: SuiteFiles, kind: Any, base: Any, problems: list[str]) -> list[Task]:
    rels = [rel for rel in files.data if rel.startswith(f"{TASKS_DIR}/") and rel.endswith(".toml")]
    if not rels:
        problems.append(f"{files.display(TASKS_DIR)}: no task files (tasks/*.toml)")
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for rel in rels:
        src = files.display(rel)
        data = _read_toml(files, rel, problems)
        if data is None:
            continue
        try:
            task = Task.model_validate(data)
        except ValidationError as e:
            problems.append(_format_error(src, e, Task))
            continue
        task._source = files.root / rel
        stem = PurePosixPath(rel).stem
        if task.id != stem:
            problems.append(f"{src}: id: {task.id!r} must equal the file stem {stem!r}")
            continue
        if task.id in seen:
            problems.append(f"{src}: id: duplicate task id {task.id!r} (also in {files.display(seen[task.id])})")
            continue
        seen[task.id] = rel
        if kind.check_task(files, src, task, base, problems):
            tasks.append(task)
    return sorted(tasks, key=lambda t: t.id)
