"""The ``harness`` command line: thin typer commands, registered here explicitly.

Parse, validate, call the engine or the report layer, print. No SQL and no Docker calls
here; errors are mapped to exit codes in one place (``harness.cli.app.HarnessGroup``).
"""

from __future__ import annotations

from harness.cli import export, inspect, report, run, sandbox, suites
from harness.cli.app import app, guard_terminal

for _module in (sandbox, run, suites, report, inspect, export):
    _module.register(app)


def main() -> None:
    """Console-script entry point (``harness``, ``python -m harness``)."""
    guard_terminal()
    app()


__all__ = ["app", "main"]
