"""SIGKILL in the middle of a run, then `deepline resume` (§3, §4, README "Durability").

A completed receipt is never paid for again; a call that was in flight when the process
died is repeated once, with the same provider idempotency key.
"""

from __future__ import annotations

import collections
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from deepline_cli import _json

N_CALLS = 400
CHUNK = 50

# `crash.work` logs "I RECEIPT_KEY IDEMPOTENCY_KEY ATTEMPT" when it is invoked (before
# its provider latency), so an invocation killed mid-call is counted as executed.
CRASH_PLAY = """
import asyncio

from deepline_cli import play, tool


@tool("crash.work", credits=1)
async def work(input, call):
    with open(input["log"], "a") as f:
        f.write(f"{input['i']} {call.receipt_key} {call.idempotency_key} {call.attempt}\\n")
        f.flush()
    await asyncio.sleep(input["latency"])
    return input["i"] * 3


@play("crash")
async def crash(ctx, input):
    n, chunk, total = input["n"], input["chunk"], 0
    for start in range(0, n, chunk):
        results = await asyncio.gather(
            *(
                ctx.tools.execute(
                    f"work-{i}", "crash.work", {"i": i, "log": input["log"], "latency": input["latency"]}
                )
                for i in range(start, min(n, start + chunk))
            )
        )
        total += sum(r.output for r in results)
    return {"total": total, "calls": n}
"""


def completed_keys(store: Path) -> set[str] | None:
    """Keys of completed receipts, read through a read-only connection (None: not yet)."""
    if not store.exists():
        return None
    try:
        conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=1)
    except sqlite3.OperationalError:
        return None
    try:
        rows = conn.execute("SELECT key FROM receipts WHERE status = 'completed'").fetchall()
    except sqlite3.OperationalError:  # not migrated yet, or busy
        return None
    finally:
        conn.close()
    return {row[0] for row in rows}


def invoked(log: Path) -> int:
    try:
        return log.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def kill_when(proc: subprocess.Popen[str], ready: Callable[[], bool], why: Callable[[], str]) -> None:
    """SIGKILL the run once `ready()`; it must still be running then (else `why()` says
    what it had not done yet)."""
    try:
        deadline = time.monotonic() + 30
        while not ready():
            assert proc.poll() is None, f"the run ended (exit {proc.returncode}) {why()}"
            assert time.monotonic() < deadline, f"the run was not ready to kill in 30 s: {why()}"
            time.sleep(0.002)
        proc.kill()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def count_completed(store: Path) -> int:
    if not store.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=1)
    except sqlite3.OperationalError:
        return 0
    try:
        return int(conn.execute("SELECT count(*) FROM receipts WHERE status = 'completed'").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


@pytest.mark.process
@pytest.mark.parametrize("kill_at", [100, 200, 300])
def test_sigkill_then_resume_pays_each_completed_call_once(
    deepline, cli_env, tmp_path, store_path, write_play, kill_at: int
) -> None:
    play = write_play(CRASH_PLAY, "crash.py")
    log = tmp_path / "calls.log"
    # 50 ms of provider latency per call: eight rounds of 50 calls take long enough to
    # kill the run reliably while a round is in flight.
    payload = _json.dumps_str({"n": N_CALLS, "chunk": CHUNK, "log": str(log), "latency": 0.05})
    run_id = f"crash-{kill_at}"

    with open(tmp_path / "run.out", "w") as out, open(tmp_path / "run.err", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deepline_cli", "run", str(play), "--input", payload,
             "--run-id", run_id, "--quiet"],
            cwd=tmp_path, env=cli_env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
        )  # fmt: skip

    def in_flight() -> bool:
        """`kill_at` receipts are completed and calls of the next round are in flight
        (invoked, logged, not yet completed)."""
        completed = count_completed(store_path)
        return completed >= kill_at and invoked(log) > completed

    kill_when(proc, in_flight, lambda: f"before {kill_at} calls completed: " + (tmp_path / "run.err").read_text())
    assert proc.returncode == -9, "the run finished before it could be killed"

    done_at_kill = completed_keys(store_path)
    assert done_at_kill is not None
    assert kill_at <= len(done_at_kill) < N_CALLS  # a non-trivial kill
    executed_before_resume = log.read_text().splitlines()

    resumed = deepline("resume", run_id, "--json", timeout=60)
    assert resumed.code == 0, resumed.stderr
    finished = resumed.json_lines()[-1]
    assert finished["event"] == "run.finished"
    assert finished["status"] == "completed"
    assert finished["attempt"] == 2
    assert finished["output"] == {"total": 3 * sum(range(N_CALLS)), "calls": N_CALLS}

    # Every call has a completed receipt now.
    receipts = deepline("receipts", "inspect", "--run", run_id, "--tool", "crash.work", "--json")
    assert receipts.code == 0, receipts.stderr
    by_key = {r["key"]: r for r in receipts.json_lines()}
    assert len(by_key) == N_CALLS
    assert all(r["status"] == "completed" for r in by_key.values())
    assert done_at_kill <= by_key.keys()

    executions: dict[int, list[tuple[str, str, int]]] = collections.defaultdict(list)
    for line in log.read_text().splitlines():
        i, receipt, idem, attempt = line.split()
        executions[int(i)].append((receipt, idem, int(attempt)))
    assert set(executions) == set(range(N_CALLS))  # every call was executed

    in_flight_at_kill = {int(line.split()[0]) for line in executed_before_resume} - {
        i for i, runs in executions.items() if runs[0][0] in done_at_kill
    }
    assert 0 < len(in_flight_at_kill) <= CHUNK  # killed while one round was in flight
    for i, runs in executions.items():
        keys = {receipt for receipt, _, _ in runs}
        idems = {idem for _, idem, _ in runs}
        assert len(keys) == 1, f"call {i} ran under several receipt keys: {keys}"
        (key,) = keys
        assert key in by_key
        assert idems == {by_key[key]["idempotency_key"]}, f"call {i} used idempotency keys {idems}"
        attempts = [a for _, _, a in runs]
        if key in done_at_kill:
            assert attempts == [1], f"call {i} was completed before the kill but ran in attempts {attempts}"
        elif i in in_flight_at_kill:
            # Invoked by the killed attempt, not recorded: repeated once by the resume.
            assert attempts == [1, 2], f"call {i} was in flight at the kill; ran in attempts {attempts}"
        else:
            assert attempts == [2], f"call {i} was not started before the kill; ran in attempts {attempts}"


