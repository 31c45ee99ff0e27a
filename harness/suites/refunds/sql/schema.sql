-- The refund desk: one SQLite database per trial (HARNESS_STATE, default /work/state.db).
-- Money is integer cents. Dates are ISO 'YYYY-MM-DD'; policy.today is "now" so that every
-- trial sees the same calendar.

CREATE TABLE policy (
    id                       INTEGER PRIMARY KEY CHECK (id = 1),
    today                    TEXT    NOT NULL,
    refund_window_days       INTEGER NOT NULL CHECK (refund_window_days > 0),
    goodwill_threshold_cents INTEGER NOT NULL CHECK (goodwill_threshold_cents >= 0),
    support_address          TEXT    NOT NULL,
    rules                    TEXT    NOT NULL  -- one rule per line, shown by `refunds policy`
);

CREATE TABLE customers (
    id                 INTEGER PRIMARY KEY,
    name               TEXT    NOT NULL,
    email              TEXT    NOT NULL UNIQUE,
    fraud_flag         INTEGER NOT NULL DEFAULT 0 CHECK (fraud_flag IN (0, 1)),
    store_credit_cents INTEGER NOT NULL DEFAULT 0 CHECK (store_credit_cents >= 0),
    created_on         TEXT    NOT NULL
);

CREATE TABLE orders (
    id           INTEGER PRIMARY KEY,
    customer_id  INTEGER NOT NULL REFERENCES customers(id),
    status       TEXT    NOT NULL CHECK (status IN ('placed', 'shipped', 'delivered', 'cancelled')),
    ordered_on   TEXT    NOT NULL,
    shipped_on   TEXT,
    delivered_on TEXT,
    total_cents  INTEGER NOT NULL CHECK (total_cents >= 0)
);

CREATE TABLE line_items (
    id               INTEGER PRIMARY KEY,
    order_id         INTEGER NOT NULL REFERENCES orders(id),
    sku              TEXT    NOT NULL,
    description      TEXT    NOT NULL,
    quantity         INTEGER NOT NULL CHECK (quantity > 0),
    unit_price_cents INTEGER NOT NULL CHECK (unit_price_cents >= 0)
);

CREATE TABLE payments (
    id           INTEGER PRIMARY KEY,
    order_id     INTEGER NOT NULL REFERENCES orders(id),
    method       TEXT    NOT NULL CHECK (method IN ('card', 'paypal', 'store_credit')),
    status       TEXT    NOT NULL CHECK (status IN ('captured', 'failed')),
    amount_cents INTEGER NOT NULL CHECK (amount_cents > 0),
    captured_on  TEXT    NOT NULL,
    reference    TEXT    NOT NULL   -- e.g. card brand + last four, or the PayPal transaction id
);

-- method 'original' goes back to the payment (a store_credit payment goes back to the balance);
-- method 'store_credit' adds to customers.store_credit_cents.
CREATE TABLE refunds (
    id           INTEGER PRIMARY KEY,
    payment_id   INTEGER REFERENCES payments(id),
    order_id     INTEGER NOT NULL REFERENCES orders(id),
    amount_cents INTEGER NOT NULL CHECK (amount_cents > 0),
    method       TEXT    NOT NULL CHECK (method IN ('original', 'store_credit')),
    reason       TEXT    NOT NULL,
    created_on   TEXT    NOT NULL,
    CHECK ((method = 'original') = (payment_id IS NOT NULL))
);

CREATE TABLE emails (
    id          INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers(id),
    to_addr     TEXT    NOT NULL,
    subject     TEXT    NOT NULL,
    body        TEXT    NOT NULL,
    sent_on     TEXT    NOT NULL
);

CREATE TABLE escalations (
    id           INTEGER PRIMARY KEY,
    customer_id  INTEGER NOT NULL REFERENCES customers(id),
    order_id     INTEGER REFERENCES orders(id),
    amount_cents INTEGER CHECK (amount_cents IS NULL OR amount_cents >= 0),
    reason       TEXT    NOT NULL,
    status       TEXT    NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'closed')),
    created_on   TEXT    NOT NULL
);

CREATE INDEX orders_customer ON orders(customer_id);
CREATE INDEX line_items_order ON line_items(order_id);
CREATE INDEX payments_order ON payments(order_id);
CREATE INDEX refunds_order ON refunds(order_id);
