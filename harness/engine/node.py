"""The node side of a distributed run: what one machine of a cluster does with an attempt
handed to it. ``harness.engine.ray_executor`` ships the work and calls these functions in
Ray worker processes; nothing here imports Ray, so the node side is the same code a local
run uses:

    RemoteAttempt (the driver's AttemptJob, its attempt id, no cpuset)
      -> lease cores here (the same cross-process locks; leftovers of a holder that died
         on them removed first) -> the attempt pipeline against this node's Docker engine,
         its monitor and host rules judged with this node's facts
      -> RemoteResult: the immutable record (stamped with this node's facts), its artifact
         files copied into the result up to a cap, the phases it went through

The driver owns the plan, the attempt ids and the store; a node never writes to the store.
Artifacts are *copied* through the result (bounded by ``HARNESS_NODE_ARTIFACTS_CAP``, 256
MiB per attempt by default); files past the cap stay on the node, named in the record.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from harness.engine.events import EventSink
from harness.engine.executor import LocalExecutor, OrphanClearer, Work
from harness.engine.pipeline import AttemptJob, AttemptPipeline
from harness.engine.scheduler import CpuPool
from harness.measure import host as hoststats
from harness.model.attempt import AttemptRecord
from harness.model.errors import RunError
from harness.model.units import MiB, format_size
from harness.sandbox.docker_backend import DockerBackend
from harness.sandbox.docker_sandbox import connect, engine_facts
from harness.sandbox.images import INPUTS_LABEL, image_labels
from harness.store.store import harness_home

ARTIFACTS_CAP = 256 * MiB


def artifacts_cap() -> int:
    try:
        return int(os.environ.get("HARNESS_NODE_ARTIFACTS_CAP", ARTIFACTS_CAP))
    except ValueError:
        return ARTIFACTS_CAP


@dataclass(frozen=True)
class RemoteAttempt:
    """One attempt as shipped to a node: the driver's job (cpuset empty, artifacts relative
    to the run's artifact folder) and the cores it needs."""

    job: AttemptJob
    cores: int
    rel: str  # <task>/slot<N>-attempt<M>
    reserve: int | None = None  # cores the node keeps for itself (default: the node's own default)
    budget_s: float = 0.0  # how long the attempt may take once started before the driver presumes it lost


@dataclass(frozen=True)
class RemoteResult:
    record: AttemptRecord
    files: list[tuple[str, bytes, int]] = field(default_factory=list)  # relative path, bytes, mode
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    kept_on_node: str = ""  # folder on the node still holding the files past the cap


def node_facts(client: Any, node_id: str) -> dict[str, Any]:
    """What a record says about the machine it ran on (read there)."""
    facts = hoststats.host_facts()
    return {"executor": "ray" if node_id else "local", "node_id": node_id, "hostname": facts.get("hostname", ""),
            "kernel": facts.get("kernel", ""), "cgroup_version": str(facts.get("cgroup_version", "")),
            "cpu_model": facts.get("cpu_model", ""), "logical_cpus": facts.get("logical_cpus"),
            "memory_total": facts.get("memory_total"), "psi": facts.get("psi"), **engine_facts(client)}


def image_facts(client: Any, image: str) -> dict[str, str] | None:
    """(id, inputs hash) of an image on this engine; None when it is absent."""
    labels = image_labels(client, image)
    if labels is None:
        return None
    return {"id": client.images.get(image).id, "inputs": labels.get(INPUTS_LABEL, "")}


def image_problem(node: str, image: str, want: dict[str, str], have: dict[str, str] | None) -> str | None:
    """Why ``image`` on a node is not the image the driver planned with (one line), or None.
    Images harness built compare by their inputs hash; others by id (loaded from one file)."""
    fix = f"build it there (`harness images build`, or `docker load` the driver's) and start again"
    if have is None:
        return f"node {node}: image {image} is missing; {fix}"
    if want.get("inputs"):
        if have.get("inputs") != want["inputs"]:
            return f"node {node}: image {image} was built from other inputs ({have.get('inputs') or 'none'} != {want['inputs']}); {fix}"
        return None
    if have.get("id") != want.get("id"):
        return f"node {node}: image {image} is another image ({have.get('id', '')[:19]} != {want.get('id', '')[:19]}); {fix}"
    return None


