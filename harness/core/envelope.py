"""The envelope as the kernel applied it, compared with the profile (pure)."""

from __future__ import annotations

from typing import Any

from harness.model.counters import CgroupLimits
from harness.model.profile import Profile
from harness.model.sandbox import EnvelopeCheck

PAGE = 4096


def expected_limits(profile: Profile, cpuset: list[int]) -> dict[str, Any]:
    """The cgroup values a correctly applied envelope has."""
    mem = profile.memory // PAGE * PAGE
    return {
        "cpu_quota_us": profile.quota_us,
        "cpu_period_us": profile.cpu_period_us,
        "cpuset_cpus": sorted(cpuset),
        "memory_max": mem,
        "memsw_max": mem,
        "pids_max": profile.pids,
    }


def check_envelope(profile: Profile, cpuset: list[int], applied: CgroupLimits | None) -> EnvelopeCheck:
    """Compare read-back limits with the profile. Unknown values (None) of optional limits such
    as memsw on a kernel without swap accounting are not mismatches; a missing cgroup is."""
    exp = expected_limits(profile, cpuset)
    if applied is None:
        return EnvelopeCheck(applied=None, expected=exp, mismatches=["cgroup not readable"])
    mism = []
    for key, want in exp.items():
        got = getattr(applied, key)
        if key == "memsw_max" and got is None:
            continue  # no swap accounting: swap cannot be used beyond memory anyway
        if key in ("memory_max", "memsw_max") and got is not None:
            got = got // PAGE * PAGE
        if key == "cpuset_cpus" and got is not None:
            got = sorted(got)
        if got != want:
            mism.append(f"{key}: profile {want}, kernel {got}")
    return EnvelopeCheck(applied=applied, expected=exp, mismatches=mism)
