"""The model gateway and egress proxy: the process inside the harness's gateway container.

Standard library only: it runs as ``python3 -I gateway_server.py`` in its own container (one
per run, on the controller's reserved cores), next to ``egress.py``. Three listeners:

* **admin** (port 8700, bound only to the container's first interface, which the engine
  publishes on the host's 127.0.0.1): the controller sets the providers and their keys (held
  in memory only, never written, never logged), registers each attempt (its token, its
  network policy and allowlist, and the gateway's own address on that attempt's private
  network), and takes the attempt's records back when it ends. Every request carries the
  admin token the container was started with.
* **api** (port 8080, on every attempt network): ``/openai/...`` and ``/anthropic/...``,
  OpenAI- and Anthropic-compatible. A call must carry a registered attempt token
  (``Authorization: Bearer``, or ``x-api-key``) and arrive on that attempt's network; the
  token is replaced by the provider's real key, the answer streamed back as it comes. Per
  call: status, latency, time to first byte, bytes, tokens as the answer reported them,
  retries. Per provider: a cap on calls in flight and on calls per minute.
* **proxy** (port 3128): an HTTP CONNECT / absolute-URI proxy for attempts under the
  ``allowlist`` policy; every allowed and refused connection is logged for the attempt whose
  network it came from.
"""

from __future__ import annotations

import ctypes
import hmac
import http.client
import json
import os
import select
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    from harness.model.egress import allowed as egress_allowed, parse_rules  # in the controller's tests
except ImportError:  # in the container: egress.py sits next to this file
    from egress import allowed as egress_allowed, parse_rules  # type: ignore[no-redef]

ADMIN_PORT, API_PORT, PROXY_PORT = 8700, 8080, 3128
MAX_BODY = 16 << 20  # a request body the gateway accepts (a long context fits)
MAX_BODY_IN_FLIGHT = 64 << 20  # request-body bytes one attempt may have the gateway hold at once
MAX_CONNS = 64  # connections one attempt may hold open to the gateway at once
IDLE_S = 30.0  # a connection that sends nothing for this long is closed (slow headers, slow bodies, idle keep-alive)
WATCHDOG_S = 120.0  # no word from the controller this long: it is gone, and so is the gateway
REQUEST_HEADERS = {"content-type", "accept", "user-agent", "anthropic-version", "anthropic-beta", "openai-beta", "idempotency-key"}
RESPONSE_HEADERS = {"content-type", "retry-after", "x-request-id", "request-id", "openai-processing-ms", "openai-version",
                    "cache-control"}
# tools the provider runs itself, reaching the internet from its side: not forwarded unless the run allows them
SERVER_TOOLS = ("web_search", "web_fetch", "code_execution", "code_interpreter", "mcp", "file_search", "image_generation",
                "computer_use_preview", "local_shell")
MAX_USAGE_SCAN = 8 << 20  # bytes of a non-streamed answer kept to read its usage
MAX_CALLS = MAX_EGRESS = 2000
HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
       "transfer-encoding", "upgrade", "host", "content-length", "authorization", "x-api-key", "accept-encoding"}
ENDPOINTS = {  # provider -> (method, path under the base) the gateway lets an agent call with the run's key
    "openai": {("POST", "/chat/completions"), ("POST", "/responses"), ("POST", "/completions"), ("POST", "/embeddings"),
               ("GET", "/models")},
    "anthropic": {("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens"), ("GET", "/v1/models")},
}
RETRYABLE = {429, 500, 502, 503, 504, 529}


def log(msg: str) -> None:
    print(f"gateway: {msg}", file=sys.stderr, flush=True)


