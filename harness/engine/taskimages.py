"""Per-task images of suites whose tasks bring their own (Harbor, Terminal-Bench): built
offline (``harness.sandbox.images.build_image``: foreign bases mapped, the host's CA passed
in, BuildKit-only syntax rewritten), cached by their inputs, one line per task that cannot be
built (the log's tail, the whole log under HARNESS_HOME/builds)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.model.errors import HarnessError, NotBuildableHere
from harness.model.state import BuildSpec, VerifierGraderSpec
from harness.model.suite import Suite, Task
from harness.sandbox.basemap import BaseMap
from harness.sandbox.dockerfile import DockerfileError
from harness.sandbox.images import (
    SUITE_LABEL,
    build_image,
    ensure_local_base,
    image_id,
    image_identity,
)
from harness.sandbox.prewarm import REQUIREMENTS_FILE, verifier_requirements
from harness.sandbox.prewarm import epilogue as prewarm_epilogue
from harness.state.verifier import tb_helpers
from harness.store.store import harness_home

TASK_LABEL = "dev.harness.task"


@dataclass
class TaskImages:
    """What the builds gave: task id -> (image, digest), foreign base -> local image, and the
    tasks that could not be built (task id -> one line)."""

    images: dict[str, tuple[str, str]] = field(default_factory=dict)
    verifiers: dict[str, str] = field(default_factory=dict)  # task id -> a separate verifier's image
    substitutions: dict[str, str] = field(default_factory=dict)
    bases: dict[str, list[str]] = field(default_factory=dict)  # task id -> the references of substitutions its images used
    failures: dict[str, str] = field(default_factory=dict)
    not_buildable: set[str] = field(default_factory=set)  # of failures: the Dockerfile's or the base map's to fix (exit 2)
    built: list[tuple[str, float]] = field(default_factory=list)  # (tag, seconds) actually built


def _verifier_scripts(suite: Suite, task: Task) -> Callable[[str], str | None]:
    """/tests/NAME -> the text of that suite file (the verifier's own files, read at load)."""
    g = task.grader
    if not isinstance(g, VerifierGraderSpec):
        return lambda _p: None
    files = {f"/tests/{name}": rel for name, rel in g.extra.items()}

    def read(path: str) -> str | None:
        rel = files.get(path) or (f"{g.tests}/{path[len('/tests/'):]}" if g.tests and path.startswith("/tests/") else None)
        data = suite.file_bytes(rel) if rel else None
        return data.decode("utf-8", errors="replace") if data is not None else None
    return read


def _with_prewarm(suite: Suite, task: Task, b: BuildSpec, files: dict[str, Any]) -> dict[str, Any]:
    """The build context plus, when the verifier installs packages at test time, a last layer
    that fetches them now (``harness.sandbox.prewarm``)."""
    g = task.grader
    if not isinstance(g, VerifierGraderSpec) or b.dockerfile not in files:
        return files
    read = _verifier_scripts(suite, task)
    scripts = [read(a) for a in g.command if a.startswith("/tests/")] + [read(f"/tests/{n}") for n in g.extra]
    # Terminal-Bench helpers the scripts source: the task's own, else the harness's
    scripts += [read(f"/tests/{name}") or body for name, body in tb_helpers([t.encode() for t in scripts if t], set()).items()]
    reqs = [r for text in scripts if text for r in verifier_requirements(text, read)]
    if not reqs:
        return files
    data, mode = files[b.dockerfile]
    text = data.decode("utf-8", errors="replace").rstrip("\n")
    text += "\n" + prewarm_epilogue(text)
    return {**files, b.dockerfile: (text.encode(), mode), REQUIREMENTS_FILE: ("\n".join(dict.fromkeys(reqs)).encode() + b"\n", 0o644)}


def _one_build(client: Any, suite: Suite, task: Task, tag: str, b: BuildSpec, bmap: BaseMap, labels: dict[str, str], force: bool,
               out: TaskImages, nocache: bool = False) -> str:
    """Build (or map) one image; the tag to run."""
    files = suite.files_under(b.context)
    prebuilt_here = bool(b.image) and image_id(client, b.image or "") is not None
    used = out.bases.setdefault(task.id, [])
    if b.image and not prebuilt_here and b.dockerfile in files:
        # a prebuilt image (Harbor's docker_image) cannot be pulled offline: its Dockerfile is built instead
        out.substitutions[b.image] = f"{tag} (built here from {b.context}/{b.dockerfile})"
        used.append(b.image)
    elif b.image:  # a prebuilt image and nothing to build it from: mapped like a FROM
        try:
            local = bmap.resolve(b.image, lambda r: image_id(client, r) is not None)
        except DockerfileError as e:
            raise NotBuildableHere(f"docker_image {b.image}: {e}") from None
        if image_id(client, local) is None:
            ensure_local_base(client, local)
        if local != b.image:
            out.substitutions[b.image] = f"{local}@{(image_id(client, local) or local)[:19]}"
            used.append(b.image)
        return local
    files = _with_prewarm(suite, task, b, files)
    res = build_image(client, tag, files, b.dockerfile, basemap=bmap, labels=labels, force=force, timeout=b.timeout,
                      log_dir=harness_home() / "builds", ensure_base=lambda local: ensure_local_base(client, local), nocache=nocache)
    out.substitutions.update(res.substitutions)
    used.extend(ref for ref in res.substitutions if ref not in used)
    if res.built:
        out.built.append((tag, res.seconds))
    return tag


def build_task_images(client: Any, suite: Suite, tasks: list[Task], base_map: list[str] | None = None, force: bool = False,
                      log: Callable[[str], None] | None = None, nocache: bool = False) -> TaskImages:
    """Build the images of ``tasks`` that have a ``build`` (and their separate verifiers');
    ``force`` and ``nocache``: every one again, every step again (a cold build)."""
    bmap = BaseMap.parse(base_map, suite.base_map)
    out = TaskImages()
    todo = [t for t in tasks if t.build is not None]
    for i, t in enumerate(todo, 1):
        t0 = time.monotonic()
        n_built = len(out.built)
        labels = {SUITE_LABEL: suite.name, TASK_LABEL: t.id}
        try:
            tag = _one_build(client, suite, t, t.image or "", t.build, bmap, labels, force, out, nocache)
            if isinstance(t.grader, VerifierGraderSpec) and t.grader.build is not None and t.grader.image:
                out.verifiers[t.id] = _one_build(client, suite, t, t.grader.image, t.grader.build, bmap, labels, force, out, nocache)
            out.images[t.id] = (tag, image_identity(client, tag)[0])  # the image id: what runs, whatever the tag becomes
        except HarnessError as e:
            out.failures[t.id] = str(e)
            if isinstance(e, NotBuildableHere):
                out.not_buildable.add(t.id)
        if log is not None:
            took = time.monotonic() - t0
            state = "cannot be built" if t.id in out.failures else ("built" if len(out.built) > n_built else "up to date")
            log(f"image {i}/{len(todo)} {t.id}: {state} ({took:.1f} s)")
    return out


def unbuildable(client: Any, suite: Suite, base_map: list[str] | None = None) -> dict[str, str]:
    """Task id -> why its image cannot be built here as written (a base with no local
    equivalent, BuildKit-only syntax), found without building: what ``suites show`` warns of
    before a run refuses it. ``client`` None (no engine answers): an image only the engine
    could hold counts as missing, and the line says so."""
    from harness.sandbox.dockerfile import translate

    bmap = BaseMap.parse(base_map, suite.base_map)

    def present(ref: str) -> bool:
        return client is not None and image_id(client, ref) is not None

    out: dict[str, str] = {}
    for t in suite.tasks:
        builds = [t.build] + ([t.grader.build] if isinstance(t.grader, VerifierGraderSpec) and t.grader.build else [])
        for b in (x for x in builds if x is not None):
            files = suite.files_under(b.context)
            try:
                if b.dockerfile in files:
                    translate(files[b.dockerfile][0].decode("utf-8", "replace"), lambda ref: bmap.resolve(ref, present), None)
                elif b.image:
                    bmap.resolve(b.image, present)
            except DockerfileError as e:
                out[t.id] = f"{b.context}/{b.dockerfile}: {e}" + ("" if client is not None else " (no engine answers to look for it)")
                break
    return out
