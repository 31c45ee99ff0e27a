"""The built-in `refunds` suite: fixtures, tools, oracle solutions, and the reference agent.

For every task: the fixture builds; a hand-written oracle (real tool calls on a host copy of
the state) passes; doing nothing fails, and so does a plausible wrong action. Then refundbot
runs for seeds 0..7 on every task (host python, thinking scaled down) and must give the
intended mix of always / sometimes / never passing tasks. One docker test runs it the way
the runner will.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.engine.suites import load_suite
from harness.model.grade import Verdict
from harness.state import sqlite_grade
from harness.state.expectations import grade_spec
from harness.state.sqlite import build_fixture_db

SUITE = load_suite("refunds")


def build_state(sql: str, path: Path) -> Path:
    path.write_bytes(build_fixture_db(sql))
    return path


def grade(task, fixture: Path, db: Path) -> Verdict:
    """The sandbox's grader program, run in-process on a host copy of the state."""
    return Verdict.model_validate(sqlite_grade.grade(grade_spec(task), str(fixture), str(db)))


def snapshot_state(path: Path) -> dict[str, list[dict]]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
    out = {n: [dict(r) for r in conn.execute(f'SELECT * FROM "{n}"')] for n in names}
    conn.close()
    return out
TOOLS = SUITE.root / "tools"
TASK_IDS = [t.id for t in SUITE.tasks]
PY = [sys.executable, "-I", "-S"]
SEEDS = range(8)

# How refundbot is meant to do on each task over seeds 0..7 (see SLIPS in refundbot.py).
INTENDED = {
    "damaged-item-full-refund": "always",
    "outside-window": "always",
    "goodwill-below-threshold": "always",
    "store-credit-payment": "always",
    "duplicate-charge": "sometimes",       # retries the refund write
    "partial-line-item": "sometimes",      # refunds both mugs
    "already-refunded": "sometimes",       # skips the refund history
    "amount-above-total": "sometimes",     # refunds the customer's figure
    "ambiguous-last-order": "sometimes",   # picks the newest order
    "cancel-unshipped": "sometimes",       # forgets the refund or the email
    "fraud-flagged": "sometimes",          # skips the fraud flag
    "store-credit-requested": "sometimes",  # refunds to the card anyway
    "shipped-not-delivered": "sometimes",  # cancels a shipped order
    "split-payment": "sometimes",          # puts everything on the card
    "goodwill-above-threshold": "never",   # blind spot: never checks the threshold
    "wrong-email-in-message": "never",     # blind spot: replies to the sender address
}


def email(cid: int, to: str, subject: str = "About your ticket") -> list[str]:
    return ["send-email", "--customer", str(cid), "--to", to, "--subject", subject, "--body", "Hello, ..."]


