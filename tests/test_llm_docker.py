"""The refunds LLM agent end to end through the model gateway, against the test upstream
(tests/testupstream.py: a real HTTP server scripted per ticket and seed — not a model).

One run of every refunds task with `--agent llm --secret OPENAI_API_KEY`: the key is set in
this process's environment only; the test upstream refuses calls without it, so every
answered call proves the gateway added it. While the run is in flight a thread inspects
every attempt container; afterwards the value is looked for in the store, the artifacts,
every report format and those inspect documents. Then injected upstream failures: 429s
and a 5xx discard the attempt as `upstream` and the rerun passes; a slow upstream shows as
waiting time, not CPU.
"""

from __future__ import annotations

import json
import secrets
import threading
from pathlib import Path

import pytest

from conftest import run_cli
from harness.sandbox.owners import LABEL_RUN
from harness.store.store import Store
from testupstream import TestUpstream

pytestmark = pytest.mark.docker
KEY = "sk-test-" + secrets.token_hex(20)  # what a provider key looks like; exists only in this process


def _store(tmp: Path) -> Store:
    return Store.open(f"sqlite:///{tmp / 'home' / 'harness.db'}")


def _llm(tmp: Path, up: TestUpstream, *args: str, env: dict | None = None):
    return run_cli(tmp, "run", "--suite", "refunds", "--agent", "llm", "--secret", "OPENAI_API_KEY",
                   "--upstream", f"openai=http://host.docker.internal:{up.port}/v1",
                   "--agent-env", "REFUNDS_LLM_MODEL=test-refunds", "--json", *args,
                   env={"OPENAI_API_KEY": KEY, **(env or {})}, timeout=1200)


class _Inspector(threading.Thread):
    """Inspects every container of the harness while the run is in flight."""

    def __init__(self, client):
        super().__init__(daemon=True)
        self.client = client
        self.docs: dict[str, str] = {}
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                for c in self.client.containers.list(filters={"label": "dev.harness"}):
                    if c.id not in self.docs:
                        self.docs[c.id] = json.dumps(c.attrs)
            except Exception:
                pass
            self.stop.wait(0.3)


@pytest.fixture(scope="module")
def llm_run(tmp_path_factory, docker_client):
    tmp = tmp_path_factory.mktemp("llm")
    with TestUpstream(key=KEY) as up:
        spy = _Inspector(docker_client)
        spy.start()
        try:
            res = _llm(tmp, up, "--trials", "1", "--k", "1", "--max-reruns", "8")  # every task once: 16 attempts through the gateway (reruns: a stolen CI host)
        finally:
            spy.stop.set()
            spy.join()
        requests = list(up.requests)
    assert res.returncode in (0, 1), res.stderr[-3000:]
    summary = json.loads(res.stdout)
    return tmp, summary, requests, spy.docs


def test_every_refunds_task_runs_through_the_gateway(llm_run):
    tmp, summary, requests, _ = llm_run
    store = _store(tmp)
    run = store.get_run(summary["run_id"])
    assert run.secrets == ["OPENAI_API_KEY"] and run.agent_name == "llm"
    assert run.profile_json["network"] == "gateway" and "openai" in run.upstreams
    attempts = [a for a in store.attempts(run.id) if a.verdict == "clean"]
    assert {a.task_id for a in attempts} == set(run.task_ids) and len(run.task_ids) == 16
    assert requests and all(r["headers"].get("authorization") == f"Bearer {KEY}" for r in requests)
    # scores: the scripted model solves some tickets and fails others by a wrong state
    outcomes = {a.outcome for a in attempts}
    assert outcomes == {"pass", "fail"}, outcomes
    assert any(a.failure_kind == "wrong_state" for a in attempts)
    # every call the upstream answered is an attempt's recorded call, with its tokens
    calls = [c for a in store.attempts(run.id) for c in a.model_calls]
    assert len(calls) == len(requests)
    assert all(c["tokens_in"] is not None and c["status"] == 200 for c in calls)
    for a in attempts:
        assert a.upstream["calls"] == len(a.model_calls) > 0
        assert a.upstream["tokens_in"] == sum(c["tokens_in"] for c in a.model_calls)


