"""Exclusive cpuset leases: never two attempts on one core, in one process or across processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import missing
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


PIN_PROBE = ("import os, sys; sys.argv = ['harness', *sys.argv[1:]]; from harness.cli.commands import _keep_off_trial_cores, own_process; own_process(); "
             "_keep_off_trial_cores(); print(','.join(map(str, sorted(os.sched_getaffinity(0)))))")


@pytest.mark.parametrize("argv,pinned", [(["report", "last"], True), (["--help"], True), (["run", "--suite", "x"], False)])
def test_harness_commands_keep_off_the_trial_cores(argv, pinned):
    """A report or an image build running beside a run used to land on its trial core (foreign
    CPU there, discarded attempts); every command but `run` (which pins by --reserve-cores)
    now runs on the cores a run reserves for its controller."""
    cpus = sorted(range(os.cpu_count() or 1))  # the machine's, whatever this test process was pinned to
    if len(cpus) < 2:
        missing("needs two cores: with one nothing is reserved (CI/HARNESS_REQUIRE_DOCKER machines have two)")
    out = subprocess.run([sys.executable, "-c", PIN_PROBE, *argv], capture_output=True, text=True, check=True,
                         preexec_fn=lambda: os.sched_setaffinity(0, cpus)).stdout.strip()
    assert out == (str(cpus[0]) if pinned else ",".join(map(str, cpus)))


def test_the_console_script_is_off_the_trial_cores_before_it_loads_anything_heavy():
    """Its imports (~0.5 s of CPU) ran on every core before the command pinned itself: a
    report beside a run was that run's foreign CPU for its first half second."""
    cpus = sorted(range(os.cpu_count() or 1))
    if len(cpus) < 2:
        missing("needs two cores (CI/HARNESS_REQUIRE_DOCKER machines have two)")
    code = ("import os, sys; import harness.cli as c; "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'sqlalchemy', 'typer', 'rich', 'docker', 'numpy') "
            "or m.startswith('harness.') and m != 'harness.cli'); c._pin_early(); "
            "from harness.engine.scheduler import CpuPool; p = CpuPool.for_host(); "
            "print(heavy, sorted(os.sched_getaffinity(0)), p.cpus, p.reserved)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         preexec_fn=lambda: os.sched_setaffinity(0, cpus)).stdout.strip()
    assert out == f"[] {[cpus[0]]} {cpus} {cpus[:1]}"
    src = (Path(__file__).parents[1] / "harness" / "cli" / "__init__.py").read_text()
    body = src[src.index("def main()"):]
    assert body.index("_pin_early()") < body.index("from harness.cli.commands import")


def test_a_pinned_controller_still_sees_the_machines_cores():
    """Pinning a process to its reserved cores used to shrink what it read as the machine: a
    command pinned at start planned a run on one core (trials beside the controller)."""
    code = ("import os; from harness.engine.scheduler import CpuPool, pin_process; pin_process([0]); "
            "p = CpuPool.for_host(); print(sorted(os.sched_getaffinity(0)), p.cpus, p.reserved)")
    cpus = sorted(range(os.cpu_count() or 1))
    if len(cpus) < 2:
        missing("needs two cores (CI/HARNESS_REQUIRE_DOCKER machines have two)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         preexec_fn=lambda: os.sched_setaffinity(0, cpus)).stdout.strip()
    assert out == f"[0] {cpus} [0]"


def test_a_command_called_in_process_never_pins_its_host(tmp_path):
    """`harness run` pins its own process to the reserved cores; called in-process (a test, a
    notebook) it used to pin the host process, and every run that process started afterwards
    inherited one core and planned its trials there, beside the controller."""
    from typer.testing import CliRunner

    from harness.cli import app

    cpus = set(range(os.cpu_count() or 1))
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        r = CliRunner().invoke(app, ["run", "--suite", str(tmp_path / "no-such-suite"), "--db", f"sqlite:///{tmp_path / 'h.db'}"])
        assert r.exit_code == 2, r.output
        assert os.sched_getaffinity(0) == cpus
    finally:
        os.sched_setaffinity(0, before)
