"""Every command registered on the typer app (``harness.cli`` loads this on first use)."""

from __future__ import annotations

import sys

from harness.cli import export, inspect, report, run, sandbox, suites
from harness.cli.app import app, guard_terminal, keep_to_reserved, own_process

for _module in (sandbox, run, suites, report, inspect, export):
    _module.register(app)


def _keep_off_trial_cores() -> None:
    """A harness command (a report, `show`, an image build) runs on a run's reserved cores;
    `run` pins itself by its own --reserve-cores."""
    if next((a for a in sys.argv[1:] if not a.startswith("-")), "") != "run":
        keep_to_reserved()


def start() -> None:
    """What the console script runs once the commands are loaded."""
    own_process()
    guard_terminal()
    _keep_off_trial_cores()
    app()


__all__ = ["app", "start"]
