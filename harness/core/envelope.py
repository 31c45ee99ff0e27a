"""The envelope as the kernel applied it, compared with the profile (pure)."""

from __future__ import annotations

from typing import Any

from harness.model.counters import CgroupLimits
from harness.model.profile import Profile
from harness.model.sandbox import EnvelopeCheck

PAGE = 4096


def expected_limits(profile: Profile, cpuset: list[int]) -> dict[str, Any]:
    """The cgroup values a correctly applied envelope has (disk limits only when the profile sets them)."""
    mem = profile.memory // PAGE * PAGE
    io = {k: getattr(profile, k) for k in ("io_read_bps", "io_write_bps") if getattr(profile, k) is not None}
    return {**io, 
        "cpu_quota_us": profile.quota_us,
        "cpu_period_us": profile.cpu_period_us,
        "cpuset_cpus": sorted(cpuset),
        "memory_max": mem,
        "memsw_max": mem,
        "pids_max": profile.pids,
    }


def check_envelope(profile: Profile, cpuset: list[int], applied: CgroupLimits | None, io_device: str | None = None) -> EnvelopeCheck:
    """Compare read-back limits with the profile. Unknown values (None) of optional limits such
    as memsw on a kernel without swap accounting are not mismatches; a missing cgroup is.
    ``io_device``: 'MAJ:MIN' of the disk the disk limits were set on (None: none found)."""
    exp = expected_limits(profile, cpuset)
    if applied is None:
        return EnvelopeCheck(applied=None, expected=exp, mismatches=["cgroup not readable"])
    mism = []
    for key, want in exp.items():
        if key in ("io_read_bps", "io_write_bps"):
            if io_device is None:
                mism.append(f"{key}: profile {want}, but no block device holds the engine's data root (overlay, tmpfs or a "
                            "remote engine): the limit cannot be applied here")
                continue
            got = getattr(applied, key).get(io_device)
            if got != want:
                mism.append(f"{key}: profile {want}, kernel {got} (device {io_device})")
            continue
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


# Facts of the machine that change what a trial measures: attempts of one run on machines
# that differ in one of these mix two environments (the report flags it, compare refuses it).
ENVELOPE_FACTS = ("cgroup_version", "kernel", "cpu_model", "engine_version", "cgroup_driver")


def envelope_differences(facts: list[dict[str, Any]], counts: list[int] | None = None) -> list[str]:
    """Facts that differ between machines (attempts' or nodes' fact sets), one line each:
    every value with how many of the sets have it (``cgroup_version: 1 (hybrid) (3), 2 (5)``).
    ``counts``: how many sets each of ``facts`` stands for (default one each)."""
    out = []
    weights = counts if counts is not None else [1] * len(facts)
    for key in ENVELOPE_FACTS:
        seen: dict[str, int] = {}
        for f, w in zip(facts, weights):
            if key in f and f[key] not in ("", None):
                seen[str(f[key])] = seen.get(str(f[key]), 0) + w
        if len(seen) > 1:
            out.append(f"{key}: " + ", ".join(f"{v} ({n})" for v, n in sorted(seen.items())))
    return out


def node_name(node: dict[str, Any]) -> str:
    """How a machine is named in tables: hostname (local), hostname/node-id prefix (a Ray
    node); '' for a record older than per-attempt node facts."""
    host = node.get("hostname") or ""
    return f"{host or '?'}/{str(node['node_id'])[:8]}" if node.get("node_id") else host
