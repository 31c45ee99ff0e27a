"""One command as one attempt (``harness sandbox exec``): a fresh sandbox, the command under
the monitor, the record, the sandbox removed. Never raises for engine or workload failures:
they are recorded as ``infra_error``."""

from __future__ import annotations

from harness.core.outcome import classify_command
from harness.model.profile import Profile
from harness.model.sandbox import AttemptResult
from harness.sandbox.base import SandboxBackend, SandboxSpec


def run_command(backend: SandboxBackend, image: str, profile: Profile, cpuset: list[int], cmd: list[str],
                env: dict[str, str] | None = None, labels: dict[str, str] | None = None, timeout: float | None = None) -> AttemptResult:
    """Run ``cmd`` in a fresh sandbox and return its record."""
    sb = backend.sandbox(SandboxSpec(image=image, profile=profile, cpuset=cpuset, labels=labels or {}))
    try:
        try:  # the command starts with the sandbox where the backend can do that (no exec)
            m = sb.run_once(cmd, timeout=profile.timeouts.agent if timeout is None else timeout, env=env)
        except Exception as e:
            if sb.envelope is None:  # it never started
                return AttemptResult(container=sb.name, image=image, profile=profile.name, cpuset=cpuset, kind="infra_error", error=str(e))
            # a host reading failed, the engine went away
            return AttemptResult(container=sb.name, image=image, profile=profile.name, cpuset=cpuset, kind="infra_error",
                                 envelope=sb.envelope, error=f"{type(e).__name__}: {str(e)[:300]}")
        return AttemptResult(
            container=sb.name, image=image, profile=profile.name, cpuset=cpuset, exec=m.result,
            kind=classify_command(m.result, m.counters.oom_kills if m.counters else None, m.engine_oom),
            envelope=sb.envelope, counters=m.counters, host=m.host, samples=m.samples,
        )
    finally:
        sb.halt()  # killed from the host first: the engine then removes an exited container (~7 ms less)
        sb.remove()
