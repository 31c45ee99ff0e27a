"""The report's SQLite read without SQLAlchemy (harness.store.fastread) answers what the store
answers, or leaves the answer to the store.

Against a real SQLite store written by harness: the same run record and the same columns as
``Store.attempts(run, REPORT_FIELDS)`` on seeded random runs of every slot shape; run ids,
prefixes and ``last`` resolved as ``Store.get_run`` does; an older schema, another database, a
damaged row or an unknown run left to the store (None), whose one-line error the command then
prints; and ``harness report --format json`` that never imports SQLAlchemy.
"""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.model.errors import StoreError
from harness.store import fastread
from harness.store.fastread import report_read
from harness.store.orm import AttemptRow, RunRow
from harness.store.store import REPORT_FIELDS, Store, _kinds, _nullable
from test_report_columns import random_run

runner = CliRunner()


def test_its_column_types_are_the_tables_as_orm_declares_them():
    assert fastread.RUN_KINDS == _kinds(RunRow)
    assert fastread.RUN_NOT_NULL == {c.name for c in RunRow.__table__.columns if not _nullable(RunRow, c.name)}
    orm = _kinds(AttemptRow)
    assert fastread.ATTEMPT_KINDS == {n: orm[n] for n in fastread.ATTEMPT_KINDS}
    assert set(fastread.ATTEMPT_KINDS) >= {"id", "run_id", *REPORT_FIELDS}
    assert fastread.ATTEMPT_NOT_NULL == {n for n in fastread.ATTEMPT_KINDS if not _nullable(AttemptRow, n)}


def _stored(tmp_path, run, atts, name: str | None = None) -> tuple[Store, str]:
    url = f"sqlite:///{tmp_path / ((name or run.id) + '.db')}"
    store = Store.open(url)
    store.add_run(run)
    for a in atts:
        store.add_attempt(a.model_copy(update={"id": None}))
    return store, url


def test_it_reads_what_the_stores_lean_read_reads(tmp_path):
    rng = random.Random(7)
    for i in range(40):
        run, atts = random_run(rng, i)
        store, url = _stored(tmp_path, run, atts)
        if i % 5 == 0 and atts:  # records that arrived after their attempt was recorded lost
            store.add_late(atts[0])
        got = report_read(url, run.id)
        if i % 5 == 0 and atts:  # rare, and the store's to read
            assert got is None, i
            continue
        assert got is not None, i
        fast_run, fast, late = got
        assert fast_run == store.get_run(run.id), i
        lean = store.attempts(run.id, REPORT_FIELDS)
        assert len(fast) == len(lean) == len(atts)
        for name in ("id", *REPORT_FIELDS):
            assert fast.col(name) == lean.col(name), (i, name)
        assert [tuple(r) for r in fast.rows(range(len(fast)))] == [tuple(r) for r in lean.rows(range(len(lean)))], i
        assert late == len(store.late_attempts(run.id)), i
        store.engine.dispose()


def test_a_run_is_named_as_the_store_names_it(tmp_path):
    rng = random.Random(3)
    runs = []
    for i, rid in enumerate(["r20261207-1419-aaaa", "r20261207-1419-aaab", "r20261207-1500-cccc"]):
        run, atts = random_run(rng, i)
        run = run.model_copy(update={"id": rid, "created_at": run.created_at.replace(hour=i)})
        runs.append((run, [a.model_copy(update={"run_id": rid}) for a in atts]))
    url = f"sqlite:///{tmp_path / 'many.db'}"
    store = Store.open(url)
    for run, atts in runs:
        store.add_run(run)
        for a in atts:
            store.add_attempt(a.model_copy(update={"id": None}))
    for ref in ("r20261207-1419-aaab", "r20261207-15", "last", "latest"):
        got = report_read(url, ref)
        assert got is not None and got[0].id == store.get_run(ref).id, ref
    # ambiguous, unknown, empty, a LIKE wildcard: the store answers (its error names which)
    for ref in ("r20261207-1419", "r2025", "", "  ", "r%", "r_0261207"):
        assert report_read(url, ref) is None, ref


