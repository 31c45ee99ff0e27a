"""``harness images build``: the offline base, the harness's own images, then every suite's
images -- one per native suite, one per task for Harbor / Terminal-Bench suites.

A native suite's image inputs are the files of its directory minus what reaches a trial at
run time (suite.toml, tasks/, fixtures, tests, solutions): editing a task never makes its
image stale.
"""

from __future__ import annotations

from typing import Callable

from harness.engine.suites import builtin_suites, load_suite
from harness.engine.taskimages import build_task_images
from harness.model.errors import ImageBuildError, NotBuildableHere
from harness.sandbox.docker_sandbox import connect
from harness.sandbox.images import SUITE_LABEL, BuildResult, ImageSpec, build_all


def build_images(base: str | None = None, suites: list[str] | None = None, force: bool = False,
                 log: Callable[[str], None] = print, base_map: list[str] | None = None) -> list[BuildResult]:
    """Build base (unless ``base`` names a public image), the harness images and the suites'
    images (default: every built-in suite). A task image that cannot be built is reported in
    the error after the others were built."""
    specs, per_task = [], []
    for name in suites if suites is not None else builtin_suites():
        s = load_suite(name)
        if any(t.build is not None for t in s.tasks):
            per_task.append(s)
        if s.dockerfile and s.image and any(t.build is None for t in s.tasks):
            specs.append(ImageSpec(tag=s.image, context=s.root, dockerfile=s.dockerfile, files=list(s.image_files),
                                   labels={SUITE_LABEL: s.name}))
    client = connect()
    results = build_all(client, specs, base=base, force=force, log=log)
    failures, infra = [], False
    for s in per_task:
        out = build_task_images(client, s, list(s.tasks), base_map, force=force, log=log)
        built = dict(out.built)
        for task, (tag, _digest) in out.images.items():
            results.append(BuildResult(tag, tag in built, "", built.get(tag, 0.0)))
        failures += [f"{s.name}/{t}: {why}" for t, why in out.failures.items()]
        infra = infra or bool(set(out.failures) - out.not_buildable)
    if failures:  # exit 3 when a build itself failed; 2 when every failure is the suite's to fix (map a base)
        raise (ImageBuildError if infra else NotBuildableHere)("\n".join(failures))
    return results
