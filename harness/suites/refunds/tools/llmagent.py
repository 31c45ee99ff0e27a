#!/usr/bin/python3 -IS
"""refunds-llm: an LLM agent for the `refunds` suite, over the OpenAI chat completions API.

It sees only the ticket ($HARNESS_PROMPT_FILE, default /harness/in/prompt.txt) and the
`refunds` tools, offered to the model as functions (one per subcommand, a JSON schema of its
flags). Each tool call the model makes runs the tool as a subprocess on the state database
($HARNESS_STATE) and its JSON output goes back to the model as a `tool` message, until a reply
has no tool calls.

Configuration (environment):
  OPENAI_BASE_URL          API base, default https://api.openai.com/v1 (in a sandbox: the
                           harness gateway, e.g. http://harness-gateway:8080/openai/v1)
  OPENAI_API_KEY           sent as `Authorization: Bearer ...`; never printed or logged
  REFUNDS_LLM_MODEL        model, default gpt-4o-mini
  HARNESS_SEED             sent as the request's `seed` (with temperature 0)
  REFUNDS_LLM_MAX_TURNS    model calls before giving up, default 30
  REFUNDS_LLM_TIMEOUT      seconds per HTTP request, default 120
  REFUNDS_LLM_BACKOFF      first retry delay in seconds, default 0.5 (doubles per retry)
  HARNESS_TRANSCRIPT       JSON-lines transcript, default /work/transcript.jsonl
  REFUNDS_TOOL             the tools' command line; else `refunds` on PATH; else the
                           refunds.py next to this file

HTTP errors are handled the way production agents do: 429, 5xx, timeouts and broken
connections are retried up to 3 times (exponential backoff; Retry-After honoured, capped at
10 s); other errors are not retried.

Exit: 0 the model finished (a reply without tool calls), 1 internal error (no prompt, tools
not runnable), 2 the model API failed (one line on stderr naming the status), 3 the turn
limit was reached.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

EXIT_OK, EXIT_INTERNAL, EXIT_API, EXIT_TURNS = 0, 1, 2, 3
MAX_RETRIES = 3
RETRY_AFTER_CAP = 10.0
TOOL_TIMEOUT = 60
MAX_TOOL_OUTPUT = 20_000

SYSTEM_PROMPT = """\
You are the refund desk agent of an online shop. Resolve the customer's ticket using only the \
tools you are given; they act on the shop's real database and every write is final.
- Call `policy` first and follow its rules exactly (refund window, goodwill threshold, fraud \
flags, cancellations, duplicate charges, where refunds go, how to reply).
- Look the customer, their orders, payments and existing refunds up with the tools. Use only ids \
and amounts that tool results showed you: never invent or guess a customer, order or payment id.
- Make each write (refund, store credit, cancellation, escalation) once; a tool error means it \
was not done.
- Reply to the customer with `send_email` exactly once, at the email address on file for them.
- When the ticket is resolved, answer with a one-paragraph summary and no tool call."""

# The `refunds` subcommands and their flags (tools/refunds.py's argparse), as functions.
# Each entry: description, {argument: (json type, required, description)}. An argument
# `amount_cents` is the flag `--amount-cents`; the function `find_customer` runs `find-customer`.
_AMOUNT = {"amount": ("string", False, "amount in dollars, e.g. 12.50 (give amount or amount_cents)"),
           "amount_cents": ("integer", False, "amount in integer cents, e.g. 1250 (give amount or amount_cents)")}
TOOL_SPECS: dict[str, tuple[str, dict[str, tuple[str, bool, str]]]] = {
    "policy": ("The refund policy (rules, refund window, goodwill threshold) and today's date.", {}),
    "find_customer": ("Look a customer up by exactly one of email, name (substring) or id.", {
        "email": ("string", False, "email address"),
        "name": ("string", False, "part of the customer's name"),
        "id": ("integer", False, "customer id"),
    }),
    "list_orders": ("A customer's orders, newest first, with their item descriptions.", {
        "customer": ("integer", True, "customer id"),
    }),
    "get_order": ("One order with its line items, payments (and how much of each was refunded) and refunds.", {
        "order": ("integer", True, "order id"),
    }),
    "list_payments": ("An order's payments, with how much of each was refunded.", {
        "order": ("integer", True, "order id"),
    }),
    "issue_refund": ("Refund (part of) one payment to its original method (a store-credit payment goes back to the balance).", {
        "payment": ("integer", True, "payment id"),
        **_AMOUNT,
        "reason": ("string", True, "why, for the record"),
    }),
    "issue_store_credit": ("Add store credit to the customer's balance, for one of their orders.", {
        "customer": ("integer", True, "customer id"),
        "order": ("integer", True, "order id"),
        **_AMOUNT,
        "reason": ("string", True, "why, for the record"),
    }),
    "cancel_order": ("Mark an order cancelled. Does not refund anything.", {
        "order": ("integer", True, "order id"),
    }),
    "send_email": ("Email a customer.", {
        "customer": ("integer", True, "customer id"),
        "to": ("string", True, "recipient address"),
        "subject": ("string", True, "subject line"),
        "body": ("string", True, "message text"),
    }),
    "escalate": ("Hand the case to a human supervisor.", {
        "customer": ("integer", True, "customer id"),
        "order": ("integer", False, "order id, if the case is about one"),
        **_AMOUNT,
        "reason": ("string", True, "what the supervisor must decide"),
    }),
}


def tool_schemas() -> list[dict]:
    """The `tools` of a chat completions request."""
    out = []
    for name, (desc, params) in TOOL_SPECS.items():
        props = {k: {"type": t, "description": d} for k, (t, _req, d) in params.items()}
        out.append({"type": "function", "function": {
            "name": name, "description": desc,
            "parameters": {"type": "object", "properties": props,
                           "required": [k for k, (_t, req, _d) in params.items() if req],
                           "additionalProperties": False}}})
    return out


class ApiError(Exception):
    """The model API failed for good; the message is one line naming the status."""


class Transcript:
    """JSON lines, each with the time since start; the API key is redacted from every line."""

    def __init__(self, f, secret: str):
        self.f = f
        self.secret = secret
        self.t0 = time.monotonic()

    def redact(self, text: str) -> str:
        if self.secret:
            for form in {self.secret, json.dumps(self.secret)[1:-1]}:
                text = text.replace(form, "[redacted]")
        return text

    def log(self, kind: str, **fields) -> None:
        rec = {"t": round(time.monotonic() - self.t0, 4), "type": kind, **fields}
        self.f.write(self.redact(json.dumps(rec, default=str)) + "\n")
        self.f.flush()


def tool_command() -> list[str]:
    if os.environ.get("REFUNDS_TOOL"):
        return shlex.split(os.environ["REFUNDS_TOOL"])
    found = shutil.which("refunds")
    if found:
        return [found]
    return [sys.executable, "-I", "-S", str(Path(__file__).resolve().with_name("refunds.py"))]


def tool_argv(name: str, raw_arguments) -> list[str]:
    """Map a model's tool call to `refunds` arguments; ValueError says what is wrong with it."""
    if name not in TOOL_SPECS:
        raise ValueError(f"unknown tool {name!r}; the tools are: {', '.join(TOOL_SPECS)}")
    if isinstance(raw_arguments, str):
        try:
            args = json.loads(raw_arguments) if raw_arguments.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"arguments of {name} are not valid JSON ({e.msg} at char {e.pos}); send a JSON object") from None
    else:
        args = raw_arguments if raw_arguments is not None else {}
    if not isinstance(args, dict):
        raise TypeError(f"arguments of {name} must be a JSON object, got {type(args).__name__}")
    params = TOOL_SPECS[name][1]
    argv = [name.replace("_", "-")]
    for key, value in args.items():
        if key not in params:
            raise ValueError(f"{name} has no argument {key!r}; it takes: {', '.join(params) or 'none'}")
        if value is None:
            continue
        kind = params[key][0]
        if isinstance(value, (bool, dict, list)):
            raise TypeError(f"{name}: argument {key!r} must be a {kind}, got {json.dumps(value)[:80]}")
        if kind == "integer" and isinstance(value, float) and value.is_integer():
            value = int(value)
        value = str(value)
        if "\x00" in value:
            raise ValueError(f"{name}: argument {key!r} contains a NUL character")
        argv.append(f"--{key.replace('_', '-')}={value}")  # `=`: a value starting with '-' stays a value
    return argv


