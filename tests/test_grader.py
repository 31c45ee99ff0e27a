"""The SQLite grader program (runs inside the sandbox): expectations, unchanged tables,
extra effects, the capped diff, and states it cannot read. Here it runs in-process on files
the tests make, and once as the standard-library-only program it is in the sandbox."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.engine.suites import load_suite
from harness.model.grade import MAX_VERDICT_BYTES, Verdict
from harness.model.suite import Expectation, Task
from harness.state import sqlite_grade as g
from harness.state.expectations import grade_spec
from harness.state.sqlite import build_fixture_db

TINY = Path(__file__).parent / "fixtures" / "suites" / "tiny"


@pytest.fixture(scope="module")
def tiny():
    return load_suite(TINY)


def build(sql: str, path: Path) -> Path:
    path.write_bytes(build_fixture_db(sql))  # a fresh state, as setup copies it for the agent
    return path


_FIXTURES: dict[str, str] = {}


def fixture_file(sql: str) -> str:
    """The fixture database built from ``sql`` the way the state kind builds it for a run."""
    if sql not in _FIXTURES:
        p = Path(tempfile.mkdtemp(prefix="harness-test-fixture-")) / "fixture.db"
        p.write_bytes(build_fixture_db(sql))
        _FIXTURES[sql] = str(p)
    return _FIXTURES[sql]


def verdict(task: Task, fixture_sql: str, final: Path | None) -> Verdict:
    raw = g.grade(grade_spec(task), fixture_file(fixture_sql), None if final is None else str(final))
    return Verdict.model_validate_json(g.fit(raw))


@pytest.fixture
def refund_one(tiny, tmp_path):
    """(task, fixture sql, a final state to play the agent on)."""
    task = tiny.task("refund-one")
    sql = tiny.fixture_sql(task)
    return task, sql, build(sql, tmp_path / "state.db")


def run_sql(db: Path, sql: str) -> None:
    conn = sqlite3.connect(db)
    conn.executescript(sql)
    conn.commit()
    conn.close()


SOLVE = "INSERT INTO refunds VALUES (1, 1004, 2000); INSERT INTO emails VALUES (2, 'ben@example.com', 'refunded');"


def test_correct_final_state_passes(refund_one):
    task, sql, final = refund_one
    run_sql(final, SOLVE)
    v = verdict(task, sql, final)
    assert v.status == "graded" and v.passed, v.reason
    assert v.reason is None
    assert [c.name for c in v.checks] == ["refunds", "emails", "unchanged: orders", "no extra effects"]
    assert all(c.passed for c in v.checks)


def test_doing_nothing_fails_on_the_first_expectation(refund_one):
    task, sql, final = refund_one
    v = verdict(task, sql, final)
    assert v.status == "graded" and not v.passed
    assert v.reason == "refunds: expected 1 row, found 0"
    assert v.diff is not None and v.diff.empty


def test_double_refund_reports_row_counts(refund_one):
    task, sql, final = refund_one
    run_sql(final, SOLVE + "INSERT INTO refunds VALUES (2, 1004, 2000);")
    assert verdict(task, sql, final).reason == "refunds: expected 1 row, found 2: (1004, 2000), (1004, 2000)"


def test_wrong_value_names_expected_and_found_row(refund_one):
    task, sql, final = refund_one
    run_sql(final, SOLVE.replace("1004, 2000", "1004, 2500"))
    assert verdict(task, sql, final).reason == "refunds: expected (1004, 2000), found (1004, 2500)"


def test_table_rows_compare_named_columns(refund_one):
    task, sql, final = refund_one
    run_sql(final, "INSERT INTO refunds VALUES (1, 1004, 2000); INSERT INTO emails VALUES (2, 'ann@example.com', 'x');")
    assert verdict(task, sql, final).reason == "emails: expected ('ben@example.com'), found ('ann@example.com')"


def test_unchanged_table_change_is_described(refund_one):
    task, sql, final = refund_one
    run_sql(final, SOLVE + "UPDATE orders SET status = 'cancelled' WHERE id = 1003;")
    v = verdict(task, sql, final)
    assert not v.passed
    assert v.reason == "orders changed but must be unchanged: order 1003 status 'shipped' -> 'cancelled'"
    td = v.diff.table("orders")
    assert td.changed[0].key == {"id": 1003}
    assert td.changed[0].columns == ["status"]
    assert td.changed[0].before == {"status": "shipped"} and td.changed[0].after == {"status": "cancelled"}
    assert td.counts.changed == 1


def test_extra_effect_added_row(tiny, tmp_path):
    # cancel-one allows orders.status only; a new email is an extra effect
    task = tiny.task("cancel-one")
    sql = tiny.fixture_sql(task)
    final = build(sql, tmp_path / "s.db")
    run_sql(final, "UPDATE orders SET status = 'cancelled' WHERE id = 1004; INSERT INTO emails VALUES (7, 'x@example.com', 'hi');")
    v = verdict(task, sql, final)
    assert not v.passed
    assert v.reason == "extra effect: emails +1 row (id=7)"
    assert [c.passed for c in v.checks] == [True, True, False]


def test_allowed_column_passes_other_column_in_same_table_fails(tiny, tmp_path):
    task = tiny.task("cancel-one")
    sql = tiny.fixture_sql(task)
    final = build(sql, tmp_path / "s.db")
    run_sql(final, "UPDATE orders SET status = 'cancelled' WHERE id = 1004;")
    assert verdict(task, sql, final).passed
    run_sql(final, "UPDATE orders SET total_cents = 0 WHERE id = 1004;")
    assert verdict(task, sql, final).reason == "extra effect: orders changed: order 1004 total_cents 2000 -> 0"


def test_a_disallowed_change_after_many_allowed_ones_is_still_found(tmp_path):
    """The extra-effects check sees every row, not only the first ones the stored diff keeps."""
    sql = "CREATE TABLE t (id INTEGER PRIMARY KEY, a INT, b INT);" + "".join(f"INSERT INTO t VALUES ({i}, 0, 0);" for i in range(100))
    final = build(sql, tmp_path / "s.db")
    run_sql(final, "UPDATE t SET a = 1; UPDATE t SET b = 1 WHERE id = 99;")
    task = Task(id="x", title="t", prompt="p", allow=["t.a"])
    v = verdict(task, sql, final)
    assert v.reason == "extra effect: t changed: t 99 b 0 -> 1"
    td = v.diff.table("t")
    assert td.counts.changed == 100 and len(td.changed) == g.MAX_ROWS_SHOWN and td.truncated
    assert td.changed_outside_allowed == 1


def test_ordered_rows():
    conn = sqlite3.connect(":memory:")
    conn.executescript("CREATE TABLE t (a INT); INSERT INTO t VALUES (2), (1);")
    unordered = Expectation(name="t", query="SELECT a FROM t", rows=[[1], [2]]).model_dump()
    ordered = Expectation(name="t", query="SELECT a FROM t ORDER BY a DESC", rows=[[1], [2]], ordered=True).model_dump()
    assert g.check_expectation(conn, unordered) == (True, None)
    assert g.check_expectation(conn, ordered) == (False, "t: row 0: expected (1), found (2)")


def test_expectation_query_error_is_a_failed_check(refund_one):
    task, sql, final = refund_one
    run_sql(final, "DROP TABLE refunds;")
    v = verdict(task, sql, final)
    assert v.reason == "refunds: query failed on the final state: no such table: refunds"
    assert v.diff.table("refunds").status == "removed"


def test_a_view_in_place_of_a_table_is_a_dropped_table(refund_one):
    """An agent that replaces a table by a view answering the expectation still fails."""
    task, sql, final = refund_one
    run_sql(final, "DROP TABLE refunds; CREATE VIEW refunds AS SELECT 1 AS id, 1004 AS order_id, 2000 AS amount_cents;"
                   "INSERT INTO emails VALUES (2, 'ben@example.com', 'refunded');")
    v = verdict(task, sql, final)
    assert v.status == "graded" and not v.passed
    assert v.checks[0].passed  # the view answers the query...
    assert "table refunds replaced by a view" in v.reason  # ...but the table is gone: an extra effect


def test_new_table_is_an_extra_effect(refund_one):
    task, sql, final = refund_one
    run_sql(final, SOLVE + "CREATE TABLE scratch (x); INSERT INTO scratch VALUES (1), (2);")
    assert verdict(task, sql, final).reason == "extra effect: new table scratch (2 rows)"


def test_rowid_table_changes(refund_one):
    task, sql, final = refund_one
    run_sql(final, SOLVE + "UPDATE notes SET body = 'edited';")
    assert verdict(task, sql, final).passed  # notes.body is allowed
    run_sql(final, "INSERT INTO notes VALUES ('second');")
    assert verdict(task, sql, final).reason == "extra effect: notes +1 row (rowid=2)"


def test_no_final_state(refund_one, tmp_path):
    task, sql, _ = refund_one
    assert verdict(task, sql, None).reason == "no final state"
    v = verdict(task, sql, tmp_path / "missing.db")
    assert v.reason == "no final state" and v.status == "graded"


def test_an_empty_file_is_an_empty_database(refund_one):
    task, sql, final = refund_one
    final.write_bytes(b"")
    v = verdict(task, sql, final)
    assert v.status == "graded" and v.reason == "refunds: query failed on the final state: no such table: refunds"
    assert {t.table for t in v.diff.tables} == {"emails", "notes", "orders", "refunds"}


@pytest.mark.parametrize("content", [b"not a database at all" * 100, b"SQLite format 3\x00" + b"\xff" * 4000])
def test_malformed_final_state_is_ungradable(refund_one, content):
    task, sql, final = refund_one
    final.write_bytes(content)
    v = verdict(task, sql, final)
    assert v.status == "ungradable" and not v.passed
    assert v.reason.startswith(g.NOT_READABLE)
    assert v.diff is None


def test_truncated_sqlite_file_is_ungradable(refund_one):
    task, sql, final = refund_one
    run_sql(final, SOLVE + "INSERT INTO notes SELECT hex(randomblob(500)) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 200) SELECT x FROM c);")
    data = final.read_bytes()
    final.write_bytes(data[: len(data) // 3])
    v = verdict(task, sql, final)
    assert v.status == "ungradable" and v.reason.startswith(g.NOT_READABLE)


def test_symlink_final_state_is_refused(refund_one, tmp_path):
    task, sql, final = refund_one
    link = tmp_path / "link.db"
    link.symlink_to(final)
    v = verdict(task, sql, link)
    assert v.status == "ungradable" and "not a regular file" in v.reason


def test_reading_changes_nothing(refund_one):
    _, _, final = refund_one
    before = final.read_bytes()
    conn, copy = g.open_final_state(str(final))
    assert copy is None
    assert {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")} == {"orders", "refunds", "emails", "notes"}
    with pytest.raises(sqlite3.OperationalError):
        conn.execute("DELETE FROM orders")
    conn.close()
    assert final.read_bytes() == before
    assert not Path(str(final) + "-journal").exists()


def test_wal_commits_are_graded_and_the_files_left_alone(refund_one, tmp_path):
    task, sql, final = refund_one
    conn = sqlite3.connect(final)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.executescript(SOLVE)
    conn.commit()
    wal = Path(str(final) + "-wal")
    assert wal.stat().st_size > 0
    snap = (final.read_bytes(), wal.read_bytes())
    v = verdict(task, sql, final)
    assert (final.read_bytes(), wal.read_bytes()) == snap  # read in place, never checkpointed
    conn.close()
    assert v.passed, v.reason


def test_diff_schema_change(tmp_path):
    sql = "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'a');"
    final = build(sql, tmp_path / "s.db")
    run_sql(final, "ALTER TABLE t ADD COLUMN w INT; UPDATE t SET w = 9;")
    v = verdict(Task(id="x", title="t", prompt="p", allow=["t"]), sql, final)
    td = v.diff.table("t")
    assert td.columns_added == ["w"] and not td.changed


def test_a_generated_column_the_agent_adds_is_named_not_computed(tmp_path):
    """Only the fixture's columns are read from the final state: an added generated column
    (which could cost anything to compute) is reported by name and never evaluated."""
    sql = "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'a');"
    final = build(sql, tmp_path / "s.db")
    run_sql(final, "ALTER TABLE t ADD COLUMN big BLOB GENERATED ALWAYS AS (zeroblob(2000000000)) VIRTUAL;")
    v = verdict(Task(id="x", title="t", prompt="p"), sql, final)
    assert v.reason == "extra effect: t new column(s) big"


def test_blobs_and_long_values_are_shortened(refund_one):
    task, sql, final = refund_one
    run_sql(final, SOLVE + "INSERT INTO notes VALUES (x'00ff'); INSERT INTO notes VALUES ('" + "y" * 5000 + "');")
    v = verdict(task, sql, final)
    notes = v.diff.table("notes")
    assert notes.added[0] == {"rowid": 2, "body": "x'00ff'"}
    assert notes.added[1]["body"].startswith("y" * g.MAX_VALUE_CHARS) and notes.added[1]["body"].endswith("(5000 chars)")


def test_the_verdict_fits_its_cap_whatever_the_state(tmp_path):
    sql = "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT);"
    final = build(sql, tmp_path / "s.db")
    statements = "".join(f"CREATE TABLE t{i} (x TEXT); INSERT INTO t{i} VALUES ('{'z' * 3000}');" for i in range(200))
    run_sql(final, statements)
    text = g.fit(g.grade(grade_spec(Task(id="x", title="t", prompt="p")), fixture_file(sql), str(final)))
    assert len(text.encode()) <= g.VERDICT_TARGET_BYTES <= MAX_VERDICT_BYTES
    v = Verdict.model_validate_json(text)
    assert v.diff.tables_total == 200 and len(v.diff.tables) <= 50 and v.diff.truncated
    assert v.reason.startswith("extra effect: new table t0 (1 row)") and "(and 199 more)" in v.reason


def test_task_without_expectations_still_checks_extra_effects(refund_one):
    _, sql, final = refund_one
    task = Task(id="noop", title="t", prompt="p")
    assert verdict(task, sql, final).passed
    run_sql(final, "DELETE FROM orders WHERE id = 1003;")
    assert verdict(task, sql, final).reason == "extra effect: orders -1 row (id=1003)"


def test_the_program_runs_on_the_standard_library_alone(refund_one, tmp_path):
    """As in the sandbox: ``python3 -I -S`` (no site-packages, no harness), one verdict on stdout."""
    task, sql, final = refund_one
    run_sql(final, SOLVE)
    spec = {**grade_spec(task), "state_path": str(final), "fixture_path": fixture_file(sql)}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    p = subprocess.run([sys.executable, "-I", "-S", g.__file__, str(tmp_path / "spec.json")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert Verdict.model_validate_json(p.stdout).passed


def test_a_fixture_the_grader_cannot_read_is_its_own_failure(tmp_path):
    (tmp_path / "spec.json").write_text(json.dumps({**grade_spec(Task(id="x", title="t", prompt="p")), "state_path": str(tmp_path / "none.db"),
                                                    "fixture_path": str(tmp_path / "missing-fixture.db")}))
    p = subprocess.run([sys.executable, "-I", "-S", g.__file__, str(tmp_path / "spec.json")], capture_output=True, text=True, timeout=60)
    assert p.returncode == g.EXIT_BROKEN and "sqlite3" in p.stderr and p.stdout == ""


# ---------------------------------------------------------------------------- found by an attack pass

PROBE_SQL = ("CREATE TABLE log (id INTEGER PRIMARY KEY, seed INTEGER NOT NULL, seen INTEGER NOT NULL);"
             "CREATE TABLE audit (id INTEGER PRIMARY KEY, note TEXT NOT NULL); INSERT INTO audit (note) VALUES ('fixture row');")
PROBE_TASK = Task(id="append", title="t", prompt="p", unchanged=["audit"], allow=["log"],
                  expect=[Expectation(name="log", query="SELECT seen FROM log", rows=[[0]])])


def test_an_index_that_disagrees_with_its_table_is_ungradable(tmp_path):
    """An index built on another expression, its schema text rewritten: the expectation read
    the index (0) while the table held 999."""
    final = build(PROBE_SQL, tmp_path / "s.db")
    c = sqlite3.connect(final)
    c.execute("INSERT INTO log (seed, seen) VALUES (1, 999)")
    c.execute("CREATE INDEX i ON log(seed * 0)")
    c.commit()
    c.execute("PRAGMA writable_schema = ON")
    c.execute("UPDATE sqlite_master SET sql = 'CREATE INDEX i ON log(seen)' WHERE name = 'i'")
    c.commit()
    c.close()
    v = verdict(PROBE_TASK, PROBE_SQL, final)
    assert v.status == "ungradable" and "integrity check" in v.reason, v.reason


def test_an_unfinished_transaction_is_rolled_back_before_grading(tmp_path):
    final = build(PROBE_SQL, tmp_path / "s.db")
    code = (f"import os, sqlite3\nc = sqlite3.connect({str(final)!r}, isolation_level=None)\nc.execute('PRAGMA cache_size=1')\n"
            "c.execute('BEGIN')\nc.execute('INSERT INTO log (seed, seen) VALUES (1, 0)')\n"
            "c.execute(\"INSERT INTO audit (note) SELECT hex(randomblob(1000)) FROM (WITH RECURSIVE r(x) AS "
            "(SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 50) SELECT x FROM r)\")\n"
            "c.execute('DELETE FROM audit WHERE id > 1')\nos._exit(0)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert Path(str(final) + "-journal").stat().st_size > 0
    before = final.read_bytes()
    v = verdict(PROBE_TASK, PROBE_SQL, final)
    assert v.status == "graded" and v.reason == "log: expected 1 row, found 0", v.reason  # what was committed
    assert final.read_bytes() == before and Path(str(final) + "-journal").exists()  # rolled back on a copy


def test_triggers_views_and_redefined_tables_are_extra_effects(tmp_path):
    final = build(PROBE_SQL, tmp_path / "s.db")
    run_sql(final, "INSERT INTO log (seed, seen) VALUES (1, 0);"
                   "CREATE TABLE a2 (id, note); INSERT INTO a2 SELECT * FROM audit; DROP TABLE audit; ALTER TABLE a2 RENAME TO audit;"
                   "CREATE VIEW secrets AS SELECT 1; CREATE TRIGGER wipe AFTER INSERT ON log BEGIN DELETE FROM audit; END;")
    v = verdict(PROBE_TASK, PROBE_SQL, final)
    assert not v.passed
    assert v.diff.schema_changes == ["table audit redefined: CREATE TABLE \"audit\" (id, note)", "new trigger wipe on log",
                                     "new view secrets on secrets"], v.diff.schema_changes
    assert v.reason.startswith("extra effect: schema: table audit redefined") and "(and 2 more)" in v.reason


def test_a_blob_where_the_column_holds_text_is_an_extra_effect(tmp_path):
    """A BLOB never equals TEXT: `note = 'forbidden'` with count = 0 used to pass."""
    task = Task(id="b", title="t", prompt="p", allow=["log", "audit"],
                expect=[Expectation(name="nothing forbidden", query="SELECT id FROM audit WHERE note = 'forbidden'", count=0)])
    final = build(PROBE_SQL, tmp_path / "s.db")
    run_sql(final, "INSERT INTO audit (note) VALUES (CAST('forbidden' AS BLOB));")
    v = verdict(task, PROBE_SQL, final)
    assert v.checks[0].passed and not v.passed
    assert v.reason == "extra effect: audit.note holds a BLOB in a TEXT column (audit 2)", v.reason


def test_vacuum_renumbering_a_keyless_table_is_not_a_change(tmp_path):
    sql = "CREATE TABLE tags (name TEXT, n INTEGER); INSERT INTO tags VALUES ('a', 1), ('b', 2), ('c', 3); DELETE FROM tags WHERE name = 'a';"
    final = build(sql, tmp_path / "s.db")
    run_sql(final, "VACUUM;")
    assert [r[0] for r in sqlite3.connect(final).execute("SELECT rowid FROM tags")] == [1, 2]  # renumbered
    v = verdict(Task(id="v", title="t", prompt="p", unchanged=["tags"]), sql, final)
    assert v.passed, v.reason
    run_sql(final, "UPDATE tags SET n = 9 WHERE name = 'b';")  # a real change is still one
    v = verdict(Task(id="v", title="t", prompt="p", unchanged=["tags"]), sql, final)
    assert not v.passed and v.reason.startswith("tags changed but must be unchanged"), v.reason


def test_invalid_utf8_and_terminal_escapes_never_break_or_leave_the_grader(tmp_path):
    sql = "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, CAST(x'ff61' AS TEXT));"
    final = build(sql, tmp_path / "s.db")
    run_sql(final, 'CREATE TABLE "[/] \x1b[2J\x1b[32mclean: pass" (x); INSERT INTO t VALUES (2, CAST(x\'c328\' AS TEXT));')
    text = g.fit(g.grade(grade_spec(Task(id="x", title="t", prompt="p")), fixture_file(sql), str(final)))
    v = Verdict.model_validate_json(text)
    assert v.status == "graded" and not v.passed
    assert "\x1b" not in text and not any(ord(ch) < 32 for ch in v.reason)
    assert v.diff.table("t").added[0]["v"] == "\ufffd("


# an agent whose wrong answer made the grader crash or its verdict unreadable had that attempt
# discarded as an infrastructure error and rerun: it chose which of its attempts were scored
# (attack pass: a coin-flip agent reported pass^4 = 1.000). Whatever the final state holds,
# the verdict is graded and valid.
POISON = [
    ("non-UTF-8 text", "UPDATE job SET v = CAST(x'77726f6e67ff' AS TEXT) WHERE id = 1"),
    ("a long blob", "UPDATE job SET v = zeroblob(2000) WHERE id = 1"),
    ("escapes in text", "UPDATE job SET v = char(27) || '[2J' || char(10) || 'clean: pass' WHERE id = 1"),
    ("wide rows", "INSERT INTO job VALUES (2, '" + "w" * 300 + "'), (3, '" + "x" * 300 + "')"),
]


@pytest.mark.parametrize("what, agent_sql", POISON, ids=[p[0] for p in POISON])
def test_a_wrong_answer_is_graded_a_failure_whatever_its_bytes(tmp_path, what, agent_sql):
    sql = "CREATE TABLE job (id INTEGER PRIMARY KEY, v); INSERT INTO job VALUES (1, 'todo');"
    final = build(sql, tmp_path / "s.db")
    run_sql(final, agent_sql)
    wide = ", ".join(["v"] * 8)  # an honest wrong answer on a wide expectation: a long detail
    task = Task.model_validate({"id": "x", "title": "t", "prompt": "p", "allow": ["job"],
                                "expect": [{"name": "done", "query": f"SELECT id, {wide} FROM job", "rows": [[1, *["done"] * 8]]}]})
    text = g.fit(g.grade(grade_spec(task), fixture_file(sql), str(final)))
    text.encode("utf-8")  # valid UTF-8, as the controller reads it
    v = Verdict.model_validate_json(text)
    assert v.status == "graded" and not v.passed, v
    check = next(c for c in v.checks if c.name == "done")
    assert not check.passed and check.detail.startswith("done: ") and len(check.detail) <= 500
    assert not any(ord(ch) < 32 for ch in check.detail)


def test_a_crash_on_the_agents_state_is_ungradable_never_broken(tmp_path, monkeypatch, capsys):
    # a grader bug that only the agent's state triggers is still the state's verdict
    sql = "CREATE TABLE job (id INTEGER PRIMARY KEY, v); INSERT INTO job VALUES (1, 'todo');"
    final = build(sql, tmp_path / "s.db")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**grade_spec(Task(id="x", title="t", prompt="p")), "fixture_path": fixture_file(sql),
                                "state_path": str(final)}))

    def boom(*a, **k):
        raise KeyError("a state the grader did not expect")

    monkeypatch.setattr(g, "diff_states", boom)
    assert g.main(["g", str(spec)]) == 0
    v = Verdict.model_validate_json(capsys.readouterr().out)
    assert v.status == "ungradable" and "KeyError" in v.reason
    spec.write_text(json.dumps({**grade_spec(Task(id="x", title="t", prompt="p")), "fixture_path": str(tmp_path / "none.db"),
                                "state_path": str(final)}))
    assert g.main(["g", str(spec)]) == g.EXIT_BROKEN  # its own fixture missing: the grader's, never the agent's


@pytest.mark.parametrize("stdout, truncated, says", [
    ('{"version": 1, "status": "graded", "passed": false, "checks": [{"name": "x", "kind": "expect", "passed": false, '
     '"detail": "' + "d" * 700 + '"}]}', False, "malformed"),
    ("{" * 10, False, "malformed"),
    ("{}", True, "over its cap"),
])
def test_a_verdict_the_controller_cannot_take_is_ungradable_never_a_discard(tiny, stdout, truncated, says):
    from harness.model.sandbox import ExecResult
    from harness.state.expectations import ExpectationsGrader

    res = ExecResult(cmd=["g"], exit_code=0, wall_s=0.1, stdout=stdout, stdout_truncated=truncated, stdout_bytes=len(stdout))
    r = ExpectationsGrader().read(tiny.task("refund-one"), res, False, 8.0, {})
    assert r.status == "ungradable" and not r.passed and says in r.reason
