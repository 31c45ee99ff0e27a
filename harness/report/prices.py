"""The price table: what a model's tokens cost, for the cost columns of the reports.

A TOML file, USD per million tokens::

    [models."gpt-4o-mini"]
    input = 0.15
    output = 0.60
    cached = 0.075   # optional: cached input tokens (else they cost as input)

``--prices FILE`` names it (``harness report``, ``trials``, ``show``); ``$HARNESS_PRICES`` is
the default path. A model is matched by the name its requests gave. Costs are computed by
:func:`harness.core.upstream.call_cost`: unknown (null) where a model has no price or a
response reported no usage.
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

from harness.model.errors import UsageError

ENV = "HARNESS_PRICES"
PRICE_KEYS = ("input", "output", "cached")
REQUIRED_KEYS = ("input", "output")
EXAMPLE = '[models."gpt-4o-mini"] input = 0.15, output = 0.60, cached = 0.075 (USD per million tokens)'

Prices = dict[str, dict[str, float]]


def parse_prices(text: str, where: str) -> Prices:
    """The table in ``text`` (TOML) as model -> {"input", "output"[, "cached"]}; a UsageError
    naming ``where`` and the key for anything else."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{where}: not valid TOML ({e}); expected e.g. {EXAMPLE}") from None
    extra = sorted(k for k in data if k != "models")
    if extra:
        raise UsageError(f"{where}: unknown key {extra[0]!r}; a price table has only [models.\"NAME\"] tables, e.g. {EXAMPLE}")
    models = data.get("models")
    if not isinstance(models, dict) or not models:
        raise UsageError(f"{where}: no [models.\"NAME\"] table; expected e.g. {EXAMPLE}")
    out: Prices = {}
    for name, p in models.items():
        key = f'models."{name}"'
        if not isinstance(p, dict):
            raise UsageError(f"{where}: {key}: expected a table with input and output, got {p!r}")
        unknown = sorted(k for k in p if k not in PRICE_KEYS)
        if unknown:
            raise UsageError(f"{where}: {key}.{unknown[0]}: unknown key; a price has input, output and optionally cached")
        missing = [k for k in REQUIRED_KEYS if k not in p]
        if missing:
            raise UsageError(f"{where}: {key}.{missing[0]}: missing (USD per million {missing[0]} tokens)")
        price: dict[str, float] = {}
        for k, v in p.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise UsageError(f"{where}: {key}.{k}: expected a number >= 0 (USD per million tokens), got {v!r}")
            price[k] = float(v)
        out[str(name)] = price
    return out


def load_prices(path: Path) -> Prices:
    """Read and validate a price table file (see the module docstring)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise UsageError(f"--prices {path}: cannot read ({why}); pass a TOML price table, e.g. {EXAMPLE}") from None
    return parse_prices(text, f"--prices {path}")


def prices_from_option(path: Path | None, environ: Mapping[str, str] = os.environ) -> Prices | None:
    """The price table of ``--prices`` or, without it, of ``$HARNESS_PRICES``; None when neither is set."""
    if path is not None:
        return load_prices(path)
    env = (environ.get(ENV) or "").strip()
    if not env:
        return None
    try:
        return load_prices(Path(env))
    except UsageError as e:
        raise UsageError(f"${ENV}: {e}") from None
