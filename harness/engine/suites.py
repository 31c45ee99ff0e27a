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
from harness.model.units import did_you_mean, format_validation_error
from harness.state import grader as grader_named
from harness.state import state_kind

# Never part of the content hash: caches that differ between machines and do not change the suite.
_HASH_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache", ".git"}
_HASH_SKIP_SUFFIXES = (".pyc", ".pyo", ".swp")
_HASH_SKIP_NAMES = {".DS_Store"}


class SuiteFiles:
    """The files of a suite directory, read once: relative POSIX path -> bytes (and permission bits)."""

    def __init__(self, root: Path):
        self.root = root
        self.data: dict[str, bytes] = {}
        self.modes: dict[str, int] = {}
        self.outward: list[str] = []  # links that lead out of the suite directory: never read
        real_root = root.resolve()
        for f in root.rglob("*"):
            rel = f.relative_to(root)
            if any(part in _HASH_SKIP_DIRS for part in rel.parts):
                continue
            try:
                inside = f.resolve().is_relative_to(real_root)
            except (OSError, RuntimeError):
                inside = False
            if not inside:  # a link (or a file under a linked directory) pointing at the host
                self.outward.append(rel.as_posix())
                continue
            if f.is_file() and f.name not in _HASH_SKIP_NAMES and not f.name.endswith(_HASH_SKIP_SUFFIXES):
                self.data[rel.as_posix()] = f.read_bytes()
                self.modes[rel.as_posix()] = f.stat().st_mode & 0o777
        self.data = dict(sorted(self.data.items()))

    def content_hash(self) -> str:
        """sha256 over the files (relative POSIX path + bytes, and whether it is executable),
        independent of mtimes, other permissions and absolute location, so the same suite
        hashes the same on every machine."""
        h = hashlib.sha256(b"harness-suite-v1\0")
        for rel, data in self.data.items():
            h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + hashlib.sha256(data).digest())
            if self.modes.get(rel, 0) & 0o111:
                h.update(b"\0x")
        return h.hexdigest()

    def has_dir(self, rel: str) -> bool:
        """A directory of the suite holding at least one file."""
        prefix = self.key(rel).rstrip("/") + "/"
        return any(k.startswith(prefix) for k in self.data) if prefix != "./" and prefix != "/" else bool(self.data)

    def tree(self, rel: str) -> dict[str, tuple[bytes, int]]:
        """The files under a directory: path inside it -> (bytes, permission bits)."""
        prefix = self.key(rel).rstrip("/") + "/"
        return {k[len(prefix):]: (v, self.modes.get(k, 0o644)) for k, v in self.data.items() if k.startswith(prefix)}

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

    def check(self, rel: str, src: str, key: str, problems: list[str], what: str = "file", outside: str = "") -> bool:
        """``rel`` (named by ``key`` in ``src``) is inside the suite and is a ``what``: file,
        directory, or either; else one line in ``problems``."""
        if not self.inside(rel):
            problems.append(f"{src}: {key}: {rel!r} is outside the suite directory{outside}")
            return False
        found = {"file": self.has, "directory": self.has_dir}.get(what) or (lambda r: self.has(r) or self.has_dir(r))
        if not found(rel):
            empty = " (or it holds no files)" if what != "file" else ""
            problems.append(f"{src}: {key}: no such {what} {self.display(rel)}{empty}")
            return False
        return True

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
    """Names of the suites shipped in ``harness/suites/`` (native, or Harbor datasets with a harness.toml)."""
    d = builtin_suites_dir()
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if (p / SUITE_FILE).is_file() or (p / "harness.toml").is_file())


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
        f"unknown suite {s!r}{did_you_mean(s, builtin_suites()) if '/' not in s else ''}: not a built-in suite "
        f"({', '.join(builtin_suites()) or 'none'}) "
        f"and not a directory (a {SUITE_FILE}, or Harbor / Terminal-Bench task.toml / task.yaml task directories)"
    )


def load_suite(name_or_path: str | Path) -> Suite:
    """Load and validate a suite: a native suite (``suite.toml``), or a Harbor / Terminal-Bench
    task directory or a directory of them. Raises :class:`SuiteError` listing every problem."""
    root = resolve_suite_dir(name_or_path)
    if not (root / SUITE_FILE).is_file():
        from harness.engine.harbor import is_foreign, load_foreign

        if is_foreign(root):
            return load_foreign(root)
        raise SuiteError(f"{display(root / SUITE_FILE)}: missing; a suite directory needs a {SUITE_FILE} "
                         "(or, for Harbor / Terminal-Bench, task.toml / task.yaml task directories)")
    files = SuiteFiles(root)
    problems: list[str] = []
    spec: SuiteSpec | None = None
    data = _read_toml(files, SUITE_FILE, problems)
    if data is not None:
        try:
            spec = SuiteSpec.model_validate(data)
        except ValidationError as e:
            problems.append(_format_error(files.display(SUITE_FILE), e, SuiteSpec))
    if spec is not None:
        _check_suite_files(files, spec, problems)
    if spec is None:
        # suite.toml has other problems; still check the tasks against what is well-formed in
        # it, so one load reports as much as possible
        _load_tasks(files, _partial_spec(files, data, problems), problems)
        raise SuiteError("\n".join(problems))
    tasks = _load_tasks(files, spec, problems)
    if problems:
        raise SuiteError("\n".join(problems))
    return build_suite(files, spec, tasks)


