"""Foreign Dockerfiles made buildable offline by the engine's classic builder (pure text).

What changes, and only that:

* every ``FROM`` (and ``COPY --from``) naming an image outside the file is replaced by the
  local image the base map gives (``harness.sandbox.basemap``); stage names, ``scratch`` and
  ``ARG``-defaulted references are resolved first, digests are dropped;
* right after each such ``FROM``, the host's CA bundle is copied in and named by build-time
  ``ARG``s (``PIP_CERT``, ``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``,
  ``NODE_EXTRA_CA_CERTS``, ``GIT_SSL_CAINFO``, ``APT_CONFIG``): ``pip`` and ``apt-get`` reach
  mirrors that need it during the build, and the image's runtime environment is unchanged;
* BuildKit-only syntax the classic builder refuses is rewritten where the meaning survives
  (``RUN --mount=type=cache`` and ``RUN --network`` dropped, ``COPY --link`` dropped,
  ``COPY --chmod`` as a ``chmod`` after the copy, heredocs as files of the build context)
  and refused with the file, line and key otherwise (``--mount=type=secret``, ``ssh``,
  ``bind``, ``COPY --parents``, ``--exclude``).
"""

from __future__ import annotations

import base64
import re
import shlex
from dataclasses import dataclass, field
from typing import Callable

CA_FILE = ".harness-build-ca.pem"
APT_CONF_FILE = ".harness-build-apt.conf"
CA_PATH = "/usr/local/share/harness-build/ca.pem"
APT_CONF_PATH = "/usr/local/share/harness-build/apt.conf"
CA_ARGS = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO")
_VAR = re.compile(r"\$(\w+)|\$\{(\w+)(?::?-([^}]*))?\}")
_HEREDOC = re.compile(r"<<(-?)(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")


class DockerfileError(ValueError):
    """A Dockerfile this builder cannot build as written (the message names the line)."""


@dataclass
class Translation:
    """The Dockerfile to build, what it was built FROM instead, and files it needs in its context."""

    text: str
    bases: dict[str, str] = field(default_factory=dict)  # reference as written -> local image
    files: dict[str, bytes] = field(default_factory=dict)  # extra build-context files
    notes: list[str] = field(default_factory=list)  # what was rewritten, one line each


@dataclass
class _Line:
    no: int  # first physical line
    text: str  # the logical instruction (continuations joined)
    heredocs: list[tuple[str, str]] = field(default_factory=list)  # (delimiter, body)


def logical_lines(text: str) -> list[_Line]:
    """Instructions with continuations joined, comments and blank lines dropped, heredoc bodies attached."""
    phys = text.replace("\r\n", "\n").split("\n")
    out: list[_Line] = []
    i = 0
    while i < len(phys):
        line = phys[i]
        if not line.strip() or line.lstrip().startswith("#"):
            i += 1
            continue
        start, buf = i, line
        while buf.rstrip().endswith("\\") and i + 1 < len(phys):
            i += 1
            nxt = phys[i]
            if nxt.lstrip().startswith("#"):
                continue  # comments inside a continued instruction are dropped
            buf = buf.rstrip()[:-1] + " " + nxt.strip() if nxt.strip() else buf.rstrip()[:-1]
        cur = _Line(start + 1, buf.strip())
        for strip_tabs, _q, delim in _HEREDOC.findall(cur.text) if cur.text.split(None, 1)[0].upper() in ("RUN", "COPY", "ADD") else []:
            body = []
            i += 1
            while i < len(phys) and (phys[i].lstrip("\t") if strip_tabs else phys[i]) != delim:
                body.append(phys[i].lstrip("\t") if strip_tabs else phys[i])
                i += 1
            if i >= len(phys):
                raise DockerfileError(f"line {cur.no}: heredoc <<{delim} is never closed")
            cur.heredocs.append((delim, "\n".join(body) + "\n"))
        out.append(cur)
        i += 1
    return out


