"""`deepline tools list` and `deepline check`: look at plays and tools without calling anything."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from deepline_cli.cli.common import JsonOption, cli_errors
from deepline_cli.cli.tables import print_json_lines, print_table

app = typer.Typer(help="List the tools a play can call.", no_args_is_help=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", metavar="FILE", help="deepline.toml [default: ./deepline.toml or next to PLAY]."),
]


@app.command("list")
@cli_errors
def list_tools(
    play: Annotated[
        str | None, typer.Option("--play", metavar="FILE", help="Also load this play's local @tools.")
    ] = None,
    config: ConfigOption = None,
    json: JsonOption = False,
) -> None:
    """List HTTP tools from deepline.toml and local @tools of a play.

    \b
    Examples:
      deepline tools list
      deepline tools list --play plays/leads.py --json
    """
    rows = _tool_rows(play, config)
    if json:
        print_json_lines(rows)
        return
    table = [
        (r["id"], r["kind"], r["credits"], r["rate_limit"] or "", r["concurrency"] or "", r["target"]) for r in rows
    ]
    print_table(["tool", "kind", "credits", "rate limit", "concurrency", "target"], table, empty="No tools found.")


def _tool_rows(play: str | None, config: Path | None) -> list[dict[str, object]]:
    """The tools of deepline.toml, and the local @tools of the play file (every play in it)."""
    from deepline_cli.runtime.config import find_config, load_config
    from deepline_cli.runtime.play import load_module, split_ref
    from deepline_cli.runtime.tools import registered_tools

    base = Path.cwd() / "play.py"
    if play:
        base = Path(split_ref(play)[0]).resolve()
        load_module(base)
    cfg = load_config(find_config(base, config))
    rows: list[dict[str, object]] = []
    for tool_id, spec in sorted(cfg.tools.items()):
        rows.append(
            {
                "id": tool_id,
                "kind": "http",
                "credits": spec.credits,
                "rate_limit": spec.rate_limit,
                "concurrency": spec.concurrency,
                "target": f"{spec.method} {spec.url}",
                "secrets": spec.secret_names(),
                "fields": spec.field_names(),
            }
        )
    for tool_id, local in sorted(registered_tools().items()):
        rows.append(
            {
                "id": tool_id,
                "kind": "local",
                "credits": local.credits,
                "rate_limit": local.rate_limit,
                "concurrency": local.concurrency,
                "target": f"{local.fn.__module__}.{local.fn.__qualname__}",
                "secrets": [],
                "fields": [],
            }
        )
    if cfg.remote is not None:
        rows.append(
            {
                "id": "*",
                "kind": "remote",
                "credits": cfg.remote.credits.get("*", 0),
                "rate_limit": None,
                "concurrency": None,
                "target": cfg.remote.base_url,
                "secrets": [cfg.remote.api_key_env],
                "fields": [],
            }
        )
    return rows


@cli_errors
def check(
    play: Annotated[str, typer.Argument(metavar="PLAY", help="The play file: PATH.py[:FUNCTION].")],
    config: ConfigOption = None,
    json: JsonOption = False,
) -> None:
    """Load a play and its deepline.toml, list plays and tools, check secrets; call nothing.

    \b
    Examples:
      deepline check plays/leads.py
      deepline check plays/leads.py:lead_emails --config prod.toml
    """
    from deepline_cli.cli.tables import print_json
    from deepline_cli.errors import UsageError
    from deepline_cli.runtime.config import find_config, load_config
    from deepline_cli.runtime.play import load_module, plays_in, split_ref
    from deepline_cli.runtime.secrets import Secrets

    raw, selector = split_ref(play)
    path = Path(raw).resolve()
    module = load_module(path)
    plays = plays_in(module)
    if selector and not any(selector in (p.name, p.function) for p in plays):
        raise UsageError(f"{path} has no play {selector!r}.")
    config_path = find_config(path, config)
    cfg = load_config(config_path)
    secrets = Secrets(path.parent)
    missing = sorted(
        {
            (tool_id, name)
            for tool_id, spec in cfg.tools.items()
            for name in spec.secret_names()
            if secrets.lookup(name) is None
        }
    )
    if cfg.remote is not None and secrets.lookup(cfg.remote.api_key_env) is None:
        missing.append(("[remote]", cfg.remote.api_key_env))
    tool_rows = _tool_rows(play, config)
    report = {
        "play_file": str(path),
        "plays": [{"name": p.name, "function": p.function, "description": p.description} for p in plays],
        "config": str(config_path) if config_path else None,
        "tools": tool_rows,
        "missing_secrets": [{"tool": t, "secret": n} for t, n in missing],
    }
    if json:
        print_json(report)
    else:
        typer.echo(f"play file  {path}")
        for p in plays:
            typer.echo(f"play       {p.name}  ({path.name}:{p.function})  {p.description}")
        typer.echo(f"config     {config_path or 'none'}")
        for row in tool_rows:
            typer.echo(f"tool       {row['id']}  [{row['kind']}]  {row['target']}")
    if missing:
        tool_id, name = missing[0]
        raise UsageError(f"Tool {tool_id!r}: secret {name} is not set; export it or add it to .env next to the play.")
    if not json:
        typer.echo("ok: the play loads, its config is valid and every secret is set.")
