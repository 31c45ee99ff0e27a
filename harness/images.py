"""Offline image builds: the base image from Debian's archive, then everything FROM it.

No registry is needed. The base image is a ``mmdebstrap --variant=minbase`` tarball of
Debian bookworm with python3, made from apt's *configured* sources and imported with the
Docker SDK. The sandbox image and each suite's image are built from Dockerfiles whose
``ARG BASE`` defaults to the offline chain, so the same files build from a public image
where a registry is reachable (``--base python:3.11-slim-bookworm``).

Every image carries a ``dev.harness.inputs`` label: a hash of what it was built from. A
build is skipped when the present image already has the hash of the current inputs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import docker
import docker.errors

BASE_IMAGE = "harness/base:bookworm"
SANDBOX_IMAGE = "harness/sandbox:latest"
INPUTS_LABEL = "dev.harness.inputs"
SUITE_LABEL = "dev.harness.suite"  # on a suite's image: which suite it was built from
BASE_PACKAGES = ["python3", "tar"]
BASE_RECIPE = f"mmdebstrap --variant=minbase --include={','.join(BASE_PACKAGES)} bookworm v1"


class ImageBuildError(RuntimeError):
    """An image could not be built; the message says which and why."""


def docker_dir() -> Path:
    """The ``docker/`` directory: the repo's, or the copy shipped in the package."""
    here = Path(__file__).resolve().parent
    for cand in (here / "docker", here.parent / "docker"):
        if (cand / "sandbox.Dockerfile").is_file():
            return cand
    raise ImageBuildError("docker/sandbox.Dockerfile not found; run from a checkout of harness")


def hash_tree(root: Path, extra: str = "") -> str:
    """sha256 over every file's relative path and bytes under ``root`` (sorted), plus ``extra``."""
    h = hashlib.sha256(extra.encode())
    files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def image_inputs(client: docker.DockerClient, tag: str) -> str | None:
    """The inputs hash of a present image, or None if absent."""
    try:
        img = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    return (img.labels or {}).get(INPUTS_LABEL, "")


def apt_sources_digest() -> str:
    """A digest of apt's configured sources, so a changed mirror means a new base image
    (the address itself is never recorded in the repo)."""
    h = hashlib.sha256()
    for p in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()[:12]


@dataclass
class BuildResult:
    tag: str
    built: bool
    inputs: str
    seconds: float = 0.0


def build_base(client: docker.DockerClient, tag: str = BASE_IMAGE, force: bool = False, log: Callable[[str], None] = print) -> BuildResult:
    """Build the base image with mmdebstrap from apt's configured sources and import it."""
    inputs = hashlib.sha256(f"{BASE_RECIPE}|{apt_sources_digest()}".encode()).hexdigest()[:16]
    if not force and image_inputs(client, tag) == inputs:
        return BuildResult(tag, False, inputs)
    if shutil.which("mmdebstrap") is None:
        if os.geteuid() != 0:
            raise ImageBuildError("mmdebstrap is missing; install it with `sudo apt-get install mmdebstrap`")
        log("images: installing mmdebstrap (apt-get)...")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "-q", "mmdebstrap"], check=False, env=env, capture_output=True)
        if shutil.which("mmdebstrap") is None:
            subprocess.run(["apt-get", "update", "-q"], check=True, env=env, capture_output=True)
            subprocess.run(["apt-get", "install", "-y", "-q", "mmdebstrap"], check=True, env=env, capture_output=True)
    t0 = time.monotonic()
    log(f"images: building {tag} with mmdebstrap (bookworm minbase + {', '.join(BASE_PACKAGES)}) ...")
    with tempfile.TemporaryDirectory(prefix="harness-base-") as tmp:
        tarball = Path(tmp, "rootfs.tar")
        proc = subprocess.run(
            ["mmdebstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", "bookworm", str(tarball)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
            raise ImageBuildError(f"mmdebstrap failed (exit {proc.returncode}); is apt configured (apt-get update)?\n{tail}")
        repo, _, version = tag.rpartition(":")
        try:
            client.api.import_image_from_file(
                str(tarball),
                repository=repo,
                tag=version,
                changes=[f"LABEL {INPUTS_LABEL}={inputs}", 'CMD ["/bin/sh"]', "ENV LANG=C.UTF-8"],
            )
        except docker.errors.DockerException as e:
            raise ImageBuildError(f"docker import of {tag} failed: {e}") from None
    return BuildResult(tag, True, inputs, time.monotonic() - t0)


def build_dockerfile(
    client: docker.DockerClient,
    tag: str,
    context: Path,
    dockerfile: str,
    base: str,
    force: bool = False,
    labels: dict[str, str] | None = None,
) -> BuildResult:
    """Build ``tag`` from a Dockerfile with ``--build-arg BASE=base``, skipping when the
    inputs (context files, Dockerfile, base image id) are unchanged."""
    try:
        base_id = client.images.get(base).id
    except docker.errors.ImageNotFound:
        base_id = base  # a registry base: the tag is the input
    inputs = hash_tree(context, extra=f"{dockerfile}|{base}|{base_id}")
    if not force and image_inputs(client, tag) == inputs:
        return BuildResult(tag, False, inputs)
    t0 = time.monotonic()
    try:
        client.images.build(
            path=str(context),
            dockerfile=dockerfile,
            tag=tag,
            buildargs={"BASE": base},
            labels={INPUTS_LABEL: inputs, **(labels or {})},
            rm=True,
            forcerm=True,
            pull=False,
        )
    except docker.errors.BuildError as e:
        tail = "".join(str(x.get("stream", x.get("error", ""))) for x in list(e.build_log)[-10:])
        raise ImageBuildError(f"building {tag} from {context / dockerfile} failed: {e.msg}\n{tail}") from None
    except docker.errors.APIError as e:
        raise ImageBuildError(f"building {tag} failed: {e.explanation or e}") from None
    return BuildResult(tag, True, inputs, time.monotonic() - t0)


def build_all(
    client: docker.DockerClient,
    base: str | None = None,
    suites: list[str] | None = None,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> list[BuildResult]:
    """Build base (unless ``base`` names a public image), sandbox, and the images of the
    given suites (default: every built-in suite)."""
    from harness.suite import builtin_suites, load_suite

    results = []
    if base is None:
        results.append(build_base(client, force=force, log=log))
        base = BASE_IMAGE
    ddir = docker_dir()
    results.append(build_dockerfile(client, SANDBOX_IMAGE, ddir, "sandbox.Dockerfile", base, force))
    for name in suites if suites is not None else builtin_suites():
        s = load_suite(name)
        if not s.dockerfile:
            continue
        results.append(build_dockerfile(client, s.image, s.root, s.dockerfile, SANDBOX_IMAGE, force, labels={SUITE_LABEL: s.name}))
    return results
