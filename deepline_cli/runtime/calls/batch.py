"""Batch tools: several member calls sent to the provider as one request.

Every member keeps its own receipt (claimed, reused and billed one by one). The members
waiting at the same time — up to `max_size`, or whatever arrived within `max_wait_ms` —
become one provider request under an aggregate receipt, whose key (and so the provider
idempotency key) is derived from the members' idempotency keys (their receipt keys, or a
fresh one for a member forced or gone stale).

The aggregate's claim records what it sends (each member's key and input) and points
every member receipt at it, in the same transaction, before the request goes out. A
member taken over after a crash finds its batch that way: if the batch was answered it
takes its result from it, otherwise the same batch is sent again with the same key — so
a provider never bills a member in two different batches, however a resumed run would
have grouped its rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from deepline_cli.errors import DeeplineError, ProviderTransientError, ToolExecutionError
from deepline_cli.runtime.calls.receipts import DurableCall, ReceiptBook, receipt_key
from deepline_cli.runtime.providers.tools import ToolCall, ToolDef

Send = Callable[[list[Any], ToolCall], Awaitable[Any]]
BATCH_SUFFIX = "#batch"  # a batch request's receipts are a tool of their own: `hunter.email#batch`
Member = tuple[ToolCall, Any, asyncio.Future[Any]]


class Batcher:
    """Calls to a batching tool, gathered for up to `max_wait_ms` or `max_size` members and
    sent as one request under one batch receipt; each member keeps its own receipt."""

    def __init__(self, definition: ToolDef, book: ReceiptBook, send: Send) -> None:
        batch = definition.batch or {}
        self.tool = definition.id
        self.max_size = max(1, int(batch.get("max_size", 10)))
        self.max_wait_s = float(batch.get("max_wait_ms", 20)) / 1000
        self._book = book
        self._send = send
        self._pending: list[Member] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, member: ToolCall, input: Any) -> Any:
        """Queue one member call; its answer arrives when its batch has been answered."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((member, input, future))
        if len(self._pending) >= self.max_size:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.max_wait_s, self._flush)
        return await future

    async def recover(self, member: ToolCall) -> Any:
        """A member sent in a batch by an attempt that died: that batch's answer (sent
        again as it was, same key, if it never arrived)."""
        assert member.batch_key is not None
        stored = await self._book.stored(member.batch_key)
        sent = (stored.request if stored is not None else None) or []
        keys = [key for key, _ in sent]
        if member.receipt_key not in keys:
            raise DeeplineError(f"{self.tool}: the batch a call was sent in ({member.batch_key}) is not in the store.")
        call = DurableCall(
            key=member.batch_key,
            kind="batch",
            label=f"{self.tool} batch of {len(keys)}",
            tool=f"{self.tool}{BATCH_SUFFIX}",
        )
        try:
            results = await self._execute(call, [input for _, input in sent])
        except ToolExecutionError as exc:
            member.unanswered = member.unanswered or exc.unanswered  # that batch may have been processed: so may it
            raise
        return results[keys.index(member.receipt_key)]

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending:
            members, self._pending = self._pending[: self.max_size], self._pending[self.max_size :]
            task = asyncio.get_running_loop().create_task(self._run(members))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, members: list[Member]) -> None:
        members = [m for m in members if _still_owned(m)]
        if not members:
            return
        call = DurableCall(
            # Keyed by what the members send: a forced or stale member carries a fresh
            # idempotency key, so its batch is a new request, never an earlier batch's answer.
            key=receipt_key("batch", self.tool, *sorted(info.idempotency_key for info, _, _ in members)),
            kind="batch",
            label=f"{self.tool} batch of {len(members)}",
            tool=f"{self.tool}{BATCH_SUFFIX}",
            members=[(info.receipt_key, info.lease_id) for info, _, _ in members],
            request=[[info.receipt_key, input] for info, input, _ in members],
        )
        try:
            results = await self._execute(call, [input for _, input, _ in members])
        except BaseException as exc:
            if isinstance(exc, ToolExecutionError) and exc.unanswered:  # the batch may have been processed
                for info, _, _ in members:
                    info.unanswered = True
            for _, _, future in members:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, _, future), result in zip(members, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def _execute(self, call: DurableCall, inputs: list[Any]) -> list[Any]:
        async def send(info: ToolCall) -> Any:
            results = await self._send(inputs, info)
            # Checked before the aggregate receipt completes: a short answer is a (retryable)
            # failure, never a stored result that every later run would trip on.
            if not isinstance(results, list) or len(results) != len(inputs):
                got = len(results) if isinstance(results, list) else type(results).__name__
                raise ProviderTransientError(
                    f"{self.tool}: a batch of {len(inputs)} calls got {got} results back",
                    category="upstream",
                    tool=self.tool,
                )
            return results

        value: list[Any] = (await self._book.execute(call, send)).value
        return value


def _still_owned(member: Member) -> bool:
    """A member whose lease was lost while it waited for its batch is not sent: it is
    claimed again (and finds the new owner's answer)."""
    info, _, future = member
    try:
        info.ensure_lease()
    except BaseException as exc:
        if not future.done():
            future.set_exception(exc)
        return False
    return True
