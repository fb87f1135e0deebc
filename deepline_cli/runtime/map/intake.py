"""A map's input, row by row: read up to the limit, keyed, duplicates skipped, rows an
earlier attempt finished skipped, the rest handed on in chunks (one sheet read each).
Every field any row has becomes an input column (for the export)."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import functools
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator, Mapping
from itertools import chain
from pathlib import Path
from typing import Any, NamedTuple

from deepline_cli.errors import InputError, UsageError
from deepline_cli.runtime.map.book import MapBook
from deepline_cli.runtime.map.failures import PlayCodeError, where
from deepline_cli.runtime.map.row_context import PendingRow
from deepline_cli.runtime.map.rows import CsvSource, folded_name, input_columns, is_blank, key_fields, row_digest
from deepline_cli.store.records import SheetRow

NEAR_LOOKS = 100_000  # keys not folded already that `_near` keeps to compare with
CHUNK = 256  # rows looked up in the sheet per store read
Counts = tuple[int, int]  # rows read, duplicates


class Intake:
    def __init__(
        self,
        name: str,
        rows: Iterable[Mapping[str, Any]],
        key_of: Callable[[dict[str, Any]], str],
        limit: int | None,
        book: MapBook,
        column_names: list[str],
        warn: Callable[[str], None],
    ) -> None:
        self.name, self.rows, self.key_of, self.limit, self.book = name, rows, key_of, limit, book
        self.key_fields = key_fields(key_of)
        self.column_names = column_names
        self.warn = warn
        self.seen: set[str] = set()
        self.input_columns: dict[str, None] = {c: None for c in input_columns(rows)}
        self.csv = rows if isinstance(rows, CsvSource) else None
        self.clashes: set[tuple[str, str]] = set()  # column names told apart by case only, warned of
        self._folds: dict[str, str] = {}  # a key folded (case, spaces) → the first key not folded already
        self._near_said = False
        self._check_key()
        self.total_estimate = estimate_total(rows, limit)
        self.read_whole = False  # every input row read (it reads ahead of what is handed out)
        self.warn_of_case(self.input_columns)

    def _check_key(self) -> None:
        """A CSV's key fields are columns of its header: said before any row, not as its first
        row's fault (a key is matched as written; `required=` ignores case and spaces)."""
        if self.csv is None or not self.input_columns:
            return
        for name in self.key_fields:
            if name not in self.input_columns:
                near = [c for c in self.input_columns if folded_name(c) == folded_name(name)]
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise InputError(
                    f"Map {self.name!r}: its key field {name!r} is not a column of {self.csv.path.name} "
                    f"(its columns: {', '.join(self.input_columns)}){hint}"
                )

    def chunks(self) -> Iterator[list[PendingRow]]:
        """The rows still to do, CHUNK at a time; counts what it reads, skips and seeds."""
        for chunk, read in self._read():
            self._count(read)
            if chunk:
                yield chunk

    async def read_ahead(
        self, sheet_rows: Callable[[list[str]], Awaitable[dict[str, SheetRow]]]
    ) -> AsyncGenerator[list[PendingRow], None]:
        """The chunks, each row with the sheet row earlier runs left for its key (`previous`):
        the next chunk's are read while this one is handed out. A chunk's rows are counted
        (read, duplicate) when it is handed out, so a map stopped early reports only
        what it reached. Close it (`aclosing`)."""
        reads: list[asyncio.Future[dict[str, SheetRow]] | None] = []  # this chunk's and the next one's
        ahead: tuple[list[PendingRow], Counts] | None = None
        try:
            for turn in chain(self._read(), [None]):  # None: the last chunk's turn
                if turn is not None:
                    keys = [job.key for job in turn[0]]
                    reads.append(asyncio.ensure_future(sheet_rows(keys)) if keys else None)
                if ahead is not None:
                    chunk, read = ahead
                    reading = reads.pop(0)
                    previous = {} if reading is None else await reading
                    for job in chunk:
                        job.given(previous.get(job.key))
                    self._count(read)
                    if chunk:
                        yield chunk
                ahead = turn
        finally:
            for reading in reads:  # not handed out (stopped, failed): its answer or error is dropped
                if reading is not None:
                    reading.cancel()
                    reading.add_done_callback(_retrieved)

    def _read(self) -> Iterator[tuple[list[PendingRow], Counts]]:
        """The input, CHUNK rows to do at a time, each chunk with the rows read for it
        (duplicates and rows an earlier attempt finished, skipped); the last may hold no
        row to do. Row keys are known as they are read (duplicates), counts when applied."""
        chunk: list[PendingRow] = []
        distinct = read = duplicate = 0
        book, seen, csv, limit = self.book, self.seen, self.csv, self.limit
        columns = self.input_columns.keys()
        input_index = -1
        source = csv.isolating() if csv is not None else self.rows  # a misfit line fails its row alone
        for input_index, raw in enumerate(source):
            if limit is not None and distinct >= limit:
                break
            read += 1
            row = raw if type(raw) is dict and csv is not None else self._fields(raw, input_index)  # a CSV row is new
            blank = csv.blank(row) if csv is not None else None
            if not row.keys() <= columns:  # every field any row has is an input column (for export)
                new = [column for column in row if column not in self.input_columns]
                self.input_columns.update(dict.fromkeys(new))
                self.warn_of_case(new)
            if csv is not None and csv.doubts:
                for doubt in csv.doubts:
                    self.warn(doubt)
                csv.doubts.clear()
            key, placed = self._key(row, input_index, blank)
            if key in seen:
                duplicate += 1
                continue
            seen.add(key)
            if not (placed or self._near_said):
                self._near(key)
            idx = distinct
            distinct += 1
            book.input_index_of.append(input_index)
            seeded = book.is_seeded(idx, key, placed=placed)  # kept while its sheet row matches (MapRun)
            chunk.append(PendingRow(idx, input_index, key, row, self.digest(row, input_index), None, blank, seeded))
            if len(chunk) >= CHUNK:
                yield chunk, (read, duplicate)
                chunk, read, duplicate = [], 0, 0
        else:  # the whole input read: its rows are counted (a line count counted a quoted newline too)
            self.total_estimate = input_index + 1 if limit is None else distinct  # a limit counts distinct rows
            self.read_whole = True
        if chunk or read:
            yield chunk, (read, duplicate)

    def _fields(self, raw: Any, input_index: int) -> dict[str, Any]:
        """A row of a list as a dict of its fields (a copy: the map adds its columns to it)."""
        if isinstance(raw, Mapping):
            return dict(raw)
        if not isinstance(raw, str | bytes):
            with contextlib.suppress(TypeError, ValueError):
                return dict(raw)  # (name, value) pairs
        raise UsageError(
            f"Map {self.name!r}: row {input_index + 1} is a {type(raw).__name__}, not a dict of fields "
            f"(give rows like {{'domain': 'acme.com'}})."
        )

    def key(self, row: dict[str, Any], input_index: int, blank: str | None) -> str:
        """The row's key. A blank one is no identity: the row is keyed by where it is (each
        such row is a row of its own, and one with a blank required cell fails on its own),
        never a duplicate. A key function that raises stops the map, naming the row."""
        return self._key(row, input_index, blank)[0]

    def _key(self, row: dict[str, Any], input_index: int, blank: str | None) -> tuple[str, bool]:
        """The key, and whether it is the row's place (not an identity across attempts)."""
        try:
            key = self.key_of(row)
        except InputError as exc:
            raise self._row_refused(input_index, exc) from None
        except Exception as exc:
            raise self._key_failed(input_index, exc) from exc
        if not key.strip() or (blank is not None and self._no_key(row)):
            return (self.csv.where() if self.csv is not None else f"row {input_index + 1}"), True
        return key, False

    def _no_key(self, row: dict[str, Any]) -> bool:
        """Does this failing row hold no key: a field the key is made of is blank (`key=["name",
        "domain"]`), or its line did not fit the header (its key cell may hold another's: two
        `Acme, Inc,acme.com` lines are no duplicates of each other)?"""
        return (self.csv is not None and self.csv.misfit) or any(is_blank(row.get(name)) for name in self.key_fields)

    def digest(self, row: dict[str, Any], input_index: int) -> str:
        """The row's digest (`row_digest`); a row that is no JSON (NaN) named by its place."""
        try:
            return row_digest(row)
        except InputError as exc:
            raise self._row_refused(input_index, exc) from None

    def _row_refused(self, input_index: int, exc: InputError) -> InputError:
        """A row the map cannot take (no key field, NaN), named by its place."""
        place = self.csv.where() if self.csv is not None else f"input row {input_index + 1}"
        return InputError(f"Map {self.name!r} stopped at {place}: {exc}.")

    def _key_failed(self, input_index: int, exc: Exception) -> PlayCodeError:
        place = where(exc)
        return PlayCodeError(
            f"Map {self.name!r} stopped at input row {input_index + 1}: its key function raised "
            f"{type(exc).__name__}: {exc}" + (f" ({place})" if place else "") + "; nothing more was called"
        )

    def _count(self, counts: Counts) -> None:
        tally = self.book.tally
        read, duplicate = counts
        tally.read += read
        tally.duplicate += duplicate

    def _near(self, key: str) -> None:
        """Keys that differ only by surrounding spaces, or, for domains and emails (a `.` or
        an `@` in them), by case (`acme.com`, ` ACME.com`) are two rows, each paid for: said
        once. (Other keys may tell records apart by case: a CRM's record ids.) Keys are
        compared with those of the first NEAR_LOOKS not folded already, so memory stays small."""
        folded = key.strip()
        if "." in folded or "@" in folded:
            folded = folded.casefold()
        if folded != key:
            other = self._folds.get(folded) or (folded if folded in self.seen else None)
            if other is None:
                if len(self._folds) < NEAR_LOOKS:
                    self._folds[folded] = key
                return
        else:
            other = self._folds.get(key)
            if other is None:
                return
        self._near_said = True
        fields = self.key_fields
        how = (
            f'key=lambda row: row["{fields[0]}"].strip().lower()'
            if len(fields) == 1
            else "strip and lower-case its parts in a key function"
        )
        self.warn(
            f"Map {self.name!r}: the keys {other!r} and {key!r} differ only by case or spaces: two rows, each "
            f"computed (and paid for) on its own; to take them as one, normalise the key ({how})"
        )

    def warn_of_case(self, input_columns: Iterable[str]) -> None:
        """Columns whose names differ only in case (`Company` in the CSV, a `company` column):
        the export keeps both, but spreadsheets and many CSV readers take them for one."""
        ours = self.column_names
        # the input's own columns (`Email` and `email`) clash as a column of ours does; names
        # are grouped by their lower case (10,000 columns compared each with each took 30 s)
        by_case: dict[str, list[str]] = {}
        for column in [*ours, *(n for n in self.input_columns if n not in ours)]:
            by_case.setdefault(column.lower(), []).append(column)
        for name in [*input_columns, *ours]:
            for column in by_case.get(name.lower(), ()):
                pair = (min(name, column), max(name, column))
                if name != column and pair not in self.clashes:
                    self.clashes.add(pair)
                    self.warn(
                        f"Map {self.name!r}: the columns {pair[0]!r} and {pair[1]!r} differ only in case; the "
                        "export keeps both, but spreadsheets and many CSV readers take them for one: rename one."
                    )


