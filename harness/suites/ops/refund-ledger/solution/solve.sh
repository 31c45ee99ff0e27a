#!/bin/bash
set -euo pipefail
psql -v ON_ERROR_STOP=1 -q <<'SQL'
BEGIN;
INSERT INTO refunds (payment_id, amount_cents, reason) VALUES (504, 1999, 'add-on bought by mistake');
INSERT INTO ledger (account_id, delta_cents, note) VALUES (3, 1999, 'refund of payment 504');
UPDATE accounts SET balance_cents = balance_cents + 1999 WHERE id = 3;
COMMIT;
SQL