def test_the_secret_value_is_nowhere(llm_run):
    tmp, summary, _, inspected = llm_run
    run_id = summary["run_id"]
    assert inspected, "the inspector saw no container"
    assert KEY not in json.dumps(summary)
    for doc in inspected.values():
        assert KEY not in doc
    found = []
    for p in (tmp / "home").rglob("*"):
        if p.is_file() and KEY.encode() in p.read_bytes():
            found.append(str(p))
    assert not found, found
    for fmt in ("table", "json", "markdown", "junit", "html"):
        out = run_cli(tmp, "report", run_id, "--format", fmt)
        assert out.returncode in (0, 1), out.stderr
        assert KEY not in out.stdout + out.stderr, fmt
    for cmd in (["trials", run_id], ["runs"], ["show", f"{run_id}:1"]):
        out = run_cli(tmp, *cmd)
        assert KEY not in out.stdout + out.stderr, cmd
    store = _store(tmp)
    assert all("OPENAI_API_KEY" not in a.error or KEY not in a.error for a in store.attempts(run_id) if a.error)


def test_a_value_passed_by_value_is_refused(tmp_path, docker_client):
    res = run_cli(tmp_path, "run", "--suite", "refunds", "--agent-cmd", f"env OPENAI_API_KEY={KEY} refundbot", "--trials", "1", "--k", "1",
                  env={"OPENAI_API_KEY": KEY})
    assert res.returncode == 2, res.stderr
    assert "credential" in res.stderr or "secret" in res.stderr
    assert KEY not in res.stderr + res.stdout and not (tmp_path / "home" / "harness.db").exists()


def _single(tmp: Path, up: TestUpstream, task: str, *args: str):
    res = _llm(tmp, up, "--tasks", task, "--trials", "1", "--k", "1", "--max-reruns", "8", *args)
    assert res.returncode in (0, 1), res.stderr[-3000:]
    run_id = json.loads(res.stdout)["run_id"]
    return sorted(_store(tmp).attempts(run_id), key=lambda a: a.attempt_no)


@pytest.mark.parametrize("status,rule", [(429, "upstream_rate_limited"), (503, "upstream_server_error")])
def test_upstream_errors_discard_the_attempt_and_the_rerun_passes(tmp_path, docker_client, status, rule):
    with TestUpstream(key=KEY) as up:
        up.inject(status=status, times=4)  # more than the agent's own retries: it gives up (exit 2)
        attempts = _single(tmp_path, up, "outside-window")
    first, last = attempts[0], attempts[-1]
    assert first.verdict == "discarded" and rule in first.reasons, (first.reasons, first.upstream)
    scope = {r["rule"]: r["scope"] for r in first.rules}
    assert scope[rule] == "upstream"
    assert first.outcome is None or first.verdict == "discarded"  # never scored
    assert last.verdict == "clean" and last.outcome == "pass", (last.reasons, last.grade_reason)
    assert last.seed == first.seed and [a.attempt_no for a in attempts] == list(range(first.attempt_no, last.attempt_no + 1))
    # a busy host may discard an attempt in between (host rules); it is rerun the same way
    assert all(a.verdict == "discarded" and set(a.reasons) <= {"host_cpu_contention", "host_steal", rule} for a in attempts[1:-1]), \
        [(a.attempt_no, a.reasons) for a in attempts]
    errors = [c for c in first.model_calls if c["status"] == status]
    assert len(errors) == 4


def test_a_slow_upstream_is_waiting_time_not_cpu(tmp_path, docker_client):
    with TestUpstream(key=KEY) as up:
        up.inject(mode="slow:3", times=2)
        attempts = _single(tmp_path, up, "outside-window")
    a = attempts[0]  # the attempt that met the slow upstream (on a busy host it may be discarded and rerun)
    assert a.upstream["wait_s"] >= 6.0, a.upstream
    cpu_s = (a.cpu_usage_us or 0) / 1e6
    assert a.upstream["wait_s"] > 5 * cpu_s, (a.upstream["wait_s"], cpu_s)
    assert a.agent_wall_s >= a.upstream["wait_s"]