def _subst(s: str, args: dict[str, str]) -> str:
    def rep(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name in args:
            return args[name]
        if m.group(3) is not None:
            return m.group(3)
        raise DockerfileError(f"${name} has no default (pass it with --build-arg; the harness passes none)")
    return _VAR.sub(rep, s)


def _flags(rest: str) -> tuple[list[str], str]:
    """Leading --flags of an instruction, and what follows them."""
    flags = []
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        flags.append(flag)
        rest = rest.lstrip()
    return flags, rest


def normalize_ref(ref: str) -> str:
    """An image reference without its digest (``python:3.12-slim@sha256:...`` -> ``python:3.12-slim``)
    and without the implicit registry (``docker.io/library/``)."""
    ref = ref.split("@", 1)[0].strip()
    for prefix in ("docker.io/library/", "index.docker.io/library/", "library/", "docker.io/"):
        if ref.startswith(prefix):
            ref = ref[len(prefix):]
            break
    return ref


def translate(text: str, resolve: Callable[[str], str], ca: bytes | None, args: dict[str, str] | None = None) -> Translation:
    """The buildable Dockerfile (see the module docstring). ``resolve`` maps a foreign
    reference to a local image or raises :class:`DockerfileError` (its message is kept);
    ``args`` are the build arguments the build passes (over the file's ARG defaults)."""
    tr = Translation(text="")
    out: list[str] = []
    global_args: dict[str, str] = {}
    passed = dict(args or {})
    stages: set[str] = set()
    seen_from = False
    user = ""  # the current stage's USER (for a chmod after COPY --chmod)
    n_docs = 0

    def base(ref: str, no: int) -> str:
        if ref.lower() in stages or ref == "scratch":
            return ref
        try:
            local = resolve(normalize_ref(ref))
        except DockerfileError as e:
            raise DockerfileError(f"line {no}: FROM {ref}: {e}") from None
        tr.bases[ref] = local
        return local

    for ln in logical_lines(text):
        word, _, rest = ln.text.partition(" ")
        op, rest = word.upper(), rest.strip()
        if op == "ARG" and not seen_from:
            for part in shlex.split(rest):
                k, _, v = part.partition("=")
                global_args[k] = passed.get(k, v)
            out.append(ln.text)
            continue
        if op == "FROM":
            seen_from = True
            flags, rest = _flags(rest)
            if [f for f in flags if not f.startswith("--platform")]:
                raise DockerfileError(f"line {ln.no}: FROM {' '.join(flags)}: only --platform is understood")
            parts = rest.split()
            if not parts:
                raise DockerfileError(f"line {ln.no}: FROM names no image")
            ref = _subst(parts[0], global_args)
            alias = parts[2] if len(parts) >= 3 and parts[1].lower() == "as" else None
            from_stage = ref.lower() in stages
            mapped = base(ref, ln.no)
            out.append(f"FROM {mapped}" + (f" AS {alias}" if alias else ""))
            if alias:
                stages.add(alias.lower())
            user = ""
            if ca is not None and ref != "scratch" and not from_stage:
                out += _ca_lines()
            continue
        if op == "USER":
            user = rest
            out.append(ln.text)
            continue
        if op == "RUN":
            out += _run(ln, rest, tr, n_docs)
            n_docs += len(ln.heredocs)
            continue
        if op in ("COPY", "ADD"):
            lines, n_docs = _copy(ln, op, rest, tr, n_docs, user, lambda r: base(r, ln.no))
            out += lines
            continue
        out.append(ln.text)
    if not seen_from:
        raise DockerfileError("no FROM line")
    if ca is not None:
        tr.files[CA_FILE] = ca
        tr.files[APT_CONF_FILE] = f'Acquire::https::CaInfo "{CA_PATH}";\n'.encode()
    tr.text = "\n".join(out) + "\n"
    return tr


def _ca_lines() -> list[str]:
    return [
        f"COPY {CA_FILE} {CA_PATH}",
        f"COPY {APT_CONF_FILE} {APT_CONF_PATH}",
        *(f"ARG {name}={CA_PATH}" for name in CA_ARGS),
        f"ARG APT_CONFIG={APT_CONF_PATH}",
    ]


def _run(ln: _Line, rest: str, tr: Translation, n_docs: int) -> list[str]:
    flags, cmd = _flags(rest)
    for f in flags:
        if f.startswith("--network"):
            tr.notes.append(f"line {ln.no}: RUN {f} dropped (builds use the engine's default network)")
        elif f.startswith("--mount"):
            kind = dict(p.partition("=")[::2] for p in f[len("--mount="):].split(",")).get("type", "bind")
            if kind in ("cache", "tmpfs"):
                tr.notes.append(f"line {ln.no}: RUN --mount=type={kind} dropped (no build cache here)")
            else:
                raise DockerfileError(f"line {ln.no}: RUN --mount=type={kind} needs BuildKit, which offline builds here do not use")
        else:
            raise DockerfileError(f"line {ln.no}: RUN {f} is not supported by the classic builder")
    if not ln.heredocs:
        return [f"RUN {cmd}"]
    lines = []
    for k, (delim, body) in enumerate(ln.heredocs):
        b64 = base64.b64encode(body.encode()).decode()
        script = f"/tmp/.harness-heredoc-{n_docs + k}"
        runner = "" if body.startswith("#!") else "sh "
        head = _HEREDOC.sub("", cmd, count=1).strip() if k == 0 else ""
        # `RUN <<EOF` runs the body as a script; `RUN cmd <<EOF` feeds it to cmd's stdin
        if head and not head.startswith("&&"):
            lines.append(f"RUN echo {b64} | base64 -d > {script} && ({head}) < {script}; rc=$?; rm -f {script}; exit $rc")
        else:
            lines.append(f"RUN echo {b64} | base64 -d > {script} && chmod +x {script} && {runner}{script}; rc=$?; rm -f {script}; exit $rc")
    tr.notes.append(f"line {ln.no}: RUN heredoc rewritten as a script")
    return lines


def _copy(ln: _Line, op: str, rest: str, tr: Translation, n_docs: int, user: str, base: Callable[[str], str]) -> tuple[list[str], int]:
    flags, args = _flags(rest)
    keep, chmod = [], None
    for f in flags:
        name, _, value = f.partition("=")
        if name == "--chmod":
            chmod = value
        elif name == "--link":
            tr.notes.append(f"line {ln.no}: {op} --link dropped")
        elif name == "--chown":
            keep.append(f)
        elif name == "--from":
            keep.append(f"--from={base(value)}" if "/" in value or ":" in value else f)
        else:
            raise DockerfileError(f"line {ln.no}: {op} {name} is not supported by the classic builder")
    parts = shlex.split(args) if not args.startswith("[") else _json_args(args, ln.no)
    if ln.heredocs:
        new_parts = []
        k = 0
        for p in parts:
            m = _HEREDOC.fullmatch(p)
            if m:
                name = f".harness-heredoc-{n_docs + k}"
                tr.files[name] = ln.heredocs[k][1].encode()
                new_parts.append(name)
                k += 1
            else:
                new_parts.append(p)
        parts, n_docs = new_parts, n_docs + k
        tr.notes.append(f"line {ln.no}: {op} heredoc written to the build context")
    if len(parts) < 2:
        raise DockerfileError(f"line {ln.no}: {op} needs a source and a destination")
    lines = [f"{op} {' '.join(keep + [shlex.quote(p) for p in parts])}".replace("  ", " ")]
    if chmod:
        dest = parts[-1]
        srcs = parts[:-1]
        targets = [dest] if len(srcs) == 1 and not dest.endswith("/") else [dest.rstrip("/") + "/" + s.rstrip("/").rsplit("/", 1)[-1] for s in srcs]
        lines += (["USER root"] if user else []) + [f"RUN chmod -R {chmod} {' '.join(shlex.quote(t) for t in targets)}"] + \
                 ([f"USER {user}"] if user else [])
        tr.notes.append(f"line {ln.no}: {op} --chmod={chmod} applied with chmod after the copy")
    return lines, n_docs


def _json_args(args: str, no: int) -> list[str]:
    import json

    try:
        v = json.loads(args)
    except ValueError:
        raise DockerfileError(f"line {no}: not a valid JSON array: {args[:60]}") from None
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise DockerfileError(f"line {no}: expected a JSON array of strings")
    return v
