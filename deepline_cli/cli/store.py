"""`deepline store …`: where the store is, for the tools that read SQLite files."""

from __future__ import annotations

import typer

from deepline_cli.cli.common import Command, StoreOption, cli_errors

app = typer.Typer(help="Where the store is (a SQLite file opens in sqlite-utils or Datasette).", no_args_is_help=True)


@app.command("path", cls=Command)
@cli_errors
def path(store: StoreOption = None) -> None:
    """Print the store's path (or PostgreSQL URL, password hidden). sqlite-utils comes with
    `pip install 'deepline-cli[inspect]'`; Datasette is installed on its own.

    \b
    Examples:
      deepline store path
      sqlite-utils tables "$(deepline store path)" --counts
      datasette "$(deepline store path)"
    """
    from deepline_cli.store import resolve_store_url, safe_url

    target = resolve_store_url(store)
    typer.echo(safe_url(target.removeprefix("sqlite:///")))
