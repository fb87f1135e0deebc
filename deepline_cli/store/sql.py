"""The SQL both stores share: every table, query and write, in one dialect.

SQLite (3.35+) and PostgreSQL both speak `INSERT … ON CONFLICT` and `RETURNING`, so the
statements are written once with `?` placeholders. A backend supplies the connection,
how a write transaction starts, the placeholder style, and whether rows can be locked
(`FOR UPDATE`, PostgreSQL) or the whole database is (`BEGIN IMMEDIATE`, SQLite).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from itertools import chain
from typing import Any

from deepline_cli import _json
from deepline_cli.errors import StoreError
from deepline_cli.store.base import (
    NOT_FOUND,
    Applied,
    Boundary,
    Claim,
    ClaimOutcome,
    DatasetRow,
    LogLine,
    MapRecord,
    MapRow,
    Receipt,
    ReceiptGeneration,
    ReceiptQuery,
    RunRecord,
    Settlement,
    SheetRow,
    Writes,
    claim_idempotency_key,
    decide_claim,
)
from deepline_cli.store.ledger import LedgerQueries

_RUN_COLUMNS = (
    "run_id, play, play_ref, input, status, attempt, workspace, cwd, options, parent_run_id,"
    " root_run_id, holder, lease_expires_at, output, error, stats, created_at, updated_at,"
    " finished_at, wake_at, scheduled, ancestors, description, snapshot, failure_seen_by, stop_reason"
)
_RUN_JSON = frozenset({"input", "options", "output", "error", "stats", "ancestors"})
_RECEIPT_COLUMNS = (
    "key, kind, label, tool, status, run_id, attempt, lease_id, lease_expires_at,"
    " idempotency_key, output, error, failure_kind, retryable, credits, created_at, completed_at,"
    " batch_key, request, generation, description, input"
)
_BOUNDARY_COLUMNS = "run_id, id, kind, status, due_at, event_id, child_run_id, payload, created_at, resolved_at"
_TREE = "(SELECT run_id FROM runs WHERE run_id = ? OR root_run_id = ?)"  # a run and its child runs
_LOG_COLUMNS = "run_id, attempt, ts, level, message, key, kind, fields, id"
_CHUNK = 400  # bound parameters per statement stay well under every backend's limit
CONFLICT_RETRIES = 5


class StoreConflict(StoreError):
    """The database aborted a transaction to break a deadlock; it can be run again."""


class SqlStore(LedgerQueries):
    """Everything a store does, over a DB-API connection; see SQLiteStore and PostgresStore."""

    url: str
    row_lock = ""  # " FOR UPDATE" where the database locks rows
    skip_locked = ""  # " FOR UPDATE SKIP LOCKED" where workers can pass over each other's rows

    def _write(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _many(self, c: Any, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            c.executemany(sql, rows)

    def close(self) -> None:
        raise NotImplementedError

    def reconnect(self) -> None:
        return None  # a file has no connection to lose (PostgresStore has)

    def now(self) -> float:
        raise NotImplementedError

    # --- runs -------------------------------------------------------------------------

    def insert_run(self, run: RunRecord) -> bool:
        values = [_encode_run_field(name, getattr(run, name)) for name in _run_fields()]
        marks = ", ".join("?" * len(values))
        with self._write() as c:
            cur = c.execute(
                f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES ({marks}) ON CONFLICT (run_id) DO NOTHING", values
            )
            return bool(cur.rowcount == 1)

    def get_run(self, run_id: str) -> RunRecord | None:
        rows = self._read(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,))
        return _run_from_row(rows[0]) if rows else None

    def claim_queued_run(self, *, holder: str, expires_at: float) -> RunRecord | None:
        with self._write() as c:
            row = c.execute(
                "SELECT run_id FROM runs WHERE status = 'queued' ORDER BY created_at LIMIT 1" + self.skip_locked
            ).fetchone()
            if row is None:
                return None
            c.execute(
                "UPDATE runs SET status = 'running', attempt = attempt + 1, holder = ?, lease_expires_at = ?,"
                " updated_at = ?, stop_reason = NULL WHERE run_id = ? AND status = 'queued'",
                (holder, expires_at, time.time(), row[0]),
            )
            found = c.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (row[0],)).fetchone()
        record = _run_from_row(found)
        return record if record.holder == holder else None

    def due_runs(self, limit: int, now: float, host: str = "") -> list[RunRecord]:
        # By index (runs_wake, runs_lease): thousands of runs sleeping for days cost
        # nothing. Running runs held on `host` are listed too, whatever their lease: the
        # worker asks the OS whether their holder still lives (a killed one is taken over
        # at once). Children run inside their parent's process are not a worker's to
        # continue; scheduled children (queued runs of their own) are.
        mine = "(parent_run_id IS NULL OR scheduled = 1)"
        rows = self._read(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE status = 'waiting' AND wake_at <= ? AND {mine}"
            f" ORDER BY wake_at LIMIT {int(limit)}",
            (now,),
        )
        here = " OR holder LIKE ?" if host else ""
        rows += self._read(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE status = 'running' AND (lease_expires_at < ?{here})"
            f" AND {mine} ORDER BY lease_expires_at LIMIT {int(limit)}",
            (now, f"{host}:%") if host else (now,),
        )
        return [_run_from_row(r) for r in rows]

    def set_wake(self, run_id: str, wake_at: float | None) -> None:
        with self._write() as c:
            c.execute("UPDATE runs SET wake_at = ? WHERE run_id = ?", (wake_at, run_id))

    def put_snapshot(self, digest: str, snapshot: dict[str, Any]) -> None:
        with self._write() as c:
            c.execute(
                "INSERT INTO snapshots (digest, snapshot, created_at) VALUES (?, ?, ?) ON CONFLICT (digest) DO NOTHING",
                (digest, _json.dumps_str(snapshot), time.time()),
            )

    def get_snapshot(self, digest: str) -> dict[str, Any] | None:
        rows = self._read("SELECT snapshot FROM snapshots WHERE digest = ?", (digest,))
        return _json.loads(rows[0][0]) if rows else None

    def notify(self) -> None:
        return None

    def take_rate_slot(self, tool: str, interval_s: float, now: float, count: int = 1) -> float:
        with self._write() as c:
            c.execute("INSERT INTO rate_slots (tool, next_at) VALUES (?, ?) ON CONFLICT (tool) DO NOTHING", (tool, now))
            row = c.execute(
                "UPDATE rate_slots SET next_at = (CASE WHEN next_at > ? THEN next_at ELSE ? END) + ?"
                " WHERE tool = ? RETURNING next_at",
                (now, now, interval_s * count, tool),
            ).fetchone()
        return float(row[0]) - interval_s * count

    def lease_run(
        self,
        run_id: str,
        *,
        holder: str,
        expires_at: float,
        attempt: int,
        expect_attempt: int,
        expect_expires: float | None = None,
    ) -> bool:
        # With expect_expires: only if the holder has not heartbeated since it was seen gone.
        # A stop asked of an earlier attempt is done with: the new attempt starts clear.
        fence = " AND coalesce(lease_expires_at, 0) = ?" if expect_expires is not None else ""
        params = [holder, expires_at, attempt, time.time(), run_id, expect_attempt]
        with self._write() as c:
            cur = c.execute(
                "UPDATE runs SET holder = ?, lease_expires_at = ?, attempt = ?, stop_reason = NULL,"
                f" status = 'running', updated_at = ? WHERE run_id = ? AND attempt = ?{fence}",
                params + ([expect_expires] if expect_expires is not None else []),
            )
            return bool(cur.rowcount == 1)

    def heartbeat_run(self, run_id: str, *, holder: str, attempt: int, expires_at: float) -> bool:
        now = time.time()
        with self._write() as c:
            cur = c.execute(
                "UPDATE runs SET lease_expires_at = ?, updated_at = ? WHERE run_id = ? AND holder = ? AND attempt = ?",
                (expires_at, now, run_id, holder, attempt),
            )
            held = bool(cur.rowcount == 1)
            if held:
                c.execute("UPDATE attempts SET seen_at = ? WHERE run_id = ? AND attempt = ?", (now, run_id, attempt))
            return held

    def begin_attempt(self, run_id: str, attempt: int, holder: str, now: float) -> None:
        with self._write() as c:
            c.execute(
                "INSERT INTO attempts (run_id, attempt, holder, started_at, seen_at, status) VALUES (?, ?, ?, ?, ?,"
                " 'running') ON CONFLICT (run_id, attempt) DO UPDATE SET holder = excluded.holder,"
                " started_at = excluded.started_at, seen_at = excluded.seen_at, ended_at = NULL, status = 'running'",
                (run_id, attempt, holder, now, now),
            )

    def attempt_status(self, run_id: str, attempt: int) -> str | None:
        rows = self._read("SELECT status FROM attempts WHERE run_id = ? AND attempt = ?", (run_id, attempt))
        return str(rows[0][0]) if rows else None

    def end_attempt(self, run_id: str, attempt: int, status: str, now: float) -> None:
        with self._write() as c:
            c.execute(
                "UPDATE attempts SET ended_at = ?, seen_at = ?, status = ? WHERE run_id = ? AND attempt = ?",
                (now, now, status, run_id, attempt),
            )

    def update_run(self, run_id: str, *, only_attempt: int | None = None, **fields: Any) -> bool:
        fields["updated_at"] = time.time()
        names = list(fields)
        assignments = ", ".join(f"{name} = ?" for name in names)
        values = [_encode_run_field(name, fields[name]) for name in names]
        fence, params = ("", []) if only_attempt is None else (" AND attempt = ?", [only_attempt])
        with self._write() as c:
            cur = c.execute(f"UPDATE runs SET {assignments} WHERE run_id = ?{fence}", [*values, run_id, *params])
            return bool(cur.rowcount == 1)

    def list_runs(
        self, *, status: str | None = None, play: str | None = None, limit: int | None = None
    ) -> list[RunRecord]:
        where, params = _where({"status": status, "play": play})
        sql = f"SELECT {_RUN_COLUMNS} FROM runs{where} ORDER BY created_at DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [_run_from_row(r) for r in self._read(sql, params)]

    # --- receipts ---------------------------------------------------------------------

    def apply(self, writes: Writes, now: float) -> Applied:
        # A transaction the database aborted to break a deadlock with another process rolled
        # back whole (nothing of it is kept), so running it again is safe.
        for attempt in range(CONFLICT_RETRIES):
            try:
                return self._apply(writes, now)
            except StoreConflict:
                if attempt == CONFLICT_RETRIES - 1:
                    raise
                time.sleep(0.005 * 2**attempt)
        raise AssertionError("unreachable")

    def _apply(self, writes: Writes, now: float) -> Applied:
        with self._write() as c:
            # Fencing: an attempt whose run another process took over writes nothing more.
            # Its settlements are refused by their leases; its claims, rows and log lines here.
            stale = self._superseded(c, writes)
            settled = self._settle(c, writes.settlements, now)
            outcomes = self._claim(c, writes.claims, now, stale) if writes.claims else []
            sheet_rows = [r for r in writes.sheet_rows if (r.run_id, r.attempt) not in stale]
            if sheet_rows:
                self._write_sheet_rows(c, sheet_rows)
            map_rows = [r for r in writes.map_rows if (r.run_id, r.attempt) not in stale]
            if map_rows:
                self._write_map_rows(c, map_rows)
            logs = [ln for ln in writes.logs if (ln.run_id, ln.attempt) not in stale]
            if logs:
                self._many(
                    c,
                    "INSERT INTO logs (run_id, attempt, ts, level, message, key, kind, fields)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    [
                        (ln.run_id, ln.attempt, ln.ts, ln.level, ln.message, ln.key, ln.kind, _json_or_none(ln.fields))
                        for ln in logs
                    ],
                )
        return Applied(settled, outcomes)

    def _write_sheet_rows(self, c: Any, rows: Sequence[SheetRow]) -> None:
        """A new revision of each row; one another run finished with goes to the history."""
        self._many(
            c,
            "INSERT INTO sheet_history (sheet, row_key, rev, input, cells, run_id, updated_at)"
            " SELECT sheet, row_key, rev, input, cells, run_id, updated_at FROM sheet_rows"
            " WHERE sheet = ? AND row_key = ? AND run_id <> ? ON CONFLICT DO NOTHING",
            [(r.sheet, r.row_key, r.run_id) for r in rows if r.replaces],
        )
        self._many(
            c,
            "INSERT INTO sheet_rows (sheet, row_key, input, input_digest, cells, status, run_id, updated_at, rev)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1) ON CONFLICT (sheet, row_key) DO UPDATE SET"
            " input = excluded.input, input_digest = excluded.input_digest, cells = excluded.cells,"
            " status = excluded.status, run_id = excluded.run_id, updated_at = excluded.updated_at,"
            " rev = sheet_rows.rev + 1",
            [
                (
                    r.sheet,
                    r.row_key,
                    _json.dumps_str(r.input),
                    r.input_digest,
                    _json.dumps_str(r.cells),
                    r.status,
                    r.run_id,
                    r.updated_at,
                )
                for r in rows
            ],
        )

    def _write_map_rows(self, c: Any, rows: Sequence[MapRow]) -> None:
        upsert = (
            " ON CONFLICT (run_id, map, idx) DO UPDATE SET input_index = excluded.input_index,"
            " row_key = excluded.row_key, outcome = excluded.outcome, error = excluded.error, rev = excluded.rev,"
            " steps = excluded.steps, attempt = coalesce(excluded.attempt, map_rows.attempt),"
            " reused_row = excluded.reused_row, reused_cells = excluded.reused_cells, found = excluded.found"
        )
        columns = (
            "INSERT INTO map_rows (run_id, map, idx, input_index, row_key, outcome, error, steps, attempt,"
            " reused_row, reused_cells, found, rev)"
        )
        known = [r for r in rows if r.rev is not None]
        self._many(
            c,
            f"{columns} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?){upsert}",
            [(*_map_row_values(r), r.rev) for r in known],
        )
        # Written with their sheet row in this transaction: the revision it just got.
        self._many(
            c,
            f"{columns} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
            " (SELECT rev FROM sheet_rows WHERE sheet = ? AND row_key = ?))" + upsert,
            [(*_map_row_values(r), r.sheet, r.row_key) for r in rows if r.rev is None],
        )

    def heartbeat_receipts(self, leases: Sequence[tuple[str, str]], expires_at: float) -> set[str]:
        # Fencing: a lease held by an attempt whose run another process took over is not
        # extended, even before the new owner released that attempt's receipts.
        lost: set[str] = set()
        with self._write() as c:
            for key, lease_id in leases:
                cur = c.execute(
                    "UPDATE receipts SET lease_expires_at = ? WHERE key = ? AND lease_id = ? AND status = 'running'"
                    " AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.run_id = receipts.run_id"
                    " AND runs.attempt > receipts.attempt)",
                    (expires_at, key, lease_id),
                )
                if cur.rowcount != 1:
                    lost.add(lease_id)
        return lost

    def expire_run_receipts(self, run_id: str) -> int:
        # The attempt that held them is dead: its calls may have been sent (released).
        with self._write() as c:
            cur = c.execute(
                "UPDATE receipts SET status = 'released', lease_expires_at = NULL"
                " WHERE run_id = ? AND status = 'running'",
                (run_id,),
            )
            return int(cur.rowcount)

    def get_receipt(self, key: str) -> Receipt | None:
        rows = self._read(f"SELECT {_RECEIPT_COLUMNS} FROM receipts WHERE key = ?", (key,))
        return _receipt_from_row(rows[0]) if rows else None

    def receipt_history(self, key: str) -> list[ReceiptGeneration]:
        rows = self._read(
            "SELECT key, generation, run_id, attempt, idempotency_key, output, credits, completed_at, replaced_at"
            " FROM receipt_history WHERE key = ? ORDER BY generation",
            (key,),
        )
        return [
            ReceiptGeneration(key, gen, run_id, attempt, idem, _json.loads(output), credits or 0.0, done, replaced)
            for key, gen, run_id, attempt, idem, output, credits, done, replaced in rows
        ]

    def tool_costs(self) -> dict[str, float]:
        return {tool: float(most) for tool, most in self._read("SELECT tool, max_credits FROM tool_costs")}

    def credits_spent(self, run_id: str) -> float:
        rows = self._read(
            f"SELECT coalesce(sum(credits), 0) FROM calls WHERE status = 'completed' AND run_id IN {_TREE}",
            (run_id, run_id),
        )
        return float(rows[0][0])

    def run_usage(self, run_id: str) -> tuple[int, int]:
        calls = self._read(
            f"SELECT count(*) FROM calls WHERE kind = 'tool' AND run_id IN {_TREE}",
            (run_id, run_id),
        )
        children = self._read("SELECT count(*) FROM runs WHERE root_run_id = ? AND run_id <> ?", (run_id, run_id))
        return int(calls[0][0]), int(children[0][0])

    def query_receipts(self, query: ReceiptQuery) -> list[Receipt]:
        clauses: list[str] = []
        params: list[Any] = []
        source = "receipts"
        if query.run_id:
            clauses.append("(receipts.run_id = ? OR receipts.key IN (SELECT key FROM run_receipts WHERE run_id = ?))")
            params += [query.run_id, query.run_id]
        if query.key_prefix:
            clauses.append("receipts.key >= ? AND receipts.key < ?")
            params += [query.key_prefix, query.key_prefix + "\uffff"]
        for name in ("status", "tool"):
            value = getattr(query, name)
            if value:
                clauses.append(f"receipts.{name} = ?")
                params.append(value)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        cols = ", ".join(f"receipts.{c.strip()}" for c in _RECEIPT_COLUMNS.split(","))
        sql = f"SELECT {cols} FROM {source}{where} ORDER BY receipts.created_at, receipts.key"
        if query.limit:
            sql += f" LIMIT {int(query.limit)}"
        return [_receipt_from_row(r) for r in self._read(sql, params)]

    # --- logs -------------------------------------------------------------------------

    # --- sheets and maps ---------------------------------------------------------------

    def load_sheet_rows(self, sheet: str, row_keys: Sequence[str]) -> dict[str, SheetRow]:
        found: dict[str, SheetRow] = {}
        for chunk in _chunks(row_keys):
            marks = ", ".join("?" * len(chunk))
            rows = self._read(
                "SELECT row_key, input, input_digest, cells, status, run_id, updated_at, rev"
                f" FROM sheet_rows WHERE sheet = ? AND row_key IN ({marks})",
                [sheet, *chunk],
            )
            for key, inp, digest, cells, status, run_id, updated, rev in rows:
                found[key] = SheetRow(
                    sheet, key, _json.loads(inp), digest, _json.loads(cells), status, run_id, updated, rev
                )
        return found

    def map_steps(self, run_id: str, *, succeeded_only: bool = False) -> dict[str, dict[str, dict[str, int]]]:
        only = " AND outcome = 'succeeded'" if succeeded_only else ""
        rows = self._read(
            "SELECT map, steps, count(*) FROM map_rows"
            f" WHERE run_id = ? AND steps IS NOT NULL{only} GROUP BY map, steps",
            (run_id,),
        )
        hits: dict[str, dict[str, dict[str, int]]] = {}
        for map_name, steps, n in rows:
            for column, step in (_json.loads(steps) or {}).items():
                per_step = hits.setdefault(map_name, {}).setdefault(column, {})
                per_step[step or NOT_FOUND] = per_step.get(step or NOT_FOUND, 0) + int(n)
        if hits:  # in the waterfall's own order, "none" last
            for map_name, declared in self._read("SELECT map, steps FROM maps WHERE run_id = ?", (run_id,)):
                for column, names in (_json.loads(declared) or {}).items():
                    found = hits.get(map_name, {}).get(column)
                    if found is not None:
                        order = [*names, NOT_FOUND]
                        hits[map_name][column] = {k: found[k] for k in sorted(found, key=_position(order))}
        return hits

    def finished_map_rows(self, run_id: str, map: str) -> list[int]:
        rows = self._read("SELECT idx FROM map_rows WHERE run_id = ? AND map = ?", (run_id, map))
        return [r[0] for r in rows]

    def succeeded_map_rows(self, run_id: str, map: str) -> list[int]:
        rows = self._read(
            "SELECT idx FROM map_rows WHERE run_id = ? AND map = ? AND outcome = 'succeeded'", (run_id, map)
        )
        return [r[0] for r in rows]

    def count_map_rows(self, run_id: str, map: str) -> dict[str, int]:
        rows = self._read(
            "SELECT outcome, count(*) FROM map_rows WHERE run_id = ? AND map = ? GROUP BY outcome",
            (run_id, map),
        )
        return {outcome: n for outcome, n in rows}

    def failed_map_rows(self, run_id: str, map: str, limit: int, *, after_idx: int = -1) -> list[MapRow]:
        rows = self._read(
            "SELECT run_id, map, idx, input_index, row_key, outcome, error, '', rev FROM map_rows"
            " WHERE run_id = ? AND map = ? AND outcome = 'failed' AND idx > ? ORDER BY idx LIMIT ?",
            (run_id, map, after_idx, limit),
        )
        return [MapRow(*r) for r in rows]

    def map_rows_page(
        self, run_id: str, map: str, sheet: str, after_idx: int, limit: int, *, failed_only: bool = False
    ) -> list[DatasetRow]:
        failed = " AND m.outcome = 'failed'" if failed_only else ""
        # The revision the run finished with: current, or in the history if a later run
        # recomputed the row (map rows older than revisions have none: the current one).
        rows = self._read(
            "SELECT m.idx, m.row_key, m.outcome, m.error,"
            " CASE WHEN h.rev IS NULL THEN s.input ELSE h.input END,"
            " CASE WHEN h.rev IS NULL THEN s.cells ELSE h.cells END FROM map_rows m"
            " LEFT JOIN sheet_rows s ON s.sheet = ? AND s.row_key = m.row_key"
            " LEFT JOIN sheet_history h ON h.sheet = ? AND h.row_key = m.row_key AND h.rev = m.rev AND s.rev <> m.rev"
            f" WHERE m.run_id = ? AND m.map = ? AND m.idx > ?{failed} ORDER BY m.idx LIMIT ?",
            (sheet, sheet, run_id, map, after_idx, limit),
        )
        return [
            DatasetRow(idx, key, outcome, error, _json.loads(inp), _json.loads(cells) or {})
            for idx, key, outcome, error, inp, cells in rows
        ]

    def save_map(self, record: MapRecord) -> None:
        with self._write() as c:
            if record.attempt and self._superseded_pairs(c, {(record.run_id, record.attempt)}):
                return  # fencing: the run was taken over; its new owner keeps the map's record
            c.execute(
                "INSERT INTO maps (run_id, map, sheet, input_columns, columns, status, total, succeeded,"
                " failed, duplicate, reused, started_at, finished_at, pilot, steps, description)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, map) DO UPDATE SET"
                " sheet = excluded.sheet, input_columns = excluded.input_columns, columns = excluded.columns,"
                " status = excluded.status, total = excluded.total, succeeded = excluded.succeeded,"
                " failed = excluded.failed, duplicate = excluded.duplicate, reused = excluded.reused,"
                " finished_at = excluded.finished_at, pilot = excluded.pilot, steps = excluded.steps,"
                " description = excluded.description",
                (
                    record.run_id,
                    record.map,
                    record.sheet,
                    _json.dumps_str(record.input_columns),
                    _json.dumps_str(record.columns),
                    record.status,
                    record.total,
                    record.succeeded,
                    record.failed,
                    record.duplicate,
                    record.reused,
                    record.started_at,
                    record.finished_at,
                    _json_or_none(record.pilot),
                    _json_or_none(record.steps or None),
                    record.description or None,
                ),
            )

    def get_maps(self, run_id: str) -> list[MapRecord]:
        rows = self._read(
            "SELECT run_id, map, sheet, input_columns, columns, status, total, succeeded, failed,"
            " duplicate, reused, started_at, finished_at, pilot, steps, description FROM maps WHERE run_id = ?"
            " ORDER BY started_at",
            (run_id,),
        )
        return [_map_from_row(r) for r in rows]

    # --- suspension -----------------------------------------------------------------------

    def get_boundary(self, run_id: str, id: str) -> Boundary | None:
        rows = self._read(f"SELECT {_BOUNDARY_COLUMNS} FROM boundaries WHERE run_id = ? AND id = ?", (run_id, id))
        return _boundary_from_row(rows[0]) if rows else None

    def put_boundary(self, boundary: Boundary) -> Boundary:
        b = boundary
        with self._write() as c:
            c.execute(
                f"INSERT INTO boundaries ({_BOUNDARY_COLUMNS}) VALUES ({', '.join('?' * 10)})"
                " ON CONFLICT (run_id, id) DO NOTHING",
                (
                    b.run_id,
                    b.id,
                    b.kind,
                    b.status,
                    b.due_at,
                    b.event_id,
                    b.child_run_id,
                    _json_or_none(b.payload),
                    b.created_at,
                    b.resolved_at,
                ),
            )
            row = c.execute(
                f"SELECT {_BOUNDARY_COLUMNS} FROM boundaries WHERE run_id = ? AND id = ?", (b.run_id, b.id)
            ).fetchone()
        return _boundary_from_row(row)

    def resolve_boundary(self, run_id: str, id: str, payload: Any, now: float) -> None:
        with self._write() as c:
            c.execute(
                "UPDATE boundaries SET status = 'resolved', payload = ?, resolved_at = ?"
                " WHERE run_id = ? AND id = ? AND status = 'waiting'",
                (_json_or_none(payload), now, run_id, id),
            )

    def boundaries(self, run_id: str) -> list[Boundary]:
        rows = self._read(
            f"SELECT {_BOUNDARY_COLUMNS} FROM boundaries WHERE run_id = ? ORDER BY created_at, id", (run_id,)
        )
        return [_boundary_from_row(r) for r in rows]

    def send_event(self, run_id: str, event_id: str, payload: Any, now: float) -> bool:
        with self._write() as c:
            cur = c.execute(
                "INSERT INTO events (run_id, event_id, payload, created_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (run_id, event_id) DO NOTHING",
                (run_id, event_id, _json_or_none(payload), now),
            )
            return bool(cur.rowcount == 1)

    def get_event(self, run_id: str, event_id: str) -> tuple[bool, Any]:
        rows = self._read("SELECT payload FROM events WHERE run_id = ? AND event_id = ?", (run_id, event_id))
        return (True, _json.loads(rows[0][0])) if rows else (False, None)

    def journal(self, run_id: str) -> list[str]:
        return [r[0] for r in self._read("SELECT id FROM journal WHERE run_id = ? ORDER BY position", (run_id,))]

    def logged(self, run_id: str) -> set[str]:
        return {r[0] for r in self._read("SELECT key FROM logs WHERE run_id = ? AND key IS NOT NULL", (run_id,))}

    def append_journal(self, run_id: str, position: int, id: str) -> None:
        with self._write() as c:
            c.execute(
                "INSERT INTO journal (run_id, position, id) VALUES (?, ?, ?) ON CONFLICT (run_id, position) DO NOTHING",
                (run_id, position, id),
            )

    def child_runs(self, run_id: str) -> list[RunRecord]:
        rows = self._read(f"SELECT {_RUN_COLUMNS} FROM runs WHERE parent_run_id = ? ORDER BY created_at", (run_id,))
        return [_run_from_row(r) for r in rows]

    def get_logs(self, run_id: str) -> list[LogLine]:
        rows = self._read(f"SELECT {_LOG_COLUMNS} FROM logs WHERE run_id = ? ORDER BY id", (run_id,))
        return [_log_from_row(r) for r in rows]

    def logs_after(self, run_id: str, after_id: int, limit: int, *, kinds: Sequence[str] = ()) -> list[LogLine]:
        # By the (run_id, id) index: a follower polling a long run reads only what is new.
        # Lines written before kinds existed have none: they are the play's own (`log`).
        of_kinds = f" AND coalesce(kind, 'log') IN ({', '.join('?' * len(kinds))})" if kinds else ""
        rows = self._read(
            f"SELECT {_LOG_COLUMNS} FROM logs WHERE run_id = ? AND id > ?{of_kinds} ORDER BY id LIMIT {int(limit)}",
            (run_id, after_id, *kinds),
        )
        return [_log_from_row(r) for r in rows]

    # --- stopping a run -----------------------------------------------------------------

    def run_status(self, run_id: str) -> str | None:
        rows = self._read("SELECT status FROM runs WHERE run_id = ?", (run_id,))
        return str(rows[0][0]) if rows else None

    def ask_stop(self, run_id: str, reason: str, *, attempt: int) -> bool:
        with self._write() as c:
            cur = c.execute(
                "UPDATE runs SET stop_reason = ?, updated_at = ? WHERE run_id = ? AND attempt = ?"
                " AND status = 'running'",
                (reason, time.time(), run_id, attempt),
            )
            return bool(cur.rowcount == 1)

    def stop_requested(self, run_id: str, attempt: int) -> str | None:
        rows = self._read("SELECT stop_reason FROM runs WHERE run_id = ? AND attempt = ?", (run_id, attempt))
        return str(rows[0][0]) if rows and rows[0][0] is not None else None

    def interrupt_run(
        self,
        run_id: str,
        reason: str,
        *,
        attempt: int,
        status: str,
        error: dict[str, Any],
        now: float,
        expect_expires: float | None = None,
    ) -> bool:
        fence = " AND coalesce(lease_expires_at, 0) = ?" if expect_expires is not None else ""
        with self._write() as c:
            cur = c.execute(
                "UPDATE runs SET status = 'interrupted', stop_reason = ?, error = ?, holder = NULL,"
                " lease_expires_at = 0, wake_at = NULL, updated_at = ?"
                f" WHERE run_id = ? AND attempt = ? AND status = ?{fence}",
                (reason, _json.dumps_str(error), time.time(), run_id, attempt, status)
                + ((expect_expires,) if expect_expires is not None else ()),
            )
            if cur.rowcount != 1:
                return False
            # A holder that died left its attempt open: it ends here (a waiting one had ended).
            c.execute(
                "UPDATE attempts SET ended_at = ?, status = 'interrupted' WHERE run_id = ? AND attempt = ?"
                " AND ended_at IS NULL",
                (now, run_id, attempt),
            )
            return True

    def _settle_all(self, c: Any, settlements: Sequence[Settlement], now: float) -> list[bool]:
        """Apply each settlement if its lease is still current (one statement each)."""
        return [bool(c.execute(*settle_statement(s, now)).rowcount == 1) for s in settlements]

    def _settle(self, c: Any, settlements: Sequence[Settlement], now: float) -> list[bool]:
        """Settle in key order (rows lock in one order, so two processes rarely deadlock),
        and add the executions that ended to the calls ledger."""
        order = sorted(range(len(settlements)), key=lambda i: settlements[i].key)
        results = self._settle_all(c, [settlements[i] for i in order], now)
        done = dict(zip(order, results, strict=True))
        fresh = [done[i] for i in range(len(settlements))]
        settled = fresh
        if not all(fresh):
            before = self._settled_before(c, [s for s, ok in zip(settlements, fresh, strict=True) if not ok])
            settled = [ok or s.key in before for s, ok in zip(settlements, fresh, strict=True)]
        ledger = [
            (
                st.call.run_id,
                st.call.attempt,
                st.key,
                st.call.kind,
                st.call.tool,
                st.status,
                st.credits,
                st.call.started_at,
                now,
                st.call.retries,
                st.failure_kind,
                st.call.map,
                st.call.row_key,
                round(st.call.waited_s, 6),
            )
            for st, applied in zip(settlements, fresh, strict=True)  # applied now, not by an earlier try
            if applied and st.call is not None and st.status in ("completed", "failed")
        ]
        self._many(
            c,
            "INSERT INTO calls (run_id, attempt, key, kind, tool, status, credits, started_at, ended_at, retries,"
            " category, map, row_key, waited_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            ledger,
        )
        replaced = [
            (r.key, r.generation, r.run_id, r.attempt, r.idempotency_key, _json_or_none(r.output), r.credits,
             r.completed_at, now)
            for st, applied in zip(settlements, fresh, strict=True)
            if applied and (r := st.replaces) is not None and st.status in ("completed", "failed")
        ]  # fmt: skip
        self._many(c, _KEEP_HISTORY, replaced)
        costs: dict[str, list[float]] = {}
        for st, applied in zip(settlements, fresh, strict=True):
            if applied and st.reported and st.status == "completed" and st.call is not None and st.call.tool:
                costs.setdefault(st.call.tool, []).append(st.credits)
        self._many(
            c,
            "INSERT INTO tool_costs (tool, answers, credits, max_credits) VALUES (?, ?, ?, ?) ON CONFLICT (tool)"
            " DO UPDATE SET answers = tool_costs.answers + excluded.answers, credits = tool_costs.credits"
            " + excluded.credits, max_credits = CASE WHEN excluded.max_credits > tool_costs.max_credits"
            " THEN excluded.max_credits ELSE tool_costs.max_credits END",
            [(tool, len(paid), sum(paid), max(paid)) for tool, paid in sorted(costs.items())],
        )
        return settled

    def _settled_before(self, c: Any, settlements: Sequence[Settlement]) -> set[str]:
        """Keys these very settlements already ended (a transaction run again after its
        connection dropped, though it had committed): applied, not taken over."""
        keys = [s.key for s in settlements]
        marks = ", ".join("?" * len(keys))
        rows = c.execute(f"SELECT key, lease_id, status FROM receipts WHERE key IN ({marks})", keys).fetchall()
        found = {key: (lease, status) for key, lease, status in rows}
        # A skip of a receipt with an earlier paid answer ends it `completed` again.
        return {s.key for s in settlements if found.get(s.key) in ((s.lease_id, s.status), (s.lease_id, "completed"))}

    # --- claims ---------------------------------------------------------------------------

    def _claim(
        self, c: Any, claims: Sequence[Claim], now: float, superseded: set[tuple[str, int]]
    ) -> list[ClaimOutcome]:
        """Decide every claim against the stored receipt, under a row lock where the
        database has them; a key another process inserted meanwhile is decided again.
        A claim of a `superseded` attempt is refused (fencing)."""
        existing = self._load_for_update(c, [cl.key for cl in claims])
        outcomes: dict[int, ClaimOutcome] = {}
        replaced: list[Receipt] = []
        pending = []
        for position, cl in enumerate(claims):
            if (cl.run_id, cl.attempt) in superseded:
                outcomes[position] = ClaimOutcome("superseded", _claimed(None, cl, now))
            else:
                pending.append((position, cl))
        while pending:
            inserts: list[tuple[int, Claim, Receipt]] = []
            for position, cl in pending:
                current = existing.get(cl.key)
                verdict = decide_claim(current, cl, now)
                prior = (current.status, current.run_id) if current is not None else (None, None)
                replacing = _replaced_answer(current, cl) if verdict == "claimed" else None
                if verdict == "claimed":
                    if current is not None and current.run_id != cl.run_id:
                        replaced.append(current)
                    claimed = _claimed(current, cl, now)
                    if current is None:
                        inserts.append((position, cl, claimed))
                    else:
                        c.execute(_CLAIM_UPDATE, claim_row(claimed))
                    existing[cl.key] = current = claimed
                assert current is not None
                outcomes[position] = ClaimOutcome(
                    verdict, current, prior_status=prior[0], prior_run_id=prior[1], replaces=replacing
                )
            lost = self._insert_claims(c, inserts, now)
            for _, cl, _ in lost:  # another process inserted it since we looked: decide again
                existing.pop(cl.key, None)
            existing.update(self._load_for_update(c, [cl.key for _, cl, _ in lost]))
            pending = [(position, cl) for position, cl, _ in lost]
        ordered = [outcomes[i] for i in range(len(claims))]
        self._point_members(c, claims, ordered)
        # Receipts a run owns are found by their owner column; only receipts it used but
        # another run owns (reuse, or one taken over from it) need a usage row.
        usage: list[tuple[str, str, float | None, str | None, str | None]] = [
            (cl.run_id, o.receipt.key, now, cl.map, cl.row_key)
            for cl, o in zip(claims, ordered, strict=True)
            if o.verdict in ("reused", "failed") and o.receipt.run_id != cl.run_id
        ]
        usage += [(before.run_id, before.key, None, None, None) for before in replaced if before.run_id]
        self._many(
            c,
            "INSERT INTO run_receipts (run_id, key, used_at, map, row_key) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING",
            usage,
        )
        return ordered

    def _superseded(self, c: Any, writes: Writes) -> set[tuple[str, int]]:
        """The (run, attempt) pairs writing here whose run has moved on to a later attempt:
        another process took the run over, so this attempt may write nothing more (fencing).
        Attempt 0 is a write made outside any attempt: never fenced."""
        writers: Iterable[Claim | SheetRow | MapRow | LogLine] = chain(
            writes.claims, writes.sheet_rows, writes.map_rows, writes.logs
        )
        return self._superseded_pairs(c, {(w.run_id, w.attempt) for w in writers if w.attempt})

    def _superseded_pairs(self, c: Any, attempts: set[tuple[str, int]]) -> set[tuple[str, int]]:
        if not attempts:
            return set()
        run_ids = sorted({run_id for run_id, _ in attempts})
        marks = ", ".join("?" * len(run_ids))
        current = dict(c.execute(f"SELECT run_id, attempt FROM runs WHERE run_id IN ({marks})", run_ids).fetchall())
        return {(run_id, attempt) for run_id, attempt in attempts if current.get(run_id, attempt) > attempt}

    def _point_members(self, c: Any, claims: Sequence[Claim], outcomes: Sequence[ClaimOutcome]) -> None:
        """A batch about to be sent: each member receipt records the aggregate it goes in."""
        pointers = [
            (cl.key, member, lease_id)
            for cl, o in zip(claims, outcomes, strict=True)
            if cl.members and o.verdict == "claimed"
            for member, lease_id in cl.members
        ]
        self._many(
            c,
            "UPDATE receipts SET batch_key = ? WHERE key = ? AND lease_id = ? AND status = 'running'",
            pointers,
        )

    def _insert_claims(
        self, c: Any, inserts: list[tuple[int, Claim, Receipt]], now: float
    ) -> list[tuple[int, Claim, Receipt]]:
        """Insert new receipts; return the ones that lost a race to another process."""
        lost: list[tuple[int, Claim, Receipt]] = []
        inserts = sorted(inserts, key=lambda item: item[1].key)
        step = 200  # rows per INSERT: 13 parameters each stays under every backend's limit
        for start in range(0, len(inserts), step):
            chunk = inserts[start : start + step]
            rows = ", ".join([CLAIM_ROW] * len(chunk))
            params = [v for _, _, claimed in chunk for v in claim_row(claimed)]
            sql = (
                f"INSERT INTO receipts ({CLAIM_INSERT_COLUMNS}) VALUES {rows}"
                " ON CONFLICT (key) DO NOTHING RETURNING key"
            )
            inserted = {r[0] for r in c.execute(sql, params).fetchall()}
            lost += [item for item in chunk if item[1].key not in inserted]
        return lost

    def _load_for_update(self, c: Any, keys: Sequence[str]) -> dict[str, Receipt]:
        found: dict[str, Receipt] = {}
        for chunk in _chunks(list(dict.fromkeys(keys))):
            marks = ", ".join("?" * len(chunk))
            sql = f"SELECT {_RECEIPT_COLUMNS} FROM receipts WHERE key IN ({marks}) ORDER BY key{self.row_lock}"
            for row in c.execute(sql, chunk).fetchall():
                found[row[0]] = _receipt_from_row(row)
        return found


# --- receipts: the write path ------------------------------------------------------------


_SETTLE_RELEASE = (
    "UPDATE receipts SET status = 'released', lease_expires_at = NULL WHERE key = ? AND lease_id = ?"
    " AND status = 'running'"
)
# Never called: a receipt that still holds an earlier paid result (a forced or stale
# refresh given back before the call) is completed again with it, not emptied.
_SETTLE_SKIP = (
    "UPDATE receipts SET status = CASE WHEN output IS NOT NULL THEN 'completed' ELSE 'skipped' END,"
    " lease_expires_at = NULL WHERE key = ? AND lease_id = ? AND status = 'running'"
)
_SETTLE_END = (
    "UPDATE receipts SET status = ?, output = ?, error = ?, failure_kind = ?, retryable = ?, credits = ?,"
    " completed_at = ?, generation = generation + ?, lease_expires_at = NULL"
    " WHERE key = ? AND lease_id = ? AND status = 'running'"
)
_KEEP_HISTORY = (
    "INSERT INTO receipt_history (key, generation, run_id, attempt, idempotency_key, output, credits,"
    " completed_at, replaced_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)


def settle_statement(s: Settlement, now: float) -> tuple[str, tuple[Any, ...]]:
    """The UPDATE that ends (or gives back) a claim — only while its lease is current."""
    if s.status == "released":
        return _SETTLE_RELEASE, (s.key, s.lease_id)
    if s.status == "skipped":
        return _SETTLE_SKIP, (s.key, s.lease_id)
    output = _json_or_none(s.output) if s.status == "completed" else None
    values = (s.status, output, _json_or_none(s.error), s.failure_kind, int(s.retryable), s.credits, now)
    return _SETTLE_END, (*values, 1 if s.replaces is not None else 0, s.key, s.lease_id)


# --- row mapping ------------------------------------------------------------------------


def _position(order: list[str]) -> Any:
    return lambda name: order.index(name) if name in order else len(order)


def _map_row_values(r: MapRow) -> tuple[Any, ...]:
    steps = _json_or_none(r.steps) if r.steps else None
    found = _json_or_none(r.found) if r.found else None
    attempt = None if r.kept else r.attempt or None  # a kept row stays the earlier attempt's
    return (r.run_id, r.map, r.idx, r.input_index, r.row_key, r.outcome, r.error, steps, attempt,
            int(r.reused_row), r.reused_cells, found)  # fmt: skip


def _map_from_row(r: Sequence[Any]) -> MapRecord:
    return MapRecord(
        run_id=r[0], map=r[1], sheet=r[2], input_columns=_json.loads(r[3]) or [], columns=_json.loads(r[4]) or [],
        status=r[5], total=r[6], succeeded=r[7], failed=r[8], duplicate=r[9], reused=r[10], started_at=r[11],
        finished_at=r[12], pilot=_json.loads(r[13]), steps=_json.loads(r[14]) or {}, description=r[15] or "",
    )  # fmt: skip


def _log_from_row(r: Sequence[Any]) -> LogLine:
    run_id, attempt, ts, level, message, key, kind, fields, id = r
    return LogLine(run_id, attempt, ts, level, message, key, kind or "log", _json.loads(fields), int(id))


def _boundary_from_row(row: Sequence[Any]) -> Boundary:
    values = list(row)
    values[7] = _json.loads(values[7])
    return Boundary(*values)


def _run_fields() -> list[str]:
    return [name.strip() for name in _RUN_COLUMNS.split(",")]


def _encode_run_field(name: str, value: Any) -> Any:
    if name in _RUN_JSON:
        return _json_or_none(value)
    if name == "scheduled":
        return int(bool(value))
    return value


def _json_or_none(value: Any) -> str | None:
    return None if value is None else _json.dumps_str(value)


def _run_from_row(row: Sequence[Any]) -> RunRecord:
    values = {
        name: (_json.loads(value) if name in _RUN_JSON else value)
        for name, value in zip(_run_fields(), row, strict=True)
    }
    values["options"] = values["options"] or {}
    values["stats"] = values["stats"] or {}
    values["ancestors"] = values["ancestors"] or []
    values["scheduled"] = bool(values["scheduled"])
    values["description"] = values["description"] or ""
    return RunRecord(**values)


def _receipt_from_row(row: Sequence[Any]) -> Receipt:
    (
        key,
        kind,
        label,
        tool,
        status,
        run_id,
        attempt,
        lease_id,
        lease_expires_at,
        idem,
        output,
        error,
        failure_kind,
        retryable,
        credits,
        created_at,
        completed_at,
        batch_key,
        request,
        generation,
        description,
        input,
    ) = row
    return Receipt(
        key=key,
        kind=kind,
        label=label or "",
        tool=tool,
        status=status,
        run_id=run_id,
        attempt=attempt,
        lease_id=lease_id,
        lease_expires_at=lease_expires_at,
        idempotency_key=idem,
        output=_json.loads(output),
        error=_json.loads(error),
        failure_kind=failure_kind,
        retryable=bool(retryable),
        credits=credits or 0.0,
        created_at=created_at,
        completed_at=completed_at,
        batch_key=batch_key,
        request=_json.loads(request),
        generation=generation or 1,
        description=description,
        input=_json.loads(input),
    )


CLAIM_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running', 0, 0)"
CLAIM_INSERT_COLUMNS = (
    "kind, label, tool, run_id, attempt, lease_id, lease_expires_at, idempotency_key, created_at, batch_key,"
    " request, description, input, key, status, retryable, credits"
)
_CLAIM_UPDATE = (
    "UPDATE receipts SET kind = ?, label = ?, tool = ?, run_id = ?, attempt = ?, lease_id = ?,"
    " lease_expires_at = ?, idempotency_key = ?, created_at = ?, batch_key = ?, request = ?, description = ?,"
    " input = ?, status = 'running', error = NULL, failure_kind = NULL, retryable = 0 WHERE key = ?"
)


def claim_row(r: Receipt) -> tuple[Any, ...]:
    """A claimed receipt's values, in the order of CLAIM_INSERT_COLUMNS and _CLAIM_UPDATE."""
    return (
        r.kind,
        r.label,
        r.tool,
        r.run_id,
        r.attempt,
        r.lease_id,
        r.lease_expires_at,
        r.idempotency_key,
        r.created_at,
        r.batch_key,
        _json_or_none(r.request),
        r.description,
        _json_or_none(r.input),
        r.key,
    )