class Provider:
    def __init__(self, name: str, base: str, key: str | None, concurrency: int, rate: float | None):
        u = urllib.parse.urlsplit(base)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"provider {name}: base URL {base!r} is not http(s)://host[:port][/path]")
        self.name, self.scheme, self.host = name, u.scheme, u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.key = key
        self.sem = threading.BoundedSemaphore(concurrency)
        self.interval = 60.0 / rate if rate else 0.0
        self._next = 0.0
        self._lock = threading.Lock()

    def slot(self) -> float:
        """Wait for a rate slot; the seconds waited."""
        if not self.interval:
            return 0.0
        with self._lock:
            now = time.monotonic()
            at = max(now, self._next)
            self._next = at + self.interval
        if at > now:
            time.sleep(at - now)
        return max(0.0, at - now)

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=ssl.create_default_context())
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def auth(self, headers: dict[str, str]) -> None:
        if not self.key:
            return
        if self.name == "anthropic":
            headers["x-api-key"] = self.key
        else:
            headers["Authorization"] = f"Bearer {self.key}"


class Attempt:
    def __init__(self, attempt: str, policy: str, allow: list[str], ip: str | None, per_attempt: int):
        self.attempt, self.policy, self.ip = attempt, policy, ip
        self.rules = parse_rules(allow)
        self.calls: list[dict] = []
        self.egress: list[dict] = []
        self.dropped_calls = self.dropped_egress = 0
        self.lock = threading.Lock()
        self.conns = 0  # connections open from its network
        self.body_bytes = 0  # request-body bytes being read for it
        self.upstream: set = set()  # upstream connections in flight (closed when the attempt ends)
        self.inflight: dict[int, threading.Event] = {}  # calls whose handler is still at work
        self.calls_sem = threading.BoundedSemaphore(per_attempt)  # its share of a provider's concurrency
        self.closed = False

    def reserve(self, n: int) -> bool:
        with self.lock:
            if self.body_bytes + n > MAX_BODY_IN_FLIGHT:
                return False
            self.body_bytes += n
            return True

    def release(self, n: int) -> None:
        with self.lock:
            self.body_bytes -= n

    def end(self) -> None:
        """The attempt is over: cut its upstream calls (their slots go to others)."""
        with self.lock:
            self.closed = True
            conns, self.upstream = list(self.upstream), set()
        for c in conns:
            try:
                c.close()
            except Exception:
                pass

    def add_call(self, rec: dict) -> threading.Event:
        """Keep ``rec``; the event is set once its handler has finished with it."""
        done = threading.Event()
        with self.lock:
            if len(self.calls) < MAX_CALLS:
                self.calls.append(rec)
                self.inflight[id(rec)] = done
            else:
                self.dropped_calls += 1
        return done

    def settle(self, rec: dict, done: threading.Event) -> None:
        with self.lock:
            self.inflight.pop(id(rec), None)
        done.set()

    def wait_settled(self, seconds: float) -> None:
        """Let calls whose answer already went out finish their bookkeeping (an agent can have its
        last answer a moment before the gateway's thread writes the call's latency down)."""
        deadline = time.monotonic() + seconds
        with self.lock:
            pending = list(self.inflight.values())
        for ev in pending:
            ev.wait(max(0.0, deadline - time.monotonic()))

    def add_egress(self, rec: dict) -> dict:
        with self.lock:
            if len(self.egress) < MAX_EGRESS:
                self.egress.append(rec)
            else:
                self.dropped_egress += 1
        return rec


class State:
    def __init__(self) -> None:
        self.providers: dict[str, Provider] = {}
        self.timeout = 300.0
        self.retries = 0
        self.by_token: dict[str, Attempt] = {}
        self.by_ip: dict[str, Attempt] = {}
        self.lock = threading.Lock()
        self.per_attempt = 4
        self.server_tools = False
        self.last_admin = time.monotonic()

    def attempt_for(self, token: str | None, local_ip: str) -> Attempt | None:
        with self.lock:
            a = self.by_token.get(token or "")
        if a is None or (a.ip and a.ip != local_ip):
            return None  # a token from another attempt's network, or none at all
        return a

    def attempt_at(self, local_ip: str) -> Attempt | None:
        with self.lock:
            return self.by_ip.get(local_ip)


