"""The runtime's door to the store: one store thread, and group commit for writes.

Store methods are plain blocking calls. The runtime runs them on a single dedicated
thread (so the event loop keeps dispatching provider calls while SQLite writes) and
batches the hot writes: every claim, settlement or log line submitted while the
previous batch was being written goes into the next transaction together.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Generic, TypeVar

from deepline_cli.store.base import Store

T = TypeVar("T")
R = TypeVar("R")


class StoreIO:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="deepline-store")
        # Leases use the store's clock; measure its offset once instead of asking per call.
        self._offset = store.now() - time.time()

    def now(self) -> float:
        return time.time() + self._offset

    async def call(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, partial(fn, *args, **kwargs))

    def close(self) -> None:
        self._executor.shutdown(wait=True)


class GroupCommit(Generic[T, R]):
    """Batch items into one `flush(items) -> results` call on the store thread."""

    def __init__(self, io: StoreIO, flush: Callable[[Sequence[T]], Sequence[R]]) -> None:
        self._io = io
        self._flush = flush
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._task: asyncio.Task[None] | None = None

    def submit(self, item: T) -> asyncio.Future[R]:
        """Queue `item`; the returned future resolves once its batch is committed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._pending.append((item, future))
        if self._task is None:
            self._task = loop.create_task(self._drain())
        return future

    async def flushed(self) -> None:
        """Wait until everything submitted so far is written."""
        while self._task is not None:
            await asyncio.shield(self._task)

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    results = await self._io.call(self._flush, [item for item, _ in batch])
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._task = None
