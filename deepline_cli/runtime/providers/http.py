"""Provider calls over HTTP: HTTP tools from `deepline.toml`, remote tools, `ctx.fetch`.

One connection pool per run (transport.py: keep-alive connections per origin), retries with
exponential backoff and jitter that honour `Retry-After`, errors sorted into the
categories of `ToolExecutionError`, and secrets redacted from everything kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import html
import ipaddress
import math
import os
import re
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from deepline_cli import _json
from deepline_cli._aio import count_held
from deepline_cli.backoff import delays
from deepline_cli.errors import (
    Category,
    DeeplineError,
    ProviderTransientError,
    ToolExecutionError,
    UsageError,
)
from deepline_cli.runtime.providers.config import Config, HttpToolSpec, RemoteSpec
from deepline_cli.runtime.providers.governor import Governor
from deepline_cli.runtime.providers.secrets import MIN_SECRET_LENGTH, Secrets
from deepline_cli.runtime.providers.templates import render, render_proxy, render_url
from deepline_cli.runtime.providers.tools import ToolCall, ToolDef
from deepline_cli.runtime.providers.transport import (
    BadSettings,
    InvalidRequest,
    InvalidResponse,
    ProxyRefused,
    Response,
    StaleConnection,
    Transport,
    TransportError,
    TransportTimeout,
    tls_context,
)

MAX_BACKOFF_S = 30.0
MAX_RETRY_AFTER_S = 300.0  # a longer Retry-After (a quota spent for the day) fails the call instead
_STATUS_CATEGORY: dict[int, Category] = {
    400: "validation",
    401: "authentication",
    403: "authorization",
    402: "billing",
    404: "validation",
    409: "conflict",
    422: "validation",
    429: "rate_limit",
}


def backoff_base_s() -> float:
    return float(os.environ.get("DEEPLINE_RETRY_BASE_S", "0.5"))


@dataclass(slots=True)  # one per call: not frozen (its fields set three times slower)
class Request:
    method: str
    url: str
    headers: dict[str, str]
    params: dict[str, Any]
    json: Any = None


class Http:
    """Sends requests with retries; shared by HTTP tools, remote tools and `ctx.fetch`."""

    def __init__(self, pool: Transport, secrets: Secrets, governor: Governor, *, public_only: bool = False) -> None:
        self.pool = pool
        self.secrets = secrets
        self.governor = governor
        # ctx.fetch on shared workers: a transport of its own that connects to public addresses only.
        self.fetch_pool = Transport(8, address_check=public_address) if public_only else pool

    async def send(
        self,
        request: Request,
        *,
        tool: str,
        timeout_s: float,
        retries: int,
        client_errors: bool = False,
        call: ToolCall | None = None,
        pool: Transport | None = None,
        proxy: str | None = None,
    ) -> Response:
        """The provider's answer (2xx, and 4xx other than 429 with `client_errors`), or a
        ToolExecutionError after the retries allowed. Before every attempt the call's lease
        is checked: a call another process took over is not sent again."""
        attempt, waits = 0, None  # the backoff schedule, made at the first retry
        while True:
            try:
                ready = call.ready if call is not None else None  # checked once a connection is free
                response = await self._once(pool or self.pool, request, timeout_s, proxy, ready)
                failure = self._failure(response, tool)
                if failure is None or (client_errors and not failure.retryable):
                    return response
                raise failure
            except ToolExecutionError as exc:
                if call is not None and (exc.category == "upstream" or (exc.category == "network" and not exc.at_once)):
                    # Timed out or cut off after it was sent, or a 5xx (a gateway that gave up
                    # waiting on the provider): it may have been processed.
                    call.unanswered = True
                if not exc.retryable or attempt >= retries:
                    raise self._final(exc, attempt) from None
                if (exc.retry_after_s or 0.0) > MAX_RETRY_AFTER_S:
                    raise self._too_long(exc, attempt) from None
                if waits is None:
                    waits = delays(backoff_base_s(), cap=MAX_BACKOFF_S, jitter=True)
                # Never shorter than the provider asked; none for a kept connection the server had closed.
                delay = 0.0 if exc.at_once else max(next(waits), exc.retry_after_s or 0.0)
                if exc.category == "rate_limit":
                    self.governor.back_off(tool, delay)  # slow the tool down for everyone
                if call is not None:
                    call.waited_s += delay
                attempt += 1
                wait = call.pause if call is not None else asyncio.sleep
                await wait(delay)
                await self.governor.pace(tool, wait)  # the retry keeps to the tool's pace and pauses
                if call is not None:  # a retry is counted once it goes out (an interrupt ends the wait)
                    call.note_retry(_retry_reason(exc))

    async def aclose(self) -> None:
        await self.pool.aclose()
        if self.fetch_pool is not self.pool:
            await self.fetch_pool.aclose()

    def _private(self, headers: Mapping[str, str]) -> frozenset[str]:
        """The headers holding a secret: not sent on to another origin a redirect names."""
        if not self.secrets.active:
            return frozenset()
        return frozenset(name.lower() for name, value in headers.items() if self.secrets.holds(value))

    async def _once(
        self,
        pool: Transport,
        request: Request,
        timeout_s: float,
        proxy: str | None,
        ready: Callable[[], Awaitable[None]] | None = None,
    ) -> Response:
        try:
            return await pool.request(
                request.method,
                request.url,
                headers=request.headers,
                params=request.params,
                json=request.json,
                timeout_s=timeout_s,
                proxy=proxy,
                ready=ready,
                private=self._private(request.headers),
                private_body=request.json is not None and self.secrets.active and self.secrets.holds(request.json),
            )
        except ProxyRefused as exc:
            # Configuration, not the call's failure: nothing is recorded on its receipt, so
            # the run continues once the proxy settings are fixed.
            raise UsageError(
                self.secrets.redact(str(exc)) + "; check HTTP_PROXY / HTTPS_PROXY or the tool's `proxy`"
            ) from None
        except BadSettings as exc:  # a proxy or certificates to set right: as a refusing proxy
            raise UsageError(self.secrets.redact(str(exc))) from None
        except InvalidRequest as exc:
            reason = self.secrets.redact(str(exc))
            raise ToolExecutionError(
                f"cannot send the request: {reason}", origin="caller", category="validation", retryable=False
            ) from None
        except InvalidResponse as exc:
            reason = self.secrets.redact(str(exc))
            raise ToolExecutionError(f"unusable answer: {reason}", category="upstream", retryable=False) from None
        except TransportTimeout:
            raise ProviderTransientError(f"timed out after {timeout_s:g}s", category="network") from None
        except StaleConnection as exc:
            stale = ProviderTransientError(f"network error: {exc}", category="network")
            stale.at_once = True  # asked again at once, no backoff: counted as a retry, within `retries`
            raise stale from None
        except TransportError as exc:
            reason = self.secrets.redact(str(exc) or type(exc).__name__)
            raise ProviderTransientError(f"network error: {reason}", category="network") from None

    def _failure(self, response: Response, tool: str) -> ToolExecutionError | None:
        status = response.status_code
        if status < 400:
            return None
        body = self.secrets.excerpt(_readable(response.text), 200).rstrip()
        detail = f"{status} from {tool}" + (f": {body}" if body else "")
        if status == 429 or status >= 500:
            category: Category = "rate_limit" if status == 429 else "upstream"
            return ProviderTransientError(
                detail, category=category, status_code=status, retry_after_s=_retry_after(response), tool=tool
            )
        return ToolExecutionError(
            detail,
            origin="provider",
            category=_STATUS_CATEGORY.get(status, "validation"),
            retryable=False,
            status_code=status,
            tool=tool,
        )

    @staticmethod
    def _too_long(exc: ToolExecutionError, attempts: int) -> ToolExecutionError:
        """A provider asking for a longer wait than a call makes (a daily quota spent): the
        call fails now, transient: a resume of the run asks again, as does a later run given
        --refresh-failed (a later run keeps a failed map cell)."""
        wait = exc.retry_after_s or 0.0
        asked = f"{wait:,.0f}s" if math.isfinite(wait) else "forever"
        exc.args = (
            f"{exc.args[0]}; the provider asked to wait {asked} (a call waits at most "
            f"{MAX_RETRY_AFTER_S:.0f}s), so the call stops here; a later run with --refresh-failed asks again (or a "
            "resume, while the run has not completed)",
        )
        return Http._final(exc, attempts)

    @staticmethod
    def _final(exc: ToolExecutionError, attempts: int) -> ToolExecutionError:
        if attempts:
            exc.args = (f"{exc.args[0]} (retried {attempts}x)",)
        return exc

    def decode(self, response: Response, tool: str, *, expects_json: bool = False) -> Any:
        """The JSON body, the text for non-JSON bodies, None when empty; its secrets are
        redacted where every durable answer's are, as the receipt book keeps it.
        An answer that is not the JSON it says it is (or, `expects_json`, a tool's answer
        its `extract` paths or batch read: an HTML page, a login form) is not kept as an
        answer: transient, asked again (same idempotency key) by a resume."""
        content_type = response.headers.get("content-type", "")
        if not response.content:
            if expects_json and "json" in content_type and response.status_code not in (201, 202, 204, 205):
                raise self._not_json(f"an empty answer from {tool} (its content type says JSON)", response, tool)
            return None
        try:
            # JSON in another charset than UTF-8 (`charset=iso-8859-1`) is read as it declares.
            value = _json.loads_lenient(response.content if response.charset == "utf-8" else response.text)
        except ValueError:
            if "json" in content_type:
                raise self._not_json(f"malformed JSON from {tool}", response, tool) from None
            if expects_json:
                said = self.secrets.excerpt(_readable(response.text), 120)
                raise self._not_json(
                    f"{tool} answered {content_type or 'text'} where JSON was expected ({said})", response, tool
                ) from None
            value = response.text
        return value

    @staticmethod
    def _not_json(message: str, response: Response, tool: str) -> ProviderTransientError:
        return ProviderTransientError(message, category="upstream", status_code=response.status_code, tool=tool)


_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]+>")


def _readable(text: str) -> str:
    """An error body as one line a person reads: an HTML page (a proxy's or a web server's
    502 page) by its title, or its text without markup; every run of whitespace one space.
    JSON holding `\\u` escapes is written again as deepline writes it (`\\u002B` a `+`), so a
    secret it echoes, its characters escaped, is found and redacted."""
    if "\\u" in text and text.lstrip()[:1] in ("{", "["):
        with contextlib.suppress(orjson.JSONDecodeError):
            text = orjson.dumps(orjson.loads(text)).decode()
    if "<" in text and re.search(r"<(html|head|body|title|h1|!doctype)\b", text, re.IGNORECASE):
        title = _TITLE.search(text)
        text = html.unescape(title.group(1) if title else _TAG.sub(" ", text))
    return " ".join(text.split())


def invalid(message: str, tool: str) -> ToolExecutionError:
    """A request the caller built wrong: never sent, never retried."""
    return ToolExecutionError(message, origin="caller", category="validation", retryable=False, tool=tool)


def check_host(url: str, allowed: tuple[str, ...], tool: str) -> None:
    """A URL whose host comes from the input may only reach the hosts listed for it."""
    parts = urllib.parse.urlsplit(url)
    host = (parts.hostname or "").lower()
    netloc = f"{host}:{parts.port}" if parts.port else host
    if parts.username is not None or (host not in allowed and netloc not in allowed):
        raise invalid(f"{tool}: host {netloc or url[:60]!r} is not in the tool's allow_hosts", tool)


def public_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    """The transport's veto for `ctx.fetch` limited to public addresses
    (DEEPLINE_FETCH_PUBLIC_ONLY): no cloud metadata (169.254.169.254), no private network
    (RFC 1918), no loopback. It sees the addresses the host resolves to, which are the ones
    connected to: a name cannot resolve one way for the check and another for the call."""
    mapped = getattr(address, "ipv4_mapped", None) or address
    if not mapped.is_global:
        raise ToolExecutionError(
            f"{mapped} is a private address; fetches are limited to public ones",
            origin="caller",
            category="validation",
            retryable=False,
        )


def _retry_reason(exc: ToolExecutionError) -> str:
    if exc.status_code == 429:
        return "429"
    if exc.status_code and exc.status_code >= 500:
        return "5xx"
    return exc.category


def _retry_after(response: Response) -> float | None:
    raw = response.headers.get("retry-after")
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        pass
    else:
        return None if math.isnan(seconds) else max(0.0, seconds)
    try:
        parsed = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None  # unreadable: the usual backoff applies
    return max(0.0, parsed.timestamp() - time.time())


class CredentialChanged(DeeplineError):
    """A provider rejected the credentials, and they changed since the call was keyed."""


def warm_up() -> None:
    """Build the shared TLS context (~20-45 ms) before the run, so the first paced call is
    not sent late — and then together with the second. Certificates that cannot be loaded
    stop the calls that need them (as a one-sentence error), not the run's start."""
    with contextlib.suppress(BadSettings):
        tls_context()


