"""The connection layer (runtime/transport.py) under `Http`: connections kept per origin,
redirects, timeouts, request checks, query encoding, response bodies and retries.

Every test talks to a real loopback server: tests/provider.py (which counts the
connections it accepted), or a scripted raw HTTP/1.1 server started in the test's own
event loop for answers the provider cannot give (chunked, gzip, odd charsets, a closed
keep-alive connection), or a TLS server with a certificate made for the test.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import ipaddress
import json
import math
import shutil
import ssl
import subprocess
import threading
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepline_cli import _json
from deepline_cli.errors import ProviderTransientError, ToolExecutionError, UsageError
from deepline_cli.runtime.providers.governor import Governor
from deepline_cli.runtime.providers.http import Http, Request
from deepline_cli.runtime.providers.secrets import Secrets
from deepline_cli.runtime.providers.transport import Response, Transport, _wire, build, checked_head
from tests.provider import Provider, ProviderServer, Seen

SECRET = "sk-live-7f3c9a1e5b2d4c6e"


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPLINE_RETRY_BASE_S", "0.01")


@pytest.fixture
def provider() -> Iterator[Provider]:
    with ProviderServer() as running:
        yield running


@pytest.fixture
def hosts() -> Iterator[list[Provider]]:
    """Three providers, each on its own port: three origins."""
    with ProviderServer() as a, ProviderServer() as b, ProviderServer() as c:
        yield [a, b, c]


@asynccontextmanager
async def client(size: int = 64, **transport: Any) -> AsyncIterator[Http]:
    http = Http(Transport(size, **transport), Secrets(), Governor())
    try:
        yield http
    finally:
        await http.pool.aclose()


async def send(
    http: Http,
    url: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    params: dict[str, Any] | None = None,
    json: Any = None,
    timeout_s: float = 5.0,
    retries: int = 0,
) -> Response:
    request = Request(method, url, headers or {}, params or {}, json)
    return await http.send(request, tool="test.tool", timeout_s=timeout_s, retries=retries)


def call(url: str, *, size: int = 64, address_check: Any = None, **request: Any) -> Response:
    """One request through a fresh pool."""

    async def once() -> Response:
        async with client(size, address_check=address_check) as http:
            return await send(http, url, **request)

    return asyncio.run(once())


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


# --- connections per origin ------------------------------------------------------------------


def test_each_origin_keeps_its_own_connections(hosts: list[Provider]) -> None:
    async def waterfall() -> None:
        # Rows in flight, each calling A, then B, then C: connections to one host are
        # never handed to another, so each host sees at most the pool size.
        async with client(size=10) as http:

            async def row(i: int) -> None:
                for host in hosts:
                    answer = await send(http, f"{host.url}/v1/row", method="POST", json={"i": i})
                    assert answer.status_code == 200

            await asyncio.gather(*(row(i) for i in range(150)))

    run(waterfall())
    assert [h.served for h in hosts] == [150, 150, 150]
    assert all(1 <= h.connections <= 10 for h in hosts), [h.connections for h in hosts]


def test_alternating_hosts_one_request_at_a_time_reuse_one_connection_each(hosts: list[Provider]) -> None:
    async def alternate() -> None:
        async with client() as http:
            for i in range(30):
                await send(http, f"{hosts[i % 3].url}/v1/ping")

    run(alternate())
    assert [h.connections for h in hosts] == [1, 1, 1]


def test_idle_connections_are_bounded_and_the_least_recently_used_is_closed(hosts: list[Provider]) -> None:
    async def visit() -> None:
        async with client(max_idle=2) as http:
            for host in [*hosts, hosts[2], hosts[0]]:  # A B C C A with room for two idle connections
                await send(http, f"{host.url}/v1/ping")

    run(visit())
    # A's connection was the oldest when C's became idle: it was closed, and A reconnected.
    assert [h.connections for h in hosts] == [2, 1, 1]


# --- redirects ------------------------------------------------------------------------------


def test_redirects_are_followed_as_httpx_follows_them(provider: Provider) -> None:
    provider.script("/temporary", ["307:/kept"])
    provider.script("/found", ["302:/as-get"])
    provider.script("/dir/relative", ["303:next"])

    async def follow() -> list[Response]:
        async with client() as http:
            return [
                await send(http, f"{provider.url}/temporary", method="POST", json={"a": 1}),
                await send(http, f"{provider.url}/found", method="POST", json={"b": 2}),
                await send(http, f"{provider.url}/dir/relative"),
            ]

    answers = run(follow())
    assert [a.status_code for a in answers] == [200, 200, 200]
    seen = [(r.method, r.path, r.body) for r in provider.requests]
    assert seen == [
        ("POST", "/temporary", {"a": 1}),
        ("POST", "/kept", {"a": 1}),  # 307 keeps the method and the body
        ("POST", "/found", {"b": 2}),
        ("GET", "/as-get", None),  # 302 turns a POST into a GET without a body
        ("GET", "/dir/relative", None),
        ("GET", "/dir/next", None),
    ]
    assert provider.requests[3].headers.get("content-length") is None


def test_a_redirect_to_another_origin_drops_the_authorization_header(hosts: list[Provider]) -> None:
    first, other = hosts[0], hosts[1]
    first.script("/start", [f"302:{other.url}/landed"])
    headers = {"Authorization": f"Bearer {SECRET}", "X-Trace": "t1"}
    call(f"{first.url}/start", headers=headers)
    landed = other.requests[0]
    assert landed.path == "/landed"
    assert "authorization" not in landed.headers
    assert landed.headers["x-trace"] == "t1"
    assert landed.headers["host"] == f"127.0.0.1:{other.port}"


def test_a_redirect_to_another_origin_drops_every_header_that_holds_a_secret(
    hosts: list[Provider], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many providers take their key in `X-Api-Key`: a redirect to another host carried it
    there (only `Authorization` was dropped). A redirect on the same host keeps it."""
    first, other = hosts[0], hosts[1]
    first.script("/start", [f"302:{other.url}/landed"])
    first.script("/moved", ["302:/here"])
    monkeypatch.setenv("T_REDIRECT_KEY", SECRET)
    secrets = Secrets()
    assert secrets.lookup("T_REDIRECT_KEY") == SECRET  # read by a template, as a tool's header is

    async def follow() -> None:
        http = Http(Transport(8), secrets, Governor())
        try:
            for path in ("/start", "/moved"):
                headers = {"X-Api-Key": SECRET, "X-Auth": f"Token {SECRET}", "X-Trace": "t1"}
                await http.send(Request("GET", f"{first.url}{path}", headers, {}), tool="t.x", timeout_s=5, retries=0)
        finally:
            await http.pool.aclose()

    run(follow())
    landed = other.requests[0].headers
    assert ("x-api-key" in landed, "x-auth" in landed, landed.get("x-trace")) == (False, False, "t1")
    here = next(r for r in first.requests if r.path == "/here").headers
    assert here["x-api-key"] == SECRET