def test_anything_it_is_not_sure_of_is_left_to_the_store(tmp_path):
    run, atts = random_run(random.Random(5), 1)
    store, url = _stored(tmp_path, run, atts)
    assert report_read(url, run.id) is not None
    assert report_read("postgresql+psycopg://u@localhost/h", run.id) is None
    assert report_read(url + "?timeout=5", run.id) is None
    assert report_read(f"sqlite:///{tmp_path / 'absent.db'}", run.id) is None
    assert report_read(f"sqlite:///{tmp_path}", run.id) is None  # a directory
    (tmp_path / "not.db").write_bytes(b"not a database at all" * 100)
    assert report_read(f"sqlite:///{tmp_path / 'not.db'}", run.id) is None
    store.engine.dispose()
    # an older harness's database: a column this one reads is not there; the store reads it
    old = tmp_path / "old.db"
    old.write_bytes((tmp_path / f"{run.id}.db").read_bytes())
    con = sqlite3.connect(old)
    con.execute("DROP INDEX ix_attempts_report")
    con.execute("ALTER TABLE attempts DROP COLUMN agent_wall_s")
    con.commit()
    con.close()
    assert report_read(f"sqlite:///{old}", run.id) is None
    res = runner.invoke(app, ["report", run.id, "--format", "json", "--db", f"sqlite:///{old}"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["run"]["id"] == run.id


@pytest.mark.parametrize("table, column, value", [
    ("attempts", "verdict", "maybe"), ("attempts", "slot", -1), ("attempts", "wall_s", "fast"), ("attempts", "node", "[1, 2]"),
    ("attempts", "reasons", "{not json"), ("attempts", "model_calls", '[{"status": "x"}]'), ("attempts", "outcome", 1),
    ("runs", "trials", "many"), ("runs", "created_at", "yesterday"), ("runs", "finished_at", "2026-12-07T16:24:26+00:00"),
    ("runs", "task_overrides", 7), ("runs", "ks", '{"a": 1}'), ("runs", "profile_json", '"text"'), ("runs", "nodes", "[1"),
])
def test_a_damaged_row_is_left_to_the_store_whose_answer_the_report_prints(tmp_path, table, column, value):
    run, atts = random_run(random.Random(11), 2)
    store, url = _stored(tmp_path, run, atts)
    store.engine.dispose()
    con = sqlite3.connect(tmp_path / f"{run.id}.db")
    con.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = (SELECT min(rowid) FROM {table})", (value,))
    con.commit()
    con.close()
    fast = report_read(url, run.id)
    try:  # the store's answer: the reference
        ro = Store.open(url, "ro")
        ref_run, ref = ro.get_run(run.id), ro.attempts(run.id, REPORT_FIELDS)
    except StoreError:
        ref_run = ref = None
    if ref is None:  # what the store refuses, the fast read never answers
        assert fast is None
    else:  # and what it answers, the store answers with the same records
        assert fast is None or fast[0] == ref_run
    if fast is not None:
        assert all(fast[1].col(n) == ref.col(n) for n in ("id", *REPORT_FIELDS))  # type: ignore[union-attr]
    res = runner.invoke(app, ["report", run.id, "--format", "json", "--db", url])
    assert (res.exit_code == 0) == (ref is not None), res.output
    if ref is None:
        assert res.exit_code == 2 and "harness never writes that" in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1, res.output


def test_a_json_report_never_imports_sqlalchemy(tmp_path):
    run, atts = random_run(random.Random(13), 3)
    store, url = _stored(tmp_path, run, atts)
    store.engine.dispose()
    code = ("import sys\nfrom harness.cli import main\n"
            f"sys.argv = ['harness', 'report', {run.id!r}, '--format', '{{}}', '--db', {url!r}, '--out', {str(tmp_path / 'r.out')!r}]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sqlalchemy')[:1])")
    for fmt, imports in (("json", False), ("markdown", False), ("junit", False), ("table", False), ("html", True)):
        p = subprocess.run([sys.executable, "-c", code.replace("{}", fmt)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        assert (p.stdout.strip() != "[]") == imports, (fmt, p.stdout)


def test_what_an_attack_pass_found_is_left_to_the_store_or_refused_in_one_line(tmp_path):
    """File names a URL or an SQLite URI reads otherwise, duplicate run rows, a writer's lock
    and damaged late records: the fast read leaves each to the store, whose answer is the
    report's (found by an attack pass on this read)."""
    run, atts = random_run(random.Random(17), 4)
    store, url = _stored(tmp_path, run, atts, name="plain")
    store.engine.dispose()
    assert report_read(url, run.id) is not None
    for name in ("a%20b", "h#1", "q?x", "tab\tname"):  # the same store, copied where the store's URL reading differs
        (tmp_path / f"{name}.db").write_bytes((tmp_path / "plain.db").read_bytes())
        assert report_read(f"sqlite:///{tmp_path}/{name}.db", run.id) is None, name
    assert report_read(f"sqlite://///{tmp_path}/plain.db", run.id) is None  # five slashes: an authority to SQLite
    # a run row twice (no primary key: changed outside harness), the second damaged
    store, url = _stored(tmp_path, run, atts, name="dup")
    store.engine.dispose()
    con = sqlite3.connect(tmp_path / "dup.db")
    cols = [r[1] for r in con.execute("pragma table_info(runs)")]
    con.executescript(f"PRAGMA foreign_keys=OFF; CREATE TABLE r2 AS SELECT * FROM runs; DROP TABLE runs; ALTER TABLE r2 RENAME TO runs;")
    con.execute(f"INSERT INTO runs ({', '.join(cols)}) SELECT {', '.join('99' if c == 'trials' else c for c in cols)} FROM runs")
    con.execute("UPDATE runs SET status = 7 WHERE rowid = (SELECT max(rowid) FROM runs)")
    con.commit()
    con.close()
    assert report_read(url, run.id) is None
    res = runner.invoke(app, ["report", run.id, "--format", "json", "--db", url])
    assert res.exit_code == 2 and "harness never writes that" in res.output, res.output
    # a writer holding its lock: the fast read waits half a second, then the store waits its own
    store, url = _stored(tmp_path, run, atts, name="locked")
    store.engine.dispose()
    con = sqlite3.connect(tmp_path / "locked.db", isolation_level=None)
    con.execute("PRAGMA journal_mode=DELETE")
    con.execute("BEGIN EXCLUSIVE")
    t0 = time.monotonic()
    assert report_read(url, run.id) is None
    assert time.monotonic() - t0 < 0.5 + 2, "the fast read waited out more than its own lock wait"
    con.execute("ROLLBACK")
    con.close()
    assert report_read(url, run.id) is not None


@pytest.mark.parametrize("record", ['{"x": 1}', "null", "5"])
def test_a_damaged_late_record_is_one_line_on_every_path(tmp_path, record):
    run, atts = random_run(random.Random(19), 5)
    store, url = _stored(tmp_path, run, atts)
    store.add_late(atts[0])
    store.engine.dispose()
    con = sqlite3.connect(tmp_path / f"{run.id}.db")
    con.execute("UPDATE late_attempts SET record = ?", (record,))
    con.commit()
    con.close()
    assert report_read(url, run.id) is None
    for fmt in ("json", "html"):
        res = runner.invoke(app, ["report", run.id, "--format", fmt, "--db", url, "--out", str(tmp_path / "r.out")])
        assert res.exit_code == 2 and "late record" in res.output and "Traceback" not in res.output, res.output


def test_a_name_no_file_can_have_and_a_run_ref_that_is_not_text_are_one_line(tmp_path):
    long = f"sqlite:///{tmp_path}/{'x' * 300}.db"
    assert report_read(long, "last") is None
    res = runner.invoke(app, ["report", "last", "--db", long])
    assert res.exit_code == 2 and "cannot name a file" in res.output, res.output
    run, atts = random_run(random.Random(23), 6)
    store, url = _stored(tmp_path, run, atts)
    store.engine.dispose()
    res = runner.invoke(app, ["report", "r\udcff", "--db", url])
    assert res.exit_code == 2 and "not UTF-8 text" in res.output, res.output


def test_a_store_named_with_a_hash_is_read_read_only_by_its_own_name(tmp_path):
    """A '#' is a character of a file name, never an SQLite URI fragment: the store read the
    file before it ('a'), creating it empty, and called the real store no harness database
    (found by a new-user helper)."""
    run, atts = random_run(random.Random(29), 7)
    store, _ = _stored(tmp_path, run, atts, name="plain")
    store.engine.dispose()
    (tmp_path / "a#b.db").write_bytes((tmp_path / "plain.db").read_bytes())
    res = runner.invoke(app, ["report", run.id, "--format", "json", "--db", f"sqlite:///{tmp_path}/a#b.db"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["run"]["id"] == run.id
    assert not (tmp_path / "a").exists()
