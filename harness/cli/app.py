"""The ``harness`` Typer app, its consoles, and the one place errors become exit codes.

Exit codes: 0 success, 1 a check failed (doctor problem, gate unmet), 2 usage error
(bad option, bad suite/profile file, unknown id), 3 infrastructure error (engine down,
store lost). Any :class:`~harness.model.errors.HarnessError` that reaches the command
group is printed as ``error: ...`` and mapped to its class's exit code, here and nowhere
else. A command's own *result* may set the status after printing it (a gate that did not
hold, the command's exit status in ``sandbox exec``), never an error.
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from harness.model.errors import CheckFailed, HarnessError, InfraError, UsageError

EXIT_FAIL, EXIT_USAGE, EXIT_INFRA = CheckFailed.exit_code, UsageError.exit_code, InfraError.exit_code


def _width(stream: Any) -> int | None:
    """Terminal width on a terminal; 150 columns when piped (CI logs), unless COLUMNS says."""
    if os.environ.get("COLUMNS") or stream.isatty():
        return None
    return 150


console = Console(width=_width(sys.stdout))
err = Console(stderr=True, width=_width(sys.stderr))


def print_error(e: HarnessError) -> None:
    err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)


class HarnessGroup(TyperGroup):
    """The command group: maps every HarnessError raised below it to its exit code."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except HarnessError as e:
            print_error(e)
            raise typer.Exit(e.exit_code) from None


def die(msg: str, code: int = EXIT_USAGE) -> NoReturn:
    """Stop the command with an error of the class that has exit code ``code``."""
    raise {EXIT_USAGE: UsageError, EXIT_INFRA: InfraError, EXIT_FAIL: CheckFailed}[code](msg)


app = typer.Typer(
    name="harness",
    cls=HarnessGroup,
    help=(
        "Eval harness for tool-using agents: every trial in its own resource-pinned Docker "
        "sandbox, cgroup saturation counters per trial, SLA discard-and-rerun, pass@k beside pass^k.\n\n"
        "Quick start:  make demo   (or: harness run --suite refunds)"
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
)
sandbox_app = typer.Typer(help="Run one command in a pinned sandbox.", no_args_is_help=True)
images_app = typer.Typer(help="Build the images offline (base from Debian, then FROM it).", no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(images_app, name="images")

DB_HELP = "Database URL (SQLAlchemy), default sqlite:///.harness/harness.db or $HARNESS_DB."


def fmt3(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"