AGENT_THAT_KNOWS = r"""
import json, os, sqlite3, sys
v = os.environ["PART_A"] + os.environ["PART_B"]  # learnt at run time (its image, an upstream that echoes it)
print("stdout", v); print("stderr", v, file=sys.stderr)
with open(os.environ["HARNESS_TRANSCRIPT"], "w") as f:
    f.write(json.dumps({"role": "assistant", "content": "the key is " + v}) + "\n")
c = sqlite3.connect(os.environ["HARNESS_STATE"], isolation_level=None)
c.execute("INSERT INTO t (note) VALUES (?)", (v,))
c.execute(f'CREATE TABLE "k{v}" (x)')
c.close()
"""


def test_a_key_the_agent_learnt_is_masked_in_everything_kept(tmp_path, docker_client):
    """The gateway keeps the key from the sandbox; an agent that has it anyway (from its image,
    or an upstream that echoes it) writes it into its output, transcript and final state. The
    grade reason, checks and diff quote that state: every string of the record has the value
    replaced by the secret's name, and every kept file (the state copy too) has it overwritten."""
    import sqlite3

    root = tmp_path / "knows"
    (root / "tasks").mkdir(parents=True)
    (root / "schema.sql").write_text("CREATE TABLE t (id INTEGER PRIMARY KEY, note TEXT);\n")
    (root / "Dockerfile").write_text("ARG BASE=harness/sandbox:latest\nFROM ${BASE}\n")
    half = 6  # no part looks like a key (that is refused before the run)
    (root / "suite.toml").write_text(
        'name = "knows"\nimage = "harness/sandbox:latest"\n'
        f"agent_cmd = [\"python3\", \"-c\", {json.dumps(AGENT_THAT_KNOWS)}]\n"
        'trials = 1\nk = [1]\nmax_reruns = 3\nstate_sql = ["schema.sql"]\n'
        f'[agent_env]\nPART_A = "{KEY[:half]}"\nPART_B = "{KEY[half:]}"\n')
    (root / "tasks" / "knows.toml").write_text('id = "knows"\ntitle = "knows the key"\nprompt = "nothing"\nunchanged = ["t"]\n')
    with TestUpstream(key=KEY) as up:
        res = run_cli(tmp_path, "run", "--suite", str(root), "--secret", "OPENAI_API_KEY", "--json",
                      "--upstream", f"openai=http://host.docker.internal:{up.port}/v1", env={"OPENAI_API_KEY": KEY}, timeout=600)
    assert res.returncode in (0, 1), res.stderr[-3000:]
    run_id = json.loads(res.stdout)["run_id"]
    atts = _store(tmp_path).attempts(run_id)
    clean = [a for a in atts if a.verdict == "clean"]
    assert len(clean) == 1 and clean[0].outcome == "fail" and clean[0].failure_kind == "wrong_state", atts
    a = clean[0]
    assert "[secret OPENAI_API_KEY]" in json.dumps([a.grade_reason, a.grade_checks, a.state_diff]), (a.grade_reason, a.state_diff)
    assert "secret values masked in the kept files" in (a.error or "") and "OPENAI_API_KEY" in a.error
    art = Path(a.artifacts)
    assert "[secret OPENAI_API_KEY]" in (art / "stdout.txt").read_text() and "[secret OPENAI_API_KEY]" in (art / "transcript.jsonl").read_text()
    states = [p for p in art.rglob("*") if p.is_file() and p.read_bytes()[:16] == b"SQLite format 3\x00"]
    assert states, sorted(p.name for p in art.rglob("*"))
    for p in states:  # the copy of the final state still opens, the value overwritten in place
        c = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
        notes = [r[0] for r in c.execute("SELECT note FROM t")]
        c.close()
        assert notes == ["*" * len(KEY)], notes
    found = [str(p) for p in (tmp_path / "home").rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert not found, found
    for args in (["report", run_id, "--format", "json"], ["report", run_id, "--format", "junit"], ["show", str(a.id)], ["show", str(a.id), "--json"],
                 ["report", run_id, "--format", "html", "--out", str(tmp_path / "r.html")]):
        out = run_cli(tmp_path, *args)
        assert out.returncode in (0, 1), (args, out.stderr[-2000:])
        assert KEY not in out.stdout + out.stderr, args
    assert KEY not in (tmp_path / "r.html").read_text()
