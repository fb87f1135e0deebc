"""The leases of the calls this process is invoking right now.

A lease is ours until the expiry the store last confirmed; the run's heartbeat extends
them all in one write and learns which ones another owner took. A process paused past
its expiry (SIGSTOP, a laptop lid) finds the lease gone and sends nothing.
"""

from __future__ import annotations

import asyncio

from deepline_cli.runtime.calls.store_thread import StoreIO


class HeldLeases:
    """Lease id → (receipt key, confirmed expiry) for every call being invoked."""

    def __init__(self, io: StoreIO, ttl: float) -> None:
        self._io = io
        self._ttl = ttl
        self._held: dict[str, tuple[str, float]] = {}
        self._lost: set[str] = set()
        self._invoking = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def hold(self, lease_id: str, key: str, expires_at: float) -> None:
        self._held[lease_id] = (key, expires_at)
        self._invoking += 1
        self._idle.clear()

    def release(self, lease_id: str) -> None:
        self._held.pop(lease_id, None)
        self._invoking -= 1
        if self._invoking == 0:
            self._idle.set()

    @property
    def invoking(self) -> int:
        """Calls being invoked now (out, or about to go out: waiting for a budget or a rate)."""
        return self._invoking

    def owned(self, lease_id: str) -> bool:
        """Still ours: not taken by another owner, and not past the expiry last confirmed."""
        return lease_id not in self._lost and self._held.get(lease_id, ("", 0.0))[1] > self._io.now()

    async def heartbeat(self) -> None:
        """Extend every lease held; remember the ones another owner took."""
        if not self._held:
            return
        leases = [(key, lease_id) for lease_id, (key, _) in self._held.items()]
        expires = self._io.now() + self._ttl
        lost = await self._io.call(self._io.store.receipts.heartbeat_receipts, leases, expires)
        self._lost.update(lost)
        for key, lease_id in leases:
            if lease_id in self._held and lease_id not in lost:
                self._held[lease_id] = (key, expires)

    async def idle(self, timeout: float) -> bool:
        """Wait (up to `timeout`) until no call is being invoked; True if none is."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True
