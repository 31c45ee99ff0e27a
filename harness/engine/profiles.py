"""Loading profiles: ``sandboxes/NAME.toml`` (./sandboxes first, then the built-in ones).

Reads files; the models are ``harness.model.profile``.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from harness.model.errors import ProfileError
from harness.model.profile import Profile
from harness.model.units import did_you_mean, format_validation_error

def load_profile_file(path: Path) -> Profile:
    """Load and validate one profile TOML file. Raises ProfileError naming the file and key."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such profile file") from None
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{path}: not valid TOML: {e}") from None
    data.setdefault("name", path.stem)
    try:
        return Profile.model_validate(data)
    except ValidationError as e:
        raise ProfileError(format_validation_error(str(path), e, Profile)) from None


def profile_dirs() -> list[Path]:
    """Where profiles are looked up, first match wins: ./sandboxes, then the built-in ones."""
    dirs = [Path.cwd() / "sandboxes"]
    builtin = Path(str(resources.files("harness") / "sandboxes"))
    if builtin.is_dir() and builtin.resolve() not in [d.resolve() for d in dirs if d.is_dir()]:
        dirs.append(builtin)
    return dirs


def available_profiles() -> dict[str, Path]:
    """Profile name -> file, across the lookup directories."""
    found: dict[str, Path] = {}
    for d in profile_dirs():
        if d.is_dir():
            for f in sorted(d.glob("*.toml")):
                found.setdefault(f.stem, f)
    return found


def load_profile(name_or_path: str) -> Profile:
    """Load a profile by name (``standard``) or by path to a TOML file."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or "/" in name_or_path:
        return load_profile_file(p)
    profiles = available_profiles()
    if name_or_path not in profiles:
        names = ", ".join(sorted(profiles)) or "none found"
        raise ProfileError(f"unknown profile {name_or_path!r}{did_you_mean(name_or_path, profiles)}; available: {names} "
                           "(or pass a path to a .toml file)")
    return load_profile_file(profiles[name_or_path])
