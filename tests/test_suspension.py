"""Suspension through the real CLI (SPEC §4, §5): durable sleeps, events, waiting runs,
SIGKILL while waiting inline, run lifecycle and the determinism guard.

Every `deepline` invocation is a subprocess with a private SQLite store. Waits are
computed from stored due times or polled with deadlines, never guessed.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import as_json, logged, no_traceback, runs, show, wait_until

# `t.work` appends its label to a log file when invoked, so a test can count how often a
# tool really ran (a replay from a receipt does not invoke it).
TOOL = """
from deepline_cli import play, tool


@tool("t.work")
def work(input):
    with open(input["log"], "a") as f:
        f.write(input["label"] + "\\n")
    return input["label"].upper()
"""

SLEEP_PLAY = (
    TOOL
    + """

@play("sleepy")
async def sleepy(ctx, input):
    before = await ctx.tools.execute("before", "t.work", {"label": "before", "log": input["log"]})
    await ctx.sleep("nap", input["seconds"])
    after = await ctx.tools.execute("after", "t.work", {"label": "after", "log": input["log"]})
    return {"before": before.output, "after": after.output, "attempt": ctx.run.attempt}
"""
)

EVENT_PLAY = (
    TOOL
    + """

@play("approval")
async def approval(ctx, input):
    before = await ctx.tools.execute("before", "t.work", {"label": "before", "log": input["log"]})
    payload = await ctx.wait_for_event("approve", timeout_s=input.get("timeout"))
    return {"before": before.output, "payload": payload, "attempt": ctx.run.attempt}
"""
)

# The determinism guard: STEP_ID / TOOL_LABEL / TOOL_INPUT are replaced per test.
DET_PLAY = (
    TOOL
    + """

@play("det")
async def det(ctx, input):
    first = await ctx.step("STEP_ID", lambda: "one")
    done = await ctx.tools.execute("TOOL_LABEL", "t.work", {"label": "TOOL_INPUT", "log": input["log"]})
    payload = await ctx.wait_for_event("go")
    return {"first": first, "tool": done.output, "payload": payload}
