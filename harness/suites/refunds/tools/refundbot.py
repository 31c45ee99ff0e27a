#!/usr/bin/python3 -IS
"""refundbot: the reference agent of the `refunds` suite.

It sees only the ticket (the file named by $HARNESS_PROMPT_FILE, default /work/prompt.txt)
and the `refunds` tools, which it runs as subprocesses - real tool calls on the state
database ($HARNESS_STATE). It never sees a task's expectations.

It behaves like a fallible LLM agent, deterministically per $HARNESS_SEED and ticket:
 * situational slips, each with its own probability, that only matter when the situation
   calls for care (several payments, a partial quantity, an amount stated by the customer,
   "my last order" with several orders, a prior refund, a fraud flag, a store-credit
   preference, a shipped order, a multi-step cancellation);
 * two systematic blind spots that no seed avoids: goodwill credit is granted whatever the
   threshold, and replies go to the address the ticket came from, not the one on file.

Resource use is real: every step "thinks" (sha256 iterations, scaled by
$REFUNDBOT_THINK_SCALE, default 1.0: a whole ticket costs ~0.3-1.0 CPU-s at full speed) and
grows a resident "context" (a bytearray, 40-160 MiB by seed and ticket, scaled by
$REFUNDBOT_MEMORY_SCALE), so a tight envelope produces throttling, timeouts and OOM kills.

Every thought, tool call and tool result is a line of JSON in $HARNESS_TRANSCRIPT
(default /work/transcript.jsonl). Exit 0 when it believes it is done, 1 on an internal error.
The tools are found as $REFUNDS_TOOL (a command line), else `refunds` on PATH, else the
refunds.py next to this file (how host-side tests run it without Docker).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import random
import re
import resource
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

MiB = 1024 * 1024
PAGE = 4096
ITERS_PER_WEIGHT = 80_000  # sha256 rounds per unit of step weight at THINK_SCALE 1.0

# Probability of each slip. A slip is decided once per (seed, ticket) up front, so the
# same seed always makes the same choices, and only changes the outcome in the situation
# it describes.
SLIPS = {
    "retry_write": 0.35,           # refunding one of two identical charges, re-sends a refund it thinks timed out
    "misread_quantity": 0.40,      # "one of the two" -> refunds the whole line
    "trust_customer_amount": 0.45,  # refunds the amount the customer states instead of what was paid
    "wrong_last_order": 0.45,      # "my last order" -> the newest order, not the one with the item
    "skip_refund_history": 0.45,   # does not look at existing refunds before refunding
    "skip_fraud_check": 0.50,      # does not look at the account's fraud flag
    "ignore_credit_preference": 0.40,  # refunds to the card although store credit was asked for
    "cancel_shipped": 0.35,        # cancels (and refunds) an order that has already shipped
    "forget_refund_after_cancel": 0.30,  # cancels an unshipped order but never refunds it
    "single_payment_refund": 0.40,  # refunds a split-payment order entirely to the card
    "forget_email_multistep": 0.20,  # after two or more writes, forgets the confirmation email
}


class ToolFailed(Exception):
    """A tool call failed in a way the agent cannot handle."""


class Agent:
    def __init__(self, prompt: str, seed: int, transcript: Path, tool_cmd: list[str],
                 think_scale: float = 1.0, memory_scale: float = 1.0):
        self.prompt = prompt
        self.seed = seed
        self.tool_cmd = tool_cmd
        self.think_scale = max(0.0, think_scale)
        self.transcript = open(transcript, "a", encoding="utf-8")
        self.step = 0
        self.t0 = time.monotonic()
        digest = hashlib.sha256(prompt.encode()).hexdigest()
        self.rng = random.Random(f"refundbot:{seed}:{digest}")
        self.slip = {name: self.rng.random() < p for name, p in SLIPS.items()}
        # How "hard" the ticket feels: scales thinking cost; and how much context it holds.
        self.effort = self.rng.uniform(0.8, 1.6)
        ticket_mib = 40 + int(digest[:8], 16) % 61          # 40..100, by ticket
        target_mib = ticket_mib + self.rng.randint(0, 60)  # +0..60, by seed
        self.context_target = int(target_mib * MiB * max(0.0, memory_scale))
        self.context: list[bytearray] = []
        self.context_bytes = 0
        self.iterations = 0
        self.writes = 0
        self.log("start", seed=seed, task=os.environ.get("HARNESS_TASK_ID"), slips=sorted(k for k, v in self.slip.items() if v),
                 context_target_mib=round(self.context_target / MiB, 1))

    # ------------------------------------------------------------------ plumbing

    def log(self, kind: str, **fields) -> None:
        self.step += 1
        rec = {"step": self.step, "t": round(time.monotonic() - self.t0, 4), "type": kind, **fields}
        self.transcript.write(json.dumps(rec) + "\n")
        self.transcript.flush()

    def think(self, thought: str, weight: float = 1.0) -> None:
        """Spend CPU like a model producing tokens, and grow the resident context."""
        n = int(ITERS_PER_WEIGHT * weight * self.effort * self.rng.uniform(0.7, 1.3) * self.think_scale)
        h = thought.encode()
        for _ in range(n):
            h = hashlib.sha256(h).digest()
        self.iterations += n
        if self.context_bytes < self.context_target:
            chunk = min(self.context_target - self.context_bytes, max(self.context_target // 4, PAGE))
            block = bytearray(chunk)
            block[::PAGE] = b"\x01" * len(range(0, chunk, PAGE))  # touch every page: resident, not just reserved
            self.context.append(block)
            self.context_bytes += chunk
        self.log("thought", text=thought)

    def tool(self, *args: str, allow_fail: bool = False) -> dict | None:
        argv = [*self.tool_cmd, *args]
        self.log("tool_call", argv=["refunds", *args])
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        out, err = proc.stdout.strip(), proc.stderr.strip()
        self.log("tool_result", exit=proc.returncode, stdout=out[:4000], stderr=err[:2000])
        if proc.returncode == 0:
            return json.loads(out)
        if allow_fail and proc.returncode == 3:  # not found: the agent can work around it
            return None
        raise ToolFailed(f"refunds {' '.join(args[:1])} exited {proc.returncode}: {err[:300]}")

    def write(self, *args: str) -> dict | None:
        self.writes += 1
        return self.tool(*args)

    # ------------------------------------------------------------------ the agent loop

    def run(self) -> str:
        self.think("Read the ticket and work out what the customer wants.", 2.0)
        t = parse_ticket(self.prompt)
        self.log("thought", text=f"intent={t['intent']} orders={t['orders']} amounts={t['amounts']} "
                                 f"from={t['from_addr']} last_order={t['last_order']}")
        self.policy = self.tool("policy")["policy"]
        self.today = dt.date.fromisoformat(self.policy["today"])
        self.think("Check the policy that applies.", 1.0)

        customer = self.identify_customer(t)
        if customer is None:
            self.reply(None, t, "We could not find your account",
                       "We could not find an account or order matching your message. Please reply with your order number.")
            return "no customer"
        self.customer = customer
        order = self.pick_order(t, customer)
        if order is None:
            self.reply(customer, t, "We could not find that order",
                       "We could not find the order you mentioned on your account. Please reply with the order number.")
            return "no order"
        self.think(f"Working on order {order['id']} ({order['status']}).", 1.5)
        handler = {"duplicate": self.handle_duplicate, "cancel": self.handle_cancel,
                   "goodwill": self.handle_goodwill}.get(t["intent"], self.handle_return)
        return handler(t, customer, order)

    # ------------------------------------------------------------------ steps

    def identify_customer(self, t: dict) -> dict | None:
        self.think("Find the customer's account.", 1.0)
        if t["from_addr"]:
            res = self.tool("find-customer", "--email", t["from_addr"], allow_fail=True)
            if res:
                return res["customers"][0]
        for oid in t["orders"]:  # sender not on file: go through the order number
            res = self.tool("get-order", "--order", str(oid), allow_fail=True)
            if res:
                cid = res["order"]["customer_id"]
                found = self.tool("find-customer", "--id", str(cid), allow_fail=True)
                if found:
                    return found["customers"][0]
        if t["from_name"]:
            res = self.tool("find-customer", "--name", t["from_name"], allow_fail=True)
            if res and len(res["customers"]) == 1:
                return res["customers"][0]
        return None

    def pick_order(self, t: dict, customer: dict) -> dict | None:
        if t["orders"]:
            res = self.tool("get-order", "--order", str(t["orders"][0]), allow_fail=True)
            if res and res["order"]["customer_id"] == customer["id"]:
                return res["order"]
            return None
        orders = self.tool("list-orders", "--customer", str(customer["id"]))["orders"]
        self.think("No order number given; pick the order the customer means.", 1.5)
        if not orders:
            return None
        chosen = None
        if t["last_order"] and len(orders) > 1 and self.slip["wrong_last_order"]:
            chosen = orders[0]  # newest by date
            self.log("thought", text=f"'Last order' - that is order {chosen['id']}, the most recent one.")
        else:
            words = t["words"]
            matching = [o for o in orders if any(item_matches(i, words) for i in o["items"])]
            chosen = matching[0] if matching else orders[0]
        return self.tool("get-order", "--order", str(chosen["id"]))["order"]

    def fraud_blocked(self, customer: dict, order: dict, amount: int, t: dict) -> bool:
        if self.slip["skip_fraud_check"]:
            return False
        self.think("Check the account for fraud flags before moving money.", 0.5)
        if not customer.get("fraud_flag"):
            return False
        self.write("escalate", "--customer", str(customer["id"]), "--order", str(order["id"]),
                   "--amount-cents", str(amount), "--reason", "Refund request on a fraud-flagged account")
        self.reply(customer, t, "We are reviewing your request",
                   "Thanks for getting in touch. Your request needs a review by our team; "
                   "we will get back to you within 3 business days.")
        return True

    def in_window(self, order: dict) -> bool:
        ref = order.get("delivered_on") or order.get("ordered_on")
        age = (self.today - dt.date.fromisoformat(ref)).days
        return age <= int(self.policy["refund_window_days"])

    def handle_return(self, t: dict, customer: dict, order: dict) -> str:
        if order["status"] in ("placed", "shipped"):
            self.reply(customer, t, "Your order has not been delivered yet",
                       f"Order {order['id']} has not been delivered yet, so it cannot be returned. "
                       "Once it arrives you can return it within the refund window.")
            return "not delivered"
        if not self.in_window(order):
            self.think("Outside the refund window: deny politely.", 1.0)
            self.reply(customer, t, "About your return request",
                       f"Order {order['id']} was delivered on {order['delivered_on']}, which is outside our "
                       f"{self.policy['refund_window_days']}-day return window, so we cannot refund it. Sorry!")
            return "outside window"

        self.think("Work out how much to refund.", 1.5)
        words = t["words"]
        lines = [li for li in order["line_items"] if item_matches(li["description"], words)] or order["line_items"]
        amount = 0
        for li in lines:
            qty = li["quantity"]
            if t["one_of"] and len(lines) == 1 and qty > 1 and not self.slip["misread_quantity"]:
                qty = 1
            amount += qty * li["unit_price_cents"]
        stated = t["amounts"][0] if t["amounts"] else None
        from_customer = False
        if stated is not None and stated != amount and self.slip["trust_customer_amount"]:
            self.log("thought", text=f"The customer says they paid {stated / 100:.2f}; refund that.")
            amount, from_customer = stated, True

        payments = [p for p in order["payments"] if p["status"] == "captured"]
        refunded = 0 if self.slip["skip_refund_history"] else sum(r["amount_cents"] for r in order["refunds"])
        remaining = sum(p["amount_cents"] for p in payments) - refunded
        if remaining <= 0:
            when = ", ".join(r["created_on"] for r in order["refunds"])
            self.reply(customer, t, "Your refund was already issued",
                       f"Good news: the refund for order {order['id']} was already issued on {when}. "
                       "It can take 5-10 business days to show on your statement.")
            return "already refunded"
        if not from_customer:
            amount = min(amount, remaining)
        if self.fraud_blocked(customer, order, amount, t):
            return "escalated (fraud)"

        if t["wants_store_credit"] and not self.slip["ignore_credit_preference"]:
            self.write("issue-store-credit", "--customer", str(customer["id"]), "--order", str(order["id"]),
                       "--amount-cents", str(amount), "--reason", f"Return, store credit requested: {t['subject']}")
            self.reply(customer, t, "Store credit issued",
                       f"We added {amount / 100:.2f} of store credit to your account for order {order['id']}.")
            return "store credit"

        self.refund_across(order, payments, amount, t)
        self.reply(customer, t, "Your refund is on its way",
                   f"We refunded {amount / 100:.2f} for order {order['id']} to your original payment method.")
        return "refunded"

    def refund_across(self, order: dict, payments: list[dict], amount: int, t: dict) -> None:
        """Refund ``amount`` over the order's payments, each up to what is left on it."""
        self.think("Issue the refund to the original payment method(s).", 1.0)
        methods = {p["method"] for p in payments}
        if len(methods) > 1 and self.slip["single_payment_refund"]:
            card = next((p for p in payments if p["method"] != "store_credit"), payments[0])
            plan = [(card, amount)]
        else:
            plan, left = [], amount
            for p in payments:
                take = min(left, p["amount_cents"] - (0 if self.slip["skip_refund_history"] else p["refunded_cents"]))
                if take > 0:
                    plan.append((p, take))
                    left -= take
            if left > 0:  # more than the payments hold (the customer's figure): put the rest on the last one
                if plan:
                    plan[-1] = (plan[-1][0], plan[-1][1] + left)
                else:
                    plan.append((payments[-1], left))
        for p, cents in plan:
            self.write("issue-refund", "--payment", str(p["id"]), "--amount-cents", str(cents),
                       "--reason", f"Ticket: {t['subject']}")

    def handle_duplicate(self, t: dict, customer: dict, order: dict) -> str:
        self.think("Look for two captures of the same amount.", 1.5)
        payments = self.tool("list-payments", "--order", str(order["id"]))["payments"]
        captured = [p for p in payments if p["status"] == "captured"]
        dup = None
        for i, p in enumerate(captured):
            for q in captured[i + 1:]:
                if p["amount_cents"] == q["amount_cents"] and p["method"] == q["method"]:
                    dup = q
        if dup is None:
            self.reply(customer, t, "About the double charge",
                       f"We only see one captured payment for order {order['id']}; the other line on your "
                       "statement is a pending authorisation that will drop off in a few days.")
            return "no duplicate"
        amount = dup["amount_cents"] - dup["refunded_cents"]
        if amount <= 0:
            self.reply(customer, t, "The duplicate charge was already refunded", "The duplicate charge was already refunded.")
            return "already refunded"
        if self.fraud_blocked(customer, order, amount, t):
            return "escalated (fraud)"
        self.think("Refund the duplicate capture in full.", 1.0)
        self.write("issue-refund", "--payment", str(dup["id"]), "--amount-cents", str(amount),
                   "--reason", "Duplicate charge")
        if self.slip["retry_write"]:
            self.log("thought", text="No confirmation seen - the call may have timed out; retrying the refund.")
            self.write("issue-refund", "--payment", str(dup["id"]), "--amount-cents", str(amount),
                       "--reason", "Duplicate charge (retry)")
        self.reply(customer, t, "Duplicate charge refunded",
                   f"You were right: order {order['id']} was charged twice. We refunded the duplicate "
                   f"{amount / 100:.2f}.")
        return "refunded duplicate"

    def handle_cancel(self, t: dict, customer: dict, order: dict) -> str:
        status = order["status"]
        self.think(f"Cancellation request; the order is {status}.", 1.0)
        if status == "placed" or (status == "shipped" and self.slip["cancel_shipped"]):
            payments = [p for p in order["payments"] if p["status"] == "captured"]
            amount = sum(p["amount_cents"] - p["refunded_cents"] for p in payments)
            if self.fraud_blocked(customer, order, amount, t):
                return "escalated (fraud)"
            self.write("cancel-order", "--order", str(order["id"]))
            if self.slip["forget_refund_after_cancel"]:
                self.log("thought", text="Order cancelled; that should take care of it.")
            elif amount > 0:
                self.refund_across(order, payments, amount, t)
            self.reply(customer, t, "Your order is cancelled",
                       f"Order {order['id']} is cancelled and {amount / 100:.2f} is on its way back to you.")
            return "cancelled"
        if status == "shipped":
            self.reply(customer, t, "Your order has already shipped",
                       f"Order {order['id']} shipped on {order['shipped_on']}, so we can no longer cancel it. "
                       "Once it arrives you can return it within 30 days for a full refund.")
            return "cannot cancel (shipped)"
        if status == "cancelled":
            self.reply(customer, t, "Your order was already cancelled", f"Order {order['id']} was already cancelled.")
            return "already cancelled"
        return self.handle_return(t, customer, order)

    def handle_goodwill(self, t: dict, customer: dict, order: dict) -> str:
        amount = t["amounts"][0] if t["amounts"] else 1000
        self.think("Late delivery: a goodwill gesture in store credit is the usual answer.", 1.5)
        if self.fraud_blocked(customer, order, amount, t):
            return "escalated (fraud)"
        # Blind spot: the goodwill threshold is never consulted.
        self.write("issue-store-credit", "--customer", str(customer["id"]), "--order", str(order["id"]),
                   "--amount-cents", str(amount), "--reason", "Goodwill: late delivery")
        self.reply(customer, t, "Sorry about the delay",
                   f"We're sorry order {order['id']} arrived late. We added {amount / 100:.2f} of store credit to your account.")
        return "goodwill credit"

    def reply(self, customer: dict | None, t: dict, subject: str, body: str) -> None:
        if customer is None:
            self.log("thought", text="Nobody to write to on file; leaving the ticket for a human.")
            return
        if self.writes >= 2 and self.slip["forget_email_multistep"]:
            self.log("thought", text="All done on the account side.")
            return
        self.think("Write the reply to the customer.", 1.5)
        to = t["from_addr"] or customer["email"]  # blind spot: answers the sender, not the address on file
        self.write("send-email", "--customer", str(customer["id"]), "--to", to,
                   "--subject", f"Re: {t['subject'] or subject}", "--body", f"Hi {customer['name'].split()[0]},\n\n{body}\n\nThe refund desk")


