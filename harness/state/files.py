"""State kind ``files``: the agent changes directory trees at declared paths.

Each declared path (``[state] paths``, e.g. ``/work/app``) is a size-capped tmpfs the agent
owns, filled before the agent starts from a fixture directory of the suite (read once, at
load time: the tar each attempt gets is built from those bytes, so the tree the agent starts
from and the one it is graded against are the same). The final trees are graded in the
sandbox by :mod:`harness.state.files_grade` and kept as evidence (``files-N.tar``: links kept
as links, never followed, within the path's size).

At load time every expectation is tried on the fixture itself: one that fails there can only
pass if its path changes, so a path no ``allow`` glob covers (or one under ``unchanged``) is a
task that cannot pass, reported then, not after a run.
"""

from __future__ import annotations

import io
import json
import posixpath
import tarfile
import tempfile
import threading
from pathlib import Path, PurePosixPath
from typing import Any

from harness.model.profile import Profile
from harness.model.sandbox import GRADE_DIR, TRANSCRIPT_FILE
from harness.model.state import FilesStateSpec
from harness.model.suite import Suite, SuiteSpec, Task
from harness.state import files_grade
from harness.state.base import INPUT_DIR, AgentInputs, ExportFile, GradePlan, StateKind

GRADE_PROGRAM = "files_grade.py"
GRADE_SPEC = "files-spec.json"
TRANSCRIPT_CAP = 16 * 1024 * 1024
_SOURCE = Path(files_grade.__file__).read_bytes()
_TARS: dict[tuple[str, str, str], bytes] = {}
_TARS_LOCK = threading.Lock()