"""
)


# --- helpers ------------------------------------------------------------------------------


def boundary(shown: dict[str, Any], boundary_id: str) -> dict[str, Any]:
    found = [b for b in shown["boundaries"] if b["id"] == boundary_id]
    assert len(found) == 1, shown["boundaries"]
    return found[0]


def finished(result: Any) -> dict[str, Any]:
    events = result.json_lines()
    assert events, result.stderr
    assert events[-1]["event"] == "run.finished", events[-1]
    return events[-1]


def rewrite(path: Path, text: str) -> None:
    """Change a play file; drop cached bytecode so the next process compiles the new code."""
    path.write_text(text)
    shutil.rmtree(path.parent / "__pycache__", ignore_errors=True)


# --- ctx.sleep ----------------------------------------------------------------------------


def test_short_sleep_is_slept_inline_and_completes(deepline, write_play, tmp_path):
    write_play(SLEEP_PLAY)
    log = tmp_path / "tools.log"
    started = time.monotonic()
    result = deepline("run", "play.py", "--run-id", "r-short", "--input", as_json({"log": str(log), "seconds": 1.0}))
    elapsed = time.monotonic() - started
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout) == {"before": "BEFORE", "after": "AFTER", "attempt": 1}
    assert elapsed >= 1.0  # it really slept (default --max-inline-wait is 30 s)
    shown = show(deepline, "r-short")
    assert shown["status"] == "completed"
    assert shown["attempt"] == 1
    nap = boundary(shown, "sleep:nap")
    assert nap["kind"] == "sleep"
    assert nap["status"] == "resolved"
    assert logged(log) == ["before", "after"]
    # said while it waits, with when it ends: a run that only waits looked hung
    lines = deepline("runs", "logs", "r-short").stdout
    assert "waiting for timer 'nap' in this process: 1s, until " in lines, lines


def test_long_sleep_suspends_and_early_resume_stays_waiting(deepline, write_play, tmp_path):
    write_play(SLEEP_PLAY)
    log = tmp_path / "tools.log"
    before = time.time()
    result = deepline("run", "play.py", "--run-id", "r-long", "--input", as_json({"log": str(log), "seconds": 3600}))
    after = time.time()
    assert result.code == 3, result.stderr
    assert "waiting" in result.stderr and "nap" in result.stderr
    assert "deepline resume r-long" in result.stderr
    no_traceback(result.stderr)

    shown = show(deepline, "r-long")
    assert shown["status"] == "waiting"
    assert shown["attempt"] == 1
    nap = boundary(shown, "sleep:nap")
    assert nap["kind"] == "sleep"
    assert nap["status"] == "waiting"
    due = nap["due_at"]
    assert before + 3600 <= due <= after + 3600
    due_text = dt.datetime.fromtimestamp(due).strftime("%Y-%m-%d %H:%M:%S")
    assert due_text in result.stderr
    human = deepline("runs", "show", "r-long")
    assert human.code == 0, human.stderr
    line = next(ln for ln in human.stdout.splitlines() if "sleep:nap" in ln)
    assert "sleep" in line and "waiting" in line and due_text[:16] in line

    # Not due: resume reports the run as waiting (exit 3) and says when it is due,
    # without starting a new attempt.
    early = deepline("resume", "r-long")
    assert early.code == 3, early.stderr
    assert "due at" in early.stderr and due_text in early.stderr
    no_traceback(early.stderr)
    early_json = deepline("resume", "r-long", "--json")
    assert early_json.code == 3, early_json.stderr
    event = finished(early_json)
    assert event["status"] == "waiting"
    assert [b["due_at"] for b in event["waiting"] if b["kind"] == "sleep"] == [due]

    again = show(deepline, "r-long")
    assert again["attempt"] == 1
    assert again["status"] == "waiting"
    assert boundary(again, "sleep:nap")["due_at"] == due  # stored once, not pushed back
    assert logged(log) == ["before"]


def test_sleep_resumed_after_due_time_continues_past_it(deepline, write_play, tmp_path):
    write_play(SLEEP_PLAY)
    log = tmp_path / "tools.log"
    result = deepline(
        "run",
        "play.py",
        "--run-id",
        "r-due",
        "--max-inline-wait",
        "0",
        "--input",
        as_json({"log": str(log), "seconds": 1.5}),
    )
    assert result.code == 3, result.stderr
    due = boundary(show(deepline, "r-due"), "sleep:nap")["due_at"]
    assert logged(log) == ["before"]

    time.sleep(max(0.0, due - time.time()) + 0.05)  # computed from the stored due time
    assert time.time() > due
    # --max-inline-wait 0 is persisted: a due time recomputed on resume would suspend again.
    resumed = deepline("resume", "r-due", "--json")
    assert resumed.code == 0, resumed.stderr
    event = finished(resumed)
    assert event["status"] == "completed"
    assert event["output"] == {"before": "BEFORE", "after": "AFTER", "attempt": 2}
    assert logged(log) == ["before", "after"]  # the work before the sleep was not redone
    shown = show(deepline, "r-due")
    assert shown["status"] == "completed"
    assert shown["attempt"] == 2
    nap = boundary(shown, "sleep:nap")
    assert nap["status"] == "resolved"
    assert nap["due_at"] == due


@pytest.mark.process
def test_sigkill_while_sleeping_inline_then_resume_takes_over(deepline, write_play, tmp_path, spawn):
    """A run killed while it sleeps inline is `running` with a dead holder: `runs list`
    marks it stale, and `resume` takes it over at once (no lease wait) and sleeps only
    what is left of the stored wake-up time."""
    write_play(SLEEP_PLAY)
    log = tmp_path / "tools.log"
    seconds = 7.0
    proc = spawn(
        "run",
        "play.py",
        "--run-id",
        "r-kill",
        "--max-inline-wait",
        "60",
        "--json",
        "--input",
        as_json({"log": str(log), "seconds": seconds}),
    )

    def sleeping() -> float | None:
        result = deepline("runs", "show", "r-kill", "--json")
        if result.code != 0:
            return None
        found = [b for b in json.loads(result.stdout)["boundaries"] if b["id"] == "sleep:nap"]
        return found[0]["due_at"] if found else None

    due = wait_until(sleeping, what="the sleep boundary to be stored")
    # While its holder lives, a resume refuses the run.
    busy = deepline("resume", "r-kill")
    assert busy.code == 4, busy.stderr
    assert "held by a live process" in busy.stderr
    # Kill it three seconds into the sleep, so a due time recomputed on resume would show.
    time.sleep(max(0.0, due - seconds + 3.0 - time.time()))
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert logged(log) == ["before"]

    listed = runs(deepline)["r-kill"]
    assert listed["status"] == "running"
    assert listed["stale"] is True
    table = deepline("runs", "list")
    assert table.code == 0, table.stderr
    assert "stale" in table.stdout

    resume_started = time.time()
    resumed = deepline("resume", "r-kill", "--json")
    ended = time.time()
    assert resumed.code == 0, resumed.stderr  # not 4: the holder is gone, no lease wait
    event = finished(resumed)
    assert event["output"] == {"before": "BEFORE", "after": "AFTER", "attempt": 2}
    assert logged(log) == ["before", "after"]
    # Woke at the stored time: not earlier, and not after a full new sleep from the resume
    # (which started at least 3 s into the original sleep).
    assert due <= ended < resume_started + seconds - 1.0, (due, resume_started, ended)
    shown = show(deepline, "r-kill")
    assert shown["status"] == "completed"
    assert boundary(shown, "sleep:nap")["due_at"] == due


# --- run lifecycle ------------------------------------------------------------------------


def test_resume_of_a_completed_run_reports_it(deepline, write_play, tmp_path):
    write_play(SLEEP_PLAY)
    log = tmp_path / "tools.log"
    result = deepline("run", "play.py", "--run-id", "r-done", "--input", as_json({"log": str(log), "seconds": 0}))
    assert result.code == 0, result.stderr

    again = deepline("resume", "r-done")
    assert again.code == 0, again.stderr
    assert "already completed" in again.stderr
    assert json.loads(again.stdout) == {"before": "BEFORE", "after": "AFTER", "attempt": 1}
    as_events = deepline("resume", "r-done", "--json")
    assert as_events.code == 0, as_events.stderr
    event = finished(as_events)
    assert event["status"] == "completed"
    assert event.get("reported") is True
    assert event["attempt"] == 1
    assert logged(log) == ["before", "after"]

    unknown = deepline("resume", "r-nope")
    assert unknown.code == 2
    assert "r-nope" in unknown.stderr
    no_traceback(unknown.stderr)


# --- ctx.wait_for_event -------------------------------------------------------------------


def test_wait_for_event_suspends_send_then_resume_returns_payload(deepline, write_play, tmp_path):
    write_play(EVENT_PLAY)
    log = tmp_path / "tools.log"
    result = deepline("run", "play.py", "--run-id", "r-ev", "--json", "--input", as_json({"log": str(log)}))
    assert result.code == 3, result.stderr
    events = result.json_lines()
    waiting = [e for e in events if e["event"] == "run.waiting"]
    assert len(waiting) == 1
    assert [(b["kind"], b["event_id"]) for b in waiting[0]["boundaries"]] == [("event", "approve")]
    assert finished(result)["status"] == "waiting"
    shown = show(deepline, "r-ev")
    assert shown["status"] == "waiting"
    assert boundary(shown, "event:approve")["event_id"] == "approve"

    # Nothing delivered yet: a resume stays waiting and starts no attempt.
    early = deepline("resume", "r-ev")
    assert early.code == 3, early.stderr
    assert "deepline events send r-ev approve" in early.stderr

    sent = deepline("events", "send", "r-ev", "approve", "--payload", '{"a":1}')
    assert sent.code == 0, sent.stderr
    assert "Delivered 'approve'" in sent.stderr
    twice = deepline("events", "send", "r-ev", "approve", "--payload", '{"a":2}')
    assert twice.code == 0, twice.stderr
    assert "already delivered" in twice.stderr

    resumed = deepline("resume", "r-ev")
    assert resumed.code == 0, resumed.stderr
    # attempt 2: the early resume started no attempt of its own.
    assert json.loads(resumed.stdout) == {"before": "BEFORE", "payload": {"a": 1}, "attempt": 2}
    assert logged(log) == ["before"]

    # Past the wait: a webhook sending it again is told the run took it, as while it ran.
    late = deepline("events", "send", "r-ev", "approve")
    assert late.code == 0, late.stderr
    assert "took 'approve' already" in late.stderr, late.stderr
    # ...and that it completed: no later wait of it will come (it said to send it again then).
    assert "has completed since" in late.stderr and "later wait" not in late.stderr, late.stderr
    other = deepline("events", "send", "r-ev", "another")  # nothing in a completed run waits for it
    assert other.code == 2
    assert "has completed; nothing in it waits for events" in other.stderr


def test_events_send_errors_are_usage_errors(deepline, write_play, tmp_path):
    write_play(EVENT_PLAY)
    result = deepline("run", "play.py", "--run-id", "r-ev2", "-q", "--input", as_json({"log": str(tmp_path / "l")}))
    assert result.code == 3, result.stderr

    unknown = deepline("events", "send", "r-missing", "approve")
    assert unknown.code == 2
    assert "No run 'r-missing'" in unknown.stderr
    no_traceback(unknown.stderr)

    other = deepline("events", "send", "r-ev2", "other-event", "--payload", "{}")
    assert other.code == 0  # kept for when the run waits for it, not an error
    # a typo of the id is kept, as an event a later wait may take, and says what the run waits for
    assert "not waiting for 'other-event' yet (it waits for 'approve'); the event is kept" in other.stderr
    no_traceback(other.stderr)

    bad = deepline("events", "send", "r-ev2", "approve", "--payload", "{not json")
    assert bad.code == 2
    no_traceback(bad.stderr)
    # Neither of those delivered what it waits for.
    assert deepline("resume", "r-ev2").code == 3


def test_event_timeout_while_waiting_inline_fails_the_run(deepline, write_play, tmp_path):
    write_play(EVENT_PLAY)
    started = time.monotonic()
    result = deepline(
        "run",
        "play.py",
        "--run-id",
        "r-timeout",
        "--max-inline-wait",
        "10",
        "--input",
        as_json({"log": str(tmp_path / "l"), "timeout": 1}),
    )
    assert result.code == 1, result.stderr
    assert time.monotonic() - started >= 1.0
    assert "'approve'" in result.stderr and "did not arrive" in result.stderr
    no_traceback(result.stderr)
    shown = show(deepline, "r-timeout")
    assert shown["status"] == "failed"
    assert "'approve'" in shown["error"]["message"]


FALLBACK_PLAY = (
    TOOL
    + """