def estimate_total(rows: Any, limit: int | None) -> int | None:
    """The input's rows before the map has read it (None: unknown), as far as `limit` lets it go."""
    total: int | None = None
    if isinstance(rows, CsvSource):
        try:  # the whole file read (its rows counted), its bytes checked: before any row is paid for
            total = count_records(rows.path, delimiter=rows.delimiter, utf8=True) - 1 - rows.preamble  # header, sep=
        except UnicodeDecodeError:
            raise rows.undecodable() from None
    elif hasattr(rows, "__len__"):
        total = len(rows)
    if total is not None and limit is not None:
        total = min(total, limit)
    return total


def count_records(path: Path, block_size: int = 1 << 20, delimiter: str = ",", *, utf8: bool = False) -> int:
    """The CSV's records (its header one of them), counted fast: its lines, but for line
    breaks inside quoted cells and blank lines, empty or of empty unquoted cells (`,,,`, a
    spreadsheet's trailing rows), which the map skips. An estimate still, until the map has
    read the file: the view says the exact count once it has. `utf8`: and UnicodeDecodeError
    if it is not UTF-8."""
    blanks = _blanks(delimiter)
    count, quoted, ended = 0, False, True  # `ended`: the text so far ends a line
    for block in _blocks(path, block_size, utf8):
        if not quoted and b'"' not in block:
            count += _line_ends(block, ended, blanks)
            ended = _ends_line(block, ended, blanks)
            continue
        pieces = block.split(b'"')
        if quoted and len(pieces) == 1:
            continue  # all of it inside one quoted cell
        # What is outside quotes, each quoted stretch (quotes and all) as one `"`: at C speed.
        outside = b'"'.join(pieces[1::2] if quoted else pieces[0::2])
        if quoted:  # it begins after the quote that ends a cell: mid-line
            outside, ended = b'"' + outside, False
        count += _line_ends(outside, ended, blanks)
        quoted ^= len(pieces) % 2 == 0  # an odd number of quotes in the block
        ended = not quoted and _ends_line(outside, ended, blanks)
    if quoted:  # a quote never closed: a literal `"` in an unquoted cell (27" Monitors), as csv reads it
        return _count_lines(path, block_size, blanks)
    return count + (0 if ended else 1)


