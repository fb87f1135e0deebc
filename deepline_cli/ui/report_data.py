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
from deepline_cli.runtime.map.projection import CellCounts, read_sample
from deepline_cli.runtime.providers.found import is_found
from deepline_cli.runtime.run.holders import holder_stale
from deepline_cli.store.ledger import AttemptRow, CallRow, ReuseRow
from deepline_cli.store.records import FOUND_PREFIX, MapRecord, MapRow, RunRecord
from deepline_cli.store.roles import Store
from deepline_cli.ui.run_show import maps_now

FIRST_FAILURES = 10


@dataclass
class ToolFigures:
    """One tool's calls, counted as `runs show` counts them (Store.run_stats), with what
    only the report shows: latencies, waiting, and how often the play found a value."""

    tool: str
    live: int = 0
    reused: int = 0
    failed: int = 0  # calls whose final outcome is a failure, each once
    recovered: int = 0  # of the failed, those whose cell got past them (a fall back)
    kept: int = 0  # of the failed, those given back from earlier runs' receipts (no request made)
    not_found: int = 0  # "not found" answers (404) a row got past: answers that found nothing
    retried: int = 0  # executions that needed retries
    retries: int = 0
    credits: float = 0.0
    found: int = 0  # answers (live or reused) the play found a value with (runtime/found.py)
    latencies: list[float] = field(default_factory=list)  # the provider's own time, per execution
    waits: list[float] = field(default_factory=list)  # time waited per execution (pacing, 429, backoff)
    descriptions: list[str] = field(default_factory=list)  # what the play said its calls were for

    @property
    def answered(self) -> int:
        """Answers: live and reused ones, and the "not found" ones (404) a row got past."""
        return self.live + self.reused + self.not_found

    @property
    def final(self) -> int:
        """Failed calls no step got past."""
        return self.failed - self.recovered

    def percentile(self, q: float) -> float:
        return percentile(self.latencies, q)


@dataclass
class MapFigures:
    record: MapRecord
    columns: dict[str, CellCounts]
    failures: list[MapRow]
    reused_rows: int = 0  # rows taken whole from sheet rows earlier runs wrote
    reused_cells: int = 0  # cells taken from the sheet (rows reused whole, and inside recomputed rows)


@dataclass
class Report:
    run: RunRecord
    stats: dict[str, Any]
    calls: list[CallRow]
    reuses: list[ReuseRow]
    attempts: list[AttemptRow]
    tools: dict[str, ToolFigures]
    maps: list[MapFigures]
    stale: bool = False  # `running`, but no live process holds it (killed, paused past its lease)

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
    run = store.runs.get_run(run_id)
    if run is None:
        raise UsageError(f"No run {run_id!r} in the store {store.url}.")
    calls, reuses = store.ledger.call_rows(run_id), store.ledger.reuse_rows(run_id)
    maps = [
        MapFigures(
            m,
            read_sample(store, run_id, m).columns,
            store.sheets.failed_map_rows(run_id, m.map, FIRST_FAILURES),
            *store.sheets.map_reuse(run_id, m.map),
        )
        for m in maps_now(store, run_id)
    ]
    stats = {**run.stats, **store.ledger.run_stats(run_id)}
    tools = tool_figures(stats.get("tools") or {}, calls, reuses, _found(store, run_id, calls, reuses))
    for tool_id, counts in (run.stats.get("tools") or {}).items():
        # Retries of calls an interrupt abandoned are in the run's outcome, not the ledger.
        if int(counts.get("retries", 0)) > 0:
            figures = tools.setdefault(tool_id, ToolFigures(tool_id))
            figures.retries = max(figures.retries, int(counts["retries"]))
    for tool_id, said in store.ledger.call_descriptions(run_id).items():
        if tool_id in tools:
            tools[tool_id].descriptions = said
    stale = holder_stale(run, store.now())
    return Report(run, stats, calls, reuses, store.ledger.attempt_rows(run_id), tools, maps, stale)


def _found(store: Store, run_id: str, calls: list[CallRow], reuses: list[ReuseRow]) -> set[str]:
    """The answers the play found a value with (receipt key prefixes): as the map rows
    recorded them, and for a call outside maps, or in a row never recorded (a budget stop
    dropped it), its answer judged by itself."""
    found = store.ledger.found_answers(run_id)
    recorded = store.ledger.recorded_rows(run_id) if any(not c.outside_map for c in calls) else set()
    outside = [
        c.key
        for c in calls
        if c.status == "completed" and (c.outside_map or (c.run_id, c.map or "", c.row_key or "") not in recorded)
    ]
    outside += [r.key for r in reuses if r.outside_map and r.status == "completed"]
    found.update(
        key[:FOUND_PREFIX] for key, answer in store.ledger.answers(sorted(set(outside))).items() if is_found(answer)
    )
    return found


def tool_figures(
    counted: dict[str, dict[str, Any]], calls: list[CallRow], reuses: list[ReuseRow], found: set[str]
) -> dict[str, ToolFigures]:
    """Per tool: the store's counts (`counted`, Store.run_stats), and from the ledger each
    execution's latency and wait, and how many answers the play found a value with."""
    tools = {
        tool_id: ToolFigures(
            tool_id,
            live=int(c.get("live", 0)),
            reused=int(c.get("reused", 0)),
            failed=int(c.get("failed", 0)),
            recovered=int(c.get("recovered", 0)),
            kept=int(c.get("kept", 0)),
            not_found=int(c.get("not_found", 0)),
            retries=int(c.get("retries", 0)),
            credits=float(c.get("credits", 0.0)),
        )
        for tool_id, c in counted.items()
    }
    for c in calls:
        if c.kind == "step":
            continue
        t = tools.setdefault(_tool(c.tool, c.kind), ToolFigures(_tool(c.tool, c.kind)))
        if c.status == "completed":
            t.found += c.key[:FOUND_PREFIX] in found
        t.retried += c.retries > 0
        t.latencies.append(provider_time(c))
        t.waits.append(min(c.waited_s, max(0.0, c.ended_at - c.started_at)))
    for r in reuses:
        if r.kind == "step" or r.status != "completed":
            continue
        t = tools.setdefault(_tool(r.tool, r.kind), ToolFigures(_tool(r.tool, r.kind)))
        t.found += r.key[:FOUND_PREFIX] in found
    return tools


def provider_time(c: CallRow) -> float:
    """An execution's time at the provider: from its start to its end, less the time it
    waited (a concurrency slot, the rate limit, a 429 pause, Retry-After and backoff)."""
    return max(0.0, c.ended_at - c.started_at - c.waited_s)


def superseded(calls: list[CallRow]) -> set[int]:
    """The failed executions a later attempt tried again (by position): not final."""
    last: dict[str, int] = {}
    for i, c in enumerate(calls):
        last[c.key] = i
    return {i for i, c in enumerate(calls) if c.status != "completed" and last[c.key] != i}


def _tool(tool: str | None, kind: str) -> str:
    return tool or f"ctx.{kind}"
