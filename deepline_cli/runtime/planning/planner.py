"""`deepline plan`: what a run would call and spend, found without calling anything.

The play body runs with a planning context. In a map, each row goes through the map
engine's own logic (keys, duplicates, limit, which cells the sheet can give back); a
cell that would be computed runs its resolver with a planning `rc`, whose
`tools.execute` computes the receipt key exactly as a real call does (`Tools.receipt_key`)
and decides it with the receipt state machine (`decide_claim`):

    a completed receipt that would be reused → its stored output: the resolver goes on
    a failure that would be replayed         → the stored failure is raised, as in a run
    anything else                            → a new call to TOOL: the resolver stops here

What a stopped resolver might still call, and what columns after it (which need its
answer) might call, is bounded by the tools their code names (runtime/map/toolscan.py):
the worst case calls each of them once. The expected case weighs those tools by how
often earlier runs of the play called them per row of this map (the calls ledger), or,
with no earlier runs, counts only the first tool each column names.

Outside maps, `ctx.step`, `ctx.fetch`, `ctx.run_play`, `ctx.sleep` and
`ctx.wait_for_event` return what the play's latest run with the same input stored;
without one, planning stops there ("not planned") and reports what it learned.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from deepline_cli.errors import DeeplineError
from deepline_cli.runtime.calls.budget import Budget, expected_cost
from deepline_cli.runtime.calls.call_scope import CellScope, current_cell, enter_cell
from deepline_cli.runtime.calls.caps import Caps
from deepline_cli.runtime.calls.events import EventBus
from deepline_cli.runtime.calls.identity import Identity
from deepline_cli.runtime.calls.receipts import receipt_key, stored_failure
from deepline_cli.runtime.calls.stats import RunStats
from deepline_cli.runtime.calls.store_thread import StoreIO
from deepline_cli.runtime.calls.tool_calls import Staleness, Tools, staleness_of
from deepline_cli.runtime.map import failures
from deepline_cli.runtime.map.columns import Column, ResolvedColumn
from deepline_cli.runtime.map.engine import MapRun, resolve_cell
from deepline_cli.runtime.map.pilot import whole_row_reusable
from deepline_cli.runtime.map.reuse import previous_value, refresh_after
from deepline_cli.runtime.map.row_context import PendingRow, RowContext
from deepline_cli.runtime.map.rows import CsvSource, RowKey
from deepline_cli.runtime.map.toolscan import runs_child_plays, tool_ids
from deepline_cli.runtime.providers.config import Config, load_config
from deepline_cli.runtime.providers.http import FetchResult
from deepline_cli.runtime.providers.tools import ToolDef, ToolResult, find_tool
from deepline_cli.runtime.run.context import Context
from deepline_cli.runtime.run.parts import Journal, RunParts, Settings, build_parts
from deepline_cli.runtime.run.play import PlayDef
from deepline_cli.runtime.run.play_input import play_input
from deepline_cli.store.claims import decide_claim
from deepline_cli.store.records import Claim
from deepline_cli.store.roles import Store

PLAN_RUN_ID = "plan"
_TOOL_ID = re.compile(r"^[a-z0-9_-]+(\.[a-z0-9_-]+)+$")


class NotPlanned(BaseException):
    """What follows depends on something only a real run can tell: planning stops here.

    A BaseException, so a play's or resolver's `except Exception` cannot swallow it.
    """

    def __init__(self, reason: str, *, unbounded: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.unbounded = unbounded  # what follows may call anything (a child play): no maximum is known


class NewCall(NotPlanned):
    """A resolver reached a call that would be made (and billed) for real."""

    def __init__(self, tool: str, credits: float, shared: bool, *, unpriced: bool = False) -> None:
        super().__init__(f"new call to {tool}")
        self.tool, self.credits, self.shared = tool, credits, shared
        self.unpriced = unpriced  # its answers say their price, and none is known yet: no maximum


@dataclass
class Tracker:
    """The calls one resolver (or the play body) reached while planning."""

    called: set[str] = field(default_factory=set)  # tools answered from receipts
    paid: int = 0
    new: list[tuple[str, float, bool]] = field(default_factory=list)  # (tool, credits, shared)


_TRACKER: ContextVar[Tracker | None] = ContextVar("deepline_plan_tracker", default=None)


@dataclass
class Credits:
    min: float = 0.0
    expected: float = 0.0
    max: float = 0.0
    unbounded: bool = False  # calls only a real run can tell (a child play's)

    def add(self, low: float, expected: float, high: float | None) -> None:
        self.min += low
        self.expected += expected
        if high is None:
            self.unbounded = True
        else:
            self.max += high

    def as_dict(self) -> dict[str, float | None]:
        high = None if self.unbounded else round(self.max, 4)
        return {"min": round(self.min, 4), "expected": round(self.expected, 4), "max": high}


KEPT_FAILURE = "keeps the failure an earlier run recorded; a run with --refresh-failed asks again"


@dataclass
class ColumnPlan:
    column: str
    tools: list[str]
    credits_each: dict[str, float]
    run_if: bool
    # No tool id in its code and no `rc` to call one with (`lambda row: ...`): a cell that
    # depends on another column's value still calls nothing.
    calls_nothing: bool = False
    child_plays: bool = False  # its code runs child plays: what a cell calls has no known bound
    reused_cells: int = 0  # cells the sheet gives back (same row input and column code)
    paid_calls: int = 0  # calls answered by receipts that exist (no new bill)
    new_calls: int = 0  # calls that would be made for sure
    shared_calls: int = 0  # calls another row of this plan makes already (billed once)
    dependent_rows: int = 0  # rows whose calls here depend on answers known only after running
    # The calls those rows, and rows whose first call is new (a waterfall's next steps), may
    # make besides: each tool the column names and the row has not called yet, once.
    dependent_calls: int = 0
    failed_rows: int = 0
    credits: Credits = field(default_factory=Credits)
    reasons: dict[str, int] = field(default_factory=dict)
    steps: list[str] | None = None  # a waterfall's steps, in order
    step_hits: dict[str, int] = field(default_factory=dict)  # what earlier runs' steps found (rows)

    def note(self, reason: str) -> None:
        self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def unbounded_by_child_plays(self, *, said: bool = False) -> None:
        """A cell of a column that runs child plays: what they call is known only by running
        them, so the column has no maximum (`said`: a note says so already)."""
        self.credits.add(0.0, 0.0, None)
        if not said:
            self.note("runs child plays; what they call is not counted")

    def as_dict(self) -> dict[str, Any]:
        return {
            "column": self.column,
            "tools": {t: self.credits_each.get(t, 0.0) for t in self.tools},
            "run_if": self.run_if,
            "reused_cells": self.reused_cells,
            "paid_calls": self.paid_calls,
            "new_calls": self.new_calls,
            "shared_calls": self.shared_calls,
            "dependent_rows": self.dependent_rows,
            "dependent_calls": self.dependent_calls,
            "failed_rows": self.failed_rows,
            "credits": self.credits.as_dict(),
            "notes": [f"{reason} ({n:,} row{'s' if n != 1 else ''})" for reason, n in self.reasons.items()],
            **({"steps": self.steps, "step_hits": self.step_hits} if self.steps is not None else {}),
        }


@dataclass
class History:
    """How often earlier runs called each tool per row of a map, and paid for it (a
    completed call; a failed one costs nothing): the calls ledger."""

    rows: int = 0
    per_tool: dict[str, int] = field(default_factory=dict)  # rows where the tool was called
    paid: dict[str, int] = field(default_factory=dict)  # rows where a call of it completed

    def rate(self, tool: str) -> float:
        """How often a row pays for `tool`."""
        return self.paid.get(tool, 0) / self.rows if self.rows else 0.0

    def after(self, tool: str, first: str) -> float:
        """How often a row that called `first` pays for `tool` (capped at 1)."""
        base = self.per_tool.get(first, 0)
        return min(1.0, self.paid.get(tool, 0) / base) if base else self.rate(tool)

    def pays(self, tool: str) -> float:
        """How often a call of `tool` is paid for (1 with no history of it)."""
        called = self.per_tool.get(tool, 0)
        return self.paid.get(tool, 0) / called if called else 1.0


@dataclass
class MapPlan:
    map: str
    input_rows: int = 0
    distinct: int = 0
    duplicate: int = 0
    limit: int | None = None
    paid_rows: int = 0  # rows the sheet gives back whole: nothing to call
    blank_rows: int = 0  # rows a blank required CSV column fails: nothing to call
    columns: list[ColumnPlan] = field(default_factory=list)
    history_rows: int = 0

    def as_dict(self) -> dict[str, Any]:
        total = Credits()
        for c in self.columns:
            total.add(c.credits.min, c.credits.expected, None if c.credits.unbounded else c.credits.max)
        return {
            "map": self.map,
            "input_rows": self.input_rows,
            "distinct": self.distinct,
            "duplicate": self.duplicate,
            "limit": self.limit,
            "paid_rows": self.paid_rows,
            "blank_rows": self.blank_rows,
            "reused_cells": sum(c.reused_cells for c in self.columns),
            "paid_calls": sum(c.paid_calls for c in self.columns),
            "new_calls": sum(c.new_calls for c in self.columns),
            "dependent_calls": sum(c.dependent_calls for c in self.columns),
            "credits": total.as_dict(),
            "expected_from": (
                f"hit rates of {self.history_rows:,} rows of earlier runs"
                if self.history_rows
                else "no earlier runs: each column's first tool answers"
            ),
            "columns": [c.as_dict() for c in self.columns],
        }


@dataclass
class Plan:
    """What `deepline plan` found: per map its rows, paid rows and columns' calls and credits,
    the calls the body makes itself, and why planning stopped early, if it did."""

    play: str
    maps: list[MapPlan] = field(default_factory=list)
    body: Tracker = field(default_factory=Tracker)
    body_tools: dict[str, float] = field(default_factory=dict)  # tools the body itself names
    stopped: str | None = None  # why planning stopped before the play's end
    reference_run: str | None = None
    warnings: list[str] = field(default_factory=list)  # what a run would warn of (an empty CSV…)

    def as_dict(self) -> dict[str, Any]:
        maps = [m.as_dict() for m in self.maps]
        body_new = [(t, c) for t, c, shared in self.body.new if not shared]
        credits = Credits()
        for m in maps:
            credits.add(m["credits"]["min"], m["credits"]["expected"], m["credits"]["max"])
        # Tools the body names beyond its maps' columns and the calls it reached.
        seen = {t for m in self.maps for c in m.columns for t in c.tools} | {t for t, _, _ in self.body.new}
        unplanned = {t: c for t, c in self.body_tools.items() if t not in seen}
        body_credits = sum(c for _, c in body_new)
        # Stopped before the play's end at a call of its body (it may be made again after) or
        # where what follows names tools it may call (how often is not known): no maximum.
        credits.add(body_credits, body_credits, None if self.stopped and (unplanned or body_new) else body_credits)
        return {
            "play": self.play,
            "reference_run": self.reference_run,
            "maps": maps,
            "body": {
                "paid_calls": self.body.paid,
                "new_calls": [{"tool": t, "credits": c} for t, c in body_new],
                "may_also_call": unplanned if self.stopped else {},
            },
            "stopped": self.stopped,
            "complete": self.stopped is None,
            "warnings": self.warnings,
            "totals": {
                "rows": sum(m["distinct"] for m in maps),
                "paid_rows": sum(m["paid_rows"] for m in maps),
                "paid_calls": sum(m["paid_calls"] for m in maps) + self.body.paid,
                "new_calls": sum(m["new_calls"] for m in maps) + len(body_new),
                "dependent_calls": sum(m["dependent_calls"] for m in maps),
                "credits": credits.as_dict(),
            },
        }


class PlanTools(Tools):
    """`ctx.tools` / `rc.tools` while planning: receipts are looked up, never claimed."""

    def __init__(self, parts: RunParts, planner: Planner) -> None:
        who, effects = parts.identity, parts.effects
        super().__init__(who, effects.book, effects.governor, effects.tools, effects.caps, parts.log)
        self._parts = parts
        self._planner = planner

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
        tracker = _TRACKER.get() or self._planner.plan.body
        definition = self._resolve(tool)
        key = self.receipt_key(definition, input)  # exactly the key a real call claims
        stale = await staleness_of(self._parts.effects.book, key, stale_after_seconds)
        return await self._planner.tool_call(tracker, definition, key, force, stale)

    def declared(self, tool_id: str) -> ToolDef | None:
        """The tool's definition if `tool_id` names one this run could call. Any id could be
        a remote tool: only ids `[remote] credits` names, or shaped like one (`vendor.tool`)."""
        tools = self._parts.effects.tools
        local = tools.local.get(tool_id) or find_tool(tool_id)
        config = tools.http_tools.config
        if local is not None or tool_id in config.tools:
            return local or tools.http_tools.definition(tool_id)
        if config.remote is None or not (tool_id in config.remote.credits or _TOOL_ID.match(tool_id)):
            return None
        try:
            return tools.http_tools.definition(tool_id)
        except DeeplineError:  # its API key is not set: a real call says so
            return None


class PlanDataset:
    """A map's rows, when planning could tell every cell without running."""

    __fingerprint_as__: ClassVar[str] = "deepline.Dataset"

    def __init__(self, name: str, rows: list[dict[str, Any]], failed: int) -> None:
        self.name, self._rows, self.failed_count = name, rows, failed

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._rows)

    def failed_rows(self) -> Iterator[dict[str, Any]]:
        return (row for row in self._rows if "_error" in row)

    def to_csv(self, path: Any) -> int:
        raise NotPlanned(f"map {self.name!r} is written to {path} only by a real run")

    def to_jsonl(self, path: Any) -> int:
        raise NotPlanned(f"map {self.name!r} is written to {path} only by a real run")


