"""Tools: `@tool` local tools, the registry, and what a call returns (`ToolResult`).

A tool is anything that does paid or effectful work for one input. Local tools are
Python functions taking `(input)` or `(input, call)`; `call` carries the provider
idempotency key so a tool that calls a provider itself can pass it on.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import math
import numbers
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from deepline_cli import _json
from deepline_cli._aio import Held, count_held, is_awaitable
from deepline_cli.errors import UsageError
from deepline_cli.runtime.providers.governor import parse_rate

Execution = Literal["live", "receipt", "checkpoint", "in_flight"]
F = TypeVar("F", bound=Callable[..., Any])


class CallOwner(Protocol):
    """Who holds a call's lease (the receipt book): asked before every attempt."""

    def ensure_owned(self, call: Any, lease_id: str) -> None: ...
    def note_retry(self, call: Any, reason: str) -> None: ...
    async def pause(self, seconds: float) -> None: ...
    @property
    def store_up(self) -> bool: ...
    async def until_store_up(self) -> None: ...


@dataclass(slots=True)
class ToolCall:
    """What a running tool knows about its own call.

    A tool that calls a provider itself passes `idempotency_key` on, and one that retries
    by itself calls `ensure_lease()` before every attempt: it raises
    `ReceiptLeaseLostError` once another process has taken the call over.
    """

    idempotency_key: str
    run_id: str
    attempt: int
    receipt_key: str
    # True when the call may have been sent before (by an attempt that crashed or was
    # stopped): it goes out again under the same idempotency key.
    resumed: bool = False
    lease_id: str = ""
    # The batch this call was sent in before (a crash, a transient failure: sent again only as
    # that batch); "" a batch member not yet in a batch; None a call claimed alone.
    batch_key: str | None = None
    retries: int = 0
    # A try went without an answer (a timeout, a dropped connection): the provider may have
    # processed it. A failure of the call is then asked again only under this key.
    unanswered: bool = False
    # What the provider said this call cost (a remote answer's `credits`); None: the
    # tool's declared credits.
    credits: float | None = None
    # Seconds spent waiting rather than at the provider: for a concurrency slot, the rate
    # limit, a 429 pause, Retry-After and backoff between retries (the report's latency).
    waited_s: float = 0.0
    # True while the call waits for its slot (concurrency, rate limit, a 429 pause): stopped
    # there, it was never sent, and is given back as such (skipped, not released).
    queued: bool = False
    # How long the call held the event loop (a step's plain `def`, a sync tool run on it):
    # answers that held it long enough in all are committed as they end (WriteQueue.settle).
    held_s: float = 0.0
    _owner: CallOwner | None = field(default=None, repr=False, compare=False)
    _call: Any = field(default=None, repr=False, compare=False)

    def ensure_lease(self) -> None:
        """Raise ReceiptLeaseLostError if this process no longer owns the call."""
        if self._owner is not None:
            self._owner.ensure_owned(self._call, self.lease_id)

    async def ready(self) -> None:
        """Just before the call goes out (and before each retry): wait while the store cannot
        record what it answers (its connection lost), then `ensure_lease`."""
        owner = self._owner
        if owner is not None and not owner.store_up:
            await owner.until_store_up()
        self.ensure_lease()

    def note_retry(self, reason: str) -> None:
        """One more attempt of the call (`reason`: "429", "5xx", "network"…), for the stats."""
        self.retries += 1
        if self._owner is not None:
            self._owner.note_retry(self._call, reason)

    async def pause(self, seconds: float) -> None:
        """Wait before the next attempt: `seconds`, or until the run stops dispatching,
        then raise as `ensure_lease` does if the call may no longer go out."""
        if self._owner is None:
            await asyncio.sleep(seconds)
        else:
            await self._owner.pause(seconds)
            self.ensure_lease()


