"""HTTP/1.1 for provider calls: keep-alive connections pooled per origin, one request at a time.

`Http` (http.py) decides what to retry and how to classify a failure; this module only
builds a request, sends it over a connection to its origin (scheme, host, port) and
reads the answer, straight from an asyncio protocol: each request is checked as h11 (the
HTTP/1.1 engine under httpx and httpcore) checks one and written in one piece, and llhttp
(Node's parser, through httptools) reads each answer as its bytes arrive. httpx's client layer was
most of a run's CPU, httpcore's connection layer still 1.75x this one's, and h11's state
machine a quarter of a run's CPU on a machine where the run waits on it (BENCHMARKS.md).

Errors: `InvalidRequest` (the request cannot be sent as given: nothing reached the
network), `InvalidResponse` (the provider's answer cannot be used), `TransportTimeout`
and `TransportError` (the connection failed: worth another attempt).
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import functools
import ipaddress
import math
import os
import re
import socket
import ssl
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, parse_qsl, quote, unquote, urlencode, urljoin, urlsplit

import httptools

from deepline_cli import __version__, _json

if TYPE_CHECKING:
    import h11

Origin = tuple[str, str, int]  # scheme, host, port
Route = tuple[Origin, str]  # an origin and the proxy reaching it ("" for none): what a connection is kept for
AddressCheck = Callable[[ipaddress.IPv4Address | ipaddress.IPv6Address], None]

KEEPALIVE_S = 30.0
# The largest body an answer may have, decoded (DEEPLINE_MAX_RESPONSE_MB): an enrichment
# answer is kilobytes; one of hundreds of megabytes (a download, a runaway export, a
# compressed bomb) would be held whole, parsed and stored on its receipt.
MAX_RESPONSE_MB = 64
MAX_REDIRECTS = 20
_DEFAULT_PORTS = {"http": 80, "https": 443}
Given = dict[str, tuple[str, str]]  # headers by lower-case name: (name as written, value)
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# What httpx percent-encodes in a path and in a query (the WHATWG URL sets); '%' is kept,
# so an escape already in a template stays as written.
_PATH_SAFE = "".join(chr(i) for i in range(0x21, 0x7F) if chr(i) not in '"#<>?`{}')
_QUERY_SAFE = "".join(chr(i) for i in range(0x21, 0x7F) if chr(i) not in '"#<>')
_DEFAULT_HEADERS = {
    "Accept": "*/*",
    "Accept-Encoding": "gzip, deflate",
    "Connection": "keep-alive",
    "User-Agent": f"deepline/{__version__}",
}


class InvalidRequest(ValueError):
    """The request cannot be sent as given (bad URL, header or query value)."""


class InvalidResponse(Exception):
    """The provider's answer cannot be used (a redirect loop, an undecodable body)."""


class TransportError(Exception):
    """The connection failed before a whole answer arrived."""


class ClosedUnanswered(TransportError):
    """The server closed the connection cleanly (a FIN) before a byte of its answer arrived."""


class StaleConnection(TransportError):
    """A kept connection the server closed cleanly, not a byte of an answer on it: most
    often closed as the request went out (a keep-alive limit). Retried at once, no backoff."""


class BadSettings(InvalidRequest):
    """The machine's settings keep the request from going out (a proxy URL that cannot be
    used, certificates that cannot be loaded or that do not vouch for the server): the
    user's to fix, not the call's failure, and not worth retrying."""


class ProxyRefused(BadSettings):
    """The proxy answered, but would not carry the request (407, 403…): not worth retrying."""


class TransportTimeout(TransportError):
    """Connecting, or waiting for the answer, took longer than allowed (a request is written
    in one go, so a stalled upload shows as a late answer). The wait for a free connection
    of the pool is not the provider's time: it has no bound."""


def tls_context() -> ssl.SSLContext:
    """One TLS context for every connection of the process: building one costs ~20-45 ms.
    Trusts the system's certificate authorities, and those of `SSL_CERT_FILE` and
    `SSL_CERT_DIR` when set (a company's own CA), as httpx and curl do."""
    return _tls_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.cache
