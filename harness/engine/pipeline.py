"""The attempt pipeline: one attempt of one slot, as phases over the extension points.

    sandbox up (envelope read back) -> setup (state kind) -> agent (measured)
      -> stop (tree frozen and killed) -> grade (in the sandbox, grade envelope)
      -> export evidence -> sandbox removed -> SLA judge -> immutable AttemptRecord

It never raises: whatever happens becomes the record (an engine error is ``infra_error``,
discarded and rerun like any host breach). The controller reads the agent's content only as
the grader's size-capped verdict; the exported files are kept as evidence, never parsed.
"""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from harness.core import outcome
from harness.core.envelope import PAGE
from harness.core.sla import judge
from harness.model.attempt import COUNTER_COLUMNS, AttemptRecord
from harness.model.grade import MAX_VERDICT_BYTES, GradeResult
from harness.model.profile import Profile
from harness.model.run import RunRecord
from harness.model.suite import Suite, Task
from harness.model.units import format_size, utcnow
from harness.sandbox.base import Command, Sandbox, SandboxBackend, SandboxSpec
from harness.sandbox.owners import LABEL_ATTEMPT, LABEL_RUN
from harness.state import grader as grader_named
from harness.state import state_kind
from harness.model.sandbox import INPUT_DIR, TRANSCRIPT_FILE, WORKDIR
from harness.engine.events import EventSink

@dataclass(frozen=True)
class AttemptJob:
    """Everything one attempt needs, fixed before it starts."""

    run: RunRecord
    suite: Suite
    task: Task
    profile: Profile  # the effective envelope (the task's override applied)
    slot: int
    attempt_no: int
    seed: int
    cpuset: list[int]
    concurrent: int
    artifacts: Path


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


