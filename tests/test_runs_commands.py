"""`deepline runs tail | stop | logs | show --full`: a run followed, stopped and read from
another process through the store alone, on a SQLite file and on PostgreSQL.

The plays' tool calls wait behind a gate file the test opens, so a test knows where the
run is (two calls in flight, none finished) without sleeping for it; each call appends a
line to a file, so a test counts the real invocations (nothing paid twice).
"""

from __future__ import annotations

import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deepline_cli import _json
from deepline_cli.store import open_store
from tests.conftest import Result
from tests.helpers import logged, no_traceback, wait_until

pytestmark = pytest.mark.process
Run = Callable[..., Result]
Spawn = Callable[..., "subprocess.Popen[str]"]

GATED = """
import asyncio
import pathlib

from deepline_cli import play, tool


@tool("t.gated", credits=1)
async def gated(input):
    with open(input["calls"], "a") as calls:  # one line per real invocation
        calls.write(f"{input['n']}\\n")
    gate = pathlib.Path(input["gate"])
    while not gate.exists():
        await asyncio.sleep(0.01)
    if input["n"] == 3:
        raise ValueError("no such lead")
    return {"double": input["n"] * 2}


@play("gated")
async def gated_play(ctx, input):
    ctx.log("started", tier="gold")
    rows = await ctx.map(
        "rows", [{"n": n} for n in range(6)], key="n", concurrency=2,
        columns={"v": lambda row, rc: rc.tools.execute(
            "v", "t.gated", {"n": row["n"], "gate": input["gate"], "calls": input["calls"]})},
    )
    return {"rows": len(rows), "failed": rows.failed_count}
"""

MAP_DONE = "Map completed: 6 results (5 succeeded, 1 failed, 0 duplicate keys skipped)"


@dataclass
class Gated:
    play: Path
    calls: Path
    gate: Path

    def run_args(self, run_id: str, *more: str) -> list[str]:
        payload = _json.dumps_str({"gate": str(self.gate), "calls": str(self.calls)})
        return ["run", str(self.play), "--input", payload, "--run-id", run_id, *more]

    def open(self) -> None:
        self.gate.touch()

    def invoked(self) -> list[str]:
        return logged(self.calls)


@pytest.fixture
def gated(tmp_path: Path, write_play: Callable[..., Path]) -> Gated:
    return Gated(write_play(GATED), tmp_path / "calls.txt", tmp_path / "gate")


class Lines:
    """A background process's stdout, read line by line as it comes."""

    def __init__(self, proc: subprocess.Popen[str], *, as_json: bool = False) -> None:
        self.proc, self.as_json = proc, as_json
        self.seen: list[Any] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def _next(self, timeout: float) -> Any:
        line = self._queue.get(timeout=timeout)
        if line is None:
            return None
        item = _json.loads(line) if self.as_json else line.rstrip("\n")
        self.seen.append(item)
        return item

    def until(self, predicate: Callable[[Any], bool], what: str, timeout: float = 30) -> Any:
        try:
            while (item := self._next(timeout)) is not None:
                if predicate(item):
                    return item
        except queue.Empty:
            pass
        pytest.fail(f"no {what} in the output: {self.seen}")

    def rest(self, timeout: float = 60) -> list[Any]:
        """Everything until the process closes its stdout; then its exit code is in."""
        while self._next(timeout) is not None:
            pass
        self._pump.join(timeout)
        self.proc.wait(timeout)
        return self.seen


def stderr_of(proc: subprocess.Popen[str]) -> str:
    assert proc.stderr is not None
    return proc.stderr.read()


def store_logs(store_url: str, run_id: str, kind: str) -> list[Any]:
    store = open_store(store_url)
    try:
        return store.ledger.logs_after(run_id, 0, 100, kinds=[kind])
    finally:
        store.close()