def _tls_context(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if cafile:
        _trust(context, f"SSL_CERT_FILE={cafile}", cafile=cafile)
    if capath and os.path.isdir(capath):  # one that is not is left out, as httpx does (said if a certificate fails)
        _trust(context, f"SSL_CERT_DIR={capath}", capath=capath)
    context.set_alpn_protocols(["http/1.1"])
    return context


def _trust(context: ssl.SSLContext, named: str, **where: str) -> None:
    """Add the certificate authorities found `where` (a file or a folder) to `context`."""
    try:
        context.load_verify_locations(**where)
    except (OSError, ssl.SSLError) as exc:
        raise BadSettings(f"the certificates of {named} cannot be loaded ({exc}); fix or unset it") from None


# --- proxies -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Proxy:
    """An HTTP proxy (`http://[user:password@]host:port`): plain http requests go to it in
    absolute form, https ones through a CONNECT tunnel."""

    url: str
    host: str
    port: int
    authorization: str | None  # the Proxy-Authorization header, from the URL's credentials

    @staticmethod
    def parse(url: str) -> Proxy:
        try:
            parts = urlsplit(url if "://" in url else "http://" + url)
            port = parts.port or 80
        except ValueError as exc:
            raise BadSettings(f"the proxy URL {_without_password(url)!r} is not valid ({exc})") from None
        if parts.scheme.lower() != "http" or not parts.hostname:
            raise BadSettings(
                f"the proxy {_without_password(url)!r} is not an http:// proxy (https and socks proxies are not "
                "supported); give an http:// one (HTTP_PROXY / HTTPS_PROXY / ALL_PROXY or the tool's `proxy`), "
                'or send this host direct (NO_PROXY, or `proxy = ""` for the tool)'
            )
        authorization = None
        if parts.username is not None:
            credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            authorization = "Basic " + base64.b64encode(credentials).decode()
        return Proxy(_without_password(url), parts.hostname, port, authorization)


def _without_password(url: str) -> str:
    try:
        parts = urlsplit(url if "://" in url else "http://" + url)
        password = parts.password
    except ValueError:  # not even a URL Python can split: whatever follows a ':' before '@' hidden
        return re.sub(r"://([^:/@]*):[^@]*@", r"://\1:***@", url)
    if password is None:
        return url
    return url.replace(f":{password}@", ":***@", 1)


class Proxies:
    """Which proxy a request goes through: the one given for its tool (`proxy = "…"` in
    deepline.toml; "" for none), else the environment's, read as httpx's trust_env reads it:
    `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` (lower-case names too), and `NO_PROXY` for the
    hosts that go direct (names, domain suffixes, addresses, `*`)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        found = _proxies_from(dict(os.environ if environ is None else environ))
        # Read when a request goes through one: a socks proxy set for other programs stops
        # only the requests that would use it (BadSettings), not every run.
        self._by_scheme = {scheme: url for scheme, url in found.items() if scheme in ("http", "https", "all")}
        self._no_proxy = found.get("no", "")

    def route(self, origin: Origin, given: str | None) -> Proxy | None:
        if given is not None:
            return _parsed(given) if given else None
        scheme, host, port = origin
        url = self._by_scheme.get(scheme) or self._by_scheme.get("all")
        if url is None or _bypassed(host, port, self._no_proxy):
            return None
        return _parsed(url)


@functools.lru_cache(maxsize=64)
def _parsed(url: str) -> Proxy:
    return Proxy.parse(url)


def _proxies_from(environ: dict[str, str]) -> dict[str, str]:
    """`{scheme: url}` from *_PROXY variables; a lower-case name wins over an upper-case one."""
    found: dict[str, str] = {}
    for name, value in environ.items():
        if name.upper().endswith("_PROXY") and value and (name.islower() or name.lower() not in environ):
            found[name[: -len("_proxy")].lower()] = value.strip()
    return found


def _bypassed(host: str, port: int, no_proxy: str) -> bool:
    """Does NO_PROXY send this host direct?"""
    host = host.strip("[]")
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        name, entry_port = _no_proxy_entry(entry)
        if entry_port and entry_port != str(port):
            continue
        name = name.lstrip("*").lstrip(".")  # `*.corp.com` and `.corp.com`: the domain and its hosts
        if host == name or host.endswith("." + name) or _in_network(host, name):
            return True
    return False


def _no_proxy_entry(entry: str) -> tuple[str, str]:
    """A NO_PROXY entry's host (a name, a domain, an address or a network) and port, if it
    gives one: `host`, `host:port`, `[v6]`, `[v6]:port`, or a bare IPv6 address."""
    if entry.startswith("["):
        name, _, rest = entry[1:].partition("]")
        return name, rest[1:] if rest.startswith(":") else ""
    if entry.count(":") == 1:
        name, _, port = entry.partition(":")
        return name, port
    return entry, ""


def _in_network(host: str, entry: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")) in ipaddress.ip_network(entry.strip("[]"), strict=False)
    except ValueError:
        return False


# --- building a request ------------------------------------------------------------------------


# What h11 (RFC 9110/9112) allows in a request it sends, checked the same way here without
# its event objects: a method and a header name are tokens, a target is visible ASCII, a
# header value is visible characters (obs-text included) with single spaces or tabs inside.
_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_FIELD_VALUE = re.compile(rb"(?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?")
_CONTENT_LENGTH = re.compile(rb"[0-9]{1,20}")


@dataclass(slots=True)  # one or more per request: not frozen (its fields set three times slower)
class Head:
    """A request's line and headers as they go on the wire, checked (`checked_head`)."""

    method: bytes
    target: bytes
    headers: tuple[tuple[bytes, bytes], ...]  # (name as given, value)
    chunked: bool  # Transfer-Encoding: chunked (the body goes in chunks)


@functools.lru_cache(maxsize=4096)
def _is_token(name: bytes) -> bool:
    """A header name or method as HTTP allows it: the same few, checked once each."""
    return _TOKEN.fullmatch(name) is not None


def checked_head(method: bytes, target: bytes, headers: Sequence[tuple[bytes, bytes]]) -> Head:
    """The head h11 would send for these parts, or ValueError where h11 refuses them: one
    Host header, Content-Length a single number (repeats that agree are one), at most one
    Transfer-Encoding and only `chunked` (its value lower-cased, as h11 writes it)."""
    if not _is_token(method):
        raise ValueError("illegal method characters")
    if not _TARGET.fullmatch(target):
        raise ValueError("illegal target characters")
    kept: list[tuple[bytes, bytes]] = []
    hosts, length, chunked = 0, None, False
    for name, value in headers:
        if not _is_token(name) or not _FIELD_VALUE.fullmatch(value):
            raise ValueError("illegal header")
        lower = name.lower()
        if lower == b"host":
            hosts += 1
        elif lower == b"content-length":
            lengths = {part.strip() for part in value.split(b",")}
            value = lengths.pop()
            if lengths or not _CONTENT_LENGTH.fullmatch(value) or length not in (None, value):
                raise ValueError("bad or conflicting Content-Length")
            if length is not None:
                continue
            length = value
        elif lower == b"transfer-encoding":
            value = value.lower()
            if chunked or value != b"chunked":
                raise ValueError("only one Transfer-Encoding: chunked is supported")
            chunked = True
        kept.append((name, value))
    if hosts != 1:
        raise ValueError("a request needs exactly one Host header")
    return Head(method, target, tuple(kept), chunked)


@dataclass(slots=True)  # one or more per request: not frozen (its fields set three times slower)
class Outgoing:
    """A request ready for the wire, with what a redirect needs to build the next one."""

    method: str
    url: str
    origin: Origin
    head: Head
    body: bytes
    headers: Mapping[str, str]
    private: frozenset[str] = frozenset()  # headers (lower case) holding a secret: kept to their origin
    private_body: bool = False  # the body holds a secret: never sent on to another origin

    def redirected(self, status: int, location: str) -> Outgoing:
        """The request a redirect asks for, as httpx builds it; to another origin, without
        `Authorization` nor any header holding a secret (`X-Api-Key`)."""
        method = self.method
        if (status in (302, 303) and method != "HEAD") or (status == 301 and method == "POST"):
            method = "GET"
        url = urljoin(self.url, location)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "cookie"}
        elsewhere = _origin_of(url) != self.origin and not _is_https_upgrade(self.origin, url)
        if elsewhere:
            headers = {
                k: v for k, v in headers.items() if k.lower() != "authorization" and k.lower() not in self.private
            }
        body = b"" if method == "GET" and method != self.method else self.body
        if elsewhere and body and self.private_body:  # a 307/308 would send the secret to that host
            raise InvalidResponse(
                f"redirected to another host ({urlsplit(url).netloc}) with a body holding a secret: not followed"
            )
        if not body and self.body:  # the body is dropped: its framing goes with it (as httpx does)
            headers = {k: v for k, v in headers.items() if k.lower() not in ("content-length", "transfer-encoding")}
        try:
            return replace(
                build(method, url, headers, None, body), private=self.private, private_body=self.private_body
            )
        except InvalidRequest as exc:
            raise InvalidResponse(f"redirected to a URL that cannot be requested: {exc}") from None


