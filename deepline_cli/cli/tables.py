"""Printing records: a table for people, JSON for programs."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Sequence
from typing import Any


def when(ts: float | None) -> str:
    if not ts:
        return ""
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def print_json_lines(rows: Sequence[dict[str, Any]]) -> None:
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
