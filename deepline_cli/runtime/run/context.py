"""The context a play receives as `ctx`: everything with an effect goes through it."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from deepline_cli import _json
from deepline_cli.errors import InputError, ToolExecutionError, UsageError
from deepline_cli.runtime.calls.batch import Batcher
from deepline_cli.runtime.calls.receipts import DurableCall, ReceiptBook, receipt_key
from deepline_cli.runtime.map.columns import Column, Staleness
from deepline_cli.runtime.map.dataset import Dataset
from deepline_cli.runtime.map.rows import CsvSource, RowKey
from deepline_cli.runtime.providers.http import CredentialChanged, FetchResult, Request, fetch_once
from deepline_cli.runtime.providers.tools import ToolCall, ToolDef, ToolResult, find_tool
from deepline_cli.runtime.run.services import RunServices, log_fields


@dataclass(frozen=True, slots=True)
class RunInfo:
    id: str
    attempt: int
    cwd: str


@dataclass(frozen=True, slots=True)
class PlayInfo:
    name: str
    file: str


async def staleness_of(book: ReceiptBook, key: str, stale_after_seconds: Staleness) -> float | None:
    """`stale_after_seconds` as a number: a function of the stored answer is asked with it
    (None when there is no answer yet)."""
    if not callable(stale_after_seconds):
        return stale_after_seconds
    stored = await book.stored(key)
    previous = stored.output if stored is not None and stored.status == "completed" else None
    ttl = stale_after_seconds(previous)
    return None if ttl is None else float(ttl)


class Tools:
    """`ctx.tools`: durable tool calls."""

    def __init__(self, services: RunServices) -> None:
        self._s = services
        self._configured: set[str] = set()
        self._batchers: dict[str, Batcher] = {}

    def _resolve(self, tool_id: str) -> ToolDef:
        definition = self._s.local_tools.get(tool_id) or find_tool(tool_id) or self._s.http_tools.definition(tool_id)
        if definition is None:
            raise UsageError(f"Unknown tool {tool_id!r}: declare it with @tool or in deepline.toml.")
        if tool_id not in self._configured:
            self._s.governor.configure_tool(
                tool_id, concurrency=definition.concurrency, rate_limit=definition.rate_limit
            )
            self._configured.add(tool_id)
        return definition

    def receipt_key(self, definition: ToolDef, input: Any) -> str:
        scope = self._s.scope
        try:
            content = _json.canonical(input)
        except TypeError as exc:
            raise InputError(f"The input of tool {definition.id!r} has no receipt key: {exc}.") from None
        return receipt_key("tool", scope.workspace, scope.play, definition.id, content, definition.auth_digest,
                           definition.version)  # fmt: skip

    async def _invoke(self, definition: ToolDef, input: Any, info: ToolCall, timeout_s: float | None) -> Any:
        """Call the tool under its limits: run-wide and per-tool concurrency, rate, timeout."""
        governor, tool = self._s.governor, definition.id
        if governor.unlimited(tool) and timeout_s is None:
            return await definition.invoke(input, info)
        asked = time.monotonic()
        async with governor.slot(tool):
            info.waited_s += time.monotonic() - asked
            # The wait for a slot may have outlasted the lease (a paused process): the call
            # goes out only if it is still ours.
            info.ensure_lease()
            if timeout_s is None:
                return await definition.invoke(input, info)
            async with asyncio.timeout(timeout_s):
                return await definition.invoke(input, info)

    def _batcher(self, definition: ToolDef, timeout_s: float | None) -> Batcher:
        batcher = self._batchers.get(definition.id)
        if batcher is None:

            async def send(inputs: list[Any], info: ToolCall) -> Any:
                return await self._invoke(definition, inputs, info, timeout_s)

            batcher = self._batchers[definition.id] = Batcher(definition, self._s.book, send)
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

        def attempt() -> Awaitable[ToolResult]:
            return self._execute(id, tool, input, force, stale_after_seconds, timeout_s, receipt_wait_s, description)

        try:
            return await attempt()
        except CredentialChanged:
            # Keyed under the old account: release (nothing recorded), re-key, claim once more.
            self._s.log(f"credentials of tool {tool!r} changed during the run; calling it again under the new ones")
            self._s.http_tools.forget(tool)
            return await attempt()

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
        call = DurableCall(
            key=key,
            kind="tool",
            label=id,
            tool=tool,
            force=force,
            stale_after_s=await staleness_of(self._s.book, key, stale_after_seconds),
            credits=definition.credits,
            metered=definition.metered,
            receipt_wait_s=receipt_wait_s,
            description=description,
            input=input,
        )
        if definition.batch:
            batcher = self._batcher(definition, timeout_s)

            async def invoke(info: ToolCall) -> Any:
                self._s.caps.count_tool_call()
                if info.batch_key:  # sent in a batch before a crash: that batch again, same key
                    return await batcher.recover(info)
                return await batcher.submit(info, input)
        else:

            async def invoke(info: ToolCall) -> Any:
                self._s.caps.count_tool_call()  # --max-tool-calls counts calls actually made
                return await self._invoke(definition, input, info, timeout_s)

        try:
            outcome = await self._s.book.execute(call, invoke)
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


class Context:
    """`ctx`: the play's handle on its run."""

    def __init__(self, services: RunServices, play_name: str, play_input: Any = None) -> None:
        self._s = services
        self.play_input = play_input  # what the play was started with (a map's cells are keyed on it)
        scope = services.scope
        self.run = RunInfo(scope.run_id, scope.attempt, services.cwd)
        self.play = PlayInfo(play_name, services.play_file)
        self.tools = Tools(services)
        self.secrets = services.secrets

    def log(self, message: str, **fields: Any) -> None:
        """A run log line, with optional fields (JSON values) to filter on later (`deepline
        runs logs --where name=value`); a resume replaying the play body does not write it again."""
        self._s.log(message, key=self._s.journal.log_key(), fields=log_fields(fields))

    async def step(
        self,
        id: str,
        fn: Callable[[], Any],
        *,
        stale_after_seconds: Staleness = None,
        _journal: bool = True,
    ) -> Any:
        """A durable memoised value: `fn` runs once per run; resumes get the stored value
        (unless older than `stale_after_seconds`, a number or a function of that value)."""
        scope = self._s.scope
        if _journal:
            self._s.journal.reach(f"step:{id}", scope.run_id)
        key = receipt_key("step", scope.workspace, scope.run_id, id)
        call = DurableCall(
            key=key,
            kind="step",
            label=id,
            stale_after_s=await staleness_of(self._s.book, key, stale_after_seconds),
        )

        async def invoke(_: ToolCall) -> Any:
            value = fn()
            if inspect.isawaitable(value):
                value = await value
            # Round-trip now so a resumed run sees exactly what a fresh one saw.
            return _json.loads(_json.dumps(value))

        return (await self._s.book.execute(call, invoke)).value

    async def fetch(
        self,
        id: str,
        url: str,
        *,
        method: str = "GET",
        headers: Mapping[str, str] | None = None,
        json: Any = None,
        stale_after_seconds: Staleness = None,
        timeout_s: float = 30.0,
        _journal: bool = True,
    ) -> FetchResult:
        """A durable HTTP request: made once per run and id (unless its answer is older than
        `stale_after_seconds`, a number or a function of the stored answer); secrets are
        redacted."""
        scope = self._s.scope
        if _journal:
            self._s.journal.reach(f"fetch:{id}", scope.run_id)
        key = receipt_key("fetch", scope.workspace, scope.run_id, id)
        call = DurableCall(
            key=key,
            kind="fetch",
            label=id,
            stale_after_s=await staleness_of(self._s.book, key, stale_after_seconds),
            input={"method": method.upper(), "url": url, **({"json": json} if json is not None else {})},
        )
        request = Request(method.upper(), url, dict(headers or {}), {}, json)

        async def invoke(info: ToolCall) -> Any:
            return await fetch_once(self._s.http, request, label=id, timeout_s=timeout_s, retries=3, call=info)

        stored = (await self._s.book.execute(call, invoke)).value
        return FetchResult(stored["ok"], stored["status"], stored["headers"], stored["text"])

    async def run_play(
        self, id: str, play_ref: str, input: Any = None, *, description: str = "", _journal: bool = True
    ) -> Any:
        """Run a child play (a play name, or "path/to/file.py[:function]") → its output."""
        from deepline_cli.runtime.run.children import run_play

        return await run_play(self._s, id, play_ref, {} if input is None else input, description, _journal)

    async def sleep(self, id: str, seconds: float) -> None:
        """A durable timer: short waits sleep inline, long ones suspend the run (`waiting`)."""
        from deepline_cli.runtime.run.suspension import sleep

        await sleep(self._s, id, seconds)

    async def wait_for_event(self, id: str, *, timeout_s: float | None = None) -> Any:
        """Suspend until `deepline events send RUN_ID ID --payload JSON`; returns the payload."""
        from deepline_cli.runtime.run.suspension import wait_for_event

        return await wait_for_event(self._s, id, timeout_s)

    def csv(
        self,
        path: str | Path,
        *,
        rename: Mapping[str, str] | None = None,
        required: Sequence[str] | None = None,
        columns: Mapping[str, str | Sequence[str]] | None = None,
        description: str = "",
    ) -> CsvSource:
        """A row source read lazily from a CSV; required columns are checked now.
        `columns={"domain": ["Website", "Company Domain"]}`: the headers a column may have."""
        source = CsvSource(
            self.resolve_path(path), rename=rename, required=required, columns=columns, description=description
        )
        if not source.has_rows():
            self.warn(f"The CSV {source.path} has no rows, only a header: there is nothing to do with it.")
        return source

    def warn(self, message: str) -> None:
        """A warning from the runtime about what the play was given (a log line, shown live)."""
        self._s.log(message, level="warning")

    async def map(
        self,
        name: str,
        rows: Iterable[Mapping[str, Any]],
        columns: Mapping[str, Callable[..., Any] | Column],
        *,
        key: RowKey = None,
        on_row_error: Literal["isolate", "fail"] = "isolate",
        concurrency: int | None = None,
        limit: int | None = None,
    ) -> Dataset:
        """Resolve `columns` for every distinct row; persisted as a sheet (see the map engine)."""
        from deepline_cli.runtime.map.engine import MapRun

        engine = MapRun(
            self,
            self._s,
            name,
            rows,
            columns,
            key=key,
            on_row_error=on_row_error,
            concurrency=concurrency,
            limit=limit,
        )
        return await engine.run()

    def resolve_path(self, path: str | Path) -> Path:
        """A relative path resolves against the directory the run was started in."""
        candidate = Path(path).expanduser()
        return candidate if candidate.is_absolute() else Path(self._s.cwd) / candidate
