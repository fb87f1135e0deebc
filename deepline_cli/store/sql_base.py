"""What every SQL role of the store stands on: a connection that a backend supplies, and
the fencing check every write shares."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any


class SqlBase:
    """The connection as the SQL roles use it; SQLiteStore and PostgresStore supply it."""

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

    def _as_stored(self, text: str) -> str:
        """A text as the database keeps it (PostgreSQL's cannot hold a NUL: `PostgresStore`)."""
        return text

    def _in_texts(self, column: str, values: Sequence[str]) -> tuple[str, list[Any]]:
        """`column IN (values)` for a text column, as SQL and its parameters: a mark per value
        here (SQLite), one array on PostgreSQL (`PostgresStore._in_texts`)."""
        return f"{column} IN ({', '.join('?' * len(values))})", list(values)

    def _insert(self, c: Any, head: str, row: str, tail: str, rows: Sequence[Sequence[Any]]) -> None:
        """`{head} VALUES {row}{tail}` for each of `rows`, applied in order. A statement per
        row here: with psycopg a long statement of many rows costs more than the rows it
        saves (it parses and converts every statement over 50 parameters anew); SQLite
        sends many rows in one statement."""
        self._many(c, f"{head} VALUES {row}{tail}", rows)

    def _insert_returning(
        self, c: Any, head: str, row: str, tail: str, rows: Sequence[Sequence[Any]]
    ) -> list[tuple[Any, ...]] | None:
        """`_insert` and the rows its `RETURNING` tail gives, where a backend gets them at no
        extra cost (SQLite); None where it does not (the caller reads what it needs)."""
        self._insert(c, head, row, tail.partition(" RETURNING ")[0], rows)
        return None

    def close(self) -> None:
        raise NotImplementedError

    def reconnect(self, hurry: bool = False) -> None:
        return None  # a file has no connection to lose (PostgresStore has)

    def abort(self) -> None:
        return None  # a statement on a file ends by itself (busy_timeout bounds its waits)

    def now(self) -> float:
        raise NotImplementedError

    def _superseded_pairs(self, c: Any, attempts: set[tuple[str, int]]) -> set[tuple[str, int]]:
        if not attempts:
            return set()
        run_ids = sorted({run_id for run_id, _ in attempts})
        marks = ", ".join("?" * len(run_ids))
        current = dict(c.execute(f"SELECT run_id, attempt FROM runs WHERE run_id IN ({marks})", run_ids).fetchall())
        return {(run_id, attempt) for run_id, attempt in attempts if current.get(run_id, attempt) > attempt}