def build(method: str, url: str, headers: Mapping[str, str], params: Mapping[str, Any] | None, body: bytes) -> Outgoing:
    """Check and encode a request; nothing here touches the network."""
    method = method.upper()
    parts, origin, target, given, basic = _place(url)
    if params:
        target = _target(parts, params)
    wire = _headers(given, basic, headers, method, body)
    try:
        head = checked_head(method.encode("ascii"), target, wire)
    except ValueError:  # UnicodeEncodeError too: a method that is not ASCII
        raise InvalidRequest(_what_is_invalid(method, headers)) from None
    return Outgoing(method, url, origin, head, body, headers)


@functools.lru_cache(maxsize=1024)
def _place(url: str) -> tuple[SplitResult, Origin, bytes, Given, tuple[str, str] | None]:
    """A URL's parts, origin, target (before any params), the headers it gives every request
    and its Basic credentials (`_url_headers`): read once for the URL a tool asks on every call."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise InvalidRequest(f"the URL is not valid ({exc})") from None
    origin = _origin(parts)
    return parts, origin, _target(parts, None), *_url_headers(parts, origin)


def _absolute(request: Outgoing, proxy: Proxy) -> Outgoing:
    """A plain http request as sent to a proxy: the whole URL as its target, and the
    proxy's credentials."""
    scheme, host, port = request.origin
    netloc = f"[{host}]" if ":" in host else host
    target = f"{scheme}://{netloc}:{port}".encode("ascii") + request.head.target
    headers = list(request.head.headers)
    if proxy.authorization:
        headers.append((b"Proxy-Authorization", proxy.authorization.encode("ascii")))
    try:
        head = checked_head(request.head.method, target, headers)
    except ValueError:
        raise InvalidRequest(
            "the request cannot be sent through the proxy: its URL or the proxy's credentials are not valid"
        ) from None
    return Outgoing(request.method, request.url, request.origin, head, request.body, request.headers)


