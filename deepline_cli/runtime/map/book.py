"""What a map has done, kept as it goes: its counts, which distinct rows are finished, each
finished row written (sheet row and map row, with the receipts), progress for the views,
the summary it logs, and a failure that is every row's (a systemic one) noticed early."""

from __future__ import annotations

import array
import asyncio
import bisect
import contextlib
import time
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from deepline_cli import _json
from deepline_cli.errors import DeeplineError, RunInterrupted, SystemicFailure
from deepline_cli.runtime.calls.suspended import Suspended
from deepline_cli.runtime.map import failures
from deepline_cli.runtime.map.columns import ResolvedColumn
from deepline_cli.runtime.map.host import MapParts
from deepline_cli.runtime.map.row_context import PendingRow
from deepline_cli.runtime.providers.secrets import REDACTED
from deepline_cli.store.records import FOUND_PREFIX, NOT_FOUND, Cell, EarlierRow, MapRecord, MapRow, SheetRow

FAILURES_LOGGED = 3
SAME_ERROR_STOP = 20  # the first rows of a map all failing the same way: a systemic failure
SEED_PAGE = 50_000  # rows an earlier attempt finished, read per store call on resume

Cells = dict[str, Cell]


class Tally:
    """A map's counts, as the live view shows them."""

    def __init__(self) -> None:
        self.succeeded = 0
        self.failed = 0
        self.duplicate = 0
        self.reused = 0  # rows taken whole from sheet rows earlier runs wrote (every attempt)
        self.reused_cells = 0  # cells taken from the sheet (every attempt)
        self.seeded = 0  # rows an earlier attempt finished well: not run again
        self.seeded_reused = 0  # of those, rows that attempt took whole from earlier runs
        self.kept = 0  # rows an earlier attempt wrote, taken back whole (failed ones, or ones moved since)
        # Rows an earlier attempt failed, asked again and not ended yet: failed still, as the
        # store has them, until they end again.
        self.failing = 0
        self.read = 0
        self.steps: dict[str, dict[str, int]] = {}  # waterfall column -> step (or "none") -> rows

    @property
    def succeeded_all(self) -> int:
        """The rows that succeeded, earlier attempts' included (as `failed` counts them too)."""
        return self.succeeded + self.seeded

    @property
    def earlier(self) -> int:
        """The rows earlier attempts of this run finished (those they reused aside)."""
        return self.seeded - self.seeded_reused + self.kept

    def as_dict(self) -> dict[str, Any]:
        return {
            "succeeded": self.succeeded,
            "failed": self.failed,
            "duplicate": self.duplicate,
            "reused": self.reused,
            "reused_cells": self.reused_cells,
            "seeded": self.seeded,
            "earlier": self.earlier,
            "steps": {column: dict(hits) for column, hits in self.steps.items()},
        }