from deepline_cli.errors import DeeplineError


@play("fallback")
async def fallback(ctx, input):
    try:
        await ctx.wait_for_event("approve", timeout_s=input["timeout"])
        branch = await ctx.tools.execute("primary", "t.work", {"label": "primary", "log": input["log"]})
    except DeeplineError:
        branch = await ctx.tools.execute("fallback", "t.work", {"label": "fallback", "log": input["log"]})
    done = await ctx.wait_for_event("done")
    return {"branch": branch.output, "done": done}
"""
)


def test_a_timed_out_wait_stays_timed_out_on_resume(deepline, write_play, tmp_path):
    """A wait that timed out took the play down its other branch (paid for): a resume
    replays the timeout, so the branch is the same and nothing is paid for the other one;
    an event sent for it later is kept but taken by nothing, and the run is not shown
    waiting for it."""
    write_play(FALLBACK_PLAY)
    log = tmp_path / "l"
    first = deepline("run", "play.py", "--run-id", "fb", "--input", as_json({"log": str(log), "timeout": 0.5}))
    assert first.code == 3, first.stderr
    assert logged(log) == ["fallback"]
    waits = [b["id"] for b in show(deepline, "fb")["boundaries"] if b["status"] == "waiting"]
    assert waits == ["event:done"]
    late = deepline("events", "send", "fb", "approve", "--payload", "true")
    assert late.code == 0, late.stderr
    assert "timed out" in late.stderr
    assert deepline("events", "send", "fb", "done", "--payload", "1").code == 0
    resumed = deepline("resume", "fb", "--json")
    assert resumed.code == 0, resumed.stderr
    assert finished(resumed)["output"] == {"branch": "FALLBACK", "done": 1}
    assert logged(log) == ["fallback"]  # the primary branch never ran, the fallback not again


def test_an_event_sent_after_its_wait_timed_out_but_before_the_resume_is_not_taken(deepline, write_play, tmp_path):
    """The wait's deadline passed while the run was not running; the event came later,
    before the resume. The wait timed out at its deadline, so the resume takes the
    timeout's branch (as an inline wait would have), and `events send` says so."""
    write_play(FALLBACK_PLAY)
    log = tmp_path / "l"
    args = ("--max-inline-wait", "0", "--input", as_json({"log": str(log), "timeout": 0.5}))
    first = deepline("run", "play.py", "--run-id", "late", *args)
    assert first.code == 3, first.stderr
    (due,) = [b["due_at"] for b in show(deepline, "late")["boundaries"] if b["id"] == "event:approve"]
    due_ts = dt.datetime.fromisoformat(due).timestamp() if isinstance(due, str) else float(due)
    wait_until(lambda: time.time() > due_ts + 0.05, what="the wait's deadline to pass")
    sent = deepline("events", "send", "late", "approve", "--payload", "true")
    assert sent.code == 0, sent.stderr
    assert "timed out before it was sent" in sent.stderr, sent.stderr
    assert deepline("events", "send", "late", "done", "--payload", "1").code == 0
    resumed = deepline("resume", "late", "--json")
    assert resumed.code == 0, resumed.stderr
    assert finished(resumed)["output"] == {"branch": "FALLBACK", "done": 1}
    assert logged(log) == ["fallback"]


