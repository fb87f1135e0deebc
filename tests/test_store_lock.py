"""A process stopped while it holds the SQLite store's write lock (Ctrl-Z, a debugger, a
closed laptop) locks no reader out, and a command that must write says who holds the lock
and exits 2 within its timeout. A real SIGSTOPped process holds the lock."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, Result

HOLDER = """
import sys, time
from deepline_cli.runtime.run.holders import holder_id
from deepline_cli.store.records import RunRecord
from deepline_cli.store.sqlite import SQLiteStore

store = SQLiteStore(sys.argv[1])
now = store.now()
store.runs.insert_run(RunRecord(run_id="r-holder", play="hello", play_ref="x", input={}, holder=holder_id(),
                           lease_expires_at=now + 600, created_at=now, updated_at=now))
with store._write():
    print("locked", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def stopped_writer(tmp_path: Path, store_path: Path, deepline: Callable[..., Result]) -> Iterator[int]:
    """A store with a finished run in it, and a process stopped while holding its write lock."""
    done = deepline("run", str(ROOT / "examples/hello/play.py"), "--run-id", "r-done")
    assert done.code == 0, done.stderr
    script = tmp_path / "holder.py"
    script.write_text(textwrap.dedent(HOLDER))
    proc = subprocess.Popen([sys.executable, str(script), str(store_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    proc.send_signal(signal.SIGSTOP)
    try:
        yield proc.pid
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.communicate(timeout=10)


def timed(deepline: Callable[..., Result], *args: str, **env: str) -> tuple[Result, float]:
    start = time.monotonic()
    result = deepline(*args, **env)
    return result, time.monotonic() - start


def test_readers_are_not_locked_out_by_a_stopped_writer(deepline: Callable[..., Result], stopped_writer: int) -> None:
    listed, took = timed(deepline, "runs", "list", "--json")
    assert listed.code == 0, listed.stderr
    assert {row["run_id"] for row in listed.json_lines()} == {"r-done", "r-holder"}
    assert took < 5, f"runs list took {took:.1f}s"
    for args in (("runs", "show", "r-done"), ("receipts", "inspect", "--run", "r-done"), ("runs", "logs", "r-done")):
        shown, took = timed(deepline, *args)
        assert shown.code == 0 and took < 5, (args, shown.stderr, took)


def test_a_writer_says_who_holds_the_lock_and_exits_2_in_time(
    deepline: Callable[..., Result], stopped_writer: int
) -> None:
    result, took = timed(
        deepline, "run", str(ROOT / "examples/hello/play.py"), "--run-id", "r-new", DEEPLINE_SQLITE_BUSY_S="1"
    )
    assert result.code == 2, result.stderr
    assert f"locked by process {stopped_writer} on this machine" in result.stderr
    assert "running r-holder" in result.stderr and f"kill -CONT {stopped_writer}" in result.stderr
    assert "Traceback" not in result.stderr
    assert took < 10, f"took {took:.1f}s with a 1 s lock timeout"


def test_a_call_that_would_wait_for_the_lock_is_handed_over_with_nothing_written(store_path: Path) -> None:
    """The runtime runs a store call on its event loop only when SQLite can answer at once
    (`try_now`); one that would wait for another writer's lock, or for another thread using
    the connection, is handed to the store thread, and nothing of it was written."""
    import sqlite3
    import threading

    from deepline_cli.store.records import RunRecord
    from deepline_cli.store.sqlite import SQLiteStore

    store = SQLiteStore(store_path)
    try:
        store.runs.insert_run(RunRecord(run_id="r1", play="p", play_ref="x", input={}, created_at=1.0, updated_at=1.0))

        def describe(text: str) -> bool:
            return store.runs.update_run("r1", description=text)

        other = sqlite3.connect(store_path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
        try:
            assert store.try_now(lambda: describe("while locked")) == (False, None)
            done, record = store.try_now(lambda: store.runs.get_run("r1"))  # WAL: reads need no lock
            assert done and record is not None and record.description == ""
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert store.try_now(lambda: describe("after")) == (True, True)
        assert store.runs.get_run("r1").description == "after"  # type: ignore[union-attr]
        # Another thread in the middle of a call on the same connection: hand over, no wait.
        busy, release = threading.Event(), threading.Event()

        def hold() -> None:
            with store._lock:
                busy.set()
                release.wait(10)

        holder = threading.Thread(target=hold)
        holder.start()
        busy.wait(10)
        started = time.monotonic()
        assert store.try_now(lambda: describe("while busy")) == (False, None)
        assert time.monotonic() - started < 1
        release.set()
        holder.join()
        # Once it has committed, the call waits like any other (handed over, its first write
        # would be made twice); and a call outside `try_now` waits as usual afterwards.
        other = sqlite3.connect(store_path, isolation_level=None, check_same_thread=False)
        try:

            def meet_a_writer() -> None:  # another writer takes the lock, for 0.3 s
                other.execute("BEGIN IMMEDIATE")
                threading.Timer(0.3, other.execute, ("ROLLBACK",)).start()

            def commit_then_meet_a_writer() -> bool:
                describe("first")
                meet_a_writer()
                return describe("second")

            assert store.try_now(commit_then_meet_a_writer) == (True, True)
            meet_a_writer()
            assert describe("outside") is True
            assert store.runs.get_run("r1").description == "outside"  # type: ignore[union-attr]
        finally:
            other.close()
    finally:
        store.close()
