#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import json

def merge(a, b):
    out = dict(a)
    for k, v in b.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out

d = json.load(open("/app/defaults.json"))
o = json.load(open("/app/overrides.json"))
json.dump(merge(d, o), open("/app/merged.json", "w"), indent=2)
PY
