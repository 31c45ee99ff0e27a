"""The refunds suite's LLM agent (tools/llmagent.py) against the test upstream (tests/testupstream.py),
on the host, no Docker: the agent makes real HTTP calls to a real server that replays scripted
tool calls (not a model), runs the real `refunds` tools on a fresh state database per task, and
the harness's own sqlite grader grades the state it leaves. Then the test upstream itself: each
API, streaming and not, usage, errors, truncation, slowness, injection, keep-alive, the CLI.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from testupstream import DEFAULT_SCRIPT, TestUpstream

from harness.engine.suites import load_suite
from harness.model.grade import Verdict
from harness.state import sqlite_grade
from harness.state.expectations import grade_spec
from harness.state.sqlite import build_fixture_db

ROOT = Path(__file__).resolve().parents[1]
SUITE = load_suite("refunds")
TOOLS = SUITE.root / "tools"
AGENT = TOOLS / "llmagent.py"
PY = [sys.executable, "-I", "-S"]
REFUNDS_TOOL = " ".join([*PY, str(TOOLS / "refunds.py")])
TASK_IDS = [t.id for t in SUITE.tasks]
TICKET = {t.id: re.search(r"Ticket #(\d+)", t.prompt).group(1) for t in SUITE.tasks}
SCRIPT = json.loads(DEFAULT_SCRIPT.read_text())["tickets"]
SEEDS = range(4)  # every ticket's variants cycle with the seed in at most 4 steps: seeds 0..3 meet them all
KEY = f"sk-test-upstream-{uuid.uuid4().hex}"
PROXY_VARS = {"http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"}


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


llmagent = load_module("llmagent_under_test", AGENT)


def variant_of(task_id: str, seed: int) -> str:
    by_seed = SCRIPT[TICKET[task_id]]["by_seed"]
    return by_seed[seed % len(by_seed)]


def is_correct(variant: str) -> bool:
    return variant.startswith(("correct", "recovers"))


def turn_of(request: dict) -> int:
    """Which assistant turn a chat request asks for (assistant messages already present)."""
    return sum(1 for m in (request["json"] or {}).get("messages", []) if m.get("role") == "assistant")


# ---------------------------------------------------------------------------- running the agent


@dataclass
class Run:
    rc: int
    passed: bool
    reason: str | None
    stdout: str
    stderr: str
    transcript_text: str
    db: Path

    @property
    def transcript(self) -> list[dict]:
        return [json.loads(line) for line in self.transcript_text.splitlines()]


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("llm-fixtures")
    out = {}
    for t in SUITE.tasks:
        out[t.id] = d / f"{t.id}.db"
        out[t.id].write_bytes(build_fixture_db(SUITE.fixture_sql(t)))
    return out


@pytest.fixture(scope="module")
def upstream():
    with TestUpstream() as up:
        yield up


@pytest.fixture()
def own_upstream():
    """An upstream of its own, for tests that inject failures or count requests."""
    with TestUpstream() as up:
        yield up


def grade(task_id: str, fixture: Path, db: Path) -> Verdict:
    return Verdict.model_validate(sqlite_grade.grade(grade_spec(SUITE.task(task_id)), str(fixture), str(db)))


def run_agent(up: TestUpstream, task_id: str, workdir: Path, fixture: Path, *, seed: int | None = 0,
              model: str = "test-refunds", prompt: str | None = None, env: dict | None = None,
              base_url: str | None = None, timeout: float = 120) -> Run:
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "state.db"
    shutil.copyfile(fixture, db)
    (workdir / "prompt.txt").write_text(prompt if prompt is not None else SUITE.task(task_id).prompt)
    e = {k: v for k, v in os.environ.items() if k not in PROXY_VARS}
    e.update({"OPENAI_BASE_URL": base_url or f"{up.url}/v1", "OPENAI_API_KEY": KEY, "REFUNDS_LLM_MODEL": model,
              "HARNESS_TASK_ID": task_id, "HARNESS_PROMPT_FILE": str(workdir / "prompt.txt"), "HARNESS_STATE": str(db),
              "HARNESS_TRANSCRIPT": str(workdir / "transcript.jsonl"), "REFUNDS_TOOL": REFUNDS_TOOL,
              "REFUNDS_LLM_BACKOFF": "0.05"})
    if seed is not None:
        e["HARNESS_SEED"] = str(seed)
    e.update(env or {})
    p = subprocess.run([*PY, str(AGENT)], check=False, env=e, capture_output=True, text=True, timeout=timeout, cwd=workdir)
    g = grade(task_id, fixture, db)
    t = workdir / "transcript.jsonl"
    return Run(p.returncode, g.passed, g.reason, p.stdout, p.stderr, t.read_text() if t.exists() else "", db)


# ---------------------------------------------------------------------------- the script and the schemas


def test_agent_tools_match_the_refunds_cli():
    """One function per `refunds` subcommand, one property per flag, the same required flags and types."""
    parser = load_module("refunds_cli_under_test", TOOLS / "refunds.py").build_parser()
    subs = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    assert {n.replace("-", "_") for n in subs} == set(llmagent.TOOL_SPECS)
    for name, sub in subs.items():
        flags = {a.dest: a for a in sub._actions if a.option_strings and a.dest != "help"}
        spec = llmagent.TOOL_SPECS[name.replace("-", "_")][1]
        assert set(spec) == set(flags), name
        for dest, action in flags.items():
            assert action.option_strings == [f"--{dest.replace('_', '-')}"]
            kind, required, _ = spec[dest]
            assert kind == ("integer" if action.type is int else "string"), (name, dest)
            assert required == action.required, (name, dest)
    schemas = llmagent.tool_schemas()
    assert [s["function"]["name"] for s in schemas] == list(llmagent.TOOL_SPECS)
    issue = next(s["function"]["parameters"] for s in schemas if s["function"]["name"] == "issue_refund")
    assert issue["required"] == ["payment", "reason"] and issue["additionalProperties"] is False


def test_tool_argument_mapping():
    argv = llmagent.tool_argv
    assert argv("policy", "{}") == ["policy"] and argv("policy", "") == ["policy"]
    assert argv("issue_refund", '{"payment": 1, "amount": 45.99, "reason": "-cracked"}') == \
        ["issue-refund", "--payment=1", "--amount=45.99", "--reason=-cracked"]
    assert argv("get_order", {"order": 1001.0}) == ["get-order", "--order=1001"]
    assert argv("escalate", {"customer": 7, "order": None, "reason": "x"}) == ["escalate", "--customer=7", "--reason=x"]
    for name, raw, msg in [("get_order", '{"order": 1001', "not valid JSON"), ("get_order", "[1001]", "must be a JSON object"),
                           ("get_order", '{"order_id": 1001}', "has no argument 'order_id'"),
                           ("cancel_order", '{"order": true}', "must be a integer"), ("frobnicate", "{}", "unknown tool")]:
        with pytest.raises((ValueError, TypeError), match=msg):
            argv(name, raw)


def test_script_covers_the_suite_and_fits_the_tool_schemas():
    assert {s["task"] for s in SCRIPT.values()} == set(TASK_IDS)
    assert {TICKET[s["task"]] for s in SCRIPT.values()} == set(SCRIPT)  # keyed by the ticket in the task's prompt
    for ticket, s in SCRIPT.items():
        assert "correct" in s["variants"], ticket
        assert set(s["by_seed"]) <= set(s["variants"]), ticket
        for name, v in s["variants"].items():
            assert ("mistake" in v) != is_correct(name), (ticket, name)
            for call in v["calls"]:
                if name.startswith("recovers") and ("raw_arguments" in call or call["tool"] not in llmagent.TOOL_SPECS):
                    continue  # deliberately malformed
                spec = llmagent.TOOL_SPECS[call["tool"]][1]
                assert set(call["arguments"]) <= set(spec), (ticket, name, call)
                assert {k for k, (_t, req, _d) in spec.items() if req} <= set(call["arguments"]), (ticket, name, call)
    kinds = [{is_correct(variant_of(t, s)) for s in SEEDS} for t in TASK_IDS]
    assert {True} in kinds and {False} in kinds and {True, False} in kinds


# ---------------------------------------------------------------------------- outcomes


VARIANTS = [(s["task"], name) for s in SCRIPT.values() for name in s["variants"]]


@pytest.mark.parametrize("task_id, variant", VARIANTS, ids=[f"{t}:{v}" for t, v in VARIANTS])
def test_each_variant_grades_as_intended(upstream, fixtures, tmp_path, task_id, variant):
    """Every correct variant passes its task; every mistaken one exits 0 with a wrong state."""
    r = run_agent(upstream, task_id, tmp_path, fixtures[task_id], model=f"test-refunds:{variant}")
    assert r.rc == 0, r.stderr
    assert r.passed == is_correct(variant), (r.reason, SCRIPT[TICKET[task_id]]["variants"][variant].get("mistake"))
    final = r.transcript[-1]
    assert final["type"] == "final" and final["turns"] == len(SCRIPT[TICKET[task_id]]["variants"][variant]["calls"]) + 1


def test_seed_matrix(upstream, fixtures, tmp_path):
    """Seeds 0..3 on every task, the variant chosen by the seed the agent sends: the pattern
    the script promises, some tasks always solved, some never, the rest sometimes."""
    jobs = [(t, s) for t in TASK_IDS for s in SEEDS]
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = dict(zip(jobs, pool.map(lambda j: run_agent(upstream, j[0], tmp_path / f"{j[0]}-{j[1]}", fixtures[j[0]], seed=j[1]), jobs)))
    assert all(r.rc == 0 for r in runs.values()), {j: r.stderr for j, r in runs.items() if r.rc}
    assert max(len(v["by_seed"]) for v in SCRIPT.values()) <= len(SEEDS)  # every variant is met
    lines, classes = [f"{'task':28s} seeds 0..{len(SEEDS) - 1}", "-" * 40], {}
    for t in TASK_IDS:
        row = "".join("P" if runs[(t, s)].passed else "." for s in SEEDS)
        assert row == "".join("P" if is_correct(variant_of(t, s)) else "." for s in SEEDS), t
        classes[t] = "always" if "." not in row else "never" if "P" not in row else "sometimes"
        lines.append(f"{t:28s} {row}  {classes[t]}")
    print("\n" + "\n".join(lines))
    assert {"always", "never", "sometimes"} == set(classes.values())
    for (t, s), r in runs.items():  # a failure is a wrong state after a clean exit, with a reason
        assert r.passed or r.reason, (t, s)


def test_requests_carry_key_seed_and_tools_and_the_key_stays_secret(own_upstream, fixtures, tmp_path):
    spy = tmp_path / "tool-env.txt"
    wrapper = tmp_path / "refunds-spy.py"
    wrapper.write_text("import os, subprocess, sys\n"
                       f"open({str(spy)!r}, 'a').write(repr(os.environ.get('OPENAI_API_KEY')) + '\\n')\n"
                       f"sys.exit(subprocess.call([*{PY!r}, {str(TOOLS / 'refunds.py')!r}, *sys.argv[1:]]))\n")
    r = run_agent(own_upstream, "split-payment", tmp_path / "w", fixtures["split-payment"], seed=5,
                  env={"REFUNDS_TOOL": f"{sys.executable} {wrapper}"})
    assert (r.rc, r.passed) == (0, True), (r.stderr, r.reason)
    reqs = own_upstream.requests
    assert len(reqs) == len(SCRIPT[TICKET["split-payment"]]["variants"][variant_of("split-payment", 5)]["calls"]) + 1
    for i, q in enumerate(reqs):
        assert (q["method"], q["path"]) == ("POST", "/v1/chat/completions")
        assert q["headers"]["authorization"] == f"Bearer {KEY}"
        body = q["json"]
        assert body["seed"] == 5 and body["temperature"] == 0 and body["tool_choice"] == "auto"
        assert body["model"] == "test-refunds"
        assert [t["function"]["name"] for t in body["tools"]] == list(llmagent.TOOL_SPECS)
        assert body["messages"][0]["role"] == "system" and body["messages"][1] == {"role": "user", "content": SUITE.task("split-payment").prompt}
        assert turn_of(q) == i
        if i:  # the previous turn's tool call was answered, by id
            assert body["messages"][-1]["role"] == "tool" and body["messages"][-1]["tool_call_id"] == f"call_{TICKET['split-payment']}_{i - 1}"
    assert KEY not in r.transcript_text and KEY not in r.stdout and KEY not in r.stderr
    assert set(spy.read_text().split()) == {"None"}  # the tools never see the key
    # token accounting: what the upstream reported adds up to what the agent logged
    final = r.transcript[-1]
    assert final["usage"]["prompt_tokens"] == sum(u["prompt_tokens"] for u in own_upstream.reported)
    assert final["usage"]["completion_tokens"] == sum(u["completion_tokens"] for u in own_upstream.reported)
    for q, u in zip(reqs, own_upstream.reported):  # input = words of the message texts and tool-call arguments
        words = sum(len((m.get("content") or "").split()) + sum(len(c["function"]["arguments"].split()) for c in m.get("tool_calls", []))
                    for m in q["json"]["messages"])
        assert u["prompt_tokens"] == words and u["prompt_tokens_details"]["cached_tokens"] == words // 4


def test_transcript_records_requests_replies_and_tools(upstream, fixtures, tmp_path):
    r = run_agent(upstream, "cancel-unshipped", tmp_path, fixtures["cancel-unshipped"], model="test-refunds:correct")
    assert (r.rc, r.passed) == (0, True)
    recs = r.transcript
    kinds = [x["type"] for x in recs]
    assert kinds[0] == "start" and kinds[-1] == "final"
    assert {"request", "reply", "tool_call", "tool_run", "tool_result"} <= set(kinds)
    runs = [x["argv"] for x in recs if x["type"] == "tool_run"]
    assert runs[0] == ["refunds", "policy"] and ["refunds", "cancel-order", "--order=1012"] in runs
    assert all(x["exit"] == 0 for x in recs if x["type"] == "tool_result")
    assert "Cancelled order 1012" in r.stdout


def test_retries_two_429s_and_still_passes(own_upstream, fixtures, tmp_path):
    own_upstream.inject(status=429, times=2, match=lambda q: turn_of(q) == 2)
    r = run_agent(own_upstream, "damaged-item-full-refund", tmp_path, fixtures["damaged-item-full-refund"], model="test-refunds:correct")
    assert (r.rc, r.passed) == (0, True), (r.stderr, r.reason)
    third = [q for q in own_upstream.requests if turn_of(q) == 2]
    assert len(third) == 3 and third[0]["json"] == third[1]["json"] == third[2]["json"]
    retries = [x for x in r.transcript if x["type"] == "retry"]
    assert [(x["turn"], x["attempt"]) for x in retries] == [(2, 0), (2, 1)] and all("429" in x["error"] for x in retries)
    assert all(x["wait_s"] == 0 for x in retries)  # Retry-After: 0 honoured over the backoff


def test_four_429s_exit_2_naming_the_status(own_upstream, fixtures, tmp_path):
    own_upstream.inject(status=429, times=4, message=f"slow down, {KEY}")  # an upstream that echoes the key
    r = run_agent(own_upstream, "damaged-item-full-refund", tmp_path, fixtures["damaged-item-full-refund"])
    assert r.rc == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "HTTP 429" in r.stderr and "4 attempts" in r.stderr
    assert len(own_upstream.requests) == 4
    assert KEY not in r.stderr and KEY not in r.transcript_text and "[redacted]" in r.stderr
    assert not r.passed and r.reason.startswith("refunds: expected 1 row, found 0")


@pytest.mark.parametrize("status, mode", [(500, "status"), (503, "status"), (0, "reset"), (0, "truncate")])
def test_transient_failures_are_retried(own_upstream, fixtures, tmp_path, status, mode):
    own_upstream.inject(status=status, mode=mode, times=2, match=lambda q: turn_of(q) == 1)
    r = run_agent(own_upstream, "outside-window", tmp_path, fixtures["outside-window"], env={"REFUNDS_LLM_BACKOFF": "0.1"})
    assert (r.rc, r.passed) == (0, True), (r.stderr, r.reason)
    second = [q["time"] for q in own_upstream.requests if turn_of(q) == 1]
    assert len(second) == 3
    assert second[1] - second[0] >= 0.1 and second[2] - second[1] >= 0.2  # exponential backoff, no Retry-After


def test_a_timed_out_request_is_retried(own_upstream, fixtures, tmp_path):
    own_upstream.inject(mode="slow:3", times=1, match=lambda q: turn_of(q) == 0)
    r = run_agent(own_upstream, "outside-window", tmp_path, fixtures["outside-window"], env={"REFUNDS_LLM_TIMEOUT": "0.5"})
    assert (r.rc, r.passed) == (0, True), (r.stderr, r.reason)
    retry = next(x for x in r.transcript if x["type"] == "retry")
    assert retry["turn"] == 0 and "timed out" in retry["error"].lower()


def test_retry_after_is_honoured(own_upstream, fixtures, tmp_path):
    own_upstream.inject(status=429, times=1, headers={"Retry-After": "1"}, match=lambda q: turn_of(q) == 1)
    r = run_agent(own_upstream, "outside-window", tmp_path, fixtures["outside-window"], env={"REFUNDS_LLM_BACKOFF": "0.01"})
    assert (r.rc, r.passed) == (0, True)
    t = [q["time"] for q in own_upstream.requests if turn_of(q) == 1]
    assert len(t) == 2 and t[1] - t[0] >= 0.95
    assert llmagent.retry_delay({"retry-after": "3600"}, 0, 0.5) == 10.0  # capped
    assert llmagent.retry_delay({}, 2, 0.5) == 2.0


def test_client_errors_are_not_retried(own_upstream, fixtures, tmp_path):
    own_upstream.inject(status=401, times=1, message=f"invalid key {KEY}")
    r = run_agent(own_upstream, "outside-window", tmp_path, fixtures["outside-window"])
    assert r.rc == 2 and "HTTP 401" in r.stderr and "not retried" in r.stderr
    assert len(own_upstream.requests) == 1 and KEY not in r.stderr + r.transcript_text


def test_unreachable_api_exits_2(fixtures, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the agent runs: connection refused
    r = run_agent(None, "outside-window", tmp_path, fixtures["outside-window"], base_url=f"http://127.0.0.1:{port}/v1",
                  env={"REFUNDS_LLM_BACKOFF": "0.01"})
    assert r.rc == 2 and "connection error" in r.stderr and "4 attempts" in r.stderr


def test_malformed_tool_arguments_go_back_to_the_model(own_upstream, fixtures, tmp_path):
    r = run_agent(own_upstream, "damaged-item-full-refund", tmp_path, fixtures["damaged-item-full-refund"],
                  model="test-refunds:recovers-from-bad-arguments")
    assert (r.rc, r.passed) == (0, True), (r.stderr, r.reason)
    errors = [json.loads(x["content"])["error"] for x in r.transcript if x["type"] == "tool_result" and x["exit"] is None]
    assert len(errors) == 2 and "not valid JSON" in errors[0] and "unknown tool 'lookup_order'" in errors[1]
    answered = own_upstream.requests[2]["json"]["messages"][-1]
    assert answered["role"] == "tool" and "not valid JSON" in answered["content"]


def test_turn_limit_exits_3(own_upstream, fixtures, tmp_path):
    r = run_agent(own_upstream, "split-payment", tmp_path, fixtures["split-payment"], env={"REFUNDS_LLM_MAX_TURNS": "2"})
    assert r.rc == 3 and "2 turns" in r.stderr
    assert len(own_upstream.requests) == 2 and r.transcript[-1]["type"] == "gave_up"


def test_unknown_ticket_gets_no_help(own_upstream, fixtures, tmp_path):
    r = run_agent(own_upstream, "outside-window", tmp_path, fixtures["outside-window"], prompt="Hello, can you help me with my order?")
    assert r.rc == 0 and "I cannot help" in r.stdout and len(own_upstream.requests) == 1
    assert not r.passed  # nothing done: the task's email is missing


def test_missing_prompt_is_an_internal_error(tmp_path):
    env = {**os.environ, "HARNESS_PROMPT_FILE": str(tmp_path / "none.txt"), "HARNESS_TRANSCRIPT": str(tmp_path / "t.jsonl"),
           "OPENAI_API_KEY": KEY}
    p = subprocess.run([*PY, str(AGENT)], check=False, env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and "cannot read the ticket" in p.stderr


# ---------------------------------------------------------------------------- the test upstream itself


def request(up: TestUpstream, method: str, path: str, body: dict | None = None, headers: dict | None = None,
            conn: http.client.HTTPConnection | None = None):
    """(status, headers, body bytes) over ``conn`` or a new connection."""
    c = conn or http.client.HTTPConnection("127.0.0.1", up.port, timeout=30)
    data = json.dumps(body).encode() if body is not None else None
    c.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = c.getresponse()
    try:
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        if conn is None:
            c.close()


def sse(raw: bytes) -> list[tuple[str | None, str]]:
    """Parse an event stream into (event name, data) pairs."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
            else:
                raise AssertionError(f"not an SSE line: {line!r}")
        out.append((name, "\n".join(data)))
    return out


MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one two three four five six seven"}]
BODIES = {  # the same conversation in each API: 9 words in
    "chat": ("/chat/completions", {"messages": MESSAGES}),
    "responses": ("/responses", {"instructions": "be brief", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "one two three four five six seven"}]}]}),
    "messages": ("/messages", {"system": "be brief", "max_tokens": 100, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "one two three four five six seven"}]}]}),
}
APIS = list(BODIES)


def call(up, api: str, model: str, stream: bool = False, prefix: str = "/v1", **extra):
    path, body = BODIES[api]
    return request(up, "POST", prefix + path, {**body, "model": model, "stream": stream, **extra})


def text_and_usage(api: str, obj: dict) -> tuple[str, dict | None]:
    if api == "chat":
        return obj["choices"][0]["message"]["content"], obj.get("usage")
    if api == "responses":
        return obj["output"][0]["content"][0]["text"], obj.get("usage")
    return obj["content"][0]["text"], obj.get("usage")


def stream_text_and_usage(api: str, events: list[tuple[str | None, str]]) -> tuple[str, dict | None]:
    """Check an API's stream is well formed; its text and the usage it carried (normalized)."""
    if api == "chat":
        assert events[-1] == (None, "[DONE]")
        chunks = [json.loads(d) for _, d in events[:-1]]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        assert finish == ["stop"]
        usage = [c["usage"] for c in chunks if c.get("usage")]
        assert len(usage) <= 1 and (not usage or chunks[-1]["choices"] == [])  # only in the last, choice-less chunk
        return text, usage[0] if usage else None
    if api == "responses":
        kinds = [n for n, _ in events]
        datas = [json.loads(d) for _, d in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert all(d["type"] == n for n, d in zip(kinds, datas))
        assert [d["sequence_number"] for d in datas] == list(range(len(datas)))
        text = "".join(d["delta"] for d in datas if d["type"] == "response.output_text.delta")
        assert text == next(d["text"] for d in datas if d["type"] == "response.output_text.done")
        done = datas[-1]["response"]
        assert done["status"] == "completed" and done["output"][0]["content"][0]["text"] == text
        return text, done.get("usage")
    kinds = [n for n, _ in events]
    datas = [json.loads(d) for _, d in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert all(d["type"] == n for n, d in zip(kinds, datas))
    text = "".join(d["delta"]["text"] for d in datas if d["type"] == "content_block_delta")
    start, delta = datas[0]["message"].get("usage"), datas[-2].get("usage")
    assert (start is None) == (delta is None)
    return text, ({**start, "output_tokens": delta["output_tokens"]} if start else None)


def expected_usage(api: str, words_in: int, text: str) -> dict:
    out, cached = len(text.split()), words_in // 4
    if api == "chat":
        return {"prompt_tokens": words_in, "completion_tokens": out, "total_tokens": words_in + out,
                "prompt_tokens_details": {"cached_tokens": cached}, "completion_tokens_details": {"reasoning_tokens": 0}}
    if api == "responses":
        return {"input_tokens": words_in, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": out,
                "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": words_in + out}
    return {"input_tokens": words_in - cached, "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
            "output_tokens": out}


def test_upstream_names_itself_and_binds_all_interfaces(upstream):
    assert "test upstream" in TestUpstream.__doc__ and "not a model" in sys.modules[TestUpstream.__module__].__doc__.lower()
    assert upstream.server.server_address[0] == "0.0.0.0" and upstream.url == f"http://127.0.0.1:{upstream.port}"


@pytest.mark.parametrize("prefix", ["/v1", ""])
def test_upstream_models(upstream, prefix):
    status, _, raw = request(upstream, "GET", f"{prefix}/models")
    listing = json.loads(raw)
    assert status == 200 and listing["object"] == "list" and "test-echo" in [m["id"] for m in listing["data"]]
    status, _, raw = request(upstream, "GET", f"{prefix}/models", headers={"anthropic-version": "2023-06-01"})
    assert status == 200 and json.loads(raw)["data"][0]["type"] == "model"


@pytest.mark.parametrize("prefix", ["/v1", ""])
@pytest.mark.parametrize("api", APIS)
def test_upstream_echo(own_upstream, api, prefix):
    status, headers, raw = call(own_upstream, api, "test-echo", prefix=prefix)
    assert status == 200 and headers["content-type"] == "application/json"
    obj = json.loads(raw)
    text, usage = text_and_usage(api, obj)
    assert text.startswith("test upstream echo (9 words in): one two three")
    assert usage == expected_usage(api, 9, text) == own_upstream.reported[-1]
    assert {"chat": "chat.completion", "responses": "response"}.get(api, "message") == obj.get("object", obj.get("type"))
    # deterministic
    assert text_and_usage(api, json.loads(call(own_upstream, api, "test-echo", prefix=prefix)[2])) == (text, usage)


@pytest.mark.parametrize("api", APIS)
def test_upstream_echo_stream(own_upstream, api):
    plain, _ = text_and_usage(api, json.loads(call(own_upstream, api, "test-echo")[2]))
    extra = {"stream_options": {"include_usage": True}} if api == "chat" else {}
    status, headers, raw = call(own_upstream, api, "test-echo", stream=True, **extra)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert headers["transfer-encoding"] == "chunked"
    events = sse(raw)
    assert len(events) > 5
    text, usage = stream_text_and_usage(api, events)
    assert text == plain and usage == expected_usage(api, 9, text) == own_upstream.reported[-1]
    if api == "chat":  # without include_usage: no usage chunk, nothing reported
        status, _, raw = call(own_upstream, api, "test-echo", stream=True)
        assert stream_text_and_usage(api, sse(raw)) == (plain, None) and own_upstream.reported[-1] is None
        assert b'"usage"' not in raw


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", APIS)
def test_upstream_nousage(own_upstream, api, stream):
    extra = {"stream_options": {"include_usage": True}} if api == "chat" and stream else {}
    status, _, raw = call(own_upstream, api, "test-nousage", stream=stream, **extra)
    assert status == 200 and b'"usage"' not in raw and b"tokens" not in raw  # no usage at all, not zeros
    text = (stream_text_and_usage(api, sse(raw)) if stream else text_and_usage(api, json.loads(raw)))[0]
    assert text.startswith("test upstream echo")
    assert own_upstream.reported == [None]


@pytest.mark.parametrize("model, code", [("test-429", 429), ("test-500", 500), ("test-503", 503)])
@pytest.mark.parametrize("api", APIS)
def test_upstream_error_models(own_upstream, api, model, code):
    status, headers, raw = call(own_upstream, api, model)
    err = json.loads(raw)
    assert status == code
    if api == "messages":
        assert err["type"] == "error" and err["error"]["type"] and err["error"]["message"]
    else:
        assert set(err["error"]) == {"message", "type", "param", "code"}
    assert (headers.get("retry-after") == "0") == (code == 429)


@pytest.mark.parametrize("api", APIS)
def test_upstream_truncate(own_upstream, api):
    with pytest.raises(http.client.IncompleteRead):
        call(own_upstream, api, "test-truncate")
    # a stream stops mid-way: no terminating chunk, so the client sees an incomplete read
    with pytest.raises(http.client.IncompleteRead) as e:
        call(own_upstream, api, "test-truncate", stream=True)
    partial = e.value.partial.decode()
    assert partial and "[DONE]" not in partial and "response.completed" not in partial and "message_stop" not in partial


def elapsed(fn) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def test_upstream_slow(own_upstream):
    baseline = min(elapsed(lambda: call(own_upstream, "chat", "test-echo")) for _ in range(3))
    slow = elapsed(lambda: call(own_upstream, "chat", "test-slow-0.5"))
    assert baseline + 0.45 <= slow <= baseline + 5
    # streaming: the same wait before the answer and between events
    stream_base = min(elapsed(lambda: call(own_upstream, "messages", "test-echo", stream=True)) for _ in range(3))
    _, _, raw = call(own_upstream, "messages", "test-slow-0.05", stream=True)
    gaps = len(sse(raw)) - 1
    slow_stream = elapsed(lambda: call(own_upstream, "messages", "test-slow-0.05", stream=True))
    assert stream_base + 0.05 * (1 + gaps) * 0.9 <= slow_stream <= stream_base + 0.05 * (1 + gaps) + 5
    assert stream_text_and_usage("messages", sse(raw))[1] is not None
    status, _, _ = call(own_upstream, "chat", "test-slow-forever")
    assert status == 400


def test_upstream_unknown_model_and_path(own_upstream):
    status, _, raw = call(own_upstream, "chat", "gpt-4o")
    assert status == 404 and json.loads(raw)["error"]["code"] == "model_not_found"
    assert request(own_upstream, "POST", "/v1/embeddings", {"model": "test-echo"})[0] == 404


def test_upstream_injection(own_upstream):
    up = own_upstream
    up.inject(status=500, times=2, match=lambda q: q["json"]["model"] == "test-echo")
    assert call(up, "chat", "test-nousage")[0] == 200  # does not match
    assert [call(up, "chat", "test-echo")[0] for _ in range(3)] == [500, 500, 200]
    up.inject(status=429, times=1)
    status, headers, _ = call(up, "messages", "test-echo")
    assert status == 429 and headers["retry-after"] == "0"
    up.inject(mode="reset")
    with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected)):
        call(up, "chat", "test-echo")
    up.inject(mode="truncate")
    with pytest.raises(http.client.IncompleteRead):
        call(up, "responses", "test-echo")
    baseline = min(elapsed(lambda: call(up, "chat", "test-echo")) for _ in range(3))
    up.inject(mode="slow:0.4")
    assert elapsed(lambda: call(up, "chat", "test-echo")) >= baseline + 0.35
    assert call(up, "chat", "test-echo")[0] == 200
    with pytest.raises(ValueError, match="unknown injection mode"):
        up.inject(mode="explode")


