"""The files grader program: runs INSIDE the attempt's sandbox, never in the controller.

Standard library only (``python3 -I -S files_grade.py SPEC.json``, after every agent process
is frozen and killed, under the profile's grade envelope). It walks the agent's final trees
at the declared paths -- untrusted data: never following a link, reading at most
``max_files`` entries and ``read_cap`` bytes of any one file -- compares them with the
fixture trees (tars the harness built from the suite: trusted) and prints one JSON verdict,
bounded in size by construction.

A task passes when every ``expect`` holds, every path matching an ``unchanged`` glob equals
the fixture, and every other change (a path added, removed or modified, a file type or mode
changed) is covered by an ``allow`` glob; anything else is an *extra effect*. A glob matches
a path or any of its parent directories (``/work/app/out`` covers everything below it); ``*``
stays within one path component, ``**`` crosses them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import sys
import tarfile
import traceback
from typing import Any

VERDICT_VERSION = 1
MAX_CHANGES_SHOWN = 200
MAX_LINES = 40
MAX_CHECKS = 200
EXIT_BROKEN = 70
READ_CAP = 16 * 1024 * 1024  # bytes of one file an expectation reads
_CONTROL = dict.fromkeys([*range(0, 9), *range(11, 32), *range(127, 160)], "\ufffd")


class Unreadable(Exception):
    """The final state cannot be read within the grader's limits (the message says why)."""


def clean(s: str, limit: int = 300) -> str:
    """A string as it may leave the sandbox: valid UTF-8, no control characters, short."""
    s = s.encode("utf-8", "surrogateescape").decode("utf-8", "replace").translate(_CONTROL)
    return s if len(s) <= limit else s[: limit - 1] + "…"


# --------------------------------------------------------------------------- trees


def _entry(kind: str, mode: int, size: int = 0, digest: str | None = None, link: str | None = None) -> dict[str, Any]:
    return {"kind": kind, "mode": mode & 0o7777, "size": size, "digest": digest, "link": link}


def read_fixture(tar_path: str, root: str) -> dict[str, dict[str, Any]]:
    """absolute path -> entry, for a fixture tar (built by the harness: trusted)."""
    out: dict[str, dict[str, Any]] = {root: _entry("dir", 0o755)}
    with tarfile.open(tar_path, "r") as tf:
        for m in tf:
            path = root + "/" + m.name.strip("/")
            if m.isdir():
                out[path] = _entry("dir", m.mode)
            elif m.isfile():
                f = tf.extractfile(m)
                data = f.read() if f else b""
                out[path] = _entry("file", m.mode, len(data), hashlib.sha256(data).hexdigest())
            elif m.issym():
                out[path] = _entry("link", 0o777, link=m.linkname)
    return out


def _digest(path: str) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        while True:
            chunk = f.read(1024 * 1024)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def read_final(root: str, limit: int) -> dict[str, dict[str, Any]]:
    """absolute path -> entry, walking the agent's tree without following links."""
    out: dict[str, dict[str, Any]] = {}
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return out
    if not stat.S_ISDIR(st.st_mode):
        raise Unreadable(f"{root} is not a directory any more")
    out[root] = _entry("dir", st.st_mode)
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            it = list(os.scandir(d))
        except OSError as e:
            raise Unreadable(f"cannot list {clean(d)}: {e.strerror or e}") from None
        for e in it:
            if len(out) >= limit:
                raise Unreadable(f"more than {limit} entries under {root} (the task reads at most {limit}; max_files)")
            est = e.stat(follow_symlinks=False)
            if stat.S_ISDIR(est.st_mode):
                out[e.path] = _entry("dir", est.st_mode)
                stack.append(e.path)
            elif stat.S_ISLNK(est.st_mode):
                out[e.path] = _entry("link", 0o777, link=os.readlink(e.path))
            elif stat.S_ISREG(est.st_mode):
                try:
                    out[e.path] = _entry("file", est.st_mode, est.st_size, _digest(e.path))
                except OSError as err:
                    raise Unreadable(f"cannot read {clean(e.path)}: {err.strerror or err}") from None
            else:
                out[e.path] = _entry("special", est.st_mode)
    return out


# --------------------------------------------------------------------------- globs


