"""Runs in SQL: records, attempts, leases, stop requests; and the queue workers take runs from."""

from __future__ import annotations

import time
from typing import Any

from deepline_cli import _json
from deepline_cli.store.records import RunRecord
from deepline_cli.store.run_states import STARTS, from_clause
from deepline_cli.store.sql_base import SqlBase
from deepline_cli.store.sql_rows import RUN_COLUMNS, encode_run_field, run_fields, run_from_row, where_clause


class RunsSql(SqlBase):
    """Runs in SQL: records, attempts, leases, stop requests; and the queue workers take runs from."""

    def insert_run(self, run: RunRecord) -> bool:
        if run.status not in STARTS:
            raise ValueError(f"a run starts {' or '.join(sorted(STARTS))}, not {run.status!r}")
        values = [encode_run_field(name, getattr(run, name)) for name in run_fields()]
        marks = ", ".join("?" * len(values))
        with self._write() as c:
            cur = c.execute(
                f"INSERT INTO runs ({RUN_COLUMNS}) VALUES ({marks}) ON CONFLICT (run_id) DO NOTHING", values
            )
            return bool(cur.rowcount == 1)

    def get_run(self, run_id: str) -> RunRecord | None:
        rows = self._read(f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,))
        return run_from_row(rows[0]) if rows else None

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
                "UPDATE runs SET holder = ?, lease_expires_at = ?, attempt = ?, stop_reason = NULL, error = NULL,"
                f" finished_at = NULL, status = 'running', updated_at = ? WHERE run_id = ? AND attempt = ?{fence}"
                f" AND {from_clause('running')}",
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
            # An earlier attempt still unended died without a word (SIGKILL, a crash, a lost
            # machine): it ended when it was last heard of, its last heartbeat or call.
            c.execute(
                "UPDATE attempts SET status = 'killed', ended_at = coalesce((SELECT max(c.ended_at) FROM calls c"
                " WHERE c.run_id = attempts.run_id AND c.attempt = attempts.attempt AND c.ended_at > attempts.seen_at),"
                " seen_at) WHERE run_id = ? AND attempt < ? AND ended_at IS NULL",
                (run_id, attempt),
            )
            # One killed before it recorded itself (a worker killed between its claim and its
            # attempt): its number was taken; it is counted, killed as it began.
            rows = c.execute("SELECT attempt FROM attempts WHERE run_id = ?", (run_id,)).fetchall()
            known = {int(r[0]) for r in rows}
            for lost in sorted(set(range(1, attempt)) - known):
                c.execute(
                    "INSERT INTO attempts (run_id, attempt, started_at, seen_at, ended_at, status)"
                    " VALUES (?, ?, ?, ?, ?, 'killed')",
                    (run_id, lost, now, now, now),
                )
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
        if "status" in fields:
            raise ValueError("a run's status changes through set_status (the run state machine)")
        return self._update(run_id, "", only_attempt, fields)

    def set_status(self, run_id: str, status: str, *, only_attempt: int | None = None, **fields: Any) -> bool:
        return self._update(run_id, f" AND {from_clause(status)}", only_attempt, {"status": status, **fields})

    def _update(self, run_id: str, condition: str, only_attempt: int | None, fields: dict[str, Any]) -> bool:
        fields["updated_at"] = time.time()
        names = list(fields)
        assignments = ", ".join(f"{name} = ?" for name in names)
        values = [encode_run_field(name, fields[name]) for name in names]
        fence, params = ("", []) if only_attempt is None else (" AND attempt = ?", [only_attempt])
        with self._write() as c:
            cur = c.execute(
                f"UPDATE runs SET {assignments} WHERE run_id = ?{condition}{fence}", [*values, run_id, *params]
            )
            return bool(cur.rowcount == 1)

    def list_runs(
        self, *, status: str | None = None, play: str | None = None, limit: int | None = None
    ) -> list[RunRecord]:
        where, params = where_clause({"status": status, "play": play})
        sql = f"SELECT {RUN_COLUMNS} FROM runs{where} ORDER BY created_at DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [run_from_row(r) for r in self._read(sql, params)]

    def tick_run_ids(self, prefix: str, limit: int) -> list[str]:
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self._read(
            "SELECT run_id FROM runs WHERE run_id LIKE ? ESCAPE '\\' AND substr(run_id, ?, 1) BETWEEN '0' AND '9'"
            " LIMIT ?",
            (escaped + "%", len(prefix) + 1, limit),
        )
        return [r[0] for r in rows]

    def tree_runs(self, root_run_id: str) -> list[RunRecord]:
        rows = self._read(f"SELECT {RUN_COLUMNS} FROM runs WHERE root_run_id = ? ORDER BY created_at", (root_run_id,))
        return [run_from_row(r) for r in rows]

    def child_runs(self, run_id: str) -> list[RunRecord]:
        rows = self._read(f"SELECT {RUN_COLUMNS} FROM runs WHERE parent_run_id = ? ORDER BY created_at", (run_id,))
        return [run_from_row(r) for r in rows]

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

    def requeue(self, run_id: str, attempt: int) -> bool:
        with self._write() as c:
            cur = c.execute(
                "UPDATE runs SET status = 'queued', updated_at = ? WHERE run_id = ? AND attempt = ?"
                " AND status = 'interrupted' AND stop_reason IS NULL",
                (time.time(), run_id, attempt),
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
                f" WHERE run_id = ? AND attempt = ? AND status = ? AND {from_clause('interrupted')}{fence}",
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
