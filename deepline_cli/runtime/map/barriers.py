"""The two barriers a map passes before its rows are returned.

- Visibility: after the rows are written, read back through the store (not from memory)
  how many finished rows of this run are visible; retry briefly until all are, else
  SheetVisibilityError naming the map, the counts and the run.
- Finalization: every input row is accounted for, as succeeded, failed (by this attempt
  or an earlier one) or duplicate; else MapAccountingError listing the first missing
  input indexes.
"""

from __future__ import annotations

import asyncio

from deepline_cli.backoff import VISIBILITY_WAITS
from deepline_cli.errors import MapAccountingError, SheetVisibilityError
from deepline_cli.runtime.map.book import MapBook


async def visibility(book: MapBook) -> dict[str, int]:
    """Read back, through the store, that every finished row of this run is visible;
    returns the visible rows by outcome."""
    s, run_id, name = book.s, book.run_id, book.name
    expected = book.distinct
    s.bus.emit("barrier.visibility", run_id, map=name, expected=expected, visible=0, reads=0, passed=None)
    await s.writes.flushed()
    counts: dict[str, int] = {}
    seen, reads = 0, 0
    for delay in VISIBILITY_WAITS:
        await asyncio.sleep(delay)
        reads += 1
        counts = await s.io.call(s.io.store.sheets.count_map_rows, run_id, name)
        seen = sum(counts.values())
        if seen >= expected:
            s.bus.emit("barrier.visibility", run_id, map=name, expected=expected, visible=seen, reads=reads,
                       passed=True)  # fmt: skip
            return counts
    s.bus.emit("barrier.visibility", run_id, map=name, expected=expected, visible=seen, reads=reads, passed=False)
    raise SheetVisibilityError(
        f"Map {name!r} of run {run_id}: {expected} rows were written but only {seen} are visible in the store."
    )


async def finalization(book: MapBook, counts: dict[str, int]) -> None:
    """Every input row is accounted for as succeeded, failed or duplicate."""
    s, tally, distinct = book.s, book.tally, book.distinct
    persisted = sum(counts.values())
    in_memory = sum(book.finished[:distinct])
    accounted = persisted + tally.duplicate
    facts = {"map": book.name, "rows": tally.read, "distinct": distinct, "duplicate": tally.duplicate}
    s.bus.emit("barrier.finalization", book.run_id, passed=None, **facts)
    if persisted == distinct and in_memory == distinct and accounted == tally.read:
        s.bus.emit("barrier.finalization", book.run_id, passed=True, **facts)
        return
    stored = set(await s.io.call(s.io.store.sheets.finished_map_rows, book.run_id, book.name))
    missing = [book.input_index_of[i] for i in range(distinct) if i not in stored or not book.finished[i]]
    s.bus.emit("barrier.finalization", book.run_id, passed=False, missing=missing[:10], **facts)
    shown = ", ".join(str(i) for i in missing[:10]) or "none"
    raise MapAccountingError(
        f"Map {book.name!r} of run {book.run_id}: {tally.read} input rows but only {persisted} "
        f"finished and {tally.duplicate} duplicate rows are accounted for; missing input indexes: {shown}."
    )
