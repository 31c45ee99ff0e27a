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
import re
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from harness.model.errors import CheckFailed, HarnessError, InfraError, UsageError
from harness.model.units import did_you_mean, printable

EXIT_FAIL, EXIT_USAGE, EXIT_INFRA = CheckFailed.exit_code, UsageError.exit_code, InfraError.exit_code
EXIT_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a tool whose reader closed the pipe


def _width(stream: Any) -> int | None:
    """Terminal width on a terminal; 150 columns when piped (CI logs), unless COLUMNS says."""
    if os.environ.get("COLUMNS") or stream.isatty():
        return None
    return 150


console = Console(width=_width(sys.stdout))
err = Console(stderr=True, width=_width(sys.stderr))


# what may reach a terminal besides text: colour (SGR) sequences, which is all rich writes here
_SGR = re.compile(r"(\x1b\[[0-9;]*m)")


def terminal_safe(text: str) -> str:
    """``text`` as it may reach a terminal: colour sequences kept, every other control
    character, escape sequence and bidi override replaced by U+FFFD."""
    parts = _SGR.split(text)
    return "".join(p if i % 2 else printable(p) for i, p in enumerate(parts))


class TerminalGuard:
    """A terminal stream that lets text and colour through, nothing else: whatever a command
    prints that came from a store, a task or an agent (a task id, a grader's reason, a run's
    note) cannot move the cursor, retitle the window, or reorder the line. Installed by
    :func:`guard_terminal` for streams that are terminals only: piped or redirected output
    (JSON, markdown, CSV) stays byte for byte what the command wrote."""

    def __init__(self, stream: Any):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(terminal_safe(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_terminal() -> None:
    """Wrap sys.stdout / sys.stderr in a :class:`TerminalGuard` where they are terminals."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        if tty and not isinstance(stream, TerminalGuard):
            setattr(sys, name, TerminalGuard(stream))


def print_error(e: HarnessError) -> None:
    # the message may quote a stored or agent-written value: no control characters, even in a log
    err.print(f"[bold red]error:[/] {escape(printable(str(e)))}", highlight=False, soft_wrap=True)


_ITEM = re.compile(r"^(?:[-*•] |\d+[.)] |\S+:  )")


def reflow_help(text: str | None) -> str | None:
    """A docstring's prose as paragraphs the terminal wraps: the source's line breaks inside a
    paragraph joined (rich keeps them, so at 80 columns every long source line wrapped twice);
    indented lines (examples) and list items keep their lines."""
    if not text:
        return text
    out: list[str] = []
    for para in re.split(r"\n\s*\n", text.strip("\n")):
        lines = para.split("\n")
        if lines[0][:1].isspace():  # an example block: as written
            out.append(para)
            continue
        joined: list[str] = []
        for line in lines:
            if joined and not _ITEM.match(line) and not line[:1].isspace():
                joined[-1] += " " + line.strip()
            elif joined and line[:1].isspace() and not line.strip()[:1] in "-*•" and _ITEM.match(joined[-1].strip()):
                joined[-1] += " " + line.strip()  # a list item's continuation
            else:
                joined.append(line.rstrip())
        out.append("\n".join(joined))
    return "\n\n".join(out)


def _fold_long_words() -> None:
    """--help at 80 columns: a token longer than the help column (a URL, a NAME=value example)
    folds onto the next line instead of being cut with an ellipsis. Typer builds each option's
    help as Columns of Text with rich's default overflow; where its helper is not there (a
    later typer), help is printed as typer prints it."""
    from rich.text import Text
    from typer import rich_utils

    made = getattr(rich_utils, "_get_parameter_help", None)
    if made is None or getattr(made, "_folds", False):
        return

    def folded(*args: Any, **kwargs: Any) -> Any:
        out = made(*args, **kwargs)
        for item in getattr(out, "renderables", ()):
            if isinstance(item, Text):
                item.overflow = "fold"
        return out

    folded._folds = True  # type: ignore[attr-defined]
    rich_utils._get_parameter_help = folded


def _reflow_all(group: Any, ctx: Any) -> None:
    _no_flag_type(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or getattr(cmd, "_reflowed", False):
            continue
        cmd.help = reflow_help(cmd.help)
        cmd._reflowed = True
        _no_flag_type(cmd)
        if hasattr(cmd, "list_commands"):
            _reflow_all(cmd, ctx)


def _no_flag_type(cmd: Any) -> None:
    """A flag takes no value: its help row shows none (typer's panel showed `<bool>`, and
    `--json true` is refused). --help is made when help is asked for: marked then."""
    for p in cmd.params:
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
    made = cmd.get_help_option

    def get_help_option(ctx: Any) -> Any:
        opt = made(ctx)
        if opt is not None and opt.metavar is None:
            opt.metavar = ""
        return opt

    cmd.get_help_option = get_help_option


# what other tools call a command of ours
COMMAND_SYNONYMS = {"diff": "compare", "list": "runs", "ls": "runs", "history": "runs", "exec": "sandbox exec", "eval": "run",
                    "test": "run", "check": "doctor", "build": "images build", "inspect": "show", "attempts": "trials",
                    "logs": "show", "clean": "gc", "prune": "gc", "push": "export", "otlp": "export"}


class HarnessGroup(TyperGroup):
    """The command group: maps every HarnessError raised below it to its exit code, and a
    command line that does not parse (unknown option, bad value) to one line, exit 2."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError as ClickUsage
        from typer.exceptions import Abort

        _reflow_all(self, None)
        _fold_long_words()
        self.help = reflow_help(self.help)
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except NoArgsIsHelpError as e:  # `harness`, `harness sandbox`: the help was printed
            sys.exit(e.exit_code)
        except ClickException as e:
            ctx = getattr(e, "ctx", None) if isinstance(e, ClickUsage) else None
            where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            err.print(f"[bold red]error:[/] {escape(printable(e.format_message()))}{where}", highlight=False, soft_wrap=True)
            sys.exit(e.exit_code)
        except Abort:
            err.print("aborted", highlight=False)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """An unknown command names the one meant: a close spelling, or the word other tools use."""
        from typer._click.exceptions import UsageError as ClickUsage

        try:
            return super().resolve_command(ctx, args)
        except ClickUsage as e:
            name = args[0] if args else ""
            meant = COMMAND_SYNONYMS.get(name.lower())
            hint = f" (did you mean `{ctx.command_path} {meant}`?)" if meant else did_you_mean(name, self.list_commands(ctx))
            if not hint:
                raise
            raise ClickUsage(f"No such command {name!r}{hint}", ctx=ctx) from None

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except HarnessError as e:
            print_error(e)
            raise typer.Exit(e.exit_code) from None
        except BrokenPipeError:
            # the reader closed the pipe (`| head`): stop quietly with the status of a tool the
            # pipe's signal ended (exit 1 would read as a failed check); what is still buffered
            # goes nowhere, so no error follows at exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise typer.Exit(EXIT_PIPE) from None


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


def _version(value: bool) -> None:
    if value:
        import harness

        console.print(f"harness {harness.__version__}", highlight=False)
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the harness version and exit.")) -> None:
    """Eval harness for tool-using agents."""


sandbox_app = typer.Typer(help="Run one command in a pinned sandbox.", no_args_is_help=True)
images_app = typer.Typer(help="Build the images offline (base from Debian, then FROM it).", no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(images_app, name="images")

_owner = {"process": False}  # set by the console script (harness.cli.main): the process is harness's own to pin


def own_process() -> None:
    _owner["process"] = True


def owns_process() -> bool:
    """Was harness started as its own process (not a command called in-process by a test)?"""
    return _owner["process"]


def keep_to_reserved(reserve_cores: int | None = None) -> bool:
    """Keep this process on the cores a run reserves for its controller (``reserve_cores``,
    default 1 of 2+), never on trial cores a concurrent run is measuring (it would be their
    foreign CPU). Only when harness owns the process (the console script), never a process
    that called a command in-process (a test, a notebook: its children would inherit the
    pin). A bad value is left for the run's plan to refuse. True when it is kept there now."""
    from harness.engine.scheduler import CpuPool, pin_process
    from harness.model.errors import SchedulerError

    if not owns_process():
        return False
    try:
        pool = CpuPool.for_host(reserve=reserve_cores)
    except SchedulerError:  # left for the run's plan to refuse; off the trial cores meanwhile
        pool = CpuPool.for_host()
        reserved = False
    else:
        reserved = bool(pool.reserved)
    pin_process(list(pool.reserved or pool.cpus))  # none reserved (--reserve-cores 0): it shares every core, as it would unpinned
    return reserved

DB_HELP = ("Database URL (SQLAlchemy). Default: $HARNESS_DB, else the SQLite file harness.db in $HARNESS_HOME "
           "(default: .harness in the working directory).")


def fmt3(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"