def _count_lines(path: Path, block_size: int, blanks: _Blanks) -> int:
    """The file's lines that hold something, quotes or not."""
    count, ended = 0, True
    for block in _blocks(path, block_size):
        count += _line_ends(block, ended, blanks)
        ended = _ends_line(block, ended, blanks)
    return count + (0 if ended else 1)


def _blocks(path: Path, block_size: int, utf8: bool = False) -> Iterator[bytes]:
    """The file's bytes, a block at a time, lines ended by `\n`: a file whose lines end with a
    lone `\r` (Excel for Mac's "CSV (Macintosh)", told by its first block) has them as `\n`.
    `utf8`: each block decoded too (UnicodeDecodeError), at C speed."""
    cr_only: bool | None = None
    decode = codecs.getincrementaldecoder("utf-8")().decode if utf8 else None
    with path.open("rb") as handle:
        while block := handle.read(block_size):
            if decode is not None:
                decode(block)
            if cr_only is None and b"\n" in block:
                cr_only = False
            elif cr_only is None and b"\r" in block[:-1]:  # not its last byte: a `\r\n` split by the block
                cr_only = True
            yield block.replace(b"\r", b"\n") if cr_only else block
    if decode is not None:
        decode(b"", True)  # a character cut short at the end


class _Blanks(NamedTuple):
    """What makes a line blank in a file of this delimiter: spaces and delimiters only."""

    filler: bytes  # the bytes a blank line may hold before its end
    line: re.Pattern[bytes]  # a line end a blank line follows (lookahead: runs of them too)
    start: re.Pattern[bytes]  # a blank line at the start of a text


@functools.lru_cache(maxsize=8)
def _blanks(delimiter: str) -> _Blanks:
    filler = b" \t" + delimiter.encode()
    cells = b"[" + re.escape(filler) + b"]*"
    return _Blanks(filler, re.compile(rb"\n(?=" + cells + rb"\r?\n)"), re.compile(cells + rb"\r*\n"))


def _line_ends(text: bytes, ended: bool, blanks: _Blanks) -> int:
    """The lines `text` ends that hold something (a blank line is no record), given
    whether the text before it ended a line."""
    blank = len(blanks.line.findall(text)) + (1 if ended and blanks.start.match(text) else 0)
    return text.count(b"\n") - blank


def _ends_line(text: bytes, ended: bool, blanks: _Blanks) -> bool:
    """Whether the text so far ends a line, once `text` is added to it (a CR, a space or a
    delimiter alone adds nothing: a line of them is blank)."""
    text = text.rstrip(b"\r" + blanks.filler)
    return text.endswith(b"\n") if text else ended


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
