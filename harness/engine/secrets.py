"""Secrets by name, and what the run's model gateway serves.

``--secret NAME`` (or ``secrets = [...]`` in suite.toml) names a provider key the gateway
injects; the value is read from the controller's environment (``NAME``, or ``ENVVAR`` with
``--secret NAME=ENVVAR``) and handed to the gateway's memory only. Runs store names. A value
that shows up anyway in what the run stores or hands an agent (the agent command, agent or
task environments, services, the note) is refused before anything starts.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Iterable

from harness.model.errors import RunError
from harness.model.gateway import PROVIDERS
from harness.model.suite import SECRET_NAME, Suite, Task

KEY_NAMES = {key: prov for prov, (_base, key, _env) in PROVIDERS.items()}
MIN_SECRET_LEN = 8  # shorter values are not looked for in commands (they would match by chance)
# what a credential written into a command line looks like: NAME_API_KEY=..., a provider key's shape
LOOKS_SECRET = re.compile(r"(?i)\b[A-Z0-9_]*(API_KEY|APIKEY|ACCESS_KEY|SECRET|TOKEN|PASSWORD)[A-Z0-9_]*=\S{8,}"
                          r"|\bsk-(ant-)?[A-Za-z0-9_-]{16,}")


@dataclass(frozen=True)
class GatewayPlan:
    """Providers the gateway serves (name -> base URL), their keys (name -> value, memory only),
    and the secret names (stored)."""

    upstreams: dict[str, str] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict, repr=False)
    names: list[str] = field(default_factory=list)

    @property
    def redact(self) -> dict[str, str]:
        """value -> secret name, for anything written from an attempt (belt and braces)."""
        by_prov = {prov: key for key, prov in KEY_NAMES.items()}
        return {v: by_prov[p] for p, v in self.keys.items() if len(v) >= MIN_SECRET_LEN}


def parse_secret(spec: str) -> tuple[str, str]:
    """``NAME`` or ``NAME=ENVVAR`` -> (name, the environment variable holding its value)."""
    name, _, var = spec.partition("=")
    name, var = name.strip(), (var.strip() or name.strip())
    for n in (name, var):
        if not SECRET_NAME.match(n):
            raise RunError(f"--secret {spec!r}: give a name like OPENAI_API_KEY (or NAME=ENVVAR), never the value")
    if name not in KEY_NAMES:
        raise RunError(f"--secret {name}: the gateway injects model API keys only: {', '.join(KEY_NAMES)} "
                       f"(another variable can hold it: --secret OPENAI_API_KEY=MY_VAR); other credentials are never given "
                       "to an agent (it would hold them): put the service it needs behind a per-attempt service instead")
    return name, var


def plan_gateway(secret_specs: Iterable[str], upstream_specs: Iterable[str], env: dict[str, str] | None = None) -> GatewayPlan:
    """Resolve secrets and ``--upstream NAME=URL`` overrides into a :class:`GatewayPlan`."""
    env = dict(os.environ) if env is None else env
    upstreams: dict[str, str] = {}
    for spec in upstream_specs:
        prov, _, url = spec.partition("=")
        prov, url = prov.strip().lower(), url.strip()
        if prov not in PROVIDERS or not url.startswith(("http://", "https://")):
            raise RunError(f"--upstream {spec!r}: give PROVIDER=URL with PROVIDER one of {', '.join(PROVIDERS)}, "
                           "e.g. --upstream openai=https://api.openai.com/v1")
        parts = urllib.parse.urlsplit(url)
        if (parts.hostname or "") in ("localhost", "127.0.0.1", "::1", "0.0.0.0") or (parts.hostname or "").startswith("127."):
            raise RunError(f"--upstream {spec!r}: the gateway runs in a container, where {parts.hostname} is the gateway "
                           f"itself; a server on this host is host.docker.internal there: "
                           f"--upstream {prov}={url.replace(parts.hostname or '', 'host.docker.internal', 1)}")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise RunError(f"--upstream {prov}=…: no credentials, query or fragment in the URL (it is stored with the run); "
                           "the key goes in by name: --secret")
        upstreams[prov] = url.rstrip("/")
    keys, names = {}, []
    for spec in dict.fromkeys(secret_specs):
        name, var = parse_secret(spec)
        value = env.get(var)
        if not value:
            raise RunError(f"secret {name}: ${var} is not set in this shell (export it, or name another variable: "
                           f"--secret {name}=VAR); the value stays with the gateway, never in the run")
        prov = KEY_NAMES[name]
        keys[prov] = value
        names.append(name)
        upstreams.setdefault(prov, PROVIDERS[prov][0])
    return GatewayPlan(upstreams=upstreams, keys=keys, names=names)


def refuse_leaks(plan: GatewayPlan, suite: Suite, tasks: list[Task], agent_cmd: list[str], agent_env: dict[str, str],
                 note: str) -> None:
    """A secret's value in anything the run stores or gives an agent: refused, naming where."""
    places: list[tuple[str, str]] = [("the agent command", " ".join(agent_cmd)), ("--note", note)]
    places += [(f"the agent environment ({k})", f"{k}={v}") for k, v in {**suite.agent_env, **agent_env}.items()]
    for t in tasks:
        places.append((f"task {t.id}'s prompt", t.prompt))
        places += [(f"task {t.id}'s environment ({k})", v) for k, v in t.sandbox.env.items()]
        places += [(f"service {s.name}'s environment ({k})", v) for s in t.services for k, v in s.env.items()]
    places += [(f"service {s.name}'s environment ({k})", v) for s in suite.services for k, v in s.env.items()]
    known = dict(plan.redact)
    for name in KEY_NAMES:  # a provider key in this shell, passed by value instead of by name
        v = os.environ.get(name, "")
        if len(v) >= MIN_SECRET_LEN:
            known.setdefault(v, name)
    for where, text in places[:1] + [p for p in places if p[0].startswith("the agent environment")]:
        m = LOOKS_SECRET.search(text)
        if m:
            what = f"{m.group(0).split('=')[0]}=…" if "=" in m.group(0) else "a provider key, sk-…"
            raise RunError(f"{where} holds what looks like a credential ({what}): it would be stored and shown "
                           "in reports; pass model API keys by name (--secret OPENAI_API_KEY) so the gateway holds them "
                           "(other credentials are never given to an agent)")
    for value, name in known.items():
        for where, text in places:
            if value in text:
                raise RunError(f"the value of secret {name} appears in {where}: it would be stored and shown in reports; "
                               f"pass it by name only (--secret {name}) and let the agent use the gateway "
                               "($OPENAI_BASE_URL / $ANTHROPIC_BASE_URL with the token the harness gives it)")
