"""Everything a run decides per task before it starts: the image each task runs (built per
task for Harbor / Terminal-Bench suites), its effective envelope, the tasks that cannot run
here (one line each), and what a foreign task asked for beside what it gets.

A foreign task's envelope (Harbor ``[environment]``) becomes its profile unless ``--profile``
was given (then the task's ask is stored with every attempt as ``requested_envelope``). A
foreign task asking for more cores than one attempt can lease here runs on what can be
leased, and the run records the adjustment (it is part of the run's identity); a native
task asking for too much is refused, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from harness.engine import agents
from harness.engine.taskimages import build_task_images
from harness.model.errors import NothingToRun, ProfileError, RunError
from harness.model.profile import Profile
from harness.model.suite import Suite, Task
from harness.model.state import VerifierGraderSpec
from harness.sandbox.images import ensure_local_base, image_config, image_id, image_identity


@dataclass
class Prepared:
    """The per-task plan of a run."""

    tasks: list[Task]  # runnable tasks, sandbox defaults filled from their images
    profiles: dict[str, Profile]  # task id -> effective envelope
    images: dict[str, str]  # task id -> image tag to run
    digests: dict[str, str] = field(default_factory=dict)  # task id -> digest (tasks with their own image)
    substitutions: dict[str, str] = field(default_factory=dict)
    bases: dict[str, list[str]] = field(default_factory=dict)  # task id -> which of them its images used
    excluded: dict[str, str] = field(default_factory=dict)  # task id -> why it cannot run here
    adjustments: dict[str, dict[str, Any]] = field(default_factory=dict)  # task id -> cores, cpus, note: fitted to this machine
    requested: dict[str, dict[str, Any]] = field(default_factory=dict)  # task id -> what it asked for, when --profile replaced it
    built: list[tuple[str, float]] = field(default_factory=list)


def effective_profile(profile: Profile, task: Task, task_overrides: bool, adjustment: dict[str, Any] | None = None) -> Profile:
    """The envelope one task's attempts run under."""
    try:
        p = profile.with_override(task.envelope) if task_overrides else profile
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        where = task.source or f"task {task.id}"
        errs = e.errors() if hasattr(e, "errors") else []
        detail = "; ".join(str(x.get("msg", "")).removeprefix("Value error, ") for x in errs) if errs else str(e)
        raise ProfileError(f"{where}: [envelope] does not fit profile {profile.name!r}: {detail} -- change the task's "
                           "[envelope] or run with another --profile") from None
    if adjustment:
        p = Profile.model_validate({**p.model_dump(), **adjustment})
    return p


def fit_to_machine(task: Task, p: Profile, leasable: int) -> tuple[dict[str, Any] | None, str | None]:
    """A foreign task asking for more cores than one attempt can lease: run it on what can be."""
    if p.cores <= leasable or task.requested == {} and task.envelope is None:
        return None, None
    adj = {"cores": leasable, "cpus": min(p.cpus, float(leasable))}
    return adj, (f"asked for cpus {p.cpus:g} on {p.cores} cores; this machine leases at most {leasable} core(s) per "
                 f"attempt: runs with cpus {adj['cpus']:g} on {leasable}")


def _with_defaults(client: Any, task: Task, image: str) -> Task:
    """A writable-root task without its own user or working directory gets the image's
    (as Harbor runs it): the image's USER (root when it has none) and WORKDIR (/ when none)."""
    verifier = task.grader if isinstance(task.grader, VerifierGraderSpec) else None
    if not task.sandbox.writable_root or (task.sandbox.user and task.sandbox.workdir and (verifier is None or verifier.user)):
        return task
    cfg = image_config(client, image)
    image_user = cfg.get("User") or "0:0"
    user = task.sandbox.user or image_user
    workdir = task.sandbox.workdir or (cfg.get("WorkingDir") or "/")
    update: dict[str, Any] = {"sandbox": task.sandbox.model_copy(update={"user": user, "workdir": workdir})}
    if verifier is not None and not verifier.user:
        # Harbor runs the verifier as the image's user whatever `[agent] user` says
        update["grader"] = verifier.model_copy(update={"user": image_user})
    return task.model_copy(update=update)


def prepare_tasks(client: Any, suite: Suite, tasks: list[Task], profile: Profile, task_overrides: bool, agent_cmd: list[str],
                  leasable: int, agent_image: str | None = None, base_map: list[str] | None = None,
                  log: Callable[[str], None] | None = None, adjustments: dict[str, dict[str, Any]] | None = None) -> Prepared:
    """The per-task plan (see the module docstring). Raises :class:`RunError` when no task can run."""
    out = Prepared(tasks=[], profiles={}, images={})
    if agents.builtin(agent_cmd) == agents.ORACLE:
        for t in tasks:
            why = agents.solution_missing(suite, t)
            if why:
                out.excluded[t.id] = why
    todo = [t for t in tasks if t.id not in out.excluded]
    built = build_task_images(client, suite, [t for t in todo if t.build is not None and not agent_image], base_map, log=log)
    out.substitutions, out.built = built.substitutions, built.built
    out.bases = {t: refs for t, refs in built.bases.items() if refs}
    out.excluded.update(built.failures)
    for t in todo:
        if t.id in out.excluded:
            continue
        if t.build is not None and not agent_image:
            _tag, digest = built.images[t.id]
            out.digests[t.id] = digest
            image = digest  # started by id: a tag rebuilt by someone else mid-run changes nothing
        else:
            image = agent_image or suite.image_of(t)
        out.images[t.id] = image
        p = effective_profile(profile, t, task_overrides)
        adj = (adjustments or {}).get(t.id)
        note = None
        if adj is None and suite.format != "native" and task_overrides:
            adj, note = fit_to_machine(t, p, leasable)
        if adj:
            out.adjustments[t.id] = {**adj, "note": note or f"fitted to this machine: {adj}"}
            p = effective_profile(profile, t, task_overrides, adj)
        out.profiles[t.id] = p
        if not task_overrides and t.envelope is not None:
            out.requested[t.id] = {"envelope": t.envelope.model_dump(mode="json", exclude_none=True), **t.requested}
        task = _with_defaults(client, t, image)
        if t.id in built.verifiers:
            vid = image_identity(client, built.verifiers[t.id])[0]
            task = task.model_copy(update={"grader": task.grader.model_copy(update={"image": vid})})
        out.tasks.append(task)
    _service_images(client, out.tasks, suite, log)
    if not out.tasks:
        lines = "\n".join(f"  {k}: {v.splitlines()[0][:1000]}" for k, v in out.excluded.items())
        raise NothingToRun(f"no task of suite {suite.name} can run here:\n{lines}", out.excluded)
    return out


def _service_images(client: Any, tasks: list[Task], suite: Suite, log: Callable[[str], None] | None) -> None:
    """Services' images must be on the engine; the harness's own (harness/postgres) are built when missing."""
    from harness.state import state_kind

    wanted: set[str] = {s.image for s in suite.services}
    for t in tasks:
        wanted.update(s.image for s in t.services)
        if t.state_kind == "postgres":
            wanted.update(r.spec.image for r in state_kind(t.state_kind).prepare(suite, t).services)
    for img in sorted(wanted):
        if image_id(client, img) is None:
            if log:
                log(f"image {img}: missing, building it")
            if ensure_local_base(client, img) is None:
                raise RunError(f"service image {img} is not on this engine; build or load it first")
        image_identity(client, img)
