"""``harness run``: plan task x trial slots, run attempts on exclusive cpusets, judge, store.

Data flow (see DESIGN.md): suite + profile -> plan (slots, seeds) -> scheduler (cpuset
leases) -> sandbox (fresh container per attempt) + monitor -> grader (final state vs
fixture) -> SLA judge (clean | discarded, rerun the slot up to max_reruns) -> store.

An attempt never raises: whatever happens becomes an AttemptRow, persisted in a
``finally``. Engine errors are ``infra_error`` (discarded, rerun like any host breach).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import queue
import secrets
import shutil
import signal
import socket
import sqlite3
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import docker

import harness
from harness import hoststats
from harness.counters import CounterDelta, HostDelta
from harness.grader import build_state, grade
from harness.profile import Profile, ProfileError, load_profile
from harness.sandbox import (
    INPUT_DIR,
    LABEL_ATTEMPT,
    LABEL_RUN,
    Sandbox,
    SandboxError,
    _pid_alive,
    connect,
    sweep_containers,
    sweep_unowned,
)
from harness.scheduler import CpuPool
from harness.sla import judge
from harness.store import AttemptRow, RunRow, Store, utcnow
from harness.suite import Suite, Task, load_suite

STATE_FILE = "state.db"
TRANSCRIPT_FILE = "transcript.jsonl"
_SETUP = (
    "import sqlite3\n"
    f"c = sqlite3.connect('/work/{STATE_FILE}')\n"
    f"c.executescript(open('{INPUT_DIR}/fixture.sql').read())\n"
    "c.commit(); c.close()\n"
)


class RunError(RuntimeError):
    """A run cannot start (bad options, missing image, engine down); one clear line."""


def slot_seed(run_seed: int, task_id: str, slot: int) -> int:
    """The seed of a slot: depends on the run seed, task and trial index only, so a rerun
    of the slot and the same slot under another profile see the same seed."""
    h = hashlib.sha256(f"{run_seed}:{task_id}:{slot}".encode()).hexdigest()
    return int(h[:8], 16) & 0x7FFFFFFF


def new_run_id() -> str:
    return dt.datetime.now().strftime("r%Y%m%d-%H%M%S-") + secrets.token_hex(2)


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


@dataclass
class SlotState:
    task: Task
    slot: int
    seed: int
    attempts: int = 0  # highest attempt number so far
    budget_used: int = 0  # attempts that count against max_reruns (interrupted ones do not)
    done: bool = False


@dataclass
class Progress:
    """Counts the progress bar shows."""

    total_slots: int
    passed: int = 0
    failed: int = 0
    discarded: int = 0
    unmeasured: int = 0
    attempts: int = 0

    @property
    def slots_done(self) -> int:
        return self.passed + self.failed + self.unmeasured


def image_identity(client: docker.DockerClient, image: str) -> tuple[str, str]:
    """(image id, digest-ish string) of a local image, or raise RunError with the fix."""
    try:
        img = client.images.get(image)
    except docker.errors.ImageNotFound:
        raise RunError(f"image {image} not found; build it with `make images` (or `harness images build`)") from None
    digests = img.attrs.get("RepoDigests") or []
    return img.id, (digests[0] if digests else img.id)


def _max_cores(profile: Profile, tasks: list[Task]) -> int:
    """The largest cpuset any task's effective envelope needs (validating each override)."""
    return max(profile.with_override(t.envelope).cores for t in tasks)


def stale_image_reason(client: docker.DockerClient, suite: Suite) -> str | None:
    """Why the suite's image no longer matches the suite's files (None when it does, or when
    the image was not built by harness and carries no inputs label)."""
    from harness.images import INPUTS_LABEL, SANDBOX_IMAGE, SUITE_LABEL, hash_tree

    try:
        labels = client.images.get(suite.image).labels or {}
        base_id = client.images.get(SANDBOX_IMAGE).id
    except docker.errors.ImageNotFound:
        return None
    built = labels.get(INPUTS_LABEL)
    if not built or labels.get(SUITE_LABEL) != suite.name or not suite.dockerfile_path.is_file():
        return None  # not built by harness from this suite: nothing to compare
    now = hash_tree(suite.root, extra=f"{suite.dockerfile}|{SANDBOX_IMAGE}|{base_id}")
    if now == built:
        return None
    return (
        f"image {suite.image} was built from other files than suite {suite.name} has now ({built} != {now}); "
        f"rebuild it with `harness images build --suite {suite.root}` so the run measures what the suite says"
    )