class _Phases(EventSink):
    def __init__(self) -> None:
        self.items: list[tuple[str, float, float]] = []

    def phase(self, run_id: str, task_id: str, slot: int, attempt_no: int, name: str, t0: float, t1: float) -> None:
        self.items.append((name, t0, t1))


class NodeRuntime:
    """What a worker process keeps between attempts: the engine client, the core pool and a
    one-attempt local executor (which removes orphans before a lease and quarantines cores
    whose sandbox could not be removed)."""

    _lock = threading.Lock()
    _instances: dict[Any, "NodeRuntime"] = {}

    def __init__(self, reserve: int | None):
        self.client = connect()
        self.backend = DockerBackend(self.client, inputs_root=harness_home() / "inputs")
        self.pool = CpuPool.for_host(reserve=reserve)
        self.stop = threading.Event()
        self.clearer = OrphanClearer(self.backend)
        self.executor = LocalExecutor(self.pool, 1, self.stop, clear=self.clearer)
        self.facts: dict[str, dict[str, Any]] = {}

    @classmethod
    def get(cls, reserve: int | None) -> "NodeRuntime":
        with cls._lock:
            if reserve not in cls._instances:
                cls._instances[reserve] = cls(reserve)
            return cls._instances[reserve]

    def node(self, node_id: str) -> dict[str, Any]:
        if node_id not in self.facts:
            self.facts[node_id] = node_facts(self.client, node_id)
        return self.facts[node_id]

    def run(self, spec: RemoteAttempt, node_id: str, emit: Callable[[list[int]], None]) -> RemoteResult:
        """Run the attempt here; ``emit(cpuset)`` is called once its cores are leased."""
        job = spec.job
        local = harness_home() / "node-artifacts" / job.run.id / spec.rel
        facts = dict(self.node(node_id))
        img = image_facts(self.client, job.image or job.run.image)
        if img is not None:
            facts.update(image_id=img["id"], image_inputs=img["inputs"])
        phases = _Phases()
        pipeline = AttemptPipeline(self.backend, phases, self.stop)

        def run(cpuset: list[int]) -> tuple[AttemptRecord, bool, Any]:
            emit(cpuset)
            out = pipeline.run(dataclasses.replace(job, cpuset=cpuset, concurrent=self.pool.in_use(), artifacts=local, node=facts,
                                                   notes=tuple(self.clearer.notes(cpuset))))
            return out.record, out.removed, out.retry_remove

        self.executor.submit(Work(key=spec.rel, cores=spec.cores, run=run))
        try:
            while True:
                done = self.executor.results(timeout=1.0)
                if done is not None:
                    break
        except BaseException:  # cancelled by the driver (Ray raises KeyboardInterrupt here): end this runtime,
            self.stop.set()  # so a lease still waiting gives up instead of starting an attempt nobody wants
            with NodeRuntime._lock:
                for k, v in list(NodeRuntime._instances.items()):
                    if v is self:
                        del NodeRuntime._instances[k]
            raise
        if done.error is not None:
            raise done.error
        if done.not_started:
            raise RunError("the node's executor stopped before the attempt started")
        files, kept = collect_artifacts(local, artifacts_cap())
        rec: AttemptRecord = done.result
        if kept:
            rec = rec.model_copy(update={"error": (rec.error + "; " if rec.error else "") +
                                         f"artifacts past the {format_size(artifacts_cap())} cap stay on node "
                                         f"{facts.get('hostname', '')} ({node_id[:12]}) in {local}"})
        return RemoteResult(record=rec, files=files, phases=phases.items, kept_on_node=str(local) if kept else "")


