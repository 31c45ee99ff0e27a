CREATE TABLE accounts (
    id integer PRIMARY KEY,
    owner text NOT NULL,
    email text NOT NULL,
    balance_cents bigint NOT NULL
);
CREATE TABLE payments (
    id integer PRIMARY KEY,
    account_id integer NOT NULL REFERENCES accounts(id),
    amount_cents bigint NOT NULL CHECK (amount_cents > 0),
    paid_on date NOT NULL,
    memo text NOT NULL
);
CREATE TABLE refunds (
    id serial PRIMARY KEY,
    payment_id integer NOT NULL REFERENCES payments(id),
    amount_cents bigint NOT NULL CHECK (amount_cents > 0),
    reason text NOT NULL
);
CREATE TABLE ledger (
    id serial PRIMARY KEY,
    account_id integer NOT NULL REFERENCES accounts(id),
    delta_cents bigint NOT NULL,
    note text NOT NULL
);
INSERT INTO accounts VALUES
  (1, 'Ada Moreau', 'ada.moreau@example.com', 0),
  (2, 'Bo Lindqvist', 'bo.lindqvist@example.com', 1250),
  (3, 'Chiara Neri', 'chiara.neri@example.com', 0),
  (4, 'Dev Raman', 'dev.raman@example.com', 300);
INSERT INTO payments VALUES
  (501, 1, 4599, '2024-06-02', 'annual plan'),
  (502, 2, 1999, '2024-06-03', 'monthly plan'),
  (503, 3, 4599, '2024-06-03', 'annual plan'),
  (504, 3, 1999, '2024-06-04', 'add-on: extra seats'),
  (505, 4, 899, '2024-06-05', 'storage pack');
INSERT INTO refunds (payment_id, amount_cents, reason) VALUES (502, 1999, 'duplicate charge');
SELECT setval('refunds_id_seq', 1);
INSERT INTO ledger (account_id, delta_cents, note) VALUES (2, 1999, 'refund of payment 502');
