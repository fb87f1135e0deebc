"""What `deepline runs report` shows, read from the store (no drawing here).

Everything comes from what the store kept: the calls ledger (every execution with its
start, end, retries and credits), the receipts the run reused from other runs (and
when), its maps and map rows, the sheet's cells, and its attempts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from deepline_cli.errors import UsageError
from deepline_cli.runtime.projection import CellCounts, read_sample
from deepline_cli.store.base import MapRecord, MapRow, RunRecord, Store
from deepline_cli.store.ledger import AttemptRow, CallRow, LedgerQueries, ReuseRow

FIRST_FAILURES = 10


@dataclass
class ToolFigures:
    tool: str
    live: int = 0
    reused: int = 0
    failed: int = 0
    retried: int = 0
    retries: int = 0
    credits: float = 0.0
    found: int = 0  # answers (live or reused) that were not empty
    latencies: list[float] = field(default_factory=list)
    descriptions: list[str] = field(default_factory=list)  # what the play said its calls were for

    @property
    def answered(self) -> int:
        return self.live + self.reused

    def percentile(self, q: float) -> float:
        return percentile(self.latencies, q)


@dataclass
class MapFigures:
    record: MapRecord
    columns: dict[str, CellCounts]
    failures: list[MapRow]


@dataclass
class Report:
    run: RunRecord
    stats: dict[str, Any]
    calls: list[CallRow]
    reuses: list[ReuseRow]
    attempts: list[AttemptRow]
    tools: dict[str, ToolFigures]
    maps: list[MapFigures]

    @property
    def start(self) -> float:
        times = [a.started_at for a in self.attempts if a.started_at] + [c.started_at for c in self.calls]
        times += [r.used_at for r in self.reuses]
        return min(times) if times else self.run.created_at

    @property
    def end(self) -> float:
        times = [a.ended_at or a.seen_at or 0.0 for a in self.attempts] + [c.ended_at for c in self.calls]
        times += [r.used_at for r in self.reuses]
        return max([t for t in times if t] or [self.run.finished_at or self.run.updated_at])


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def read_report(store: Store, run_id: str) -> Report:
    run = store.get_run(run_id)
    if run is None:
        raise UsageError(f"No run {run_id!r} in the store {store.url}.")
    if not isinstance(store, LedgerQueries):
        raise UsageError(f"The store {store.url} cannot report on runs.")
    calls, reuses = store.call_rows(run_id), store.reuse_rows(run_id)
    maps = [
        MapFigures(
            m, read_sample(store, store, run_id, m).columns, store.failed_map_rows(run_id, m.map, FIRST_FAILURES)
        )
        for m in store.get_maps(run_id)
    ]
    stats = {**run.stats, **store.run_stats(run_id)}
    tools = tool_figures(calls, reuses)
    for tool_id, counts in (run.stats.get("tools") or {}).items():
        # Retries of calls an interrupt abandoned are in the run's outcome, not the ledger.
        if int(counts.get("retries", 0)) > 0:
            figures = tools.setdefault(tool_id, ToolFigures(tool_id))
            figures.retries = max(figures.retries, int(counts["retries"]))
    for tool_id, said in store.call_descriptions(run_id).items():
        if tool_id in tools:
            tools[tool_id].descriptions = said
    return Report(run, stats, calls, reuses, store.attempt_rows(run_id), tools, maps)


def tool_figures(calls: list[CallRow], reuses: list[ReuseRow]) -> dict[str, ToolFigures]:
    tools: dict[str, ToolFigures] = {}
    for c in calls:
        if c.kind == "step":
            continue
        t = tools.setdefault(c.tool or f"ctx.{c.kind}", ToolFigures(c.tool or f"ctx.{c.kind}"))
        if c.status == "completed":
            t.live += 1
            t.found += c.found
        else:
            t.failed += 1
        t.retried += c.retries > 0
        t.retries += c.retries
        t.credits += c.credits
        t.latencies.append(max(0.0, c.ended_at - c.started_at))
    for r in reuses:
        if r.kind == "step" or r.status != "completed":
            continue
        t = tools.setdefault(r.tool or f"ctx.{r.kind}", ToolFigures(r.tool or f"ctx.{r.kind}"))
        t.reused += 1
        t.found += not r.output_empty
    return tools
