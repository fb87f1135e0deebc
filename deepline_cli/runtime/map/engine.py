"""The map engine: `ctx.map(name, rows, columns)` over thousands to millions of rows.

input rows ─► key ─► duplicate? ─► sheet lookup (batched) ─────────┐
                                                                │
              every cell reusable ─► record the row (no call) ◄─┤
              (an earlier attempt's row at its place: kept, no write)
              else ─► workers: resolve columns in order, tool calls through receipts
                                                                │
sheet rows + map rows written with the receipts (group commit) ◄┘
─► visibility barrier (read back through the store) ─► finalization barrier ─► Dataset
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from deepline_cli import _json
from deepline_cli._aio import is_awaitable
from deepline_cli.errors import BudgetExceededError, DeeplineError, SystemicFailure, UsageError
from deepline_cli.runtime.calls.call_scope import CellScope, current_cell, enter_cell
from deepline_cli.runtime.calls.store_thread import Reconnecting, StoreIO
from deepline_cli.runtime.calls.suspended import Suspended
from deepline_cli.runtime.map import barriers, failures
from deepline_cli.runtime.map.book import MapBook
from deepline_cli.runtime.map.columns import Column, ResolvedColumn, resolve_columns, same_fingerprint
from deepline_cli.runtime.map.dataset import ERROR_COLUMN, Dataset, step_column
from deepline_cli.runtime.map.host import MapHost, MapParts
from deepline_cli.runtime.map.intake import Intake
from deepline_cli.runtime.map.pilot import scan_rest
from deepline_cli.runtime.map.reuse import ReusePolicy, previous_value, refresh_after
from deepline_cli.runtime.map.row_context import PendingRow, RowContext
from deepline_cli.runtime.map.rows import CsvSource, RowKey, key_function
from deepline_cli.runtime.map.waterfall import Found, Waterfall
from deepline_cli.runtime.providers.found import is_found
from deepline_cli.runtime.providers.tools import ToolResult
from deepline_cli.store.records import Cell, MapRecord, SheetRow

DEFAULT_CONCURRENCY = 50


class MapRun:
    """One map of one run attempt: reads the rows, skips duplicates and rows an earlier
    attempt finished, gives back what the sheet holds, resolves the rest with `concurrency`
    workers, then passes the barriers. What it has done is kept in its `book`."""

    record: MapRecord  # the map as the store has it (from `run`)

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
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise UsageError(f"Map {name!r}: concurrency must be a whole number, 1 or more, not {concurrency!r}.")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise UsageError(f"Map {name!r}: limit must be a whole number of rows, 1 or more (or None), not {limit!r}.")
        self.ctx, self.s, self.name, self.rows = host, parts, name, rows
        # A CSV's path is left out of the input a cell is keyed on: its rows are keyed by content.
        # So is the CSV a map over another map's rows reads through it (this week's file under a
        # new name: the same rows).
        path = getattr(rows, "path", None)
        rows_path = str(path) if isinstance(path, Path) else source_of(rows)
        self.columns = resolve_columns(
            columns, host.play_input, rows_path=rows_path, cwd=parts.identity.cwd, tools=parts.tool_versions,
            own_path=isinstance(path, Path),
        )  # fmt: skip
        self.key_of = key_function(key)
        self.on_row_error = on_row_error
        self.concurrency = max(1, concurrency or parts.concurrency or DEFAULT_CONCURRENCY)
        limits = [n for n in (limit, parts.limit) if n is not None]
        self.limit = min(limits) if limits else None
        scope = parts.identity
        self.sheet = sheet_name(scope.workspace, scope.play, name)
        self.run_id, self.attempt = scope.run_id, scope.attempt
        self.stop: BaseException | None = None
        # Rows that must wait (a child play that waits, a long sleep): not recorded, and the
        # map waits once every row has been done or has waited.
        self.waiting: list[Suspended] = []
        self.reuse = ReusePolicy(parts.io.now, scope.force_refresh, scope.refresh_failed, scope.run_id)
        self.waterfalls = {c.name: c.column.fn.names for c in self.columns if isinstance(c.column.fn, Waterfall)}
        refuse_export_names(name, [c.name for c in self.columns], self.waterfalls)
        self.book = MapBook(parts, name, self.sheet, self.columns, self.waterfalls, on_row_error == "fail")
        names = [c.name for c in self.columns]
        self.column_names = frozenset(names)
        self.said_changed: set[str] = set()  # columns said to have changed since their cells were computed
        # A cell's own durable calls (rc.step, rc.fetch) are keyed by its column and the code of
        # the columns up to it (RowContext.enter).
        self.cell_ids = {
            c.name: _json.digest(c.name, *(b.fingerprint for b in self.columns[: i + 1]))[:16]
            for i, c in enumerate(self.columns)
        }
        self.intake = Intake(name, rows, self.key_of, self.limit, self.book, names, self._warn)

    # --- the whole map -----------------------------------------------------------------------

    async def run(self) -> Dataset:
        s = self.s
        record = MapRecord(
            self.run_id,
            self.name,
            self.sheet,
            list(self.intake.input_columns),
            [c.name for c in self.columns],
            total=self.total_estimate or 0,  # the input's size until the map has counted its rows
            started_at=s.io.now(),
            attempt=self.attempt,
            steps=self.waterfalls,
            description=getattr(self.rows, "description", "") or "",
            source=str(self.rows.path) if isinstance(self.rows, CsvSource) else source_of(self.rows),
        )
        await self.book.start(record, self.total_estimate, self.limit)
        self.record = record
        s.progress.append(self._progress)  # said with the run's own progress, a few times a second
        try:
            await self._execute()
        except BaseException as exc:
            self.book.progress(self.total_estimate)  # the view's last frame: every row that finished
            record.input_columns = list(self.intake.input_columns)  # a list's fields: known as it is read
            if self.attempt > 1 and self.intake.read_whole and self.limit is None:
                # Rows of earlier attempts at places it did not reach: gone where the input lost them.
                with contextlib.suppress(Exception):
                    await self.book.trim(self.intake.seen)
            await self.book.save_unfinished(record, exc, *self._row_counts())
            raise
        finally:
            s.progress.remove(self._progress)
        self.book.progress(self.total_estimate)
        if self.attempt > 1:
            await self.book.trim()
        counts = await barriers.visibility(self.book)
        await barriers.finalization(self.book, counts)
        record.input_columns = list(self.intake.input_columns)
        record.pilot = self._fed_by_pilot() or await scan_rest(self)  # what the rest holds (projection)
        await self.book.complete(record, counts)
        # Read as the play iterates it (on its own thread, not the store thread's): reconnecting.
        return Dataset(Reconnecting(s.io.store).sheets, record, s.identity.cwd)

    async def _execute(self) -> None:
        queue: asyncio.Queue[PendingRow | None] = asyncio.Queue(maxsize=self.concurrency * 2)
        workers = [asyncio.create_task(self._worker(queue)) for _ in range(self.concurrency)]
        try:
            try:
                await self._produce(queue)
            except Exception as exc:  # the input failed (a key function, a CSV line): the rows out finish first
                self._stop_on(exc)
            for _ in workers:
                await queue.put(None)
            await asyncio.gather(*workers)
        except BaseException:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise
        if isinstance(self.stop, SystemicFailure) and self._every_row_ended():
            self.stop = None  # it held nothing back (every row was in flight): the map completes
        if self.stop is not None:
            raise self.stop
        if self.waiting:
            raise self.waiting[0]  # every one's boundary is stored: the run waits for them all

    def _every_row_ended(self) -> bool:
        """Has every row of the input ended, succeeded or failed (none left undone)?"""
        tally = self.book.tally
        return self.intake.read_whole and tally.succeeded_all + tally.failed == self.distinct

    def _fed_by_pilot(self) -> dict[str, Any] | None:
        """A map over the rows of a map a limit cut (a pilot): for the full list it will run on
        as many rows as that one will have, which the projection reckons with."""
        source = getattr(self.rows, "record", None)
        if isinstance(source, MapRecord) and source.pilot:
            return {"fed_by": source.map}
        return None

    @property
    def total_estimate(self) -> int | None:
        """The input's rows: estimated (a CSV's lines) until the input has been read."""
        return self.intake.total_estimate

    @property
    def io(self) -> StoreIO:
        return self.s.io

    @property
    def read(self) -> int:
        """Input rows read so far (duplicates included)."""
        return self.book.tally.read

    @property
    def duplicate(self) -> int:
        return self.book.tally.duplicate

    @property
    def distinct(self) -> int:
        return self.book.distinct

    # --- producing rows ---------------------------------------------------------------------

    async def _produce(self, queue: asyncio.Queue[PendingRow | None]) -> None:
        def sheet_rows(keys: list[str]) -> Awaitable[dict[str, SheetRow]]:
            return self.s.io.call(self.s.io.store.sheets.load_sheet_rows, self.sheet, keys, with_input=False)

        counted = False  # the map's rows recorded, once the whole input is read
        async with contextlib.aclosing(self.intake.read_ahead(sheet_rows)) as chunks:
            async for chunk in chunks:
                self.s.check_open()  # interrupted: a map its sheet answers whole stops too
                if len(self.intake.input_columns) != len(self.record.input_columns):
                    await self.book.record_input_columns(self.record, list(self.intake.input_columns))
                if not counted and self.intake.read_whole:
                    counted = True
                    await self._input_read()
                for job in chunk:
                    if not (self.reusable(job) and self._reuse_whole_row(job)):
                        if job.blank is not None:  # no call made for it
                            self._stop_on(self.book.record(job, self._blank_cells(job), job.blank))
                        else:
                            previous = job.previous
                            if previous is not None and previous.run_id == self.run_id and previous.status == "failed":
                                job.failing = True  # failed in the store, as the view says it, until it ends again
                                self.book.tally.failing += 1
                            await queue.put(job)
                    if self.stop is not None:
                        return
        if not counted:  # a limit stopped reading: its rows are known now
            await self._input_read()

    async def _input_read(self) -> None:
        """The input read whole (it is read ahead of the rows handed out): record the map's
        distinct rows and duplicates (a CSV's line count, until now), for `runs show` and
        `export` while the map goes on, and after a kill."""
        self.record.input_columns = list(self.intake.input_columns)
        await self.book.input_read(self.record, *self._row_counts())

    def _row_counts(self) -> tuple[int, int]:
        """The map's distinct rows and duplicates: exact once the input is read whole (it is
        read ahead of the rows handed out), else the input's size less the duplicates seen."""
        total = self.total_estimate or 0
        if self.intake.read_whole and self.limit is None:
            return self.distinct, total - self.distinct
        return self.book.distinct_in(total), self.book.tally.duplicate

    def _warn(self, message: str) -> None:
        self.s.log(level="warning", message=message)

    # --- one row --------------------------------------------------------------------------------

    def reusable(self, job: PendingRow) -> bool:
        """Whether the sheet may give the row back whole. A row with a blank required cell is
        given back only through its columns' cells (the kept error, or an answer an earlier
        run paid for): a map with no columns has no cell to keep its failure in."""
        return job.blank is None or bool(self.columns)

    def _blank_cells(self, job: PendingRow) -> dict[str, Cell]:
        """A blank required cell's failure, kept as the first column's error cell: later runs
        give it back like any failed cell (`--refresh-failed` checks the row again)."""
        if not self.columns:
            return {}
        first = self.columns[0]
        return {first.name: Cell(None, job.blank, self.s.io.now(), first.fingerprint, {"input": True})}

    def _reuse_whole_row(self, job: PendingRow) -> bool:
        """The fast path: every cell is reusable, so record the row without any call."""
        cells = self.reuse.whole_row(job.previous, job.digest, self.columns, taken=job.seeded)
        if cells is None:
            if job.seeded:  # its input or code changed since: done again
                self.book.unseed(job.idx)
            return False
        error = cells[-1].error if cells else None  # the cells stop at the first error
        if job.blank is not None:  # said of this input's file and line, not the one that kept it
            error = job.blank
        assert job.previous is not None
        if job.seeded:  # that attempt's row, recorded here (its sheet row this run's or an earlier run's)
            self.book.count_seeded(job.idx)
            return True
        # A row an earlier attempt of this run wrote (a failed one, its errors kept) is
        # that attempt's work, not a reuse of an earlier run's.
        earlier_run = job.previous.run_id != self.run_id
        if earlier_run:
            self.book.tally.reused += 1
            self.book.tally.reused_cells += len(cells)
        else:
            self.book.tally.kept += 1
        steps = (
            self.book.steps(dict(zip((c.name for c in self.columns), cells, strict=False))) if self.waterfalls else None
        )
        self._stop_on(self.book.record(job, None, error, steps, reused=(earlier_run, len(cells) if earlier_run else 0)))
        return True

    def _say_changed(self, column: str) -> None:
        """A column whose cells are computed again because it changed: said once per map."""
        self.said_changed.add(column)
        self._warn(
            f"Map {self.name!r}: column {column!r} changed since its cells were computed (its code, what it "
            "reads, or a tool's version): computing them again; a tool call asked as before comes back from its "
            "receipt, one asked anew (a new version, another input), an rc.step, rc.fetch or force=True call is "
            "made again"
        )

    def _progress(self) -> None:
        self.book.progress(self.total_estimate)

    def _stopped(self) -> BaseException | None:
        """Why the map stopped, once it has (its rows' calls not sent yet are not sent)."""
        return self.stop

    def _stop_on(self, reason: BaseException | None) -> None:
        """Stop the map (after the rows in flight) for the first reason given."""
        if reason is not None and self.stop is None:
            self.stop = reason

    async def _worker(self, queue: asyncio.Queue[PendingRow | None]) -> None:
        while True:
            job = await queue.get()
            if job is None:
                return
            if self.stop is not None:
                continue  # stopping: drain the queue without work, so the producer never blocks
            try:
                self.s.check_open()  # interrupted (Ctrl-C, a closed pipe…): start no new row
                await self._process(job)
            except Suspended as waits:  # the other rows go on: the run waits for all that must
                self.waiting.append(waits)
            except Exception as exc:  # fatal for the run (budget, lease, store…): stop the map
                self._stop_on(exc)

    async def _process(self, job: PendingRow) -> None:
        row = job.row
        # The row as the input gave it, kept: resolvers may change the row they are given (a
        # column of an input field's name replaces it), never the input stored and exported.
        given = dict(row)
        cells: dict[str, Cell] = dict(job.previous.cells) if job.previous else {}
        rc = RowContext(self.ctx, self.s, self.name, job.key, job.idx)
        changed = False
        moved = False  # a value the row had before changed (not one computed for the first time)
        error: str | None = None
        failure: BaseException | None = None
        scopes: list[CellScope] = []
        found: set[str] = set()  # receipt keys whose answers the play found a value with
        reused_cells = 0
        for position, column in enumerate(self.columns):
            cell = self.reuse.cell(job.previous, job.digest, column, changed, taken=job.seeded)
            if cell is not None:
                reused_cells += 1
                row[column.name] = cell.value
                if cell.error is not None:
                    error = cell.error
                    break
                continue
            before = cells.get(column.name)
            if (
                before is not None
                and column.name not in self.said_changed
                and not same_fingerprint(before.fingerprint, column)
            ):
                self._say_changed(column.name)
            rc.previous = previous_value(before)
            # Calls made for this cell: recorded with its row, refreshed when their answer is
            # older than the cell may be.
            scope = CellScope(self.name, job.key, refresh_after(column, before), stopped=self._stopped)
            scopes.append(scope)
            enter_cell(scope)
            rc.enter(self.cell_ids[column.name], job.digest)
            try:
                value, meta, hits = await resolve_cell(column, row, rc)
            except DeeplineError as exc:
                if exc.fatal or exc.exit_code != 1:
                    raise  # budget, lease, store, usage…: fail the run, record nothing
                failure = exc
            except (Exception, SystemExit) as exc:  # `sys.exit` in a resolver: it means to stop
                if failures.is_play_bug(exc) or isinstance(exc, SystemExit):  # it would fail every row: stop
                    raise play_bug(self.name, job.key, column.name, exc, self.s.secrets.redact) from exc
                failure = exc
            if failure is not None:
                error = self.s.secrets.redact(failures.describe(failure))
                transient = {"transient": True} if failures.transient(failure) else None
                cells[column.name] = Cell(None, error, self.s.io.now(), column.fingerprint, transient)
                for later in self.columns[position + 1 :]:  # not computed on a failed row
                    cells.pop(later.name, None)
                break
            moved = moved or (before is not None and before.value != value)
            changed = changed or moved or before is None
            if scope.failed:  # settled as fallen back only where the cell found a value (got_past)
                scope.found = meta["step"] is not None if meta and "step" in meta else is_found(value)
            # As old as the oldest answer it was made from (a receipt reused): judged stale by that.
            at = min(self.s.io.now(), scope.oldest or math.inf)
            cells[column.name] = Cell(value, None, at, column.fingerprint, meta)
            row[column.name] = value
            if scope.answered:  # the answers it found its value with (a waterfall's: its step's)
                if hits is not None:
                    found.update(key for key in scope.answered if key in hits)
                elif is_found(value):
                    found.update(scope.answered)
        previous = job.previous
        outdated = previous is not None and (moved or job.digest != previous.input_digest)
        if outdated and not cells.keys() <= self.column_names:
            # A column dropped from the play for now and restored later is computed again:
            # its cell was computed from an input or values this row no longer has.
            cells = {name: cell for name, cell in cells.items() if name in self.column_names}
        held_back = any(scope.held_back for scope in scopes)
        tripped = self.s.tripped()
        if tripped is not None and (held_back or not isinstance(tripped, BudgetExceededError)):
            # The run stopped while the row ran: a refusal met in its cells may have been caught
            # by its resolver, which returned a value it is not. A budget spent by other rows
            # leaves this one whole (its calls answered, and are paid): it is recorded.
            raise tripped
        if held_back:  # a call of the row was held back: no value
            self.s.check_open()  # the run stopped dispatching (Ctrl-C…): its resolver may have caught that
            if self.stop is not None:
                raise self.stop  # the map stopped
        waits = next((scope.waits for scope in scopes if scope.waits is not None), None)
        if waits is not None:
            raise waits  # a wait its resolver caught: the row waits, its value is none yet
        # A row an earlier attempt of this run wrote, done again (its failure asked again…).
        redone = previous is not None and previous.run_id == self.run_id
        kept_cells = reused_cells > 0  # cells taken back as they were: the earlier word on their failures holds
        if redone:
            reused_cells = 0  # this run's own cells, from an earlier attempt: not a reuse
        self.book.tally.reused_cells += reused_cells
        steps = self.book.steps(cells)
        # The row's failed calls settle: fallen back from where another call of their cell
        # answered (CellScope.got_past) and the cell got a value; final in the cell that failed
        # the row, and where the play handled the failure itself.
        final = list(scopes.pop().failed) if failure is not None and scopes else []
        fell_back: list[str] = []
        handled: list[str] = []
        for scope in scopes:
            if scope.failed:  # most rows' cells have none
                (fell_back if scope.got_past() else handled).extend(scope.failed)
        final += handled
        self._stop_on(
            self.book.record(
                job, cells, error, steps, reused=(False, reused_cells), found=found, given=given,
                fell_back=fell_back if failure is not None or handled else None, kept_cells=kept_cells,
            )
        )  # fmt: skip
        self.s.stats.row_ended(fell_back, final, failed=failure is not None)
        # A redone row says nothing of the map's first rows: a resume asks the rows that failed
        # first, and their recurring failure stopped it for good.
        if failure is not None and not redone:
            self._stop_on(self.book.systemic(failure, error or ""))


