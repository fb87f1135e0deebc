"""Run statistics: tool calls live / reused / failed per tool, retries, credits.

While a run goes on these are counted in memory, on top of what earlier attempts did
(read from the store when the attempt starts), for the live view and `run.progress`.
When the attempt ends, the run's stats are read back from the store (`Store.run_stats`):
the calls ledger, the receipts it reused, its map rows and attempts, so an attempt that
was killed is counted too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from deepline_cli._format import sum_credits
from deepline_cli.store.records import FailedCall


@dataclass(slots=True)
class ToolCounts:
    live: int = 0
    reused: int = 0
    failed: int = 0  # calls whose final outcome is a failure (their row settled, or outside maps)
    credits: float = 0.0
    retries: int = 0
    retry_reasons: Counter[str] = field(default_factory=Counter)  # "429", "5xx", "network"
    recovered: int = 0  # of the failed, those whose cell got past them (a waterfall fell through)
    pending: int = 0  # failed calls whose row is still running: neither final nor fallen back yet
    kept: int = 0  # of the failed, those given back from earlier runs' receipts (no request made)
    not_found: int = 0  # "not found" answers (404) a row got past: they found nothing, nothing failed

    def note_retry(self, reason: str) -> None:
        self.retries += 1
        self.retry_reasons[reason] += 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "live": self.live,
            "reused": self.reused,
            "failed": self.failed,
            "credits": self.credits,
            "retries": self.retries,
            "retry_reasons": dict(self.retry_reasons),
            "recovered": self.recovered,
            "pending": self.pending,
            "kept": self.kept,
            "not_found": self.not_found,
        }


# A failure's state: its row still running, final, fallen back from, or (a 404 its row got
# past) an answer that found nothing.
PENDING, FINAL, RECOVERED, FOUND_NOTHING = "pending", "final", "recovered", "found_nothing"


@dataclass(slots=True)
class RunStats:
    """The live counts. A failed call is counted once per receipt key, by its final
    outcome, as `Store.run_stats` counts it: while its row runs it is pending (shown
    neither as failed nor as fallen back), and it settles when the row ends (fallen back
    if the row succeeded). So no count on screen goes down while the run goes on."""

    tools: dict[str, ToolCounts] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=lambda: {"live": 0, "reused": 0})
    failures: dict[str, tuple[str, str]] = field(default_factory=dict)  # key -> (tool, pending|final|recovered)
    # Failures given back from earlier runs' receipts, as the store tells them: a key this run
    # asked itself (and saw fail) is its own failure, whatever answered it later.
    kept: set[str] = field(default_factory=set)
    asked: set[str] = field(default_factory=set)  # keys this run asked and saw fail
    not_found: set[str] = field(default_factory=set)  # failed keys the provider knew nothing of (404)

    @classmethod
    def since(cls, before: dict[str, Any], recovered: dict[str, Any], failures: Iterable[FailedCall] = (),
              *, refresh_failed: bool = False) -> RunStats:  # fmt: skip
        """Counts that start from what earlier attempts did (`Store.run_stats` and its
        `final_failures`, and the retries the run's last stats kept). A failure this
        attempt may settle again starts pending: one whose row was not recorded (in flight
        when the last attempt stopped), one the attempt may retry (transient, outside
        maps; any, with --refresh-failed, in a failed row)."""
        stats = cls()
        for tool_id, c in (before.get("tools") or {}).items():
            stats.tools[tool_id] = ToolCounts(c.get("live", 0), c.get("reused", 0), 0, c.get("credits", 0.0),
                                              c.get("retries", 0))  # fmt: skip
        for f in failures:
            (stats.kept if f.kept else stats.asked).add(f.key)
            if f.not_found:
                stats.not_found.add(f.key)
            stats._enter(f.key, f.tool, _state_at_start(f, refresh_failed))
        for tool_id, c in recovered.items():
            counts = stats.tool(tool_id)
            # Retries of calls an interruption abandoned are in no ledger row: the last
            # attempt's outcome counted them.
            counts.retries = max(counts.retries, int(c.get("retries", 0)))
            counts.retry_reasons.update(c.get("retry_reasons") or {})
        stats.steps.update(before.get("steps") or {})
        return stats

    def tool(self, tool_id: str) -> ToolCounts:
        counts = self.tools.get(tool_id)
        if counts is None:
            counts = self.tools[tool_id] = ToolCounts()
        return counts

    @property
    def credits(self) -> float:
        return sum_credits(c.credits for c in self.tools.values())

    def tools_dict(self) -> dict[str, dict[str, Any]]:
        """Each tool's counts, as the views and the run's stats say them."""
        return {tool: counts.to_dict() for tool, counts in self.tools.items()}

    def call_failed(self, key: str, tool: str, *, in_row: bool, kept: bool = False, not_found: bool = False) -> None:
        """A call failed (or, `kept`, gave back an earlier run's stored failure: no request;
        `not_found`: the provider knew nothing of it, a 404). Counted once per key: in a map row
        it waits for the row to end; outside maps it is final at once."""
        if not_found:
            self.not_found.add(key)
        else:  # asked again and failed otherwise: a failure like any
            self.not_found.discard(key)
        known = self.failures.get(key)
        if kept:
            if key not in self.asked:
                self.kept.add(key)
        else:
            self.asked.add(key)
            if key in self.kept:  # asked again (--refresh-failed, --force-refresh): this run's own now
                self.kept.discard(key)
                if known is not None and known[1] != PENDING:
                    self.tool(known[0]).kept -= 1
        if known is None:
            self._enter(key, tool, PENDING if in_row else FINAL)
        elif known[1] == PENDING and not in_row:
            self._move(key, FINAL)

    def call_answered(self, key: str) -> None:
        """A call answered: a failure of it still pending (retried by this attempt) is no
        failure any more. One already shown stays shown until the run ends."""
        known = self.failures.get(key)
        if known is not None and known[1] == PENDING:
            del self.failures[key]
            self.tool(known[0]).pending -= 1

    def row_ended(self, fell_back: Iterable[str], final: Iterable[str] = (), *, failed: bool = False) -> None:
        """A map row ended (`failed`: it failed): the failures of its calls settle, fallen back
        from where their cell got a value all the same (a waterfall), final in the cell that
        failed the row; a 404 the row got past found nothing (FailedCall.found_nothing)."""
        for keys, state in ((fell_back, RECOVERED), (final, FINAL)):
            for key in keys:
                known = self.failures.get(key)
                if known is not None and known[1] == PENDING:
                    got_past = state == RECOVERED or not failed
                    self._move(key, FOUND_NOTHING if key in self.not_found and got_past else state)

    def _enter(self, key: str, tool: str, state: str) -> None:
        self.failures[key] = (tool, state)
        if state == PENDING:
            self.tool(tool).pending += 1
        else:
            self._settled(key, tool, state)

    def _move(self, key: str, state: str) -> None:
        tool, _ = self.failures[key]
        self.tool(tool).pending -= 1
        self.failures[key] = (tool, state)
        self._settled(key, tool, state)

    def _settled(self, key: str, tool: str, state: str) -> None:
        """Count a failure that settled: a "not found" answer (404) made by this run, or one
        given back from an earlier run's receipt (no request made: an answer reused); else a
        failure, fallen back from or final, given back or not."""
        counts = self.tool(tool)
        if state == FOUND_NOTHING:
            if key in self.kept:
                counts.reused += 1
            else:
                counts.not_found += 1
            return
        counts.failed += 1
        counts.recovered += state == RECOVERED
        counts.kept += key in self.kept


def _state_at_start(f: FailedCall, refresh_failed: bool) -> str:
    if f.row is not None and f.found_nothing:
        return FOUND_NOTHING
    if f.recovered:
        return RECOVERED
    may_retry = refresh_failed or (f.row == "" and f.retryable)  # a failed row's cell is kept
    if f.row is None or (may_retry and f.row in ("", "failed")):
        return PENDING
    return FINAL
