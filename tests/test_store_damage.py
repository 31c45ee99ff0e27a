"""A store changed outside harness, and the small things a reader meets (no engine needed):
every reading command ends a damaged store in one line (exit 2), never a traceback; an
--otlp URL's credentials do not silently replace an authorization header; a --db that is a
directory, an HTML page to a terminal, bidi overrides in agent output, a lock file read while
it is being written, a gate's advice for slots not run yet."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.engine import otel, scheduler
from harness.engine.scheduler import CpuPool
from harness.model.attempt import AttemptRecord
from harness.model.errors import UsageError
from harness.model.outcomes import TaskOutcomes
from harness.model.run import RunRecord
from harness.report.gate import check_measured
from harness.report.views import printable, tail_text
from harness.store.store import Store

runner = CliRunner()
HARNESS = str(Path(sys.executable).with_name("harness"))


def make_store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'h.db'}"
    s = Store.open(url)
    s.add_run(RunRecord(id="r1", suite="s", suite_hash="h", image="i", agent_cmd=["a"], profile="p", profile_json={},
                        trials=2, ks=[1], max_reruns=0, task_ids=["t"], harness_version="0", status="complete"))
    for slot in range(2):
        s.add_attempt(AttemptRecord(run_id="r1", task_id="t", slot=slot, attempt_no=1, seed=slot, verdict="clean", outcome="pass"))
    s.engine.dispose()
    return url


def tamper(url: str, table: str, column: str, value: object) -> None:
    c = sqlite3.connect(url.removeprefix("sqlite:///"))
    c.execute(f"UPDATE {table} SET {column} = ?", (value,))
    c.commit()
    c.close()


COMMANDS = [["report", "r1"], ["report", "r1", "--format", "json"], ["show", "1"], ["trials", "r1"],
            ["gate", "r1", "--require", "pass@1>=0.5"], ["runs"]]
DAMAGE = [("attempts", "reasons", "notjson"), ("attempts", "reasons", "123"), ("attempts", "node", "[1]"),
          ("attempts", "counters", "5"), ("attempts", "model_calls", "{}"), ("attempts", "phases", "notjson"),
          ("attempts", "verdict", "weird"), ("attempts", "wall_s", "xyz"), ("attempts", "started_at", "garbage"),
          ("runs", "ks", "5"), ("runs", "trials", "x"), ("runs", "host", "[]"),
          # integers where a report's read sends shared values back as small integers (codes):
          # never taken for one
          ("attempts", "verdict", 0), ("attempts", "outcome", 1), ("attempts", "node", 0), ("attempts", "reasons", 1),
          ("attempts", "upstream", 0),
          # a negative or infinite wall time: the JSON report printed -2.0 or null (an attack pass)
          ("attempts", "wall_s", -5.0), ("attempts", "wall_s", float("inf"))]


@pytest.mark.parametrize("table,column,value", DAMAGE)
def test_a_store_changed_outside_harness_ends_every_reader_in_one_line(tmp_path, table, column, value):
    url = make_store(tmp_path)
    ok = runner.invoke(app, ["report", "r1", "--db", url])
    assert ok.exit_code == 0, ok.output  # the undamaged store reads
    tamper(url, table, column, value)
    for cmd in COMMANDS:
        res = runner.invoke(app, [*cmd, "--db", url])
        if res.exit_code == 0:  # a reader that does not read the damaged column (runs lists runs only)
            assert cmd == ["runs"] or column in ("phases", "counters", "started_at") and cmd[0] in ("report", "gate"), (cmd, res.output)
            continue
        assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (cmd, res.output, res.exception)
        assert "changed outside harness or is damaged" in res.output, (cmd, res.output)
        assert "Traceback" not in res.output


def make_store_with_samples(tmp_path: Path) -> str:
    url = make_store(tmp_path)
    c = sqlite3.connect(url.removeprefix("sqlite:///"))
    c.executemany("INSERT INTO samples (attempt_id, t, cpu_usage_us, memory_current) VALUES (?, ?, ?, ?)",
                  [(1, 0.2 * i, 1000 * i, 4096) for i in range(1, 4)])
    c.commit()
    c.close()
    return url


# deeper damage: bytes that are not UTF-8, JSON holding the wrong things, values outside a
# field's range, an unknown vocabulary word, a sample holding text
DEEP = [("attempts", "error", "CAST(x'41ff' AS TEXT)"), ("attempts", "task_id", "CAST(x'41ff' AS TEXT)"),
        ("attempts", "failure_kind", "'weird'"), ("attempts", "reasons", "'[1, null]'"),
        ("attempts", "model_calls", "'[1, \"x\"]'"), ("attempts", "rules", "'[1]'"), ("attempts", "slot", "-1 - slot"),
        ("runs", "excluded", "'{\"t\": 5}'"), ("runs", "agent_cmd", "'[1, {}]'"), ("runs", "task_ids", "'[1, 2]'"),
        ("runs", "ks", "'[0]'"), ("runs", "ks", "'[1000]'"), ("runs", "ks", "'[\"a\"]'"), ("runs", "trials", "0"),
        ("samples", "t", "'x'"), ("samples", "memory_current", "x'00ff'"),
        ("attempts", "model_calls", "'[{\"provider\": \"openai\", \"started\": 1, \"tokens_in\": \"x\"}]'"),
        ("attempts", "model_calls", "'[{\"latency_s\": \"slow\"}]'"), ("runs", "profile_json", "'{\"cpus\": \"x\"}'"),
        ("runs", "profile_json", "'{\"memory\": [1]}'"), ("runs", "trials", "1000000000"),
        # from an attack pass: a negative or infinite wall time (the JSON report printed -2.0 or
        # null), rule items and an upstream summary of the wrong types, JSON nested past recursion
        ("attempts", "rules", "'[{\"rule\": [\"x\"], \"breached\": true, \"scope\": \"host\"}]'"),
        ("attempts", "upstream", "'{\"calls\": \"x\"}'"), ("attempts", "upstream", "'{\"models\": 5}'"),
        ("attempts", "reasons", "'" + "[" * 100_000 + "]" * 100_000 + "'")]


@pytest.mark.parametrize("table,column,sql", DEEP)
def test_deeper_damage_is_one_line_too(tmp_path, table, column, sql):
    url = make_store_with_samples(tmp_path)
    c = sqlite3.connect(url.removeprefix("sqlite:///"))
    c.execute(f"UPDATE {table} SET {column} = {sql}")
    c.commit()
    c.close()
    failed = set()
    for cmd in [*COMMANDS, ["report", "r1", "--format", "html", "--out", str(tmp_path / "r.html")], ["samples", "r1"],
                ["samples", "1", "--jsonl"]]:
        res = runner.invoke(app, [*cmd, "--db", url])
        assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit), (cmd, res.output, res.exception)
        if res.exit_code:
            assert res.exit_code == 2 and "changed outside harness or is damaged" in res.output, (cmd, res.output)
            assert "\x1b" not in res.output and "\udcff" not in res.output
            failed.add(cmd[0])
    # the commands that read the damaged table say so
    assert failed >= ({"samples", "show"} if table == "samples" else {"report", "trials"}), failed


@pytest.mark.parametrize("diff", ['{"files": {"total": "abc", "lines": [1, null]}}', '{"tables": 5, "lines": 7}',
                                  '{"tables": [{"table": "t", "status": "changed", "counts": "x", "added": 5, "key": 3}, 7],'
                                  ' "lines": [], "lines_total": "q"}', '[]'])
def test_a_state_diff_holding_the_wrong_things_is_left_out_never_a_traceback(tmp_path, diff):
    url = make_store(tmp_path)
    c = sqlite3.connect(url.removeprefix("sqlite:///"))
    c.execute("UPDATE attempts SET outcome = 'fail', failure_kind = 'wrong_state', grade_reason = 'r', state_diff = ?", (diff,))
    c.commit()
    c.close()
    for cmd in (["show", "1"], ["report", "r1", "--format", "html", "--out", str(tmp_path / "r.html")], ["report", "r1"], ["trials", "r1"]):
        res = runner.invoke(app, [*cmd, "--db", url])
        assert res.exception is None or isinstance(res.exception, SystemExit), (cmd, res.exception)
        assert res.exit_code == 0 or "changed outside harness or is damaged" in res.output, (cmd, res.output)


def test_samples_jsonl_is_json_whatever_the_store_holds(tmp_path):
    """A float column holding inf or NaN (SQLite keeps what it is given) came out as the
    non-JSON Infinity / NaN; such a value is now null (and empty in CSV)."""
    url = make_store_with_samples(tmp_path)
    c = sqlite3.connect(url.removeprefix("sqlite:///"))
    c.execute("UPDATE samples SET t = 9e999 WHERE id = 1")
    c.execute("UPDATE samples SET t = -9e999 WHERE id = 2")
    c.commit()
    c.close()
    res = runner.invoke(app, ["samples", "1", "--jsonl", "--db", url])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line, parse_constant=lambda x: pytest.fail(f"non-JSON {x}")) for line in res.stdout.splitlines()]
    ts = [r["t"] for r in rows]
    assert len(ts) == 3 and ts.count(None) == 2 and [t for t in ts if t is not None] == [pytest.approx(0.6)]
    res = runner.invoke(app, ["samples", "1", "--db", url])
    assert res.exit_code == 0 and "inf" not in res.stdout.lower()


def test_terminal_output_carries_text_and_colour_only(tmp_path):
    """Whatever a store holds, a terminal gets no escape sequence but colour, no bidi override."""
    url = make_store(tmp_path)
    evil = "\x1b]0;PWN\x07\x1b[2J\u202eRTL"
    c = sqlite3.connect(url.removeprefix("sqlite:///"))
    c.execute("UPDATE attempts SET grade_reason = ?, outcome = 'fail', failure_kind = 'wrong_state'", (evil,))
    c.execute("UPDATE runs SET note = ?", (evil,))
    c.commit()
    c.close()
    for cmd in (["show", "1"], ["report", "r1"], ["runs"], ["trials", "r1"]):
        primary, secondary = pty.openpty()
        try:
            p = subprocess.Popen([HARNESS, *cmd, "--db", url], stdout=secondary, stderr=secondary, env={**os.environ, "COLUMNS": "200"})
            os.close(secondary)
            chunks = []
            while True:
                try:
                    b = os.read(primary, 65536)
                except OSError:
                    break
                if not b:
                    break
                chunks.append(b)
            assert p.wait(timeout=120) == 0, cmd
        finally:
            os.close(primary)
        out = b"".join(chunks).decode("utf-8", "replace")
        assert "\x1b]" not in out and "\x1b[2J" not in out and "\u202e" not in out and "\x07" not in out, (cmd, out[-400:])
        other = [m for m in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]", out) if not m.endswith("m")]
        assert not other, (cmd, other)


def test_a_damaged_value_is_named_by_type_never_shown(tmp_path):
    """A stored string may be an agent's text: the line names its type, not its content."""
    url = make_store(tmp_path)
    tamper(url, "attempts", "wall_s", "\x1b[31mAGENT-TEXT")
    res = runner.invoke(app, ["show", "1", "--db", url])
    assert res.exit_code == 2 and "column wall_s holds a str" in res.output and "AGENT-TEXT" not in res.output


