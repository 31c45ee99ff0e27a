"""The cgroup v2 guest's build script (tests/guest/cgroup2.py) keeps every runtime dependency
of harness in the guest's venv: CI once failed every guest `harness run` on `import numpy`
because the script left numpy out as a large, unneeded package."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "guest" / "cgroup2.py"


def _script():
    spec = importlib.util.spec_from_file_location("guest_cgroup2", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_guest_leaves_out_no_runtime_dependency():
    g = _script()
    deps = g.runtime_dependencies()
    assert {"numpy", "pydantic", "docker", "sqlalchemy"} <= deps
    assert not (g.NOT_IN_GUEST & deps)


def test_leaving_out_a_runtime_dependency_is_refused():
    g = _script()
    g.NOT_IN_GUEST = g.NOT_IN_GUEST | {"numpy"}
    try:
        g.requirements()
    except g.GuestError as e:
        assert "numpy" in str(e)
    else:
        raise AssertionError("requirements() accepted a guest without numpy")
