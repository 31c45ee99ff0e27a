"""The HTML report's failure review: which attempts it picks, its caps, the pairing with a
passing attempt, how artifacts are cut, and how agent-controlled text is escaped.

Runs are built from AttemptRecords in memory (``build_report`` is pure); artifact folders are
real files under tmp_path. The page's script is exercised in headless Chromium by
tests/test_html_chromium.py."""

from __future__ import annotations

import json
import os
import time
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

import harness.report.review as review
from harness.cli import app
from harness.model.attempt import AttemptRecord
from harness.model.run import RunRecord
from harness.report.artifacts import read_artifacts, read_capped
from harness.report.build import build_report
from harness.report.render import render_html, script_json
from harness.report.review import ReviewLimits, pick_failed, plan_review, read_review_artifacts, review_html, review_sections
from harness.report.views import Thresholds
from harness.store.store import Store

INJECT = "</script><script>window.pwned=1</script><img src=x onerror=alert(1)>"
KINDS = {"✓": ("pass", None), "W": ("fail", "wrong_state"), "C": ("fail", "crashed"), "T": ("fail", "timeout"),
         "O": ("fail", "oom_killed"), "U": ("fail", "ungradable")}


def make_run(tasks: dict[str, str], tmp: Path | None = None, *, max_reruns: int = 1, **attempt_kw):
    """A run whose task t has one slot per mark of tasks[t] (KINDS; '·' = unmeasured: every
    attempt discarded); each attempt gets an artifacts folder under ``tmp`` when given."""
    trials = max(len(m) for m in tasks.values())
    run = RunRecord(id="r1", suite="s", suite_hash="h", image="i", profile="standard", harness_version="v", trials=trials,
                    ks=[1], max_reruns=max_reruns, task_ids=list(tasks), status="complete", seed=0)
    atts: list[AttemptRecord] = []

    def add(task: str, slot: int, no: int, **kw) -> AttemptRecord:
        aid = len(atts) + 1
        folder = ""
        if tmp is not None:
            d = tmp / f"a{aid}"
            d.mkdir()
            (d / "transcript.jsonl").write_text(json.dumps({"type": "thought", "text": f"attempt {aid}"}) + "\n")
            (d / "stdout.txt").write_text(f"out {aid}\n")
            (d / "stderr.txt").write_text("")
            folder = str(d)
        a = AttemptRecord(id=aid, run_id="r1", task_id=task, slot=slot, attempt_no=no, seed=slot, artifacts=folder, wall_s=1.0,
                          **{**attempt_kw, **kw})
        atts.append(a)
        return a

    for task, marks in tasks.items():
        for slot, m in enumerate(marks):
            if m == "·":
                for no in range(1, max_reruns + 2):
                    add(task, slot, no, verdict="discarded", reasons=["host_cpu_contention"],
                        error="slot unmeasured" if no == max_reruns + 1 else None)
                continue
            outcome, kind = KINDS[m]
            add(task, slot, 1, verdict="clean", outcome=outcome, failure_kind=kind,
                grade_reason=None if outcome == "pass" else f"{task} slot {slot} wrong")
    return run, atts


def plan_of(tasks, tmp=None, limits=ReviewLimits(), **kw):
    run, atts = make_run(tasks, tmp, **kw)
    rep = build_report(run, atts).data()
    return rep, atts, plan_review(rep, atts, limits)


# ----------------------------------------------------------------------------- which attempts


def test_pick_failed_takes_one_of_each_kind_first_then_slot_order():
    a = [SimpleNamespace(id=i, slot=i, attempt_no=1, failure_kind=k) for i, k in enumerate(
        ["wrong_state", "wrong_state", "wrong_state", "timeout", "wrong_state", "crashed"])]
    assert [x.id for x in pick_failed(a, 3)] == [0, 3, 5]  # wrong_state, timeout, crashed: one example each
    assert [x.id for x in pick_failed(a, 4)] == [0, 1, 3, 5]
    assert [x.id for x in pick_failed(a, 10)] == [0, 1, 2, 3, 4, 5]
    assert pick_failed(a, 0) == []
    many = [SimpleNamespace(id=i, slot=i, attempt_no=1, failure_kind=k) for i, k in enumerate(["oom_killed", "timeout", "crashed", "wrong_state"])]
    assert [x.failure_kind for x in pick_failed(many, 2)] == ["crashed", "wrong_state"]  # FAILURE_KINDS order picks, slot order shows


