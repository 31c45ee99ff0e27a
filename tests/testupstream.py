"""The test upstream: a real HTTP server that stands in for a model provider in tests. It is
NOT a model and never calls one.

It speaks the wire formats of the OpenAI chat completions and Responses APIs and of the
Anthropic Messages API (non-streaming and SSE streaming), so that an agent or the harness's
model gateway can be exercised end to end with no provider reachable. What it answers is
chosen by the request's ``model``:

- ``test-echo``: a deterministic reply; usage computed from the request (input tokens = the
  number of whitespace-separated words in the request's message texts, output = words in the
  reply, cached = input // 4). Anthropic semantics: ``input_tokens`` excludes the cached part,
  which is ``cache_read_input_tokens``; OpenAI's ``prompt_tokens`` / ``input_tokens`` include it.
- ``test-nousage``: the same reply with no usage at all (no ``usage`` key, no usage events).
- ``test-429`` / ``test-500`` / ``test-503``: that status with an error body in the API's shape
  (``Retry-After: 0`` on 429).
- ``test-slow-<seconds>``: sleeps that long before answering, and between stream events.
- ``test-truncate``: a Content-Length larger than the body, then the connection closes (a
  stream stops mid-way, without its terminating chunk).
- ``test-refunds`` (chat completions only): a scripted "model" for the refunds suite. It finds
  ``Ticket #NNNNN`` in the first user message and replays that ticket's script from
  ``tests/fixtures/upstream/refunds-script.json``: the i-th assistant turn (i = assistant
  messages already in the conversation) is the i-th scripted tool call, then a final message
  without tool calls. The variant is ``by_seed[seed % len(by_seed)]``; ``test-refunds:<name>``
  forces one. Unknown ticket: "I cannot help". Usage as for ``test-echo``.

Use::

    up = TestUpstream()            # or TestUpstream(script=path, key="...") to require a key
    up.start(); up.url             # http://127.0.0.1:PORT (bound on 0.0.0.0: reachable from a container)
    up.inject(status=429, times=2, match=lambda r: r["json"]["model"] == "test-echo")
    up.requests                    # [{method, path, headers (lower-case names), json, time}]
    up.reported                    # parallel to requests: the usage object sent, or None
    up.stop()

    python -m tests.testupstream --port 8089 [--script FILE]   # in the foreground, by hand
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import re
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

log = logging.getLogger("testupstream")

DEFAULT_SCRIPT = Path(__file__).resolve().parent / "fixtures" / "upstream" / "refunds-script.json"
MODELS = ["test-echo", "test-nousage", "test-429", "test-500", "test-503", "test-slow-<seconds>",
          "test-truncate", "test-refunds"]
ERROR_STATUSES = {"test-429": 429, "test-500": 500, "test-503": 503}
# Keys whose string values are identifiers, not text, when counting a request's words.
NOT_TEXT = {"role", "type", "id", "tool_call_id", "call_id", "tool_use_id", "name", "model", "cache_control",
            "status", "signature"}
TICKET_RE = re.compile(r"Ticket #(\d+)")


def count_words(obj) -> int:
    """Whitespace-separated words in every string of ``obj`` except identifiers (NOT_TEXT)."""
    if isinstance(obj, str):
        return len(obj.split())
    if isinstance(obj, list):
        return sum(count_words(x) for x in obj)
    if isinstance(obj, dict):
        return sum(count_words(v) for k, v in obj.items() if k not in NOT_TEXT)
    return 0


def request_words(api: str, body: dict) -> int:
    """The test upstream's "input tokens" of a request."""
    if api == "responses":
        return count_words(body.get("input")) + count_words(body.get("instructions"))
    if api == "messages":
        return count_words(body.get("messages")) + count_words(body.get("system"))
    return count_words(body.get("messages"))


