"""`deepline schedules list`: the schedules of play files, their next tick and last run."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

import typer

from deepline_cli.cli.common import Command, JsonOption, StoreOption, cli_errors
from deepline_cli.cli.tables import print_json_lines, print_table

app = typer.Typer(help="The schedules `deepline worker --play FILE` fires.", no_args_is_help=True)


@app.command("list", cls=Command)
@cli_errors
def list_schedules(
    plays: Annotated[
        list[str],
        typer.Argument(metavar="FILE...", help="Play files with @play(schedule=...), or deepline.toml files."),
    ],
    store: StoreOption = None,
    json: JsonOption = False,
) -> None:
    """Each play's schedule, its next tick, and its last scheduled run with that run's status.

    \b
    Examples:
      deepline schedules list refresh.py
      deepline schedules list deepline.toml
      deepline schedules list plays/*.py --json
    """
    from deepline_cli.runtime.run.schedules import is_its_tick, scheduled_plays
    from deepline_cli.store import open_store

    loaded = [play for path in plays for play in scheduled_plays(path, required=False)]
    db = open_store(store)
    try:
        now = db.now()
        rows: list[dict[str, Any]] = []
        for play in loaded:
            assert play.schedule is not None
            last = next((r for r in db.runs.list_runs(play=play.name, limit=1000) if is_its_tick(r, play)), None)
            rows.append(
                {
                    "schedule_id": play.schedule.name,
                    "play": play.name,
                    "file": play.file,
                    "schedule": play.schedule.cron,
                    "timezone": play.schedule.timezone,
                    "catch_up": play.schedule.catch_up,
                    "next_tick": play.schedule.next_tick(now),
                    "last_run_id": last.run_id if last else None,
                    "last_status": last.status if last else None,
                }
            )
    finally:
        db.close()
    if json:
        print_json_lines(rows)
        return
    table = [
        (r["schedule_id"], r["play"], f"{r['schedule']} ({r['timezone']})", _utc(r["next_tick"]),
         r["last_run_id"] or "never run", r["last_status"] or "")
        for r in rows
    ]  # fmt: skip
    print_table(
        ["schedule", "play", "cron", "next tick", "last run", "status"], table, empty="No schedules in these files."
    )


def _utc(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
