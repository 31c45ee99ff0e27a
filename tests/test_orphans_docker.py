"""A controller (or a Ray worker) killed while its container runs: the kernel drops its core
lock at once, but the container keeps running on that core. The next lease of the core must
remove it before anything else runs there. Real processes, real flocks, a real container."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from harness.engine.executor import LocalExecutor, OrphanClearer, Work
from harness.engine.scheduler import CpuPool
from harness.sandbox.docker_backend import DockerBackend
from harness.sandbox.images import SANDBOX_IMAGE
from harness.sandbox.owners import LABEL_RUN, controller_host
from tests.conftest import dead_core_holder

pytestmark = pytest.mark.docker

HOLDER = textwrap.dedent("""
    import sys, time
    from harness.engine.scheduler import CpuPool
    from harness.sandbox.docker_sandbox import connect
    from harness.sandbox.docker_backend import _labels
    core = int(sys.argv[1])
    pool = CpuPool(cpus=[core], reserved=[])
    got = pool.lease(1, timeout=30)
    c = connect().containers.run(sys.argv[2], ["sleep", "600"], detach=True, cpuset_cpus=str(core),
                                 labels=_labels({"dev.harness.run": sys.argv[3]}), network_mode="none")
    print(c.name, flush=True)
    time.sleep(600)
""")


def _holder(tmp_path, core: int, run_id: str) -> tuple[subprocess.Popen, str]:
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    p = subprocess.Popen([sys.executable, str(script), str(core), SANDBOX_IMAGE, run_id], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "HARNESS_LOCK_DIR": str(tmp_path / "locks")})
    name = p.stdout.readline().strip()
    assert name, "the holder process did not start its container"
    return p, name


def test_lock_file_names_a_holder_that_died_holding_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_LOCK_DIR", str(tmp_path / "locks"))
    pool = CpuPool(cpus=[0], reserved=[])
    got = pool.lease(1, timeout=5)
    pool.release(got)  # a clean release leaves no name behind
    got = pool.lease(1, timeout=5)
    assert pool.take_stale(got) == {}
    pool.release(got)
    pid = dead_core_holder(0)
    got = pool.lease(1, timeout=5)
    stale = pool.take_stale(got)
    assert stale == {0: f"{controller_host()}:{pid}"}
    assert pool.take_stale(got) == {}, "a stale holder is reported once"
    pool.release(got)


def test_container_of_a_killed_holder_is_removed_before_its_core_is_leased_again(tmp_path, monkeypatch, docker_client):
    monkeypatch.setenv("HARNESS_LOCK_DIR", str(tmp_path / "locks"))
    core = CpuPool.for_host().cpus[-1]
    p, name = _holder(tmp_path, core, "orphan-test")
    try:
        assert docker_client.containers.get(name).status == "running"
        os.kill(p.pid, signal.SIGKILL)  # the kernel drops its flock; its container runs on
        p.wait()
        assert docker_client.containers.get(name).status == "running"
        backend = DockerBackend(docker_client)
        clearer = OrphanClearer(backend)
        stop = threading.Event()
        ex = LocalExecutor(CpuPool(cpus=[core], reserved=[]), 1, stop, clear=clearer)
        seen = {}

        def run(cpuset):
            # by the time the attempt has the core, nothing of the dead holder runs there
            seen["left"] = [c.name for c in docker_client.containers.list(all=True, filters={"label": [f"{LABEL_RUN}=orphan-test"]})]
            seen["notes"] = clearer.notes(cpuset)
            return "rec", True, None

        ex.submit(Work(key="k", cores=1, run=run))
        done = ex.results(timeout=60)
        ex.close(timeout=5)
        assert done is not None and done.result == "rec"
        assert seen["left"] == []
        assert len(seen["notes"]) == 1 and f":{p.pid}, which died holding it" in seen["notes"][0] and name in seen["notes"][0]
    finally:
        p.kill()
        for c in docker_client.containers.list(all=True, filters={"label": [f"{LABEL_RUN}=orphan-test"]}):
            c.remove(force=True)


def test_a_live_holder_is_no_orphan(docker_client):
    backend = DockerBackend(docker_client)
    me = f"{controller_host()}:{os.getpid()}"
    assert backend.remove_orphans_of([me]) == []
