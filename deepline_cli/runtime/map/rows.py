"""Row sources and row keys: what a map iterates and how it tells rows apart."""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from deepline_cli import _json
from deepline_cli.errors import InputError

RowKey = str | Sequence[str] | Callable[[Mapping[str, Any]], Any] | None
# A cell may hold a whole pasted page: Python's csv refuses a field over 128 KB by default,
# a spreadsheet does not. 1 GB still stops a file that is not CSV at all from filling memory.
csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))


SAVE_AS_UTF8 = (
    " (a spreadsheet saves it as UTF-8 with Save As › CSV UTF-8; a file Excel saved on Windows is "
    "converted by iconv -f cp1252 -t utf-8)"
)
_UTF16 = (
    "UTF-16 text (Excel's Unicode Text)",
    "save the sheet as CSV UTF-8, or convert it (iconv -f utf-16 -t utf-8 {name})",
)
# What a file given as a CSV is, by its first bytes, when it is a compressed or binary file.
_PACKED = (
    (b"\x1f\x8b", "gzip-compressed", "decompress it first (gunzip -k {name})"),
    (b"PK\x03\x04", "a zip archive (an Excel .xlsx workbook is one)", "save the sheet as CSV UTF-8, or unzip it"),
    (b"\xd0\xcf\x11\xe0", "an Excel .xls workbook", "save the sheet as CSV UTF-8"),
    (b"BZh", "bzip2-compressed", "decompress it first (bunzip2 -k {name})"),  # then a digit and "1AY&"
    (b"\xfd7zXZ\x00", "xz-compressed", "decompress it first (unxz -k {name})"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "decompress it first (unzstd {name})"),
    (b"\xff\xfe", *_UTF16),
    (b"\xfe\xff", *_UTF16),
)
# Excel's first line naming the delimiter (`sep=;`), which it writes and honours.
_EXCEL_SEP = re.compile(r"sep=([^\r\n\"])\r?\n")


def _packed_kind(head: bytes) -> tuple[str, str] | None:
    half = len(head) // 2
    if half >= 2 and half in (head[0::2].count(0), head[1::2].count(0)):
        return _UTF16  # a NUL in every other byte and no byte-order mark: UTF-16 all the same
    for magic, kind, fix in _PACKED:
        if head.startswith(magic) and (magic != b"BZh" or head[4:8] == b"1AY&"):
            return kind, fix
    return None