STATE = State()
def _admin_token() -> str:
    """The admin token, from a file the controller put in (never the environment: `docker inspect` shows that)."""
    path = os.environ.get("HARNESS_GATEWAY_ADMIN_FILE", os.path.join(os.path.dirname(os.path.abspath(__file__)), "admin-token"))
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


ADMIN_TOKEN = _admin_token()


# -- usage as the answer reports it ----------------------------------------------
def _usage_of(obj: dict, into: dict) -> None:
    """Fold the usage fields of one JSON object (an answer, or one stream event) into ``into``."""
    if not isinstance(obj, dict):
        return
    for holder in (obj, obj.get("response"), obj.get("message"), obj.get("delta")):
        if not isinstance(holder, dict):
            continue
        u = holder.get("usage")
        if not isinstance(u, dict):
            continue
        def num(k: str) -> int | None:
            v = u.get(k)
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None
        t_in = num("prompt_tokens") if "prompt_tokens" in u else num("input_tokens")
        t_out = num("completion_tokens") if "completion_tokens" in u else num("output_tokens")
        details = u.get("prompt_tokens_details") or u.get("input_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if cached is None and "cache_read_input_tokens" in u:
            cached = num("cache_read_input_tokens")
        for k, v in (("tokens_in", t_in), ("tokens_out", t_out),
                     ("tokens_cached", cached if isinstance(cached, int) and cached >= 0 else None)):
            if v is not None:
                into[k] = v  # later events carry the running totals (Anthropic's message_delta, the final chunk)


class Masker:
    """Replaces a key in a byte stream with as many '*' (lengths, and so Content-Length, stay),
    holding back only a tail that could be the start of the key."""

    def __init__(self, key: str | None):
        self.key = key.encode() if key and len(key) >= 8 else b""
        self.tail = b""

    def text(self, value: str) -> str:
        return value.replace(self.key.decode(), "*" * len(self.key)) if self.key else value

    def feed(self, chunk: bytes) -> bytes:
        """The bytes safe to send now; ``b""`` at the end flushes what was held back."""
        if not self.key:
            return chunk
        data = (self.tail + chunk).replace(self.key, b"*" * len(self.key))
        if not chunk:
            self.tail = b""
            return data
        hold = next((i for i in range(min(len(self.key) - 1, len(data)), 0, -1) if data.endswith(self.key[:i])), 0)
        self.tail = data[len(data) - hold:] if hold else b""
        return data[: len(data) - hold]


def server_side_tools(req: dict) -> str | None:
    """Why a request asks the provider to run tools itself (web search, fetch, code, MCP), or None."""
    if req.get("mcp_servers"):
        return "mcp_servers"
    tools = req.get("tools")
    for t in tools if isinstance(tools, list) else []:
        kind = str(t.get("type", "")) if isinstance(t, dict) else ""
        if kind.startswith(SERVER_TOOLS):
            return f"tool type {kind[:60]!r}"
    return None


class SSEUsage:
    """Reads ``data:`` lines of a server-sent-event stream as they pass, for their usage."""

    def __init__(self) -> None:
        self.buf = b""
        self.usage: dict = {}

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            line = line.strip()
            if line.startswith(b"data:") and b"usage" in line:
                try:
                    _usage_of(json.loads(line[5:].strip()), self.usage)
                except ValueError:
                    pass
        if len(self.buf) > 1 << 20:  # a line this long is not an event we can read
            self.buf = b""


# -- handlers --------------------------------------------------------------------
class _Base(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "harness-gateway"
    sys_version = ""
    timeout = IDLE_S  # the socket's timeout: slow or idle clients are dropped, never held forever

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass  # no request lines in the log: paths and headers may carry agent data

    def _json(self, status: int, obj: object, close: bool = False) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _body(self, attempt: "Attempt | None" = None) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self._json(411, {"error": {"message": "harness gateway: send a Content-Length"}}, close=True)
            return None
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n = -1
        if n < 0 or n > MAX_BODY:
            self._json(413, {"error": {"message": f"harness gateway: body must be 0..{MAX_BODY} bytes"}}, close=True)
            return None
        if not n:
            return b""
        if attempt is not None and not attempt.reserve(n):
            self._json(503, {"error": {"message": "harness gateway: too many request bytes in flight for this attempt"}}, close=True)
            return None
        try:
            data = self.rfile.read(n)
        finally:
            if attempt is not None:
                attempt.release(n)
        if len(data) < n:
            self.close_connection = True
            return None
        return data


class _AttemptHandler(_Base):
    """A handler for connections from attempt networks: a connection that arrives on an
    address no attempt has is closed before anything is read; an attempt holds at most
    MAX_CONNS connections."""

    attempt_here: "Attempt | None" = None

    def setup(self) -> None:
        super().setup()
        try:
            local = self.connection.getsockname()[0]
        except OSError:
            local = ""
        a = STATE.attempt_at(local)
        if a is not None:
            with a.lock:
                if a.conns >= MAX_CONNS:
                    a = None
                else:
                    a.conns += 1
        self.attempt_here = a

    def handle(self) -> None:
        if self.attempt_here is None:
            self.close_connection = True
            return  # nothing read, nothing answered
        super().handle()

    def finish(self) -> None:
        a = self.attempt_here
        if a is not None:
            with a.lock:
                a.conns -= 1
        try:
            super().finish()
        except OSError:
            pass


class AdminHandler(_Base):
    def _auth(self) -> bool:
        if not ADMIN_TOKEN or not hmac.compare_digest(self.headers.get("X-Harness-Admin", ""), ADMIN_TOKEN):
            self._json(403, {"error": "admin token required"}, close=True)
            return False
        STATE.last_admin = time.monotonic()
        return True

    def do_GET(self) -> None:
        if not self._auth():
            return
        if self.path == "/admin/health":
            with STATE.lock:
                n = len(STATE.by_token)
            self._json(200, {"ok": True, "attempts": n, "providers": sorted(STATE.providers)})
        else:
            self._json(404, {"error": "no such admin path"})

    def do_POST(self) -> None:
        if not self._auth():
            return
        body = self._body()
        if body is None:
            return
        try:
            req = json.loads(body or b"{}")
            if self.path == "/admin/config":
                lim = req.get("limits", {})
                provs = {n: Provider(n, p["base"], p.get("key"), int(lim.get("concurrency", 8)), lim.get("rate"))
                         for n, p in req.get("providers", {}).items()}
                with STATE.lock:
                    STATE.providers = provs
                    STATE.timeout = float(lim.get("timeout", 300.0))
                    STATE.retries = int(lim.get("retries", 0))
                    conc = int(lim.get("concurrency", 8))
                    STATE.per_attempt = int(lim.get("per_attempt") or max(1, conc // 2))
                    STATE.server_tools = bool(lim.get("server_tools", False))
                log(f"providers {', '.join(f'{n} -> {p.scheme}://{p.host}:{p.port}{p.prefix}' for n, p in provs.items())}")
                self._json(200, {"ok": True})
            elif self.path == "/admin/attempts":
                a = Attempt(str(req["attempt"]), str(req.get("policy", "gateway")), list(req.get("allow") or []), req.get("ip"),
                            STATE.per_attempt)
                with STATE.lock:
                    STATE.by_token[str(req["token"])] = a
                    if a.ip:
                        STATE.by_ip[a.ip] = a
                self._json(200, {"ok": True})
            elif self.path == "/admin/attempts/close":
                with STATE.lock:
                    a = STATE.by_token.pop(str(req["token"]), None)
                    if a is not None and a.ip and STATE.by_ip.get(a.ip) is a:
                        del STATE.by_ip[a.ip]
                if a is None:
                    self._json(404, {"error": "no such attempt"})
                    return
                a.wait_settled(1.0)  # a call still waiting on the upstream after this is cut_off
                a.end()
                now = time.time()
                with a.lock:
                    calls = []
                    for c in a.calls:
                        c = dict(c)
                        if c.get("latency_s") is None:  # still waiting on the upstream when the agent was stopped
                            c.update(error="cut_off", latency_s=round(max(0.0, now - c["started"] - c.get("queued_s", 0.0)), 6),
                                     detail="still in flight when the attempt ended")
                        calls.append(c)
                    out = {"calls": calls, "egress": [dict(e) for e in a.egress], "dropped_calls": a.dropped_calls,
                           "dropped_egress": a.dropped_egress}
                self._json(200, out)
            else:
                self._json(404, {"error": "no such admin path"})
        except (KeyError, TypeError, ValueError) as e:
            self._json(400, {"error": f"{type(e).__name__}: {e}"})


class ApiHandler(_AttemptHandler):
    def do_GET(self) -> None:
        self._call("GET")

    def do_POST(self) -> None:
        self._call("POST")

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return self.headers.get("x-api-key")

    def _refuse(self, status: int, msg: str, attempt: Attempt | None, provider: str, endpoint: str, t0: float) -> None:
        if attempt is not None:
            rec = {"provider": provider[:40], "endpoint": endpoint[:80], "status": status, "error": "refused",
                   "started": t0, "latency_s": round(time.time() - t0, 6), "detail": msg[:300]}
            attempt.settle(rec, attempt.add_call(rec))  # complete as recorded
        self._json(status, {"error": {"type": "harness_gateway", "message": f"harness gateway: {msg}"}})

    def _call(self, method: str) -> None:
        t0 = time.time()
        local_ip = self.connection.getsockname()[0]
        path = urllib.parse.urlsplit(self.path).path
        provider_name, _, rest = path.lstrip("/").partition("/")
        endpoint = "/" + rest
        if provider_name == "openai" and endpoint.startswith("/v1/"):
            endpoint = endpoint[3:]  # agents get .../openai/v1 (as OpenAI's own base URL ends); the provider's base has it
        attempt = STATE.attempt_for(self._token(), local_ip)
        if attempt is None:  # before reading the body: an unknown caller gets nothing held for it
            self.close_connection = True
            self._refuse(401, "unknown attempt token (each attempt has its own, valid only on its own network, only while it runs)",
                         STATE.attempt_at(local_ip), provider_name, endpoint, t0)
            return
        body = self._body(attempt) if method == "POST" else b""
        if body is None:
            return
        t0 = time.time()  # the agent's own upload is not time spent waiting on the model
        prov = STATE.providers.get(provider_name)
        if prov is None:
            self._refuse(404, f"no provider {provider_name!r} in this run (providers: {', '.join(sorted(STATE.providers)) or 'none'})",
                         attempt, provider_name, endpoint, t0)
            return
        if (method, endpoint) not in ENDPOINTS.get(provider_name, set()):
            self._refuse(403, f"{method} {endpoint} is not an endpoint the gateway forwards for {provider_name}", attempt,
                         provider_name, endpoint, t0)
            return
        model, stream = None, False
        if body:
            try:
                req = json.loads(body)
            except ValueError:
                req = None
            if isinstance(req, dict):
                model = req.get("model") if isinstance(req.get("model"), str) else None
                stream = req.get("stream") is True
                why = None if STATE.server_tools else server_side_tools(req)
                if why:
                    self._refuse(403, f"{why}: tools the provider runs itself reach the internet from its side; this run "
                                 "does not allow them ([gateway] server_tools = true does)", attempt, provider_name, endpoint, t0)
                    return
        rec = {"provider": provider_name[:40], "endpoint": endpoint[:80], "model": (model or None) and model[:200], "stream": stream,
               "started": t0, "bytes_in": len(body), "retries": 0, "queued_s": 0.0}
        done = attempt.add_call(rec)  # recorded from the start: a call still in flight when the attempt ends is kept (cut_off)
        try:
            self._forward(prov, method, endpoint, body, rec, t0, attempt)
        finally:
            rec["latency_s"] = round(max(0.0, time.time() - t0 - rec["queued_s"]), 6)  # the upstream's part; queued_s beside it
            attempt.settle(rec, done)

    def _headers_out(self, prov: Provider) -> dict[str, str]:
        # only headers a model call needs: never the agent's choice of organisation, project or other routing
        out = {k: v for k, v in self.headers.items() if k.lower() in REQUEST_HEADERS or k.lower().startswith("x-stainless-")}
        out["Host"] = prov.host if prov.port in (80, 443) else f"{prov.host}:{prov.port}"
        prov.auth(out)
        return out

    def _forward(self, prov: Provider, method: str, endpoint: str, body: bytes, rec: dict, t0: float, attempt: Attempt) -> None:
        q0 = time.monotonic()
        attempt.calls_sem.acquire()  # its share first, so one attempt cannot hold every slot of a provider
        try:
            prov.sem.acquire()
        except BaseException:
            attempt.calls_sem.release()
            raise
        try:
            prov.slot()
            rec["queued_s"] = round(time.monotonic() - q0, 6)
            target = prov.prefix + endpoint
            if self.path.find("?") >= 0:
                target += "?" + self.path.split("?", 1)[1]
            headers = self._headers_out(prov)
            tries = 0
            while True:
                conn = prov.connect(STATE.timeout)
                with attempt.lock:
                    if attempt.closed:
                        return
                    attempt.upstream.add(conn)
                try:
                    conn.request(method, target, body=body or None, headers=headers)
                    resp = conn.getresponse()
                except (socket.timeout, TimeoutError):
                    conn.close()
                    if self._retry(rec, tries):
                        tries += 1
                        continue
                    rec.update(status=504, error="timeout", detail=f"no answer from {prov.host} within {STATE.timeout:.0f} s")
                    self._json(504, {"error": {"type": "harness_gateway", "message": "harness gateway: upstream timed out"}})
                    return
                except (OSError, http.client.HTTPException) as e:
                    conn.close()
                    if self._retry(rec, tries):
                        tries += 1
                        continue
                    rec.update(status=502, error="connection", detail=f"{type(e).__name__}: {str(e)[:200]}")
                    self._json(502, {"error": {"type": "harness_gateway", "message": f"harness gateway: upstream unreachable ({type(e).__name__})"}})
                    return
                if resp.status in RETRYABLE and tries < STATE.retries:
                    resp.read()
                    conn.close()
                    self._retry(rec, tries, resp.getheader("Retry-After"))
                    tries += 1
                    continue
                break
            rec["ttfb_s"] = round(time.time() - t0 - rec["queued_s"], 6)
            self._relay(conn, resp, rec, t0 + rec["queued_s"], prov.key)
        finally:
            prov.sem.release()
            attempt.calls_sem.release()

    def _retry(self, rec: dict, tries: int, retry_after: str | None = None) -> bool:
        if tries >= STATE.retries:
            return False
        rec["retries"] = tries + 1
        try:
            wait = min(10.0, float(retry_after)) if retry_after else min(10.0, 0.5 * 2 ** tries)
        except ValueError:
            wait = min(10.0, 0.5 * 2 ** tries)
        time.sleep(max(0.0, wait))
        return True

    def _relay(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, rec: dict, t0: float,
               key: str | None = None) -> None:
        status = resp.status
        rec["status"] = status
        if status == 429:
            rec["error"] = "rate_limited"
        elif status >= 500:
            rec["error"] = "server_error"
        elif status in (401, 403):
            rec["error"] = "auth"
        elif status >= 400:
            rec["error"] = "client_error"
        length = resp.getheader("Content-Length")
        mask = Masker(key)
        self.send_response(status)
        for k, v in resp.getheaders():
            lk = k.lower()
            if lk in RESPONSE_HEADERS or lk.startswith(("x-ratelimit-", "anthropic-ratelimit-")):
                self.send_header(k, mask.text(v))
        chunked = length is None
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", length)
        self.end_headers()
        sse = SSEUsage() if "text/event-stream" in (resp.getheader("Content-Type") or "") else None
        kept = bytearray()
        n = 0
        first = True
        agent_gone = False

        def send(data: bytes) -> None:
            nonlocal agent_gone
            if agent_gone or not data:
                return
            try:
                self.wfile.write(data)
            except OSError:
                agent_gone = True  # the agent hung up: its choice, not the provider's failure

        try:
            while True:
                chunk = resp.read1(65536)
                if first and chunk:
                    rec["ttfb_s"] = round(time.time() - t0, 6)
                    first = False
                n += len(chunk)
                if sse is not None:
                    sse.feed(chunk)
                elif len(kept) < MAX_USAGE_SCAN:
                    kept += chunk[: MAX_USAGE_SCAN - len(kept)]
                out = mask.feed(chunk)  # an upstream that echoes the key never hands it to the agent
                if out:
                    send(f"{len(out):x}\r\n".encode() + out + b"\r\n" if chunked else out)
                if not chunk or agent_gone:
                    break
            if agent_gone:
                rec["detail"] = f"the agent closed the connection after {n} bytes of the answer"
                self.close_connection = True
            else:
                if length is not None and length.isdigit() and n < int(length):  # read1 ends quietly at a short body
                    raise http.client.IncompleteRead(b"", int(length) - n)
                if chunked:
                    send(b"0\r\n\r\n")
                try:
                    self.wfile.flush()
                except OSError:
                    self.close_connection = True
        except (http.client.IncompleteRead, ConnectionError, OSError) as e:  # reading the upstream's answer
            timed_out = isinstance(e, (socket.timeout, TimeoutError))
            rec.update(error="timeout" if timed_out else "connection",
                       detail=("upstream stalled mid-answer" if timed_out else f"answer cut off after {n} bytes ({type(e).__name__})"))
            self.close_connection = True  # the agent sees the cut too: the answer it got is incomplete
        finally:
            conn.close()
            rec["bytes_out"] = n
        usage = sse.usage if sse is not None else {}
        if sse is None and kept and rec.get("error") is None:
            try:
                _usage_of(json.loads(bytes(kept)), usage)
            except ValueError:
                pass
        rec.update(usage)


class ProxyHandler(_AttemptHandler):
    """CONNECT host:port (TLS and anything else) and plain-HTTP absolute URIs, for attempts
    whose policy is ``allowlist``."""

    def _decide(self, host: str, port: int, method: str) -> tuple[Attempt | None, dict, str | None]:
        attempt = STATE.attempt_at(self.connection.getsockname()[0])
        ev = {"at": time.time(), "method": method[:16], "host": host[:255], "port": port, "addr": None,
              "allowed": False, "rule": None, "reason": "", "bytes_up": 0, "bytes_down": 0, "duration_s": 0.0}
        if attempt is None:
            return None, ev, "no attempt on this network"
        if attempt.policy != "allowlist":
            ev["reason"] = f"network policy is {attempt.policy}"
            return attempt, attempt.add_egress(ev), ev["reason"]
        rule = egress_allowed(attempt.rules, host, port)
        if rule is None:  # refused before any lookup: a refused name never leaves as a DNS query
            ev["reason"] = "not in the allowlist"
            return attempt, attempt.add_egress(ev), ev["reason"]
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            addr = infos[0][4][0]
        except (OSError, UnicodeError) as e:
            ev["reason"] = f"does not resolve ({type(e).__name__})"
            return attempt, attempt.add_egress(ev), ev["reason"]
        ev["addr"] = addr
        ev.update(allowed=True, rule=rule.text[:200])
        return attempt, attempt.add_egress(ev), None

    def _open(self, host: str, port: int, method: str) -> tuple[socket.socket, dict] | None:
        """The upstream connection for an allowed ``host:port`` (logged), or None: refused or
        unreachable, answered and logged."""
        _attempt, ev, why = self._decide(host, port, method)
        if why:
            self._json(403, {"error": f"refused by the harness egress allowlist: {host}:{port} ({why})"}, close=True)
            return None
        try:
            return socket.create_connection((ev["addr"], port), timeout=10), ev
        except OSError as e:
            ev.update(allowed=False, reason=f"connect failed: {type(e).__name__}")
            self._json(502, {"error": f"harness egress proxy: cannot connect to {host}:{port}"}, close=True)
            return None

    def do_CONNECT(self) -> None:
        host, _, port_s = self.path.rpartition(":")
        host = host.strip("[]")
        try:
            port = int(port_s)
        except ValueError:
            self._json(400, {"error": "CONNECT host:port"}, close=True)
            return
        t = time.monotonic()
        opened = self._open(host, port, "CONNECT")
        if opened is None:
            return
        up, ev = opened
        self.send_response(200, "Connection Established")
        self.end_headers()
        self.wfile.flush()
        self._pipe(self.connection, up, ev)
        ev["duration_s"] = round(time.monotonic() - t, 4)
        self.close_connection = True

    def _plain(self) -> None:
        u = urllib.parse.urlsplit(self.path)
        if u.scheme != "http" or not u.hostname:
            self._json(400, {"error": "harness egress proxy: send CONNECT host:port, or an absolute http:// URI"}, close=True)
            return
        body = self._body(self.attempt_here)
        if body is None:
            return
        t = time.monotonic()
        opened = self._open(u.hostname, u.port or 80, self.command)
        if opened is None:
            return
        up, ev = opened
        target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        lines = [f"{self.command} {target} HTTP/1.1"]
        lines += [f"{k}: {v}" for k, v in self.headers.items() if not k.lower().startswith("proxy-") and k.lower() != "connection"]
        lines.append("Connection: close")
        up.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        ev["bytes_up"] += len(body)
        self._pipe(self.connection, up, ev, one_way=True)
        ev["duration_s"] = round(time.monotonic() - t, 4)
        self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = _plain

    @staticmethod
    def _pipe(client: socket.socket, up: socket.socket, ev: dict, one_way: bool = False) -> None:
        socks = [client, up]
        try:
            while socks:
                r, _, _ = select.select(socks, [], [], 300)
                if not r:
                    break
                for s in r:
                    data = s.recv(65536)
                    other = up if s is client else client
                    if not data:
                        if s is up or one_way:
                            return
                        socks.remove(s)
                        try:
                            up.shutdown(socket.SHUT_WR)
                        except OSError:
                            pass
                        continue
                    other.sendall(data)
                    ev["bytes_up" if s is client else "bytes_down"] += len(data)
        except OSError:
            pass
        finally:
            up.close()


def serve(host: str, port: int, handler: type) -> ThreadingHTTPServer:
    srv = ThreadingHTTPServer((host, port), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True, name=f"gw-{port}").start()
    return srv


def _undumpable() -> None:
    """No other process of this uid may read this one's memory (/proc/PID/mem, environ): the keys live there."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        log("could not make the process undumpable")


def _watchdog() -> None:
    """Exit when the controller has not spoken for WATCHDOG_S: a killed controller leaves no gateway holding keys."""
    while True:
        time.sleep(5)
        if time.monotonic() - STATE.last_admin > WATCHDOG_S:
            log(f"no word from the controller for {WATCHDOG_S:.0f} s; exiting")
            os._exit(0)


def main() -> None:
    if not ADMIN_TOKEN:
        log("no admin token (admin-token next to this file); refusing to start")
        sys.exit(2)
    _undumpable()
    threading.Thread(target=_watchdog, daemon=True, name="gw-watchdog").start()
    admin_ip = os.environ.get("HARNESS_GATEWAY_ADMIN_IP") or socket.gethostbyname(socket.gethostname())
    serve(admin_ip, ADMIN_PORT, AdminHandler)
    serve("0.0.0.0", API_PORT, ApiHandler)
    serve("0.0.0.0", PROXY_PORT, ProxyHandler)
    log(f"ready: admin {admin_ip}:{ADMIN_PORT}, api :{API_PORT}, proxy :{PROXY_PORT}")
    threading.Event().wait()


if __name__ == "__main__":
    main()
