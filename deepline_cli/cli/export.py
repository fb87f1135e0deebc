"""`deepline export`: a run's map rows as CSV or JSONL."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, Annotated, Any, cast

import typer

from deepline_cli.cli.common import StoreOption, cli_errors, one_of
from deepline_cli.ui.text import for_terminal


@cli_errors
def export(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The run whose map to export.")],
    map: Annotated[
        str | None, typer.Option("--map", metavar="NAME", help="The map to export (needed when the run has several).")
    ] = None,
    format: Annotated[
        str | None,
        typer.Option(
            "--format",
            metavar="csv|jsonl",
            parser=one_of("csv", "jsonl"),
            help="csv or jsonl (default: by --out's suffix, else csv).",
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", metavar="FILE", help="Write here instead of stdout (-: stdout).")
    ] = None,
    store: StoreOption = None,
) -> None:
    """Export every distinct row of a run's map, failed ones with their `_error`.

    \b
    Examples:
      deepline export r-8f2c1a9b3e4d --out enriched.csv
      deepline export r-8f2c1a9b3e4d --map leads --format jsonl > leads.jsonl
    """
    import sys

    from deepline_cli.errors import UsageError
    from deepline_cli.runtime.map.dataset import Dataset
    from deepline_cli.runtime.run.input_files import named_files
    from deepline_cli.store import open_store

    if out is not None and str(out) in _STDOUT_NAMES:
        # stdout, as `-` is for most tools; /dev/stdout too (replaced, it was the file stdout
        # was redirected to, `>> log.txt` losing what it held; a pipe could not be opened)
        out = None
    suffix = out.suffix.lower() if out is not None else ""
    if format is None and suffix == ".json":  # one JSON document is not what it writes: not CSV either
        raise UsageError(
            f"--out {out} asks for JSON: export writes CSV or JSON Lines (one row per line); name the file "
            f"{out.with_suffix('.jsonl') if out else ''} or give --format csv|jsonl."
        )
    if format is None:  # `--out rows.jsonl` is JSON Lines without saying it twice
        format = "jsonl" if suffix in (".jsonl", ".ndjson") else "csv"
    db = open_store(store, existing=True)
    try:
        run = db.runs.get_run(run_id)
        if run is None:
            raise UsageError(f"No run {run_id!r} in the store {db.url}.")
        maps = {m.map: m for m in db.sheets.get_maps(run_id)}
        if not maps:
            raise UsageError(f"Run {run_id} has no map to export.")
        if map is None:
            if len(maps) > 1:
                raise UsageError(f"Run {run_id} has several maps ({', '.join(maps)}); pick one with --map.")
            record = next(iter(maps.values()))
        elif map in maps:
            record = maps[map]
        else:
            raise UsageError(f"Run {run_id} has no map {map!r}; it has: {', '.join(maps)}.")
        if out is not None and not out.parent.is_dir():
            raise UsageError(f"Cannot write {out}: the directory {out.parent} does not exist.")
        if out is not None and out.is_dir():
            raise UsageError(f"Cannot write {out}: it is a directory; give a file name, like {out / 'rows.csv'}.")
        sources = [Path(m.source) for m in maps.values() if m.source]
        if out is not None and any(_same_file(out, path) for path in [*named_files(run.input, run.cwd), *sources]):
            raise UsageError(
                f"Cannot write {out}: {out} is an input of run {run_id} (a file it read), which the export would "
                f"replace; give another file name, like {out.with_name(out.stem + '-export' + out.suffix)}."
            )
        dataset = Dataset(db.sheets, record)
        count = _write(out, format, dataset)
        partial = _partial(db, run_id, record)
    finally:
        db.close()
    if out:
        sys.stderr.write(f"Exported {count} rows of map {record.map!r} to {out}.\n")
    for a, b in _by_case_only(dataset.columns):
        sys.stderr.write(
            f"Warning: the columns {a!r} and {b!r} differ only in case; this export keeps both, but "
            "spreadsheets and many CSV readers take them for one.\n"
        )
    if partial:
        sys.stderr.write(partial + "\n")


_STDOUT_NAMES = frozenset({"-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"})


def _same_file(out: Path, path: Path) -> bool:
    try:
        return out.exists() and path.is_file() and out.samefile(path)
    except OSError:  # a name too long, a value that is no path at all
        return False


def _write(out: Path | None, format: str, dataset: Any) -> int:
    """Write the rows; a file that cannot be written (a full disk, no permission) is one
    sentence, exit 2."""
    from deepline_cli.errors import UsageError
    from deepline_cli.runtime.map.dataset import replacing, stdout_output, write_csv, write_jsonl

    writer = write_csv if format == "csv" else write_jsonl
    try:
        if out is not None:
            with replacing(out) as handle:
                return writer(dataset, handle)
        if sys.stdout is None:  # `>&-`
            raise UsageError("Cannot write the rows to stdout: it is closed; give --out FILE.")
        stdout = stdout_output()
        try:
            # On a terminal the rows are read, not stored: an escape sequence in a cell (a
            # provider's answer) is shown escaped, never acted on. A file or pipe gets them as they are.
            count = writer(dataset, cast(IO[str], _Escaped(stdout)) if sys.stdout.isatty() else stdout)
            stdout.flush()
            return count
        finally:
            stdout.detach()  # stdout's own buffer stays open: only the wrapper goes
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            raise  # the reader went away: cli_errors ends quietly
        raise UsageError(f"Cannot write {out or 'the rows to stdout'}: {exc.strerror or exc}.") from None


def _by_case_only(columns: list[str]) -> list[tuple[str, str]]:
    first: dict[str, str] = {}
    pairs = []
    for name in columns:
        seen = first.setdefault(name.lower(), name)
        if seen != name:
            pairs.append((seen, name))
    return pairs


def _partial(db: Any, run_id: str, record: Any) -> str | None:
    """A warning when the map did not finish, or was a pilot: the export holds only what was done."""
    run = db.runs.get_run(run_id)
    if record.status == "completed" and run.status == "completed":
        return _pilot(run, record)
    return _unfinished(db, run, record)


def _pilot(run: Any, record: Any) -> str | None:
    """A pilot's map (`--limit`, or a map's `limit=`) holds the first rows of its list: said."""
    rest = int((record.pilot or {}).get("rest_distinct", 0))
    if not rest:
        return None
    done, limit = record.succeeded + record.failed, (run.options or {}).get("limit")
    how, whole = (f" (--limit {limit})", "run the play without --limit") if limit else ("", "lift the map's limit")
    return (
        f"Warning: run {run.run_id} is a pilot{how}: map {record.map!r} has its first {done:,} of {done + rest:,} "
        f"rows; the whole list: {whole} (the rows paid here are not paid again)."
    )


def _unfinished(db: Any, run: Any, record: Any) -> str:
    """The map or its run did not finish: what the export holds, and how the run goes on."""
    run_id = run.run_id
    from deepline_cli.runtime.run.holders import holder_stale

    gone = holder_stale(run, db.now())  # killed: the store still says running
    state = "stopped (its process is gone)" if gone else f"is {run.status}"
    # A run a live process is at goes on by itself (its resume would be refused as busy).
    going = run.status in ("running", "queued") and not gone
    resume = "" if going else f" Continue the run with: deepline resume {run_id}"
    outcomes = db.sheets.count_map_rows(run_id, record.map)
    done = sum(outcomes.values())
    if record.total and done >= record.total:  # every row is there: the run failed after (or beside) them
        failed = f"{outcomes.get('failed', 0):,} failed"
        return f"Warning: run {run_id} {state}; map {record.map!r} has all its {done:,} rows ({failed})." + (
            resume if gone else ""
        )
    of = f" of {record.total:,}" if record.total >= done else ""
    return (
        f"Warning: run {run_id} {state} and map {record.map!r} has {done:,}{of} rows: this export is partial.{resume}"
    )


class _Escaped:
    """A text stream that writes what a terminal would act on as escapes (`\\x1b`)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return int(self._stream.write(for_terminal(text)))
