"""A paid call whose completion cannot be recorded fails the run, even as its last act."""

from __future__ import annotations

from pathlib import Path

from deepline_cli.errors import StoreError
from deepline_cli.runtime.calls.events import EventBus
from deepline_cli.runtime.run.options import RunOptions
from deepline_cli.runtime.run.runner import Runner
from deepline_cli.store.records import Applied, Writes
from deepline_cli.store.sqlite import SQLiteStore

PLAY = """
from deepline_cli import play, tool

@tool("breaker.end.t")
async def t(input):
    return {"paid": input["n"]}

@play("last-call")
async def last_call(ctx, input):
    result = await ctx.tools.execute("only", "breaker.end.t", {"n": 1})
    return result.output  # returns before the completion is written (write-behind)
"""


class CompletionsFail(SQLiteStore):
    """A store that takes claims but cannot record any completed call."""

    def apply(self, writes: Writes, now: float) -> Applied:
        if any(s.status == "completed" for s in writes.settlements):
            raise StoreError("disk full (simulated)")
        return super().apply(writes, now)


def test_an_unrecorded_last_completion_fails_the_run(tmp_path: Path) -> None:
    play = tmp_path / "last_call.py"
    play.write_text(PLAY)
    store = CompletionsFail(tmp_path / "store.db")
    runner = Runner(RunOptions(store=str(tmp_path / "store.db")), EventBus(), store=store)
    try:
        result = runner.start(str(play), {})
    finally:
        runner.close()
    assert result.status == "failed"
    assert result.exit_code == 1
    assert "could not be recorded" in (result.error or {}).get("message", "")
