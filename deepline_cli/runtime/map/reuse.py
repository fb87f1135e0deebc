"""The reuse policy: which cells of a sheet row a map takes back, and how fresh the tool
answers of a cell it recomputes must be. One policy, used by the map engine, the pilot's
projection and `deepline plan`, so the three never disagree.

A cell is reused while the row's input, the column's fingerprint (its code and what it
reads, see columns.py) and its freshness still match. A cell holding an error is kept,
however old, unless the run or the column asks to retry errors, or a resume finds the
error of its own earlier attempt and it may pass (a provider down, rate-limited). A cell
that went stale is recomputed with its tool calls made fresh: an answer older than the
cell's time to live is paid for again (a new receipt generation, a new idempotency key);
a younger one, made since by another run, is reused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from deepline_cli.runtime.map.columns import ResolvedColumn, same_fingerprint
from deepline_cli.store.records import Cell, SheetRow


@dataclass(frozen=True, slots=True)
class ReusePolicy:
    now: Callable[[], float]  # the store's clock
    force_refresh: bool = False  # --force-refresh: nothing is reused
    refresh_failed: bool = False  # --refresh-failed: cells holding an error are recomputed
    # The run asking: a resume asks again the cells an earlier attempt of it failed with an
    # error that may pass (a provider down); later runs keep them (--refresh-failed asks).
    run_id: str = ""

    def cell(
        self,
        previous: SheetRow | None,
        digest: str,
        column: ResolvedColumn,
        upstream_changed: bool = False,
        taken: bool = False,
    ) -> Cell | None:
        """The previous cell of `column` when it may be reused as it is, else None. `taken`:
        an earlier attempt of this run finished the row with the sheet row as it is (its
        cells taken, fresh then, from an earlier run): judged as the run's own."""
        if previous is None or upstream_changed or previous.input_digest != digest:
            return None
        cell = previous.cells.get(column.name)
        spec = column.column
        if cell is None or not same_fingerprint(cell.fingerprint, column):
            return None
        # An earlier attempt of this run made it: refreshed (forced, stale, recomputed) once per
        # run. One it took as it was (fresh then) is not judged stale again; a force (given to
        # this attempt: one given to that attempt would have recomputed it) refreshes it.
        own = previous.run_id == self.run_id
        if (self.force_refresh or spec.recompute) and not own:
            return None
        own = own or taken
        if cell.error is not None:  # kept, stale or not, unless asked (or this run's own, and may pass)
            # A refresh (forced too) recomputes it: its receipt says whether its call is asked again.
            asked = self.refresh_failed or self.force_refresh
            retry = spec.recompute_on_error or asked or (cell.transient and own)
            return None if retry else cell
        if spec.stale_after_seconds is not None and not own and self.is_stale(column, cell):
            return None
        return cell

    def whole_row(
        self, previous: SheetRow | None, digest: str, columns: Sequence[ResolvedColumn], taken: bool = False
    ) -> list[Cell] | None:
        """Every cell the row needs, when all of them may be reused (the fast path: no
        resolver runs); the cells up to the first one holding an error."""
        if previous is None or previous.input_digest != digest:
            return None
        cells = []
        for column in columns:
            cell = self.cell(previous, digest, column, taken=taken)
            if cell is None:
                return None
            cells.append(cell)
            if cell.error is not None:
                break
        return cells

    def is_stale(self, column: ResolvedColumn, cell: Cell) -> bool:
        ttl = column.column.staleness(previous_value(cell))
        return ttl is not None and (ttl <= 0 or self.now() - (cell.completed_at or 0.0) > ttl)


def as_input_now(previous: SheetRow | None, blank: str | None) -> SheetRow | None:
    """The sheet row earlier runs left, as the row's input is now: a failure its input gave
    it (a blank required cell, a line short of a cell) is not kept once the input no longer
    has it (the line mended, the column no longer required): the row is computed."""
    if previous is None or blank is not None or previous.status != "failed":
        return previous
    if not any(c.from_input for c in previous.cells.values()):
        return previous
    return replace(previous, cells={name: c for name, c in previous.cells.items() if not c.from_input})


def previous_value(cell: Cell | None) -> Any:
    """What a cell held, for `rc.previous` and a staleness function (None: nothing found,
    or an error)."""
    return cell.value if cell is not None and cell.error is None else None


def refresh_after(column: ResolvedColumn, previous: Cell | None) -> float | None:
    """How old a tool answer a recomputed cell of `column` may reuse: its time to live
    (None: any age)."""
    ttl = column.column.staleness(previous_value(previous))
    return None if ttl is None else max(0.0, float(ttl))