def test_a_flag_given_again_at_its_default_value_overrides_the_runs_start(deepline, write_play, tmp_path):
    """Started with --max-inline-wait 0, the run waits (exit 3). `resume` without the flag
    keeps 0; `resume --max-inline-wait 30` (30 is the default) was taken as not given, and
    the run exited 3 again: it now waits the second left inline and completes."""
    write_play(SLEEP_PLAY)
    log = tmp_path / "l"
    args = ("--max-inline-wait", "0", "--input", as_json({"log": str(log), "seconds": 1}))
    assert deepline("run", "play.py", "--run-id", "mi", *args).code == 3
    assert deepline("resume", "mi").code == 3  # not given: the run's own 0
    resumed = deepline("resume", "mi", "--max-inline-wait", "30")
    assert resumed.code == 0, resumed.stderr


def test_event_sent_while_the_run_waits_inline_completes_it(deepline, write_play, tmp_path, spawn):
    write_play(EVENT_PLAY)
    proc = spawn(
        "run",
        "play.py",
        "--run-id",
        "r-inline",
        "--max-inline-wait",
        "120",
        "--json",
        "--input",
        as_json({"log": str(tmp_path / "l"), "timeout": 60}),
    )

    def waiting_for_event() -> bool:
        result = deepline("runs", "show", "r-inline", "--json")
        if result.code != 0:
            return False
        return any(
            b["id"] == "event:approve" and b["status"] == "waiting" for b in json.loads(result.stdout)["boundaries"]
        )

    wait_until(waiting_for_event, what="the run to wait for 'approve'")
    assert proc.poll() is None
    sent = deepline("events", "send", "r-inline", "approve", "--payload", '{"ok":true}')
    assert sent.code == 0, sent.stderr
    assert "the process running it takes the event" in sent.stderr, sent.stderr  # no `resume` to run
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    last = json.loads(stdout.splitlines()[-1])
    assert last["event"] == "run.finished"
    assert last["status"] == "completed"
    assert last["output"] == {"before": "BEFORE", "payload": {"ok": True}, "attempt": 1}
    assert show(deepline, "r-inline")["attempt"] == 1  # no resume was needed


# --- determinism guard --------------------------------------------------------------------


def det_source(step_id: str, tool_label: str = "tool", tool_input: str = "tool") -> str:
    return DET_PLAY.replace("STEP_ID", step_id).replace("TOOL_LABEL", tool_label).replace("TOOL_INPUT", tool_input)


def test_changed_durable_id_at_the_same_position_fails_the_resume(deepline, write_play, tmp_path):
    path = write_play(det_source("a"))
    log = tmp_path / "tools.log"
    result = deepline("run", "play.py", "--run-id", "r-det", "-q", "--input", as_json({"log": str(log)}))
    assert result.code == 3, result.stderr
    assert deepline("events", "send", "r-det", "go", "--payload", "1").code == 0

    rewrite(path, det_source("b"))
    resumed = deepline("resume", "r-det")
    assert resumed.code == 1, resumed.stderr
    assert "'step:b'" in resumed.stderr and "'step:a'" in resumed.stderr
    no_traceback(resumed.stderr)
    shown = show(deepline, "r-det")
    assert shown["status"] == "failed"
    assert shown["error"]["type"] == "DeterminismError"
    assert "'step:a'" in shown["error"]["message"] and "'step:b'" in shown["error"]["message"]

    # The old code resumes the run.
    rewrite(path, det_source("a"))
    restored = deepline("resume", "r-det")
    assert restored.code == 0, restored.stderr
    assert json.loads(restored.stdout) == {"first": "one", "tool": "TOOL", "payload": 1}
    assert logged(log) == ["tool"]


def test_changed_tool_calls_do_not_trip_the_determinism_guard(deepline, write_play, tmp_path):
    path = write_play(det_source("a", tool_label="tool", tool_input="old"))
    log = tmp_path / "tools.log"
    result = deepline("run", "play.py", "--run-id", "r-det2", "-q", "--input", as_json({"log": str(log)}))
    assert result.code == 3, result.stderr
    assert deepline("events", "send", "r-det2", "go", "--payload", '"yes"').code == 0

    # Tool calls are content-addressed: another label and input is simply another call.
    rewrite(path, det_source("a", tool_label="renamed", tool_input="new"))
    resumed = deepline("resume", "r-det2")
    assert resumed.code == 0, resumed.stderr
    assert json.loads(resumed.stdout) == {"first": "one", "tool": "NEW", "payload": "yes"}
    assert logged(log) == ["old", "new"]


