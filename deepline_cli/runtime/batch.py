"""Batch tools: several member calls sent to the provider as one request.

Every member keeps its own receipt (claimed, reused and billed one by one). The members
waiting at the same time — up to `max_size`, or whatever arrived within `max_wait_ms` —
become one provider request under an aggregate receipt, whose key (and so the provider
idempotency key) is derived from the members' receipt keys.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from deepline_cli.errors import ProviderTransientError
from deepline_cli.runtime.receipts import DurableCall, ReceiptBook, receipt_key
from deepline_cli.runtime.tools import ToolCall, ToolDef

Send = Callable[[list[Any], ToolCall], Awaitable[Any]]


class Batcher:
    def __init__(self, definition: ToolDef, book: ReceiptBook, send: Send) -> None:
        batch = definition.batch or {}
        self.tool = definition.id
        self.max_size = max(1, int(batch.get("max_size", 10)))
        self.max_wait_s = float(batch.get("max_wait_ms", 20)) / 1000
        self._book = book
        self._send = send
        self._pending: list[tuple[str, Any, asyncio.Future[Any]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, member_key: str, input: Any) -> Any:
        """Queue one member call; its answer arrives when its batch has been answered."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((member_key, input, future))
        if len(self._pending) >= self.max_size:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.max_wait_s, self._flush)
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending:
            members, self._pending = self._pending[: self.max_size], self._pending[self.max_size :]
            task = asyncio.get_running_loop().create_task(self._run(members))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, members: list[tuple[str, Any, asyncio.Future[Any]]]) -> None:
        keys = sorted(key for key, _, _ in members)
        inputs = [input for _, input, _ in members]
        call = DurableCall(
            key=receipt_key("batch", self.tool, *keys),
            kind="tool",
            label=f"{self.tool} batch of {len(members)}",
            tool=f"{self.tool}#batch",
        )

        async def send(info: ToolCall) -> Any:
            results = await self._send(inputs, info)
            # Checked before the aggregate receipt completes: a short answer is a (retryable)
            # failure, never a stored result that every later run would trip on.
            if not isinstance(results, list) or len(results) != len(members):
                got = len(results) if isinstance(results, list) else type(results).__name__
                raise ProviderTransientError(
                    f"{self.tool}: a batch of {len(members)} calls got {got} results back",
                    category="upstream",
                    tool=self.tool,
                )
            return results

        try:
            results = (await self._book.execute(call, send)).value
        except BaseException as exc:
            for _, _, future in members:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, _, future), result in zip(members, results, strict=True):
            if not future.done():
                future.set_result(result)