def full(deepline: Run, run_id: str, **env: str) -> dict[str, Any]:
    shown = deepline("runs", "show", run_id, "--full", "--json", **env)
    assert shown.code == 0, shown.stderr
    return dict(_json.loads(shown.stdout))


# --- tail -----------------------------------------------------------------------------------


def test_tail_follows_a_run_another_process_executes(deepline: Run, spawn: Spawn, gated: Gated, store_url: str) -> None:
    env = {"DEEPLINE_STORE": store_url}
    run = spawn(*gated.run_args("t1", "--json"), **env)
    wait_until(lambda: len(gated.invoked()) == 2, what="two calls in flight behind the gate")
    tail = Lines(spawn("runs", "tail", "t1", "--json", **env), as_json=True)

    tail.until(lambda e: e["event"] == "log" and e["message"] == "started", "log event of the play's first line")
    progress = tail.until(lambda e: e["event"] == "map.progress", "map.progress event")
    assert run.poll() is None  # followed while it runs: its calls still wait behind the gate
    assert (progress["map"], progress["done"], progress["total"], progress["failed"]) == ("rows", 0, 6, 0)
    gated.open()
    events = tail.rest()
    own, err = run.communicate(timeout=60)

    assert (run.returncode, tail.proc.returncode) == (0, 0), err + stderr_of(tail.proc)
    logs = [e for e in events if e["event"] == "log"]
    stored = [line["id"] for line in _json_lines(deepline("runs", "logs", "t1", "--json", **env))]
    assert [e["id"] for e in logs] == stored  # every line, once, in the order written
    own_events = [_json.loads(line) for line in own.splitlines()]
    said = [(e["message"], e["kind"], e["level"]) for e in own_events if e["event"] == "log"]
    assert [(e["message"], e["kind"], e["level"]) for e in logs] == said
    assert logs[0]["fields"] == {"tier": "gold"}
    assert MAP_DONE in [e["message"] for e in logs]
    assert events[-1]["event"] == "run.finished"
    ended, own_end = dict(events[-1]), dict(own_events[-1])
    for event in (ended, own_end):
        del event["ts"]
    assert ended == own_end  # the run's own run.finished, read back from the store
    assert ended["output"] == {"rows": 6, "failed": 1}


def test_tail_follows_a_run_a_worker_executes(deepline: Run, spawn: Spawn, gated: Gated, store_url: str) -> None:
    env = {"DEEPLINE_STORE": store_url}
    queued = deepline(*gated.run_args("w1", "--enqueue"), **env)
    assert queued.code == 0, queued.stderr
    tail = Lines(spawn("runs", "tail", "w1", **env))  # before any worker: it waits for one
    worker = spawn("worker", "--once", **env)

    tail.until(lambda line: line.endswith("started  [tier=gold]"), "the play's first line")
    assert worker.poll() is None and not gated.invoked()[2:]  # live: the rows wait behind the gate
    gated.open()
    lines = tail.rest()
    worker.wait(60)

    assert tail.proc.returncode == 0, stderr_of(tail.proc)
    assert worker.returncode == 0, stderr_of(worker)
    assert sum(MAP_DONE in line for line in lines) == 1
    assert sum(line.endswith("started  [tier=gold]") for line in lines) == 1
    assert any("row 3 failed: " in line and "no such lead" in line for line in lines)
    assert lines[-2].startswith("✓ Run w1 completed")
    assert "deepline export w1 --out gated-export.csv" in lines[-1]


