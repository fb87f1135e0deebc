"""`Dataset`: a map's result, streamed from the store in input order; CSV/JSONL export."""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import itertools
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, ClassVar

from deepline_cli import _json
from deepline_cli.store.records import DatasetRow, MapRecord
from deepline_cli.store.roles import SheetStore

PAGE = 1000
ERROR_COLUMN = "_error"


class Dataset:
    """The rows of one map of one run: `len()`, iteration in input order, failures, export.

    Rows are read from the store page by page, so a million-row map never sits in memory.
    """

    __fingerprint_as__: ClassVar[str] = "deepline.Dataset"  # a run's and the plan's alike

    def __init__(self, store: SheetStore, record: MapRecord, cwd: str | None = None) -> None:
        self._store = store
        self.record = record
        self._cwd = cwd  # the folder the run was started in: a relative file is written there, as ctx.csv reads

    @property
    def name(self) -> str:
        return self.record.map

    @property
    def columns(self) -> list[str]:
        """Original columns first, then the map's new columns (a waterfall column followed by
        `<column>_step`: which of its steps found the value)."""
        original = [c for c in self.record.input_columns if c != ERROR_COLUMN]  # `_error` is the map's own
        added = []
        for column in self.record.columns:
            if column not in original:
                added.append(column)
            if column in self.record.steps and step_column(column) not in original:
                added.append(step_column(column))
        return original + added

    def __len__(self) -> int:
        return self.record.succeeded + self.record.failed

    @property
    def failed_count(self) -> int:
        return self.record.failed

    def count(self) -> int:
        """How many distinct rows (failed ones included)."""
        return len(self)

    def peek(self, n: int = 5) -> list[dict[str, Any]]:
        """The first `n` rows, in input order."""
        return list(itertools.islice(iter(self), max(0, n)))

    def materialize(self, n: int | None = None) -> list[dict[str, Any]]:
        """The rows as a list (the first `n`): for small maps, a million rows is a lot of memory."""
        return list(self) if n is None else self.peek(n)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for row in self._rows(failed_only=False):
            yield self._as_dict(row)

    def failed_rows(self) -> Iterator[dict[str, Any]]:
        for row in self._rows(failed_only=True):
            yield self._as_dict(row)

    def _rows(self, *, failed_only: bool) -> Iterator[DatasetRow]:
        record, after = self.record, -1
        while True:
            page = self._store.map_rows_page(
                record.run_id, record.map, record.sheet, after, PAGE, failed_only=failed_only
            )
            yield from page
            if len(page) < PAGE:
                return
            after = page[-1].idx

    def _as_dict(self, row: DatasetRow) -> dict[str, Any]:
        values: dict[str, Any] = dict(row.input or {})
        for column in self.record.columns:
            cell = row.cells.get(column)
            # A column that computed no value (its row failed before it, or in it) leaves an input
            # field of its name as it was.
            values[column] = cell.value if cell and cell.error is None else values.get(column)
            if column in self.record.steps:  # as its value: where it did not run, an input's step is kept
                if cell is not None and cell.error is None and not cell.not_run:
                    values[step_column(column)] = cell.step
                else:
                    values.setdefault(step_column(column), None)
        if row.outcome == "failed":
            values[ERROR_COLUMN] = row.error
        else:
            values.pop(ERROR_COLUMN, None)  # an input's `_error` (another map's): this row did not fail here
        return values

    def to_csv(self, path: str | Path) -> int:
        with replacing(self._place(path)) as handle:
            return write_csv(self, handle)

    def to_jsonl(self, path: str | Path) -> int:
        with replacing(self._place(path)) as handle:
            return write_jsonl(self, handle)

    def _place(self, path: str | Path) -> Path:
        """A relative path: in the folder the run was started in (a resume runs from anywhere)."""
        path = Path(path).expanduser()
        return path if path.is_absolute() or self._cwd is None else Path(self._cwd, path)

    def to_json(self) -> dict[str, Any]:
        return {"map": self.name, "rows": len(self), "failed": self.failed_count}

    def __repr__(self) -> str:
        return f"Dataset({self.name!r}, rows={len(self)}, failed={self.failed_count})"


def step_column(column: str) -> str:
    return f"{column}_step"


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"  # as JSON says it, in the same file's nested values too
    if isinstance(value, str | int | float):
        return value
    return _json.dumps_str(value)


def write_csv(dataset: Dataset, handle: IO[str]) -> int:
    """Original columns first, new columns after, `_error` last; non-scalars as JSON."""
    header = [*dataset.columns, ERROR_COLUMN]
    writer = csv.writer(handle)
    writer.writerow(header)
    count = 0
    for row in dataset:
        writer.writerow([_csv_cell(row.get(name)) for name in header])
        count += 1
    return count


def write_jsonl(dataset: Dataset, handle: IO[str]) -> int:
    count = 0
    for row in dataset:
        row.setdefault(ERROR_COLUMN, None)
        handle.write(_json.dumps_str(row) + "\n")
        count += 1
    return count


def stdout_output() -> io.TextIOWrapper:
    return io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="", write_through=True)


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[IO[str]]:
    """A file written whole or not at all: the rows go to a new file beside `path`, which
    takes its place once every row is on disk. A write that fails halfway (a full disk,
    Ctrl-C) leaves what `path` held before as it was, and nothing beside it. A link is
    followed (the file it names is replaced); a device or pipe (/dev/null) is written."""
    descriptor = _descriptor(str(path))
    if descriptor is not None:
        # A descriptor's name (/dev/stderr, /dev/fd/3): written through that descriptor, at its
        # place (a file `2>> log` redirects to is never replaced nor truncated; a pipe works).
        with open(os.dup(descriptor), "w", encoding="utf-8", newline="") as handle:
            yield handle
        return
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_file():
        with target.open("w", encoding="utf-8", newline="") as handle:
            yield handle
        return
    if target.exists() and not os.access(target, os.W_OK):  # replacing it would bypass its permissions
        raise PermissionError(errno.EACCES, "Permission denied", str(path))
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    except PermissionError:  # a folder only its files may be written in: written in place
        with target.open("w", encoding="utf-8", newline="") as handle:
            yield handle
        return
    PARTS.add(temporary)
    try:
        with open(fd, "w", encoding="utf-8", newline="") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        mode = target.stat().st_mode if target.exists() else 0o666 & ~_umask()
        os.chmod(temporary, mode & 0o7777)  # as the file it replaces, or as a new file would be
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    finally:
        PARTS.discard(temporary)


def _descriptor(path: str) -> int | None:
    """The file descriptor a path names (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N)."""
    named = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}.get(path)
    if named is not None:
        return named
    for prefix in ("/dev/fd/", "/proc/self/fd/"):
        if path.startswith(prefix) and path[len(prefix) :].isdigit():
            return int(path[len(prefix) :])
    return None


# The files `replacing` is writing: a process ended at once (Ctrl-C: cli.stop_at_once) removes them.
PARTS: set[str] = set()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