def test_plan_orders_by_failures_pairs_a_passing_attempt_and_caps(tmp_path):
    rep, atts, plan = plan_of({"ok": "✓✓✓", "one": "✓W✓", "most": "WCWTW", "never": "WWW"},
                              limits=ReviewLimits(tasks=2, failed_per_task=3))
    assert [t.task for t in plan.tasks] == ["most", "never"]  # most failures first; 'ok' never failed
    assert plan.failing_tasks == 3 and plan.left_out_tasks == 1 and plan.left_out_failures == 1
    most = plan.tasks[0]
    assert most.failed_total == 5 and [a.failure_kind for a in most.failed] == ["wrong_state", "crashed", "timeout"]
    assert [a.slot for a in most.failed] == [0, 1, 3]
    assert most.passing is None and plan.tasks[1].passing is None  # no passing attempt to pair with
    assert plan.kinds == {"wrong_state": 7, "crashed": 1, "timeout": 1}

    rep, atts, plan = plan_of({"one": "W✓W✓"})
    t = plan.tasks[0]
    assert t.passing.slot == 1 and t.passing.outcome == "pass" and t.passing.verdict == "clean"
    assert [a.id for a in plan.attempts()] == [a.id for a in (*t.failed, t.passing)]  # the passing one once


def test_ties_keep_the_report_order_and_unmeasured_slots_are_listed_not_scored():
    rep, atts, plan = plan_of({"a": "W✓·", "b": "✓✓·", "c": "✓W✓"}, max_reruns=1)
    report_order = [t["task"] for t in rep["tasks"] if t["failed_trials"]]
    assert [t.task for t in plan.tasks] == report_order  # one failure each: report order (worst first)
    assert plan.unmeasured_total == 2 and {(u.task, u.slot) for u in plan.unmeasured} == {("a", 2), ("b", 2)}
    last = {(a.task_id, a.slot): a.id for a in atts if a.verdict == "discarded" and a.attempt_no == 2}
    assert all(u.last_attempt == last[(u.task, u.slot)] for u in plan.unmeasured)
    assert all(u.reasons == ["host_cpu_contention"] for u in plan.unmeasured)
    a = next(t for t in plan.tasks if t.task == "a")
    assert a.unmeasured == 1 and a.clean == 2 and a.passed == 1  # the unmeasured slot is neither pass nor fail
    assert "b" not in {t.task for t in plan.tasks}  # unmeasured only: listed below, not as failing
    # a discarded attempt is never the passing one
    disc_pass = AttemptRecord(id=99, run_id="r1", task_id="c", slot=0, attempt_no=0 + 1, seed=0, verdict="discarded", outcome="pass")
    plan2 = plan_review(rep, [disc_pass, *atts])
    assert next(t for t in plan2.tasks if t.task == "c").passing.id != 99


def test_a_huge_run_is_planned_in_one_pass_and_reads_only_what_it_shows(monkeypatch):
    n_tasks, trials = 2000, 50  # 10^5 attempts
    atts, rows = [], []
    for t in range(n_tasks):
        failed = []
        for s in range(trials):
            aid = len(atts) + 1
            ok = (s + t) % 3 == 0
            atts.append(SimpleNamespace(id=aid, task_id=f"t{t}", slot=s, attempt_no=1, verdict="clean", outcome="pass" if ok else "fail",
                                        failure_kind=None if ok else "wrong_state", artifacts=f"/nonexistent/{aid}"))
            if not ok:
                failed.append({"slot": s, "attempt_id": aid, "failure_kind": "wrong_state", "reason": "x"})
        rows.append({"task": f"t{t}", "marks": "", "c": trials - len(failed), "n": trials, "failure_kinds": {"wrong_state": len(failed)},
                     "failed_trials": failed, "unmeasured": []})
    rep = {"run": {"id": "big"}, "trials": trials, "tasks": rows, "unmeasured": []}
    t0 = time.perf_counter()
    plan = plan_review(rep, atts)
    assert time.perf_counter() - t0 < 5
    assert len(plan.tasks) == 50 and all(len(t.failed) == 3 and t.passing is not None for t in plan.tasks)
    assert plan.left_out_tasks == n_tasks - 50
    read: list[str] = []
    monkeypatch.setattr(review, "read_capped", lambda path, *a, **k: read.append(str(path)))
    read_review_artifacts(plan)
    assert len({Path(p).parent for p in read}) == 200  # 50 tasks x (3 failed + 1 passing), nothing else
    assert len(read) == 200 * 6


