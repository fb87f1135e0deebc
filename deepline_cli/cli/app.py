"""The `deepline` command: one Typer app, a sub-app per command group.

Only typer and the standard library are imported here: `deepline --help` must start
fast, so each command imports the runtime, the store and rich when it runs.
"""

from __future__ import annotations

from typing import Annotated

import typer

from deepline_cli import __version__
from deepline_cli.cli import events, export, plan, receipts, runs, schedules, serve, store, tools, worker
from deepline_cli.cli import run as run_cmd
from deepline_cli.cli.common import Command, Settings

app = typer.Typer(
    name="deepline",
    help="Run durable plays: every paid provider call goes through a receipt, so nothing "
    "is paid twice and an interrupted run resumes where it stopped.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    add_completion=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="""\b
Examples:
  deepline run examples/hello/play.py                     # a first play, offline
  deepline run play.py --csv leads.csv --limit 20         # a pilot on 20 rows
  deepline resume r-8f2c1a9b3e4d                          # continue where it stopped
  deepline export r-8f2c1a9b3e4d --out enriched.csv       # the rows, failures in _error
  deepline runs list --status failed                      # what went wrong lately
  deepline run play.py --run-id nightly --json            # in CI: idempotent, NDJSON""",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"deepline {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks for errors.", envvar="DEEPLINE_DEBUG")
    ] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    Settings.debug = debug


app.command("run", cls=Command, epilog=run_cmd.RUN_EPILOG)(run_cmd.run)
app.command("resume", cls=Command)(run_cmd.resume)
app.command("plan", cls=Command, epilog=plan.PLAN_EPILOG)(plan.plan)
app.command("export", cls=Command)(export.export)
app.command("check", cls=Command)(tools.check)
app.command("worker", cls=Command)(worker.worker)
app.command("serve", cls=Command)(serve.serve)
app.add_typer(tools.app, name="tools")
app.add_typer(events.app, name="events")
app.add_typer(receipts.app, name="receipts")
app.add_typer(runs.app, name="runs")
app.add_typer(store.app, name="store")
app.add_typer(schedules.app, name="schedules")