def _origin(parts: SplitResult) -> Origin:
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise InvalidRequest(
            f"unsupported URL scheme {scheme!r}: only http and https can be requested"
            if scheme
            else "the URL has no http:// or https:// scheme"
        )
    if not parts.hostname:
        raise InvalidRequest("the URL has no host")
    try:
        port = parts.port or _DEFAULT_PORTS[scheme]
        host = parts.hostname if parts.hostname.isascii() else parts.hostname.encode("idna").decode("ascii")
    except (ValueError, UnicodeError) as exc:
        raise InvalidRequest(f"the URL's host or port is not valid ({exc})") from None
    if not host.isprintable() or any(c.isspace() for c in host):
        raise InvalidRequest("the URL's host is not valid: it holds a space or a control character")
    return scheme, host, port


def _origin_of(url: str) -> Origin | None:
    try:
        return _origin(urlsplit(url))
    except InvalidRequest:
        return None


def _is_https_upgrade(origin: Origin, url: str) -> bool:
    new = _origin_of(url)
    return new is not None and origin[0] == "http" and new == ("https", origin[1], 443) and origin[2] == 80


def _target(parts: SplitResult, params: Mapping[str, Any] | None) -> bytes:
    path = quote(_without_dot_segments(parts.path) or "/", safe=_PATH_SAFE)
    query = _merged_query(parts.query, params) if params else quote(parts.query, safe=_QUERY_SAFE)
    return (path + "?" + query if query else path).encode("ascii")


def _without_dot_segments(path: str) -> str:
    """'/a/./b/../c' -> '/a/c' (RFC 3986 5.2.4), so a template value cannot climb the path."""
    if "." not in path:
        return path
    kept: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if len(kept) > 1:
                kept.pop()
        elif segment != ".":
            kept.append(segment)
    return "/".join(kept) if kept != [""] else "/"


def _merged_query(query: str, params: Mapping[str, Any]) -> str:
    """The URL's own query, then `params` (a name in both takes the value from `params`)."""
    kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k not in params]
    added = [(str(k), _query_value(k, item)) for k, v in params.items() for item in _as_list(v)]
    return urlencode(kept + added)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _query_value(name: Any, value: Any) -> str:
    # JSON-style booleans and an empty null, as httpx sends them.
    if value is True or value is False:
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, str | int | float):
        return str(value)
    raise InvalidRequest(f"query parameter {name!r} is a {type(value).__name__}, not a string, number or list")


def _url_headers(parts: SplitResult, origin: Origin) -> tuple[Given, tuple[str, str] | None]:
    """The headers a URL gives every request to it, by lower-case name (its Host, deepline's
    defaults), and the Authorization its Basic credentials make, if it holds any (put in after
    the request's own headers: they win over an Authorization of its own)."""
    scheme, host, port = origin
    netloc = f"[{host}]" if ":" in host else host
    given = {"host": ("Host", netloc if parts.port in (None, _DEFAULT_PORTS[scheme]) else f"{netloc}:{port}")}
    given |= {k.lower(): (k, v) for k, v in _DEFAULT_HEADERS.items()}
    if parts.username is None:
        return given, None
    credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
    return given, ("Authorization", "Basic " + base64.b64encode(credentials).decode())


def _headers(
    given: Given, basic: tuple[str, str] | None, headers: Mapping[str, str], method: str, body: bytes
) -> list[tuple[bytes, bytes]]:
    merged = dict(given)  # a copy: the URL's own are kept as read, for its next request
    merged |= {str(k).lower(): (str(k), _header_value(k, v)) for k, v in headers.items()}
    if basic is not None:
        merged["authorization"] = basic
    if body:
        merged.setdefault("content-type", ("Content-Type", "application/json"))
    _frame(merged, body, method)
    try:
        return [(name.encode("ascii"), value.encode("ascii")) for name, value in merged.values()]
    except UnicodeEncodeError:
        raise InvalidRequest(_what_is_invalid(method, headers)) from None


def _frame(merged: dict[str, tuple[str, str]], body: bytes, method: str) -> None:
    """The body's framing: its length, or chunks when the play asked for them. A declared
    length that is not the body's is refused: the bytes it leaves over on a kept-alive
    connection would be read by the server as the start of the next request."""
    declared = merged.get("content-length")
    if "transfer-encoding" in merged:
        if declared is not None:
            raise InvalidRequest("a request cannot declare both Content-Length and Transfer-Encoding")
        return
    length = str(len(body))
    if declared is not None:
        if {part.strip() for part in declared[1].split(",")} != {length}:
            raise InvalidRequest(f"header 'Content-Length' says {declared[1]} bytes but the body has {length}")
    elif body or method in _BODY_METHODS:
        merged["content-length"] = ("Content-Length", length)


def _header_value(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"header {name!r} is a {type(value).__name__}, not a string")
    return value.strip(" \t")  # surrounding whitespace is not part of a value in HTTP


def _what_is_invalid(method: str, headers: Mapping[str, str]) -> str:
    """Which part was refused, named without its value (a header may carry a secret)."""
    for name, value in headers.items():
        if not name.isascii() or not name or any(c in name for c in ' \t\r\n\0:()<>@,;"/[]?={}\\'):
            return f"header name {name!r} is not valid"
        if not value.isascii():
            return f"header {name!r} has a non-ASCII value"
        if any(c in value for c in "\r\n\0"):
            return f"header {name!r} has a line break or NUL byte in its value"
    return f"method {method!r} or a header is not valid HTTP"


