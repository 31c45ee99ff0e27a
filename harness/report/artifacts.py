"""Reading an attempt's artifact files (stdout, stderr, transcript, grader and verifier
output) for `harness show` and the HTML report's failure review.

These files are agent-controlled bytes. They are only ever read as capped text: at most
``cap`` bytes of a file, whatever its size, decoded with replacement characters; never
parsed here (a transcript's JSON lines are parsed by the report page's own script, in the
browser). Only regular files are opened, without following a symlink.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.report.views import printable, tail_text

TRANSCRIPT = "transcript.jsonl"
ARTIFACT_FILES = ("stdout.txt", "stderr.txt", TRANSCRIPT, "grade-stderr.txt", "verifier-stdout.txt", "verifier-stderr.txt")
OPTIONAL_FILES = ("grade-stderr.txt", "verifier-stdout.txt", "verifier-stderr.txt")  # shown only when present
SHOW_READ_BYTES = 64 * 1024  # what `harness show` reads of the end of each file


@dataclass(frozen=True)
class Capped:
    """At most ``cap`` bytes of a file: its first bytes (``head``) and its last (``tail``),
    ``omitted`` bytes between them left out (0: the whole file is here, in ``head``)."""

    head: str
    tail: str
    size: int
    omitted: int

    @property
    def truncated(self) -> bool:
        return self.omitted > 0

    @property
    def kept(self) -> int:
        return self.size - self.omitted

    def as_dict(self) -> dict[str, Any]:
        return {"head": self.head, "tail": self.tail, "size": self.size, "omitted": self.omitted}


def _open_regular(path: Path) -> int | None:
    """A read-only descriptor of a regular file (no symlink followed, a FIFO never waited
    on), or None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _decode(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def read_capped(path: Path, cap: int, head_share: float = 0.0, controls: bool = False) -> Capped | None:
    """At most ``cap`` bytes of the file at ``path`` (None when it is absent or not a
    regular file). A longer file keeps ``head_share`` of the cap from its start and the rest
    from its end, each cut at a line boundary where that keeps at least half of it, so a
    JSON-lines file loses whole lines, and a line longer than that is cut inside rather than
    dropped (the page shows its parts as lines that are not JSON). ``controls=False``
    replaces control characters (escape sequences) as the terminal views do; a transcript
    keeps them (the page shows text, never markup)."""
    fd = _open_regular(path)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        if size <= cap:
            head_b, tail_b = os.pread(fd, cap, 0), b""
        else:
            h = max(0, min(cap, int(cap * head_share)))
            head_b = os.pread(fd, h, 0) if h else b""
            tail_b = os.pread(fd, cap - h, size - (cap - h)) if cap - h else b""
            # at a line boundary when that keeps at least half of the part: a line longer than
            # that (a big tool result) is cut inside, never dropped whole
            end = head_b.rfind(b"\n") + 1
            if end and end >= len(head_b) // 2:
                head_b = head_b[:end]
            start = tail_b.find(b"\n", 0, len(tail_b) - 1) + 1
            if start and start <= len(tail_b) // 2:
                tail_b = tail_b[start:]
    except OSError:
        return None
    finally:
        os.close(fd)
    size = max(size, len(head_b) + len(tail_b))
    fix = (lambda s: s) if controls else printable
    return Capped(head=fix(_decode(head_b)), tail=fix(_decode(tail_b)), size=size, omitted=size - len(head_b) - len(tail_b))


def read_artifacts(path: str) -> dict[str, Any]:
    """What `harness show` prints of an attempt's artifacts: the tail of each file (None =
    absent) and which files the folder holds."""
    base = Path(path) if path else None
    out: dict[str, Any] = {"dir": path or None, "present": [], "tails": {}}
    for name in ARTIFACT_FILES:
        data, before = None, 0
        if base is not None:
            fd = _open_regular(base / name)
            if fd is not None:
                try:
                    size = os.fstat(fd).st_size
                    before = max(0, size - SHOW_READ_BYTES)
                    data = os.pread(fd, SHOW_READ_BYTES, before)
                except OSError:
                    data = None
                finally:
                    os.close(fd)
        out["tails"][name] = tail_text(data, before=before)
    if base is not None and base.is_dir():
        out["present"] = sorted(str(p) for p in base.iterdir() if p.is_file())
        grade = base / "grade"
        if grade.is_dir():
            out["present"] += sorted(str(p) for p in grade.iterdir() if p.is_file())
    return out