@dataclass(slots=True)
class Placement:
    """Where a sync tool runs. On a thread at first: it may block (a plain HTTP client, a
    file). Once INLINE_AFTER calls in a row each took under INLINE_UNDER_S, on the event
    loop: a thread hop costs more than such a call. An inline call over SLOW_S (a pause, a
    slow input) sends it back to threads until it proves quick again; one over BLOCKING_S
    (it waits on something) sends it back for good. Either held the loop up once."""

    INLINE_AFTER = 16
    INLINE_UNDER_S = 0.0002
    SLOW_S = 0.002
    BLOCKING_S = 0.02

    quick: int = 0  # calls in a row under INLINE_UNDER_S
    blocking: bool = False

    @property
    def inline(self) -> bool:
        return not self.blocking and self.quick >= self.INLINE_AFTER

    def took(self, seconds: float) -> None:
        if self.inline and seconds > self.SLOW_S:
            self.quick, self.blocking = 0, seconds > self.BLOCKING_S
        elif not self.inline:
            self.quick = self.quick + 1 if seconds < self.INLINE_UNDER_S else 0


@dataclass(slots=True)
class ToolDef:
    id: str
    fn: Callable[..., Any]
    credits: float = 0.0
    rate_limit: str | None = None
    concurrency: int | None = None
    version: str = "1"
    batch: dict[str, Any] | None = None
    extract: dict[str, str] = field(default_factory=dict)
    auth_digest: str = ""
    wants_call: bool = False
    metered: bool = False  # its answers say what they cost (remote tools): the budget counts those
    placement: Placement = field(default_factory=Placement)  # a sync tool: a thread, or the loop once proven quick
    local: bool = False  # the play's own Python (@tool): its answers are given as stored
    is_async: bool = field(init=False)

    def __post_init__(self) -> None:
        self.is_async = inspect.iscoroutinefunction(self.fn)

    async def invoke(self, input: Any, call: ToolCall, *, under_timeout: bool = False) -> Any:
        """The tool's answer. A sync tool runs on a thread, or inline once proven quick,
        never inline under a timeout (`under_timeout`: nothing could interrupt it), and in a
        copy of the caller's context either way (what it sets does not leak out)."""
        args = (input, call) if self.wants_call else (input,)
        if self.is_async:
            result = self.fn(*args)
        else:
            context = contextvars.copy_context()
            if self.placement.inline and not under_timeout:
                result = context.run(self._timed, call, *args)  # proven quick, it may block this time
            else:
                result = await asyncio.get_running_loop().run_in_executor(None, context.run, self._timed, None, *args)
        if is_awaitable(result):
            # How long a play's own code held the event loop goes with the call's (a sync SDK
            # called inside an `async def` blocks it, awaiting nothing): its answer is committed
            # soon. deepline's own HTTP tools await their sockets: awaited as they are.
            result = await (Held(result, call) if self.local else result)
        if not self.local or _json.as_is(result):
            return result
        # As a receipt gives it back; an object with no JSON form refused, not stored as its repr.
        return _json.plain(result, f"The answer of tool {self.id!r}")

    def _timed(self, on_loop: ToolCall | None, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.fn(*args)
        finally:
            took = time.perf_counter() - start
            self.placement.took(took)
            if on_loop is not None:  # run on the event loop: it held it that long
                on_loop.held_s = took
                count_held(took)


_REGISTRY: dict[str, ToolDef] = {}


def tool(
    id: str,
    *,
    credits: float = 0,
    rate_limit: str | None = None,
    concurrency: int | None = None,
    version: str = "1",
    batch: dict[str, Any] | None = None,
) -> Callable[[F], F]:
    """Register a local tool under `id`; the function takes `(input)` or `(input, call)`."""
    if not isinstance(id, str):  # `@tool` with no id: it was given the function
        raise UsageError('@tool needs the tool\'s id: @tool("acme.lookup").')

    def register(fn: F) -> F:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if not 1 <= len(params) <= 2:
            raise UsageError(f"Tool {id!r} must take (input) or (input, call).")
        # Refused where it is written (`deepline check` says so), not by the run's first call.
        if rate_limit is not None:
            parse_rate(rate_limit, owner=f"Tool {id!r}")
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise UsageError(f"Tool {id!r}: concurrency must be a whole number of at least 1, not {concurrency!r}.")
        _REGISTRY[id] = ToolDef(
            id=id,
            fn=fn,
            credits=_declared_credits(id, credits),
            rate_limit=rate_limit,
            concurrency=concurrency,
            version=str(version),
            batch=batch,
            wants_call=len(params) == 2,
            local=True,
        )
        fn.__deepline_tool__ = _REGISTRY[id]  # type: ignore[attr-defined]
        return fn

    return register


def _declared_credits(id: str, credits: Any) -> float:
    """`@tool(credits=…)`: a number of credits, 0 or more (an int, a float, a Decimal, a
    Fraction, a numpy number), as a float. True, "5", -1, NaN or a number no float holds
    is refused where it is written (`deepline check` says so)."""
    if not isinstance(credits, bool) and (
        isinstance(credits, numbers.Real) or _json.decimal_number(credits) is not None
    ):
        try:
            value = float(credits)
        except (OverflowError, ValueError):
            value = math.nan
        if 0 <= value <= sys.float_info.max:
            return value
    huge = isinstance(credits, int) and credits.bit_length() > 128  # its repr may be refused (4,300 digits)
    shown = f"an integer of about {int(credits.bit_length() * math.log10(2)) + 1} digits" if huge else repr(credits)
    raise UsageError(f"Tool {id!r}: credits must be a number of credits, 0 or more, not {shown}.")


def registered_tools() -> dict[str, ToolDef]:
    return dict(_REGISTRY)


def find_tool(tool_id: str) -> ToolDef | None:
    return _REGISTRY.get(tool_id)


@dataclass(slots=True)
class ToolResult:
    """The answer of one durable tool call."""

    output: Any
    execution: Execution
    receipt_key: str
    credits: float = 0.0
    tool: str = ""
    extract: dict[str, str] = field(default_factory=dict)

    @property
    def status(self) -> Literal["completed", "no_result"]:
        return "no_result" if self.output in (None, {}, []) else "completed"

    @property
    def raw(self) -> Any:
        """The provider's answer, as stored in the receipt."""
        return self.output

    @property
    def extracted(self) -> dict[str, Any]:
        """Every declared extractor's value, by name (a list for a `[*]` path)."""
        return {name: json_path(self.output, path) for name, path in self.extract.items()}

    def get(self, name: str, default: Any = None) -> Any:
        """A declared extractor's value (or a top-level output field of that name)."""
        path = self.extract.get(name)
        if path is None:
            return self.output.get(name, default) if isinstance(self.output, dict) else default
        return json_path(self.output, path, default)

    def to_json(self) -> Any:
        return self.output

    def __repr__(self) -> str:
        return f"ToolResult({self.tool}, {self.status}, execution={self.execution})"


def json_path(value: Any, path: str, default: Any = None) -> Any:
    """Follow a dotted path through JSON: `data.email`, `results.0.id`, an optional leading
    `$.`; `[0]` is the same as `.0`. A `*` (or `[*]`) step takes every item of a list (or
    value of an object) and gives a list: `data.emails[*].value` → every email's value
    (items without it are left out)."""
    return _follow(value, _parts(path), default)


def _parts(path: str) -> list[str]:
    text = path.removeprefix("$").replace("[", ".").replace("]", "")
    return [part for part in text.split(".") if part != ""]


def _follow(current: Any, parts: list[str], default: Any) -> Any:
    for position, part in enumerate(parts):
        if part == "*":
            items = (
                current if isinstance(current, list) else list(current.values()) if isinstance(current, dict) else []
            )
            rest = parts[position + 1 :]
            found = [_follow(item, rest, _MISSING) for item in items]
            return [item for item in found if item is not _MISSING]
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.lstrip("-").isdigit() and current:
            index = int(part)
            if not -len(current) <= index < len(current):
                return default
            current = current[index]
        else:
            return default
    return current


_MISSING = object()
