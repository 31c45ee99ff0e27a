#!/usr/bin/env python3
"""opsbot: the reference agent of the `ops` suite.

It knows how to do every task of the suite, and behaves like a fallible model doing them:

* per (seed, task) it decides up front which of the task's known slips it makes (each with
  a fixed probability), so the same seed makes the same choices and pass@k rises with k
  while pass^k falls;
* it "thinks" before acting: sha256 rounds costing ~0.2-0.6 CPU-s per task at full speed
  (log-summary, the "hard" one, ~6 s)
  (scaled by $OPSBOT_THINK_SCALE), so a small CPU quota or a short timeout shows up as
  throttling and timeouts;
* it holds a resident "context" (a bytearray, 60-200 MiB by task and seed, scaled by
  $OPSBOT_MEMORY_SCALE), so a small memory ceiling shows up as OOM kills.

It reads the harness's environment (HARNESS_TASK_ID, HARNESS_SEED, HARNESS_PROMPT_FILE,
HARNESS_TRANSCRIPT) and writes a JSON-lines transcript; standard library only, plus `psql`
for the database tasks. Never read by the grader.
"""

from __future__ import annotations

import collections
import csv
import hashlib
import json
import os
import random
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

MiB = 1 << 20
PAGE = 4096
ITERS_PER_WEIGHT = 120_000  # sha256 rounds per unit of thinking at scale 1.0

# Each task's slips and their probabilities (decided once per seed and task).
SLIPS: dict[str, dict[str, float]] = {
    "log-summary": {"keeps_corrupt_lines": 0.25},
    "csv-totals": {"float_cents": 0.35},
    "json-merge": {"keeps_null_keys": 0.30},
    "py-bugfix": {"remainder_last": 0.20},
    "config-repair": {"leaves_backup": 0.25},
    "log-cleanup": {"deletes_boundary_day": 0.20},
    "sql-report": {"drops_last_day": 0.30},
    "refund-ledger": {"refunds_wrong_payment": 0.15, "forgets_ledger": 0.15},
}
# How heavy each task feels: thinking weight and the context it grows (MiB, before the seed's share).
EFFORT = {"log-summary": (170, 80), "csv-totals": (10, 140), "json-merge": (4, 60), "py-bugfix": (8, 90),
          "config-repair": (4, 60), "log-cleanup": (3, 60), "sql-report": (6, 90), "refund-ledger": (7, 100)}


