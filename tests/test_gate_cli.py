"""`harness gate` and `harness compare` through the CLI on a real SQLite store.

Exit codes: 0 every requirement holds, 1 one fails, 2 usage error (bad requirement,
k not measured, unknown run, mismatched identities without --allow-mismatch).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.report.gate import parse_per_task, parse_requirement
from harness.model.attempt import AttemptRecord
from harness.model.run import RunRecord
from harness.store.store import Store

OUTCOME = {"✓": ("pass", None), "✗": ("fail", "wrong_state"), "C": ("fail", "crashed"), "T": ("fail", "timeout")}
WORKED = {"t1": "✓✓✓✓✓", "t2": "✓✓✓✓✗", "t3": "✓✗✓✗✓", "t4": "✗✗✓✗✗"}


def add_run(store: Store, run_id: str, tasks: dict[str, str], *, ks=(1, 2, 5), minutes: int = 0, **overrides) -> None:
    """One slot per mark: ✓ pass, ✗ wrong_state, C crashed, T timeout, · unmeasured (2 discarded attempts)."""
    fields = dict(
        id=run_id, created_at=dt.datetime(2024, 1, 1) + dt.timedelta(minutes=minutes), status="complete",
        suite="refunds", suite_hash="sha-suite-1", image="harness/refunds:latest", image_digest="sha256:aaa",
        agent_cmd=["refundbot"], profile="standard", profile_json={"name": "standard", "cpus": 1.0, "memory": 536870912},
        harness_version="0.1.0", host={"hostname": "h1"}, cgroup_version="2",
        trials=max(len(m) for m in tasks.values()), ks=list(ks), max_reruns=1, task_ids=list(tasks),
    )
    fields.update(overrides)
    store.add_run(RunRecord(**fields))
    for task, marks in tasks.items():
        for slot, m in enumerate(marks):
            if m == "·":
                for no in (1, 2):
                    store.add_attempt(AttemptRecord(run_id=run_id, task_id=task, slot=slot, attempt_no=no, seed=slot,
                                                 verdict="discarded", reasons=["host_steal"]))
                continue
            outcome, kind = OUTCOME[m]
            store.add_attempt(AttemptRecord(run_id=run_id, task_id=task, slot=slot, attempt_no=1, seed=slot,
                                         verdict="clean", outcome=outcome, failure_kind=kind))


@pytest.fixture()
def db(tmp_path):
    url = f"sqlite:///{tmp_path}/h.db"
    store = Store.open(url)
    add_run(store, "worked", WORKED)
    return store, url


runner = CliRunner()


def gate(url: str, *args: str):
    return runner.invoke(app, ["gate", *args, "--db", url])


def compare(url: str, *args: str):
    return runner.invoke(app, ["compare", *args, "--db", url])


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text, metric, op, value",
    [("pass^4>=0.9", "pass^4", ">=", 0.9), ("pass@1 > .5", "pass@1", ">", 0.5), ("pass@8<=1", "pass@8", "<=", 1.0),
     ("pass^2==1", "pass^2", "==", 1.0), ("pass^1<0.3", "pass@1", "<", 0.3)],
)
def test_parse_requirement(text, metric, op, value):
    r = parse_requirement(text)
    assert (r.metric, r.op, r.value) == (metric, op, value)


@pytest.mark.parametrize("text", ["pass^4=>0.9", "pass^4>=1.5", "pass^0>=0.5", "pass~4>=0.5", "pass^4>=", "pass^k>=0.9", "pass^4=0.9", ""])
def test_parse_requirement_rejects(text):
    with pytest.raises(ValueError):
        parse_requirement(text)


def test_parse_per_task():
    req, share = parse_per_task("pass^3==1:0.9")
    assert (req.metric, req.op, req.value, share) == ("pass^3", "==", 1.0, 0.9)
    for bad in ("pass^3==1", "pass^3==1:x", "pass^3==1:1.2"):
        with pytest.raises(ValueError):
            parse_per_task(bad)


# --------------------------------------------------------------------------- gate


def test_gate_passes_and_fails_with_the_shortfall(db):
    _, url = db
    r = gate(url, "worked", "--require", "pass@1>=0.6", "--require", "pass^5>=0.25")
    assert r.exit_code == 0, r.output
    assert "pass@1 = 0.650 >= 0.6" in r.stdout and "gate passed" in r.stdout

    r = gate(url, "worked", "--require", "pass@1>=0.6", "--require", "pass^5>=0.9")
    assert r.exit_code == 1, r.output
    assert "pass^5 = 0.250 < 0.9 (short by 0.650)" in r.stdout
    assert "FAIL pass^5>=0.9" in r.stdout and "1 of 2 check(s) unmet" in r.stdout

    r = gate(url, "worked", "--require", "pass@1<=0.5")
    assert r.exit_code == 1 and "pass@1 = 0.650 > 0.5 (over by 0.150)" in r.stdout
    r = gate(url, "worked", "--require", "pass^2==0.475", "--require", "pass@2>0.8")
    assert r.exit_code == 0, r.output


def test_gate_json_output(db):
    _, url = db
    r = gate(url, "last", "--require", "pass^5>=0.9", "--json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["checks"][0]["message"].startswith("pass^5 = 0.250 < 0.9")


def test_gate_accepts_any_k_up_to_trials(db):
    """A gate's k is declared in CI before the run, so any k <= trials is allowed."""
    _, url = db
    r = gate(url, "worked", "--require", "pass^3>=0.2", "--per-task", "pass^4==1:0.25")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    "args, needle",
    [
        (["worked", "--require", "pass^5=>0.9"], "expected METRIC OP VALUE"),
        (["worked", "--require", "pass^5>=1.2"], "outside [0, 1]"),
        (["worked", "--require", "pass^9>=0.5"], "exceeds the 5 trials"),
        (["worked", "--per-task", "pass^5==1"], "CONDITION:SHARE"),
        (["nosuchrun", "--require", "pass@1>=0.5"], "no such run"),
        (["worked", "--require", "pass@1>=0.5", "--baseline", "nosuchrun"], "no such run"),
        (["worked"], "nothing to check"),
    ],
)
def test_gate_usage_errors_exit_2(db, args, needle):
    _, url = db
    r = gate(url, *args)
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert len([line for line in r.stderr.splitlines() if line.strip()]) == 1  # one clear line