class PlanContext(Context):
    """`ctx` while planning: nothing with an effect happens."""

    def __init__(self, parts: RunParts, planner: Planner, play_input: Any = None) -> None:
        super().__init__(parts, planner, play_input)
        self.tools: PlanTools = PlanTools(parts, planner)
        self._planner = planner

    def log(self, message: str, **fields: Any) -> None:
        return None

    def warn(self, message: str) -> None:
        self._planner.plan.warnings.append(message)

    async def step(
        self,
        id: str,
        fn: Callable[[], Any],
        *,
        stale_after_seconds: Staleness = None,
        _journal: bool = True,
        _cell: str = "",
    ) -> Any:
        return await self._planner.stored("step", id)

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
        stored = await self._planner.stored("fetch", id)
        return FetchResult(stored["ok"], stored["status"], stored["headers"], stored["text"])

    async def run_play(
        self, id: str, play_ref: str, input: Any = None, *, description: str = "", _journal: bool = True
    ) -> Any:
        return await self._planner.stored("run_play", id, label=play_ref)

    async def sleep(self, id: str, seconds: float) -> None:
        await self._planner.boundary(f"sleep:{id}")

    async def wait_for_event(self, id: str, *, timeout_s: float | None = None) -> Any:
        return await self._planner.boundary(f"event:{id}")

    async def map(  # type: ignore[override]
        self,
        name: str,
        rows: Iterable[Mapping[str, Any]],
        columns: Mapping[str, Callable[..., Any] | Column],
        *,
        key: RowKey = None,
        on_row_error: Literal["isolate", "fail"] = "isolate",
        concurrency: int | None = None,
        limit: int | None = None,
    ) -> PlanDataset:
        bounded = Bounded(rows)
        # A CSV or a list goes to the engine as it is: the engine knows a CSV (its path is not
        # part of a cell's fingerprint, its required columns are checked per row).
        engine = MapRun(
            self,
            self.map_parts(),
            name,
            rows if bounded.finite else bounded,
            columns,
            key=key,
            on_row_error=on_row_error,
            concurrency=1,
            limit=limit,
        )
        return await self._planner.plan_map(engine, RowPlanner(self._planner, engine), bounded)