def test_tail_of_a_finished_run_prints_it_at_once_and_ctrl_c_ends_a_tail_quietly(
    deepline: Run, spawn: Spawn, gated: Gated
) -> None:
    running = spawn(*gated.run_args("c1", "--quiet"))
    wait_until(lambda: len(gated.invoked()) == 2, what="two calls in flight behind the gate")
    tail = Lines(spawn("runs", "tail", "c1"))
    tail.until(lambda line: "started" in line, "the play's first line")
    tail.proc.send_signal(signal.SIGINT)
    tail.rest()
    assert tail.proc.returncode == 130
    assert stderr_of(tail.proc) == ""
    assert running.poll() is None  # the run goes on: only the follower stopped

    gated.open()
    assert running.wait(60) == 0
    finished = deepline("runs", "tail", "c1")
    assert finished.code == 0, finished.stderr
    assert MAP_DONE in finished.stdout and "✓ Run c1 completed" in finished.stdout
    assert "rows done" not in finished.stdout  # no progress for a map that finished
    unknown = deepline("runs", "tail", "nope")
    assert (unknown.code, unknown.stderr.count("\n")) == (2, 1)
    assert "No run 'nope'" in unknown.stderr


# --- stop -----------------------------------------------------------------------------------


def test_stop_from_another_process_interrupts_the_run_and_resume_pays_no_call_twice(
    deepline: Run, spawn: Spawn, gated: Gated, store_url: str
) -> None:
    env = {"DEEPLINE_STORE": store_url}
    run = spawn(*gated.run_args("s1", "--quiet"), **env)
    wait_until(lambda: len(gated.invoked()) == 2, what="two calls in flight behind the gate")

    stopping = spawn("runs", "stop", "s1", "--reason", "budget review", **env)
    wait_until(lambda: store_logs(store_url, "s1", "run.interrupted"), what="the run's process to hear the stop")
    gated.open()  # the calls in flight finish; no new one starts
    said, _ = stopping.communicate(timeout=60)
    _, err = run.communicate(timeout=60)

    assert stopping.returncode == 0, stderr_of(stopping)
    assert said == "Run s1 stopped: budget review. Next: deepline resume s1\n"
    assert run.returncode == 130, err
    assert "■ Run s1 stopped (budget review) after" in err
    assert sorted(gated.invoked()) == ["0", "1"]
    stopped = full(deepline, "s1", **env)
    assert stopped["status"] == "interrupted"
    assert stopped["stop_reason"] == "budget review"
    assert stopped["error"]["message"] == "The run was stopped: budget review."
    assert [a["status"] for a in stopped["attempts"]] == ["interrupted"]
    [heard] = store_logs(store_url, "s1", "run.interrupted")
    assert (heard.fields, heard.level) == ({"reason": "budget review"}, "warning")
    assert deepline("runs", "tail", "s1", **env).code == 130

    resumed = deepline("resume", "s1", "--quiet", **env)

    assert resumed.code == 0, resumed.stderr
    assert sorted(gated.invoked()) == ["0", "1", "2", "3", "4", "5"]  # each row's call made once
    done = full(deepline, "s1", **env)
    assert (done["status"], done["stop_reason"], done["output"]) == ("completed", None, {"rows": 6, "failed": 1})
    assert [a["status"] for a in done["attempts"]] == ["interrupted", "completed"]
    assert (done["tools"]["t.gated"]["live"], done["tools"]["t.gated"]["failed"]) == (5, 1)
    once = deepline("runs", "logs", "s1", "--where", "tier=gold", **env)
    assert once.stdout.count("started") == 1  # the play body's line, written once per run


def test_stop_reaches_a_run_a_worker_executes_and_no_wait_returns_at_once(
    deepline: Run, spawn: Spawn, gated: Gated, store_url: str
) -> None:
    env = {"DEEPLINE_STORE": store_url}
    assert deepline(*gated.run_args("ws", "--enqueue"), **env).code == 0
    worker = spawn("worker", "--once", **env)
    wait_until(lambda: len(gated.invoked()) == 2, what="two calls in flight behind the gate")

    asked = deepline("runs", "stop", "ws", "--no-wait", **env)

    assert asked.code == 0, asked.stderr
    assert asked.stdout == "Asked run ws to stop; its process stops within a second or so.\n"
    wait_until(lambda: store_logs(store_url, "ws", "run.interrupted"), what="the worker to hear the stop")
    gated.open()
    assert worker.wait(60) == 0, stderr_of(worker)
    stopped = full(deepline, "ws", **env)
    assert (stopped["status"], stopped["error"]["reason"]) == ("interrupted", "stopped by user")
    assert sorted(gated.invoked()) == ["0", "1"]
    assert deepline("resume", "ws", "--quiet", **env).code == 0
    assert sorted(gated.invoked()) == ["0", "1", "2", "3", "4", "5"]


