"""State kinds and graders (see ``harness.state.base``). Registered by name here."""

from __future__ import annotations

from harness.model.errors import UsageError
from harness.state.base import Grader, StateKind

_KINDS: dict[str, type[StateKind]] = {}
_GRADERS: dict[str, type[Grader]] = {}


def _register() -> None:
    from harness.state.expectations import ExpectationsGrader
    from harness.state.sqlite import SqliteState

    _KINDS.setdefault(SqliteState.name, SqliteState)
    _GRADERS.setdefault(ExpectationsGrader.name, ExpectationsGrader)


def state_kind(name: str) -> StateKind:
    """The state kind called ``name`` (``sqlite``)."""
    _register()
    if name not in _KINDS:
        raise UsageError(f"unknown state kind {name!r}; known: {', '.join(sorted(_KINDS))}")
    return _KINDS[name]()


def grader(name: str) -> Grader:
    """The grader called ``name`` (``expectations``)."""
    _register()
    if name not in _GRADERS:
        raise UsageError(f"unknown grader {name!r}; known: {', '.join(sorted(_GRADERS))}")
    return _GRADERS[name]()