# ---------------------------------------------------------------------- ticket parsing

STOP = {"the", "and", "for", "with", "set", "pack", "one", "two", "size", "from", "order", "arrived", "please"}


def _stem(w: str) -> str:
    return w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w


def words_of(text: str) -> set[str]:
    return {_stem(w) for w in re.findall(r"[a-z]+", text.lower()) if len(w) >= 3 and w not in STOP}


def item_matches(description: str, words: set[str]) -> bool:
    return bool(words_of(description) & words)


def parse_ticket(prompt: str) -> dict:
    m = re.search(r"^From:\s*(?P<name>[^<\n]*?)\s*<(?P<addr>[^>\s]+)>", prompt, re.M)
    subject = re.search(r"^Subject:\s*(.+)$", prompt, re.M)
    body = prompt.split(subject.group(0), 1)[1] if subject else prompt
    low = body.lower()
    orders = [int(x) for x in re.findall(r"order\s*(?:number\s*|no\.?\s*|#\s*)?(\d{4,})", prompt, re.I)]
    amounts = [int(round(float(a.replace(",", "")) * 100)) for a in re.findall(r"\$\s?(\d[\d,]*(?:\.\d{2})?)", body)]
    late = bool(re.search(r"\blate\b|\bdelay", low))
    wants_credit = "store credit" in low
    if re.search(r"charged twice|double[- ]charg|duplicate|two charges|billed twice", low):
        intent = "duplicate"
    elif re.search(r"\bcancel", low):
        intent = "cancel"
    elif late and re.search(r"compensat|goodwill|credit|apolog", low):
        intent = "goodwill"
    else:
        intent = "return"
    return {
        "from_name": m.group("name").strip() if m else "",
        "from_addr": m.group("addr") if m else "",
        "subject": subject.group(1).strip() if subject else "",
        "orders": list(dict.fromkeys(orders)),
        "amounts": amounts,
        "intent": intent,
        "last_order": bool(re.search(r"\b(?:my|the) (?:last|latest|most recent) order", low)),
        "one_of": bool(re.search(r"\bone of (?:the|my)\b", low)),
        "wants_store_credit": wants_credit and intent == "return",
        "words": words_of(body),
    }


