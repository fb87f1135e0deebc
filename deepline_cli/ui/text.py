"""Stored text made safe to show: a run id, a play's log line or a provider's error may hold
control characters (an ANSI escape that rewrites the terminal, a NUL, a right-to-left
override); they are shown escaped (`\\x1b`), never acted on."""

from __future__ import annotations


def printable(text: object, *, newlines: bool = False) -> str:
    """`text` with every character that is not printable written as an escape (`\\x1b`,
    `\\u202e`); line breaks kept when `newlines`."""
    value = str(text)
    if value.isprintable():
        return value
    return "".join(_shown(c, newlines) for c in value)


def _shown(c: str, newlines: bool) -> str:
    if c.isprintable() or (newlines and c == "\n") or c == " ":
        return c
    if c == "\t":
        return "    " if newlines else "\\t"
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
