"""CLI commands that run suites and list what ran: run, suites, runs, sweep."""

from __future__ import annotations

import json
import shlex
import time
from typing import Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from harness.cli.app import DB_HELP, EXIT_FAIL, EXIT_INFRA, console, die, err, fmt3, keep_to_reserved
from harness.cli.progress import ProgressDisplay, sigterm_as_interrupt
from harness.engine.events import Fanout
from harness.measure.host import CoreProbe
from harness.model.units import plural

_fmt = fmt3


def run(
    suite: Optional[str] = typer.Option(None, "--suite", "-s", help="Built-in suite name (see `harness suites`) or path to a suite directory."),
    resume: Optional[str] = typer.Option(None, "--resume", help="Continue an interrupted run (id, prefix or 'last'): fills only its missing slots."),
    profile: Optional[str] = typer.Option(None, "--profile", "-p", help="Sandbox profile (default: the suite's)."),
    trials: Optional[int] = typer.Option(None, "--trials", "-n", help="Trials per task (default: the suite's)."),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="Comma-separated task ids (default: all)."),
    k: Optional[str] = typer.Option(None, "--k", help="k values to report, e.g. '1,2,4' (default: the suite's); each <= trials."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Run seed (default 0); each slot's seed derives from it, the task and the trial index."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", "-j", help="At most this many attempts at once (can only lower what fits)."),
    max_reruns: Optional[int] = typer.Option(None, "--max-reruns", help="Reruns per slot after discarded attempts (default: the suite's)."),
    reserve_cores: Optional[int] = typer.Option(None, "--reserve-cores", help="Cores kept for the controller (default 1 when the machine has more than one)."),
    agent_image: Optional[str] = typer.Option(None, "--agent-image", help="Run your agent's image instead of the suite's (build it FROM the suite image)."),
    agent_cmd: Optional[str] = typer.Option(None, "--agent-cmd", help="Agent command line (shell-quoted), e.g. 'python3 /opt/my/agent.py'."),
    agent: Optional[str] = typer.Option(None, "--agent", help="A built-in agent instead of the suite's: oracle (runs each task's "
                                        "solution) or nop (does nothing), or one the suite names (refunds: llm, an "
                                        "OpenAI-compatible tool-calling agent)."),
    secret: list[str] = typer.Option([], "--secret", help="NAME or NAME=ENVVAR: a model API key (OPENAI_API_KEY, ANTHROPIC_API_KEY) "
                                     "read from this shell and held by the model gateway only; the run stores the name (repeatable)."),
    upstream: list[str] = typer.Option([], "--upstream", help="PROVIDER=URL: where the gateway sends a provider's calls (default "
                                       "openai=https://api.openai.com/v1, anthropic=https://api.anthropic.com; repeatable)."),
    agent_env: list[str] = typer.Option([], "--agent-env", help="KEY=VALUE in the agent's environment (repeatable; stored with "
                                        "the run, so never a credential: use --secret), e.g. REFUNDS_LLM_MODEL=gpt-4.1-mini."),
    network: Optional[str] = typer.Option(None, "--network", help="Network policy over the profile's: none, gateway (only the model "
                                          "gateway), allowlist (the profile's `allow` list), bridge (internet, never the host)."),
    base_map: list[str] = typer.Option([], "--base-map", help="FOREIGN=LOCAL: build per-task images FROM LOCAL where their "
                                       "Dockerfile names FOREIGN (repeatable; globs: 'python:3.*=harness/python:bookworm')."),
    executor: Optional[str] = typer.Option(None, "--executor", help="Where attempts run: local (this machine's cores, the "
                                           "default) or ray (the nodes of a Ray cluster; needs `pip install 'harness\\[ray]'`)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="The Ray cluster to join "
                                              "(HOST:PORT of its head; also $HARNESS_RAY_ADDRESS). Without it, --executor ray "
                                              "starts a one-node cluster on this machine."),
    refill_unmeasured: bool = typer.Option(False, "--refill-unmeasured", help="With --resume: give the run's unmeasured slots "
                                           "a fresh rerun budget (only those discarded for host or upstream reasons; the "
                                           "discarded attempts stay as evidence)."),
    max_unmeasured: float = typer.Option(0.0, "--max-unmeasured", min=0.0, max=1.0, envvar="HARNESS_MAX_UNMEASURED",
                                         help="Largest share of unmeasured slots a run may end with and exit 0 (default 0: any "
                                         "unmeasured slot exits 3, naming the rule that discarded most)."),
    wait_quiet: Optional[float] = typer.Option(None, "--wait-quiet", min=0.0, max=86400.0, help="Before the first attempt, "
                                               "wait up to this many seconds for the trial cores to be quiet (default: "
                                               "probe once and warn)."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON summary document instead of tables."),
    note: str = typer.Option("", "--note", help="Free text stored with the run."),
    otlp: Optional[str] = typer.Option(None, "--otlp", help="Send the run as OpenTelemetry traces while it runs, to this "
                                       "OTLP/HTTP endpoint (http://localhost:4318 or its .../v1/traces URL; needs "
                                       "`pip install 'harness\\[otel]'`). A collector that is down is noted once; the run goes on."),
    require: list[str] = typer.Option([], "--require", "-r", help="Gate the run: METRIC OP VALUE as `harness gate --require` "
                                      "takes it, e.g. 'pass^4>=0.9' (repeatable). Checked before anything runs (a k above the "
                                      "trials is refused); judged after the run: exit 1 when one fails."),
    otlp_header: list[str] = typer.Option([], "--otlp-header", help="KEY=VALUE sent with every OTLP request (repeatable; "
                                          "values never printed; $OTEL_EXPORTER_OTLP_HEADERS is read too)."),
) -> None:
    """Run a suite: every task x trial slot in a fresh pinned container.

    Each attempt is SLA-judged; discarded attempts are rerun (up to --max-reruns) and kept
    as evidence; clean ones are graded by the state they leave. Everything is stored.
    A suite is a built-in name, a native suite directory (suite.toml), or Harbor /
    Terminal-Bench task directories (task.toml / task.yaml; one task or a directory of
    them), whose images are built per task offline (foreign bases mapped: `harness images basemap`).

    Examples:

      harness run --suite refunds

      harness run --suite refunds --profile tight --tasks duplicate-charge

      harness run --suite ./mine --agent-image my/agent:dev --agent-cmd /agent/run

      harness run --suite ./tb --base-map python:3.13-slim=harness/python:bookworm

      # a real provider, through the gateway
      harness run --suite refunds --agent llm --secret OPENAI_API_KEY

      # a local server
      harness run --suite refunds --agent llm --upstream openai=http://gpu:8089/v1

      # spread over a cluster's nodes
      harness run --suite refunds --executor ray --ray-address 10.0.0.5:6379

      # after Ctrl-C or a crash: same seeds, same envelope, missing slots only
      harness run --resume last

      # a busy host left slots unmeasured: rerun just those
      harness run --resume last --refill-unmeasured

      harness run --suite refunds --wait-quiet 120 --max-unmeasured 0.05

      # spans to a collector as it runs; see `harness export`
      harness run --suite refunds --otlp http://localhost:4318

      # a release gate in one step: exit 1 when unmet
      harness run --suite refunds --trials 4 --require 'pass^4>=0.9'

    Exit codes: 0 every slot measured (or within --max-unmeasured), 1 only when a --require
    is unmet (a failing agent is a result, not an error), 2 usage error, 3 infrastructure
    (unmeasured slots over the limit, tasks that could not run here, the engine; it wins over
    1), 130 interrupted.
    """
    # kept to the controller's cores from the start (imports, planning, image builds), the
    # pre-run probe of the trial cores begins now: the engine's imports and the plan overlap
    # it instead of waiting it out (0.3 s of a run's start-up)
    early_probe = CoreProbe() if keep_to_reserved(reserve_cores) else None
    from harness.core.aggregate import summarize
    from harness.engine.runner import RunOptions, Runner, refill_plan
    from harness.report.gate import parse_requirement

    if (suite is None) == (resume is None):
        die("give --suite SUITE for a new run, or --resume RUN to continue one" + (" (not both)" if suite is not None else ""))
    if refill_unmeasured and resume is None:
        die("--refill-unmeasured refills a stored run's unmeasured slots: give --resume RUN with it")
    from harness.engine.runner import lane_depth, probe_seconds

    probe_seconds()  # a bad $HARNESS_PROBE_S is a usage error before anything is stored
    lane_depth()  # and $HARNESS_LANE_DEPTH
    otlp_url, otlp_headers = None, {}
    if otlp is not None:  # checked before anything is stored, too
        from harness.engine.otel import otlp_options

        otlp_url, otlp_headers = otlp_options(otlp, otlp_header)
    elif otlp_header:
        die("--otlp-header goes with --otlp ENDPOINT")
    if tasks is not None and not any(t.strip() for t in tasks.split(",")):
        die(f"--tasks {tasks!r} names no task (give ids separated by commas, or leave --tasks out to run them all)")
    if agent_cmd is not None and not agent_cmd.strip():
        die("--agent-cmd is empty; give the command that starts your agent (or leave it out for the suite's)")
    if resume is not None:
        given = {"--profile": profile, "--trials": trials, "--tasks": tasks, "--k": k, "--max-reruns": max_reruns,
                 "--agent-image": agent_image, "--agent-cmd": agent_cmd, "--agent": agent, "--base-map": base_map or None,
                 "--secret": secret or None, "--upstream": upstream or None, "--network": network, "--agent-env": agent_env or None,
                 "--seed": seed, "--note": note or None}
        clash = [k for k, v in given.items() if v is not None]
        if clash:
            die(f"--resume keeps the run's identity; {', '.join(clash)} cannot change it (start a new run instead)")
    try:
        reqs = [parse_requirement(q) for q in require]
    except ValueError as e:
        die(str(e))
    if reqs and resume is not None:
        die("--require gates a new run; to gate a resumed run, run `harness gate RUN --require ...` after it")
    try:
        agent_argv = shlex.split(agent_cmd) if agent_cmd else None
    except ValueError as e:
        die(f"--agent-cmd {agent_cmd!r}: {e} (it is split like a shell command line)")
    if agent_argv is not None and not agent_argv:
        die("--agent-cmd is empty; give the command that starts your agent")
    opts = RunOptions(
        suite=suite or "",
        profile=profile,
        trials=trials,
        tasks=[t.strip() for t in tasks.split(",") if t.strip()] if tasks else None,
        seed=seed or 0,
        concurrency=concurrency,
        max_reruns=max_reruns,
        reserve_cores=reserve_cores,
        agent_image=agent_image,
        agent_cmd=agent_argv,
        note=note,
        ks=_parse_ks(k) if k else None,
        agent=agent,
        base_map=list(base_map) or None,
        secrets=list(secret), upstreams=list(upstream), network=network, agent_env=list(agent_env),
        log=None if json_out else (lambda m: err.print(f"[dim]{m}[/]", highlight=False)),
        executor=executor or "local", ray_address=ray_address, gate_ks=[(q.text, q.k) for q in reqs],
    )
    if executor not in (None, "local", "ray"):
        die(f"--executor {executor!r}: one of local, ray")
    if ray_address and (executor or "local") != "ray" and resume is None:
        die("--ray-address joins a Ray cluster: give --executor ray with it")
    if resume is not None:
        runner = Runner.resume(resume, db=db, concurrency=concurrency, reserve_cores=reserve_cores, executor=executor,
                               ray_address=ray_address, refill=refill_unmeasured)
    else:
        runner = Runner.plan(opts, db=db)
    runner.take_probe(early_probe)
    r = runner.run
    at = _db_arg(db)  # the hints below name the store this run is in
    if not json_out:
        err.print(
            f"run [bold]{r.id}[/]  suite {r.suite} ({plural(len(r.task_ids), 'task')} x {plural(r.trials, 'trial')})  profile {r.profile}  "
            f"concurrency {r.concurrency}  max reruns {r.max_reruns}  image {r.image}",
            highlight=False,
        )
        if r.executor == "ray":
            names = ", ".join(f"{f.get('hostname', '?')}/{n[:8]} ({f.get('harness_cores', 0)} cores)" for n, f in r.nodes.items())
            err.print(f"executor ray: {len(r.nodes)} node(s): {names}", highlight=False)
            for line in (r.host or {}).get("nodes_differ", []):
                err.print(f"[yellow]nodes differ[/] {line}: the report flags this run and `compare` refuses it", highlight=False)
        net = (r.profile_json or {}).get("network", "none")
        if net != "none" or r.upstreams:
            ups = ", ".join(f"{p} -> {u}" for p, u in r.upstreams.items()) or "no model provider"
            keys = f"; keys held by the gateway: {', '.join(r.secrets)}" if r.secrets else ""
            err.print(f"network {net}  model gateway: {ups}{keys}", highlight=False)
        print_run_notes(r)
    otel_sink = None
    if otlp_url is not None:
        from harness.engine.otel import OtelSink

        otel_sink = OtelSink(otlp_url, otlp_headers, runner.store, note=lambda m: err.print(m, highlight=False, markup=False, soft_wrap=True))
    t0 = time.monotonic()
    sigterm_as_interrupt()
    with ProgressDisplay(len(r.task_ids) * r.trials, quiet=json_out) as display:
        try:
            runner.execute(events=Fanout([display, otel_sink]) if otel_sink else display, wait_quiet=wait_quiet)
        except KeyboardInterrupt:
            err.print(f"\n[yellow]interrupted[/]: containers of run {r.id} removed; the run is marked interrupted; "
                      "continue it with", highlight=False)
            err.print(f"  harness run --resume {r.id}{at}", highlight=False, soft_wrap=True)  # whole, to copy
            raise typer.Exit(130)
        finally:
            if otel_sink is not None:
                otel_sink.close()  # every span sent (or the collector's failure noted) before the summary
    wall = time.monotonic() - t0
    stored = runner.store.get_run(r.id)
    attempts = runner.store.attempts(r.id)
    summary = summarize(stored, attempts)
    summary["wall_s"] = round(wall, 1)
    not_run = dict(stored.excluded or {})
    summary["not_run"] = not_run
    gate_failed = False
    if reqs:
        from harness.cli.report import gate_doc, judge, print_gate

        checks, notes = judge(stored, attempts, reqs, [])
        gate_failed = any(not c.ok for c in checks)
        if json_out:
            summary["gate"] = gate_doc(stored, checks, notes)
    elif json_out:
        summary["gate"] = None  # no --require: nothing judged
    if json_out:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
        console.print(f"[dim]wall {wall:.0f}s; details: harness report {r.id}{at}   per-attempt: harness trials {r.id}{at}[/]",
                      highlight=False)
        if reqs:
            print_gate(stored, checks, notes)
    slots = len(r.task_ids) * r.trials
    unmeasured = int(summary.get("unmeasured_slots") or 0)
    if slots and unmeasured / slots > max_unmeasured + 1e-12:
        rule, count = _top_rule(summary)
        refill, kept = refill_plan(stored, attempts)
        if not refill:  # a dead controller or the envelope discarded them, or they were refilled once: advice would be refused
            then = (f"none can be refilled ({len(kept)} were discarded by a rule the attempt may cause itself, such as "
                    "controller_lost or an envelope breach, or were refilled once already); a new run measures them again")
        else:
            then = (f"once the cause is gone, `harness run --resume {r.id} --refill-unmeasured{at}` reruns "
                    + ("them" if not kept else f"{len(refill)} of them (the other {len(kept)} cannot be refilled)"))
        err.print(f"[bold red]{unmeasured} of {slots} slot(s) unmeasured[/] ({unmeasured / slots:.0%} > --max-unmeasured "
                  f"{max_unmeasured:g}); the rule that discarded most: {rule} ({count} of the unmeasured slots) -- see `harness report {r.id}{at}`; "
                  f"{then} (exit 3)", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_INFRA)
    if not_run:  # the figures cover fewer tasks than the suite has: not a clean exit
        if not json_out:
            err.print(f"[yellow]{len(not_run)} task(s) could not run here[/] and are in no figure: {', '.join(sorted(not_run))} "
                      "(exit 3; the reasons are above and in `harness report`)", highlight=False)
        raise typer.Exit(EXIT_INFRA)
    if gate_failed:
        raise typer.Exit(EXIT_FAIL)


def _db_arg(db: str | None) -> str:
    """' --db URL' for a hint to copy, with a password in the URL masked (it reaches terminals and CI logs)."""
    if not db:
        return ""
    from urllib.parse import urlsplit, urlunsplit

    try:
        u = urlsplit(db)
        if u.password:
            db = urlunsplit((u.scheme, f"{u.username}:***@{u.hostname}" + (f":{u.port}" if u.port else ""), u.path, u.query, u.fragment))
    except ValueError:
        db = "<your --db>"
    from rich.markup import escape

    return escape(" --db " + shlex.quote(db))


def _top_rule(summary: dict[str, Any]) -> tuple[str, int]:
    """The rule that discarded most attempts of the unmeasured slots (over all discards if none)."""
    from collections import Counter

    c: Counter[str] = Counter()
    for t in summary.get("tasks") or []:
        for u in t.get("unmeasured") or []:
            c.update(u.get("reasons") or [])
    c = c or Counter(summary.get("discard_reasons") or {})
    return c.most_common(1)[0] if c else ("unknown", 0)


def print_run_notes(r: Any) -> None:
    """What a run changed or left out, before it starts (also in `harness report`)."""
    for task, why in (r.excluded or {}).items():
        err.print(Text.assemble(("not run ", "yellow"), f"{task}: ", why.splitlines()[0][:300]))
        for line in why.splitlines()[1:]:
            err.print(Text(line[:200], style="dim"))
    for task, adj in (r.adjustments or {}).items():
        err.print(Text.assemble(("envelope fitted ", "yellow"), f"{task}: {adj.get('note', adj)}"))
    for ref, local in (r.substitutions or {}).items():
        err.print(Text.assemble(("base substituted ", "cyan"), f"{ref} -> {local}"))
    if not r.task_overrides:
        err.print(Text("the tasks' own envelopes are replaced by --profile (each attempt keeps what its task asked for)", style="dim"))


def _parse_ks(text: str) -> list[int]:
    parts = [x.strip() for x in text.split(",")]
    if not any(parts):
        die("--k needs at least one value, e.g. --k 1,2,4")
    if "" in parts:
        die(f"--k {text!r}: an empty value between commas; expected integers like 1,2,4")
    try:
        return [int(x) for x in parts]
    except ValueError:
        die(f"--k {text!r}: expected integers like 1,2,4")


def print_summary(s: dict[str, Any]) -> None:
    """The per-task ✓/✗ rows and the suite metrics, worst tasks first."""
    from harness.report.views import fitted_table

    ks = [k for k in s["ks"]]
    big = [k for k in ks if k > 1]
    rows = sorted(s["tasks"], key=lambda x: (x["metrics"].get("pass@1") if x["metrics"].get("pass@1") is not None else -1, x["task"]))
    cols: dict[str, tuple[str, list[Text]]] = {name: ("right" if name.startswith(("c/", "pass")) else "left", [])
                                               for name in ["task", "trials", "c/n", "pass@1", *(f"pass@{k}" for k in big),
                                                            *(f"pass^{k}" for k in big), "failures"]}
    for x in rows:
        fk = ", ".join(f"{k} {v}" for k, v in sorted(x["failure_kinds"].items()))
        if x["unmeasured"]:
            fk = (fk + "; " if fk else "") + f"{len(x['unmeasured'])} unmeasured"
        marks = Text()
        for m in x["marks"]:
            marks.append(m, style="green" if m == "✓" else "red" if m == "✗" else "")
        cells = {"task": x["task"], "trials": marks, "c/n": f"{x['c']}/{x['n']}", "failures": fk,
                 **{f"pass{sym}{k}": _fmt(x["metrics"].get(f"pass{sym}{k}")) for sym in "@^" for k in ks}}
        for name, (_, col) in cols.items():
            v = cells[name]
            col.append(v if isinstance(v, Text) else Text(v))
    # at 80 columns: the task, its trials, pass@1, what failed and the reliability at the
    # largest k first; the suite line below has every figure whatever is left out
    priority = ["task", "trials", "pass@1", *(f"pass^{k}" for k in big[-1:]), "failures", "c/n",
                *(f"pass^{k}" for k in big[:-1]), *(f"pass@{k}" for k in big)]
    title = f"{s['suite']} · profile {s['profile']} · {plural(s['trials'], 'trial')} · run {s['run_id']}"
    t, hidden = fitted_table(cols, priority, len(rows), "", console.width)
    console.print(title, highlight=False)  # on its own line: a title over a narrow table would break the run id
    console.print(t)
    if hidden:
        console.print(f"[dim]left out for width: {', '.join(hidden)} (widen the terminal, or `harness report {s['run_id']}`)[/]")
    m = s["metrics"]
    out = s.get("excluded") or {}
    n_tasks = len(s["tasks"])

    def fig(key: str) -> str:  # a mean over fewer tasks than the suite has says over how many, in place
        left = len(out.get(key) or [])
        return f"{key} {_fmt(m.get(key))}" + (f" [yellow]({n_tasks - left}/{n_tasks} tasks)[/]" if left and m.get(key) is not None else "")

    keys = ["pass@1"] + [f"pass@{k}" for k in ks if k > 1] + [f"pass^{k}" for k in ks if k > 1]
    console.print("[bold]suite[/] (mean over tasks): " + "   ".join(fig(k) for k in keys), highlight=False)
    a = s["attempts"]
    line = f"attempts {a['total']}: clean {a['clean']}, discarded {a['discarded']}"
    if s["discard_reasons"]:
        reasons = s["discard_reasons"]
        several = sum(reasons.values()) > a["discarded"]  # an attempt that broke two rules is in both
        line += (" (" + ("by rule, an attempt in each it broke: " if several else "")
                 + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) + ")")
    if s["unmeasured_slots"]:
        line += f"; [yellow]{s['unmeasured_slots']} unmeasured slots (not scored)[/]"
    console.print(line, highlight=False)
    mu = s.get("model")
    if mu:
        def tok(v: int | None) -> str:
            return "–" if v is None else f"{v:,}"  # unknown stays unknown, never 0
        none = f" ({mu['calls_without_usage']} calls reported no usage)" if mu["calls_without_usage"] else ""
        console.print(f"model calls {mu['calls']}: tokens in {tok(mu['tokens_in'])}, out {tok(mu['tokens_out'])}{none}; "
                      f"upstream errors {mu['upstream_errors']} ({mu['upstream_discards']} attempts discarded for them); "
                      f"waiting on the model {mu['wait_s']:.1f} s", highlight=False)
    if s.get("excluded"):
        for key, tasks in s["excluded"].items():
            console.print(f"[yellow]{key}[/]: {len(tasks)} task(s) with fewer than k clean trials left out: {', '.join(tasks)}")