def test_gate_unmeasured_slots_are_not_counted(db):
    store, url = db
    add_run(store, "holes", {"a": "✓✓✓✓·", "b": "✓✓✓✓✓"}, ks=(1, 4), minutes=1)
    r = gate(url, "holes", "--require", "pass^4==1", "--per-task", "pass^4==1:1")
    assert r.exit_code == 0, r.output


def test_gate_fails_when_the_metric_cannot_be_computed(db):
    store, url = db
    add_run(store, "thin", {"a": "✓✓✓··", "b": "✓····"}, ks=(1, 4), minutes=1)
    r = gate(url, "thin", "--require", "pass^4>=0.5")
    assert r.exit_code == 1, r.output
    assert "pass^4 cannot be computed: no task has 4 clean trial(s)" in r.stdout
    r = gate(url, "thin", "--per-task", "pass^4==1:0.5")
    assert r.exit_code == 1 and "cannot be computed" in r.stdout
    # a task short of k counts at its worst: it cannot drop out and lift the mean
    add_run(store, "part", {"a": "✓✓✓✓✓", "b": "✓✓···"}, ks=(1, 4), minutes=2)
    r = gate(url, "part", "--require", "pass^4>=1")
    assert r.exit_code == 1 and "counted at their worst (0): b" in r.stdout and "pass^4 = 0.500" in r.stdout
    r = gate(url, "part", "--require", "pass^4>=0.5")
    assert r.exit_code == 0, r.output


def test_gate_per_task_rule(db):
    _, url = db
    # pass^5 == 1 holds for t1 only: 1 of 4 tasks = 25%
    assert gate(url, "worked", "--per-task", "pass^5==1:0.25").exit_code == 0
    r = gate(url, "worked", "--per-task", "pass^5==1:0.5")
    assert r.exit_code == 1, r.output
    assert "1 of 4 tasks (25.0%) reach pass^5 == 1 < required 50% (short by 1 task(s))" in r.stdout
    assert re.search(r"not reaching it: t2 \(0\.000\), t3 \(0\.000\), t4 \(0\.000\)", r.stdout)
    # pass@1 >= 0.6 per task: t1, t2, t3 -> 75%
    assert gate(url, "worked", "--per-task", "pass@1>=0.6:0.75").exit_code == 0
    assert gate(url, "worked", "--per-task", "pass@1>=0.6:0.8").exit_code == 1