class Bot:
    def __init__(self, task: str, seed: int, transcript: Path, think_scale: float, memory_scale: float):
        self.task = task
        self.rng = random.Random(f"opsbot:{seed}:{task}")
        self.slip = {name: self.rng.random() < p for name, p in SLIPS.get(task, {}).items()}
        weight, mib = EFFORT.get(task, (4, 60))
        self.weight = weight * self.rng.uniform(0.8, 1.4) * max(0.0, think_scale)
        self.context_target = int((mib + self.rng.randint(0, 60)) * MiB * max(0.0, memory_scale))
        self.context: list[bytearray] = []
        self.context_bytes = 0
        self.iterations = 0
        self.out = open(transcript, "a", encoding="utf-8")
        self.t0 = time.monotonic()
        self.step = 0
        self.log("start", seed=seed, task=task, slips=sorted(k for k, v in self.slip.items() if v),
                 context_target_mib=round(self.context_target / MiB, 1))

    def log(self, kind: str, **fields: object) -> None:
        self.step += 1
        self.out.write(json.dumps({"step": self.step, "t": round(time.monotonic() - self.t0, 4), "type": kind, **fields}) + "\n")
        self.out.flush()

    def think(self, thought: str, share: float) -> None:
        """Spend a ``share`` of the task's thinking and grow the context towards its target."""
        n = int(ITERS_PER_WEIGHT * self.weight * share * self.rng.uniform(0.7, 1.3))
        h = thought.encode()
        for _ in range(n):
            h = hashlib.sha256(h).digest()
        self.iterations += n
        want = min(self.context_target, int(self.context_target * (self.context_bytes / self.context_target + share + 1e-9))) \
            if self.context_target else 0
        if want > self.context_bytes:
            block = bytearray(want - self.context_bytes)
            block[::PAGE] = b"\x01" * len(range(0, len(block), PAGE))  # resident, not just reserved
            self.context.append(block)
            self.context_bytes = want
        self.log("thought", text=thought)

    def sh(self, argv: list[str], stdin: str | None = None) -> str:
        self.log("tool_call", argv=argv)
        p = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60)
        self.log("tool_result", exit=p.returncode, stdout=p.stdout[-2000:], stderr=p.stderr[-1000:])
        if p.returncode != 0:
            raise RuntimeError(f"{argv[0]} exited {p.returncode}: {p.stderr.strip()[:300]}")
        return p.stdout

    def wrote(self, path: str) -> None:
        self.log("write", path=path)

    # ------------------------------------------------------------------ the tasks

    def log_summary(self) -> None:
        self.think("the log is Apache combined format; some lines are corrupt", 0.4)
        strict = re.compile(r'^(\d+\.\d+\.\d+\.\d+) \S+ \S+ \[[^\]]+\] "(\S+) (\S+) [^"]*" (\d{3}) (\d+) ')
        loose = re.compile(r'^(\S+) .*?"\S+ (\S+)[^"]*" (\d{3}) (\d+)')
        n, ips, paths, s5, total = 0, set(), collections.Counter(), 0, 0
        for line in open("/app/access.log", encoding="utf-8", errors="replace"):
            if self.slip["keeps_corrupt_lines"]:
                m = loose.match(line)
                if not m:
                    continue
                ip, path, status, size = m.group(1), m.group(2), m.group(3), m.group(4)
            else:
                m = strict.match(line)
                if not m:
                    continue
                ip, path, status, size = m.group(1), m.group(3), m.group(4), m.group(5)
            n += 1
            ips.add(ip)
            paths[path] += 1
            s5 += int(status) >= 500
            total += int(size)
        self.think("counted; the top path breaks ties alphabetically", 0.6)
        top = sorted(paths.items(), key=lambda kv: (-kv[1], kv[0]))[0][0] if paths else ""
        Path("/app/report.json").write_text(json.dumps({"requests": n, "unique_ips": len(ips), "top_path": top,
                                                        "status_5xx": s5, "bytes_total": total}))
        self.wrote("/app/report.json")

    def csv_totals(self) -> None:
        self.think("sum settled minus refunded per customer, in cents", 0.3)
        totals: dict[str, int] = {}
        with open("/app/transactions.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        self.think(f"{len(rows)} rows read; pending rows do not count", 0.4)
        for row in rows:
            if row["status"] not in ("settled", "refunded"):
                continue
            if self.slip["float_cents"]:
                value = int(float(row["amount"]) * 100)  # the classic: 0.29 * 100 = 28.999...
            else:
                euros, _, cents = row["amount"].partition(".")
                value = int(euros) * 100 + (int(cents.ljust(2, "0")) if not euros.startswith("-") else -int(cents.ljust(2, "0")))
            totals[row["customer_id"]] = totals.get(row["customer_id"], 0) + (value if row["status"] == "settled" else -value)
        self.think("writing the totals sorted by customer", 0.3)
        with open("/app/totals.csv", "w") as f:
            f.write("customer_id,total_cents\n")
            for c in sorted(totals):
                f.write(f"{c},{totals[c]}\n")
        self.wrote("/app/totals.csv")

    def json_merge(self) -> None:
        self.think("recursive merge; null removes the key", 0.5)
        keep_null = self.slip["keeps_null_keys"]

        def merge(a: dict, b: dict) -> dict:
            out = dict(a)
            for k, v in b.items():
                if v is None and not keep_null:
                    out.pop(k, None)
                elif isinstance(v, dict) and isinstance(out.get(k), dict):
                    out[k] = merge(out[k], v)
                else:
                    out[k] = v
            return out

        merged = merge(json.load(open("/app/defaults.json")), json.load(open("/app/overrides.json")))
        self.think("merged; writing /app/merged.json", 0.5)
        Path("/app/merged.json").write_text(json.dumps(merged, indent=2))
        self.wrote("/app/merged.json")

    def py_bugfix(self) -> None:
        self.think("split_cents drops the remainder; the docstring wants larger shares first", 0.6)
        head = "[share] * (parts - extra) + [share + 1] * extra" if self.slip["remainder_last"] else \
            "[share + 1] * extra + [share] * (parts - extra)"
        src = Path("/app/ledger/split.py").read_text()
        body = ('    if parts <= 0 or total < 0:\n        raise ValueError("parts must be positive and total not negative")\n'
                f'    share, extra = divmod(total, parts)\n    return {head}\n')
        fixed = re.sub(r'(    """\n)(    share = total // parts\n    return \[share\] \* parts\n)', lambda m: m.group(1) + body, src)
        if fixed == src:
            raise RuntimeError("split.py does not look like the file I expected")
        self.think("patched; the signature is unchanged", 0.4)
        Path("/app/ledger/split.py").write_text(fixed)
        self.wrote("/app/ledger/split.py")

    def config_repair(self) -> None:
        self.think("the port is a string with a typo; workers is zero", 0.5)
        p = Path("/app/config/service.toml")
        text = p.read_text()
        if self.slip["leaves_backup"]:
            Path("/app/config/service.toml.bak").write_text(text)
            self.wrote("/app/config/service.toml.bak")
        p.write_text(re.sub(r'(?m)^port = ".*"$', "port = 8080", text))
        self.wrote(str(p))
        s = Path("/app/config/settings.json")
        cfg = json.loads(s.read_text())
        cfg["workers"] = 4
        s.write_text(json.dumps(cfg, indent=2) + "\n")
        self.wrote(str(s))
        self.think("both fixed", 0.5)

    def log_cleanup(self) -> None:
        self.think("delete daily logs dated before 2024-06-01, nothing in archive/", 0.5)
        cutoff = "2024-06-01"
        for f in sorted(Path("/app/logs").glob("app-*.log")):
            day = f.name[4:-4]
            if day < cutoff or (self.slip["deletes_boundary_day"] and day == cutoff):
                f.unlink()
                self.log("delete", path=str(f))
        self.think("done", 0.5)

    def sql_report(self) -> None:
        self.think("monthly paid revenue for 2024 from the orders table", 0.5)
        upper = "placed_at <= '2024-12-31'" if self.slip["drops_last_day"] else "placed_at < '2025-01-01'"
        q = ("\\copy (SELECT to_char(placed_at, 'YYYY-MM') AS month, count(*) AS orders, sum(amount_cents) AS revenue_cents "
             f"FROM orders WHERE status = 'paid' AND placed_at >= '2024-01-01' AND {upper} GROUP BY 1 ORDER BY 1) "
             "TO '/app/report.csv' WITH (FORMAT csv, HEADER)")
        self.sh(["psql", "-v", "ON_ERROR_STOP=1", "-q", "-c", q])
        self.wrote("/app/report.csv")
        self.think("report written", 0.5)

    def refund_ledger(self) -> None:
        self.think("Chiara Neri wants the add-on refunded, not the annual plan", 0.4)
        out = self.sh(["psql", "-At", "-F", "|", "-c",
                       "SELECT p.id, p.amount_cents, p.memo, a.id FROM payments p JOIN accounts a ON a.id = p.account_id "
                       "WHERE a.email = 'chiara.neri@example.com' ORDER BY p.paid_on, p.id"])
        rows = [line.split("|") for line in out.splitlines() if line]
        pick = [r for r in rows if ("add-on" in r[2]) != self.slip["refunds_wrong_payment"]]
        if not pick:
            raise RuntimeError("no payment matches the ticket")
        pid, amount, _memo, acct = pick[0]
        self.think(f"refunding payment {pid} ({amount} cents)", 0.4)
        sql = ["BEGIN;", f"INSERT INTO refunds (payment_id, amount_cents, reason) VALUES ({int(pid)}, {int(amount)}, 'add-on bought by mistake');"]
        if not self.slip["forgets_ledger"]:
            sql.append(f"INSERT INTO ledger (account_id, delta_cents, note) VALUES ({int(acct)}, {int(amount)}, 'refund of payment {int(pid)}');")
        sql += [f"UPDATE accounts SET balance_cents = balance_cents + {int(amount)} WHERE id = {int(acct)};", "COMMIT;"]
        self.sh(["psql", "-v", "ON_ERROR_STOP=1", "-q"], stdin="\n".join(sql) + "\n")
        self.think("refund issued", 0.2)


def main() -> int:
    task = os.environ.get("HARNESS_TASK_ID") or ""
    transcript = Path(os.environ.get("HARNESS_TRANSCRIPT") or "/tmp/opsbot.jsonl")
    bot = None
    try:
        bot = Bot(task, int(os.environ.get("HARNESS_SEED") or 0), transcript,
                  float(os.environ.get("OPSBOT_THINK_SCALE") or 1.0), float(os.environ.get("OPSBOT_MEMORY_SCALE") or 1.0))
        solve = getattr(bot, task.replace("-", "_"), None)
        if task not in SLIPS or solve is None:
            raise RuntimeError(f"opsbot does not know the task {task!r}")
        solve()
    except Exception as e:  # an internal error: said in the transcript, exit non-zero
        if bot is not None:
            bot.log("error", text=f"{type(e).__name__}: {e}")
        print(f"opsbot: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    ru = resource.getrusage(resource.RUSAGE_SELF)
    bot.log("final", think_iterations=bot.iterations, context_mib=round(bot.context_bytes / MiB, 1),
            cpu_seconds=round(ru.ru_utime + ru.ru_stime, 3), max_rss_mib=round(ru.ru_maxrss / 1024, 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
