"""Numbers as a person reads them, the same in every view (the runtime's messages and the UI's)."""

from __future__ import annotations


def format_credits(value: float) -> str:
    """`12,345.5`, `0.5`, `1,000,000`: thousands separated, the decimals the value has (up to
    4, as budgets and plans round them), never an exponent."""
    text = f"{value:,.4f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text
