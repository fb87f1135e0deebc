"""Sheets and maps in SQL: sheet rows with their revisions, a run's map rows and map records."""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from deepline_cli import _json
from deepline_cli.store.records import (
    NOT_FOUND,
    DatasetRow,
    EarlierRow,
    MapRecord,
    MapRow,
    SheetRow,
    cells_of,
    stored_cells,
)
from deepline_cli.store.sql_base import SqlBase
from deepline_cli.store.sql_rows import DUPLICATES_SEEN, chunks, json_or_none, map_from_row, map_row_values, position


class SheetsSql(SqlBase):
    """Sheets and maps in SQL: sheet rows with their revisions, a run's map rows and map records."""

    def load_sheet_rows(self, sheet: str, row_keys: Sequence[str], *, with_input: bool = True) -> dict[str, SheetRow]:
        found: dict[str, SheetRow] = {}
        stored_input = "input" if with_input else "NULL"
        for chunk in chunks(row_keys):
            asked = {self._as_stored(key): key for key in chunk}  # found under the key asked by (a NUL in it)
            among, params = self._in_texts("row_key", chunk)
            rows = self._read(
                f"SELECT row_key, {stored_input}, input_digest, cells, status, run_id, updated_at, rev"
                f" FROM sheet_rows WHERE sheet = ? AND {among}",
                [sheet, *params],
            )
            for stored, inp, digest, cells, status, run_id, updated, rev in rows:
                key = asked.get(stored, stored)
                found[key] = SheetRow(
                    sheet, key, _json.loads(inp), digest, cells_of(_json.loads(cells)), status, run_id, updated, rev
                )
        return found

    def map_steps(self, run_id: str) -> dict[str, dict[str, dict[str, int]]]:
        rows = self._read(
            "SELECT map, steps, count(*) FROM map_rows WHERE run_id = ? AND steps IS NOT NULL GROUP BY map, steps",
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
                        hits[map_name][column] = {k: found[k] for k in sorted(found, key=position(order))}
        return hits

    def finished_map_rows(self, run_id: str, map: str) -> list[int]:
        rows = self._read("SELECT idx FROM map_rows WHERE run_id = ? AND map = ?", (run_id, map))
        return [r[0] for r in rows]

    def stored_key(self, row_key: str) -> str:
        return self._as_stored(row_key)

    def earlier_map_rows(self, run_id: str, map: str, after_idx: int, limit: int) -> list[EarlierRow]:
        rows = self._read(
            "SELECT idx, row_key, outcome, reused_row, reused_cells, steps, found, fell_back FROM map_rows"
            " WHERE run_id = ? AND map = ? AND idx > ? ORDER BY idx LIMIT ?",
            (run_id, map, after_idx, limit),
        )
        loads = _json.loads
        return [
            EarlierRow(idx, key, ok == "succeeded", bool(reused), cells or 0, loads(steps), loads(found), loads(fell))
            for idx, key, ok, reused, cells, steps, found, fell in rows
        ]

    def trim_map_rows(
        self, run_id: str, map: str, attempt: int, keep: int, keys: AbstractSet[str] | None = None
    ) -> int:
        with self._write() as c:
            if attempt and self._superseded_pairs(c, {(run_id, attempt)}):
                return 0  # fencing: the run was taken over; its new owner keeps the map's rows
            cur = c.execute("DELETE FROM map_rows WHERE run_id = ? AND map = ? AND idx >= ?", (run_id, map, keep))
            dropped = int(cur.rowcount)
            if keys is not None:
                rows = c.execute("SELECT idx, row_key FROM map_rows WHERE run_id = ? AND map = ?", (run_id, map))
                if any("\x00" in key for key in keys):  # compared as stored (PostgreSQL: no NUL)
                    keys = {self._as_stored(key) for key in keys}
                gone = [(run_id, map, idx) for idx, key in rows.fetchall() if key not in keys]
                self._many(c, "DELETE FROM map_rows WHERE run_id = ? AND map = ? AND idx = ?", gone)
                dropped += len(gone)
            return dropped

    def count_map_rows(self, run_id: str, map: str) -> dict[str, int]:
        rows = self._read(
            "SELECT outcome, count(*) FROM map_rows WHERE run_id = ? AND map = ? GROUP BY outcome",
            (run_id, map),
        )
        return {outcome: n for outcome, n in rows}

    def unfinished_counts(self, run_id: str, map: str) -> tuple[int, int]:
        rows = self._read(
            f"SELECT {DUPLICATES_SEEN}, coalesce(sum(reused_row), 0) FROM map_rows WHERE run_id = ? AND map = ?",
            (run_id, map),
        )
        duplicates, reused = rows[0] if rows else (0, 0)
        return max(0, int(duplicates or 0)), int(reused or 0)

    def failed_map_rows(self, run_id: str, map: str, limit: int, *, after_idx: int = -1) -> list[MapRow]:
        rows = self._read(
            "SELECT run_id, map, idx, input_index, row_key, outcome, error, '', rev, coalesce(attempt, 0) FROM map_rows"
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
            DatasetRow(idx, key, outcome, error, _json.loads(inp), cells_of(_json.loads(cells)))
            for idx, key, outcome, error, inp, cells in rows
        ]

    def save_map(self, record: MapRecord) -> None:
        with self._write() as c:
            if record.attempt and self._superseded_pairs(c, {(record.run_id, record.attempt)}):
                return  # fencing: the run was taken over; its new owner keeps the map's record
            c.execute(
                "INSERT INTO maps (run_id, map, sheet, input_columns, columns, status, total, succeeded,"
                " failed, duplicate, reused, started_at, finished_at, pilot, steps, description, source)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, map) DO UPDATE SET"
                " sheet = excluded.sheet, input_columns = excluded.input_columns, columns = excluded.columns,"
                " status = excluded.status, total = excluded.total, succeeded = excluded.succeeded,"
                " failed = excluded.failed, duplicate = excluded.duplicate, reused = excluded.reused,"
                " finished_at = excluded.finished_at, pilot = excluded.pilot, steps = excluded.steps,"
                " description = excluded.description, source = excluded.source",
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
                    json_or_none(record.pilot),
                    json_or_none(record.steps or None),
                    record.description or None,
                    record.source,
                ),
            )

    def get_maps(self, run_id: str) -> list[MapRecord]:
        rows = self._read(
            "SELECT run_id, map, sheet, input_columns, columns, status, total, succeeded, failed,"
            " duplicate, reused, started_at, finished_at, pilot, steps, description, source FROM maps WHERE run_id = ?"
            " ORDER BY started_at",
            (run_id,),
        )
        return [map_from_row(r) for r in rows]

    def _write_sheet_rows(self, c: Any, rows: Sequence[SheetRow]) -> dict[tuple[str, str], int] | None:
        """A new revision of each row; one another run finished with goes to the history.
        The revisions written, by (sheet, row key), where the backend returns them."""
        self._many(
            c,
            "INSERT INTO sheet_history (sheet, row_key, rev, input, cells, run_id, updated_at)"
            " SELECT sheet, row_key, rev, input, cells, run_id, updated_at FROM sheet_rows"
            " WHERE sheet = ? AND row_key = ? AND run_id <> ? ON CONFLICT DO NOTHING",
            [(r.sheet, r.row_key, r.run_id) for r in rows if r.replaces],
        )
        revs = self._insert_returning(
            c,
            "INSERT INTO sheet_rows (sheet, row_key, input, input_digest, cells, status, run_id, updated_at, rev)",
            "(?, ?, ?, ?, ?, ?, ?, ?, 1)",
            " ON CONFLICT (sheet, row_key) DO UPDATE SET"
            " input = excluded.input, input_digest = excluded.input_digest, cells = excluded.cells,"
            " status = excluded.status, run_id = excluded.run_id, updated_at = excluded.updated_at,"
            " rev = sheet_rows.rev + 1 RETURNING sheet, row_key, rev",
            [
                (
                    r.sheet,
                    r.row_key,
                    _json.dumps_str(r.input),
                    r.input_digest,
                    _json.dumps_str(stored_cells(r.cells)),
                    r.status,
                    r.run_id,
                    r.updated_at,
                )
                for r in rows
            ],
        )
        return {(sheet, row_key): rev for sheet, row_key, rev in revs} if revs is not None else None

    def _write_map_rows(self, c: Any, rows: Sequence[MapRow], revs: dict[tuple[str, str], int] | None = None) -> None:
        """`revs`: the revisions of the sheet rows this transaction wrote, where known."""
        # A row a resume did again at another place: its key leaves the place it had.
        self._many(
            c,
            "DELETE FROM map_rows WHERE run_id = ? AND map = ? AND idx = ? AND row_key = ?",
            [(r.run_id, r.map, r.moved_from, r.row_key) for r in rows if r.moved_from is not None],
        )
        upsert = (
            " ON CONFLICT (run_id, map, idx) DO UPDATE SET input_index = excluded.input_index,"
            " row_key = excluded.row_key, outcome = excluded.outcome, error = excluded.error, rev = excluded.rev,"
            " steps = excluded.steps, attempt = coalesce(excluded.attempt, map_rows.attempt),"
            " reused_row = excluded.reused_row, reused_cells = excluded.reused_cells, found = excluded.found,"
            " fell_back = excluded.fell_back"
        )
        columns = (
            "INSERT INTO map_rows (run_id, map, idx, input_index, row_key, outcome, error, steps, attempt,"
            " reused_row, reused_cells, found, fell_back, rev)"
        )
        revs = revs or {}
        # Written with their sheet row in this transaction: the revision it just got.
        known = [(r, r.rev if r.rev is not None else revs.get((r.sheet, r.row_key))) for r in rows]
        self._insert(
            c,
            columns,
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            upsert,
            [(*map_row_values(r), rev) for r, rev in known if rev is not None],
        )
        self._insert(
            c,
            columns,
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, (SELECT rev FROM sheet_rows WHERE sheet = ? AND row_key = ?))",
            upsert,
            [(*map_row_values(r), r.sheet, r.row_key) for r, rev in known if rev is None],
        )
