"""What every SQL role of the store stands on: a connection that a backend supplies, and
the fencing check every write shares."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

ROWS_PER_INSERT = 64  # rows in one INSERT: 17 parameters each at most, far below any limit


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

    def _insert(
        self,
        c: Any,
        head: str,
        row: str,
        tail: str,
        rows: Sequence[Sequence[Any]],
        key: Callable[[Sequence[Any]], Any] | None = None,
    ) -> None:
        """`{head} VALUES {row}{tail}` for each of `rows`, up to ROWS_PER_INSERT rows in one
        statement: the database runs them one after the other, as separate statements would,
        at a fraction of the cost. An upsert (`ON CONFLICT … DO UPDATE`) names its conflict
        `key`: PostgreSQL refuses to update one row twice in a statement, so a row whose key
        the statement holds already starts the next one."""
        start = 0
        while start < len(rows):
            end = min(len(rows), start + ROWS_PER_INSERT)
            if key is not None:
                seen: set[Any] = set()
                for at in range(start, end):
                    one = key(rows[at])
                    if one in seen:
                        end = at
                        break
                    seen.add(one)
            values = ", ".join([row] * (end - start))
            c.execute(f"{head} VALUES {values}{tail}", [v for r in rows[start:end] for v in r])
            start = end

    def close(self) -> None:
        raise NotImplementedError

    def reconnect(self) -> None:
        return None  # a file has no connection to lose (PostgresStore has)

    def now(self) -> float:
        raise NotImplementedError

    def _superseded_pairs(self, c: Any, attempts: set[tuple[str, int]]) -> set[tuple[str, int]]:
        if not attempts:
            return set()
        run_ids = sorted({run_id for run_id, _ in attempts})
        marks = ", ".join("?" * len(run_ids))
        current = dict(c.execute(f"SELECT run_id, attempt FROM runs WHERE run_id IN ({marks})", run_ids).fetchall())
        return {(run_id, attempt) for run_id, attempt in attempts if current.get(run_id, attempt) > attempt}