ORACLE: dict[str, list[list[str]]] = {
    "damaged-item-full-refund": [
        ["issue-refund", "--payment", "1", "--amount", "45.99", "--reason", "kettle arrived cracked"],
        email(1, "ana.silva@example.com")],
    "duplicate-charge": [
        ["issue-refund", "--payment", "23", "--amount-cents", "8950", "--reason", "duplicate charge"],
        email(2, "ben.okafor@example.com")],
    "partial-line-item": [
        ["issue-refund", "--payment", "3", "--amount", "12.50", "--reason", "one mug broken"],
        email(3, "chloe.martin@example.com")],
    "outside-window": [email(4, "dev.patel@example.com", "Outside the return window")],
    "already-refunded": [email(5, "elena.rossi@example.com", "Your refund was issued on June 10")],
    "amount-above-total": [
        ["issue-refund", "--payment", "6", "--amount", "120", "--reason", "desk arrived broken; refund capped at the order total"],
        email(6, "farah.haddad@example.com")],
    "goodwill-above-threshold": [
        ["escalate", "--customer", "7", "--order", "1007", "--amount", "50", "--reason", "goodwill above threshold"],
        email(7, "george.brown@example.com")],
    "goodwill-below-threshold": [
        ["issue-store-credit", "--customer", "8", "--order", "1008", "--amount", "15", "--reason", "late delivery"],
        email(8, "hana.kim@example.com")],
    "ambiguous-last-order": [
        ["issue-refund", "--payment", "9", "--amount-cents", "19900", "--reason", "headphones defective"],
        email(9, "ivan.petrov@example.com")],
    "cancel-unshipped": [
        ["cancel-order", "--order", "1012"],
        ["issue-refund", "--payment", "10", "--amount", "64.00", "--reason", "cancelled before shipping"],
        email(10, "julia.novak@example.com")],
    "fraud-flagged": [
        ["escalate", "--customer", "11", "--order", "1013", "--amount-cents", "149900", "--reason", "fraud-flagged account"],
        email(11, "kevin.wu@example.com")],
    "store-credit-requested": [
        ["issue-store-credit", "--customer", "12", "--order", "1014", "--amount", "35", "--reason", "return, store credit requested"],
        email(12, "lena.fischer@example.com")],
    "store-credit-payment": [
        ["issue-refund", "--payment", "13", "--amount", "42", "--reason", "lamp flickers; paid with store credit"],
        email(13, "marco.bianchi@example.com")],
    "shipped-not-delivered": [email(14, "nora.lindqvist@example.com", "Your order has shipped")],
    "wrong-email-in-message": [
        ["issue-refund", "--payment", "15", "--amount", "89", "--reason", "speaker damaged"],
        email(15, "omar.said@example.com")],
    "split-payment": [
        ["issue-refund", "--payment", "16", "--amount-cents", "3000", "--reason", "return"],
        ["issue-refund", "--payment", "17", "--amount-cents", "7000", "--reason", "return"],
        email(16, "priya.nair@example.com")],
}

# A plausible mistake per task, with the first failure the grader must report.
WRONG: dict[str, tuple[list[list[str]], str]] = {
    "damaged-item-full-refund": (
        [["issue-store-credit", "--customer", "1", "--order", "1001", "--amount", "45.99", "--reason", "x"],
         email(1, "ana.silva@example.com")],
        "refunds: expected (1, 1001, 4599, 'original'), found (NULL, 1001, 4599, 'store_credit')"),
    "duplicate-charge": (
        [["issue-refund", "--payment", "23", "--amount-cents", "8950", "--reason", "dup"]] * 2 + [email(2, "ben.okafor@example.com")],
        "refunds: expected 1 row, found 2"),
    "partial-line-item": (
        [["issue-refund", "--payment", "3", "--amount", "25", "--reason", "mugs"], email(3, "chloe.martin@example.com")],
        "refunds: expected (3, 1003, 1250, 'original'), found (3, 1003, 2500, 'original')"),
    "outside-window": (
        [["issue-refund", "--payment", "4", "--amount", "129", "--reason", "x"], email(4, "dev.patel@example.com")],
        "refunds: expected 0 rows, found 1"),
    "already-refunded": (
        [["issue-refund", "--payment", "5", "--amount", "79.99", "--reason", "x"], email(5, "elena.rossi@example.com")],
        "refunds: expected 1 row, found 2"),
    "amount-above-total": (
        [["issue-refund", "--payment", "6", "--amount", "150", "--reason", "x"], email(6, "farah.haddad@example.com")],
        "refunds: expected (6, 1006, 12000, 'original'), found (6, 1006, 15000, 'original')"),
    "goodwill-above-threshold": (
        [["issue-store-credit", "--customer", "7", "--order", "1007", "--amount", "50", "--reason", "late"],
         email(7, "george.brown@example.com")],
        "escalations: expected 1 row, found 0"),
    "goodwill-below-threshold": (
        [["escalate", "--customer", "8", "--order", "1008", "--amount", "15", "--reason", "goodwill"],
         email(8, "hana.kim@example.com")],
        "refunds: expected 1 row, found 0"),
    "ambiguous-last-order": (
        [["issue-refund", "--payment", "101", "--amount", "18", "--reason", "last order"], email(9, "ivan.petrov@example.com")],
        "refunds: expected (9, 1009, 19900, 'original'), found (101, 1010, 1800, 'original')"),
    "cancel-unshipped": (
        [["cancel-order", "--order", "1012"], email(10, "julia.novak@example.com")],
        "refunds: expected 1 row, found 0"),
    "fraud-flagged": (
        [["issue-refund", "--payment", "11", "--amount", "1499", "--reason", "defective"], email(11, "kevin.wu@example.com")],
        "escalations: expected 1 row, found 0"),
    "store-credit-requested": (
        [["issue-refund", "--payment", "12", "--amount", "35", "--reason", "return"], email(12, "lena.fischer@example.com")],
        "refunds: expected (1, 1014, 3500, 'store_credit'), found (0, 1014, 3500, 'original')"),
    "store-credit-payment": (
        [email(13, "marco.bianchi@example.com", "We cannot refund to a card")],
        "refunds: expected 1 row, found 0"),
    "shipped-not-delivered": (
        [["cancel-order", "--order", "1016"], ["issue-refund", "--payment", "14", "--amount", "56", "--reason", "x"],
         email(14, "nora.lindqvist@example.com")],
        "order status: expected ('shipped'), found ('cancelled')"),
    "wrong-email-in-message": (
        [["issue-refund", "--payment", "15", "--amount", "89", "--reason", "x"], email(15, "osaid.work@corp-mail.example")],
        "emails: expected (15, 'omar.said@example.com'), found (15, 'osaid.work@corp-mail.example')"),
    "split-payment": (
        [["issue-refund", "--payment", "17", "--amount", "100", "--reason", "x"], email(16, "priya.nair@example.com")],
        "refunds: expected 2 rows, found 1: (17, 10000, 'original')"),
}


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("refunds-fixtures")
    return {t.id: build_state(SUITE.fixture_sql(t), d / f"{t.id}.db") for t in SUITE.tasks}


