"""The Ray executor: one run's attempts spread over the nodes of a Ray cluster.

The driver (``harness run --executor ray``) keeps the plan, the attempt ids and the store;
each attempt is a Ray task with ``max_retries=0`` (every failure reaches the driver, which
records it and reruns the slot itself) that asks for one ``harness_core`` custom resource
per exclusive core, so Ray never places more attempts on a node than the node advertised
cores to lease. On the node, ``harness.engine.node`` leases the cores with the same
cross-process locks a local run takes, runs the attempt against that node's engine, and
returns the record with its artifacts (copied, capped).

Exactly once: a task that fails (its worker crashed, its node died) or whose result does
not come back within its budget after it started becomes an ``infra_error`` attempt the
driver stores under the attempt id it chose, and the slot is rerun under the next id; a
result that arrives after that is handed back as ``late`` (evidence, never counted).

Ray is an optional dependency (``pip install 'harness[ray]'``); it is imported here only,
lazily, and started without usage reporting.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from harness.engine.executor import Done, Executor, Work
from harness.engine.node import RemoteAttempt, RemoteResult, check_node, receive_artifacts, sweep_node
from harness.model.errors import ClusterError, RunError

RESOURCE = "harness_core"  # one unit per exclusive core a node offers to attempts
ADDRESS_ENV = "HARNESS_RAY_ADDRESS"


def ray_module() -> Any:
    """Ray, or a one-line error saying how to install it."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # never report usage, also from the nodes it starts
    try:
        import ray
    except ImportError:
        raise RunError("--executor ray needs Ray, an optional dependency: pip install 'harness[ray]'") from None
    return ray


_started_here = False


def version() -> str:
    return str(ray_module().__version__)


def shutdown() -> None:
    """Leave the cluster (and stop the one-node cluster :func:`connect` started here)."""
    ray = ray_module()
    if ray.is_initialized():
        ray.shutdown()


def connect(address: str | None = None, cores: int | None = None) -> str:
    """Join the cluster at ``address`` (else $HARNESS_RAY_ADDRESS); with neither, start a
    one-node cluster on this machine offering ``cores`` harness cores (stopped at exit).
    Returns the address joined."""
    global _started_here
    ray = ray_module()
    address = address or os.environ.get(ADDRESS_ENV) or None
    if ray.is_initialized():
        return str(ray.get_runtime_context().gcs_address)
    kw: dict[str, Any] = dict(logging_level="ERROR", log_to_driver=False, configure_logging=True)
    if address:
        _probe(address)
    try:
        if address:
            ray.init(address=address, **kw)
        else:
            # "local": always a new cluster, never one that happens to run here already
            ray.init(address="local", num_cpus=max(1, cores or 1), resources={RESOURCE: float(cores or 1)}, include_dashboard=False, **kw)
            _started_here = True
            atexit.register(ray.shutdown)
    except Exception as e:  # ray raises ConnectionError, RuntimeError, ValueError ... here
        where = f"the Ray cluster at {address}" if address else "a local Ray node"
        text = str(e)
        hint = ("" if not address or os.environ.get("RAY_AUTH_MODE") else
                " (if the head was started by `ray start` with token authentication, the default of recent Ray, run harness "
                "with RAY_AUTH_MODE=token as the user that started it: the token is its ~/.ray/auth_token)")
        raise ClusterError(f"could not join {where}: {type(e).__name__}: {text.splitlines()[0][:200] if text else ''}{hint}") from None
    return str(ray.get_runtime_context().gcs_address)


def _probe(address: str, timeout: float = 5.0) -> None:
    """One TCP connect to the head's GCS port before Ray tries (Ray itself retries for many
    minutes): nothing listening there is a one-line error at once."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        raise RunError(f"--ray-address {address!r}: give HOST:PORT of the cluster's head (its GCS port, 6379 by default)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise ClusterError(f"nothing answers at {address} ({e.strerror or e}): is the head started "
                           f"(`ray start --head --port {port}`) and reachable from here?") from None


def nodes() -> list[dict[str, Any]]:
    """The cluster's live nodes: id, address, harness cores offered."""
    ray = ray_module()
    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        out.append({"node_id": n["NodeID"], "address": n.get("NodeManagerAddress", ""),
                    "harness_cores": int(n.get("Resources", {}).get(RESOURCE, 0))})
    return out


def _on_node(fn: Callable[..., Any], node_id: str) -> Any:
    ray = ray_module()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return ray.remote(num_cpus=0, max_retries=0)(fn).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False))


