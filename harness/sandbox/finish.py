"""Getting files out of a sandbox without trusting it.

A tree is kept with its own name as the top entry (``/work/app`` -> ``app/...``; a file as
itself), so it unpacks into the directory above it: that is how a separate verifier gets it.

Two ways, one result (:class:`~harness.sandbox.base.Exported`):

* **The finish program** (a read-only-root sandbox, whose ``python3 -I -S`` the agent cannot
  change): run in the sandbox once the agent is gone, it optionally runs a command first
  (the grader: its own session and wall clock, its output through pipes), then writes a tar
  stream of what is asked -- plain regular files (never through a link), whole trees as
  members (links kept as links, never followed) -- each within its cap, then a manifest.
* **The engine's archive API** (a writable-root sandbox, where the agent may have replaced
  any program): the engine itself reads the files; nothing runs in the sandbox.

Either way the controller never extracts anything: a file is copied to the destination
folder under the name the harness chose, a tree is re-packed member by member into
``NAME.tar`` (names and links kept as data, sizes within the cap).
"""

from __future__ import annotations

import json
import posixpath
import shutil
import tarfile
from pathlib import Path, PurePosixPath
from typing import IO, Any, Iterable, Iterator

from harness.model.sandbox import ExecResult
from harness.model.units import format_size
from harness.sandbox.base import Command, Exported, ExportFile

MANIFEST = ".harness-export.json"
CMD_OUT, CMD_ERR = ".harness-cmd-out", ".harness-cmd-err"
TREE_PREFIX = "tree/"
TREE_ENTRIES = 20_000  # members of one tree kept (the rest counted)

