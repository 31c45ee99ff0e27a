"""Exclusive cpuset leases: never two attempts on one core, in one process or across processes."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from harness.engine.scheduler import CpuPool
from harness.model.errors import SchedulerError


def test_reserves_one_core_when_more_than_one():
    p = CpuPool.for_host(cpus=[0, 1, 2, 3])
    assert p.reserved == [0] and p.size == 3
    assert CpuPool.for_host(cpus=[0]).reserved == []


def test_concurrency_is_what_fits_and_can_only_be_lowered():
    p = CpuPool.for_host(cpus=list(range(8)))
    assert p.concurrency(1) == 7
    assert p.concurrency(2) == 3
    assert p.concurrency(2, requested=2) == 2
    assert p.concurrency(2, requested=50) == 3
    with pytest.raises(SchedulerError, match="needs 8 exclusive cores"):
        p.concurrency(8)
    with pytest.raises(SchedulerError):
        CpuPool.for_host(reserve=4, cpus=[0, 1, 2, 3])


def test_leases_are_exclusive_under_threads(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_LOCK_DIR", str(tmp_path))
    p = CpuPool.for_host(cpus=list(range(5)))
    in_use: set[int] = set()
    clash = []
    lock = threading.Lock()

    def work():
        for _ in range(30):
            got = p.lease(2)
            with lock:
                if in_use & set(got):
                    clash.append(got)
                in_use.update(got)
            time.sleep(0.001)
            with lock:
                in_use.difference_update(got)
            p.release(got)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not clash
    assert p.peak_in_use <= 4 and 0 not in in_use


def test_a_core_leased_by_another_process_waits(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_LOCK_DIR", str(tmp_path))
    code = (
        "import os, time\n"
        "from harness.engine.scheduler import CpuPool\n"
        "p = CpuPool(cpus=[0, 1], reserved=[0])\n"
        "got = p.lease(1); print('leased', got, flush=True); time.sleep(1.5); p.release(got)\n"
    )
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env={**__import__("os").environ, "HARNESS_LOCK_DIR": str(tmp_path)})
    assert "leased [1]" in other.stdout.readline()
    p = CpuPool(cpus=[0, 1], reserved=[0])
    t0 = time.monotonic()
    got = p.lease(1)
    waited = time.monotonic() - t0
    p.release(got)
    other.wait()
    assert got == [1]
    assert waited > 0.8, "the lease must wait until the other controller releases core 1"
