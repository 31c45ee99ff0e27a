#!/usr/bin/python3 -IS
"""refunds: the refund desk's tools, acting on the state database named by $HARNESS_STATE
(default /work/state.db).

Every command prints one JSON object on stdout. Errors print {"ok": false, "error": ...} on
stderr and exit non-zero: 2 usage, 3 not found, 4 invalid input, 5 state database problem.
The tools check that input is well-formed and refers to things that exist; they do NOT apply
the refund policy (run `refunds policy` to read it) - that is the agent's job.

Examples:
  refunds policy
  refunds find-customer --email ana.silva@example.com
  refunds list-orders --customer 1
  refunds get-order --order 1001
  refunds issue-refund --payment 1 --amount 45.99 --reason "kettle arrived cracked"
  refunds issue-store-credit --customer 8 --order 1008 --amount-cents 1500 --reason "late delivery"
  refunds cancel-order --order 1012
  refunds send-email --customer 1 --to ana.silva@example.com --subject "Your refund" --body "..."
  refunds escalate --customer 7 --order 1007 --amount 50 --reason "goodwill above threshold"
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import sys

EXIT_USAGE, EXIT_NOT_FOUND, EXIT_INVALID, EXIT_STATE = 2, 3, 4, 5
EMAIL_RE = re.compile(r"^[^@\s<>]+@[^@\s<>]+\.[A-Za-z]{2,}$")
MAX_TEXT = 10_000


class ToolError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def fail(code: int, message: str) -> ToolError:
    return ToolError(code, message)


def db_path() -> str:
    return os.environ.get("HARNESS_STATE") or "/work/state.db"


def connect() -> sqlite3.Connection:
    path = db_path()
    if not os.path.isfile(path):
        raise fail(EXIT_STATE, f"state database {path} does not exist (set HARNESS_STATE)")
    try:
        conn = sqlite3.connect(path, timeout=10, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("SELECT 1 FROM policy").fetchone()
    except sqlite3.Error as e:
        raise fail(EXIT_STATE, f"state database {path} is not usable: {e}") from None
    return conn


def rows(cur) -> list[dict]:
    return [dict(r) for r in cur]


def today(conn) -> str:
    return conn.execute("SELECT today FROM policy WHERE id = 1").fetchone()[0]


def cents(args) -> int:
    """--amount DOLLARS (e.g. 12.50) or --amount-cents N -> positive integer cents."""
    if args.amount is not None and args.amount_cents is not None:
        raise fail(EXIT_INVALID, "give --amount or --amount-cents, not both")
    if args.amount_cents is not None:
        value = args.amount_cents
    elif args.amount is not None:
        from decimal import Decimal, InvalidOperation  # only here: keeps every other call fast

        raw = args.amount.strip().lstrip("$").replace(",", "")
        try:
            d = Decimal(raw)
        except InvalidOperation:
            raise fail(EXIT_INVALID, f"--amount {args.amount!r} is not a number of dollars like 12.50") from None
        if not d.is_finite() or d != d.quantize(Decimal("0.01")):
            raise fail(EXIT_INVALID, f"--amount {args.amount!r} must have at most two decimals")
        value = int(d * 100)
    else:
        raise fail(EXIT_INVALID, "an amount is required: --amount DOLLARS or --amount-cents N")
    if value <= 0:
        raise fail(EXIT_INVALID, f"amount must be positive, got {value} cents")
    if value > 100_000_000:
        raise fail(EXIT_INVALID, f"amount {value} cents is not plausible")
    return value


def text(value: str, name: str) -> str:
    value = (value or "").strip()
    if not value:
        raise fail(EXIT_INVALID, f"{name} must not be empty")
    if len(value) > MAX_TEXT:
        raise fail(EXIT_INVALID, f"{name} is longer than {MAX_TEXT} characters")
    return value


def get_customer(conn, customer_id: int) -> dict:
    r = conn.execute("SELECT * FROM customers WHERE id = ?", (customer_id,)).fetchone()
    if r is None:
        raise fail(EXIT_NOT_FOUND, f"customer {customer_id} not found")
    return dict(r)


def get_order_row(conn, order_id: int) -> dict:
    r = conn.execute("SELECT * FROM orders WHERE id = ?", (order_id,)).fetchone()
    if r is None:
        raise fail(EXIT_NOT_FOUND, f"order {order_id} not found")
    return dict(r)


def payments_of(conn, order_id: int) -> list[dict]:
    out = rows(conn.execute(
        "SELECT p.*, COALESCE((SELECT SUM(r.amount_cents) FROM refunds r WHERE r.payment_id = p.id), 0) "
        "AS refunded_cents FROM payments p WHERE p.order_id = ? ORDER BY p.id", (order_id,)))
    return out


# --------------------------------------------------------------------------- commands


def cmd_policy(conn, args) -> dict:
    p = dict(conn.execute("SELECT * FROM policy WHERE id = 1").fetchone())
    p["rules"] = [line.strip() for line in p["rules"].splitlines() if line.strip()]
    p.pop("id", None)
    return {"policy": p}


def cmd_find_customer(conn, args) -> dict:
    given = [x for x in (args.email, args.name, args.id) if x is not None]
    if len(given) != 1:
        raise fail(EXIT_INVALID, "give exactly one of --email, --name, --id")
    if args.id is not None:
        found = rows(conn.execute("SELECT * FROM customers WHERE id = ?", (args.id,)))
    elif args.email is not None:
        found = rows(conn.execute("SELECT * FROM customers WHERE lower(email) = lower(?)", (text(args.email, "--email"),)))
    else:
        found = rows(conn.execute("SELECT * FROM customers WHERE name LIKE ? ORDER BY id",
                                  (f"%{text(args.name, '--name')}%",)))
    if not found:
        raise fail(EXIT_NOT_FOUND, "no customer matches")
    return {"customers": found}


def cmd_list_orders(conn, args) -> dict:
    get_customer(conn, args.customer)
    orders = rows(conn.execute("SELECT * FROM orders WHERE customer_id = ? ORDER BY ordered_on DESC, id DESC",
                               (args.customer,)))
    for o in orders:
        o["items"] = [r[0] for r in conn.execute(
            "SELECT description FROM line_items WHERE order_id = ? ORDER BY id", (o["id"],))]
    return {"orders": orders}


def cmd_get_order(conn, args) -> dict:
    order = get_order_row(conn, args.order)
    order["line_items"] = rows(conn.execute("SELECT * FROM line_items WHERE order_id = ? ORDER BY id", (args.order,)))
    order["payments"] = payments_of(conn, args.order)
    order["refunds"] = rows(conn.execute("SELECT * FROM refunds WHERE order_id = ? ORDER BY id", (args.order,)))
    return {"order": order}


def cmd_list_payments(conn, args) -> dict:
    get_order_row(conn, args.order)
    return {"payments": payments_of(conn, args.order)}


def cmd_issue_refund(conn, args) -> dict:
    amount = cents(args)
    reason = text(args.reason, "--reason")
    conn.execute("BEGIN IMMEDIATE")
    try:
        p = conn.execute("SELECT * FROM payments WHERE id = ?", (args.payment,)).fetchone()
        if p is None:
            raise fail(EXIT_NOT_FOUND, f"payment {args.payment} not found")
        if p["status"] != "captured":
            raise fail(EXIT_INVALID, f"payment {args.payment} was never captured (status {p['status']}); nothing to refund")
        cur = conn.execute(
            "INSERT INTO refunds (payment_id, order_id, amount_cents, method, reason, created_on) "
            "VALUES (?, ?, ?, 'original', ?, ?)", (p["id"], p["order_id"], amount, reason, today(conn)))
        if p["method"] == "store_credit":  # money paid from the balance goes back to the balance
            cid = conn.execute("SELECT customer_id FROM orders WHERE id = ?", (p["order_id"],)).fetchone()[0]
            conn.execute("UPDATE customers SET store_credit_cents = store_credit_cents + ? WHERE id = ?", (amount, cid))
        refund = dict(conn.execute("SELECT * FROM refunds WHERE id = ?", (cur.lastrowid,)).fetchone())
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    refund["to"] = f"{p['method']} {p['reference']}"
    return {"ok": True, "refund": refund}


def cmd_issue_store_credit(conn, args) -> dict:
    amount = cents(args)
    reason = text(args.reason, "--reason")
    conn.execute("BEGIN IMMEDIATE")
    try:
        get_customer(conn, args.customer)
        order = get_order_row(conn, args.order)
        if order["customer_id"] != args.customer:
            raise fail(EXIT_INVALID, f"order {args.order} belongs to customer {order['customer_id']}, not {args.customer}")
        cur = conn.execute(
            "INSERT INTO refunds (payment_id, order_id, amount_cents, method, reason, created_on) "
            "VALUES (NULL, ?, ?, 'store_credit', ?, ?)", (args.order, amount, reason, today(conn)))
        conn.execute("UPDATE customers SET store_credit_cents = store_credit_cents + ? WHERE id = ?", (amount, args.customer))
        refund = dict(conn.execute("SELECT * FROM refunds WHERE id = ?", (cur.lastrowid,)).fetchone())
        balance = conn.execute("SELECT store_credit_cents FROM customers WHERE id = ?", (args.customer,)).fetchone()[0]
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return {"ok": True, "refund": refund, "store_credit_cents": balance}


def cmd_cancel_order(conn, args) -> dict:
    conn.execute("BEGIN IMMEDIATE")
    try:
        order = get_order_row(conn, args.order)
        if order["status"] == "cancelled":
            raise fail(EXIT_INVALID, f"order {args.order} is already cancelled")
        conn.execute("UPDATE orders SET status = 'cancelled' WHERE id = ?", (args.order,))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return {"ok": True, "order": args.order, "previous_status": order["status"], "status": "cancelled",
            "note": "payments are not refunded by cancelling; use issue-refund"}


def cmd_send_email(conn, args) -> dict:
    to = text(args.to, "--to")
    if not EMAIL_RE.match(to):
        raise fail(EXIT_INVALID, f"--to {to!r} is not an email address")
    subject, body = text(args.subject, "--subject"), text(args.body, "--body")
    conn.execute("BEGIN IMMEDIATE")
    try:
        get_customer(conn, args.customer)
        cur = conn.execute("INSERT INTO emails (customer_id, to_addr, subject, body, sent_on) VALUES (?, ?, ?, ?, ?)",
                           (args.customer, to, subject, body, today(conn)))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return {"ok": True, "email": {"id": cur.lastrowid, "to": to, "subject": subject}}


def cmd_escalate(conn, args) -> dict:
    reason = text(args.reason, "--reason")
    amount = cents(args) if (args.amount is not None or args.amount_cents is not None) else None
    conn.execute("BEGIN IMMEDIATE")
    try:
        get_customer(conn, args.customer)
        if args.order is not None:
            order = get_order_row(conn, args.order)
            if order["customer_id"] != args.customer:
                raise fail(EXIT_INVALID, f"order {args.order} belongs to customer {order['customer_id']}, not {args.customer}")
        cur = conn.execute(
            "INSERT INTO escalations (customer_id, order_id, amount_cents, reason, created_on) VALUES (?, ?, ?, ?, ?)",
            (args.customer, args.order, amount, reason, today(conn)))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return {"ok": True, "escalation": {"id": cur.lastrowid, "status": "open"}}


# --------------------------------------------------------------------------- CLI


class Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors as JSON too, exit 2
        raise ToolError(EXIT_USAGE, f"{self.prog}: {message}")


def _amount_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--amount", help="dollars, e.g. 12.50")
    p.add_argument("--amount-cents", type=int, help="integer cents, e.g. 1250")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="refunds", description=__doc__.split("\n\n")[0],
                    epilog="Exit codes: 0 ok, 2 usage, 3 not found, 4 invalid input, 5 state database problem.",
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    sub.add_parser("policy", help="the refund policy and today's date").set_defaults(fn=cmd_policy)

    p = sub.add_parser("find-customer", help="look a customer up by --email, --name (substring) or --id")
    p.add_argument("--email")
    p.add_argument("--name")
    p.add_argument("--id", type=int)
    p.set_defaults(fn=cmd_find_customer)

    p = sub.add_parser("list-orders", help="a customer's orders, newest first")
    p.add_argument("--customer", type=int, required=True)
    p.set_defaults(fn=cmd_list_orders)

    p = sub.add_parser("get-order", help="one order with its line items, payments and refunds")
    p.add_argument("--order", type=int, required=True)
    p.set_defaults(fn=cmd_get_order)

    p = sub.add_parser("list-payments", help="an order's payments, with how much of each was refunded")
    p.add_argument("--order", type=int, required=True)
    p.set_defaults(fn=cmd_list_payments)

    p = sub.add_parser("issue-refund", help="refund (part of) a payment to its original method")
    p.add_argument("--payment", type=int, required=True)
    _amount_args(p)
    p.add_argument("--reason", required=True)
    p.set_defaults(fn=cmd_issue_refund)

    p = sub.add_parser("issue-store-credit", help="credit the customer's store-credit balance, for an order")
    p.add_argument("--customer", type=int, required=True)
    p.add_argument("--order", type=int, required=True)
    _amount_args(p)
    p.add_argument("--reason", required=True)
    p.set_defaults(fn=cmd_issue_store_credit)

    p = sub.add_parser("cancel-order", help="mark an order cancelled (does not refund)")
    p.add_argument("--order", type=int, required=True)
    p.set_defaults(fn=cmd_cancel_order)

    p = sub.add_parser("send-email", help="email a customer")
    p.add_argument("--customer", type=int, required=True)
    p.add_argument("--to", required=True)
    p.add_argument("--subject", required=True)
    p.add_argument("--body", required=True)
    p.set_defaults(fn=cmd_send_email)

    p = sub.add_parser("escalate", help="hand the case to a human supervisor")
    p.add_argument("--customer", type=int, required=True)
    p.add_argument("--order", type=int)
    _amount_args(p)
    p.add_argument("--reason", required=True)
    p.set_defaults(fn=cmd_escalate)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        conn = connect()
        try:
            result = args.fn(conn, args)
        finally:
            conn.close()
    except ToolError as e:
        print(json.dumps({"ok": False, "error": str(e), "exit": e.code}), file=sys.stderr)
        return e.code
    except sqlite3.Error as e:
        print(json.dumps({"ok": False, "error": f"database error: {e}", "exit": EXIT_STATE}), file=sys.stderr)
        return EXIT_STATE
    print(json.dumps(result, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
