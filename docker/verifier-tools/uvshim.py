#!/usr/bin/python3 -I
"""harness: `uv` / `uvx` for verifiers that install their tools at test time.

Harbor verifiers commonly run `curl -LsSf https://astral.sh/uv/.../install.sh | sh`, then
`uvx -p 3.13 -w pytest==8.4.1 ... pytest`. Offline neither the installer nor a managed
Python 3.13 can be fetched. This image has uv preinstalled (from PyPI, at image build) and
the packages a task's verifier names downloaded as wheels into /opt/harness/wheels (root's,
read-only) at the task's build, so here `-p/--python X` is replaced by the image's python3
(said on stderr, kept in the verifier's output), and when PyPI cannot be reached uv runs
offline from those wheels only.
"""
import os
import socket
import subprocess
import sys

REAL = "/usr/local/lib/harness-uv/bin/"
SYSTEM_PYTHON = "/usr/bin/python3"
WHEELS = "/opt/harness/wheels"
# uv / uvx options that take a value (so the tool name after them is found)
VALUED = {"-w", "--with", "--from", "--with-editable", "--with-requirements", "--index", "--index-url", "--default-index",
          "--extra-index-url", "-f", "--find-links", "--cache-dir", "--directory", "--project", "--config-file", "-c",
          "--constraints", "--overrides", "-b", "--build-constraints", "-P", "--upgrade-package", "--reinstall-package",
          "--no-binary-package", "--no-build-package", "--index-strategy", "--keyring-provider", "--resolution", "--prerelease",
          "--exclude-newer", "--link-mode", "--color", "--python-platform", "--env-file", "--torch-backend", "-r",
          "--requirements", "--group", "--extra", "--package"}
PASSTHROUGH = {"run", "x", "tool"}  # after the tool / command name, arguments are the command's own


def strip_python(argv: list[str], stop_at_command: bool) -> tuple[list[str], str | None]:
    out, asked, i = [], None, 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            out += argv[i:]
            break
        if a in ("-p", "--python") and i + 1 < len(argv):
            asked, i = argv[i + 1], i + 2
            continue
        if a.startswith("--python="):
            asked, i = a.split("=", 1)[1], i + 1
            continue
        if a.startswith("-p") and not a.startswith("--") and len(a) > 2:
            asked, i = a[2:], i + 1
            continue
        out.append(a)
        if a in VALUED and i + 1 < len(argv):
            out.append(argv[i + 1])
            i += 2
            continue
        if stop_at_command and not a.startswith("-"):
            out += argv[i + 1:]
            break
        i += 1
    return out, asked


def online() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=2).close()
        return True
    except OSError:
        return False


def main() -> int:
    name = os.path.basename(sys.argv[0])
    tool = "uvx" if name == "uvx" else "uv"
    argv = sys.argv[1:]
    head = 0
    if tool == "uvx":
        argv, asked = strip_python(argv, stop_at_command=True)
    else:
        sub = [a for a in argv[:2] if not a.startswith("-")]
        head = 2 if sub[:2] in (["tool", "run"], ["pip", "install"]) else 1
        rest, asked = strip_python(argv[head:], stop_at_command=bool(sub) and sub[0] in PASSTHROUGH)
        argv = argv[:head] + rest
    env = dict(os.environ)
    env.setdefault("UV_PYTHON_DOWNLOADS", "never")
    env.setdefault("UV_PYTHON_PREFERENCE", "only-system")
    env.setdefault("UV_LINK_MODE", "copy")
    if os.path.isfile("/usr/local/share/harness-build/ca.pem"):
        env.setdefault("SSL_CERT_FILE", "/usr/local/share/harness-build/ca.pem")
    if asked is not None:
        version = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True).stdout.strip()
        print(f"harness: {tool} --python {asked}: using this image's {SYSTEM_PYTHON} ({version}) instead "
              "(no managed Python is fetched offline)", file=sys.stderr)
        argv = argv[:head] + ["--python", SYSTEM_PYTHON] + argv[head:]
    if not env.get("HARNESS_BUILD") and "UV_OFFLINE" not in env and not online():
        env["UV_OFFLINE"] = "1"
        if os.path.isdir(WHEELS):
            env.setdefault("UV_FIND_LINKS", WHEELS)
            env.setdefault("UV_NO_INDEX", "1")
    os.execve(REAL + tool, [REAL + tool, *argv], env)
    return 127


if __name__ == "__main__":
    sys.exit(main())
