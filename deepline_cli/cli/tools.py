"""`deepline tools list/describe/execute` and `deepline check`: look at plays and tools, or
make one call of a tool through a receipt."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from deepline_cli._format import format_credits
from deepline_cli.cli.common import Command, JsonOption, StoreOption, cli_errors
from deepline_cli.cli.run import WorkspaceOption
from deepline_cli.cli.tables import print_json, print_json_lines, print_table

if TYPE_CHECKING:
    from deepline_cli.runtime.providers.tools import ToolDef
    from deepline_cli.runtime.run.catalog import Catalog
    from deepline_cli.runtime.run.options import RunResult
    from deepline_cli.runtime.run.play import PlayDef

app = typer.Typer(help="List, describe and call the tools a play can call.", no_args_is_help=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        metavar="FILE",
        help="deepline.toml [default: the one next to --play FILE, as its runs read it; without --play, "
        "./deepline.toml].",
    ),
]
PlayOption = Annotated[str | None, typer.Option("--play", metavar="FILE", help="Also load this play's local @tools.")]
ToolArgument = Annotated[str, typer.Argument(metavar="TOOL", help="The tool id, e.g. hunter.email.")]


def _catalog(play: str | None, config: Path | None) -> Catalog:
    from deepline_cli.runtime.run.catalog import open_catalog

    with contextlib.redirect_stdout(sys.stderr):  # what the play prints as it loads: stdout is the command's
        return open_catalog(play, config, Path.cwd())


@app.command("list", cls=Command)
@cli_errors
def list_tools(play: PlayOption = None, config: ConfigOption = None, json: JsonOption = False) -> None:
    """List HTTP tools from deepline.toml and local @tools of a play.

    \b
    Examples:
      deepline tools list
      deepline tools list --play plays/leads.py --json
    """
    rows = _tool_rows(_catalog(play, config))
    if json:
        print_json_lines(rows)
        return
    table = [
        (r["id"], r["kind"], _price(r["credits"]), r["rate_limit"] or "", r["concurrency"] or "", r["target"])
        for r in rows
    ]
    print_table(["tool", "kind", "credits", "rate limit", "concurrency", "target"], table, empty="No tools found.")


def _price(credits: object) -> str:
    return format_credits(credits) if isinstance(credits, int | float) else ""


def _tool_rows(catalog: Catalog) -> list[dict[str, object]]:
    """The tools of deepline.toml, the local @tools loaded (the play file's), and [remote]."""
    cfg = catalog.config
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
    for tool_id, local in sorted(catalog.local.items()):
        rows.append(
            {
                "id": tool_id,
                "kind": "local",
                "credits": local.credits,
                "rate_limit": local.rate_limit,
                "concurrency": local.concurrency,
                "target": _where_defined(local),
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


@app.command("describe", cls=Command)
@cli_errors
def describe(
    tool: ToolArgument, config: ConfigOption = None, play: PlayOption = None, json: JsonOption = False
) -> None:
    """Show what a tool is: its request, the input fields it reads, credits and limits.

    Secret values are never shown: a `${NAME}` template shows the name, and whether it is set.

    \b
    Examples:
      deepline tools describe hunter.email
      deepline tools describe demo.company --play plays/leads.py --json
    """
    described = _catalog(play, config).describe(tool)
    if json:
        print_json(described)
        return
    for label, text in _describe_lines(described):
        typer.echo(f"{label:<13}{text}" if label else text)


def _describe_lines(d: dict[str, Any]) -> list[tuple[str, str]]:
    from deepline_cli import _json

    def shown(value: Any) -> str:
        if value in (None, {}, []):
            return "none"
        return value if isinstance(value, str) else _json.dumps_str(value)

    def pairs(table: dict[str, Any]) -> str:
        return "  ".join(f"{k}: {shown(v)}" for k, v in table.items()) or "none"

    head = f"{d['id']}  ({d['kind']} tool" + (f", {d['config']}" if d.get("config") else "") + ")"
    if d["kind"] == "local":
        lines = [
            ("", head),
            ("function", f"{d['function']} in {d['module']}" + (f" line {d['line']}" if d["line"] else "")),
            ("signature", d["signature"]),
            ("about", shown(d["doc"])),
            ("takes call", "yes: (input, call), call.idempotency_key" if d["takes_call"] else "no: (input)"),
        ]
    else:
        lines = [
            ("", head),
            ("request", f"{d['method']} {d['url']}"),
            ("headers", pairs(d["headers"])),
            ("query", pairs(d["query"])),
            ("json", shown(d["json"])),
            ("reads", ", ".join(d["fields"]) or ("the whole input" if d["kind"] == "remote" else "none")),
            ("secrets", ", ".join(f"{s['name']} ({'set' if s['set'] else 'not set'})" for s in d["secrets"]) or "none"),
        ]
        if d.get("proxy") is not None:
            lines.append(("proxy", d["proxy"] or "none (direct)"))
    credits = "reported by each answer" if d["credits"] is None else f"{format_credits(d['credits'])} per call"
    lines += [("credits", credits), ("rate limit", shown(d["rate_limit"])), ("concurrency", shown(d["concurrency"]))]
    if d["kind"] != "local":
        lines += [
            ("timeout", f"{d['timeout_s']:g} s"),
            ("retries", str(d["retries"])),
            ("idempotency", f"{d['idempotency_header']} header"),
            ("extract", pairs(d["extract"])),
            ("allow_hosts", ", ".join(d["allow_hosts"]) or "the url's own host"),
        ]
    lines += [("batch", shown(d["batch"])), ("version", str(d["version"]))]
    return lines


@app.command("execute", cls=Command)
@cli_errors
def execute(
    tool: ToolArgument,
    input: Annotated[
        str | None, typer.Option("--input", metavar="JSON|@FILE", help="The tool's input: JSON, or @file.json.")
    ] = None,
    config: ConfigOption = None,
    play: PlayOption = None,
    force: Annotated[bool, typer.Option("--force", help="Call the provider again (a new paid call).")] = False,
    store: StoreOption = None,
    workspace: WorkspaceOption = "default",
    json: Annotated[bool, typer.Option("--json", help="The run's NDJSON events on stdout.")] = False,
) -> None:
    """Call one tool once, through a receipt: the same input again reuses the answer.

    The call is a run of the built-in play `tools.execute` (see `deepline runs list`);
    its receipts are its own, not shared with a play's. Prints the tool's answer as JSON.

    \b
    Examples:
      deepline tools execute hunter.email --input '{"domain": "acme.com", "first_name": "Ada"}'
      deepline tools execute demo.company --play plays/leads.py --input @company.json --force
    """
    from deepline_cli.cli.inputs import read_input
    from deepline_cli.cli.run import execute as execute_run
    from deepline_cli.errors import UsageError
    from deepline_cli.runtime.run.builtin import TOOLS_EXECUTE
    from deepline_cli.runtime.run.options import RunOptions
    from deepline_cli.runtime.run.play import BUILTIN_PREFIX

    cwd = Path.cwd()
    payload = read_input(input, cwd=cwd)
    catalog = _catalog(play, config)
    catalog.describe(tool)  # an unknown tool fails here, before a run exists
    secret = catalog.missing_secret(tool)
    if secret is not None:
        raise UsageError(
            f"Tool {tool!r}: secret {secret} is not set; export it or add it to {catalog.secrets.env_file}."
        )
    options = RunOptions(
        store=store,
        workspace=workspace,
        config=str(catalog.config.path) if catalog.config.path else None,
        tools_from=str(catalog.play_file) if catalog.play_file else None,
    )
    run_input = {"tool": tool, "input": payload, "force": force}

    def start(runner: Any) -> RunResult:
        result: RunResult = runner.start(BUILTIN_PREFIX + TOOLS_EXECUTE, run_input, cwd=str(cwd))
        return result

    execute_run(options, start, json, quiet=True, report=_report_call)


def _report_call(result: RunResult, json_mode: bool, view: Any) -> None:
    """The tool's answer on stdout; on stderr, whether it was paid for now or came from its receipt."""
    from deepline_cli import _json
    from deepline_cli.cli.run import report_run

    if json_mode or result.status != "completed":
        if result.status == "failed" and not json_mode:
            message = (result.error or {}).get("message", "the call failed")
            if (result.error or {}).get("replayed"):
                message += (
                    "; this failure is the one its receipt kept: the provider was not called again "
                    "(--force calls it again)"
                )
            sys.stderr.write(f"Error: {message} (run {result.run_id}).\n")
            return
        report_run(result, json_mode, view)
        return
    out = result.output
    sys.stdout.write(_json.dumps_str(out["output"]) + "\n")
    if out["execution"] == "live":
        credits = f"{format_credits(out['credits'])} credit" + ("" if out["credits"] == 1 else "s")
        sys.stderr.write(f"Called {out['tool']}: {credits} (run {result.run_id}).\n")
    else:
        sys.stderr.write(
            f"From the receipt {out['receipt_key']}: no provider call (run {result.run_id}; --force pays again).\n"
        )


@cli_errors
def check(
    play: Annotated[str, typer.Argument(metavar="PLAY", help="The play file: PATH.py[:FUNCTION].")],
    config: Annotated[
        Path | None,
        typer.Option("--config", metavar="FILE", help="deepline.toml [default: the one next to PLAY]."),
    ] = None,
    json: JsonOption = False,
) -> None:
    """Load a play and its deepline.toml, list plays and tools, check secrets; call nothing.

    \b
    Examples:
      deepline check plays/leads.py
      deepline check plays/leads.py:lead_emails --config prod.toml
    """
    from deepline_cli.errors import UsageError
    from deepline_cli.runtime.run.play import load_module, plays_in, split_ref

    raw, selector = split_ref(play)
    path = Path(raw).resolve()
    with contextlib.redirect_stdout(sys.stderr):  # what the play prints as it loads
        plays = plays_in(load_module(path))
    if selector and not any(selector in (p.name, p.function) for p in plays):
        raise UsageError(f"{path} has no play {selector!r}.")
    chosen = [p for p in plays if not selector or selector in (p.name, p.function)]
    catalog = _catalog(play, config)
    secrets = catalog.secrets
    missing: list[tuple[str | None, str | None, str]] = [
        (p.name, None, name) for p in chosen for name in p.secrets if secrets.lookup(name) is None
    ]
    for tool_id, spec in sorted(catalog.config.tools.items()):
        needed = [*spec.secret_names(), *spec.proxy_secret_names()]
        missing += [(None, tool_id, name) for name in needed if secrets.lookup(name) is None]
    remote = catalog.config.remote
    if remote is not None:
        missing += [(None, "[remote]", name) for name in remote.secret_names() if secrets.lookup(name) is None]
    tool_rows = _tool_rows(catalog)
    unknown = _unknown_tools(path, catalog)
    report = {
        "play_file": str(path),
        "plays": [_play_dict(p) for p in plays],
        "config": str(catalog.config.path) if catalog.config.path else None,
        "tools": tool_rows,
        "unknown_tools": [{"tool": t, "file": f, "line": n} for t, f, n in unknown],
        "missing_secrets": [{"play": p, "tool": t, "secret": n} for p, t, n in missing],
    }
    if json:
        print_json(report)
    else:
        _print_check(path, plays, report, tool_rows, lambda name: secrets.lookup(name) is not None)
    if unknown:
        raise UsageError(_unknown_sentence(unknown, catalog))
    if missing:
        by_play, by_tool, secret = missing[0]
        owner = (
            f"Play {by_play!r} needs the secret {secret}, which" if by_play else f"Tool {by_tool!r}: secret {secret}"
        )
        raise UsageError(f"{owner} is not set; export it or add it to {secrets.env_file}.")
    if not json:
        typer.echo("ok: the play loads, its config is valid and every secret is set.")


def _unknown_tools(play_file: Path, catalog: Catalog) -> list[tuple[str, str, int]]:
    """Tools the play's code calls by a literal id that nothing here can run: not a local
    @tool, not in deepline.toml, and no [remote] table to send it to. The play's file and
    the modules it imported from its folder are read."""
    import contextlib

    from deepline_cli.errors import UsageError
    from deepline_cli.runtime.map.toolscan import called_tools
    from deepline_cli.runtime.run.snapshot import local_modules

    files = [play_file]
    with contextlib.suppress(UsageError):  # a module linked from outside the folder: `run --enqueue` says so
        files += [f for f in local_modules(play_file.parent).values() if f.resolve() != play_file.resolve()]
    unknown: dict[str, tuple[str, str, int]] = {}
    for file in files:
        for tool_id, line in called_tools(file):
            if catalog.kind(tool_id) is None:
                unknown.setdefault(tool_id, (tool_id, file.name, line))
    return list(unknown.values())


def _unknown_sentence(unknown: list[tuple[str, str, int]], catalog: Catalog) -> str:
    import difflib

    tool_id, file, line = unknown[0]
    near = difflib.get_close_matches(tool_id, catalog.ids(), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    where = str(catalog.config.path) if catalog.config.path else "a deepline.toml (none was found)"
    more = f" ({len(unknown) - 1} more unknown tool(s) listed above)" if len(unknown) > 1 else ""
    return (
        f"{file} line {line} calls the tool {tool_id!r}{hint}, which is not a local @tool, not in {where}, "
        f"and no [remote] table covers it{more}."
    )


def _play_dict(p: PlayDef) -> dict[str, Any]:
    return {
        "name": p.name,
        "function": p.function,
        "description": p.description,
        "input_schema": p.input_schema,
        "secrets": list(p.secrets),
        "max_credits_per_run": p.max_credits_per_run,
    }


def _print_check(path: Path, plays: list[PlayDef], report: dict[str, Any], tool_rows: list[Any], is_set: Any) -> None:
    from deepline_cli.runtime.run.schema import fields

    typer.echo(f"play file  {path}")
    for p in plays:
        typer.echo(f"play       {p.name}  ({path.name}:{p.function})  {p.description}".rstrip())
        if p.input_schema is not None:
            docs = fields(p.input_schema) or []
            width = max((len(f.path) for f in docs), default=0)
            for i, f in enumerate(docs):
                need = "required" if f.required else "optional"
                typer.echo(f"  {'input' if i == 0 else '':<9}{f.path:<{width}}  {f.expected}  ({need})")
            if not docs:
                typer.echo("  input    any object")
        if p.secrets:
            listed = ", ".join(f"{n} ({'set' if is_set(n) else 'not set'})" for n in p.secrets)
            typer.echo(f"  secrets  {listed}")
        if p.max_credits_per_run is not None:
            typer.echo(f"  budget   {format_credits(p.max_credits_per_run)} credits per run (--max-credits overrides)")
    typer.echo(f"config     {report['config'] or 'none'}")
    for row in tool_rows:
        typer.echo(f"tool       {row['id']}  [{row['kind']}]  {row['target']}")
    for u in report["unknown_tools"]:
        typer.echo(f"unknown    {u['tool']}  ({u['file']} line {u['line']}): nothing here can run it")


def _where_defined(local: ToolDef) -> str:
    """`company in play.py line 39`: a local tool's function where the play's author wrote it
    (its module's name is the loader's own, `deepline_play_…`)."""
    from deepline_cli.runtime.run.catalog import describe_local

    where = describe_local(local)
    if where["line"] is None:
        return f"{where['module']}.{where['function']}"
    return f"{where['function']} in {Path(where['module']).name} line {where['line']}"
