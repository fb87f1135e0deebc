"""The runtime's door to the store: one store thread, and group commit for writes.

Store methods are plain blocking calls. The runtime runs them on a single dedicated
thread (so the event loop keeps dispatching provider calls while SQLite writes) and
batches the hot writes: every claim, settlement or log line submitted while the
previous batch was being written goes into the next transaction together.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar, cast

from deepline_cli._aio import count_held
from deepline_cli.backoff import delays
from deepline_cli.errors import StoreConnectionLost, StoreUnreachable
from deepline_cli.store.claims import given_back
from deepline_cli.store.records import (
    Applied,
    Claim,
    ClaimOutcome,
    LogLine,
    MapRow,
    Settlement,
    SheetRow,
    Writes,
)
from deepline_cli.store.roles import ROLES, Store

R = TypeVar("R")
Checked = Callable[[bool | BaseException], None]  # a settlement's fate: applied, or the store's error
# A batch's waiters: each claim's, and each settlement's `checked`, in the batch's order.
Batch = tuple[list[tuple[Claim, "asyncio.Future[ClaimOutcome]"]], list[tuple[Settlement, Checked | None]]]


def reconnect_bound_s() -> float:
    """How long a store that dropped its connection is tried again before giving up."""
    return float(os.environ.get("DEEPLINE_STORE_RECONNECT_S", "60"))


# Stores (by URL) this process already gave up on: a later call, on any connection to it
# (recording how the run ended, a worker putting the run back), tries once, not for the
# whole bound again.
_GAVE_UP: set[str] = set()


def _waits(once: bool) -> Iterator[float]:
    """The wait before each reconnect: backing off until the bound is passed, or, for a
    store given up on already, one try at once."""
    if once:
        yield 0.0
        return
    yield from delays(0.1, cap=5.0, until=reconnect_bound_s())  # 0.1, 0.2, 0.4 … then every 5 s


# How long an outage is still tried once the run was asked to stop (Ctrl-C, SIGTERM): a
# blip passes, and a person who asked to stop is not kept waiting the whole bound.
STOPPING_RECONNECT_S = 5.0
# How long one try of a store call may go unanswered once the run is asked to stop before
# its connection is cut (a statement a live server is still working on ends well before).
STOPPING_STALL_S = 10.0


def reconnecting(
    store: Store,
    fn: Callable[..., R],
    *args: Any,
    report: Callable[[str], None] | None = None,
    outage: Callable[[bool], None] | None = None,
    stopping: threading.Event | None = None,
) -> R:
    """`fn(*args)`, connecting again (with backoff) when the store dropped the connection.

    A transaction cut off with its connection is run again: every write the runtime makes
    is idempotent when applied twice (claims by their lease id, settlements by theirs,
    rows by their keys). Past the bound, StoreUnreachable. `outage` hears True when the
    connection is found lost and False as soon as a new one is made, whatever `fn` does
    with it then (not when given up on). Once `stopping` is set (the run was asked to
    stop), it is tried for STOPPING_RECONNECT_S more at most.
    """
    try:
        result = fn(*args)
    except StoreConnectionLost as lost:
        reason = lost
    else:
        if _GAVE_UP:  # it answers again: a later outage is tried for the whole bound
            _GAVE_UP.discard(store.url)
        return result
    told = outage or _unheard
    told(True)
    stop = stopping or threading.Event()
    gave_up, began, stopped_at = store.url in _GAVE_UP, time.monotonic(), None
    if gave_up and stop.is_set():  # given up on already, and the run is stopping: not tried again
        raise StoreUnreachable(f"{reason} Given up on already, the run being asked to stop.") from None
    for delay in _waits(once=gave_up):
        if stopped_at is None and stop.wait(delay):
            stopped_at = time.monotonic()  # asked to stop while waiting: try now, then briefly
        elif stopped_at is not None:
            time.sleep(min(delay, max(0.0, stopped_at + STOPPING_RECONNECT_S - time.monotonic())))
        try:
            store.reconnect(hurry=stopped_at is not None)
            told(False)
            result = fn(*args)
        except StoreConnectionLost as again:
            reason = again
            told(True)
            if stopped_at is not None and time.monotonic() - stopped_at >= STOPPING_RECONNECT_S:
                break
            continue
        _GAVE_UP.discard(store.url)
        if report is not None:
            said = str(reason).rstrip(".")
            report(f"{said}; reconnected after {time.monotonic() - began:.1f}s")
        return result
    waited = time.monotonic() - began
    if gave_up:
        raise StoreUnreachable(f"{reason} Still down, after {reconnect_bound_s():.0f}s of trying earlier.") from None
    _GAVE_UP.add(store.url)
    why = ", the run being asked to stop" if stopped_at is not None else ""
    raise StoreUnreachable(f"{reason} Gave up after {waited:.0f}s of trying to reconnect{why}.") from None


def _unheard(down: bool) -> None:
    """Nobody listens for this call's outage (a command's own store calls)."""


class Reconnecting:
    """A store whose calls connect again (with backoff) when the connection dropped: for
    what a command does on its own thread — looking a run up, taking its lease, loading
    its snapshot — before and after the run's store thread exists."""

    def __init__(self, store: Store) -> None:
        self.wrapped = store

    def __getattr__(self, name: str) -> Any:
        if name in ROLES:  # `store.runs.get_run(...)` reconnects too
            return self
        attr = getattr(self.wrapped, name)
        if not callable(attr) or name in ("close", "reconnect"):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return reconnecting(self.wrapped, partial(attr, *args, **kwargs))

        return call