# ----------------------------------------------------------------------------- artifacts


def test_read_capped_keeps_the_start_and_end_at_line_boundaries(tmp_path):
    p = tmp_path / "t.jsonl"
    lines = [json.dumps({"step": i, "text": "x" * 50}) for i in range(5000)]
    p.write_text("\n".join(lines) + "\n")
    c = read_capped(p, 64 * 1024, head_share=0.25, controls=True)
    assert c.size == p.stat().st_size and c.truncated and c.omitted == c.size - len(c.head) - len(c.tail)
    assert len(c.head) <= 16 * 1024 and len(c.tail) <= 48 * 1024 and c.kept <= 64 * 1024
    assert c.head.startswith(lines[0]) and c.head.endswith("\n") and c.tail.endswith(lines[-1] + "\n")
    assert all(line in lines for line in (c.head + c.tail).splitlines())  # whole lines only
    small = tmp_path / "s.txt"
    small.write_text("a\x1b[31mred\n")
    assert read_capped(small, 100).head == "a\ufffd[31mred\n" and not read_capped(small, 100).truncated  # escape sequences replaced
    assert read_capped(small, 100, controls=True).head == "a\x1b[31mred\n"
    tail = read_capped(p, 1000)
    assert tail.head == "" and tail.tail.endswith(lines[-1] + "\n") and "\n" not in tail.tail[:-1].split("\n")[0]
    assert read_capped(tmp_path / "absent", 10) is None


def test_a_line_longer_than_its_share_of_the_cap_is_cut_inside_never_dropped(tmp_path):
    p = tmp_path / "t.jsonl"  # a big tool result between small lines: the line a reader wants
    big = json.dumps({"role": "tool", "content": "B" * 200_000})
    p.write_text('{"role": "user", "content": "hi"}\n' + big + '\n{"role": "assistant", "content": "done"}\n')
    c = read_capped(p, 64 * 1024, head_share=0.25, controls=True)
    assert c.truncated and c.kept > 60 * 1024  # was 556 bytes: both cuts fell back to the small lines
    assert c.head.startswith('{"role": "user"') and '{"role": "tool", "content": "BBB' in c.head
    assert c.tail.endswith('{"role": "assistant", "content": "done"}\n') and c.tail.startswith("BBB")


def test_read_capped_opens_only_regular_files(tmp_path):
    secret = tmp_path / "host-file"
    secret.write_text("host data")
    (tmp_path / "link").symlink_to(secret)
    os.mkfifo(tmp_path / "fifo")
    assert read_capped(tmp_path / "link", 100) is None  # a symlink is never followed
    assert read_capped(tmp_path / "fifo", 100) is None  # and a FIFO never waited on
    assert read_capped(tmp_path, 100) is None
    arts = tmp_path / "arts"
    arts.mkdir()
    (arts / "stdout.txt").symlink_to(secret)
    assert read_artifacts(str(arts))["tails"]["stdout.txt"] is None


