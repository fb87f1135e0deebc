"""Named, append-only schema migrations for the SQLite store.

Never edit or reorder a migration that has shipped: add a new one at the end. A store
that has applied a migration this version does not know was written by a newer
deepline, and opening it fails instead of guessing.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

import sqlite_utils

from deepline_cli.errors import StoreError

Migration = Callable[[sqlite_utils.Database], None]


def _runs_receipts_logs(db: sqlite_utils.Database) -> None:
    db.table("runs").create(
        {
            "run_id": str,
            "play": str,
            "play_ref": str,
            "input": str,
            "status": str,
            "attempt": int,
            "workspace": str,
            "cwd": str,
            "options": str,
            "parent_run_id": str,
            "root_run_id": str,
            "holder": str,
            "lease_expires_at": float,
            "output": str,
            "error": str,
            "stats": str,
            "created_at": float,
            "updated_at": float,
            "finished_at": float,
        },
        pk="run_id",
        not_null={"play", "status", "attempt"},
    )
    db.table("runs").create_index(["status"])
    db.table("runs").create_index(["root_run_id"])
    db.table("receipts").create(
        {
            "key": str,
            "kind": str,
            "label": str,
            "tool": str,
            "status": str,
            "run_id": str,
            "attempt": int,
            "lease_id": str,
            "lease_expires_at": float,
            "idempotency_key": str,
            "output": str,
            "error": str,
            "failure_kind": str,
            "retryable": int,
            "credits": float,
            "created_at": float,
            "completed_at": float,
        },
        pk="key",
        not_null={"kind", "status", "run_id", "attempt"},
    )
    # run_id only: status changes on every settlement and would rewrite a wider index.
    db.table("receipts").create_index(["run_id"])
    # Which runs used which receipts (reused ones included): `receipts inspect --run`.
    db.execute(
        "CREATE TABLE run_receipts (run_id TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (run_id, key)) WITHOUT ROWID"
    )
    db.table("logs").create(
        {"id": int, "run_id": str, "attempt": int, "ts": float, "level": str, "message": str},
        pk="id",
    )
    db.table("logs").create_index(["run_id", "id"])


def _sheets_and_maps(db: sqlite_utils.Database) -> None:
    # Sheets: one row per (sheet, row key), shared by every run of the play.
    db.execute(
        "CREATE TABLE sheet_rows (sheet TEXT NOT NULL, row_key TEXT NOT NULL, input TEXT,"
        " input_digest TEXT, cells TEXT, status TEXT, run_id TEXT, updated_at REAL,"
        " PRIMARY KEY (sheet, row_key))"
    )
    # Which distinct rows a run's map finished, in input order: datasets, exports, barriers.
    db.execute(
        "CREATE TABLE map_rows (run_id TEXT NOT NULL, map TEXT NOT NULL, idx INTEGER NOT NULL,"
        " input_index INTEGER, row_key TEXT, outcome TEXT, error TEXT,"
        " PRIMARY KEY (run_id, map, idx)) WITHOUT ROWID"
    )
    db.execute(
        "CREATE TABLE maps (run_id TEXT NOT NULL, map TEXT NOT NULL, sheet TEXT,"
        " input_columns TEXT, columns TEXT, status TEXT, total INTEGER, succeeded INTEGER,"
        " failed INTEGER, duplicate INTEGER, reused INTEGER, started_at REAL, finished_at REAL,"
        " PRIMARY KEY (run_id, map))"
    )


def _boundaries_events_journal(db: sqlite_utils.Database) -> None:
    db.execute(
        "CREATE TABLE boundaries (run_id TEXT NOT NULL, id TEXT NOT NULL, kind TEXT NOT NULL,"
        " status TEXT NOT NULL, due_at REAL, event_id TEXT, child_run_id TEXT, payload TEXT,"
        " created_at REAL, resolved_at REAL, PRIMARY KEY (run_id, id))"
    )
    db.execute(
        "CREATE TABLE events (run_id TEXT NOT NULL, event_id TEXT NOT NULL, payload TEXT,"
        " created_at REAL, PRIMARY KEY (run_id, event_id))"
    )
    # The order in which a run first reached its id-addressed durable calls (determinism guard).
    db.execute(
        "CREATE TABLE journal (run_id TEXT NOT NULL, position INTEGER NOT NULL, id TEXT NOT NULL,"
        " PRIMARY KEY (run_id, position)) WITHOUT ROWID"
    )
    db.execute("CREATE INDEX runs_parent ON runs (parent_run_id)")


def _rate_slots(db: sqlite_utils.Database) -> None:
    # Per-tool pacing shared by every process on the store (rate limits across workers).
    db.execute("CREATE TABLE rate_slots (tool TEXT PRIMARY KEY, next_at REAL NOT NULL)")


MIGRATIONS: list[tuple[str, Migration]] = [
    ("0001_runs_receipts_logs", _runs_receipts_logs),
    ("0002_sheets_and_maps", _sheets_and_maps),
    ("0003_boundaries_events_journal", _boundaries_events_journal),
    ("0004_rate_slots", _rate_slots),
]


def migrate(conn: sqlite3.Connection, path: str) -> None:
    """Apply pending migrations in one write transaction; refuse a newer schema."""
    known = [name for name, _ in MIGRATIONS]
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at REAL)")
        applied = [r[0] for r in conn.execute("SELECT name FROM _migrations ORDER BY name")]
        unknown = sorted(set(applied) - set(known))
        if unknown:
            raise StoreError(
                f"The store {path} was written by a newer deepline (schema {unknown[-1]}); upgrade deepline to open it."
            )
        db = sqlite_utils.Database(conn)
        for name, apply in MIGRATIONS:
            if name not in applied:
                apply(db)
                conn.execute("INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", (name, time.time()))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
