"""`deepline runs …`: list runs, show one, follow or stop one from any terminal, read its logs."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from deepline_cli.cli.common import Command, JsonOption, StoreOption, at_least, cli_errors
from deepline_cli.cli.tables import print_json, print_json_lines, print_table, when

app = typer.Typer(help="List runs, show one, follow or stop one, read its logs.", no_args_is_help=True)

LOG_PAGE = 1000  # log lines read per query


def _load(store: str | None, run_id: str) -> Any:
    from deepline_cli.errors import UsageError
    from deepline_cli.store import open_store

    db = open_store(store, existing=True)
    record = db.runs.get_run(run_id)
    if record is None:
        url = db.url
        db.close()
        raise UsageError(f"No run {run_id!r} in the store {url}.")
    return db, record


@app.command("list", cls=Command)
@cli_errors
def list_runs(
    status: Annotated[str | None, typer.Option("--status", metavar="STATUS", help="Only runs in this status.")] = None,
    play: Annotated[str | None, typer.Option("--play", metavar="NAME", help="Only runs of this play.")] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", metavar="N", parser=at_least(1), help="At most N runs.")
    ] = None,
    store: StoreOption = None,
    json: JsonOption = False,
) -> None:
    """List runs, newest first (child runs included).

    \b
    Examples:
      deepline runs list --status failed
      deepline runs list --play lead-emails --json
    """
    from deepline_cli.errors import NoStoreError, UsageError
    from deepline_cli.runtime.run.holders import holder_stale
    from deepline_cli.store import open_store
    from deepline_cli.store.records import RUN_STATUSES
    from deepline_cli.ui.run_show import run_dict

    if status is not None and status not in RUN_STATUSES:
        raise UsageError(f"--status must be one of {', '.join(RUN_STATUSES)}, not {status!r}.")
    try:
        db = open_store(store, existing=True)
    except NoStoreError as missing:  # nothing has run on it yet, or a typo: either way, said with its path
        if not json:
            typer.echo(f"No runs yet: there is no store at {missing.path} (a run creates it).")
        return
    try:
        runs = db.runs.list_runs(status=status, play=play, limit=limit)
        now = db.now()
    finally:
        db.close()
    if json:
        rows = []
        for r in runs:
            row = run_dict(r)
            row["stale"] = holder_stale(r, now)
            rows.append(row)
        print_json_lines(rows)
        return
    table = []
    for r in runs:
        shown = r.status
        if holder_stale(r, now):
            shown = "running (stale: holder gone)"
        trigger = r.options.get("trigger") or ""
        table.append((r.run_id, r.play, shown, r.attempt, r.parent_run_id or "", trigger, when(r.created_at)))
    empty = "No runs yet." if status is None and play is None else "No run matches these filters."
    print_table(["run", "play", "status", "attempt", "parent", "trigger", "created"], table, empty=empty)


@app.command("show", cls=Command)
@cli_errors
def show(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The run.")],
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="Everything the store knows, untruncated: maps, tools with retries by cause, attempts, "
            "boundaries, child runs, the whole output, the error's traceback, the stop reason.",
        ),
    ] = False,
    store: StoreOption = None,
    json: JsonOption = False,
) -> None:
    """Show a run: status, attempts, row and tool-call counts, credits, output.

    \b
    Examples:
      deepline runs show r-8f2c1a9b3e4d
      deepline runs show r-8f2c1a9b3e4d --full
      deepline runs show r-8f2c1a9b3e4d --full --json
    """
    from deepline_cli.ui.run_show import read_shown, shown_dict, shown_lines
    from deepline_cli.ui.text import printable

    db, r = _load(store, run_id)
    try:
        shown = read_shown(db, r, full=full)
    finally:
        db.close()
    if json:
        print_json(shown_dict(shown))
        return
    typer.echo("\n".join(printable(line, newlines=True) for line in shown_lines(shown, when)))


@app.command("logs", cls=Command)
@cli_errors
def logs(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The run.")],
    kind: Annotated[
        list[str] | None,
        typer.Option(
            "--kind",
            metavar="KIND",
            help="Only lines of this kind: log (the play's own and the runtime's notes), row.failed (every "
            "failed row of the run's maps, not only those their log names; listed from the rows, so with no "
            "log id), row.failed.omitted, map.completed, run.interrupted, store.lost, store.reconnected. Repeat for "
            "several.",
        ),
    ] = None,
    where: Annotated[
        list[str] | None,
        typer.Option(
            "--where",
            metavar="FIELD=VALUE",
            help="Only lines whose field equals VALUE (compared as text; also level= and attempt=). "
            "Repeat: every one must hold.",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", metavar="FILE", help="Write the lines to FILE (the count goes to stderr)."),
    ] = None,
    store: StoreOption = None,
    json: JsonOption = False,
) -> None:
    """Print a run's log lines, every attempt, oldest first.

    \b
    Examples:
      deepline runs logs r-8f2c1a9b3e4d
      deepline runs logs r-8f2c1a9b3e4d --kind row.failed
      deepline runs logs r-8f2c1a9b3e4d --where map=leads --where row_key=acme.com
      deepline runs logs r-8f2c1a9b3e4d --kind log --where level=warning --json --out warnings.jsonl
    """
    import sys

    from deepline_cli import _json
    from deepline_cli.errors import UsageError
    from deepline_cli.store.records import LOG_KINDS
    from deepline_cli.ui.logs import Where, every_failed_row, line_dict, line_text, matches_all

    unknown = [k for k in kind or [] if k not in LOG_KINDS]
    if unknown:
        raise UsageError(f"--kind must be one of {', '.join(LOG_KINDS)}, not {unknown[0]!r}.")
    wheres = [Where.parse(w) for w in where or []]
    db, record = _load(store, run_id)
    try:
        sink = open(out, "w", encoding="utf-8") if out else sys.stdout  # noqa: SIM115 (closed below)
    except OSError as exc:
        db.close()
        raise UsageError(f"Cannot write the log lines to {out}: {exc.strerror}.") from None
    written = 0
    try:
        lines = _stored_lines(db, run_id, kind or ())
        if "row.failed" in (kind or ()):  # every failed row, not only those the maps logged
            lines = every_failed_row(lines, db, run_id, record.attempt)
        for line in lines:
            if matches_all(line, wheres):
                sink.write((_json.dumps_str(line_dict(line)) if json else line_text(line)) + "\n")
                written += 1
    finally:
        db.close()
        if out:
            sink.close()
    if out:
        sys.stderr.write(f"Wrote {written:,} log line(s) to {out}.\n")


def _stored_lines(db: Any, run_id: str, kinds: Sequence[str]) -> Iterator[Any]:
    after = 0
    while page := db.ledger.logs_after(run_id, after, LOG_PAGE, kinds=kinds):
        after = page[-1].id
        yield from page


@app.command("tail", cls=Command)
@cli_errors
def tail(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The run to follow.")],
    store: StoreOption = None,
    json: Annotated[
        bool, typer.Option("--json", help="NDJSON events on stdout: log, map.progress, run.finished.")
    ] = False,
) -> None:
    """Follow a run from another terminal: its log lines as they are written, each map's
    progress, and how it ends; exits with the run's exit code (0 completed, 1 failed,
    3 waiting, 130 interrupted). Reads the store only, so it follows a run on any machine
    sharing the store (a worker's included).

    \b
    Examples:
      deepline runs tail r-8f2c1a9b3e4d
      deepline runs tail r-8f2c1a9b3e4d --json | jq -c 'select(.event == "map.progress")'
    """
    import sys

    from deepline_cli import _json
    from deepline_cli.cli import stop_quietly
    from deepline_cli.runtime.run.follow import Follower
    from deepline_cli.ui.logs import followed_text

    stop_quietly()  # Ctrl-C stops following (exit 130), quietly; the run goes on
    db, r = _load(store, run_id)
    follower = Follower(db, run_id)
    try:
        for event in follower.events():
            lines = [_json.dumps_str(event.to_dict())] if json else followed_text(event, r.play)
            sys.stdout.write("".join(line + "\n" for line in lines))
            sys.stdout.flush()  # a pipe (`| grep`) sees each line as it comes
    finally:
        db.close()
    assert follower.result is not None
    raise typer.Exit(follower.result.exit_code)


@app.command("stop", cls=Command)
@cli_errors
def stop(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The run to stop.")],
    reason: Annotated[
        str, typer.Option("--reason", metavar="REASON", help="Why: kept in the run's error and its log.")
    ] = "stopped by user",
    wait: Annotated[
        bool,
        typer.Option("--wait/--no-wait", help="Wait until the run's process has recorded it interrupted."),
    ] = True,
    timeout: Annotated[
        float,
        typer.Option("--timeout", metavar="SECONDS", parser=at_least(0, number=float), help="How long --wait waits."),
    ] = 60.0,
    store: StoreOption = None,
) -> None:
    """Stop a run from any terminal or machine sharing its store. The process running it
    stops within a second as on Ctrl-C: no new calls, calls in flight finished and recorded,
    the run interrupted with the reason. A queued or waiting run is interrupted at once.
    `deepline resume` continues it.

    \b
    Examples:
      deepline runs stop r-8f2c1a9b3e4d
      deepline runs stop r-8f2c1a9b3e4d --reason "budget review" --no-wait
    """
    from deepline_cli.errors import UsageError
    from deepline_cli.runtime.run.stop import stop_run
    from deepline_cli.store import open_store

    reason = reason.strip()
    if not reason:
        raise UsageError("--reason must say something (or leave it out).")
    db = open_store(store, existing=True)
    try:
        stopped = stop_run(db, run_id, reason, wait_s=timeout if wait else None)
    finally:
        db.close()
    r = stopped.record
    if r.status == "interrupted":
        typer.echo(f"Run {run_id} stopped: {reason}. Next: deepline resume {run_id}")
    elif r.status != "running":
        typer.echo(f"Run {run_id} {r.status} before it could stop.")
    elif r.attempt != stopped.attempt:
        typer.echo(f"Run {run_id}'s attempt {stopped.attempt} stopped; attempt {r.attempt} has started since.")
    elif not wait:
        typer.echo(f"Asked run {run_id} to stop; its process stops within a second or so.")
    else:
        typer.echo(
            f"Run {run_id} is still stopping after {timeout:g}s (calls in flight finishing); "
            f"see: deepline runs show {run_id}"
        )
        raise typer.Exit(1)


@app.command("report", cls=Command)
@cli_errors
def report(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The run.")],
    html: Annotated[bool, typer.Option("--html", help="Write the report as one self-contained HTML file.")] = False,
    out: Annotated[
        Path | None,
        typer.Option("--out", metavar="FILE", help="Where to write it [default: deepline-report-RUN.html here]."),
    ] = None,
    store: StoreOption = None,
) -> None:
    """Report on a run: timeline, latency, credits and hit rates, rows, barriers, attempts.

    \b
    Examples:
      deepline runs report r-8f2c1a9b3e4d --html
      deepline runs report r-8f2c1a9b3e4d --html --out report.html
    """
    from deepline_cli.errors import UsageError
    from deepline_cli.ui.report_data import read_report
    from deepline_cli.ui.report_html import render

    if not html:
        raise UsageError("Choose the report's format: --html (a self-contained file to open in a browser).")
    db = open_store_for(store)
    try:
        page = render(read_report(db, run_id))
    finally:
        db.close()
    # The default name stays in this folder whatever the run id holds (an older store may
    # have ids from before they were checked): anything but a letter, digit, ., _ or - goes.
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in run_id).lstrip(".")
    path = (out or Path(f"deepline-report-{safe}.html")).expanduser().resolve()
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"Cannot write the report to {path}: {exc.strerror}.") from None
    typer.echo(str(path))


def open_store_for(store: str | None) -> Any:
    from deepline_cli.store import open_store

    return open_store(store, existing=True)
