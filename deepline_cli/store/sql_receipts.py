"""Receipts in SQL: reading them, their leases' heartbeats, rate slots and credits."""

from __future__ import annotations

import time
from collections.abc import Generator, Iterable, Sequence
from itertools import chain
from operator import attrgetter
from typing import Any, TypeVar

from deepline_cli import _json
from deepline_cli._format import round_credits
from deepline_cli.backoff import delays
from deepline_cli.errors import StoreConflict
from deepline_cli.store.records import (
    Applied,
    Claim,
    LogLine,
    MapRow,
    Receipt,
    ReceiptGeneration,
    ReceiptQuery,
    SheetRow,
    Writes,
)
from deepline_cli.store.sql_claims import ClaimsSql
from deepline_cli.store.sql_rows import (
    CONFLICT_RETRIES,
    RECEIPT_COLUMNS,
    TREE,
    chunks,
    json_or_none,
    receipt_from_row,
)
from deepline_cli.store.sql_sheets import SheetsSql


class ReceiptsSql(ClaimsSql, SheetsSql):
    """Receipts in SQL: reading them, their leases' heartbeats, rate slots and credits."""

    def apply(self, writes: Writes, now: float) -> Applied:
        # A transaction the database aborted to break a deadlock with another process rolled
        # back whole (nothing of it is kept), so running it again is safe. The waits are
        # jittered: two processes that deadlocked once, retrying in step, would again.
        for wait in (*delays(0.005, cap=0.5, tries=CONFLICT_RETRIES - 1, jitter=True), None):
            try:
                return self._apply(writes, now)
            except StoreConflict:
                if wait is None:
                    raise
                time.sleep(wait)
        raise AssertionError("unreachable")

    def _apply(self, writes: Writes, now: float) -> Applied:
        with self._write() as c:
            # Fencing: an attempt whose run another process took over writes nothing more.
            # Its settlements are refused by their leases; its claims, rows and log lines here.
            stale = self._superseded(c, writes)
            known: dict[str, Receipt | None] = {}
            if self.row_lock:
                # Every receipt this transaction settles or claims, locked in one key order
                # before any is changed: settling some keys and then claiming others, each set
                # in its own order, let two processes' batches lock in opposite orders. The
                # claims are decided on what was read, but for keys this batch settles.
                settling = {s.key for s in writes.settlements}
                claiming = {cl.key for cl in writes.claims}
                locked = self._load_for_update(c, sorted(settling | claiming))
                known = {key: locked.get(key) for key in claiming - settling}
            settled = self._settle(c, writes.settlements, now)
            outcomes = self._claim(c, writes.claims, now, stale, known) if writes.claims else []
            sheet_rows = _current(writes.sheet_rows, stale)
            revs = self._write_sheet_rows(c, sheet_rows) if sheet_rows else None
            map_rows = _current(writes.map_rows, stale)
            if map_rows:
                self._write_map_rows(c, map_rows, revs)
            logs = _current(writes.logs, stale)
            if logs:
                self._insert(
                    c,
                    "INSERT INTO logs (run_id, attempt, ts, level, message, key, kind, fields)",
                    "(?, ?, ?, ?, ?, ?, ?, ?)",
                    " ON CONFLICT DO NOTHING",
                    [
                        (ln.run_id, ln.attempt, ln.ts, ln.level, ln.message, ln.key, ln.kind, json_or_none(ln.fields))
                        for ln in logs
                    ],
                )
        return Applied(settled, outcomes)

    def _superseded(self, c: Any, writes: Writes) -> set[tuple[str, int]]:
        """The (run, attempt) pairs writing here whose run has moved on to a later attempt:
        another process took the run over, so this attempt may write nothing more (fencing).
        Attempt 0 is a write made outside any attempt: never fenced."""
        writers: Iterable[Claim | SheetRow | MapRow | LogLine] = chain(
            writes.claims, writes.sheet_rows, writes.map_rows, writes.logs
        )
        pairs = set(map(_writer, writers))  # at C speed: a batch holds thousands of rows of one attempt
        return self._superseded_pairs(c, {pair for pair in pairs if pair[1]})

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

    def expire_run_receipts(self, run_id: str, before_attempt: int) -> int:
        # The attempts that held them are dead: their calls may have been sent (released).
        with self._write() as c:
            cur = c.execute(
                "UPDATE receipts SET status = 'released', lease_expires_at = NULL"
                " WHERE run_id = ? AND status = 'running' AND attempt < ?",
                (run_id, before_attempt),
            )
            return int(cur.rowcount)

    def get_receipt(self, key: str) -> Receipt | None:
        rows = self._read(f"SELECT {RECEIPT_COLUMNS} FROM receipts WHERE key = ?", (key,))
        return receipt_from_row(rows[0]) if rows else None

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

    def query_receipts(self, query: ReceiptQuery) -> list[Receipt]:
        return list(self.iter_receipts(query))

    def iter_receipts(self, query: ReceiptQuery, page: int = 2000) -> Generator[Receipt, None, None]:
        """The receipts `query` matches, oldest first, read whole `page` at a time (a run's
        hundreds of thousands of receipts are never all in memory at once). Nothing is held
        open between pages: a reader may take its time (a pager, a slow pipe)."""
        clauses: list[str] = []
        params: list[Any] = []
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
        # Their keys in order first (sorting whole receipts held them all in the database's
        # memory: ~90 bytes a receipt here, not thousands), then each page read whole by key.
        sql = f"SELECT receipts.key FROM receipts{where} ORDER BY receipts.created_at, receipts.key"
        if query.limit:
            sql += f" LIMIT {int(query.limit)}"
        ordered = [key for (key,) in self._read(sql, params)]
        for start in range(0, len(ordered), page):
            keys = ordered[start : start + page]
            whole: dict[str, tuple[Any, ...]] = {}
            for chunk in chunks(keys):
                among, params = self._in_texts("key", chunk)
                whole.update(
                    (r[0], r) for r in self._read(f"SELECT {RECEIPT_COLUMNS} FROM receipts WHERE {among}", params)
                )
            yield from (receipt_from_row(whole[key]) for key in keys if key in whole)

    def take_rate_slot(self, tool: str, interval_s: float, now: float, count: int = 1) -> float:
        with self._write() as c:
            c.execute("INSERT INTO rate_slots (tool, next_at) VALUES (?, ?) ON CONFLICT (tool) DO NOTHING", (tool, now))
            row = c.execute(
                "UPDATE rate_slots SET next_at = (CASE WHEN next_at > ? THEN next_at ELSE ? END) + ?"
                " WHERE tool = ? RETURNING next_at",
                (now, now, interval_s * count, tool),
            ).fetchone()
        return float(row[0]) - interval_s * count

    def tool_costs(self) -> dict[str, float]:
        return {tool: float(most) for tool, most in self._read("SELECT tool, max_credits FROM tool_costs")}

    def credits_spent(self, run_id: str) -> float:
        rows = self._read(
            f"SELECT coalesce(sum(credits), 0) FROM calls WHERE status = 'completed' AND run_id IN {TREE}",
            (run_id, run_id),
        )
        return round_credits(float(rows[0][0]))

    def run_usage(self, run_id: str) -> tuple[int, int]:
        calls = self._read(
            f"SELECT count(*) FROM calls WHERE kind = 'tool' AND run_id IN {TREE}",
            (run_id, run_id),
        )
        children = self._read("SELECT count(*) FROM runs WHERE root_run_id = ? AND run_id <> ?", (run_id, run_id))
        return int(calls[0][0]), int(children[0][0])


_writer = attrgetter("run_id", "attempt")
W = TypeVar("W", SheetRow, MapRow, LogLine)


def _current(written: list[W], stale: set[tuple[str, int]]) -> list[W]:
    """What was written by attempts still current (all of it, unless a run was taken over)."""
    return [w for w in written if (w.run_id, w.attempt) not in stale] if stale else written
