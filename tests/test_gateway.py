"""The gateway process (harness/sandbox/gateway_server.py) in this process, against the test
upstream (tests/testupstream.py, a real HTTP server — not a model): every API and stream
format, tokens as reported (null stays null), error kinds, retries, caps, the token rules,
the endpoint allowlist, the admin token, and the egress proxy's allow/refuse log. No Docker:
the containerised gateway is covered by tests/test_network_docker.py and test_llm_docker.py.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from harness.core.upstream import attempt_cost, busy_seconds, summarize
from harness.model.egress import allowed, parse_rule, parse_rules
from harness.model.gateway import ModelCall
from harness.sandbox import gateway_server as gs
from testupstream import TestUpstream

ADMIN = "test-admin-token"


@pytest.fixture()
def gw():
    gs.ADMIN_TOKEN = ADMIN
    gs.STATE.__init__()
    servers = [gs.serve("127.0.0.1", 0, h) for h in (gs.AdminHandler, gs.ApiHandler, gs.ProxyHandler)]
    ports = {name: s.server_address[1] for name, s in zip(("admin", "api", "proxy"), servers)}
    yield ports
    for s in servers:
        s.shutdown()
        s.server_close()


def _req(port: int, method: str, path: str, body=None, headers=None, raw: bool = False):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    data = json.dumps(body).encode() if body is not None else None
    c.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    try:
        out = r.read()
    except http.client.IncompleteRead as e:
        out = e.partial
    c.close()
    return r.status, (out if raw else (json.loads(out) if out.strip().startswith(b"{") else out))


def _admin(ports, path, body=None, token=ADMIN):
    return _req(ports["admin"], "POST" if body is not None else "GET", path, body, {"X-Harness-Admin": token})


def _setup(ports, up: TestUpstream, key: str | None = "sk-upstream-key-123456", **limits):
    provs = {"openai": {"base": f"{up.url}/v1", "key": key}, "anthropic": {"base": up.url, "key": key}}
    assert _admin(ports, "/admin/config", {"providers": provs, "limits": {"concurrency": 4, **limits}})[0] == 200
    assert _admin(ports, "/admin/attempts", {"token": "tok-a", "attempt": "t/0/1", "policy": "gateway", "ip": "127.0.0.1"})[0] == 200


def _close(ports, token="tok-a") -> list[ModelCall]:
    st, out = _admin(ports, "/admin/attempts/close", {"token": token})
    assert st == 200
    return [ModelCall.model_validate(c) for c in out["calls"]]


def _chat(ports, model, stream=False, token="tok-a", raw=False, **extra):
    body = {"model": model, "messages": [{"role": "user", "content": "one two three four"}], "stream": stream, **extra}
    return _req(ports["api"], "POST", "/openai/v1/chat/completions", body, {"Authorization": f"Bearer {token}"}, raw=stream or raw)


def test_admin_needs_its_token(gw):
    assert _admin(gw, "/admin/health", token="wrong")[0] == 403
    assert _admin(gw, "/admin/health")[0] == 200


@pytest.mark.parametrize("stream", [False, True])
def test_tokens_are_what_each_api_reported(gw, stream):
    with TestUpstream(key="sk-upstream-key-123456") as up:
        _setup(gw, up)
        st, _ = _chat(gw, "test-echo", stream, stream_options={"include_usage": True} if stream else None)
        assert st == 200
        st, _ = _req(gw["api"], "POST", "/openai/v1/responses", {"model": "test-echo", "input": "a b c", "stream": stream},
                     {"Authorization": "Bearer tok-a"}, raw=True)
        assert st == 200
        st, _ = _req(gw["api"], "POST", "/anthropic/v1/messages",
                     {"model": "test-echo", "max_tokens": 50, "messages": [{"role": "user", "content": "x y"}], "stream": stream},
                     {"x-api-key": "tok-a", "anthropic-version": "2023-06-01"}, raw=True)
        assert st == 200
        st, _ = _chat(gw, "test-nousage", stream)
        assert st == 200
        reported = list(up.reported)
        seen_keys = [r["headers"].get("authorization") or r["headers"].get("x-api-key") for r in up.requests]
    calls = _close(gw)
    assert [c.endpoint for c in calls] == ["/chat/completions", "/responses", "/v1/messages", "/chat/completions"]
    chat, resp, msg, nousage = calls
    u = reported[0]
    assert (chat.tokens_in, chat.tokens_out, chat.tokens_cached) == (
        u["prompt_tokens"], u["completion_tokens"], u["prompt_tokens_details"]["cached_tokens"])
    u = reported[1]
    assert (resp.tokens_in, resp.tokens_out, resp.tokens_cached) == (
        u["input_tokens"], u["output_tokens"], u["input_tokens_details"]["cached_tokens"])
    u = reported[2]
    assert (msg.tokens_in, msg.tokens_out, msg.tokens_cached) == (u["input_tokens"], u["output_tokens"], u["cache_read_input_tokens"])
    assert reported[3] is None and (nousage.tokens_in, nousage.tokens_out, nousage.tokens_cached) == (None, None, None)
    assert all(c.stream is stream and c.status == 200 and c.error is None for c in calls)
    assert all(c.ttfb_s is not None and c.latency_s >= c.ttfb_s for c in calls)
    # the agent's token never reached the upstream: the gateway put the real key in its place
    assert seen_keys == ["Bearer sk-upstream-key-123456"] * 2 + ["sk-upstream-key-123456", "Bearer sk-upstream-key-123456"]
    s = summarize(calls)
    assert s.calls == 4 and s.calls_without_usage == 1 and s.tokens_in == sum(c.tokens_in or 0 for c in calls)


def test_error_kinds_and_gateway_retries(gw):
    with TestUpstream() as up:
        _setup(gw, up, key=None)
        assert _chat(gw, "test-429")[0] == 429
        assert _chat(gw, "test-503")[0] == 503
        st, body = _chat(gw, "test-truncate", raw=True)
        assert st == 200
        calls = _close(gw)
        assert [c.error for c in calls] == ["rate_limited", "server_error", "connection"]
        assert "cut off" in calls[2].detail
        # with gateway retries, a transient 429 is absorbed and counted as a retry
        _setup(gw, up, key=None, retries=2)
        up.inject(status=429, times=1, match=lambda r: r["json"]["model"] == "test-echo")
        assert _chat(gw, "test-echo")[0] == 200
        (call,) = _close(gw)
        assert call.retries == 1 and call.error is None


def test_upstream_timeout_and_unreachable(gw):
    with TestUpstream() as up:
        _setup(gw, up, key=None, timeout=0.5)
        assert _chat(gw, "test-slow-2")[0] == 504
        (call,) = _close(gw)
        assert call.error == "timeout"
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    assert _admin(gw, "/admin/config", {"providers": {"openai": {"base": f"http://127.0.0.1:{port}/v1"}}})[0] == 200
    _admin(gw, "/admin/attempts", {"token": "tok-a", "attempt": "t/0/1", "policy": "gateway", "ip": "127.0.0.1"})
    assert _chat(gw, "test-echo")[0] == 502
    assert _close(gw)[0].error == "connection"


def test_tokens_networks_and_endpoints_are_refused(gw):
    with TestUpstream() as up:
        _setup(gw, up, key=None)
        assert _chat(gw, "test-echo", token="tok-unknown")[0] == 401
        # a token registered for another network (the gateway's address there) is refused here
        _admin(gw, "/admin/attempts", {"token": "tok-b", "attempt": "t/1/1", "policy": "gateway", "ip": "10.9.9.9"})
        assert _chat(gw, "test-echo", token="tok-b")[0] == 401
        # only model endpoints are forwarded with the run's key
        for method, path in (("POST", "/openai/v1/files"), ("GET", "/openai/v1/organization/users"), ("POST", "/anthropic/v1/complete")):
            assert _req(gw["api"], method, path, {} if method == "POST" else None, {"Authorization": "Bearer tok-a"})[0] == 403
        assert _req(gw["api"], "POST", "/nope/v1/x", {}, {"Authorization": "Bearer tok-a"})[0] == 404
        assert not up.requests
        refused = _close(gw)
        assert [c.error for c in refused] == ["refused"] * 6  # wrong tokens from its network are logged on it too
        # a closed attempt's token is dead, and its network's address now answers nothing at all
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            _chat(gw, "test-echo")


def test_concurrency_cap_queues_calls_and_records_the_wait(gw):
    with TestUpstream() as up:
        _setup(gw, up, key=None, concurrency=1)
        threads = [threading.Thread(target=_chat, args=(gw, "test-slow-0.5")) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        starts = sorted(r["time"] for r in up.requests)
    calls = _close(gw)
    assert len(calls) == 3 and max(c.queued_s for c in calls) >= 0.8  # the third waited for two others
    assert starts[2] - starts[0] >= 0.9  # the upstream never saw two at once
    s = summarize(calls)
    assert s.wait_s >= 1.4 and s.queued_s >= 1.2


def test_egress_proxy_allows_refuses_and_logs(gw):
    with TestUpstream() as up:
        gs.STATE.providers = {}
        _admin(gw, "/admin/attempts", {"token": "tok-p", "attempt": "t/0/1", "policy": "allowlist",
                                        "allow": [f"127.0.0.1:{up.port}"], "ip": "127.0.0.1"})
        c = http.client.HTTPConnection("127.0.0.1", gw["proxy"], timeout=10)
        c.request("GET", f"http://127.0.0.1:{up.port}/v1/models")
        assert c.getresponse().status == 200
        c.close()
        c = http.client.HTTPConnection("127.0.0.1", gw["proxy"], timeout=10)
        c.set_tunnel("127.0.0.1", up.port + 1 if up.port < 65535 else 1)
        with pytest.raises(OSError):
            c.request("GET", "/")
        c.close()
        c = http.client.HTTPConnection("127.0.0.1", gw["proxy"], timeout=10)
        c.request("CONNECT", "example.org:443")
        assert c.getresponse().status == 403
        c.close()
    st, out = _admin(gw, "/admin/attempts/close", {"token": "tok-p"})
    ev = [(e["host"], e["port"], e["allowed"]) for e in out["egress"]]
    assert ev[0] == ("127.0.0.1", up.port, True) and ev[1][2] is False and ev[2] == ("example.org", 443, False)
    assert all(e["reason"] for e in out["egress"][1:])


def test_allowlist_entries():
    r = parse_rules(["api.example.com", "*.pythonhosted.org:443", "10.1.0.0/16:*", "[2001:db8::/32]:8000-8100"])
    assert allowed(r, "api.example.com", 443) and not allowed(r, "api.example.com", 22)
    assert allowed(r, "files.pythonhosted.org", 443) and not allowed(r, "pythonhosted.org", 443)
    assert not allowed(r, "files.pythonhosted.org", 80)
    assert allowed(r, "10.1.2.3", 5432) and not allowed(r, "10.2.0.1", 5432)
    assert not allowed(r, "internal.corp", 5432, addr="10.1.2.3"), "an address entry admits addresses, not names"
    assert allowed(r, "[2001:db8::1]", 8050) and not allowed(r, "evil.example.com", 443)
    for bad in ("*", "", "exa mple.com", "host:0", "host:abc", "host:70000"):
        with pytest.raises(ValueError):
            parse_rule(bad)


def test_summaries_and_cost():
    assert busy_seconds([(0, 2), (1, 3), (5, 6)]) == 4
    calls = [ModelCall(provider="openai", model="m", started=0.0, latency_s=1.0, tokens_in=1000, tokens_out=100, tokens_cached=400),
             ModelCall(provider="openai", model="m", started=0.5, latency_s=1.0, status=429, error="rate_limited")]
    s = summarize(calls)
    assert (s.wait_s, s.rate_limited, s.calls_without_usage, s.tokens_in) == (1.5, 1, 0, 1000)
    prices = {"m": {"input": 2.0, "output": 10.0, "cached": 1.0}}
    dumped = [c.model_dump() for c in calls]
    assert attempt_cost(dumped, prices) == pytest.approx((600 * 2 + 100 * 10 + 400 * 1) / 1e6)
    assert attempt_cost(dumped, {"other": {"input": 1.0}}) is None  # unknown stays unknown
    assert attempt_cost([{**dumped[0], "tokens_in": None, "tokens_out": None}], prices) is None


def test_a_key_echoed_by_the_upstream_never_reaches_the_agent():
    key = "sk-upstream-key-123456"
    m = gs.Masker(key)
    text = f'{{"error": "bad key {key}", "again": "{key}"}}'.encode()
    pieces = [text[i:i + 5] for i in range(0, len(text), 5)]  # split anywhere, keys across chunk edges
    out = b"".join(m.feed(p) for p in pieces) + m.feed(b"")
    assert key.encode() not in out and len(out) == len(text) and out.count(b"*" * len(key)) == 2
    assert gs.Masker(None).feed(b"abc") == b"abc"


def test_runs_that_cannot_use_the_gateway_are_refused_before_anything_starts(tmp_path):
    from conftest import run_cli

    key = "sk-test-" + "ab12" * 10
    cases = [
        (["--agent", "llm"], "needs a model provider"),  # an LLM agent with no provider: every call would be refused
        (["--network", "gateway"], "needs a model provider"),
        (["--agent", "llm", "--upstream", "openai=http://127.0.0.1:8089/v1"], "host.docker.internal"),
        (["--agent", "llm", "--upstream", "openai=https://user:pw@example.com/v1"], "no credentials"),
        (["--agent", "llm", "--secret", "GITHUB_TOKEN"], "model API keys only"),
        (["--agent", "llm", "--secret", "OPENAI_API_KEY=NOT_SET_ANYWHERE"], "is not set"),
        (["--agent-env", f"MY_API_KEY={key}"], "looks like a credential"),
        (["--network", "allowlist"], "needs `allow` entries"),
    ]
    for args, words in cases:
        res = run_cli(tmp_path, "run", "--suite", "refunds", "--trials", "1", "--k", "1", *args, env={"OPENAI_API_KEY": key})
        assert res.returncode == 2, (args, res.stderr)
        assert words in res.stderr, (args, res.stderr)
        assert key not in res.stderr + res.stdout and "validation error" not in res.stderr
    assert not (tmp_path / "home" / "harness.db").exists()


def test_a_secret_in_a_prompt_is_refused(tmp_path):
    import shutil

    from conftest import run_cli

    key = "sk-test-" + "cd34" * 10
    suite = tmp_path / "s"
    shutil.copytree(Path(__file__).parent.parent / "harness" / "suites" / "refunds", suite)
    t = suite / "tasks" / "duplicate-charge.toml"
    t.write_text(t.read_text().replace("Please fix this.", f"Please fix this. {key}"))
    res = run_cli(tmp_path, "run", "--suite", str(suite), "--trials", "1", "--k", "1", "--agent", "llm", "--secret", "OPENAI_API_KEY",
                  env={"OPENAI_API_KEY": key})
    assert res.returncode == 2 and "prompt" in res.stderr and key not in res.stderr, res.stderr


def test_an_address_with_no_attempt_gets_nothing_read(gw):
    # nobody registered on 127.0.0.1: a 16 MiB announcement is not read, the connection is just closed
    s = socket.create_connection(("127.0.0.1", gw["api"]), timeout=5)
    s.sendall(b"POST /openai/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 16000000\r\n\r\n")
    assert s.recv(100) == b""
    s.close()


def test_connections_per_attempt_are_capped_and_idle_ones_dropped(gw, monkeypatch):
    with TestUpstream() as up:
        _setup(gw, up, key=None)
        socks = [socket.create_connection(("127.0.0.1", gw["api"]), timeout=5) for _ in range(gs.MAX_CONNS + 6)]
        time.sleep(0.5)
        closed = 0
        for s in socks[gs.MAX_CONNS:]:
            s.settimeout(2)
            try:
                closed += s.recv(10) == b""
            except OSError:
                closed += 1
        for s in socks:
            s.close()
        assert closed == 6
        time.sleep(0.3)
        assert _chat(gw, "test-echo")[0] == 200, "the attempt is served again once its connections are gone"


def test_provider_side_tools_and_routing_headers_are_not_forwarded(gw):
    with TestUpstream() as up:
        _setup(gw, up, key=None)
        st, body = _req(gw["api"], "POST", "/openai/v1/responses",
                        {"model": "test-echo", "input": "x", "tools": [{"type": "web_search_preview"}]}, {"Authorization": "Bearer tok-a"})
        assert st == 403 and "provider runs itself" in body["error"]["message"]
        st, _ = _req(gw["api"], "POST", "/anthropic/v1/messages",
                     {"model": "test-echo", "max_tokens": 5, "messages": [], "mcp_servers": [{"url": "https://x"}]}, {"x-api-key": "tok-a"})
        assert st == 403
        st, _ = _req(gw["api"], "POST", "/openai/v1/chat/completions",
                     {"model": "test-echo", "messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function", "function": {"name": "f"}}]},
                     {"Authorization": "Bearer tok-a", "OpenAI-Organization": "org-evil", "OpenAI-Project": "p"})
        assert st == 200
        (r,) = up.requests
        assert "openai-organization" not in r["headers"] and "openai-project" not in r["headers"]


def test_an_agent_that_hangs_up_is_not_an_upstream_failure(gw):
    with TestUpstream() as up:
        _setup(gw, up, key=None)
        s = socket.create_connection(("127.0.0.1", gw["api"]), timeout=5)
        body = json.dumps({"model": "test-slow-0.3", "stream": True, "messages": [{"role": "user", "content": "a b c d e f"}]}).encode()
        s.sendall(b"POST /openai/v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-a\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        s.recv(200)  # the first bytes of the stream, then gone
        s.close()
        time.sleep(2.5)
        (call,) = _close(gw)
    assert call.error is None and "agent closed" in call.detail


def test_one_attempt_cannot_hold_every_slot_of_a_provider(gw):
    with TestUpstream() as up:
        _setup(gw, up, key=None, concurrency=2)  # per attempt: half, one call at a time
        threads = [threading.Thread(target=_chat, args=(gw, "test-slow-0.4")) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        a, b = sorted(r["time"] for r in up.requests)
    assert b - a >= 0.35


def test_bad_records_are_dropped_one_by_one():
    from harness.sandbox.gateway import _valid

    good = {"provider": "openai", "started": 1.0}
    ok, bad = _valid(ModelCall, [good, {"provider": "openai", "started": "not a time"}, "junk", good])
    assert len(ok) == 2 and bad == 2
    m = gs.Masker("sk-upstream-key-123456")
    assert "sk-upstream" not in m.text("Bearer sk-upstream-key-123456")


def test_a_call_record_with_an_agent_shaped_string_is_kept_cleaned_not_dropped():
    # a model name with a lone surrogate (or longer than its field) failed validation and the
    # call was dropped: its 429 never reached the SLA rules and the attempt was scored clean
    from harness.model.gateway import ModelCall
    from harness.sandbox.gateway import _valid

    call = {"provider": "openai", "endpoint": "/v1/chat/completions", "model": "gpt-4o-mini", "started": 1.0,
            "status": 429, "error": "rate_limited", "tokens_in": 5}
    got, bad = _valid(ModelCall, [call, {**call, "model": "gpt-4o-mini\ud800"}, {**call, "model": "m" * 5000},
                                  {**call, "detail": "\udfff" * 400}, {**call, "started": "not a time"}, "junk"])
    assert bad == 2 and len(got) == 4
    assert [c.error for c in got] == ["rate_limited"] * 4 and all(c.tokens_in == 5 for c in got)
    assert got[1].model == "gpt-4o-mini\ufffd" and len(got[2].model) == 200 and len(got[3].detail) == 300
    for c in got:
        c.model_dump_json()  # valid UTF-8 throughout: it stores and exports
