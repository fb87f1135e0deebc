"""The governor: how many calls may be in flight, and how fast each tool may go.

A run-wide limit (`--concurrency`) and per-tool limits (`concurrency`, `rate_limit`).
Rate limits are a paced schedule (one slot every 1/rate seconds, no burst), which keeps
a tool within a few percent of its limit over any window of a few seconds.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from deepline_cli.errors import UsageError

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$")
_UNIT_S = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}


def parse_rate(text: str, *, owner: str) -> float:
    """`"20/s"`, `"600/min"` → calls per second."""
    match = _RATE.match(text)
    if not match or float(match.group(1)) <= 0:
        raise UsageError(f'{owner}: rate_limit {text!r} is not valid; write it like "20/s" or "600/min".')
    return float(match.group(1)) / _UNIT_S[match.group(2)]


SharedSlot = Callable[[str, float], Awaitable[float]]  # (tool, interval) -> seconds to wait


class Pacer:
    """Hands out call start times no closer than 1/rate apart.

    With `shared`, the schedule lives in the store, so every process (every worker on
    every machine) using that store draws from one schedule per tool.
    """

    def __init__(self, tool: str, per_second: float, shared: SharedSlot | None = None) -> None:
        self.tool = tool
        self.interval = 1.0 / per_second
        self._next = 0.0
        self._shared = shared
        self.waiting = 0

    async def wait(self) -> None:
        if self._shared is not None:
            delay = await self._shared(self.tool, self.interval)
            await self._sleep(delay)
            return
        now = time.monotonic()
        start = max(now, self._next)
        self._next = start + self.interval
        await self._sleep(start - now)

    async def _sleep(self, delay: float) -> None:
        if delay > 0:
            self.waiting += 1
            try:
                await asyncio.sleep(delay)
            finally:
                self.waiting -= 1


class Governor:
    def __init__(self, concurrency: int | None = None, shared_slot: SharedSlot | None = None) -> None:
        self._run = asyncio.Semaphore(concurrency) if concurrency else None
        self._shared_slot = shared_slot
        self._tool_slots: dict[str, asyncio.Semaphore] = {}
        self._pacers: dict[str, Pacer] = {}
        self._paused_until: dict[str, float] = {}

    def back_off(self, tool_id: str, seconds: float) -> None:
        """A provider said "slow down" (429): hold every new call of the tool in this run."""
        until = time.monotonic() + seconds
        if until > self._paused_until.get(tool_id, 0.0):
            self._paused_until[tool_id] = until

    def configure_tool(self, tool_id: str, *, concurrency: int | None, rate_limit: str | None) -> None:
        if concurrency and tool_id not in self._tool_slots:
            self._tool_slots[tool_id] = asyncio.Semaphore(concurrency)
        if rate_limit and tool_id not in self._pacers:
            self._pacers[tool_id] = Pacer(tool_id, parse_rate(rate_limit, owner=f"Tool {tool_id!r}"), self._shared_slot)

    def paced(self) -> dict[str, float]:
        """Tools whose calls wait for their rate limit now → the limit (calls/s)."""
        return {t: 1.0 / p.interval for t, p in self._pacers.items() if p.waiting}

    def paused(self) -> dict[str, float]:
        """Tools held back after a 429 → seconds until they go again."""
        now = time.monotonic()
        return {t: round(until - now, 1) for t, until in self._paused_until.items() if until > now}

    @asynccontextmanager
    async def slot(self, tool_id: str) -> AsyncIterator[None]:
        run, tool = self._run, self._tool_slots.get(tool_id)
        if run is not None:
            await run.acquire()
        try:
            if tool is not None:
                await tool.acquire()
            try:
                paused = self._paused_until.get(tool_id, 0.0) - time.monotonic()
                if paused > 0:
                    await asyncio.sleep(paused)
                pacer = self._pacers.get(tool_id)
                if pacer is not None:
                    await pacer.wait()
                yield
            finally:
                if tool is not None:
                    tool.release()
        finally:
            if run is not None:
                run.release()

    def unlimited(self, tool_id: str) -> bool:
        return (
            self._run is None
            and tool_id not in self._tool_slots
            and tool_id not in self._pacers
            and tool_id not in self._paused_until
        )
