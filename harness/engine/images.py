"""``harness images build``: the offline base, the sandbox image, then every suite's image.

A suite's image inputs are the files of its directory minus what reaches a trial at run
time (suite.toml, tasks/, fixtures): editing a task never makes its image stale.
"""

from __future__ import annotations

from typing import Callable

from harness.engine.suites import builtin_suites, load_suite
from harness.sandbox.docker_sandbox import connect
from harness.sandbox.images import SUITE_LABEL, BuildResult, ImageSpec, build_all


def build_images(base: str | None = None, suites: list[str] | None = None, force: bool = False,
                 log: Callable[[str], None] = print) -> list[BuildResult]:
    """Build base (unless ``base`` names a public image), sandbox and the suites' images
    (default: every built-in suite)."""
    specs = []
    for name in suites if suites is not None else builtin_suites():
        s = load_suite(name)
        if s.dockerfile:
            specs.append(ImageSpec(tag=s.image, context=s.root, dockerfile=s.dockerfile, files=list(s.image_files),
                                   labels={SUITE_LABEL: s.name}))
    return build_all(connect(), specs, base=base, force=force, log=log)
