#!/bin/bash
# The same checks for Harbor (the harness grades this task by the expectations in task.toml).
mkdir -p /logs/verifier
python3 - <<'PY'
import hashlib, json, os, tomllib
ok = True
try:
    svc = tomllib.load(open("/app/config/service.toml", "rb"))
    cfg = json.load(open("/app/config/settings.json"))
    ok &= svc["server"]["port"] == 8080 and svc["tls"]["cert"] == "/app/config/tls/cert.pem"
    ok &= cfg["workers"] == 4 and cfg["queue"]["retries"] == 3
except Exception as e:
    print("unreadable:", e)
    ok = False
files = sorted(os.path.relpath(os.path.join(d, f), "/app/config") for d, _, fs in os.walk("/app/config") for f in fs)
ok &= files == ["README.txt", "service.toml", "settings.json", "tls/cert.pem", "tls/key.pem"]
open("/logs/verifier/reward.txt", "w").write("1\n" if ok else "0\n")
PY
