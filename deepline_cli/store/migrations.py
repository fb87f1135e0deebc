"""Named, append-only schema migrations, one list for SQLite and PostgreSQL.

Never edit or reorder a migration that has shipped: add a new one at the end. A store
that has applied a migration this version does not know was written by a newer
deepline, and opening it fails instead of guessing.

The DDL is written once. Where the two databases differ, a `{token}` stands in:

    {float}          REAL (SQLite) / DOUBLE PRECISION (PostgreSQL's REAL is 4 bytes)
    {serial}         an auto-numbered primary key
    {key}            the receipt key: PostgreSQL compares it bytewise (COLLATE "C")
    {without_rowid}  SQLite stores a table keyed by its primary key alone
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from deepline_cli.errors import StoreError


@dataclass(frozen=True)
class Dialect:
    name: str
    tokens: dict[str, str]

    def ddl(self, text: str) -> list[str]:
        """The statements of a migration, tokens filled in."""
        lines = [line for line in text.splitlines() if not line.strip().startswith("--")]
        filled = "\n".join(lines).format(**self.tokens)
        return [part.strip() for part in filled.split(";") if part.strip()]


SQLITE = Dialect(
    "sqlite",
    {"float": "REAL", "serial": "INTEGER PRIMARY KEY", "key": "TEXT", "without_rowid": " WITHOUT ROWID"},
)
POSTGRES = Dialect(
    "postgres",
    {"float": "DOUBLE PRECISION", "serial": "BIGSERIAL PRIMARY KEY", "key": 'TEXT COLLATE "C"', "without_rowid": ""},
)


class Cursor(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...


Step = Callable[[Cursor, Dialect], None]

_RUN_COLUMNS = """
-- What was kept in runs.options besides the run's flags gets columns of its own, and a
-- play's source (an enqueued run's snapshot) a table, shared by the runs that use it.
ALTER TABLE runs ADD COLUMN wake_at {float};
ALTER TABLE runs ADD COLUMN scheduled INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN ancestors TEXT;
ALTER TABLE runs ADD COLUMN description TEXT;
ALTER TABLE runs ADD COLUMN snapshot TEXT;
ALTER TABLE runs ADD COLUMN failure_seen_by INTEGER;
CREATE TABLE snapshots (digest TEXT PRIMARY KEY, snapshot TEXT NOT NULL, created_at {float});
-- How workers find work without scanning every run.
CREATE INDEX runs_wake ON runs (wake_at) WHERE status = 'waiting';
CREATE INDEX runs_lease ON runs (lease_expires_at) WHERE status = 'running';
CREATE INDEX runs_queued ON runs (created_at) WHERE status = 'queued'
"""
_MOVED = ("scheduled", "ancestors", "description", "snapshot", "failure_seen_by")


def _run_columns_snapshots(c: Cursor, dialect: Dialect) -> None:
    import hashlib

    for statement in dialect.ddl(_RUN_COLUMNS):
        c.execute(statement)
    for run_id, options, status in c.execute("SELECT run_id, options, status FROM runs").fetchall():
        flags = json.loads(options) if options else {}
        moved = {name: flags.pop(name) for name in _MOVED if name in flags}
        digest = None
        if moved.get("snapshot"):
            text = json.dumps(moved["snapshot"], sort_keys=True)
            digest = hashlib.sha256(text.encode()).hexdigest()[:32]
            c.execute(
                "INSERT INTO snapshots (digest, snapshot, created_at) VALUES (?, ?, ?) ON CONFLICT (digest) DO NOTHING",
                (digest, text, time.time()),
            )
        c.execute(
            "UPDATE runs SET options = ?, scheduled = ?, ancestors = ?, description = ?, snapshot = ?,"
            " failure_seen_by = ?, wake_at = ? WHERE run_id = ?",
            (
                json.dumps(flags),
                int(bool(moved.get("scheduled"))),
                json.dumps(moved.get("ancestors") or []),
                moved.get("description") or "",
                digest,
                moved.get("failure_seen_by"),
                0.0 if status == "waiting" else None,  # a worker looks at it once, and knows
                run_id,
            ),
        )


MIGRATIONS: list[tuple[str, str | Step]] = [
    (
        "0001_runs_receipts_logs",
        """
        CREATE TABLE runs (
            run_id TEXT PRIMARY KEY, play TEXT NOT NULL, play_ref TEXT, input TEXT, status TEXT NOT NULL,
            attempt INTEGER NOT NULL, workspace TEXT, cwd TEXT, options TEXT, parent_run_id TEXT,
            root_run_id TEXT, holder TEXT, lease_expires_at {float}, output TEXT, error TEXT, stats TEXT,
            created_at {float}, updated_at {float}, finished_at {float});
        CREATE INDEX runs_status ON runs (status);
        CREATE INDEX runs_root ON runs (root_run_id);
        CREATE TABLE receipts (
            key {key} PRIMARY KEY, kind TEXT NOT NULL, label TEXT, tool TEXT, status TEXT NOT NULL,
            run_id TEXT NOT NULL, attempt INTEGER NOT NULL, lease_id TEXT, lease_expires_at {float},
            idempotency_key TEXT, output TEXT, error TEXT, failure_kind TEXT, retryable INTEGER,
            credits {float}, created_at {float}, completed_at {float});
        -- run_id only: status changes on every settlement and would rewrite a wider index.
        CREATE INDEX receipts_run ON receipts (run_id);
        -- Which runs used which receipts (reused ones included): `receipts inspect --run`.
        CREATE TABLE run_receipts (run_id TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (run_id, key)){without_rowid};
        CREATE TABLE logs (id {serial}, run_id TEXT, attempt INTEGER, ts {float}, level TEXT, message TEXT);
        CREATE INDEX logs_run ON logs (run_id, id)
        """,
    ),
    (
        "0002_sheets_and_maps",
        """
        -- Sheets: one row per (sheet, row key), shared by every run of the play.
        CREATE TABLE sheet_rows (
            sheet TEXT NOT NULL, row_key TEXT NOT NULL, input TEXT, input_digest TEXT, cells TEXT,
            status TEXT, run_id TEXT, updated_at {float}, PRIMARY KEY (sheet, row_key));
        -- Which distinct rows a run's map finished, in input order: datasets, exports, barriers.
        CREATE TABLE map_rows (
            run_id TEXT NOT NULL, map TEXT NOT NULL, idx INTEGER NOT NULL, input_index INTEGER,
            row_key TEXT, outcome TEXT, error TEXT, PRIMARY KEY (run_id, map, idx)){without_rowid};
        CREATE TABLE maps (
            run_id TEXT NOT NULL, map TEXT NOT NULL, sheet TEXT, input_columns TEXT, columns TEXT,
            status TEXT, total INTEGER, succeeded INTEGER, failed INTEGER, duplicate INTEGER,
            reused INTEGER, started_at {float}, finished_at {float}, PRIMARY KEY (run_id, map))
        """,
    ),
    (
        "0003_boundaries_events_journal",
        """
        CREATE TABLE boundaries (
            run_id TEXT NOT NULL, id TEXT NOT NULL, kind TEXT NOT NULL, status TEXT NOT NULL,
            due_at {float}, event_id TEXT, child_run_id TEXT, payload TEXT, created_at {float},
            resolved_at {float}, PRIMARY KEY (run_id, id));
        CREATE TABLE events (
            run_id TEXT NOT NULL, event_id TEXT NOT NULL, payload TEXT, created_at {float},
            PRIMARY KEY (run_id, event_id));
        -- The order in which a run first reached its id-addressed durable calls (determinism guard).
        CREATE TABLE journal (
            run_id TEXT NOT NULL, position INTEGER NOT NULL, id TEXT NOT NULL,
            PRIMARY KEY (run_id, position)){without_rowid};
        CREATE INDEX runs_parent ON runs (parent_run_id)
        """,
    ),
    (
        "0004_rate_slots",
        # Per-tool pacing shared by every process on the store (rate limits across workers).
        "CREATE TABLE rate_slots (tool TEXT PRIMARY KEY, next_at {float} NOT NULL)",
    ),
    (
        "0005_batches_calls_attempts",
        """
        -- A batch member points at the aggregate receipt it was sent in; the aggregate keeps
        -- its members and inputs, so after a crash the same batch is sent again, same key.
        ALTER TABLE receipts ADD COLUMN batch_key TEXT;
        ALTER TABLE receipts ADD COLUMN request TEXT;
        -- Every execution a run paid for (or that failed), written with its settlement: what
        -- a run spent, across every attempt, killed ones included.
        CREATE TABLE calls (
            id {serial}, run_id TEXT NOT NULL, attempt INTEGER NOT NULL, key TEXT NOT NULL, kind TEXT,
            tool TEXT, status TEXT NOT NULL, credits {float}, started_at {float}, ended_at {float},
            retries INTEGER, category TEXT);
        CREATE INDEX calls_run ON calls (run_id, attempt);
        -- One row per attempt of a run: who ran it, from when to when (last heartbeat).
        CREATE TABLE attempts (
            run_id TEXT NOT NULL, attempt INTEGER NOT NULL, holder TEXT, started_at {float},
            seen_at {float}, ended_at {float}, status TEXT, PRIMARY KEY (run_id, attempt));
        ALTER TABLE run_receipts ADD COLUMN used_at {float}
        """,
    ),
    (
        "0006_sheet_revisions",
        """
        -- Each write of a sheet row is a new revision; a run's map rows name the revision
        -- they finished with, and a revision another run recomputed moves to the history,
        -- so a finished run's export stays what that run produced.
        ALTER TABLE sheet_rows ADD COLUMN rev INTEGER NOT NULL DEFAULT 1;
        ALTER TABLE map_rows ADD COLUMN rev INTEGER;
        CREATE TABLE sheet_history (
            sheet TEXT NOT NULL, row_key TEXT NOT NULL, rev INTEGER NOT NULL, input TEXT, cells TEXT,
            run_id TEXT, updated_at {float}, PRIMARY KEY (sheet, row_key, rev)){without_rowid}
        """,
    ),
    (
        "0007_log_keys",
        """
        -- A play body's log line is written once per run, however many resumes replay it.
        ALTER TABLE logs ADD COLUMN key TEXT;
        CREATE UNIQUE INDEX logs_key ON logs (run_id, key)
        """,
    ),
    (
        "0008_call_rows_map_pilot",
        """
        -- The map row a call was made for (NULL outside maps): per-row credits for the pilot
        -- projection, and hit rates per tool for `deepline plan`.
        ALTER TABLE calls ADD COLUMN map TEXT;
        ALTER TABLE calls ADD COLUMN row_key TEXT;
        -- A map cut short by a limit: what the rest of its input holds (rows, distinct keys,
        -- rows already paid), measured when the map finished, for the projection.
        ALTER TABLE maps ADD COLUMN pilot TEXT
        """,
    ),
    ("0009_run_columns_snapshots", _run_columns_snapshots),
    (
        "0010_generations_steps_stops",
        """
        -- A receipt whose answer is paid for again (a stale cell, a forced call) moves its
        -- earlier answer to the history: receipts hold the current generation.
        ALTER TABLE receipts ADD COLUMN generation INTEGER NOT NULL DEFAULT 1;
        ALTER TABLE receipts ADD COLUMN description TEXT;
        -- The call's input as it was claimed (secrets redacted; none when large): receipts inspect.
        ALTER TABLE receipts ADD COLUMN input TEXT;
        CREATE TABLE receipt_history (
            key {key} NOT NULL, generation INTEGER NOT NULL, run_id TEXT, attempt INTEGER,
            idempotency_key TEXT, output TEXT, credits {float}, completed_at {float},
            replaced_at {float}, PRIMARY KEY (key, generation)){without_rowid};
        -- A waterfall column: which of its steps found the value, per row ({"column": "step"}).
        ALTER TABLE map_rows ADD COLUMN steps TEXT;
        ALTER TABLE maps ADD COLUMN steps TEXT;
        ALTER TABLE maps ADD COLUMN description TEXT;
        -- Structured log lines: what kind of line, and its fields (`runs logs --kind --where`).
        ALTER TABLE logs ADD COLUMN kind TEXT;
        ALTER TABLE logs ADD COLUMN fields TEXT;
        -- `deepline runs stop`: asked through the store, heard by the run's owner.
        ALTER TABLE runs ADD COLUMN stop_reason TEXT;
        -- What answers of tools that say their own cost (remote tools) cost: a budget's
        -- expected cost of their next call, in any run on this store.
        CREATE TABLE tool_costs (
            tool TEXT PRIMARY KEY, answers INTEGER NOT NULL, credits {float} NOT NULL, max_credits {float} NOT NULL);
        -- How long a call waited before and between its requests (a concurrency slot, its
        -- rate limit, a 429 pause, Retry-After and backoff): the rest is the provider's time.
        ALTER TABLE calls ADD COLUMN waited_s {float};
        -- A map row: the attempt that finished it, whether it was taken whole from a sheet row
        -- an earlier run wrote, how many of its cells came from the sheet, and the answers
        -- the play found a value with (receipt key prefixes: a provider's hit rate).
        ALTER TABLE map_rows ADD COLUMN attempt INTEGER;
        ALTER TABLE map_rows ADD COLUMN reused_row INTEGER;
        ALTER TABLE map_rows ADD COLUMN reused_cells INTEGER;
        ALTER TABLE map_rows ADD COLUMN found TEXT;
        -- The map row a receipt of another run was used for (fallen back from, or final).
        ALTER TABLE run_receipts ADD COLUMN map TEXT;
        ALTER TABLE run_receipts ADD COLUMN row_key TEXT
        """,
    ),
    (
        "0011_map_rows_fell_back",
        """
        -- A failed map row: the failed calls of its cells that got a value all the same (a
        -- waterfall fell back from them), as receipt key prefixes: fallen back, not final.
        ALTER TABLE map_rows ADD COLUMN fell_back TEXT
        """,
    ),
    (
        "0012_maps_source",
        """
        -- The file a map read its rows from (a CSV): an export never writes over it.
        ALTER TABLE maps ADD COLUMN source TEXT
        """,
    ),
    (
        "0013_run_receipts_status",
        """
        -- How another run's receipt answered a run when it used it (completed or failed): a
        -- later run refreshing that receipt does not change what the earlier run got.
        ALTER TABLE run_receipts ADD COLUMN status TEXT
        """,
    ),
]


def migrate(c: Cursor, dialect: Dialect, where: str, *, has_table: bool | None = None) -> None:
    """Apply pending migrations (the caller holds one write transaction); refuse a newer
    schema. `has_table`: whether `_migrations` exists, where the caller knows (an up-to-date
    store then needs no right to create tables: a role that may only read and write)."""
    if not has_table:
        c.execute(
            f"CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at {dialect.tokens['float']})"
        )
    applied = {row[0] for row in c.execute("SELECT name FROM _migrations").fetchall()}
    unknown = sorted(applied - {name for name, _ in MIGRATIONS})
    if unknown:
        raise StoreError(
            f"The store {where} was written by a newer deepline (schema {unknown[-1]}); upgrade deepline to open it."
        )
    for name, step in MIGRATIONS:
        if name in applied:
            continue
        if callable(step):
            step(c, dialect)
        else:
            for statement in dialect.ddl(step):
                c.execute(statement)
        c.execute("INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", (name, time.time()))
