#!/bin/bash
set -euo pipefail
sed -i 's/^port = "80a"$/port = 8080/' /app/config/service.toml
python3 - <<'PY'
import json
p = "/app/config/settings.json"
cfg = json.load(open(p))
cfg["workers"] = 4
json.dump(cfg, open(p, "w"), indent=2)
PY
