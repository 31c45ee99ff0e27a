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

import fnmatch
import hashlib
import io
import json
import os
import re
import shutil
import ssl
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import docker
import docker.errors
import requests

from harness.model.errors import ImageBuildError, NotBuildableHere, RunError
from harness.model.sandbox import Tree
from harness.sandbox.basemap import BASE_IMAGE, DEBIAN_IMAGE, PYTHON_IMAGE, BaseMap
from harness.sandbox.dockerfile import DockerfileError, Translation, normalize_ref, translate

POSTGRES_IMAGE = "harness/postgres:15"
GATEWAY_IMAGE = "harness/gateway:latest"
SANDBOX_IMAGE = "harness/sandbox:latest"
# harness's own images (built offline by `harness images build`): a suite may run in one
HARNESS_IMAGES = (BASE_IMAGE, SANDBOX_IMAGE, DEBIAN_IMAGE, PYTHON_IMAGE, POSTGRES_IMAGE, GATEWAY_IMAGE)
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


def remove_image(client: docker.DockerClient, image: str) -> bool:
    """Remove a local image by tag (its layers go with it unless shared); False when absent."""
    try:
        client.images.remove(image, force=True)
        return True
    except docker.errors.ImageNotFound:
        return False


def image_identity(client: docker.DockerClient, image: str, fix: str | None = None) -> tuple[str, str]:
    """(image id, digest-ish string) of a local image, or a RunError with the fix (``fix``:
    the caller knows a better one, e.g. the suite directory that builds it)."""
    try:
        img = client.images.get(image)
    except docker.errors.ImageNotFound:
        fix = fix or ("build it with `make images` (or `harness images build`)" if image.startswith("harness/") else
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


def image_config(client: docker.DockerClient, image: str) -> dict:
    """The image's run configuration (User, WorkingDir, Env, ...); {} when absent."""
    try:
        return client.images.get(image).attrs.get("Config") or {}
    except docker.errors.ImageNotFound:
        return {}


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


def host_ca_bundle() -> bytes | None:
    """The host's CA bundle (what its own pip and apt trust), passed into builds; None if none."""
    candidates = [os.environ.get("SSL_CERT_FILE"), os.environ.get("REQUESTS_CA_BUNDLE"), ssl.get_default_verify_paths().cafile,
                  "/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"]
    for c in candidates:
        if c and Path(c).is_file():
            try:
                return Path(c).read_bytes()
            except OSError:
                continue
    return None


def read_tree(root: Path, files: list[str] | None = None) -> Tree:
    """Files of a directory (all of them by default): relative path -> (bytes, permission bits)."""
    rels = files if files is not None else context_files(root)
    return {rel: ((root / rel).read_bytes(), (root / rel).stat().st_mode & 0o777) for rel in rels}


def dockerignore(files: Tree) -> Tree:
    """The build context as the docker CLI would send it: ``.dockerignore`` patterns applied
    (``!`` re-includes; a pattern matches a path or any directory above it)."""
    raw = files.get(".dockerignore")
    if raw is None:
        return dict(files)
    rules = []
    for line in raw[0].decode("utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        pat = line[1:].strip() if neg else line
        pat = pat.strip("/").removeprefix("./")
        rules.append((neg, pat))

    def excluded(rel: str) -> bool:
        parts = rel.split("/")
        out = False
        for neg, pat in rules:
            if any(fnmatch.fnmatchcase("/".join(parts[:i]), pat) or fnmatch.fnmatchcase("/".join(parts[:i]), pat + "/**")
                   for i in range(1, len(parts) + 1)) or ("**" in pat and fnmatch.fnmatchcase(rel, pat.replace("**/", "*"))):
                out = not neg
        return out

    keep = {rel: v for rel, v in files.items() if not excluded(rel)}
    for must in ("Dockerfile",):  # the CLI always sends the Dockerfile
        if must in files:
            keep[must] = files[must]
    return keep


def _tar(files: Tree) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for rel, (data, mode) in sorted(files.items()):
            ti = tarfile.TarInfo(rel)
            ti.size, ti.mode = len(data), mode or 0o644
            tf.addfile(ti, io.BytesIO(data))
    buf.seek(0)
    return buf


BUILD_DOCKERFILE = ".harness.Dockerfile"  # the translated Dockerfile, beside the context files


@dataclass
class BuildResult:
    tag: str
    built: bool
    inputs: str
    seconds: float = 0.0
    substitutions: dict[str, str] = field(default_factory=dict)  # reference as written -> local image@id
    notes: list[str] = field(default_factory=list)


def build_image(
    client: docker.DockerClient,
    tag: str,
    files: Tree,
    dockerfile: str = "Dockerfile",
    basemap: BaseMap | None = None,
    buildargs: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    force: bool = False,
    timeout: float = 1800.0,
    log_dir: Path | None = None,
    ensure_base: Callable[[str], None] | None = None,
    nocache: bool = False,
) -> BuildResult:
    """Build ``tag`` from a Dockerfile and its context (``files``), offline: foreign bases mapped
    to local ones, the host's CA bundle passed in, BuildKit-only syntax rewritten
    (``harness.sandbox.dockerfile``). Skipped when the present image was built from the same
    inputs (context, translated Dockerfile, base image ids). A failure raises
    :class:`ImageBuildError` with the log's tail; the whole log is kept in ``log_dir``. A
    Dockerfile that cannot be built here as written (an unmapped base) is :class:`NotBuildableHere`.
    ``nocache`` (with ``force``) builds every step again instead of reusing the layer cache."""
    if dockerfile not in files:
        raise NotBuildableHere(f"building {tag}: no {dockerfile} in its build context")
    try:
        context, tr, ids, inputs = prepare_build(client, files, dockerfile, basemap, buildargs, ensure_base)
    except DockerfileError as e:
        raise NotBuildableHere(f"building {tag}: {dockerfile}: {e}") from None
    subs = {ref: f"{local}@{ids.get(local, local)[:19]}" for ref, local in tr.bases.items() if normalize_ref(ref) != local and ref != local}
    if not force and image_inputs(client, tag) == inputs:
        return BuildResult(tag, False, inputs, substitutions=subs, notes=tr.notes)
    t0 = time.monotonic()
    log: list[str] = []
    error = None
    try:
        stream = client.api.build(fileobj=_tar(context), custom_context=True, dockerfile=BUILD_DOCKERFILE, tag=tag,
                                  buildargs=buildargs or None, labels={INPUTS_LABEL: inputs, **(labels or {})}, rm=True,
                                  forcerm=True, pull=False, decode=True, nocache=nocache)
        for chunk in stream:
            if "stream" in chunk:
                log += [x for x in str(chunk["stream"]).splitlines() if x.strip()]
            if "error" in chunk:
                error = str(chunk.get("error")).strip()
                log.append(error)
            if time.monotonic() - t0 > timeout:
                error = f"the build took longer than {timeout:.0f} s"
                stream.close()
                break
    except docker.errors.APIError as e:
        error = str(e.explanation or e)
    except requests.RequestException as e:
        error = f"the engine stopped answering during the build ({type(e).__name__})"
    if log_dir is not None:
        try:
            log_dir.mkdir(parents=True, exist_ok=True)
            (log_dir / (tag.replace("/", "_").replace(":", "_") + ".log")).write_text("\n".join(log) + "\n")
        except OSError:
            pass
    if error is not None:
        tail = "\n".join("    " + re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", x)[:300] for x in log[-12:])
        where = f" (whole log: {log_dir / (tag.replace('/', '_').replace(':', '_') + '.log')})" if log_dir else ""
        raise ImageBuildError(f"building {tag} failed: {error[:300]}{where}\n{tail}")
    return BuildResult(tag, True, inputs, time.monotonic() - t0, subs, tr.notes)


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
    """Build ``tag`` from a Dockerfile of the harness or of a native suite with
    ``--build-arg BASE=base`` (``files``: exactly the context files that are its inputs)."""
    tree = read_tree(context, files)
    if dockerfile not in tree:
        tree[dockerfile] = ((context / dockerfile).read_bytes(), 0o644)
    return build_image(client, tag, tree, dockerfile, buildargs={"BASE": base}, labels=labels, force=force,
                       log_dir=_build_logs(), ensure_base=lambda local: ensure_local_base(client, local))


def prepare_build(client: docker.DockerClient, files: Tree, dockerfile: str, basemap: BaseMap | None = None,
                  buildargs: dict[str, str] | None = None, ensure_base: Callable[[str], None] | None = None,
                  ) -> tuple[Tree, Translation, dict[str, str], str]:
    """(build context, translation, local base -> image id, inputs hash) of a build; no build.
    Raises :class:`DockerfileError` for a Dockerfile that cannot be built here."""
    bmap = basemap or BaseMap()
    ids: dict[str, str] = {}

    def resolve(ref: str) -> str:
        local = bmap.resolve(ref, lambda r: image_id(client, r) is not None)
        if image_id(client, local) is None and ensure_base is not None:
            ensure_base(local)
        ids[local] = image_id(client, local) or local
        return local

    try:
        text = files[dockerfile][0].decode("utf-8")
    except UnicodeDecodeError:
        raise DockerfileError("not UTF-8 text") from None
    tr = translate(text, resolve, host_ca_bundle(), args=buildargs)
    context = dockerignore(files)
    context.update({name: (data, 0o644) for name, data in tr.files.items()})
    context[BUILD_DOCKERFILE] = (tr.text.encode(), 0o644)
    h = hashlib.sha256(b"harness-build-v2\0")
    for rel, (data, mode) in sorted(context.items()):
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest() + (b"x" if mode & 0o111 else b""))
    h.update(json.dumps([sorted(ids.items()), sorted((buildargs or {}).items())]).encode())
    return context, tr, ids, h.hexdigest()[:16]


def dockerfile_inputs(client: docker.DockerClient, context: Path, dockerfile: str, base: str, files: list[str] | None = None) -> str:
    """The inputs hash an image built from this Dockerfile carries in its label (no build)."""
    tree = read_tree(context, files)
    if dockerfile not in tree:
        tree[dockerfile] = ((context / dockerfile).read_bytes(), 0o644)
    try:
        return prepare_build(client, tree, dockerfile, buildargs={"BASE": base})[3]
    except DockerfileError:
        return ""


def _build_logs() -> Path:
    return Path(os.environ.get("HARNESS_HOME", ".harness")) / "builds"


# the harness's own images: tag -> (Dockerfile in docker/, its other context files, the image it is built FROM)
HARNESS_IMAGES: dict[str, tuple[str, tuple[str, ...], str]] = {
    SANDBOX_IMAGE: ("sandbox.Dockerfile", (), BASE_IMAGE),
    DEBIAN_IMAGE: ("debian.Dockerfile", tuple(f"verifier-tools/{f}" for f in ("uvshim.py", "curl", "env", "harness-uv-prewarm")), BASE_IMAGE),
    PYTHON_IMAGE: ("python.Dockerfile", (), DEBIAN_IMAGE),
    POSTGRES_IMAGE: ("postgres.Dockerfile", ("pg-start.sh",), BASE_IMAGE),
    GATEWAY_IMAGE: ("gateway.Dockerfile", (), BASE_IMAGE),
}


def ensure_local_base(client: docker.DockerClient, tag: str, force: bool = False, log: Callable[[str], None] | None = None) -> BuildResult | None:
    """Build one of the harness's own images (and what it is built FROM) when it is missing."""
    if tag == BASE_IMAGE:
        return build_base(client, force=force, log=log or (lambda _m: None))
    if tag not in HARNESS_IMAGES:
        return None
    dockerfile, extra, parent = HARNESS_IMAGES[tag]
    if image_id(client, parent) is None or parent != BASE_IMAGE:
        ensure_local_base(client, parent, False, log)
    if log:
        log(f"images: {tag} ...")
    return build_dockerfile(client, tag, docker_dir(), dockerfile, parent, force, files=[dockerfile, *extra])


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
    """Build base (unless ``base`` names a public image), the harness's own images (sandbox,
    debian, python, postgres), then ``images`` FROM the sandbox image."""
    results = []
    if base is None:
        results.append(build_base(client, force=force, log=log))
        base = BASE_IMAGE
    ddir = docker_dir()
    for tag, (dockerfile, extra, parent) in HARNESS_IMAGES.items():
        log(f"images: {tag} ...")
        results.append(build_dockerfile(client, tag, ddir, dockerfile, base if parent == BASE_IMAGE else parent, force,
                                        files=[dockerfile, *extra]))
    for im in images:
        results.append(build_dockerfile(client, im.tag, im.context, im.dockerfile, SANDBOX_IMAGE, force, labels=im.labels, files=im.files))
    return results


def list_images(client: docker.DockerClient) -> list[tuple[str, str, int | None, str]]:
    """(tag, short id, size, inputs hash) of every harness/* image present."""
    out = []
    for img in client.api.images():  # the list itself: images.list() inspects each, and one removed meanwhile is a 404
        for tag in img.get("RepoTags") or []:
            if tag.startswith("harness/"):
                out.append((tag, str(img.get("Id", "")).split(":")[-1][:12], img.get("Size"), (img.get("Labels") or {}).get(INPUTS_LABEL, "-")))
    return out
