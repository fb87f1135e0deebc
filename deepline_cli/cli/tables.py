"""Printing records: a table for people, JSON for programs."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Iterable, Sequence
from typing import Any


def when(ts: float | None) -> str:
    if not ts:
        return ""
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def print_json_lines(rows: Iterable[dict[str, Any]]) -> None:
    from deepline_cli import _json

    out = sys.stdout
    for row in rows:
        out.write(_json.dumps_str(row) + "\n")


def print_json(value: Any) -> None:
    from deepline_cli import _json

    sys.stdout.write(_json.dumps_str(value) + "\n")


def print_table(
    columns: Sequence[str], rows: Sequence[Sequence[Any]], *, empty: str, whole: Sequence[str] = ()
) -> None:
    """A table for people; the `whole` columns are never wrapped or cut (ids to copy)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=400)  # piped: never wrap or truncate
    if not rows:
        console.print(empty)
        return
    from rich.text import Text

    from deepline_cli.ui.text import printable

    if len(rows) > LONG_TABLE:  # rich lays a table out whole: 200,000 receipts took two minutes and 2 GB
        _print_long(columns, rows, whole, printable)
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for i, name in enumerate(columns):
        if name in whole:
            widest = max(len(str(row[i])) for row in rows)
            table.add_column(name, no_wrap=True, min_width=max(widest, len(name)))
        else:
            table.add_column(name)
    for row in rows:  # Text, not markup: a stored "[bold]" or an ANSI escape is shown as written
        table.add_row(*[Text("" if v is None else printable(v)) for v in row])
    console.print(table)


LONG_TABLE = 500  # rows past which a table is written line by line, its columns as wide as they need
CELL_MOST = 60  # characters of a cell a long table shows (the `whole` columns: all of them)


def _print_long(columns: Sequence[str], rows: Sequence[Sequence[Any]], whole: Sequence[str], printable: Any) -> None:
    """A long table, aligned like rich's and written as it goes (no layout of the whole)."""
    cells = [["" if v is None else printable(v) for v in row] for row in rows]
    widths = []
    for i, name in enumerate(columns):
        widest = max(len(name), *(len(row[i]) for row in cells))
        widths.append(widest if name in whole else min(widest, CELL_MOST))

    def line(values: Sequence[str]) -> str:
        shown = [v if len(v) <= w else v[: w - 1] + "…" for v, w in zip(values, widths, strict=True)]
        return "  ".join(v.ljust(w) for v, w in zip(shown, widths, strict=True)).rstrip() + "\n"

    out = sys.stdout
    out.write(line(list(columns)))
    for row in cells:
        out.write(line(row))
