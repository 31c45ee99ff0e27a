"""State kinds and graders (see ``harness.state.base``). Registered by name here."""

from __future__ import annotations

from harness.model.errors import UsageError
from harness.state.base import Grader, StateKind

_KINDS: dict[str, type[StateKind]] = {}
_GRADERS: dict[str, type[Grader]] = {}


def _register() -> None:
    if _KINDS:
        return
    from harness.state.container import ContainerState
    from harness.state.expectations import ExpectationsGrader
    from harness.state.files import FilesState
    from harness.state.postgres import PostgresState
    from harness.state.sqlite import SqliteState
    from harness.state.verifier import VerifierGrader

    for k in (SqliteState, FilesState, PostgresState, ContainerState):
        _KINDS[k.name] = k
    for g in (ExpectationsGrader, VerifierGrader):
        _GRADERS[g.name] = g


def state_kind(name: str) -> StateKind:
    """The state kind called ``name`` (sqlite, files, postgres, container)."""
    _register()
    if name not in _KINDS:
        raise UsageError(f"unknown state kind {name!r}; known: {', '.join(sorted(_KINDS))}")
    return _KINDS[name]()


def grader(name: str) -> Grader:
    """The grader called ``name`` (expectations, verifier)."""
    _register()
    if name not in _GRADERS:
        raise UsageError(f"unknown grader {name!r}; known: {', '.join(sorted(_GRADERS))}")
    return _GRADERS[name]()
