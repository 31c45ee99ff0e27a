"""OpenTelemetry export (`harness run --otlp`, `harness export RUN --otlp`) against a real
OTLP/HTTP receiver started here (OtlpTestReceiver: decodes the protobuf body the way a
collector does; it is not a collector and stores nothing but the decoded spans).

One small real run shared by the module: two refunds tasks, one trial each, the LLM agent
through the model gateway against the test upstream (tests/testupstream.py), the first four
calls answered 429 so one attempt is discarded (upstream_rate_limited) and rerun. It is sent
live with --otlp, then exported from the store to a second receiver: both trees are compared
span by span. Then a collector that is down (live and after the fact), bad input, the extra
missing, and a pure mapping test on records made in-process.
"""

from __future__ import annotations

import calendar
import datetime as dt
import gzip
import json
import os
import secrets
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import run_cli  # Docker-backed tests take conftest's docker_client: missing() fails them under CI
from harness.store.store import Store

KEY = "sk-test-" + secrets.token_hex(20)  # a provider key: must never reach a span
HEADER_VALUE = "Bearer otlp-" + secrets.token_hex(12)  # an --otlp-header value: sent, never printed
PROBE = str(Path(__file__).parent / "suites" / "probe")


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def _attrs(kvs) -> dict:
    return {kv.key: _value(kv.value) for kv in kvs}


class _HttpTestServer:
    """A real ThreadingHTTPServer on 127.0.0.1, served from a thread for a ``with`` block."""

    def _serve(self, handler) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _release(self) -> None:
        """Lets handlers still running return (before the server is shut down)."""

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._release()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