def test_a_db_that_is_a_directory_is_one_line(tmp_path):
    for cmd in (["runs"], ["report", "last"]):
        res = runner.invoke(app, [*cmd, "--db", f"sqlite:///{tmp_path}"])
        assert res.exit_code == 2 and "is a directory" in res.output and str(tmp_path / "harness.db") in res.output, res.output


def test_an_html_report_is_not_written_to_a_terminal(tmp_path):
    url = make_store(tmp_path)
    primary, secondary = pty.openpty()
    try:
        p = subprocess.run([HARNESS, "report", "r1", "--format", "html", "--db", url], stdout=secondary,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(secondary)
        os.close(primary)
    assert p.returncode == 2 and "--out report.html" in p.stderr, p.stderr
    piped = subprocess.run([HARNESS, "report", "r1", "--format", "html", "--db", url], capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stdout.lstrip().lower().startswith("<!doctype html"), piped.stderr


def test_url_credentials_beside_an_authorization_header_are_refused(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_HEADERS", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", raising=False)
    url = otel.traces_url("http://user:tok3n@127.0.0.1:4318")
    with pytest.raises(UsageError, match="carries credentials") as e:
        otel.parse_headers(["Authorization=Bearer s3cret"], url)
    assert "tok3n" not in str(e.value) and "s3cret" not in str(e.value)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20x")
    with pytest.raises(UsageError, match="carries credentials"):
        otel.parse_headers([], url)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_HEADERS")
    assert otel.parse_headers(["x-team=a"], url) == {"x-team": "a"}  # credentials in the URL alone are fine
    assert otel.parse_headers(["authorization=b"], otel.traces_url("http://127.0.0.1:4318")) == {"authorization": "b"}


def test_bidi_overrides_never_reach_the_terminal():
    s = "refund \u202eevil\u202c ok \u2066x\u2069 \u200fy \x1b[2J"
    out = printable(s)
    assert not any(ch in out for ch in "\u202e\u202c\u2066\u2069\u200f\x1b")
    assert out.startswith("refund \ufffdevil\ufffd ok")
    assert "\u202e" not in tail_text(s.encode())


def test_a_lock_file_being_taken_is_not_named_as_pid_unknown(tmp_path, monkeypatch):
    """A holder's name is written before the file is cut to length (never empty while held);
    a lock held over an empty file (a prober this instant) is left out of the waiting line."""
    monkeypatch.setenv("HARNESS_LOCK_DIR", str(tmp_path))
    core = sorted(os.sched_getaffinity(0))[0]
    fd = os.open(tmp_path / f"cpu{core}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"a much longer previous holder line than ours\nrun r-old\n")
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        watcher = CpuPool(cpus=[core])
        assert watcher.holders([core]) == {}  # held, nothing written yet: no "pid ?"
        pool = CpuPool(cpus=[core])
        pool.note = "r-new"
        pool._mark(core, fd)
        text = (tmp_path / f"cpu{core}.lock").read_text()
        assert text == f"{scheduler.controller_id()}\nrun r-new\n"  # cut to length: no tail of the longer line
        assert watcher.holders([core]) == {core: f"pid {os.getpid()} (run r-new)"}
    finally:
        os.close(fd)


def test_a_gate_advises_resume_for_slots_not_run_and_refill_for_spent_ones():
    spent = TaskOutcomes(task_id="a", trials=[], slots=["unmeasured", "unmeasured"])
    waiting = TaskOutcomes(task_id="b", trials=[], slots=["pending", "pending"])
    fine = TaskOutcomes(task_id="c", trials=[True, True], slots=["pass", "pass"])
    only_waiting = check_measured([waiting, fine])
    assert only_waiting is not None and not only_waiting.ok
    assert "--refill-unmeasured" not in only_waiting.message and "`harness run --resume RUN` runs them" in only_waiting.message
    both = check_measured([spent, waiting, fine])
    assert "1 spent their rerun budget" in both.message and "--refill-unmeasured" in both.message
    assert "1 have slots not run yet" in both.message
    assert check_measured([fine]) is None


def test_markdown_shows_an_agents_words_as_text(tmp_path):
    """Text from outside (a foreign task's id, a note, an error line) reaches a report pasted
    as a PR comment: an image there is fetched by every viewer (a tracking pixel), a link or
    tag is live, an @name notifies that user, a | splits the table. All of it is shown as
    the characters it is."""
    url = make_store(tmp_path)
    evil = "![p](http://evil.example/p.png) <img src=x> [ok](javascript:alert(1)) @octocat `x` a|b\nnext"
    c = sqlite3.connect(url.removeprefix("sqlite:///"))
    c.execute("UPDATE attempts SET task_id = ?, outcome = 'fail', failure_kind = 'wrong_state'", (evil,))
    c.execute("UPDATE runs SET note = ?, task_ids = ?", (evil, json.dumps([evil])))
    c.commit()
    c.close()
    res = runner.invoke(app, ["report", "r1", "--format", "markdown", "--db", url])
    assert res.exit_code == 0, res.output
    md = res.stdout
    assert "octocat" in md and "evil.example" in md  # shown, not dropped
    for live in ("![", "<img", " @octocat", "`x`", "a|b", "\nnext"):
        assert live not in md, live
    assert not re.search(r"(?<!\\)\]\(", md), "a live link"
    rows = [line for line in md.splitlines() if "octocat" in line and line.startswith("|")]
    header = next(line for line in md.splitlines()[md.splitlines().index(rows[0]) - 5:] if line.startswith("| "))
    assert rows and all(r.replace("\\|", "").count("|") == header.count("|") for r in rows)


def test_an_attempt_of_no_slot_is_named_never_dropped_silently(tmp_path):
    """An attempt whose slot is beyond the run's trials, or whose task the run does not
    have, was left out of every figure without a word; the report now says so."""
    url = make_store(tmp_path)
    c = sqlite3.connect(url.removeprefix("sqlite:///"))
    c.execute("UPDATE attempts SET slot = 7 WHERE slot = 1")
    c.commit()
    c.close()
    res = runner.invoke(app, ["report", "r1", "--format", "json", "--db", url])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["warnings"][0].startswith("1 stored attempt(s) belong to no slot of this run") and "slot 7" in rep["warnings"][0]
    assert [t["n"] for t in rep["tasks"]] == [1]  # the stray is not scored


def test_show_prints_the_phases_with_the_lane_waits(tmp_path):
    url = make_store(tmp_path)
    phases = [{"name": "sandbox", "start_s": 0.0, "wall_s": 0.171}, {"name": "lane", "start_s": 0.171, "wall_s": 0.02},
              {"name": "agent", "start_s": "x", "wall_s": None}]
    tamper(url, "attempts", "phases", json.dumps(phases))
    res = runner.invoke(app, ["show", "1", "--db", url])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.stdout.splitlines() if "phases" in x)
    assert "sandbox +0.00 0.17s · lane +0.17 0.02s · agent +? ?s" in line


def test_a_named_database_in_a_folder_that_is_not_there_is_refused(tmp_path, monkeypatch):
    """A mistyped --db is not a new store in a new folder (as root, at the top of the disk);
    the default store's folder is made; an SQLite URI is read as the file it names."""
    from harness.model.errors import StoreError
    from harness.store.store import Store

    missing = tmp_path / "no" / "such"
    with pytest.raises(StoreError, match=f"folder {missing} does not exist; create it first") as e:
        Store.open(f"sqlite:///{missing}/h.db")
    assert not (tmp_path / "no").exists()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError) as e:
        Store.open("sqlite:///no/such/h.db")  # three slashes: relative
    assert "relative to the working directory" in str(e.value) and "sqlite:////no/such/h.db" in str(e.value)
    with pytest.raises(StoreError) as e:
        Store.open(str(tmp_path / "h.db"))  # a path, not a URL
    assert f"sqlite:///{tmp_path}/h.db" in str(e.value)
    with pytest.raises(StoreError, match="relative to the working directory"):
        Store.open("sqlite:///rel-missing.db", mode="ro")
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / "fresh" / "home"))
    monkeypatch.delenv("HARNESS_DB", raising=False)
    Store.open()  # the default store: its folder is made
    assert (tmp_path / "fresh" / "home" / "harness.db").is_file()
    Store.open(f"sqlite:///file:{tmp_path}/fresh/home/harness.db?mode=ro&uri=true", mode="ro")
    assert not any(p.name.startswith("file:") for p in tmp_path.rglob("*"))