def identity_hash(run: RunRow) -> str:
    """What makes two runs comparable: suite content, image, envelope, harness, cgroup version."""
    key = json.dumps(
        [run.suite_hash, run.image_digest, run.profile_json, run.harness_version, run.cgroup_version, run.agent_cmd],
        sort_keys=True,
    )
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class Runner:
    """Executes one run. Build with ``Runner.plan``; call ``execute``."""

    def __init__(self, store: Store, run: RunRow, suite: Suite, profile: Profile, tasks: list[Task], client: docker.DockerClient, pool: CpuPool):
        self.store = store
        self.run = run
        self.suite = suite
        self.profile = profile
        self.tasks = tasks
        self.client = client
        self.pool = pool
        self.artifacts = Path(run.artifacts_dir)
        self._fixture_cache: dict[str, Path] = {}
        self._fixture_lock = threading.Lock()
        self._inflight = 0
        self._inflight_lock = threading.Lock()
        self._stop = threading.Event()
        self._interrupted = threading.Event()  # set by interrupt() only, not by controller errors
        self._busy = 0

    # -- planning --------------------------------------------------------------
    @classmethod
    def plan(cls, opts: RunOptions, db: str | None = None, client: docker.DockerClient | None = None, store: Store | None = None) -> "Runner":
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
        if trials < 1:
            raise RunError(f"--trials must be at least 1 (got {trials})")
        # k is fixed before the run (by the suite, or by --k), never chosen after
        ks = sorted(set(opts.ks)) if opts.ks else list(suite.k)
        if any(k < 1 for k in ks):
            raise RunError(f"--k {','.join(map(str, ks))}: every k must be >= 1")
        too_big = [k for k in ks if k > trials]
        if too_big:
            src = "--k" if opts.ks else f"suite {suite.name} (suite.toml: k)"
            raise RunError(
                f"k = {','.join(map(str, too_big))} from {src} exceeds {trials} trials per task; "
                f"raise --trials to {max(too_big)} or pass --k {','.join(str(k) for k in ks if k <= trials) or '1'}"
            )
        max_reruns = opts.max_reruns if opts.max_reruns is not None else suite.max_reruns
        if max_reruns < 0:
            raise RunError("--max-reruns must be >= 0")
        by_id = {t.id: t for t in suite.tasks}
        if opts.tasks:
            unknown = [t for t in opts.tasks if t not in by_id]
            if unknown:
                raise RunError(f"suite {suite.name} has no task {', '.join(unknown)}; see `harness suites {suite.name}`")
            tasks = [by_id[t] for t in dict.fromkeys(opts.tasks)]  # a repeated id runs once
        else:
            tasks = list(suite.tasks)
        pool = CpuPool.for_host(reserve=opts.reserve_cores)
        # every task's envelope is validated (and must fit) before anything is written
        concurrency = pool.concurrency(_max_cores(profile, tasks), opts.concurrency)
        client = client or connect()
        image = opts.agent_image or suite.image
        _, digest = image_identity(client, image)
        if not opts.agent_image:
            stale = stale_image_reason(client, suite)
            if stale:
                raise RunError(stale)
        facts = hoststats.host_facts()
        store = store or Store.open(db)
        run_id = new_run_id()
        artifacts = store.artifacts_root() / run_id
        run = RunRow(
            id=run_id,
            status="running",
            suite=suite.name,
            suite_hash=suite.content_hash(),
            suite_path=str(suite.root),
            image=image,
            image_digest=digest,
            agent_cmd=list(opts.agent_cmd or suite.agent_cmd),
            profile=profile.name,
            profile_json=profile.model_dump(mode="json"),
            harness_version=harness.__version__,
            host=facts,
            cgroup_version=str(facts.get("cgroup_version", "")),
            trials=trials,
            ks=ks,
            max_reruns=max_reruns,
            seed=opts.seed,
            concurrency=concurrency,
            task_ids=[t.id for t in tasks],
            sweep_id=opts.sweep_id,
            artifacts_dir=str(artifacts.resolve()),
            note=opts.note,
        )
        run.identity_hash = identity_hash(run)
        return cls(store, run, suite, profile, tasks, client, pool)

    # -- execution -------------------------------------------------------------
    @classmethod
    def resume(cls, run_id: str, db: str | None = None, client: docker.DockerClient | None = None, concurrency: int | None = None,
               reserve_cores: int | None = None) -> "Runner":
        """Pick up a run whose controller died or was interrupted: the same suite (by content
        hash), the same envelope (the stored profile), the same seeds. Slots with a clean
        attempt, or whose rerun budget is spent, are left alone; the others continue with
        the next attempt number, so no slot is filled twice."""
        store = Store.open(db, create=False)
        run = store.get_run(run_id)
        if run.status == "complete":
            raise RunError(f"run {run.id} is complete; nothing to resume")
        owner = (run.controller or "").split(":")
        if run.status == "running" and len(owner) == 2 and owner[0] == socket.gethostname() and owner[1].isdigit() and _pid_alive(int(owner[1])) and int(owner[1]) != os.getpid():
            raise RunError(f"run {run.id} is still being run by process {owner[1]}; stop it first (Ctrl-C) or wait")
        try:
            suite = load_suite(run.suite_path or run.suite)
        except Exception as e:
            raise RunError(f"run {run.id}: cannot load its suite from {run.suite_path}: {e}") from None
        if suite.content_hash() != run.suite_hash:
            raise RunError(
                f"run {run.id}: suite {suite.name} changed since the run started (hash {suite.content_hash()[:12]} != "
                f"{run.suite_hash[:12]}); resuming would mix two suites in one run — start a new run"
            )
        profile = Profile.model_validate(run.profile_json)
        by_id = {t.id: t for t in suite.tasks}
        tasks = [by_id[t] for t in run.task_ids]
        pool = CpuPool.for_host(reserve=reserve_cores)
        client = client or connect()
        _, digest = image_identity(client, run.image)
        if digest != run.image_digest:
            raise RunError(f"run {run.id}: image {run.image} changed since the run started ({digest[:19]} != {run.image_digest[:19]}); start a new run")
        run_conc = pool.concurrency(_max_cores(profile, tasks), concurrency if concurrency is not None else run.concurrency)
        facts = hoststats.host_facts()
        now = {"harness_version": harness.__version__, "cgroup_version": str(facts.get("cgroup_version", ""))}
        differs = [f"{k} {getattr(run, k)} -> {v}" for k, v in now.items() if str(getattr(run, k)) != v]
        if differs:
            raise RunError(
                f"run {run.id} was started under another identity ({'; '.join(differs)}); resuming would "
                "mix two environments in one run — start a new run"
            )
        self = cls(store, run, suite, profile, tasks, client, pool)
        self.run.concurrency = run_conc
        self._resuming = True
        self._claimed_from = run.controller or ""
        return self

    def pending_slots(self) -> tuple[list[SlotState], Progress]:
        """Slots still to fill, from what the store holds (nothing, for a new run)."""
        prog = Progress(total_slots=len(self.tasks) * self.run.trials)
        existing = self.store.attempts(self.run.id)
        by_slot: dict[tuple[str, int], list[AttemptRow]] = {}
        for a in existing:
            by_slot.setdefault((a.task_id, a.slot), []).append(a)
        pending = []
        for task in self.tasks:
            for i in range(self.run.trials):
                atts = by_slot.get((task.id, i), [])
                clean = [a for a in atts if a.verdict == "clean"]
                counted = [a for a in atts if "interrupted" not in (a.reasons or [])]
                prog.attempts += len(atts)
                prog.discarded += len(atts) - len(clean)
                if clean:
                    if clean[0].outcome == "pass":
                        prog.passed += 1
                    else:
                        prog.failed += 1
                    continue
                if len(counted) > self.run.max_reruns:
                    prog.unmeasured += 1
                    continue
                st = SlotState(task=task, slot=i, seed=slot_seed(self.run.seed, task.id, i))
                st.attempts = max([a.attempt_no for a in atts], default=0)
                st.budget_used = len(counted)
                pending.append(st)
        return pending, prog

    def execute(self, on_update: Callable[[Progress, AttemptRow | None], None] | None = None) -> Progress:
        """Run every slot to a clean attempt or to unmeasured. Ctrl-C removes the run's
        containers and marks the run interrupted (resumable with ``harness run --resume``)."""
        self.run.controller = f"{socket.gethostname()}:{os.getpid()}"
        if getattr(self, "_resuming", False):
            if not self.store.claim_run(self.run.id, self._claimed_from, self.run.controller):
                raise RunError(f"run {self.run.id} was just claimed by another controller; not resuming it twice")
            self.store.update_run(self.run.id, concurrency=self.run.concurrency)
        else:
            self.store.add_run(self.run)
        self.artifacts.mkdir(parents=True, exist_ok=True)
        pin_controller(self.pool)
        # containers of a dead controller are leftovers: remove them before leasing cores
        sweep_containers(self.client, only_dead_owners=True)
        pending, prog = self.pending_slots()
        slots: "queue.Queue[SlotState]" = queue.Queue()
        for st in pending:
            slots.put(st)
        lock = threading.Lock()
        errors: list[BaseException] = []
        if on_update:
            on_update(prog, None)

        def worker() -> None:
            while not self._stop.is_set():
                try:
                    st = slots.get(timeout=0.2)
                except queue.Empty:
                    with lock:
                        if self._busy == 0 and slots.empty():
                            return
                    continue
                with lock:
                    self._busy += 1
                try:
                    row = self._run_slot_attempt(st)
                except BaseException as e:  # a bug in the controller: stop the run, keep the data
                    errors.append(e)
                    self._stop.set()
                    return
                finally:
                    with lock:
                        self._busy -= 1
                if self._stop.is_set():
                    return
                if "infra_error" in row.reasons:
                    # an engine restart: wait for it to answer before burning the slot's budget,
                    # then remove what could not be removed while it was down
                    if wait_for_engine(self.client, timeout=120, stop=self._stop):
                        sweep_unowned(self.client, self.run.id)
                with lock:
                    prog.attempts += 1
                    if row.verdict == "clean":
                        st.done = True
                        if row.outcome == "pass":
                            prog.passed += 1
                        else:
                            prog.failed += 1
                    else:
                        prog.discarded += 1
                        if st.budget_used > self.run.max_reruns:
                            prog.unmeasured += 1
                        else:
                            slots.put(st)
                    if on_update:
                        on_update(prog, row)

        threads = [threading.Thread(target=worker, name=f"harness-worker-{i}", daemon=True) for i in range(self.run.concurrency)]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.2)
        except KeyboardInterrupt:
            # a second Ctrl-C must not cut the clean-up short
            old = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                self.interrupt()
                # let in-flight attempts land in the store (as `interrupted`) before exiting
                deadline = time.monotonic() + 15
                for t in threads:
                    t.join(timeout=max(0.0, deadline - time.monotonic()))
            finally:
                signal.signal(signal.SIGINT, old)
            raise
        sweep_unowned(self.client, self.run.id)
        if errors:
            self.store.set_run_status(self.run.id, "failed")
            raise errors[0]
        self.store.set_run_status(self.run.id, "complete")
        return prog

    def interrupt(self) -> None:
        """Stop scheduling, remove this run's containers now, mark the run interrupted."""
        from harness.sandbox import remove_all_live

        self._interrupted.set()
        self._stop.set()
        remove_all_live()
        try:
            sweep_containers(self.client, run_id=self.run.id)
        except docker.errors.DockerException:
            pass
        self.store.set_run_status(self.run.id, "interrupted")

    def _fixture_db(self, task: Task) -> Path:
        with self._fixture_lock:
            if task.id not in self._fixture_cache:
                p = self.artifacts / task.id / "fixture.db"
                p.parent.mkdir(parents=True, exist_ok=True)
                if p.exists():
                    p.unlink()
                build_state(self.suite.fixture_sql(task), p)
                self._fixture_cache[task.id] = p
            return self._fixture_cache[task.id]

    def _run_slot_attempt(self, st: SlotState) -> AttemptRow:
        st.attempts += 1
        st.budget_used += 1
        profile = self.profile.with_override(st.task.envelope)
        cpuset = self.pool.lease(profile.cores)
        with self._inflight_lock:
            self._inflight += 1
            beside = self._inflight
        try:
            row, samples = run_attempt(
                client=self.client,
                run=self.run,
                suite=self.suite,
                task=st.task,
                profile=profile,
                slot=st.slot,
                attempt_no=st.attempts,
                seed=st.seed,
                cpuset=cpuset,
                concurrent=beside,
                fixture_db=self._fixture_db(st.task),
                artifacts=self.artifacts / st.task.id / f"slot{st.slot}-attempt{st.attempts}",
            )
        finally:
            with self._inflight_lock:
                self._inflight -= 1
            self.pool.release(cpuset)
        if self._interrupted.is_set() and row.verdict == "discarded":
            # the controller was stopped under this attempt: evidence, but not the slot's fault
            row.reasons = ["interrupted"]
            row.rules = [
                {"rule": "interrupted", "scope": "host", "value": None, "threshold": None, "breached": True,
                 "detail": "the controller was stopped (Ctrl-C / SIGTERM) during this attempt; not scored, not charged to the rerun budget"}
            ]
            st.budget_used -= 1
        elif row.verdict == "discarded" and st.budget_used > self.run.max_reruns:
            envelope_only = row.reasons and all(r in ("cpu_throttled", "memory_pressure") for r in row.reasons)
            note = (
                f"slot unmeasured after {st.budget_used} attempts: the envelope is too small for task {st.task.id}"
                if envelope_only
                else f"slot unmeasured after {st.budget_used} attempts (rerun budget {self.run.max_reruns} spent)"
            )
            row.error = (row.error + "; " if row.error else "") + note
        self.store.add_attempt(row, samples)
        return row


