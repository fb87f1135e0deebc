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


def test_an_attempt_that_cannot_set_up_its_parts_is_recorded_failed_not_left_running(
    write_play, store_path, monkeypatch
) -> None:
    """Anything that fails while an attempt builds its parts (after the run is recorded as
    running) left the run `running` with its process gone: `runs list` showed it stale."""
    from deepline_cli.runtime.run import attempt
    from deepline_cli.store import open_store
    from tests.helpers import resume_run, run_play

    play = write_play(
        """
        from deepline_cli import play

        @play("setup")
        async def setup(ctx, input):
            return await ctx.step("answer", lambda: 42)
        """
    )

    def broken(*args, **kwargs):
        raise RuntimeError("cannot build the parts")

    with monkeypatch.context() as patched:
        patched.setattr(attempt, "attempt_parts", broken)
        first = run_play(play, store_path, run_id="su-1")
    assert first.status == "failed" and "cannot build the parts" in first.error["message"], first
    db = open_store(str(store_path))
    try:
        assert db.runs.get_run("su-1").status == "failed"
    finally:
        db.close()
    again = resume_run("su-1", store_path)
    assert (again.status, again.output) == ("completed", 42), again.error


def test_the_store_is_said_back_once_it_reconnects_whatever_the_call_then_does() -> None:
    """The connection dropped, a new one was made, then the call failed otherwise (a statement
    timeout): the outage was never said over, and every later call of the run waited for
    good at its dispatch."""
    from deepline_cli.errors import StoreConnectionLost
    from deepline_cli.runtime.calls.store_thread import reconnecting

    class Flaky:
        url = "postgresql://flaky/test"

        def __init__(self) -> None:
            self.calls = 0

        def reconnect(self, hurry: bool = False) -> None:
            pass

    store, heard = Flaky(), []

    def call() -> None:
        store.calls += 1
        if store.calls == 1:
            raise StoreConnectionLost("the connection dropped")
        raise StoreError("canceling statement due to statement timeout")

    try:
        reconnecting(store, call, outage=heard.append)  # type: ignore[arg-type]
    except StoreError as exc:
        assert "statement timeout" in str(exc)
    assert heard == [True, False]