def build_suite(files: SuiteFiles, spec: SuiteSpec, tasks: list[Task]) -> Suite:
    """The loaded suite from its checked spec and tasks, with what each task gets at run time."""
    runtime = {SUITE_FILE, "harness.toml"}
    fixtures = {}
    for t in tasks:
        kind, grader = state_kind(t.state_kind), grader_named(t.grader_kind)
        runtime.update(kind.runtime_files(spec, t))
        runtime.update(grader.runtime_files(spec, t))
        if t.solution:
            runtime.add(t.solution)
        text = kind.fixture_text(files, spec, t)
        if text is not None:
            fixtures[t.id] = text
    if spec.agent_dir:
        runtime.add(spec.agent_dir)
    dirs = tuple(r.rstrip("/") + "/" for r in runtime)
    image_files = [rel for rel in files.data if rel not in runtime and not rel.startswith(f"{TASKS_DIR}/") and not rel.startswith(dirs)]
    suite = Suite(**spec.model_dump(), root=files.root, tasks=tasks, content_hash=files.content_hash(), fixtures=fixtures,
                  image_files=image_files)
    suite._data = files.data
    suite._modes = files.modes
    return suite


def _partial_spec(files: SuiteFiles, data: dict[str, Any] | None, problems: list[str]) -> SuiteSpec | None:
    """The well-formed parts of a suite.toml that has problems (for checking its tasks)."""
    if data is None:
        return None
    sql, df = data.get("state_sql", []), data.get("dockerfile", "Dockerfile")
    if not (isinstance(sql, list) and all(isinstance(x, str) for x in sql) and isinstance(df, str)):
        return None
    image = data.get("image") if isinstance(data.get("image"), str) else "?"
    state = data.get("state") if data.get("state") in ("sqlite", "files", "postgres", "container") else "sqlite"
    spec = SuiteSpec.model_construct(name="?", image=image, dockerfile=df, state_sql=sql, state=state, agent_dir=None,
                                     services=[], base_map={}, format="native", agent_cmd=None)
    _check_dockerfile(files, df, problems)
    return spec


def _check_suite_files(files: SuiteFiles, spec: SuiteSpec, problems: list[str]) -> None:
    src = files.display(SUITE_FILE)
    if spec.dockerfile and spec.image:
        _check_dockerfile(files, spec.dockerfile, problems)
    if spec.agent_dir:
        files.check(spec.agent_dir, src, "agent_dir", problems, "directory")


def _check_dockerfile(files: SuiteFiles, dockerfile: str, problems: list[str]) -> None:
    files.check(dockerfile, files.display(SUITE_FILE), "dockerfile", problems, outside=" (the build context)")


def _load_tasks(files: SuiteFiles, spec: SuiteSpec | None, problems: list[str]) -> list[Task]:
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
            task = Task.model_validate(data, context={"state_kind": spec.state if spec else "sqlite"})
        except ValidationError as e:
            problems.append(format_validation_error(src, e, Task, short=set(data)))
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
        tasks.append(task)
    if spec is None:
        return tasks
    ok = check_tasks(files, spec, tasks, problems, lambda t: files.display(seen[t.id]))
    return sorted(ok, key=lambda t: t.id)


def check_tasks(files: SuiteFiles, spec: SuiteSpec, tasks: list[Task], problems: list[str], source: Any) -> list[Task]:
    """Each task checked by its state kind (fixtures built, expectations tried), its grader and
    for its image and solution; returns the tasks that passed."""
    kinds: dict[str, Any] = {}
    ctxs: dict[str, Any] = {}
    ok: list[Task] = []
    try:
        for task in tasks:
            src = source(task)
            name = task.state_kind
            if name not in kinds:
                kinds[name] = state_kind(name)
                ctxs[name] = kinds[name].check_suite(files, spec, files.display(SUITE_FILE), problems)
            good = kinds[name].check_task(files, src, task, ctxs[name], problems)
            good &= grader_named(task.grader_kind).check_task(files, src, task, problems)
            if task.image is None and spec.image is None:
                problems.append(f"{src}: image: the task names no image and {SUITE_FILE} has none")
                good = False
            if task.grader_kind == "expectations" and not task.expect and not task.unchanged:
                problems.append(f"{src}: no expectations: add [[expect]] entries (what the final state must hold), or list in "
                                "`unchanged` what must stay as the fixture left it (a task whose answer is to change nothing); "
                                "with neither, an agent that does nothing passes")
                good = False
            if task.solution is not None and not files.check(task.solution, src, "solution", problems, "file or directory"):
                good = False
            if good:
                ok.append(task)
    finally:
        for name, kind in kinds.items():
            kind.close_suite(ctxs[name])
    return ok