class AttemptPipeline:
    """Runs attempts on a sandbox backend. ``stop`` is the run's stop event: an attempt
    whose sandbox starts after it is set is removed at once and recorded as interrupted."""

    def __init__(self, backend: SandboxBackend, events: EventSink, stop: threading.Event):
        self.backend = backend
        self.events = events
        self.stop = stop

    def run(self, job: AttemptJob) -> AttemptOutput:
        t_start = time.monotonic()
        run, task, profile = job.run, job.task, job.profile
        d = _Draft(
            run_id=run.id, task_id=task.id, slot=job.slot, attempt_no=job.attempt_no, seed=job.seed,
            verdict="discarded", cpuset=",".join(map(str, job.cpuset)), concurrent=job.concurrent,
            image=run.image, envelope=profile.model_dump(mode="json"), started_at=utcnow(), artifacts=str(job.artifacts),
        )
        ctx = _Ctx()
        sb: Sandbox | None = None
        removed = True
        try:
            kind = state_kind(task.state_kind)
            grader = grader_named(task.grader)
            state_inputs = kind.prepare(job.suite, task)
            spec = SandboxSpec(
                image=run.image, profile=profile, cpuset=job.cpuset,
                labels={LABEL_RUN: run.id, LABEL_ATTEMPT: f"{task.id}/{job.slot}/{job.attempt_no}"},
                inputs={**state_inputs.files, "prompt.txt": task.prompt.encode()},
                with_grade_dir=True,
            )
            sb = self.backend.sandbox(spec)
            job.artifacts.mkdir(parents=True, exist_ok=True)
            self._attempt(job, sb, d, ctx, kind, grader, state_inputs)
        except Exception as e:  # the engine went away mid-attempt, a bug: never lose the attempt
            if not ctx.infra:
                ctx.infra = ("container died during the attempt (engine restart, removal or kill outside the harness)"
                             if ctx.started and not sb.alive() else f"{type(e).__name__}: {str(e)[:300]}")
            d.note(traceback.format_exc(limit=3)[-1500:])
        finally:
            if sb is not None:
                t = time.monotonic()
                removed = sb.remove()
                self._phase(job, "remove", t)
                if not removed:
                    d.note(f"container {sb.name} could not be removed yet; its cores stay leased until it is")
            record = self._finish(job, d, ctx, t_start)
        return AttemptOutput(record=record, removed=removed, retry_remove=None if removed or sb is None else sb.remove)

    # -- phases ----------------------------------------------------------------
    def _phase(self, job: AttemptJob, name: str, t0: float) -> None:
        self.events.phase(job.run.id, job.task.id, job.slot, job.attempt_no, name, t0, time.monotonic())

    def _attempt(self, job: AttemptJob, sb: Sandbox, d: _Draft, ctx: "_Ctx", kind: Any, grader: Any, state_inputs: Any) -> None:
        run, task, profile = job.run, job.task, job.profile
        t = time.monotonic()
        try:
            sb.start()
        except Exception as e:
            ctx.infra = str(e)
            return
        finally:
            self._phase(job, "sandbox", t)
        ctx.started = True
        d.f["container"] = sb.name
        if self.stop.is_set():
            ctx.infra = "the controller was stopped before the agent started"
            return
        if sb.envelope is not None:
            ctx.mismatches = list(sb.envelope.mismatches)
            applied = sb.envelope.applied
            d.f["envelope_applied"] = applied.model_dump(mode="json") if applied else {}
            if applied is not None:
                d.f["memory_max"], d.f["pids_max"] = applied.memory_max, applied.pids_max
        if state_inputs.setup:
            t = time.monotonic()
            setup = sb.exec(state_inputs.setup, timeout=profile.timeouts.setup)
            self._phase(job, "setup", t)
            d.f["setup_wall_s"] = setup.wall_s
            if setup.exit_code != 0:
                ctx.infra = (
                    f"setup failed (exit {setup.exit_code}{', timed out' if setup.timed_out else ''}): "
                    f"{((setup.stderr or setup.stdout).strip().splitlines() or [''])[-1][:300]}"
                )
                return
        env = {
            **job.suite.agent_env,
            **state_inputs.env,
            "HARNESS_SEED": str(job.seed),
            "HARNESS_TASK_ID": task.id,
            "HARNESS_TRIAL": str(job.slot),
            "HARNESS_ATTEMPT": str(job.attempt_no),
            "HARNESS_RUN_ID": run.id,
            "HARNESS_PROMPT_FILE": f"{INPUT_DIR}/prompt.txt",
            "HARNESS_TRANSCRIPT": f"{WORKDIR}/{TRANSCRIPT_FILE}",
            "HARNESS_WORKDIR": WORKDIR,
            "HOME": WORKDIR,
        }
        t = time.monotonic()
        m = sb.measured_exec(list(run.agent_cmd), timeout=profile.timeouts.agent, env=env, workdir=WORKDIR)
        self._phase(job, "agent", t)
        ctx.exec_res, ctx.counters, ctx.host = m.result, m.counters, m.host
        d.f["samples"] = list(m.samples)
        d.f["monitor_errors"] = m.monitor_errors
        _write(job.artifacts / "stdout.txt", m.result.stdout.encode(), d)
        _write(job.artifacts / "stderr.txt", m.result.stderr.encode(), d)
        why = outcome.agent_start_failure(m.result)
        if why:
            ctx.infra = why
            return
        if not sb.alive():
            # removed or killed outside the harness (an engine restart, `docker rm`, Ctrl-C):
            # the exit status means nothing, so the attempt cannot be graded
            ctx.infra = "container died during the agent phase (engine restart, removal or kill outside the harness)"
            return
        if m.counters is None:
            ctx.infra = "the container's cgroup counters could not be read; the attempt is unmeasured"
            return
        # orphans the agent left behind must not touch the state while it is graded and copied out
        t = time.monotonic()
        sb.kill_tree()
        self._phase(job, "stop", t)
        if sb.workload_alive():
            ctx.infra = "agent processes survived the kill; the final state cannot be trusted"
            return
        self._grade_and_export(job, sb, d, ctx, grader, kind)
        if ctx.grade is not None and ctx.grade.status == "broken":
            ctx.infra = f"grading failed: {ctx.grade.reason}"
        if not sb.alive() and not ctx.infra:
            ctx.infra = "container died while the final state was graded or exported"

    def _grade_and_export(self, job: AttemptJob, sb: Sandbox, d: _Draft, ctx: "_Ctx", grader: Any, kind: Any) -> None:
        """The grader, in this sandbox, under the profile's grade envelope; then the evidence
        out -- both in one exec. If that exec did not reach the export (killed), the files
        are copied out on their own."""
        profile = job.profile
        exports = [(f.name, f.cap, f.keep_head) for f in kind.exports(profile)]
        exp = None
        t = time.monotonic()
        try:
            now = sb.snapshot()
            used = (now.memory_current or 0) if now is not None else 0
            limit = -(-(used + profile.grade.memory) // PAGE) * PAGE
            quota = profile.grade_quota_us
            applied = sb.set_envelope(limit, quota)
            d.f["grade_envelope"] = {
                "memory_max": applied.memory_max if applied else None, "cpu_quota_us": applied.cpu_quota_us if applied else None,
                "memory_in_use": used, "memory_for_grader": profile.grade.memory, "timeout_s": profile.timeouts.grade,
            }
            if applied is None or applied.memory_max is None or abs(applied.memory_max - limit) > PAGE or applied.cpu_quota_us != quota:
                ctx.grade = GradeResult(status="broken", reason=f"grade envelope not applied (asked memory {format_size(limit)}, "
                                        f"quota {quota} us; kernel {applied.memory_max if applied else None}, "
                                        f"{applied.cpu_quota_us if applied else None})")
            else:
                program = grader.program(job.suite, job.task)
                sb.put_grade_files(program.files)
                before = sb.snapshot()
                exp = sb.export(exports, timeout=profile.timeouts.grade, dest=job.artifacts,
                                then=Command(program.cmd, profile.timeouts.grade, MAX_VERDICT_BYTES))
                after = sb.snapshot()
                sb.kill_tree()
                res = exp.command
                oom = res.exit_code == 137 and not res.timed_out
                if before is not None and after is not None and before.oom_kills is not None and after.oom_kills is not None:
                    oom = oom or after.oom_kills > before.oom_kills
                if res.stderr.strip():
                    _write(job.artifacts / "grade-stderr.txt", res.stderr.encode(), d)
                ctx.grade = grader.read(res, oom, profile.timeouts.grade)
                d.f["grade_wall_s"] = round(res.wall_s, 4)
        finally:
            self._phase(job, "grade", t)
        if exp is None or not exp.complete:
            t = time.monotonic()
            exp = sb.export(exports, timeout=profile.timeouts.grade, dest=job.artifacts)
            self._phase(job, "export", t)
        if exp.problems:
            d.note("; ".join(exp.problems))

    # -- the record ------------------------------------------------------------
    def _finish(self, job: AttemptJob, d: _Draft, ctx: "_Ctx", t_start: float) -> AttemptRecord:
        """Judge and freeze the record (in the attempt's ``finally``)."""
        f = d.f
        try:
            f["finished_at"] = utcnow()
            f["wall_s"] = round(time.monotonic() - t_start, 4)
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
                if g.verdict is not None:
                    f["grade_checks"] = [c.model_dump(mode="json") for c in g.verdict.checks]
                    f["state_diff"] = g.verdict.diff.model_dump(mode="json") if g.verdict.diff else {}
            j = judge(job.profile.sla, host, counters, ctx.mismatches, infra_error=ctx.infra)
            f.update(verdict=j.verdict, reasons=j.reasons, rules=[r.model_dump(mode="json") for r in j.rules])
            if ctx.infra:
                d.note(ctx.infra)
            elif g is not None and res is not None:
                f["outcome"], f["failure_kind"], f["grade_reason"] = outcome.graded_outcome(
                    res.exit_code, res.timed_out, f.get("oom_kills"), g, job.profile.timeouts.agent)
            return AttemptRecord(**f)
        except Exception as e:  # never lose the attempt because the record could not be made
            keep = {k: f[k] for k in ("run_id", "task_id", "slot", "attempt_no", "seed", "cpuset", "container", "image",
                                      "started_at", "finished_at", "artifacts", "wall_s") if k in f}
            return AttemptRecord(**keep, verdict="discarded", reasons=["infra_error"],
                                 error=f"{f.get('error') or ''}; the record could not be made: {type(e).__name__}: {str(e)[:300]}")


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


def _write(path: Path, data: bytes, d: _Draft) -> None:
    try:
        path.write_bytes(data)
    except OSError as e:
        d.note(f"could not keep {path.name}: {e.strerror or e}")
