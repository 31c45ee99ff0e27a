"""Units shared by every model: byte sizes and the one-line validation message format.

Pure: no I/O.
"""

from __future__ import annotations

import datetime as dt
import difflib
import gc
import re
from contextlib import contextmanager
from typing import Annotated, Any, Iterator, Literal, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Tag, ValidationError, WithJsonSchema, model_validator

MiB = 1024 * 1024
MEMORY_FLOOR = 16 * MiB  # below this the kernel and python3 itself do not fit

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": MiB, "g": 1024 * MiB, "t": 1024 * 1024 * MiB}


def parse_size(value: int | str) -> int:
    """Parse a byte size such as ``512m``, ``1GiB``, ``2g`` or an integer number of bytes."""
    if isinstance(value, bool):
        raise ValueError("expected a size like '512m' or '1g', got a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("size must be positive")
        return value
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a size; use e.g. '256m', '1g' or bytes as an integer")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_size(n: int | float | None) -> str:
    """Human-readable binary size (``256 MiB``)."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


ByteSize = Annotated[
    int,
    BeforeValidator(parse_size),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*[kmgtKMGT]?(i?[bB])?\s*$"},
            ],
            "description": "Bytes, or a size such as '512m', '1g', '64MiB'.",
        }
    ),
]


def _owner(model: Any, loc: tuple) -> Any:
    """The model class that holds the last key of ``loc`` (list indexes skipped; a union's tag,
    such as ``expectations`` or ``sql``, picks the member it names), or None."""
    cands: list[tuple[Any, set[str]]] = [(model, set())]
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        tagged = [(m, t) for m, t in cands if part in t]
        if tagged and not any(part in m.model_fields for m, _ in cands):
            cands = tagged
            continue
        nxt: list[tuple[Any, set[str]]] = []
        for m, _ in cands:
            field = m.model_fields.get(part)
            if field is not None:
                nxt += _members(field.annotation)
        if not nxt:
            return None
        cands = nxt
    return cands[0][0] if cands else None


def _members(annotation: Any, tags: frozenset[str] = frozenset()) -> list[tuple[Any, set[str]]]:
    """The model classes an annotation may hold, each with the tags that select it in a union
    (a ``Tag`` beside it, or the value of its one-valued ``Literal`` fields such as ``kind``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        own = {str(v) for f in annotation.model_fields.values() if get_origin(f.annotation) is Literal
               for v in get_args(f.annotation)[:1] if len(get_args(f.annotation)) == 1}
        return [(annotation, set(tags) | own)]
    args = get_args(annotation)
    if get_origin(annotation) is Annotated:
        return _members(args[0], tags | {m.tag for m in args[1:] if isinstance(m, Tag)})
    return [x for a in args for x in _members(a, tags)]


# discriminated unions put their tag in an error's location: state.<kind>.x, grader.<kind>.x, expect.0.<sql|file>.x
_UNION_TAGS = {"state": {"sqlite", "files", "postgres", "container"}, "grader": {"expectations", "verifier"}}
_EXPECT_TAGS = {"sql", "file"}
# the short form of a task: these keys were written at the top level
SHORT_FORM = {"grader.expect": "expect", "grader.allow": "allow", "grader.unchanged": "unchanged",
              "state.fixture_sql": "fixture_sql", "state.fixture": "fixture"}


def clean_loc(loc: tuple, short: set[str] | None = None) -> tuple:
    """An error location as the user wrote the key: union tags dropped, short-form keys restored."""
    out: list[Any] = []
    for i, part in enumerate(loc):
        prev = loc[i - 1] if i else None
        if isinstance(part, str) and prev in _UNION_TAGS and part in _UNION_TAGS[prev]:
            continue
        if isinstance(part, str) and part in _EXPECT_TAGS and isinstance(prev, int) and i >= 2 and loc[i - 2] in ("expect",):
            continue
        out.append(part)
    if short and len(out) >= 2:
        key = f"{out[0]}.{out[1]}"
        if key in SHORT_FORM and SHORT_FORM[key] in short:
            out = [SHORT_FORM[key], *out[2:]]
    return tuple(out)


# a key written as a value where TOML wants a list: the form it takes
LIST_HINTS = {
    "expect": "write each expectation as its own [[expect]] table, with two brackets",
    "agent_cmd": 'a list of words, e.g. agent_cmd = ["python3", "/opt/agent/main.py"]',
    "setup": 'a list of commands, each a list of words, e.g. setup = [["sh", "-c", "..."]]',
    "unchanged": 'a list of table names, e.g. unchanged = ["orders"]',
    "allow": 'a list, e.g. allow = ["refunds", "emails.body"]',
    "k": "a list, e.g. k = [1, 2, 4]",
    "state_sql": 'a list of files, e.g. state_sql = ["schema.sql"]',
    "tags": 'a list, e.g. tags = ["refund"]',
}


def closest(word: str, choices: Any) -> str | None:
    """The choice closest to a mistyped ``word``, or None when none is close."""
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(word: str, choices: Any) -> str:
    """' (did you mean 'x'?)' for the choice closest to a mistyped ``word``, or ''."""
    close = closest(word, choices)
    return f" (did you mean {close!r}?)" if close else ""


def format_validation_error(source: str, err: ValidationError, model: Any = None, short: set[str] | None = None) -> str:
    """One line per problem: ``file: key: message``; an unknown key gets a "did you mean"
    when ``model`` has a field close to it. ``short``: top-level keys of a task's short form.
    A required field reported missing beside an unknown key that suggests it (``quary`` for
    ``query``) is left out: the unknown key's line says what to fix."""
    lines: list[tuple[bool, str, tuple | None]] = []  # (not an unknown key, line, raw location of a missing field)
    suggested: set[tuple] = set()  # raw locations of the fields an unknown key's "did you mean" names
    for e in err.errors():
        raw = tuple(e["loc"])  # tags and long-form keys: what the models are walked by
        e = {**e, "loc": clean_loc(raw, short)}
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
            owner = _owner(model, raw) if model is not None else None
            top = list(model.model_fields) + list(getattr(model, "short_keys", ())) if model is not None else []
            key = str(e["loc"][-1])
            if len(e["loc"]) >= 3 and isinstance(e["loc"][-2], int) and key in top:
                msg += (f" (in TOML, keys written after a [[{e['loc'][-3]}]] table belong to it: move {key!r} above the "
                        f"first [[{e['loc'][-3]}]])")
            elif owner is not None:
                meant = closest(key, list(owner.model_fields) + list(getattr(owner, "short_keys", ())))
                if meant is not None:
                    msg += f" (did you mean {meant!r}?)"
                    suggested.add((*raw[:-1], meant))
        elif e["type"] == "list_type" and e["loc"] and str(e["loc"][-1]) in LIST_HINTS:
            msg += f" ({LIST_HINTS[str(e['loc'][-1])]})"
        line = f"{source}: {msg}" if not e["loc"] and re.match(r"^[\w.]+: ", msg) else f"{source}: {loc}: {msg}"
        lines.append((e["type"] != "extra_forbidden", line, raw if e["type"] == "missing" else None))
    # unknown keys first: a misspelt key is often why a check on the others fails ("trails"
    # leaves trials at its default, which k then exceeds)
    return "\n".join(line for _, line, missing in sorted(lines, key=lambda x: x[0]) if missing not in suggested)


# C0 and C1 controls but tab and newline (escape sequences), and the bidirectional formatting
# characters that reorder what a terminal shows (U+061C, U+200E/F, U+202A-E, U+2066-9)
TERMINAL_UNSAFE = dict.fromkeys([*range(0, 9), *range(11, 32), *range(127, 160), 0x061C, 0x200E, 0x200F,
                                 *range(0x202A, 0x202F), *range(0x2066, 0x206A)], "\ufffd")


def printable(s: str) -> str:
    """Text as it may reach a terminal: control characters (escape sequences) and bidirectional
    overrides replaced by U+FFFD; tabs and newlines kept."""
    return s.translate(TERMINAL_UNSAFE)


LINE_UNSAFE = {**TERMINAL_UNSAFE, 9: "\\t", 10: "\\n", 13: "\\r"}


def printable_line(s: str) -> str:
    """:func:`printable` for text that is one line where it is shown (a grade reason, a check,
    a row of a diff): a newline, carriage return or tab in it is written as ``\\n``, ``\\r``
    or ``\\t``, so a value cannot start a line of its own that reads like the tool's."""
    return s.translate(LINE_UNSAFE)


def one_line(text: str, limit: int = 60) -> str:
    """Anybody's text (a process name, a lock file) as one printable line for a notice: every
    non-printable character (terminal escapes, newlines, bidi controls) replaced, cut at ``limit``."""
    return "".join(ch if ch.isprintable() else "\ufffd" for ch in text)[:limit]


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 trial``, ``3 trials``: a number with its noun in the right number."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def utcnow() -> dt.datetime:
    """Now in UTC, without tzinfo (as every stored time is)."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


@contextmanager
def collector_paused(freeze: bool = False) -> Iterator[None]:
    """No cycle collection inside: code that makes 10^5 new objects (a large run's records, its
    report) would have the collector walk the growing heap again and again, for garbage it
    does not make. Resumed on exit (if it was on), whatever happens. ``freeze``: what was
    made inside lives until the process ends (a command's loaded run, its report): it is
    moved out of the collector's sight first, or resuming would walk all of it once more."""
    on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if on:
            gc.enable()


_NUMBERS = (int, float, int | None, float | None)


class StrictModel(BaseModel):
    """The base of what a user writes (suites, tasks, profiles, states): an unknown key is
    refused, and so is ``true`` where a number goes (pydantic would read it as 1: a time limit
    of one second, one core)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, f in cls.model_fields.items():
                key = name if name in data else f.alias
                if key in data and isinstance(data[key], bool) and f.annotation in _NUMBERS:
                    raise ValueError(f"{key}: {str(data[key]).lower()} is not a number")
        return data