class OtlpTestReceiver(_HttpTestServer):
    """A real HTTP server speaking the receiving side of OTLP/HTTP protobuf for traces:
    POST /v1/traces, gzip or plain, 200 with an empty ExportTraceServiceResponse. Decoded
    spans are kept as dicts (ids as hex)."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse

        self.spans: list[dict] = []
        self.resources: list[dict] = []
        self.headers: list[dict] = []
        self.lock = threading.Lock()
        recv = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                with recv.lock:
                    recv.headers.append({k.lower(): v for k, v in self.headers.items()})
                    for rs in req.resource_spans:
                        res = _attrs(rs.resource.attributes)
                        recv.resources.append(res)
                        for ss in rs.scope_spans:
                            for s in ss.spans:
                                recv.spans.append({
                                    "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(), "parent": s.parent_span_id.hex(),
                                    "name": s.name, "kind": s.kind, "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                                    "attributes": _attrs(s.attributes), "status": (s.status.code, s.status.message),
                                    "events": [{"name": e.name, "time": e.time_unix_nano, "attributes": _attrs(e.attributes)}
                                               for e in s.events],
                                    "scope": ss.scope.name, "resource": res})
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        self._serve(Handler)


def _dead_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connections are refused
    return port


def _tree(spans: list[dict]) -> set:
    return {(s["trace_id"], s["span_id"], s["parent"], s["name"], s["start"], s["end"]) for s in spans}


# -- one real run, sent live, then exported from the store ---------------------------

@pytest.fixture(scope="module")
def otel_run(tmp_path_factory, docker_client):
    from testupstream import TestUpstream

    tmp = tmp_path_factory.mktemp("otlp")
    with TestUpstream(key=KEY) as up, OtlpTestReceiver() as live:
        up.inject(status=429, times=4)  # more than the agent retries: its attempt is discarded (upstream) and rerun
        res = run_cli(tmp, "run", "--suite", "refunds", "--agent", "llm", "--secret", "OPENAI_API_KEY",
                      "--upstream", f"openai=http://host.docker.internal:{up.port}/v1", "--agent-env", "REFUNDS_LLM_MODEL=test-refunds",
                      "--tasks", "outside-window,duplicate-charge", "--trials", "1", "--k", "1", "--max-reruns", "8", "--json",
                      "--otlp", live.url, "--otlp-header", f"authorization={HEADER_VALUE}",
                      env={"OPENAI_API_KEY": KEY}, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    run_id = json.loads(res.stdout)["run_id"]
    with OtlpTestReceiver() as after:
        exp = run_cli(tmp, "export", run_id, "--otlp", after.url)
    assert exp.returncode == 0, exp.stderr
    return {"tmp": tmp, "run_id": run_id, "run": res, "export": exp, "live": live, "after": after}


def _store(tmp: Path) -> Store:
    return Store.open(f"sqlite:///{tmp / 'home' / 'harness.db'}", mode="ro")


@pytest.mark.docker
def test_export_sends_the_stored_run_as_one_tree(otel_run):
    spans, run_id = otel_run["after"].spans, otel_run["run_id"]
    store = _store(otel_run["tmp"])
    run, attempts = store.get_run(run_id), store.attempts(run_id)
    assert f"exported {len(spans)} spans of run {run_id}" in otel_run["export"].stderr
    assert len({s["trace_id"] for s in spans}) == 1
    assert len({s["span_id"] for s in spans}) == len(spans)
    by_id = {s["span_id"]: s for s in spans}
    roots = [s for s in spans if not s["parent"]]
    assert [r["name"] for r in roots] == ["run refunds"]
    root = roots[0]
    ra = root["attributes"]
    assert ra["harness.run_id"] == run_id and ra["harness.suite"] == "refunds" and ra["harness.suite_hash"] == run.suite_hash
    assert ra["harness.image"] == run.image and ra["harness.profile"] == run.profile and ra["harness.version"] == run.harness_version
    assert ra["harness.cgroup_version"] == run.cgroup_version and ra["harness.run.status"] == "complete"
    assert ra["harness.secrets"] == ["OPENAI_API_KEY"]  # the name, never the value
    assert root["resource"]["service.name"] == "harness" and root["resource"]["harness.run_id"] == run_id
    # the same instance id live and after the fact (an export sent again is the same instance)
    live_ids = {s["resource"]["service.instance.id"] for s in otel_run["live"].spans}
    assert live_ids == {s["resource"]["service.instance.id"] for s in spans} and len(live_ids) == 1

    slots = [s for s in spans if s["name"].startswith("slot ")]
    assert sorted(s["name"] for s in slots) == ["slot duplicate-charge", "slot outside-window"]
    assert all(s["parent"] == root["span_id"] for s in slots)
    att_spans = [s for s in spans if s["name"] == "attempt"]
    assert len(att_spans) == len(attempts) >= 3  # every attempt, the discarded one too
    for s in att_spans:
        slot = by_id[s["parent"]]
        assert slot["name"] == f"slot {s['attributes']['harness.task.id']}"
        assert slot["attributes"]["harness.slot"] == s["attributes"]["harness.slot"]
        assert slot["start"] <= s["start"] <= s["end"] <= slot["end"]
    for s in spans:
        if s["name"] in ("setup", "agent", "grade"):
            parent = by_id[s["parent"]]
            assert parent["name"] == "attempt" and parent["start"] <= s["start"] <= s["end"] <= parent["end"]

    recs = {(a.task_id, a.slot, a.attempt_no): a for a in attempts}
    seen_discard = seen_eval = 0
    for s in att_spans:
        at = s["attributes"]
        a = recs[(at["harness.task.id"], at["harness.slot"], at["harness.attempt_no"])]
        t = a.started_at
        assert s["start"] == (calendar.timegm(t.timetuple()) * 10 ** 6 + t.microsecond) * 1000  # the recorded time, to the µs
        assert at["harness.verdict"] == a.verdict and at["harness.seed"] == a.seed and at["harness.cpuset"] == a.cpuset
        assert at["harness.envelope.requested.memory"] == a.envelope["memory"]
        assert at["harness.envelope.applied.memory_max"] == a.envelope_applied["memory_max"]
        assert isinstance(at["harness.counters.cpu_usage_us"], int) and at["harness.counters.cpu_usage_us"] == a.counters["cpu_usage_us"]
        assert isinstance(at["harness.host_counters.foreign_cpu_share"], float)
        assert isinstance(at["harness.wall_s"], float) and at["harness.wall_s"] == a.wall_s
        phases = [p for p in spans if p["parent"] == s["span_id"] and not p["name"].startswith("chat")]
        assert [p["name"] for p in phases] == [p["name"] for p in a.phases] and "agent" in [p["name"] for p in a.phases]
        for span, kept in zip(phases, a.phases):  # the controller's own times (kept to 0.1 ms), not an estimate
            assert span["attributes"]["harness.phase.start_estimated"] is False
            assert abs(span["start"] - (s["start"] + round(kept["start_s"] * 1e9))) <= 1
            assert span["end"] <= s["end"] and abs(span["end"] - span["start"] - round(kept["wall_s"] * 1e9)) <= 200_000
        if a.verdict == "discarded":  # the 429s discard one; a loaded host may discard others (foreign CPU)
            seen_discard += "upstream_rate_limited" in a.reasons
            assert at["harness.discard.reasons"] == a.reasons and set(a.reasons) <= set(at["harness.sla.fired"])
            assert all(at[f"harness.sla.rule.{r}.breached"] is True for r in a.reasons if r in at["harness.sla.fired"])
            assert s["status"][0] == 2 and s["status"][1] == "discarded: " + ", ".join(a.reasons)
        events = [e for e in s["events"] if e["name"] == "gen_ai.evaluation.result"]
        if a.outcome is not None:
            seen_eval += 1
            ev = events[0]["attributes"]
            assert ev["gen_ai.evaluation.name"] == "harness.grade"
            assert ev["harness.scored"] is (a.verdict == "clean")
            if a.verdict == "clean":
                assert ev["gen_ai.evaluation.score.value"] == (1.0 if a.outcome == "pass" else 0.0)
                assert ev["gen_ai.evaluation.score.label"] == ("pass" if a.outcome == "pass" else a.failure_kind)
            else:  # not counted by the harness: no score a dashboard could average
                assert "gen_ai.evaluation.score.value" not in ev and ev["gen_ai.evaluation.score.label"] == "not_scored"
                assert ev["harness.grade.outcome"] == a.outcome
            if a.outcome == "fail":
                assert ev["gen_ai.evaluation.explanation"] == a.grade_reason[:1024]
                if a.verdict == "clean":
                    assert s["status"][0] == 2 and s["status"][1] == f"fail: {a.failure_kind}"
        else:
            assert not events
    assert seen_discard >= 1 and seen_eval >= 2

    calls = [s for s in spans if s["kind"] == 3]  # SPAN_KIND_CLIENT: the model calls
    assert len(calls) == sum(len(a.model_calls) for a in attempts) > 0
    for c in calls:
        assert c["name"] == "chat test-refunds" and by_id[c["parent"]]["name"] == "agent"
        at = c["attributes"]
        assert at["gen_ai.operation.name"] == "chat" and at["gen_ai.provider.name"] == "openai" == at["gen_ai.system"]
        assert at["gen_ai.request.model"] == "test-refunds"
        att = by_id[by_id[c["parent"]]["parent"]]["attributes"]
        rec = recs[(att["harness.task.id"], att["harness.slot"], att["harness.attempt_no"])].model_calls[at["harness.model_call.index"]]
        assert c["start"] == round(rec["started"] * 1e9) and c["end"] - c["start"] == round(rec["latency_s"] * 1e9)
        if rec["error"]:
            assert at["error.type"] == "rate_limited" and at["http.response.status_code"] == 429 and c["status"][0] == 2
        else:
            assert at["gen_ai.usage.input_tokens"] == rec["tokens_in"] > 0 and at["gen_ai.usage.output_tokens"] == rec["tokens_out"]
    assert sum(1 for c in calls if c["attributes"].get("error.type") == "rate_limited") == 4
    assert KEY not in json.dumps(spans), "a secret value reached a span"


@pytest.mark.docker
def test_live_spans_are_the_exported_tree(otel_run):
    live, after = otel_run["live"], otel_run["after"]
    assert live.spans and _tree(live.spans) == _tree(after.spans)  # ids, parents, names and recorded times
    by_id = {s["span_id"]: s for s in after.spans}
    for s in live.spans:
        assert s["attributes"] == by_id[s["span_id"]]["attributes"] and s["events"] == by_id[s["span_id"]]["events"]
        assert s["status"] == by_id[s["span_id"]]["status"]
    assert all(h.get("authorization") == HEADER_VALUE for h in live.headers)  # --otlp-header reached the collector
    run = otel_run["run"]
    assert HEADER_VALUE not in run.stdout + run.stderr and KEY not in json.dumps(live.spans)
    assert f"otlp: {len(live.spans)} spans of run {otel_run['run_id']} sent to" in run.stderr


# -- a collector that is down ---------------------------------------------------------

@pytest.mark.docker
def test_collector_down_the_run_goes_on_and_export_exits_3(tmp_path, docker_client):
    port = _dead_port()
    env = {"OTEL_EXPORTER_OTLP_TIMEOUT": "2000"}  # milliseconds
    res = run_cli(tmp_path, "run", "--suite", PROBE, "--tasks", "append", "--trials", "2", "--k", "1", "--json",
                  "--otlp", f"http://127.0.0.1:{port}", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    run_id = json.loads(res.stdout)["run_id"]
    attempts = _store(tmp_path).attempts(run_id)
    assert len([a for a in attempts if a.verdict == "clean"]) == 2  # everything stored
    lines = [ln for ln in res.stderr.splitlines() if str(port) in ln]
    assert len(lines) == 1 and "did not take spans (connection refused; is it running" in lines[0] and f"harness export {run_id}" in lines[0], res.stderr
    assert "Traceback" not in res.stderr and "Transient error" not in res.stderr

    exp = run_cli(tmp_path, "export", run_id, "--otlp", f"http://127.0.0.1:{port}/v1/traces", env=env)
    assert exp.returncode == 3, exp.stderr
    out = exp.stderr.strip().splitlines()
    assert len(out) == 1 and f"127.0.0.1:{port}/v1/traces" in out[0] and "connection refused" in out[0], exp.stderr
    # a refused port is known at once: the export does not retry until its timeout (here a
    # minute) has passed, as the SDK alone does
    t0 = time.monotonic()
    exp = run_cli(tmp_path, "export", run_id, "--otlp", f"http://127.0.0.1:{port}", env={"OTEL_EXPORTER_OTLP_TIMEOUT": "60000"})
    assert exp.returncode == 3 and "connection refused" in exp.stderr and time.monotonic() - t0 < 30, exp.stderr


# -- bad input ------------------------------------------------------------------------

BAD_URLS = ["localhost:4318", "ftp://collector:4318", "http://", "http://a b:4318", "http://h:99999", "http://h:4318/#x"]


def test_a_bad_otlp_url_is_a_usage_error_before_anything_runs(tmp_path):
    from harness.engine.otel import traces_url
    from harness.model.errors import UsageError

    for url in BAD_URLS:
        with pytest.raises(UsageError, match="http://localhost:4318"):
            traces_url(url)
    assert traces_url("http://c:4318") == traces_url("http://c:4318/") == traces_url("http://c:4318/v1/traces") == "http://c:4318/v1/traces"
    assert traces_url("https://c/otlp") == "https://c/otlp/v1/traces"
    res = run_cli(tmp_path, "run", "--suite", PROBE, "--trials", "1", "--otlp", BAD_URLS[0])
    assert res.returncode == 2, res.stderr
    assert "--otlp" in res.stderr and "http://localhost:4318" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "home" / "harness.db").exists()
    exp = run_cli(tmp_path, "export", "last", "--otlp", BAD_URLS[1])
    assert exp.returncode == 2 and "--otlp" in exp.stderr and len(exp.stderr.strip().splitlines()) == 1


@pytest.mark.docker
def test_bad_headers_and_unknown_runs_are_usage_errors(otel_run):
    tmp = otel_run["tmp"]
    res = run_cli(tmp, "export", "last", "--otlp", "http://127.0.0.1:1", "--otlp-header", "Bearer-sk-secretish")
    assert res.returncode == 2 and "KEY=VALUE" in res.stderr and "sk-secretish" not in res.stderr
    res = run_cli(tmp, "export", "no-such-run", "--otlp", "http://127.0.0.1:1")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "no such run" in res.stderr
    res = run_cli(tmp, "run", "--suite", PROBE, "--otlp-header", "a=b")
    assert res.returncode == 2 and "--otlp-header goes with --otlp" in res.stderr
    res = run_cli(tmp, "export", "last", "--otlp", "http://SECRETUSER:SECRETPW@127.0.0.1:1/?k=SECRETQ")
    assert res.returncode == 3 and "SECRET" not in res.stderr and "***@127.0.0.1:1" in res.stderr, res.stderr
    for var in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"):  # the SDK would drop it in silence
        res = run_cli(tmp, "export", "last", "--otlp", "http://127.0.0.1:1", env={var: "x-team=evals,garbageSECRETVALUE123"})
        assert res.returncode == 2 and f"${var}" in res.stderr and "SECRETVALUE" not in res.stderr, res.stderr


class _FailingCollector(_HttpTestServer):
    """A real HTTP server on 127.0.0.1 that answers every POST with ``status``, or with
    ``status=None`` takes the request and never answers (a hung collector)."""

    def __init__(self, status: int | None):
        release = self.release = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if status is None:
                    release.wait(60)
                    return
                self.send_error(status)

            def log_message(self, *a):
                pass

        self._serve(Handler)

    def _release(self) -> None:
        self.release.set()


def test_the_export_timeout_is_milliseconds_and_a_bad_one_is_a_usage_error(tmp_path, monkeypatch):
    from harness.engine.otel import export_timeout
    from harness.model.errors import UsageError

    for var in ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)
    assert export_timeout() == 10.0  # the specification's default, 10000 ms
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2500")
    assert export_timeout() == 2.5
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "400")  # the traces one comes first, as in the SDK
    assert export_timeout() == 0.4
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
    for bad in ("0", "-5", "abc", "nan", "inf"):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", bad)
        with pytest.raises(UsageError, match="OTEL_EXPORTER_OTLP_TIMEOUT.*milliseconds"):
            export_timeout()
        for args in (("export", "last", "--otlp", "http://127.0.0.1:1"), ("run", "--suite", PROBE, "--trials", "1", "--otlp", "http://127.0.0.1:1")):
            res = run_cli(tmp_path, *args, env={"OTEL_EXPORTER_OTLP_TIMEOUT": bad})
            assert res.returncode == 2 and "milliseconds" in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "home" / "harness.db").exists()  # refused before anything was stored


@pytest.mark.docker
def test_a_collector_that_refuses_or_hangs_is_named_for_what_it_did(otel_run):
    tmp = otel_run["tmp"]
    with _FailingCollector(500) as c:
        res = run_cli(tmp, "export", "last", "--otlp", c.url)
    line = res.stderr.strip().splitlines()
    assert res.returncode == 3 and len(line) == 1 and "HTTP 500" in line[0] and "see its logs" in line[0], res.stderr
    assert "is it running" not in line[0]
    with _FailingCollector(None) as c:  # 300 ms, not 300 s: the variable is read in milliseconds
        res = run_cli(tmp, "export", "last", "--otlp", c.url, env={"OTEL_EXPORTER_OTLP_TIMEOUT": "300"}, timeout=120)
    line = res.stderr.strip().splitlines()
    assert res.returncode == 3 and len(line) == 1 and "timed out" in line[0] and "0.3 s" in line[0] and "milliseconds" in line[0], res.stderr


@pytest.mark.docker
def test_exporting_a_run_still_in_progress_says_it_will_be_sent_again(otel_run, tmp_path):
    import shutil
    import sqlite3

    (tmp_path / "home").mkdir()
    shutil.copy(otel_run["tmp"] / "home" / "harness.db", tmp_path / "home" / "harness.db")
    with sqlite3.connect(tmp_path / "home" / "harness.db") as con:  # as a run's controller keeps it while it runs
        con.execute("update runs set status = 'running' where id = ?", (otel_run["run_id"],))
    res = run_cli(tmp_path, "export", otel_run["run_id"], "--otlp", "http://127.0.0.1:1")
    assert res.returncode == 3  # nothing listens: the note comes before the attempt to send
    assert "still running" in res.stderr and "same ids" in res.stderr, res.stderr
    res = run_cli(otel_run["tmp"], "export", otel_run["run_id"], "--otlp", "http://127.0.0.1:1")
    assert res.returncode == 3 and "still running" not in res.stderr


def test_without_the_extra_otlp_names_the_install_and_harness_imports_no_opentelemetry(tmp_path):
    env = {**os.environ, "HARNESS_HOME": str(tmp_path / "home")}
    code = ("import sys; sys.modules['opentelemetry'] = None\n"  # as if the extra were not installed
            "from harness.cli import main; sys.argv = ['harness', *sys.argv[1:]]; main()")
    for args in (["export", "last", "--otlp", "http://127.0.0.1:1"], ["run", "--suite", PROBE, "--otlp", "http://127.0.0.1:1"]):
        res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        assert res.returncode == 2, res.stderr
        assert "pip install 'harness[otel]'" in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "home" / "harness.db").exists()
    res = subprocess.run([sys.executable, "-c", "import sys, harness.cli, harness.engine.otel, harness.engine.runner; "
                          "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr


# -- the mapping, from records made here ----------------------------------------------

def _records():
    from harness.model.attempt import AttemptRecord
    from harness.model.run import RunRecord

    t0 = dt.datetime(2026, 1, 2, 3, 4, 5, 123456)
    run = RunRecord(id="r-test-otel", created_at=t0, finished_at=t0 + dt.timedelta(seconds=30), status="complete", suite="s",
                    suite_hash="h" * 16, image="img", profile="standard", harness_version="0.1.0", trials=1, max_reruns=2,
                    task_ids=["t"], host={"kernel": "6.1", "cores": 2}, upstreams={"openai": "https://user:pw@up.example/v1"},
                    agent_env={"MODEL": "x"}, secrets=["OPENAI_API_KEY"])
    common = dict(run_id=run.id, task_id="t", slot=0, seed=7, cpuset="1", envelope={"memory": 1 << 28, "cpus": 1.0},
                  envelope_applied={"memory_max": 1 << 28, "cpuset_cpus": [1]}, counters={"cpu_usage_us": 1000, "throttled_share": 0.5},
                  host_counters={"foreign_cpu_share": 0.4, "pinned_cpus": [1]})
    bad = AttemptRecord(**common, attempt_no=1, verdict="discarded", reasons=["host_cpu_contention"],
                        rules=[{"rule": "host_cpu_contention", "scope": "host", "value": 0.4, "threshold": 0.1, "breached": True,
                                "detail": "40% foreign"}], outcome="pass", setup_wall_s=0.1, agent_wall_s=1.0, grade_wall_s=0.2,
                        wall_s=2.0, started_at=t0 + dt.timedelta(seconds=1), finished_at=t0 + dt.timedelta(seconds=3),
                        state_diff={"lines": ["SECRET-STATE-TEXT"]}, grade_checks=[{"name": "n", "passed": True, "detail": "AGENT-DETAIL"}])
    start = (t0 + dt.timedelta(seconds=5)).replace(tzinfo=dt.timezone.utc).timestamp()
    good = AttemptRecord(**common, attempt_no=2, verdict="clean", outcome="fail", failure_kind="wrong_state", grade_reason="r" * 5000,
                         setup_wall_s=0.1, agent_wall_s=2.0, grade_wall_s=0.2, wall_s=3.0, started_at=t0 + dt.timedelta(seconds=5),
                         finished_at=t0 + dt.timedelta(seconds=8),
                         model_calls=[{"provider": "anthropic", "endpoint": "/v1/messages", "model": "m\x1b[31m" + "x" * 300,
                                       "started": start + 0.5, "latency_s": 0.5, "tokens_in": 10, "tokens_out": 3, "tokens_cached": 4,
                                       "status": 200},
                                      {"provider": "openai", "endpoint": "/agent/chosen/path", "started": start + 1.0, "latency_s": None,
                                       "status": 403, "error": "refused", "detail": "AGENT-PATH"}],
                         upstream={"calls": 2, "tokens_in": 10, "tokens_out": 3, "models": ["m"]})
    return run, [bad, good]


def test_kept_phases_are_placed_at_their_recorded_times():
    from harness.engine import otel

    run, (_, good) = _records()
    kept = [{"name": "sandbox", "start_s": 0.0, "wall_s": 0.2}, {"name": "setup", "start_s": 0.2, "wall_s": 0.1},
            {"name": "agent", "start_s": 0.3, "wall_s": 2.0}, {"name": "export", "start_s": 2.3, "wall_s": 0.05},
            {"name": "grade", "start_s": 2.35, "wall_s": 0.2}, {"name": "export", "start_s": 2.55, "wall_s": 0.05},
            {"name": "remove", "start_s": 2.6, "wall_s": 9.0}]  # longer than the attempt: cut at its end
    a = good.model_copy(update={"phases": kept})
    specs = otel.attempt_spans(a)
    top = specs[0]
    phases = [s for s in specs if s.parent == top.key and not s.client]
    assert [p.name for p in phases] == [k["name"] for k in kept]
    assert len({p.key for p in phases}) == len(kept)  # the second export has a key of its own
    for p, k in zip(phases, kept):
        assert p.start_ns == top.start_ns + round(k["start_s"] * 1e9) and p.attributes["harness.phase.start_estimated"] is False
    assert [p.end_ns - p.start_ns for p in phases[:-1]] == [round(k["wall_s"] * 1e9) for k in kept[:-1]]
    assert phases[-1].end_ns == top.end_ns
    chat = next(s for s in specs if s.client)
    assert chat.parent == phases[2].key  # model calls under the agent phase


def test_the_mapping_from_records(tmp_path):
    from harness.engine import otel

    run, atts = _records()
    specs = otel.run_tree(run, atts)
    assert specs == otel.run_tree(run, list(reversed(atts)))  # deterministic
    keys = {s.key: s for s in specs}
    assert len(keys) == len(specs)
    assert [s.name for s in specs if s.parent is None] == ["run s"]
    assert keys["slot/t/0"].parent == "run" and keys["slot/t/0"].attributes["harness.slot.status"] == "fail"
    for a in atts:
        k = otel.attempt_key(a)
        assert keys[k].parent == "slot/t/0"
        phases = [s for s in specs if s.parent == k]
        assert [p.name for p in phases] == ["setup", "agent", "grade"]
        assert all(keys[k].start_ns <= p.start_ns <= p.end_ns <= keys[k].end_ns for p in phases)
        assert all(x.end_ns <= y.start_ns for x, y in zip(phases, phases[1:]))  # in order, not overlapping
        assert [round((p.end_ns - p.start_ns) / 1e9, 3) for p in phases] == [a.setup_wall_s, a.agent_wall_s, a.grade_wall_s]
    bad, good = (keys[otel.attempt_key(a)] for a in atts)
    assert bad.error == "discarded: host_cpu_contention" and bad.attributes["harness.sla.rule.host_cpu_contention.value"] == 0.4
    assert bad.events[0].attributes["harness.scored"] is False  # graded, never scored
    assert "gen_ai.evaluation.score.value" not in bad.events[0].attributes  # nothing a dashboard could average
    assert bad.events[0].attributes["gen_ai.evaluation.score.label"] == "not_scored"
    assert bad.events[0].attributes["harness.grade.outcome"] == atts[0].outcome
    assert good.events[0].attributes["gen_ai.evaluation.score.value"] == 0.0
    assert good.error == "fail: wrong_state" and len(good.attributes["harness.grade.reason"]) == otel.TEXT_CAP
    assert len(good.events[0].attributes["gen_ai.evaluation.explanation"]) == otel.TEXT_CAP
    agent = keys[otel.attempt_key(atts[1]) + "/phase/agent"]
    chat, refused = (keys[f"{otel.attempt_key(atts[1])}/call/{i}"] for i in (0, 1))
    assert chat.parent == agent.key and agent.start_ns <= chat.start_ns  # the agent was running when it called
    assert chat.name.startswith("chat m ") and "\x1b" not in chat.name and len(chat.attributes["gen_ai.request.model"]) <= otel.NAME_CAP
    assert chat.attributes["gen_ai.usage.input_tokens"] == 14  # Anthropic's cached input counted in, as the conventions say
    assert chat.attributes["gen_ai.usage.cache_read.input_tokens"] == 4 and chat.client
    assert refused.attributes["harness.model_call.endpoint"] == "other" and refused.attributes["error.type"] == "refused"
    assert "gen_ai.operation.name" not in refused.attributes
    everything = json.dumps([(s.name, s.attributes, [e.attributes for e in s.events]) for s in specs])
    for leaked in ("SECRET-STATE-TEXT", "AGENT-DETAIL", "AGENT-PATH", "/agent/chosen/path", ":pw@"):
        assert leaked not in everything
    for s in specs:
        for v in s.attributes.values():
            assert isinstance(v, (str, bool, int, float)) or (isinstance(v, list) and len({type(x) for x in v}) <= 1), (s.key, v)

    with OtlpTestReceiver() as rx:  # and through the SDK's exporter, in process
        n = otel.export_run(run, atts, otel.traces_url(rx.url), {"x-team": "evals"})
    assert n == len(specs) == len(rx.spans) and rx.headers[0]["x-team"] == "evals"
    assert rx.headers[0].get("content-encoding") == "gzip"
    got = {s["span_id"]: s for s in rx.spans}
    for s in specs:
        r = got[f"{otel.span_id(run.id, s.key):016x}"]
        assert (r["name"], r["start"], r["end"], r["trace_id"]) == (s.name, s.start_ns, s.end_ns, f"{otel.trace_id(run.id):032x}")
        assert r["parent"] == ("" if s.parent is None else f"{otel.span_id(run.id, s.parent):016x}")
        assert r["attributes"] == s.attributes


def test_times_a_store_changed_outside_harness_holds_are_sent_in_range(tmp_path):
    """Year 1 or 9999, 1e300 seconds, NaN: each is sent as nanoseconds OTLP can carry (an
    OverflowError traceback, or spans the exporter could not encode, before)."""
    from harness.cli import app
    from harness.engine import otel
    from tests.test_store_damage import make_store, runner

    run, (bad, good) = _records()
    huge = good.model_copy(update={
        "started_at": dt.datetime(9999, 12, 31), "finished_at": None, "wall_s": 1e300, "agent_wall_s": 1e300,
        "phases": [{"name": "agent", "start_s": 1e300, "wall_s": float("nan")}],
        "model_calls": [{**good.model_calls[0], "started": 1e300, "latency_s": 1e300}, {**good.model_calls[1], "started": -1e300}]})
    early = bad.model_copy(update={"started_at": dt.datetime(1, 1, 1), "finished_at": dt.datetime(1, 1, 1)})
    specs = otel.run_tree(run.model_copy(update={"created_at": dt.datetime(1, 1, 1)}), [early, huge])
    times = [t for s in specs for t in (s.start_ns, s.end_ns, *(e.time_ns for e in s.events))]
    assert len(specs) > 5 and all(0 <= t <= otel.MAX_NS for t in times)

    url = make_store(tmp_path)
    c = sqlite3.connect(url.removeprefix("sqlite:///"))
    c.execute("UPDATE attempts SET started_at = '9999-12-31 23:59:59.999999', agent_wall_s = 1e300, model_calls = ?",
              (json.dumps([{"provider": "openai", "started": 1e300, "latency_s": 1e300, "tokens_in": 1}]),))
    c.execute("UPDATE runs SET created_at = '0001-01-01 00:00:00'")
    c.commit()
    c.close()
    with OtlpTestReceiver() as recv:
        res = runner.invoke(app, ["export", "r1", "--otlp", recv.url + "/v1/traces", "--db", url])
        assert res.exit_code == 0 and res.exception is None, res.output
        got = [t for s in recv.spans for t in (s["start"], s["end"])]
    assert len(recv.spans) >= 5 and all(0 <= t <= otel.MAX_NS for t in got)