def test_artifacts_are_capped_per_file_and_per_page(tmp_path):
    rep, atts, plan = plan_of({"a": "WWW✓", "b": "WW✓"}, tmp_path)
    big = Path(plan.tasks[0].failed[0].artifacts)
    (big / "transcript.jsonl").write_text("".join(json.dumps({"i": i, "pad": "y" * 100}) + "\n" for i in range(3000)))
    (big / "stdout.txt").write_text("z" * 100_000 + "\nlast line\n")
    (big / "verifier-stdout.txt").write_text("verifier says no\n")
    lim = ReviewLimits(transcript_bytes=4096, tail_bytes=512)
    art = read_review_artifacts(plan, lim)
    f = art.files[plan.tasks[0].failed[0].id]
    assert f["transcript.jsonl"].kept <= 4096 and f["transcript.jsonl"].truncated
    assert f["stdout.txt"].kept <= 512 and f["stdout.txt"].tail.endswith("last line\n")
    assert f["verifier-stdout.txt"].head == "verifier says no\n" and f["grade-stderr.txt"] is None
    page = review_html(plan, art, Thresholds(), lim)
    markup = page.split('class="review-data"')[0]
    assert "verifier output: stdout (tail)" in markup and "grader stderr" not in markup  # an optional file only when present
    assert "KiB kept" in page  # the cut is said
    # a page budget for one attempt's files: the rest are not embedded, and say so
    tight = ReviewLimits(transcript_bytes=4096, tail_bytes=512, page_bytes=len(art.json[plan.attempts()[0].id]))
    art2 = read_review_artifacts(plan, tight)
    assert list(art2.json) == [plan.attempts()[0].id] and len(art2.skipped) == len(plan.attempts()) - 1
    page = review_html(plan, art2, Thresholds(), tight)
    assert "budget for artifacts is spent" in page and f"harness show {plan.attempts()[1].id}" in page


def test_a_missing_folder_says_so(tmp_path):
    rep, atts, plan = plan_of({"a": "W✓"}, tmp_path)
    gone = plan.tasks[0].failed[0]
    for p in Path(gone.artifacts).iterdir():
        p.unlink()
    Path(gone.artifacts).rmdir()
    page = review_html(plan, read_review_artifacts(plan), Thresholds())
    assert "artifacts folder is gone" in page


# ----------------------------------------------------------------------------- escaping


def test_script_json_cannot_end_its_script_element():
    s = {"x": INJECT + "<!-- \u2028\u2029 & \ud800 end", "y": ["</SCRIPT>", ">"]}
    out = script_json(s)
    assert not set(out) & set("<>&\u2028\u2029") and out.isascii()
    assert json.loads(out) == s


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.stack: list[str] = []
        self.scripts: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self.stack.append(tag)

    def handle_endtag(self, tag):
        if self.stack and self.stack[-1] == tag:
            self.stack.pop()

    def handle_data(self, data):
        (self.scripts if self.stack and self.stack[-1] == "script" else self.text).append(data)


def test_agent_text_is_escaped_in_the_markup_and_the_data_block(tmp_path):
    run, atts = make_run({"t": "W✓"}, tmp_path)
    bad = atts[0].model_copy(update={
        "grade_reason": f"reason {INJECT}",
        "grade_checks": [{"name": f"check {INJECT}", "kind": "expect", "passed": False, "detail": INJECT}],
        "state_diff": {"tables": [{"table": INJECT, "status": "changed", "counts": {"added": 1}}], "tables_total": 1,
                       "lines": [f"row {INJECT}"], "lines_total": 1},
        "error": INJECT,
    })
    (Path(bad.artifacts) / "transcript.jsonl").write_text(json.dumps({"role": "user", "content": INJECT}) + "\n" + INJECT + "\n")
    (Path(bad.artifacts) / "stdout.txt").write_text(INJECT + "\n")
    atts = [bad, *atts[1:]]
    rep = build_report(run, atts).data()
    html = render_html(rep, extra_sections=review_sections(rep, atts))
    assert INJECT not in html and "<img" not in html and "window.pwned=1</script>" not in html
    p = Page()
    p.feed(html)
    assert not [t for t, _ in p.tags if t == "img"]
    scripts = [a for t, a in p.tags if t == "script"]
    assert scripts == [{"type": "application/json", "class": "review-data"}, {}]  # only the review's own two
    # what the agent wrote is in the text, exactly, once unescaped by the parser
    text = "".join(p.text)
    assert f"reason {INJECT}" in text and f"row {INJECT}" in text and f"check {INJECT}" in text
    # and in the data block, as capped text, read back exactly (the page parses the JSON lines)
    data = json.loads(p.scripts[0])
    tr = data["attempts"][str(bad.id)]["files"]["transcript.jsonl"]
    assert tr["head"] == json.dumps({"role": "user", "content": INJECT}) + "\n" + INJECT + "\n" and tr["omitted"] == 0
    assert data["attempts"][str(bad.id)]["files"]["stdout.txt"]["head"].startswith("</script>")


