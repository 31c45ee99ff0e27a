#!/bin/bash
# The same checks for Harbor (the harness grades this task by the expectations in task.toml).
mkdir -p /logs/verifier
cd /app/logs || { echo 0 > /logs/verifier/reward.txt; exit 0; }
have=$(find . -type f | sort | tr '\n' ' ')
want="./app-2024-06-01.log ./app-2024-06-02.log ./app-2024-06-03.log ./archive/app-2023-12-31.log ./current.log "
if [ "$have" = "$want" ]; then echo 1 > /logs/verifier/reward.txt; else echo "have: $have"; echo 0 > /logs/verifier/reward.txt; fi