class HttpTools:
    """Tool definitions for the HTTP and remote tools of a run's `deepline.toml`."""

    def __init__(self, config: Config, http: Http) -> None:
        self.config = config
        self.http = http
        self._defs: dict[str, ToolDef] = {}
        plain = [spec.url for spec in config.tools.values()] + ([config.remote.base_url] if config.remote else [])
        if any(not url.lower().startswith("http://") for url in plain):  # https, or a scheme a template says
            warm_up()

    def definition(self, tool_id: str) -> ToolDef | None:
        if tool_id in self._defs:
            return self._defs[tool_id]
        spec = self.config.tools.get(tool_id)
        if spec is not None:
            made = self._http_tool(spec)
        elif self.config.remote is not None:
            made = self._remote_tool(tool_id, self.config.remote)
        else:
            return None
        self._defs[tool_id] = made
        return made

    def forget(self, tool_id: str) -> None:
        self._defs.pop(tool_id, None)

    async def _send_checking_auth(
        self,
        request: Request,
        *,
        tool: str,
        names: list[str],
        digest: str,
        timeout_s: float,
        retries: int,
        call: ToolCall,
        proxy: str | None,
    ) -> Response:
        try:
            return await self.http.send(
                request, tool=tool, timeout_s=timeout_s, retries=retries, call=call, proxy=proxy
            )
        except ToolExecutionError as exc:
            if exc.category == "authentication" and names:
                self.http.secrets.reload()
                if self._auth_digest(names, tool) != digest:
                    raise CredentialChanged(f"The credentials of tool {tool!r} changed during the run.") from exc
            raise

    def _auth_digest(self, names: list[str], owner: str) -> str:
        values = []
        for name in names:
            value = self.http.secrets.lookup(name)
            if value is None:
                raise UsageError(
                    f"Tool {owner!r}: secret {name} is not set; export it or add it to {self.http.secrets.env_file}."
                )
            if len(value) >= MIN_SECRET_LENGTH:  # a port or a region is not a credential
                values.append(f"{name}={value}")
        return _json.digest("auth", *values)[:16] if values else ""

    def _http_tool(self, spec: HttpToolSpec) -> ToolDef:
        http = self.http
        names = spec.secret_names()
        digest = self._auth_digest(names, spec.id)

        def body(input: Any) -> Any:
            return render(spec.json, input, http.secrets, tool=spec.id) if spec.json is not None else input

        async def call_http(input: Any, call: ToolCall) -> Any:
            # A batch tool gets the members' inputs: one request carries all their bodies.
            first = input[0] if spec.batch else input
            items_field = (spec.batch or {}).get("items_field", "items")
            url = render_url(spec.url, first, http.secrets, tool=spec.id)
            if spec.allow_hosts:
                check_host(url, spec.allow_hosts, spec.id)
            request = Request(
                method=spec.method,
                url=url,
                headers={
                    **_strings(render(spec.headers, first, http.secrets, tool=spec.id)),
                    spec.idempotency_header: call.idempotency_key,
                },
                params=render(spec.query, first, http.secrets, tool=spec.id),
                json={items_field: [body(i) for i in input]} if spec.batch else body(input) if spec.json else None,
            )
            response = await self._send_checking_auth(
                request,
                tool=spec.id,
                names=names,
                digest=digest,
                timeout_s=spec.timeout_s,
                retries=spec.retries,
                call=call,
                proxy=render_proxy(spec.proxy, http.secrets, tool=spec.id) if spec.proxy else spec.proxy,
            )
            answer = read_answer(http, response, spec.id, call, expects_json=bool(spec.extract or spec.batch))
            if spec.batch and isinstance(answer, dict):
                return answer.get((spec.batch or {}).get("results_field", "results"))
            return answer

        return ToolDef(
            id=spec.id,
            fn=call_http,
            credits=spec.credits,
            rate_limit=spec.rate_limit,
            concurrency=spec.concurrency,
            version=spec.version,
            batch=spec.batch,
            extract=spec.extract,
            auth_digest=digest,
            wants_call=True,
        )

    def _remote_tool(self, tool_id: str, remote: RemoteSpec) -> ToolDef:
        http = self.http
        key_name = remote.api_key_env

        async def call_remote(input: Any, call: ToolCall) -> Any:
            api_key = http.secrets.get(key_name)
            base_url = render_url(remote.base_url, {}, http.secrets, tool=tool_id)  # its `${NAME}`s
            request = Request(
                method="POST",
                url=f"{base_url}/v1/tools/{tool_id}/execute",
                headers={
                    "Authorization": f"Bearer {api_key}",
                    "x-deepline-idempotency-key": call.idempotency_key,
                    "x-request-id": uuid.uuid4().hex,
                },
                params={},
                json={
                    "tool": tool_id,
                    "payload": input,
                    "metadata": {
                        "parent_run_id": call.run_id,
                        "receipt_key": call.receipt_key,
                        "idempotency_key": call.idempotency_key,
                    },
                },
            )
            proxy = render_proxy(remote.proxy, http.secrets, tool=tool_id) if remote.proxy else remote.proxy
            response = await http.send(
                request, tool=tool_id, timeout_s=remote.timeout_s, retries=remote.retries, call=call, proxy=proxy
            )
            body = read_answer(http, response, tool_id, call, expects_json=True)
            if not isinstance(body, dict):
                return body
            call.credits = reported_credits(body, tool_id)
            return body.get("output", body)

        return ToolDef(
            id=tool_id,
            fn=call_remote,
            credits=remote.credits_for(tool_id) or 0.0,
            auth_digest=self._auth_digest([key_name], tool_id),
            wants_call=True,
            metered=True,
        )


