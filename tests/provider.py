"""A real loopback HTTP provider for tests and benchmarks.

An asyncio HTTP/1.1 server (keep-alive) on 127.0.0.1 in its own thread. It answers
JSON, records every request with the moment it arrived (`Seen.at`), remembers
idempotency keys and "bills" each key once (as a provider that honours
`Idempotency-Key` would), and can be told to misbehave:

    provider.script("/v1/email", ["500", "429:0.2", "ok"])   # per-path answers, in order
    provider.default_fault = "slow:2"                          # for every request

Faults: `500` (any 5xx/4xx status), `429:SECONDS` (Retry-After), `slow:SECONDS`,
`malformed` (invalid JSON with a JSON content type), `html` (a 200 HTML page), `empty_json`
(a 200 with a JSON content type and no body), `reset` (a reset, RST, without an answer),
`echo` (answer with the request headers, to test redaction; `echo_keys`: their values as
the object's keys, as a usage endpoint keyed by the API key answers), `302:LOCATION` (any 3xx
status, redirecting to LOCATION), `ok`.

`connections` counts the connections it accepted; `GET /_stats` answers
`{"connections": N, "requests": M}` (that request's own connection included).

    python tests/provider.py --port 8765 --latency-ms 20     # standalone, for benchmarks
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Seen:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any
    at: float = 0.0  # time.monotonic() when the request line arrived: rates are measured here
    port: int = 0  # the provider's port it arrived on (see ProviderServer.add_port)


@dataclass
class Provider:
    latency_s: float = 0.0
    default_fault: str = "ok"
    requests: list[Seen] = field(default_factory=list)
    billed: Counter[str] = field(default_factory=Counter)
    answers: dict[str, Any] = field(default_factory=dict)
    _scripts: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    port: int = 0
    record: bool = True
    connections: int = 0
    served: int = 0

    def script(self, path: str, faults: list[str]) -> None:
        self._scripts[path] = list(faults)

    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def count(self, path: str | None = None) -> int:
        return sum(1 for r in self.requests if path is None or r.path == path)

    def _fault_for(self, path: str) -> str:
        queue = self._scripts.get(path)
        if queue:
            return queue.pop(0)
        return self.default_fault

    def answer(self, seen: Seen) -> tuple[int, dict[str, str], bytes]:
        body = seen.body if isinstance(seen.body, dict) else {}
        key = seen.headers.get("idempotency-key") or seen.headers.get("x-deepline-idempotency-key") or ""
        if key:
            self.billed[key] += 0  # known key; billed below only once
        payload = {"ok": True, "path": seen.path, "query": seen.query, "echo": body, "key": key}
        if key and key in self.answers:
            payload = self.answers[key]  # an idempotent provider replays its first answer
        elif key:
            self.answers[key] = payload
            self.billed[key] += 1
        return 200, {"content-type": "application/json"}, json.dumps(payload).encode()


class ProviderServer:
    """Runs a Provider on a background event loop thread."""

    def __init__(self, provider: Provider | None = None, port: int = 0, ssl: Any = None) -> None:
        self.provider = provider or Provider()
        self._port = port
        self._ssl = ssl  # an ssl.SSLContext: serve HTTPS
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._extra: list[asyncio.base_events.Server] = []

    def __enter__(self) -> Provider:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        future.result(timeout=10)
        return self.provider

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def add_port(self) -> int:
        """Listen on one more port (same provider, same answers); the requests that arrive
        there say so in `Seen.port`: a test gives each client its own port to tell them apart."""
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        return future.result(timeout=10)

    async def _listen(self) -> int:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=1024)
        self._extra.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self._port, backlog=1024, ssl=self._ssl)
        self.provider.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        # Let connection handlers end (a `slow` answer may outlive the run that gave up on
        # it): a handler destroyed mid-sleep would leak its socket.
        current = asyncio.current_task()
        handlers = [t for t in asyncio.all_tasks() if t is not current]
        if handlers:
            _, pending = await asyncio.wait(handlers, timeout=8)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for server in [self._server, *self._extra]:
            if server is not None:
                server.close()
                await server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.provider.connections += 1
        port = writer.get_extra_info("sockname")[1]
        try:
            while True:
                seen = await _read_request(reader)
                if seen is None:
                    return
                seen.port = port
                if not await self._respond(seen, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def _respond(self, seen: Seen, writer: asyncio.StreamWriter) -> bool:
        provider = self.provider
        if seen.path == "/_stats":
            stats = {"connections": provider.connections, "requests": provider.served}
            return await _write(writer, 200, {"content-type": "application/json"}, json.dumps(stats).encode())
        provider.served += 1
        if provider.record:
            provider.requests.append(seen)
        if provider.latency_s:
            await asyncio.sleep(provider.latency_s)
        fault = provider._fault_for(seen.path)
        kind, _, arg = fault.partition(":")
        if kind == "reset":  # a real reset (RST), not a close: SO_LINGER 0
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        if kind == "slow":
            await asyncio.sleep(float(arg or 5))
            kind = "ok"
        if kind == "ok":
            status, headers, body = provider.answer(seen)
        elif kind == "malformed":
            status, headers, body = 200, {"content-type": "application/json"}, b'{"broken": '
        elif kind == "html":  # a bot check or a login page, with a 200
            status, headers, body = 200, {"content-type": "text/html"}, b"<html><title>Just a moment...</title></html>"
        elif kind == "empty_json":
            status, headers, body = 200, {"content-type": "application/json"}, b""
        elif kind in ("echo", "echo_keys"):  # echo_keys: the header values as the JSON object's keys
            echoed = seen.headers if kind == "echo" else {value: name for name, value in seen.headers.items()}
            status, headers, body = 200, {"content-type": "application/json"}, json.dumps(echoed).encode()
        elif kind == "429":
            status, headers, body = 429, {"retry-after": arg or "1"}, b'{"error": "slow down"}'
        elif kind.startswith("3"):
            status, headers, body = int(kind), {"location": arg}, b""
        else:
            status, headers, body = int(kind), {"content-type": "application/json"}, b'{"error": "fault"}'
        return await _write(writer, status, headers, body)


async def _write(writer: asyncio.StreamWriter, status: int, headers: dict[str, str], body: bytes) -> bool:
    head = f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(head.encode() + b"\r\n" + body)
    await writer.drain()
    return True


async def _read_request(reader: asyncio.StreamReader) -> Seen | None:
    line = await reader.readline()
    if not line:
        return None
    at = time.monotonic()
    method, target, _ = line.decode().split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length") or 0)
    data = await reader.readexactly(length) if length else b""
    path, _, query = target.partition("?")
    body: Any = json.loads(data) if data else None
    return Seen(method, path, query, headers, body, at)


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the loopback provider on its own.")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    args = parser.parse_args()
    provider = Provider(latency_s=args.latency_ms / 1000, record=False)
    with ProviderServer(provider, port=args.port):
        print(f"listening on 127.0.0.1:{args.port}", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