def test_a_redirect_to_another_origin_that_keeps_a_body_holding_a_secret_is_not_followed(
    hosts: list[Provider], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`json = { api_key = "${KEY}" }` and a 307 to another host: the body went on with the key."""
    first, other = hosts[0], hosts[1]
    first.script("/start", [f"307:{other.url}/landed"])
    first.script("/here", ["307:/kept"])
    monkeypatch.setenv("T_BODY_KEY", SECRET)
    secrets = Secrets()
    secrets.lookup("T_BODY_KEY")

    async def follow(path: str) -> Response:
        http = Http(Transport(8), secrets, Governor())
        try:
            request = Request("POST", f"{first.url}{path}", {}, {}, {"api_key": SECRET, "q": "x"})
            return await http.send(request, tool="t.x", timeout_s=5, retries=0)
        finally:
            await http.pool.aclose()

    with pytest.raises(ToolExecutionError) as refused:
        run(follow("/start"))
    assert "another host" in str(refused.value) and SECRET not in str(refused.value)
    assert other.requests == []
    assert run(follow("/here")).status_code == 200  # the same host: followed, body and all
    assert next(r for r in first.requests if r.path == "/kept").body == {"api_key": SECRET, "q": "x"}


def test_a_redirect_loop_fails_as_a_provider_error_without_retries(provider: Provider) -> None:
    provider.default_fault = "302:/again"
    with pytest.raises(ToolExecutionError) as failure:
        call(f"{provider.url}/again", retries=3)
    error = failure.value
    assert (error.origin, error.category, error.retryable) == ("provider", "upstream", False)
    assert "more than 20 redirects" in str(error)
    assert provider.served == 21


# --- timeouts -------------------------------------------------------------------------------


def test_a_slow_answer_times_out_as_a_transient_network_error(provider: Provider) -> None:
    provider.script("/slow", ["slow:1"])
    with pytest.raises(ProviderTransientError) as failure:
        call(f"{provider.url}/slow", timeout_s=0.2)
    assert failure.value.category == "network"
    assert str(failure.value) == "timed out after 0.2s"


def test_waiting_for_a_free_connection_does_not_count_against_the_timeout(provider: Provider) -> None:
    """A request that waited 1 s for the pool's one connection, with a timeout of 0.2 s: it was
    failed as a provider timeout though never sent. It is sent once the connection is free."""
    provider.script("/busy", ["slow:1"])

    async def crowd() -> BaseException | Response:
        async with client(size=1) as http:
            busy = asyncio.create_task(send(http, f"{provider.url}/busy", timeout_s=5))
            await asyncio.sleep(0.05)
            waiting = await asyncio.gather(send(http, f"{provider.url}/next", timeout_s=0.2), return_exceptions=True)
            await busy
            return waiting[0]

    outcome = run(crowd())
    assert isinstance(outcome, Response) and outcome.status_code == 200, outcome
    assert [r.path for r in provider.requests] == ["/busy", "/next"]


# --- request checks -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "headers", "params", "reason"),
    [
        ("file:///etc/passwd", {}, {}, "unsupported URL scheme 'file'"),
        ("gopher://{host}/x", {}, {}, "unsupported URL scheme 'gopher'"),
        ("{host}/no-scheme", {}, {}, "no http:// or https:// scheme"),
        ("http:///no-host", {}, {}, "has no host"),
        ("{url}/x", {"X-Api-Key": SECRET + "\r\nX-Injected: 1"}, {}, "header 'X-Api-Key' has a line break or NUL"),
        ("{url}/x", {"X-Api-Key": SECRET + "\0"}, {}, "header 'X-Api-Key' has a line break or NUL"),
        ("{url}/x", {"Bad Name": "v"}, {}, "header name 'Bad Name' is not valid"),
        ("{url}/x", {"X-Name": "Müller"}, {}, "header 'X-Name' has a non-ASCII value"),
        ("{url}/x", {"Content-Length": "5, 6"}, {}, "header 'Content-Length' says 5, 6 bytes but the body has 0"),
        ("{url}/x", {"Transfer-Encoding": "gzip"}, {}, "or a header is not valid HTTP"),
        ("{url}/x", {"Content-Length": "5"}, {}, "header 'Content-Length' says 5 bytes but the body has 0"),
        ("{url}/x", {"Transfer-Encoding": "chunked", "Content-Length": "0"}, {}, "both Content-Length and"),
        ("http://a b:{port}/x", {}, {}, "the URL's host is not valid"),
        ("{url}/x", {}, {"filter": {"a": 1}}, "query parameter 'filter' is a dict"),
    ],
)
def test_a_request_that_cannot_be_built_is_a_validation_error_and_reaches_no_server(
    provider: Provider, url: str, headers: dict[str, str], params: dict[str, Any], reason: str
) -> None:
    target = url.format(url=provider.url, host=f"127.0.0.1:{provider.port}", port=provider.port)
    with pytest.raises(ToolExecutionError) as failure:
        call(target, headers=headers, params=params, retries=3)
    error = failure.value
    assert (error.origin, error.category, error.retryable) == ("caller", "validation", False)
    assert reason in str(error)
    assert "retried" not in str(error)
    assert SECRET not in str(error)
    assert provider.connections == 0


# --- query encoding -------------------------------------------------------------------------


def test_query_parameters_are_encoded_and_merged_with_the_urls_own_query(provider: Provider) -> None:
    params = {"over": "new", "text": "a b&c/d=é", "many": [1, 2], "yes": True, "no": False, "none": None, "n": 1.5}

    async def both() -> None:
        async with client() as http:
            await send(http, f"{provider.url}/q path/é?keep=1&over=old&sp=a%20b", params=params)
            await send(http, f"{provider.url}/as-written?a=b c&d=%2F&e")

    run(both())
    merged, written = provider.requests
    assert merged.path == "/q%20path/%C3%A9"
    assert merged.query == (
        "keep=1&sp=a+b&over=new&text=a+b%26c%2Fd%3D%C3%A9&many=1&many=2&yes=true&no=false&none=&n=1.5"
    )
    assert written.query == "a=b%20c&d=%2F&e"


def test_dot_segments_of_a_path_are_resolved_before_sending(provider: Provider) -> None:
    call(f"{provider.url}/v1/users/../../admin/./x")
    assert provider.requests[0].path == "/admin/x"


# --- answers from a scripted server ---------------------------------------------------------


@dataclass
class Scripted:
    """A raw HTTP/1.1 server answering each request with the next scripted bytes."""

    answers: list[tuple[bytes, bool]]  # (raw answer, close the connection after it)
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head + await reader.readexactly(_content_length(head)))
                answer, close = self.answers.pop(0)
                writer.write(answer)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


def _content_length(head: bytes) -> int:
    lines = head.lower().split(b"\r\n")
    return next((int(line[15:]) for line in lines if line.startswith(b"content-length:")), 0)


@asynccontextmanager
async def scripted(*answers: bytes | tuple[bytes, bool]) -> AsyncIterator[Scripted]:
    script = Scripted([a if isinstance(a, tuple) else (a, False) for a in answers])
    server = await asyncio.start_server(script.handle, "127.0.0.1", 0)
    script.port = server.sockets[0].getsockname()[1]
    async with server:
        yield script


def answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\n{head}\r\n".encode() + body


def test_text_is_decoded_with_the_charset_of_the_content_type() -> None:
    async def texts() -> list[str]:
        async with (
            scripted(
                answer("café".encode("latin-1"), 'Content-Type: text/plain; charset="ISO-8859-1"'),
                answer("café".encode(), "Content-Type: text/plain"),
                answer("café".encode("latin-1"), "Content-Type: text/plain; charset=no-such-charset"),
                answer(
                    "żółw".encode("cp1250"), "content-type: text/html; charset=windows-1250", "X-Two: 1", "x-two: 2"
                ),
            ) as server,
            client() as http,
        ):
            answers = [await send(http, server.url) for _ in range(4)]
        assert answers[3].headers["X-TWO"] == "1, 2"
        assert answers[3].headers["Content-Type"] == "text/html; charset=windows-1250"
        return [a.text for a in answers]

    assert run(texts()) == ["café", "café", "caf\ufffd", "żółw"]


def test_chunked_gzip_informational_and_close_delimited_bodies() -> None:
    chunked = b'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\n{"a"\r\n3\r\n: 1\r\n1\r\n}\r\n0\r\n\r\n'
    informational = b"HTTP/1.1 100 Continue\r\n\r\n" + answer(b"after 100")
    zipped = answer(gzip.compress(b'{"zipped": true}'), "Content-Encoding: gzip")
    until_close = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nto the end"

    async def bodies() -> tuple[list[bytes], int]:
        script = (chunked, informational, zipped, (until_close, True), answer(b"new"))
        async with scripted(*script) as server, client() as http:
            answers = [await send(http, server.url) for _ in range(5)]
        return [a.content for a in answers], server.connections

    contents, connections = run(bodies())
    assert contents == [b'{"a": 1}', b"after 100", b'{"zipped": true}', b"to the end", b"new"]
    assert connections == 2  # kept alive until the server closed it


def _chunked(body: bytes, size: int = 1 << 16) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size)]
    return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"".join(parts) + b"0\r\n\r\n"


@pytest.mark.parametrize(
    ("script", "connections"),
    [
        (answer(b"x" * (3 << 20)), 2),
        (_chunked(b"x" * (3 << 20)), 2),  # no length said: counted as it comes
        # 200 KB that inflate to 200 MB: read whole, so the connection is still good
        (answer(gzip.compress(b"\0" * (200 << 20)), "Content-Encoding: gzip"), 1),
        (answer(zlib.compress(b"\0" * (200 << 20)), "Content-Encoding: deflate"), 1),
    ],
    ids=["length", "chunked", "gzip bomb", "deflate bomb"],
)
def test_an_answer_over_the_size_limit_is_refused_once_without_holding_it_whole(
    monkeypatch: pytest.MonkeyPatch, script: bytes, connections: int
) -> None:
    """A body past DEEPLINE_MAX_RESPONSE_MB (a download, a runaway export, a compressed bomb)
    fails the call for good, saying the limit and how to raise it: it is not asked again
    (the same answer would come, and be paid again), nor decoded whole, nor stored. A body
    left unread closes its connection; the next request opens another."""
    monkeypatch.setenv("DEEPLINE_MAX_RESPONSE_MB", "1")

    async def big() -> tuple[int, int]:
        async with scripted(script, answer(b"next")) as server, client() as http:
            with pytest.raises(ToolExecutionError) as failure:
                await send(http, server.url, retries=3)
            error = failure.value
            assert (error.category, error.retryable) == ("upstream", False), error
            assert "over 1 MB" in str(error) and "DEEPLINE_MAX_RESPONSE_MB" in str(error), str(error)
            assert (await send(http, server.url)).content == b"next"
        return len(server.requests), server.connections

    tracemalloc.start()
    try:
        requests, opened = run(big())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (requests, opened) == (2, connections)
    assert peak < len(script) + (8 << 20), peak  # never the whole decoded body


def test_an_answer_whose_length_is_over_the_limit_is_refused_at_its_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Content-Length over the limit fails the call as its head arrives: nothing of its
    body is waited for or held (calls in flight would each hold up to the limit)."""
    monkeypatch.setenv("DEEPLINE_MAX_RESPONSE_MB", "1")
    head_only = b"HTTP/1.1 200 OK\r\ncontent-length: 104857600\r\n\r\n" + b"x" * 1000  # the rest never comes

    async def refused() -> None:
        async with scripted(head_only) as server, client() as http:
            await send(http, server.url, timeout_s=3, retries=2)

    with pytest.raises(ToolExecutionError) as failure:
        run(refused())
    assert (failure.value.category, failure.value.retryable) == ("upstream", False)
    assert "over 1 MB" in str(failure.value)


@pytest.mark.parametrize("over", [1, 5000, 3 << 20])
@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_an_answer_just_over_the_limit_is_refused_whatever_read_ends_it(
    monkeypatch: pytest.MonkeyPatch, over: int, framing: str
) -> None:
    """The read that crosses the limit may end the answer too: refused all the same, never
    given back as an empty 200 (a paid answer stored as nothing)."""
    monkeypatch.setenv("DEEPLINE_MAX_RESPONSE_MB", "1")
    body = b"x" * ((1 << 20) + over)
    script = answer(body) if framing == "length" else _chunked(body, size=len(body))

    async def once() -> bytes:
        async with scripted(script, answer(b"next")) as server, client() as http:
            with pytest.raises(ToolExecutionError) as failure:
                await send(http, server.url)
            assert (failure.value.category, failure.value.retryable) == ("upstream", False)
            return (await send(http, server.url)).content

    assert run(once()) == b"next"


def test_an_answer_at_the_size_limit_is_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPLINE_MAX_RESPONSE_MB", "1")
    body = b"y" * (1 << 20)

    async def exact() -> list[bytes]:
        script = (answer(body), answer(gzip.compress(body), "Content-Encoding: gzip"), _chunked(body))
        async with scripted(*script) as server, client() as http:
            return [(await send(http, server.url)).content for _ in range(3)]

    assert run(exact()) == [body, body, body]


@pytest.mark.parametrize("given", ["lots", "0", "-1", "1e-7", "1e13", "nan"])
def test_a_size_limit_out_of_its_range_says_so(monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    monkeypatch.setenv("DEEPLINE_MAX_RESPONSE_MB", given)
    with pytest.raises(UsageError, match="DEEPLINE_MAX_RESPONSE_MB must be a number of megabytes"):
        call("http://127.0.0.1:9/x")


def test_a_head_answer_ends_at_its_head_whatever_length_it_names() -> None:
    """A HEAD's answer names the length of a body it never sends: read up to its head, and
    the connection is not used again (what follows on it would be misread)."""

    async def head_then_get() -> tuple[Response, Response, int]:
        async with (
            scripted(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", answer(b"next")) as server,
            client() as http,
        ):
            first = await send(http, server.url, method="HEAD")
            second = await send(http, server.url)
        return first, second, server.connections

    first, second, connections = run(head_then_get())
    assert (first.status_code, first.content, first.headers["content-length"]) == (200, b"", "5")
    assert (second.content, connections) == (b"next", 2)


@pytest.mark.parametrize(
    ("script", "said"),
    [
        (b"HTTP/1.1 2xx Nope\r\n\r\n", "the server broke HTTP/1.1"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nonly4", "in the middle of its answer"),
        (b"", "before answering"),
    ],
    ids=["malformed", "cut short", "nothing"],
)
def test_a_broken_or_cut_answer_is_a_transient_network_error(script: bytes, said: str) -> None:
    async def broken() -> None:
        async with scripted((script, True)) as server, client() as http:
            await send(http, server.url)

    with pytest.raises(ProviderTransientError) as failure:
        run(broken())
    assert failure.value.category == "network"
    assert said in str(failure.value)


def test_a_declared_content_length_is_the_body_s_or_the_request_is_not_sent(provider: Provider) -> None:
    """A length that is not the body's would leave bytes on a kept-alive connection, read by
    the server as the start of the next request (another row's call)."""
    with pytest.raises(ToolExecutionError) as failure:
        call(f"{provider.url}/x", method="POST", json={"a": 1}, headers={"Content-Length": "1"})
    assert "header 'Content-Length' says 1 bytes but the body has 7" in str(failure.value)
    answer = call(f"{provider.url}/x", method="POST", json={"a": 1}, headers={"Content-Length": "7"})
    assert answer.status_code == 200 and provider.requests[-1].body == {"a": 1}
    assert provider.connections == 1


def test_a_redirect_that_drops_the_body_drops_its_declared_length(provider: Provider) -> None:
    provider.script("/found", ["302:/as-get"])
    answer = call(f"{provider.url}/found", method="POST", json={"a": 1}, headers={"Content-Length": "7"})
    assert answer.status_code == 200
    assert [(r.method, r.path, r.headers.get("content-length")) for r in provider.requests] == [
        ("POST", "/found", "7"),
        ("GET", "/as-get", None),
    ]


@pytest.mark.parametrize(
    ("method", "headers", "body"),
    [
        ("GET", {}, b""),
        ("POST", {"X-Api-Key": "k", "Content-Type": "application/json"}, b'{"a":1}'),
        ("POST", {"Transfer-Encoding": "chunked"}, b'{"a":1}'),
        ("PUT", {"Transfer-Encoding": "chunked"}, b""),
    ],
    ids=["get", "post", "chunked", "chunked-empty"],
)
def test_a_request_is_written_byte_for_byte_as_h11_writes_it(method: str, headers: dict[str, str], body: bytes) -> None:
    request = build(method, "http://127.0.0.1:8080/v1/x?q=1", headers, {"p": "2"}, body)
    head = request.head
    conn = h11.Connection(h11.CLIENT)
    event = h11.Request(method=head.method, target=head.target, headers=list(head.headers))
    expected = conn.send(event) + (conn.send(h11.Data(data=body)) if body else b"")
    expected += conn.send(h11.EndOfMessage())  # chunked: the closing chunk

    assert _wire(request) == expected


# Bytes where the rules of a request head differ: separators, controls, spaces, obs-text;
# mostly drawn from well-formed parts, so that heads h11 accepts are common too.
_TRICKY = st.binary(max_size=12) | st.text(alphabet='aZ09-_.:;, \t\r\n\x00\x7f\x80é(){}"/', max_size=8).map(
    lambda t: t.encode("utf-8")
)


def _mostly(*good: bytes, odd: st.SearchStrategy[bytes] = _TRICKY) -> st.SearchStrategy[bytes]:
    """A well-formed part four times in five, else an odd one."""
    return st.sampled_from([*good, *good, *good, *good, None]).flatmap(lambda g: odd if g is None else st.just(g))


_NAMES = _mostly(b"content-length", b"Content-Length", b"Transfer-Encoding", b"X-Key", odd=_TRICKY | st.just(b"Host"))
_VALUES = _mostly(
    b"5", b" 5 , 5", b"5, 6", b"chunked", b"CHUNKED", b"gzip", b"a  b", b"a\tb", b"a \t b", b"a\x80b", b""
)
_SOUND = [
    (b"Content-Length", b"5"),
    (b"content-length", b" 5 , 5"),
    (b"content-length", b"5, 5"),
    (b"Content-Length", b"1" * 20),
    (b"Content-Length", b"1" * 21),
    (b"Transfer-Encoding", b"CHUNKED"),
    (b"Transfer-Encoding", b"chunked"),
    (b"X-Key", b"a\tb"),
    (b"X-Key", b"a \t b"),
    (b"X-Key", b"a\x80b"),
    (b"X-Key", b""),
]
_HEADER = st.sampled_from([*_SOUND, None]).flatmap(lambda h: st.tuples(_NAMES, _VALUES) if h is None else st.just(h))


@settings(max_examples=1500, deadline=None)
@given(
    method=_mostly(b"GET", b"POST", b"PATCH"),
    target=_mostly(b"/v1/x?q=1", b"/", b"/a b"),
    host=st.sampled_from([1, 1, 1, 1, 0, 2]),
    headers=st.lists(_HEADER, max_size=3),
)
def test_a_request_head_is_refused_where_h11_refuses_it_and_written_as_h11_writes_it(
    method: bytes, target: bytes, host: int, headers: list[tuple[bytes, bytes]]
) -> None:
    """The hand-written check against h11's own, on the bytes where their rules bite."""
    headers = [(b"Host", b"example.com")] * host + headers
    try:
        theirs = h11.Request(method=method, target=target, headers=headers)
    except h11.LocalProtocolError:
        with pytest.raises(ValueError):
            checked_head(method, target, headers)
        return
    ours = checked_head(method, target, headers)
    assert (ours.method, ours.target, list(ours.headers)) == (theirs.method, theirs.target, theirs.headers.raw_items())


def test_an_idle_connection_the_server_closed_is_not_reused() -> None:
    async def two() -> tuple[list[int], int]:
        async with scripted((answer(b"first"), True), answer(b"second")) as server, client() as http:
            first = await send(http, server.url)
            await asyncio.sleep(0.05)  # the server's close arrives while the connection is idle
            second = await send(http, server.url)
        return [first.status_code, second.status_code], server.connections

    assert run(two()) == ([200, 200], 2)


def test_a_kept_connection_the_server_closed_as_the_request_went_out_is_retried_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server closing kept connections (nginx's keepalive_requests) may close one just as
    the next request is written on it: the answer never comes, not a byte of it. It is a
    retry like any network error (counted, within `retries`: with none, the call fails), but
    at once on a new connection, without the backoff's wait."""

    async def two(retries: int) -> tuple[list[int], int, int, float]:
        connections = 0
        requests = 0
        handlers: list[asyncio.Task[Any]] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections, requests
            connections += 1
            first = connections == 1
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                while True:
                    await reader.readuntil(b"\r\n\r\n")
                    requests += 1
                    if first and requests == 2:
                        break  # the kept connection closes under the second request
                    writer.write(answer(b"ok"))
                    await writer.drain()
            writer.close()
            await writer.wait_closed()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            handlers.append(asyncio.current_task())  # type: ignore[arg-type]
            await serve(reader, writer)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with server:
            async with client() as http:
                first = await send(http, url)
                began = asyncio.get_running_loop().time()
                try:
                    second: Any = (await send(http, url, retries=retries)).status_code
                except ProviderTransientError as exc:
                    second = str(exc)
                took = asyncio.get_running_loop().time() - began
            await asyncio.wait_for(asyncio.gather(*handlers), 5)  # each saw the client close
        return [first.status_code, second], connections, requests, took

    monkeypatch.setenv("DEEPLINE_RETRY_BASE_S", "2")  # a backoff waited would show
    statuses, connections, requests, took = run(two(1))
    assert (statuses, connections, requests) == ([200, 200], 2, 3)
    assert took < 1.0  # no backoff
    statuses, connections, requests, _ = run(two(0))
    assert statuses[1] == "network error: the server closed a kept connection before answering", statuses
    assert (connections, requests) == (1, 2)


def test_a_new_connection_closed_before_answering_is_a_network_error_as_before() -> None:
    async def closed() -> None:
        async with scripted((b"", True)) as server, client() as http:
            await send(http, server.url, retries=0)

    with pytest.raises(ProviderTransientError) as failure:
        run(closed())
    assert "closed the connection before answering" in str(failure.value)


def test_an_undecodable_gzip_body_is_a_provider_error() -> None:
    async def broken() -> None:
        async with scripted(answer(b"not gzip at all", "Content-Encoding: gzip")) as server, client() as http:
            await send(http, server.url)

    with pytest.raises(ToolExecutionError) as failure:
        run(broken())
    assert (failure.value.category, failure.value.retryable) == ("upstream", False)


# --- resets and retries ---------------------------------------------------------------------


def test_a_reset_connection_is_retried_with_a_new_connection(provider: Provider) -> None:
    provider.script("/flaky", ["reset", "ok"])
    response = call(f"{provider.url}/flaky", method="POST", json={"x": 1}, retries=2)
    assert response.status_code == 200
    assert [r.path for r in provider.requests] == ["/flaky", "/flaky"]
    assert provider.connections == 2


def test_a_reset_without_retries_left_is_a_transient_network_error(provider: Provider) -> None:
    provider.script("/flaky", ["reset"])
    with pytest.raises(ProviderTransientError) as failure:
        call(f"{provider.url}/flaky")
    assert failure.value.category == "network"
    assert str(failure.value).startswith("network error: ")


def test_a_refused_connection_is_a_transient_network_error() -> None:
    with ProviderServer() as gone:
        port = gone.port
    with pytest.raises(ProviderTransientError) as failure:
        call(f"http://127.0.0.1:{port}/x")
    assert failure.value.category == "network"
    assert f"cannot connect to 127.0.0.1:{port}" in str(failure.value)


# --- the address check ----------------------------------------------------------------------


def test_an_address_check_sees_resolved_addresses_and_can_veto_the_connection(provider: Provider) -> None:
    checked: list[Any] = []

    def veto(address: Any) -> None:
        checked.append(address)
        if address.is_loopback:
            raise PermissionError(f"{address} is private")  # an OSError, yet not a failed connection

    with pytest.raises(PermissionError):
        call(f"http://localhost:{provider.port}/x", address_check=veto)
    assert provider.connections == 0

    call(f"http://localhost:{provider.port}/x", address_check=checked.append)
    assert ipaddress.ip_address("127.0.0.1") in checked
    assert provider.requests[0].headers["host"] == f"localhost:{provider.port}"


# --- TLS ------------------------------------------------------------------------------------


@pytest.fixture
def certificate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """A self-signed certificate for localhost, trusted by the shared TLS context."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    request = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost"]
    subprocess.run(
        ["openssl", *request, "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # tls_context() reads it on every call
    yield cert, key


def test_https_verifies_the_host_name_and_keeps_the_connection(certificate: tuple[Path, Path]) -> None:
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(*certificate)

    async def secure() -> tuple[list[bytes], int]:
        script = Scripted([(answer(b"one"), False), (answer(b"two"), False)])
        server = await asyncio.start_server(script.handle, "127.0.0.1", 0, ssl=server_tls)
        port = server.sockets[0].getsockname()[1]
        async with server, client() as http:
            answers = [await send(http, f"https://localhost:{port}/") for _ in range(2)]
            with pytest.raises(UsageError, match="certificate"):  # the same on every try: not retried
                await send(http, f"https://127.0.0.1:{port}/")  # the certificate names localhost only
        return [a.content for a in answers], script.connections

    assert run(secure()) == ([b"one", b"two"], 1)  # one handshake for both requests


def test_tls_connections_leave_no_socket_open_once_the_run_ends(certificate: tuple[Path, Path]) -> None:
    """A worker runs many runs, each on a loop of its own: the TLS connections of one (kept
    alive, failed to verify) must all be closed when it ends, not left to a shutdown
    timeout that outlives its loop."""
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(*certificate)

    async def one_run(port: int) -> None:
        async with client() as http:
            await send(http, f"https://localhost:{port}/")
            with pytest.raises(UsageError, match="certificate"):
                await send(http, f"https://127.0.0.1:{port}/")

    def client_sockets(port: int) -> int:
        """This process's sockets whose far end is the server's port: the client's side only
        (the server thread, in this process too, closes its own side on its own schedule)."""
        inodes = set()
        for fd in list(Path("/proc/self/fd").iterdir()):
            with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
                inodes.add(str(fd.readlink()).removeprefix("socket:[").removesuffix("]"))
        count = 0
        for table in ("tcp", "tcp6"):  # "localhost" may be tried over IPv6 first
            for line in Path(f"/proc/self/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                count += int(fields[2].rsplit(":", 1)[1], 16) == port and fields[9] in inodes
        return count

    async def serve(ready: threading.Event, port: list[int], stop: threading.Event) -> None:
        script = Scripted([(answer(b"ok"), False)] * 50)
        server = await asyncio.start_server(script.handle, "127.0.0.1", 0, ssl=server_tls)
        port.append(server.sockets[0].getsockname()[1])
        ready.set()
        async with server:
            while not stop.is_set():
                await asyncio.sleep(0.01)

    ready, stop, port = threading.Event(), threading.Event(), []  # type: ignore[var-annotated]
    thread = threading.Thread(target=lambda: asyncio.run(serve(ready, port, stop)))
    thread.start()
    try:
        ready.wait(10)
        for _ in range(6):
            run(one_run(port[0]))
        assert client_sockets(port[0]) == 0
    finally:
        stop.set()
        thread.join(10)


def test_a_request_waiting_for_a_free_connection_is_not_timed_out(provider: Provider) -> None:
    """6 requests on a pool of 2, each answered in 0.3 s with a timeout of 0.5 s: the last
    ones waited over 0.5 s for a connection and were failed as provider timeouts ("timed
    out after 0.5s"), though never sent. The timeout is the provider's time to answer."""
    provider.default_fault = "slow:0.3"

    async def crowded() -> list[int]:
        async with client(size=2) as http:
            answers = await asyncio.gather(*(send(http, f"{provider.url}/x/{n}", timeout_s=0.5) for n in range(6)))
        return [a.status_code for a in answers]

    assert run(crowded()) == [200] * 6
    assert len(provider.requests) == 6


def test_timeout_s_bounds_the_whole_answer_not_each_read() -> None:
    """A provider trickling its 20-byte body a byte every 0.05 s, with a timeout of 0.3 s: the
    timer started again at every byte, and the answer came after a second, not timed out."""

    done = asyncio.Event()

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 20\r\n\r\n")
            for byte in b'{"email":"a@b.co"}  ':
                if writer.is_closing():
                    break
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.05)
        except ConnectionError:
            pass  # the client gave up on it
        finally:
            writer.close()
            done.set()

    async def slow() -> BaseException | Response:
        server = await asyncio.start_server(trickle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, client() as http:
            (outcome,) = await asyncio.gather(
                send(http, f"http://127.0.0.1:{port}/", timeout_s=0.3), return_exceptions=True
            )
            await done.wait()
            return outcome

    outcome = run(slow())  # the whole answer takes a second: with a timer per read, it arrived
    assert isinstance(outcome, ProviderTransientError) and "timed out after 0.3s" in str(outcome), outcome


def test_a_request_that_waited_for_a_free_connection_is_checked_before_it_goes_out(provider: Provider) -> None:
    """The call's check (its lease, the run still dispatching, the store able to record it)
    was made before the wait for one of the pool's connections, which has no bound: calls
    that waited went out after the store went away, an interrupt or a lost lease."""
    provider.script("/busy", ["slow:0.3"])

    class Stopped(Exception):
        pass

    async def stopped() -> None:
        raise Stopped("the run stopped dispatching while this call waited")

    async def crowd() -> BaseException | Response:
        async with client(size=1) as http:
            busy = asyncio.create_task(send(http, f"{provider.url}/busy"))
            await asyncio.sleep(0.05)
            waiting = http.pool.request("GET", f"{provider.url}/next", headers={}, params=None, json=None,
                                        timeout_s=5, ready=stopped)  # fmt: skip
            (outcome,) = await asyncio.gather(waiting, return_exceptions=True)
            await busy
            return outcome

    assert isinstance(run(crowd()), Stopped)
    assert [r.path for r in provider.requests] == ["/busy"]


def test_a_call_whose_lease_went_while_its_connection_was_made_is_not_sent(
    provider: Provider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ready` (the lease, the store, the run) was asked once a connection slot was free,
    before a new connection was made: a process paused while connecting (SIGSTOP past its
    lease, its run taken over) sent the request when it woke. It is asked again once the
    connection is made."""
    from deepline_cli.runtime.providers import transport as transport_module

    made = transport_module.Transport._connect

    async def slow_connect(self: Any, *args: Any, **kwargs: Any) -> Any:
        connection = await made(self, *args, **kwargs)
        await asyncio.sleep(0.05)  # the moment a paused process would spend here
        return connection

    monkeypatch.setattr(transport_module.Transport, "_connect", slow_connect)
    asked: list[int] = []

    async def ready() -> None:
        asked.append(1)
        if len(asked) > 1:
            raise RuntimeError("the lease was lost")

    async def once() -> None:
        async with client() as http:
            await http.pool.request(
                "GET", f"{provider.url}/x", headers={}, params=None, json=None, timeout_s=5, ready=ready
            )

    with pytest.raises(RuntimeError, match="the lease was lost"):
        run(once())
    assert provider.requests == []


def test_the_certificates_that_cannot_be_loaded_are_the_ones_named(tmp_path: Path) -> None:
    """SSL_CERT_FILE not a certificate, beside a good SSL_CERT_DIR (as many machines set it):
    the error named both."""
    from deepline_cli.runtime.providers.transport import BadSettings, _tls_context

    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    folder = tmp_path / "certs"
    folder.mkdir()
    with pytest.raises(BadSettings) as bad_file:
        _tls_context(str(junk), str(folder))
    assert f"SSL_CERT_FILE={junk}" in str(bad_file.value) and "SSL_CERT_DIR" not in str(bad_file.value)
    assert _tls_context(None, str(folder)) is not None  # an empty folder of certificates is no error
    # One that is not a folder is left out, as httpx does (the system's authorities still
    # answer for public providers); a certificate it was to vouch for names it.
    assert _tls_context(None, str(tmp_path / "nowhere")) is not None


def test_a_urls_headers_are_read_once_and_each_request_gets_them_whole() -> None:
    """A URL's Host, defaults and Basic credentials are read once per URL: a request's own
    headers (an Authorization among them) never change what the next request to it gets,
    and the URL's credentials still win over a request's own Authorization."""
    url = "http://svc:pw@127.0.0.1:8080/v1/x"
    first = build("POST", url, {"Authorization": "Bearer mine", "X-One": "1", "accept": "text/plain"}, {}, b"{}")
    second = build("GET", url, {}, {}, b"")
    names = [name for name, _ in first.head.headers]
    assert names[:5] == [b"Host", b"accept", b"Accept-Encoding", b"Connection", b"User-Agent"], names
    got = dict(first.head.headers)
    assert got[b"Host"] == b"127.0.0.1:8080" and got[b"accept"] == b"text/plain"
    assert got[b"Authorization"] == b"Basic " + base64.b64encode(b"svc:pw")
    assert got[b"X-One"] == b"1" and got[b"Content-Length"] == b"2"
    again = dict(second.head.headers)
    assert again[b"Accept"] == b"*/*" and b"X-One" not in again and b"Content-Length" not in again
    assert again[b"Authorization"] == b"Basic " + base64.b64encode(b"svc:pw")


class BigAnswer(Provider):
    """Answers every call with ~6 MB of JSON (as gzip when `gzipped`): tens of ms to read."""

    gzipped: bool = False

    def answer(self, seen: Seen) -> tuple[int, dict[str, str], bytes]:
        body = json.dumps({"rows": [{"n": n, "name": f"person {n}", "tags": ["a", "b"]} for n in range(120_000)]})
        if self.gzipped:
            return 200, {"content-type": "application/json", "content-encoding": "gzip"}, gzip.compress(body.encode())
        return 200, {"content-type": "application/json"}, body.encode()


@pytest.mark.parametrize("gzipped", [False, True])
def test_reading_a_large_http_answer_counts_as_holding_the_event_loop(tmp_path: Path, gzipped: bool) -> None:
    """An HTTP tool's answer that takes long to read (inflate, parse) holds the event loop as
    a play's blocking code does: the time goes with the call (`held_s`), so its answer is
    committed as it returns (WriteQueue.settle), not left for a kill meanwhile to lose."""
    from deepline_cli.runtime.providers.config import load_config
    from deepline_cli.runtime.providers.http import HttpTools
    from deepline_cli.runtime.providers.tools import ToolCall

    provider = BigAnswer()
    provider.gzipped = gzipped
    with ProviderServer(provider) as big:
        (tmp_path / "deepline.toml").write_text(f'[tools."big.read"]\nurl = "{big.url}/v1/big"\n')
        call = ToolCall(idempotency_key="dl-k", run_id="r", attempt=1, receipt_key="k")

        async def invoke() -> Any:
            http = Http(Transport(8), Secrets(), Governor())
            try:
                definition = HttpTools(load_config(tmp_path / "deepline.toml"), http).definition("big.read")
                assert definition is not None
                return await definition.invoke({}, call)
            finally:
                await http.pool.aclose()

        answer = run(invoke())
    assert len(answer["rows"]) == 120_000
    body = json.dumps(answer).encode()
    # What parsing that much JSON takes on this machine: the quicker of two (a busy machine,
    # another test's work, a collection, only makes one slower), so the bound cannot flake.
    parse_s = math.inf
    for _ in range(2):
        began = time.perf_counter()
        parsed = _json.loads_lenient(body)
        parse_s = min(parse_s, time.perf_counter() - began)
    assert parsed == answer
    assert call.held_s >= 0.5 * parse_s > 0, (call.held_s, parse_s)
