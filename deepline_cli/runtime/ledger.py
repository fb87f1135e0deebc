"""Which map row a call is made for, so the calls ledger can say it (per-row credits).

The map engine sets the row while a row's columns resolve; every call made from there
(awaited in the same task, or in tasks it starts) is recorded with it. Outside maps
there is no row.
"""

from __future__ import annotations

from contextvars import ContextVar

_ROW: ContextVar[tuple[str, str] | None] = ContextVar("deepline_row", default=None)


def set_row(map_name: str, row_key: str) -> None:
    """Calls made from here on in this task (and tasks it starts) are for this row."""
    _ROW.set((map_name, row_key))


def current_row() -> tuple[str | None, str | None]:
    """(map, row key) of the row being resolved, or (None, None) outside maps."""
    row = _ROW.get()
    return row if row is not None else (None, None)
