"""The map engine: `ctx.map(name, rows, columns)` over thousands to millions of rows.

input rows ─► key ─► duplicate? ─► seeded by an earlier attempt? ─► sheet lookup (batched)
                                                                │
              every cell reusable ─► record the row (no call) ◄─┤
              else ─► workers: resolve columns in order, tool calls through receipts
                                                                │
sheet rows + map rows written with the receipts (group commit) ◄┘
─► visibility barrier (read back through the store) ─► finalization barrier ─► Dataset
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import inspect
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from deepline_cli import _json
from deepline_cli.errors import (
    DeeplineError,
    MapAccountingError,
    RunInterrupted,
    SheetVisibilityError,
    UsageError,
)
from deepline_cli.runtime.calls.call_scope import CellScope, enter_cell
from deepline_cli.runtime.calls.events import log_fields
from deepline_cli.runtime.calls.tool_calls import Staleness
from deepline_cli.runtime.map import failures
from deepline_cli.runtime.map.columns import Column, ResolvedColumn, resolve_columns
from deepline_cli.runtime.map.dataset import Dataset
from deepline_cli.runtime.map.host import MapHost, MapParts
from deepline_cli.runtime.map.pilot import scan_rest
from deepline_cli.runtime.map.reuse import ReusePolicy, previous_value, refresh_after
from deepline_cli.runtime.map.rows import CsvSource, RowKey, input_columns, key_function, row_digest
from deepline_cli.runtime.map.waterfall import Found, Waterfall
from deepline_cli.runtime.providers.found import is_found
from deepline_cli.runtime.providers.tools import ToolResult
from deepline_cli.store.records import FOUND_PREFIX, NOT_FOUND, MapRecord, MapRow, SheetRow

DEFAULT_CONCURRENCY = 50
CHUNK = 256  # rows looked up in the sheet per store read
VISIBILITY_TRIES = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0)
PROGRESS_EVERY_S = 0.5
FAILURES_LOGGED = 3
SAME_ERROR_STOP = 20  # the first rows of a map all failing the same way: a systemic failure


class RowContext:
    """`rc`: what a column resolver can do for its row."""

    def __init__(self, host: MapHost, parts: MapParts, map_name: str, row_key: str, index: int) -> None:
        self._ctx = host
        self._s = parts
        self.tools = host.tools
        self.row_key = row_key
        self.index = index
        self.previous: Any = None  # the cell's value in the sheet before (None: none, or an error)
        self._map = map_name

    def log(self, message: str, **fields: Any) -> None:
        """A log line about this row: its fields name the map and the row's key (`deepline
        runs logs --where row_key=acme.com`) besides any the play gives."""
        extra = log_fields(fields) or {}
        # Rows run in no fixed order: every line of every attempt is kept.
        self._s.log(message, fields={"map": self._map, "row_key": self.row_key, **extra})

    def _scoped(self, id: str) -> str:
        # Row-level durable ids: unique per map and row, and outside the run's journal,
        # since rows finish in no fixed order.
        return f"map:{self._map}:{self.row_key}:{id}"

    async def step(self, id: str, fn: Callable[[], Any], *, stale_after_seconds: Staleness = None) -> Any:
        return await self._ctx.step(self._scoped(id), fn, stale_after_seconds=stale_after_seconds, _journal=False)

    async def fetch(self, id: str, url: str, **options: Any) -> Any:
        return await self._ctx.fetch(self._scoped(id), url, _journal=False, **options)

    async def run_play(self, id: str, play_ref: str, input: Any = None, *, description: str = "") -> Any:
        return await self._ctx.run_play(self._scoped(id), play_ref, input, description=description, _journal=False)


@dataclass(slots=True)
class _Job:
    idx: int
    input_index: int
    key: str
    row: dict[str, Any]
    digest: str
    previous: SheetRow | None
    blank: str | None = None  # a required CSV column with no value: the row fails, nothing is called


class _Tally:
    def __init__(self) -> None:
        self.succeeded = 0
        self.failed = 0
        self.duplicate = 0
        self.reused = 0  # rows taken whole from sheet rows earlier runs wrote (every attempt)
        self.reused_cells = 0  # cells taken from the sheet (every attempt)
        self.seeded = 0  # rows an earlier attempt finished well: not run again
        self.seeded_reused = 0  # of those, rows that attempt took whole from earlier runs
        self.kept = 0  # rows an earlier attempt failed, taken back whole with their errors
        self.read = 0
        self.steps: dict[str, dict[str, int]] = {}  # waterfall column -> step (or "none") -> rows

    def as_dict(self) -> dict[str, Any]:
        return {
            "succeeded": self.succeeded,
            "failed": self.failed,
            "duplicate": self.duplicate,
            "reused": self.reused,
            "reused_cells": self.reused_cells,
            "seeded": self.seeded,
            # The rows earlier attempts of this run finished (those they reused aside).
            "earlier": self.seeded - self.seeded_reused + self.kept,
            "steps": {column: dict(hits) for column, hits in self.steps.items()},
        }


class MapRun:
    def __init__(
        self,
        host: MapHost,
        parts: MapParts,
        name: str,
        rows: Iterable[Mapping[str, Any]],
        columns: Mapping[str, Callable[..., Any] | Column],
        *,
        key: RowKey,
        on_row_error: Literal["isolate", "fail"],
        concurrency: int | None,
        limit: int | None,
    ) -> None:
        if on_row_error not in ("isolate", "fail"):
            raise UsageError(f"Map {name!r}: on_row_error must be 'isolate' or 'fail', not {on_row_error!r}.")
        self.ctx, self.s, self.name, self.rows = host, parts, name, rows
        # A CSV's path is left out of the input a cell is keyed on: its rows are keyed by content.
        path = getattr(rows, "path", None)
        rows_path = str(path) if isinstance(path, Path) else None
        self.columns = resolve_columns(columns, host.play_input, rows_path=rows_path)
        self.key_of = key_function(key)
        self.on_row_error = on_row_error
        self.concurrency = max(1, concurrency or parts.concurrency or DEFAULT_CONCURRENCY)
        limits = [n for n in (limit, parts.limit) if n is not None]
        self.limit = min(limits) if limits else None
        scope = parts.identity
        self.sheet = f"{scope.workspace}/{scope.play}/{name}"
        self.run_id, self.attempt = scope.run_id, scope.attempt
        self.tally = _Tally()
        self.input_index_of = array.array("q")  # distinct idx -> input index
        self.finished = bytearray()  # distinct idx -> 1 once finished (this or an earlier attempt)
        self.seen: set[str] = set()
        self.input_columns: dict[str, None] = {c: None for c in input_columns(rows)}
        self.stop: BaseException | None = None
        self.first_failures: list[tuple[object, ...]] = []  # signatures, while no row succeeded
        self.started = time.monotonic()
        self.total_estimate = _estimate_total(rows, self.limit)
        self.reuse = ReusePolicy(parts.io.now, scope.force_refresh, scope.refresh_failed)
        self.waterfalls = {c.name: c.column.fn.names for c in self.columns if isinstance(c.column.fn, Waterfall)}
        self.csv = rows if isinstance(rows, CsvSource) else None
        self.clashes: set[tuple[str, str]] = set()  # column names told apart by case only, warned of
        self.warn_of_case(self.input_columns)

    # --- the whole map -----------------------------------------------------------------------

    async def run(self) -> Dataset:
        s = self.s
        record = MapRecord(
            self.run_id,
            self.name,
            self.sheet,
            list(self.input_columns),
            [c.name for c in self.columns],
            total=self.total_estimate or 0,  # the input's size until the map has counted its rows
            started_at=s.io.now(),
            attempt=self.attempt,
            steps=self.waterfalls,
            description=getattr(self.rows, "description", "") or "",
        )
        await s.io.call(s.io.store.save_map, record)
        # Rows an earlier attempt finished well are seeded; failed ones go through the sheet
        # again, where their error cell is kept, or recomputed with --refresh-failed.
        seeded = await s.io.call(s.io.store.succeeded_map_rows, self.run_id, self.name)
        for idx in seeded:
            self._mark(idx)
        if seeded:  # what those rows reused counts in this map's figures
            rows, cells = await s.io.call(s.io.store.map_reuse, self.run_id, self.name, True)
            self.tally.reused, self.tally.seeded_reused, self.tally.reused_cells = rows, rows, cells
        if self.waterfalls and seeded:  # their steps' hits count in this map's figures
            found = await s.io.call(s.io.store.map_steps, self.run_id, succeeded_only=True)
            self.tally.steps = found.get(self.name, {})
        s.bus.emit(
            "map.started",
            self.run_id,
            map=self.name,
            columns=record.columns,
            total=self.total_estimate,
            seeded=len(seeded),
            limit=self.limit,
            steps=self.waterfalls,
            description=record.description,
        )
        ticker = asyncio.create_task(self._tick())
        try:
            await self._execute()
        except BaseException as exc:
            await self._save_unfinished(record, exc)
            raise
        finally:
            ticker.cancel()
        self._progress()
        counts = await self._visibility_barrier()
        await self._finalization_barrier(counts)
        record.input_columns = list(self.input_columns)
        record.status = "completed"
        record.succeeded, record.failed = counts.get("succeeded", 0), counts.get("failed", 0)
        record.duplicate, record.reused = self.tally.duplicate, self.tally.reused
        record.total = record.succeeded + record.failed
        record.finished_at = s.io.now()
        record.pilot = await scan_rest(self)  # a limit cut the input: what the rest holds (projection)
        await s.io.call(s.io.store.save_map, record)
        await self._log_summary(record)
        s.bus.emit(
            "map.completed",
            self.run_id,
            map=self.name,
            total=record.total,
            succeeded=record.succeeded,
            failed=record.failed,
            duplicate=record.duplicate,
            reused=record.reused,
            reused_cells=self.tally.reused_cells,
            earlier=self.tally.as_dict()["earlier"],
            steps=self.tally.steps,
            elapsed_s=round(time.monotonic() - self.started, 3),
        )
        return Dataset(s.io.store, record)

    async def _save_unfinished(self, record: MapRecord, exc: BaseException) -> None:
        """A map that did not finish says so, with what it did (`runs show`, `export`)."""
        interrupted = isinstance(exc, asyncio.CancelledError | RunInterrupted)
        record.status = "interrupted" if interrupted else "failed"
        record.succeeded = self.tally.succeeded + self.tally.seeded
        record.failed, record.duplicate, record.reused = self.tally.failed, self.tally.duplicate, self.tally.reused
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await self.s.io.call(self.s.io.store.save_map, record)

    async def _execute(self) -> None:
        queue: asyncio.Queue[_Job | None] = asyncio.Queue(maxsize=self.concurrency * 2)
        workers = [asyncio.create_task(self._worker(queue)) for _ in range(self.concurrency)]
        try:
            await self._produce(queue)
            for _ in workers:
                await queue.put(None)
            await asyncio.gather(*workers)
        except BaseException:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise
        if self.stop is not None:
            raise self.stop

    # --- producing rows ---------------------------------------------------------------------

    async def _produce(self, queue: asyncio.Queue[_Job | None]) -> None:
        for chunk in self._chunks():
            if self.stop is not None:
                return
            previous = await self.s.io.call(self.s.io.store.load_sheet_rows, self.sheet, [job.key for job in chunk])
            for job in chunk:
                job.previous = previous.get(job.key)
                if not (self.reusable(job) and self._reuse_whole_row(job)):
                    if job.blank is not None:
                        self._record(job, self._blank_cells(job), job.blank)  # no call made for it
                    else:
                        await queue.put(job)
                if self.stop is not None:
                    return

    def _chunks(self) -> Iterator[list[_Job]]:
        chunk: list[_Job] = []
        distinct = 0
        for input_index, raw in enumerate(self.rows):
            if self.limit is not None and distinct >= self.limit:
                break
            self.tally.read += 1
            row = dict(raw)
            blank = self.csv.blank(row) if self.csv is not None else None
            new = [column for column in row if column not in self.input_columns]
            if new:  # every field any row has is an input column (for export)
                self.input_columns.update(dict.fromkeys(new))
                self.warn_of_case(new)
            key = self.key_of(row)
            if key in self.seen:
                self.tally.duplicate += 1
                continue
            self.seen.add(key)
            idx = distinct
            distinct += 1
            self.input_index_of.append(input_index)
            if idx < len(self.finished) and self.finished[idx]:
                self.tally.seeded += 1
                continue
            chunk.append(_Job(idx, input_index, key, row, row_digest(row), None, blank))
            if len(chunk) >= CHUNK:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    def warn_of_case(self, input_columns: Iterable[str]) -> None:
        """Columns whose names differ only in case (`Company` in the CSV, a `company` column):
        the export keeps both, but spreadsheets and many CSV readers take them for one."""
        ours = [c.name for c in self.columns]
        for name in [*input_columns, *ours]:
            for column in ours:
                pair = (min(name, column), max(name, column))
                if name != column and name.lower() == column.lower() and pair not in self.clashes:
                    self.clashes.add(pair)
                    self.s.log(
                        level="warning",
                        message=f"Map {self.name!r}: the columns {pair[0]!r} and {pair[1]!r} differ only in case; the "
                        "export keeps both, but spreadsheets and many CSV readers take them for one: rename one.",
                    )

    # --- one row --------------------------------------------------------------------------------

    def reusable(self, job: _Job) -> bool:
        """Whether the sheet may give the row back whole. A row with a blank required cell is
        given back only through its columns' cells (the kept error, or an answer an earlier
        run paid for): a map with no columns has no cell to keep its failure in."""
        return job.blank is None or bool(self.columns)

    def _blank_cells(self, job: _Job) -> dict[str, list[Any]]:
        """A blank required cell's failure, kept as the first column's error cell: later runs
        give it back like any failed cell (`--refresh-failed` checks the row again)."""
        if not self.columns:
            return {}
        first = self.columns[0]
        return {first.name: [None, job.blank, self.s.io.now(), first.fingerprint]}

    def _reuse_whole_row(self, job: _Job) -> bool:
        """The fast path: every cell is reusable, so record the row without any call."""
        cells = self.reuse.whole_row(job.previous, job.digest, self.columns)
        if cells is None:
            return False
        error = next((cell[1] for cell in cells if cell[1] is not None), None)
        assert job.previous is not None
        # A row an earlier attempt of this run wrote (a failed one, its errors kept) is
        # that attempt's work, not a reuse of an earlier run's.
        earlier_run = job.previous.run_id != self.run_id
        if earlier_run:
            self.tally.reused += 1
            self.tally.reused_cells += len(cells)
        else:
            self.tally.kept += 1
        steps = self._steps(dict(zip((c.name for c in self.columns), cells, strict=False))) if self.waterfalls else None
        self._record(job, None, error, steps, reused=(earlier_run, len(cells) if earlier_run else 0))
        return True

    def _steps(self, cells: Mapping[str, list[Any]]) -> dict[str, str | None] | None:
        """Which step of each waterfall column found the row's value (None: no step did)."""
        if not self.waterfalls:
            return None
        found = {
            name: cell[4].get("step")
            for name, cell in cells.items()
            if name in self.waterfalls and cell[1] is None and len(cell) > 4 and "step" in cell[4]
        }
        for name, step in found.items():
            self.tally.steps.setdefault(name, {}).setdefault(step or NOT_FOUND, 0)
            self.tally.steps[name][step or NOT_FOUND] += 1
        return found or None

    async def _worker(self, queue: asyncio.Queue[_Job | None]) -> None:
        while True:
            job = await queue.get()
            if job is None:
                return
            if self.stop is not None:
                continue  # stopping: drain the queue without work, so the producer never blocks
            try:
                self.s.check_open()  # interrupted (Ctrl-C, a closed pipe…): start no new row
                await self._process(job)
            except Exception as exc:  # fatal for the run (budget, lease, store…): stop the map
                self.stop = exc

    async def _process(self, job: _Job) -> None:
        row = job.row
        cells: dict[str, list[Any]] = dict(job.previous.cells) if job.previous else {}
        rc = RowContext(self.ctx, self.s, self.name, job.key, job.idx)
        changed = False
        error: str | None = None
        failure: BaseException | None = None
        scopes: list[CellScope] = []
        found: set[str] = set()  # receipt keys whose answers the play found a value with
        reused_cells = 0
        for position, column in enumerate(self.columns):
            cell = self.reuse.cell(job.previous, job.digest, column, changed)
            if cell is not None:
                reused_cells += 1
                row[column.name] = cell[0]
                if cell[1] is not None:
                    error = cell[1]
                    break
                continue
            before = cells.get(column.name)
            rc.previous = previous_value(before)
            # Calls made for this cell: recorded with its row, refreshed when their answer is
            # older than the cell may be.
            scope = CellScope(self.name, job.key, refresh_after(column, before))
            scopes.append(scope)
            enter_cell(scope)
            try:
                value, meta, hits = await self._resolve(column, row, rc)
            except DeeplineError as exc:
                if exc.fatal or exc.exit_code != 1:
                    raise  # budget, lease, store, usage…: fail the run, record nothing
                failure = exc
            except Exception as exc:
                if failures.is_play_bug(exc):  # it would fail every row: stop, record nothing
                    raise self._play_bug(job, column.name, exc) from exc
                failure = exc
            if failure is not None:
                error = self.s.secrets.redact(failures.describe(failure))
                cells[column.name] = [None, error, self.s.io.now(), column.fingerprint]
                for later in self.columns[position + 1 :]:  # not computed on a failed row
                    cells.pop(later.name, None)
                break
            changed = changed or before is None or before[0] != value
            cells[column.name] = [value, None, self.s.io.now(), column.fingerprint, *([meta] if meta else [])]
            row[column.name] = value
            found.update(key for key in scope.answered if (key in hits if hits is not None else is_found(value)))
        if job.previous is not None and job.previous.run_id == self.run_id:
            reused_cells = 0  # this run's own cells, from an earlier attempt: not a reuse
        self.tally.reused_cells += reused_cells
        self._record(job, cells, error, self._steps(cells), reused=(False, reused_cells), found=found)
        # The row's failed calls settle: fallen back from if it succeeded, else final.
        self.s.stats.row_ended([key for scope in scopes for key in scope.failed], failure is None)
        if failure is not None:
            self._watch_for_systemic(failure, error or "")

    def _play_bug(self, job: _Job, column: str, exc: BaseException) -> failures.PlayCodeError:
        place = failures.where(exc)
        return failures.PlayCodeError(
            self.s.secrets.redact(
                f"Map {self.name!r} stopped at row {job.key}, column {column!r}: {type(exc).__name__}: {exc} "
                f"({place}); an error in the play's code fails every row, so nothing more was called"
            )
        )

    def _watch_for_systemic(self, failure: BaseException, error: str) -> None:
        """The map's first rows all failing the same way (a revoked API key, a provider
        down) stop it, instead of paying for the whole list to fail."""
        if self.tally.succeeded or len(self.first_failures) >= SAME_ERROR_STOP:
            return
        self.first_failures.append(failures.signature(failure))
        if len(self.first_failures) == SAME_ERROR_STOP and len(set(self.first_failures)) == 1:
            self.stop = self.stop or SystemicFailure(
                f"Map {self.name!r} stopped: its first {SAME_ERROR_STOP} rows all failed the same way ({error}). "
                f"Fix the cause, then: deepline resume {self.run_id} --refresh-failed"
            )

    async def _resolve(
        self, column: ResolvedColumn, row: dict[str, Any], rc: RowContext
    ) -> tuple[Any, dict[str, Any] | None, tuple[str, ...] | None]:
        """The cell's value; what the cell keeps beside it (the step of a waterfall that
        found it, or that its `run_if` said no); and for a waterfall, the receipts whose
        answers its winning step used (None: judge every answer by the value)."""
        spec = column.column
        if spec.run_if is not None:
            wanted = spec.run_if(row, rc.index) if column.run_if_arity >= 2 else spec.run_if(row)
            if inspect.isawaitable(wanted):
                wanted = await wanted
            if not wanted:
                return None, {"run_if": False}, ()
        result = spec.fn(row, rc) if column.arity != 1 else spec.fn(row)
        if inspect.isawaitable(result):
            result = await result
        meta, hits = None, None
        if isinstance(result, Found):
            result, meta, hits = result.value, {"step": result.step}, result.keys
        if isinstance(result, ToolResult):
            result = result.output
        return _json.loads(_json.dumps(result)), meta, hits

    def _record(
        self,
        job: _Job,
        cells: dict[str, list[Any]] | None,
        error: str | None,
        steps: dict[str, str | None] | None = None,
        *,
        reused: tuple[bool, int] = (False, 0),
        found: set[str] | None = None,
    ) -> None:
        outcome = "failed" if error is not None else "succeeded"
        if outcome == "failed":
            self.tally.failed += 1
        else:
            self.tally.succeeded += 1
        sheet_row, previous = None, job.previous
        if cells is not None:
            sheet_row = SheetRow(
                self.sheet,
                job.key,
                _input_only(job.row, self.columns),
                job.digest,
                cells,
                outcome,
                self.run_id,
                self.s.io.now(),
                replaces=previous is not None and previous.run_id != self.run_id,
                attempt=self.attempt,
            )
        if error is not None and self.on_row_error == "fail" and self.stop is None:
            self.stop = DeeplineError(f"Map {self.name!r} stopped: row {job.key} failed: {error}")
        # A row reused whole finished with the revision it was read at; a written one with
        # the revision its write makes.
        rev = previous.rev if sheet_row is None and previous is not None else None
        row = MapRow(self.run_id, self.name, job.idx, job.input_index, job.key, outcome, error, self.sheet, rev)
        row.attempt, row.steps = self.attempt, steps
        row.reused_row, row.reused_cells = reused
        row.found = sorted(key[:FOUND_PREFIX] for key in found) if found else None
        row.kept = sheet_row is None and previous is not None and previous.run_id == self.run_id
        self.s.writes.sheet(sheet_row, row)
        self._mark(job.idx)

    def _mark(self, idx: int) -> None:
        if idx >= len(self.finished):
            self.finished.extend(b"\0" * (idx + 1 - len(self.finished) + 1024))
        self.finished[idx] = 1

    # --- barriers --------------------------------------------------------------------------------

    async def _visibility_barrier(self) -> dict[str, int]:
        """Read back, through the store, that every finished row of this run is visible."""
        s = self.s
        expected = len(self.input_index_of)
        s.bus.emit("barrier.visibility", self.run_id, map=self.name, expected=expected, visible=0, reads=0,
                   passed=None)  # fmt: skip
        await s.writes.flushed()
        counts: dict[str, int] = {}
        seen = 0
        for reads, delay in enumerate(VISIBILITY_TRIES, start=1):
            await asyncio.sleep(delay)
            counts = await s.io.call(s.io.store.count_map_rows, self.run_id, self.name)
            seen = sum(counts.values())
            if seen >= expected:
                s.bus.emit(
                    "barrier.visibility",
                    self.run_id,
                    map=self.name,
                    expected=expected,
                    visible=seen,
                    reads=reads,
                    passed=True,
                )
                return counts
        s.bus.emit(
            "barrier.visibility",
            self.run_id,
            map=self.name,
            expected=expected,
            visible=seen,
            reads=len(VISIBILITY_TRIES),
            passed=False,
        )
        raise SheetVisibilityError(
            f"Map {self.name!r} of run {self.run_id}: {expected} rows were written but only {seen} are "
            "visible in the store."
        )

    async def _finalization_barrier(self, counts: dict[str, int]) -> None:
        """Every input row is accounted for as succeeded, failed or duplicate."""
        s = self.s
        distinct = len(self.input_index_of)
        persisted = sum(counts.values())
        in_memory = sum(self.finished[:distinct])
        accounted = persisted + self.tally.duplicate
        facts = {"map": self.name, "rows": self.tally.read, "distinct": distinct, "duplicate": self.tally.duplicate}
        s.bus.emit("barrier.finalization", self.run_id, passed=None, **facts)
        if persisted == distinct and in_memory == distinct and accounted == self.tally.read:
            s.bus.emit("barrier.finalization", self.run_id, passed=True, **facts)
            return
        stored = set(await s.io.call(s.io.store.finished_map_rows, self.run_id, self.name))
        missing = [self.input_index_of[i] for i in range(distinct) if i not in stored or not self.finished[i]]
        s.bus.emit("barrier.finalization", self.run_id, passed=False, missing=missing[:10], **facts)
        shown = ", ".join(str(i) for i in missing[:10]) or "none"
        raise MapAccountingError(
            f"Map {self.name!r} of run {self.run_id}: {self.tally.read} input rows but only {persisted} "
            f"finished and {self.tally.duplicate} duplicate rows are accounted for; "
            f"missing input indexes: {shown}."
        )

    async def _log_summary(self, record: MapRecord) -> None:
        s = self.s
        if record.failed:
            failed = await s.io.call(s.io.store.failed_map_rows, self.run_id, self.name, FAILURES_LOGGED)
            for row in failed:
                s.log(
                    f"row {row.row_key} failed: {row.error}",
                    level="warning",
                    kind="row.failed",
                    fields={"map": self.name, "row_key": row.row_key, "error": row.error},
                )
            if record.failed > FAILURES_LOGGED:
                omitted = record.failed - FAILURES_LOGGED
                s.log(
                    f"{omitted} additional row failure(s) omitted from map log",
                    level="warning",
                    kind="row.failed.omitted",
                    fields={"map": self.name, "omitted": omitted},
                )
        s.log(
            f"Map completed: {record.total} results ({record.succeeded} succeeded, {record.failed} "
            f"failed, {record.duplicate} duplicate keys skipped)",
            kind="map.completed",
            fields={
                "map": self.name,
                "total": record.total,
                "succeeded": record.succeeded,
                "failed": record.failed,
                "duplicate": record.duplicate,
            },
        )

    # --- progress --------------------------------------------------------------------------------

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            self._progress()

    def _progress(self) -> None:
        t = self.tally
        done = t.succeeded + t.failed + t.seeded
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = (t.succeeded + t.failed) / elapsed
        total = self.total_estimate
        eta = (total - done - t.duplicate) / rate if total and rate > 0 else None
        self.s.bus.emit(
            "map.progress",
            self.run_id,
            map=self.name,
            done=done,
            total=total,
            rows_per_s=round(rate, 1),
            eta_s=None if eta is None else max(0.0, round(eta, 1)),
            **t.as_dict(),
        )


class SystemicFailure(DeeplineError):
    """A map's first rows all failed the same way; it stopped."""

    fatal = True


def _input_only(row: dict[str, Any], columns: list[ResolvedColumn]) -> dict[str, Any]:
    names = {c.name for c in columns}
    return {k: v for k, v in row.items() if k not in names}


def _estimate_total(rows: Any, limit: int | None) -> int | None:
    total: int | None = None
    if isinstance(rows, CsvSource):
        total = _count_lines(rows.path) - 1
    elif hasattr(rows, "__len__"):
        total = len(rows)
    if total is not None and limit is not None:
        total = min(total, limit)
    return total


def _count_lines(path: Path) -> int:
    count, last = 0, b"\n"
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            count += block.count(b"\n")
            last = block
    return count + (0 if last.endswith(b"\n") else 1)