# Plays that catch their children's waits: a body gathering children, and a map column.
GATHERED_PLAY = """
import asyncio
from deepline_cli import play


@play("approver")
async def approver(ctx, input):
    return {"who": input["who"], "ok": await ctx.wait_for_event(f"ok-{input['who']}")}


@play("fanout")
async def fanout(ctx, input):
    got = await asyncio.gather(*[ctx.run_play(f"a{who}", "approver", {"who": who}) for who in ("cat", "dan")],
                               return_exceptions=True)
    return {"results": [r if isinstance(r, dict) else repr(r) for r in got]}


@play("rows")
async def rows_play(ctx, input):
    async def approval(row, rc):
        got = await asyncio.gather(rc.run_play(f"a-{row['who']}", "approver", {"who": row["who"]}),
                                   return_exceptions=True)
        return repr(got[0]) if isinstance(got[0], BaseException) else got[0]["ok"]

    done = await ctx.map("people", [{"who": "cat"}, {"who": "dan"}], key="who", columns={"ok": approval})
    return [row["ok"] for row in done]
"""


def test_children_that_wait_under_gather_return_exceptions_make_the_parent_wait(deepline, write_play):
    """`asyncio.gather(..., return_exceptions=True)` hands the play the children's waits as
    results: the parent does not complete with them (its children waiting for good); it
    waits for them all, and a resume gives it their results."""
    write_play(GATHERED_PLAY)
    first = deepline("run", "play.py:fanout", "--run-id", "fan")
    assert first.code == 3, first.stderr
    assert show(deepline, "fan")["status"] == "waiting"
    for who in ("cat", "dan"):
        assert deepline("events", "send", "fan", f"ok-{who}", "--payload", "true").code == 0
    resumed = deepline("resume", "fan", "--json")
    assert resumed.code == 0, resumed.stderr
    assert finished(resumed)["output"] == {"results": [{"who": "cat", "ok": True}, {"who": "dan", "ok": True}]}


def test_a_budget_given_to_a_resume_of_a_run_not_due_yet_is_kept(deepline, write_play, tmp_path):
    """`resume RUN --max-credits 2` of a run whose sleep is not due: the run waits on, and
    the budget holds when it does go on (a later `resume` without the flag, or a worker),
    instead of being dropped without a word."""
    write_play(SLEEP_PLAY)
    payload = as_json({"log": str(tmp_path / "l"), "seconds": 30})
    assert deepline("run", "play.py", "--run-id", "nap", "--max-inline-wait", "0", "--input", payload).code == 3
    assert deepline("resume", "nap", "--max-credits", "2").code == 3
    from deepline_cli.store import open_store

    store = open_store(str(tmp_path / "deepline.db"))
    try:
        record = store.runs.get_run("nap")
    finally:
        store.close()
    assert record is not None and record.options.get("max_credits") == 2


def test_a_wait_a_column_catches_makes_its_row_wait_not_recorded_with_the_wait(deepline, write_play):
    """A column gathers a child play that waits, with return_exceptions=True: the row is
    not recorded holding the wait's repr; the run waits, and a resume gives the rows the
    children's results."""
    write_play(GATHERED_PLAY)
    first = deepline("run", "play.py:rows_play", "--run-id", "cg", "--max-inline-wait", "0")
    assert first.code == 3, first.stderr
    for who in ("cat", "dan"):
        assert deepline("events", "send", "cg", f"ok-{who}", "--payload", "true").code == 0
    resumed = deepline("resume", "cg", "--json")
    assert resumed.code == 0, resumed.stderr
    assert finished(resumed)["output"] == [True, True]


def test_an_event_sent_while_its_run_is_recorded_waiting_still_wakes_it(write_play, store_path, monkeypatch) -> None:
    """The run read that no event had come (no wake time), `events send` delivered one and
    set the run due, then the run's `waiting` record put its wake time back to none: no
    worker ever took it, its event delivered. The sender's moment, made deterministic."""
    from deepline_cli.runtime.run import attempt
    from tests.helpers import run_play

    real = attempt.next_wake

    def then_an_event_comes(store: Any, run_id: str, *args: Any) -> float | None:
        wake = real(store, run_id, *args)  # nothing came yet
        if not store.suspension.get_event(run_id, "go")[0]:
            now = store.now()  # what `deepline events send` does, at this moment
            store.suspension.send_event(run_id, "go", "yes", now)
            store.queue.set_wake(run_id, now)
        return wake

    monkeypatch.setattr(attempt, "next_wake", then_an_event_comes)
    play = write_play(
        """
        from deepline_cli import play

        @play("w")
        async def w(ctx, input):
            return await ctx.wait_for_event("go")
        """
    )
    waiting = run_play(play, store_path, run_id="ev-race")
    assert waiting.status == "waiting", waiting.error
    import sqlite3

    with sqlite3.connect(store_path) as db:
        (wake,) = db.execute("SELECT wake_at FROM runs WHERE run_id = 'ev-race'").fetchone()
    assert wake is not None and wake <= time.time(), wake  # due: a worker takes it


GATE_PLAY = """
from deepline_cli import play, tool

@tool("demo.enrich", credits=1)
def enrich(input):
    return {"domain": input["domain"]}

@play("gate")
async def gate(ctx, input):
    for d in ["a.com", "b.com", "c.com"]:
        await ctx.tools.execute(d, "demo.enrich", {"domain": d})
    return await ctx.wait_for_event("approve")
"""


def test_an_event_sent_to_a_failed_run_is_kept_for_its_resume(deepline, write_play) -> None:
    """A run that failed on its budget before its approval wait is resumable, yet `events
    send` refused the approval (exit 2: "nothing in it waits for events any more"), and the
    resume then waited for it."""
    write_play(GATE_PLAY)
    assert deepline("run", "play.py", "--run-id", "g1", "--max-credits", "2", "--quiet").code == 1
    sent = deepline("events", "send", "g1", "approve", "--payload", '"yes"')
    assert sent.code == 0, sent.stderr
    assert "the event is kept" in sent.stderr and "deepline resume g1" in sent.stderr, sent.stderr
    resumed = deepline("resume", "g1", "--max-credits", "10")
    assert resumed.code == 0, resumed.stderr
    assert json.loads(resumed.stdout) == "yes"