# `crash.slow` answers after a pause as long as the file `pause` next to the log says.
SLOW_PLAY = """
import asyncio
from pathlib import Path

from deepline_cli import play, tool


@tool("crash.slow", credits=1)
async def slow(input, call):
    log = Path(input["log"])
    with log.open("a") as f:
        f.write(f"{input['i']} {call.idempotency_key}\\n")
    await asyncio.sleep(float((log.parent / "pause").read_text()))
    return input["i"]


@play("slow")
async def slow_play(ctx, input):
    rows = await ctx.map("items", [{"i": i} for i in range(input["n"])], key="i", concurrency=5, columns={
        "out": lambda row, rc: rc.tools.execute("slow", "crash.slow", {"i": row["i"], "log": input["log"]}),
    })
    return {"rows": len(rows)}
"""


@pytest.mark.process
def test_a_new_run_takes_over_at_once_the_calls_a_killed_run_held_on_this_machine(
    tmp_path: Path, cli_env: dict[str, str], deepline
) -> None:
    """A run is killed while its calls are out; the user starts the play again as a new run
    (not a resume). The calls the dead process held are taken over at once (its process is
    gone), not after their leases expire, and each is sent again under its own key."""
    play, log = tmp_path / "slow.py", tmp_path / "calls.log"
    play.write_text(SLOW_PLAY)
    (tmp_path / "pause").write_text("60")
    args = ["run", str(play), "--input", _json.dumps_str({"n": 10, "log": str(log)})]
    env = {**cli_env, "DEEPLINE_LEASE_TTL": "60"}
    proc = subprocess.Popen([sys.executable, "-m", "deepline_cli", *args], cwd=tmp_path, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    kill_when(proc, lambda: invoked(log) >= 5, lambda: "before it sent its calls")
    (tmp_path / "pause").write_text("0")
    started = time.monotonic()
    again = deepline(*args, "--json", DEEPLINE_LEASE_TTL="60")
    elapsed = time.monotonic() - started
    assert again.code == 0, again.stderr
    assert elapsed < 20, f"the new run waited {elapsed:.1f}s for the dead run's calls"
    sent: dict[str, list[str]] = collections.defaultdict(list)
    for line in log.read_text().splitlines():
        i, idem = line.split()
        sent[i].append(idem)
    assert sorted(sent, key=int) == [str(i) for i in range(10)]
    assert all(len(set(keys)) == 1 for keys in sent.values()), sent  # a call sent again keeps its key