# The finish program, run as ``python3 -I -S -c FINISH SPEC`` by the workload's user.
FINISH = r"""
import io, json, os, runpy, select, signal, stat, subprocess, sys, tarfile, time
spec = json.loads(sys.argv[1])
out = tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT)
man = {}

def member(name, f, size, kind=tarfile.REGTYPE, link="", mode=0o644):
    ti = tarfile.TarInfo(name)
    ti.size = size if kind == tarfile.REGTYPE else 0
    ti.type = kind
    ti.linkname = link
    ti.mode = mode
    out.addfile(ti, f if kind == tarfile.REGTYPE else None)

def run(cmd, timeout, cap, env, cwd):
    # (exit status, timed out, stdout, stderr, bytes written to each): output through pipes,
    # the first cap + 1 bytes of each kept, the rest drained; the child is killed with its
    # whole session at the timeout. Nothing is written to disk (the agent may have filled it).
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    proc = None
    if cmd[:3] == ["python3", "-I", "-S"] and len(cmd) > 3 and cmd[3].endswith(".py") and not env:
        # a python program under the same flags as this one: fork and run it, instead of
        # paying for a second interpreter start
        pid = os.fork()
        if pid == 0:
            os.setsid()
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for fd in (out_r, err_r, out_w, err_w):
                os.close(fd)
            sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb"), write_through=True)
            sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb"), write_through=True)
            sys.argv = cmd[3:]
            code = 0
            try:
                runpy.run_path(cmd[3], run_name="__main__")
            except SystemExit as x:
                code = x.code if isinstance(x.code, int) else (0 if x.code is None else 1)
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 70
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    else:
        # the Popen object is kept: dropped, its finalizer reaps a child that already exited
        # (a quick one, on a host that stalled us), and pidfd_open below found no such process
        proc = subprocess.Popen(cmd, stdout=out_w, stderr=err_w, stdin=subprocess.DEVNULL, cwd=cwd,
                                env=dict(os.environ, **env) if env else None, start_new_session=True)
        pid = proc.pid
    os.close(out_w)
    os.close(err_w)
    pidfd = os.pidfd_open(pid)
    bufs, counts, open_fds = {out_r: bytearray(), err_r: bytearray()}, {out_r: 0, err_r: 0}, {out_r, err_r}
    deadline, timed_out, exited = time.monotonic() + timeout, False, False
    while open_fds or not exited:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            os.killpg(pid, signal.SIGKILL)
            break
        ready, _, _ = select.select(list(open_fds) + ([] if exited else [pidfd]), [], [], left)
        for fd in ready:
            if fd == pidfd:
                exited = True
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.discard(fd)
                continue
            counts[fd] += len(chunk)
            room = cap + 1 - len(bufs[fd])
            if room > 0:
                bufs[fd] += chunk[:room]
    rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if proc is not None:
        proc.returncode = rc  # reaped here: its finalizer has nothing left to wait for
    for fd in (out_r, err_r, pidfd):
        os.close(fd)
    return rc, timed_out, bytes(bufs[out_r]), bytes(bufs[err_r]), counts[out_r], counts[err_r]

def refuse(name, why, size=None):
    man[name] = {"refused": why} if size is None else {"refused": why, "size": size}

def one_file(name, path, cap, keep):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        return refuse(name, "cannot stat: " + (e.strerror or str(e)))
    if not stat.S_ISREG(st.st_mode):
        return refuse(name, "not a regular file")
    if st.st_size > cap and not keep:
        return refuse(name, "over the cap", st.st_size)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        return refuse(name, "cannot open: " + (e.strerror or str(e)))
    with os.fdopen(fd, "rb") as f:
        member(name, f, min(st.st_size, cap))
    man[name] = {"size": st.st_size, "kept": min(st.st_size, cap)}

def tree(name, root, cap, limit):
    # every entry under root, depth first, never following a link: directories, regular
    # files (while the cap lasts), links as links; anything else is counted, not kept
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        return refuse(name, "not a directory")
    info = {"entries": 1, "bytes": 0, "omitted": 0, "special": 0}
    base = os.path.basename(root.rstrip("/")) or "root"
    member("tree/" + name + "/" + base, None, 0, tarfile.DIRTYPE, mode=stat.S_IMODE(st.st_mode))
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            entries = sorted(os.scandir(os.path.join(root, rel) if rel else root), key=lambda e: e.name)
        except OSError:
            info["omitted"] += 1
            continue
        for e in entries:
            r = rel + "/" + e.name if rel else e.name
            if info["entries"] >= limit:
                info["omitted"] += 1
                continue
            try:
                est = e.stat(follow_symlinks=False)
            except OSError:
                info["omitted"] += 1
                continue
            mode = stat.S_IMODE(est.st_mode)
            arc = "tree/" + name + "/" + base + "/" + r
            if stat.S_ISDIR(est.st_mode):
                member(arc, None, 0, tarfile.DIRTYPE, mode=mode)
                stack.append(r)
            elif stat.S_ISLNK(est.st_mode):
                try:
                    member(arc, None, 0, tarfile.SYMTYPE, os.readlink(e.path), mode)
                except OSError:
                    info["omitted"] += 1
                    continue
            elif stat.S_ISREG(est.st_mode):
                if info["bytes"] + est.st_size > cap:
                    info["omitted"] += 1
                    continue
                try:
                    fd = os.open(e.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                except OSError:
                    info["omitted"] += 1
                    continue
                with os.fdopen(fd, "rb") as f:
                    member(arc, f, est.st_size, mode=mode)
                info["bytes"] += est.st_size
            else:
                info["special"] += 1
                continue
            info["entries"] += 1
    man[name] = info

cmd = spec.get("cmd")
unreset = []
for p in spec.get("reset", []) if cmd else []:
    # the agent may have taken its own permissions away (chmod 555, 444): give them back first
    subprocess.run(["chmod", "u+rwx", "--", os.path.dirname(p) or "/"], stderr=subprocess.DEVNULL)
    subprocess.run(["chmod", "-R", "u+rwX", "--", p], stderr=subprocess.DEVNULL)
    # what the agent left there is evidence: moved aside (and exported when asked), not deleted
    kept = p.rstrip("/") + ".before-grading"
    subprocess.run(["rm", "-rf", "--", kept], stderr=subprocess.DEVNULL)
    try:
        os.rename(p, kept)
    except OSError:
        pass
    subprocess.run(["rm", "-rf", "--", p], stderr=subprocess.DEVNULL)
    try:
        os.makedirs(p, exist_ok=True)
        clean = os.path.isdir(p) and not os.path.islink(p) and not os.listdir(p)
    except OSError:
        clean = False
    if not clean:
        unreset.append(p)
if unreset:
    # a directory that could not be emptied may hold what the agent wrote there: the command
    # does not run and nothing under it is read
    man[".reset-failed"] = unreset
    cmd = None
    spec["files"] = [f for f in spec["files"] if not any(f[1] == p or f[1].startswith(p.rstrip("/") + "/") for p in unreset)]
if cmd:
    t0 = time.monotonic()
    rc, to, o, e, no, ne = run(cmd, spec["timeout"], spec["cap"], spec.get("env"), spec.get("cwd") or "/tmp")
    if spec.get("kill_after"):
        # whatever the command left running (as this user) must not touch what is read next
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
    man[".command"] = {"exit_code": 128 - rc if rc < 0 else rc, "timed_out": to, "wall_s": round(time.monotonic() - t0, 4),
                       "out_bytes": no, "err_bytes": ne}
    member(".harness-cmd-out", io.BytesIO(o), len(o))
    member(".harness-cmd-err", io.BytesIO(e), len(e))
for name, path, cap, keep, is_tree in spec["files"]:
    if is_tree:
        tree(name, path, cap, spec.get("tree_entries", 20000))
    else:
        one_file(name, path, cap, keep)
data = json.dumps(man).encode()
member(".harness-export.json", io.BytesIO(data), len(data))
out.close()
"""


