"""What the commands show a person hides nothing: every failed row of a run, a receipt's
key, input and output, credits written with thousands separators."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from deepline_cli._format import format_credits
from tests.conftest import Result

Run = Callable[..., Result]


def test_credits_are_written_with_thousands_separators() -> None:
    assert format_credits(12345.5) == "12,345.5"
    assert format_credits(1234567.5) == "1,234,567.5"  # never 1.23457e+06
    assert format_credits(1_000_000) == "1,000,000"
    assert (format_credits(0.5), format_credits(0), format_credits(2.25)) == ("0.5", "0", "2.25")


DEAR = """
from deepline_cli import play, tool

@tool("t.dear", credits=12345.5)
def dear(input):
    return {"ok": input["n"]}

@play("dear")
async def dear_play(ctx, input):
    return (await ctx.tools.execute("dear", "t.dear", {"n": 1})).output
"""


def test_runs_show_and_the_verdict_separate_thousands(deepline: Run, write_play: Callable[..., Path]) -> None:
    write_play(DEAR)
    run = deepline("run", "play.py", "--run-id", "D")
    assert run.code == 0, run.stderr
    assert "12,345.5 credits" in run.stderr
    shown = deepline("runs", "show", "D")
    assert shown.code == 0, shown.stderr
    assert "credits   12,345.5" in shown.stdout
    assert "t.dear: live 1  reused 0  failed 0  credits 12,345.5" in shown.stdout
    assert "12345.5" not in shown.stdout
    full = deepline("runs", "show", "D", "--full")
    assert "credits 12,345.5" in full.stdout and "12345.5" not in full.stdout
    listed = deepline("receipts", "inspect", "--run", "D")
    assert "12,345.5" in listed.stdout
    budget = deepline("run", "play.py", "--run-id", "E", "--max-credits", "10000", "--force-refresh")
    assert budget.code == 1
    assert "--max-credits 10,000 would be exceeded" in budget.stderr