@pytest.mark.parametrize(
    ("status", "holder", "said"),
    [
        ("running", "nowhere:999999:x", "Run r-ev3's process is gone; continue it with: deepline resume r-ev3"),
        ("interrupted", None, "Continue the run with: deepline resume r-ev3"),
    ],
    ids=["killed-while-waiting-inline", "stopped-under-workers"],
)
def test_events_send_says_who_continues_the_run(deepline, write_play, tmp_path, store_path, status, holder, said):
    """A run killed while it waited inline was said to be taken up by "the process running
    it" (gone); one stopped (`runs stop`) under workers, by a worker (workers take waiting
    runs only): each is continued by a resume."""
    import sqlite3

    write_play(EVENT_PLAY)
    assert (
        deepline("run", "play.py", "--run-id", "r-ev3", "-q", "--input", as_json({"log": str(tmp_path / "l")})).code
        == 3
    )
    with sqlite3.connect(store_path) as db:
        db.execute("UPDATE runs SET status = ?, holder = ?, scheduled = 1, lease_expires_at = 1", (status, holder))
    sent = deepline("events", "send", "r-ev3", "approve")
    assert sent.code == 0, sent.stderr
    assert said in sent.stderr, sent.stderr
    assert "worker" not in sent.stderr and "the process running it" not in sent.stderr, sent.stderr


def test_an_event_sent_while_a_worker_looks_at_its_run_still_wakes_it(write_play, store_path, monkeypatch) -> None:
    """A worker found a waiting run listed as due but not ready yet, and wrote it a later
    wake time; an event sent between its look and that write was undone (no worker took the
    run again). The sender's moment, made deterministic."""
    import sqlite3

    from deepline_cli.runtime.run import worker
    from deepline_cli.store import open_store
    from tests.helpers import run_play

    play = write_play(
        """
        from deepline_cli import play

        @play("w")
        async def w(ctx, input):
            return await ctx.wait_for_event("go")
        """
    )
    assert run_play(play, store_path, run_id="wk-race").status == "waiting"
    with sqlite3.connect(store_path) as db:
        db.execute("UPDATE runs SET wake_at = 1 WHERE run_id = 'wk-race'")  # listed as due (a stale wake)
    real = worker.next_wake

    def then_an_event_comes(store: Any, run_id: str, *args: Any) -> float | None:
        wake = real(store, run_id, *args)  # nothing came yet
        now = store.now()  # what `deepline events send` does, at this moment
        store.suspension.send_event(run_id, "go", "yes", now)
        store.queue.set_wake(run_id, now)
        return wake

    monkeypatch.setattr(worker, "next_wake", then_an_event_comes)
    store = open_store(str(store_path))
    try:
        record = store.runs.get_run("wk-race")
        assert record is not None
        taken = worker.Worker._is_due(store, record)
        after = store.runs.get_run("wk-race")
        wake = after.wake_at if after is not None else None
    finally:
        store.close()
    assert taken or (wake is not None and wake <= time.time()), (taken, wake)  # taken now, or due for the next look


def test_enqueueing_a_waiting_run_again_reports_it_waiting(deepline, write_play, tmp_path) -> None:
    """A CI job's `run --enqueue --run-id` of a run waiting for its approval queued it again:
    a worker spent an attempt only to wait once more."""
    write_play(EVENT_PLAY)
    payload = as_json({"log": str(tmp_path / "l")})
    assert deepline("run", "play.py", "--run-id", "r-enq", "-q", "--input", payload).code == 3
    again = deepline("run", "play.py", "--enqueue", "--run-id", "r-enq", "--input", payload)
    assert again.code == 3, again.stderr
    assert "waiting" in again.stderr and "approve" in again.stderr, again.stderr
    assert show(deepline, "r-enq")["status"] == "waiting"


CTX_IN_COLUMNS = """
from deepline_cli import play

@play("p27")
async def p27(ctx, input):
    async def appr(row, rc):
        ctx.log(f"asked {row['d']}")
        if row["d"] in ("b", "c"):
            return await ctx.wait_for_event(f"ok-{row['d']}")
        return "auto"

    async def nap(row, rc):
        await ctx.sleep(f"nap-{row['d']}", 0.01)
        return await ctx.step(f"norm-{row['d']}", lambda: row["d"].upper())

    rows = await ctx.map("m", [{"d": d} for d in "abcd"], key="d", columns={"appr": appr, "nap": nap})
    return {"rows": [dict(r) for r in rows], "failed": rows.failed_count}
"""


def test_ctx_calls_in_map_columns_resume_in_any_order_of_rows(deepline, write_play):
    """`ctx.wait_for_event`, `ctx.sleep`, `ctx.step` in a column (a closure over ctx): rows
    finish in no fixed order, and a resume reached them where its earlier attempt had reached
    others. Each row failed with "the play's code changed" (it had not), kept for later runs;
    and `ctx.log` lines of resumed rows were taken for lines already written, and dropped."""
    write_play(CTX_IN_COLUMNS)
    assert deepline("run", "play.py", "--run-id", "e1", "-q").code == 3
    assert deepline("events", "send", "e1", "ok-c", "--payload", '"C"').code == 0
    assert deepline("resume", "e1", "-q").code == 3
    assert deepline("events", "send", "e1", "ok-b", "--payload", '"B"').code == 0
    done = deepline("resume", "e1", "-q")
    assert done.code == 0, done.stderr
    output = show(deepline, "e1")["output"]
    assert output["failed"] == 0, output
    assert {r["d"]: (r["appr"], r["nap"]) for r in output["rows"]} == {
        "a": ("auto", "A"), "b": ("B", "B"), "c": ("C", "C"), "d": ("auto", "D")
    }  # fmt: skip
    logs = deepline("runs", "logs", "e1", "--kind", "log", "--json").json_lines()
    asked = [line["message"] for line in logs if line["message"].startswith("asked ")]
    # As rc.log's: every line of every attempt (a, b, c, d; b and c resumed; b again).
    assert sorted(asked) == ["asked a", "asked b", "asked b", "asked b", "asked c", "asked c", "asked d"], asked


