"""Suspension and logs in SQL: boundaries, events, the journal of durable ids, log lines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deepline_cli import _json
from deepline_cli.store.records import Boundary, LogLine
from deepline_cli.store.sql_base import SqlBase
from deepline_cli.store.sql_rows import BOUNDARY_COLUMNS, LOG_COLUMNS, boundary_from_row, json_or_none, log_from_row


class SuspensionSql(SqlBase):
    """Suspension and logs in SQL: boundaries, events, the journal of durable ids, log lines."""

    def get_boundary(self, run_id: str, id: str) -> Boundary | None:
        rows = self._read(f"SELECT {BOUNDARY_COLUMNS} FROM boundaries WHERE run_id = ? AND id = ?", (run_id, id))
        return boundary_from_row(rows[0]) if rows else None

    def put_boundary(self, boundary: Boundary) -> Boundary:
        b = boundary
        with self._write() as c:
            c.execute(
                f"INSERT INTO boundaries ({BOUNDARY_COLUMNS}) VALUES ({', '.join('?' * 10)})"
                " ON CONFLICT (run_id, id) DO NOTHING",
                (
                    b.run_id,
                    b.id,
                    b.kind,
                    b.status,
                    b.due_at,
                    b.event_id,
                    b.child_run_id,
                    json_or_none(b.payload),
                    b.created_at,
                    b.resolved_at,
                ),
            )
            row = c.execute(
                f"SELECT {BOUNDARY_COLUMNS} FROM boundaries WHERE run_id = ? AND id = ?", (b.run_id, b.id)
            ).fetchone()
        return boundary_from_row(row)

    def resolve_boundary(self, run_id: str, id: str, payload: Any, now: float, status: str = "resolved") -> None:
        """Got past: `resolved` (with what it waited for) or `timed_out` (an event that did not come)."""
        with self._write() as c:
            c.execute(
                "UPDATE boundaries SET status = ?, payload = ?, resolved_at = ?"
                " WHERE run_id = ? AND id = ? AND status = 'waiting'",
                (status, json_or_none(payload), now, run_id, id),
            )

    def boundaries(self, run_id: str) -> list[Boundary]:
        rows = self._read(
            f"SELECT {BOUNDARY_COLUMNS} FROM boundaries WHERE run_id = ? ORDER BY created_at, id", (run_id,)
        )
        return [boundary_from_row(r) for r in rows]

    def send_event(self, run_id: str, event_id: str, payload: Any, now: float) -> bool:
        with self._write() as c:
            cur = c.execute(
                "INSERT INTO events (run_id, event_id, payload, created_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (run_id, event_id) DO NOTHING",
                (run_id, event_id, json_or_none(payload), now),
            )
            return bool(cur.rowcount == 1)

    def get_event(self, run_id: str, event_id: str, by: float | None = None) -> tuple[bool, Any]:
        sql = "SELECT payload FROM events WHERE run_id = ? AND event_id = ?"
        params: list[Any] = [run_id, event_id]
        if by is not None:
            sql, params = sql + " AND created_at <= ?", [*params, by]
        rows = self._read(sql, params)
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

    def get_logs(self, run_id: str) -> list[LogLine]:
        rows = self._read(f"SELECT {LOG_COLUMNS} FROM logs WHERE run_id = ? ORDER BY id", (run_id,))
        return [log_from_row(r) for r in rows]

    def logs_after(self, run_id: str, after_id: int, limit: int, *, kinds: Sequence[str] = ()) -> list[LogLine]:
        # By the (run_id, id) index: a follower polling a long run reads only what is new.
        # Lines written before kinds existed have none: they are the play's own (`log`).
        of_kinds = f" AND coalesce(kind, 'log') IN ({', '.join('?' * len(kinds))})" if kinds else ""
        rows = self._read(
            f"SELECT {LOG_COLUMNS} FROM logs WHERE run_id = ? AND id > ?{of_kinds} ORDER BY id LIMIT {int(limit)}",
            (run_id, after_id, *kinds),
        )
        return [log_from_row(r) for r in rows]
