"""What the model gateway and the egress proxy record, per attempt.

The gateway is the harness's own process in its own container; what it hands the controller
is these records (validated, strings capped), never an agent's bytes. ``None`` means "the
response did not say" (a provider that reports no usage), never zero.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ErrorKind = Literal["rate_limited", "server_error", "timeout", "connection", "auth", "client_error", "refused", "cut_off"]
MAX_CALLS = 2000  # call records kept per attempt (the rest are counted in the summary)
MAX_EGRESS = 2000  # egress log lines kept per attempt

PROVIDERS = {  # name -> (default base URL, the secret that holds its key, the env var an agent reads the base from)
    "openai": ("https://api.openai.com/v1", "OPENAI_API_KEY", "OPENAI_BASE_URL"),
    "anthropic": ("https://api.anthropic.com", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
}


class _Rec(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)


class ModelCall(_Rec):
    """One call an agent made through the gateway."""

    provider: str = Field(..., max_length=40, description="openai or anthropic (the base URL the agent used).")
    endpoint: str = Field("", max_length=80, description="API path, e.g. /v1/chat/completions.")
    model: str | None = Field(None, max_length=200, description="The model the request named.")
    stream: bool = Field(False, description="A streaming call.")
    status: int | None = Field(None, description="HTTP status the agent got (None: the gateway answered no status).")
    error: ErrorKind | None = Field(None, description="rate_limited (429), server_error (5xx), timeout, connection "
                                    "(refused, reset, truncated), auth (the provider refused the key: 401/403), client_error "
                                    "(another 4xx, e.g. an unknown model), refused (by the gateway: unknown token, endpoint), "
                                    "cut_off (still in flight when the attempt ended).")
    started: float = Field(..., description="Unix time the call reached the gateway.")
    queued_s: float = Field(0.0, ge=0, description="Seconds it waited for the gateway's concurrency/rate caps.")
    latency_s: float | None = Field(None, ge=0, description="Seconds from reaching the gateway to the last byte.")
    ttfb_s: float | None = Field(None, ge=0, description="Seconds to the first byte of the upstream's answer.")
    bytes_in: int = Field(0, ge=0, description="Request body bytes.")
    bytes_out: int = Field(0, ge=0, description="Response body bytes.")
    tokens_in: int | None = Field(None, ge=0, description="Input tokens as the response reported them.")
    tokens_out: int | None = Field(None, ge=0, description="Output tokens as the response reported them.")
    tokens_cached: int | None = Field(None, ge=0, description="Cached input tokens as the response reported them.")
    retries: int = Field(0, ge=0, description="Times the gateway retried this call upstream.")
    detail: str = Field("", max_length=300, description="One line on an error.")


class EgressEvent(_Rec):
    """One connection an attempt asked the egress proxy for."""

    at: float = Field(..., description="Unix time.")
    method: str = Field(..., max_length=16, description="CONNECT or the HTTP method of a plain-HTTP request.")
    host: str = Field(..., max_length=255, description="The host asked for.")
    port: int = Field(..., ge=0, le=65535)
    addr: str | None = Field(None, max_length=64, description="The address it resolved to.")
    allowed: bool
    rule: str | None = Field(None, max_length=200, description="The allowlist entry that admitted it.")
    reason: str = Field("", max_length=200, description="Why it was refused.")
    bytes_up: int = Field(0, ge=0)
    bytes_down: int = Field(0, ge=0)
    duration_s: float = Field(0.0, ge=0)


class UpstreamSummary(_Rec):
    """An attempt's model calls, summed. Token sums count the calls that reported them;
    ``calls_without_usage`` says how many did not (a sum is None when none did)."""

    calls: int = 0
    dropped: int = Field(0, description="Calls not recorded: beyond the per-attempt record cap, or a record that would not validate (counted, not kept).")
    rate_limited: int = 0
    server_errors: int = 0
    timeouts: int = 0
    connection_errors: int = 0
    auth_errors: int = Field(0, description="Calls the provider refused the key for (401/403).")
    client_errors: int = Field(0, description="Calls the provider answered with another 4xx (e.g. an unknown model).")
    refused: int = Field(0, description="Calls the gateway refused (bad token, endpoint not allowed).")
    cut_off: int = Field(0, description="Calls still in flight when the agent was stopped (their time counts as waiting).")
    retries: int = 0
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_cached: int | None = None
    calls_without_usage: int = 0
    wait_s: float = Field(0.0, description="Seconds with at least one model call in flight (union of call intervals), "
                          "queueing in the gateway included: the agent's waiting time.")
    queued_s: float = Field(0.0, description="Seconds calls spent queued behind the gateway's caps (summed).")
    bytes_in: int = 0
    bytes_out: int = 0
    models: list[str] = Field(default_factory=list, description="Models named, first-seen order.")
