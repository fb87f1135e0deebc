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
