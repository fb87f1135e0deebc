"""The governor: how many calls may be in flight, and how fast each tool may go.

A run-wide limit (`--concurrency`) and per-tool limits (`concurrency`, `rate_limit`).
Rate limits are a paced schedule (one slot every 1/rate seconds, no burst), which keeps
a tool within a few percent of its limit over any window of a few seconds.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from deepline_cli.errors import UsageError

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$")
_UNIT_S = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}


def parse_rate(text: str, *, owner: str) -> float:
    """`"20/s"`, `"600/min"` → calls per second (`10`, no text, is refused as any other)."""
    match = _RATE.match(text) if isinstance(text, str) else None
    if not match or float(match.group(1)) <= 0:
        raise UsageError(f'{owner}: rate_limit {text!r} is not valid; write it like "20/s" or "600/min".')
    return float(match.group(1)) / _UNIT_S[match.group(2)]


# (tool, interval, count) -> the first start time of `count` consecutive slots, in seconds
# from now (shared through the store by every process using it).
SharedSlots = Callable[[str, float, int], Awaitable[float]]
BLOCK_S = 0.25  # a process reserves up to this much of a tool's schedule at a time
Pause = Callable[[float], Awaitable[None]]


class Pacer:
    """Hands out call start times no closer than 1/rate apart.

    With `shared`, the schedule lives in the store, so every process (every worker on
    every machine) using that store draws from one schedule per tool. Slots are reserved
    in blocks (up to a quarter of a second of the schedule, as many as calls are waiting),
    so a fast-paced tool costs one store round trip per block, not per call. And calls
    never go out closer than 1/rate apart from this process, even when it was starved
    of CPU and woke after several of its slots had passed: late slots are not a burst.
    """

    def __init__(self, tool: str, per_second: float, shared: SharedSlots | None = None) -> None:
        self.tool = tool
        self.interval = 1.0 / per_second
        self._block = max(1, int(per_second * BLOCK_S))
        self._next = 0.0
        self._shared = shared
        self._slots: deque[float] = deque()  # reserved start times (monotonic clock)
        self._reserving: asyncio.Future[None] | None = None
        self._last_sent = float("-inf")
        self.waiting = 0  # calls in wait(): how many slots to reserve at once
        self.sleeping = 0  # calls held back by the pace right now (the live view says "paced")

    async def wait(self, pause: Pause = asyncio.sleep) -> None:
        """Until this call's slot; `pause` sleeps (a run's pause raises when the run stops
        dispatching)."""
        self.waiting += 1
        try:
            start = await self._slot()
            # The floor on this process's own pace: a slot that came due while the process
            # could not run is not taken together with the next one.
            while (moment := max(start, self._last_sent + self.interval)) > time.monotonic():
                self.sleeping += 1
                try:
                    await pause(moment - time.monotonic())
                finally:
                    self.sleeping -= 1
            self._last_sent = time.monotonic()
        finally:
            self.waiting -= 1

    async def _slot(self) -> float:
        if self._shared is None:
            start = max(time.monotonic(), self._next)
            self._next = start + self.interval
            return start
        while not self._slots:
            if self._reserving is None:
                self._reserving = asyncio.ensure_future(self._reserve(min(self._block, self.waiting)))
            reserving = self._reserving
            try:
                await asyncio.shield(reserving)
            finally:
                if self._reserving is reserving and reserving.done():
                    self._reserving = None
        return self._slots.popleft()

    async def _reserve(self, count: int) -> None:
        assert self._shared is not None
        first = time.monotonic() + await self._shared(self.tool, self.interval, count)
        self._slots.extend(first + i * self.interval for i in range(count))


class Governor:
    """How fast calls go out: the run's concurrency, each tool's concurrency and rate limit
    (paced, optionally shared with other processes through the store), and a tool's pause
    after a 429."""

    def __init__(self, concurrency: int | None = None, shared_slot: SharedSlots | None = None) -> None:
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
        return {t: 1.0 / p.interval for t, p in self._pacers.items() if p.sleeping}

    def paused(self) -> dict[str, float]:
        """Tools held back after a 429 → seconds until they go again."""
        now = time.monotonic()
        return {t: round(until - now, 1) for t, until in self._paused_until.items() if until > now}

    @asynccontextmanager
    async def slot(self, tool_id: str, pause: Pause = asyncio.sleep) -> AsyncIterator[None]:
        """Hold a slot of the run and of the tool while a call goes out. The waits for a
        429's pause and for the rate limit go through `pause`: a run's pause raises when the
        run stops dispatching, so an interrupt does not wait for a call that is not out."""
        run, tool = self._run, self._tool_slots.get(tool_id)
        if run is not None:
            await run.acquire()
        try:
            if tool is not None:
                await tool.acquire()
            try:
                await self.pace(tool_id, pause)
                yield
            finally:
                if tool is not None:
                    tool.release()
        finally:
            if run is not None:
                run.release()

    async def pace(self, tool_id: str, pause: Pause = asyncio.sleep) -> None:
        """Until the tool may send: past a 429's pause, at its next rate-limit slot. A call
        waiting for its slot when a 429 came waits the pause out too, then takes a new slot;
        a retry goes through here again (retries keep to the limit as first tries do)."""
        pacer = self._pacers.get(tool_id)
        while True:
            paused = self._paused_until.get(tool_id, 0.0) - time.monotonic()
            if paused > 0:
                await pause(paused)
            if pacer is not None:
                await pacer.wait(pause)
            if self._paused_until.get(tool_id, 0.0) <= time.monotonic():
                return

    def unlimited(self, tool_id: str) -> bool:
        return (
            self._run is None
            and tool_id not in self._tool_slots
            and tool_id not in self._pacers
            and tool_id not in self._paused_until
        )