def refuse_export_names(map_name: str, columns: list[str], waterfalls: Mapping[str, Any]) -> None:
    """A column named as a column the export adds (`_error`, a waterfall's `<column>_step`)
    would lose its values to it, under a header holding the name twice: refused."""
    for column in columns:
        if column == ERROR_COLUMN:
            said = "the export's column for a row's failure"
        elif waterfall := next((w for w in waterfalls if step_column(w) == column), None):
            said = f"the column saying which step of waterfall {waterfall!r} found its value"
        else:
            continue
        raise UsageError(f"Map {map_name!r}: a column may not be named {column!r}: it is {said}; rename it.")


def source_of(rows: Any) -> str | None:
    """The CSV another map's rows (a Dataset) came from, through any maps in between."""
    record = getattr(rows, "record", None)
    return record.source if isinstance(record, MapRecord) else None


def sheet_name(workspace: str, play: str, map_name: str) -> str:
    """`workspace/play/map`, the sheet a map's rows are kept in across runs: a `/` (and `%`)
    inside a part is escaped, so play "acme" map "q1/leads" and play "acme/q1" map "leads"
    keep sheets of their own (names without them are as they always were)."""
    return "/".join(part.replace("%", "%25").replace("/", "%2F") for part in (workspace, play, map_name))