GENERATOR_ROWS = 100_000  # a row source of unknown length is planned this far


class Bounded:
    """A map's rows while planning: a source of unknown length (a generator, perhaps one that
    never ends) is read only to GENERATOR_ROWS rows; a list or a CSV whole."""

    def __init__(self, rows: Iterable[Mapping[str, Any]]) -> None:
        self.rows = rows
        self.finite = isinstance(rows, CsvSource) or hasattr(rows, "__len__")
        self.cut = False
        self.columns = getattr(rows, "columns", None)
        self.description = getattr(rows, "description", "")
        self.path = getattr(rows, "path", None)  # a CSV's: left out of the input cells are keyed on

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        for read, row in enumerate(self.rows):
            if not self.finite and read >= GENERATOR_ROWS:
                self.cut = True
                return
            yield row


class PlanRow(dict[str, Any]):
    """A row while planning, after columns whose values only a real run can tell: reading one
    of them stops the resolver there, as depending on that column. A resolver that reads only
    the row's input or known columns goes on, and its calls are planned like any other."""

    def __init__(self, row: Mapping[str, Any], unknown: Sequence[str]) -> None:
        # An unknown column named like an input field replaces it: its input value is not
        # what the resolver will read (a found email, where the CSV's was blank).
        super().__init__({name: value for name, value in row.items() if name not in unknown})
        self.unknown = tuple(unknown)

    def __missing__(self, name: str) -> Any:
        if name in self.unknown:
            raise NotPlanned(f"depends on {name!r}, known only after running")
        raise KeyError(name)

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default  # noqa: SIM401 (self.get is this method)

    def __contains__(self, name: object) -> bool:
        return name in self.unknown or super().__contains__(name)

    # Whole-row reads (`dict(row)`, `{**row}`, `row.items()`) read every column, unknown ones too.
    def __iter__(self) -> Iterator[str]:
        yield from super().__iter__()
        yield from (name for name in self.unknown if not super().__contains__(name))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def keys(self) -> Any:
        return list(self)

    def items(self) -> Any:
        return [(name, self[name]) for name in self]

    def values(self) -> Any:
        return [self[name] for name in self]


