"""`rc`, what a column resolver can do for its row, and a row waiting to be resolved."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deepline_cli import _json
from deepline_cli.runtime.calls.events import log_fields
from deepline_cli.runtime.calls.receipts import durable_id
from deepline_cli.runtime.calls.tool_calls import Staleness
from deepline_cli.runtime.map.host import MapHost, MapParts
from deepline_cli.runtime.map.reuse import as_input_now
from deepline_cli.store.records import SheetRow


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
        self._cell: tuple[str, str] | None = None  # the cell being computed (`enter`)
        self._cell_key: str | None = None

    def enter(self, column: str, digest: str) -> None:
        """The cell about to be computed: `column` names it and what it is computed from (its
        code and that of the columns before it: MapRun.cell_ids), `digest` the row's input.
        Its `rc.step`s and `rc.fetch`es are its own: made again where any of that changed, a
        resume of the same run too; given back where none did (the values of the columns
        before it are not part of it: one may differ each time, a time, a random pick)."""
        self._cell, self._cell_key = (column, digest), None

    def _made_for(self) -> str:
        """What the cell is computed from, as a digest (worked out at its first step or fetch)."""
        if self._cell_key is None:
            self._cell_key = _json.digest(*self._cell)[:16] if self._cell is not None else ""
        return self._cell_key

    def log(self, message: str, **fields: Any) -> None:
        """A log line about this row: its fields name the map and the row's key (`deepline
        runs logs --where row_key=acme.com`) besides any the play gives."""
        extra = log_fields(fields) or {}
        # Rows run in no fixed order: every line of every attempt is kept.
        self._s.log(message, fields={"map": self._map, "row_key": self.row_key, **extra})

    def _scoped(self, id: str) -> str:
        # Row-level durable ids: unique per map and row, and outside the run's journal,
        # since rows finish in no fixed order.
        return f"map:{self._map}:{self.row_key}:{durable_id(id, 'an rc call')}"

    async def step(self, id: str, fn: Callable[[], Any], *, stale_after_seconds: Staleness = None) -> Any:
        return await self._ctx.step(
            self._scoped(id), fn, stale_after_seconds=stale_after_seconds, _journal=False, _cell=self._made_for()
        )

    async def fetch(self, id: str, url: str, **options: Any) -> Any:
        return await self._ctx.fetch(self._scoped(id), url, _journal=False, _cell=self._made_for(), **options)

    async def run_play(self, id: str, play_ref: str, input: Any = None, *, description: str = "") -> Any:
        return await self._ctx.run_play(self._scoped(id), play_ref, input, description=description, _journal=False)


@dataclass(slots=True)
class PendingRow:
    """A distinct input row the map has read and not finished: where it is, its key and
    content digest, and the sheet row earlier runs left for its key."""

    idx: int
    input_index: int
    key: str
    row: dict[str, Any]
    digest: str
    previous: SheetRow | None
    blank: str | None = None  # a required CSV column with no value: the row fails, nothing is called
    seeded: bool = False  # an earlier attempt of the run finished it here: kept while its input and code match
    failing: bool = False  # an earlier attempt of the run failed it, and this one asks it again

    def given(self, previous: SheetRow | None) -> None:
        """The sheet row earlier runs left for its key, as its input is now (reuse.as_input_now)."""
        self.previous = as_input_now(previous, self.blank)
