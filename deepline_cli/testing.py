"""Offline providers: a real HTTP server on 127.0.0.1 that answers like a paid provider,
for trying a play without API keys and for testing your plays.

    from deepline_cli.testing import FakeProvider

    provider = FakeProvider("hunter")

    @provider.route("GET", "/v2/email-finder")
    def find(request):
        return {"data": {"email": f"{request.query['first_name'].lower()}@{request.query['domain']}"}}

    with provider.running(port=0) as url:      # a thread; or provider.serve(8787) in the foreground
        ...                                    # point deepline.toml at `url`

It bills each answer (2xx) once per `Idempotency-Key`, as a provider honouring keys does
(a repeated key gets the first answer again, unbilled; errors are not billed), counts what
it received and billed (`provider.stats()`, or `GET /_stats`), and checks an API key when
given one (`api_key=`, sent as a bearer token, an `X-Api-Key` header or an `api_key` query
parameter) on every path but the `/_…` ones, which are for looking in. A handler returns
the JSON body, or `(status, body)`, or `(status, body, headers)`.
"""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

KEY_HEADERS = ("idempotency-key", "x-deepline-idempotency-key")


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    json: Any

    @property
    def idempotency_key(self) -> str:
        return next((self.headers[h] for h in KEY_HEADERS if h in self.headers), "")


Handler = Callable[[Request], Any]


@dataclass
class FakeProvider:
    """A paid provider on 127.0.0.1 for tests and offline tries: routes answer JSON, every
    request is counted by path, and a request carrying an idempotency key already billed
    is answered again without billing twice (`billed`), as real providers do."""

    name: str = "provider"
    api_key: str | None = None
    routes: dict[tuple[str, str], Handler] = field(default_factory=dict)
    requests: Counter[str] = field(default_factory=Counter)  # by path
    billed: Counter[str] = field(default_factory=Counter)  # by path
    _answers: dict[str, tuple[int, Any, dict[str, str]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def route(self, method: str, path: str) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self.routes[(method.upper(), path)] = handler
            return handler

        return register

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": sum(self.requests.values()),
                "billed": sum(self.billed.values()),
                "by_path": {p: {"requests": n, "billed": self.billed[p]} for p, n in sorted(self.requests.items())},
            }

    def answer(self, request: Request) -> tuple[int, Any, dict[str, str]]:
        if request.path == "/_stats":
            return 200, self.stats(), {}
        handler = self.routes.get((request.method, request.path))
        with self._lock:
            self.requests[request.path] += 1
        if handler is None:
            return 404, {"error": f"no route {request.method} {request.path}"}, {}
        if self.api_key is not None and not request.path.startswith("/_") and not self._authorised(request):
            return 401, {"error": "invalid API key"}, {}
        key = request.idempotency_key
        with self._lock:
            if key and key in self._answers:
                return self._answers[key]  # replayed: billed once
        try:
            status, body, headers = _normalise(handler(request))
        except Exception as exc:  # a bug in a handler: an honest 500, not a dropped connection
            return 500, {"error": f"{type(exc).__name__}: {exc}"}, {}
        with self._lock:
            if 200 <= status < 300:  # an answer is billed; an error (a 404 not-found too) is not
                if key:
                    self._answers[key] = (status, body, headers)
                self.billed[request.path] += 1
        return status, body, headers

    def _authorised(self, request: Request) -> bool:
        given = {
            request.headers.get("authorization", "").removeprefix("Bearer ").strip(),
            request.headers.get("x-api-key", ""),
            request.query.get("api_key", ""),
        }
        return self.api_key in given

    @contextlib.contextmanager
    def running(self, port: int = 0) -> Iterator[str]:
        """Serve in a thread while the block runs; yields the base URL."""
        server = self._server(port)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)

    def serve(self, port: int, *, ready: Callable[[int], None] | None = None) -> None:
        """Serve in the foreground until interrupted; `ready` hears the port (0: any free)."""
        server = self._server(port)
        if ready is not None:
            ready(int(server.server_address[1]))
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
        server.server_close()

    def _server(self, port: int) -> ThreadingHTTPServer:
        provider = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real providers

            def _handle(self) -> None:
                parts = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                request = Request(
                    self.command,
                    parts.path,
                    dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True)),
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                )
                status, answer, headers = provider.answer(request)
                data = b"" if answer is None else json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

            def log_message(self, format: str, *args: Any) -> None:
                return None  # quiet: the play's view is what matters

        server = _Server(("127.0.0.1", port), _Handler)
        server.daemon_threads = True
        return server


def _normalise(answer: Any) -> tuple[int, Any, dict[str, str]]:
    if isinstance(answer, tuple):
        status, body, *rest = answer
        return int(status), body, dict(rest[0]) if rest else {}
    return 200, answer, {}


__all__ = ["FakeProvider", "Request"]


class _Server(ThreadingHTTPServer):
    """A provider that takes a map's calls at once: the listen queue is the OS's default
    size (5 here) otherwise, and 50 rows in flight met refused connections and retries."""

    request_queue_size = 1024