def _claimed(current: Receipt | None, cl: Claim, now: float) -> Receipt:
    """The receipt `cl` owns now. A call taken over from an owner that may have sent it
    keeps its batch (and its idempotency key, see claim_idempotency_key)."""
    resumed = current is not None and current.status in ("running", "released")
    request = cl.request if cl.request is not None else current.request if resumed and current else None
    return Receipt(
        key=cl.key,
        kind=cl.kind,
        label=cl.label,
        tool=cl.tool,
        status="running",
        run_id=cl.run_id,
        attempt=cl.attempt,
        lease_id=cl.lease_id,
        lease_expires_at=cl.lease_expires_at,
        idempotency_key=claim_idempotency_key(current, cl),
        created_at=current.created_at if current else now,
        batch_key=current.batch_key if resumed and current else None,
        request=request,
        generation=current.generation if current else 1,
        description=cl.description,
        input=cl.input if cl.input is not None else current.input if current else None,
    )


def _replaced_answer(current: Receipt | None, cl: Claim) -> Receipt | None:
    """The earlier answer a winning claim may replace: a receipt holding output that is not
    this very claim (applied before its connection dropped)."""
    if current is None or current.output is None or current.lease_id == cl.lease_id:
        return None
    return current


def _where(filters: dict[str, Any]) -> tuple[str, list[Any]]:
    present = {k: v for k, v in filters.items() if v is not None}
    if not present:
        return "", []
    return " WHERE " + " AND ".join(f"{k} = ?" for k in present), list(present.values())


def _chunks(items: Sequence[str]) -> Iterator[list[str]]:
    for i in range(0, len(items), _CHUNK):
        yield list(items[i : i + _CHUNK])
