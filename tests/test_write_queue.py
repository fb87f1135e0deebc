"""The run's writer (runtime/calls/store_thread.py): what `commit_now` begins on the event
loop and the store holds up (another process's write lock) is handed to the writer, and
every batch's waiters hear their outcome, in order; how long calls held the loop (`Held`)."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import threading
import types
import weakref
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from deepline_cli._aio import Held
from deepline_cli.runtime.calls import store_thread
from deepline_cli.runtime.calls.store_thread import StoreIO, WriteQueue
from deepline_cli.store import open_store
from deepline_cli.store.records import Claim, Settlement
from tests.helpers import run_play


def a_claim(key: str, now: float) -> Claim:
    return Claim(
        key=key, kind="tool", label=key, tool="demo.tool", run_id="r1", attempt=1, lease_id=f"L-{key}",
        lease_expires_at=now + 60, idempotency_key=f"idem-{key}",
    )  # fmt: skip


def test_commits_a_held_up_store_keeps_waiting_are_each_delivered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two calls that held the loop end while another process holds the write lock: the
    first commit is handed to the writer after COMMIT_NOW_S, and the second is left to the
    writer too (it replaced the first, whose answers were never confirmed, nor its claims
    answered: the run hung)."""
    monkeypatch.setattr(store_thread, "COMMIT_NOW_S", 0.05)
    path = tmp_path / "store.db"
    store = open_store(str(path))
    io = StoreIO(store)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    heard: list[tuple[str, bool | BaseException]] = []

    async def two_commits() -> None:
        writes = WriteQueue(io)
        claims = [writes.claim(a_claim(key, io.now())) for key in "ab"]
        await writes.flushed()
        assert [c.result().verdict for c in claims] == ["claimed", "claimed"]
        holder.execute("BEGIN IMMEDIATE")
        threading.Timer(0.4, holder.execute, ("COMMIT",)).start()
        for key in "ab":
            # A call that held the loop 30 ms: committed at once.
            writes.settle(Settlement(key, f"L-{key}", "completed", output=key), partial(answered, key), held_s=0.03)
        await writes.flushed()

    def answered(key: str, applied: bool | BaseException) -> None:
        heard.append((key, applied))

    try:
        asyncio.run(two_commits())
    finally:
        io.close()
        holder.close()
    assert heard == [("a", True), ("b", True)]
    assert io._queued == 0  # every store call counted out: later ones may run inline again
    assert [getattr(store.get_receipt(key), "status", None) for key in "ab"] == ["completed", "completed"]
    store.close()


# --- how long a call held the loop ------------------------------------------------------------


@types.coroutine
def _generator_coroutine():  # a generator-based coroutine: awaitable, no __await__
    yield
    return "done"


class _IteratorAwaitable:  # `__await__` may return any iterator; `await` needs no send()
    def __await__(self):
        return iter([None])


@pytest.mark.parametrize("make", [_generator_coroutine, _IteratorAwaitable], ids=["types.coroutine", "iterator"])
def test_held_awaits_what_await_awaits(make: Any) -> None:
    async def plain():
        return await make()

    async def held():
        return await Held(make())

    assert asyncio.run(plain()) == asyncio.run(held())  # AttributeError under Held


def test_a_cancelled_held_leaves_no_reference_cycle() -> None:
    """`await x` cancelled frees x at once, and so does `await Held(x)`: no cycle exc ->
    traceback -> Held's frame -> exc keeps x (its frame, what it references) for the
    collector, thousands of rows at a stop."""
    gc.disable()
    try:
        refs: list[weakref.ref[Any]] = []

        async def main() -> None:
            async def inner() -> None:
                await asyncio.sleep(10)

            coro = inner()
            refs.append(weakref.ref(coro))

            async def outer(c=coro):
                return await Held(c)

            task = asyncio.create_task(outer())
            del coro
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        assert refs[0]() is None
    finally:
        gc.enable()


def test_a_step_returning_a_generator_coroutine_runs(tmp_path: Path) -> None:
    """`ctx.step` awaits whatever `await` takes: a generator-based coroutine too."""
    play = tmp_path / "play.py"
    play.write_text(
        "import types\n"
        "from deepline_cli import play\n"
        "@types.coroutine\n"
        "def legacy():\n"
        "    yield\n"
        "    return 41\n"
        "@play('legacy')\n"
        "async def legacy_play(ctx, input):\n"
        "    return await ctx.step('s', legacy)\n"
    )
    result = run_play(play, tmp_path / "deepline.db")
    assert result.status == "completed", result.error
    assert result.output == 41


NESTED = """\
import time
from deepline_cli import play, tool

@tool("review.pay")
async def pay(input):  # a sync SDK inside an async def: blocks the loop 25 ms
    time.sleep(0.025)
    return {"paid": input["id"]}

@play("nested")
async def nested(ctx, input):
    async def enrich(row, rc):
        async def body():
            return (await rc.tools.execute("pay", "review.pay", {"id": row["id"]})).output
        return await rc.step("wrap", body)
    ds = await ctx.map("rows", [{"id": str(i)} for i in range(20)], key="id", concurrency=5,
                       columns={"paid": enrich})
    return {"rows": len(ds), "failed": ds.failed_count}
"""


def test_a_step_around_a_blocking_tool_commits_once_per_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step awaiting a blocking tool: the tool's 25 ms hold was counted again in the step
    (Held times what it awaits, the tool's own `commit_now` included), and each paid call
    made two commits that held the loop. Only the hold since the last such commit counts."""
    commits: list[int] = []
    original = store_thread.WriteQueue.commit_now

    def counting(self) -> None:
        commits.append(1)
        original(self)

    monkeypatch.setattr(store_thread.WriteQueue, "commit_now", counting)
    play = tmp_path / "play.py"
    play.write_text(NESTED)
    result = run_play(play, tmp_path / "deepline.db")
    assert result.status == "completed", result.error
    assert len(commits) <= 20, f"{len(commits)} commits held the loop for 20 paid calls"
