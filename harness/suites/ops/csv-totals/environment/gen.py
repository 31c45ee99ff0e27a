"""Writes the task's transactions (deterministic): python3 gen.py OUT.csv"""
import random
import sys


def rows():
    r = random.Random(7)
    for i in range(120_000):
        cents = r.randrange(50, 250_000)
        status = r.choices(["settled", "refunded", "pending"], [80, 12, 8])[0]
        yield f"T{i:06d},C{r.randrange(1, 501):04d},{cents // 100}.{cents % 100:02d},EUR,{status}"


if __name__ == "__main__":
    with open(sys.argv[1], "w") as f:
        f.write("id,customer_id,amount,currency,status\n")
        for line in rows():
            f.write(line + "\n")