def runs(
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    limit: int = typer.Option(30, "--limit", help="Most recent N runs."),
    json_out: bool = typer.Option(False, "--json", help="JSON output."),
) -> None:
    """List runs and their identity (suite, image, profile, cgroup).

    The identity summary: suite hash, image, profile, cgroup version.

    Example:  harness runs --limit 5
    """
    from harness.core.aggregate import summarize
    from harness.store.store import Store, is_default_store, missing_database

    path = missing_database(db)
    if path is not None and is_default_store(path):  # nothing run yet is an answer, not an error
        if json_out:
            print("[]")
        else:
            console.print(f"no runs yet (no database at {path}); start one with `harness run --suite refunds`")
        return
    store = Store.open(db, mode="ro")  # a named database that does not exist (a mistyped --db): one line, exit 2
    out = []
    for r in store.runs(limit):
        s = summarize(r, store.attempts(r.id))
        out.append(
            {
                "run_id": r.id,
                "created_at": r.created_at.isoformat(timespec="seconds"),
                "status": r.status,
                "suite": r.suite,
                "profile": r.profile,
                "tasks": len(r.task_ids),
                "trials": r.trials,
                "sweep_id": r.sweep_id,
                "identity": s["identity"],
                "metrics": s["metrics"],
                "attempts": s["attempts"],
                "unmeasured_slots": s["unmeasured_slots"],
            }
        )
    if json_out:
        print(json.dumps(out, indent=2))
        return
    if not out:
        console.print("no runs yet; start one with `harness run --suite refunds`")
        return
    from harness.report.views import fitted_table

    cells = {
        "run": [o["run_id"] for o in out],  # what you copy: never cut or wrapped (no column is)
        "created": [o["created_at"].replace("T", " ") for o in out],
        "status": [o["status"] for o in out],
        "suite": [o["suite"] for o in out],
        "profile": [o["profile"] for o in out],
        "tasks×n": [f"{o['tasks']}×{o['trials']}" for o in out],
        "pass@1": [_fmt(o["metrics"].get("pass@1")) for o in out],
        "attempts (discarded)": [f"{o['attempts']['total']} ({o['attempts']['discarded']})" for o in out],
        "identity": [f"{o['identity']['identity_hash']} cg{o['identity']['cgroup_version']}" for o in out],
    }
    right = {"tasks×n", "pass@1", "attempts (discarded)"}
    cols = {name: ("right" if name in right else "left", [Text(v) for v in vals]) for name, vals in cells.items()}
    # at 80 columns what tells runs apart comes first; the rest when the terminal is wider
    priority = ["run", "created", "suite", "pass@1", "status", "attempts (discarded)", "tasks×n", "profile", "identity"]
    t, hidden = fitted_table(cols, priority, len(out), "runs (newest first)", console.width)
    console.print(t)
    if hidden:
        console.print(f"[dim]left out for width: {', '.join(hidden)} (widen the terminal, or --json)[/]")


