"""The attempt pipeline: one attempt of one slot, as phases over the extension points.

    services up (private network, health) -> gateway (joins that network; the attempt's token)
      -> sandbox up (envelope read back) -> setup (state kind)
      -> agent (measured, services on the same cores) -> the gateway's record of its calls
      -> stop (tree frozen and killed)
      -> grade (the grader's plan: in the sandbox, in a service, or in a separate sandbox,
         under the grade envelope) -> evidence out -> everything removed -> SLA judge
      -> immutable AttemptRecord

It never raises: whatever happens becomes the record (an engine error or a service that never
became healthy is ``infra_error``, discarded and rerun like any host breach). The controller
reads the agent's content only as the grader's size-capped verdict or reward; the exported
files are kept as evidence, never parsed.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from harness.core import outcome
from harness.core.envelope import PAGE
from harness.core.sla import judge
from harness.core.upstream import summarize
from harness.engine.events import EventSink
from harness.engine.lanes import OPEN
from harness.model.attempt import COUNTER_COLUMNS, AttemptRecord
from harness.model.grade import MAX_VERDICT_BYTES, GradeResult
from harness.model.profile import Profile
from harness.model.errors import SandboxError
from harness.model.run import RunRecord
from harness.model.sandbox import INPUT_DIR, LOGS_DIR, TESTS_DIR, TRANSCRIPT_FILE, WORKDIR, Tree
from harness.model.suite import Suite, Task
from harness.model.units import MiB, format_size, utcnow
from harness.sandbox.base import ROOT_CAPS, Command, Exported, ExportFile, Network, Sandbox, SandboxBackend, SandboxSpec
from harness.sandbox.owners import LABEL_ATTEMPT, LABEL_RUN
from harness.sandbox.finish import without_outward_links
from harness.sandbox.gateway import API_PORT, GATEWAY_NAME, PROXY_PORT, Gateway, new_token
from harness.state import grader as grader_named
from harness.state import state_kind
from harness.state.base import AgentInputs, GradePlan, Grader, ServiceRun, StateKind

LOGS_TMPFS = 16 * MiB  # /logs in a read-only-root sandbox whose task has a verifier


@dataclass(frozen=True)
class AttemptJob:
    """Everything one attempt needs, fixed before it starts."""

    run: RunRecord
    suite: Suite
    task: Task
    profile: Profile  # the effective envelope (the task's override applied, unless --profile replaced it)
    slot: int
    attempt_no: int
    seed: int
    cpuset: list[int]
    concurrent: int
    artifacts: Path
    image: str = ""  # the image the sandbox runs (the task's, else the suite's)
    agent_cmd: list[str] = field(default_factory=list)  # the agent command for this task
    trees: dict[str, Tree] = field(default_factory=dict)  # read-only trees for the agent (/solution, an agent directory)
    requested: dict[str, Any] = field(default_factory=dict)  # the task's own envelope when --profile replaced it
    redact: dict[str, str] = field(default_factory=dict, repr=False)  # secret value -> its name (never written)
    node: dict[str, Any] = field(default_factory=dict)  # the machine it runs on (stamped on the record)
    notes: tuple[str, ...] = ()  # what the executor did before it started (leftovers removed from its cores)
    gate: Any = field(default=None, repr=False, compare=False)  # its lane's gate (harness.engine.lanes); None: alone on its cores


@dataclass(frozen=True)
class AttemptOutput:
    """The record, and whether the sandbox is gone (only then may its cores be leased again;
    until then ``retry_remove`` tries again and says whether it is gone now)."""

    record: AttemptRecord
    removed: bool
    retry_remove: Callable[[], bool] | None = None


class _Draft:
    """The fields of the record being made; frozen into an AttemptRecord at the end."""

    def __init__(self, **fields: Any):
        self.f: dict[str, Any] = dict(fields)

    def note(self, text: str) -> None:
        self.f["error"] = (self.f["error"] + "; " if self.f.get("error") else "") + text


class _Ctx:
    """What the phases found, for the judge."""

    def __init__(self) -> None:
        self.infra: str | None = None
        self.mismatches: list[str] = []
        self.exec_res: Any = None
        self.counters: Any = None
        self.host: Any = None
        self.grade: GradeResult | None = None
        self.started = False


def service_profile(profile: Profile, svc: Any) -> Profile:
    """A service's envelope: its own memory, pids and tmpfs, on the attempt's cores."""
    cpus = min(svc.cpus or profile.cpus, float(profile.cores))
    return profile.model_copy(update={"name": f"{profile.name}+{svc.name}", "cpus": cpus, "memory": svc.memory,
                                      "pids": svc.pids, "tmpfs": dict(svc.tmpfs), "storage": None})


def _root(user: str | None) -> bool:
    return user is not None and user.split(":")[0] in ("0", "root")


class AttemptPipeline:
    """Runs attempts on a sandbox backend. ``stop`` is the run's stop event: an attempt
    whose sandbox starts after it is set is removed at once and recorded as interrupted."""

    def __init__(self, backend: SandboxBackend, events: EventSink, stop: threading.Event, gateway: Gateway | None = None,
                 egress: str | None = None):
        self.backend = backend
        self.events = events
        self.stop = stop
        self.gateway = gateway  # the run's model gateway (None: no attempt of the run reaches one)
        self.egress = egress  # the run's `bridge` network (None: no attempt of the run is under `bridge`)

    def run(self, job: AttemptJob) -> AttemptOutput:
        return _Attempt(self, job).run()


class _Attempt:
    """One attempt's phases (see the module docstring)."""

    def __init__(self, pipeline: AttemptPipeline, job: AttemptJob):
        self.p = pipeline
        self.job = job
        run, task, profile = job.run, job.task, job.profile
        self.d = _Draft(
            run_id=run.id, task_id=task.id, slot=job.slot, attempt_no=job.attempt_no, seed=job.seed,
            verdict="discarded", cpuset=",".join(map(str, job.cpuset)), concurrent=job.concurrent,
            image=job.image or run.image, envelope=profile.model_dump(mode="json"), started_at=utcnow(), artifacts=str(job.artifacts),
            requested_envelope=dict(job.requested), node=dict(job.node),
        )
        for n in job.notes:
            self.d.note(n)
        self.ctx = _Ctx()
        self.sb: Sandbox | None = None
        self.services: dict[str, Sandbox] = {}
        self.net: Network | None = None
        self.extra: list[Sandbox] = []  # a separate verifier's sandbox
        self.inputs = AgentInputs()
        self.root_dirs: list[str] = []  # state paths that are directories of a writable root
        self.t_start = time.monotonic()
        self.token: str | None = None  # this attempt's gateway token while it is registered
        self.gate = job.gate if job.gate is not None else OPEN

    # -- the whole attempt -----------------------------------------------------
    def run(self) -> AttemptOutput:
        job, d, ctx = self.job, self.d, self.ctx
        removed = True
        try:
            kind = state_kind(job.task.state_kind)
            grader = grader_named(job.task.grader_kind)
            inputs = kind.prepare(job.suite, job.task)
            plan = grader.plan(job.suite, job.task, kind)
            job.artifacts.mkdir(parents=True, exist_ok=True)
            self.inputs = inputs
            if self._services_up([*self._declared_services(), *inputs.services]) and self._gateway_up():
                self.sb = self.p.backend.sandbox(self._sandbox_spec(inputs, plan))
                self._attempt(kind, grader, inputs, plan)
        except Exception as e:  # the engine went away mid-attempt, a bug: never lose the attempt
            if not ctx.infra:
                ctx.infra = ("container died during the attempt (engine restart, removal or kill outside the harness)"
                             if ctx.started and self.sb is not None and not self.sb.alive() else f"{type(e).__name__}: {str(e)[:300]}")
            d.note(traceback.format_exc(limit=3)[-1500:])
        finally:
            removed = self._down()
            record = self._finish()
        sb = self.sb
        return AttemptOutput(record=record, removed=removed, retry_remove=None if removed or sb is None else sb.remove)

    def _waited(self, t0: float) -> None:
        """A wait on the lane longer than a millisecond is a phase of its own ("lane")."""
        if time.monotonic() - t0 > 1e-3:
            self._phase("lane", t0)

    def _phase(self, name: str, t0: float) -> None:
        j = self.job
        t1 = time.monotonic()
        self.d.f.setdefault("phases", []).append({"name": name, "start_s": round(t0 - self.t_start, 4), "wall_s": round(t1 - t0, 4)})
        self.p.events.phase(j.run.id, j.task.id, j.slot, j.attempt_no, name, t0, t1)

    def _labels(self) -> dict[str, str]:
        j = self.job
        return {LABEL_RUN: j.run.id, LABEL_ATTEMPT: f"{j.task.id}/{j.slot}/{j.attempt_no}"}

    # -- services --------------------------------------------------------------
    def _declared_services(self) -> list[ServiceRun]:
        return [ServiceRun(spec=s) for s in (*self.job.suite.services, *self.job.task.services)]

    def _policy(self) -> str:
        return self.job.profile.network

    def _wants_gateway(self) -> bool:
        return self.p.gateway is not None and self._policy() != "none"

    def _gateway_up(self) -> bool:
        """Put the run's gateway on the attempt's private network and give the attempt its token."""
        if not self._wants_gateway():
            return True
        gw = self.p.gateway
        assert gw is not None
        t = time.monotonic()
        try:
            if self.net is None:
                self.net = self.p.backend.network(self._labels())
            try:
                self._register(gw)
            except Exception:
                if not gw.revive():  # a gateway that died is started again; any other error is this attempt's
                    raise
                self.d.note("the model gateway had died and was restarted before this attempt")
                self._register(gw)
        except Exception as e:
            self.ctx.infra = f"the model gateway could not take the attempt: {str(e)[:300]}"
            return False
        finally:
            self._phase("gateway", t)
        return True

    def _register(self, gw: Gateway) -> None:
        ip = gw.attach(self.net.name)
        token = new_token(self.job.run.id)
        j = self.job
        gw.register(token, f"{j.task.id}/{j.slot}/{j.attempt_no}", self._policy(), list(j.profile.allow), ip)
        self.token = token

    def _gateway_env(self) -> dict[str, str]:
        if self.token is None:
            return {}
        base = f"http://{GATEWAY_NAME}:{API_PORT}"
        env = {"OPENAI_BASE_URL": f"{base}/openai/v1", "OPENAI_API_KEY": self.token,
               "ANTHROPIC_BASE_URL": f"{base}/anthropic", "ANTHROPIC_API_KEY": self.token, "HARNESS_GATEWAY_URL": base}
        if self._policy() == "allowlist":
            proxy = f"http://{GATEWAY_NAME}:{PROXY_PORT}"
            no_proxy = ",".join([GATEWAY_NAME, "localhost", "127.0.0.1", *self.services])
            for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
                env[k] = proxy
            env["NO_PROXY"] = env["no_proxy"] = no_proxy
        return env

    def _gateway_close(self) -> None:
        """End the attempt's token and keep what the gateway recorded for it."""
        if self.token is None or self.p.gateway is None:
            return
        token, self.token = self.token, None
        try:
            calls, egress, dropped, dropped_egress = self.p.gateway.close(token)
        except Exception as e:
            self.ctx.infra = self.ctx.infra or f"the model gateway's record of the attempt was lost: {str(e)[:300]}"
            return
        up = summarize(calls, dropped)
        self.upstream = up
        self.d.f["model_calls"] = [c.model_dump(mode="json") for c in calls]
        self.d.f["upstream"] = up.model_dump(mode="json")
        if self._policy() == "allowlist" or egress:
            self.d.f["egress"] = [e.model_dump(mode="json") for e in egress]
            self.d.f["egress_summary"] = {"allowed": sum(e.allowed for e in egress), "refused": sum(not e.allowed for e in egress),
                                          "dropped": dropped_egress}

    upstream: Any = None

    def _services_up(self, runs: list[ServiceRun]) -> bool:
        """Start every service on a fresh private network and wait until each is healthy."""
        if not runs:
            return True
        t = time.monotonic()
        try:
            self.net = self.p.backend.network(self._labels())
            for r in runs:
                s = r.spec
                spec = SandboxSpec(image=s.image, profile=service_profile(self.job.profile, s), cpuset=self.job.cpuset,
                                   labels=self._labels(), inputs=dict(r.inputs), with_grade_dir=True, user=s.user or r.tmpfs_owner,
                                   writable_root=s.writable_root, network=self.net.name, aliases=(s.name,), env=dict(s.env),
                                   command=list(s.command) if s.command else [])
                sb = self.p.backend.sandbox(spec)
                self.services[s.name] = sb
                sb.start()
                if sb.envelope is not None:
                    self.ctx.mismatches += [f"service {s.name}: {m}" for m in sb.envelope.mismatches]
            for r in runs:
                why = self.services[r.spec.name].healthy(r.spec.health, r.spec.health_timeout, self.p.stop)
                if why:
                    self.ctx.infra = f"service {r.spec.name} ({r.spec.image}) {why}"
                    return False
        except Exception as e:
            self.ctx.infra = f"service could not start: {str(e)[:300]}"
            return False
        finally:
            self._phase("services", t)
        return True

    # -- the sandbox -----------------------------------------------------------
    def _sandbox_spec(self, inputs: Any, plan: GradePlan) -> SandboxSpec:
        job, task = self.job, self.job.task
        sbo = task.sandbox
        user = sbo.user or job.profile.user
        tmpfs = dict(inputs.tmpfs)
        if sbo.writable_root:
            # the engine's archive API (how a writable root is exported) cannot see into a
            # tmpfs: the state's paths are plain directories of the root, emptied at setup
            self.root_dirs = list(tmpfs)
            tmpfs = {}
        verifier_here = plan.output == "reward" and plan.site == "sandbox"
        if not sbo.writable_root and (verifier_here or sbo.logs):
            tmpfs.setdefault(LOGS_DIR, LOGS_TMPFS)
        return SandboxSpec(
            image=job.image or job.run.image, profile=job.profile, cpuset=job.cpuset, labels=self._labels(),
            inputs={**inputs.files, "prompt.txt": task.prompt.encode()}, with_grade_dir=True, user=sbo.user,
            writable_root=sbo.writable_root, tmpfs=tmpfs,
            late_dirs=(TESTS_DIR,) if plan.tests is not None and plan.site == "sandbox" else (),
            trees=dict(job.trees), network=self.net.name if self.net else None,
            egress=self.p.egress if job.profile.network == "bridge" else None,
            workdir=sbo.workdir, caps=ROOT_CAPS if _root(user) and sbo.writable_root else (),
        )

    def _attempt(self, kind: StateKind, grader: Grader, inputs: Any, plan: GradePlan) -> None:
        job, d, ctx, sb = self.job, self.d, self.ctx, self.sb
        assert sb is not None
        t = time.monotonic()
        try:
            sb.start()
        except Exception as e:
            ctx.infra = str(e)
            return
        finally:
            self._phase("sandbox", t)
            self.gate.started()
        ctx.started = True
        d.f["container"] = sb.name
        if self.p.stop.is_set():
            ctx.infra = "the controller was stopped before the agent started"
            return
        if sb.envelope is not None:
            ctx.mismatches = list(sb.envelope.mismatches) + ctx.mismatches
            applied = sb.envelope.applied
            d.f["envelope_applied"] = applied.model_dump(mode="json") if applied else {}
            if applied is not None:
                d.f["memory_max"], d.f["pids_max"] = applied.memory_max, applied.pids_max
        d.f["envelope_notes"] = list(getattr(sb, "notes", []))
        t = time.monotonic()
        # on a lane, it sets up beside the grading of the attempt before it, at the lowest CPU
        # weight of the cores (that grading has them whenever it wants them); where the weight
        # cannot be set, that grading finishes first
        ok = self.gate.work(self.p.stop, yield_cpu=sb.yield_cpu)
        self._waited(t)
        if not ok:
            ctx.infra = "the controller was stopped before the agent started"
            return
        if not self._setup(inputs):
            return
        if not self._agent(inputs):
            return
        # orphans the agent left behind must not touch the state while it is graded and copied out
        t = time.monotonic()
        sb.kill_tree()
        self._phase("stop", t)
        if sb.workload_alive():
            ctx.infra = "agent processes survived the kill; the final state cannot be trusted"
            return
        self._grade(kind, grader, plan)
        if ctx.grade is not None and ctx.grade.status == "broken":
            ctx.infra = f"grading failed: {ctx.grade.reason}"
        oom_down = ctx.grade is not None and ctx.grade.status == "ungradable" and self._agent_oom()
        if not sb.alive() and not ctx.infra and not oom_down:
            ctx.infra = "container died while the final state was graded or exported"

    def _setup(self, inputs: Any) -> bool:
        job, d, ctx, sb = self.job, self.d, self.ctx, self.sb
        sbo = job.task.sandbox
        cmds: list[tuple[list[str], str | None]] = []
        if sbo.logs and sbo.writable_root:
            # Harbor's folders, writable by the agent's user whoever it is
            cmds.append((["sh", "-c", f"mkdir -p {LOGS_DIR}/agent {LOGS_DIR}/verifier {LOGS_DIR}/artifacts && chmod 0777 "
                          f"{LOGS_DIR}/agent {LOGS_DIR}/verifier {LOGS_DIR}/artifacts"], "0:0"))
        elif sbo.logs or LOGS_DIR in sb.spec.tmpfs:
            cmds.append((["mkdir", "-p", f"{LOGS_DIR}/agent", f"{LOGS_DIR}/verifier", f"{LOGS_DIR}/artifacts"], None))
        if self.root_dirs:
            owner = sbo.user or job.profile.user or "0:0"
            cmds.append((["sh", "-c", 'u="$1"; shift; for p; do rm -rf -- "$p" && mkdir -p -- "$p" && chown -- "$u" "$p" || exit 1; done',
                          "sh", owner, *self.root_dirs], "0:0"))
        cmds += [(c, None) for c in inputs.setup]
        if not cmds:
            return True
        t = time.monotonic()
        wall = 0.0
        try:
            for cmd, user in cmds:
                res = sb.exec(cmd, timeout=job.profile.timeouts.setup, user=user)
                wall += res.wall_s
                if res.exit_code != 0:
                    ctx.infra = (f"setup failed (exit {res.exit_code}{', timed out' if res.timed_out else ''}): "
                                 f"{((res.stderr or res.stdout).strip().splitlines() or [''])[-1][:300]}")
                    return False
        finally:
            d.f["setup_wall_s"] = round(wall, 4)
            self._phase("setup", t)
        return True

    def _agent_env(self, inputs: Any) -> dict[str, str]:
        job, task = self.job, self.job.task
        workdir = task.sandbox.workdir or WORKDIR
        env = {
            **job.suite.agent_env,
            **job.run.agent_env,
            **task.sandbox.env,
            **inputs.env,
            "HARNESS_SEED": str(job.seed),
            "HARNESS_TASK_ID": task.id,
            "HARNESS_TRIAL": str(job.slot),
            "HARNESS_ATTEMPT": str(job.attempt_no),
            "HARNESS_RUN_ID": job.run.id,
            "HARNESS_PROMPT_FILE": f"{INPUT_DIR}/prompt.txt",
            "HARNESS_TRANSCRIPT": f"{workdir}/{TRANSCRIPT_FILE}" if not task.sandbox.logs else f"{LOGS_DIR}/agent/{TRANSCRIPT_FILE}",
            "HARNESS_WORKDIR": workdir,
            **self._gateway_env(),
        }
        if not task.sandbox.writable_root:
            env["HOME"] = WORKDIR
        return env

    def _agent(self, inputs: Any) -> bool:
        job, d, ctx, sb = self.job, self.d, self.ctx, self.sb
        t = time.monotonic()
        with self.gate.agent(self.p.stop) as ok:  # opens once no sandbox on these cores is starting or being removed
            self._waited(t)
            if not ok:
                ctx.infra = "the controller was stopped before the agent started"
                return False
            try:
                sb.reclaim_cpu()  # its CPU weight back before anything is measured
            except SandboxError as e:
                ctx.infra = str(e)
                return False
            t = time.monotonic()
            m = sb.measured_exec(list(job.agent_cmd or job.run.agent_cmd), timeout=job.profile.timeouts.agent, env=self._agent_env(inputs),
                                 workdir=job.task.sandbox.workdir or None, also=list(self.services.values()))
            self._phase("agent", t)
        self._gateway_close()
        ctx.exec_res, ctx.counters, ctx.host = m.result, m.counters, m.host
        d.f["samples"] = list(m.samples)
        d.f["monitor_errors"] = m.monitor_errors
        d.f["services"] = self._service_record(m.services)
        _write(job.artifacts / "stdout.txt", self._redacted(m.result.stdout).encode(), d)
        _write(job.artifacts / "stderr.txt", self._redacted(m.result.stderr).encode(), d)
        why = outcome.agent_start_failure(m.result)
        if why:
            ctx.infra = why
            return False
        if not sb.alive() and self._agent_oom():
            # the kernel counted OOM kills in the agent's cgroup: its memory ceiling took the
            # container down (where the keeper could not be spared, see DockerSandbox): the
            # agent's doing, a failure, never the engine's
            ctx.grade = GradeResult(status="ungradable", reason="the container did not survive the agent's OOM kill; "
                                    "its final state could not be graded")
            return False
        if not sb.alive():
            if m.counters is None and sb.oom_killed():
                # the same, seen by the engine only: the container (and its cgroup) went before
                # its counters were read (a loaded host). Nothing measured the window, so the
                # attempt is not scored; the discard is charged to the slot as every infra one
                ctx.infra = ("the memory ceiling took the container down (the engine saw an OOM kill) before its counters "
                             "could be read; the attempt is unmeasured")
                return False
            # removed or killed outside the harness (an engine restart, `docker rm`, Ctrl-C):
            # the exit status means nothing, so the attempt cannot be graded
            ctx.infra = "container died during the agent phase (engine restart, removal or kill outside the harness)"
            return False
        if m.counters is None:
            ctx.infra = "the container's cgroup counters could not be read; the attempt is unmeasured"
            return False
        dead = [n for n, s in self.services.items() if not s.alive()]
        if dead:
            ctx.infra = f"service {', '.join(dead)} died during the agent phase"
            return False
        return True

    def _service_record(self, deltas: dict[str, Any]) -> dict[str, dict[str, Any]]:
        out = {}
        for name, s in self.services.items():
            env = s.envelope
            delta = deltas.get(s.name)
            out[name] = {"image": s.spec.image, "container": s.name,
                         "envelope_applied": env.applied.model_dump(mode="json") if env is not None and env.applied else {},
                         "mismatches": list(env.mismatches) if env is not None else [],
                         "counters": delta.model_dump(mode="json") if delta is not None else {}}
        return out

    # -- grading ---------------------------------------------------------------
    def _grade(self, kind: StateKind, grader: Grader, plan: GradePlan) -> None:
        job, d, ctx, sb = self.job, self.d, self.ctx, self.sb
        if plan.output == "verdict" and plan.site == "sandbox" and sb.spec.writable_root:
            # a root agent with a writable root could have replaced the very python that would
            # grade it: its state is graded in a fresh sandbox from the image instead
            plan = dataclasses.replace(plan, site="separate", carry=kind.carry(job.suite, job.task))
        evidence = kind.exports(job.suite, job.task, job.profile)
        one_exec = plan.site == "sandbox" and plan.output == "verdict" and not sb.spec.writable_root and not plan.tests
        if not one_exec:
            carry = [f for f, _ in plan.carry if f.name not in {e.name for e in evidence}]
            self._export(sb, evidence + carry, job.artifacts)
        t = time.monotonic()
        try:
            target = self._grade_target(plan)
            if target is None:
                return
            exp = self._run_grader(target, plan, evidence if one_exec else [])
            if exp is None:
                return
            res = exp.command
            read_back = self._read_back(plan)
            try:
                ctx.grade = grader.read(job.task, res, self._oom, job.profile.timeouts.grade, read_back)
            except Exception as e:  # noqa: BLE001 - what the grader handed over came from the agent's state
                d.note(traceback.format_exc(limit=3)[-1500:])
                ctx.grade = GradeResult(status="ungradable", wall_s=res.wall_s,
                                        reason=f"the grader's output on this state could not be read ({type(e).__name__}: {str(e)[:160]})")
            d.f["grade_wall_s"] = round(res.wall_s, 4)
            if plan.output == "reward":
                _write(job.artifacts / "verifier-stdout.txt", self._redacted(res.stdout).encode(), d)
                _write(job.artifacts / "verifier-stderr.txt", self._redacted(res.stderr).encode(), d)
            elif res.stderr.strip():
                _write(job.artifacts / "grade-stderr.txt", self._redacted(res.stderr).encode(), d)
        finally:
            self._phase("grade", t)
        if one_exec and not exp.complete:
            self._export(sb, evidence, job.artifacts)

    def _grade_target(self, plan: GradePlan) -> Sandbox | None:
        """Where the plan runs, with the grade envelope applied (read back), or None (recorded why)."""
        job, ctx = self.job, self.ctx
        if plan.site == "service":
            target = self.services.get(plan.service or "")
            if target is None:
                ctx.grade = GradeResult(status="broken", reason=f"the grader needs service {plan.service!r}, which this attempt does not have")
                return None
        elif plan.site == "separate":
            target = self._separate(plan)
            if target is None:
                return None
        else:
            target = self.sb
        now = target.snapshot()
        used = (now.memory_current or 0) if now is not None else 0
        limit = -(-(used + job.profile.grade.memory) // PAGE) * PAGE
        quota = job.profile.grade_quota_us
        applied = target.set_envelope(limit, quota)
        self.d.f["grade_envelope"] = {
            "memory_max": applied.memory_max if applied else None, "cpu_quota_us": applied.cpu_quota_us if applied else None,
            "memory_in_use": used, "memory_for_grader": job.profile.grade.memory, "timeout_s": job.profile.timeouts.grade,
            "site": plan.site if plan.site != "service" else f"service {plan.service}",
        }
        if applied is None and self._agent_oom() and not target.alive():
            # the memory ceiling took the container down with the agent: the envelope's doing, not the host's
            ctx.grade = GradeResult(status="ungradable", reason="the container did not survive the agent's OOM kill; "
                                    "its final state could not be graded")
            return None
        if applied is None or applied.memory_max is None or abs(applied.memory_max - limit) > PAGE or applied.cpu_quota_us != quota:
            gone = "" if target.alive() else f"; the container is gone ({target.how_it_ended() or 'no word from its engine'})"
            ctx.grade = GradeResult(status="broken", reason=f"grade envelope not applied{gone} (asked memory {format_size(limit)}, "
                                    f"quota {quota} us; kernel {applied.memory_max if applied else None}, "
                                    f"{applied.cpu_quota_us if applied else None})")
            return None
        return target

    def _agent_oom(self) -> bool:
        c = self.ctx.counters
        return c is not None and (c.oom_kills or 0) > 0

    def _separate(self, plan: GradePlan) -> Sandbox | None:
        """A fresh sandbox from the task's image (or the verifier's) with the carried state in."""
        job, ctx = self.job, self.ctx
        user = plan.user or job.task.sandbox.user or job.profile.user
        spec = SandboxSpec(image=plan.image or job.image or job.run.image, profile=job.profile, cpuset=job.cpuset,
                           labels=self._labels(), inputs=dict(self.inputs.files), with_grade_dir=True, user=user, writable_root=True,
                           network=self.net.name if self.net else None, workdir=plan.workdir or job.task.sandbox.workdir,
                           caps=ROOT_CAPS if _root(user) else ())
        t = time.monotonic()
        try:
            sep = self.p.backend.sandbox(spec)
            self.extra.append(sep)
            sep.start()
            for f, dest in plan.carry:
                tar = job.artifacts / f"{f.name}.tar"
                if tar.is_file():
                    if f.path:  # the image's own copy of that path must not mix with the agent's
                        sep.exec(["rm", "-rf", "--", f.path], timeout=60, user="0:0", workdir="/")
                    if plan.output == "verdict":  # the harness's grader reads links as links (a change, never followed)
                        sep.put_archive(dest, tar)
                        continue
                    # a verifier command would follow them: links out of the tree are not carried
                    safe = tar.with_name(f"{f.name}.carried.tar")
                    dropped = without_outward_links(tar, safe)
                    if dropped:
                        self.d.note(f"{len(dropped)} link(s) pointing outside {f.path or f.name} not carried to the verifier: "
                                    f"{', '.join(dropped[:5])}"[:400])
                    sep.put_archive(dest, safe)
                    safe.unlink(missing_ok=True)
        except Exception as e:
            ctx.infra = f"the separate verifier sandbox could not be made: {str(e)[:300]}"
            return None
        finally:
            self._phase("verifier-sandbox", t)
        return sep

    def _run_grader(self, target: Sandbox, plan: GradePlan, evidence: list[ExportFile]) -> Exported | None:
        job = self.job
        if plan.files:
            target.put_grade_files(plan.files)
        if plan.tests is not None:
            target.put_tree(TESTS_DIR, plan.tests)
        self._grade_dir = job.artifacts / "grade"
        if not evidence:
            self._grade_dir.mkdir(exist_ok=True)
        before = target.snapshot()
        cap = MAX_VERDICT_BYTES if plan.output == "verdict" else job.profile.output_cap
        then = Command(list(plan.cmd), job.profile.timeouts.grade, cap)
        timeout = job.profile.timeouts.grade
        if evidence:  # one exec: the grader, then the agent's evidence
            exp = target.export(evidence, timeout=timeout, dest=job.artifacts, then=then)
        else:
            user = plan.user if plan.user is not None else ("" if plan.site == "service" else None)
            exp = target.export([*plan.reads, *plan.evidence], timeout=timeout, dest=self._grade_dir, then=then,
                                reset=list(plan.reset), env=dict(plan.env) or None, cwd=plan.workdir, user=user,
                                kill_after=plan.output == "reward")
        after = target.snapshot()
        if target is self.sb:
            target.kill_tree()
        res = exp.command
        self._oom = res is not None and res.exit_code == 137 and not res.timed_out
        if before is not None and after is not None and before.oom_kills is not None and after.oom_kills is not None:
            self._oom = self._oom or after.oom_kills > before.oom_kills
        if exp.problems:
            self.d.note("; ".join(exp.problems))
        if res is None:
            self.ctx.grade = GradeResult(status="broken", reason="the grader did not run")
            return None
        self._move_evidence(plan)
        return exp

    def _move_evidence(self, plan: GradePlan) -> None:
        """The grader's own evidence (verifier logs, a database dump) beside the attempt's."""
        if not self._grade_dir.is_dir():
            return
        for f in plan.evidence:
            for name in (f.name, f"{f.name}.tar"):
                src = self._grade_dir / name
                if src.is_file():
                    shutil.move(str(src), str(self.job.artifacts / name))

    def _read_back(self, plan: GradePlan) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        if not self._grade_dir.is_dir():
            return out
        for f in plan.reads:
            p = self._grade_dir / f.name
            if p.is_file():
                out[f.name] = p.read_bytes()[: f.cap]
        return out

    _oom = False
    _grade_dir: Path

    def _export(self, sb: Sandbox, files: list[ExportFile], dest: Path) -> None:
        if not files:
            return
        t = time.monotonic()
        exp = sb.export(files, timeout=self.job.profile.timeouts.grade, dest=dest)
        self._phase("export", t)
        if exp.problems:
            self.d.note("; ".join(exp.problems))

    # -- the end ---------------------------------------------------------------
    def _redacted(self, text: str) -> str:
        for value, name in self.job.redact.items():
            text = text.replace(value, f"[secret {name}]")
        return text

    def _down(self) -> bool:
        """Remove the sandbox, the services, the separate verifier and the network."""
        self.gate.remove_begin()  # in-container work ends here; the next attempt's agent waits for this removal (or halt)
        try:
            # once nothing of this attempt runs on the cores, the rest of its removal (the
            # engine's unmounts and deletes) is no longer the lane's business: the next agent
            # window may open (where that cannot be seen from here, the whole removal is waited)
            t, boxes = time.monotonic(), self._containers()
            if all(s.halt() for s in boxes):
                if boxes:
                    self._phase("halt", t)  # from here on nothing of this attempt runs on its cores
                self.gate.remove_end()
            return self._remove_all()
        finally:
            self.gate.remove_end()

    def _containers(self) -> list[Sandbox]:
        return [*self.extra, *([self.sb] if self.sb is not None else []), *self.services.values()]

    def _remove_all(self) -> bool:
        removed = True
        t = time.monotonic()
        self._gateway_close()
        if self.net is not None and self._wants_gateway():
            self.p.gateway.detach(self.net.name)
        for s in self._containers():
            gone = s.remove()
            if not gone:
                self.d.note(f"container {s.name} could not be removed yet; its cores stay leased until it is")
            removed &= gone
        if self.net is not None and removed and not self.net.remove():
            self.d.note(f"network {self.net.name} could not be removed yet (the next sweep removes it)")
        if self.sb is not None or self.services:
            self._phase("remove", t)
        return removed

    def _finish(self) -> AttemptRecord:
        """Judge and freeze the record (in the attempt's ``finally``)."""
        job, d, ctx = self.job, self.d, self.ctx
        f = d.f
        try:
            f["finished_at"] = utcnow()
            f["wall_s"] = round(time.monotonic() - self.t_start, 4)
            res, counters, host = ctx.exec_res, ctx.counters, ctx.host
            if res is not None:
                f.update(exit_code=res.exit_code, timed_out=res.timed_out, agent_wall_s=res.wall_s,
                         terminated_cleanly=res.exit_code == 0 and not res.timed_out)
            if counters is not None:
                for k in COUNTER_COLUMNS:
                    f[k] = getattr(counters, k)
                f["counters"] = counters.model_dump(mode="json")
            if host is not None:
                f.update(foreign_cpu_share=host.foreign_cpu_share, steal_share=host.steal_share,
                         host_psi_cpu=host.psi_cpu_some_share, host_psi_memory=host.psi_memory_some_share,
                         host_psi_io=host.psi_io_some_share, mem_available_min=host.mem_available_min,
                         host_counters=host.model_dump(mode="json"))
            g = ctx.grade
            if g is not None:
                f["grade_status"] = g.status
                f["grade_reason"] = g.reason
                f["reward"], f["rewards"] = g.reward, dict(g.rewards)
                if g.verdict is not None:
                    f["grade_checks"] = [c.model_dump(mode="json") for c in g.verdict.checks]
                    if g.verdict.diff is not None:
                        f["state_diff"] = g.verdict.diff.model_dump(mode="json")
                    elif g.verdict.files is not None:
                        f["state_diff"] = {"files": g.verdict.files.model_dump(mode="json")}
                elif g.checks:
                    f["grade_checks"] = [c.model_dump(mode="json") for c in g.checks]
            j = judge(job.profile.sla, host, counters, ctx.mismatches, infra_error=ctx.infra, upstream=self.upstream,
                      agent_wall_s=res.wall_s if res is not None else None)
            f.update(verdict=j.verdict, reasons=j.reasons, rules=[r.model_dump(mode="json") for r in j.rules])
            if ctx.infra:
                d.note(self._redacted(ctx.infra))
            elif g is not None and res is not None:
                f["outcome"], f["failure_kind"], f["grade_reason"] = outcome.graded_outcome(
                    res.exit_code, res.timed_out, f.get("oom_kills"), g, job.profile.timeouts.agent)
                up = self.upstream
                if res.timed_out and up is not None and up.wait_s > 0 and res.wall_s > 0:
                    f["grade_reason"] = (f"{f['grade_reason'] or 'timed out'}; {up.wait_s:.1f} s of the agent's {res.wall_s:.1f} s "
                                         f"({100 * up.wait_s / res.wall_s:.0f}%) was waiting on the model")
            if job.redact:  # an agent that learnt a key (its image, an upstream that echoes it) writes it into what is kept
                self._mask_artifacts()
                f = self._scrubbed(f)
            return AttemptRecord(**f)
        except Exception as e:  # never lose the attempt because the record could not be made
            keep = {k: f[k] for k in ("run_id", "task_id", "slot", "attempt_no", "seed", "cpuset", "container", "image",
                                      "started_at", "finished_at", "artifacts", "wall_s", "node", "phases") if k in f}
            return AttemptRecord(**self._scrubbed(keep), verdict="discarded", reasons=["infra_error"],
                                 error=self._redacted(f"{f.get('error') or ''}; the record could not be made: {type(e).__name__}: {str(e)[:300]}"))

    def _scrubbed(self, v: Any) -> Any:
        """``v`` with every secret value in its strings (keys too, at any depth) replaced by its name."""
        if isinstance(v, str):
            return self._redacted(v)
        if isinstance(v, dict):
            return {self._scrubbed(k): self._scrubbed(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(self._scrubbed(x) for x in v)
        return v

    def _mask_artifacts(self) -> None:
        """Every kept file of the attempt with a secret value in it has the value replaced:
        by the secret's name in a text file (the transcript, output, verifier output), by as
        many ``*`` in any other (a copy of the final state, a SQLite file or a tar of a tree,
        keeps its layout and still opens). Said in the record's notes, by the secret's name."""
        root = self.job.artifacts
        values = [(v.encode("utf-8"), name) for v, name in self.job.redact.items()]
        masked: list[str] = []
        try:
            files = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
        except OSError:
            return
        for p in files:
            try:
                data = p.read_bytes()
                hit = [name for v, name in values if v in data]
                if not hit:
                    continue
                if p.suffix in TEXT_SUFFIXES:
                    data = self._redacted(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
                else:
                    for v, _name in values:
                        data = data.replace(v, b"*" * len(v))
                p.write_bytes(data)
                masked.append(f"{p.relative_to(root)} ({', '.join(dict.fromkeys(hit))})")
            except OSError as e:
                p.unlink(missing_ok=True)  # a secret is never kept: a file that cannot be masked goes
                masked.append(f"{p.relative_to(root)} (could not be masked: {e.strerror or e}; removed)")
        if masked:
            self.d.note(f"secret values masked in the kept files: {'; '.join(masked)}")


TEXT_SUFFIXES = (".txt", ".jsonl", ".json", ".log", ".md")  # kept files a secret is replaced in by its name


def _write(path: Path, data: bytes, d: _Draft) -> None:
    try:
        path.write_bytes(data)
    except OSError as e:
        d.note(f"could not keep {path.name}: {e.strerror or e}")