def test_stop_of_a_queued_run_interrupts_it_and_a_worker_leaves_it(deepline: Run, gated: Gated, store_url: str) -> None:
    env = {"DEEPLINE_STORE": store_url}
    assert deepline(*gated.run_args("q1", "--enqueue"), **env).code == 0

    stopped = deepline("runs", "stop", "q1", **env)

    assert stopped.code == 0, stopped.stderr
    assert stopped.stdout == "Run q1 stopped: stopped by user. Next: deepline resume q1\n"
    shown = full(deepline, "q1", **env)
    assert (shown["status"], shown["stop_reason"]) == ("interrupted", "stopped by user")
    assert shown["error"]["message"] == "The run was stopped: stopped by user."
    logged = deepline("runs", "logs", "q1", "--kind", "run.interrupted", **env)
    assert "stop requested (stopped by user): the run was queued; it ends here" in logged.stdout, logged.stdout
    worked = deepline("worker", "--once", **env)
    assert "0 started" in worked.stderr, worked.stderr
    assert gated.invoked() == []
    gated.open()
    assert deepline("resume", "q1", "--quiet", **env).code == 0
    assert sorted(gated.invoked()) == ["0", "1", "2", "3", "4", "5"]

    again = deepline("runs", "stop", "q1", **env)
    assert again.code == 2
    assert again.stderr == "Error: Run q1 already completed; nothing to stop.\n"
    unknown = deepline("runs", "stop", "nope", **env)
    assert unknown.code == 2 and unknown.stderr.startswith("Error: No run 'nope'")
    no_traceback(unknown.stderr)


WAITER = """
from deepline_cli import play

@play("waiter")
async def waiter(ctx, input):
    ctx.log("waiting for go")
    return await ctx.wait_for_event("go")
"""


def test_stop_of_a_waiting_run_interrupts_it_and_resume_continues_it(
    deepline: Run, write_play: Callable[..., Path], store_url: str
) -> None:
    env = {"DEEPLINE_STORE": store_url}
    write_play(WAITER, "waiter.py")
    assert deepline("run", "waiter.py", "--run-id", "wt1", "--quiet", **env).code == 3
    tailed = deepline("runs", "tail", "wt1", **env)
    assert tailed.code == 3 and "… Run wt1 is waiting: for event 'go'" in tailed.stdout

    stopped = deepline("runs", "stop", "wt1", "--reason", "not needed", **env)

    assert stopped.code == 0, stopped.stderr
    shown = full(deepline, "wt1", **env)
    assert (shown["status"], shown["stop_reason"]) == ("interrupted", "not needed")
    assert [b["status"] for b in shown["boundaries"]] == ["waiting"]
    logged = deepline("runs", "logs", "wt1", "--kind", "run.interrupted", "--json", **env)
    assert [line["fields"] for line in logged.json_lines()] == [{"reason": "not needed"}], logged.stdout
    again = deepline("runs", "stop", "wt1", **env)
    assert (again.code, again.stderr) == (2, "Error: Run wt1 already interrupted; nothing to stop.\n")
    assert deepline("events", "send", "wt1", "go", "--payload", '"now"', **env).code == 0
    resumed = deepline("resume", "wt1", "--quiet", **env)
    assert resumed.code == 0, resumed.stderr
    done = full(deepline, "wt1", **env)
    assert (done["status"], done["output"], done["stop_reason"]) == ("completed", "now", None)
    [boundary] = done["boundaries"]
    assert (boundary["status"], boundary["payload"]) == ("resolved", "now")
    assert boundary["resolved_at"] >= boundary["created_at"] > 0


