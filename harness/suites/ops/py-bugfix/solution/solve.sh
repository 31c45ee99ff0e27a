#!/bin/bash
set -euo pipefail
cat > /app/ledger/split.py <<'PY'
"""Splitting an amount of money into equal shares."""


def split_cents(total: int, parts: int) -> list[int]:
    """Split ``total`` cents into ``parts`` integer shares (see the tests)."""
    if parts <= 0 or total < 0:
        raise ValueError("parts must be positive and total not negative")
    share, extra = divmod(total, parts)
    return [share + 1] * extra + [share] * (parts - extra)
PY