def test_gate_baseline_regression_on_deterministic_tasks(db):
    store, url = db
    add_run(store, "base", {"t1": "✓✓✓✓✓", "t2": "✓✓✓✓✓", "t3": "✓✗✓✗✓", "t4": "✓✓✓✓✓"}, minutes=1)
    # t2 always passed in the baseline and now fails once; t3 was flaky (not held); t4 is unmeasured now
    add_run(store, "cand", {"t1": "✓✓✓✓✓", "t2": "✓✓C✓✓", "t3": "✗✗✗✗✗", "t4": "·····"}, minutes=2)
    r = gate(url, "cand", "--baseline", "base")
    assert r.exit_code == 1, r.output
    assert "1 task(s) that passed every trial in baseline base no longer do: t2" in r.stdout
    assert "t2: ✓✓✓✓✓ → ✓✓✗✓✓ (4/5)" in r.stdout
    assert "not checked (unmeasured in this run): t4" in r.stdout
    # a task the baseline held and this run does not have at all fails the check: the suite
    # lost it (else dropping a regressing task from the suite would pass the gate)
    add_run(store, "lost", {"t1": "✓✓✓✓✓", "t3": "✓✓✓✓✓"}, minutes=4, suite_hash="sha-suite-2")
    r = gate(url, "lost", "--baseline", "base")
    assert r.exit_code == 1, r.output
    assert "FAIL baseline base" in r.stdout and "2 task(s) that passed every trial in baseline base are not in this run" in r.stdout
    assert "not in this run: t2, t4" in r.stdout
    # the same tasks still deterministic: passes, and combines with --require
    add_run(store, "cand2", {"t1": "✓✓✓✓✓", "t2": "✓✓✓✓✓", "t3": "✗✗✗✗✗", "t4": "✓✓✓✓✓"}, minutes=3)
    r = gate(url, "cand2", "--baseline", "base", "--require", "pass@1>=0.7")
    assert r.exit_code == 0, r.output
    assert "all 3 task(s) that passed every trial in baseline base still do" in r.stdout
    r = gate(url, "cand2", "--baseline", "cand2")
    assert r.exit_code == 2


def test_gate_matches_how_the_makefile_calls_it(db):
    """`make gate` runs `harness run $(RUN_ARGS) $(foreach r,$(REQUIRE),--require '$(r)')`:
    run's --require is gate's (same parser, same judgement: tests/test_run_docker.py)."""
    store, url = db
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    target = makefile.split("\ngate:", 1)[1].split("\n\n", 1)[0]
    line = next(x for x in target.splitlines() if "$(HARNESS) run" in x)
    assert "$(RUN_ARGS)" in line and "--require '$(r)'" in line
    add_run(store, "0123456789abcdef", {"a": "✓✓✓✓", "b": "✓✓✓✓"}, ks=(1, 2, 4), minutes=5)
    require = "pass^4>=0.9 pass@1>=0.95"  # REQUIRE may hold several, space-separated
    args = shlex.split(" ".join(f"--require '{r}'" for r in require.split()))
    r = gate(url, "0123456789abcdef", *args)
    assert r.exit_code == 0, r.output
    assert r.stdout.count("ok  ") == 2


# --------------------------------------------------------------------------- compare