class RowPlanner:
    """Plans one map's rows, one at a time, with the map engine's own decisions."""

    def __init__(self, planner: Planner, engine: MapRun) -> None:
        self.planner, self.engine = planner, engine
        self.history = planner.history(engine.name)
        self.columns = [planner.column_plan(c) for c in engine.columns]
        hits = planner.step_history(engine.name)
        for plan, column in zip(self.columns, engine.columns, strict=True):
            if column.name in engine.waterfalls:
                plan.steps, plan.step_hits = engine.waterfalls[column.name], hits.get(column.name, {})
        self.rows: list[dict[str, Any]] | None = []  # None once a row's values are unknown
        self.failed = 0

    async def row(self, job: PendingRow) -> None:
        engine = self.engine
        row, changed = job.row, False
        unknown: list[str] = []  # columns whose values only a real run can tell
        certain = True  # the row surely gets to the next column (no earlier one may fail it)
        reached: set[str] = set()  # tools this row's earlier columns call: a later call of one is likely shared
        rc = RowContext(engine.ctx, engine.s, engine.name, job.key, job.idx)
        for column, plan in zip(engine.columns, self.columns, strict=True):
            # After an unknown column, a cell is recomputed (its calls may still hit receipts);
            # a resolver that reads an unknown column depends on that one (PlanRow).
            cell = engine.reuse.cell(job.previous, job.digest, column, changed or bool(unknown))
            if cell is not None:
                plan.reused_cells += 1
                row[column.name] = cell.value
                if cell.error is not None:  # a run gives it back failed, calling nothing
                    plan.failed_rows += 1
                    plan.note(KEPT_FAILURE)
                    return self._keep(row, cell.error)
                continue
            before = job.previous.cells.get(column.name) if job.previous else None
            rc.previous = previous_value(before)
            enter_cell(CellScope(engine.name, job.key, refresh_after(column, before)))
            given = PlanRow(row, unknown) if unknown else row
            outcome = await self._resolve(column, plan, given, rc, reached, certain=certain)
            if isinstance(outcome, _Failed):
                return self._keep(row, outcome.error)
            if isinstance(outcome, _Stopped):
                unknown.append(column.name)
                certain = certain and outcome.sure
                continue
            changed = changed or before is None or before.value != outcome.value
            row[column.name] = outcome.value
        if unknown:
            self.rows = None
        self._keep(row, None)

    async def _resolve(
        self,
        column: ResolvedColumn,
        plan: ColumnPlan,
        row: dict[str, Any],
        rc: RowContext,
        reached: set[str],
        *,
        certain: bool = True,
    ) -> Any:
        """The cell's value, or why a real run is needed to know it. `certain`: the row surely
        gets to this cell (no earlier column whose answer is unknown calls a tool that has
        failed calls before: one may fail the row)."""
        tracker = Tracker()
        token = _TRACKER.set(tracker)
        try:
            return _Value((await resolve_cell(column, row, rc))[0])
        except NewCall as stop:
            self._stopped_at(plan, stop, tracker, reached, certain)
            reached.add(stop.tool)
            return _Stopped(sure=all(self.history.pays(tool) >= 1.0 for tool in plan.tools))
        except NotPlanned as stop:
            self._dependent(plan, stop.reason, tracker, reached, said_unbounded=stop.unbounded)
            plan.credits.unbounded = plan.credits.unbounded or stop.unbounded
            return _Stopped()
        except DeeplineError as exc:
            if exc.fatal or exc.exit_code != 1:
                raise
            plan.failed_rows += 1
            plan.note(f"would fail: {failures.describe(exc)}")
            return _Failed(str(exc))
        except Exception as exc:
            plan.failed_rows += 1
            if failures.is_play_bug(exc):  # the run stops at the first such row, calling nothing more
                plan.note(f"stops the run at its first row: {failures.describe(exc)}; fix the play first")
            else:
                plan.note(f"would fail: {failures.describe(exc)}")
            return _Failed(f"{type(exc).__name__}: {exc}")
        finally:
            _TRACKER.reset(token)
            plan.paid_calls += tracker.paid
            reached.update(tracker.called)

    def _stopped_at(
        self, plan: ColumnPlan, stop: NewCall, tracker: Tracker, reached: set[str], certain: bool = True
    ) -> None:
        """A resolver reached a new call: it is certain where the row surely gets to it
        (`certain`: an earlier column may fail the row, and the cells after it are not
        computed); what it may call after depends on the answer (each remaining tool
        at most once, in the worst case; expected unless an earlier column of the row calls
        it: then most likely the same call, paid once)."""
        for tool, credits in [(stop.tool, stop.credits), *((t, 0.0) for t in tracker.called)]:
            if tool not in plan.tools:  # an id the code scan could not see (built at run time)
                plan.tools.append(tool)
                plan.credits_each.setdefault(tool, credits)
        if stop.shared:
            plan.shared_calls += 1
        else:
            plan.new_calls += 1
            paid = self.history.pays(stop.tool)  # a call that may fail (a 404) may cost nothing
            plan.credits.add(
                stop.credits if paid >= 1.0 and certain else 0.0,
                stop.credits * paid,
                None if stop.unpriced else stop.credits,
            )
            if stop.unpriced:
                plan.note(f"{stop.tool} prices its answers itself and none is known yet: no maximum")
        if plan.child_plays:  # then it runs child plays
            plan.unbounded_by_child_plays()
        rest = [t for t in plan.tools if t != stop.tool and t not in tracker.called]
        if rest:
            plan.dependent_calls += len(rest)
            plan.note(f"after {stop.tool}, may call {', '.join(rest)} depending on its answer")
            high = sum(plan.credits_each.get(t, 0.0) for t in rest)
            expected = sum(
                plan.credits_each.get(t, 0.0) * self.history.after(t, stop.tool) for t in rest if t not in reached
            )
            plan.credits.add(0.0, expected, high)

    def _dependent(
        self, plan: ColumnPlan, reason: str, tracker: Tracker | None, reached: set[str], *, said_unbounded: bool = False
    ) -> None:
        """A cell whose calls cannot be known before running: bounded by the tools it names,
        unless it runs child plays (`said_unbounded`: the reason says so already)."""
        if plan.calls_nothing:  # its value waits for another column's; no call does
            return
        plan.dependent_rows += 1
        plan.note(reason + (" (then its run_if decides)" if plan.run_if and reason.startswith("depends on") else ""))
        called = tracker.called if tracker is not None else set()
        rest = [t for t in plan.tools if t not in called]
        plan.dependent_calls += len(rest)
        high = sum(plan.credits_each.get(t, 0.0) for t in rest)
        if plan.child_plays:
            plan.unbounded_by_child_plays(said=said_unbounded)
        rest = [t for t in rest if t not in reached]  # an earlier column's call: most likely shared
        if self.history.rows:
            expected = sum(plan.credits_each.get(t, 0.0) * self.history.rate(t) for t in rest)
        else:  # no earlier runs: the first tool the column names answers
            expected = plan.credits_each.get(rest[0], 0.0) if rest else 0.0
        plan.credits.add(0.0, expected, high)

    def _keep(self, row: dict[str, Any], error: str | None) -> None:
        if error is not None:
            self.failed += 1
            # As the run's rows have it: the columns after the failure hold None.
            missing = {c.name: None for c in self.engine.columns if c.name not in row}
            row = {**row, **missing, "_error": error}
        if self.rows is not None:
            self.rows.append(row)


