"""``harness run``: the driver. Plans task x trial slots, hands attempts to an executor,
judges what comes back, reruns discarded slots (bounded), and stores every record.

    plan (validated before anything is written) -> executor (exclusive cores per lane of attempts)
      -> attempt pipeline (engine.pipeline) -> record -> store (one transaction each)
      -> clean: slot done | discarded: rerun the slot, or unmeasured once its budget is spent

The driver owns the slot bookkeeping and the store; workers only run attempts. An attempt
that started has a claim in the store until its record lands, so ``--resume`` after a
controller died records what it lost instead of silently repeating it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

import harness
from harness.core import outcome
from harness.core.plan import Progress, SlotState, new_run_id, pending_slots, resolve_ks
from harness.engine.events import EventSink, Fanout
from harness.engine.executor import Done, Executor, LocalExecutor, OrphanClearer, Work
from harness.engine.node import RemoteAttempt, image_facts, node_facts
from harness.core.envelope import envelope_differences
from harness.engine import agents
from harness.engine.pipeline import AttemptJob, AttemptPipeline
from harness.engine.prepare import Prepared, prepare_tasks
from harness.engine.profiles import load_profile
from harness.engine.secrets import GatewayPlan, plan_gateway, refuse_leaks
from harness.engine.scheduler import CpuPool
from harness.engine.suites import builtin_suites_dir, load_suite
from harness.measure import host as hoststats
from harness.model.attempt import AttemptRecord
from harness.model.errors import HarnessError, ProfileError, RunError, StoreLost
from harness.model.profile import Profile
from harness.model.run import MAX_SLOTS, MAX_TRIALS, RunRecord
from harness.model.suite import Suite, Task
from harness.model.units import did_you_mean, one_line, plural, utcnow
from harness.sandbox.basemap import BaseMap
from harness.sandbox.docker_backend import DockerBackend
from harness.sandbox.docker_sandbox import connect
from harness.sandbox.gateway import EgressNetwork, Gateway, host_nameservers
from harness.sandbox.images import (
    HARNESS_IMAGES,
    INPUTS_LABEL,
    SANDBOX_IMAGE,
    SUITE_LABEL,
    dockerfile_inputs,
    image_id,
    image_identity,
    image_labels,
)
from harness.sandbox.owners import controller_id, owner_dead
from harness.store.store import Store, harness_home

HEARTBEAT_S = 10.0  # how often the driver says it is alive
HEARTBEAT_STALE_S = 60.0  # a controller silent this long is taken for dead by --resume
ENGINE_WAIT_S = 120.0  # how long to wait for an engine that went away before going on
UPSTREAM_BACKOFF_S = (2.0, 60.0)  # a slot discarded for the model API waits 2, 4, 8 ... s (at most 60) before its rerun


@dataclass
class RunOptions:
    """Everything ``harness run`` can set; None means "the suite's default"."""

    suite: str
    profile: str | None = None
    trials: int | None = None
    tasks: list[str] | None = None
    seed: int = 0
    concurrency: int | None = None
    max_reruns: int | None = None
    reserve_cores: int | None = None
    agent_image: str | None = None
    agent_cmd: list[str] | None = None
    sweep_id: str | None = None
    note: str = ""
    profile_obj: Profile | None = None  # an in-memory profile (sweeps); wins over `profile`
    ks: list[int] | None = None  # k values to report; default the suite's
    gate_ks: list[tuple[str, int]] | None = None  # run --require: (requirement, its k), each k <= trials
    agent: str | None = None  # a built-in agent: oracle | nop
    base_map: list[str] | None = None  # --base-map FOREIGN=LOCAL entries (per-task image builds)
    log: Any = None  # where build progress goes (one line each)
    secrets: list[str] | None = None  # --secret NAME[=ENVVAR]: model API keys the gateway holds
    upstreams: list[str] | None = None  # --upstream PROVIDER=URL: where the gateway forwards model calls
    network: str | None = None  # --network POLICY: over the profile's
    agent_env: list[str] | None = None  # --agent-env KEY=VALUE: over the suite's (and a named agent's)
    executor: str = "local"  # --executor: local (this machine) or ray (a cluster's nodes)
    ray_address: str | None = None  # --ray-address (else $HARNESS_RAY_ADDRESS; else a one-node cluster here)


def _max_cores(profiles: dict[str, Profile]) -> int:
    """The largest cpuset any task's effective envelope needs."""
    return max(p.cores for p in profiles.values())


def stale_image_reason(client: Any, suite: Suite) -> str | None:
    """Why the suite's image is not what the suite's image inputs build now (None when it is,
    when the image was not built by harness and carries no inputs label, or when the suite
    runs in one of harness's own images). An image harness built from another suite's files,
    or one of its own images tagged with the suite's name, is refused too unless its inputs
    are this suite's. Tasks and fixtures are not image inputs: they reach every attempt at
    run time."""
    labels = image_labels(client, suite.image)
    if labels is None:
        return None
    built = labels.get(INPUTS_LABEL)
    dockerfile = suite.dockerfile_path
    if not built or dockerfile is None or not dockerfile.is_file():
        return None  # not built by harness (a user's own build), or no Dockerfile to compare
    made_for = labels.get(SUITE_LABEL)
    if made_for is None and suite.image in HARNESS_IMAGES:
        return None  # the suite runs in harness's own image, whatever its Dockerfile would add
    now = dockerfile_inputs(client, suite.root, suite.dockerfile, SANDBOX_IMAGE, suite.image_files)
    if now == built:
        return None
    fix = f"build it with `harness images build --suite {suite.root}` so the run measures what the suite says"
    if made_for is None:
        own = {t: image_id(client, t) for t in HARNESS_IMAGES}
        if image_id(client, suite.image) in set(own.values()) - {None}:
            return f"image {suite.image} was not built from suite {suite.name} (it is one of harness's own images under another name); {fix}"
        parent = next((t for t in HARNESS_IMAGES if own[t] and (image_labels(client, t) or {}).get(INPUTS_LABEL) == built), None)
        if parent is not None:  # a label inherited through FROM: built by something else than harness (`docker build`)
            return (f"image {suite.image} was built FROM {parent} by something else than `harness images build` (it carries "
                    f"{parent}'s inputs label, not suite {suite.name}'s), so what it holds is unknown; {fix}")
        # a harness that did not yet record which suite it built from
        return f"image {suite.image} was built from other files than suite {suite.name} has now ({built} != {now}); re{fix}"
    if made_for != suite.name:
        return (f"image {suite.image} was built from suite {one_line(made_for, 60)!r}'s files, not from suite {suite.name}'s "
                f"({built} != {now}); {fix}")
    return f"image {suite.image} was built from other files than suite {suite.name} has now ({built} != {now}); re{fix}"