def test_upstream_injection_is_thread_safe(own_upstream):
    own_upstream.inject(status=429, times=5)
    with ThreadPoolExecutor(max_workers=8) as pool:
        codes = list(pool.map(lambda _: call(own_upstream, "chat", "test-echo")[0], range(24)))
    assert sorted(codes).count(429) == 5 and codes.count(200) == 19
    assert len(own_upstream.requests) == len(own_upstream.reported) == 24


def test_upstream_keep_alive(own_upstream):
    conn = http.client.HTTPConnection("127.0.0.1", own_upstream.port, timeout=30)
    try:
        path, body = BODIES["chat"]
        first = request(own_upstream, "POST", "/v1" + path, {**body, "model": "test-echo"}, conn=conn)
        sock = conn.sock
        second = request(own_upstream, "POST", "/v1" + path, {**body, "model": "test-echo", "stream": True}, conn=conn)
        third = request(own_upstream, "GET", "/v1/models", conn=conn)
        fourth = request(own_upstream, "POST", "/v1/messages", {**BODIES["messages"][1], "model": "test-429"}, conn=conn)
        assert [r[0] for r in (first, second, third, fourth)] == [200, 200, 200, 429]
        assert conn.sock is sock  # one connection for all four
    finally:
        conn.close()


def test_upstream_requires_its_key_when_given_one():
    with TestUpstream(key="sk-upstream") as up:
        assert call(up, "chat", "test-echo")[0] == 401
        path, body = BODIES["chat"]
        assert request(up, "POST", "/v1" + path, {**body, "model": "test-echo"}, {"Authorization": "Bearer sk-upstream"})[0] == 200
        path, body = BODIES["messages"]
        assert request(up, "POST", "/v1" + path, {**body, "model": "test-echo"}, {"x-api-key": "sk-upstream"})[0] == 200
        assert up.requests[1]["headers"]["authorization"] == "Bearer sk-upstream"


