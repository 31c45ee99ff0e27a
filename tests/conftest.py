"""Shared fixtures. Tests that need Docker use the real engine: they skip when none answers,
except under CI or HARNESS_REQUIRE_DOCKER, where a missing engine is a failure."""

from __future__ import annotations

import os

import pytest

REQUIRE_DOCKER = bool(os.environ.get("CI") or os.environ.get("HARNESS_REQUIRE_DOCKER"))

# tests/guest/ holds the checks that need a live cgroup v2 kernel: `make test-cgroup2` runs them
# in its guest (HARNESS_IN_GUEST is set there); elsewhere they are not collected
collect_ignore = [] if os.environ.get("HARNESS_IN_GUEST") else ["guest"]
# ... where QEMU may emulate the CPU (TCG, ~14x slower): the few tests whose assertion is a
# CPU-time ratio that emulation distorts use bounds that hold there too, and say why
EMULATED = os.environ.get("HARNESS_GUEST_ACCEL") == "tcg"

# Runs in tests of other behaviour may end with a slot visibly unmeasured on a busy CI host:
# they read the slot's status, not the exit code `run` gives it (3 by default), and they skip
# the pre-run core probe (0.3 s a run). The exit code for unmeasured slots and the probe have
# their own tests (test_run_docker.py, test_busy_host.py), which set both.
os.environ.setdefault("HARNESS_MAX_UNMEASURED", "1")
os.environ.setdefault("HARNESS_PROBE_S", "0")


def missing(reason: str) -> None:
    """A prerequisite of a test is absent: a failure under CI/HARNESS_REQUIRE_DOCKER (where
    `make test` installs everything), a skip on a developer's machine."""
    if REQUIRE_DOCKER:
        pytest.fail(f"{reason} (CI/HARNESS_REQUIRE_DOCKER is set, so this is a failure; `make test` sets up the engine, images, chromium and postgresql)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client():
    """A connected Docker SDK client with the harness images present."""
    from harness.sandbox.images import SANDBOX_IMAGE
    from harness.model.errors import EngineError
    from harness.sandbox.docker_sandbox import connect, image_present

    try:
        client = connect(timeout=120)
    except EngineError as e:
        missing(str(e))
    if not image_present(client, SANDBOX_IMAGE):
        missing(f"image {SANDBOX_IMAGE} missing; run `make images`")
    return client


@pytest.fixture()
def trial_cpu():
    """A core for a pinned test container, leased like a run's (flock), so a test never
    shares its core with another harness controller on this machine."""
    from harness.engine.scheduler import CpuPool

    with CpuPool.for_host().leased(1) as got:
        yield got


def run_cli(cwd, *args: str, env: dict | None = None, timeout: float = 600):
    """`python -m harness ARGS` in ``cwd`` with its own HARNESS_HOME, as a user would run it."""
    import subprocess
    import sys

    e = {**os.environ, "HARNESS_HOME": str(cwd / "home"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=timeout, env=e, cwd=cwd)


def dead_core_holder(core: int = 0) -> int:
    """A real process that leases ``core`` (as a controller does) and is killed holding it;
    its pid. The lock folder is the caller's $HARNESS_LOCK_DIR."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "import time; from harness.engine.scheduler import CpuPool; "
                          f"p = CpuPool(cpus=[{core}], reserved=[]); p.lease(1, timeout=5); print('held', flush=True); time.sleep(60)"],
                         stdout=subprocess.PIPE, text=True, env={**os.environ})
    assert p.stdout.readline().strip() == "held"
    p.kill()
    p.wait()
    return p.pid
