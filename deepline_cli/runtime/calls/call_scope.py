"""Which map cell a call is made for.

The map engine enters a cell while its resolver runs; every call made from there
(awaited in the same task, or in tasks it starts, through `rc` or `ctx`) is recorded in
the calls ledger with its map and row (per-row credits), and its receipt is refreshed when
the answer it holds is older than the cell's time to live. Outside maps there is no cell.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass(slots=True)  # one per cell: not frozen, whose fields cost object.__setattr__ each
class CellScope:
    map: str
    row_key: str
    refresh_after_s: float | None = None  # a stale cell's calls: answers older than this are paid again
    # What the cell's calls did, in order: the receipt keys that answered (live, reused or
    # shared) and those that failed. A waterfall reads which step's calls answered; the
    # map settles the row's failures (fallen back from, or final) when the row ends.
    answered: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    gate: int = 0  # of the answers, those of the column's run_if (asked before its resolver)
    found: bool = False  # the cell's value holds something (a waterfall: a step found it)
    oldest: float | None = None  # when the oldest answer it reused was made: the cell is that old
    # Why the map stopped, once it has: a call of the cell not sent yet is not sent then
    # (`halted_call`), and the row is not recorded (what its resolver made of that is no value).
    stopped: Callable[[], BaseException | None] | None = None
    held_back: bool = False  # a call of this cell was not sent: the map, or the run, had stopped
    # A wait reached in the cell (a child play that waits, a long sleep): the row waits with
    # it, even if its resolver caught the Suspended and returned something else.
    waits: BaseException | None = None

    def halted_call(self) -> BaseException | None:
        """The map's stop reason, if it stopped: the call about to go out stays back."""
        reason = self.stopped() if self.stopped is not None else None
        if reason is not None:
            self.held_back = True
        return reason

    def got_past(self) -> bool:
        """Did another call of the cell's resolver answer beside its failed ones (a waterfall's
        next step, a provider asked at the same time), and the cell find a value with it?
        Then they were fallen back from. Where none answered, the play handled the failure
        itself (a 404 caught), and where nothing was found, the failure may have hidden the
        value: final."""
        return self.found and len(self.answered) > self.gate


_CELL: ContextVar[CellScope | None] = ContextVar("deepline_cell", default=None)


def enter_cell(scope: CellScope) -> None:
    """Calls made from here on in this task (and tasks it starts) are for this cell."""
    _CELL.set(scope)


def current_cell() -> CellScope | None:
    return _CELL.get()


def hold_back_cell() -> None:
    """A refusal (the run stopped dispatching, a budget spent) is raised into the current
    cell's code: its row is not recorded, whatever its resolver makes of it."""
    cell = _CELL.get()
    if cell is not None:
        cell.held_back = True
