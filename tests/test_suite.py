"""Loading suites: the format, every error naming its file and key, and the content hash."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from harness.engine.suites import builtin_suites, load_suite
from harness.model.errors import SuiteError
from harness.model.suite import Suite

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path("tests/fixtures/suites")


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch):
    # error messages show paths relative to the working directory
    monkeypatch.chdir(REPO)


@pytest.fixture
def tiny_copy(tmp_path) -> Path:
    dst = tmp_path / "tiny"
    shutil.copytree(REPO / FIXTURES / "tiny", dst)
    return dst


def errors_of(path) -> list[str]:
    with pytest.raises(SuiteError) as ei:
        load_suite(path)
    return str(ei.value).splitlines()


# ---------------------------------------------------------------------------- loading


def test_load_tiny_suite():
    s = load_suite(FIXTURES / "tiny")
    assert isinstance(s, Suite)
    assert (s.name, s.image, s.agent_cmd, s.profile, s.trials, s.k, s.max_reruns) == (
        "tiny", "harness/tiny:latest", ["true"], "standard", 4, [1, 2, 4], 3)
    assert s.agent_env == {"TINY_MODE": "test"}
    assert [t.id for t in s.tasks] == ["cancel-one", "refund-one"]  # sorted by id, sub-directories included
    t = s.task("refund-one")
    assert t.envelope.memory == 512 * 1024 * 1024 and t.envelope.timeouts == {"agent": 60}
    assert t.source.name == "refund-one.toml"
    with pytest.raises(KeyError, match="no task 'nope'"):
        s.task("nope")


def test_fixture_sql_is_state_sql_then_fixture_file_then_inline(tmp_path):
    s = load_suite(FIXTURES / "tiny")
    sql = s.fixture_sql(s.task("cancel-one"))
    assert sql.index("CREATE TABLE orders") < sql.index("INSERT INTO orders VALUES (1003") < sql.index("(1005, 'cy'")
    conn = sqlite3.connect(":memory:")
    conn.executescript(sql)
    assert conn.execute("SELECT count(*) FROM orders").fetchone() == (3,)
    inline = s.fixture_sql(s.task("refund-one"))
    conn = sqlite3.connect(":memory:")
    conn.executescript(inline)
    assert conn.execute("SELECT to_addr FROM emails").fetchall() == [("old@example.com",)]


def test_builtin_suites_resolve_by_name():
    assert "refunds" in builtin_suites()
    s = load_suite("refunds")
    assert s.root == (REPO / "harness" / "suites" / "refunds")
    assert s.image == "harness/refunds:latest" and s.agent_cmd == ["refundbot"]
    assert len(s.tasks) >= 12


def test_unknown_suite_name():
    with pytest.raises(SuiteError, match="unknown suite 'nope'.*refunds"):
        load_suite("nope")


def test_content_hash_is_stable_and_location_independent(tiny_copy, tmp_path):
    original = load_suite(FIXTURES / "tiny").content_hash
    copy = load_suite(tiny_copy)
    assert copy.content_hash == original
    # mtimes, modes and caches do not count
    os.utime(tiny_copy / "suite.toml", (1, 1))
    (tiny_copy / "Dockerfile").chmod(0o600)
    (tiny_copy / "__pycache__").mkdir()
    (tiny_copy / "__pycache__" / "x.pyc").write_bytes(b"junk")
    assert load_suite(tiny_copy).content_hash == original


@pytest.mark.parametrize("rel", ["suite.toml", "tasks/refund-one.toml", "sql/rows.sql", "sql/cancel-one.sql", "Dockerfile"])
def test_content_hash_covers_every_input(tiny_copy, rel):
    before = load_suite(tiny_copy).content_hash
    with open(tiny_copy / rel, "a") as f:
        f.write("\n-- changed\n" if rel.endswith(".sql") else "\n# changed\n")
    assert load_suite(tiny_copy).content_hash != before


def test_content_hash_covers_build_context(tiny_copy):
    before = load_suite(tiny_copy).content_hash
    (tiny_copy / "agent.py").write_text("print('hi')\n")
    assert load_suite(tiny_copy).content_hash != before


def test_refunds_hash_is_a_sha256():
    h = load_suite("refunds").content_hash
    assert len(h) == 64 and int(h, 16) >= 0
    assert h == load_suite("refunds").content_hash


# ---------------------------------------------------------------------------- errors


def test_broken_suite_reports_every_problem_with_file_and_key():
    lines = errors_of(FIXTURES / "broken")
    b = "tests/fixtures/suites/broken"
    expected = [
        f"{b}/suite.toml: agent_cmd: Input should be a valid list (a list of words, e.g. agent_cmd = [\"python3\", \"/opt/agent/main.py\"])",
        f"{b}/suite.toml: k: k = 8 exceeds trials = 4; raise trials or drop k = 8",
        f"{b}/suite.toml: colour: unknown key",
        f"{b}/tasks/b/dup.toml: id: duplicate task id 'dup' (also in {b}/tasks/a/dup.toml)",
        f"{b}/tasks/bad-envelope.toml: envelope.cpus: Input should be greater than 0",
        f"{b}/tasks/bad-envelope.toml: envelope.gpus: unknown key (did you mean 'cpus'?)",
        f"{b}/tasks/bad-expect.toml: expect.0: give exactly one of `rows` or `count`",
        f"{b}/tasks/bad-expect.toml: expect.1.rows: must be an array of rows: arrays (positional) or tables (column = value)",
        f"{b}/tasks/bad-names.toml: unchanged.0: no table 'ordrs' in the fixture (tables: orders)",
        f"{b}/tasks/bad-names.toml: allow.0: table 'orders' has no column 'colour'",
        f"{b}/tasks/bad-names.toml: expect.0.query: SQL error against the fixture: no such table: refunds",
        f"{b}/tasks/bad-sql.toml: fixture_sql: SQL error: near \"INSRT\": syntax error",
        f"{b}/tasks/missing-fixture.toml: fixture: no such file {b}/fixtures/nope.sql",
        f"{b}/tasks/stem-mismatch.toml: id: 'another-name' must equal the file stem 'stem-mismatch'",
        f"{b}/tasks/unknown-key.toml: tags: Input should be a valid list (a list, e.g. tags = [\"refund\"])",
        f"{b}/tasks/unknown-key.toml: expct: unknown key (did you mean 'expect'?)",
    ]
    for line in expected:
        assert line in lines, f"missing: {line}\ngot:\n" + "\n".join(lines)
    assert any(line.startswith(f"{b}/tasks/not-toml.toml: not valid TOML: ") for line in lines)
    assert len(lines) == len(expected) + 1


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new))


@pytest.mark.parametrize(
    "file, old, new, message",
    [
        ("suite.toml", "trials = 4", "trials = 1", "suite.toml: k: k = 2 exceeds trials = 1; raise trials or drop k = 2"),
        ("suite.toml", "trials = 4", 'trials = "four"', "suite.toml: trials: Input should be a valid integer"),
        ("suite.toml", 'image = "harness/tiny:latest"', 'imag = "x"', "suite.toml: imag: unknown key (did you mean 'image'?)"),
        ("suite.toml", 'image = "harness/tiny:latest"', 'image = "harness/tiny:latest"\nimage_tag = "x"',
         "suite.toml: image_tag: unknown key (did you mean 'image'?)"),
        ("suite.toml", '"sql/rows.sql"]', '"sql/rows.sql", "sql/gone.sql"]', "suite.toml: state_sql.2: no such file "),
        ("suite.toml", 'agent_cmd = ["true"]', 'agent_cmd = ["true"]\ndockerfile = "../Dockerfile"',
         "suite.toml: dockerfile: '../Dockerfile' is outside the suite directory"),
        ("sql/rows.sql", "INSERT INTO notes", "INSERT INTO nowhere", "suite.toml: state_sql.1: sql/rows.sql: SQL error: no such table: nowhere"),
        # a misspelt key inside an [[expect]] table (a member of a tagged union) gets its "did you mean"
        ("tasks/refund-one.toml", 'rows = [[1004, 2000]]', 'rowz = [[1004, 2000]]',
         "tasks/refund-one.toml: expect.0.rowz: unknown key (did you mean 'rows'?)"),
        ("tasks/refund-one.toml", 'rows = [[1004, 2000]]', 'rows = [[1004, 2000]]\ncount = 1',
         "tasks/refund-one.toml: expect.0: give exactly one of `rows` or `count`"),
        ("tasks/refund-one.toml", 'rows = [[1004, 2000]]', 'rows = [[1004]]',
         "tasks/refund-one.toml: expect.0.rows.0: 1 values but the query returns 2 columns (order_id, amount_cents)"),
        ("tasks/refund-one.toml", 'rows = [[1004, 2000]]', 'rows = [[1004, 2000], {order_id = 1}]',
         "tasks/refund-one.toml: expect.0.rows: rows must be all arrays (positional) or all tables"),
        ("tasks/refund-one.toml", 'rows = [{ to_addr = "ben@example.com" }]', 'rows = [{ addr = "ben@example.com" }]',
         "tasks/refund-one.toml: expect.1.rows.0: column(s) addr not in the query's columns (to_addr)"),
        ("tasks/refund-one.toml", 'rows = [[1004, 2000]]', 'rows = [[1004, 2024-06-15]]',
         "tasks/refund-one.toml: expect.0.rows: row 0: datetime.date(2024, 6, 15) is not a number, string or boolean"),
        ("tasks/refund-one.toml", 'query = "SELECT order_id, amount_cents FROM refunds"', 'query = "DELETE FROM refunds"',
         "tasks/refund-one.toml: expect.0.query: SQL error against the fixture: it writes; expectation queries must be read-only SELECTs"),
        ("tasks/refund-one.toml", 'id = "refund-one"', 'id = "Refund One"', "tasks/refund-one.toml: id: String should match pattern"),
        ("tasks/refund-one.toml", 'id = "refund-one"', 'id = "refund-two"',
         "tasks/refund-one.toml: id: 'refund-two' must equal the file stem 'refund-one'"),
        ("tasks/refund-one.toml", 'tags = ["refund"]', 'tags = ["refund"]\nfixture = "sql/none.sql"',
         "tasks/refund-one.toml: fixture: no such file "),
        ("tasks/refund-one.toml", 'tags = ["refund"]', 'tags = ["refund"]\nfixture = "/etc/passwd"',
         "tasks/refund-one.toml: fixture: '/etc/passwd' is outside the suite directory"),
        ("tasks/refund-one.toml", "VALUES (1, 'old@example.com', 'welcome')", "VALUES (1, 'old@example.com')",
         "tasks/refund-one.toml: fixture_sql: SQL error: table emails has 3 columns but 2 values were supplied"),
        ("tasks/refund-one.toml", 'unchanged = ["orders"]', 'unchanged = ["orders", "refunds"]',
         "tasks/refund-one.toml: (top level): table(s) refunds are both in `unchanged` and `allow`"),
        ("tasks/refund-one.toml", '"notes.body"]', '"notes.body.x"]',
         "tasks/refund-one.toml: allow: 'notes.body.x' is not 'table' or 'table.column'"),
        ("tasks/refund-one.toml", 'memory = "512m"', 'memory = "lots"', "tasks/refund-one.toml: envelope.memory: "),
        ("tasks/more/cancel-one.toml", "ordered = true", "ordered = 3", "tasks/more/cancel-one.toml: expect.0.ordered: Input should be a valid boolean"),
        ("tasks/more/cancel-one.toml", "count = 0", "count = -1", "tasks/more/cancel-one.toml: expect.1.count: Input should be greater than or equal to 0"),
        ("sql/cancel-one.sql", "'cy', 'placed', 700", "'cy', 'placed'", "tasks/more/cancel-one.toml: fixture: SQL error: "),
    ],
)
def test_each_error_names_file_and_key(tiny_copy, file, old, new, message):
    _edit(tiny_copy / file, old, new)
    lines = errors_of(tiny_copy)
    prefix = str(tiny_copy) + "/"
    assert any(line.startswith(prefix) and message in line for line in lines), "\n".join(lines)
    assert all(line.startswith(prefix) for line in lines)


def test_duplicate_ids_across_subdirectories(tiny_copy):
    shutil.copy(tiny_copy / "tasks" / "refund-one.toml", tiny_copy / "tasks" / "more" / "refund-one.toml")
    lines = errors_of(tiny_copy)
    assert lines == [
        f"{tiny_copy}/tasks/refund-one.toml: id: duplicate task id 'refund-one' (also in {tiny_copy}/tasks/more/refund-one.toml)"
    ]


def test_no_tasks(tiny_copy):
    shutil.rmtree(tiny_copy / "tasks")
    assert errors_of(tiny_copy) == [f"{tiny_copy}/tasks: no task files (tasks/*.toml)"]


def test_missing_suite_toml(tiny_copy):
    (tiny_copy / "suite.toml").unlink()
    with pytest.raises(SuiteError, match="suite.toml: missing"):
        load_suite(str(tiny_copy))


def test_agent_env_rejects_reserved_names(tiny_copy):
    _edit(tiny_copy / "suite.toml", 'TINY_MODE = "test"', 'HARNESS_SEED = "1"')
    assert "suite.toml: agent_env: 'HARNESS_SEED' is not allowed" in "\n".join(errors_of(tiny_copy))


def test_every_builtin_suite_loads():
    for name in builtin_suites():
        s = load_suite(name)
        assert s.tasks, name
        # one image per suite, or one per task (a Harbor-format suite such as ops)
        assert (s.dockerfile_path is not None and s.dockerfile_path.is_file()) or all(t.build is not None for t in s.tasks), name
        assert all(k <= s.trials for k in s.k)


def test_a_value_where_toml_wants_a_list_says_the_form_it_takes():
    from pydantic import ValidationError

    from harness.model.suite import Task
    from harness.model.units import format_validation_error

    with pytest.raises(ValidationError) as e:  # [expect] written with one pair of brackets
        Task.model_validate({"id": "t", "title": "t", "prompt": "p", "expect": {"name": "x", "query": "SELECT 1", "rows": [[1]]}})
    assert format_validation_error("tasks/t.toml", e.value, Task, short={"expect"}) == (
        "tasks/t.toml: expect: Input should be a valid list (write each expectation as its own [[expect]] table, with two brackets)")


def test_a_misspelt_required_key_is_one_line_with_its_suggestion(tiny_copy):
    # `quary` for `query` in an [[expect]] table: the unknown key says what to fix; "query:
    # Field required" beside it only repeats the same mistake as a second problem
    _edit(tiny_copy / "tasks" / "refund-one.toml", 'query = "SELECT order_id', 'quary = "SELECT order_id')
    assert errors_of(tiny_copy) == [f"{tiny_copy}/tasks/refund-one.toml: expect.0.quary: unknown key (did you mean 'query'?)"]


def test_a_missing_field_is_kept_when_no_unknown_key_suggests_it():
    from pydantic import ValidationError

    from harness.model.suite import Task
    from harness.model.units import format_validation_error

    def lines(expect: dict) -> list[str]:
        with pytest.raises(ValidationError) as e:
            Task.model_validate({"id": "t", "title": "t", "prompt": "p", "expect": [expect]})
        return format_validation_error("tasks/t.toml", e.value, Task, short={"expect"}).splitlines()

    # `rowz` suggests `rows`, not the missing `query`: both are problems of their own
    assert lines({"name": "x", "rowz": [[1]]}) == [
        "tasks/t.toml: expect.0.rowz: unknown key (did you mean 'rows'?)",
        "tasks/t.toml: expect.0.query: Field required",
    ]
    # the same misspelling in another table does not hide this one's missing query
    with pytest.raises(ValidationError) as e:
        Task.model_validate({"id": "t", "title": "t", "prompt": "p",
                             "expect": [{"name": "x", "quary": "SELECT 1", "rows": [[1]]}, {"name": "y", "rows": [[1]]}]})
    assert format_validation_error("tasks/t.toml", e.value, Task, short={"expect"}).splitlines() == [
        "tasks/t.toml: expect.0.quary: unknown key (did you mean 'query'?)",
        "tasks/t.toml: expect.1.query: Field required",
    ]