# --- the response ------------------------------------------------------------------------------


class Headers(Mapping[str, str]):
    """Response headers, case-insensitive; a repeated header's values joined with ', '."""

    def __init__(self, raw: Sequence[tuple[bytes, bytes]]) -> None:
        self._raw = raw
        self._values: dict[str, str] | None = None

    def _by_name(self) -> dict[str, str]:
        if self._values is None:
            values: dict[str, str] = {}
            for name, value in self._raw:
                key, text = name.decode("latin-1").lower(), _header_text(value)
                values[key] = f"{values[key]}, {text}" if key in values else text
            self._values = values
        return self._values

    def __getitem__(self, name: str) -> str:
        return self._by_name()[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name())

    def __len__(self) -> int:
        return len(self._by_name())


def _header_text(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")


@dataclass(slots=True)  # one or more per request: not frozen (its fields set three times slower)
class Response:
    status_code: int
    headers: Headers
    content: bytes
    held_s: float = 0.0  # how long reading its body held the event loop (joining, inflating it)

    @property
    def charset(self) -> str:
        """The charset its content type declares (UTF-8 when none or unknown), by its codec name."""
        return _charset(self.headers.get("content-type", ""))

    @property
    def text(self) -> str:
        """The body decoded with the charset of its content type (UTF-8 when none or unknown)."""
        return self.content.decode(self.charset, errors="replace")


def _charset(content_type: str) -> str:
    for param in content_type.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            try:
                return codecs.lookup(value.strip().strip("\"'")).name
            except LookupError:
                break
    return "utf-8"


def max_response_bytes() -> int:
    """The largest body an answer may have, decoded: DEEPLINE_MAX_RESPONSE_MB megabytes."""
    given = os.environ.get("DEEPLINE_MAX_RESPONSE_MB", "").strip()
    if not given:
        return MAX_RESPONSE_MB << 20
    try:
        megabytes = float(given)
    except ValueError:
        megabytes = math.nan
    if not (math.isfinite(megabytes) and 0.001 <= megabytes <= 1_000_000):
        raise BadSettings(
            f"DEEPLINE_MAX_RESPONSE_MB must be a number of megabytes from 0.001 to 1000000, not {given!r}"
        )
    return int(megabytes * (1 << 20))


def too_large(limit: int) -> InvalidResponse:
    return InvalidResponse(
        f"its body is over {limit / (1 << 20):g} MB (DEEPLINE_MAX_RESPONSE_MB raises the limit, "
        f"{MAX_RESPONSE_MB} by default)"
    )


def _decoded(content: bytes, encoding: str, limit: int) -> bytes:
    """The body without its content encodings (gzip, deflate; others are left as sent),
    refused once it is over `limit` bytes (inflated no further than that)."""
    for coding in reversed([c.strip().lower() for c in encoding.split(",")]):
        try:
            if coding in ("gzip", "x-gzip"):
                content = _inflated(content, zlib.MAX_WBITS | 16, limit)
            elif coding == "deflate":
                try:
                    content = _inflated(content, zlib.MAX_WBITS, limit)
                except zlib.error:  # some servers send raw deflate without the zlib header
                    content = _inflated(content, -zlib.MAX_WBITS, limit)
        except zlib.error as exc:
            raise InvalidResponse(f"the {coding} body cannot be decoded ({exc})") from None
    return content


def _inflated(content: bytes, wbits: int, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits)
    plain = inflater.decompress(content, limit + 1)
    if len(plain) > limit:
        raise too_large(limit)
    if not inflater.eof:
        raise zlib.error("incomplete or truncated stream")
    return plain


# --- one connection ----------------------------------------------------------------------------


class _Answer:
    """One response as llhttp reads it (httptools calls these as the bytes come); the 1xx
    answers before it are passed over. Parse errors are kept, to be raised by the waiter."""

    __slots__ = (
        "chunks", "complete", "error", "framed", "head_only", "headers", "keep_alive", "left", "limit", "parser",
        "status",
    )  # fmt: skip

    def __init__(self, head_only: bool, limit: int) -> None:
        self.head_only = head_only  # a HEAD's answer: its length names a body that never comes
        self.limit = self.left = limit  # the bytes its body may have, and has left
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.complete = False
        self.keep_alive = False
        self.framed = False  # its length or chunks say where it ends (else the server's close does)
        self.error: Exception | None = None
        self.parser = httptools.HttpResponseParser(self)

    def feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = exc

    def on_message_begin(self) -> None:
        if self.complete:  # bytes after the answer, never asked for: the connection is spoilt
            self.keep_alive = False
        else:  # the answer after a 1xx: its own headers
            self.headers, self.chunks, self.left = [], [], self.limit

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.complete:
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.complete:
            return
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        if self.status >= 200:
            self.framed = any(name.lower() in (b"content-length", b"transfer-encoding") for name, _ in self.headers)
            if not self.head_only and _length(self.headers) > self.limit:  # refused at its head: none of it held
                self.error = too_large(self.limit)
            if self.head_only:  # done at its head; llhttp would wait for the body: not reused
                self.complete, self.keep_alive = True, False

    def on_body(self, body: bytes) -> None:
        if not self.complete and self.error is None:
            self.left -= len(body)
            if self.left < 0:
                self.error, self.chunks = too_large(self.limit), []  # read no further, hold none of it
            else:
                self.chunks.append(body)

    def on_message_complete(self) -> None:
        if self.status >= 200:
            self.complete = True


def _length(headers: Sequence[tuple[bytes, bytes]]) -> int:
    """The body length an answer's head says (-1: none said; llhttp has checked its form)."""
    for name, value in headers:
        if name.lower() == b"content-length" and value.strip().isdigit():
            return int(value)
    return -1


def _wire(request: Outgoing) -> bytes:
    """The request as bytes, in one piece: its line, its checked headers, its body (in one
    chunk when the play asked for chunked transfer)."""
    head = request.head
    wire = [head.method, b" ", head.target, b" HTTP/1.1\r\n"]
    for name, value in head.headers:
        wire += (name, b": ", value, b"\r\n")
    wire.append(b"\r\n")
    body = request.body
    if head.chunked:
        wire += (b"%x\r\n" % len(body), body, b"\r\n0\r\n\r\n") if body else (b"0\r\n\r\n",)
    else:
        wire.append(body)
    return b"".join(wire)


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: each request written in one piece, the answer's
    bytes parsed by llhttp (httptools) as they arrive. A CONNECT to a proxy goes through h11."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.closed = False
        self.ended = False  # the server ended it cleanly (a FIN, not a reset or an error)
        self._feed: Callable[[bytes], None] | None = None  # who reads the bytes now (None: nobody asked)
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._feed is None:  # unasked-for bytes on an idle connection: never reuse it
            self.closed = True
            return
        self._feed(data)
        self._wake()

    def eof_received(self) -> None:
        self.ended = not self.closed
        self._lost()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost()

    def _lost(self) -> None:
        if not self.closed:
            self.closed = True
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def reusable(self, now: float) -> bool:
        return not self.closed and self._feed is None and now - self.idle_since < KEEPALIVE_S

    def close(self) -> None:
        """Drop the connection at once. A connection is closed only between requests (an
        idle one, or one an error ended), so nothing is left to flush; a TLS one is not
        shut down politely either: asyncio would wait for the server's reply up to its
        shutdown timeout, and a run's loop that ends first leaves the socket open."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    async def exchange(self, request: Outgoing, timeout_s: float, limit: int) -> Response:
        """Send the request in one write and read the whole answer (its body `limit` bytes at
        most); the connection is idle again after, unless the server or an error ended it."""
        answer = _Answer(request.method == "HEAD", limit)
        assert self.transport is not None
        self._feed = answer.feed
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s  # for the whole answer: one trickled a byte at a time too
        try:
            self.transport.write(_wire(request))
            while not answer.complete:
                if answer.error is not None:
                    break
                if self.closed:
                    if answer.status >= 200 and not answer.framed:
                        break  # its body ends where the connection does
                    if answer.status:
                        raise TransportError("the server closed the connection in the middle of its answer")
                    if self.ended:  # a clean close: the server was done with the connection
                        raise ClosedUnanswered("the server closed the connection before answering")
                    raise TransportError("the server closed the connection before answering")
                await self._readable(deadline - loop.time())
        except BaseException:
            self.closed = True  # half an exchange: never reused
            raise
        finally:
            self._feed = None
        if answer.error is not None:  # seen as it came, or in the read that ended the answer too
            self.closed = True
            if isinstance(answer.error, InvalidResponse):
                raise answer.error
            raise TransportError(f"the server broke HTTP/1.1 ({answer.error})")
        if not answer.keep_alive:
            self.closed = True
        self.idle_since = time.monotonic()
        encoding = _header(answer.headers, b"content-encoding")
        began = time.perf_counter()
        content = _decoded(b"".join(answer.chunks), encoding, limit) if answer.chunks else b""
        return Response(answer.status, Headers(answer.headers), content, time.perf_counter() - began)

    async def tunnel(self, origin: Origin, proxy: Proxy, timeout_s: float) -> None:
        """Ask the proxy for a tunnel to `origin` (CONNECT); after it, this connection starts
        again, to the origin, and TLS goes through the tunnel."""
        _, host, port = origin
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        headers = [(b"Host", authority.encode("ascii"))]
        if proxy.authorization:
            headers.append((b"Proxy-Authorization", proxy.authorization.encode("ascii")))
        assert self.transport is not None
        import h11  # only a tunnel speaks it: not imported by every run that sends a request

        conn = h11.Connection(h11.CLIENT)
        self._feed = conn.receive_data
        try:
            self.transport.write(
                conn.send(h11.Request(method="CONNECT", target=authority.encode("ascii"), headers=headers))
            )
            event = await self._next(conn, timeout_s)
            while isinstance(event, h11.InformationalResponse):
                event = await self._next(conn, timeout_s)
        finally:
            self._feed = None
        if not isinstance(event, h11.Response):
            raise TransportError(f"the proxy {proxy.url} closed the connection instead of opening a tunnel")
        if not 200 <= event.status_code < 300:
            reason = event.reason.decode("latin-1")
            refusal = f"the proxy {proxy.url} refused a tunnel to {authority} ({event.status_code} {reason})"
            if event.status_code >= 500:
                raise TransportError(refusal)  # it could not reach the host: worth another attempt
            raise ProxyRefused(refusal)

    async def _next(self, conn: h11.Connection, timeout_s: float) -> object:
        import h11

        while (event := conn.next_event()) is h11.NEED_DATA:
            if self.closed:
                conn.receive_data(b"")  # the proxy closed: h11 says so next
            else:
                await self._readable(timeout_s)
        return event

    async def _readable(self, timeout_s: float) -> None:
        if self.closed:
            raise TransportError("the server closed the connection before answering")
        if timeout_s <= 0:
            raise TransportTimeout("the server did not answer in time")
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        # The timer fails the waiter rather than cancelling the task: cheaper than
        # asyncio.timeout, and a cancellation from outside stays a cancellation.
        timer = loop.call_later(timeout_s, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None


@contextlib.contextmanager
def _connect_errors(host: str, port: int, timeout_s: float, what: str = "") -> Iterator[None]:
    try:
        yield
    except TimeoutError:  # before OSError: asyncio's timeout is one
        raise TransportTimeout(f"connecting to {what}{host}:{port} took over {timeout_s:g}s") from None
    except ssl.SSLCertVerificationError as exc:  # the same on every try: the machine's CAs to set
        folder = os.environ.get("SSL_CERT_DIR")
        missing = f" (SSL_CERT_DIR={folder} is not a folder)" if folder and not os.path.isdir(folder) else ""
        raise BadSettings(
            f"the certificate of {host}:{port} is not trusted ({exc.verify_message}); if a company CA signs it, "
            f"point SSL_CERT_FILE or SSL_CERT_DIR at it{missing}"
        ) from None
    except OSError as exc:
        raise TransportError(f"cannot connect to {what}{host}:{port}: {exc.strerror or exc}") from None


async def _resolved(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


async def _first_to_connect(addresses: list[str], port: int, tls_host: str | None) -> Connection:
    """A connection to the first address that accepts one; TLS checks `tls_host`'s certificate."""
    loop = asyncio.get_running_loop()
    for address in addresses[:-1]:
        with contextlib.suppress(OSError):
            return await _secured((await loop.create_connection(Connection, address, port))[1], tls_host)
    return await _secured((await loop.create_connection(Connection, addresses[-1], port))[1], tls_host)


async def _secured(connection: Connection, tls_host: str | None) -> Connection:
    """TLS over a connection made (when `tls_host` is given), checking its certificate. A
    failed handshake aborts the connection at once: asyncio, left to close it, waits up to
    its shutdown timeout, and a loop that ends first leaves the socket open."""
    if tls_host is None:
        return connection
    assert connection.transport is not None
    raw = connection.transport
    try:
        tls = await asyncio.get_running_loop().start_tls(raw, connection, tls_context(), server_hostname=tls_host)
    except BaseException:
        raw.abort()
        raise
    assert isinstance(tls, asyncio.Transport)
    connection.transport = tls
    return connection


async def _through(proxy: Proxy, origin: Origin, timeout_s: float) -> Connection:
    """A connection to `origin` by way of `proxy`: for https, a CONNECT tunnel with TLS to
    the origin inside it; for http, the connection to the proxy itself."""
    scheme, host, _ = origin
    with _connect_errors(proxy.host, proxy.port, timeout_s, what="the proxy "):
        connection = await _first_to_connect([proxy.host], proxy.port, None)
    if scheme != "https":
        return connection
    try:
        await connection.tunnel(origin, proxy, timeout_s)
    except BaseException:
        connection.close()
        raise
    with _connect_errors(host, origin[2], timeout_s):
        return await _secured(connection, host)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TransportTimeout("the server did not answer in time"))