def fixture_tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    """A deterministic tar of a fixture tree (sorted, no owners, no times)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        dirs: set[str] = set()
        for rel, (data, mode) in sorted(files.items()):
            parts = PurePosixPath(rel).parts
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    ti = tarfile.TarInfo(d)
                    ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                    tf.addfile(ti)
                    dirs.add(d)
            ti = tarfile.TarInfo(rel)
            ti.size, ti.mode = len(data), 0o755 if mode & 0o111 else 0o644
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _spec(task: Task) -> FilesStateSpec:
    assert isinstance(task.state, FilesStateSpec)
    return task.state


def _owning_path(spec: FilesStateSpec, path: str) -> str | None:
    return next((p for p in spec.paths if path == p or path.startswith(p.rstrip("/") + "/")), None)


def _exp_json(e: Any) -> dict[str, Any]:
    return {**e.model_dump(mode="json", by_alias=True), "label": e.label}


class FilesState(StateKind):
    """Directory trees at declared paths; see the module docstring."""

    name = "files"

    def check_task(self, files: Any, src: str, task: Task, ctx: Any, problems: list[str]) -> bool:
        spec = _spec(task)
        ok = True
        for path, rel in spec.paths.items():
            if rel is not None and not files.check(rel, src, f"state.paths.{path}", problems, "directory"):
                ok = False
        for key in ("expect", "unchanged", "allow"):
            for i, item in enumerate(getattr(task, key)):
                p = item.path if key == "expect" else item
                if _owning_path(spec, p.split("*", 1)[0].split("?", 1)[0].rstrip("/") or "/") is None:
                    problems.append(f"{src}: {key}.{i}: {p!r} is not inside a state path ({', '.join(spec.paths)})")
                    ok = False
        return ok and self._check_against_fixture(files, src, task, problems)

    def _check_against_fixture(self, files: Any, src: str, task: Task, problems: list[str]) -> bool:
        """Each expectation that fails on the untouched fixture needs its path to change."""
        spec = _spec(task)
        allow = [files_grade.glob_regex(g) for g in task.allow]
        frozen = [files_grade.glob_regex(g) for g in task.unchanged]
        ok = True
        with tempfile.TemporaryDirectory(prefix="harness-files-check-") as tmp:
            roots = {}
            for i, (path, rel) in enumerate(spec.paths.items()):
                root = Path(tmp, f"p{i}")
                root.mkdir()
                roots[path] = str(root)
                for r, (data, _mode) in (files.tree(rel) if rel else {}).items():
                    fp = root.joinpath(*PurePosixPath(r).parts)
                    fp.parent.mkdir(parents=True, exist_ok=True)
                    fp.write_bytes(data)
            for i, e in enumerate(task.expect):
                owner = _owning_path(spec, e.path)
                local = roots[owner] + e.path[len(owner):]
                holds, _ = files_grade.check_expectation({**_exp_json(e), "path": local})
                if holds:
                    continue
                if files_grade.covered(e.path, frozen):
                    problems.append(f"{src}: expect.{i}: {e.label} does not hold on the fixture, and {e.path} is under `unchanged`: "
                                    "the task cannot pass")
                    ok = False
                elif not files_grade.covered(e.path, allow):
                    problems.append(f"{src}: expect.{i}: {e.label} does not hold on the fixture, so {e.path} must change, "
                                    "but no `allow` glob covers it: the task cannot pass")
                    ok = False
        return ok

    def runtime_files(self, spec: SuiteSpec, task: Task) -> list[str]:
        return [rel for rel in _spec(task).paths.values() if rel]

    def tars(self, suite: Suite, task: Task) -> list[bytes | None]:
        """One fixture tar per declared path (None: starts empty), built once per suite content."""
        out: list[bytes | None] = []
        for path, rel in _spec(task).paths.items():
            if rel is None:
                out.append(None)
                continue
            key = (suite.content_hash, task.id, path)
            with _TARS_LOCK:
                if key not in _TARS:
                    _TARS[key] = fixture_tar(suite.files_under(rel))
                out.append(_TARS[key])
        return out

    def prepare(self, suite: Suite, task: Task) -> AgentInputs:
        spec = _spec(task)
        inputs, setup = {}, []
        for i, ((path, _rel), tar) in enumerate(zip(spec.paths.items(), self.tars(suite, task))):
            if tar is None:
                continue
            inputs[f"files-{i}.tar"] = tar
            setup.append(["tar", "-x", "--no-same-owner", "-f", f"{INPUT_DIR}/files-{i}.tar", "-C", path])
        paths = list(spec.paths)
        return AgentInputs(files=inputs, setup=setup, tmpfs={p: spec.size for p in paths},
                           env={"HARNESS_STATE": paths[0], "HARNESS_STATE_PATHS": ":".join(paths)})

    def exports(self, suite: Suite, task: Task, profile: Profile) -> list[ExportFile]:
        spec = _spec(task)
        trees = [ExportFile(f"files-{i}", spec.size, path=p, tree=True) for i, p in enumerate(spec.paths)]
        return trees + [ExportFile(TRANSCRIPT_FILE, TRANSCRIPT_CAP, keep_head=True)]

    def carry(self, suite: Suite, task: Task) -> list[tuple[ExportFile, str]]:
        spec = _spec(task)
        return [(ExportFile(f"files-{i}", spec.size, path=p, tree=True), posixpath.dirname(p) or "/") for i, p in enumerate(spec.paths)]

    def expectations_plan(self, suite: Suite, task: Task) -> GradePlan:
        spec = _spec(task)
        paths = {p: (f"{INPUT_DIR}/files-{i}.tar" if rel else None) for i, (p, rel) in enumerate(spec.paths.items())}
        grade_spec = {"task_id": task.id, "paths": paths, "expect": [_exp_json(e) for e in task.expect],
                      "unchanged": list(task.unchanged), "allow": list(task.allow), "max_files": spec.max_files}
        return GradePlan(
            files={GRADE_PROGRAM: _SOURCE, GRADE_SPEC: json.dumps(grade_spec).encode()},
            cmd=["python3", "-I", "-S", f"{GRADE_DIR}/{GRADE_PROGRAM}", f"{GRADE_DIR}/{GRADE_SPEC}"],
        )