# --- logs -----------------------------------------------------------------------------------

LOGGY = """
from deepline_cli import play


def score(row, rc):
    if row["n"] in (1, 2, 3, 4):
        raise ValueError(f"no lead {row['n']}")
    rc.log("scored", score=row["n"] * 10, hot=row["n"] == 5)
    return row["n"] * 10


@play("loggy")
async def loggy(ctx, input):
    ctx.log("started", tier="gold", batch=7)
    rows = await ctx.map("leads", [{"n": n} for n in range(6)], key="n", concurrency=1, columns={"score": score})
    ctx.log("finished")
    return rows.failed_count
"""


def _json_lines(result: Result) -> list[dict[str, Any]]:
    assert result.code == 0, result.stderr
    return result.json_lines()


def test_logs_filter_by_kind_and_fields_and_write_to_a_file(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path, store_url: str
) -> None:
    env = {"DEEPLINE_STORE": store_url}
    write_play(LOGGY, "loggy.py")
    assert deepline("run", "loggy.py", "--run-id", "L", "--quiet", **env).code == 0

    def logs(*args: str) -> list[dict[str, Any]]:
        return _json_lines(deepline("runs", "logs", "L", "--json", *args, **env))

    failed = logs("--kind", "row.failed")
    assert [f["fields"]["row_key"] for f in failed] == ["1", "2", "3", "4"]  # every one (the log names three)
    for line in failed:
        assert line["fields"]["map"] == "leads" and line["fields"]["error"].startswith("ValueError: no lead")
        assert line["message"] == f"row {line['fields']['row_key']} failed: {line['fields']['error']}"
    [omitted] = logs("--kind", "row.failed.omitted")
    assert (omitted["message"], omitted["fields"]) == (
        "1 additional row failure(s) omitted from map log",
        {"map": "leads", "omitted": 1},
    )
    [completed] = logs("--kind", "map.completed")
    assert completed["message"] == "Map completed: 6 results (2 succeeded, 4 failed, 0 duplicate keys skipped)"
    assert completed["fields"] == {"map": "leads", "total": 6, "succeeded": 2, "failed": 4, "duplicate": 0}

    assert [line["message"] for line in logs("--where", "tier=gold")] == ["started"]
    assert [line["fields"] for line in logs("--where", "batch=7")] == [{"tier": "gold", "batch": 7}]
    scored = logs("--where", "map=leads", "--where", "row_key=5")
    assert [(s["message"], s["fields"]) for s in scored] == [
        ("scored", {"map": "leads", "row_key": "5", "score": 50, "hot": True})
    ]
    assert [s["fields"]["row_key"] for s in logs("--where", "hot=true")] == ["5"]
    assert [s["kind"] for s in logs("--where", "row_key=1")] == ["row.failed"]
    assert len(logs("--where", "level=warning")) == 4
    assert logs("--where", "attempt=2") == []
    both = logs("--kind", "log", "--kind", "map.completed")
    assert [b["message"] for b in both] == ["started", "scored", "scored", completed["message"], "finished"]
    assert [b["id"] for b in both] == sorted(b["id"] for b in both)

    out = tmp_path / "warnings.txt"
    written = deepline("runs", "logs", "L", "--where", "level=warning", "--out", str(out), **env)
    assert (written.code, written.stdout) == (0, "")
    assert written.stderr == f"Wrote 4 log line(s) to {out}.\n"
    shown = deepline("runs", "logs", "L", "--where", "level=warning", **env).stdout
    assert out.read_text() == shown and shown.count("\n") == 4
    as_json = tmp_path / "started.jsonl"
    assert deepline("runs", "logs", "L", "--json", "--kind", "log", "--out", str(as_json), **env).code == 0
    assert [_json.loads(line)["message"] for line in as_json.read_text().splitlines()] == [
        "started", "scored", "scored", "finished",
    ]  # fmt: skip
    text = deepline("runs", "logs", "L", "--kind", "log", **env).stdout
    assert "info    started  [tier=gold batch=7]" in text


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--kind", "row.fail"], "--kind must be one of log, row.failed"),
        (["--where", "tier"], "--where takes FIELD=VALUE"),
        (["--where", "=gold"], "--where takes FIELD=VALUE"),
    ],
)
def test_logs_filters_a_user_gets_wrong_are_one_sentence(deepline: Run, args: list[str], says: str) -> None:
    result = deepline("runs", "logs", "whatever", *args)
    assert result.code == 2
    assert result.stderr.startswith(f"Error: {says}") and result.stderr.count("\n") == 1