@dataclass
class _Value:
    value: Any


@dataclass
class _Failed:
    error: str


@dataclass
class _Stopped:
    sure: bool = True  # the row surely gets past the column (none of its tools has failed a call before)


@dataclass
class PlanOptions:
    workspace: str = "default"
    limit: int | None = None
    refresh_failed: bool = False
    force_refresh: bool = False


class Planner:
    """Runs a play's body without calling any provider: every call is looked up in the
    store (paid already, or new), maps walk their input through the same intake and reuse
    decisions as a run, and a new call's answer is unknown, so what depends on it is
    counted as a range. Nothing is written."""

    def __init__(self, play: PlayDef, config_path: Path | None, store: Store, options: PlanOptions) -> None:
        self.play, self.store, self.options = play, store, options
        self.config = load_config(config_path)
        self.plan = Plan(play.name)
        self._learned: dict[str, float] | None = None  # the most each tool has cost here (tool_costs)
        self._unpriced: set[str] = set()  # tools whose answers say their price, none known yet
        self.reference: str | None = None
        self._planned: set[str] = set()  # receipt keys this plan counts as new calls already
        self.io = StoreIO(store)
        self.services = self._services(self.config, config_path)

    def close(self) -> None:
        self.io.close()

    def _services(self, config: Config, config_path: Path | None) -> RunParts:
        """The parts of a run, built as a run builds them: planning claims nothing, but keys
        and looks up receipts exactly as the run would."""
        options = self.options
        identity = Identity(
            run_id=PLAN_RUN_ID,
            attempt=1,
            play=self.play.name,
            workspace=options.workspace,
            lease_ttl=30.0,
            force_refresh=options.force_refresh,
            refresh_failed=options.refresh_failed,
            ancestors=(self.play.name,),
            play_file=self.play.file,
            cwd=str(Path.cwd()),
        )
        config_file = str(config_path) if config_path else None
        return build_parts(
            identity,
            self.io,
            EventBus(),
            RunStats(),
            config=config,
            budget=Budget(None),
            caps=Caps(),
            journal=Journal([]),
            local_tools=self.play.tools(),
            settings=Settings(concurrency=1, limit=options.limit, config=config_file),
            env_folder=Path(self.play.file).parent,
        )

    async def run_play(
        self, parts: RunParts, id: str, play_ref: str, input: Any, description: str, journal: bool
    ) -> Any:
        """Child plays while planning (the `ChildPlays` port): what the reference run stored."""
        return await self.stored("run_play", id, label=play_ref)

    async def run(self, input: Any) -> Plan:
        self.reference = await self.io.call(self._reference_run, input)
        self.plan.reference_run = self.reference
        input = play_input(input)
        ctx = PlanContext(self.services, self, input)
        self.plan.body_tools = self._credits_of(tool_ids([self.play.fn], lambda t: ctx.tools.declared(t) is not None))
        try:
            await self.play.fn(ctx, input)
        except NotPlanned as stop:
            self.plan.stopped = stop.reason
        except DeeplineError:
            raise
        except Exception as exc:
            raise DeeplineError(f"The play failed while planning: {type(exc).__name__}: {exc}.") from exc
        return self.plan

    def _reference_run(self, input: Any) -> str | None:
        """The play's latest run with the same input: stored steps, fetches and child plays."""
        for run in self.store.runs.list_runs(play=self.play.name):
            if run.parent_run_id is None and run.workspace == self.options.workspace and run.input == input:
                return run.run_id
        return None

    # --- what the planning context asks ------------------------------------------------

    async def tool_call(
        self, tracker: Tracker, definition: ToolDef, key: str, force: bool, stale_after_s: float | None
    ) -> ToolResult:
        receipt = await self.io.call(self.store.receipts.get_receipt, key)
        verdict = "claimed"
        if receipt is not None:
            scope = self.services.identity
            claim = Claim(
                key=key, kind="tool", label="", tool=definition.id, run_id=PLAN_RUN_ID, attempt=1, lease_id="",
                lease_expires_at=0.0, idempotency_key="", force=force or scope.force_refresh,
                stale_after_s=stale_after_s, refresh_failed=scope.refresh_failed,
                refresh_after_s=cell.refresh_after_s if (cell := current_cell()) is not None else None,
            )  # fmt: skip
            verdict = decide_claim(receipt, claim, self.io.now())
        if receipt is not None and verdict == "reused":
            tracker.paid += 1
            tracker.called.add(definition.id)
            return ToolResult(receipt.output, "receipt", key, receipt.credits, definition.id, definition.extract)
        if receipt is not None and verdict == "failed":
            tracker.paid += 1
            tracker.called.add(definition.id)
            raise stored_failure(receipt)
        # busy: another live run makes this call now, and pays for it.
        shared = key in self._planned or verdict == "busy"
        self._planned.add(key)
        cost = self._cost(definition)
        tracker.new.append((definition.id, cost, shared))
        raise NewCall(definition.id, cost, shared, unpriced=definition.id in self._unpriced)

    async def stored(self, kind: str, id: str, *, label: str | None = None) -> Any:
        what = {"run_play": "child play"}.get(kind, kind)
        if self.reference is None:
            if kind == "run_play" and current_cell() is not None:  # one note for every row of the map
                raise NotPlanned(f"{what} {label or id!r} runs only in a real run; what it calls is not counted",
                                 unbounded=True)  # fmt: skip
            raise NotPlanned(f"{what} {id!r} runs only in a real run (no earlier run with this input)")
        scope = self.services.identity
        receipt = await self.io.call(
            self.store.receipts.get_receipt, receipt_key(kind, scope.workspace, self.reference, id)
        )
        if receipt is None or receipt.status != "completed":
            if kind == "run_play":  # what it would call is not known: no maximum (one note for every row)
                raise NotPlanned(f"{what} {label or id!r} has no stored result in run {self.reference}; what it "
                                 "calls is not counted", unbounded=True)  # fmt: skip
            raise NotPlanned(f"{what} {id!r} has no stored result in run {self.reference}")
        (_TRACKER.get() or self.plan.body).paid += 1
        return receipt.output

    async def boundary(self, boundary_id: str) -> Any:
        if self.reference is None:
            raise NotPlanned(f"{boundary_id} waits only in a real run")
        found = await self.io.call(self.store.suspension.get_boundary, self.reference, boundary_id)
        if found is None or found.status != "resolved":
            raise NotPlanned(f"{boundary_id} has not passed in run {self.reference}")
        return found.payload

    # --- maps ---------------------------------------------------------------------------

    def history(self, map_name: str) -> History:
        return History(*self.store.ledger.tool_rows(self.play.name, self.options.workspace, map_name))

    def step_history(self, map_name: str) -> dict[str, dict[str, int]]:
        return self.store.ledger.step_rows(self.play.name, self.options.workspace, map_name)

    def column_plan(self, column: ResolvedColumn) -> ColumnPlan:
        tools: PlanTools = PlanTools(self.services, self)
        fns = [column.column.fn] + ([column.column.run_if] if column.column.run_if else [])
        found = tool_ids(fns, lambda t: tools.declared(t) is not None)
        return ColumnPlan(
            column.name, found, self._credits_of(found), column.column.run_if is not None,
            calls_nothing=column.arity == 1 and not found, child_plays=runs_child_plays(fns),
        )  # fmt: skip

    def _credits_of(self, tool_ids: list[str]) -> dict[str, float]:
        tools = PlanTools(self.services, self)
        return {t: self._cost(d) for t in tool_ids if (d := tools.declared(t)) is not None}

    def _cost(self, definition: ToolDef) -> float:
        """What a call of the tool may cost: as declared, and for a tool whose answers say
        what they cost the most one has cost on this store, if more (as the budget holds)."""
        if not definition.metered:
            return definition.credits
        if self._learned is None:
            self._learned = self.store.receipts.tool_costs()
        if not definition.credits and definition.id not in self._learned:
            self._unpriced.add(definition.id)  # bounded by nothing known: the plan says so
        return expected_cost(definition.credits, self._learned.get(definition.id, 0.0))

    async def plan_map(self, engine: MapRun, rows: RowPlanner, source: Bounded) -> PlanDataset:
        plan = MapPlan(engine.name, limit=engine.limit, columns=rows.columns, history_rows=rows.history.rows)
        self.plan.maps.append(plan)
        for chunk in engine.intake.chunks():
            keys = [job.key for job in chunk]
            previous = await self.io.call(self.store.sheets.load_sheet_rows, engine.sheet, keys, with_input=False)
            for job in chunk:
                job.given(previous.get(job.key))
                if job.blank is not None:  # the run fails the row before any call (its kept failure, or anew)
                    plan.blank_rows += 1
                    rows._keep(job.row, job.blank)
                elif whole_row_reusable(engine, job):
                    plan.paid_rows += 1
                    for column in rows.columns:
                        cell = job.previous.cells.get(column.column)  # type: ignore[union-attr]
                        column.reused_cells += cell is not None
                        if cell is not None and cell.error is not None:  # a run gives it back failed
                            column.failed_rows += 1
                            column.note(KEPT_FAILURE)
                    rows._keep(_sheet_values(job), _first_error(job))
                else:
                    await rows.row(job)
        plan.input_rows, plan.duplicate = engine.read, engine.duplicate
        plan.distinct = engine.distinct
        if source.cut:
            raise NotPlanned(
                f"map {engine.name!r} reads its rows from a source of unknown length (a generator) that did not end "
                f"within {GENERATOR_ROWS:,} rows; the figures above are for those rows"
            )
        if rows.rows is None:
            raise NotPlanned(f"what follows map {engine.name!r} uses its results, known only after running")
        return PlanDataset(engine.name, rows.rows, rows.failed)


def _sheet_values(job: PendingRow) -> dict[str, Any]:
    values = dict(job.row)
    for name, cell in (job.previous.cells if job.previous else {}).items():
        values[name] = cell.value
    return values


def _first_error(job: PendingRow) -> str | None:
    cells = job.previous.cells if job.previous else {}
    return next((cell.error for cell in cells.values() if cell.error is not None), None)


def plan_play(play: PlayDef, input: Any, config_path: Path | None, store: Store, options: PlanOptions) -> Plan:
    """Plan a run of `play` on `input` against what `store` holds; no provider is called."""
    play.check_input(input)
    planner = Planner(play, config_path, store, options)
    try:
        return asyncio.run(planner.run(input))
    finally:
        planner.close()
