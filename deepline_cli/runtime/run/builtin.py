"""Plays shipped with deepline: run like any other play (a run in the store, receipts,
resume), found by their `builtin:NAME` ref rather than a file.

`tools.execute` makes one call of one tool through a receipt (`deepline tools execute`).
Receipts are keyed by play name, so its receipts are its own: a play's receipts for the
same call are not reused here, nor these by a play.
"""

from __future__ import annotations

from typing import Any

from deepline_cli.runtime.run.context import Context
from deepline_cli.runtime.run.play import PlayDef, builtin, play

TOOLS_EXECUTE = "tools.execute"


@play(
    TOOLS_EXECUTE,
    description="One call of one tool, through a receipt (deepline tools execute).",
    input={"tool": str, "input": dict, "force": bool | None},
)
async def tools_execute(ctx: Context, input: dict[str, Any]) -> dict[str, Any]:
    result = await ctx.tools.execute(input["tool"], input["tool"], input["input"], force=bool(input.get("force")))
    return {
        "tool": result.tool,
        "output": result.output,
        "execution": result.execution,
        "receipt_key": result.receipt_key,
        "credits": result.credits,
    }


BUILTIN_PLAYS: dict[str, PlayDef] = {p.ref: p for p in (builtin(tools_execute),)}