ORDER_PLAY = """
import os
from deepline_cli import play

@play("p10")
async def p10(ctx, input):
    out = {}
    domains = ["acme.com", "globex.com"]
    for d in (reversed(domains) if os.environ.get("P10_REVERSED") else domains):  # a set's order, say
        out[d] = await ctx.step(f"norm-{d}", lambda: d.upper())
        ctx.log(f"normalised {d}")
        await ctx.wait_for_event(f"ok-{d}")
    return out
"""


def test_a_resume_of_unchanged_code_reaching_its_calls_in_another_order_goes_on(
    deepline, write_play, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A play looping over a set reaches its durable calls in the order of the process's
    hash seed: the resume failed, at random, as if the play's code had changed (it had not).
    Ids name the calls; only changed code is held to the order it reached them in before.
    Its log lines were keyed by position: one was written twice, another never."""
    write_play(ORDER_PLAY)
    assert deepline("run", "play.py", "--run-id", "s1", "-q").code == 3
    assert deepline("events", "send", "s1", "ok-acme.com").code == 0
    monkeypatch.setenv("P10_REVERSED", "1")
    resumed = deepline("resume", "s1", "-q")
    assert resumed.code == 3, resumed.stderr  # now waits for ok-globex.com, not failed
    assert deepline("events", "send", "s1", "ok-globex.com").code == 0
    done = deepline("resume", "s1", "-q")
    assert done.code == 0, done.stderr
    assert show(deepline, "s1")["output"] == {"globex.com": "GLOBEX.COM", "acme.com": "ACME.COM"}
    # Each line once: a line's place is the call before it, not its position in the order.
    logs = deepline("runs", "logs", "s1", "--kind", "log", "--json").json_lines()
    assert sorted(line["message"] for line in logs) == ["normalised acme.com", "normalised globex.com"], logs


KID_IN_A_ROW = """
from deepline_cli import play

@play("kid")
async def kid(ctx, input):
    ctx.log(f"kid {input['n']} before")
    v = await ctx.step("STEP_ID", lambda: 1)
    got = await ctx.wait_for_event("go")
    return [v, got]

@play("mom")
async def mom(ctx, input):
    rows = await ctx.map("m", [{"n": input["n"]}], key="n",
                         columns={"k": lambda row, rc: rc.run_play("kid", "kid", {"n": row["n"]})})
    return {"failed": rows.failed_count, "rows": [dict(r) for r in rows]}
"""


def test_a_child_play_run_from_a_map_row_keeps_its_own_order(deepline, write_play):
    """A map row's ctx calls are out of the order check, but a child play it runs in this
    process is a run of its own: its log lines are written once, and its changed code is
    told on resume as a root's is."""
    path = write_play(KID_IN_A_ROW.replace("STEP_ID", "a"))
    assert deepline("run", "play.py:mom", "--run-id", "m1", "-q", "--set", "n=1").code == 3
    [kid] = [r for r in runs(deepline).values() if r["parent_run_id"] == "m1"]
    assert deepline("events", "send", kid["run_id"], "go", "--payload", '"GO"').code == 0
    assert deepline("resume", "m1", "-q").code == 0
    logs = deepline("runs", "logs", kid["run_id"], "--kind", "log", "--json").json_lines()
    assert [line["message"] for line in logs] == ["kid 1 before"], logs

    path.write_text(KID_IN_A_ROW.replace("STEP_ID", "a"))
    assert deepline("run", "play.py:mom", "--run-id", "m2", "-q", "--set", "n=2").code == 3
    path.write_text(KID_IN_A_ROW.replace("STEP_ID", "b"))  # the child's code changed
    [kid] = [r for r in runs(deepline).values() if r["parent_run_id"] == "m2"]
    assert deepline("events", "send", kid["run_id"], "go", "--payload", '"GO"').code == 0
    deepline("resume", "m2", "-q")
    [kid] = [r for r in runs(deepline).values() if r["parent_run_id"] == "m2"]
    assert kid["status"] == "failed" and "'step:b'" in kid["error"]["message"], kid


def test_a_changed_helper_module_is_changed_code(deepline, write_play, tmp_path):
    """The play file is the same, a module it imports from its folder is not: the resume is
    held to the order its calls were reached in, as for a change in the play file."""
    (tmp_path / "helpers.py").write_text('STEP = "a"\n')
    write_play(
        """
        from deepline_cli import play
        from helpers import STEP

        @play("helped")
        async def helped(ctx, input):
            await ctx.step(STEP, lambda: 1)
            return await ctx.wait_for_event("go")
        """
    )
    assert deepline("run", "play.py", "--run-id", "h1", "-q").code == 3
    (tmp_path / "helpers.py").write_text('STEP = "b"\n')
    assert deepline("events", "send", "h1", "go").code == 0
    resumed = deepline("resume", "h1", "-q")
    assert resumed.code == 1 and "'step:b'" in resumed.stderr, resumed.stderr


def test_a_run_whose_log_lines_an_earlier_deepline_keyed_by_position_writes_them_once(
    deepline, write_play, store_path
) -> None:
    """An earlier deepline keyed a log line by its position (`1.1`: the first line after the
    first durable call). Resumed after an upgrade, every line was written again."""
    import sqlite3

    write_play(
        """
        from deepline_cli import play

        @play("logs")
        async def logs(ctx, input):
            ctx.log("one")
            await ctx.step("s", lambda: 1)
            ctx.log("two")
            await ctx.wait_for_event("go")
            ctx.log("three")
            return "done"
        """
    )
    assert deepline("run", "play.py", "--run-id", "lg", "-q").code == 3
    conn = sqlite3.connect(store_path)  # the keys as the earlier deepline wrote them
    conn.execute("UPDATE logs SET key = '0.1' WHERE run_id = 'lg' AND message = 'one'")
    conn.execute("UPDATE logs SET key = '1.1' WHERE run_id = 'lg' AND message = 'two'")
    conn.commit()
    conn.close()
    assert deepline("events", "send", "lg", "go").code == 0
    assert deepline("resume", "lg", "-q").code == 0
    logs = deepline("runs", "logs", "lg", "--kind", "log", "--json").json_lines()
    assert [line["message"] for line in logs] == ["one", "two", "three"], logs


def test_a_timer_reached_again_under_the_same_id_is_warned_of(deepline, write_play):
    """`for i in range(3): await ctx.sleep("cooldown", 0.01)`: one id names one timer; the
    second and third returned at once, silently."""
    write_play(
        """
        from deepline_cli import play

        @play("loop")
        async def loop(ctx, input):
            for i in range(3):
                await ctx.sleep("cooldown", 0.01)
            return "done"
        """
    )
    done = deepline("run", "play.py", "--run-id", "lp")
    assert done.code == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if "ctx.sleep('cooldown') was reached again" in line]
    assert len(warned) == 1, done.stderr
    assert 'f"cooldown-{i}"' in warned[0], warned