def _header(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> str:
    return ", ".join(value.decode("latin-1") for key, value in headers if key.lower() == name)


# --- the pool ----------------------------------------------------------------------------------


class Transport:
    """Keep-alive connections for one run, kept per origin.

    At most `size` requests are in flight at once (a request waits for a slot at most its
    timeout). An idle connection is reused for its own origin only, while it is younger
    than KEEPALIVE_S and the server kept it open; at most `max_idle` stay open (4 x size
    by default: room for a waterfall's few providers, a bound on the sockets of a run that
    fetches from thousands of sites), the least recently used closed first.

    `address_check`, if given, sees every address a host name resolves to before a
    connection is made and may veto it by raising; the connection then goes to the checked
    address, with the host name still used for TLS and the Host header.
    """

    def __init__(
        self,
        size: int = 64,
        *,
        max_idle: int | None = None,
        address_check: AddressCheck | None = None,
        proxies: Proxies | None = None,
    ) -> None:
        self._slots = asyncio.Semaphore(size)
        self._max_idle = 4 * size if max_idle is None else max_idle
        self._idle: dict[Route, dict[Connection, None]] = {}
        self._oldest_idle: dict[Connection, Route] = {}  # insertion order: least recently used first
        self._address_check = address_check
        self._proxies = proxies if proxies is not None else Proxies()
        self._open: set[Connection] = set()  # every connection not closed yet, idle or in use
        self._closed = False

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        params: Mapping[str, Any] | None,
        json: Any,
        timeout_s: float,
        proxy: str | None = None,
        ready: Callable[[], Awaitable[None]] | None = None,
        private: frozenset[str] = frozenset(),
        private_body: bool = False,
    ) -> Response:
        """The answer, after following up to MAX_REDIRECTS redirects (as httpx does); `json`
        (when not None) is the body. `proxy`: the tool's own proxy URL ("" for none; None:
        the environment decides). `ready` is awaited once a connection is free, just before
        the request goes out (it raises when the call may no longer go out). `private`: the
        headers (lower case) a redirect to another origin leaves out (they hold a secret);
        `private_body`: the body holds one (a redirect to another origin that keeps it is refused)."""
        limit = self._body_limit  # a setting to fix: said before anything is sent (and read then only)
        outgoing = build(method, url, headers, params, b"" if json is None else _json.dumps(json))
        if private or private_body:
            outgoing = replace(outgoing, private=private, private_body=private_body)
        for _ in range(MAX_REDIRECTS + 1):
            response = await self._exchange(outgoing, timeout_s, proxy, ready, limit)
            location = response.headers.get("location") if response.status_code in _REDIRECTS else None
            if location is None:
                return response
            outgoing = outgoing.redirected(response.status_code, location)
        raise InvalidResponse(f"more than {MAX_REDIRECTS} redirects")

    async def _exchange(
        self,
        request: Outgoing,
        timeout_s: float,
        given_proxy: str | None,
        ready: Callable[[], Awaitable[None]] | None,
        limit: int,
    ) -> Response:
        proxy = self._proxies.route(request.origin, given_proxy)
        route: Route = (request.origin, proxy.url if proxy else "")
        if proxy is not None and request.origin[0] == "http":
            request = _absolute(request, proxy)  # to the proxy itself: the whole URL, and its credentials
        await self._slots.acquire()  # a free connection: waited for as long as it takes (not the provider's time)
        try:
            if ready is not None:  # the wait may have outlasted the lease, the store, the run
                await ready()
            connection = self._reused(route)
            kept = connection is not None
            if connection is None:
                connection = await self._connect(request.origin, timeout_s, proxy)
                self._open.add(connection)
            try:
                if not kept and ready is not None:  # connecting took a while (a process paused in it): again
                    await ready()
                response = await connection.exchange(request, timeout_s, limit)
            except ClosedUnanswered:
                if kept:  # the server was done with a kept connection (its keep-alive limit, its idle timeout)
                    raise StaleConnection("the server closed a kept connection before answering") from None
                raise
            finally:
                self._keep(route, connection)
        finally:
            self._slots.release()
        if response.status_code == 407 and proxy is not None:  # only a proxy says 407
            raise ProxyRefused(f"the proxy {proxy.url} refused the request (407 Proxy Authentication Required)")
        return response

    @functools.cached_property
    def _body_limit(self) -> int:
        return max_response_bytes()

    def _reused(self, route: Route) -> Connection | None:
        idle = self._idle.get(route)
        now = time.monotonic()
        while idle:
            connection, _ = idle.popitem()  # the most recently used: least likely closed by the server
            del self._oldest_idle[connection]
            if connection.reusable(now):
                return connection
            connection.close()
            self._open.discard(connection)
        return None

    def _keep(self, route: Route, connection: Connection) -> None:
        if self._closed or not connection.reusable(time.monotonic()):
            connection.close()
            self._open.discard(connection)
            return
        self._idle.setdefault(route, {})[connection] = None
        self._oldest_idle[connection] = route
        if len(self._oldest_idle) > self._max_idle:
            oldest, its_origin = next(iter(self._oldest_idle.items()))
            del self._oldest_idle[oldest], self._idle[its_origin][oldest]
            if not self._idle[its_origin]:
                del self._idle[its_origin]
            oldest.close()
            self._open.discard(oldest)

    async def _connect(self, origin: Origin, timeout_s: float, proxy: Proxy | None) -> Connection:
        scheme, host, port = origin
        deadline = asyncio.get_running_loop().time() + timeout_s
        addresses = [host]
        if self._address_check is not None:
            with _connect_errors(host, port, timeout_s):
                async with asyncio.timeout_at(deadline):
                    addresses = await _resolved(host, port)
            for address in addresses:  # outside the error mapping: a veto is raised as it is
                self._address_check(ipaddress.ip_address(address.partition("%")[0]))
            proxy = None  # a checked fetch goes to the address checked, never through a proxy
        if proxy is not None:
            async with asyncio.timeout_at(deadline):
                return await _through(proxy, origin, timeout_s)
        with _connect_errors(host, port, timeout_s):
            async with asyncio.timeout_at(deadline):
                return await _first_to_connect(addresses, port, host if scheme == "https" else None)

    async def aclose(self) -> None:
        """Close every connection, those a cancelled request left in use too."""
        self._closed = True
        for connection in self._open:
            connection.close()
        self._open.clear()
        self._idle.clear()
        self._oldest_idle.clear()
        await asyncio.sleep(0)  # the sockets close on the loop's next turn: let it come