def finish_spec(files: list[ExportFile], workdir: str, then: Command | None, reset: list[str] | None = None,
                env: dict[str, str] | None = None, cwd: str | None = None, kill_after: bool = False) -> dict[str, Any]:
    """The JSON argument of the finish program."""
    prog: dict[str, Any] = {
        "files": [[f.name, f.path or f"{workdir}/{f.name}", int(f.cap), bool(f.keep_head), bool(f.tree)] for f in files],
        "tree_entries": TREE_ENTRIES,
    }
    if then is not None:
        prog.update(cmd=then.cmd, timeout=then.timeout, cap=then.cap, reset=list(reset or []), env=dict(env or {}),
                    cwd=cwd, kill_after=kill_after)
    return prog


def check_names(files: Iterable[ExportFile]) -> list[ExportFile]:
    out = list(files)
    for f in out:
        if "/" in f.name or f.name.startswith(".") or not f.name:
            raise ValueError(f"export name {f.name!r} must be a plain file name")
    return out


def stream_limit(files: list[ExportFile], then: Command | None) -> int:
    """The most bytes an export stream may carry: members, tar headers and the manifest."""
    per_tree_headers = TREE_ENTRIES * 1536
    return sum(f.cap + (per_tree_headers if f.tree else 0) for f in files) + 2 * (then.cap if then else 0) + 1024 * 1024


class TreeWriter:
    """Re-packs the members of exported trees into ``DEST/NAME.tar`` without extracting them:
    directories, regular files and symbolic links only, names normalised, each tree within
    its byte cap and entry limit."""

    def __init__(self, dest: Path, caps: dict[str, int]):
        self.dest = dest
        self.caps = caps
        self.out: dict[str, tarfile.TarFile] = {}
        self.used: dict[str, int] = {}
        self.entries: dict[str, int] = {}
        self.dropped: dict[str, int] = {}

    def add(self, name: str, rel: str, m: tarfile.TarInfo, f: IO[bytes] | None) -> None:
        rel = PurePosixPath("/" + rel).as_posix().lstrip("/")  # no '..' survives: names are data, never host paths
        if not rel or not (m.isdir() or m.isreg() or m.issym()):
            self.dropped[name] = self.dropped.get(name, 0) + 1
            return
        size = m.size if m.isreg() else 0
        if self.used.get(name, 0) + size > self.caps[name] or self.entries.get(name, 0) >= TREE_ENTRIES:
            self.dropped[name] = self.dropped.get(name, 0) + 1
            return
        if name not in self.out:
            self.out[name] = tarfile.open(self.dest / f"{name}.tar", "w", format=tarfile.PAX_FORMAT)
        ti = tarfile.TarInfo(rel)
        ti.type, ti.size, ti.mode = m.type, size, m.mode & 0o7777
        ti.linkname = m.linkname if m.issym() else ""
        self.out[name].addfile(ti, f if m.isreg() else None)
        self.used[name] = self.used.get(name, 0) + size
        self.entries[name] = self.entries.get(name, 0) + 1

    def close(self) -> dict[str, int]:
        for tf in self.out.values():
            tf.close()
        return {n: self.used.get(n, 0) for n in self.out}


