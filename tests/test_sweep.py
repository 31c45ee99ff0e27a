"""Envelope sweeps: profile scaling (pure) and a real two-envelope sweep of the probe suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.engine.profiles import load_profile
from harness.model.units import MiB
from harness.store.store import Store
from harness.core.sweep import generosity, scale_profile

PROBE = str(Path(__file__).parent / "suites" / "probe")


def test_headroom_scales_kill_limits_and_keeps_the_cpuset():
    tight = load_profile("tight")
    p, note = scale_profile(tight, 2)
    assert p.name == "tight-x2"
    assert p.cpus == pytest.approx(0.5) and p.cores == tight.cores
    assert p.memory == 2 * tight.memory
    assert p.timeouts.agent == 2 * tight.timeouts.agent and p.timeouts.setup == 2 * tight.timeouts.setup
    assert note == ""


def test_headroom_quota_is_capped_at_the_cpuset():
    p, note = scale_profile(load_profile("standard"), 3)
    assert p.cpus == p.cores == 1
    assert "capped" in note
    with pytest.raises(ValueError):
        scale_profile(load_profile("standard"), 0)


def test_generosity_orders_the_shipped_profiles():
    names = sorted(["generous", "tight", "standard"], key=lambda n: generosity(load_profile(n)))
    assert names == ["tight", "standard", "generous"]


@pytest.mark.docker
def test_sweep_runs_each_envelope_with_the_same_seeds(docker_client, tmp_path):
    env = {**os.environ, "HARNESS_HOME": str(tmp_path / "home")}
    url = f"sqlite:///{tmp_path}/h.db"
    r = subprocess.run(
        [sys.executable, "-m", "harness", "sweep", "--suite", PROBE, "--profiles", "tight,standard", "--trials", "2", "--k", "1,2",
         "--max-reruns", "6", "--db", url, "--json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["reference"] == "standard"
    rows = {p["profile"]: p for p in doc["profiles"]}
    assert set(rows) == {"tight", "standard"}
    assert rows["standard"]["vs_reference"] is None
    v = rows["tight"]["vs_reference"]
    assert v["reference"] == "standard" and v["n_common"] == 2
    assert v["low"] <= v["delta_pass1"] <= v["high"]
    assert {"pass@1", "pass^2"} <= set(rows["tight"]["metrics"])
    store = Store.open(url, mode="ro")
    runs = [store.get_run(p["run_id"]) for p in doc["profiles"]]
    assert {x.sweep_id for x in runs} == {doc["sweep_id"]}
    assert {x.profile for x in runs} == {"tight", "standard"}
    # same seeds per slot under both envelopes: only the envelope changes
    seeds = [sorted((a.task_id, a.slot, a.seed) for a in store.attempts(x.id) if a.verdict == "clean") for x in runs]
    assert seeds[0] == seeds[1]
    assert runs[0].profile_json["memory"] == 128 * MiB


def test_headroom_scales_a_tasks_own_overrides_too():
    from harness.model.profile import EnvelopeOverride

    base = load_profile("standard")
    task_override = EnvelopeOverride(memory="256m", cpus=0.25, timeouts={"agent": 10})
    scaled, _ = scale_profile(base, 2)
    eff = scaled.with_override(task_override)
    assert eff.memory == 512 * MiB and eff.cpus == pytest.approx(0.5) and eff.timeouts.agent == 20
    # factor 1 leaves a task's override exactly as written
    same = scale_profile(base, 1)[0].with_override(task_override)
    assert same.memory == 256 * MiB and same.cpus == 0.25 and same.timeouts.agent == 10
