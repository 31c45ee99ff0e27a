#!/bin/bash
mkdir -p /logs/verifier
python3 - <<'PY'
import json
want = json.load(open("/tests/expected.json"))
try:
    got = json.load(open("/app/merged.json"))
except (OSError, ValueError) as e:
    got, why = None, f"merged.json unreadable: {e}"
else:
    why = "matches" if got == want else "differs: " + ", ".join(sorted(k for k in set(want) | set(got or {}) if (got or {}).get(k) != want.get(k)))
open("/logs/verifier/reward.txt", "w").write("1\n" if got == want else "0\n")
print(why)
PY