def test_the_section_through_the_cli_names_what_it_left_out(tmp_path):
    url = f"sqlite:///{tmp_path}/h.db"
    store = Store.open(url)
    run, atts = make_run({f"t{i}": "W" * (i + 1) + "✓" for i in range(4)}, tmp_path)
    store.add_run(run.model_copy(update={"id": "rv"}))
    for a in atts:
        store.add_attempt(a.model_copy(update={"id": None, "run_id": "rv"}))
    out = tmp_path / "r.html"
    r = CliRunner().invoke(app, ["report", "rv", "--format", "html", "--out", str(out), "--db", url])
    assert r.exit_code == 0, r.output
    page = out.read_text(encoding="utf-8")
    assert '<section id="review"><h2>Failure review</h2>' in page
    assert page.index('id="figures"') < page.index('id="review"')
    assert page.count('<details class="rattempt"') == 3 + 3 + 2 + 1  # at most 3 failed attempts per task
    assert "showing 3 of 4 failed attempts" in page and "harness trials rv --task t3 --outcome fail" in page
    assert page.count('class="side side-pass"') == 9  # each beside the task's passing attempt
    markup, data = page.split('class="review-data"')
    assert "out 1" not in markup and '"head":"out 1\\n"' in data  # a tail is in the data block, shown when opened


def test_no_failure_no_attempt_shown(tmp_path):
    rep, atts, plan = plan_of({"a": "✓✓"}, tmp_path)
    page = review_html(plan, read_review_artifacts(plan), Thresholds())
    assert "No failing attempt" in page and "rattempt" not in page.split("<script>")[0]


def test_saturation_rows_flag_what_is_over_its_threshold():
    a = AttemptRecord(id=1, run_id="r", task_id="t", slot=0, attempt_no=1, seed=0, verdict="clean", outcome="fail",
                      failure_kind="oom_killed", memory_peak=250 * 2**20, memory_max=256 * 2**20, oom_kills=1, throttled_share=0.5,
                      throttled_us=500_000, cpu_usage_us=400_000, agent_wall_s=1.0, envelope={"cpus": 1.0},
                      counters={"oom_events": 2, "wall_s": 1.0}, pids_peak=3, pids_max=64, pids_limit_hits=0)
    rows = {k: (v, hot) for k, v, hot in review.saturation_rows(a, Thresholds())}
    assert rows["memory peak / limit"] == ("250 MiB / 256 MiB (97.7%)", True)
    assert rows["OOM events / kills"] == ("2 / 1", True)
    assert rows["CPU throttled"][1] is True and rows["CPU throttled"][0].startswith("0.500 s (50.0% of wall)")
    assert rows["pids peak / limit / refused forks"] == ("3 / 64 / 0", False)
    assert rows["block I/O read / written"] == ("- / -", False)  # not measured, never 0


@pytest.mark.parametrize("limits", [ReviewLimits(tasks=0), ReviewLimits(failed_per_task=1, unmeasured=0)])
def test_limits_of_zero_show_nothing_of_that_kind(limits):
    rep, atts, plan = plan_of({"a": "WW✓·"}, limits=limits)
    if limits.tasks == 0:
        assert plan.tasks == [] and plan.left_out_tasks == 1
    else:
        assert len(plan.tasks[0].failed) == 1 and plan.unmeasured == [] and plan.unmeasured_total == 1


def test_the_plotly_bundle_ships_compressed_and_whole():
    import base64
    import gzip
    import re as _re

    from plotly.offline import get_plotlyjs

    from harness.report.figures import head_html

    head = head_html()
    m = _re.search(r'<script type="application/gzip\+base64" id="harness-plotly-gz">([A-Za-z0-9+/=]+)</script>', head)
    assert m and gzip.decompress(base64.b64decode(m.group(1))).decode() == get_plotlyjs()
    assert len(head) < len(get_plotlyjs()) / 2
