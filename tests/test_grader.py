"""The grader: expectations, unchanged tables, extra effects, and hostile final states."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from harness.grader import (
    NOT_READABLE,
    State,
    StateError,
    build_state,
    diff_states,
    grade,
    snapshot_state,
)
from harness.suite import Expectation, Task, load_suite

TINY = Path(__file__).parent / "fixtures" / "suites" / "tiny"


@pytest.fixture(scope="module")
def tiny():
    return load_suite(TINY)


@pytest.fixture
def refund_one(tiny, tmp_path):
    """(task, fixture db, a copy to play the agent on)."""
    task = tiny.task("refund-one")
    fixture = build_state(tiny.fixture_sql(task), tmp_path / "fixture.db")
    final = tmp_path / "final.db"
    final.write_bytes(fixture.read_bytes())
    return task, fixture, final


def run_sql(db: Path, sql: str) -> None:
    conn = sqlite3.connect(db)
    conn.executescript(sql)
    conn.commit()
    conn.close()


SOLVE = "INSERT INTO refunds VALUES (1, 1004, 2000); INSERT INTO emails VALUES (2, 'ben@example.com', 'refunded');"


def test_correct_final_state_passes(refund_one):
    task, fixture, final = refund_one
    run_sql(final, SOLVE)
    g = grade(task, fixture, final)
    assert g.passed, g.reason
    assert g.reason is None
    assert [c.name for c in g.checks] == ["refunds", "emails", "unchanged: orders", "no extra effects"]
    assert all(c.passed for c in g.checks)


def test_doing_nothing_fails_on_the_first_expectation(refund_one):
    task, fixture, final = refund_one
    g = grade(task, fixture, final)
    assert not g.passed
    assert g.reason == "refunds: expected 1 row, found 0"
    assert g.diff is not None and g.diff.empty


def test_double_refund_reports_row_counts(refund_one):
    task, fixture, final = refund_one
    run_sql(final, SOLVE + "INSERT INTO refunds VALUES (2, 1004, 2000);")
    g = grade(task, fixture, final)
    assert g.reason == "refunds: expected 1 row, found 2: (1004, 2000), (1004, 2000)"


def test_wrong_value_names_expected_and_found_row(refund_one):
    task, fixture, final = refund_one
    run_sql(final, SOLVE.replace("1004, 2000", "1004, 2500"))
    g = grade(task, fixture, final)
    assert g.reason == "refunds: expected (1004, 2000), found (1004, 2500)"


def test_table_rows_compare_named_columns(refund_one):
    task, fixture, final = refund_one
    run_sql(final, "INSERT INTO refunds VALUES (1, 1004, 2000); INSERT INTO emails VALUES (2, 'ann@example.com', 'x');")
    g = grade(task, fixture, final)
    assert g.reason == "emails: expected ('ben@example.com'), found ('ann@example.com')"


def test_unchanged_table_change_is_described(refund_one):
    task, fixture, final = refund_one
    run_sql(final, SOLVE + "UPDATE orders SET status = 'cancelled' WHERE id = 1003;")
    g = grade(task, fixture, final)
    assert not g.passed
    assert g.reason == "orders changed but must be unchanged: order 1003 status 'shipped' -> 'cancelled'"
    td = g.diff.table("orders")
    assert td.changed[0].key == {"id": 1003}
    assert td.changed[0].columns == ["status"]
    assert td.changed[0].before == {"status": "shipped"} and td.changed[0].after == {"status": "cancelled"}


def test_extra_effect_added_row(refund_one, tiny, tmp_path):
    # cancel-one allows orders.status only; a refund row is an extra effect
    task = tiny.task("cancel-one")
    fixture = build_state(tiny.fixture_sql(task), tmp_path / "f2.db")
    final = tmp_path / "final2.db"
    final.write_bytes(fixture.read_bytes())
    run_sql(final, "UPDATE orders SET status = 'cancelled' WHERE id = 1004; INSERT INTO emails VALUES (7, 'x@example.com', 'hi');")
    g = grade(task, fixture, final)
    assert not g.passed
    assert g.reason == "extra effect: emails +1 row (id=7)"
    assert [c.passed for c in g.checks] == [True, True, False]


def test_allowed_column_passes_other_column_in_same_table_fails(tiny, tmp_path):
    task = tiny.task("cancel-one")
    fixture = build_state(tiny.fixture_sql(task), tmp_path / "f.db")
    final = tmp_path / "final.db"
    final.write_bytes(fixture.read_bytes())
    run_sql(final, "UPDATE orders SET status = 'cancelled' WHERE id = 1004;")
    assert grade(task, fixture, final).passed
    run_sql(final, "UPDATE orders SET total_cents = 0 WHERE id = 1004;")
    g = grade(task, fixture, final)
    assert g.reason == "extra effect: orders changed: order 1004 total_cents 2000 -> 0"


def test_ordered_rows(tiny, tmp_path):
    conn = sqlite3.connect(":memory:")
    conn.executescript("CREATE TABLE t (a INT); INSERT INTO t VALUES (2), (1);")
    from harness.grader import check_expectation

    unordered = Expectation(name="t", query="SELECT a FROM t", rows=[[1], [2]])
    ordered = Expectation(name="t", query="SELECT a FROM t ORDER BY a DESC", rows=[[1], [2]], ordered=True)
    assert check_expectation(conn, unordered) == (True, None)
    assert check_expectation(conn, ordered) == (False, "t: row 0: expected (1), found (2)")


def test_expectation_query_error_is_a_failed_check(refund_one):
    task, fixture, final = refund_one
    run_sql(final, "DROP TABLE refunds;")
    g = grade(task, fixture, final)
    assert g.reason == "refunds: query failed on the final state: no such table: refunds"
    # and the dropped table shows in the diff
    assert g.diff.table("refunds").status == "removed"


def test_new_table_is_an_extra_effect(refund_one):
    task, fixture, final = refund_one
    run_sql(final, SOLVE + "CREATE TABLE scratch (x); INSERT INTO scratch VALUES (1), (2);")
    g = grade(task, fixture, final)
    assert g.reason == "extra effect: new table scratch (2 rows)"


def test_rowid_table_changes(refund_one):
    task, fixture, final = refund_one
    run_sql(final, SOLVE + "UPDATE notes SET body = 'edited';")
    assert grade(task, fixture, final).passed  # notes.body is allowed
    run_sql(final, "INSERT INTO notes VALUES ('second');")
    g = grade(task, fixture, final)
    assert g.reason == "extra effect: notes +1 row (rowid=2)"


def test_no_final_state(refund_one, tmp_path):
    task, fixture, _ = refund_one
    assert grade(task, fixture, None).reason == "no final state"
    assert grade(task, fixture, tmp_path / "missing.db").reason == "no final state"


@pytest.mark.parametrize("content", [b"", b"not a database at all" * 100, b"SQLite format 3\x00" + b"\xff" * 4000])
def test_malformed_final_state_is_a_failing_grade(refund_one, content):
    task, fixture, final = refund_one
    final.write_bytes(content)
    g = grade(task, fixture, final)
    assert not g.passed
    assert g.reason == NOT_READABLE
    assert g.diff is None


def test_truncated_sqlite_file(refund_one):
    task, fixture, final = refund_one
    run_sql(final, SOLVE + "INSERT INTO notes SELECT hex(randomblob(500)) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 200) SELECT x FROM c);")
    data = final.read_bytes()
    final.write_bytes(data[: len(data) // 3])
    g = grade(task, fixture, final)
    assert not g.passed and g.reason == NOT_READABLE


def test_huge_final_state_is_capped(refund_one):
    task, fixture, final = refund_one
    size = final.stat().st_size
    g = grade(task, fixture, final, max_bytes=size - 1)
    assert not g.passed
    assert g.reason.startswith("final state is ") and "over the cap" in g.reason


def test_symlink_final_state_is_refused(refund_one, tmp_path):
    task, fixture, _ = refund_one
    link = tmp_path / "link.db"
    link.symlink_to(fixture)
    assert grade(task, fixture, link).reason == NOT_READABLE


def test_snapshot_is_read_only(refund_one):
    _, fixture, final = refund_one
    before = final.read_bytes()
    state = snapshot_state(final)
    assert set(state) == {"orders", "refunds", "emails", "notes"}
    assert state.key_columns["orders"] == ["id"] and state.key_columns["notes"] == ["rowid"]
    assert state["orders"][0] == {"id": 1003, "customer": "ana", "status": "shipped", "total_cents": 5000}
    assert final.read_bytes() == before
    assert not Path(str(final) + "-journal").exists()


def test_snapshot_rejects_non_sqlite(tmp_path):
    p = tmp_path / "x.db"
    p.write_text("hello")
    with pytest.raises(StateError, match="not a readable SQLite database"):
        snapshot_state(p)


def test_diff_states_on_plain_dicts():
    before = {"t": [{"id": 1, "a": "x", "b": 1}, {"id": 2, "a": "y", "b": 2}]}
    after = {"t": [{"id": 1, "a": "x", "b": 5}, {"id": 3, "a": "z", "b": 3}], "u": [{"id": 1}]}
    d = diff_states(before, after)
    t = d.table("t")
    assert [r["id"] for r in t.added] == [3]
    assert [r["id"] for r in t.removed] == [2]
    assert t.changed[0].key == {"id": 1} and t.changed[0].columns == ["b"]
    assert d.table("u").status == "added"
    assert diff_states(before, before).empty


def test_diff_schema_change(tmp_path):
    a = build_state("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'a');", tmp_path / "a.db")
    b = build_state("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT, w INT); INSERT INTO t VALUES (1, 'a', 9);", tmp_path / "b.db")
    d = diff_states(snapshot_state(a), snapshot_state(b))
    assert d.table("t").columns_added == ["w"]
    assert not d.table("t").changed


def test_grade_is_json_serializable_with_blobs(refund_one):
    task, fixture, final = refund_one
    run_sql(final, SOLVE + "INSERT INTO notes VALUES (x'00ff');")
    g = grade(task, fixture, final)
    data = json.loads(g.model_dump_json())
    notes = next(t for t in data["diff"]["tables"] if t["table"] == "notes")
    assert notes["added"] == [{"rowid": 2, "body": "x'00ff'"}]
    assert data["passed"] is False


def test_state_is_a_dict():
    s = State({"t": []}, key_columns={"t": ["id"]})
    assert dict(s) == {"t": []} and list(s.keys()) == ["t"] and s.key_columns == {"t": ["id"]}


def test_task_without_expectations_still_checks_extra_effects(refund_one):
    _, fixture, final = refund_one
    task = Task(id="noop", title="t", prompt="p")
    assert grade(task, fixture, final).passed
    run_sql(final, "DELETE FROM orders WHERE id = 1003;")
    assert grade(task, fixture, final).reason == "extra effect: orders -1 row (id=1003)"
