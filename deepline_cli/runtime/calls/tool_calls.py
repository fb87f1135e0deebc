"""`ctx.tools` and `rc.tools`: durable tool calls. A tool is looked up (the play's own
@tools, the registry, deepline.toml, a `[remote]` API), keyed by its input, claimed as a
receipt and, unless the receipt answers, invoked under the tool's limits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from deepline_cli import _json
from deepline_cli.errors import InputError, ToolExecutionError, UsageError
from deepline_cli.runtime.calls.batch import Batcher
from deepline_cli.runtime.calls.caps import Caps
from deepline_cli.runtime.calls.identity import Identity
from deepline_cli.runtime.calls.receipts import KEY_CHARS, DurableCall, ReceiptBook, durable_id
from deepline_cli.runtime.providers.governor import Governor
from deepline_cli.runtime.providers.http import CredentialChanged, HttpTools
from deepline_cli.runtime.providers.tools import ToolCall, ToolDef, ToolResult, find_tool

# `stale_after_seconds`: a number of seconds, or a function of the stored answer giving one
# (None: never stale), e.g. re-check a not-found sooner than a found.
Staleness = float | Callable[[Any], float | None] | None


class ToolCatalog(Protocol):
    """Where a run finds its tools' definitions."""

    def definition(self, tool_id: str) -> ToolDef | None: ...
    def forget(self, tool_id: str) -> None: ...


class RunTools:
    """A run's tools: the play module's own @tools first (two versions of a play in one
    worker each call their own), then the registry, then deepline.toml and `[remote]`."""

    def __init__(self, local: dict[str, ToolDef], http_tools: HttpTools) -> None:
        self.local = local
        self.http_tools = http_tools

    def definition(self, tool_id: str) -> ToolDef | None:
        return self.local.get(tool_id) or find_tool(tool_id) or self.http_tools.definition(tool_id)

    def forget(self, tool_id: str) -> None:
        self.http_tools.forget(tool_id)

    def versions(self) -> dict[str, str]:
        """The version of each tool the play declares (its module's @tools and deepline.toml's):
        a map's cells calling one are recomputed when it is bumped (columns.py)."""
        declared = {tool_id: str(d.version) for tool_id, d in self.local.items()}
        declared.update((tool_id, str(spec.version)) for tool_id, spec in self.http_tools.config.tools.items())
        return declared


def checked_staleness(value: Any, what: str = "stale_after_seconds", *, function: bool = True) -> Any:
    """`stale_after_seconds` as given: None, a number of seconds (0 or more), or (`function`)
    a function of the stored value. Anything else (text from a config: "3600") is refused at
    once, not when a later run first compares it with a stored answer."""
    if value is None or (function and callable(value)):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        function_too = ", or a function of the stored value" if function else ""
        raise UsageError(f"{what} must be a number of seconds (0 or more) or None{function_too}, not {value!r}.")
    return value


async def staleness_of(book: ReceiptBook, key: str, stale_after_seconds: Staleness) -> float | None:
    """`stale_after_seconds` as a number: a function of the stored answer is asked with it
    (None when there is no answer yet)."""
    checked_staleness(stale_after_seconds)
    if not callable(stale_after_seconds):
        return stale_after_seconds
    stored = await book.stored(key)
    previous = stored.output if stored is not None and stored.status == "completed" else None
    ttl = checked_staleness(stale_after_seconds(previous), "The stale_after_seconds function's answer", function=False)
    return None if ttl is None else float(ttl)


