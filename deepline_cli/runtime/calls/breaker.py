"""Why a run stopped dispatching calls: an interrupt, a lost run, a budget spent, or the
circuit breaker (a paid call that could not be recorded). One is shared by a run and its
child runs, so stopping one stops them all; the first reason stands."""

from __future__ import annotations

import asyncio
import contextlib

from deepline_cli.errors import DeeplineError


class Breaker:
    def __init__(self) -> None:
        self._reasons: list[BaseException] = []
        self._refusing: BaseException | None = None  # `refuse`: set from a signal handler
        self._stopped = asyncio.Event()
        self._store_up = asyncio.Event()  # cleared while the store cannot record anything
        self._store_up.set()

    @property
    def store_up(self) -> bool:
        return self._store_up.is_set()

    def store_outage(self, down: bool) -> None:
        """The store's connection was lost (True) or is back (False)."""
        if down:
            self._store_up.clear()
        else:
            self._store_up.set()

    async def until_store_up(self) -> None:
        """Wait until the store can record again, or dispatching stops (then `check` says why)."""
        if self._store_up.is_set():
            return
        back, stopped = asyncio.ensure_future(self._store_up.wait()), asyncio.ensure_future(self._stopped.wait())
        try:
            await asyncio.wait((back, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            back.cancel()
            stopped.cancel()

    def check(self) -> None:
        """Raise why dispatching stopped, if it did."""
        if self._reasons:
            raise self._reasons[0]
        if self._refusing is not None:
            raise self._refusing

    def refuse(self, reason: BaseException) -> None:
        """From a signal handler, the moment Ctrl-C comes, before the event loop hears it (it
        only sets a flag): no call starts from then, each raising `reason`; `stop` follows."""
        self._refusing = reason

    def stop(self, reason: BaseException) -> None:
        if not self._reasons:
            self._reasons.append(reason)
            self._stopped.set()

    async def pause(self, seconds: float) -> None:
        """Sleep `seconds`, or less if dispatching stops meanwhile (a call waiting out a
        Retry-After has nothing at the provider: an interrupt need not wait for it)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)

    def trip(self, exc: DeeplineError) -> DeeplineError:
        self.stop(exc)
        return exc

    @property
    def tripped(self) -> BaseException | None:
        """The fatal error that stopped the run (not a plain interrupt), if any."""
        reason = self._reasons[0] if self._reasons else None
        return reason if isinstance(reason, DeeplineError) and reason.fatal else None