def collect_artifacts(root: Path, cap: int) -> tuple[list[tuple[str, bytes, int]], bool]:
    """The regular files under ``root`` (links are never followed or sent), up to ``cap``
    bytes in all; (files, whether some were left). The folder stays until the driver's
    end-of-run sweep (:func:`sweep_node`), which keeps what the driver could not write."""
    files: list[tuple[str, bytes, int]] = []
    total, left = 0, False
    if not root.is_dir():
        return files, False
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            try:
                st = p.lstat()
            except OSError:
                continue
            if not p.is_file() or p.is_symlink():
                continue
            if total + st.st_size > cap:
                left = True
                continue
            files.append((p.relative_to(root).as_posix(), p.read_bytes(), st.st_mode & 0o777))
            total += st.st_size
    return files, left


def receive_artifacts(dest: Path, files: list[tuple[str, bytes, int]]) -> list[str]:
    """Write a node's artifact files under ``dest`` (the driver's folder of that attempt);
    a path that would leave ``dest`` is refused and named in the result."""
    refused = []
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    for rel, data, mode in files:
        p = PurePosixPath(rel)
        if p.is_absolute() or not p.parts or any(part in ("", ".", "..") for part in p.parts):
            refused.append(rel)
            continue
        target = root.joinpath(*p.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.parent.resolve().is_relative_to(root) or target.is_symlink():
            refused.append(rel)
            continue
        target.write_bytes(data)
        os.chmod(target, (mode & 0o777) | 0o600)
    return refused


def check_node(node_id: str, images: dict[str, dict[str, str]], reserve: int | None, version: str = "") -> dict[str, Any]:
    """A node's facts and what stops it from running the run's attempts (its harness version,
    engine, cgroups, cores, images), for the driver's plan."""
    import harness

    out: dict[str, Any] = {"node_id": node_id, "problems": []}
    if version and harness.__version__ != version:
        out["problems"].append(f"runs harness {harness.__version__}, the driver {version}: install the same version on every node")
    try:
        client = connect(timeout=30)
    except Exception as e:
        out["problems"].append(f"no Docker engine answers: {str(e)[:200]}")
        out["facts"] = {"hostname": hoststats.host_facts().get("hostname", ""), "node_id": node_id}
        return out
    facts = node_facts(client, node_id)
    out["facts"] = facts
    try:
        pool = CpuPool.for_host(reserve=reserve)
        out["cores"] = pool.size
        out["reserved"] = list(pool.reserved)
    except Exception as e:
        out["problems"].append(str(e))
        out["cores"] = 0
    if facts.get("cgroup_version") in ("", None, "unknown"):
        out["problems"].append("no cgroup hierarchy the harness can read")
    name = f"{facts.get('hostname', '')} ({node_id[:12]})"
    for image, want in sorted(images.items()):
        why = image_problem(name, image, want, image_facts(client, image))
        if why:
            out["problems"].append(why.split(": ", 1)[1])
    try:
        client.close()
    except Exception:
        pass
    return out


def sweep_node(run_id: str, keep: list[str] | None = None) -> list[str]:
    """Remove every container and network of ``run_id`` on this node's engine, and those of
    controllers that died here (the end of a run, an interrupt, a resume); and this node's
    copies of the run's artifacts, except the attempts in ``keep`` and those past the cap."""
    backend = DockerBackend(connect(timeout=30), inputs_root=harness_home() / "inputs")
    removed = backend.sweep_dead_owners() + backend.sweep_run(run_id, held_too=True)
    root = harness_home() / "node-artifacts" / run_id
    cap = artifacts_cap()
    if root.is_dir() and not root.is_symlink():
        for task in root.iterdir():
            for att in task.iterdir() if task.is_dir() and not task.is_symlink() else []:
                rel = f"{task.name}/{att.name}"
                size = sum(f.lstat().st_size for f in att.rglob("*") if f.is_file() and not f.is_symlink())
                if rel not in (keep or []) and size <= cap:
                    shutil.rmtree(att, ignore_errors=True)
    return removed