def glob_regex(pattern: str) -> re.Pattern:
    """``*`` within a component, ``**`` across components, ``?`` one character."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        out.append("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c))
        i += 1
    return re.compile("".join(out))


def covered(path: str, globs: list[re.Pattern]) -> bool:
    """A glob matches the path or one of its parent directories."""
    p = path
    while True:
        if any(g.fullmatch(p) for g in globs):
            return True
        if p in ("", "/") or "/" not in p:
            return False
        p = p.rsplit("/", 1)[0] or "/"


# --------------------------------------------------------------------------- diff


def _describe(a: dict[str, Any] | None, b: dict[str, Any] | None) -> tuple[str, str | None]:
    if a is None:
        return "added", f"{b['kind']}" + (f", {b['size']} B" if b["kind"] == "file" else "")
    if b is None:
        return "removed", f"{a['kind']}" + (f", {a['size']} B" if a["kind"] == "file" else "")
    if a["kind"] != b["kind"]:
        return "type", f"{a['kind']} -> {b['kind']}"
    if a["kind"] == "link" and a["link"] != b["link"]:
        return "modified", clean(f"link {a['link']} -> {b['link']}", 200)
    if a["kind"] == "file" and a["digest"] != b["digest"]:
        return "modified", f"{a['size']} B -> {b['size']} B"
    return "mode", f"mode {a['mode']:o} -> {b['mode']:o}"


def diff_trees(fx: dict[str, dict[str, Any]], fin: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every path whose entry differs, sorted; a directory only counts when its mode or type
    changed, or when it was added or removed empty (its contents tell the rest)."""
    out = []
    for path in sorted(set(fx) | set(fin)):
        a, b = fx.get(path), fin.get(path)
        if a == b:
            continue
        if (a is None or b is None) and (a or b)["kind"] == "dir":
            side = fin if b is not None else fx
            if any(p.startswith(path + "/") for p in side):
                continue
        change, detail = _describe(a, b)
        out.append({"path": clean(path, 1000), "raw": path, "change": change, "detail": detail})
    return out


def _line(c: dict[str, Any]) -> str:
    # a path with a newline, a control or a space at its edge is quoted (JSON-escaped), so that
    # no name an agent chose can pass for another line of the diff or end where it does not
    p = c.get("raw", c["path"])  # the name as it is: two names differing in a control stay two
    p = p if p.isprintable() and p == p.strip() else json.dumps(p, ensure_ascii=False)
    return f"{p} {c['change'] if c['change'] != 'type' else 'changed type'}" + (f" ({c['detail']})" if c["detail"] else "")


# --------------------------------------------------------------------------- expectations