class CsvSource:
    """`ctx.csv(...)`: a CSV read lazily, row by row, as dicts.

    The header is read (and `required` columns checked) when the source is created, so a
    missing column fails before any work. UTF-8 with or without a BOM.

    A required column must also have a value in every row: a map fails a row whose required
    cell is empty (or only spaces) without calling anything for it, and goes on (`blank`).

    `columns={"domain": ["Website", "Company Domain"]}` names a column by the headers it
    may have in the file (matched ignoring case and spaces, the name itself included): the
    first one found is renamed; one found nowhere is empty in every row, or, if required,
    an error naming the headers tried.
    """

    def __init__(
        self,
        path: Path,
        *,
        rename: Mapping[str, str] | None = None,
        required: Sequence[str] | None = None,
        columns: Mapping[str, str | Sequence[str]] | None = None,
        description: str = "",
    ) -> None:
        self.path = path
        self.description = description
        required = [required] if isinstance(required, str) else list(required or [])  # one name, or several
        self.required = required
        self.line = 0  # the file line of the row last read (a row may span lines)
        self.delimiter = ","
        self.preamble = 0  # lines before the header that are not blank (Excel's `sep=;`): no row
        self.doubts: list[str] = []  # what reading the file found suspect (the map warns of it)
        self._doubted = 0  # of those, how many were said (the first few are enough)
        self._misfit: str | None = None  # why the row just read does not fit, if it does not
        header = self._header()
        self._rename = _renames(header, rename or {})
        self._rename.update(_aliases(header, columns or {}, claimed=self._rename))
        self._refuse_claimed_twice(header, columns or {})
        # A required column is found as `columns=` finds one: case and spaces aside (`Domain`).
        named = {self._rename.get(name, name) for name in header}
        unnamed = [name for name in header if name not in self._rename]
        wanted: dict[str, list[str]] = {name: [] for name in self.required if name not in named}
        self._rename.update(_aliases(unnamed, wanted))
        self.columns = [self._rename.get(name, name) for name in header]
        self._refuse_duplicates(header)
        self._absent = [name for name in (columns or {}) if name not in self.columns]
        missing = [name for name in required if name not in self.columns]
        if missing:
            tried = _tried(missing[0], columns or {}, rename or {})
            raise InputError(
                f"{path}: required column {missing[0]!r} is missing{tried} (columns: {', '.join(self.columns)})."
            )
        self.columns += self._absent

    def _refuse_claimed_twice(self, header: list[str], columns: Mapping[str, str | Sequence[str]]) -> None:
        """A `columns=` name whose headers in the file another name took already (`rename=`,
        or another of `columns=`) would be empty in every row without a word: refused."""
        taken = set(self._rename.values())
        by_fold = {folded_name(name): name for name in reversed(header)}
        for column, names in columns.items():
            if column in taken:
                continue
            present = [
                by_fold[f]
                for f in map(folded_name, [column, *([names] if isinstance(names, str) else names)])
                if f in by_fold
            ]
            if present:
                other = self._rename[present[0]]
                raise InputError(
                    f"{self.path}: the column {present[0]!r} is claimed by both {column!r} and {other!r} (rename= or "
                    "columns=); give each its own header in the file."
                )

    def _refuse_duplicates(self, header: list[str]) -> None:
        """Two columns of one name would become one key of each row: one would be lost. The
        file's own names, or the play's `rename=` / `columns=`, made them one."""
        first: dict[str, int] = {}
        for number, name in enumerate(self.columns, start=1):
            if name in first and not name:
                raise InputError(
                    f"{self.path}: columns {first[name]} and {number} have no header; name them in the file's "
                    "first row."
                )
            if name in first:
                renamed = [f"{header[n - 1]!r}" for n in (first[name], number) if header[n - 1] != name]
                if renamed:
                    fix = "change the play's rename= or columns=, or rename a column in the file"
                    why = f" ({' and '.join(renamed)} renamed to it by the play)"
                else:
                    fix, why = "rename one of them in the file", ""
                raise InputError(
                    f"{self.path}: the column {name!r} appears twice (columns {first[name]} and {number}){why}; {fix}."
                )
            first[name] = number

    def _open(self, raw: type[io.FileIO] = io.FileIO) -> io.TextIOWrapper:
        """The file as text; `raw=_Watched` for the read that tells whether it was written over."""
        try:
            file = raw(self.path, "r")
        except FileNotFoundError:
            raise InputError(f"CSV file {self.path} does not exist.") from None
        except OSError as exc:
            raise InputError(f"CSV file {self.path} cannot be read: {exc.strerror}.") from None
        return io.TextIOWrapper(io.BufferedReader(file, WATCHED_BYTES), encoding="utf-8-sig", newline="")

    def _header(self) -> list[str]:
        with self._open() as handle:
            kind = _packed_kind(cast(io.BufferedReader, handle.buffer).peek(8)[:8])
            if kind is not None:
                raise InputError(f"{self.path} is {kind[0]}, not a CSV: {kind[1].format(name=self.path.name)}.")
            try:
                sample = handle.read(SNIFF_BYTES)
                named = _EXCEL_SEP.match(sample)
                self.delimiter = named.group(1) if named else _delimiter(sample)
                self.preamble = 1 if named else 0
                handle.seek(0)
                if named:
                    handle.readline()
                rows = csv.reader(handle, delimiter=self.delimiter)
                header = next((row for row in rows if not _blank_record(row)), None)  # blank lines before it skipped
            except UnicodeDecodeError:
                raise self.undecodable() from None
        if not header or not any(h.strip() for h in header):
            raise InputError(f"CSV file {self.path} is empty: it has no header row.")
        return _trimmed([h.strip() for h in header])  # empty trailing columns, as a spreadsheet saves them

    def undecodable(self) -> InputError:
        """The decoder reads in blocks, so find the real line and column of the bad byte."""
        with self.path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    raw.decode("utf-8-sig" if number == 1 else "utf-8")
                except UnicodeDecodeError as exc:
                    column = len(raw[: exc.start].decode("utf-8", errors="replace")) + 1
                    return InputError(f"{self.path} line {number}, column {column}: not valid UTF-8{SAVE_AS_UTF8}.")
        return InputError(f"{self.path}: not valid UTF-8{SAVE_AS_UTF8}.")

    def __iter__(self) -> Iterator[dict[str, str]]:
        return self._rows(isolate=False)

    def isolating(self) -> Iterator[dict[str, str]]:
        """The rows as a map reads them: a line whose cells do not fit the header is a row
        that fails on its own (`blank` says why), padded or cut to the header; read any
        other way, it is an error naming its line."""
        return self._rows(isolate=True)

    def _rows(self, *, isolate: bool) -> Iterator[dict[str, str]]:
        absent = self._absent
        header = self.columns[: len(self.columns) - len(absent)]
        width = len(header)
        self.doubts, self._doubted = [], 0  # this read's own (the file may be read more than once)
        with self._open(_Watched) as handle:
            watch = cast(_Watched, cast(Any, handle.buffer).raw)
            skipped = self.preamble
            for _ in range(skipped):
                handle.readline()
            reader = csv.reader(handle, delimiter=self.delimiter)
            line = 1 + skipped
            spanned = (0, 0, 0)  # the last row over several lines: its first and last line, rows shaped in it
            try:
                for heading in reader:  # the header, after any blank lines
                    if not _blank_record(heading):
                        break
                line = reader.line_num + skipped
                top = heading[0].strip()  # a line of the header's cells again: two files joined
                for record in reader:
                    start, line = line + 1, reader.line_num + skipped
                    if line > start:
                        spanned = (start, line, self._rows_in(record, width, start, line))
                    if _blank_record(record):
                        continue  # a blank line, or a row of blank cells (a spreadsheet's trailing `,,`)
                    self._misfit = None
                    if record[0].lstrip("\ufeff").strip() == top and _repeats(record, heading):
                        said = "it repeats the header (two files joined into one?)"
                        if not isolate:
                            raise InputError(f"{self.path} line {line}: {said}")
                        self._misfit = f"{self.path.name} line {line}: {said}"  # this row fails, not the map
                        record = (record + [""] * width)[:width]
                    elif len(record) != width:
                        if len(record) > width and _blank_record(record[width:]):
                            record = record[:width]  # empty cells under the empty trailing columns
                        elif line > start:
                            raise InputError(
                                f"{self.path} line {start}: a quoted cell runs from here to line {line}, and the "
                                f"row it makes has {len(record)} fields where the header has {width}: a quote "
                                "left open? Close it."
                            )
                        else:
                            said = f"{len(record)} fields where the header has {width}: " + _misfit(
                                heading, len(record), width
                            )
                            if not isolate:
                                raise InputError(f"{self.path} line {line}: {said}")
                            self._misfit = f"{self.path.name} line {line}: {said}"  # this row fails, not the map
                            record = (record + [""] * width)[:width]
                    row = dict(zip(header, record, strict=False))  # as long as the header: checked above
                    for name in absent:
                        row[name] = ""
                    self.line = line
                    yield row
            except UnicodeDecodeError:
                raise self.undecodable() from None
            except csv.Error as exc:
                raise InputError(f"{self.path} line {reader.line_num + skipped}: {exc}.") from None
            except WrittenOver:
                raise self._changed(line) from None
            if watch.written_over():
                raise self._changed(line)
        first, last, shaped = spanned
        if shaped and last == line and self._open_at_end():
            raise InputError(
                f"{self.path} line {first}: a quote opened here is never closed, so the rest of the file "
                f"({line - first + 1} lines) would be one cell; close the quote."
            )

    def _changed(self, line: int) -> InputError:
        """The file was written over while it was read (a spreadsheet saved, a job regenerating
        it): what follows is another file's content at the old place."""
        return InputError(
            f"{self.path} changed while the map read it (near line {line}): the rows read before are "
            "recorded; resume the run to read the file as it is now."
        )

    def _rows_in(self, record: list[str], width: int, start: int, end: int) -> int:
        """A row read over several lines (a quoted cell with line breaks): how many of its
        lines are shaped like rows of this file (as many fields as the header). A stray
        quote swallows such lines into one cell: the map is warned, naming the line."""
        shaped = sum(
            1
            for cell in record
            if "\n" in cell
            for part in cell.split("\n")[1:]
            if part.strip() and part.count(self.delimiter) >= width - 1  # a trailing empty column: one more
        )
        if shaped and self._doubted < 3:
            self._doubted += 1
            self.doubts.append(
                f"{self.path.name} line {start}: a quoted cell runs over {end - start + 1} lines, {shaped} of them "
                "shaped like rows of this file; if a quote was left open there, those rows are read as part of "
                "the cell (close the quote to read them)"
            )
        return shaped

    def _open_at_end(self) -> bool:
        """Does the file end inside a quoted cell (read again strictly, only when its last row
        spanned lines shaped like rows)?"""
        with self._open() as handle:
            try:
                for _ in csv.reader(handle, delimiter=self.delimiter, strict=True):
                    pass
            except csv.Error as exc:
                return "unexpected end of data" in str(exc)
        return False

    def blank(self, row: Mapping[str, Any]) -> str | None:
        """Why the row just read cannot be used: its line's cells do not fit the header, or a
        required column has no value in it."""
        if self._misfit is not None:
            return f"InputError: {self._misfit}"
        for name in self.required:
            if is_blank(row.get(name)):
                return f"InputError: required column {name!r} is blank ({self.where()})"
        return None

    @property
    def misfit(self) -> bool:
        """The row just read did not fit the header: its cells may be shifted (no key in it)."""
        return self._misfit is not None

    def where(self) -> str:
        """The row just read, as a person finds it in the file: `leads.csv line 812`."""
        return f"{self.path.name} line {self.line}"

    def has_rows(self) -> bool:
        """Whether the file holds a row after its header (it reads no further than the first)."""
        return next(self.isolating(), None) is not None  # a first line that does not fit fails alone

    def count(self) -> int:
        """How many rows the file holds (read once; blank lines are not rows)."""
        return sum(1 for _ in self)

    def peek(self, n: int = 5) -> list[dict[str, str]]:
        """The first `n` rows."""
        return list(itertools.islice(iter(self), max(0, n)))

    def materialize(self, n: int | None = None) -> list[dict[str, str]]:
        """The rows as a list (the first `n`)."""
        return list(self) if n is None else self.peek(n)

    def __repr__(self) -> str:
        return f"CsvSource({self.path})"