def test_upstream_refunds_model(own_upstream):
    prompt = SUITE.task("damaged-item-full-refund").prompt
    conv = [{"role": "system", "content": "x"}, {"role": "user", "content": prompt}]
    status, _, raw = request(own_upstream, "POST", "/v1/chat/completions", {"model": "test-refunds", "seed": 0, "messages": conv})
    reply = json.loads(raw)
    choice = reply["choices"][0]
    assert status == 200 and choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (tc,) = choice["message"]["tool_calls"]
    assert tc["type"] == "function" and tc["function"] == {"name": "policy", "arguments": "{}"}
    assert reply["usage"]["prompt_tokens"] > 0 and own_upstream.reported[-1] == reply["usage"]
    # the same turn streamed: the tool call comes in deltas
    _, _, raw = request(own_upstream, "POST", "/chat/completions",
                        {"model": "test-refunds", "seed": 0, "messages": conv, "stream": True, "stream_options": {"include_usage": True}})
    chunks = [json.loads(d) for _, d in sse(raw)[:-1]]
    deltas = [tcd for c in chunks if c["choices"] for tcd in c["choices"][0]["delta"].get("tool_calls", [])]
    assert deltas[0]["id"] == tc["id"] and deltas[0]["function"]["name"] == "policy"
    assert "".join(d["function"]["arguments"] for d in deltas) == "{}"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls" and chunks[-1]["usage"]
    # a tool call left unanswered, or a tool message answering nothing: 400, as the real API
    bad = [*conv, choice["message"], {"role": "user", "content": "?"}]
    assert request(own_upstream, "POST", "/v1/chat/completions", {"model": "test-refunds", "messages": bad})[0] == 400
    bad = [*conv, {"role": "tool", "tool_call_id": "nope", "content": "{}"}]
    assert request(own_upstream, "POST", "/v1/chat/completions", {"model": "test-refunds", "messages": bad})[0] == 400
    # unknown ticket, unknown variant, other APIs
    status, _, raw = request(own_upstream, "POST", "/v1/chat/completions",
                             {"model": "test-refunds", "messages": [{"role": "user", "content": "hello"}]})
    msg = json.loads(raw)["choices"][0]
    assert msg["finish_reason"] == "stop" and "I cannot help" in msg["message"]["content"] and "tool_calls" not in msg["message"]
    assert request(own_upstream, "POST", "/v1/chat/completions", {"model": "test-refunds:nonsense", "messages": conv})[0] == 400
    assert call(own_upstream, "messages", "test-refunds")[0] == 400


def test_upstream_cli_runs_in_the_foreground():
    env = {k: v for k, v in os.environ.items() if k not in PROXY_VARS}
    p = subprocess.Popen([sys.executable, "-m", "tests.testupstream", "--port", "0"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = [None]
        reader = threading.Thread(target=lambda: line.__setitem__(0, p.stdout.readline()), daemon=True)
        reader.start()
        reader.join(30)
        assert line[0], p.stderr.read() if p.poll() is not None else "no line within 30 s"
        assert "test upstream" in line[0] and "NOT a model" in line[0]
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/v1", line[0]).group(1))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/v1/models")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    assert p.returncode == 0, p.stderr.read()
