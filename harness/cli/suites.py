"""``harness suites``: list suites, show one, and check that every task of one is gradable."""

from __future__ import annotations

import json
from typing import Any, Optional

import typer
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from harness.cli.app import DB_HELP, HarnessGroup, console, die, err


class _SuitesGroup(HarnessGroup):
    """`harness suites NAME` shows a suite; `harness suites check DIR` checks one; `harness suites` lists."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            return "show", self.commands["show"], args
        return super().resolve_command(ctx, args)


suites_app = typer.Typer(cls=_SuitesGroup, invoke_without_command=True, add_completion=False,
                         help="List the built-in suites, show one, or check every task of one.")


@suites_app.callback()
def _default(ctx: typer.Context, json_out: bool = typer.Option(False, "--json", help="JSON output.")) -> None:
    """List the built-in suites (`harness suites`), show one (`harness suites NAME|DIR`), or
    check one (`harness suites check DIR`).

    Examples:

      harness suites

      harness suites refunds

      harness suites ./harbor-tasks

      harness suites check ops
    """
    if ctx.invoked_subcommand is not None:
        return
    from harness.engine.suites import builtin_suites, load_suite

    ss = [load_suite(n) for n in builtin_suites()]
    if json_out:
        print(json.dumps([{"name": s.name, "description": s.description, "format": s.format, "tasks": len(s.tasks),
                           "image": s.image, "trials": s.trials, "k": s.k} for s in ss], indent=2))
        return
    t = Table(title="built-in suites")
    for c in ("suite", "format", "tasks", "trials", "k", "profile", "image", "description"):
        t.add_column(c)
    for s in ss:
        t.add_row(s.name, s.format, str(len(s.tasks)), str(s.trials), ",".join(map(str, s.k)), s.profile, s.image or "per task",
                  s.description)
    console.print(t)


@suites_app.command("show")
def show(
    name: str = typer.Argument(..., help="A built-in suite name or a suite directory (native, Harbor, Terminal-Bench)."),
    base_map: list[str] = typer.Option([], "--base-map", help="FOREIGN=LOCAL base image mapping, as run would use it (repeatable)."),
    json_out: bool = typer.Option(False, "--json", help="JSON output."),
) -> None:
    """Show one suite's tasks: state kind, grader, image and envelope of each.

    A task whose envelope does not fit the suite's profile, or whose Dockerfile names a base
    image with no local equivalent (map it with --base-map, as on run), is marked in red: a
    run would refuse it.

    Examples:

      harness suites show refunds

      harness suites show ./tb --base-map nvidia/cuda:12.0-base=mycuda:local
    """
    from harness.engine.suites import load_suite

    s = load_suite(name)
    misfit = _misfits(s)
    try:
        from harness.engine.taskimages import unbuildable

        nobuild = unbuildable(_engine_or_none(), s, list(base_map) or None) if any(t.build for t in s.tasks) else {}
    except ValueError as e:  # a malformed --base-map entry
        die(str(e))
    if json_out:
        print(json.dumps({"name": s.name, "format": s.format, "tasks": [
            {"id": t.id, "title": t.title, "tags": list(t.tags), "state": t.state_kind, "grader": t.grader_kind,
             "image": t.image or s.image, "services": [x.name for x in (*s.services, *t.services)],
             "envelope": t.envelope.model_dump(exclude_none=True) if t.envelope else {},
             **({"envelope_error": misfit[t.id]} if t.id in misfit else {}),
             **({"image_error": nobuild[t.id]} if t.id in nobuild else {})} for t in s.tasks],
            "refused": dict(s.refused),
            "agents": {"default": list(s.agent_cmd or []),
                       **{n: a.model_dump(mode="json") for n, a in s.agents.items()}}, "secrets": list(s.secrets)}, indent=2))
        return
    t = Table(title=f"{s.name} ({s.format}): {s.description}" if s.description else f"{s.name} ({s.format})")
    for c in ("task", "title", "state / grader", "services", "envelope override"):
        t.add_column(c)
    for task in s.tasks:
        ov = task.envelope.model_dump(exclude_none=True) if task.envelope else {}
        svcs = ", ".join(x.name for x in (*s.services, *task.services)) + (" db" if task.state_kind == "postgres" else "")
        env = Text(_envelope_text(ov))
        if task.id in misfit:
            env.append(("\n" if ov else "") + misfit[task.id], style="red")
        if task.id in nobuild:
            env.append(("\n" if env.plain else "") + "image: " + nobuild[task.id], style="red")
        t.add_row(task.id, Text(task.title if len(task.title) <= 120 else task.title[:119] + "…"), f"{task.state_kind} / {task.grader_kind}", svcs.strip(), env)
    for tid, why in sorted(s.refused.items()):
        t.add_row(tid, Text(why.splitlines()[0][:200], style="red"), "cannot run here", "", "")
    console.print(t)
    agents = [f"default: {' '.join(s.agent_cmd)}"] if s.agent_cmd else []
    agents += [f"--agent {n}: {a.description or ' '.join(a.cmd)}" + (f" (network {a.network})" if a.network else "")
               for n, a in s.agents.items()]
    if agents:
        console.print(Text("agents  " + "   ".join(agents)), highlight=False)
    if s.secrets:
        console.print(Text(f"secrets (by name, held by the model gateway): {', '.join(s.secrets)}"), highlight=False)


def _engine_or_none() -> Any:
    """A client when an engine answers (so an image it holds counts as a base), else None."""
    from harness.model.errors import EngineError
    from harness.sandbox.docker_sandbox import connect

    try:
        return connect(timeout=10)
    except EngineError:
        return None


def _misfits(s: Any) -> dict[str, str]:
    """Task id -> why its [envelope] does not fit the suite's default profile (a run would refuse it)."""
    from harness.engine.prepare import effective_profile
    from harness.engine.profiles import load_profile
    from harness.model.errors import HarnessError

    try:
        profile = load_profile(s.profile)
    except HarnessError as e:
        return {t.id: f"profile {s.profile!r}: {e}" for t in s.tasks}
    out = {}
    for t in s.tasks:
        try:
            effective_profile(profile, t, True)
        except HarnessError as e:
            out[t.id] = str(e).split(": ", 1)[-1]
    return out