def check_nodes(images: dict[str, dict[str, str]], reserve: int | None = None, version: str = "",
                timeout: float = 120) -> list[dict[str, Any]]:
    """Run :func:`harness.engine.node.check_node` on every live node (in parallel); each
    answer gains ``harness_cores`` (what the node advertises) and a problem when that is
    none, or more than the node can lease."""
    ray = ray_module()
    live = nodes()
    refs = {n["node_id"]: _on_node(check_node, n["node_id"]).remote(n["node_id"], images, reserve, version) for n in live}
    out = []
    for n in live:
        try:
            ans = ray.get(refs[n["node_id"]], timeout=timeout)
        except Exception as e:
            ans = {"node_id": n["node_id"], "facts": {"hostname": n["address"]}, "problems": [f"did not answer: {type(e).__name__}"]}
        ans["harness_cores"] = n["harness_cores"]
        ans["address"] = n["address"]
        if n["harness_cores"] <= 0:
            ans.setdefault("problems", []).append(
                f"offers no {RESOURCE} resource: start it with `ray start ... --resources '{{\"{RESOURCE}\": N}}'` "
                "(N = its cores minus those it keeps for itself); it runs no attempt")
        elif ans.get("cores") is not None and n["harness_cores"] > ans["cores"]:
            ans.setdefault("problems", []).append(
                f"offers {n['harness_cores']} {RESOURCE} but has only {ans['cores']} cores to lease: attempts would wait there")
        out.append(ans)
    return out


def on_every_node(fn: Callable[..., Any], *args: Any, timeout: float = 300) -> dict[str, Any]:
    """``fn(*args)`` on every live node at once: node id -> its answer, or the exception."""
    ray = ray_module()
    refs = {n["node_id"]: _on_node(fn, n["node_id"]).remote(*args) for n in nodes()}
    out: dict[str, Any] = {}
    for node_id, ref in refs.items():
        try:
            out[node_id] = ray.get(ref, timeout=timeout)
        except Exception as e:
            out[node_id] = e
    return out


def sweep_nodes(run_id: str, timeout: float = 60, keep: list[str] | None = None) -> None:
    """Remove the run's containers on every live node (and those of workers that died
    there), and the nodes' copies of its artifacts except those of the attempts in ``keep``
    (the driver could not write them)."""
    ray = ray_module()
    refs = [_on_node(sweep_node, n["node_id"]).remote(run_id, list(keep or [])) for n in nodes()]
    try:
        ray.wait(refs, num_returns=len(refs), timeout=timeout)
    except Exception:
        pass


def _remote_attempt(spec: RemoteAttempt, events: Any) -> RemoteResult:
    """The Ray task: runs on a node (see harness.engine.node)."""
    import ray

    from harness.engine.node import NodeRuntime

    node_id = ray.get_runtime_context().get_node_id()
    rt = NodeRuntime.get(spec.reserve)

    def emit(cpuset: list[int]) -> None:
        facts = rt.node(node_id)
        try:
            events.put(("started", spec.rel, node_id, facts.get("hostname", ""), list(cpuset), os.getpid()), timeout=30)
        except Exception:
            pass  # the driver then learns of the attempt from its result

    return rt.run(spec, node_id, emit)


@dataclass
class _Pending:
    work: Work
    submitted: float
    started: float | None = None
    node: str = ""
    host: str = ""
    cpuset: tuple[int, ...] = ()
    pid: int = 0


