"""Read-only queries over what runs did: the calls ledger, reused receipts, attempts.

For the pilot projection, `deepline plan`'s observed hit rates and `deepline runs
report`; mixed into both SQL stores (the statements are plain SQL both speak).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deepline_cli import _json
from deepline_cli._format import add_credits, round_credits, sum_credits
from deepline_cli.store.records import FOUND_PREFIX, MADE_FOR, NOT_FOUND, FailedCall, said_not_found
from deepline_cli.store.sql_rows import DUPLICATES_SEEN, TREE

_ROWS_PAGE = 50_000  # map rows read per store call, to say how the rows of failed calls ended


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
    waited_s: float = 0.0  # waiting for a slot, the rate limit, a 429 pause, Retry-After: not the provider
    outside_map: bool = False


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
    outside_map: bool


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
    run_id, attempt, key, kind, tool, status, credits, started, ended, retries, category, map, row_key, waited = r
    return CallRow(
        run_id, attempt, key, kind, tool, status, float(credits), started, ended, int(retries), category, map,
        row_key, float(waited or 0.0), map is None,
    )  # fmt: skip


def empty_tool_counts() -> dict[str, Any]:
    """A tool's counts in a run's stats, before any call of it is counted."""
    return {"live": 0, "reused": 0, "failed": 0, "credits": 0.0, "retries": 0, "recovered": 0, "kept": 0,
            "not_found": 0}  # fmt: skip


class LedgerQueries:
    """Mixed into SqlStore, which supplies `_read`."""

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def map_steps(self, run_id: str) -> dict[str, dict[str, dict[str, int]]]:
        raise NotImplementedError

    def run_stats(self, run_id: str, failures: list[FailedCall] | None = None) -> dict[str, Any]:
        """What the run (and its child runs) did over every attempt (see `Store.run_stats`).

        Per tool: `live` executions (each one paid) and their credits and retries; `reused`
        answers of other runs' receipts; `failed`, the calls whose final outcome is a
        failure, each counted once however many attempts tried it (not those whose map row
        did not end: a resume settles them); `recovered`, those of them whose row, or at
        least whose cell, got past them (a waterfall fell back to its next step); `kept`,
        those of them given back from earlier runs' failed receipts (no request made)."""
        tools: dict[str, dict[str, Any]] = {}
        steps = {"live": 0, "reused": 0}
        executed = self._read(
            "SELECT kind, tool, count(*), coalesce(sum(credits), 0), coalesce(sum(retries), 0)"
            f" FROM calls WHERE run_id IN {TREE} AND status = 'completed' GROUP BY kind, tool",
            (run_id, run_id),
        )
        for kind, tool, n, credits, retries in executed:
            if kind == "step":
                steps["live"] += n
                continue
            counts = tools.setdefault(tool or f"ctx.{kind}", empty_tool_counts())
            counts["live"] += n
            counts["credits"] = add_credits(counts["credits"], float(credits))
            counts["retries"] += int(retries)
        failed_retries = self._read(
            "SELECT kind, tool, coalesce(sum(retries), 0) FROM calls"
            f" WHERE run_id IN {TREE} AND status = 'failed' AND kind <> 'step' GROUP BY kind, tool",
            (run_id, run_id),
        )
        for kind, tool, retries in failed_retries:
            tools.setdefault(tool or f"ctx.{kind}", empty_tool_counts())["retries"] += int(retries)
        for failure in self.final_failures(run_id) if failures is None else failures:  # given: read already
            counts = tools.setdefault(failure.tool, empty_tool_counts())
            if failure.row is None:
                continue  # its row did not end (the attempt stopped): neither final nor fallen back yet
            if failure.found_nothing:  # a "not found" answer (404) its row got past: no failure
                counts["reused" if failure.kept else "not_found"] += 1  # given back: an answer from a receipt
                continue
            counts["failed"] += 1
            counts["recovered"] += failure.recovered
            counts["kept"] += failure.kept
        used = self._read(
            # As the receipt answered the run then (a later refresh does not change it).
            "SELECT r.kind, r.tool, count(*) FROM run_receipts u JOIN receipts r ON r.key = u.key"
            f" WHERE u.used_at IS NOT NULL AND u.run_id IN {TREE} AND coalesce(u.status, r.status) = 'completed'"
            " GROUP BY r.kind, r.tool",
            (run_id, run_id),
        )
        for kind, tool, n in used:
            if kind == "step":
                steps["reused"] += n
            else:
                tools.setdefault(tool or f"ctx.{kind}", empty_tool_counts())["reused"] += n
        maps = self._read("SELECT map FROM maps WHERE run_id = ? ORDER BY started_at", (run_id,))
        return {
            "maps": [name for (name,) in maps],  # the run's own, in the order they started (export --map)
            "waterfalls": self.map_steps(run_id),
            "rows": self.row_stats(run_id),
            "tools": tools,
            "steps": steps,
            "credits": sum_credits(c["credits"] for c in tools.values()),
            **self._attempt_stats(run_id),
        }

    def final_failures(self, run_id: str) -> list[FailedCall]:
        """Every call of the run (and its child runs) whose final outcome is a failure."""
        rows = self._read(
            "SELECT f.key, f.kind, f.tool, f.run_id, f.map, f.row_key, r.retryable, 0, r.error FROM calls f"
            # The last execution of each key that ever failed in the run (few keys, one pass).
            f" JOIN (SELECT key, max(id) AS last FROM calls WHERE run_id IN {TREE} AND key IN"
            f" (SELECT key FROM calls WHERE run_id IN {TREE} AND status = 'failed') GROUP BY key) l ON l.last = f.id"
            " LEFT JOIN receipts r ON r.key = f.key WHERE f.status = 'failed' AND f.kind <> 'step'"
            # Failures of earlier runs given back from their receipts (no request made).
            " UNION ALL SELECT u.key, r.kind, r.tool, u.run_id, u.map, u.row_key, r.retryable, 1, r.error"
            " FROM run_receipts u JOIN receipts r ON r.key = u.key"
            f" WHERE u.used_at IS NOT NULL AND u.run_id IN {TREE} AND coalesce(u.status, r.status) = 'failed'"
            " AND r.kind <> 'step'"
            f" AND u.key NOT IN (SELECT key FROM calls WHERE run_id IN {TREE})",
            (run_id,) * 8,
        )
        owners = self._row_owners(run_id, {(run, map) for _, _, _, run, map, *_ in rows if map is not None})
        wanted = {(o, map, row) for _, _, _, run, map, row, *_ in rows if map is not None for o in owners[run, map]}
        ended = self._rows_ended(wanted)
        failed: list[FailedCall] = []
        for key, kind, tool, run, map, row, retryable, kept, error in rows:
            outcome: str | None = ""
            fell_back: frozenset[str] | None = None
            if map is not None:  # the row of the nearest run that has it: the call's own run's, or an ancestor's
                at = next((o for o in owners[run, map] if (o, map, row) in ended), None)
                outcome, fell_back = ended[at, map, row] if at is not None else (None, None)
            got_past = None if fell_back is None else key[:FOUND_PREFIX] in fell_back
            not_found = said_not_found(_json.loads(error))
            failed.append(
                FailedCall(key, tool or f"ctx.{kind}", outcome, bool(retryable), got_past, bool(kept), not_found)
            )
        return failed

    def _row_owners(self, run_id: str, made: set[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
        """The runs whose map row a (run, map) call may have been made for, nearest first:
        the run itself, and for a child play a map row ran (its calls outside its own maps
        are made for that row) its ancestors with a map of that name."""
        if not made:
            return {}
        parents = dict(self._read(f"SELECT run_id, parent_run_id FROM runs WHERE run_id IN {TREE}", (run_id, run_id)))
        maps = self._tree_maps(run_id)
        owners: dict[tuple[str, str], list[str]] = {}
        for run, map in made:
            chain: list[str] = []
            at: str | None = run
            while at is not None:
                if (at, map) in maps:
                    chain.append(at)
                at = parents.get(at)
            owners[run, map] = chain or [run]
        return owners

    def _tree_maps(self, run_id: str) -> set[tuple[str, str]]:
        """Every (run, map) of a run and the runs below it."""
        return set(self._read(f"SELECT run_id, map FROM maps WHERE run_id IN {TREE}", (run_id, run_id)))

    def _rows_ended(
        self, wanted: set[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], tuple[str, frozenset[str] | None]]:
        """How these map rows ended (absent: not recorded), with the failed calls the row got
        past where it says (see MapRow.fell_back); each map read once in pages: map rows are
        found by place, not by key, and a lookup per row scanned the whole map."""
        ended: dict[tuple[str, str, str], tuple[str, frozenset[str] | None]] = {}
        for run, map in sorted({(run, map) for run, map, _ in wanted}):
            after = -1
            while page := self._read(
                "SELECT idx, row_key, outcome, fell_back FROM map_rows WHERE run_id = ? AND map = ? AND idx > ?"
                " ORDER BY idx LIMIT ?",
                (run, map, after, _ROWS_PAGE),
            ):
                for _, key, outcome, fell_back in page:
                    if (run, map, key) in wanted:
                        said = None if fell_back is None else frozenset(_json.loads(fell_back))
                        ended[(run, map, key)] = (outcome, said)
                after = page[-1][0]
        return ended

    def row_stats(self, run_id: str) -> dict[str, int]:
        """A run's map rows: succeeded, failed, duplicate input rows, rows taken whole from
        sheet rows earlier runs wrote (`reused`), cells taken from the sheet, and rows an
        earlier attempt than the run's latest finished (not reused ones)."""
        outcomes = dict(
            self._read("SELECT outcome, count(*) FROM map_rows WHERE run_id = ? GROUP BY outcome", (run_id,))
        )
        # A map stopped (or killed) before its input was read whole recorded no duplicates: they
        # are counted from its rows, as `runs show` counts them on its line (unfinished_counts).
        duplicate = sum(
            max(int(counted or 0), int(seen or 0))
            for counted, seen in self._read(
                f"SELECT m.duplicate, CASE WHEN m.status <> 'completed' THEN (SELECT {DUPLICATES_SEEN}"
                " FROM map_rows r WHERE r.run_id = m.run_id AND r.map = m.map) END FROM maps m WHERE m.run_id = ?",
                (run_id,),
            )
        )
        reused, cells, earlier = self._read(
            "SELECT coalesce(sum(reused_row), 0), coalesce(sum(reused_cells), 0), coalesce(sum(CASE WHEN"
            " coalesce(reused_row, 0) = 0 AND attempt < (SELECT attempt FROM runs WHERE run_id = ?) THEN 1 ELSE 0"
            " END), 0) FROM map_rows WHERE run_id = ?",
            (run_id, run_id),
        )[0]
        return {
            "succeeded": int(outcomes.get("succeeded", 0)),
            "failed": int(outcomes.get("failed", 0)),
            "duplicate": int(duplicate),
            "reused": int(reused),
            "reused_cells": int(cells),
            "from_earlier_attempts": int(earlier),
        }

    def map_reuse(self, run_id: str, map: str) -> tuple[int, int]:
        """A map of a run: rows taken whole from sheet rows earlier runs wrote, and cells
        taken from the sheet."""
        rows = self._read(
            "SELECT coalesce(sum(reused_row), 0), coalesce(sum(reused_cells), 0) FROM map_rows"
            " WHERE run_id = ? AND map = ?",
            (run_id, map),
        )
        return int(rows[0][0]), int(rows[0][1])

    def _attempt_stats(self, run_id: str) -> dict[str, Any]:
        # A killed attempt ended some time after its last heartbeat: at its last call, if later.
        spans = self._read(
            "SELECT a.started_at, a.seen_at, a.ended_at, (SELECT max(c.ended_at) FROM calls c"
            " WHERE c.run_id = a.run_id AND c.attempt = a.attempt) FROM attempts a WHERE a.run_id = ?",
            (run_id,),
        )
        duration = sum((ended or max(seen, last or 0.0)) - began for began, seen, ended, last in spans)
        return {"attempts": len(spans), "duration_s": round(float(duration), 3)}

    def call_rows(self, run_id: str) -> list[CallRow]:
        """Every execution of the run and its child runs, in the order they ended."""
        rows = self._read(
            "SELECT c.run_id, c.attempt, c.key, c.kind, c.tool, c.status, coalesce(c.credits, 0), c.started_at,"
            " c.ended_at, coalesce(c.retries, 0), c.category, c.map, c.row_key, c.waited_s FROM calls c"
            f" WHERE c.run_id IN {TREE} ORDER BY c.id",
            (run_id, run_id),
        )
        return [_call_row(r) for r in rows]

    def reuse_rows(self, run_id: str) -> list[ReuseRow]:
        """Receipts of other runs the run (and its child runs) reused."""
        rows = self._read(
            "SELECT u.run_id, u.used_at, r.key, r.kind, r.tool, r.label, coalesce(u.status, r.status), u.map"
            " FROM run_receipts u JOIN receipts r ON r.key = u.key"
            f" WHERE u.used_at IS NOT NULL AND u.run_id IN {TREE} ORDER BY u.used_at",
            (run_id, run_id),
        )
        return [ReuseRow(r[0], r[1], r[2], r[3], r[4], r[5] or "", r[6], r[7] is None) for r in rows]

    def found_answers(self, run_id: str) -> set[str]:
        """The answers the run's map rows found a value with (runtime/found.py), as receipt
        key prefixes (`MapRow.found`); an answer a map row used that is not here found nothing."""
        found: set[str] = set()
        for (text,) in self._read(f"SELECT found FROM map_rows WHERE run_id IN {TREE} AND found IS NOT NULL",
                                  (run_id, run_id)):  # fmt: skip
            found.update(_json.loads(text) or [])
        return found

    def queued_children_stats(self, run_id: str) -> list[dict[str, Any]]:
        """The stats of the child runs below this run that workers ran as queued runs of their
        own, the topmost of each branch (each counts those below it): one query, however deep."""
        rows = self._read(
            "WITH RECURSIVE below(run_id, scheduled) AS (SELECT run_id, scheduled FROM runs WHERE parent_run_id = ?"
            " UNION SELECT r.run_id, r.scheduled FROM runs r JOIN below b ON r.parent_run_id = b.run_id"
            " WHERE b.scheduled = 0)"
            " SELECT r.stats FROM runs r JOIN below b ON b.run_id = r.run_id WHERE b.scheduled = 1",
            (run_id,),
        )
        return [_json.loads(text) or {} for (text,) in rows if text]

    def recorded_rows(self, run_id: str) -> set[tuple[str, str, str]]:
        """(run id, map, row key) of every map row the run and its child runs recorded."""
        rows = self._read(f"SELECT run_id, map, row_key FROM map_rows WHERE run_id IN {TREE}", (run_id, run_id))
        return {(r, m, k) for r, m, k in rows}

    def answers(self, keys: Sequence[str]) -> dict[str, Any]:
        """The stored answers of these receipts (calls made outside maps, judged found or not)."""
        found: dict[str, Any] = {}
        for i in range(0, len(keys), 400):
            chunk = list(keys[i : i + 400])
            marks = ", ".join("?" * len(chunk))
            for key, output in self._read(f"SELECT key, output FROM receipts WHERE key IN ({marks})", chunk):
                found[key] = _json.loads(output) if output is not None else None
        return found

    def call_descriptions(self, run_id: str) -> dict[str, list[str]]:
        """What the play said the calls of each tool were for (`description=`), by tool."""
        rows = self._read(
            "SELECT DISTINCT r.tool, r.description FROM receipts r"
            " WHERE r.description IS NOT NULL AND r.tool IS NOT NULL"
            f" AND (r.run_id IN {TREE} OR r.key IN (SELECT key FROM run_receipts WHERE run_id IN {TREE}))"
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
        """Credits of the completed calls made for each row of a run's map (every attempt),
        those of the child plays a row ran included (their calls are made for its row)."""
        credits: dict[str, float] = {}
        for key, paid in self._per_row(run_id, map, "sum(credits)", "status = 'completed'"):
            credits[key] = credits.get(key, 0.0) + float(paid or 0.0)
        return {key: round_credits(paid) for key, paid in credits.items()}

    def row_ends(self, run_id: str, map: str) -> dict[str, float]:
        """When the last call made for each row of a run's map ended (every attempt, the
        child plays a row ran included)."""
        ends: dict[str, float] = {}
        for key, end in self._per_row(run_id, map, "max(ended_at)", "ended_at IS NOT NULL"):
            ends[key] = max(ends.get(key, 0.0), float(end))
        return ends

    def _per_row(self, run_id: str, map: str, figure: str, where: str) -> list[tuple[str, Any]]:
        """`figure` of the calls made for each row of a run's map (a row key may come more
        than once): calls made in the row's cells (its child plays' there too), and the
        calls a child play made for the row in maps of its own (or a worker ran outside any)."""
        calls = self._read(
            f"SELECT run_id, map, row_key, {figure} FROM calls WHERE run_id IN {TREE} AND {where}"
            " GROUP BY run_id, map, row_key",
            (run_id, run_id),
        )
        made_for = self._made_for(run_id, map)
        own_maps = self._tree_maps(run_id)
        rows: list[tuple[str, Any]] = []
        for run, made_in, row_key, value in calls:
            if run in made_for and (made_in is None or (run, made_in) in own_maps):
                rows.append((made_for[run], value))  # in a map of the child's own (of any name)
            elif made_in == map and row_key is not None:
                rows.append((row_key, value))  # in a cell of this map's row
        return rows

    def _made_for(self, run_id: str, map: str) -> dict[str, str]:
        """The runs below `run_id` made for a row of its map `map` (a child play a row ran,
        and every run below that one), each with that row's key."""
        runs = self._read(f"SELECT run_id, parent_run_id, options FROM runs WHERE run_id IN {TREE}", (run_id, run_id))
        parents = {run: parent for run, parent, _ in runs}
        rows: dict[str, str] = {}
        for run, parent, options in runs:
            made = (_json.loads(options) or {}).get(MADE_FOR) if parent == run_id else None
            if isinstance(made, dict) and made.get("map") == map and made.get("row") is not None:
                rows[run] = str(made["row"])
        found: dict[str, str] = {}
        for run in parents:  # every run below a child made for a row: that row's too
            at: str | None = run
            while at is not None and at not in rows:
                at = parents.get(at)
            if at is not None:
                found[run] = rows[at]
        return found

    def rows_reusing(self, run_id: str, map: str) -> set[str]:
        """The rows of a run's map some call of which another run's receipt answered."""
        rows = self._read(
            "SELECT DISTINCT row_key FROM run_receipts WHERE run_id = ? AND map = ? AND used_at IS NOT NULL",
            (run_id, map),
        )
        return {key for (key,) in rows}

    def step_rows(self, play: str, workspace: str, map: str) -> dict[str, dict[str, int]]:
        """Earlier runs of a play: how many rows of its map each waterfall step found a value
        for (column → step, or "none" → rows). A row is counted once however many runs wrote
        it with the same steps (taken whole from the sheet, or its waterfall's cell reused)."""
        rows = self._read(
            "SELECT steps, count(DISTINCT row_key) FROM map_rows WHERE map = ? AND steps IS NOT NULL"
            " AND run_id IN (SELECT run_id FROM runs WHERE play = ? AND workspace = ?) GROUP BY steps",
            (map, play, workspace),
        )
        hits: dict[str, dict[str, int]] = {}
        for steps, n in rows:
            for column, step in (_json.loads(steps) or {}).items():
                per_step = hits.setdefault(column, {})
                per_step[step or NOT_FOUND] = per_step.get(step or NOT_FOUND, 0) + int(n)
        return hits

    def tool_rows(self, play: str, workspace: str, map: str) -> tuple[int, dict[str, int], dict[str, int]]:
        """Earlier runs of a play: how many rows of its map made calls, in how many of those
        rows each tool was called, and in how many it was paid (a completed call; a failed
        one, a 404 say, costs nothing): observed rates for `deepline plan`."""
        scope = "SELECT run_id FROM runs WHERE play = ? AND workspace = ?"
        total = self._read(
            "SELECT count(*) FROM (SELECT DISTINCT run_id, row_key FROM calls"
            f" WHERE map = ? AND row_key IS NOT NULL AND run_id IN ({scope})) t",
            (map, play, workspace),
        )
        per_tool = self._read(
            "SELECT tool, count(*), sum(paid) FROM (SELECT run_id, row_key, tool,"
            " max(CASE WHEN status = 'completed' THEN 1 ELSE 0 END) AS paid FROM calls"
            f" WHERE map = ? AND kind = 'tool' AND row_key IS NOT NULL AND run_id IN ({scope})"
            " GROUP BY run_id, row_key, tool) t GROUP BY tool",
            (map, play, workspace),
        )
        called = {str(tool): int(n) for tool, n, _ in per_tool}
        return int(total[0][0]), called, {str(tool): int(paid or 0) for tool, _, paid in per_tool}