def run_tool(cmd: list[str], argv: list[str]) -> tuple[int, str]:
    """Run one `refunds` command; returns (exit code, the JSON text for the model)."""
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}  # the tools have no use for it
    try:
        proc = subprocess.run([*cmd, *argv], check=False, capture_output=True, text=True,
                              timeout=TOOL_TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        return 124, json.dumps({"ok": False, "error": f"the tool did not answer within {TOOL_TIMEOUT} s"})
    except OSError as e:
        raise RuntimeError(f"cannot run the refunds tool {shlex.join(cmd)}: {e}") from None
    out = (proc.stdout if proc.returncode == 0 else proc.stderr or proc.stdout).strip()
    if not out:
        out = json.dumps({"ok": proc.returncode == 0, "exit": proc.returncode})
    if len(out) > MAX_TOOL_OUTPUT:
        out = out[:MAX_TOOL_OUTPUT] + f"... [{len(out) - MAX_TOOL_OUTPUT} more characters cut]"
    return proc.returncode, out


def retry_delay(headers, attempt: int, backoff: float) -> float:
    """Seconds before retry number ``attempt`` (0-based): the server's Retry-After if it gave
    one (capped), else exponential backoff."""
    if headers is not None:
        ms = headers.get("retry-after-ms")
        ra = headers.get("retry-after")
        try:
            if ms is not None:
                return min(max(float(ms) / 1000, 0.0), RETRY_AFTER_CAP)
            if ra is not None:
                try:
                    return min(max(float(ra), 0.0), RETRY_AFTER_CAP)
                except ValueError:
                    when = email.utils.parsedate_to_datetime(ra).timestamp()
                    return min(max(when - time.time(), 0.0), RETRY_AFTER_CAP)
        except (TypeError, ValueError, OverflowError):
            pass
    return min(backoff * (2 ** attempt), RETRY_AFTER_CAP)


def error_detail(body: bytes) -> str:
    """The error message of an API error body (OpenAI or Anthropic shape), one line."""
    try:
        err = json.loads(body).get("error")
        msg = err.get("message") if isinstance(err, dict) else err
    except (ValueError, AttributeError):
        msg = body.decode("utf-8", "replace")
    return " ".join(str(msg or "").split())[:300]


class Client:
    """POST {base}/chat/completions with retries."""

    def __init__(self, base: str, key: str, transcript: Transcript, timeout: float, backoff: float):
        self.url = base.rstrip("/") + "/chat/completions"
        self.key = key
        self.log = transcript
        self.timeout = timeout
        self.backoff = backoff

    def chat(self, payload: dict, turn: int) -> dict:
        data = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "refunds-llm/1"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        for attempt in range(MAX_RETRIES + 1):
            self.log.log("request", turn=turn, attempt=attempt, url=self.url, model=payload.get("model"),
                         messages=len(payload["messages"]), tools=len(payload.get("tools", [])),
                         seed=payload.get("seed"), bytes=len(data))
            req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            failure, resp_headers = None, None
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    body = resp.read()
            except urllib.error.HTTPError as e:
                resp_headers = e.headers
                try:
                    detail = error_detail(e.read())
                except (OSError, http.client.HTTPException):
                    detail = ""
                failure = f"HTTP {e.code}" + (f": {detail}" if detail else "")
                if not (e.code == 429 or e.code >= 500):
                    self.log.log("api_error", turn=turn, attempt=attempt, status=e.code, error=failure)
                    raise ApiError(f"model API error: {failure} (not retried)") from None
            except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
                reason = getattr(e, "reason", None) or e
                failure = f"connection error: {type(reason).__name__}: {reason}".rstrip(": ")
            else:
                try:
                    reply = json.loads(body)
                except ValueError as e:
                    reply = f"{type(e).__name__}: {e}"
                if not isinstance(reply, dict):
                    problem = reply if isinstance(reply, str) else "not a JSON object"
                    self.log.log("api_error", turn=turn, attempt=attempt, status=200, error=f"unreadable reply: {problem}")
                    raise ApiError(f"model API error: HTTP 200 with an unreadable body ({problem})")
                return reply
            if attempt == MAX_RETRIES:
                self.log.log("api_error", turn=turn, attempt=attempt, error=failure, gave_up=True)
                raise ApiError(f"model API error: {failure} (gave up after {MAX_RETRIES + 1} attempts)")
            wait = retry_delay(resp_headers, attempt, self.backoff)
            self.log.log("retry", turn=turn, attempt=attempt, error=failure, wait_s=round(wait, 3))
            time.sleep(wait)
        raise AssertionError("unreachable")


def run(prompt: str, client: Client, log: Transcript, model: str, seed: int | None, max_turns: int) -> int:
    cmd = tool_command()
    messages: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}]
    tools = tool_schemas()
    usage_total = {"prompt_tokens": 0, "completion_tokens": 0}
    log.log("start", model=model, seed=seed, base_url=client.url.rsplit("/chat/completions", 1)[0],
            task=os.environ.get("HARNESS_TASK_ID"), tool=shlex.join(cmd), max_turns=max_turns)
    for turn in range(max_turns):
        payload = {"model": model, "messages": messages, "tools": tools, "tool_choice": "auto", "temperature": 0}
        if seed is not None:
            payload["seed"] = seed
        reply = client.chat(payload, turn)
        choices = reply.get("choices") or []
        msg = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
        if not isinstance(msg, dict):
            log.log("api_error", turn=turn, error="reply has no choices[0].message", reply=reply)
            raise ApiError("model API error: HTTP 200 but the reply has no choices[0].message")
        usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else None
        for k in usage_total:
            if usage and isinstance(usage.get(k), int):
                usage_total[k] += usage[k]
        calls = [c for c in (msg.get("tool_calls") or []) if isinstance(c, dict)]
        log.log("reply", turn=turn, id=reply.get("id"), finish_reason=choices[0].get("finish_reason"),
                message=msg, usage=usage)
        assistant = {"role": "assistant", "content": msg.get("content")}
        if calls:
            assistant["tool_calls"] = calls
        messages.append(assistant)
        if not calls:
            log.log("final", turns=turn + 1, content=msg.get("content"), usage=usage_total)
            print(log.redact(str(msg.get("content") or "")))
            return EXIT_OK
        for i, call in enumerate(calls):
            fn = call.get("function") if isinstance(call.get("function"), dict) else {}
            name, raw = fn.get("name"), fn.get("arguments")
            call_id = call.get("id") or f"call_{turn}_{i}"
            log.log("tool_call", turn=turn, id=call_id, name=name, arguments=raw)
            try:
                argv = tool_argv(str(name), raw)
            except (ValueError, TypeError) as e:
                code, content = None, json.dumps({"ok": False, "error": str(e)})
            else:
                code, content = run_tool(cmd, argv)
                log.log("tool_run", turn=turn, id=call_id, argv=["refunds", *argv], exit=code)
            log.log("tool_result", turn=turn, id=call_id, exit=code, content=content)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
    log.log("gave_up", turns=max_turns, usage=usage_total)
    print(f"refunds-llm: no answer after {max_turns} turns (REFUNDS_LLM_MAX_TURNS)", file=sys.stderr)
    return EXIT_TURNS