def _repeats(record: Sequence[str], heading: Sequence[str]) -> bool:
    """Does this line hold the header's cells (a byte order mark and spaces aside)?"""
    cells = [cell.lstrip("\ufeff").strip() for cell in record]
    names = [name.strip() for name in heading]
    return _trimmed(cells) == _trimmed(names)


def _blank_record(cells: Sequence[str]) -> bool:
    """No cell holds more than whitespace: a blank line, or a line of blank cells (a
    spreadsheet's trailing `,,`, the spaces under its empty trailing columns)."""
    return not "".join(cells).strip()


def folded_name(name: str) -> str:
    """A column's name as `required=` and `columns=` match it: case and spaces aside."""
    return "".join(name.split()).lower()


def _aliases(
    header: Sequence[str], columns: Mapping[str, str | Sequence[str]], claimed: Mapping[str, str] | None = None
) -> dict[str, str]:
    """header name → column name, for the first header each column's aliases find that no
    other column took (nor a `claimed` one: renamed by `rename=`)."""
    found: dict[str, str] = {}
    taken = set(claimed or ())
    by_fold: dict[str, str] = {}
    for name in header:
        by_fold.setdefault(folded_name(name), name)
    for column, names in columns.items():
        candidates = [names] if isinstance(names, str) else list(names)
        for alias in [column, *candidates]:
            original = by_fold.get(folded_name(alias))
            if original is not None and original not in found and original not in taken:
                found[original] = column
                break
    return found


