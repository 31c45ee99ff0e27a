#!/bin/bash
set -euo pipefail
psql -v ON_ERROR_STOP=1 -q -c "\copy (SELECT to_char(placed_at, 'YYYY-MM') AS month, count(*) AS orders, sum(amount_cents) AS revenue_cents FROM orders WHERE status = 'paid' AND placed_at >= '2024-01-01' AND placed_at < '2025-01-01' GROUP BY 1 ORDER BY 1) TO '/app/report.csv' WITH (FORMAT csv, HEADER)"
