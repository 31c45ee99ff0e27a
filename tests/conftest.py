"""Shared fixtures. Tests that need Docker use the real engine: they skip when none answers,
except under CI or HARNESS_REQUIRE_DOCKER, where a missing engine is a failure."""

from __future__ import annotations

import os

import pytest

REQUIRE_DOCKER = bool(os.environ.get("CI") or os.environ.get("HARNESS_REQUIRE_DOCKER"))


def _no_docker(reason: str) -> None:
    if REQUIRE_DOCKER:
        pytest.fail(f"{reason} (CI/HARNESS_REQUIRE_DOCKER is set, so this is a failure; run `make engine images`)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client():
    """A connected Docker SDK client with the harness images present."""
    from harness.images import SANDBOX_IMAGE
    from harness.sandbox import EngineError, connect, image_present

    try:
        client = connect(timeout=120)
    except EngineError as e:
        _no_docker(str(e))
    if not image_present(client, SANDBOX_IMAGE):
        _no_docker(f"image {SANDBOX_IMAGE} missing; run `make images`")
    return client


@pytest.fixture()
def trial_cpu():
    """A core for a pinned test container, leased like a run's (flock), so a test never
    shares its core with another harness controller on this machine."""
    from harness.scheduler import CpuPool

    pool = CpuPool.for_host()
    got = pool.lease(1)
    yield got
    pool.release(got)
