#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import csv
totals = {}
with open("/app/transactions.csv", newline="") as f:
    for row in csv.DictReader(f):
        if row["status"] not in ("settled", "refunded"):
            continue
        euros, cents = row["amount"].split(".")
        value = int(euros) * 100 + int(cents)
        sign = 1 if row["status"] == "settled" else -1
        totals[row["customer_id"]] = totals.get(row["customer_id"], 0) + sign * value
with open("/app/totals.csv", "w") as f:
    f.write("customer_id,total_cents\n")
    for c in sorted(totals):
        f.write(f"{c},{totals[c]}\n")
PY