class Tools:
    """`ctx.tools`: durable tool calls."""

    __fingerprint_as__: ClassVar[str] = "deepline.Tools"  # the run's and the plan's alike (see Context)

    def __init__(
        self,
        identity: Identity,
        book: ReceiptBook,
        governor: Governor,
        catalog: ToolCatalog,
        caps: Caps,
        log: Callable[[str], None],
    ) -> None:
        self._identity = identity
        self._book = book
        self._governor = governor
        self._catalog = catalog
        self._caps = caps
        self._log = log
        # Asked before each call (the play's context): what must hold first (a wait awaited).
        self.before: Callable[[], None] | None = None
        self._digests: dict[tuple[str, ...], _json.Digest] = {}
        self._configured: set[str] = set()
        self._batchers: dict[str, Batcher] = {}

    def _resolve(self, tool_id: str) -> ToolDef:
        definition = self._catalog.definition(tool_id)
        if definition is None:
            raise UsageError(f"Unknown tool {tool_id!r}: declare it with @tool or in deepline.toml.")
        if tool_id not in self._configured:
            self._governor.configure_tool(tool_id, concurrency=definition.concurrency, rate_limit=definition.rate_limit)
            self._configured.add(tool_id)
        return definition

    def declared(self, tool_id: str) -> ToolDef | None:
        """The definition of a tool this run could call, without configuring it."""
        return self._catalog.definition(tool_id)

    def receipt_key(self, definition: ToolDef, input: Any) -> str:
        scope = self._identity
        try:
            content = _json.canonical(input)
        except TypeError as exc:
            raise InputError(f"The input of tool {definition.id!r} has no receipt key: {exc}.") from None
        # receipt_key("tool", workspace, play, tool id, content, auth digest, version), the
        # parts around the content hashed once per tool (and again when its credentials change).
        around = (scope.workspace, scope.play, definition.id, definition.auth_digest, definition.version)
        digest = self._digests.get(around)
        if digest is None:
            digest = self._digests[around] = _json.Digest(("tool", *around[:3]), around[3:])
        return digest.of(content)[:KEY_CHARS]

    async def _invoke(self, definition: ToolDef, input: Any, info: ToolCall, timeout_s: float | None) -> Any:
        """Call the tool under its limits: run-wide and per-tool concurrency, rate, timeout."""
        governor, tool = self._governor, definition.id
        if governor.unlimited(tool) and timeout_s is None:  # the book checked it may go out just now
            return await definition.invoke(input, info)
        asked = time.monotonic()
        info.queued = True
        async with governor.slot(tool, info.pause):
            info.waited_s += time.monotonic() - asked
            # The wait for a slot may have outlasted the lease (a paused process), or been cut
            # short by an interrupt: the call goes out only if it is still ours, and once the
            # store can record its answer.
            await info.ready()
            info.queued = False
            if timeout_s is None:
                return await definition.invoke(input, info)
            async with asyncio.timeout(timeout_s):
                return await definition.invoke(input, info, under_timeout=True)

    def _batcher(self, definition: ToolDef, timeout_s: float | None) -> Batcher:
        batcher = self._batchers.get(definition.id)
        if batcher is None:

            async def send(inputs: list[Any], info: ToolCall) -> Any:
                return await self._invoke(definition, inputs, info, timeout_s)

            batcher = self._batchers[definition.id] = Batcher(definition, self._book, send)
        return batcher

    async def execute(
        self,
        id: str,
        tool: str,
        input: Any,
        *,
        force: bool = False,
        stale_after_seconds: Staleness = None,
        timeout_s: float | None = None,
        receipt_wait_s: float | None = None,
        description: str | None = None,
    ) -> ToolResult:
        """A durable tool call. `description`: what it is for, in the play's words (kept
        with its receipt, shown in its errors and the report)."""

        durable_id(id, "ctx.tools.execute")
        if self.before is not None:
            self.before()
        if description is not None and not isinstance(description, str):
            description = str(description)  # from the play's data (a list id): said as text
        args = (id, tool, input, force, stale_after_seconds, timeout_s, receipt_wait_s, description)
        try:
            return await self._execute(*args)
        except CredentialChanged:
            # Keyed under the old account: release (nothing recorded), re-key, claim once more.
            self._log(f"credentials of tool {tool!r} changed during the run; calling it again under the new ones")
            self._catalog.forget(tool)
            return await self._execute(*args)

    async def _execute(
        self,
        id: str,
        tool: str,
        input: Any,
        force: bool,
        stale_after_seconds: Staleness,
        timeout_s: float | None,
        receipt_wait_s: float | None,
        description: str | None,
    ) -> ToolResult:
        definition = self._resolve(tool)
        key = self.receipt_key(definition, input)
        asked = stale_after_seconds  # None, the usual case, needs no look at the stored answer
        stale_after_s = None if asked is None else await staleness_of(self._book, key, asked)
        call = DurableCall(
            key=key,
            kind="tool",
            label=id,
            tool=tool,
            force=force,
            stale_after_s=stale_after_s,
            credits=definition.credits,
            metered=definition.metered,
            receipt_wait_s=receipt_wait_s,
            description=description,
            input=input,
            batched=bool(definition.batch),
        )
        if definition.batch:
            batcher = self._batcher(definition, timeout_s)

            async def invoke(info: ToolCall) -> Any:
                self._caps.count_tool_call()
                if info.batch_key:  # sent in a batch that may have gone out: that batch again, same key
                    return await batcher.recover(info)
                if info.batch_key is None:  # claimed alone before, and sent again under its key: alone only
                    raise UsageError(
                        f"Tool {tool!r} was called alone before, and that call may have gone out (a run that stopped, "
                        "or a failure it may have been processed in), and deepline.toml now batches it (inside a "
                        "batch, its calls would be billed again): take its `batch` setting out while these calls "
                        "are asked again, and put it back after."
                    )
                return await batcher.submit(info, input)
        else:

            async def invoke(info: ToolCall) -> Any:
                if info.batch_key:  # sent in a batch that may have gone out: never again alone
                    raise UsageError(
                        f"Tool {tool!r} was called in a batch that may have gone out (a run that stopped, or a "
                        "failure it may have been processed in), and deepline.toml no longer batches it (sent "
                        "alone, its calls would be billed again): put its `batch` setting back while these calls "
                        "are asked again, and change it after."
                    )
                self._caps.count_tool_call()  # --max-tool-calls counts calls actually made
                return await self._invoke(definition, input, info, timeout_s)

        try:
            outcome = await self._book.execute(call, invoke)
        except ToolExecutionError as exc:
            if description and not str(exc).startswith(description):
                exc.args = (f"{description}: {exc.args[0] if exc.args else exc}", *exc.args[1:])
            raise
        return ToolResult(
            output=outcome.value,
            execution=outcome.execution,
            receipt_key=outcome.key,
            credits=outcome.credits,
            tool=tool,
            extract=definition.extract,
        )
