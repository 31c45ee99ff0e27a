"""The new-user bugs of issue 13 (item 8), each as a test that failed before its fix."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.engine.prepare import effective_profile
from harness.engine.profiles import load_profile
from harness.engine.suites import load_suite
from harness.model.errors import ProfileError, SuiteError

runner = CliRunner()
PROBE = Path(__file__).parent / "suites" / "probe"
ROOT = Path(__file__).parent.parent


def probe_copy(tmp_path: Path) -> Path:
    d = tmp_path / "mine"
    shutil.copytree(PROBE, d)
    return d


def test_envelope_that_does_not_fit_the_profile_names_the_task_file(tmp_path):
    d = probe_copy(tmp_path)
    task = d / "tasks" / "append.toml"
    # valid alone (2 CPUs is a fine override), invalid with the standard profile's 1 core
    task.write_text(task.read_text().replace('allow = ["log"]', 'allow = ["log"]\n\n[envelope]\ncpus = 2.0\n'))
    suite = load_suite(d)
    t = next(t for t in suite.tasks if t.id == "append")
    with pytest.raises(ProfileError) as e:
        effective_profile(load_profile("standard"), t, True)
    assert str(task) in str(e.value) and "does not fit profile 'standard'" in str(e.value)
    assert "Traceback" not in str(e.value) and "\n" not in str(e.value)
    r = runner.invoke(app, ["suites", "show", str(d), "--json"])
    assert r.exit_code == 0, r.output
    tasks = {x["id"]: x for x in json.loads(r.stdout)["tasks"]}
    assert "does not fit profile 'standard'" in tasks["append"]["envelope_error"]
    assert "envelope_error" not in tasks["extra-effect"]


def test_task_without_expectations_is_refused(tmp_path):
    d = probe_copy(tmp_path)
    task = d / "tasks" / "append.toml"
    text = task.read_text()
    text = re.sub(r"\[\[expect\]\].*", "", text, flags=re.S).replace('unchanged = ["audit"]\n', "")
    task.write_text(text)
    with pytest.raises(SuiteError, match="no expectations"):
        load_suite(d)


def test_make_eval_builds_the_users_suite_images():
    mk = (ROOT / "Makefile").read_text()
    assert re.search(r"^suite-images: setup\n\t@\$\(HARNESS\) images build --suite \$\(SUITE\)$", mk, re.M)
    assert re.search(r"^eval: suite-images$", mk, re.M) and re.search(r"^gate: suite-images$", mk, re.M)


def _report_of(tmp_path, marks: dict[str, str], ks=(1, 2)):
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_gate_cli import add_run  # one store-filling helper for the CLI tests

    from harness.store.store import Store

    url = f"sqlite:///{tmp_path}/h.db"
    store = Store.open(url)
    add_run(store, "r1", marks, ks=ks)
    return store, url


def test_junit_failures_carry_the_graders_reason(tmp_path):
    from harness.model.attempt import AttemptRecord

    store, url = _report_of(tmp_path, {"t1": "✓", "t2": "✓✓"})
    reason = "expect refunds: 2 rows, expected 1 (a second refund of 7999 for order 1005)"
    store.add_attempt(AttemptRecord(run_id="r1", task_id="t1", slot=1, attempt_no=1, seed=1, verdict="clean",
                                    outcome="fail", failure_kind="wrong_state", grade_reason=reason))
    r = runner.invoke(app, ["report", "r1", "--format", "junit", "--db", url])
    assert r.exit_code == 0, r.output
    fail = ET.fromstring(r.stdout).find(".//testcase[@name='t1']/failure")
    assert reason in fail.get("message") and reason in fail.text


def test_discarded_table_has_no_empty_column(tmp_path):
    _, url = _report_of(tmp_path, {"t1": "✓·", "t2": "✓✓"})
    r = runner.invoke(app, ["report", "r1", "--format", "markdown", "--db", url])
    assert r.exit_code == 0, r.output
    head = next(line for line in r.stdout.splitlines() if line.startswith("| task | discarded"))
    assert head.rstrip().endswith("| reasons |") and "|  |" not in head


def test_sweep_figure_counts_have_whole_ticks():
    from harness.report.figures import fig_sweep

    rows = [{"profile": f"p{i}", "timeouts": i, "oom_killed": 0, "metrics": {"pass@1": {"estimate": 0.5, "low": 0.4, "high": 0.6}}}
            for i in range(3)]
    fig = fig_sweep(rows, [1])
    assert fig.layout.yaxis2.tickformat == "d" and fig.layout.yaxis2.dtick == 1


def test_junit_fails_a_task_short_of_k_that_already_failed(tmp_path):
    # 2 clean trials, both failed, k = 4: pass^4 < 1 whatever the missing trials would do
    _, url = _report_of(tmp_path, {"t1": "✗✗··", "t2": "✓✓··", "t3": "✓✓✓✓"}, ks=(1, 4))
    r = runner.invoke(app, ["report", "r1", "--format", "junit", "--k", "4", "--db", url])
    assert r.exit_code == 0, r.output
    root = ET.fromstring(r.stdout)
    assert "2 of 2 clean trial(s) failed" in root.find(".//testcase[@name='t1']/failure").get("message")
    # all passing but short of k because slots ended unmeasured: an error (unmeasured), neither a pass nor a skip
    t2 = root.find(".//testcase[@name='t2']/error")
    assert "all passing" in t2.get("message") and t2.get("type") == "unmeasured"
    assert root.find(".//testcase[@name='t2']/skipped") is None and root.find(".//testcase[@name='t2']/failure") is None
    assert root.find(".//testcase[@name='t3']/failure") is None
    r4 = runner.invoke(app, ["gate", "r1", "--per-task", "pass@1>=0:0.5", "--confidence", "0.95", "--db", url])
    assert r4.exit_code == 2 and "give --require" in r4.output


def test_junit_is_well_formed_xml_whatever_a_grade_reason_holds(tmp_path):
    from harness.model.attempt import AttemptRecord

    store, url = _report_of(tmp_path, {"t1": "✓", "t2": "✓✓"})
    reason = "bad \ufffe\uffff \x01\x0b\x1f end"  # each forbidden by XML 1.0
    store.add_attempt(AttemptRecord(run_id="r1", task_id="t1", slot=1, attempt_no=1, seed=1, verdict="clean",
                                    outcome="fail", failure_kind="wrong_state", grade_reason=reason))
    out = tmp_path / "junit.xml"
    r = runner.invoke(app, ["report", "r1", "--format", "junit", "--out", str(out), "--db", url])
    assert r.exit_code == 0, r.output
    fail = ET.fromstring(out.read_bytes()).find(".//testcase[@name='t1']/failure")  # a strict parser reads it
    assert fail is not None and "bad " in fail.get("message") and " end" in fail.text
    assert not {"\ufffe", "\uffff", "\x01", "\x0b", "\x1f"} & set(fail.text + fail.get("message"))