def read_finish_stream(sink: IO[bytes], files: list[ExportFile], dest: Path, then: Command | None, res: ExecResult,
                       problems: list[str]) -> Exported:
    """Turn the finish program's tar stream (spooled in ``sink``) into an :class:`Exported`."""
    caps = {f.name: f.cap for f in files if not f.tree}
    tree_caps = {f.name: f.cap for f in files if f.tree}
    trees = TreeWriter(dest, tree_caps)
    kept: dict[str, int] = {}
    cmd_out: dict[str, bytes] = {}
    manifest: dict[str, Any] = {}
    complete = False
    cmd_cap = then.cap if then else 0
    sink.seek(0)
    try:
        with tarfile.open(fileobj=sink, mode="r|") as tf:
            for m in tf:
                if m.name.startswith(TREE_PREFIX):
                    name, _, rel = m.name[len(TREE_PREFIX):].partition("/")
                    if name in tree_caps:
                        trees.add(name, rel, m, tf.extractfile(m) if m.isreg() else None)
                    else:
                        problems.append(f"refused unexpected member {m.name[:100]!r}")
                    continue
                if not m.isreg():
                    problems.append(f"refused {m.name[:100]!r}: not a regular file")
                    continue
                if m.name == MANIFEST and m.size <= 64 * 1024:
                    f = tf.extractfile(m)
                    manifest = json.loads(f.read()) if f else {}
                    complete = True
                    continue
                if m.name in (CMD_OUT, CMD_ERR) and then is not None and m.size <= cmd_cap + 1:
                    f = tf.extractfile(m)
                    cmd_out[m.name[-3:]] = f.read() if f else b""
                    continue
                if m.name not in caps:
                    problems.append(f"refused unexpected member {m.name[:100]!r}")
                    continue
                if m.size > caps[m.name]:
                    problems.append(f"refused {m.name!r}: {format_size(m.size)} over the cap")
                    continue
                _copy_member(tf.extractfile(m), dest / m.name, m.name, kept, m.size, problems)
    except (tarfile.TarError, ValueError, OSError) as e:
        problems.append(f"malformed export stream ({e}; exit {res.exit_code}: {res.stderr.strip()[-200:]})")
    finally:
        kept.update(trees.close())
    manifest = manifest if isinstance(manifest, dict) else {}
    truncated = _manifest_problems(manifest, caps, tree_caps, problems)
    for name, n in trees.dropped.items():
        problems.append(f"{n} entr{'y' if n == 1 else 'ies'} of {name!r} not kept (links out, devices, or over the cap)")
    command = command_result(then, manifest.get(".command"), cmd_out, res) if then is not None else None
    unreset = manifest.get(".reset-failed")
    if isinstance(unreset, list) and unreset and then is not None:
        why = f"could not empty {', '.join(str(p)[:100] for p in unreset[:3])} (the agent's permissions or files): the command did not run"
        problems.append(why)
        command = ExecResult(cmd=then.cmd, exit_code=None, timed_out=False, wall_s=0.0, stderr=why)
    if res.exit_code not in (0, None) and not res.timed_out and not problems and command is None:
        problems.append(f"export failed (exit {res.exit_code}): {res.stderr.strip()[-200:]}")
    return Exported(files=kept, problems=problems, truncated=truncated, command=command, complete=complete)


def _copy_member(f: IO[bytes] | None, path: Path, name: str, kept: dict[str, int], size: int, problems: list[str]) -> None:
    try:
        with open(path, "wb") as out:
            if f is not None:
                shutil.copyfileobj(f, out, 1024 * 1024)
        kept[name] = size
    except OSError as e:
        problems.append(f"could not keep {name!r}: {e.strerror or e}")


def _manifest_problems(manifest: dict[str, Any], caps: dict[str, int], tree_caps: dict[str, int], problems: list[str]) -> list[str]:
    truncated = []
    for name, info in manifest.items():
        if not isinstance(info, dict) or (name not in caps and name not in tree_caps):
            continue
        if "refused" in info:
            size = f" ({format_size(info['size'])})" if isinstance(info.get("size"), int) else ""
            problems.append(f"refused {name!r}: {info['refused']}{size}"[:300])
        elif name in tree_caps:
            omitted, special = info.get("omitted"), info.get("special")
            if isinstance(omitted, int) and omitted:
                truncated.append(name)
                problems.append(f"{omitted} entr{'y' if omitted == 1 else 'ies'} of {name!r} not kept (over {format_size(tree_caps[name])} "
                                "or unreadable)")
            if isinstance(special, int) and special:
                problems.append(f"{special} special file(s) (devices, FIFOs, sockets) in {name!r} not kept")
        elif isinstance(info.get("size"), int) and isinstance(info.get("kept"), int) and info["kept"] < info["size"]:
            truncated.append(name)
            problems.append(f"kept the first {format_size(info['kept'])} of {name!r} ({format_size(info['size'])})")
    return truncated