def read_answer(http: Http, response: Response, tool: str, call: ToolCall, *, expects_json: bool) -> Any:
    """A tool's answer, decoded. How long reading it held the event loop (inflating it, then
    parsing it) goes with the call's, as a play's own code's does (`Held`), so a large answer
    is committed as it returns (WriteQueue.settle)."""
    began = time.perf_counter()
    answer = http.decode(response, tool, expects_json=expects_json)
    held = response.held_s + time.perf_counter() - began
    call.held_s += held
    count_held(held)
    return answer


def reported_credits(body: dict[str, Any], tool: str) -> float | None:
    """The `credits` a remote answer's envelope carries next to `output` (None: not said)."""
    value = body.get("credits")
    if value is None or "output" not in body:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ProviderTransientError(f"{tool}: the answer's credits {value!r} is not a number", category="upstream")
    return float(value)


def _strings(headers: Any) -> dict[str, str]:
    return {str(k): v if isinstance(v, str) else _json.dumps_str(v) for k, v in dict(headers).items()}


@dataclass(frozen=True)
class FetchResult:
    """`ctx.fetch`'s answer."""

    ok: bool
    status: int
    headers: dict[str, str]
    text: str

    @property
    def json(self) -> Any:
        if not self.text:
            return None
        try:
            return _json.loads(self.text)
        except ValueError:
            kind = self.headers.get("content-type", "no content type")
            raise ValueError(f"the fetched answer is not JSON ({self.status}, {kind}): {self.text[:60]!r}") from None

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "status": self.status, "headers": self.headers, "text": self.text}


_KEPT_HEADERS = ("content-type", "etag", "last-modified", "location", "retry-after")


async def fetch_once(
    http: Http, request: Request, *, label: str, timeout_s: float, retries: int, call: ToolCall
) -> dict[str, Any]:
    """One durable fetch: any final HTTP status is a result (ok=False for 4xx); network
    failures, 5xx and 429 are retried and then raised."""
    response = await http.send(
        request,
        tool=f"fetch:{label}",
        timeout_s=timeout_s,
        retries=retries,
        client_errors=True,
        call=call,
        pool=http.fetch_pool,
    )
    headers = {k: http.secrets.redact(v) for k, v in response.headers.items() if k.lower() in _KEPT_HEADERS}
    return {
        "ok": response.status_code < 400,
        "status": response.status_code,
        "headers": headers,
        "text": http.secrets.redact(response.text),
    }