# ---------------------------------------------------------------------- entry point


def tool_command() -> list[str]:
    """How to run the tools: $REFUNDS_TOOL, else `refunds` on PATH, else the sibling script."""
    if os.environ.get("REFUNDS_TOOL"):
        return shlex.split(os.environ["REFUNDS_TOOL"])
    if shutil.which("refunds"):
        return ["refunds"]
    return [sys.executable, "-I", "-S", str(Path(__file__).resolve().parent / "refunds.py")]


def main() -> int:
    transcript = Path(os.environ.get("HARNESS_TRANSCRIPT") or "/work/transcript.jsonl")
    prompt_file = Path(os.environ.get("HARNESS_PROMPT_FILE") or "/work/prompt.txt")
    agent = None
    try:
        seed = int(os.environ.get("HARNESS_SEED") or 0)
        agent = Agent(prompt_file.read_text(), seed, transcript, tool_command(),
                      think_scale=float(os.environ.get("REFUNDBOT_THINK_SCALE") or 1.0),
                      memory_scale=float(os.environ.get("REFUNDBOT_MEMORY_SCALE") or 1.0))
        outcome = agent.run()
    except Exception as e:  # an internal error: say so in the transcript, exit non-zero
        msg = f"{type(e).__name__}: {e}"
        if agent is not None:
            agent.log("error", text=msg)
        print(f"refundbot: {msg}", file=sys.stderr)
        return 1
    ru = resource.getrusage(resource.RUSAGE_SELF)
    agent.log("final", text=outcome, think_iterations=agent.iterations,
              context_mib=round(agent.context_bytes / MiB, 1),
              cpu_seconds=round(ru.ru_utime + ru.ru_stime, 3), max_rss_mib=round(ru.ru_maxrss / 1024, 1))
    print(json.dumps({"outcome": outcome}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
