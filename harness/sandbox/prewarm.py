"""What a Harbor verifier installs at test time, fetched at image build time instead.

Most public Harbor tasks grade with a ``tests/test.sh`` that installs its tools when it runs:
``curl -LsSf https://astral.sh/uv/<v>/install.sh | sh`` and then
``uvx -p 3.13 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 pytest ...`` (or ``uv pip install
...`` / ``pip install ...``). Offline, none of that can be fetched when the verifier runs.
The local bases carry uv and shims for it (``docker/verifier-tools/``); this module reads the
package requirements out of the verifier script (a suite file, never anything an agent
wrote) so the task's image build can download them as wheels into /opt/harness/wheels
(``harness-uv-prewarm``; root's and read-only to the agent). Only plain requirement specifiers are taken (``name``,
``name[extra]==1.2``, ``name>=1,<2``): paths, URLs, variables and options are ignored.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

REQUIREMENTS_FILE = ".harness-verifier-requirements.txt"
MAX_REQUIREMENTS = 64
_SPEC = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?((===?|!=|~=|<=?|>=?)[A-Za-z0-9.*+!_-]+(,(===?|!=|~=|<=?|>=?)[A-Za-z0-9.*+!_-]+)*)?$")
_WITH = {"-w", "--with", "--from", "--with-editable"}
_INSTALL_STOP = {"&&", "||", ";", "|", ">", "2>", ">>", "&"}
# options of pip / uv pip install that take a value (their value is not a requirement)
_VALUED = {"-r", "--requirement", "-c", "--constraint", "-e", "--editable", "-i", "--index-url", "--extra-index-url",
           "-f", "--find-links", "--python", "-p", "-t", "--target", "--prefix", "--root", "--cache-dir", "--only-binary",
           "--no-binary", "--platform", "--python-version", "--implementation", "--abi", "--trusted-host", "--index-strategy"}


def _tokens(script: str) -> list[list[str]]:
    """The script's commands as token lists (continuations joined, comments dropped)."""
    text = re.sub(r"\\\r?\n", " ", script)
    out = []
    for line in text.splitlines():
        try:
            toks = shlex.split(line, comments=True)
        except ValueError:
            continue
        cmd: list[str] = []
        for t in toks:
            if t in _INSTALL_STOP:
                if cmd:
                    out.append(cmd)
                cmd = []
            else:
                cmd.append(t)
        if cmd:
            out.append(cmd)
    return out


def _uv_args(cmd: list[str], j: int, tool: bool) -> list[str]:
    """-w / --with / --from values from ``cmd[j:]``, and (``tool``) the tool name: uvx pytest."""
    found = []
    while j < len(cmd):
        a = cmd[j]
        if a in _WITH and j + 1 < len(cmd):
            found += cmd[j + 1].split(",")
            j += 2
            continue
        if a.startswith(("--with=", "--from=")):
            found += a.split("=", 1)[1].split(",")
        elif a in _VALUED and j + 1 < len(cmd):
            j += 1
        elif not a.startswith("-"):
            if tool:
                found.append(a)
            break
        j += 1
    return found


def verifier_requirements(script: str, read: Callable[[str], str | None] | None = None) -> list[str]:
    """Requirement specifiers named by a verifier script, in order, de-duplicated; ``read``
    gives the text of a requirements file it names (``-r /tests/requirements.txt``)."""
    found: list[str] = []
    for cmd in _tokens(script):
        words = [w.rsplit("/", 1)[-1] for w in cmd]
        for i, w in enumerate(words):
            nxt = words[i + 1:i + 3]
            if w == "uvx":
                found += _uv_args(cmd, i + 1, tool=True)
            elif w == "uv" and nxt[:1] == ["x"]:
                found += _uv_args(cmd, i + 2, tool=True)
            elif w == "uv" and nxt == ["tool", "run"]:
                found += _uv_args(cmd, i + 3, tool=True)
            elif w == "uv" and nxt[:1] == ["run"]:
                found += _uv_args(cmd, i + 2, tool=False)
            elif w == "install" and i and words[i - 1] in ("pip", "pip3"):
                j = i + 1
                while j < len(cmd):
                    a = cmd[j]
                    if a in ("-r", "--requirement") and j + 1 < len(cmd) and read is not None:
                        text = read(cmd[j + 1]) or ""
                        found += [ln.split("#", 1)[0].strip() for ln in text.splitlines()[:MAX_REQUIREMENTS]]
                    if a in _VALUED:
                        j += 2
                        continue
                    if not a.startswith("-"):
                        found.append(a)
                    j += 1
    out: list[str] = []
    for spec in (f.strip() for f in found):
        if _SPEC.match(spec) and spec not in out:
            out.append(spec)
    return out[:MAX_REQUIREMENTS]


def epilogue(dockerfile: str) -> str:
    """Dockerfile lines, appended to ``dockerfile``, that download the requirements as wheels
    (as root, then back to the last stage's USER; nothing happens where the tools are absent)."""
    from harness.sandbox.dockerfile import logical_lines

    user = None
    for ln in logical_lines(dockerfile):
        op, _, rest = ln.text.strip().partition(" ")
        if op.upper() == "FROM":
            user = None
        elif op.upper() == "USER":
            user = rest.strip()
    lines = ["USER root"] if user else []
    lines += [f"COPY {REQUIREMENTS_FILE} /usr/local/share/harness-build/verifier-requirements.txt",
              "RUN if command -v harness-uv-prewarm >/dev/null 2>&1; then "
              "HARNESS_BUILD=1 harness-uv-prewarm /usr/local/share/harness-build/verifier-requirements.txt; fi"]
    if user:
        lines.append(f"USER {user}")
    return "\n".join(lines) + "\n"