def _renames(header: Sequence[str], rename: Mapping[str, str]) -> dict[str, str]:
    """header name → new name, for each `rename` source a header matches: exactly, or as
    `columns=` aliases match (case and spaces aside)."""
    by_fold: dict[str, str] = {}
    for name in header:
        by_fold.setdefault(folded_name(name), name)
    found: dict[str, str] = {}
    for source, target in rename.items():
        original = source if source in header else by_fold.get(folded_name(source))
        if original is not None:
            found.setdefault(original, target)
    return found


def _tried(name: str, columns: Mapping[str, str | Sequence[str]], rename: Mapping[str, str]) -> str:
    names = columns.get(name, [])
    listed = [source for source, target in rename.items() if target == name]
    listed += [names] if isinstance(names, str) else list(names)
    if not listed:
        return ""
    return " (looked for " + ", ".join(repr(n) for n in listed) + ")"


def input_columns(rows: Any) -> list[str]:
    """The original columns of a row source, when it knows them (a CSV does)."""
    columns = getattr(rows, "columns", None)
    return list(columns) if columns else []


def key_function(key: RowKey) -> Callable[[Mapping[str, Any]], str]:
    """Turn `ctx.map(key=...)` into a function row → key string."""
    if key is None:
        return row_digest
    if isinstance(key, str):
        name = key

        def by_field(row: Mapping[str, Any]) -> str:
            try:
                return _scalar(row[name])
            except KeyError:
                raise InputError(f"it has no key field {name!r} (its fields: {', '.join(row)})") from None
            except TypeError as exc:  # NaN (a missing value from pandas): the input's, not the play's
                raise InputError(_not_json({name: row[name]}, exc)) from None

        by_field.fields = (name,)  # type: ignore[attr-defined]
        return by_field
    if callable(key):
        fn = key

        def by_function(row: Mapping[str, Any]) -> str:
            value = fn(row)
            if isinstance(value, list | tuple) and all(map(is_blank, value)):
                return ""  # every part blank: no identity, as with key=[fields]
            try:
                return _parts(value) if isinstance(value, list | tuple) else _scalar(value)
            except TypeError as exc:
                raise InputError(f"its key must be JSON (a string, a number, a list…): {exc}") from None

        return by_function
    names = list(key)

    def by_fields(row: Mapping[str, Any]) -> str:
        try:
            parts = [row[n] for n in names]
            if all(map(is_blank, parts)):
                return ""  # every part blank: no identity (the map keys the row by where it is)
            if any(map(_non_finite, parts)):  # refused, as in a key of one field
                raise InputError(_not_json(dict(zip(names, parts, strict=True))))
            return _parts(parts)
        except KeyError as exc:
            raise InputError(f"it has no key field {exc.args[0]!r} (its fields: {', '.join(row)})") from None

    by_fields.fields = tuple(names)  # type: ignore[attr-defined]
    return by_fields