def test_a_log_field_that_is_not_json_fails_the_run_in_one_sentence(
    deepline: Run, write_play: Callable[..., Path]
) -> None:
    write_play(
        """
        from deepline_cli import play

        @play("odd")
        async def odd(ctx, input):
            ctx.log("odd", seen={1, 2})
        """
    )
    result = deepline("run", "play.py", "--run-id", "odd", "--quiet")
    assert result.code != 0
    assert "Log field 'seen' is not a JSON value: a value of type set is not JSON." in result.stderr
    no_traceback(result.stderr)


# --- show --full ----------------------------------------------------------------------------

FULL = """
from deepline_cli import play, tool


@tool("t.retrying", credits=2)
def retrying(input, call):
    call.note_retry("429")
    call.note_retry("5xx")
    return {"ok": input["n"]}


@play("kid")
async def kid(ctx, input):
    return input["n"] + 1


@play("full")
async def full(ctx, input):
    await ctx.tools.execute("first", "t.retrying", {"n": 1})
    child = await ctx.run_play("kid-1", "kid", {"n": 1})
    if input.get("fail"):
        return 1 / 0
    return {"child": child, "text": "x" * 3000 + "END"}
"""


def test_show_full_says_everything_the_store_knows_untruncated(
    deepline: Run, write_play: Callable[..., Path], store_url: str
) -> None:
    env = {"DEEPLINE_STORE": store_url}
    write_play(FULL)
    assert deepline("run", "play.py:full", "--run-id", "F", "--quiet", **env).code == 0

    shown = full(deepline, "F", **env)

    assert shown["tools"]["t.retrying"] == {
        "live": 1, "reused": 0, "failed": 0, "credits": 2.0, "retries": 2,
        "retry_reasons": {"429": 1, "5xx": 1}, "recovered": 0, "kept": 0, "not_found": 0,
    }  # fmt: skip
    [attempt] = shown["attempts"]
    assert (attempt["attempt"], attempt["status"]) == (1, "completed")
    assert attempt["holder"] and attempt["ended_at"] >= attempt["started_at"]
    [child] = shown["child_runs"]
    assert (child["play"], child["status"]) == ("kid", "completed")
    assert shown["output"]["text"].endswith("END") and shown["stop_reason"] is None
    text = deepline("runs", "show", "F", "--full", **env).stdout
    assert "retries 2 (429 1, 5xx 1)" in text
    assert "attempt   #1" in text and f"child     {child['run_id']}  kid  completed" in text
    assert "END" in text
    assert "END" not in deepline("runs", "show", "F", **env).stdout  # cut at 2,000 characters

    assert deepline("run", "play.py:full", "--run-id", "X", "--input", '{"fail": true}', **env).code == 1
    broken = deepline("runs", "show", "X", "--full", **env).stdout
    assert "Traceback" in broken and "ZeroDivisionError" in broken
    assert "Traceback" not in deepline("runs", "show", "X", **env).stdout
    assert "ZeroDivisionError" in full(deepline, "X", **env)["error"]["traceback"]