class MapBook:
    """The record of one map of one run attempt, kept while it runs."""

    def __init__(self, parts: MapParts, name: str, sheet: str, columns: list[ResolvedColumn],
                 waterfalls: dict[str, list[str]], fail_fast: bool) -> None:  # fmt: skip
        self.s, self.name, self.sheet, self.columns = parts, name, sheet, columns
        self.run_id, self.attempt = parts.identity.run_id, parts.identity.attempt
        self.waterfalls = waterfalls
        self.fail_fast = fail_fast  # on_row_error="fail": a failed row stops the map
        self.tally = Tally()
        self.input_index_of = array.array("q")  # distinct idx -> input index
        self.finished = bytearray()  # distinct idx -> 1 once finished (this or an earlier attempt)
        # Rows an earlier attempt finished well, by idx: their key's hash (this process's:
        # both sides are hashed here), and what they reused (cells << 1 | whole row).
        self._seed_key = array.array("q")
        self._seed_reuse = array.array("q")
        # Their waterfall steps' hits: each distinct combination once, by number (0: none), so a
        # million seeded rows hold a number each, not a dict each.
        self._seed_steps = array.array("q")
        self._step_combos: list[dict[str, str | None]] = [{}]
        # Every row earlier attempts wrote (failed ones too), by idx; and, built when first
        # asked, their keys' hashes in order beside their idx: where each key was written.
        self._earlier = array.array("q")
        self._places: tuple[array.array[int], array.array[int]] | None = None
        # Rows earlier attempts failed, or whose cells handled a failure themselves, by key,
        # with the answers they found a value with and the failed calls their cells got past:
        # a row done again or moved keeps them (other succeeded rows say nothing of either).
        self._earlier_said: dict[str, EarlierRow] = {}
        self.first_failures: list[tuple[object, ...]] = []  # signatures, while no row succeeded
        self.started = time.monotonic()
        self.limit: int | None = None  # the distinct rows a limit lets through (a pilot)
        self.last_failed: str | None = None  # the latest row failure this attempt, as the live view says it

    @property
    def distinct(self) -> int:
        return len(self.input_index_of)

    def mark(self, idx: int) -> None:
        if idx >= len(self.finished):
            self.finished.extend(b"\0" * (idx + 1 - len(self.finished) + 1024))
        self.finished[idx] = 1

    def is_seeded(self, idx: int, key: str, *, placed: bool = False) -> bool:
        """Did an earlier attempt finish this row well? Only if the row it finished at this
        place had this key: rows may come back in another order (a list built from a set,
        a CSV sorted or edited since), and one in another place is done again (the sheet
        gives it back, nothing is paid twice), its map row written over. A row keyed by its
        place (a blank key: `placed`) is always done again: its key says nothing of its input."""
        if idx >= len(self.finished) or not self.finished[idx]:
            return False
        if placed or self._seed_key[idx] != hash(self._as_stored(key)):
            self.unseed(idx)
            return False
        return True

    def _as_stored(self, key: str) -> str:
        """The input's key as the store keeps it: what an earlier attempt's rows are compared by."""
        return self.s.io.store.sheets.stored_key(key) if "\x00" in key else key

    def unseed(self, idx: int) -> None:
        """The row at `idx` is to be done again (not the one an earlier attempt finished)."""
        self.finished[idx] = 0

    def count_seeded(self, idx: int) -> None:
        """A seeded row kept: what it reused and its steps' hits in the map's figures."""
        tally = self.tally
        reuse = self._seed_reuse[idx]
        tally.reused += reuse & 1
        tally.seeded_reused += reuse & 1
        tally.reused_cells += reuse >> 1
        for column, step in self._step_combos[self._seed_steps[idx]].items():
            hits = tally.steps.setdefault(column, {})
            hits[step or NOT_FOUND] = hits.get(step or NOT_FOUND, 0) + 1
        tally.seeded += 1

    def steps(self, cells: Mapping[str, Cell]) -> dict[str, str | None] | None:
        """Which step of each waterfall column found the row's value (None: no step did)."""
        if not self.waterfalls:
            return None
        found = {
            name: cell.step
            for name, cell in cells.items()
            if name in self.waterfalls and cell.error is None and cell.meta and "step" in cell.meta
        }
        for name, step in found.items():
            self.tally.steps.setdefault(name, {}).setdefault(step or NOT_FOUND, 0)
            self.tally.steps[name][step or NOT_FOUND] += 1
        return found or None

    def record(
        self,
        job: PendingRow,
        cells: Cells | None,
        error: str | None,
        steps: dict[str, str | None] | None = None,
        *,
        reused: tuple[bool, int] = (False, 0),
        found: set[str] | None = None,
        given: dict[str, Any] | None = None,
        fell_back: list[str] | None = None,
        kept_cells: bool = False,
    ) -> DeeplineError | None:
        """Write a finished row (its sheet row too, unless every cell was reused); returns
        why the map must stop, for a failed row of a map that fails on one."""
        outcome = "failed" if error is not None else "succeeded"
        if job.failing:  # an earlier attempt's failure, ended again: counted as it ends now
            job.failing = False
            self.tally.failing -= 1
        if outcome == "failed":
            self.tally.failed += 1
            self.last_failed = self.s.secrets.redact(f"row {job.key} failed: {error}")  # the live view's line
        else:
            self.tally.succeeded += 1
        sheet_row, previous = None, job.previous
        if cells is not None:
            stored_input = given if given is not None else dict(job.row)  # (no resolver ran: the input)
            secrets = self.s.secrets
            if secrets.active:  # what is stored holds no secret (the row's later columns had it)
                if secrets.holds(stored_input):
                    stored_input = secrets.redact_json(stored_input)
                cells = self._redacted(cells)
            sheet_row = SheetRow(
                self.sheet,
                job.key,
                stored_input,
                job.digest,
                cells,
                outcome,
                self.run_id,
                self.s.io.now(),
                replaces=previous is not None and previous.run_id != self.run_id,
                attempt=self.attempt,
            )
        # A row reused whole finished with the revision it was read at; a written one with
        # the revision its write makes.
        rev = previous.rev if sheet_row is None and previous is not None else None
        row = MapRow(self.run_id, self.name, job.idx, job.input_index, job.key, outcome, error, self.sheet, rev)
        row.attempt, row.steps = self.attempt, steps
        row.reused_row, row.reused_cells = reused
        earlier = self._earlier_said.pop(self._as_stored(job.key), None) if self._earlier_said else None
        row.found = _prefixes(found, earlier.found if earlier else None)
        said = earlier.fell_back if earlier else None
        # A succeeded row says which failed calls it got past only when the play handled one
        # itself; else (None) it got past every one, those an earlier attempt counted final too.
        # A row taken back whole (no cells computed), or in part (`kept_cells`: a later column
        # computed anew, the cells of its failures taken back), keeps what the earlier attempt said.
        if outcome == "failed" or fell_back is not None or (said is not None and (cells is None or kept_cells)):
            row.fell_back = _prefixes(fell_back, said) or []
        row.kept = sheet_row is None and previous is not None and previous.run_id == self.run_id
        if self._earlier:
            row.moved_from = self._moved_from(job.idx, job.key)
        self.s.writes.sheet(sheet_row, row)
        self.mark(job.idx)
        if error is not None and self.fail_fast:
            return DeeplineError(
                f"Map {self.name!r} stopped: row {job.key} failed: {error.rstrip('.')}. Its error is kept: "
                f"fix the cause, then: deepline resume {self.run_id} --refresh-failed"
            )
        return None

    def _moved_from(self, idx: int, key: str) -> int | None:
        """The place an earlier attempt wrote this key at, when it is not `idx`: rows came
        back in another order, and the row done again here leaves its old place (written
        over later, or never if this attempt stops first: a key is in the map once)."""
        if self._places is None:
            order = array.array("q", sorted(self._earlier, key=self._seed_key.__getitem__))
            self._places = array.array("q", (self._seed_key[i] for i in order)), order
        hashes, order = self._places
        wanted = hash(self._as_stored(key))
        at = bisect.bisect_left(hashes, wanted)
        while at < len(hashes) and hashes[at] == wanted:  # the SQL checks the key itself
            if order[at] != idx:
                return order[at]
            at += 1
        return None

    def _redacted(self, cells: Cells) -> Cells:
        """The cells as stored: a value that held a secret is kept redacted, and is never given
        back (its fingerprint matches no column): a later run computes it again, so the
        columns after it get the real value, not `[redacted]`."""
        secrets = self.s.secrets
        if not any(secrets.holds(cell.value) for cell in cells.values()):
            return cells
        return {
            name: cell._replace(value=secrets.redact_json(cell.value), fingerprint=REDACTED)
            if secrets.holds(cell.value)
            else cell
            for name, cell in cells.items()
        }

    def systemic(self, failure: BaseException, error: str) -> SystemicFailure | None:
        """The map's first rows all failing the same way (a revoked API key, a provider
        down) stop it, instead of paying for the whole list to fail. A failure replayed from
        its receipt (no call made: a resume of a refresh, say) costs nothing and says nothing
        of the provider now: it is not counted."""
        if self.tally.succeeded or len(self.first_failures) >= SAME_ERROR_STOP or failures.replayed(failure):
            return None
        self.first_failures.append(failures.signature(failure))
        if len(self.first_failures) == SAME_ERROR_STOP and len(set(self.first_failures)) == 1:
            return SystemicFailure(
                f"Map {self.name!r} stopped: its first {SAME_ERROR_STOP} rows all failed the same way ({error}). "
                f"Fix the cause, then: deepline resume {self.run_id} --refresh-failed"
            )
        return None

    async def start(self, record: MapRecord, total: int | None, limit: int | None) -> None:
        """Record the map started, seed what earlier attempts finished, and announce it."""
        self.limit = limit
        await self.s.io.call(self.s.io.store.sheets.save_map, record)
        seeded = await self.seed()
        self.s.bus.emit(
            "map.started", self.run_id, map=self.name, columns=record.columns, total=total, seeded=seeded,
            limit=limit, steps=self.waterfalls, description=record.description,
        )  # fmt: skip

    async def seed(self) -> int:
        """Rows an earlier attempt of this run finished well are seeded: not done again if
        the input has them at the same place (`is_seeded`). Failed ones go through the
        sheet again, where their error cell is kept, or recomputed with --refresh-failed.
        Where each key was written is kept, for a row done again at another place."""
        io, count, after = self.s.io, 0, -1
        combos: dict[tuple[tuple[str, str | None], ...], int] = {}
        while page := await io.call(io.store.sheets.earlier_map_rows, self.run_id, self.name, after, SEED_PAGE):
            after = page[-1].idx
            for row in page:
                idx = row.idx
                if idx >= len(self._seed_key):
                    grow = idx + 1 - len(self._seed_key) + 1024
                    zeros = array.array("q", bytes(8 * grow))
                    for seeds in (self._seed_key, self._seed_reuse, self._seed_steps):
                        seeds.extend(zeros)
                self._seed_key[idx] = hash(row.row_key)
                self._earlier.append(idx)
                if not row.succeeded or row.fell_back is not None:
                    if row.found or row.fell_back is not None:
                        self._earlier_said[row.row_key] = row
                    if not row.succeeded:
                        continue
                count += 1
                self.mark(idx)
                self._seed_reuse[idx] = row.reused_cells << 1 | row.reused_row
                if row.steps:
                    combo = tuple(sorted(row.steps.items()))  # column names are unique: never compares steps
                    number = combos.get(combo)
                    if number is None:
                        number = combos[combo] = len(self._step_combos)
                        self._step_combos.append(row.steps)
                    self._seed_steps[idx] = number
        return count

    async def trim(self, keys: AbstractSet[str] | None = None) -> None:
        """Drop the rows earlier attempts finished past this input's end (a list that lost
        rows since), and given `keys` (the input's, read whole by an attempt that stops
        before its end) those of keys the input no longer has: the map holds one row per
        distinct input row."""
        io = self.s.io
        await io.call(io.store.sheets.trim_map_rows, self.run_id, self.name, self.attempt, self.distinct, keys)

    async def complete(self, record: MapRecord, counts: Mapping[str, int]) -> None:
        """Record the map completed with the counts the barriers read back, log its summary
        and announce it."""
        s, tally = self.s, self.tally
        record.status = "completed"
        record.succeeded, record.failed = counts.get("succeeded", 0), counts.get("failed", 0)
        record.duplicate, record.reused = tally.duplicate, tally.reused
        record.total = record.succeeded + record.failed
        record.finished_at = s.io.now()
        await s.io.call(s.io.store.sheets.save_map, record)
        await self.log_summary(record)
        s.bus.emit(
            "map.completed", self.run_id, map=self.name, total=record.total, succeeded=record.succeeded,
            failed=record.failed, duplicate=record.duplicate, reused=record.reused,
            reused_cells=tally.reused_cells, earlier=tally.as_dict()["earlier"], steps=tally.steps,
            elapsed_s=round(time.monotonic() - self.started, 3),
        )  # fmt: skip

    async def record_input_columns(self, record: MapRecord, columns: list[str]) -> None:
        """A list's fields, recorded as they are first read (a CSV's header is known at the
        start): an export of the map before it ends (a kill, a run going on) has them."""
        record.input_columns = columns
        await self.s.io.call(self.s.io.store.sheets.save_map, record)

    async def input_read(self, record: MapRecord, distinct: int, duplicate: int) -> None:
        """The whole input read: record its distinct rows and its duplicates (see MapRun)."""
        record.total, record.duplicate = distinct, max(0, duplicate)
        await self.s.io.call(self.s.io.store.sheets.save_map, record)

    async def save_unfinished(self, record: MapRecord, exc: BaseException, distinct: int, duplicate: int) -> None:
        """A map that did not finish says so, with what it did (`runs show`, `export`)."""
        interrupted = isinstance(exc, asyncio.CancelledError | RunInterrupted)
        record.status = "waiting" if isinstance(exc, Suspended) else "interrupted" if interrupted else "failed"
        record.total, record.duplicate = distinct, duplicate
        record.succeeded = self.tally.succeeded_all
        record.failed, record.reused = self.tally.failed + self.tally.failing, self.tally.reused
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await self.s.io.call(self.s.io.store.sheets.save_map, record)

    def progress(self, total: int | None) -> None:
        """`map.progress`: the map's rows done (succeeded + failed) of its `total`, both in
        distinct rows: the input's rows less the duplicates read so far (exact once it is read
        whole), or with a limit the distinct rows it lets through. `succeeded` and `failed`
        both count the rows earlier attempts finished (a failed one asked again stays failed
        until it ends again); the rate only the rows this attempt did."""
        t = self.tally
        done = t.succeeded_all + t.failed + t.failing
        elapsed = max(time.monotonic() - self.started, 1e-6)
        # The rows this attempt computed: not an earlier attempt's taken back whole (kept), nor
        # rows taken whole from earlier runs' sheet rows (at once: they would promise an ETA
        # of seconds to a list whose new rows take minutes).
        computed = t.succeeded + t.failed - t.kept - (t.reused - t.seeded_reused)
        rate = computed / elapsed
        rows = self.distinct_in(total) if total else total
        left = rows - done if rows else 0
        eta = left / rate if rows and rate > 0 else None
        self.s.bus.emit(
            "map.progress",
            self.run_id,
            map=self.name,
            done=done,
            total=rows,
            rows_per_s=round(rate, 1),
            eta_s=None if eta is None else max(0.0, round(eta, 1)),
            last_failed=self.last_failed,
            **{**t.as_dict(), "succeeded": t.succeeded_all, "failed": t.failed + t.failing},
        )

    def distinct_in(self, total: int) -> int:
        """The map's rows in `total`: input rows less the duplicates read so far (a limit's
        total counts distinct rows already)."""
        return total if self.limit is not None else max(0, total - self.tally.duplicate)

    async def log_summary(self, record: MapRecord) -> None:
        """The map's log lines (exact wording: the SPEC's): its first failed rows, how many
        more were left out, and how it ended."""
        say = self._say
        if record.failed:
            s = self.s
            failed = await s.io.call(s.io.store.sheets.failed_map_rows, self.run_id, self.name, FAILURES_LOGGED)
            for row in failed:
                say(
                    f"row {row.row_key} failed: {row.error}",
                    level="warning",
                    kind="row.failed",
                    fields={"map": self.name, "row_key": row.row_key, "error": row.error},
                )
            if record.failed > FAILURES_LOGGED:
                omitted = record.failed - FAILURES_LOGGED
                say(
                    f"{omitted} additional row failure(s) omitted from map log",
                    level="warning",
                    kind="row.failed.omitted",
                    fields={"map": self.name, "omitted": omitted},
                )
        say(
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

    def _say(self, message: str, **given: Any) -> None:
        """A line of the map's own (its summary): written once per run, however many resumes
        replay the finished map (a summary that changed, its failed rows asked again, is new)."""
        key = "map:" + _json.digest(self.name, message)[:32]
        self.s.log(message, key=key, **given)


def _prefixes(keys: Iterable[str] | None, earlier: list[str] | None) -> list[str] | None:
    """Receipt keys as the map row keeps them (their first FOUND_PREFIX characters), with
    those an earlier attempt kept for the row."""
    if not keys and not earlier:
        return None
    prefixes = {key[:FOUND_PREFIX] for key in keys or ()}
    prefixes.update(earlier or ())
    return sorted(prefixes) or None
