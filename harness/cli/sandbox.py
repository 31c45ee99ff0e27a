"""CLI commands about the machine and the sandbox: doctor, sandbox exec, images build / list."""

from __future__ import annotations

import json
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

import harness
from harness.cli.app import EXIT_FAIL, EXIT_INFRA, console, die, err, images_app, pct, sandbox_app
from harness.model.units import format_size


# ----------------------------------------------------------------------------- doctor
def doctor(
    json_out: bool = typer.Option(False, "--json", help="Machine-readable result."),
    executor: str = typer.Option("local", "--executor", help="local: this machine; ray: every node of a Ray cluster."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="The cluster to check (HOST:PORT of its head; else "
                                              "$HARNESS_RAY_ADDRESS; else a one-node cluster started here)."),
) -> None:
    """Check that this machine or cluster can run pinned trials.

    Each problem comes with its fix; with --executor ray, every node of the cluster is checked.

    Checks: engine answers and its version, cgroup version and driver, the counters of a
    real container are readable, per-cgroup and host PSI, cores available for pinning,
    images present. With --executor ray: Ray itself, the cluster, then those checks run on
    each node, the harness cores each node offers against the cores it can lease, and base
    images whose inputs differ between nodes. Exit 1 when any check fails.

    Examples:

      harness doctor

      harness doctor --executor ray --ray-address 10.0.0.5:6379 --json
    """
    from harness.engine.doctor import ray_checks, run_checks

    if executor == "local":
        groups = [("", run_checks())]
    elif executor == "ray":
        groups = ray_checks(ray_address)
    else:
        die(f"--executor {executor!r}: one of local, ray")
    if json_out:
        if executor == "local":
            print(json.dumps([c.__dict__ for c in groups[0][1]], indent=2))
        else:
            print(json.dumps({name: [c.__dict__ for c in checks] for name, checks in groups}, indent=2))
    else:
        for name, checks in groups:
            t = Table(title=f"harness {harness.__version__} doctor" + (f" · {name}" if name else ""), show_lines=False)
            t.add_column("check")
            t.add_column("status")
            t.add_column("detail / fix", overflow="fold")
            for c in checks:
                mark = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[red]FAIL[/]"}[c.status]
                t.add_row(c.name, mark, c.detail + (f"\n[bold]fix:[/] {c.fix}" if c.fix else ""))
            console.print(t)
    if any(c.status == "fail" for _, checks in groups for c in checks):
        raise typer.Exit(EXIT_FAIL)


