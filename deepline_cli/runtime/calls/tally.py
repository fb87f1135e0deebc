"""What a run learns from each call's outcome: its stats per tool, the cell the call was
made for (answered or failed), and, under `--json`, one `tool.call` event per call."""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepline_cli._format import add_credits
from deepline_cli.runtime.calls.call_scope import current_cell
from deepline_cli.runtime.calls.events import EventBus
from deepline_cli.runtime.calls.stats import RunStats

if TYPE_CHECKING:
    from deepline_cli.runtime.calls.receipts import DurableCall


class CallTally:
    def __init__(self, stats: RunStats, bus: EventBus, run_id: str) -> None:
        self._stats = stats
        self._bus = bus
        self._run_id = run_id

    def count(
        self,
        call: DurableCall,
        execution: str,
        credits: float,
        *,
        counted: bool = False,
        kept: bool = False,
        not_found: bool = False,
    ) -> None:
        """One outcome (`live`, `reused`, `in_flight`, `failed`); `counted`: an earlier
        attempt of this run already put it in the stats; `kept`: a failure given back from
        an earlier run's receipt (no request made); `not_found`: a failure that is the provider
        saying it knows nothing of it (404)."""
        if call.kind != "step":
            self._note_outcome(call, execution, kept, not_found)
        if not counted:
            self._tally(call, execution, credits)
        if self._bus.per_call:
            self._bus.emit(
                "tool.call", self._run_id,
                kind=call.kind, label=call.label, tool=call.tool, key=call.key, execution=execution,
            )  # fmt: skip

    def note_retry(self, call: DurableCall, reason: str) -> None:
        self._stats.tool(_tool(call)).note_retry(reason)

    def _tally(self, call: DurableCall, execution: str, credits: float) -> None:
        if call.kind == "step":
            self._stats.steps["live" if execution == "live" else "reused"] += 1
            return
        counts = self._stats.tool(_tool(call))
        if execution == "failed":
            return  # counted once per key, by its final outcome (_note_outcome)
        if execution == "live":
            counts.live += 1
            counts.credits = add_credits(counts.credits, credits)
        else:
            counts.reused += 1

    def _note_outcome(self, call: DurableCall, execution: str, kept: bool = False, not_found: bool = False) -> None:
        """What the call's cell (if any) and the failure counts learn from its outcome,
        however it was counted (a failure or answer an earlier attempt paid counts too)."""
        cell = current_cell()
        if execution == "failed":
            self._stats.call_failed(call.key, _tool(call), in_row=cell is not None, kept=kept, not_found=not_found)
            if cell is not None:
                cell.failed.append(call.key)
            return
        self._stats.call_answered(call.key)
        if cell is not None:
            cell.answered.append(call.key)


def _tool(call: DurableCall) -> str:
    return call.tool or f"ctx.{call.kind}"  # fetch, run_play: not tools