def unwrapped(store: Store) -> Store:
    return store.wrapped if isinstance(store, Reconnecting) else store


class StoreIO:
    def __init__(self, store: Store, report: Callable[[str], None] | None = None) -> None:
        self.store = store
        self.report = report  # how a reconnect is told (a warning in the run's log)
        # Told True when the connection is found lost, False once it is back (each change
        # once, whichever store call found it): the run holds its calls meanwhile.
        self.outage: Callable[[bool], None] | None = None
        self._down = False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="deepline-store")
        # Leases use the store's clock; measure its offset once instead of asking per call.
        self._offset = reconnecting(store, store.now) - time.time()  # a connection dropped just now: again
        self.busy_s = 0.0
        self._since: float | None = None  # when the store thread's try now running began
        self._cut: float | None = None  # the try `unstick` ended (each is ended once at most)
        self._queued = 0  # calls handed to the store thread and not yet answered
        # Set when the run is asked to stop: an outage is then tried a few seconds, not the bound.
        self.stopping = threading.Event()

    def now(self) -> float:
        return time.time() + self._offset

    def start(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        """`fn(*args)` begun at once, in order with every other store call: here when the
        store can answer without waiting (as `call`), else on the store thread. The caller
        may block on the future (the event loop waits) and calls `finished` once it is done."""
        work = partial(self._timed, fn, *args)
        if not self._queued:
            future: Future[R] = Future()
            try:
                done, result = self.store.try_now(work)
            except Exception as exc:
                future.set_exception(exc)
                done = True
            else:
                if done:
                    future.set_result(cast(R, result))
            if done:
                self._queued += 1  # as a call on the store thread is: `finished` counts it out
                return future
        self._queued += 1
        return self._executor.submit(work)

    def finished(self) -> None:
        """A call `start` began is done, and its caller has its result."""
        self._queued -= 1

    async def call(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """`fn(*args)` on the store: here and now when the store can answer without waiting
        (a local SQLite file nobody else is writing: no thread hop) and no earlier call is
        still on the store thread (calls keep their order); else on the store thread."""
        work = partial(self._timed, fn, *args, **kwargs)
        if not self._queued:
            done, result = self.store.try_now(work)
            if done:
                return cast(R, result)
        self._queued += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, work)
        finally:
            self._queued -= 1

    def _timed(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """Runs on the store thread; `busy_s` is how long the store kept it busy (run stats)."""
        start = time.perf_counter()
        try:
            return reconnecting(
                self.store,
                partial(self._try, partial(fn, *args, **kwargs)),
                report=self.report,
                outage=self._outage,
                stopping=self.stopping,
            )
        finally:
            self.busy_s += time.perf_counter() - start

    def _try(self, work: Callable[[], R]) -> R:
        """One try of a store call (a reconnect's retry is another): timed for `unstick`."""
        self._since = time.perf_counter()
        try:
            return work()
        finally:
            self._since = None

    def unstick(self) -> bool:
        """Once the run is stopping: a try of a store call that has had no answer for
        STOPPING_STALL_S (a server that holds the statement, its connection still open, so
        no reconnect begins) is ended as a lost connection, once: it is tried again briefly,
        then given up on. True if it was."""
        since = self._since
        if not self.stopping.is_set() or since is None or since == self._cut:
            return False
        if time.perf_counter() - since < STOPPING_STALL_S:
            return False
        self._cut = since
        self.store.abort()
        return True

    def _outage(self, down: bool) -> None:
        if down == self._down:
            return
        self._down = down
        if self.outage is not None:
            with contextlib.suppress(RuntimeError):  # the run's loop has closed: nobody to tell
                self.outage(down)

    def close(self) -> None:
        self._executor.shutdown(wait=True)


# Loop turns a batch waits before it is taken, so the answers that arrived together (their
# settlements, their rows' next claims: a resumed coroutine is one turn, each await of its
# chain another) share one commit: on a local SQLite file a batch is written on the event
# loop at once, and without these turns an HTTP play committed ~2 calls at a time. Each
# turn costs microseconds. On the headline (BENCHMARKS.md) two turns took one host from
# 0.47 to 0.18 commits per call (CPU -22%); four took three hosts' waterfall from 0.35 to
# 0.30 (CPU -7% more); six gathered no more.
GATHER_TURNS = 4

# How long the event loop waits for a commit `WriteQueue.commit_now` began; past it (a lock
# another process holds, a store reconnecting) the writer waits for it instead.
COMMIT_NOW_S = 1.0
# Calls that held the event loop (a step's blocking plain `def`: a sync SDK's call) this long
# in all since the last commit have their answers committed at once (`WriteQueue.settle`); each
# is counted from HELD_FROM_S (less is computing, not waiting on a provider).
HELD_COMMIT_S = 0.02
HELD_FROM_S = 0.002


class WriteQueue:
    """Every hot write of a run — claims, settlements, log lines — in commit order.

    Items submitted while a batch is being written go into the next transaction
    together. Batches commit in submission order, so a settlement is never durable
    after a later claim that depends on it.
    """

    def __init__(self, io: StoreIO) -> None:
        self._io = io
        self._claims: list[tuple[Claim, asyncio.Future[ClaimOutcome]]] = []
        self._settlements: list[tuple[Settlement, Checked | None]] = []
        self._logs: list[LogLine] = []
        self._sheet_rows: list[SheetRow] = []
        self._map_rows: list[MapRow] = []
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # A batch `commit_now` began that was not done when it stopped waiting: the writer
        # hands out its results before it takes another batch.
        self._begun: tuple[Future[Applied], Batch] | None = None
        self._held_s = 0.0  # how long calls held the event loop since a batch was last taken

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def claim(self, claim: Claim) -> asyncio.Future[ClaimOutcome]:
        future: asyncio.Future[ClaimOutcome] = self._running_loop().create_future()
        self._claims.append((claim, future))
        self._wake()
        return future

    def settle(self, settlement: Settlement, checked: Checked | None = None, held_s: float = 0.0) -> None:
        """Queue a settlement; `checked` hears, once it is committed, whether it applied (or
        the store's error) — no future per settlement: most have nobody waiting for them.
        `held_s`: how long its call held the event loop (a step's blocking plain `def`): once
        such calls held it HELD_COMMIT_S in all since the last commit, `commit_now`. Their
        answers would otherwise wait for the loop to be free again, and be lost, and paid for
        again, by a kill meanwhile (rows' blocking steps run one after another)."""
        self._settlements.append((settlement, checked))
        if held_s >= HELD_FROM_S:
            self._held_s += held_s
            if self._held_s >= HELD_COMMIT_S:
                began = time.perf_counter()
                self.commit_now()
                count_held(time.perf_counter() - began)  # the call's: not an outer step's own hold
                return
        self._wake()

    def sheet(self, sheet_row: SheetRow | None, map_row: MapRow) -> None:
        """A finished map row (and its sheet row, unless every cell was reused)."""
        if sheet_row is not None:
            self._sheet_rows.append(sheet_row)
        self._map_rows.append(map_row)
        self._wake()

    def log(self, line: LogLine) -> None:
        self._logs.append(line)
        self._wake()

    def _release(self, outcome: ClaimOutcome) -> None:
        """Nobody waits for this claim any more (its caller was cancelled): give it back."""
        self._settlements.append((given_back(outcome.receipt.key, outcome, sent=False), None))

    async def flushed(self) -> None:
        """Wait until everything submitted so far is committed."""
        while self._task is not None:
            await asyncio.shield(self._task)

    def _wake(self) -> None:
        if self._task is None or self._task.done():
            self._task = self._running_loop().create_task(self._drain())

    def owns(self, task: asyncio.Task[Any]) -> bool:
        """Is `task` this queue's writer (never to be cancelled: it holds paid results)?"""
        return task is self._task

    def _pending(self) -> bool:
        return bool(self._claims or self._settlements or self._logs or self._map_rows)

    def _take(self, claims_too: bool = True) -> tuple[Batch, Writes]:
        """Everything submitted so far (but the claims, unless `claims_too`), as one
        transaction's writes."""
        self._held_s = 0.0
        claims: list[tuple[Claim, asyncio.Future[ClaimOutcome]]] = []
        if claims_too:
            claims, self._claims = self._claims, []
        settlements, self._settlements = self._settlements, []
        writes = Writes(
            [s for s, _ in settlements], [c for c, _ in claims], self._logs, self._sheet_rows, self._map_rows
        )
        self._logs, self._sheet_rows, self._map_rows = [], [], []
        return (claims, settlements), writes

    def _deliver(self, batch: Batch, applied: Applied | BaseException) -> None:
        """A committed batch's results to those who wait for them (or the store's error)."""
        claims, settlements = batch
        if isinstance(applied, BaseException):
            for _, future in claims:
                if not future.done():
                    future.set_exception(applied)
            for _, checked in settlements:
                if checked is not None:
                    checked(applied)
            return
        for (_, checked), applied_one in zip(settlements, applied.settled, strict=True):
            if checked is not None:
                checked(applied_one)
        for (_, future), outcome in zip(claims, applied.outcomes, strict=True):
            if not future.done():
                future.set_result(outcome)
            elif future.cancelled() and outcome.verdict == "claimed":
                self._release(outcome)

    def commit_now(self) -> None:
        """Commit the answers, rows and log lines queued, here and now, the event loop
        waiting (up to COMMIT_NOW_S). Not the claims: they go with the writer's next batch
        (committed now, they would start new rows ahead of an interrupt waiting for the loop,
        and of the live view). A settlement depends only on its own claim, committed before
        its call went out; it is committed after any batch already on its way to the store."""
        if not (self._settlements or self._logs or self._map_rows) or self._begun is not None:
            return  # nothing to commit, or one is on its way still: the writer's
        batch, writes = self._take(claims_too=False)
        begun = self._io.start(self._io.store.receipts.apply, writes, self._io.now())
        try:
            begun.result(timeout=COMMIT_NOW_S)
        except BaseException as exc:
            if not (begun.done() and isinstance(exc, Exception)):  # not its own error: not done yet
                self._begun = (begun, batch)  # the writer waits for it, before any later batch
                self._wake()
                if isinstance(exc, Exception):  # waited long enough
                    return
                raise
        self._io.finished()
        error = begun.exception()
        self._deliver(batch, error if error is not None else begun.result())

    async def _drain(self) -> None:
        try:
            while self._begun is not None or self._pending():
                if self._begun is not None:
                    begun, batch = self._begun
                    self._begun = None
                    try:
                        applied: Applied | BaseException = await asyncio.wrap_future(begun)
                    except Exception as exc:
                        applied = exc
                    finally:
                        self._io.finished()
                    self._deliver(batch, applied)
                for _ in range(GATHER_TURNS):
                    await asyncio.sleep(0)
                if not self._pending():  # committed meanwhile (`commit_now`)
                    continue
                batch, writes = self._take()
                try:
                    applied = await self._io.call(self._io.store.receipts.apply, writes, self._io.now())
                except Exception as exc:
                    applied = exc
                self._deliver(batch, applied)
        finally:
            self._task = None
