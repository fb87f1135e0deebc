"""Rows to sheet rows: `ctx.map` reads rows, reuses what the sheet holds (reuse.py), resolves
the rest through calls/, and passes its barriers (barriers.py)."""

__all__ = [
    "barriers",
    "book",
    "columns",
    "dataset",
    "engine",
    "failures",
    "host",
    "intake",
    "pilot",
    "projection",
    "reuse",
    "row_context",
    "rows",
    "toolscan",
    "waterfall",
]