def is_blank(value: Any) -> bool:
    """No value: None, or text that is empty or only spaces (a cell left empty)."""
    return value is None or (isinstance(value, str) and not value.strip())


def key_fields(key_of: Callable[..., str]) -> tuple[str, ...]:
    """The fields a key is made of, when the map names them (`key="email"`, a list)."""
    return getattr(key_of, "fields", ())


def _parts(parts: Sequence[Any]) -> str:
    """A key of several parts: a JSON list of each part as text, as a key of one field is
    (1 and "1" one key, None and "" alike); a CSV's rows, all text, are keyed as before."""
    return _json.dumps_str([_scalar(part) for part in parts])


def _scalar(value: Any) -> str:
    """A key as text: a string as it is, None as blank (no identity: the map keys the row by
    where it is), anything else as canonical JSON (a dict's keys in order, never a repr
    holding a memory address: the same row has the same key in every process)."""
    if isinstance(value, str):
        return value
    return "" if value is None else _json.canonical(value).decode()


def row_digest(row: Mapping[str, Any]) -> str:
    """Identity of a row's input: a cell is reused only while this stays the same."""
    try:
        content = _json.canonical(row)
    except TypeError as exc:
        raise InputError(_not_json(row, exc)) from None
    return hashlib.blake2b(content, digest_size=16).hexdigest()


def _not_json(row: Mapping[str, Any], exc: TypeError | None = None) -> str:
    """Why a row cannot be kept: the field holding NaN (rows from pandas), or what JSON said."""
    for name, value in row.items():
        if _non_finite(value):
            said = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
            return (
                f"its field {name!r} holds {said}, which is not JSON; give None for a missing value "
                "(from pandas: df.astype(object).where(df.notna(), None))"
            )
    return f"it is not JSON ({exc}): {_preview(row)}"


