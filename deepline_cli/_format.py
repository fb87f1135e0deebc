"""Numbers as a person reads them, the same in every view (the runtime's messages and the UI's)."""

from __future__ import annotations

import math
from collections.abc import Iterable

CREDIT_PLACES = 9  # credits are decimal amounts (0.1, 0.25…); sums are kept to 9 places


def add_credits(a: float, b: float) -> float:
    """`a + b` without binary-float noise: 30 calls of 0.1 cost 3, not 3.0000000000000013,
    so a budget of 3 holds them and every view shows the same 3. (Per call: whole sums, the
    usual case, skip the rounding.)"""
    total = a + b
    return total if total.is_integer() else round_credits(total)


def sum_credits(amounts: Iterable[float]) -> float:
    """The sum of many credits, as `add_credits` sums two."""
    return round_credits(math.fsum(amounts))


def round_credits(value: float) -> float:
    """A credit figure summed elsewhere (a database's `sum`) without its binary-float noise."""
    return round(value, CREDIT_PLACES)


def format_credits(value: float) -> str:
    """`12,345.5`, `0.5`, `1,000,000`: thousands separated, the decimals the value has (up to
    4, as budgets and plans round them), never an exponent."""
    text = f"{value:,.4f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def retry_causes(reasons: dict[str, int] | None, retries: int) -> dict[str, int]:
    """Retries by cause (`429`, `5xx`, `network`), with `earlier` for those whose cause no
    record kept (an attempt killed before its outcome): the causes add up to the retries."""
    known = dict(sorted((reasons or {}).items()))
    unknown = retries - sum(known.values())
    if unknown > 0:  # none known at all (every retry in a killed attempt) too; added to those an earlier outcome kept
        known["earlier"] = known.get("earlier", 0) + unknown
    return known


def kept_said(kept: int) -> str:
    """Failures given back from earlier runs' receipts: among the failed, but no request made."""
    return f"{kept:,} given back from earlier runs"
