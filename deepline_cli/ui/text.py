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
    return _escape(ord(c))


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


# Characters a terminal acts on (escapes, the bell, C1 controls, text direction overrides);
# tabs and line ends are left: a CSV's rows and its quoted multi-line cells.
_ACTED_ON = {
    code: _escape(code)
    for code in [*range(0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
    if chr(code) not in "\t\n\r"
}


def for_terminal(text: str) -> str:
    """`text` as written to a terminal: what the terminal would act on escaped, the rest
    (tabs, line ends, any other character) left as it is."""
    return text.translate(_ACTED_ON)
