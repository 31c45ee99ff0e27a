"""Profiles: the shipped ones load, bad ones fail with the file and the key named."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from harness.engine.profiles import load_profile, load_profile_file
from harness.model.errors import ProfileError
from harness.model.profile import Profile
from harness.model.units import MiB, parse_size, plural


@pytest.mark.parametrize("name", ["tight", "standard", "generous"])
def test_shipped_profiles_load(name):
    p = load_profile(name)
    assert p.name == name
    assert p.cpus <= p.cores
    assert p.network == "none"
    assert p.sla.foreign_cpu_share is not None


def test_tight_is_smaller_than_generous():
    t, g = load_profile("tight"), load_profile("generous")
    assert t.cpus < g.cpus and t.memory < g.memory and t.timeouts.agent < g.timeouts.agent


def write(tmp_path: Path, body: str, name: str = "p.toml") -> Path:
    f = tmp_path / name
    f.write_text(body)
    return f


@pytest.mark.parametrize(
    "body, key, words",
    [
        ("cpus = 2\ncores = 1\n", "(top level)", "cpus = 2.0 exceeds cores = 1"),
        ("memory = '8m'\n", "memory", "below the floor"),
        ("memory = 'lots'\n", "memory", "not a size"),
        ("pids = 2\n", "pids", "greater than or equal to 8"),
        ("cpus = 'one'\n", "cpus", "valid number"),
        ("colour = 'red'\n", "colour", "unknown key"),
        ("network = 'host'\n", "network", "'allowlist' or 'bridge'"),
        ("user = '0:0'\n", "(top level)", "root"),
        ("[timeouts]\nagent = -1\n", "timeouts.agent", "greater than 0"),
        ("[sla]\nforeign_cpu_share = 2\n", "sla.foreign_cpu_share", "less than or equal to 1"),
        ("[sla]\nbogus = 1\n", "sla.bogus", "unknown key"),
        ("[tmpfs]\n'/' = '1m'\n", "tmpfs", "absolute path other than /"),
    ],
)
def test_bad_profiles_name_file_and_key(tmp_path, body, key, words):
    f = write(tmp_path, body)
    with pytest.raises(ProfileError) as e:
        load_profile_file(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}: {key}: "), msg
    assert words in msg


def test_not_toml(tmp_path):
    f = write(tmp_path, "cpus = = 1")
    with pytest.raises(ProfileError, match="not valid TOML"):
        load_profile_file(f)


def test_unknown_profile_lists_available():
    with pytest.raises(ProfileError, match="available: .*standard"):
        load_profile("nope")


def test_override_is_validated_again():
    from harness.model.profile import EnvelopeOverride

    p = load_profile("standard")
    q = p.with_override(EnvelopeOverride(memory="2g", timeouts={"agent": 5}))
    assert q.memory == 2048 * MiB and q.timeouts.agent == 5 and q.cpus == p.cpus
    with pytest.raises(Exception, match="exceeds cores"):
        p.with_override(EnvelopeOverride(cpus=3))


@given(st.integers(min_value=0, max_value=2**40))
def test_parse_size_int_roundtrip(n):
    assert parse_size(n) == n
    assert parse_size(str(n)) == n


@given(st.text(max_size=12))
def test_parse_size_never_crashes(s):
    try:
        v = parse_size(s)
    except ValueError:
        return
    assert v >= 0


@given(
    cpus=st.floats(min_value=-1, max_value=8, allow_nan=False),
    cores=st.integers(min_value=-1, max_value=8),
    mem=st.integers(min_value=0, max_value=2**33),
)
def test_profile_validation_is_total(cpus, cores, mem):
    """Any combination either validates into a consistent profile or raises a ValueError."""
    try:
        p = Profile(name="x", cpus=cpus, cores=cores, memory=mem)
    except ValueError:
        return
    assert 0 < p.cpus <= p.cores and p.memory >= 16 * MiB


@pytest.mark.parametrize("model, field", [("Timeouts", "agent"), ("Timeouts", "grade"), ("EnvelopeOverride", "cpus"), ("EnvelopeOverride", "pids"), ("GatewayLimits", "retries")])
def test_true_is_not_a_number_in_what_a_user_writes(model, field):
    """pydantic reads ``true`` as 1 (a one-second limit, one core): refused, with the key."""
    import harness.model.profile as prof
    from pydantic import ValidationError

    cls = getattr(prof, model)
    with pytest.raises(ValidationError, match=f"{field}: true is not a number"):
        cls.model_validate({field: True})
    assert getattr(cls.model_validate({field: 8}), field) == 8


def test_plural_puts_the_noun_in_the_right_number():
    assert (plural(1, "trial"), plural(0, "trial"), plural(3, "trial"), plural(2, "tally", "tallies")) == ("1 trial", "0 trials", "3 trials", "2 tallies")