def env_number(name: str, default: float, kind=float):
    raw = os.environ.get(name)
    try:
        return kind(raw) if raw not in (None, "") else default
    except ValueError:
        raise SystemExit(f"refunds-llm: {name}={raw!r} is not a number") from None


def main() -> int:
    key = os.environ.get("OPENAI_API_KEY", "")
    with open(os.environ.get("HARNESS_TRANSCRIPT") or "/work/transcript.jsonl", "a", encoding="utf-8") as f:
        return agent(Transcript(f, key), key)


def agent(log: Transcript, key: str) -> int:
    try:
        prompt_file = os.environ.get("HARNESS_PROMPT_FILE") or "/harness/in/prompt.txt"
        try:
            prompt = Path(prompt_file).read_text(encoding="utf-8")
        except OSError as e:
            raise RuntimeError(f"cannot read the ticket {prompt_file}: {e.strerror}") from None
        seed_raw = os.environ.get("HARNESS_SEED")
        seed = env_number("HARNESS_SEED", None, int) if seed_raw not in (None, "") else None
        client = Client(os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1", key, log,
                        timeout=env_number("REFUNDS_LLM_TIMEOUT", 120.0), backoff=env_number("REFUNDS_LLM_BACKOFF", 0.5))
        return run(prompt, client, log, os.environ.get("REFUNDS_LLM_MODEL") or "gpt-4o-mini", seed,
                   max(1, env_number("REFUNDS_LLM_MAX_TURNS", 30, int)))
    except ApiError as e:
        print(log.redact(" ".join(f"refunds-llm: {e}".split())), file=sys.stderr)
        return EXIT_API
    except (RuntimeError, OSError) as e:
        log.log("error", error=str(e))
        print(log.redact(" ".join(f"refunds-llm: {e}".split())), file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
