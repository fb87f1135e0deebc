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
        self._stopped = asyncio.Event()

    def check(self) -> None:
        """Raise why dispatching stopped, if it did."""
        if self._reasons:
            raise self._reasons[0]

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