def sweep(
    suite: str = typer.Option(..., "--suite", "-s", help="Suite name or path."),
    profiles: Optional[str] = typer.Option(None, "--profiles", help="Comma-separated profiles, e.g. tight,standard,generous."),
    headroom: Optional[str] = typer.Option(None, "--headroom", help="Instead of --profiles: factors like 1,1.5,2,3 scaling one profile's kill limits."),
    profile: Optional[str] = typer.Option(None, "--profile", "-p", help="With --headroom: the profile to scale (default: the suite's)."),
    trials: Optional[int] = typer.Option(None, "--trials", "-n", help="Trials per task (default: the suite's)."),
    k: Optional[str] = typer.Option(None, "--k", help="k values to report, e.g. '1,2,4' (default: the suite's); each <= trials."),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="Comma-separated task ids (default: all)."),
    seed: int = typer.Option(0, "--seed", help="Same seed for every envelope, so only the envelope changes."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", "-j", help="Lower the concurrency."),
    max_reruns: Optional[int] = typer.Option(None, "--max-reruns", help="Reruns per slot (default: the suite's)."),
    agent: Optional[str] = typer.Option(None, "--agent", help="A built-in agent or one the suite names (as for `run`)."),
    agent_cmd: Optional[str] = typer.Option(None, "--agent-cmd", help="Your agent's command line (as for `run`)."),
    agent_image: Optional[str] = typer.Option(None, "--agent-image", help="Your agent's image (as for `run`)."),
    agent_env: list[str] = typer.Option([], "--agent-env", help="KEY=VALUE for the agent (repeatable; as for `run`)."),
    secret: list[str] = typer.Option([], "--secret", help="A model API key by name, held by the gateway (repeatable; as for `run`)."),
    upstream: list[str] = typer.Option([], "--upstream", help="PROVIDER=URL for the gateway (repeatable; as for `run`)."),
    network: Optional[str] = typer.Option(None, "--network", help="Network policy over each profile's (as for `run`)."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    json_out: bool = typer.Option(False, "--json", help="One JSON document."),
) -> None:
    """Run a suite under several envelopes: what resources alone move.

    Shows how much the score moves with the envelope and nothing else.

    Same tasks, same seeds under each envelope: per envelope pass@1 and pass^k with CIs,
    failure kinds, timeouts and OOM kills, discarded share, and the paired difference from
    the most generous envelope. Each envelope is an ordinary run, linked by a sweep id.

    Examples:

      harness sweep --suite refunds --profiles tight,generous --trials 4 --k 1,2,4

      harness sweep --suite refunds --profile tight --headroom 1,1.5,2,3

      harness sweep --suite refunds --profiles tight,generous --agent llm
    """
    from harness.core.sweep import generosity, paired_vs_reference, scale_profile, summarize_profile
    from harness.engine.profiles import load_profile
    from harness.engine.suites import load_suite
    from harness.engine.sweep import run_sweep

    if (profiles is None) == (headroom is None):
        die("give --profiles P1,P2,... or --headroom F1,F2,... (one of them)")
    try:
        s = load_suite(suite)
        plist: list[tuple[Any, str]] = []
        if profiles is not None:
            names = [p.strip() for p in profiles.split(",") if p.strip()]
            if len(names) < 2:
                die("--profiles needs at least two profiles to compare")
            plist = [(load_profile(n), "") for n in names]
        else:
            try:
                factors = [float(f) for f in headroom.split(",") if f.strip()]
            except ValueError:
                die(f"--headroom {headroom!r}: expected numbers like 1,1.5,2,3")
            if len(factors) < 2 or any(f <= 0 for f in factors):
                die("--headroom needs at least two positive factors")
            base = load_profile(profile or s.profile)
            plist = [scale_profile(base, f) for f in sorted(factors)]
    except ValueError as e:
        die(str(e))
    task_list = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
    try:
        agent_argv = shlex.split(agent_cmd) if agent_cmd else None
    except ValueError as e:
        die(f"--agent-cmd {agent_cmd!r}: {e} (it is split like a shell command line)")
    agent_opts = dict(agent=agent, agent_cmd=agent_argv, agent_image=agent_image, agent_env=list(agent_env), secrets=list(secret),
                      upstreams=list(upstream), network=network)

    def started(prof: Any, runner: Any) -> None:
        if not json_out:
            err.print(f"[bold]{prof.name}[/]: run {runner.run.id} ({plural(len(runner.run.task_ids), 'task')} x {plural(runner.run.trials, 'trial')})", highlight=False)

    sigterm_as_interrupt()
    try:
        sweep_id, results = run_sweep(
            suite, plist, trials=trials, tasks=task_list, seed=seed, db=db, concurrency=concurrency, max_reruns=max_reruns, on_start=started,
            ks=_parse_ks(k) if k else None, agent=agent_opts,
        )
    except KeyboardInterrupt:
        err.print("[yellow]sweep interrupted[/]; finished runs are stored, resume the last one with `harness run --resume last`")
        raise typer.Exit(130)
    ks = list(results[0].ks) if results else [1]
    ref = max(results, key=lambda r: generosity(r.profile))
    rows = []
    for r in results:
        d = summarize_profile(r, ks, seed=seed)
        d["vs_reference"] = paired_vs_reference(r, ref, ks, seed=seed)
        rows.append(d)
    doc = {"sweep_id": sweep_id, "suite": s.name, "reference": ref.profile.name, "ks": ks, "profiles": rows}
    if json_out:
        print(json.dumps(doc, indent=2))
        return
    print_sweep(doc)


def _ci(m: dict | None) -> str:
    if not m or "estimate" not in m:
        return "-"
    return f"{m['estimate']:.3f} [{m['low']:.2f}, {m['high']:.2f}]"


def print_sweep(doc: dict[str, Any]) -> None:
    from harness.model.units import format_size

    ks = [k for k in doc["ks"] if k > 1]
    t = Table(title=f"sweep {doc['sweep_id']} · suite {doc['suite']} · reference (most generous): {doc['reference']}")
    for c in ("profile", "cpus", "memory", "timeout", "pass@1 [95% CI]"):
        t.add_column(c)
    for k in ks:
        t.add_column(f"pass^{k} [95% CI]")
    for c in ("Δpass@1 vs ref [CI]", "p", "timeouts", "OOM", "discarded"):
        t.add_column(c)
    for r in doc["profiles"]:
        e = r["envelope"]
        v = r["vs_reference"]
        delta = "—" if v is None else (f"{100 * v['delta_pass1']:+z.1f} pts [{100 * v['low']:+z.0f}, {100 * v['high']:+z.0f}]" if "delta_pass1" in v else v.get("error", "-"))
        p = "" if not v or "p_value" not in v else f"{v['p_value']:.3f}"
        cells = [r["profile"], f"{e['cpus']:g}", format_size(e["memory"]), f"{e['agent_timeout_s']:g}s", _ci(r["metrics"].get("pass@1"))]
        cells += [_ci(r["metrics"].get(f"pass^{k}")) for k in ks]
        ds = r["discarded_share"]
        cells += [delta, p, str(r["timeouts"]), str(r["oom_killed"]), "-" if ds is None else f"{100 * ds:.0f}%"]
        t.add_row(*cells)
    console.print(t)
    for r in doc["profiles"]:
        console.print(f"[dim]{r['profile']}: run {r['run_id']}{' — ' + r['note'] if r['note'] else ''}[/]", highlight=False)
    console.print("[dim]Δ = this envelope minus the reference, paired per task (same tasks, same seeds); CI and p from the stratified permutation test (the noise floor).[/]")


def register(app: typer.Typer) -> None:
    app.command()(run)
    app.command()(runs)
    app.command()(sweep)