def copy_of(fixture: Path, dst: Path) -> Path:
    shutil.copyfile(fixture, dst)
    return dst


def tool(db: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([*PY, str(TOOLS / "refunds.py"), *args], env={**os.environ, "HARNESS_STATE": str(db)},
                       capture_output=True, text=True, timeout=30)
    if check:
        assert p.returncode == 0, (args, p.stderr)
    return p


def test_task_tables_cover_the_suite():
    assert len(SUITE.tasks) >= 12
    assert set(ORACLE) == set(WRONG) == set(INTENDED) == set(TASK_IDS)


# ---------------------------------------------------------------------------- per task


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_fixture_builds(fixtures, task_id):
    state = snapshot_state(fixtures[task_id])
    assert {"policy", "customers", "orders", "line_items", "payments", "refunds", "emails", "escalations"} <= set(state)
    assert state["policy"][0]["today"] == "2024-06-15"
    for o in state["orders"]:  # order totals match their line items
        items = [li for li in state["line_items"] if li["order_id"] == o["id"]]
        assert o["total_cents"] == sum(li["quantity"] * li["unit_price_cents"] for li in items), o


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_oracle_passes(fixtures, tmp_path, task_id):
    db = copy_of(fixtures[task_id], tmp_path / "state.db")
    for args in ORACLE[task_id]:
        tool(db, *args)
    g = grade(SUITE.task(task_id), fixtures[task_id], db)
    assert g.passed, g.reason


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_doing_nothing_fails(fixtures, tmp_path, task_id):
    db = copy_of(fixtures[task_id], tmp_path / "state.db")
    g = grade(SUITE.task(task_id), fixtures[task_id], db)
    assert not g.passed
    assert g.reason


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_plausible_wrong_action_fails(fixtures, tmp_path, task_id):
    actions, reason = WRONG[task_id]
    db = copy_of(fixtures[task_id], tmp_path / "state.db")
    for args in actions:
        tool(db, *args)
    g = grade(SUITE.task(task_id), fixtures[task_id], db)
    assert not g.passed
    assert g.reason.startswith(reason), g.reason


# ---------------------------------------------------------------------------- the tools


def test_tools_read_commands(fixtures, tmp_path):
    db = copy_of(fixtures["split-payment"], tmp_path / "s.db")
    pol = json.loads(tool(db, "policy").stdout)["policy"]
    assert pol["refund_window_days"] == 30 and pol["goodwill_threshold_cents"] == 2000 and len(pol["rules"]) == 8
    cust = json.loads(tool(db, "find-customer", "--email", "PRIYA.NAIR@example.com").stdout)["customers"]
    assert [c["id"] for c in cust] == [16]
    assert len(json.loads(tool(db, "find-customer", "--name", "Ana Silv").stdout)["customers"]) == 2
    orders = json.loads(tool(db, "list-orders", "--customer", "1").stdout)["orders"]
    assert [o["id"] for o in orders] == [1001, 1019] and orders[0]["items"] == ["Ceramic pour-over kettle"]
    order = json.loads(tool(db, "get-order", "--order", "1018").stdout)["order"]
    assert [p["method"] for p in order["payments"]] == ["store_credit", "card"] and order["refunds"] == []


def test_tools_write_without_policing_and_store_credit_payments(fixtures, tmp_path):
    db = copy_of(fixtures["split-payment"], tmp_path / "s.db")
    # a refund larger than the payment, twice: the tools allow it (the grader catches it)
    for _ in range(2):
        tool(db, "issue-refund", "--payment", "17", "--amount", "$1,000.00", "--reason", "x")
    pays = json.loads(tool(db, "list-payments", "--order", "1018").stdout)["payments"]
    assert pays[1]["refunded_cents"] == 200_000
    out = json.loads(tool(db, "issue-refund", "--payment", "16", "--amount-cents", "3000", "--reason", "x").stdout)
    assert out["refund"]["to"] == "store_credit store-credit"
    assert json.loads(tool(db, "find-customer", "--id", "16").stdout)["customers"][0]["store_credit_cents"] == 3000


@pytest.mark.parametrize("args, code, message", [
    (["find-customer", "--email", "nobody@example.com"], 3, "no customer matches"),
    (["get-order", "--order", "9"], 3, "order 9 not found"),
    (["issue-refund", "--payment", "999", "--amount", "1", "--reason", "x"], 3, "payment 999 not found"),
    (["issue-refund", "--payment", "22", "--amount", "1", "--reason", "x"], 4, "never captured"),
    (["issue-refund", "--payment", "1", "--amount", "1.234", "--reason", "x"], 4, "at most two decimals"),
    (["issue-refund", "--payment", "1", "--amount", "ten", "--reason", "x"], 4, "not a number of dollars"),
    (["issue-refund", "--payment", "1", "--amount-cents", "0", "--reason", "x"], 4, "must be positive"),
    (["issue-refund", "--payment", "1", "--amount", "1", "--amount-cents", "100", "--reason", "x"], 4, "not both"),
    (["issue-refund", "--payment", "1", "--amount", "1", "--reason", "  "], 4, "--reason must not be empty"),
    (["issue-refund", "--payment", "1", "--reason", "x"], 4, "an amount is required"),
    (["issue-store-credit", "--customer", "2", "--order", "1001", "--amount", "1", "--reason", "x"], 4, "belongs to customer 1"),
    (["send-email", "--customer", "1", "--to", "not-an-address", "--subject", "s", "--body", "b"], 4, "not an email address"),
    (["cancel-order", "--order", "1021"], 4, "already cancelled"),
    (["issue-refund", "--payment", "one", "--amount", "1", "--reason", "x"], 2, "invalid int value"),
    (["frobnicate"], 2, "invalid choice"),
])
def test_tool_errors(fixtures, tmp_path, args, code, message):
    db = copy_of(fixtures["damaged-item-full-refund"], tmp_path / "s.db")
    before = db.read_bytes()
    p = tool(db, *args, check=False)
    assert p.returncode == code, p.stderr
    err = json.loads(p.stderr)
    assert err["ok"] is False and message in err["error"]
    assert db.read_bytes() == before  # nothing written


def test_tool_without_state_database(tmp_path):
    p = tool(tmp_path / "missing.db", "policy", check=False)
    assert p.returncode == 5 and "does not exist" in json.loads(p.stderr)["error"]


# ---------------------------------------------------------------------------- refundbot


def run_refundbot(task_id: str, seed: int, workdir: Path, fixture: Path, think_scale: str = "0.05") -> tuple[int, bool, str | None]:
    workdir.mkdir(parents=True, exist_ok=True)
    db = copy_of(fixture, workdir / "state.db")
    (workdir / "prompt.txt").write_text(SUITE.task(task_id).prompt)
    env = {**os.environ, "HARNESS_SEED": str(seed), "HARNESS_TASK_ID": task_id,
           "HARNESS_PROMPT_FILE": str(workdir / "prompt.txt"), "HARNESS_STATE": str(db),
           "HARNESS_TRANSCRIPT": str(workdir / "transcript.jsonl"),
           "REFUNDBOT_THINK_SCALE": think_scale, "REFUNDBOT_MEMORY_SCALE": "0.1",
           "REFUNDS_TOOL": " ".join([*PY, str(TOOLS / "refunds.py")])}
    p = subprocess.run([*PY, str(TOOLS / "refundbot.py")], env=env, capture_output=True, text=True, timeout=120, cwd=workdir)
    g = grade(SUITE.task(task_id), fixture, db)
    return p.returncode, g.passed, g.reason


def test_refundbot_matrix(fixtures, tmp_path):
    """Seeds 0..7 on every task: some tasks always pass, some sometimes, a couple never."""
    jobs = [(t, s) for t in TASK_IDS for s in SEEDS]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = dict(zip(jobs, pool.map(lambda j: run_refundbot(j[0], j[1], tmp_path / f"{j[0]}-{j[1]}", fixtures[j[0]]), jobs)))
    assert all(rc == 0 for rc, _, _ in results.values()), {j: r for j, r in results.items() if r[0] != 0}

    observed = {}
    lines = [f"{'task':28s} seeds 0..7  class      intended", "-" * 60]
    for t in TASK_IDS:
        row = "".join("P" if results[(t, s)][1] else "." for s in SEEDS)
        n = row.count("P")
        observed[t] = "always" if n == len(SEEDS) else "never" if n == 0 else "sometimes"
        lines.append(f"{t:28s} {row}    {observed[t]:10s} {INTENDED[t]}")
    print("\n" + "\n".join(lines))
    counts = {c: list(observed.values()).count(c) for c in ("always", "sometimes", "never")}
    print(counts)
    assert counts["always"] >= 3 and counts["sometimes"] >= 3 and counts["never"] >= 1
    assert observed == INTENDED


def test_refundbot_transcript_and_errors(fixtures, tmp_path):
    rc, passed, reason = run_refundbot("damaged-item-full-refund", 3, tmp_path / "ok", fixtures["damaged-item-full-refund"])
    assert (rc, passed) == (0, True), reason
    recs = [json.loads(line) for line in (tmp_path / "ok" / "transcript.jsonl").read_text().splitlines()]
    kinds = {r["type"] for r in recs}
    assert {"start", "thought", "tool_call", "tool_result", "final"} <= kinds
    calls = [r["argv"][1] for r in recs if r["type"] == "tool_call"]
    assert calls[0] == "policy" and "issue-refund" in calls and calls[-1] == "send-email"
    assert recs[-1]["type"] == "final" and recs[-1]["think_iterations"] > 0
    # same seed, same choices
    rc2, _, _ = run_refundbot("damaged-item-full-refund", 3, tmp_path / "again", fixtures["damaged-item-full-refund"])
    again = [json.loads(line) for line in (tmp_path / "again" / "transcript.jsonl").read_text().splitlines()]
    assert [r.get("argv") for r in again] == [r.get("argv") for r in recs]

    # no state database: the first tool call fails -> internal error, exit 1, logged
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "prompt.txt").write_text(SUITE.task("outside-window").prompt)
    env = {**os.environ, "HARNESS_PROMPT_FILE": str(broken / "prompt.txt"), "HARNESS_STATE": str(broken / "none.db"),
           "HARNESS_TRANSCRIPT": str(broken / "t.jsonl"), "REFUNDBOT_THINK_SCALE": "0.01", "REFUNDBOT_MEMORY_SCALE": "0.1",
           "REFUNDS_TOOL": " ".join([*PY, str(TOOLS / "refunds.py")])}
    p = subprocess.run([*PY, str(TOOLS / "refundbot.py")], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "exited 5" in p.stderr
    assert json.loads((broken / "t.jsonl").read_text().splitlines()[-1])["type"] == "error"


# ---------------------------------------------------------------------------- docker



@pytest.mark.docker
def test_refundbot_in_container(fixtures, tmp_path, docker_client):
    """Build the image and run one trial exactly as the runner does: read-only root, tmpfs
    /work and /tmp, no network, uid 10001, inputs on a read-only mount; grade the state.
    (docker_client: the engine must answer; under CI a missing one fails.)"""
    build = subprocess.run(["docker", "build", "-q", "--build-arg", "BASE=harness/sandbox:latest",
                            "-t", SUITE.image, str(SUITE.root)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    task = SUITE.task("damaged-item-full-refund")
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "fixture.sql").write_text(SUITE.fixture_sql(task))
    (inp / "prompt.txt").write_text(task.prompt)
    for p in (inp, inp / "fixture.sql", inp / "prompt.txt"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    name = f"harness-test-{uuid.uuid4().hex[:10]}"
    run = ["docker", "run", "-d", "--rm", "--name", name, "--read-only",
           "--tmpfs", "/work:rw,size=256m,uid=10001,gid=10001,mode=0700", "--tmpfs", "/tmp:rw,size=64m",
           "--network", "none", "--user", "10001:10001", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
           "--memory", "512m", "--memory-swap", "512m", "--cpus", "1", "--pids-limit", "128",
           "-v", f"{inp}:/harness/in:ro", SUITE.image, "sleep", "infinity"]
    assert subprocess.run(run, capture_output=True, text=True, timeout=60).returncode == 0
    try:
        setup = ("import sqlite3; c = sqlite3.connect('/work/state.db'); "
                 "c.executescript(open('/harness/in/fixture.sql').read()); c.commit(); c.close()")
        p = subprocess.run(["docker", "exec", name, "python3", "-c", setup], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        envs = {"HARNESS_SEED": "0", "HARNESS_TASK_ID": task.id, "HARNESS_PROMPT_FILE": "/harness/in/prompt.txt",
                "HARNESS_STATE": "/work/state.db", "HARNESS_TRANSCRIPT": "/work/transcript.jsonl", **SUITE.agent_env}
        cmd = ["docker", "exec", "-w", "/work"]
        for k, v in envs.items():
            cmd += ["-e", f"{k}={v}"]
        p = subprocess.run([*cmd, name, *SUITE.agent_cmd], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        state = subprocess.run(["docker", "exec", name, "cat", "/work/state.db"], capture_output=True, timeout=60)
        transcript = subprocess.run(["docker", "exec", name, "cat", "/work/transcript.jsonl"], capture_output=True, text=True, timeout=60)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)
    final = tmp_path / "final.db"
    final.write_bytes(state.stdout)
    g = grade(task, fixtures[task.id], final)
    assert g.passed, g.reason
    last = json.loads(transcript.stdout.splitlines()[-1])
    print(f"\nin container: cpu {last['cpu_seconds']} s (agent process), context {last['context_mib']} MiB, "
          f"max rss {last['max_rss_mib']} MiB")
    assert last["type"] == "final" and last["context_mib"] >= 40
    conn = sqlite3.connect(final)
    assert conn.execute("SELECT count(*) FROM emails").fetchone() == (1,)