async def resolve_cell(
    column: ResolvedColumn, row: dict[str, Any], rc: RowContext
) -> tuple[Any, dict[str, Any] | None, tuple[str, ...] | None]:
    """The cell's value; what the cell keeps beside it (the step of a waterfall that
    found it, or that its `run_if` said no); and for a waterfall, the receipts whose
    answers its winning step used (None: judge every answer by the value)."""
    spec = column.column
    gate: list[str] = []  # what the run_if's own calls answered
    if spec.run_if is not None:
        cell = current_cell()
        asked = len(cell.answered) if cell is not None else 0
        wanted = spec.run_if(row, rc.index) if column.run_if_arity >= 2 else spec.run_if(row)
        if is_awaitable(wanted):
            wanted = await wanted
        if not wanted:  # an input field of the column's name ("fill where blank") keeps its value
            return row.get(column.name), {"run_if": False}, ()
        if cell is not None:
            gate = cell.answered[asked:]
            cell.gate = len(cell.answered)
    result = spec.fn(row, rc) if column.arity >= 2 else spec.fn(row)
    if is_awaitable(result):
        result = await result
    meta, hits = None, None
    if isinstance(result, Found):
        # The winning step's answers found the value; the run_if's, as in any cell, if it has one.
        result, meta, hits = result.value, {"step": result.step}, result.keys
        if gate and is_found(result):
            hits = (*hits, *gate)
    if isinstance(result, ToolResult):
        if result.execution == "live":  # JSON as stored (its receipt written already), this row's own
            return result.output, meta, hits
        result = result.output
    if _json.as_is(result):
        return result, meta, hits
    return _json.plain(result, f"The value of column {column.name!r}"), meta, hits


def play_bug(
    name: str, key: str, column: str, exc: BaseException, redact: Callable[[str], str]
) -> failures.PlayCodeError:
    place = failures.where(exc)
    return failures.PlayCodeError(
        redact(
            f"Map {name!r} stopped at row {key}, column {column!r}: {type(exc).__name__}: {exc} "
            f"({place}); an error in the play's code fails every row, so nothing more was called"
        )
    )