def wait_for_engine(client: docker.DockerClient, timeout: float, stop: threading.Event | None = None) -> bool:
    """Block until the engine answers a ping (after a restart), up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.2
    while time.monotonic() < deadline:
        if stop is not None and stop.is_set():
            return False
        try:
            client.ping()
            return True
        except Exception:
            time.sleep(delay)
            delay = min(2.0, delay * 1.5)
    return False


def pin_controller(pool: CpuPool) -> None:
    """Keep the controller's threads (SDK calls, monitor, grading) on the reserved cores so
    they do not show up as foreign CPU on the cores leased to trials. Threads started after
    this call inherit the mask."""
    if pool.reserved:
        try:
            os.sched_setaffinity(0, set(pool.reserved))
        except OSError:
            pass


def run_attempt(
    client: docker.DockerClient,
    run: RunRow,
    suite: Suite,
    task: Task,
    profile: Profile,
    slot: int,
    attempt_no: int,
    seed: int,
    cpuset: list[int],
    concurrent: int,
    fixture_db: Path,
    artifacts: Path,
) -> tuple[AttemptRow, list[dict]]:
    """One attempt of one slot in a fresh container. Never raises: failures become the record."""
    started = utcnow()
    t_start = time.monotonic()
    row = AttemptRow(
        run_id=run.id,
        task_id=task.id,
        slot=slot,
        attempt_no=attempt_no,
        seed=seed,
        verdict="discarded",
        reasons=[],
        rules=[],
        cpuset=",".join(map(str, cpuset)),
        concurrent=concurrent,
        image=run.image,
        envelope=profile.model_dump(mode="json"),
        started_at=started,
        artifacts=str(artifacts),
    )
    samples: list[dict] = []
    infra: str | None = None
    counters: CounterDelta | None = None
    host: HostDelta | None = None
    mismatches: list[str] = []
    exec_res = None
    files: dict[str, bytes] = {}
    sb = Sandbox(
        client,
        run.image,
        profile,
        cpuset,
        labels={LABEL_RUN: run.id, LABEL_ATTEMPT: f"{task.id}/{slot}/{attempt_no}"},
        inputs={"fixture.sql": suite.fixture_sql(task).encode(), "prompt.txt": task.prompt.encode()},
    )
    try:
        artifacts.mkdir(parents=True, exist_ok=True)
        try:
            sb.start()
        except SandboxError as e:
            infra = str(e)
            return row, samples
        row.container = sb.name
        if sb.envelope is not None:
            mismatches = list(sb.envelope.mismatches)
            row.envelope_applied = sb.envelope.applied.model_dump(mode="json") if sb.envelope.applied else {}
            applied = sb.envelope.applied
            if applied is not None:
                row.memory_max, row.pids_max = applied.memory_max, applied.pids_max
        setup = sb.exec(["python3", "-c", _SETUP], timeout=profile.timeouts.setup)
        row.setup_wall_s = setup.wall_s
        if setup.exit_code != 0:
            infra = (
                f"setup failed (exit {setup.exit_code}{', timed out' if setup.timed_out else ''}): "
                f"{((setup.stderr or setup.stdout).strip().splitlines() or [''])[-1][:300]}"
            )
            return row, samples
        env = {
            **suite.agent_env,
            "HARNESS_SEED": str(seed),
            "HARNESS_TASK_ID": task.id,
            "HARNESS_TRIAL": str(slot),
            "HARNESS_ATTEMPT": str(attempt_no),
            "HARNESS_RUN_ID": run.id,
            "HARNESS_PROMPT_FILE": f"{INPUT_DIR}/prompt.txt",
            "HARNESS_STATE": f"/work/{STATE_FILE}",
            "HARNESS_TRANSCRIPT": f"/work/{TRANSCRIPT_FILE}",
            "HARNESS_WORKDIR": "/work",
            "HOME": "/work",
        }
        m = sb.measured_exec(list(run.agent_cmd), timeout=profile.timeouts.agent, env=env, workdir="/work")
        exec_res, counters, host = m.result, m.counters, m.host
        samples = [x.model_dump() for x in m.samples]
        if exec_res.exit_code is None and not exec_res.timed_out:
            infra = f"agent exec failed: {exec_res.stderr.strip()[-300:]}"
            return row, samples
        if exec_res.exit_code in (126, 127) and not exec_res.timed_out and exec_res.wall_s < 2:
            out = (exec_res.stdout + exec_res.stderr).strip()
            if not out or "not found" in out or "permission denied" in out.lower() or "exec failed" in out:
                # a wrong agent command is a setup problem, never an agent that scored 0
                infra = (
                    f"the agent command {list(run.agent_cmd)!r} could not be started (exit {exec_res.exit_code}): {out[-200:]}; "
                    "check --agent-cmd or agent_cmd in suite.toml"
                ).strip()
                return row, samples
        if not sb.alive():
            # removed or killed outside the harness (an engine restart, `docker rm`, Ctrl-C):
            # the exit status means nothing, so the attempt cannot be graded
            infra = "container died during the agent phase (engine restart, removal or kill outside the harness)"
            return row, samples
        if counters is None:
            infra = "the container's cgroup counters could not be read; the attempt is unmeasured"
            return row, samples
        # orphans the agent left behind must not touch the state while it is copied out
        sb.kill_tree()
        files, problems = sb.export([STATE_FILE, STATE_FILE + "-wal", TRANSCRIPT_FILE], timeout=profile.timeouts.grade)
        if problems:
            row.error = "; ".join(problems)
            if not sb.alive():
                infra = "container died while the final state was exported"
    except Exception as e:  # engine went away mid-attempt, etc.
        infra = f"{type(e).__name__}: {str(e)[:300]}"
        row.error = (row.error or "") + traceback.format_exc(limit=3)[-1500:]
    finally:
        sb.remove()
        _finish(row, task, profile, exec_res, counters, host, mismatches, infra, files, fixture_db, artifacts, t_start)
    return row, samples


def consolidate_wal(db: Path) -> str | None:
    """An agent that switched the state to WAL mode leaves committed rows in ``state.db-wal``.
    Fold them into ``state.db`` on a private copy (the raw -wal file stays in the artifacts
    as evidence), so the grader, which opens the file immutable, sees every commit."""
    wal = db.with_name(db.name + "-wal")
    if db.read_bytes()[:16] != b"SQLite format 3\x00":
        return None  # the grader reports an unreadable state
    with tempfile.TemporaryDirectory(prefix="harness-wal-") as tmp:
        work = Path(tmp, "state.db")
        shutil.copyfile(db, work)
        shutil.copyfile(wal, Path(tmp, "state.db-wal"))
        try:
            conn = sqlite3.connect(work, timeout=5)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.execute("PRAGMA journal_mode=DELETE")
            conn.close()
        except sqlite3.Error as e:
            return f"could not fold state.db-wal into state.db: {e}"
        shutil.copyfile(work, db)
    return None


def _finish(row, task, profile, exec_res, counters, host, mismatches, infra, files, fixture_db, artifacts, t_start) -> None:
    """Grade, judge and fill the record (runs in the attempt's ``finally``)."""
    try:
        row.finished_at = utcnow()
        row.wall_s = round(time.monotonic() - t_start, 4)
        if exec_res is not None:
            row.exit_code = exec_res.exit_code
            row.timed_out = exec_res.timed_out
            row.agent_wall_s = exec_res.wall_s
            row.terminated_cleanly = exec_res.exit_code == 0 and not exec_res.timed_out
            (artifacts / "stdout.txt").write_text(exec_res.stdout)
            (artifacts / "stderr.txt").write_text(exec_res.stderr)
        for name, data in files.items():
            (artifacts / name).write_bytes(data)
        if counters is not None:
            for k in (
                "cpu_usage_us nr_periods nr_throttled throttled_us throttled_share memory_peak memory_limit_hits "
                "memory_high_events oom_kills pids_peak pids_limit_hits psi_cpu_some_us psi_memory_some_us psi_io_some_us"
            ).split():
                setattr(row, k, getattr(counters, k))
            row.counters = counters.model_dump(mode="json")
        if host is not None:
            row.foreign_cpu_share = host.foreign_cpu_share
            row.steal_share = host.steal_share
            row.host_psi_cpu = host.psi_cpu_some_share
            row.host_psi_memory = host.psi_memory_some_share
            row.host_psi_io = host.psi_io_some_share
            row.mem_available_min = host.mem_available_min
            row.host_counters = host.model_dump(mode="json")
        j = judge(profile.sla, host, counters, mismatches, infra_error=infra)
        row.verdict = j.verdict
        row.reasons = j.reasons
        row.rules = [r.model_dump(mode="json") for r in j.rules]
        if infra:
            row.error = (row.error + "; " if row.error else "") + infra
            return
        final = artifacts / STATE_FILE if STATE_FILE in files else None
        if final is not None and files.get(STATE_FILE + "-wal"):
            note = consolidate_wal(final)
            if note:
                row.error = (row.error + "; " if row.error else "") + note
        g = grade(task, fixture_db, final)
        row.grade_reason = g.reason
        row.grade_checks = [c.model_dump(mode="json") if hasattr(c, "model_dump") else dict(c) for c in g.checks]
        row.state_diff = g.diff.model_dump(mode="json") if hasattr(g.diff, "model_dump") else {}
        oom = bool(counters and (counters.oom_kills or 0) > 0)
        if oom:
            row.outcome, row.failure_kind = "fail", "oom_killed"
        elif row.timed_out:
            row.outcome, row.failure_kind = "fail", "timeout"
        elif not g.passed:
            row.outcome = "fail"
            row.failure_kind = "wrong_state" if row.exit_code == 0 else "crashed"
        else:
            row.outcome, row.failure_kind = "pass", None
        if row.failure_kind in ("oom_killed", "timeout") and not row.grade_reason:
            row.grade_reason = "agent killed before finishing" if oom or row.timed_out else None
    except Exception as e:  # never lose the attempt because grading broke
        row.verdict = "discarded"
        row.reasons = list(row.reasons or []) + ["infra_error"]
        row.error = (row.error or "") + f"; grading failed: {type(e).__name__}: {e}"
