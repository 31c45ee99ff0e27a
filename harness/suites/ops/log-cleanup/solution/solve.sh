#!/bin/bash
set -euo pipefail
cd /app/logs
for f in app-*.log; do
  d=${f#app-}; d=${d%.log}
  if [[ "$d" < "2024-06-01" ]]; then rm -f -- "$f"; fi
done
