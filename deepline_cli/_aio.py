"""Small asyncio helpers every layer uses."""

from __future__ import annotations

import inspect
import types
from typing import Any

_PLAIN = frozenset({str, int, float, bool, dict, list, type(None)})


def is_awaitable(value: Any) -> bool:
    """`inspect.isawaitable`, without its abstract-class check for what a play's function
    or tool most often returns: a coroutine, or a plain value."""
    kind = type(value)
    return kind is types.CoroutineType or (kind not in _PLAIN and inspect.isawaitable(value))
