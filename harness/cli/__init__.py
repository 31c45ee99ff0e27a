"""The ``harness`` command line: thin typer commands, registered explicitly in
``harness.cli.commands``.

Parse, validate, call the engine or the report layer, print. No SQL and no Docker calls
here; errors are mapped to exit codes in one place (``harness.cli.app.HarnessGroup``).

This module imports nothing heavy: the console script keeps itself off the trial cores
first (:func:`main`), then loads the commands (pydantic, SQLAlchemy, rich: ~0.5 s of CPU that
ran on every core, a concurrent run's trial core among them, as its foreign CPU).
"""

from __future__ import annotations

import os
from typing import Any


def _pin_early() -> None:
    """Before the commands load: this process on the first core it may use, the one a run
    reserves for its controller by default (each command then pins itself exactly: every one
    to the reserved cores, `run` by its --reserve-cores). One thread exists yet, so the mask
    is every later thread's too."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        try:
            os.sched_setaffinity(0, {cpus[0]})
        except OSError:  # a cpuset that changed under us: the exact pin below decides
            pass


# an exception no command turned into an exit code is a bug in harness (or a broken install):
# exit 3 (infrastructure, InfraError.exit_code), never 1, which CI reads as a gate that failed
_EXIT_INTERNAL = 3


def main() -> None:
    """Console-script entry point (``harness``, ``python -m harness``)."""
    _pin_early()
    try:
        from harness.cli.commands import start

        start()
    except Exception as e:  # SystemExit (every exit code) and KeyboardInterrupt pass through
        import sys

        sys.excepthook(type(e), e, e.__traceback__)  # the traceback, for the bug report
        sys.stderr.write(f"error: internal error in harness ({type(e).__name__}), not a result of the run: "
                         f"please report it with the traceback above (exit {_EXIT_INTERNAL})\n")
        sys.exit(_EXIT_INTERNAL)


def __getattr__(name: str) -> Any:  # `from harness.cli import app`: the commands load on first use
    if name != "app":
        raise AttributeError(f"module 'harness.cli' has no attribute {name!r}")
    from harness.cli import commands

    # loading them bound the submodule harness.cli.app to this name: the typer app it holds wins
    globals()["app"] = commands.app
    return commands.app


__all__ = ["app", "main"]