# ----------------------------------------------------------------------------- sandbox exec
def sandbox_exec(
    cmd: list[str] = typer.Argument(..., help="The command to run, after `--`."),
    profile: str = typer.Option("standard", "--profile", "-p", help="Profile name (sandboxes/NAME.toml) or path."),
    cpuset: Optional[str] = typer.Option(None, "--cpuset", help="Cores to pin to, e.g. '1' or '1-2' (default: leased from the free pool)."),
    image: str = typer.Option("harness/sandbox:latest", "--image", help="Image to run."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Wall-clock seconds (default: the profile's agent timeout)."),
    env: list[str] = typer.Option([], "--env", "-e", help="KEY=VALUE for the command (repeatable)."),
    json_out: bool = typer.Option(False, "--json", help="Print the whole record as JSON."),
    samples: bool = typer.Option(False, "--samples", help="Include the saturation time series in --json output."),
) -> None:
    """Run one command as one attempt in a fresh pinned container and print its record.

    The record: exit code, wall time, timed_out, cgroup counters, host contention, and the
    envelope read back from the kernel. The command starts with the container (no exec), as
    the workload's uid with no capabilities; its counters cover the container's whole life.

    Examples:

      harness sandbox exec -- python3 -c "print('hi')"

      harness sandbox exec -p tight --cpuset 1 -- sh -c 'while :; do :; done'

      harness sandbox exec --json --timeout 2 -- sleep 1000

    Exit status: the command's own (137 after an OOM kill), 124 on timeout, 127 when the
    command is not in the sandbox and 126 when it cannot be executed there (one line on
    stderr), 3 when the sandbox could not run (engine error), 2 on a usage error. A command
    may exit with any of these numbers itself, as under timeout(1): the record's `kind`
    (`--json`) tells them apart (ok, crashed, timeout, oom_killed, infra_error).
    """
    from harness.engine.command import run_command
    from harness.engine.profiles import load_profile
    from harness.engine.scheduler import CpuPool, allowed_cpus, pin_process
    from harness.sandbox.docker_backend import DockerBackend
    from harness.model.errors import RunError
    from harness.sandbox.docker_sandbox import connect
    from harness.sandbox.images import image_identity

    if timeout is not None and not (0 < timeout < float("inf")):
        die(f"--timeout {timeout:g}: seconds of wall clock, finite and more than 0 (leave it out for the profile's agent timeout)")
    prof = load_profile(profile)
    client = connect()
    try:  # before any core is leased: an image that is not here is a usage error (no registry is asked)
        image_identity(client, image)
    except RunError as e:
        die(f"--image {image}: {e}")
    if prof.network != "none":
        err.print(f"[yellow]note[/]: `sandbox exec` runs with network none (profile {prof.name} says {prof.network}: "
                  "the gateway and the other policies exist only in `harness run`)", highlight=False)
    cpus = _parse_cpuset(cpuset) if cpuset else None
    if cpus is not None:
        bad = [c for c in cpus if c not in allowed_cpus()]
        if bad:
            die(f"--cpuset {cpuset}: cores {bad} do not exist here (available: {_fmt_cpus(allowed_cpus())})")
        if len(cpus) < prof.cpus:
            die(f"--cpuset {cpuset} has {len(cpus)} cores but profile {prof.name} asks for cpus = {prof.cpus}")
        reserved = CpuPool.for_host().reserved
        if set(cpus) & set(reserved):
            err.print(
                f"[yellow]warning:[/] --cpuset {cpuset} includes core(s) {sorted(set(cpus) & set(reserved))} reserved for the "
                "controller and the engine; their work will show as foreign CPU",
                highlight=False,
            )
        pool = CpuPool(cpus=allowed_cpus())
        pool.on_wait = _say_wait
        pool.lock_exact(cpus)  # wait for any run holding these cores
    else:
        pool = CpuPool.for_host()
        pool.on_wait = _say_wait
        cpus = pool.lease(prof.cores)
    others = set(allowed_cpus()) - set(cpus)
    if others:  # keep this process off the trial's cores (it would count as foreign CPU)
        pin_process(sorted(others))
    envd = {}
    for kv in env:
        if "=" not in kv:
            die(f"--env {kv!r}: expected KEY=VALUE")
        k, v = kv.split("=", 1)
        envd[k] = v
    res = run_command(DockerBackend(client), image, prof, cpus, list(cmd), env=envd, timeout=timeout)
    if res.exec is not None and res.exec.start_error:  # nothing ran: no record to read, one line and a shell's status
        if json_out:
            print(json.dumps(res.model_dump(mode="json", exclude={"samples"}), indent=2))
        err.print(f"[bold red]error:[/] {escape(res.exec.start_error)}", highlight=False, soft_wrap=True)
        raise typer.Exit(res.exec.exit_code)
    if json_out:
        data = res.model_dump(mode="json", exclude=None if samples else {"samples"})
        if not samples:
            data["samples_count"] = len(res.samples)
        print(json.dumps(data, indent=2))
    else:
        _print_attempt(res)
    if res.kind == "infra_error":
        raise typer.Exit(EXIT_INFRA)
    if res.kind == "timeout":
        raise typer.Exit(124)  # like timeout(1)
    if res.kind == "oom_killed":
        raise typer.Exit(res.exec.exit_code or 137)  # 137 also where its status was lost with its container
    if res.exec is not None and res.exec.exit_code:
        raise typer.Exit(res.exec.exit_code)  # the command's own status (137 after an OOM kill)


def _say_wait(line: str) -> None:
    err.print(f"[dim]{line}; the sandbox starts once they are free[/]", highlight=False)


def _parse_cpuset(s: str) -> list[int]:
    out: list[int] = []
    try:
        for part in s.split(","):
            if "-" in part:
                a, b = part.split("-")
                out.extend(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
    except ValueError:
        die(f"--cpuset {s!r}: expected a list like '1' or '1-2,4'")
    return sorted(set(out))


def _fmt_cpus(c: list[int]) -> str:
    return ",".join(map(str, c))


def _print_attempt(res: Any) -> None:
    ex = res.exec
    color = {"ok": "green", "crashed": "red", "timeout": "yellow", "oom_killed": "magenta", "infra_error": "red"}[res.kind]
    console.print(f"[bold {color}]{res.kind}[/]  image {res.image}  profile {res.profile}  cpuset {_fmt_cpus(res.cpuset)}")
    if res.error:
        console.print(f"[red]{res.error}[/]")
        return
    console.print(
        f"exit {ex.exit_code}  wall {ex.wall_s:.2f}s  timed_out {ex.timed_out}  "
        f"stdout {ex.stdout_bytes} B{' (truncated)' if ex.stdout_truncated else ''}  stderr {ex.stderr_bytes} B"
    )
    if ex.stdout.strip():
        console.print("[dim]--- stdout (tail)[/]")
        console.print(ex.stdout[-1500:].rstrip(), markup=False, highlight=False)
    if ex.stderr.strip():
        console.print("[dim]--- stderr (tail)[/]")
        console.print(ex.stderr[-1500:].rstrip(), markup=False, highlight=False)
    t = Table(title="counters (cgroup)", show_header=True)
    t.add_column("counter")
    t.add_column("value", justify="right")
    c, h = res.counters, res.host
    if c:
        rows = [
            ("cpu used", f"{c.cpu_usage_us / 1e6:.3f} s"),
            ("throttled", f"{(c.throttled_us or 0) / 1e6:.3f} s ({pct(c.throttled_share)} of wall)"),
            ("periods / throttled", f"{c.nr_periods} / {c.nr_throttled}"),
            ("memory peak", format_size(c.memory_peak)),
            ("memory limit hits", str(c.memory_limit_hits)),
            ("oom kills", str(c.oom_kills)),
            ("pids peak / limit hits", f"{c.pids_peak} / {c.pids_limit_hits}"),
            ("psi cpu / mem / io some", f"{_us(c.psi_cpu_some_us)} / {_us(c.psi_memory_some_us)} / {_us(c.psi_io_some_us)}"),
        ]
        for r in rows:
            t.add_row(*r)
    if h:
        t.add_row("foreign cpu on pinned cores", pct(h.foreign_cpu_share))
        t.add_row("steal", pct(h.steal_share))
        t.add_row("host psi cpu / mem / io", f"{pct(h.psi_cpu_some_share)} / {pct(h.psi_memory_some_share)} / {pct(h.psi_io_some_share)}")
        t.add_row("host MemAvailable min", format_size(h.mem_available_min))
    console.print(t)
    e = res.envelope
    if e is not None:
        if e.ok:
            a = e.applied
            console.print(
                f"[green]envelope applied[/]: quota {a.cpu_quota_us}/{a.cpu_period_us} us, cpuset {a.cpuset_cpus}, "
                f"memory {format_size(a.memory_max)} (memsw {format_size(a.memsw_max)}), pids {a.pids_max}"
            )
        else:
            console.print("[bold red]envelope_not_applied[/]: " + "; ".join(e.mismatches))


def _us(v: int | None) -> str:
    return "-" if v is None else f"{v / 1e6:.3f}s"


# ----------------------------------------------------------------------------- images
def images_build(
    base: Optional[str] = typer.Option(
        None, "--base", help="Build FROM this public image instead of the offline Debian base (needs a registry)."
    ),
    suite: list[str] = typer.Option([], "--suite", help="Build this suite's images (repeatable; default: all built-in suites). "
                                    "A Harbor / Terminal-Bench directory gets one image per task."),
    base_map: list[str] = typer.Option([], "--base-map", help="FOREIGN=LOCAL base image mapping for per-task builds (repeatable)."),
    force: bool = typer.Option(False, "--force", help="Rebuild even when the inputs are unchanged."),
) -> None:
    """Build harness/base offline, then the harness images and the suite images FROM it.

    The base comes from mmdebstrap with apt's configured sources (no registry). Foreign
    Dockerfiles (Harbor, Terminal-Bench) are built per task with their bases mapped to local
    images (`harness images basemap`), the host's CA bundle passed in for pip / apt. Any
    image whose inputs (files, Dockerfile, base image) are unchanged is skipped; the log of
    every build is kept under $HARNESS_HOME/builds/ (default .harness/builds/).

    Examples:

      harness images build

      harness images build --suite ./harbor-tasks --base-map node:20=my/node:local

      harness images build --base python:3.11-slim-bookworm
    """
    from harness.engine.images import build_images

    results = build_images(base=base, suites=suite or None, force=force, log=lambda m: err.print(m, highlight=False),
                           base_map=list(base_map) or None)
    for r in results:
        what = f"built in {r.seconds:.1f}s" if r.built else "up to date"
        console.print(f"{r.tag:32} {what}" + (f"  (inputs {r.inputs})" if r.inputs else ""), highlight=False)


def images_basemap() -> None:
    """Show which local image each common foreign base is built FROM (offline builds).

    `--base-map FOREIGN=LOCAL` (on run, suites check, images build) and a suite's own
    `base_map` come first; an image the engine already has is used as it is. Every
    substitution is recorded in the run's identity.

    Example:  harness images basemap
    """
    from harness.sandbox.basemap import default_table

    t = Table(title="default base-image mapping")
    for col in ("FROM (glob)", "built FROM instead", "what differs"):
        t.add_column(col)
    for pattern, local, why in default_table():
        t.add_row(pattern, local, why)
    console.print(t)


def images_list() -> None:
    """Show the harness images present and their input hashes.

    Example:  harness images list
    """
    from harness.sandbox.docker_sandbox import connect
    from harness.sandbox.images import list_images

    t = Table()
    for col in ("image", "id", "size", "inputs"):
        t.add_column(col)
    for tag, short_id, size, inputs in list_images(connect()):
        t.add_row(tag, short_id, format_size(size), inputs)
    console.print(t)




def register(app: typer.Typer) -> None:
    app.command()(doctor)
    sandbox_app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(sandbox_exec)
    images_app.command("build")(images_build)
    images_app.command("list")(images_list)
    images_app.command("basemap")(images_basemap)
