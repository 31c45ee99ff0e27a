"""Which local image a foreign base image is built FROM instead (no registry is reachable).

Resolution, first match wins:

1. ``--base-map FOREIGN=LOCAL`` (repeatable; FOREIGN may be a glob such as ``python:3.*``);
2. the suite's own ``base_map`` (``harness.toml`` / ``suite.toml``);
3. the reference itself when the engine already has that image (``docker load``-ed): not a
   substitution, nothing is recorded;
4. the default table below: the common Debian, Ubuntu and python bases map to images the
   harness builds offline from Debian bookworm (``harness images build``);
5. otherwise the build is refused with one line naming the base and the flag that maps it.

Every substitution is recorded in the run's identity (a score from a substituted base is not
the same eval as one from the original) and shown by ``harness show`` / ``report``.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from harness.sandbox.dockerfile import DockerfileError, normalize_ref

BASE_IMAGE = "harness/base:bookworm"
DEBIAN_IMAGE = "harness/debian:bookworm"
PYTHON_IMAGE = "harness/python:bookworm"

# (glob over the reference without digest or docker.io/library/, local image, what differs)
DEFAULT_MAP: tuple[tuple[str, str, str], ...] = (
    ("python", PYTHON_IMAGE, "Debian bookworm's Python 3.11 with pip and venv, whatever 3.x was asked for"),
    ("python:*", PYTHON_IMAGE, "Debian bookworm's Python 3.11 with pip and venv, whatever 3.x was asked for"),
    ("ghcr.io/laude-institute/t-bench/python-3-*", PYTHON_IMAGE, "Terminal-Bench's python bases: Python 3.11 on bookworm"),
    ("debian", DEBIAN_IMAGE, "Debian bookworm (minbase, with python3, pip, curl and uv)"),
    ("debian:*", DEBIAN_IMAGE, "Debian bookworm (minbase, with python3, pip, curl and uv), whatever release was asked for"),
    ("ubuntu", DEBIAN_IMAGE, "Debian bookworm in place of Ubuntu (apt works; Ubuntu-only packages do not)"),
    ("ubuntu:*", DEBIAN_IMAGE, "Debian bookworm in place of Ubuntu (apt works; Ubuntu-only packages do not)"),
    ("ghcr.io/laude-institute/t-bench/ubuntu-*", DEBIAN_IMAGE, "Terminal-Bench's ubuntu bases: Debian bookworm"),
    ("buildpack-deps:*", DEBIAN_IMAGE, "Debian bookworm (without buildpack-deps' compilers: install them with apt-get)"),
)
LOCAL_BASES = (BASE_IMAGE, DEBIAN_IMAGE, PYTHON_IMAGE)


@dataclass(frozen=True)
class BaseMap:
    """User and suite entries over the defaults; ``present(ref)`` says whether the engine has an image."""

    user: tuple[tuple[str, str], ...] = ()
    suite: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, entries: list[str] | None, suite: dict[str, str] | None = None) -> "BaseMap":
        """``--base-map`` values ('FOREIGN=LOCAL') and a suite's table; ValueError names a bad entry."""
        user = []
        for e in entries or []:
            src, sep, dst = e.partition("=")
            if not sep or not src.strip() or not dst.strip():
                raise ValueError(f"--base-map {e!r}: expected FOREIGN=LOCAL, e.g. python:3.12-slim={PYTHON_IMAGE}")
            user.append((src.strip(), dst.strip()))
        return cls(tuple(user), tuple((k, v) for k, v in (suite or {}).items()))

    def resolve(self, ref: str, present: "callable") -> str:
        """The local image to build FROM in place of ``ref`` (see the module docstring)."""
        name = normalize_ref(ref)
        for table, where in ((self.user, "--base-map"), (self.suite, "the suite's base_map:")):
            for pattern, local in table:
                if fnmatch.fnmatchcase(name, normalize_ref(pattern)) or fnmatch.fnmatchcase(ref, pattern):
                    if local not in LOCAL_BASES and not present(local):  # the harness builds its own; a build would ask a registry for any other
                        raise DockerfileError(f"{where} {pattern}={local}: {local} is not on this engine; build or `docker load` it "
                                              f"first, or map {name} to an image the engine has ({', '.join(LOCAL_BASES[1:])} are the harness's)")
                    return local
        if present(ref) or present(name):
            return ref if present(ref) else name
        for pattern, local, _why in DEFAULT_MAP:
            if fnmatch.fnmatchcase(name, pattern):
                return local
        raise DockerfileError(f"base image {name} is not on this engine and has no local equivalent; map it with "
                              f"--base-map {name}=LOCAL_IMAGE (an image built FROM {DEBIAN_IMAGE} or {PYTHON_IMAGE}), "
                              f"or `docker load` it")


def default_table() -> list[tuple[str, str, str]]:
    """The default mapping, for ``harness images basemap`` and the README."""
    return [(p, local, why) for p, local, why in DEFAULT_MAP]
