"""The run's writer (runtime/calls/store_thread.py): what `commit_now` begins on the event
loop and the store holds up (another process's write lock) is handed to the writer, and
every batch's waiters hear their outcome, in order."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from functools import partial
from pathlib import Path

import pytest

from deepline_cli.runtime.calls import store_thread
from deepline_cli.runtime.calls.store_thread import StoreIO, WriteQueue
from deepline_cli.store import open_store
from deepline_cli.store.records import Claim, Settlement


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
