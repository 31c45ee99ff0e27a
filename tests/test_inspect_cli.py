"""`harness trials`, `show`, `samples` and `gc`: pure helpers on plain data, then the
commands over real runs of the probe suite (one clean run and one beside a noisy
neighbor, made once for the module) read back against the stored rows."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.report.views import (
    SAMPLE_FIELDS,
    TRIAL_COLUMNS,
    TRIAL_FIELDS,
    Thresholds,
    csv_value,
    derive_series,
    headline,
    parse_age,
    sort_rows,
    sparkline,
    trial_row,
    trials_table,
)

PROBE = str(Path(__file__).parent / "suites" / "probe")
cli = CliRunner()


def invoke(*args: str):
    return cli.invoke(app, list(args))


# ----------------------------------------------------------------------------- pure helpers


def fake_attempt(**kw):
    """An AttemptRow-like object with every column trial_row reads."""
    base = dict(
        id=7, run_id="r1", task_id="t", slot=0, attempt_no=1, seed=0, verdict="clean", reasons=[], rules=[], outcome="pass",
        failure_kind=None, grade_reason=None, exit_code=0, timed_out=False, wall_s=2.0, agent_wall_s=1.0, grade_wall_s=0.1, cpuset="1",
        concurrent=1, envelope={"cpus": 0.5}, counters={"wall_s": 1.0}, cpu_usage_us=250_000, throttled_us=300_000,
        throttled_share=0.3, nr_throttled=4, nr_periods=10, memory_peak=950, memory_max=1000, memory_limit_hits=2,
        memory_high_events=None, oom_kills=1, pids_peak=64, pids_max=64, pids_limit_hits=3, psi_cpu_some_us=None,
        psi_memory_some_us=1_000_000, psi_io_some_us=0, foreign_cpu_share=0.2, steal_share=0.0, host_psi_cpu=0.1,
        host_psi_memory=0.0, host_psi_io=0.0, mem_available_min=10, started_at=dt.datetime(2025, 1, 2, 3, 4, 5),
    )
    base.update(kw)
    return SimpleNamespace(**base)


def test_every_field_is_documented_and_in_order():
    row = trial_row(fake_attempt(), Thresholds())
    assert list(row) == list(TRIAL_FIELDS)
    for name, (unit, meaning) in {**TRIAL_FIELDS, **SAMPLE_FIELDS}.items():
        assert unit and meaning.strip(), name
    assert set(TRIAL_COLUMNS) <= set(TRIAL_FIELDS)
    out = invoke("trials", "--fields")
    assert out.exit_code == 0
    lines = out.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == list(TRIAL_FIELDS)
    helptext = invoke("trials", "--help").stdout
    for name in TRIAL_FIELDS:
        assert name in helptext, name
    helptext = invoke("samples", "--help").stdout
    for name in SAMPLE_FIELDS:
        assert name in helptext, name


def test_trial_row_derived_values_and_saturation():
    row = trial_row(fake_attempt(), Thresholds.from_profile({"sla": {"foreign_cpu_share": 0.1, "throttled_share": None}}))
    assert row["cpu_s"] == 0.25 and row["throttled_s"] == 0.3
    assert row["cpu_quota_share"] == pytest.approx(0.5)  # 0.25 s over 1 s at a half-core quota
    assert row["memory_peak_share"] == 0.95
    assert row["psi_cpu_some_s"] is None and row["psi_memory_some_s"] == 1.0
    assert row["started_at"] == "2025-01-02T03:04:05"
    assert row["saturated"] == ["throttled", "memory", "memory_limit", "oom", "pids", "foreign_cpu"]
    # the profile's threshold wins over the 10% default
    assert "foreign_cpu" not in trial_row(fake_attempt(), Thresholds.from_profile({"sla": {"foreign_cpu_share": 0.5}}))["saturated"]
    quiet = trial_row(
        fake_attempt(throttled_share=0.01, memory_peak=10, memory_limit_hits=0, oom_kills=0, pids_limit_hits=0, foreign_cpu_share=0.0),
        Thresholds(),
    )
    assert quiet["saturated"] == []
    # under host_cpu_contention's measurement floor (50 ms) a foreign share is rounding, as the rule judges it
    floor = trial_row(fake_attempt(host_counters={"foreign_cpu_us": 13_000}), Thresholds())
    assert "foreign_cpu" not in floor["saturated"]
    assert "foreign_cpu" in trial_row(fake_attempt(host_counters={"foreign_cpu_us": 80_000}), Thresholds())["saturated"]
    assert "foreign_cpu" in trial_row(fake_attempt(host_counters={"foreign_cpu_us": 13_000}),
                                      Thresholds.from_profile({"sla": {"foreign_cpu_min_ms": 5}}))["saturated"]
    assert csv_value(["a", "b"]) == "a;b" and csv_value(None) == "" and csv_value(False) == "false"


def test_table_colors_saturated_cells_and_drops_columns_when_narrow():
    th = Thresholds()
    hot = trial_row(fake_attempt(), th)
    calm = trial_row(fake_attempt(id=8, throttled_share=0.0, oom_kills=0, memory_peak=1, foreign_cpu_share=0.0), th)
    table, hidden = trials_table([hot, calm], th, "t", width=None)
    assert hidden == []
    cols = {c.header: c for c in table.columns}
    cells = {name: list(c._cells) for name, c in cols.items()}
    assert "red" in str(cells["oom"][0].style) and "red" not in str(cells["oom"][1].style)
    assert "red" in str(cells["throttled (n)"][0].style) and "red" not in str(cells["throttled (n)"][1].style)
    assert "red" in str(cells["mem peak (ceil)"][0].style)
    assert "red" in str(cells["foreign cpu"][0].style)
    narrow, hidden = trials_table([hot, calm], th, "t", width=60)
    assert hidden and [c.header for c in narrow.columns][:2] == ["id", "task"]


def test_sort_rows_empty_last_and_unknown_field():
    rows = [{"a": 2}, {"a": None}, {"a": 1}, {"a": 3}]
    assert [r["a"] for r in sort_rows(rows, "a", ["a"])] == [1, 2, 3, None]
    assert [r["a"] for r in sort_rows(rows, "-a", ["a"])] == [3, 2, 1, None]
    with pytest.raises(ValueError, match="no such field; the fields: `harness trials --fields`"):
        sort_rows(rows, "zz", ["a", "b"])
    with pytest.raises(ValueError, match=r"no such field \(did you mean 'wall_s'\?\)"):
        sort_rows(rows, "-wal_s", ["a", "wall_s"])


def test_series_and_sparkline():
    S = lambda t, cpu, thr, mem, f: SimpleNamespace(t=t, cpu_usage_us=cpu, throttled_us=thr, memory_current=mem, pids_current=4, foreign_cpu_us=f)  # noqa: E731
    ss = [S(0.2, 100_000, 0, 100, 20_000), S(0.4, 150_000, 100_000, 500, 20_000), S(0.6, 150_000, 100_000, 1000, 120_000)]
    s = derive_series(ss, cpus=0.5, cores=1, memory_max=1000, pids_max=8)
    assert s["t"] == [0.2, 0.4, 0.6]
    assert s["cpu"][0] is None and s["cpu"][1:] == pytest.approx([0.5, 0.0])  # 50 ms of 0.2 s at half a core
    assert s["throttled"][1:] == pytest.approx([0.5, 0.0])
    assert s["foreign"] == pytest.approx([0.1, 0.0, 0.5])
    assert s["memory"] == [0.1, 0.5, 1.0] and s["pids"] == [0.5, 0.5, 0.5]
    assert sparkline([0, 0.5, 1, None, 2]) == "▁▅█ █"
    assert sparkline([0.0] * 50 + [1.0] + [0.0] * 49, width=10) == "▁▁▁▁▁█▁▁▁▁"  # a spike survives bucketing


def test_headline_names_breached_rule_with_value_and_threshold():
    rules = [
        {"rule": "envelope_not_applied", "scope": "host", "value": 0, "threshold": 0, "breached": False, "detail": ""},
        {"rule": "host_cpu_contention", "scope": "host", "value": 0.482, "threshold": 0.1, "breached": True,
         "detail": "foreign CPU on pinned cores 48.2% > 10.0% (230 ms)"},
        {"rule": "cpu_throttled", "scope": "envelope", "value": 0.7, "threshold": 0.5, "breached": True, "detail": ""},
    ]
    a = fake_attempt(verdict="discarded", reasons=["host_cpu_contention", "cpu_throttled"], rules=rules, outcome=None)
    assert headline(a) == (
        "discarded: host_cpu_contention — foreign CPU on pinned cores 48.2% > 10.0% (230 ms); cpu_throttled — 70.0% > 50.0%"
    )
    assert headline(fake_attempt(outcome="fail", failure_kind="wrong_state", grade_reason="x")) == "clean: fail (wrong_state) — x"


def test_parse_age():
    assert parse_age("30d") == dt.timedelta(days=30)
    assert parse_age("12h") == dt.timedelta(hours=12)
    assert parse_age("90min") == dt.timedelta(minutes=90) and parse_age("2w") == dt.timedelta(weeks=2)
    with pytest.raises(ValueError, match="'m' could be minutes or months; write 1min for minutes"):
        parse_age("1m")  # read as a month by many; what gc collects is deleted
    for bad in ("30", "d", "30s", "-1d", ""):
        with pytest.raises(ValueError, match="30d, 12h, 90min"):
            parse_age(bad)


def test_errors_are_one_line_with_the_next_step(tmp_path):
    db = f"sqlite:///{tmp_path}/none.db"
    r = invoke("trials", "last", "--db", db)
    assert r.exit_code == 2 and "no harness database" in r.stderr
    r = invoke("show", "abc", "--db", db)
    assert r.exit_code == 2 and "attempt 'abc': expected a numeric attempt id" in r.stderr
    r = invoke("gc", "--older-than", "soon", "--db", db)
    assert r.exit_code == 2 and "--older-than 'soon'" in r.stderr
    for res in (invoke("trials", "last", "--verdict", "dirty", "--db", db), invoke("trials", "last", "--json", "--csv", "--db", db)):
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1


def test_attempt_that_never_started_still_shows(tmp_path):
    """An engine error before the container ran: no counters, no samples, no artifacts."""
    from harness.model.attempt import AttemptRecord
    from harness.model.run import RunRecord
    from harness.store.store import Store

    db = f"sqlite:///{tmp_path}/h.db"
    store = Store.open(db)
    store.add_run(RunRecord(id="r-infra", suite="probe", suite_hash="h", image="img", profile="standard",
                         profile_json={"sla": {"foreign_cpu_share": 0.1}}, harness_version="0", trials=1, max_reruns=0,
                         task_ids=["append"], status="complete"))
    rule = {"rule": "infra_error", "scope": "host", "value": 1, "threshold": 0, "breached": True,
            "detail": "cannot start container: engine went away"}
    aid = store.add_attempt(AttemptRecord(run_id="r-infra", task_id="append", slot=0, attempt_no=1, seed=1, verdict="discarded",
                                       reasons=["infra_error"], rules=[rule], error="cannot start container: engine went away",
                                       artifacts=str(tmp_path / "missing")))
    r = invoke("show", str(aid), "--db", db)
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "discarded: infra_error — cannot start container: engine went away" in text
    assert "never started" in text and "no samples" in text and "not graded" in text
    assert json.loads(invoke("show", str(aid), "--json", "--db", db).stdout)["samples_count"] == 0
    # `last`: the newest attempt of the newest run
    later = store.add_attempt(AttemptRecord(run_id="r-infra", task_id="append", slot=0, attempt_no=2, seed=1, verdict="clean",
                                            outcome="pass"))
    assert json.loads(invoke("show", "last", "--json", "--db", db).stdout)["attempt"]["id"] == later
    store.add_run(RunRecord(id="r-empty", suite="probe", suite_hash="h", image="img", profile="standard", harness_version="0",
                            trials=1, max_reruns=0, task_ids=["append"], created_at=dt.datetime(2099, 1, 1)))
    r = invoke("show", "last", "--db", db)
    assert r.exit_code == 2 and "run r-empty has no attempt stored yet" in r.stderr, r.output
    r = invoke("trials", "r-infra", "--db", db)
    assert r.exit_code == 0 and "infra_error" in r.stdout
    rows = json.loads(invoke("trials", "r-infra", "--json", "--db", db).stdout)
    assert rows[0]["cpu_s"] is None and rows[0]["saturated"] == []
    r = invoke("samples", str(aid), "--db", db)
    assert r.exit_code == 0 and r.stdout.splitlines() == [",".join(SAMPLE_FIELDS)] and "no samples" in r.stderr


def _many_attempts(tmp_path: Path, n: int) -> str:
    from harness.model.attempt import AttemptRecord
    from harness.model.run import RunRecord
    from harness.store.store import Store

    db = f"sqlite:///{tmp_path}/many.db"
    store = Store.open(db)
    store.add_run(RunRecord(id="r-many", suite="probe", suite_hash="h", image="img", profile="standard", harness_version="0",
                            trials=n, ks=[1], max_reruns=0, task_ids=["append"], status="complete"))
    for i in range(n):
        store.add_attempt(AttemptRecord(run_id="r-many", task_id="append", slot=i, attempt_no=1, seed=i, verdict="clean",
                                        outcome="pass" if i % 3 else "fail", failure_kind=None if i % 3 else "wrong_state",
                                        grade_reason=None if i % 3 else "log: expected [[1]], got [[0]] " + "x" * 200))
    store.engine.dispose()
    return db


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly_never_as_a_failed_check(tmp_path):
    # `harness trials RUN --json | head`: it exited 1 (a failed check, for CI) with nothing said
    db = _many_attempts(tmp_path, 400)
    env = {**os.environ, "HARNESS_HOME": str(tmp_path / "home")}
    for args in (["trials", "r-many", "--json"], ["trials", "r-many", "--csv"]):
        p = subprocess.Popen([sys.executable, "-m", "harness", *args, "--db", db], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert p.stdout is not None and p.stderr is not None
        head = p.stdout.read(10)
        p.stdout.close()  # the reader is gone before the command has written it all
        err = p.stderr.read()
        assert p.wait(timeout=60) == 141 and head and err == b"", (args, p.returncode, err)


def test_a_report_to_a_pipe_is_as_wide_as_columns_says(tmp_path):
    db = _many_attempts(tmp_path, 30)
    env = {**os.environ, "HARNESS_HOME": str(tmp_path / "home")}
    for cols, widest in (("80", 80), (None, 160)):
        e = {**env, "COLUMNS": cols} if cols else {k: v for k, v in env.items() if k != "COLUMNS"}
        r = subprocess.run([sys.executable, "-m", "harness", "report", "r-many", "--db", db], capture_output=True, text=True, env=e)
        assert r.returncode == 0, r.stderr
        assert max(map(len, r.stdout.splitlines())) <= widest and max(map(len, r.stdout.splitlines())) > 60, cols


def test_runs_at_80_columns_shows_whole_cells_and_says_what_it_left_out(tmp_path):
    # every column after run and created used to be squeezed to one letter and an ellipsis
    db = _many_attempts(tmp_path, 3)
    env = {**os.environ, "HARNESS_HOME": str(tmp_path / "home"), "COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-m", "harness", "runs", "--db", db], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout and "r-many" in r.stdout and "left out for width:" in r.stdout, r.stdout
    assert max(map(len, r.stdout.splitlines())) <= 80
    wide = subprocess.run([sys.executable, "-m", "harness", "runs", "--db", db], capture_output=True, text=True, env={**env, "COLUMNS": "200"})
    assert "identity" in wide.stdout and "left out" not in wide.stdout, wide.stdout


def test_the_end_of_run_table_at_80_columns_keeps_whole_cells(tmp_path):
    # k = 1,2,4,8 made eleven columns squeezed into 80: task ids and failure kinds were cut
    # ("pay-ca…", "crash…"); what does not fit is left out, and said
    code = ("import sys\nfrom harness.store.store import Store\nfrom harness.core.aggregate import summarize\n"
            "from harness.cli.run import print_summary\nst = Store.open(sys.argv[1], mode='ro')\nr = st.get_run('r-many')\n"
            "r = r.model_copy(update={'ks': [1, 2, 4, 8], 'task_ids': ['append']})\nprint_summary(summarize(r, st.attempts(r.id)))")
    db = _many_attempts(tmp_path, 8)
    env = {**os.environ, "COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-c", code, db], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout and "wrong_state 3" in r.stdout and "pass^8" in r.stdout and "run r-many" in r.stdout, r.stdout
    assert "left out for width: " in r.stdout and max(map(len, r.stdout.splitlines())) <= 80, r.stdout


# ----------------------------------------------------------------------------- real runs


def _harness(home: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, "HARNESS_HOME": str(home), **(env or {})}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=300, env=e, cwd=home)


@pytest.fixture(scope="module")
def runs(docker_client, tmp_path_factory):
    """A clean probe run (2 tasks x 2 trials) and a run of one slot beside a noisy neighbor
    spinning on the only trial core (rerun budget 0: its attempt stays discarded)."""
    from harness.sandbox.images import SANDBOX_IMAGE
    from harness.store.store import Store

    home = tmp_path_factory.mktemp("inspect")
    db = f"sqlite:///{home}/h.db"
    # other work on this host can spoil attempts too: the tests below compare with whatever
    # was stored (discarded reruns included), never with fixed counts
    r = _harness(home, "run", "--suite", PROBE, "--trials", "2", "--k", "1,2", "--max-reruns", "4", "--db", db, "--json")
    assert r.returncode == 0, r.stderr
    clean_run = json.loads(r.stdout)["run_id"]

    cpus = sorted(os.sched_getaffinity(0))
    reserve = len(cpus) - 1  # leaves exactly one trial core: the last one
    nb = docker_client.containers.run(
        SANDBOX_IMAGE,
        ["python3", "-c", "import time\nt=time.time()\nwhile time.time()-t<60: pass"],
        detach=True,
        cpuset_cpus=str(cpus[-1]),
        network_mode="none",
        labels={"dev.harness.test": "noisy-neighbor"},  # not dev.harness=1: the run's sweep would remove it
    )
    try:
        time.sleep(0.3)
        r = _harness(
            home, "run", "--suite", PROBE, "--tasks", "append", "--trials", "1", "--k", "1", "--max-reruns", "0",
            "--reserve-cores", str(reserve), "--db", db, "--json", env={"PROBE_BURN": "0.8"},
        )
    finally:
        nb.remove(force=True)
    assert r.returncode == 0, r.stderr
    noisy_run = json.loads(r.stdout)["run_id"]
    store = Store.open(db, mode="ro")
    return SimpleNamespace(home=home, db=db, store=store, clean=clean_run, noisy=noisy_run)


def _expected(a, field):
    if field in TRIAL_COLUMNS:
        return getattr(a, TRIAL_COLUMNS[field])
    return {
        "reasons": list(a.reasons),
        "cpu_s": None if a.cpu_usage_us is None else a.cpu_usage_us / 1e6,
        "throttled_s": None if a.throttled_us is None else a.throttled_us / 1e6,
        "memory_peak_share": None if not a.memory_max or a.memory_peak is None else a.memory_peak / a.memory_max,
        "started_at": a.started_at.isoformat(),
    }.get(field, ...)


@pytest.mark.docker
def test_trials_json_and_csv_equal_the_stored_attempts(runs):
    attempts = {a.id: a for a in runs.store.attempts(runs.clean)}
    assert len(attempts) >= 4
    r = invoke("trials", runs.clean, "--json", "--db", runs.db)
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [x["id"] for x in rows] == sorted(attempts)
    for x in rows:
        assert list(x) == list(TRIAL_FIELDS)
        a = attempts[x["id"]]
        for f in TRIAL_FIELDS:
            want = _expected(a, f)
            if want is not ...:
                assert x[f] == want, (f, x[f], want)
        assert x["cpu_s"] > 0 and x["memory_peak"] > 0 and x["foreign_cpu_share"] is not None

    r = invoke("trials", runs.clean, "--csv", "--db", runs.db)
    assert r.exit_code == 0
    reader = csv.DictReader(io.StringIO(r.stdout))
    assert reader.fieldnames == list(TRIAL_FIELDS)
    crow = list(reader)
    assert len(crow) == len(attempts)
    for x in crow:
        a = attempts[int(x["id"])]
        for f in TRIAL_FIELDS:
            want = _expected(a, f)
            if want is not ...:
                assert x[f] == str(csv_value(want)), (f, x[f], want)

    r = invoke("trials", runs.clean, "--db", runs.db)
    assert r.exit_code == 0
    for a in attempts.values():
        assert f"│ {a.id:>2} │ {a.task_id}" in r.stdout


@pytest.mark.docker
def test_trials_filters_and_sort(runs):
    def ids(*args):
        r = invoke("trials", *args, "--json", "--db", runs.db)
        assert r.exit_code == 0, r.output
        return [(x["id"], x["task"], x["verdict"], x["outcome"], x["wall_s"]) for x in json.loads(r.stdout)]

    stored = runs.store.attempts(runs.clean)

    def want(pred):
        return [a.id for a in stored if pred(a)]

    assert [i for i, *_ in ids(runs.clean, "--task", "append")] == want(lambda a: a.task_id == "append") != []
    assert [i for i, *_ in ids(runs.clean, "--outcome", "fail")] == want(lambda a: a.verdict == "clean" and a.outcome == "fail")
    assert [i for i, *_ in ids(runs.clean, "--verdict", "clean")] == want(lambda a: a.verdict == "clean")
    assert [i for i, *_ in ids(runs.clean, "--verdict", "discarded", "--task", "extra-effect")] == want(
        lambda a: a.verdict == "discarded" and a.task_id == "extra-effect")
    assert all(t == "extra-effect" for _, t, v, *_ in ids(runs.clean, "--outcome", "fail") if v == "clean")
    assert [v for _, _, v, *_ in ids(runs.noisy, "--verdict", "discarded")] == ["discarded"]
    rows = ids(runs.clean, "--sort=-wall_s")
    assert [w for *_, w in rows] == sorted((w for *_, w in rows), reverse=True)
    rows = ids("last", "--sort", "task")  # `last` is the noisy run
    assert {i for i, *_ in rows} == {a.id for a in runs.store.attempts(runs.noisy)}
    r = invoke("trials", runs.clean, "--sort", "bogus", "--db", runs.db)
    assert r.exit_code == 2 and "no such field; the fields: `harness trials --fields`" in r.stderr, r.stderr
    r = invoke("trials", runs.clean, "--sort=-wall", "--db", runs.db)  # a close name: that one, not all sixty
    assert r.exit_code == 2 and "(did you mean 'wall_s'?)" in r.stderr and "run_id" not in r.stderr, r.stderr
    r = invoke("trials", runs.clean, "--task", "nope", "--db", runs.db)
    assert r.exit_code == 2 and "has no task nope" in r.stderr


@pytest.mark.docker
def test_show_discarded_attempt_names_the_breached_rule(runs):
    (a,) = runs.store.attempts(runs.noisy)
    assert a.verdict == "discarded" and "host_cpu_contention" in a.reasons, a.reasons
    rule = next(x for x in a.rules if x["rule"] == "host_cpu_contention")
    value, threshold = f"{100 * rule['value']:.1f}%", f"{100 * rule['threshold']:.1f}%"
    r = invoke("show", str(a.id), "--db", runs.db)
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert f"discarded: host_cpu_contention — foreign CPU on pinned cores {value} > {threshold}" in text
    assert "BREACHED" in text and "not counted: the attempt was discarded" in text
    doc = json.loads(invoke("show", str(a.id), "--json", "--db", runs.db).stdout)
    assert doc["headline"].startswith(f"discarded: host_cpu_contention — foreign CPU on pinned cores {value} > {threshold}")
    assert doc["attempt"]["id"] == a.id and doc["samples_count"] == len(runs.store.samples(a.id))


@pytest.mark.docker
def test_show_clean_attempt_has_every_section(runs):
    # the extra effect fails as wrong_state (graded even when the attempt was discarded)
    a = next(x for x in runs.store.attempts(runs.clean) if x.task_id == "extra-effect")
    r = invoke("show", str(a.id), "--db", runs.db)
    assert r.exit_code == 0, r.output
    out = r.stdout
    for section in ("identity", "envelope: profile vs read back", "counters", "SLA rules", "grade",
                    "state diff vs fixture", "stdout.txt (tail)", "transcript.jsonl (tail)", "saturation over time"):
        assert section in out, section
    assert a.grade_reason and "audit" in a.grade_reason
    if a.verdict == "clean":
        assert f"clean: fail (wrong_state) — {a.grade_reason}" in " ".join(out.split())
    assert f"reason: {a.grade_reason}" in " ".join(out.split())
    assert "appended; saw 0 rows" in out  # stdout tail from the artifact file
    assert "audit +1 row" in out and "log +1 row" in out  # what the agent changed
    assert "DIFFERS" not in out  # the envelope read back equals the profile
    assert "cpu (of quota)" in out and "memory (of ceiling)" in out
    doc = json.loads(invoke("show", str(a.id), "--json", "--db", runs.db).stdout)
    assert {d["table"]: (d["added"], d["removed"], d["changed"]) for d in doc["state_diff_summary"]} == {
        "audit": (1, 0, 0), "log": (1, 0, 0)}
    assert all(e["match"] in (True, None) for e in doc["envelope"])
    assert doc["trial_row"]["memory_peak"] == a.memory_peak
    r = invoke("show", "999999", "--db", runs.db)
    assert r.exit_code == 2
    assert r.stderr.strip() == "error: attempt 999999: no such attempt; list them with `harness trials RUN`"


@pytest.mark.docker
def test_samples_export_counts_equal_stored_rows(runs, tmp_path):
    attempts = runs.store.attempts(runs.clean)
    stored = {a.id: len(runs.store.samples(a.id)) for a in attempts}
    assert sum(stored.values()) > 0
    r = invoke("samples", runs.clean, "--csv", "--db", runs.db)
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(rows) == sum(stored.values())
    assert list(rows[0]) == list(SAMPLE_FIELDS)
    by_id = {a.id: a for a in attempts}
    for x in rows:
        a = by_id[int(x["attempt_id"])]
        assert (x["task"], int(x["slot"]), x["run_id"]) == (a.task_id, a.slot, runs.clean)
    first = attempts[0]
    out = tmp_path / "one.jsonl"
    r = invoke("samples", str(first.id), "--jsonl", "--out", str(out), "--db", runs.db)
    n = stored[first.id]
    assert r.exit_code == 0 and f"wrote {n} sample{'' if n == 1 else 's'} from 1 attempt of attempt {first.id}" in r.stderr, r.stderr
    lines = [json.loads(ln) for ln in out.read_text().splitlines()]
    want = runs.store.samples(first.id)
    assert [(x["t"], x["cpu_usage_us"], x["memory_current"]) for x in lines] == [(s.t, s.cpu_usage_us, s.memory_current) for s in want]
    r = invoke("samples", "r-nope", "--db", runs.db)
    assert r.exit_code == 2 and "no such run" in r.stderr


@pytest.mark.docker
def test_gc_removes_old_folders_keeps_rows_unless_purge(runs, tmp_path):
    # a copy of the module's store and artifacts, so the other tests keep theirs
    db_file = tmp_path / "gc.db"
    src = sqlite3.connect(f"{runs.home}/h.db")
    dst = sqlite3.connect(db_file)
    src.backup(dst)
    src.close()
    shutil.copytree(runs.home / "runs", tmp_path / "runs")
    old = (dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(days=40)).isoformat(sep=" ")
    dst.execute("update runs set artifacts_dir = replace(artifacts_dir, ?, ?)", (str(runs.home / "runs"), str(tmp_path / "runs")))
    dst.execute("update attempts set artifacts = replace(artifacts, ?, ?)", (str(runs.home / "runs"), str(tmp_path / "runs")))
    dst.execute("update runs set created_at = ?", (old,))
    from harness.sandbox.owners import controller_id

    # old but still being run (by this live process): untouchable
    dst.execute("update runs set status = 'running', controller = ? where id = ?", (controller_id(), runs.noisy))
    dst.commit()
    db = f"sqlite:///{db_file}"
    clean_dir, noisy_dir = tmp_path / "runs" / runs.clean, tmp_path / "runs" / runs.noisy
    size = sum(p.stat().st_size for p in clean_dir.rglob("*") if p.is_file() and not p.is_symlink())

    def rows(run_id):
        return [dst.execute(f"select count(*) from {q}", (run_id,)).fetchone()[0] for q in (
            "runs where id = ?", "attempts where run_id = ?",
            "samples where attempt_id in (select id from attempts where run_id = ?)")]

    before = rows(runs.clean)
    assert before[0] == 1 and before[1] >= 4 and before[2] > 0

    r = invoke("gc", "--older-than", "50d", "--json", "--db", db)
    assert r.exit_code == 0 and json.loads(r.stdout)["runs"] == []  # 40 days is not older than 50
    n_att = before[1]

    r = invoke("gc", "--older-than", "30d", "--dry-run", "--json", "--db", db)
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["freed_bytes"] == size and res["folders"] == 1 and res["skipped_running"] == [runs.noisy]
    assert clean_dir.is_dir() and rows(runs.clean) == before

    r = invoke("gc", "--older-than", "30d", "--db", db)
    assert r.exit_code == 0, r.output
    assert "freed" in r.stdout and "every row kept" in " ".join(r.stdout.split())
    assert not clean_dir.exists() and noisy_dir.is_dir()
    assert rows(runs.clean) == before  # evidence stays
    r = invoke("show", str(runs.store.attempts(runs.clean)[0].id), "--db", db)
    assert r.exit_code == 0 and "artifacts folder gone" in " ".join(r.stdout.split())

    r = invoke("gc", "--older-than", "30d", "--purge", "--dry-run", "--json", "--db", db)
    res = json.loads(r.stdout)
    assert res["rows_deleted"] == {"runs": 1, "attempts": n_att, "samples": before[2]} and rows(runs.clean) == before

    r = invoke("gc", "--older-than", "720h", "--purge", "--json", "--db", db)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["rows_deleted"] == {"runs": 1, "attempts": n_att, "samples": before[2]}
    assert rows(runs.clean) == [0, 0, 0]
    assert rows(runs.noisy)[:2] == [1, 1] and noisy_dir.is_dir()  # the running run is untouched
    dst.close()


def test_runs_on_a_fresh_machine_is_an_answer_not_an_error(tmp_path):
    from conftest import run_cli

    res = run_cli(tmp_path, "runs")
    assert res.returncode == 0 and "no runs yet" in res.stdout, res.stderr
    res = run_cli(tmp_path, "runs", "--json")
    assert res.returncode == 0 and res.stdout.strip() == "[]"


def test_gc_dry_run_neither_creates_nor_writes_the_database(tmp_path):
    from conftest import run_cli

    from harness.model.run import RunRecord
    from harness.store.store import Store

    # no database yet: the default store is not created (nothing to collect, exit 0, as
    # `harness runs` lists nothing); a named one that does not exist is refused (exit 2)
    for args in (("--dry-run",), ("--dry-run", "--json"), ()):
        res = run_cli(tmp_path, "gc", "--older-than", "30d", *args)
        assert res.returncode == 0, res.stderr
        assert not (tmp_path / "home").exists()
    assert "no database at" in run_cli(tmp_path, "gc", "--older-than", "30d", "--dry-run").stdout
    for args in (("--dry-run",), ()):
        res = run_cli(tmp_path, "gc", "--older-than", "30d", *args, "--db", f"sqlite:///{tmp_path}/typo.db")
        assert res.returncode == 2 and "no harness database at" in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert not (tmp_path / "typo.db").exists()

    # a database with an old run to collect and a run marked running whose controller is gone
    db_file = tmp_path / "h.db"
    store = Store.open(f"sqlite:///{db_file}")
    old = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(days=40)
    folder = tmp_path / "runs" / "r-old"
    folder.mkdir(parents=True)
    (folder / "stdout.txt").write_text("x" * 1000)
    for rid, status in (("r-old", "complete"), ("r-dead", "running")):
        store.add_run(RunRecord(id=rid, suite="probe", suite_hash="h", image="img", profile="standard", harness_version="0",
                                trials=1, max_reruns=0, task_ids=["t"], status=status, created_at=old,
                                artifacts_dir=str(folder) if rid == "r-old" else ""))
    store.engine.dispose()

    def stat():
        st = db_file.stat()
        return st.st_size, st.st_mtime_ns

    before = stat()
    time.sleep(0.05)  # a write now would change an mtime
    res = run_cli(tmp_path, "gc", "--older-than", "30d", "--dry-run", "--purge", "--json", "--db", f"sqlite:///{db_file}")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["freed_bytes"] == 1000 and out["recovered"] == ["r-dead"] and out["kept_interrupted"] == ["r-dead"]
    assert out["rows_deleted"]["runs"] == 1
    assert stat() == before and folder.is_dir()
    # reading a WAL database may leave its -wal and -shm files (as every read command does); nothing is written to them
    assert not (tmp_path / "h.db-wal").exists() or (tmp_path / "h.db-wal").stat().st_size == 0
    assert Store.open(f"sqlite:///{db_file}", mode="ro").get_run("r-dead").status == "running"


def test_an_outcome_filter_lists_clean_attempts_only(tmp_path):
    """A discarded attempt may have been graded before it was thrown away; `--outcome` is
    about what is scored, so it never lists one."""
    from harness.store.store import Store
    from tests.test_report import add_attempt, add_run

    url = f"sqlite:///{tmp_path}/h.db"
    store = Store.open(url)
    add_run(store, "r-oc", {"a": "✓✗", "b": "✗✓"}, ks=(1,))
    graded = [add_attempt(store, "r-oc", "a", 0, 9 + i, verdict="discarded", reasons=["host_cpu_contention"], outcome=o,
                          failure_kind=None if o == "pass" else "wrong_state") for i, o in enumerate(("pass", "fail"))]
    for oc in ("pass", "fail"):
        r = invoke("trials", "r-oc", "--outcome", oc, "--json", "--db", url)
        assert r.exit_code == 0, r.output
        rows = json.loads(r.stdout)
        assert len(rows) == 2 and all(x["verdict"] == "clean" and x["outcome"] == oc for x in rows), rows
        assert not {x["id"] for x in rows} & set(graded)
    r = invoke("trials", "r-oc", "--verdict", "discarded", "--json", "--db", url)
    assert sorted(x["id"] for x in json.loads(r.stdout)) == sorted(graded)  # still listed as evidence


def test_a_value_with_newlines_cannot_forge_a_line_of_show(tmp_path):
    """The grade reason, checks and state diff quote the agent's state; a newline in a value
    is shown as \\n, so no line of `show` starts with what the agent wrote."""
    from harness.model.attempt import AttemptRecord
    from harness.model.run import RunRecord
    from harness.store.store import Store

    db = f"sqlite:///{tmp_path}/h.db"
    store = Store.open(db)
    store.add_run(RunRecord(id="r-nl", suite="probe", suite_hash="h", image="img", profile="standard", harness_version="0",
                            trials=1, max_reruns=0, task_ids=["t"], status="complete"))
    forged = "done')\n\nclean: pass — FORGED all checks passed\n ✓ FORGED [expect]"
    table = "t\nclean: pass FORGED\n"
    aid = store.add_attempt(AttemptRecord(
        run_id="r-nl", task_id="t", slot=0, attempt_no=1, seed=0, verdict="clean", outcome="fail", failure_kind="wrong_state",
        grade_status="graded", grade_reason=f"job: expected 'x', found ('{forged}')",
        grade_checks=[{"name": f"job {forged}", "kind": "expect", "passed": False, "detail": forged}],
        state_diff={"tables": [{"table": table, "status": "added", "added": 1, "removed": 0, "changed": 0, "lines": [f"new table {table}"]}]}))
    r = invoke("show", str(aid), "--db", db)
    assert r.exit_code == 0, r.output
    assert "FORGED" in r.stdout and "\\n" in r.stdout
    for line in r.stdout.splitlines():
        assert "FORGED" not in line.split("│")[0].lstrip()[:12], line  # never at the start of a line or a cell
        assert not line.lstrip(" │").startswith(("clean: pass", "✓ FORGED")), line


def test_a_tail_read_from_the_end_of_a_long_file_says_what_lies_before_it():
    from harness.report.views import tail_text

    text = "".join(f"line {i}\n" for i in range(100))
    assert tail_text(text, max_lines=3).startswith("… (97 earlier lines)\nline 97")
    # only the last bytes were read: their lines are not all the file's, and it says so
    assert tail_text(text, max_lines=3, before=2 * 1024 * 1024).startswith("… (97 earlier lines and 2 MiB before them)\n")