REFRESHED_WHILE_WAITING = """
from deepline_cli import play, tool

@tool("waits.lookup")
def lookup(input):
    with open(input["log"], "a") as f:
        f.write(str(input["i"]) + "\\n")
    raise ValueError("no such company")

@play("waits")
async def waits(ctx, input):
    rows = await ctx.map("m", [{"i": i} for i in range(3)], key="i", columns={
        "v": lambda row, rc: rc.tools.execute("l", "waits.lookup", {"i": row["i"], "log": input["log"]}),
    })
    await ctx.sleep("first", 0.2)
    await ctx.sleep("second", 0.2)
    return {"failed": rows.failed_count}
"""


def test_a_refresh_given_to_a_waiting_runs_resume_is_made_once(deepline, write_play, tmp_path):
    """Resuming a waiting run worked the refresh flags out after the run's own were copied in:
    a flag kept from an earlier resume counted as given, and each wake asked the run's failed
    calls again (three times here, not twice)."""
    write_play(REFRESHED_WHILE_WAITING)
    log = tmp_path / "calls.log"
    first = deepline("run", "play.py", "--run-id", "w", "--max-inline-wait", "0", "--input", as_json({"log": str(log)}))
    assert first.code == 3, first.stderr
    time.sleep(0.25)
    refreshed = deepline("resume", "w", "--refresh-failed")
    assert refreshed.code == 3, refreshed.stderr
    time.sleep(0.25)
    done = deepline("resume", "w", "--json")

    assert done.code == 0, done.stderr
    assert finished(done)["output"] == {"failed": 3}
    assert sorted(logged(log)) == ["0", "0", "1", "1", "2", "2"]  # once, then once more refreshed


def test_an_event_sent_again_after_a_child_took_it_is_not_kept_for_the_next_child(deepline, write_play, tmp_path):
    """A retried `events send ROOT approve` (the sender did not hear back) after the child that
    waited took the first: it was kept on the root, and the next child waiting for `approve`
    took it at once and made its paid call, with no approval of its own. It is refused as
    taken; the next child waits, and an approval sent while it waits reaches it."""
    sent = tmp_path / "sent.log"
    write_play(
        f"""
        from deepline_cli import play, tool

        @tool("crm.send")
        def send(input):
            with open({str(sent)!r}, "a") as log:
                log.write(str(input["stage"]) + "\\n")
            return input["stage"]

        @play("stage")
        async def stage(ctx, input):
            got = await ctx.wait_for_event("approve")
            if input["n"] == 1:
                await ctx.wait_for_event("go")  # still at work when the approval is sent again
            await ctx.tools.execute("send", "crm.send", {{"stage": input["n"]}})
            return {{"stage": input["n"], "approval": got}}

        @play("pipeline")
        async def pipeline(ctx, input):
            return [await ctx.run_play("s1", "stage", {{"n": 1}}), await ctx.run_play("s2", "stage", {{"n": 2}})]
        """
    )
    assert deepline("run", "play.py:pipeline", "--run-id", "pp").code == 3  # stage 1 waits for its approval
    assert deepline("events", "send", "pp", "approve", "--payload", '{"delivery": "d-1"}').code == 0
    assert deepline("resume", "pp").code == 3  # stage 1 took it, and waits for "go"
    again = deepline("events", "send", "pp", "approve", "--payload", '{"delivery": "d-1"}')
    assert again.code == 0, again.stderr
    assert "took 'approve' already" in again.stderr, again.stderr
    assert deepline("events", "send", "pp", "go").code == 0
    waiting = deepline("resume", "pp")
    assert waiting.code == 3, waiting.stderr  # stage 2 waits for an approval of its own
    assert sent.read_text().split() == ["1"]
    assert deepline("events", "send", "pp", "approve", "--payload", '{"delivery": "d-2"}').code == 0
    done = deepline("resume", "pp", "--json")
    assert done.code == 0, done.stderr
    assert [s["approval"]["delivery"] for s in done.json_lines()[-1]["output"]] == ["d-1", "d-2"]
    assert sent.read_text().split() == ["1", "2"]
