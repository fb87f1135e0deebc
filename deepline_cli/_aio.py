"""Small asyncio helpers every layer uses."""

from __future__ import annotations

import inspect
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


class Held:
    """`await Held(x)` is `await x`, and `held_s` then says how long x's own code held the
    event loop: the time of its steps between awaits, summed. An `async def` that calls a
    sync SDK inside awaits nothing while the SDK waits on its provider: one long step."""

    __slots__ = ("_awaitable", "held_s")

    def __init__(self, awaitable: Any) -> None:
        self._awaitable = awaitable
        self.held_s = 0.0

    def __await__(self) -> Generator[Any, Any, Any]:
        awaitable = self._awaitable
        # What `await` takes: a generator-based coroutine (`types.coroutine`) is its own
        # iterator, and `__await__` may give any iterator (`next` only: PEP 380's `yield from`).
        inner = awaitable if isinstance(awaitable, types.GeneratorType) else awaitable.__await__()
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            began = time.perf_counter()
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
                self.held_s += time.perf_counter() - began
            try:
                sent = yield yielded
            except GeneratorExit:
                close = getattr(inner, "close", None)
                if close is not None:
                    close()
                raise
            except BaseException as exc:  # a cancellation: into the awaitable, which may handle it
                sent, thrown = None, exc
