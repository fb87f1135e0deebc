"""`deepline plan`: what a run would call and spend, before anything is paid."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from deepline_cli._format import format_credits
from deepline_cli.cli.common import JsonOption, StoreOption, at_least, cli_errors
from deepline_cli.cli.run import (
    CsvOption,
    ForceRefreshOption,
    InputOption,
    PlayConfigOption,
    RefreshFailedOption,
    SetOption,
    WorkspaceOption,
)

PLAN_EPILOG = """\b
Examples:
  deepline plan play.py --csv leads.csv
  deepline plan play.py --csv leads.csv --limit 100 --json
  deepline plan play.py --csv leads.csv --refresh-failed   # what asking the failures again costs
"""


@cli_errors
def plan(
    play: Annotated[str, typer.Argument(metavar="PLAY", help="The play: PATH.py or PATH.py:FUNCTION.")],
    input: InputOption = None,
    csv: CsvOption = None,
    set_: SetOption = None,
    store: StoreOption = None,
    config: PlayConfigOption = None,
    workspace: WorkspaceOption = "default",
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit", metavar="N", parser=at_least(1), help="Plan a pilot: only the first N distinct rows of each map."
        ),
    ] = None,
    refresh_failed: RefreshFailedOption = False,
    force_refresh: ForceRefreshOption = False,
    json: JsonOption = False,
) -> None:
    """Plan a run without calling any provider: rows, calls already paid, new calls, credits."""
    from deepline_cli.cli.inputs import build_input
    from deepline_cli.runtime.planning.planner import PlanOptions, plan_play
    from deepline_cli.runtime.providers.config import find_config
    from deepline_cli.runtime.run.play import load_play
    from deepline_cli.store import open_store

    payload = build_input(input, csv, set_ or [], cwd=Path.cwd())
    with contextlib.redirect_stdout(sys.stderr):  # what the play prints: stdout is the plan's own
        play_def = load_play(play)
        config_path = find_config(Path(play_def.file), str(config) if config else None)
        db = open_store(store, existing="folder")
        try:
            options = PlanOptions(workspace, limit, refresh_failed=refresh_failed, force_refresh=force_refresh)
            result = plan_play(play_def, payload, config_path, db, options).as_dict()
        finally:
            db.close()
    if json:
        from deepline_cli.cli.tables import print_json

        print_json(result)
        return
    _print_plan(result)


def _print_plan(plan: dict[str, Any]) -> None:
    from deepline_cli.cli.tables import print_table

    for warning in plan["warnings"]:
        typer.echo(f"warning: {warning}")
    for m in plan["maps"]:
        typer.echo(
            f"map {m['map']}: {m['input_rows']:,} rows · {m['distinct']:,} distinct keys · "
            f"{m['duplicate']:,} duplicate · {m['paid_rows']:,} already paid"
            + (f" · limit {m['limit']:,}" if m["limit"] else "")
            + _blank(m["blank_rows"])
        )
        rows = [
            (
                c["column"],
                ", ".join(f"{t} ({format_credits(each)})" for t, each in c["tools"].items()) or "-",
                f"{c['reused_cells']:,}",
                f"{c['paid_calls']:,}",
                f"{c['new_calls']:,}",
                f"{c['dependent_rows']:,}",
                _credits(c["credits"]),
            )
            for c in m["columns"]
        ]
        print_table(
            ["column", "tools (credits)", "cells reused", "paid calls", "new calls", "depends on data", "credits"],
            rows,
            empty="",
        )
        for c in m["columns"]:
            if c.get("steps") is not None:
                typer.echo(f"  {c['column']}: waterfall {' → '.join(c['steps'])}; {_hits(c['steps'], c['step_hits'])}")
            for note in c["notes"]:
                typer.echo(f"  {c['column']}: {note}")
        typer.echo(f"  expected from {m['expected_from']}")
    body = plan["body"]
    for call in body["new_calls"]:
        typer.echo(f"play body: new call to {call['tool']} ({format_credits(call['credits'])} credits)")
    if plan["stopped"]:
        typer.echo(f"not planned beyond: {plan['stopped']}")
        for tool, each in body["may_also_call"].items():
            typer.echo(f"  the play may also call {tool} ({format_credits(each)} credits each, how often is not known)")
    t = plan["totals"]
    dependent = f" (+ up to {t['dependent_calls']:,} that depend on data)" if t["dependent_calls"] else ""
    typer.echo(
        f"rows {t['rows']:,} · {t['paid_rows']:,} already paid · {t['paid_calls']:,} paid calls reused · "
        f"{t['new_calls']:,} new calls{dependent} · max {_max(t['credits'], plan['stopped'])} "
        f"(expected ≈ {_about(t['credits']['expected'])}, at least {format_credits(t['credits']['min'])})"
    )
    sys.stdout.flush()


def _blank(rows: int) -> str:
    # A blank required cell, or a line that does not fit the header (CsvSource.blank).
    return (
        f" · {rows:,} failing on their input (a blank required cell, a line that does not fit the header: "
        "nothing called)"
        if rows
        else ""
    )


def _hits(steps: list[str], hits: dict[str, int]) -> str:
    """What earlier runs' steps found, as shares of their rows."""
    total = sum(hits.values())
    if not total:
        return "no earlier run to tell how often each step finds a value"
    shares = [
        f"{name} {hits.get(name, 0) / total:.0%}" for name in [*steps, "none"] if hits.get(name) or name != "none"
    ]
    return f"earlier runs found: {', '.join(shares).replace('none', 'not found')} ({total:,} rows)"


def _credits(c: dict[str, Any]) -> str:
    if c["min"] == c["max"]:
        return format_credits(c["max"])
    high = "?" if c["max"] is None else format_credits(c["max"])
    return f"{format_credits(c['min'])} – {high} (≈ {_about(c['expected'])})"


def _about(expected: float) -> str:
    """An expected figure, to a tenth of a credit (it is a weighing, not a count)."""
    return format_credits(round(expected, 1))


def _max(c: dict[str, Any], stopped: str | None) -> str:
    """The most a run may spend, or why it is not known."""
    if c["max"] is None and stopped:
        return "unknown (the play may call more after where planning stopped)"
    if c["max"] is None:
        return "unknown (a child play: only a real run can tell what it calls)"
    return f"{format_credits(c['max'])} credits"
