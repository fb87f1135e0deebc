"""Read-only queries over what runs did: the calls ledger, reused receipts, attempts.

For the pilot projection, `deepline plan`'s observed hit rates and `deepline runs
report`; mixed into both SQL stores (the statements are plain SQL both speak).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deepline_cli import _json
from deepline_cli.store.base import NOT_FOUND

_TREE = "(SELECT run_id FROM runs WHERE run_id = ? OR root_run_id = ?)"  # a run and its child runs
_EMPTY = "(r.output IS NULL OR r.output IN ('null', '{}', '[]', '\"\"'))"  # an answer that found nothing


@dataclass(slots=True)
class CallRow:
    """One execution from the calls ledger."""

    run_id: str
    attempt: int
    key: str
    kind: str
    tool: str | None
    status: str  # completed | failed
    credits: float
    started_at: float
    ended_at: float
    retries: int
    category: str | None
    map: str | None
    row_key: str | None
    found: bool = False  # completed with a non-empty output


@dataclass(slots=True)
class ReuseRow:
    """A receipt a run reused from another run (no new call), and when."""

    run_id: str
    used_at: float
    key: str
    kind: str
    tool: str | None
    label: str
    status: str
    output_empty: bool


@dataclass(slots=True)
class AttemptRow:
    run_id: str
    attempt: int
    holder: str | None
    started_at: float | None
    seen_at: float | None
    ended_at: float | None
    status: str | None


def _call_row(r: Sequence[Any]) -> CallRow:
    run_id, attempt, key, kind, tool, status, credits, started, ended, retries, category, map, row_key, found = r
    return CallRow(
        run_id, attempt, key, kind, tool, status, float(credits), started, ended, int(retries), category, map,
        row_key, bool(found),
    )  # fmt: skip


class LedgerQueries:
    """Mixed into SqlStore, which supplies `_read`."""

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def call_rows(self, run_id: str) -> list[CallRow]:
        """Every execution of the run and its child runs, in the order they ended."""
        rows = self._read(
            "SELECT c.run_id, c.attempt, c.key, c.kind, c.tool, c.status, coalesce(c.credits, 0), c.started_at,"
            " c.ended_at, coalesce(c.retries, 0), c.category, c.map, c.row_key, CASE WHEN c.status = 'completed'"
            f" AND NOT {_EMPTY} THEN 1 ELSE 0 END FROM calls c LEFT JOIN receipts r ON r.key = c.key"
            f" WHERE c.run_id IN {_TREE} ORDER BY c.id",
            (run_id, run_id),
        )
        return [_call_row(r) for r in rows]

    def reuse_rows(self, run_id: str) -> list[ReuseRow]:
        """Receipts of other runs the run (and its child runs) reused."""
        rows = self._read(
            "SELECT u.run_id, u.used_at, r.key, r.kind, r.tool, r.label, r.status,"
            f" CASE WHEN {_EMPTY} THEN 1 ELSE 0 END"
            " FROM run_receipts u JOIN receipts r ON r.key = u.key"
            f" WHERE u.used_at IS NOT NULL AND u.run_id IN {_TREE} ORDER BY u.used_at",
            (run_id, run_id),
        )
        return [ReuseRow(r[0], r[1], r[2], r[3], r[4], r[5] or "", r[6], bool(r[7])) for r in rows]

    def call_descriptions(self, run_id: str) -> dict[str, list[str]]:
        """What the play said the calls of each tool were for (`description=`), by tool."""
        rows = self._read(
            "SELECT DISTINCT r.tool, r.description FROM receipts r"
            " WHERE r.description IS NOT NULL AND r.tool IS NOT NULL"
            f" AND (r.run_id IN {_TREE} OR r.key IN (SELECT key FROM run_receipts WHERE run_id IN {_TREE}))"
            " ORDER BY r.tool, r.description",
            (run_id, run_id, run_id, run_id),
        )
        found: dict[str, list[str]] = {}
        for tool, description in rows:
            found.setdefault(tool, []).append(description)
        return found

    def attempt_rows(self, run_id: str) -> list[AttemptRow]:
        rows = self._read(
            "SELECT run_id, attempt, holder, started_at, seen_at, ended_at, status FROM attempts"
            " WHERE run_id = ? ORDER BY attempt",
            (run_id,),
        )
        return [AttemptRow(*r) for r in rows]

    def row_credits(self, run_id: str, map: str) -> dict[str, float]:
        """Credits of the completed calls made for each row of a run's map (every attempt)."""
        rows = self._read(
            "SELECT row_key, sum(credits) FROM calls WHERE run_id = ? AND map = ? AND status = 'completed'"
            " AND row_key IS NOT NULL GROUP BY row_key",
            (run_id, map),
        )
        return {key: float(credits or 0.0) for key, credits in rows}

    def step_rows(self, play: str, workspace: str, map: str) -> dict[str, dict[str, int]]:
        """Earlier runs of a play: how many rows of its map each waterfall step found a value
        for (column → step, or "none" → rows)."""
        rows = self._read(
            "SELECT steps, count(*) FROM map_rows WHERE map = ? AND steps IS NOT NULL"
            " AND run_id IN (SELECT run_id FROM runs WHERE play = ? AND workspace = ?) GROUP BY steps",
            (map, play, workspace),
        )
        hits: dict[str, dict[str, int]] = {}
        for steps, n in rows:
            for column, step in (_json.loads(steps) or {}).items():
                per_step = hits.setdefault(column, {})
                per_step[step or NOT_FOUND] = per_step.get(step or NOT_FOUND, 0) + int(n)
        return hits

    def tool_rows(self, play: str, workspace: str, map: str) -> tuple[int, dict[str, int]]:
        """Earlier runs of a play: how many rows of its map made calls, and in how many of
        those rows each tool was called (observed hit rates for `deepline plan`)."""
        scope = "SELECT run_id FROM runs WHERE play = ? AND workspace = ?"
        total = self._read(
            "SELECT count(*) FROM (SELECT DISTINCT run_id, row_key FROM calls"
            f" WHERE map = ? AND row_key IS NOT NULL AND run_id IN ({scope})) t",
            (map, play, workspace),
        )
        per_tool = self._read(
            "SELECT tool, count(*) FROM (SELECT DISTINCT run_id, row_key, tool FROM calls"
            f" WHERE map = ? AND kind = 'tool' AND row_key IS NOT NULL AND run_id IN ({scope})) t GROUP BY tool",
            (map, play, workspace),
        )
        return int(total[0][0]), {str(tool): int(n) for tool, n in per_tool}