def text_of(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


class Reply:
    """What the test upstream answers, before it is put in an API's shape."""

    def __init__(self, text: str | None = None, tool_calls: list[dict] | None = None):
        self.text = text
        self.tool_calls = tool_calls or []  # [{"id", "name", "arguments" (a JSON string)}]

    def output_words(self) -> int:
        return count_words(self.text or "") + sum(count_words(c["arguments"]) for c in self.tool_calls)

    def deltas(self) -> list[str]:
        """The text in stream pieces: one word (with its leading space) each."""
        words = (self.text or "").split(" ")
        return [w if i == 0 else " " + w for i, w in enumerate(words)] if self.text else []


class Usage:
    def __init__(self, words_in: int, words_out: int):
        self.input, self.output, self.cached = words_in, words_out, words_in // 4

    def openai_chat(self) -> dict:
        return {"prompt_tokens": self.input, "completion_tokens": self.output, "total_tokens": self.input + self.output,
                "prompt_tokens_details": {"cached_tokens": self.cached}, "completion_tokens_details": {"reasoning_tokens": 0}}

    def openai_responses(self) -> dict:
        return {"input_tokens": self.input, "input_tokens_details": {"cached_tokens": self.cached},
                "output_tokens": self.output, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.input + self.output}

    def anthropic(self) -> dict:
        return {"input_tokens": self.input - self.cached, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": self.cached, "output_tokens": self.output}


class Injection:
    def __init__(self, status: int, times: int, match: Callable[[dict], bool] | None, mode: str,
                 headers: dict | None, message: str | None):
        if mode not in ("status", "truncate", "reset") and not mode.startswith("slow:"):
            raise ValueError(f"test upstream: unknown injection mode {mode!r} (status, slow:SECONDS, truncate, reset)")
        self.delay = float(mode.split(":", 1)[1]) if mode.startswith("slow:") else 0.0
        self.status, self.left, self.match, self.mode = status, times, match, mode.split(":", 1)[0]
        self.headers, self.message = headers or {}, message


class RefundsScript:
    """The scripted model of the refunds suite (see the module docstring)."""

    def __init__(self, path: Path):
        self.path = path
        self.tickets = json.loads(path.read_text())["tickets"]

    def reply(self, body: dict, variant: str | None) -> Reply:
        messages = body.get("messages") or []
        first_user = next((m for m in messages if isinstance(m, dict) and m.get("role") == "user"), {})
        m = TICKET_RE.search(text_of(first_user.get("content")))
        ticket = self.tickets.get(m.group(1)) if m else None
        if ticket is None:
            return Reply("I cannot help with this request: I do not recognise the ticket.")
        if variant is None:
            seed = body.get("seed") if isinstance(body.get("seed"), int) else 0
            variant = ticket["by_seed"][seed % len(ticket["by_seed"])]
        script = ticket["variants"].get(variant)
        if script is None:
            raise KeyError(f"ticket {m.group(1)} has no variant {variant!r}; it has {', '.join(ticket['variants'])}")
        turn = sum(1 for x in messages if isinstance(x, dict) and x.get("role") == "assistant")
        if turn >= len(script["calls"]):
            return Reply(script.get("final", "Done."))
        call = script["calls"][turn]
        args = call["raw_arguments"] if "raw_arguments" in call else json.dumps(call.get("arguments", {}))
        return Reply(None, [{"id": f"call_{m.group(1)}_{turn}", "name": call["tool"], "arguments": args}])


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "test-upstream/1"
    timeout = 60  # an idle keep-alive connection ends after this
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms delayed-ACK stall
    upstream: TestUpstream  # set on the subclass made per server

    # ------------------------------------------------------------------ plumbing

    def setup(self):
        super().setup()
        self.upstream._track(self.connection, True)

    def finish(self):
        try:
            super().finish()
        finally:
            self.upstream._track(self.connection, False)

    def log_message(self, format, *args):
        log.debug("test upstream: %s %s", self.address_string(), format % args)

    def read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def send(self, status: int, obj, headers: dict | None = None, truncate: bool = False) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        if truncate:  # promise more than is sent, send half, hang up
            self.send_header("Content-Length", str(len(body) + 64))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.hang_up()
            return
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def hang_up(self, reset: bool = False) -> None:
        self.close_connection = True
        try:
            if reset:  # linger 0: close sends RST, not FIN
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                self.connection.shutdown(socket.SHUT_RDWR)
            self.connection.close()
        except OSError:
            pass

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def stream(self, events: list[tuple[str | None, object]], delay: float, truncate: bool) -> None:
        """Send SSE events (event name or None, data object or raw string) as chunks."""
        self.start_stream()
        cut = max(1, len(events) // 2) if truncate else None
        for i, (name, data) in enumerate(events):
            if cut is not None and i == cut:
                self.hang_up()  # mid-stream, no terminating chunk
                return
            if delay and i:
                time.sleep(delay)
            payload = data if isinstance(data, str) else json.dumps(data)
            text = (f"event: {name}\n" if name else "") + f"data: {payload}\n\n"
            self.chunk(text.encode())
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    # ------------------------------------------------------------------ routing

    def do_GET(self):
        path = self.route()
        idx = self.upstream._record("GET", self.path, dict(self.headers.items()), None)
        if path != "/models":
            return self.send(404, error_body("chat", 404, f"test upstream: no GET {self.path}"))
        created = 1_700_000_000
        if "anthropic-version" in {k.lower() for k in self.headers}:
            data = [{"type": "model", "id": m, "display_name": m, "created_at": "2024-01-01T00:00:00Z"} for m in MODELS]
            self.send(200, {"data": data, "has_more": False, "first_id": data[0]["id"], "last_id": data[-1]["id"]})
        else:
            self.send(200, {"object": "list", "data": [{"id": m, "object": "model", "created": created,
                                                        "owned_by": "test-upstream"} for m in MODELS]})
        log.info("test upstream: GET %s -> 200 (#%d)", self.path, idx)

    def route(self) -> str:
        path = self.path.split("?", 1)[0].rstrip("/")
        return path[3:] if path.startswith("/v1/") else path

    def do_POST(self):
        raw = self.read_body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        idx = self.upstream._record("POST", self.path, dict(self.headers.items()), body)
        api = {"/chat/completions": "chat", "/responses": "responses", "/messages": "messages"}.get(self.route())
        try:
            status = self.answer(idx, api, body)
        except (ConnectionError, TimeoutError):  # the client went away mid-answer
            self.close_connection = True
            status = "client gone"
        except Exception:  # a bug here: say so loudly, as a 500 the test will see
            log.exception("test upstream: internal error answering #%d", idx)
            self.close_connection = True
            try:
                self.send(500, error_body(api or "chat", 500, "test upstream: internal error (see its log)"))
            except OSError:
                pass
            status = "500 internal error"
        log.info("test upstream: POST %s model=%s stream=%s -> %s (#%d, usage %s)", self.path,
                 (body or {}).get("model") if isinstance(body, dict) else None,
                 bool(isinstance(body, dict) and body.get("stream")), status, idx, self.upstream.reported[idx])

    def answer(self, idx: int, api: str | None, body) -> int | str:
        if api is None:
            self.send(404, error_body("chat", 404, f"test upstream: no POST {self.path}"))
            return 404
        if self.upstream.key is not None:
            given = self.headers.get("x-api-key") or (self.headers.get("Authorization") or "").removeprefix("Bearer ")
            if given != self.upstream.key:
                self.send(401, error_body(api, 401, "test upstream: invalid API key"))
                return 401
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            self.send(400, error_body(api, 400, "test upstream: the body must be a JSON object with a model"))
            return 400
        inj = self.upstream._take_injection(self.upstream.requests[idx])
        if inj is not None:
            if inj.mode == "reset":
                self.hang_up(reset=True)
                return "reset (injected)"
            if inj.mode == "status":
                headers = {"Retry-After": "0"} if inj.status == 429 else {}
                self.send(inj.status, error_body(api, inj.status, inj.message), {**headers, **inj.headers})
                return f"{inj.status} (injected)"
            if inj.mode == "slow":
                time.sleep(inj.delay)
        model, stream = body["model"], bool(body.get("stream"))
        if model in ERROR_STATUSES:
            code = ERROR_STATUSES[model]
            self.send(code, error_body(api, code), {"Retry-After": "0"} if code == 429 else {})
            return code
        delay = 0.0
        if model.startswith("test-slow-"):
            try:
                delay = float(model.removeprefix("test-slow-"))
            except ValueError:
                delay = -1.0
            if not 0 <= delay <= 600:
                self.send(400, error_body(api, 400, f"test upstream: bad model {model!r}; use test-slow-<seconds>"))
                return 400
            time.sleep(delay)
        truncate = model == "test-truncate" or (inj is not None and inj.mode == "truncate")
        try:
            reply = self.make_reply(api, model, body)
        except (KeyError, ValueError) as e:
            self.send(400, error_body(api, 400, f"test upstream: {e}"))
            return 400
        if reply is None:
            self.send(404, error_body(api, 404, f"test upstream: the model {model!r} does not exist; models: {', '.join(MODELS)}"))
            return 404
        usage = None if model == "test-nousage" else Usage(request_words(api, body), reply.output_words())
        send = {"chat": self.api_chat, "responses": self.api_responses, "messages": self.api_messages}[api]
        send(idx, model, body, reply, usage, stream, delay, truncate)
        return "200 truncated" if truncate else 200

    def make_reply(self, api: str, model: str, body: dict) -> Reply | None:
        if model == "test-refunds" or model.startswith("test-refunds:"):
            if api != "chat":
                raise ValueError("test-refunds is served on chat/completions only")
            problem = check_tool_messages(body.get("messages"))
            if problem:
                raise ValueError(problem)
            return self.upstream.script.reply(body, model.partition(":")[2] or None)
        if model in ("test-echo", "test-nousage", "test-truncate") or model.startswith("test-slow-"):
            if api == "chat":
                problem = check_tool_messages(body.get("messages"))
                if problem:
                    raise ValueError(problem)
            return Reply(echo_text(api, body))
        return None

    # ------------------------------------------------------------------ the three APIs

    def api_chat(self, idx, model, body, reply: Reply, usage: Usage | None, stream, delay, truncate):
        rid, created = f"chatcmpl-test{idx:06d}", int(time.time())
        finish = "tool_calls" if reply.tool_calls else "stop"
        calls = [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                 for c in reply.tool_calls]
        if not stream:
            message = {"role": "assistant", "content": reply.text, "refusal": None}
            if calls:
                message["tool_calls"] = calls
            out = {"id": rid, "object": "chat.completion", "created": created, "model": model,
                   "system_fingerprint": "fp_test_upstream",
                   "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}]}
            if usage:
                out["usage"] = self.upstream._report(idx, usage.openai_chat())
            return self.send(200, out, truncate=truncate)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) and usage is not None

        def chunk(delta: dict, finish_reason=None, choices=True) -> tuple[None, dict]:
            c = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                 "system_fingerprint": "fp_test_upstream",
                 "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}] if choices else []}
            if include_usage:
                c["usage"] = None
            return None, c

        events = [chunk({"role": "assistant", "content": "" if reply.text is not None else None, "refusal": None})]
        events += [chunk({"content": d}) for d in reply.deltas()]
        for i, c in enumerate(reply.tool_calls):
            events.append(chunk({"tool_calls": [{"index": i, "id": c["id"], "type": "function",
                                                 "function": {"name": c["name"], "arguments": ""}}]}))
            args = c["arguments"]
            step = max(1, len(args) // 3)
            events += [chunk({"tool_calls": [{"index": i, "function": {"arguments": args[j:j + step]}}]})
                       for j in range(0, len(args), step)]
        events.append(chunk({}, finish))
        if include_usage:
            name, last = chunk({}, choices=False)
            last["usage"] = self.upstream._report(idx, usage.openai_chat())
            events.append((name, last))
        events.append((None, "[DONE]"))
        self.stream(events, delay, truncate)

    def api_responses(self, idx, model, body, reply: Reply, usage: Usage | None, stream, delay, truncate):
        rid, mid, created = f"resp_test{idx:06d}", f"msg_test{idx:06d}", int(time.time())
        text = reply.text or ""
        part = {"type": "output_text", "text": text, "annotations": []}
        item = {"id": mid, "type": "message", "status": "completed", "role": "assistant", "content": [part]}

        def response(status: str, output: list, with_usage: bool) -> dict:
            r = {"id": rid, "object": "response", "created_at": created, "status": status, "model": model,
                 "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                 "temperature": body.get("temperature", 1.0), "error": None, "incomplete_details": None}
            if with_usage and usage:
                r["usage"] = self.upstream._report(idx, usage.openai_responses())
            elif usage:
                r["usage"] = None  # the real API's in-progress snapshots carry usage: null
            return r

        if not stream:
            return self.send(200, response("completed", [item], True), truncate=truncate)
        seq = itertools.count()

        def ev(kind: str, **fields) -> tuple[str, dict]:
            return kind, {"type": kind, "sequence_number": next(seq), **fields}

        events = [ev("response.created", response=response("in_progress", [], False)),
                  ev("response.in_progress", response=response("in_progress", [], False)),
                  ev("response.output_item.added", output_index=0,
                     item={**item, "status": "in_progress", "content": []}),
                  ev("response.content_part.added", item_id=mid, output_index=0, content_index=0,
                     part={**part, "text": ""})]
        events += [ev("response.output_text.delta", item_id=mid, output_index=0, content_index=0, delta=d)
                   for d in reply.deltas()]
        events += [ev("response.output_text.done", item_id=mid, output_index=0, content_index=0, text=text),
                   ev("response.content_part.done", item_id=mid, output_index=0, content_index=0, part=part),
                   ev("response.output_item.done", output_index=0, item=item)]
        # built last: reporting usage is what the completed event does
        events.append(ev("response.completed", response=response("completed", [item], True)))
        self.stream(events, delay, truncate)

    def api_messages(self, idx, model, body, reply: Reply, usage: Usage | None, stream, delay, truncate):
        mid = f"msg_test{idx:06d}"
        text = reply.text or ""
        if not stream:
            out = {"id": mid, "type": "message", "role": "assistant", "model": model,
                   "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None}
            if usage:
                out["usage"] = self.upstream._report(idx, usage.anthropic())
            return self.send(200, out, truncate=truncate)
        start = {"id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
                 "stop_reason": None, "stop_sequence": None}
        if usage:
            start["usage"] = {**usage.anthropic(), "output_tokens": 1}
        events = [("message_start", {"type": "message_start", "message": start}),
                  ("content_block_start", {"type": "content_block_start", "index": 0,
                                           "content_block": {"type": "text", "text": ""}}),
                  ("ping", {"type": "ping"})]
        events += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": d}}) for d in reply.deltas()]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
        delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}}
        if usage:
            reported = self.upstream._report(idx, usage.anthropic())  # what the whole stream adds up to
            delta["usage"] = {"output_tokens": reported["output_tokens"]}
        events += [("message_delta", delta), ("message_stop", {"type": "message_stop"})]
        self.stream(events, delay, truncate)


def echo_text(api: str, body: dict) -> str:
    """test-echo's reply: deterministic, from the last user message."""
    if api == "responses":
        inp = body.get("input")
        last = inp if isinstance(inp, str) else next(
            (text_of(i.get("content")) for i in reversed(inp or []) if isinstance(i, dict) and i.get("role") == "user"), "")
    else:
        last = next((text_of(m.get("content")) for m in reversed(body.get("messages") or [])
                     if isinstance(m, dict) and m.get("role") == "user"), "")
    words = last.split()
    said = " ".join(words[:12]) + (" ..." if len(words) > 12 else "")
    head = f"test upstream echo ({request_words(api, body)} words in)"
    return f"{head}: {said}" if said else head


def check_tool_messages(messages) -> str | None:
    """What the real chat completions API rejects about tool calls (400), or None."""
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty list"
    pending: set[str] = set()
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            return f"messages[{i}] has no valid role"
        if m["role"] == "tool":
            if m.get("tool_call_id") not in pending:
                return f"messages[{i}]: a tool message must answer a preceding tool_call id (got {m.get('tool_call_id')!r})"
            pending.discard(m["tool_call_id"])
            continue
        if pending:
            return f"messages[{i}]: an assistant message with tool_calls must be followed by tool messages for {sorted(pending)}"
        if m["role"] == "assistant":
            pending = {c.get("id") for c in (m.get("tool_calls") or []) if isinstance(c, dict)}
    return None


def error_body(api: str, status: int, message: str | None = None) -> dict:
    """An error in the API's shape."""
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            429: "rate_limit_error"}.get(status, "api_error" if status < 503 else "overloaded_error")
    message = message or f"test upstream: simulated HTTP {status}"
    if api == "messages":
        return {"type": "error", "error": {"type": kind, "message": message}}
    openai_type = {429: "requests", 400: "invalid_request_error", 401: "invalid_request_error",
                   404: "invalid_request_error"}.get(status, "server_error")
    code = {429: "rate_limit_exceeded", 401: "invalid_api_key", 404: "model_not_found"}.get(status)
    return {"error": {"message": message, "type": openai_type, "param": None, "code": code}}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default 5 drops concurrent connects (a 1 s SYN retry each)

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # a client hung up, or stop() did
            log.debug("test upstream: connection from %s ended: %s", client_address, sys.exc_info()[1])
        else:
            log.exception("test upstream: error on a connection from %s", client_address)


class TestUpstream:
    """A test upstream on a free port (see the module docstring). Thread-safe."""

    __test__ = False  # not a pytest test class

    def __init__(self, script: str | Path | None = None, key: str | None = None, host: str = "0.0.0.0", port: int = 0):
        self.script = RefundsScript(Path(script) if script else DEFAULT_SCRIPT)
        self.key = key
        self.requests: list[dict] = []
        self.reported: list[dict | None] = []
        self._lock = threading.Lock()
        self._injections: list[Injection] = []
        self._conns: set[socket.socket] = set()
        handler = type("Handler", (_Handler,), {"upstream": self})
        self.server = _Server((host, port), handler)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> TestUpstream:
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="test-upstream", daemon=True)
        self._thread.start()
        log.info("test upstream (not a model) listening on %s:%d", *self.server.server_address[:2])
        return self

    def stop(self) -> None:
        self.server.shutdown()
        with self._lock:
            conns = list(self._conns)
        for c in conns:  # wake handlers waiting on an idle keep-alive connection
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.server.server_close()
        if self._thread:
            self._thread.join(10)
        log.info("test upstream stopped after %d requests", len(self.requests))

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def inject(self, status: int = 429, times: int = 1, match: Callable[[dict], bool] | None = None,
               mode: str = "status", headers: dict | None = None, message: str | None = None) -> None:
        """Make the next ``times`` POST requests for which ``match(request)`` is true (all, if
        None) fail: ``mode`` "status" answers ``status`` with an error body (plus ``headers``;
        a 429 has Retry-After: 0 unless ``headers`` say otherwise), "slow:SECONDS" delays the
        normal answer, "truncate" cuts it short, "reset" resets the connection unanswered."""
        with self._lock:
            self._injections.append(Injection(status, times, match, mode, headers, message))

    def clear(self) -> None:
        """Forget the pending injections (not the recorded requests)."""
        with self._lock:
            self._injections.clear()

    # ------------------------------------------------------------------ used by the handler

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            (self._conns.add if add else self._conns.discard)(conn)

    def _record(self, method: str, path: str, headers: dict, body) -> int:
        rec = {"method": method, "path": path, "headers": {k.lower(): v for k, v in headers.items()},
               "json": body, "time": time.monotonic()}
        with self._lock:
            self.requests.append(rec)
            self.reported.append(None)
            return len(self.requests) - 1

    def _report(self, idx: int, usage: dict) -> dict:
        with self._lock:
            self.reported[idx] = usage
        return usage

    def _take_injection(self, request: dict) -> Injection | None:
        with self._lock:
            for inj in self._injections:
                if inj.left > 0 and (inj.match is None or inj.match(request)):
                    inj.left -= 1
                    return inj
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.testupstream",
                                 description="Run the test upstream (a scripted stand-in for a model provider, not a model).")
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8089, help="0 picks a free port")
    ap.add_argument("--script", help=f"refunds script (default {DEFAULT_SCRIPT})")
    ap.add_argument("--key", help="require this API key (Authorization: Bearer or x-api-key)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr, format="%(message)s")
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # set before the line below: a signal right after it is a clean stop
        signal.signal(sig, lambda *_: done.set())
    up = TestUpstream(script=args.script, key=args.key, host=args.host, port=args.port)
    up.start()
    try:
        print(f"test upstream (a scripted stand-in for tests, NOT a model) on http://127.0.0.1:{up.port}/v1 "
              f"(bound {args.host}); models: {', '.join(MODELS)}\n"
              f"  for the harness's gateway (in a container): --upstream openai=http://host.docker.internal:{up.port}/v1",
              flush=True)
        while not done.wait(0.5):
            pass
    finally:
        up.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
