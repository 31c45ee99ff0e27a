"""The store on a real PostgreSQL server (Debian's postgresql, a private cluster started here).

A run of the probe suite is written to Postgres through `--db`, then read back by `report`,
`trials` and `gate`: the same code paths as SQLite, a different dialect.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import missing

pytestmark = pytest.mark.docker

PROBE = str(Path(__file__).parent / "suites" / "probe")


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


@pytest.fixture(scope="module")
def pg_url():
    """Start a throwaway cluster on a unix socket (no TCP port), owned by the postgres user."""
    bindir = _pg_bin()
    if bindir is None or shutil.which("runuser") is None:
        missing("PostgreSQL server binaries missing; `make test` installs Debian's postgresql")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        missing("psycopg missing: pip install -e '.[test]'")
    if os.geteuid() != 0:
        missing("starting a private cluster as the postgres user needs root (`make test` runs as root)")
    # pytest's own tmp dirs are private to root; the cluster lives in a dir postgres can reach
    root = Path(tempfile.mkdtemp(prefix="harness-pg-"))
    os.chmod(root, 0o755)
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    shutil.chown(root, "postgres", "postgres")
    shutil.chown(sock, "postgres", "postgres")

    def as_pg(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(["runuser", "-u", "postgres", "--", *cmd], capture_output=True, text=True, timeout=120)

    r = as_pg(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync")
    assert r.returncode == 0, r.stderr
    r = as_pg(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-w", "-o", f"-k {sock} -c listen_addresses=''", "start")
    assert r.returncode == 0, r.stderr + (root / "log").read_text()
    try:
        r = as_pg(str(bindir / "createdb"), "-h", str(sock), "harness")
        assert r.returncode == 0, r.stderr
        yield f"postgresql+psycopg://postgres@/harness?host={sock}"
    finally:
        as_pg(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


def harness(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HARNESS_HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def test_run_report_trials_gate_on_postgres(docker_client, pg_url, tmp_path):
    r = harness(tmp_path, "run", "--suite", PROBE, "--trials", "2", "--k", "1,2", "--db", pg_url, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    run_id = out["run_id"]
    assert [t["n"] for t in out["tasks"]] == [2, 2]

    from harness.store.store import Store

    store = Store.open(pg_url, mode="ro")
    assert store.engine.dialect.name == "postgresql"
    atts = store.attempts(run_id)
    assert len([a for a in atts if a.verdict == "clean"]) == 4
    assert all(store.samples(a.id) for a in atts)
    assert all(isinstance(a.rules, list) and a.envelope_applied["pids_max"] == 256 for a in atts)
    # the report index: json columns ride along as INCLUDE (PostgreSQL has no btree order for json)
    from sqlalchemy import text

    with store.engine.connect() as c:
        ix = dict(c.execute(text("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'attempts'")).all())
    assert "ix_attempts_report" not in ix and "INCLUDE" in ix["ix_attempts_report_pg"] and "node" in ix["ix_attempts_report_pg"], ix

    rep = harness(tmp_path, "report", run_id, "--format", "json", "--db", pg_url)
    assert rep.returncode == 0, rep.stderr
    assert json.loads(rep.stdout)["suite"]["pass@1"]["estimate"] == pytest.approx(out["metrics"]["pass@1"])
    tr = harness(tmp_path, "trials", run_id, "--json", "--db", pg_url)
    assert tr.returncode == 0 and len(json.loads(tr.stdout)) == len(atts)
    g = harness(tmp_path, "gate", run_id, "--require", "pass@1>=0.99", "--db", pg_url)
    assert g.returncode == 1, g.stdout + g.stderr  # extra-effect never passes: pass@1 = 0.5
    runs = harness(tmp_path, "runs", "--json", "--db", pg_url)
    assert runs.returncode == 0 and json.loads(runs.stdout)[0]["run_id"] == run_id