class RayExecutor(Executor):
    """Attempts as Ray tasks (see the module docstring). ``on_started(work, info)`` is called
    in the driver's thread when an attempt leased its cores on a node; ``lost(work, rule,
    detail, info)`` makes the record of an attempt that was lost; ``artifacts`` is the run's
    artifact folder on the driver; ``phase(work, name, t0, t1)`` replays the node's phases."""

    def __init__(self, stop: threading.Event, artifacts: Path, on_started: Callable[[Work, dict[str, Any]], None],
                 lost: Callable[[Work, str, str, dict[str, Any]], Any], phase: Callable[[Work, str, float, float], None] | None = None,
                 concurrency: int | None = None):
        ray = ray_module()
        from ray.util.queue import Queue
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._ray = ray
        self._stop = stop
        self._artifacts = artifacts
        self._on_started = on_started
        self._lost = lost
        self._phase = phase
        here = ray.get_runtime_context().get_node_id()
        self._events = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(here, soft=False)})
        self._fn = ray.remote(max_retries=0, num_cpus=0)(_remote_attempt)
        self._pending: dict[Any, _Pending] = {}
        self._by_rel: dict[str, Any] = {}
        self._presumed: dict[Any, _Pending] = {}
        self._later: list[Work] = []  # waiting for their backoff, or for a free place among `concurrency`
        self._ready: deque[Done] = deque()
        self._concurrency = concurrency  # at most this many attempts handed to Ray at once (None: no cap)
        self.unwritten: list[str] = []  # attempts whose artifacts the driver could not write: nodes keep them

    # -- Executor --------------------------------------------------------------
    def submit(self, work: Work) -> None:
        if not isinstance(work.spec, RemoteAttempt):
            raise RunError("the Ray executor needs work with a RemoteAttempt spec")
        if self._stop.is_set():
            self._ready.append(Done(work.key, not_started=True))
        elif work.not_before > time.monotonic() or not self._room():
            self._later.append(work)
        else:
            self._launch(work)

    def _room(self) -> bool:
        return self._concurrency is None or len(self._pending) < self._concurrency

    def results(self, timeout: float) -> Done | None:
        end = time.monotonic() + timeout
        while True:
            self._drain_events()
            self._launch_due()
            self._check_budgets()
            if self._ready:
                return self._ready.popleft()
            refs = [*self._pending, *self._presumed]
            left = end - time.monotonic()
            if left <= 0:
                return None
            if not refs:
                time.sleep(min(0.2, left))
                continue
            ready, _ = self._ray.wait(refs, num_returns=1, timeout=min(0.2, left))
            if ready:  # a node's "started" lands before its attempt can end: read it first, so a
                self._drain_events()  # worker that died right after it is named (its pid, node, cores)
            for ref in ready:
                self._take(ref)

    def stop(self) -> None:
        self._stop.set()
        for w in self._later:
            self._ready.append(Done(w.key, not_started=True))
        self._later.clear()
        for ref, p in list(self._pending.items()):
            if p.started is None:  # still queued in Ray: it will not start
                try:
                    self._ray.cancel(ref, force=False)
                except Exception:
                    pass

    def close(self, timeout: float) -> None:
        """Stop, wait up to ``timeout`` s for attempts still running (their results are not
        taken any more: the driver drained what it wanted), and end the event queue."""
        self.stop()
        if self._pending:
            try:
                self._ray.wait(list(self._pending), num_returns=len(self._pending), timeout=timeout)
            except Exception:
                pass
        try:
            self._ray.kill(self._events.actor)
        except Exception:
            pass

    def late(self, timeout: float) -> list[Done]:
        out: list[Done] = []
        end = time.monotonic() + timeout
        while self._presumed and time.monotonic() < end:
            ready, _ = self._ray.wait(list(self._presumed), num_returns=1, timeout=min(0.5, max(0.0, end - time.monotonic())))
            for ref in ready:
                self._take(ref)
            while self._ready:
                d = self._ready.popleft()
                if d.late:
                    out.append(d)
        return out

    def in_flight(self) -> int:
        return len(self._pending) + len(self._ready)

    # -- the work --------------------------------------------------------------
    def _launch(self, work: Work) -> None:
        spec: RemoteAttempt = work.spec
        ref = self._fn.options(resources={RESOURCE: float(spec.cores)}).remote(spec, self._events)
        self._pending[ref] = _Pending(work=work, submitted=time.monotonic())
        self._by_rel[spec.rel] = ref

    def _launch_due(self) -> None:
        """Hand waiting work to Ray, in submission order, once its backoff is over and there is room."""
        now = time.monotonic()
        keep: list[Work] = []
        for w in self._later:
            if w.not_before <= now and self._room() and not self._stop.is_set():
                self._launch(w)
            else:
                keep.append(w)
        self._later = keep

    def _drain_events(self) -> None:
        try:
            items = self._events.get_nowait_batch(self._events.qsize()) if self._events.qsize() else []
        except Exception:
            items = []
        for kind, rel, node, host, cpuset, pid in items:
            ref = self._by_rel.get(rel)
            p = self._pending.get(ref) if ref is not None else None
            if kind != "started" or p is None or p.started is not None:
                continue
            p.started, p.node, p.host, p.cpuset, p.pid = time.monotonic(), node, host, tuple(cpuset), pid
            self._on_started(p.work, self._info(p))

    @staticmethod
    def _info(p: _Pending) -> dict[str, Any]:
        return {"node_id": p.node, "hostname": p.host, "cpuset": list(p.cpuset), "pid": p.pid}

    def _check_budgets(self) -> None:
        now = time.monotonic()
        for ref, p in list(self._pending.items()):
            budget = p.work.spec.budget_s
            if p.started is None or not budget or now - p.started <= budget:
                continue
            del self._pending[ref]
            self._presumed[ref] = p
            where = f"node {p.host} ({p.node[:12]})" if p.node else "its node"
            self._ready.append(Done(p.work.key, result=self._lost(
                p.work, "no_result", f"no result from {where} {budget:.0f} s after the attempt started (its budget): presumed lost "
                "and rerun; a record that still arrives is kept as late evidence, never counted", self._info(p))))

    def _take(self, ref: Any) -> None:
        late = ref in self._presumed
        p = self._presumed.pop(ref, None) if late else self._pending.pop(ref, None)
        if p is None:
            return
        self._by_rel.pop(p.work.spec.rel, None)
        exc = self._ray.exceptions
        try:
            res: RemoteResult = self._ray.get(ref)
        except exc.TaskCancelledError:
            if not late:
                self._ready.append(Done(p.work.key, not_started=True) if p.started is None else Done(p.work.key, result=self._lost(
                    p.work, "worker_lost", "the attempt was cancelled on its node while it ran", self._info(p))))
            return
        except exc.RayError as e:
            if late:
                return  # the lost record is already stored; a failure now adds nothing
            self._ready.append(Done(p.work.key, result=self._lost(p.work, *_why(e, p), self._info(p))))
            return
        except Exception as e:  # a result that cannot be read back
            if not late:
                self._ready.append(Done(p.work.key, result=self._lost(
                    p.work, "worker_lost", f"the attempt's result could not be read: {type(e).__name__}: {str(e)[:200]}", self._info(p))))
            return
        rec = self._received(p, res)
        self._ready.append(Done(p.work.key, result=rec, late=late))

    def _received(self, p: _Pending, res: RemoteResult) -> Any:
        """The node's record as the driver stores it: its identity the driver's own (a node
        cannot file a record under another slot), its artifacts written here; never raises."""
        spec: RemoteAttempt = p.work.spec
        j = spec.job
        dest = self._artifacts / spec.rel
        rec = res.record
        notes = []
        try:
            refused = receive_artifacts(dest, res.files)
            if refused:
                notes.append(f"artifact paths refused: {', '.join(refused[:5])}")
        except OSError as e:  # the driver's disk: the node keeps its copy (see kept())
            self.unwritten.append(spec.rel)
            notes.append(f"its artifacts could not be written on the driver ({e.strerror or e}); they stay on node "
                         f"{p.host or '?'} ({p.node[:12]}) in $HARNESS_HOME/node-artifacts/{j.run.id}/{spec.rel}")
        upd: dict[str, Any] = {"artifacts": str(dest), "run_id": j.run.id, "task_id": j.task.id, "slot": j.slot,
                               "attempt_no": j.attempt_no, "seed": j.seed}
        if notes:
            upd["error"] = (rec.error + "; " if rec.error else "") + "; ".join(notes)
        if self._phase is not None:
            for name, t0, t1 in res.phases:
                self._phase(p.work, name, t0, t1)
        return rec.model_copy(update=upd)


def _why(e: Exception, p: _Pending) -> tuple[str, str]:
    """(rule, detail) of a Ray failure."""
    exc = ray_module().exceptions
    where = f"node {p.host} ({p.node[:12]})" if p.node else "its node"
    first = (str(e).strip().splitlines() or [""])[0][:240]
    if isinstance(e, getattr(exc, "NodeDiedError", ())) or "node" in type(e).__name__.lower() and "died" in str(e).lower():
        return "node_lost", f"{where} was lost during the attempt ({type(e).__name__})"
    if isinstance(e, (exc.WorkerCrashedError, getattr(exc, "ActorDiedError", exc.WorkerCrashedError))):
        return "worker_lost", f"the Ray worker running the attempt on {where} died (pid {p.pid or '?'}; {type(e).__name__})"
    if isinstance(e, exc.RayTaskError):
        cause = getattr(e, "cause", None)
        what = f"{type(cause).__name__}: {str(cause)[:240]}" if cause is not None else first
        return "worker_lost", f"the attempt could not run on {where}: {what}"
    return "worker_lost", f"the attempt was lost on {where}: {type(e).__name__}: {first}"
