"""A TCP proxy in front of PostgreSQL that a test can cut: every open connection is
dropped at once (as a failover or a network blip would), and new ones can be refused
for a while. It can also stall: connections stay open, but nothing passes (a server
that stopped answering, a hung middlebox). Runs on its own event loop thread, on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from urllib.parse import urlsplit, urlunsplit


class PgProxy:
    def __init__(self, target_url: str) -> None:
        parts = urlsplit(target_url)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._parts = parts
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self._refuse_until = 0.0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self.port = 0
        self.dropped = 0
        self.refused = 0  # connections refused while cut: a client trying to reconnect
        # Client messages that followed an answer: the round trips the client waited for.
        self.round_trips = 0

    @property
    def url(self) -> str:
        """The target URL, through the proxy."""
        netloc = self._parts.netloc.rsplit("@", 1)
        auth = netloc[0] + "@" if len(netloc) == 2 else ""
        return urlunsplit(self._parts._replace(netloc=f"{auth}127.0.0.1:{self.port}"))

    def __enter__(self) -> PgProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def cut(self, refuse_for_s: float = 0.0) -> int:
        """Drop every open connection; refuse new ones for `refuse_for_s` seconds."""
        return asyncio.run_coroutine_threadsafe(self._cut(refuse_for_s), self._loop).result(timeout=10)

    async def _cut(self, refuse_for_s: float) -> int:
        self._refuse_until = time.monotonic() + refuse_for_s
        links, self._links = self._links, set()
        for writer in links:
            writer.transport.abort()
        self.dropped += len(links)
        return len(links)

    def stall(self, stalled: bool = True) -> None:
        """Hold every byte from now on (connections stay open, new ones are accepted and
        never answered); `stall(False)` lets them flow again."""
        self._loop.call_soon_threadsafe(self._flowing.clear if stalled else self._flowing.set)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        await self._cut(0)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if time.monotonic() < self._refuse_until:
            self.refused += 1
            client_w.transport.abort()
            return
        await self._flowing.wait()
        try:
            server_r, server_w = await asyncio.open_connection(*self._target)
        except OSError:
            client_w.transport.abort()
            return
        self._links |= {client_w, server_w}
        turn = ["server"]  # who spoke last on this connection
        await asyncio.gather(
            self._pipe(client_r, server_w, turn, "client"), self._pipe(server_r, client_w, turn, "server")
        )
        self._links -= {client_w, server_w}

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, turn: list[str], side: str
    ) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await reader.read(65536):
                if side == "client" and turn[0] == "server":
                    self.round_trips += 1
                turn[0] = side
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
