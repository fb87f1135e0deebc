"""The work queue in SQL: queued runs, due runs, wake-ups, play snapshots."""

from __future__ import annotations

import time
from typing import Any

from deepline_cli import _json
from deepline_cli.store.records import RunRecord
from deepline_cli.store.run_states import from_clause
from deepline_cli.store.sql_base import SqlBase
from deepline_cli.store.sql_rows import RUN_COLUMNS, run_from_row


class QueueSql(SqlBase):
    """The work queue in SQL: queued runs, due runs, wake-ups, play snapshots."""

    def claim_queued_run(self, *, holder: str, expires_at: float) -> RunRecord | None:
        with self._write() as c:
            row = c.execute(
                "SELECT run_id FROM runs WHERE status = 'queued' ORDER BY created_at LIMIT 1" + self.skip_locked
            ).fetchone()
            if row is None:
                return None
            c.execute(
                "UPDATE runs SET status = 'running', attempt = attempt + 1, holder = ?, lease_expires_at = ?,"
                " updated_at = ?, stop_reason = NULL, error = NULL, finished_at = NULL"
                " WHERE run_id = ? AND status = 'queued'"
                f" AND {from_clause('running')}",
                (holder, expires_at, time.time(), row[0]),
            )
            found = c.execute(f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?", (row[0],)).fetchone()
        record = run_from_row(found)
        return record if record.holder == holder else None

    def due_runs(self, limit: int, now: float, host: str = "") -> list[RunRecord]:
        # By index (runs_wake, runs_lease): thousands of runs sleeping for days cost
        # nothing. Running runs held on `host` are listed too, whatever their lease: the
        # worker asks the OS whether their holder still lives (a killed one is taken over
        # at once). Children run inside their parent's process are not a worker's to
        # continue; scheduled children (queued runs of their own) are.
        mine = "(parent_run_id IS NULL OR scheduled = 1)"
        rows = self._read(
            f"SELECT {RUN_COLUMNS} FROM runs WHERE status = 'waiting' AND wake_at <= ? AND {mine}"
            f" ORDER BY wake_at LIMIT {int(limit)}",
            (now,),
        )
        here = " OR holder LIKE ?" if host else ""
        rows += self._read(
            f"SELECT {RUN_COLUMNS} FROM runs WHERE status = 'running' AND (lease_expires_at < ?{here})"
            f" AND {mine} ORDER BY lease_expires_at LIMIT {int(limit)}",
            (now, f"{host}:%") if host else (now,),
        )
        return [run_from_row(r) for r in rows]

    def set_wake(self, run_id: str, wake_at: float | None, *, waiting_attempt: int | None = None) -> None:
        fence = "" if waiting_attempt is None else " AND status = 'waiting' AND attempt = ?"
        params = (wake_at, run_id) if waiting_attempt is None else (wake_at, run_id, waiting_attempt)
        with self._write() as c:
            c.execute(f"UPDATE runs SET wake_at = ? WHERE run_id = ?{fence}", params)

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

    def wait_for_notify(self, timeout_s: float) -> bool | None:
        return None
