"""Small asyncio helpers every layer uses."""

from __future__ import annotations

import inspect
import threading
import time
import types
from collections.abc import Generator
from typing import Any

_PLAIN = frozenset({str, int, float, bool, dict, list, type(None)})


def is_awaitable(value: Any) -> bool:
    """`inspect.isawaitable`, without its abstract-class check for what a play's function
    or tool most often returns: a coroutine, or a plain value."""
    kind = type(value)
    return kind is types.CoroutineType or (kind not in _PLAIN and inspect.isawaitable(value))


# Seconds of holding the event loop counted so far on this thread (each event loop has its
# own thread): by a `Held`'s steps, a sync call timed on the loop, a commit made on it. An
# outer `Held` leaves out what was counted inside its own steps (a step awaiting a blocking
# tool: the tool's hold, and its commit, are the tool's).
_counted = threading.local()


def held_so_far() -> float:
    return float(getattr(_counted, "s", 0.0))


def count_held(seconds: float) -> None:
    """`seconds` of this thread's event loop held, counted by whoever held it."""
    _counted.s = held_so_far() + seconds


class Held:
    """`await Held(x, into)` is `await x`, and adds to `into.held_s` (its own `held_s` without
    one) how long x's own code held the event loop: the time of its steps between awaits,
    summed, less what was counted inside them (an inner `Held`'s, a commit's). An `async def`
    that calls a sync SDK inside awaits nothing while the SDK waits on its provider: one long
    step."""

    __slots__ = ("_awaitable", "_into", "held_s")

    def __init__(self, awaitable: Any, into: Any = None) -> None:
        self._awaitable = awaitable
        self._into = into  # anything with a `held_s` (a ToolCall); not `self`: no cycle to collect
        self.held_s = 0.0

    def __await__(self) -> Generator[Any, Any, Any]:
        awaitable, into = self._awaitable, self if self._into is None else self._into
        # What `await` takes: a generator-based coroutine (`types.coroutine`) is its own
        # iterator, and `__await__` may give any iterator (`next` only: PEP 380's `yield from`).
        inner = awaitable if isinstance(awaitable, types.GeneratorType) else awaitable.__await__()
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            began, inside = time.perf_counter(), held_so_far()
            try:
                if thrown is None:
                    yielded = next(inner) if sent is None else inner.send(sent)
                else:
                    pending, thrown = thrown, None  # not kept in this frame: its traceback holds the frame
                    try:
                        throw = getattr(inner, "throw", None)
                        if throw is None:
                            raise pending
                        yielded = throw(pending)
                    finally:
                        del pending
            except StopIteration as done:
                return done.value
            finally:
                own = max(0.0, time.perf_counter() - began - (held_so_far() - inside))
                into.held_s += own
                count_held(own)
            try:
                sent = yield yielded
            except GeneratorExit:
                close = getattr(inner, "close", None)
                if close is not None:
                    close()
                raise
            except BaseException as exc:  # a cancellation: into the awaitable, which may handle it
                sent, thrown = None, exc