def test_compare_paired_on_common_tasks(db):
    store, url = db
    add_run(store, "better", {"t1": "✓✓✓✓✓", "t2": "✓✓✓✓✓", "t3": "✓✓✓✓✓", "t4": "✓✗✓✗✓", "t9": "✓✓✓✓✓"},
            minutes=1, image_digest="sha256:bbb", harness_version="0.2.0")
    r = compare(url, "worked", "better", "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["n_common"] == 4 and doc["only_in_a"] == [] and doc["only_in_b"] == ["t9"]
    deltas = {t["task"]: t["delta_pass1"] for t in doc["per_task"]}
    assert deltas == pytest.approx({"t1": 0.0, "t2": 0.2, "t3": 0.4, "t4": 0.4})
    p1 = doc["suite"][0]
    assert p1["metric"] == "pass@1" and p1["delta"] == pytest.approx(0.25) and p1["low"] <= 0.25 <= p1["high"]
    assert {s["metric"] for s in doc["suite"]} == {"pass@1", "pass@2", "pass^2", "pass@5", "pass^5"}
    assert doc["test"]["method"] == "stratified_permutation" and 0 < doc["test"]["p_value"] <= 1
    assert all(s["beyond_noise"] == (s["low"] > 0 or s["high"] < 0) == (s["p_value"] <= 0.05) for s in doc["suite"])
    assert doc["best_p"] < 0.05 and doc["cannot_be_significant"] is None  # 4 tasks of 5 trials could show a change
    # non-blocking identity differences are warnings
    assert any("image digest differs" in w for w in doc["identity"]["warnings"])
    assert any("harness version differs" in w for w in doc["identity"]["warnings"])
    assert "warning: image digest differs" in r.stderr

    t = compare(url, "worked", "better")
    assert t.exit_code == 0 and "only in B (1): t9" in t.stdout and "paired test" in t.stdout and "image digest differs" in t.stdout
    md = compare(url, "worked", "better", "--format", "markdown")
    assert md.exit_code == 0 and re.search(r"^\| metric \| A \| B \| Δ \|", md.stdout, re.M)


def test_compare_refuses_mismatched_suite_or_profile(db):
    store, url = db
    add_run(store, "other-suite", WORKED, minutes=1, suite_hash="sha-suite-2")
    add_run(store, "other-profile", WORKED, minutes=2, profile="tight",
            profile_json={"name": "tight", "cpus": 0.5, "memory": 536870912})
    r = compare(url, "worked", "other-suite")
    assert r.exit_code == 2
    assert "suite_hash differs: A sha-suite-1 vs B sha-suite-2" in r.output and "--allow-mismatch" in r.output
    r = compare(url, "worked", "other-profile")
    assert r.exit_code == 2
    assert "profile differs: A 'standard' vs B 'tight'" in r.output and "cpus 1.0 vs 0.5" in r.output
    r = compare(url, "worked", "other-profile", "--allow-mismatch", "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["identity"]["blocking"][0].startswith("profile differs")
    r = compare(url, "worked", "other-suite", "--allow-mismatch")
    assert r.exit_code == 0 and "compared despite: suite_hash differs" in r.stdout
    assert compare(url, "worked", "nosuch").exit_code == 2


def test_compare_with_nothing_in_common_is_a_usage_error(db):
    store, url = db
    add_run(store, "disjoint", {"zz": "✓✓✓✓✓"}, minutes=1)
    r = compare(url, "worked", "disjoint")
    assert r.exit_code == 2 and "share no task measured in both" in r.output


def test_gate_on_the_confidence_bound(db):
    store, url = db
    add_run(store, "allpass", {f"t{i}": "✓✓✓✓✓✓✓✓" for i in range(16)}, ks=(1, 4), minutes=1)
    r = gate(url, "allpass", "--require", "pass^4>=0.9", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["checks"][0]["bound"] is None
    r = gate(url, "allpass", "--require", "pass^4>=0.95", "--confidence", "0.95", "--json")
    doc = json.loads(r.stdout)["checks"][0]
    # 16 tasks x 8 trials all passing: the one-sided 95% lower bound of pass^4 is about 0.91 (32 tries' worth)
    assert r.exit_code == 1 and doc["estimate"] == 1.0 and 0.88 < doc["bound"] < 0.95 and doc["estimand"] == "tasks"
    r = gate(url, "allpass", "--require", "pass^4>=0.95")
    assert r.exit_code == 0, r.output  # the point estimate holds
    r = gate(url, "allpass", "--require", "pass^4>=0.85", "--confidence", "0.95")
    assert r.exit_code == 0 and "judged on the 95% lower bound" in r.stdout
    r = gate(url, "allpass", "--require", "pass^4>=0.9", "--estimand", "suite")
    assert r.exit_code == 2 and "pass --confidence too" in r.output
    r = gate(url, "allpass", "--require", "pass^4>=0.9", "--confidence", "1.5")
    assert r.exit_code == 2 and "between 0.5 and 1" in r.output


def test_gate_cannot_be_passed_by_tasks_that_dropped_out(db):
    store, url = db
    # one task measured 8/8, nine with no clean trial: no figure covers them, the gate fails
    add_run(store, "holes", {"good": "✓✓✓✓✓✓✓✓", **{f"u{i}": "········" for i in range(9)}}, ks=(1, 4), minutes=1)
    r = gate(url, "holes", "--require", "pass@1>=0.9")
    assert r.exit_code == 1 and "every task measured" in r.stdout and "9 of 10 task(s) have no clean trial" in r.stdout
    # a task short of k cannot show that it meets a per-task condition
    add_run(store, "short", {**{f"t{i}": "✓✓✓✓" for i in range(9)}, "bad": "✗✗··"}, ks=(1, 3), minutes=2)
    r = gate(url, "short", "--per-task", "pass^3==1:0.95")
    assert r.exit_code == 1 and "9 of 10 tasks" in r.stdout and "bad (short of k)" in r.stdout
    # == has no worst value: a task short of k fails it
    add_run(store, "eq", {"a": "✗✗✗", "b": "✓✓··"}, ks=(1, 3), minutes=3)
    r = gate(url, "eq", "--require", "pass^3==0")
    assert r.exit_code == 1 and "cannot show an exact value" in r.stdout


def test_gate_baseline_alone_still_needs_every_task_measured(db):
    store, url = db
    add_run(store, "base", {"t1": "✓✓✓", "t2": "✗✓✗"}, ks=(1,), minutes=1)
    # t1 held; t2 was not deterministic, so the baseline check passes -- but t2 is in no figure
    add_run(store, "cand", {"t1": "✓✓✓", "t2": "···"}, ks=(1,), minutes=2)
    r = gate(url, "cand", "--baseline", "base")
    assert r.exit_code == 1, r.output
    assert "ok   baseline base" in r.stdout and "FAIL every task measured" in r.stdout and "t2" in r.stdout


def test_gate_fails_an_interrupted_run_with_slots_not_run_unless_allowed(db):
    store, url = db
    # 4 trials planned; t2 ran 1 slot before the interruption: 3 are pending, not unmeasured
    add_run(store, "cut", {"t1": "✓✓✓✓", "t2": "✓"}, ks=(1,), minutes=1, status="interrupted", trials=4)
    r = gate(url, "cut", "--require", "pass@1>=0.9")
    assert r.exit_code == 1, r.output
    assert "FAIL every slot run" in r.stdout and "3 slot(s) of 1 task(s) have not run yet" in r.stdout
    assert "harness run --resume cut" in r.stdout and "t2: 3 not run" in r.stdout
    r = gate(url, "cut", "--require", "pass@1>=0.9", "--allow-incomplete", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["ok"] and any("interrupted" in n for n in doc["notes"])
    assert [c["name"] for c in doc["checks"]] == ["pass@1>=0.9"]
    # a run marked complete with slots missing cannot be resumed: the store lacks them
    add_run(store, "gap", {"t1": "✓✓✓✓", "t2": "✓"}, ks=(1,), minutes=2, trials=4)
    r = gate(url, "gap", "--require", "pass@1>=0.9")
    assert r.exit_code == 1 and "marked complete, yet 3 slot(s) of 1 task(s) have no attempt" in r.stdout, r.output
    assert "--resume" not in r.stdout.replace("cannot be resumed", "")


def test_run_require_refuses_a_k_above_the_trials_before_anything_runs(tmp_path):
    from conftest import run_cli

    r = run_cli(tmp_path, "run", "--suite", "refunds", "--trials", "2", "--k", "1,2", "--require", "pass^4>=0.9")
    assert r.returncode == 2 and "k=4 exceeds the 2 trials" in r.stderr, r.stderr
    assert not (tmp_path / "home" / "harness.db").exists()
    r = run_cli(tmp_path, "run", "--suite", "refunds", "--require", "pass^4 at least 0.9")
    assert r.returncode == 2 and "METRIC OP VALUE" in r.stderr, r.stderr
    r = run_cli(tmp_path, "run", "--resume", "last", "--require", "pass^1>=0.5")
    assert r.returncode == 2 and "harness gate RUN" in r.stderr, r.stderr
