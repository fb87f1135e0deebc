"""The SQL both stores share: every table, query and write, in one dialect.

SQLite (3.35+) and PostgreSQL both speak `INSERT … ON CONFLICT` and `RETURNING`, so the
statements are written once with `?` placeholders. A backend supplies the connection,
how a write transaction starts, the placeholder style, and whether rows can be locked
(`FOR UPDATE`, PostgreSQL) or the whole database is (`BEGIN IMMEDIATE`, SQLite).
"""

from __future__ import annotations

from deepline_cli.store.ledger import LedgerQueries
from deepline_cli.store.roles import LedgerStore, QueueStore, ReceiptStore, RunStore, SheetStore, SuspensionStore
from deepline_cli.store.sql_queue import QueueSql
from deepline_cli.store.sql_receipts import ReceiptsSql
from deepline_cli.store.sql_rows import CLAIM_INSERT_COLUMNS, CLAIM_ROW, claim_row, settle_statement
from deepline_cli.store.sql_runs import RunsSql
from deepline_cli.store.sql_suspension import SuspensionSql


class SqlStore(RunsSql, QueueSql, ReceiptsSql, SuspensionSql, LedgerQueries):
    """Everything a store does, over a DB-API connection, one SQL role per mixin (runs, the
    queue, receipts with their claims and settlements, sheets, suspension, the ledger); see
    SQLiteStore and PostgresStore for the connections. Each role is this object, typed as
    that role's protocol."""

    @property
    def runs(self) -> RunStore:
        return self

    @property
    def queue(self) -> QueueStore:
        return self

    @property
    def receipts(self) -> ReceiptStore:
        return self

    @property
    def sheets(self) -> SheetStore:
        return self

    @property
    def suspension(self) -> SuspensionStore:
        return self

    @property
    def ledger(self) -> LedgerStore:
        return self


__all__ = ["CLAIM_INSERT_COLUMNS", "CLAIM_ROW", "SqlStore", "claim_row", "settle_statement"]