def wait_for_engine(ping: Any, timeout: float, stop: threading.Event | None = None) -> bool:
    """Block until ``ping()`` is true (an engine back after a restart), up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    delay = 0.2
    while time.monotonic() < deadline:
        if stop is not None and stop.is_set():
            return False
        if ping():
            return True
        time.sleep(delay)
        delay = min(2.0, delay * 1.5)
    return False


class Runner:
    """Executes one run. Build with :meth:`plan` or :meth:`resume`; call :meth:`execute`."""

    def __init__(self, store: Store, run: RunRecord, suite: Suite, profile: Profile, prepared: Prepared, client: Any, pool: CpuPool,
                 resuming: bool = False, claimed_from: str = "", gateway: GatewayPlan | None = None, reserve: int | None = None):
        self.store = store
        self.run = run
        self.suite = suite
        self.profile = profile
        self.prepared = prepared
        self.tasks = {t.id: t for t in prepared.tasks}
        self.client = client
        self.backend = DockerBackend(client, inputs_root=harness_home() / "inputs")
        self.pool = pool
        self.artifacts = Path(run.artifacts_dir)
        self._resuming = resuming
        self._claimed_from = claimed_from
        self._stop = threading.Event()
        self._interrupted = threading.Event()  # set by interrupt() only, not by controller errors
        self._stopping = threading.Event()  # the controller is stopping the run (interrupt or its own error)
        self._engine_down = threading.Event()
        self._unsaved: list[AttemptRecord] = []
        self._count_lock = threading.Lock()
        self._in_flight = 0
        self._n_unsaved = 0
        self.unsaved_path: Path | None = None
        self.gateway_plan = gateway or GatewayPlan()
        self.gateway: Gateway | None = None
        self.egress: EgressNetwork | None = None
        self.reserve = reserve  # --reserve-cores, passed on to Ray nodes
        self._clearer = OrphanClearer(self.backend)
        self._local_node: dict[str, Any] | None = None
        # the pre-run probe of the trial cores begins now and overlaps the rest of the start-up
        # (which runs on the reserved cores); _quiet_check takes its result
        self._probe = self._core_probe() if run.executor != "ray" else None
        self._early_probe: hoststats.CoreProbe | None = None  # see take_probe

    def _core_probe(self) -> "hoststats.CoreProbe | None":
        if probe_seconds() <= 0:
            return None
        return hoststats.CoreProbe([c for c in self.pool.cpus if c not in self.pool.reserved])

    def take_probe(self, probe: "hoststats.CoreProbe | None") -> None:
        """A probe of every core begun earlier, while this process was already kept to the
        reserved cores (the CLI begins one before it imports the engine): quiet over that
        longer window, the pre-run check waits no more. Busy, it may have seen the plan's own
        work (an image build), so this run's own probe decides. Ignored where the run takes
        no probe."""
        if self._probe is not None:
            self._early_probe = probe

    # -- planning --------------------------------------------------------------
    @classmethod
    def plan(cls, opts: RunOptions, db: str | None = None, client: Any = None, store: Store | None = None) -> "Runner":
        """Validate everything (suite, profile, envelope vs cores, image present) before the
        store is opened, so bad input writes nothing; then open the store and build the run."""
        suite = load_suite(opts.suite)
        try:
            profile = opts.profile_obj or load_profile(opts.profile or suite.profile)
        except ProfileError as e:
            if opts.profile_obj or opts.profile:
                raise
            raise ProfileError(f"{suite.root / 'suite.toml'}: profile: {e}") from None
        trials = opts.trials if opts.trials is not None else suite.trials
        if not 1 <= trials <= MAX_TRIALS:
            raise RunError(f"--trials must be 1 to {MAX_TRIALS:,} (got {trials})")
        ks = resolve_ks(opts.ks, list(suite.k), trials, suite.name)
        for text, k in opts.gate_ks or []:  # judged after the run: refused now, not after the run has been paid for
            if k > trials:
                raise RunError(f"--require {text!r}: k={k} exceeds the {plural(trials, 'trial')} per task this run would have "
                               f"(more --trials, or a smaller k)")
        ks = sorted(set(ks) | {k for _, k in opts.gate_ks or []})  # a gate's k is fixed before the run: the report shows it
        max_reruns = opts.max_reruns if opts.max_reruns is not None else suite.max_reruns
        if max_reruns < 0:
            raise RunError("--max-reruns must be >= 0")
        by_id = {t.id: t for t in suite.tasks}
        refused = dict(suite.refused)
        if opts.tasks:
            wanted = [next((i for i in [*by_id, *refused] if i.lower() == t.lower()), t) for t in opts.tasks]
            unknown = [t for t in wanted if t not in by_id and t not in refused]
            if unknown:
                where = suite.name if suite.root.parent.name == "suites" else str(suite.root)
                hint = did_you_mean(unknown[0], [*by_id, *refused]) if len(unknown) == 1 else ""
                raise RunError(f"suite {suite.name} has no task {', '.join(unknown)}{hint}; see `harness suites {where}`")
            refused = {t: refused[t] for t in wanted if t in refused}
            tasks = [by_id[t] for t in dict.fromkeys(wanted) if t in by_id]  # a repeated id runs once
            if not tasks:
                raise RunError("\n".join(f"{t}: {why}" for t, why in refused.items()))
        else:
            tasks = list(suite.tasks)
        if len(tasks) * trials > MAX_SLOTS:
            raise RunError(f"{len(tasks):,} tasks x {trials:,} trials is more than the {MAX_SLOTS:,} slots a run may have; "
                           "fewer trials, or a run per part of the suite (--tasks)")
        pool = CpuPool.for_host(reserve=opts.reserve_cores)
        agent_cmd = agents.run_agent_cmd(opts.agent, opts.agent_cmd, suite)
        named = suite.agents.get(opts.agent or "")
        agent_env = {**(named.env if named else {}), **parse_agent_env(opts.agent_env or [])}
        gw = plan_gateway([*suite.secrets, *(opts.secrets or [])], opts.upstreams or [])
        refuse_leaks(gw, suite, tasks, agent_cmd, agent_env, opts.note)
        profile = network_for_run(profile, opts.network, named.network if named else None, gw)
        if opts.executor == "ray" and profile.network != "none":
            raise RunError(f"--executor ray runs attempts under network none only (this run needs {profile.network}): the model "
                           "gateway and the bridge firewall live on one machine; run it with the local executor")
        if profile.network == "gateway" and not gw.upstreams:
            who = f"agent {opts.agent}" if named and named.network == "gateway" else f"network gateway (profile {profile.name})"
            raise RunError(f"{who} needs a model provider and this run has none, so every model call would be refused: "
                           "pass --secret OPENAI_API_KEY (a real provider) or --upstream openai=URL (a local server)")
        explicit = opts.profile_obj is not None or opts.profile is not None
        task_overrides = suite.format == "native" or not explicit
        try:  # a malformed --base-map is a usage error, before any engine is asked
            BaseMap.parse(opts.base_map, suite.base_map)
        except ValueError as e:
            raise RunError(str(e)) from None
        client = client or connect()
        prep = prepare_tasks(client, suite, tasks, profile, task_overrides, agent_cmd, pool.size, opts.agent_image,
                             opts.base_map, opts.log)
        # every task's envelope is validated (and must fit) before anything is written
        concurrency = pool.concurrency(_max_cores(prep.profiles), opts.concurrency)
        image, digest = _run_image(client, suite, prep, opts.agent_image)
        if not opts.agent_image and suite.image and any(t.build is None for t in prep.tasks):
            stale = stale_image_reason(client, suite)
            if stale:
                raise RunError(stale)
        if agents.builtin(agent_cmd) is None:
            for img in sorted({prep.images[t.id] for t in prep.tasks}):
                user = next((t.sandbox.user for t in prep.tasks if prep.images[t.id] == img and t.sandbox.user), None)
                _check_agent_command(DockerBackend(client), img, image_identity(client, img)[0], agent_cmd[0], profile, user,
                                     list(pool.reserved))
        facts = hoststats.host_facts()
        nodes: dict[str, dict[str, Any]] = {}
        ray_address = ""
        if opts.executor == "ray":
            concurrency, facts, nodes, ray_address = plan_ray(client, suite, prep, profile, opts)
        elif opts.executor != "local":
            raise RunError(f"--executor {opts.executor!r}: one of local, ray")
        store = store or Store.open(db)
        run_id = new_run_id()
        fields = dict(
            id=run_id, created_at=utcnow(), status="running", suite=suite.name, suite_hash=suite.content_hash,
            suite_path=str(suite.root), image=image, image_digest=digest, agent_cmd=agent_cmd,
            profile=profile.name, profile_json=profile.model_dump(mode="json"), harness_version=harness.__version__,
            host=facts, cgroup_version=str(facts.get("cgroup_version", "")), trials=trials, ks=ks, max_reruns=max_reruns,
            seed=opts.seed, concurrency=concurrency, task_ids=[t.id for t in prep.tasks], sweep_id=opts.sweep_id,
            artifacts_dir=str((store.artifacts_root() / run_id).resolve()), note=opts.note,
            images=dict(prep.digests), substitutions=dict(prep.substitutions), task_bases=dict(prep.bases), task_overrides=task_overrides,
            excluded={**refused, **prep.excluded}, adjustments=dict(prep.adjustments),
            agent_name=opts.agent if named else "", agent_env=agent_env, secrets=list(gw.names),
            upstreams=dict(gw.upstreams), executor=opts.executor, nodes=nodes, ray_address=ray_address,
        )
        run = RunRecord(**fields)
        run = run.model_copy(update={"identity_hash": run.identity.hash()})
        return cls(store, run, suite, profile, prep, client, pool, gateway=gw, reserve=opts.reserve_cores)

    @classmethod
    def resume(cls, run_id: str, db: str | None = None, client: Any = None, concurrency: int | None = None,
               reserve_cores: int | None = None, executor: str | None = None, ray_address: str | None = None,
               refill: bool = False) -> "Runner":
        """Pick up a run whose controller died or was interrupted: the same suite (by content
        hash), the same envelope (the stored profile), the same seeds. Slots with a clean
        attempt, or whose rerun budget is spent, are left alone; the others continue with
        the next attempt number, so no slot is filled twice.

        ``refill``: unmeasured slots whose discards were all the machine's or the model API's
        (host or upstream rules; never an envelope breach) get a fresh rerun budget, recorded
        in ``runs.refills``; their discarded attempts stay as evidence. A complete run can be
        refilled."""
        ro = Store.open(db, mode="ro")  # nothing is written until every check holds
        run = ro.get_run(run_id)
        refills: dict[str, int] = {}
        if refill:
            refills, kept = refill_plan(run, ro.attempts(run.id))
            if not refills:
                why = (f"; {len(kept)} unmeasured slot(s) are kept as they are (an envelope breach or a dead controller "
                       f"is the agent's own, and a slot is refilled once): {', '.join(kept[:6])}") if kept else ""
                raise RunError(f"run {run.id}: no unmeasured slot to refill (only slots discarded for host or upstream reasons "
                               f"are, once){why}")
            run = run.model_copy(update={"refills": {**run.refills, **refills}})
        elif run.status == "complete":
            raise RunError(f"run {run.id} is complete; nothing to resume (unmeasured slots discarded for host or upstream "
                           "reasons can be given a fresh rerun budget with --refill-unmeasured)")
        if run.status == "running":
            _refuse_live_owner(run)
        try:
            suite = load_suite(run.suite_path or run.suite)
        except HarnessError as e:
            raise RunError(f"run {run.id}: cannot load its suite from {run.suite_path}: {e}") from None
        if suite.content_hash != run.suite_hash:
            raise RunError(
                f"run {run.id}: suite {suite.name} changed since the run started (hash {suite.content_hash[:12]} != "
                f"{run.suite_hash[:12]}); resuming would mix two suites in one run — start a new run"
            )
        profile = Profile.model_validate(run.profile_json)
        by_id = {t.id: t for t in suite.tasks}
        tasks = [by_id[t] for t in run.task_ids]
        pool = CpuPool.for_host(reserve=reserve_cores)
        client = client or connect()
        adjust = {t: {k: v for k, v in a.items() if k in ("cores", "cpus")} for t, a in run.adjustments.items()}
        prep = prepare_tasks(client, suite, tasks, profile, run.task_overrides, list(run.agent_cmd), pool.size,
                             None if run.images or run.image == PER_TASK else (run.image if run.image != suite.image else None),
                             None, None, adjustments=adjust)
        _, digest = _run_image(client, suite, prep, None if run.image in (suite.image, PER_TASK) else run.image)
        changed = [t for t, d in prep.digests.items() if run.images.get(t) != d]
        if digest != run.image_digest or changed or prep.excluded:
            what = f"image {run.image} changed ({digest[:19]} != {run.image_digest[:19]})" if digest != run.image_digest else \
                f"the image of task(s) {', '.join(changed or list(prep.excluded))} changed or cannot be built"
            raise RunError(f"run {run.id}: {what} since the run started; start a new run")
        run_conc = pool.concurrency(_max_cores(prep.profiles), concurrency if concurrency is not None else run.concurrency)
        facts = hoststats.host_facts()
        kind = executor or run.executor or "local"
        if ray_address and kind != "ray":
            raise RunError(f"--ray-address joins a Ray cluster, and run {run.id} resumes on the {kind} executor: "
                           "give --executor ray with it, or leave the address out")
        nodes = dict(run.nodes)
        if kind == "ray":
            opts = RunOptions(suite=run.suite, concurrency=concurrency, reserve_cores=reserve_cores, executor="ray",
                              ray_address=ray_address or (run.ray_address if run.executor == "ray" else "") or None)
            run_conc, facts, nodes, joined = plan_ray(client, suite, prep, profile, opts)
            nodes = {**run.nodes, **nodes}
            ray_address = joined
        elif kind != "local":
            raise RunError(f"--executor {kind!r}: one of local, ray")
        now = {"harness_version": harness.__version__, "cgroup_version": str(facts.get("cgroup_version", ""))}
        differs = [f"{k} {getattr(run, k)} -> {v}" for k, v in now.items() if str(getattr(run, k)) != v]
        if differs:
            raise RunError(
                f"run {run.id} was started under another identity ({'; '.join(differs)}); resuming would "
                "mix two environments in one run — start a new run"
            )
        run = run.model_copy(update={"concurrency": run_conc, "executor": kind, "nodes": nodes,
                                     "ray_address": (ray_address or "") if kind == "ray" else run.ray_address})
        gw = plan_gateway(run.secrets, [f"{p}={u}" for p, u in run.upstreams.items()])
        return cls(Store.open(db), run, suite, profile, prep, client, pool, resuming=True, claimed_from=run.controller or "", gateway=gw,
                   reserve=reserve_cores)

    # -- execution -------------------------------------------------------------
    def execute(self, events: EventSink | None = None, wait_quiet: float | None = None) -> Progress:
        """Run every slot to a clean attempt or to unmeasured. Ctrl-C (or SIGTERM) removes
        the run's containers and marks the run interrupted (resumable with ``--resume``).

        Before the first lease the trial cores are probed (``HARNESS_PROBE_S``, 0.3 s): a busy
        core is named with what keeps it busy; ``wait_quiet`` seconds > 0 waits for quiet."""
        sink = Fanout([events] if events else [])
        self._wait_quiet = wait_quiet
        self._networks_up()  # before anything is stored: a gateway that cannot start writes nothing
        try:
            return self._execute(sink)
        except BaseException as e:
            self._mark_ended(e)
            raise
        finally:
            self._networks_down()

    def _mark_ended(self, e: BaseException) -> None:
        """A run whose controller stops on an error or Ctrl-C never stays 'running' in the store
        (resumable as before: --resume takes any run not complete)."""
        try:
            if self.store.get_run(self.run.id).status == "running":
                self.store.set_run_status(self.run.id, "interrupted" if isinstance(e, KeyboardInterrupt) else "failed")
        except Exception:
            pass  # never stored, or the store is what failed

    def _execute(self, sink: Fanout) -> Progress:
        me = controller_id()
        if self._resuming:
            if not self.store.claim_run(self.run.id, self._claimed_from, me):
                raise RunError(f"run {self.run.id} was just claimed by another controller; not resuming it twice")
            self.store.update_run(self.run.id, concurrency=self.run.concurrency, executor=self.run.executor, nodes=self.run.nodes,
                                  ray_address=self.run.ray_address, refills=dict(self.run.refills))
            self._import_unsaved()
            self._record_lost_attempts()
        else:
            self.run = self.run.model_copy(update={"controller": me, "heartbeat_at": utcnow()})
            self.store.add_run(self.run)
        self.artifacts.mkdir(parents=True, exist_ok=True)
        # containers and input folders of a dead controller are leftovers: remove them before leasing cores
        if self.backend.sweep_dead_owners() and self._probe is not None:
            self._probe = self._core_probe()  # what was removed kept the cores busy until now, not after
        if self.run.executor == "ray":
            from harness.engine.ray_executor import sweep_nodes

            sweep_nodes(self.run.id)  # and on every node: a resumed run has nothing running yet
        pend = pending_slots(self.store.attempts(self.run.id), list(self.run.task_ids), self.run.trials, self.run.max_reruns, self.run.seed,
                             self.run.refills)
        self.pool.note, self.pool.on_wait = self.run.id, sink.notice
        if pend.slots and self.run.executor != "ray":
            self._quiet_check(sink, getattr(self, "_wait_quiet", None))
        prog = pend.progress
        sink.run_started(self.run, prog)
        return self._slots(sink, pend)

    def _quiet_check(self, sink: Fanout, wait_s: float | None) -> None:
        """Probe the trial cores once (or until quiet, up to ``wait_s``) and say what keeps them busy."""
        probe_s = probe_seconds()
        if probe_s <= 0:
            return
        cores = [c for c in self.pool.cpus if c not in self.pool.reserved]
        deadline = time.monotonic() + (wait_s or 0.0)
        said = False
        probe = self._probe if self._probe is not None and self._probe.age() < PROBE_FRESH_S else None
        early, self._probe, self._early_probe = self._early_probe, None, None
        # quiet since the controller started: no wait of its own. Only while that window is at
        # most twice the probe's length (a neighbour that began late in a long one would be
        # averaged away), and never when the user asked to wait for quiet
        if (early is not None and not wait_s and probe_s <= early.age() <= EARLY_PROBE_SPAN * probe_s
                and not early.result(probe_s, cores=cores)):
            return
        while not self._stop.is_set():
            busy = (probe or hoststats.CoreProbe(cores)).result(probe_s, cores=cores)
            probe = None
            if not busy:
                if said:
                    sink.notice("the trial cores are quiet now; starting")
                return
            line = "; ".join(f"core {c} {share:.0%} busy" + (f" ({', '.join(who)})" if who else "") for c, (share, who) in sorted(busy.items()))
            left = deadline - time.monotonic()
            if left <= 0:
                sink.notice(f"busy trial cores: {line} -- attempts that share them are discarded (host_cpu_contention) and "
                            f"rerun; {'waited ' + format(wait_s, 'g') + ' s; ' if wait_s else ''}stop what runs there, or "
                            "pass --wait-quiet SECONDS to wait for it")
                return
            if not said:
                sink.notice(f"busy trial cores: {line} -- waiting up to {left:.0f} s for them to be quiet (--wait-quiet)")
                said = True
            time.sleep(min(1.0, max(0.0, left)))

    def _policies(self) -> set[str]:
        return {p.network for p in self.prepared.profiles.values()}

    def _networks_up(self) -> None:
        """The run's gateway (when an attempt may reach it) and its `bridge` network (when one is under it)."""
        pol = self._policies()
        if pol - {"none"}:  # firewall rules a killed controller left behind go first
            EgressNetwork(self.client, self.run.id, []).sweep_stale()
        if pol & {"gateway", "allowlist"} or (self.gateway_plan.upstreams and pol - {"none"}):
            lim = self.profile.gateway.model_dump(mode="json")
            provs = {n: (u, self.gateway_plan.keys.get(n)) for n, u in self.gateway_plan.upstreams.items()}
            self.gateway = Gateway(self.client, self.run.id, list(self.pool.reserved) or list(self.pool.cpus), lim, provs)
            self.gateway.start()
        if "bridge" in pol:
            self.egress = EgressNetwork(self.client, self.run.id, host_nameservers())
            try:
                self.egress.create()
            except BaseException:
                self._networks_down()
                raise

    def _networks_down(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        if self.egress is not None:
            self.backend.sweep_run(self.run.id)  # nothing of the run may still be on the network
            self.egress.remove()

    def _make_executor(self, sink: Fanout) -> Executor:
        if self.run.executor != "ray":
            self._local_node = node_facts(self.client, "")
            return LocalExecutor(self.pool, self.run.concurrency, self._stop, before_attempt=self._engine_gate, clear=self._clearer,
                                 depth=lane_depth())
        from harness.engine.ray_executor import RayExecutor

        def started(work: Work, info: dict[str, Any]) -> None:
            j = work.spec.job  # the claim names the worker: a resume after the driver died records what it lost
            self.store.claim_attempt(self.run.id, j.task.id, j.slot, j.attempt_no, j.seed, f"{info.get('hostname', '')}:ray:{info.get('pid', 0)}")
            sink.attempt_started(self.run.id, j.task.id, j.slot, j.attempt_no, info.get("cpuset", []), node_label(info))

        def lost(work: Work, rule: str, detail: str, info: dict[str, Any]) -> AttemptRecord:
            job = work.spec.job
            facts = dict(self.run.nodes.get(info.get("node_id", ""), {}))
            return outcome.attempt_lost(self.run.id, job.task.id, job.slot, job.attempt_no, job.seed, rule, detail,
                                        self._submitted.get((job.task.id, job.slot, job.attempt_no), utcnow()), utcnow(), node=facts)

        def phase(work: Work, name: str, t0: float, t1: float) -> None:
            j = work.spec.job
            sink.phase(self.run.id, j.task.id, j.slot, j.attempt_no, name, t0, t1)

        return RayExecutor(self._stop, self.artifacts, started, lost, phase, concurrency=self.run.concurrency)

    def _slots(self, sink: Fanout, pend: Any) -> Progress:
        prog = pend.progress
        self._submitted: dict[Any, Any] = {}
        executor = self._make_executor(sink)
        pipeline = AttemptPipeline(self.backend, sink, self._stop, gateway=self.gateway,
                                   egress=self.egress.name if self.egress is not None else None)
        self._executor = executor
        outstanding = 0
        for st in pend.slots:
            executor.submit(self._work(st, pipeline, prog))
            outstanding += 1
        self._error: BaseException | None = None
        self._in_hand: tuple[SlotState, AttemptRecord] | None = None
        beat = time.monotonic()
        try:
            while outstanding:
                done = executor.results(timeout=0.2)
                if time.monotonic() - beat > HEARTBEAT_S:
                    beat = time.monotonic()
                    self.store.heartbeat(self.run.id)
                    if self.gateway is not None:
                        self.gateway.ping()  # the gateway exits on its own if the controller dies
                if done is not None:
                    outstanding += self._take(done, executor, pipeline, prog, sink) - 1
        except KeyboardInterrupt:
            self._on_interrupt(executor, sink, prog, outstanding)
            raise
        except StoreLost as e:
            if self._in_hand is not None and not any(r is self._in_hand[1] for r in self._unsaved):
                self._unsaved.append(self._in_hand[1])
            self._abort_store_lost(executor)
            kept = f"; {self._n_unsaved} record(s) it could not store are in {self.unsaved_path}" if self._n_unsaved else ""
            raise StoreLost(f"{e}; run {self.run.id} stopped and its containers were removed{kept}") from None
        for done in executor.late(timeout=LATE_WAIT_S):  # records of attempts presumed lost that still came
            self.store.add_late(done.result)
        executor.close(timeout=30)
        self.backend.sweep_run(self.run.id)
        self.backend.retry_removals()
        self._sweep_nodes()
        if self._error is not None:
            self._record_lost_attempts(interrupted=True)  # stopped by the controller's own error
        self.store.set_run_status(self.run.id, "failed" if self._error is not None else "complete")
        sink.run_finished(self.store.get_run(self.run.id), prog)
        if self._error is not None:
            raise self._error
        return prog

    def _sweep_nodes(self) -> None:
        if self.run.executor == "ray":
            from harness.engine.ray_executor import sweep_nodes

            sweep_nodes(self.run.id, keep=list(getattr(getattr(self, "_executor", None), "unwritten", [])))

    def _take(self, done: Done, executor: Executor, pipeline: AttemptPipeline, prog: Progress, sink: Fanout) -> int:
        """Handle one finished piece of work; how many were submitted again (0 or 1; a late
        record, which ends no piece of work, counts as one)."""
        if done.late:  # the attempt was recorded lost and its slot rerun: evidence, never counted
            self.store.add_late(done.result)
            return 1
        if done.error is not None:  # a bug in the controller: stop the run, keep the data
            self._error = self._error or done.error
            self._stopping.set()
            executor.stop()
            return 0
        if done.not_started:
            return 0
        self._in_hand = (done.key, done.result)  # stored even if Ctrl-C comes now
        st, rec = done.key, self._settle(done.key, done.result)
        self._store(rec)
        self._in_hand = None
        prog.attempts += 1
        again = 0
        if rec.verdict == "clean":
            if rec.outcome == "pass":
                prog.passed += 1
            else:
                prog.failed += 1
        else:
            prog.discarded += 1
            if "infra_error" in rec.reasons and not self.backend.ping():
                self._engine_down.set()  # the next attempt waits for the engine first
            if self._stop.is_set():
                pass
            elif st.budget_used > self.run.max_reruns:
                prog.unmeasured += 1
            else:
                delay = 0.0
                if any(r.get("scope") == "upstream" and r.get("breached") for r in rec.rules):
                    delay = min(UPSTREAM_BACKOFF_S[1], UPSTREAM_BACKOFF_S[0] * 2 ** (st.budget_used - 1))
                executor.submit(self._work(st, pipeline, prog, delay))
                again = 1
        sink.attempt_finished(rec, prog)
        return again

    def _work(self, st: SlotState, pipeline: AttemptPipeline, prog: Progress, delay: float = 0.0) -> Work:
        """The next attempt of slot ``st`` (numbered and charged now, in the driver)."""
        st.attempts += 1
        st.budget_used += 1
        task = self.tasks[st.task_id]
        profile = self.prepared.profiles[task.id]
        agent_cmd, trees = agents.for_task(list(self.run.agent_cmd), self.suite, task)
        attempt_no = st.attempts
        me = controller_id()

        def run(cpuset: list[int], gate: Any = None) -> tuple[AttemptRecord, bool, Any]:
            with self._count_lock:
                self._in_flight += 1
                beside = self._in_flight
            try:
                self.store.claim_attempt(self.run.id, st.task_id, st.slot, attempt_no, st.seed, me)
                job = AttemptJob(run=self.run, suite=self.suite, task=task, profile=profile, slot=st.slot, attempt_no=attempt_no,
                                 seed=st.seed, cpuset=cpuset, concurrent=beside,
                                 artifacts=self.artifacts / st.task_id / f"slot{st.slot}-attempt{attempt_no}",
                                 image=self.prepared.images[task.id], agent_cmd=agent_cmd, trees=trees,
                                 requested=self.prepared.requested.get(task.id, {}), redact=self.gateway_plan.redact,
                                 node=self._local_node or {}, notes=tuple(self._clearer.notes(cpuset)), gate=gate)
                pipeline.events.attempt_started(self.run.id, st.task_id, st.slot, attempt_no, cpuset)
                out = pipeline.run(job)
                return out.record, out.removed, out.retry_remove
            finally:
                with self._count_lock:
                    self._in_flight -= 1

        spec = None
        if self.run.executor == "ray":
            job = AttemptJob(run=self.run, suite=self.suite, task=task, profile=profile, slot=st.slot, attempt_no=attempt_no,
                             seed=st.seed, cpuset=[], concurrent=0, artifacts=Path(), image=self.prepared.images[task.id],
                             agent_cmd=agent_cmd, trees=trees, requested=self.prepared.requested.get(task.id, {}))
            spec = RemoteAttempt(job=job, cores=profile.cores, rel=f"{st.task_id}/slot{st.slot}-attempt{attempt_no}",
                                 reserve=self.reserve, budget_s=attempt_budget(profile))
            self._submitted[(st.task_id, st.slot, attempt_no)] = utcnow()
        return Work(key=st, cores=profile.cores, run=run, not_before=time.monotonic() + delay if delay else 0.0, spec=spec, gated=True)

    def _settle(self, st: SlotState, rec: AttemptRecord) -> AttemptRecord:
        """Outcome policy applied by the driver: an attempt the controller cut short by
        stopping (Ctrl-C, or a controller error) is not charged; one that ran to its end keeps
        its verdict and reasons; the attempt that spends a slot's budget says so."""
        if self._stopping.is_set() and outcome.cut_short(rec):
            st.budget_used -= 1
            detail = outcome.INTERRUPTED_DETAIL if self._interrupted.is_set() else \
                "the controller stopped the run after an error of its own; not scored, not charged to the rerun budget"
            return outcome.interrupted(rec, detail)
        if rec.verdict == "discarded" and st.budget_used > self.run.max_reruns:
            note = outcome.unmeasured_note(rec, st.budget_used, self.run.max_reruns, st.task_id)
            return rec.model_copy(update={"error": (rec.error + "; " if rec.error else "") + note})
        return rec

    def _store(self, rec: AttemptRecord) -> None:
        try:
            self.store.add_attempt(rec)
        except HarnessError:
            self._unsaved.append(rec)  # never lost: kept beside the artifacts, imported at --resume
            raise

    def _engine_gate(self) -> None:
        """Before an attempt: if the engine went away, wait for it, then remove what could not be removed."""
        if not self._engine_down.is_set():
            return
        if wait_for_engine(self.backend.ping, ENGINE_WAIT_S, self._stop):
            self._engine_down.clear()
            self.backend.sweep_run(self.run.id)
            self.backend.retry_removals()

    def _record_lost_attempts(self, interrupted: bool = False) -> None:
        """Claims without a record become attempts, so nothing that ran goes unrecorded: at
        resume, ``controller_lost`` (its controller died; charged); when this controller was
        interrupted and an attempt's record never came back, ``interrupted`` (not charged)."""
        now = utcnow()
        for c in self.store.orphan_claims(self.run.id):
            rec = outcome.controller_lost(self.run.id, c["task_id"], c["slot"], c["attempt_no"], c["seed"] or 0,
                                          c["controller"] or "?", c["started_at"], now)
            if interrupted:
                rec = outcome.interrupted(rec.model_copy(update={
                    "reasons": ["infra_error"], "rules": [],
                    "error": "the controller was stopped while this attempt ran and its record never came back"}))
            self.store.add_attempt(rec)

    def _import_unsaved(self) -> None:
        """Records a previous controller could not store (its store failed) are stored now,
        each once, before anything is rerun."""
        path = self.artifacts / "unsaved-attempts.jsonl"
        if not path.is_file():
            return
        have = {(a.task_id, a.slot, a.attempt_no) for a in self.store.attempts(self.run.id)}
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            rec = AttemptRecord.model_validate_json(line)  # written by the harness, never by an agent
            if rec.run_id == self.run.id and (rec.task_id, rec.slot, rec.attempt_no) not in have:
                self.store.add_attempt(rec)
                have.add((rec.task_id, rec.slot, rec.attempt_no))
        path.rename(path.with_name(path.name + ".imported"))

    def _on_interrupt(self, executor: Executor, sink: Fanout, prog: Progress, outstanding: int) -> None:
        # a second Ctrl-C or SIGTERM must not cut the clean-up short
        old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.interrupt()
            if self._in_hand is not None:  # finished just before the interrupt: stored as it is
                st, rec = self._in_hand
                self._in_hand = None
                try:
                    self._store(self._settle(st, rec))
                except HarnessError:
                    pass
            # let in-flight attempts land in the store (as `interrupted`) before exiting
            deadline = time.monotonic() + 15
            while outstanding and time.monotonic() < deadline:
                done = executor.results(timeout=0.2)
                if done is None:
                    continue
                if done.late:
                    try:
                        self.store.add_late(done.result)
                    except HarnessError:
                        pass
                    continue
                outstanding -= 1
                if done.result is not None:
                    rec = self._settle(done.key, done.result)
                    try:
                        self._store(rec)
                    except HarnessError:
                        break
                    sink.attempt_finished(rec, prog)
            executor.close(timeout=5)
            try:
                self._sweep_nodes()  # again: an attempt that started while the first sweep ran
            except Exception:
                pass
            try:  # attempts whose record never came back: interrupted, not lost
                self._record_lost_attempts(interrupted=True)
            except HarnessError:
                pass
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
            self._write_unsaved()

    def interrupt(self) -> None:
        """Stop scheduling, remove this run's containers now, mark the run interrupted."""
        self._interrupted.set()
        self._stopping.set()
        self._stop.set()
        ex = getattr(self, "_executor", None)
        if ex is not None:
            ex.stop()
        self.backend.remove_held()
        self.backend.sweep_run(self.run.id, held_too=True)
        try:
            self._sweep_nodes()
        except Exception:
            pass  # the cluster went away too: each node's next run sweeps what is left
        try:
            self.store.set_run_status(self.run.id, "interrupted")
        except StoreLost:
            pass

    def _abort_store_lost(self, executor: Executor) -> None:
        """The store went away under the run: stop, remove the containers, keep the records."""
        self._stop.set()
        executor.stop()
        self.backend.remove_held()
        self.backend.sweep_run(self.run.id, held_too=True)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            done = executor.results(timeout=0.2)
            if done is None:
                if executor.in_flight() == 0:
                    break
                continue
            if done.result is not None and not done.late:  # a late record's attempt is on record already
                self._unsaved.append(done.result)
        executor.close(timeout=5)
        self._write_unsaved()

    def _write_unsaved(self) -> None:
        """Records the store could not take are kept beside the run's artifacts (JSON lines)."""
        if not self._unsaved:
            return
        path = self.artifacts / "unsaved-attempts.jsonl"
        with path.open("a", encoding="utf-8") as f:
            for rec in self._unsaved:
                f.write(json.dumps(rec.model_dump(mode="json")) + "\n")
        self._n_unsaved += len(self._unsaved)
        self._unsaved.clear()
        self.unsaved_path = path


LATE_WAIT_S = 10.0  # at the end of a run, how long to wait for records of attempts presumed lost
RAY_BUDGET_MARGIN_S = 300.0  # past its timeouts, how long a started attempt may stay silent before it is presumed lost


def attempt_budget(profile: Profile) -> float:
    """How long a distributed attempt may take once it leased its cores before the driver
    presumes it lost: its timeouts (grade twice: grading and exporting) plus a margin
    ($HARNESS_RAY_MARGIN_S, default 300 s) for services, the engine and the copy back."""
    t = profile.timeouts
    try:
        margin = float(os.environ.get("HARNESS_RAY_MARGIN_S", RAY_BUDGET_MARGIN_S))
    except ValueError:
        raise RunError(f"HARNESS_RAY_MARGIN_S={os.environ['HARNESS_RAY_MARGIN_S']!r}: give seconds") from None
    return t.setup + t.agent + 2 * t.grade + max(0.0, margin)


def node_label(info: dict[str, Any]) -> str:
    """hostname/node-id-prefix: how a node is named in progress lines."""
    return f"{info.get('hostname', '') or '?'}/{str(info.get('node_id', ''))[:8]}"


def images_needed(suite: Suite, prep: Prepared) -> list[str]:
    """Every image a run's attempts start: the tasks', their services', the state kinds'
    services and separate verifiers'."""
    from harness.state import grader as grader_named
    from harness.state import state_kind

    out = set()
    for t in prep.tasks:
        out.add(prep.images[t.id])
        out.update(s.image for s in (*suite.services, *t.services))
        kind = state_kind(t.state_kind)
        out.update(r.spec.image for r in kind.prepare(suite, t).services)
        plan = grader_named(t.grader_kind).plan(suite, t, kind)
        if plan.image:
            out.add(plan.image)
    return sorted(i for i in out if i)


PROBE_MAX_S = 10.0
PROBE_FRESH_S = 10.0  # a probe begun at start-up longer ago than this is taken afresh
EARLY_PROBE_SPAN = 2.0  # the CLI's early probe answers only while it spans at most this many probe lengths


def probe_seconds() -> float:
    """$HARNESS_PROBE_S: seconds of the pre-run probe of the trial cores (default 0.3; 0 turns it off)."""
    text = os.environ.get("HARNESS_PROBE_S", "0.3")
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not 0 <= v <= PROBE_MAX_S:  # also nan and inf
        raise RunError(f"HARNESS_PROBE_S={text!r}: seconds of the pre-run core probe, from 0 (off) to {PROBE_MAX_S:g}, e.g. 0.3")
    return v


def lane_depth() -> int:
    """$HARNESS_LANE_DEPTH: attempts per lane of cores (default 2: the next attempt starts its
    sandbox and sets up (at the lowest CPU weight) while the one before grades and is removed,
    never during an agent window, see
    harness.engine.lanes; 1: one attempt at a time per lane, nothing overlapped)."""
    text = os.environ.get("HARNESS_LANE_DEPTH", "2")
    if text.strip() not in ("1", "2"):
        raise RunError(f"HARNESS_LANE_DEPTH={text!r}: attempts per lane of cores, 1 (none overlapped) or 2 (the default)")
    return int(text)


def refill_plan(run: RunRecord, attempts: list[AttemptRecord]) -> tuple[dict[str, int], list[str]]:
    """(slots to refill: "task/slot" -> their last attempt number, unmeasured slots kept as they
    are: an envelope rule or a dead controller discarded them, or they were refilled once
    already -- a slot unmeasured again after its refill is not the host's alone to explain)."""
    by_slot: dict[tuple[str, int], list[AttemptRecord]] = {}
    for a in attempts:
        by_slot.setdefault((a.task_id, a.slot), []).append(a)
    out, kept = {}, []
    for task in run.task_ids:
        for i in range(run.trials):
            atts = by_slot.get((task, i), [])
            after = run.refills.get(f"{task}/{i}", 0)
            if outcome.first_clean(atts) is not None or outcome.charged(atts, after) <= run.max_reruns:
                continue
            if not after and outcome.refillable(atts, after):  # once per slot: unmeasured again after a refill stays so
                out[f"{task}/{i}"] = max(a.attempt_no for a in atts)
            else:
                kept.append(f"{task}/{i}")
    return out, kept


def plan_ray(client: Any, suite: Suite, prep: Prepared, profile: Profile, opts: RunOptions) -> tuple[int, dict[str, Any], dict[str, dict[str, Any]], str]:
    """Join the cluster and check every node before anything is stored: (concurrency, the
    run's host facts, node id -> facts, the address joined). A node offering harness cores that cannot run the
    attempts (no engine, no cgroups, an image missing or built from other inputs) refuses
    the run with one line naming it."""
    from harness.engine import ray_executor as rx

    nets = {p.network for p in prep.profiles.values()} | {profile.network}
    if nets - {"none"}:
        raise RunError(f"--executor ray runs attempts under network none only (this run needs {', '.join(sorted(nets - {'none'}))}): "
                       "the model gateway and the bridge firewall live on one machine; run it with the local executor")
    address = rx.connect(opts.ray_address, cores=CpuPool.for_host(reserve=opts.reserve_cores).size)
    images = {}
    for img in images_needed(suite, prep):
        f = image_facts(client, img)
        if f is None:
            raise RunError(f"image {img} not found on the driver's engine; build it with `harness images build` first")
        images[img] = f
    answers = rx.check_nodes(images, opts.reserve_cores, harness.__version__)
    offering = [a for a in answers if a["harness_cores"] > 0]
    bad = [a for a in offering if a["problems"]]
    if bad:
        raise RunError("\n".join(f"node {a['facts'].get('hostname', a.get('address', ''))} ({a['node_id'][:12]}): {p}"
                                 for a in bad for p in a["problems"]))
    need = _max_cores(prep.profiles)
    fit = sum(min(a["harness_cores"], a.get("cores") or 0) // need for a in offering)
    if fit < 1:
        raise RunError(f"no node of the Ray cluster offers {need} {rx.RESOURCE} to lease ({len(answers)} node(s); "
                       f"start nodes with `ray start ... --resources '{{\"{rx.RESOURCE}\": N}}'`, see docs/scale-out.md)")
    nodes = {a["node_id"]: dict(a["facts"], harness_cores=a["harness_cores"]) for a in offering}
    facts = _common_facts(list(nodes.values()))
    return (min(fit, opts.concurrency) if opts.concurrency else fit), facts, nodes, address if opts.ray_address or os.environ.get(rx.ADDRESS_ENV) else ""


def _common_facts(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """A Ray run's host facts: what its nodes share; where they differ, every value ("a | b")."""
    keys = ("kernel", "cpu_model", "logical_cpus", "memory_total", "cgroup_version", "psi", "hostname")  # those of a local run
    out: dict[str, Any] = {}
    for k in keys:
        vals = sorted({str(n.get(k)) for n in nodes if n.get(k) not in (None, "")})
        if vals:
            out[k] = nodes[0][k] if len(vals) == 1 else " | ".join(vals)
    diff = envelope_differences(nodes)
    if diff:
        out["nodes_differ"] = diff
    return out


PER_TASK = "(per task)"  # a run's image when every task has its own


def _run_image(client: Any, suite: Suite, prep: Prepared, agent_image: str | None) -> tuple[str, str]:
    """(image, digest) a run records: the one image its tasks share, or PER_TASK (digests per task)."""
    shared = sorted({prep.images[t.id] for t in prep.tasks if t.id not in prep.digests})
    # the suite's own image is built from its directory (`images build` alone builds the built-in suites)
    dockerfile = suite.dockerfile_path  # None for a suite with no image of its own (Harbor tasks build per task)
    own = dockerfile is not None and dockerfile.is_file() and suite.root.parent != builtin_suites_dir()

    def fix(img: str) -> str | None:
        root = str(suite.root) if suite.root.is_absolute() or "/" in str(suite.root) else f"./{suite.root}"  # never read as a built-in name
        return f"build it with `harness images build --suite {root}`" if own and img == suite.image else None

    if agent_image or (len(shared) == 1 and not prep.digests):
        img = agent_image or shared[0]
        return img, image_identity(client, img, fix(img))[1]
    for img in shared:
        image_identity(client, img, fix(img))
    return PER_TASK, ""


def _check_agent_command(backend: DockerBackend, image: str, image_id: str, command: str, profile: Profile,
                         user: str | None = None, cpus: list[int] | None = None) -> None:
    """Refuse a run whose agent command is not in its image. An image never changes under
    its id, so a command found once in it is not probed again (a file per image, command
    and uid under HARNESS_HOME/checked)."""
    key = hashlib.sha256(f"{image_id}|{command}|{user or profile.user}".encode()).hexdigest()[:32]
    mark = harness_home() / "checked" / key
    if mark.exists():
        return
    why = backend.check_command(image, command, profile, user, cpus)
    if why:
        raise RunError(why)
    try:
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.touch()
    except OSError:
        pass  # no cache: the next run probes again


def parse_agent_env(specs: list[str]) -> dict[str, str]:
    """``--agent-env KEY=VALUE`` entries (stored with the run: part of the agent's identity)."""
    out = {}
    for spec in specs:
        key, eq, value = spec.partition("=")
        if not eq or not key or key.startswith("HARNESS_") or not key.replace("_", "a").isalnum():
            raise RunError(f"--agent-env {spec!r}: give KEY=VALUE (KEY letters, digits, '_', not HARNESS_*)")
        out[key] = value
    return out


def network_for_run(profile: Profile, asked: str | None, agent_needs: str | None, gw: GatewayPlan) -> Profile:
    """The run's network policy: --network, else the profile's, except that a profile saying
    'none' gives way to what the named agent needs, or to 'gateway' when the run holds keys
    or names upstreams (the only way they can be used). Stored in the run's profile."""
    if asked is not None:
        if asked not in ("none", "gateway", "allowlist", "bridge"):
            raise RunError(f"--network {asked!r}: one of none, gateway, allowlist, bridge")
        net = asked
    elif profile.network == "none" and (agent_needs or gw.upstreams):
        net = agent_needs or "gateway"
    else:
        return profile
    if net == "none" and gw.upstreams:
        raise RunError("--network none leaves no way to the model gateway; drop --secret/--upstream or pick gateway")
    if net == profile.network:
        return profile
    data = profile.model_dump()
    data["network"] = net
    if net != "allowlist":
        data["allow"] = []
    try:
        return Profile.model_validate(data)
    except ValidationError as e:
        raise RunError(f"--network {net}: {e.errors()[0]['msg'].removeprefix('Value error, ')} (profile {profile.name})") from None


def controller_gone(run: RunRecord) -> bool:
    """Is the controller of a run marked running gone? Judged by its pid when it ran in this
    pid namespace on this host, else by its heartbeat (silent for HEARTBEAT_STALE_S)."""
    dead = owner_dead(run.controller or "")
    if dead is not None:
        return dead
    if run.heartbeat_at is None:
        return True  # an older harness wrote no heartbeat: nothing says it is alive
    return (utcnow() - run.heartbeat_at).total_seconds() >= HEARTBEAT_STALE_S


def _refuse_live_owner(run: RunRecord) -> None:
    """A run marked running may still have a controller: refuse to run it twice."""
    if controller_gone(run):
        return
    owner = run.controller or ""
    if owner_dead(owner) is False:
        raise RunError(f"run {run.id} is still being run by process {owner.rpartition(':')[2]}; stop it first (Ctrl-C) or wait")
    age = (utcnow() - run.heartbeat_at).total_seconds() if run.heartbeat_at else 0.0
    raise RunError(
        f"run {run.id} is being run by {owner} (another host or pid namespace; its last heartbeat was "
        f"{age:.0f} s ago); resume it once that controller stopped (a run silent for {HEARTBEAT_STALE_S:.0f} s is taken for dead)"
    )
