"""The context a play receives as `ctx`: everything with an effect goes through it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import sys
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from deepline_cli import _json
from deepline_cli._aio import Held, count_held, is_awaitable
from deepline_cli.errors import InputError, UsageError
from deepline_cli.runtime.calls.call_scope import current_cell
from deepline_cli.runtime.calls.events import log_fields
from deepline_cli.runtime.calls.receipts import DurableCall, durable_id, receipt_key
from deepline_cli.runtime.calls.tool_calls import Staleness, Tools, staleness_of
from deepline_cli.runtime.map.columns import Column
from deepline_cli.runtime.map.dataset import Dataset
from deepline_cli.runtime.map.engine import MapRun
from deepline_cli.runtime.map.host import MapParts
from deepline_cli.runtime.map.rows import CsvSource, RowKey
from deepline_cli.runtime.providers.config import RETRIES
from deepline_cli.runtime.providers.http import FetchResult, Request, fetch_once
from deepline_cli.runtime.providers.tools import ToolCall
from deepline_cli.runtime.run import suspension
from deepline_cli.runtime.run.parts import RunParts


@dataclass(frozen=True, slots=True)
class RunInfo:
    id: str
    attempt: int
    cwd: str


@dataclass(frozen=True, slots=True)
class PlayInfo:
    name: str
    file: str


class ChildPlays(Protocol):
    """A port for child plays: the run supplies it (run/children.py), so the context a play
    body is given knows nothing of how a child runs."""

    async def run_play(
        self, parts: RunParts, id: str, play_ref: str, input: Any, description: str, journal: bool
    ) -> Any: ...


class Context:
    """`ctx`: the play's handle on its run. Everything with an effect goes through it, and
    through a receipt: tools, steps, fetches, maps, child plays, timers and events."""

    # What a resolver closing over `ctx` is fingerprinted with: the same for a run's context
    # and `deepline plan`'s (another class), in every process.
    __fingerprint_as__: ClassVar[str] = "deepline.Context"

    def __init__(self, parts: RunParts, children: ChildPlays, play_input: Any = None) -> None:
        self._s = parts
        self._children = children
        self.play_input = play_input  # what the play was started with (a map's cells are keyed on it)
        who, effects = parts.identity, parts.effects
        self.run = RunInfo(who.run_id, who.attempt, who.cwd)
        self.play = PlayInfo(who.play, who.play_file)
        self.tools = Tools(who, effects.book, effects.governor, effects.tools, effects.caps, parts.log)
        self.secrets = parts.infra.secrets
        self._maps: set[str] = set()  # the maps this attempt ran: a map's name is its rows' identity
        self._asked: dict[str, Any] = {}  # what each durable key of this attempt was asked for (one_call)
        # Sleeps and waits asked for, with the task that asked, until awaited (check_waits).
        self._waits: list[tuple[Coroutine[Any, Any, Any], str, asyncio.Task[Any] | None]] = []
        self.tools.before = self.check_waits

    def log(self, message: str, **fields: Any) -> None:
        """A run log line, with optional fields (JSON values) to filter on later (`deepline
        runs logs --where name=value`); a resume replaying the play body does not write it again."""
        self._s.log(message, key=self._s.effects.journal.log_key(), fields=log_fields(fields))

    async def step(
        self,
        id: str,
        fn: Callable[[], Any],
        *,
        stale_after_seconds: Staleness = None,
        _journal: bool = True,
        _cell: str = "",
    ) -> Any:
        """A durable memoised value: `fn` runs once per run; resumes get the stored value
        (unless older than `stale_after_seconds`, a number or a function of that value).
        `_cell`: a map cell's (`rc.step`), what it is computed from (RowContext.enter)."""
        scope = self._s.identity
        self.check_waits()
        durable_id(id, "ctx.step")
        if _journal:
            self._s.effects.journal.reach(f"step:{id}", scope.run_id)
        key = await self._key("step", id, _cell)
        self._one_call(key, "step", id, _callable_token(fn))
        call = DurableCall(
            key=key,
            kind="step",
            label=id,
            stale_after_s=await staleness_of(self._s.effects.book, key, stale_after_seconds),
        )

        async def invoke(info: ToolCall) -> Any:
            journal, waited = self._s.effects.journal, len(self._s.effects.journal.waits)
            began = time.perf_counter()
            try:
                value = fn()
            finally:  # a plain `def` (that returned or raised): the event loop waited for it
                info.held_s = time.perf_counter() - began
                count_held(info.held_s)
            if is_awaitable(value):  # an `async def`'s own steps hold the loop too (a sync SDK inside)
                value = await Held(value, info)
            # What fn caught is not its value: a budget refusal stops the run, a wait makes it wait.
            if (tripped := self._s.effects.book.tripped) is not None:
                raise tripped
            if len(journal.waits) > waited:
                raise journal.waits[waited]
            # Round-trip now so a resumed run sees exactly what a fresh one saw.
            return _json.plain(value, f"The value of step {id!r}")

        return (await self._s.effects.book.execute(call, invoke)).value

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
        _cell: str = "",
    ) -> FetchResult:
        """A durable HTTP request: made once per run and id (unless its answer is older than
        `stale_after_seconds`, a number or a function of the stored answer); secrets are
        redacted."""
        scope = self._s.identity
        self.check_waits()
        durable_id(id, "ctx.fetch")
        if json is not None:  # refused before anything is sent, as a tool's input is (not sent as a repr)
            try:
                _json.canonical(json)
            except TypeError as exc:
                raise InputError(f"The json of ctx.fetch {id!r} cannot be sent: {exc}.") from None
        if _journal:
            self._s.effects.journal.reach(f"fetch:{id}", scope.run_id)
        key = await self._key("fetch", id, _cell)
        self._one_call(key, "fetch", id, (method.upper(), url, _json.canonical(json) if json is not None else None))
        call = DurableCall(
            key=key,
            kind="fetch",
            label=id,
            stale_after_s=await staleness_of(self._s.effects.book, key, stale_after_seconds),
            input={"method": method.upper(), "url": url, **({"json": json} if json is not None else {})},
        )

        async def invoke(info: ToolCall) -> Any:
            # The provider idempotency key of its receipt, on every retry (SPEC §3), unless
            # the play sends its own.
            sent = dict(headers or {})
            if not any(name.lower() == "idempotency-key" for name in sent):
                sent["Idempotency-Key"] = info.idempotency_key
            request = Request(method.upper(), url, sent, {}, json)
            return await fetch_once(
                self._s.effects.http, request, label=id, timeout_s=timeout_s, retries=RETRIES, call=info
            )

        stored = (await self._s.effects.book.execute(call, invoke)).value
        return FetchResult(stored["ok"], stored["status"], stored["headers"], stored["text"])

    def _one_call(self, key: str, kind: str, id: str, asked: Any) -> None:
        """A durable id names one call of the run: the same id given again for another call (a
        loop's constant id, `ctx` in a map column where `rc` keys by row) would be answered
        with the first one's result. Refused; the same call asked again is its answer."""
        first = self._asked.setdefault(key, asked)
        try:
            same = first is asked or bool(first == asked)
        except Exception:  # values that do not compare (arrays): not told apart
            same = True
        if same:
            return
        where = "; in a map column, rc." + kind + " keys it by the row" if current_cell() is not None else ""
        raise UsageError(
            f"ctx.{kind} id {id!r} was given to two different calls in this run: the second would be answered "
            f'with the first one\'s result. Give each call its own id, e.g. f"{id}-{{domain}}"{where}.'
        )

    async def _key(self, kind: str, id: str, cell: str) -> str:
        """The receipt key of a step or fetch `id` of this run; a map cell's (`cell`: what the
        cell is computed from, RowContext.enter) is its own. A run begun before a cell's calls
        were keyed so (Identity.row_keyed_steps) finds those its earlier attempts made under the
        row's key."""
        scope = self._s.identity
        if not cell:
            return receipt_key(kind, scope.workspace, scope.run_id, id)
        if scope.row_keyed_steps and scope.attempt > 1:  # one store read per call, for such runs only
            before = receipt_key(kind, scope.workspace, scope.run_id, id)
            if await self._s.effects.book.stored(before) is not None:
                return before
        return receipt_key(kind, scope.workspace, scope.run_id, id, cell)

    async def run_play(
        self, id: str, play_ref: str, input: Any = None, *, description: str = "", _journal: bool = True
    ) -> Any:
        """Run a child play (a play name, or "path/to/file.py[:function]") → its output."""
        self.check_waits()
        durable_id(id, "ctx.run_play")
        with contextlib.suppress(TypeError, ValueError):  # an input that is not JSON: refused as it runs
            self._one_call(f"run_play:{id}", "run_play", id, (play_ref, _json.canonical(input)))
        return await self._children.run_play(
            self._s, id, play_ref, {} if input is None else input, description, _journal
        )

    def sleep(self, id: str, seconds: float) -> Coroutine[Any, Any, None]:
        """A durable timer: short waits sleep inline, long ones suspend the run (`waiting`)."""
        self.check_waits()
        durable_id(id, "ctx.sleep")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0:
            raise UsageError(f"ctx.sleep({id!r}, seconds): seconds must be a number, 0 or more, not {seconds!r}.")
        return self._awaited(suspension.sleep(self._s, id, seconds), f"ctx.sleep({id!r}, {seconds!r})")

    def wait_for_event(self, id: str, *, timeout_s: float | None = None) -> Coroutine[Any, Any, Any]:
        """Suspend until `deepline events send RUN_ID ID --payload JSON`; returns the payload."""
        self.check_waits()
        durable_id(id, "ctx.wait_for_event")
        return self._awaited(suspension.wait_for_event(self._s, id, timeout_s), f"ctx.wait_for_event({id!r})")

    def _awaited(self, wait: Coroutine[Any, Any, Any], said: str) -> Coroutine[Any, Any, Any]:
        """A sleep or wait the play must await: one it does not (`await` left out) would let the
        run go on past it (an approval skipped), so the next durable call, or the body's end,
        refuses to (`check_waits`)."""
        caller = sys._getframe(2)  # the play's line that asked for it
        said = f"{said} ({Path(caller.f_code.co_filename).name}:{caller.f_lineno})"
        self._waits.append((wait, said, _current_task()))
        return wait

    def check_waits(self, *, ended: bool = False) -> None:
        """Refuse to go on past a sleep or wait the play asked for and did not await: checked
        as the task that asked goes on to another durable call, and as the body `ended`
        (another task's calls meanwhile are not its: `gather` starts the wait after them)."""
        if not self._waits:
            return
        task = None if ended else _current_task()
        mine = [w for w in self._waits if ended or w[2] is task]
        self._waits = [w for w in self._waits if not (ended or w[2] is task)]
        left = [(wait, said) for wait, said, _ in mine if inspect.getcoroutinestate(wait) == inspect.CORO_CREATED]
        if left:
            for wait, _ in left:
                wait.close()  # said here, not again as Python's "never awaited" warning
            said = left[0][1]
            raise UsageError(f"{said} was not awaited: the run would go on without waiting. Put `await` before it.")

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
        self.check_waits()
        if name in self._maps:
            raise UsageError(
                f"Map {name!r} ran already in this run: a map's name is the identity of its rows, so a "
                f"second map of that name would be answered with the first one's rows. Give each its own "
                f'name, e.g. ctx.map(f"{name}-{{Path(path).stem}}", ...).'
            )
        self._maps.add(name)
        engine = MapRun(
            self,
            self.map_parts(),
            name,
            rows,
            columns,
            key=key,
            on_row_error=on_row_error,
            concurrency=concurrency,
            limit=limit,
        )
        return await engine.run()

    def map_parts(self) -> MapParts:
        """The parts of this run a map works with."""
        s = self._s
        return MapParts(
            s.identity,
            s.infra.io,
            s.infra.writes,
            s.infra.bus,
            s.infra.stats,
            s.infra.secrets,
            s.effects.book.check_open,
            s.log,
            s.settings.concurrency,
            s.settings.limit,
            s.infra.progress,
            s.effects.tools.versions(),
            tripped=lambda: s.effects.book.tripped,
        )

    def resolve_path(self, path: str | Path) -> Path:
        """A relative path resolves against the directory the run was started in."""
        candidate = Path(path).expanduser()
        return candidate if candidate.is_absolute() else Path(self._s.identity.cwd) / candidate


def _callable_token(fn: Callable[..., Any]) -> Any:
    """What tells two steps' functions apart: their code and the values they close over (a
    loop's lambdas share their code), their object, their partial's arguments."""
    if isinstance(fn, functools.partial):
        return (_callable_token(fn.func), fn.args, tuple(sorted(fn.keywords.items())))
    code = getattr(fn, "__code__", None)
    if code is None:
        return fn
    cells = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # not set yet
            cells.append(None)
    return (code, tuple(cells), getattr(fn, "__self__", None))


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop
        return None