def _read_text(path: str) -> str:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("is not a regular file" if not stat.S_ISLNK(st.st_mode) else "is a link (links are never followed)")
    if st.st_size > READ_CAP:
        raise ValueError(f"is {st.st_size} bytes, more than the {READ_CAP} an expectation reads")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        data = f.read(READ_CAP + 1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("is not UTF-8 text") from None


_KEY = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def key_path(doc: Any, path: str) -> tuple[bool, Any]:
    """(found, value) at 'a.b[0].c' in a parsed document."""
    cur = doc
    for name, index in _KEY.findall(path):
        if name:
            if not isinstance(cur, dict) or name not in cur:
                return False, None
            cur = cur[name]
        else:
            i = int(index)
            if not isinstance(cur, list) or i >= len(cur):
                return False, None
            cur = cur[i]
    return True, cur


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b if not isinstance(a, (list, dict)) else a == b


def _short(v: Any) -> str:
    return clean(json.dumps(v, ensure_ascii=False, default=str), 80)


def through_link(path: str, roots: list[str]) -> str | None:
    """The first directory between a state root and ``path`` that is a link (never followed:
    a path through it would be graded on whatever the link points at, outside the tree)."""
    root = max((r for r in roots if path == r or path.startswith(r.rstrip("/") + "/")), key=len, default=None)
    if root is None:
        return None
    cur = root
    for part in path[len(root):].strip("/").split("/")[:-1]:
        cur = f"{cur.rstrip('/')}/{part}"
        try:
            if stat.S_ISLNK(os.lstat(cur).st_mode):
                return cur
        except OSError:
            return None
    return None


def check_expectation(exp: dict[str, Any], roots: list[str] | None = None) -> tuple[bool, str | None]:
    """Evaluate one expectation on the final tree; (passed, detail)."""
    path, label = exp["path"], exp.get("name") or exp["path"]
    keyed = exp.get("json") if exp.get("json") is not None else exp.get("toml")
    link = through_link(path, roots or [])
    if link is not None:
        return False, clean(f"{label}: {path} goes through {link}, which is a link (links are never followed)")
    if exp.get("exists") is not None and keyed is None:
        there = os.path.lexists(path)
        if there == exp["exists"]:
            return True, None
        return False, clean(f"{label}: {path} {'is missing' if exp['exists'] else 'exists but must not'}")
    if not os.path.lexists(path):
        return False, clean(f"{label}: {path} is missing")
    try:
        text = _read_text(path)
    except (ValueError, OSError) as e:
        return False, clean(f"{label}: {path} {e}")
    if keyed is not None:
        try:
            if exp.get("json") is not None:
                doc = json.loads(text)
            else:
                import tomllib
                doc = tomllib.loads(text)
        except (ValueError, RecursionError) as e:
            return False, clean(f"{label}: {path} is not valid {'JSON' if exp.get('json') is not None else 'TOML'}: {e}")
        found, value = key_path(doc, keyed)
        if exp.get("exists") is not None:
            if found == exp["exists"]:
                return True, None
            return False, clean(f"{label}: {keyed} {'is missing' if exp['exists'] else 'is present'} in {path}")
        if not found:
            return False, clean(f"{label}: {keyed} is missing in {path}")
        if same_value(value, exp["equals"]):
            return True, None
        return False, clean(f"{label}: {keyed} is {_short(value)}, expected {_short(exp['equals'])}")
    if exp.get("equals") is not None:
        if text == exp["equals"]:
            return True, None
        return False, clean(f"{label}: {path} content differs (expected {len(exp['equals'])} chars, found {len(text)}: {_short(text[:60])})")
    if exp.get("contains") is not None:
        want = exp["contains"] if isinstance(exp["contains"], list) else [exp["contains"]]
        missing = [w for w in want if w not in text]
        if not missing:
            return True, None
        return False, clean(f"{label}: {path} does not contain {_short(missing[0])}")
    if re.search(exp["matches"], text, re.MULTILINE):
        return True, None
    return False, clean(f"{label}: {path} has no match for /{exp['matches']}/")


# --------------------------------------------------------------------------- grading


def _check(name: str, kind: str, passed: bool, detail: str | None = None) -> dict[str, Any]:
    return {"name": clean(name, 200), "kind": kind, "passed": passed, "detail": None if detail is None else clean(detail, 500)}


def _verdict(status: str, passed: bool, reason: str | None, checks: list[dict], changes: list[dict] | None) -> dict[str, Any]:
    files = None
    if changes is not None:
        lines = [_line(c) for c in changes]
        files = {
            "changes": [{k: c[k] for k in ("path", "change", "detail")} for c in changes[:MAX_CHANGES_SHOWN]],
            "total": len(changes), "truncated": len(changes) > MAX_CHANGES_SHOWN, "lines": [clean(x) for x in lines[:MAX_LINES]],
        }
    return {"version": VERDICT_VERSION, "status": status, "passed": passed, "reason": None if reason is None else clean(reason, 500),
            "checks": checks[:MAX_CHECKS], "checks_total": len(checks), "diff": None, "files": files}


def ungradable(reason: str) -> dict[str, Any]:
    detail = clean(reason)
    return _verdict("ungradable", False, detail, [_check("readable final state", "state", False, detail)], None)


def grade(spec: dict[str, Any]) -> dict[str, Any]:
    """The verdict on the final trees (see the module docstring); never raises for anything the
    agent left (raises only when its own spec or fixture cannot be read)."""
    fx: dict[str, dict[str, Any]] = {}
    for root, tar_path in spec["paths"].items():
        fx.update(read_fixture(tar_path, root) if tar_path else {root: _entry("dir", 0o755)})
    try:
        return _grade_final(spec, fx)
    except (MemoryError, RecursionError) as e:
        return ungradable(f"the final state cannot be read within the grade envelope ({type(e).__name__})")
    except Exception as e:  # noqa: BLE001 - whatever broke on the agent's trees is theirs: graded, never a discard
        traceback.print_exc(limit=4, file=sys.stderr)
        return ungradable(f"the grader could not read the final state ({type(e).__name__}: {clean(str(e), 160)})")


def _grade_final(spec: dict[str, Any], fx: dict[str, dict[str, Any]]) -> dict[str, Any]:
    fin: dict[str, dict[str, Any]] = {}
    try:
        for root in spec["paths"]:
            fin.update(read_final(root, spec.get("max_files", 10000)))
    except Unreadable as e:
        return ungradable(str(e))
    changes = diff_trees(fx, fin)
    checks = []
    for exp in spec.get("expect") or []:
        ok, detail = check_expectation(exp, list(spec["paths"]))
        checks.append(_check(exp.get("name") or exp["label"], "expect", ok, detail))
    unchanged = [(g, glob_regex(g)) for g in spec.get("unchanged") or []]
    for g, rx in unchanged:
        bad = [c for c in changes if covered(c["raw"], [rx])]
        checks.append(_check(f"unchanged: {g}", "unchanged", not bad,
                             clean(f"{_line(bad[0])} but must be unchanged" + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))
                             if bad else None))
    allow = [glob_regex(g) for g in spec.get("allow") or []]
    frozen = [rx for _, rx in unchanged]
    extra = [c for c in changes if not covered(c["raw"], allow) and not covered(c["raw"], frozen)]
    more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
    checks.append(_check("no extra effects", "extra_effects", not extra, clean(f"extra effect: {_line(extra[0])}{more}") if extra else None))
    failed = next((c for c in checks if not c["passed"]), None)
    return _verdict("graded", failed is None, failed["detail"] if failed else None, checks, changes)


def main(argv: list[str]) -> int:
    """``files_grade.py SPEC.json``: one verdict to stdout."""
    try:
        with open(argv[1], encoding="utf-8") as f:
            spec = json.load(f)
        verdict = grade(spec)
    except MemoryError:
        verdict = ungradable("the final state cannot be read within the grade envelope (MemoryError)")
    except Exception:  # the grader broke on something it trusts (its spec, the fixture): not the agent's doing
        traceback.print_exc(limit=4, file=sys.stderr)
        return EXIT_BROKEN
    text = json.dumps(verdict, separators=(",", ":"), ensure_ascii=False)
    sys.stdout.write(text.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