def command_result(then: Command, info: Any, out: dict[str, bytes], res: ExecResult) -> ExecResult:
    """The ``then`` command's result as the finish program reported it; when the program
    itself did not get that far (killed), what the exec says."""
    if not isinstance(info, dict) or not isinstance(info.get("exit_code"), int):
        return ExecResult(cmd=then.cmd, exit_code=res.exit_code if not res.timed_out else None, timed_out=res.timed_out,
                          wall_s=res.wall_s, stderr=res.stderr)

    def text(key: str) -> tuple[str, bool]:
        b = out.get(key, b"")
        return b[: then.cap].decode("utf-8", errors="replace"), len(b) > then.cap

    o, o_tr = text("out")
    e, e_tr = text("err")
    return ExecResult(cmd=then.cmd, exit_code=info["exit_code"], timed_out=bool(info.get("timed_out")),
                      wall_s=max(0.0, float(info.get("wall_s") or 0.0)), stdout=o, stderr=e,
                      stdout_bytes=int(info.get("out_bytes") or 0), stderr_bytes=int(info.get("err_bytes") or 0),
                      stdout_truncated=o_tr, stderr_truncated=e_tr)


def read_archive(chunks: Iterator[bytes], f: ExportFile, dest: Path, problems: list[str], kept: dict[str, int],
                 truncated: list[str], spool_cap: int) -> None:
    """One path out of the engine's archive API (a tar whose top entry is the path's last
    component): a regular file copied under ``f.name``, a tree re-packed into ``NAME.tar``."""
    import tempfile

    with tempfile.SpooledTemporaryFile(max_size=1024 * 1024, prefix="harness-archive-") as sink:
        over = False
        for chunk in chunks:
            if sink.tell() + len(chunk) > spool_cap:
                over = True
                break
            sink.write(chunk)
        sink.seek(0)
        trees = TreeWriter(dest, {f.name: f.cap}) if f.tree else None
        try:
            with tarfile.open(fileobj=sink, mode="r|") as tf:
                for m in tf:
                    top, _, rel = m.name.partition("/")
                    if trees is not None:
                        trees.add(f.name, m.name, m, tf.extractfile(m) if m.isreg() else None)
                        continue
                    if rel:
                        continue
                    if not m.isreg():
                        problems.append(f"refused {f.name!r}: not a regular file")
                    elif m.size > f.cap and not f.keep_head:
                        problems.append(f"refused {f.name!r}: {format_size(m.size)} over the cap")
                    else:
                        src = tf.extractfile(m)
                        n = min(m.size, f.cap)
                        try:
                            with open(dest / f.name, "wb") as out:
                                if src is not None:
                                    out.write(src.read(n))
                            kept[f.name] = n
                            if n < m.size:
                                truncated.append(f.name)
                                problems.append(f"kept the first {format_size(n)} of {f.name!r} ({format_size(m.size)})")
                        except OSError as e:
                            problems.append(f"could not keep {f.name!r}: {e.strerror or e}")
                    break
        except (tarfile.TarError, ValueError, OSError) as e:
            if not over:
                problems.append(f"malformed archive of {f.name!r} ({e})")
        if trees is not None:
            kept.update(trees.close())
            if trees.dropped.get(f.name) or over:
                truncated.append(f.name)
                problems.append(f"entries of {f.name!r} not kept (links out, devices, or over {format_size(f.cap)})")


def without_outward_links(src: Path, dst: Path) -> list[str]:
    """Copy the tar ``src`` to ``dst`` without the links that point outside it (absolute, or
    up past its top): carried into a separate verifier, such a link would make the verifier
    read its own files (/tests/expected.txt) as the agent's. Returns the dropped names."""
    dropped: list[str] = []
    with tarfile.open(src) as tin, tarfile.open(dst, "w") as tout:
        for m in tin:
            if m.issym() or m.islnk():
                base = posixpath.dirname(m.name) if m.issym() else ""
                target = posixpath.normpath(posixpath.join(base, m.linkname))
                if m.linkname.startswith("/") or target == ".." or target.startswith("../"):
                    dropped.append(m.name)
                    continue
            tout.addfile(m, tin.extractfile(m) if m.isfile() else None)
    return dropped
