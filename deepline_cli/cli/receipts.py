"""`deepline receipts …`: look at the durable record of paid calls."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import typer

from deepline_cli._format import format_credits
from deepline_cli.cli.common import Command, JsonOption, StoreOption, at_least, cli_errors
from deepline_cli.cli.tables import print_json_lines, print_table, when

app = typer.Typer(help="Inspect receipts: the durable record of every tool call and step.", no_args_is_help=True)


def receipt_dict(r: Any) -> dict[str, Any]:
    return {
        "key": r.key,
        "kind": r.kind,
        "label": r.label,
        "tool": r.tool,
        "status": r.status,
        "run_id": r.run_id,
        "attempt": r.attempt,
        "lease_expires_at": r.lease_expires_at,
        "idempotency_key": r.idempotency_key,
        "failure_kind": r.failure_kind,
        "error": r.error,
        "created_at": r.created_at,
        "completed_at": r.completed_at,
        "credits": r.credits,
        "generation": r.generation,
        "description": r.description,
        "input": r.input,
        "output": r.output,
    }


@app.command("inspect", cls=Command)
@cli_errors
def inspect(
    key_prefix: Annotated[
        str | None, typer.Argument(metavar="KEY_PREFIX", help="Only keys starting with this.")
    ] = None,
    run: Annotated[str | None, typer.Option("--run", metavar="RUN_ID", help="Receipts this run used.")] = None,
    status: Annotated[
        str | None,
        typer.Option(
            "--status",
            metavar="STATUS",
            help="running, completed, failed, skipped or released (given back after it may have gone out).",
        ),
    ] = None,
    tool: Annotated[str | None, typer.Option("--tool", metavar="TOOL", help="Only this tool id.")] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", metavar="N", parser=at_least(1), help="At most N receipts.")
    ] = None,
    history: Annotated[
        bool, typer.Option("--history", help="Also the earlier answers of refreshed receipts (older generations).")
    ] = False,
    full: Annotated[
        bool, typer.Option("--full", help="Each receipt whole: its full key, the call's input, its output, its error.")
    ] = False,
    store: StoreOption = None,
    json: JsonOption = False,
) -> None:
    """List receipts, filtered. A receipt paid for again (a stale cell, a forced call) is a
    new generation; --history lists the answers it had before. --full, or a receipt's whole
    key, shows each one whole: the call's input (kept when under 4 KB, secrets redacted) and
    its output.

    \b
    Examples:
      deepline receipts inspect --run r-8f2c1a9b3e4d
      deepline receipts inspect --status failed --tool hunter.email --json
      deepline receipts inspect 3fa9c1d2e4b5 --full
      deepline receipts inspect 3fa9 --history
    """
    from deepline_cli.errors import UsageError
    from deepline_cli.store import open_store
    from deepline_cli.store.records import RECEIPT_STATUSES, ReceiptQuery

    if status is not None and status not in RECEIPT_STATUSES:
        raise UsageError(f"--status must be one of {', '.join(RECEIPT_STATUSES)}, not {status!r}.")
    db = open_store(store, existing=True)
    try:
        if run is not None and db.runs.get_run(run) is None:
            raise UsageError(f"No run {run!r} in the store {db.url}.")
        query = ReceiptQuery(key_prefix, run, status, tool, limit)
        # Written as read (a table keeps its rows' few fields, to lay them out): a run's hundreds
        # of thousands of receipts, their inputs and answers, are never all in memory.
        with contextlib.closing(db.receipts.iter_receipts(query)) as listed:
            found = _as_run_paid(listed, db, run) if run is not None else listed
            if json:
                print_json_lines(
                    {**receipt_dict(r), **(_history(db.receipts.receipt_history(r.key)) if history else {})}
                    for r in found
                )
            else:
                _print(found, db.receipts.receipt_history if history else None, full=full, key_prefix=key_prefix)
    finally:
        db.close()


def _as_run_paid(found: Iterator[Any], db: Any, run: str) -> Iterator[Any]:
    """A run's receipts as that run left them: one it paid for whose answer a later run
    paid for again (a refresh) is shown with the generation this run paid, not the later
    one (its export shows that one too). Only refreshed receipts are looked up again."""
    for r in found:
        if r.generation > 1 and r.run_id != run:
            paid = [g for g in db.receipts.receipt_history(r.key) if g.run_id == run]
            if paid:
                g = paid[-1]
                r = dataclasses.replace(
                    r, run_id=g.run_id, attempt=g.attempt or r.attempt, generation=g.generation, output=g.output,
                    credits=g.credits, completed_at=g.completed_at, idempotency_key=g.idempotency_key,
                    status="completed", error=None, failure_kind=None,
                )  # fmt: skip
        yield r


def _print(
    found: Iterator[Any], history: Callable[[str], list[Any]] | None, *, full: bool, key_prefix: str | None
) -> None:
    """As a table (a receipt's line each, its earlier answers after the table), or each
    receipt whole (--full, or the one receipt a whole key names)."""
    first = list(itertools.islice(found, 2))
    if full or (len(first) == 1 and first[0].key == key_prefix):
        for r in itertools.chain(first, found):
            _print_whole(r, history(r.key) if history else [])
        if not first:
            typer.echo("No receipts match.")
        return
    earlier: dict[str, list[Any]] = {}
    rows = []
    for r in itertools.chain(first, found):
        rows.append(
            (
                r.key[:12], r.kind, r.label, r.tool or "", r.status, r.run_id, r.attempt, r.generation,
                r.failure_kind or "", format_credits(r.credits), when(r.completed_at or r.created_at),
            )
        )  # fmt: skip
        if history and (generations := history(r.key)):
            earlier[r.key] = generations
    print_table(
        ["key", "kind", "label", "tool", "status", "run", "attempt", "gen", "failure", "credits", "at"],
        rows,
        empty="No receipts match.",
        whole=["key"],  # a KEY_PREFIX to pass back: never wrapped or cut, however narrow the terminal
    )
    for key, generations in earlier.items():
        for old in generations:
            typer.echo(_generation_line(key[:12], old))


def _generation_line(key: str, old: Any) -> str:
    return (
        f"  {key} generation {old.generation}: run {old.run_id}, {format_credits(old.credits)} credits, "
        f"answered {when(old.completed_at)}, replaced {when(old.replaced_at)}"
    )


def _print_whole(r: Any, generations: list[Any]) -> None:
    """One receipt, untruncated, as `--full` shows it."""
    from deepline_cli import _json
    from deepline_cli.ui.text import printable

    def shown(value: Any) -> str:
        return printable(_json.dumps_str(value), newlines=True)

    if r.input is not None:
        given = shown(r.input)
    elif r.kind in ("tool", "fetch", "run_play"):
        given = "not kept (larger than 4 KB, or not JSON)"
    else:
        given = "-"
    lines = [
        f"key          {r.key}",
        f"call         {r.kind} {printable(r.label)}" + (f" → {r.tool}" if r.tool else ""),
        f"status       {r.status}" + (f"  ({r.failure_kind})" if r.failure_kind else ""),
        f"run          {r.run_id}  attempt {r.attempt}  generation {r.generation}",
        f"credits      {format_credits(r.credits)}",
        f"at           {when(r.created_at)}" + (f"  answered {when(r.completed_at)}" if r.completed_at else ""),
    ]
    if r.description:
        lines.append(f"description  {printable(r.description)}")
    lines.append(f"input        {given}")
    lines.append(f"output       {shown(r.output) if r.output is not None else '-'}")
    if r.error:
        lines.append(f"error        {shown(r.error)}")
    lines += [_generation_line("earlier", old) for old in generations]
    typer.echo("\n".join(lines) + "\n")


def _history(generations: list[Any]) -> dict[str, Any]:
    return {
        "history": [
            {
                "generation": old.generation,
                "run_id": old.run_id,
                "attempt": old.attempt,
                "idempotency_key": old.idempotency_key,
                "output": old.output,
                "credits": old.credits,
                "completed_at": old.completed_at,
                "replaced_at": old.replaced_at,
            }
            for old in generations
        ]
    }
