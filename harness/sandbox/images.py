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
import io
import os
import tarfile
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import docker
import docker.errors

from harness.model.errors import ImageBuildError, RunError

BASE_IMAGE = "harness/base:bookworm"
SANDBOX_IMAGE = "harness/sandbox:latest"
INPUTS_LABEL = "dev.harness.inputs"
SUITE_LABEL = "dev.harness.suite"  # on a suite's image: which suite it was built from
BASE_PACKAGES = ["python3", "tar"]
BASE_RECIPE = f"mmdebstrap --variant=minbase --include={','.join(BASE_PACKAGES)} bookworm v1"


def docker_dir() -> Path:
    """The ``docker/`` directory: the repo's, or the copy shipped in the package."""
    pkg = Path(__file__).resolve().parent.parent  # harness/
    for cand in (pkg / "docker", pkg.parent / "docker"):
        if (cand / "sandbox.Dockerfile").is_file():
            return cand
    raise ImageBuildError("docker/sandbox.Dockerfile not found; run from a checkout of harness")


def context_files(root: Path) -> list[str]:
    """Every file under ``root`` (relative POSIX paths, sorted), caches left out."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def hash_tree(root: Path, extra: str = "", files: list[str] | None = None) -> str:
    """sha256 over the files' relative paths and bytes (all of ``root`` by default), plus ``extra``."""
    h = hashlib.sha256(extra.encode())
    for rel in sorted(files if files is not None else context_files(root)):
        h.update(rel.encode() + b"\0")
        h.update((root / rel).read_bytes())
    return h.hexdigest()[:16]


def _context_tar(root: Path, files: list[str]) -> io.BytesIO:
    """A build context holding exactly ``files`` (what the inputs hash covers, nothing else)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for rel in sorted(files):
            tf.add(root / rel, arcname=rel, recursive=False)
    buf.seek(0)
    return buf


def image_identity(client: docker.DockerClient, image: str) -> tuple[str, str]:
    """(image id, digest-ish string) of a local image, or a RunError with the fix."""
    try:
        img = client.images.get(image)
    except docker.errors.ImageNotFound:
        fix = ("build it with `make images` (or `harness images build`)" if image.startswith("harness/") else
               "build or load it on this engine first (e.g. `docker build -t IMAGE .` FROM the suite's image; no registry is used)")
        raise RunError(f"image {image} not found on this engine; {fix}") from None
    digests = img.attrs.get("RepoDigests") or []
    return img.id, (digests[0] if digests else img.id)


def image_labels(client: docker.DockerClient, image: str) -> dict[str, str] | None:
    """The labels of a local image (None when absent)."""
    try:
        return client.images.get(image).labels or {}
    except docker.errors.ImageNotFound:
        return None


def image_id(client: docker.DockerClient, image: str) -> str | None:
    try:
        return client.images.get(image).id
    except docker.errors.ImageNotFound:
        return None


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
    files: list[str] | None = None,
) -> BuildResult:
    """Build ``tag`` from a Dockerfile with ``--build-arg BASE=base``, skipping when the
    inputs (the context files, Dockerfile, base image id) are unchanged. With ``files``, the
    build context is exactly those files (the ones the inputs hash covers)."""
    inputs = dockerfile_inputs(client, context, dockerfile, base, files)
    if not force and image_inputs(client, tag) == inputs:
        return BuildResult(tag, False, inputs)
    t0 = time.monotonic()
    ctx: dict = {"path": str(context)} if files is None else {"fileobj": _context_tar(context, files), "custom_context": True}
    try:
        client.images.build(
            **ctx,
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


def dockerfile_inputs(client: docker.DockerClient, context: Path, dockerfile: str, base: str, files: list[str] | None = None) -> str:
    """The inputs hash an image built from this Dockerfile carries in its label."""
    base_id = image_id(client, base) or base  # a registry base: the tag is the input
    return hash_tree(context, extra=f"{dockerfile}|{base}|{base_id}", files=files)


@dataclass(frozen=True)
class ImageSpec:
    """An image to build FROM the sandbox image: tag, build context, Dockerfile, the context
    files that are its inputs, labels."""

    tag: str
    context: Path
    dockerfile: str
    files: list[str]
    labels: dict[str, str]


def build_all(
    client: docker.DockerClient,
    images: list[ImageSpec],
    base: str | None = None,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> list[BuildResult]:
    """Build base (unless ``base`` names a public image), sandbox, then ``images`` FROM it."""
    results = []
    if base is None:
        results.append(build_base(client, force=force, log=log))
        base = BASE_IMAGE
    ddir = docker_dir()
    results.append(build_dockerfile(client, SANDBOX_IMAGE, ddir, "sandbox.Dockerfile", base, force))
    for im in images:
        results.append(build_dockerfile(client, im.tag, im.context, im.dockerfile, SANDBOX_IMAGE, force, labels=im.labels, files=im.files))
    return results


def list_images(client: docker.DockerClient) -> list[tuple[str, str, int | None, str]]:
    """(tag, short id, size, inputs hash) of every harness/* image present."""
    out = []
    for img in client.images.list():
        for tag in img.tags:
            if tag.startswith("harness/"):
                out.append((tag, img.short_id.split(":")[1], img.attrs.get("Size"), (img.labels or {}).get(INPUTS_LABEL, "-")))
    return out