def _envelope_text(ov: dict[str, Any]) -> str:
    """cpus 1.5 · memory 768 MiB · agent 90s · network none (what a task asks for, readable)."""
    from harness.model.units import format_size

    parts = []
    for k, v in ov.items():
        if k in ("memory", "storage", "grade_memory") and isinstance(v, int):
            parts.append(f"{k} {format_size(v)}")
        elif k == "timeouts" and isinstance(v, dict):
            parts += [f"{p} {t:g}s" for p, t in v.items()]
        else:
            parts.append(f"{k} {v}")
    return " · ".join(parts)


@suites_app.command("check")
def check(
    suite: str = typer.Argument(..., help="A built-in suite name or a suite directory (native, Harbor, Terminal-Bench)."),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="Comma-separated task ids (default: all)."),
    profile: Optional[str] = typer.Option(None, "--profile", "-p", help="Run under this profile (default: the suite's / the tasks' own)."),
    base_map: list[str] = typer.Option([], "--base-map", help="FOREIGN=LOCAL base image mapping for per-task builds (repeatable)."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    json_out: bool = typer.Option(False, "--json", help="One JSON document."),
) -> None:
    """Run each task once with the built-in oracle and once with nop; report broken tasks.

    A task is broken when its oracle does not pass (unsolvable as packaged: tests, image or
    solution wrong here), when nop passes (the grader accepts an untouched state), or when
    it cannot run here (its image does not build offline, it has no solution, it uses a part
    of Harbor's format not supported yet: `harness suites show DIR` lists those). Both runs
    are stored like any other (see `harness runs`). A task whose oracle or nop attempts were
    all discarded for the host's or the model API's reasons is unmeasured, not broken. Exit 1
    when any task is broken, else 3 when a task is unmeasured (check again on a quieter host).

    Examples:

      harness suites check ops

      harness suites check ./tb --base-map ubuntu:24.04=harness/debian:bookworm
    """
    from harness.engine.check import check_suite
    from harness.engine.runner import RunOptions, Runner

    task_list = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
    ids: list[str] = []

    def run_one(agent: str) -> tuple[Any, list[Any]]:
        opts = RunOptions(suite=suite, profile=profile, trials=1, ks=[1], tasks=task_list, agent=agent, base_map=list(base_map) or None,
                          note=f"suites check ({agent})", log=None if json_out else (lambda m: err.print(f"[dim]{m}[/]", highlight=False)))
        runner = Runner.plan(opts, db=db)
        ids[:] = sorted(set(ids) | set(runner.run.task_ids) | set(runner.run.excluded))
        if not json_out:
            err.print(f"[bold]{agent}[/]: run {runner.run.id} ({len(runner.run.task_ids)} tasks)", highlight=False)
        runner.execute()
        return runner.store.get_run(runner.run.id), runner.store.attempts(runner.run.id)

    checks, run_ids = check_suite(run_one, ids)
    broken = [c for c in checks if c.verdict == "broken"]
    unmeasured = [c for c in checks if c.verdict == "unmeasured"]
    if json_out:
        print(json.dumps({"suite": suite, "runs": run_ids, "ok": not broken and not unmeasured, "tasks": [
            {"task": c.task, "oracle": c.oracle, "nop": c.nop, "ok": c.ok, "verdict": c.verdict, "reasons": c.reasons,
             "unmeasured": c.unmeasured, "attempts": c.attempts} for c in checks]}, indent=2))
    else:
        t = Table(title=f"suites check {suite}: {len(checks) - len(broken) - len(unmeasured)} ok, {len(broken)} broken"
                        + (f", {len(unmeasured)} unmeasured" if unmeasured else ""))
        for c in ("task", "oracle", "nop", "verdict"):
            t.add_column(c)
        for c in checks:
            verdict = {"ok": Text("ok", style="green"), "broken": Text("broken: " + "; ".join(c.reasons), style="red"),
                       "unmeasured": Text("unmeasured: " + "; ".join(c.unmeasured), style="yellow")}[c.verdict]
            t.add_row(Text(c.task), c.oracle, c.nop, verdict)
        console.print(t)
        console.print(f"[dim]runs {', '.join(run_ids)}; per attempt: harness trials RUN, harness show ID[/]")
    if broken:
        raise typer.Exit(1)
    if unmeasured:  # the host's doing, not the task's: what CI reads as infrastructure
        raise typer.Exit(3)


def register(app: typer.Typer) -> None:
    app.add_typer(suites_app, name="suites")