def _non_finite(value: Any) -> bool:
    """NaN or an infinity: no JSON number (pandas' missing value)."""
    return isinstance(value, float) and not math.isfinite(value)


def _preview(row: Mapping[str, Any]) -> str:
    text = repr(dict(row))
    return text if len(text) <= 120 else text[:117] + "..."


SNIFF_BYTES = 1 << 16
SNIFF_ROWS = 20
WATCHED_BYTES = 1 << 16  # a block of a CSV read for a map (see _Watched)


def _delimiter(sample: str) -> str:
    """`,`, or the `;` a spreadsheet in a European locale saves, or an export's tab: of those
    that split the header and whose header width at least half of the first rows share
    (Excel's empty trailing columns aside), the one that splits the header widest; a file
    of one column is read with `,`. A comma in a header name (`Revenue (k€, 2023)`) does not
    make a semicolon file a comma one, nor a semicolon in a note a comma file a semicolon
    one, nor a short row a semicolon file one of one column."""
    lines = sample.splitlines(keepends=True)
    if len(sample) == SNIFF_BYTES and len(lines) > 1:
        lines.pop()  # cut short: not a whole line
    best, best_width = ",", 1
    for delimiter in (",", ";", "\t"):
        try:
            records = list(itertools.islice(csv.reader(lines, delimiter=delimiter), SNIFF_ROWS + 1))
        except csv.Error:  # a NUL byte…: reading the file says so, where it is
            continue
        width = len(_trimmed(records[0])) if records else 0
        if width <= best_width:
            continue  # splits the header no wider (or not at all)
        # A row agrees when it has the header's cells, any past them empty (a blank last cell
        # of a row, Excel's empty trailing columns).
        rows = [r for r in records if any(r)]
        agree = sum(len(r) >= width and not any(c.strip() for c in r[width:]) for r in rows)
        if 2 * agree >= len(rows):
            best, best_width = delimiter, width
    return best


class _Watched(io.FileIO):
    """A CSV file read for a map, telling whether it was written over while it is read.
    Before each block is read, a file whose size or time changed since the last one has the
    block read last read again where it was: the same bytes there (touched, appended to,
    saved again as it was) and it is read on; other bytes, and it was written over in place
    (a spreadsheet re-sorted and saved, a job regenerating it): what follows the reader's
    offset is another file's content (WrittenOver). A file renamed over its path is another
    file: the one open is read to its end."""

    def __init__(self, path: Path, mode: str = "r") -> None:
        super().__init__(path, mode)
        self._seen = _version(self.fileno())
        self._offset = 0
        self._last = b""  # the block read last

    def readinto(self, buffer: Any) -> int | None:
        if self.written_over():
            raise WrittenOver()
        n = super().readinto(buffer)
        if n:
            self._last = bytes(memoryview(buffer)[:n])
            self._offset += n
        return n

    def written_over(self) -> bool:
        now = _version(self.fileno())
        if now == self._seen:
            return False
        last = self._last
        try:
            again = os.pread(self.fileno(), len(last), self._offset - len(last)) if last else last
        except OSError:  # not a file read twice (a pipe): nothing to tell
            again = last
        if again != last:
            return True
        self._seen = now
        return False


class WrittenOver(Exception):
    """The CSV file was written over while a map read it (see _Watched)."""


def _version(fd: int) -> tuple[int, int]:
    """The open file's size and modification time: a write over it changes one of them."""
    stat = os.fstat(fd)
    return stat.st_size, stat.st_mtime_ns


def _trimmed(record: list[str]) -> list[str]:
    """A record without its empty trailing cells (a spreadsheet saves empty columns)."""
    end = len(record)
    while end and not record[end - 1].strip():
        end -= 1
    return record[:end]


def _misfit(heading: list[str], fields: int, width: int) -> str:
    """What a row of `fields` cells lacks, or has over, the file's `width` columns (named by
    its own header line, `heading`)."""
    if fields < width:
        name = heading[fields].strip() if fields < len(heading) else ""
        return f"no cell for {name!r} (column {fields + 1})." if name else f"no cell for column {fields + 1}."
    return f"column {width + 1} has no header (a delimiter inside an unquoted cell?)."
