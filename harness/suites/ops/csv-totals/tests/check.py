"""Compares /app/totals.csv with the totals of the generated transactions."""
import sys

sys.path.insert(0, "/tests")
from gen import rows  # noqa: E402

want: dict[str, int] = {}
for line in rows():
    _id, cust, amount, _cur, status = line.split(",")
    euros, cents = amount.split(".")
    value = int(euros) * 100 + int(cents)
    if status == "settled":
        want[cust] = want.get(cust, 0) + value
    elif status == "refunded":
        want[cust] = want.get(cust, 0) - value
expected = ["customer_id,total_cents"] + [f"{c},{v}" for c, v in sorted(want.items())]
try:
    got = open("/app/totals.csv").read().strip().splitlines()
except OSError as e:
    got, why = [], str(e)
else:
    why = ""
if got == expected:
    reward, why = 1, "all rows match"
elif got:
    bad = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    reward = 0
    why = f"{len(got)} lines, expected {len(expected)}; first difference at line {bad + 1}: " \
          f"{got[bad] if bad < len(got) else '(missing)'!r} vs {expected[bad] if bad < len(expected) else '(none)'!r}"
else:
    reward = 0
open("/logs/verifier/reward.txt", "w").write(f"{reward}\n")
print(why)
