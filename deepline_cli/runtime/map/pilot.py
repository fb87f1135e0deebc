"""A pilot: a map cut short by `--limit N` (or `ctx.map(limit=N)`).

When such a map finishes, the rest of its input is read once (no call is made): how many
rows and distinct keys it holds, and how many of those rows are already paid for (every
cell reusable from the sheet, as the map engine decides). `runtime/projection.py` turns
that and the pilot's own figures into a projection of the full list.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from deepline_cli.runtime.calls.store_thread import StoreIO
from deepline_cli.runtime.map.columns import ResolvedColumn
from deepline_cli.runtime.map.intake import CHUNK, Intake
from deepline_cli.runtime.map.reuse import ReusePolicy
from deepline_cli.runtime.map.row_context import PendingRow


class PilotMap(Protocol):
    """What the pilot reads of a map that finished (MapRun is one)."""

    @property
    def rows(self) -> Iterable[Mapping[str, Any]]: ...
    @property
    def limit(self) -> int | None: ...
    @property
    def read(self) -> int: ...
    @property
    def distinct(self) -> int: ...
    @property
    def intake(self) -> Intake: ...
    @property
    def sheet(self) -> str: ...
    @property
    def reuse(self) -> ReusePolicy: ...
    @property
    def columns(self) -> Sequence[ResolvedColumn]: ...
    @property
    def io(self) -> StoreIO: ...


@dataclass
class RestCounts:
    rows: int = 0  # input rows after the pilot's, duplicates included
    distinct: int = 0  # of those, keys not seen before
    paid: int = 0  # of those distinct rows, rows whose every cell is reusable from the sheet
    failing: int = 0  # of those distinct rows, rows that fail on their input (a blank required cell), unpaid

    def as_dict(self) -> dict[str, int]:
        return {
            "rest_rows": self.rows, "rest_distinct": self.distinct, "rest_paid": self.paid,
            "rest_failing": self.failing,
        }  # fmt: skip


async def scan_rest(engine: PilotMap) -> dict[str, Any] | None:
    """The rest of a map's input beyond its limit, or None when the limit cut nothing
    (or the rows can be read only once, like a generator)."""
    rows: Any = engine.rows
    if engine.limit is None or engine.distinct < engine.limit or iter(rows) is rows:
        return None
    counts = RestCounts()
    for chunk in rest_jobs(engine, counts):
        counts.paid += await count_paid(engine, chunk)
    return counts.as_dict() if counts.rows else None


def rest_jobs(engine: PilotMap, counts: RestCounts) -> Iterator[list[PendingRow]]:
    """The distinct rows after the ones the map read, in chunks (keys seen by the map skipped)."""
    seen = set(engine.intake.seen)
    csv = engine.intake.csv
    chunk: list[PendingRow] = []
    for input_index, raw in enumerate(csv.isolating() if csv is not None else engine.rows):
        if input_index < engine.read:
            continue
        counts.rows += 1
        row = dict(raw)
        blank = csv.blank(row) if csv is not None else None
        key = engine.intake.key(row, input_index, blank)
        if key in seen:
            continue
        seen.add(key)
        counts.distinct += 1
        if blank is not None:  # it fails before any call: neither paid nor to pay
            counts.failing += 1
            continue
        chunk.append(PendingRow(-1, input_index, key, row, engine.intake.digest(row, input_index), None))
        if len(chunk) >= CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


async def count_paid(engine: PilotMap, chunk: list[PendingRow]) -> int:
    """How many of these rows the map engine would take whole from the sheet (no call)."""
    io = engine.io
    keys = [job.key for job in chunk]
    previous = await io.call(io.store.sheets.load_sheet_rows, engine.sheet, keys, with_input=False)
    paid = 0
    for job in chunk:
        job.given(previous.get(job.key))
        if whole_row_reusable(engine, job):
            paid += 1
    return paid


def whole_row_reusable(engine: PilotMap, job: PendingRow) -> bool:
    """The map engine's fast path, decided without recording anything."""
    return engine.reuse.whole_row(job.previous, job.digest, engine.columns) is not None
