"""Egress allowlist entries: parsing and matching (standard library only).

An entry names where an attempt under the ``allowlist`` network policy may connect, through
the harness's egress proxy:

* ``api.example.com`` — that host name exactly;
* ``*.example.com`` — any name below example.com (not example.com itself);
* ``203.0.113.7`` or ``10.0.0.0/8`` — an address or a CIDR block (IPv4 or IPv6, the IPv6
  form in brackets when a port follows: ``[2001:db8::/32]:443``);
* each optionally with ports: ``:443``, ``:80,443``, ``:8000-8100`` or ``:*`` (any); no
  port means 80 and 443.

A name entry matches the name the client asked for; an address entry matches an address the
client asked for (an IP literal), never a name that happens to resolve inside it: the proxy
decides before any lookup, so a refused name never leaves as a DNS query (no exfiltration
through the resolver), and only an admitted name is resolved. This module is imported by the model (validation) and, as a
plain file, by the gateway process inside its container, so it uses the standard library only.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

DEFAULT_PORTS = ((80, 80), (443, 443))
_NAME = re.compile(r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")


@dataclass(frozen=True)
class EgressRule:
    """One parsed allowlist entry."""

    text: str
    name: str | None  # exact name, or the suffix of a wildcard
    wildcard: bool
    net: ipaddress.IPv4Network | ipaddress.IPv6Network | None
    ports: tuple[tuple[int, int], ...] | None  # None = any port

    def port_ok(self, port: int) -> bool:
        return self.ports is None or any(lo <= port <= hi for lo, hi in self.ports)

    def matches(self, host: str, port: int, addr: str | None = None) -> bool:
        """Whether a connection to ``host:port`` (resolved to ``addr``) is allowed by this rule."""
        if not self.port_ok(port):
            return False
        h = host.lower().rstrip(".")
        if self.net is not None:
            try:
                return ipaddress.ip_address(h.strip("[]")) in self.net
            except ValueError:
                return False  # a name: address entries admit addresses only
        if self.wildcard:
            return h.endswith("." + (self.name or ""))
        return h == self.name


def _ports(text: str, entry: str) -> tuple[tuple[int, int], ...] | None:
    if text == "*":
        return None
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"allowlist entry {entry!r}: port {part!r} is not a number, a range or '*'") from None
        if not (1 <= a <= b <= 65535):
            raise ValueError(f"allowlist entry {entry!r}: port {part!r} outside 1-65535")
        out.append((a, b))
    return tuple(out)


def parse_rule(entry: str) -> EgressRule:
    """Parse one allowlist entry (see the module docstring); ValueError says what is wrong."""
    text = entry.strip()
    if not text:
        raise ValueError("allowlist entry is empty")
    host, ports = text, None
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise ValueError(f"allowlist entry {entry!r}: expected ':PORTS' after ']'")
            ports = rest[1:]
    elif text.count(":") == 1:
        host, _, ports = text.partition(":")
    port_ranges = DEFAULT_PORTS if ports is None else _ports(ports, entry)
    h = host.lower().rstrip(".")
    try:
        net = ipaddress.ip_network(h, strict=False)
    except ValueError:
        net = None
    if net is not None:
        return EgressRule(text, None, False, net, port_ranges)
    if h == "*" or not _NAME.match(h):
        raise ValueError(f"allowlist entry {entry!r}: not a host name, '*.domain', an address or a CIDR block "
                         "(optionally with :PORTS); '*' alone is not allowed (use network = \"bridge\")")
    wildcard = h.startswith("*.")
    return EgressRule(text, h[2:] if wildcard else h, wildcard, None, port_ranges)


def parse_rules(entries: list[str]) -> list[EgressRule]:
    return [parse_rule(e) for e in entries]


def allowed(rules: list[EgressRule], host: str, port: int, addr: str | None = None) -> EgressRule | None:
    """The first rule that admits ``host:port`` (resolved to ``addr``), or None."""
    for r in rules:
        if r.matches(host, port, addr):
            return r
    return None
