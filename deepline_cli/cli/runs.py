"""`deepline runs …`: list runs, show one, read its logs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from deepline_cli.cli.common import JsonOption, StoreOption, cli_errors
from deepline_cli.cli.tables import print_json, print_json_lines, print_table, when

app = typer.Typer(help="List runs, show one, read its logs.", no_args_is_help=True)


def run_dict(r: Any) -> dict[str, Any]:
    return {
        "run_id": r.run_id,
        "play": r.play,
        "status": r.status,
        "attempt": r.attempt,
        "parent_run_id": r.parent_run_id,
        "root_run_id": r.root_run_id,
        "play_ref": r.play_ref,
        "workspace": r.workspace,
        "input": r.input,
        "output": r.output,
        "error": r.error,
        "stats": r.stats,
        "holder": r.holder,
        "options": r.options,
        "scheduled": r.scheduled,
        "ancestors": r.ancestors,
        "description": r.description,
        "snapshot": r.snapshot,
        "wake_at": r.wake_at,
        "created_at": r.created_at,
        "updated_at": r.updated_at,
        "finished_at": r.finished_at,
    }


def _load(store: str | None, run_id: str) -> Any:
    from deepline_cli.errors import UsageError
    from deepline_cli.store import open_store

    db = open_store(store)
    record = db.get_run(run_id)
    if record is None:
        url = db.url
        db.close()
        raise UsageError(f"No run {run_id!r} in the store {url}.")
    return db, record


@app.command("list")
@cli_errors
def list_runs(
    status: Annotated[str | None, typer.Option("--status", metavar="STATUS", help="Only runs in this status.")] = None,
    play: Annotated[str | None, typer.Option("--play", metavar="NAME", help="Only runs of this play.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", metavar="N", min=1, help="At most N runs.")] = None,
    store: StoreOption = None,
    json: JsonOption = False,
) -> None:
    """List runs, newest first (child runs included).

    \b
    Examples:
      deepline runs list --status failed
      deepline runs list --play lead-emails --json
    """
    from deepline_cli.errors import UsageError
    from deepline_cli.runtime.holders import holder_alive
    from deepline_cli.store import open_store
    from deepline_cli.store.base import RUN_STATUSES

    if status is not None and status not in RUN_STATUSES:
        raise UsageError(f"--status must be one of {', '.join(RUN_STATUSES)}, not {status!r}.")
    db = open_store(store)
    try:
        runs = db.list_runs(status=status, play=play, limit=limit)
        now = db.now()
    finally:
        db.close()
    if json:
        rows = []
        for r in runs:
            row = run_dict(r)
            row["stale"] = r.status == "running" and not holder_alive(r, now)
            rows.append(row)
        print_json_lines(rows)
        return
    table = []
    for r in runs:
        shown = r.status
        if r.status == "running" and not holder_alive(r, now):
            shown = "running (stale: holder gone)"
        table.append((r.run_id, r.play, shown, r.attempt, r.parent_run_id or "", when(r.created_at)))
    print_table(["run", "play", "status", "attempt", "parent", "created"], table, empty="No runs yet.")


@app.command("show")
@cli_errors
def show(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The run.")],
    store: StoreOption = None,
    json: JsonOption = False,
) -> None:
    """Show a run: status, attempts, row and tool-call counts, credits, output."""
    from deepline_cli import _json

    db, r = _load(store, run_id)
    try:
        boundaries = db.boundaries(run_id)
        children = db.child_runs(run_id)
        maps = db.get_maps(run_id)
        # Counted from the store, so a run killed mid-way shows what it really did.
        r.stats = {**r.stats, **db.run_stats(run_id)}
    finally:
        db.close()
    if json:
        shown = run_dict(r)
        shown["boundaries"] = [
            {
                "id": b.id,
                "kind": b.kind,
                "status": b.status,
                "due_at": b.due_at,
                "event_id": b.event_id,
                "child_run_id": b.child_run_id,
            }
            for b in boundaries
        ]
        shown["children"] = [c.run_id for c in children]
        shown["maps"] = [
            {
                "map": m.map,
                "rows": m.total,
                "succeeded": m.succeeded,
                "failed": m.failed,
                "duplicate": m.duplicate,
                "reused": m.reused,
                "status": m.status,
            }
            for m in maps
        ]
        print_json(shown)
        return
    stats = r.stats or {}
    lines = [
        f"run       {r.run_id}",
        f"play      {r.play}  ({r.play_ref})",
        f"status    {r.status}",
        f"attempts  {r.attempt}",
        f"created   {when(r.created_at)}",
        f"finished  {when(r.finished_at)}",
        f"duration  {stats.get('duration_s', 0):.2f}s",
        f"credits   {stats.get('credits', 0):g}",
    ]
    if r.parent_run_id:
        lines.append(f"parent    {r.parent_run_id}  (root {r.root_run_id})")
    for m in maps:
        lines.append(
            f"map       {m.map}: {m.total:,} rows ({m.succeeded:,} succeeded, {m.failed:,} failed, "
            f"{m.duplicate:,} duplicate, {m.reused:,} reused)  [{m.status}]"
        )
    rows = stats.get("rows") or {}
    if any(rows.values()):
        lines.append("rows      " + "  ".join(f"{k} {v:,}" for k, v in rows.items()))
    for tool_id, c in sorted((stats.get("tools") or {}).items()):
        lines.append(
            f"tool      {tool_id}: live {c['live']:,}  reused {c['reused']:,}  "
            f"failed {c['failed']:,}  credits {c['credits']:g}"
        )
    for b in boundaries:
        detail = {
            "sleep": f"due {when(b.due_at)}",
            "event": f"event {b.event_id!r}",
            "child": f"child run {b.child_run_id}",
        }.get(b.kind, "")
        lines.append(f"boundary  {b.kind:<6} {b.id}  {detail}  [{b.status}]")
    for child in children:
        lines.append(f"child     {child.run_id}  {child.play}  {child.status}")
    if r.error:
        lines.append(f"error     {r.error.get('message')}")
    if r.output is not None:
        lines.append(f"output    {_json.dumps_str(r.output)[:2000]}")
    typer.echo("\n".join(lines))


@app.command("logs")
@cli_errors
def logs(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The run.")],
    store: StoreOption = None,
    json: JsonOption = False,
) -> None:
    """Print a run's log lines, every attempt, oldest first."""
    db, _ = _load(store, run_id)
    try:
        lines = db.get_logs(run_id)
    finally:
        db.close()
    if json:
        print_json_lines(
            [
                {
                    "run_id": ln.run_id,
                    "attempt": ln.attempt,
                    "ts": ln.ts,
                    "level": ln.level,
                    "message": ln.message,
                }
                for ln in lines
            ]
        )
        return
    for ln in lines:
        typer.echo(f"{when(ln.ts)}  #{ln.attempt}  {ln.level:<7} {ln.message}")


@app.command("report")
@cli_errors
def report(
    run_id: Annotated[str, typer.Argument(help="The run.")],
    html: Annotated[bool, typer.Option("--html", help="Write the report as one self-contained HTML file.")] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Where to write it [default: deepline-report-RUN.html here].")
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
    path = (out or Path(f"deepline-report-{run_id}.html")).expanduser().resolve()
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"Cannot write the report to {path}: {exc.strerror}.") from None
    typer.echo(str(path))


def open_store_for(store: str | None) -> Any:
    from deepline_cli.store import open_store

    return open_store(store)
