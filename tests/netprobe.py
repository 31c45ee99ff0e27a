#!/usr/bin/python3
"""A network probe agent (runs inside a sandbox): tries what it is told to and prints one
JSON object with what happened. Used by tests/test_network_docker.py; never graded on it
(its task expects nothing but an untouched state).

$PROBE (JSON): {"tcp": [[host, port], ...], "dns": [name, ...], "proxy": [url, ...],
"calls": [model, ...]} — calls go to $OPENAI_BASE_URL/chat/completions with $OPENAI_API_KEY.
"""

import json
import os
import socket
import urllib.error
import urllib.request

spec = json.loads(os.environ.get("PROBE", "{}"))
out = {"tcp": {}, "dns": {}, "proxy": {}, "calls": [], "env": sorted(k for k in os.environ if "PROXY" in k.upper() or "BASE_URL" in k)}

for host, port in spec.get("tcp", []):
    try:
        s = socket.create_connection((host, int(port)), timeout=2)
        s.close()
        out["tcp"][f"{host}:{port}"] = "connected"
    except OSError as e:
        out["tcp"][f"{host}:{port}"] = f"{type(e).__name__}: {e}"

for name in spec.get("dns", []):
    try:
        out["dns"][name] = socket.gethostbyname(name)
    except OSError as e:
        out["dns"][name] = f"{type(e).__name__}: {e}"

for url in spec.get("proxy", []):  # urllib takes the proxy from HTTP(S)_PROXY
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            out["proxy"][url] = r.status
    except urllib.error.HTTPError as e:
        out["proxy"][url] = e.code
    except (OSError, ValueError) as e:
        out["proxy"][url] = f"{type(e).__name__}: {e}"

for model in spec.get("calls", []):
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "say something short please"}]}).encode()
    req = urllib.request.Request(os.environ.get("OPENAI_BASE_URL", "http://none") + "/chat/completions", data=body,
                                 headers={"Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', '')}",
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            out["calls"].append({"model": model, "status": r.status, "usage": json.loads(r.read()).get("usage")})
    except urllib.error.HTTPError as e:
        out["calls"].append({"model": model, "status": e.code})
    except (OSError, ValueError) as e:
        out["calls"].append({"model": model, "status": f"{type(e).__name__}: {e}"})

try:
    routes = open("/proc/net/route").read().splitlines()[1:]
    out["default_route"] = any(line.split()[1] == "00000000" for line in routes)
    gw = [line.split()[2] for line in routes if line.split()[1] == "00000000"]
    out["gateway_ip"] = socket.inet_ntoa(bytes.fromhex(gw[0])[::-1]) if gw else None
except OSError:
    out["default_route"] = None
    out["gateway_ip"] = None
for port in spec.get("gw_ports", []):  # the host, through this network's own gateway address
    if out["gateway_ip"]:
        try:
            socket.create_connection((out["gateway_ip"], int(port)), timeout=2).close()
            out["tcp"][f"default-gateway:{port}"] = "connected"
        except OSError as e:
            out["tcp"][f"default-gateway:{port}"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
