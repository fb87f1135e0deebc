"""Child plays through the real CLI (SPEC §4, §5): `ctx.run_play` by name and by path,
deterministic child run ids, receipts of finished children, governance (depth, cycles,
caps), children that suspend or fail, events routed to waiting children, and SIGKILL
while a child runs.

Every `deepline` invocation is a subprocess with a private SQLite store; waits are
polled with deadlines.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import as_json, logged, no_traceback, runs, show, wait_until

# `t.work` appends its label to the log when invoked: a replay from a receipt does not.
TOOL = """
import asyncio
import os
import time

from deepline_cli import play, tool


@tool("t.work")
def work(input):
    with open(input["log"], "a") as f:
        f.write(input["label"] + "\\n")
    return input["label"].upper()
"""

COMPOSE_PLAYS = (
    TOOL
    + """

@play("helper")
async def helper(ctx, input):
    done = await ctx.tools.execute("w", "t.work", {"label": f"helper-{input['x']}", "log": input["log"]})
    return {"helper": done.output, "run": ctx.run.id}


@play("parent")
async def parent(ctx, input):
    a = await ctx.run_play("by-name", "helper", {"x": input["x"], "log": input["log"]})
    b = await ctx.run_play("by-path", "other.py:other_fn", {"y": 2, "log": input["log"]})
    return {"a": a, "b": b}
"""
)

OTHER_PLAY = """
from deepline_cli import play, tool


@tool("t.other")
def other_tool(input):
    with open(input["log"], "a") as f:
        f.write("other\\n")
    return input["y"] * 10


@play("other")
async def other_fn(ctx, input):
    done = await ctx.tools.execute("o", "t.other", input)
    return {"other": done.output, "run": ctx.run.id}
"""

RESUME_PLAYS = (
    TOOL
    + """

@play("worker")
async def worker(ctx, input):
    done = await ctx.tools.execute("w", "t.work", {"label": input["label"], "log": input["log"]})
    return done.output


@play("boss")
async def boss(ctx, input):
    first = await ctx.run_play("first", "worker", {"label": "first", "log": input["log"]})
    go = await ctx.wait_for_event("go")
    second = await ctx.run_play("second", "worker", {"label": "second", "log": input["log"]})
    return {"first": first, "go": go, "second": second}
"""
)

CHAIN_PLAYS = """
from deepline_cli import play


async def down(ctx, input, level):
    if level < input["depth"]:
        return [f"level{level}", *await ctx.run_play("down", f"level{level + 1}", input)]
    return [f"level{level}"]


@play("level0")
async def level0(ctx, input):
    return await down(ctx, input, 0)


@play("level1")
async def level1(ctx, input):
    return await down(ctx, input, 1)


@play("level2")
async def level2(ctx, input):
    return await down(ctx, input, 2)


@play("level3")
async def level3(ctx, input):
    return await down(ctx, input, 3)
"""

CYCLE_PLAYS = """
from deepline_cli import play


@play("ping")
async def ping(ctx, input):
    return await ctx.run_play("call", "pong", input)


@play("pong")
async def pong(ctx, input):
    return await ctx.run_play("call", "ping", input)
"""

CAP_PLAYS = (
    TOOL
    + """

@play("kid")
async def kid(ctx, input):
    done = await ctx.tools.execute("w", "t.work", {"label": input["label"], "log": input["log"]})
    return done.output


@play("family")
async def family(ctx, input):
    own = await ctx.tools.execute("own", "t.work", {"label": "own", "log": input["log"]})
    one = await ctx.run_play("one", "kid", {"label": "kid-1", "log": input["log"]})
    two = await ctx.run_play("two", "kid", {"label": "kid-2", "log": input["log"]})
    return [own.output, one, two]
"""
)

EVENT_CHILD_PLAYS = (
    TOOL
    + """

@play("listener")
async def listener(ctx, input):
    done = await ctx.tools.execute("w", "t.work", {"label": "listener", "log": input["log"]})
    first = await ctx.wait_for_event("first")
    second = await ctx.wait_for_event("second")
    return {"tool": done.output, "first": first, "second": second}


@play("host")
async def host(ctx, input):
    heard = await ctx.run_play("listen", "listener", {"log": input["log"]})
    return {"heard": heard}
"""
)

GATHER_PLAYS = """
import asyncio

from deepline_cli import play


@play("waiter")
async def waiter(ctx, input):
    return {input["event"]: await ctx.wait_for_event(input["event"])}


@play("fanout")
async def fanout(ctx, input):
    return await asyncio.gather(
        ctx.run_play("k1", "waiter", {"event": "e1"}),
        ctx.run_play("k2", "waiter", {"event": "e2"}),
        ctx.run_play("k3", "waiter", {"event": "e3"}),
    )
"""

SLEEPY_CHILD_PLAYS = (
    TOOL
    + """

@play("napper")
async def napper(ctx, input):
    done = await ctx.tools.execute("w", "t.work", {"label": "napper", "log": input["log"]})
    await ctx.sleep("nap", input["seconds"])
    return done.output


@play("waker")
async def waker(ctx, input):
    return await ctx.run_play("nap", "napper", input)
"""
)

FAIL_PLAYS = (
    TOOL
    + """

@play("steady")
async def steady(ctx, input):
    return (await ctx.tools.execute("w", "t.work", {"label": "steady", "log": input["log"]})).output


@play("fragile")
async def fragile(ctx, input):
    prep = await ctx.tools.execute("prep", "t.work", {"label": "fragile-prep", "log": input["log"]})
    if not os.path.exists(input["flag"]):
        raise RuntimeError("the flag file is missing")
    done = await ctx.tools.execute("finish", "t.work", {"label": "fragile-finish", "log": input["log"]})
    return [prep.output, done.output]


@play("caller")
async def caller(ctx, input):
    s = await ctx.run_play("steady", "steady", {"log": input["log"]})
    f = await ctx.run_play("fragile", "fragile", {"log": input["log"], "flag": input["flag"]})
    return {"steady": s, "fragile": f}
"""
)

# `t.block` logs that it started, then blocks until the flag file exists.
KILL_PLAYS = (
    TOOL
    + """

@tool("t.block")
def block(input):
    with open(input["log"], "a") as f:
        f.write("block\\n")
    deadline = time.time() + 60
    while not os.path.exists(input["flag"]) and time.time() < deadline:
        time.sleep(0.02)
    return "unblocked"


@play("slowkid")
async def slowkid(ctx, input):
    pre = await ctx.tools.execute("pre", "t.work", {"label": "kid-pre", "log": input["log"]})
    blocked = await ctx.tools.execute("block", "t.block", input)
    return [pre.output, blocked.output]


@play("holder")
async def holder(ctx, input):
    pre = await ctx.tools.execute("pre", "t.work", {"label": "parent-pre", "log": input["log"]})
    kid = await ctx.run_play("kid", "slowkid", input)
    return {"pre": pre.output, "kid": kid}
"""
)


# --- helpers ------------------------------------------------------------------------------


def children_of(listed: dict[str, dict[str, Any]], run_id: str) -> dict[str, dict[str, Any]]:
    """The direct children of a run, by play name."""
    found = [r for r in listed.values() if r["parent_run_id"] == run_id]
    by_play = {r["play"]: r for r in found}
    assert len(by_play) == len(found), found
    return by_play


@pytest.fixture
def plays(tmp_path: Path) -> Callable[..., Path]:
    """Write play files under tmp_path/plays (the tests run from tmp_path)."""

    def write(name: str, source: str) -> Path:
        path = tmp_path / "plays" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(source)
        return path

    return write


# --- play refs, ids, records --------------------------------------------------------------


def test_run_play_by_name_and_by_path_relative_to_the_parent_file(deepline, plays, tmp_path):
    plays("parent.py", COMPOSE_PLAYS)
    plays("other.py", OTHER_PLAY)  # next to the parent's file, not in the working directory
    log = tmp_path / "tools.log"
    result = deepline("run", "plays/parent.py:parent", "--run-id", "r-p", "--input", as_json({"x": 1, "log": str(log)}))
    assert result.code == 0, result.stderr
    output = json.loads(result.stdout)
    assert output["a"]["helper"] == "HELPER-1"
    assert output["b"]["other"] == 20
    assert sorted(logged(log)) == ["helper-1", "other"]

    listed = runs(deepline)
    kids = children_of(listed, "r-p")
    assert set(kids) == {"helper", "other"}
    for kid in kids.values():
        assert kid["root_run_id"] == "r-p"
        assert kid["status"] == "completed"
        assert kid["run_id"] != "r-p"
    assert kids["helper"]["run_id"] == output["a"]["run"]  # the child ran as its own run
    assert kids["other"]["run_id"] == output["b"]["run"]
    assert listed["r-p"]["parent_run_id"] is None
    assert listed["r-p"]["root_run_id"] == "r-p"
    assert sorted(show(deepline, "r-p")["children"]) == sorted(k["run_id"] for k in kids.values())
    assert show(deepline, kids["other"]["run_id"])["parent_run_id"] == "r-p"


def test_child_run_ids_are_deterministic(deepline, plays, tmp_path):
    plays("parent.py", COMPOSE_PLAYS)
    plays("other.py", OTHER_PLAY)
    log = str(tmp_path / "tools.log")

    def child_ids(store: str, x: int, run_id: str = "r-same") -> dict[str, str]:
        """The child run ids, as each child saw its own `ctx.run.id`."""
        result = deepline(
            "run",
            "plays/parent.py:parent",
            "--run-id",
            run_id,
            "-q",
            "--input",
            as_json({"x": x, "log": log}),
            DEEPLINE_STORE=str(tmp_path / store),
        )
        assert result.code == 0, result.stderr
        output = json.loads(result.stdout)
        return {"helper": output["a"]["run"], "other": output["b"]["run"]}

    first = child_ids("one.db", 1)
    # Same parent run id, call id, child play and input: the same child run ids.
    assert child_ids("two.db", 1) == first
    # Another input to one child: only that child's id changes.
    changed = child_ids("three.db", 5)
    assert changed["helper"] != first["helper"]
    assert changed["other"] == first["other"]
    # Another parent run: other child ids.
    elsewhere = child_ids("four.db", 1, run_id="r-other")
    assert not set(elsewhere.values()) & set(first.values())


def test_resumed_parent_never_reruns_a_finished_child(deepline, plays, tmp_path):
    plays("boss.py", RESUME_PLAYS)
    log = tmp_path / "tools.log"
    result = deepline("run", "plays/boss.py:boss", "--run-id", "r-boss", "-q", "--input", as_json({"log": str(log)}))
    assert result.code == 3, result.stderr
    assert logged(log) == ["first"]
    first = children_of(runs(deepline), "r-boss")["worker"]
    assert first["status"] == "completed"

    assert deepline("events", "send", "r-boss", "go", "--payload", '"now"').code == 0
    resumed = deepline("resume", "r-boss")
    assert resumed.code == 0, resumed.stderr
    assert json.loads(resumed.stdout) == {"first": "FIRST", "go": "now", "second": "SECOND"}
    assert logged(log) == ["first", "second"]

    listed = runs(deepline)
    assert listed[first["run_id"]]["attempt"] == 1  # the finished child did not run again
    assert listed[first["run_id"]]["updated_at"] == first["updated_at"]
    assert listed["r-boss"]["attempt"] == 2
    receipts = deepline("receipts", "inspect", "--run", "r-boss", "--json")
    assert receipts.code == 0, receipts.stderr
    kept = {(r["kind"], r["label"]): r for r in receipts.json_lines()}
    assert kept[("run_play", "first")]["status"] == "completed"
    assert kept[("run_play", "second")]["status"] == "completed"


# --- governance ---------------------------------------------------------------------------


def test_depth_cap(deepline, plays):
    plays("chain.py", CHAIN_PLAYS)
    ok = deepline("run", "plays/chain.py:level0", "--run-id", "r-d2", "--max-depth", "2", "--input", '{"depth": 2}')
    assert ok.code == 0, ok.stderr
    assert json.loads(ok.stdout) == ["level0", "level1", "level2"]
    listed = runs(deepline)
    grandchild = next(r for r in listed.values() if r["play"] == "level2")
    assert grandchild["root_run_id"] == "r-d2"
    assert listed[grandchild["parent_run_id"]]["play"] == "level1"

    deep = deepline("run", "plays/chain.py:level0", "--run-id", "r-d3", "--max-depth", "2", "--input", '{"depth": 3}')
    assert deep.code == 1, deep.stderr
    assert "'level3'" in deep.stderr and "limit is 2" in deep.stderr
    no_traceback(deep.stderr)
    shown = show(deepline, "r-d3")
    assert shown["status"] == "failed"
    assert shown["error"]["type"] == "GovernanceError"


def test_cycle_guard_names_the_cycle(deepline, plays):
    plays("cycle.py", CYCLE_PLAYS)
    result = deepline("run", "plays/cycle.py:ping", "--run-id", "r-cyc", "--input", "{}")
    assert result.code == 1, result.stderr
    assert "ping → pong → ping" in result.stderr
    assert "cycle" in result.stderr.lower()
    no_traceback(result.stderr)
    shown = show(deepline, "r-cyc")
    assert shown["status"] == "failed"
    assert shown["error"]["type"] == "GovernanceError"
    assert "ping → pong → ping" in shown["error"]["message"]


def test_max_child_plays_cap(deepline, plays, tmp_path):
    plays("caps.py", CAP_PLAYS)
    log = tmp_path / "tools.log"
    result = deepline(
        "run",
        "plays/caps.py:family",
        "--run-id",
        "r-kids",
        "--max-child-plays",
        "1",
        "--input",
        as_json({"log": str(log)}),
    )
    assert result.code == 1, result.stderr
    assert "--max-child-plays" in result.stderr
    no_traceback(result.stderr)
    assert show(deepline, "r-kids")["error"]["type"] == "GovernanceError"
    assert "kid-2" not in logged(log)

    enough = deepline(
        "run", "plays/caps.py:family", "--max-child-plays", "2", "-q", "--input", as_json({"log": str(log)})
    )
    assert enough.code == 0, enough.stderr


def test_max_tool_calls_cap_counts_the_children_too(deepline, plays, tmp_path):
    """`family` makes 3 tool calls: one itself, one in each child."""
    plays("caps.py", CAP_PLAYS)
    log = tmp_path / "tools.log"
    result = deepline(
        "run",
        "plays/caps.py:family",
        "--run-id",
        "r-tools",
        "--max-tool-calls",
        "2",
        "--input",
        as_json({"log": str(log)}),
    )
    assert result.code == 1, (result.stdout, result.stderr)
    assert "--max-tool-calls" in result.stderr
    no_traceback(result.stderr)
    assert show(deepline, "r-tools")["error"]["type"] == "GovernanceError"
    assert logged(log) == ["own", "kid-1"]


# --- children that suspend ----------------------------------------------------------------


def test_events_to_the_root_and_to_the_child_reach_a_waiting_child(deepline, plays, tmp_path):
    plays("host.py", EVENT_CHILD_PLAYS)
    log = tmp_path / "tools.log"
    result = deepline(
        "run", "plays/host.py:host", "--run-id", "r-host", "--json", "--input", as_json({"log": str(log)})
    )
    assert result.code == 3, result.stderr  # the child suspended its parent
    child = children_of(runs(deepline), "r-host")["listener"]
    child_id = child["run_id"]
    assert child["status"] == "waiting"
    assert child["root_run_id"] == "r-host"
    events = result.json_lines()
    waiting = next(e for e in events if e["event"] == "run.waiting")
    assert {(b["kind"], b["run_id"], b.get("event_id")) for b in waiting["boundaries"]} == {
        ("child", "r-host", None),
        ("event", child_id, "first"),
    }
    assert events[-1]["event"] == "run.finished" and events[-1]["status"] == "waiting"
    shown = show(deepline, "r-host")
    assert [(b["kind"], b["child_run_id"], b["status"]) for b in shown["boundaries"]] == [
        ("child", child_id, "waiting")
    ]

    # Sent to the root run id: delivered to the descendant that waits for it.
    to_root = deepline("events", "send", "r-host", "first", "--payload", '{"via":"root"}')
    assert to_root.code == 0, to_root.stderr
    assert child_id in to_root.stderr
    again = deepline("resume", "r-host")
    assert again.code == 3, again.stderr  # now waiting for "second"
    assert "'second'" in again.stderr
    resent = deepline("events", "send", child_id, "first", "--payload", "{}")  # "not waiting for it yet" said
    assert f"Run {child_id} took 'first' already" in resent.stderr, resent.stderr

    # Sent to the child run id directly.
    to_child = deepline("events", "send", child_id, "second", "--payload", '{"via":"child"}')
    assert to_child.code == 0, to_child.stderr
    done = deepline("resume", "r-host")
    assert done.code == 0, done.stderr
    assert json.loads(done.stdout) == {
        "heard": {"tool": "LISTENER", "first": {"via": "root"}, "second": {"via": "child"}}
    }
    assert logged(log) == ["listener"]  # the child's receipt replayed on each resume
    listed = runs(deepline)
    assert listed[child_id]["status"] == "completed"
    assert listed[child_id]["attempt"] == 3


APPROVAL_PLAYS = (
    TOOL
    + """

@play("vip")
async def vip(ctx, input):
    ok = await ctx.wait_for_event("approve")  # the same name as its parent's approval
    return (await ctx.tools.execute("email", "t.work", {"label": "vip", "log": input["log"]})).output if ok else None


@play("approvals")
async def approvals(ctx, input):
    await ctx.wait_for_event("approve")  # a manager approves the run
    return await ctx.run_play("vip", "vip", {"log": input["log"]})
"""
)


def test_an_event_the_root_took_itself_is_not_handed_to_its_children(deepline, plays, tmp_path):
    """A manager's approval sent to the run and taken by its own wait was taken again by
    every child play waiting later for an event of the same name: their paid calls went
    out with nobody approving them."""
    plays("approvals.py", APPROVAL_PLAYS)
    log = tmp_path / "tools.log"
    payload = as_json({"log": str(log)})
    assert deepline("run", "plays/approvals.py:approvals", "--run-id", "r-appr", "--input", payload).code == 3
    assert deepline("events", "send", "r-appr", "approve", "--payload", '{"by": "manager"}').code == 0
    resumed = deepline("resume", "r-appr")
    assert resumed.code == 3, resumed.stderr  # its child waits for its own approval
    assert logged(log) == []  # nothing paid before it
    child = children_of(runs(deepline), "r-appr")["vip"]["run_id"]
    assert deepline("events", "send", child, "approve", "--payload", "true").code == 0
    assert deepline("resume", "r-appr").code == 0
    assert logged(log) == ["vip"]


def test_a_child_resumed_on_its_own_ends_its_parents_wait_for_it(deepline, plays, tmp_path):
    """A waiting child resumed by its own id (as `events send` to it suggests) completed;
    its parent read its output but left its wait for it `waiting` for good: every later
    resume of the parent started a new attempt for it."""
    plays("host.py", EVENT_CHILD_PLAYS)
    log = tmp_path / "tools.log"
    assert deepline("run", "plays/host.py:host", "--run-id", "r-own", "--input", as_json({"log": str(log)})).code == 3
    child_id = children_of(runs(deepline), "r-own")["listener"]["run_id"]
    first = deepline("events", "send", child_id, "first", "--payload", "1")
    assert deepline("events", "send", child_id, "second", "--payload", "1").code == 0
    # The child runs inside its parent: the send names the run to resume, its root.
    assert first.code == 0 and "deepline resume r-own" in first.stderr, first.stderr
    assert f"deepline resume {child_id}" not in first.stderr, first.stderr
    alone = deepline("resume", child_id)
    assert alone.code == 0, alone.stderr
    # Resumed alone (as a person may), it says its root goes on with it: the root still waits.
    assert "deepline resume r-own" in alone.stderr, alone.stderr
    assert deepline("resume", "r-own").code == 0
    assert [(b["kind"], b["status"]) for b in show(deepline, "r-own")["boundaries"]] == [("child", "resolved")]


def test_children_suspending_together_are_all_recorded(deepline, plays):
    plays("fanout.py", GATHER_PLAYS)
    result = deepline("run", "plays/fanout.py:fanout", "--run-id", "r-fan", "--json")
    assert result.code == 3, result.stderr
    kids = {r["input"]["event"]: r for r in runs(deepline).values() if r["parent_run_id"] == "r-fan"}
    assert set(kids) == {"e1", "e2", "e3"}
    assert all(k["status"] == "waiting" for k in kids.values())

    shown = show(deepline, "r-fan")
    assert shown["status"] == "waiting"
    bounds = {b["id"]: b for b in shown["boundaries"]}
    assert set(bounds) == {"child:k1", "child:k2", "child:k3"}
    assert all(b["kind"] == "child" and b["status"] == "waiting" for b in bounds.values())
    assert {bounds[f"child:k{i}"]["child_run_id"] for i in (1, 2, 3)} == {k["run_id"] for k in kids.values()}
    waiting = next(e for e in result.json_lines() if e["event"] == "run.waiting")
    assert {b["event_id"] for b in waiting["boundaries"] if b["kind"] == "event"} == {"e1", "e2", "e3"}

    # One child can go on: the parent still waits for the others.
    assert deepline("events", "send", "r-fan", "e1", "--payload", "1").code == 0
    partial = deepline("resume", "r-fan")
    assert partial.code == 3, partial.stderr
    bounds = {b["id"]: b["status"] for b in show(deepline, "r-fan")["boundaries"]}
    assert bounds == {"child:k1": "resolved", "child:k2": "waiting", "child:k3": "waiting"}

    assert deepline("events", "send", "r-fan", "e2", "--payload", "2").code == 0
    assert deepline("events", "send", kids["e3"]["run_id"], "e3", "--payload", "3").code == 0
    done = deepline("resume", "r-fan")
    assert done.code == 0, done.stderr
    assert json.loads(done.stdout) == [{"e1": 1}, {"e2": 2}, {"e3": 3}]
    after = runs(deepline)
    assert after[kids["e1"]["run_id"]]["attempt"] == 2  # not run again after it finished
    assert all(after[k["run_id"]]["status"] == "completed" for k in kids.values())


def test_child_timer_suspends_the_parent_until_it_is_due(deepline, plays, tmp_path):
    plays("waker.py", SLEEPY_CHILD_PLAYS)
    log = tmp_path / "tools.log"
    result = deepline(
        "run",
        "plays/waker.py:waker",
        "--run-id",
        "r-wake",
        "--max-inline-wait",
        "0",
        "--input",
        as_json({"log": str(log), "seconds": 2}),
    )
    assert result.code == 3, result.stderr
    child_id = children_of(runs(deepline), "r-wake")["napper"]["run_id"]
    due = next(b["due_at"] for b in show(deepline, child_id)["boundaries"] if b["id"] == "sleep:nap")
    assert "'nap' is due at" in result.stderr

    early = deepline("resume", "r-wake")
    if time.time() < due:  # it was not due yet when the resume looked (2 s leaves ample time)
        assert early.code == 3, early.stderr
        assert "due at" in early.stderr
        assert runs(deepline)["r-wake"]["attempt"] == 1

    time.sleep(max(0.0, due - time.time()) + 0.05)
    done = deepline("resume", "r-wake")
    assert done.code == 0, done.stderr
    assert json.loads(done.stdout) == "NAPPER"
    assert logged(log) == ["napper"]
    listed = runs(deepline)
    assert listed[child_id]["status"] == "completed"
    assert listed["r-wake"]["status"] == "completed"


def test_failed_child_raises_in_the_parent_and_resume_retries_only_it(deepline, plays, tmp_path):
    plays("caller.py", FAIL_PLAYS)
    log = tmp_path / "tools.log"
    flag = tmp_path / "flag"
    payload = as_json({"log": str(log), "flag": str(flag)})
    result = deepline("run", "plays/caller.py:caller", "--run-id", "r-call", "--input", payload)
    assert result.code == 1, result.stderr
    kids = children_of(runs(deepline), "r-call")
    fragile_id = kids["fragile"]["run_id"]
    assert kids["fragile"]["status"] == "failed"
    assert kids["steady"]["status"] == "completed"
    assert "'fragile'" in result.stderr and fragile_id in result.stderr
    assert "the flag file is missing (caller.py line " in result.stderr  # where in the child's code
    no_traceback(result.stderr)
    shown = show(deepline, "r-call")
    assert shown["status"] == "failed"
    assert fragile_id in shown["error"]["message"]
    assert logged(log) == ["steady", "fragile-prep"]

    flag.touch()
    resumed = deepline("resume", "r-call")
    assert resumed.code == 0, resumed.stderr
    assert json.loads(resumed.stdout) == {"steady": "STEADY", "fragile": ["FRAGILE-PREP", "FRAGILE-FINISH"]}
    assert logged(log) == ["steady", "fragile-prep", "fragile-finish"]
    listed = runs(deepline)
    assert listed[kids["steady"]["run_id"]]["attempt"] == 1
    assert listed[fragile_id]["attempt"] == 2
    assert listed[fragile_id]["status"] == "completed"


# --- SIGKILL while a child runs -----------------------------------------------------------


def start_blocked(
    spawn: Callable[..., Any], plays: Callable[..., Path], tmp_path: Path, run_id: str, **env: str
) -> Any:
    plays("holder.py", KILL_PLAYS)
    log, flag = tmp_path / "tools.log", tmp_path / "flag"
    proc = spawn(
        "run",
        "plays/holder.py:holder",
        "--run-id",
        run_id,
        "--json",
        "--input",
        as_json({"log": str(log), "flag": str(flag)}),
        **env,
    )
    wait_until(lambda: "block" in logged(log), what="the child's blocking tool to start")
    return proc, log, flag


def test_running_child_of_a_live_parent_is_not_stale(deepline, plays, tmp_path, spawn):
    proc, _, flag = start_blocked(spawn, plays, tmp_path, "r-live")
    try:
        listed = runs(deepline)
        child = children_of(listed, "r-live")["slowkid"]
        assert listed["r-live"]["status"] == "running"
        assert listed["r-live"]["stale"] is False
        assert child["status"] == "running"
        # Its parent's process is alive and executes it: not a run whose holder died.
        assert child["stale"] is False, child
    finally:
        flag.touch()
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def test_sigkill_while_a_child_runs_then_resume_takes_over(deepline, plays, tmp_path, spawn):
    # Long leases: waiting for one to expire instead of taking it over would show.
    ttl = {"DEEPLINE_LEASE_TTL": "30"}
    proc, log, flag = start_blocked(spawn, plays, tmp_path, "r-killed", **ttl)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert logged(log) == ["parent-pre", "kid-pre", "block"]

    listed = runs(deepline)
    assert listed["r-killed"]["status"] == "running"
    assert listed["r-killed"]["stale"] is True
    table = deepline("runs", "list")
    assert "stale" in table.stdout

    flag.touch()
    started = time.monotonic()
    resumed = deepline("resume", "r-killed", "--json", **ttl)
    elapsed = time.monotonic() - started
    assert resumed.code == 0, resumed.stderr  # not 4: the dead holder is taken over at once
    assert elapsed < 15.0  # no waiting for the 30 s leases (run, child receipts) to expire
    last = resumed.json_lines()[-1]
    assert last["status"] == "completed"
    assert last["output"] == {"pre": "PARENT-PRE", "kid": ["KID-PRE", "unblocked"]}
    # Completed calls are not repeated; the one in flight at the kill runs once more.
    assert logged(log) == ["parent-pre", "kid-pre", "block", "block"]
    child = children_of(runs(deepline), "r-killed")["slowkid"]
    assert child["status"] == "completed"
    assert child["attempt"] == 2


WAITING_KID = (
    TOOL
    + """

@tool("t.wait")
async def wait(input):
    with open(input["log"], "a") as f:
        f.write("wait\\n")
    while not os.path.exists(input["flag"]):
        await asyncio.sleep(0.02)
    return "done"


@play("waitkid")
async def waitkid(ctx, input):
    return (await ctx.tools.execute("wait", "t.wait", input)).output


@play("loopkid")
async def loopkid(ctx, input):
    for n in range(400):  # one call after another, until the flag is up
        await ctx.tools.execute("w", "t.work", {"label": f"loop-{n}", "log": input["log"]})
        if os.path.exists(input["flag"]):
            return "done"
        await asyncio.sleep(0.01)
    return "done"


@play("host")
async def host(ctx, input):
    return {"kid": await ctx.run_play("kid", input["kid"], input)}
"""
)


@pytest.mark.process
@pytest.mark.parametrize(
    ("kid", "started"), [("waitkid", "wait"), ("loopkid", "loop-0")], ids=["call-in-flight", "between-calls"]
)
def test_a_child_interrupted_with_its_parent_is_interrupted_too(deepline, plays, tmp_path, spawn, kid, started):
    """Ctrl-C while a child runs (a call in flight, cancelled after the grace; or between
    calls, stopped at its next one): the parent and its child are both `interrupted` (not
    the child `failed` or left `running`), and resuming the parent finishes both."""
    plays("host.py", WAITING_KID)
    log, flag = tmp_path / "tools.log", tmp_path / "flag"
    payload = as_json({"log": str(log), "flag": str(flag), "kid": kid})
    proc = spawn("run", "plays/host.py:host", "--run-id", "r-int", "--json", "--input", payload)
    wait_until(lambda: started in logged(log), what="the child's first call")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 130
    listed = runs(deepline)
    child = children_of(listed, "r-int")[kid]
    assert (listed["r-int"]["status"], child["status"]) == ("interrupted", "interrupted"), child
    assert deepline("runs", "list", "--status", "interrupted", "--json").stdout.count(child["run_id"]) == 1

    flag.touch()
    resumed = deepline("resume", "r-int", "--json")
    assert resumed.code == 0, resumed.stderr
    assert resumed.json_lines()[-1]["output"] == {"kid": "done"}
    assert children_of(runs(deepline), "r-int")[kid]["status"] == "completed"


def test_a_child_run_has_its_own_attempts_duration_and_figures(deepline, plays, tmp_path):
    """`runs show` and `runs list` of a child say what its own run did: one attempt, how
    long it took, its calls."""
    plays("host.py", WAITING_KID)
    log, flag = tmp_path / "tools.log", tmp_path / "flag"
    flag.touch()  # the loop ends after its first call
    payload = as_json({"log": str(log), "flag": str(flag), "kid": "loopkid"})
    assert deepline("run", "plays/host.py:host", "--run-id", "r-fig", "--input", payload).code == 0
    child = children_of(runs(deepline), "r-fig")["loopkid"]
    assert child["stats"]["tools"]["t.work"]["live"] == 1, child
    shown = show(deepline, child["run_id"])
    assert shown["stats"]["attempts"] == 1
    assert shown["stats"]["duration_s"] > 0
    full = json.loads(deepline("runs", "show", child["run_id"], "--full", "--json").stdout)
    assert [a["status"] for a in full["attempts"]] == ["completed"]


MAP_OF_CHILDREN_PLAYS = (
    TOOL
    + """
import asyncio

from deepline_cli import Column


@play("approval")
async def approval(ctx, input):
    return await ctx.wait_for_event("approve-" + input["d"])


async def enrich(row, rc):
    await asyncio.sleep(0.3)  # still in flight when the first child waits
    result = await rc.tools.execute("enrich", "t.work", {"label": row["d"], "log": "work.log"})
    return result.output


@play("review")
async def review(ctx, input):
    rows = await ctx.map("leads", [{"d": d} for d in "abcd"], key="d", columns={
        "enriched": enrich,
        "approved": Column(lambda row, rc: rc.run_play("approve", "approval", {"d": row["d"]}),
                           run_if=lambda row: row["d"] != "d"),
    })
    return {"rows": len(rows), "approved": [row["approved"] for row in rows]}
"""
)


def test_rows_of_a_map_waiting_on_children_all_wait_and_the_others_finish(deepline, plays, tmp_path):
    """Three rows of a map run a child that waits for an event; the fourth only calls a tool.
    The map waits for all three at once (every child recorded waiting, every boundary named),
    the rows in flight finish and are recorded, and each tool call is made once."""
    plays("review.py", MAP_OF_CHILDREN_PLAYS)
    result = deepline("run", "plays/review.py:review", "--run-id", "r-rev", "--json")
    assert result.code == 3, result.stderr
    kids = {r["input"]["d"]: r for r in runs(deepline).values() if r["parent_run_id"] == "r-rev"}
    assert set(kids) == {"a", "b", "c"} and all(k["status"] == "waiting" for k in kids.values()), kids
    waiting = next(e for e in result.json_lines() if e["event"] == "run.waiting")
    assert {b["event_id"] for b in waiting["boundaries"] if b["kind"] == "event"} == {
        "approve-a", "approve-b", "approve-c"
    }  # fmt: skip
    shown = show(deepline, "r-rev")
    assert [(m["map"], m["status"], m["succeeded"]) for m in shown["maps"]] == [("leads", "waiting", 1)], shown
    assert shown["stats"]["tools"]["t.work"]["live"] == 4  # every row's call was made, and recorded

    for d in "abc":
        assert deepline("events", "send", "r-rev", f"approve-{d}", "--payload", json.dumps(d.upper())).code == 0
    done = deepline("resume", "r-rev", "--json")
    assert done.code == 0, done.stderr
    finished = done.json_lines()[-1]
    assert finished["output"] == {"rows": 4, "approved": ["A", "B", "C", None]}
    assert sorted((tmp_path / "work.log").read_text().split()) == ["a", "b", "c", "d"]  # none paid twice
    assert finished["stats"]["tools"]["t.work"]["live"] == 4


NESTED_CREDITS = """
from deepline_cli import play, tool

@tool("c.enrich", credits=1)
def enrich(input):
    return 1

@tool("c.email", credits=2)
def email(input):
    return 2

@play("grand")
async def grand(ctx, input):
    return (await ctx.tools.execute("e", "c.email", {})).output

@play("child")
async def child(ctx, input):
    mine = (await ctx.tools.execute("e", "c.enrich", {})).output
    return mine + await ctx.run_play("g", "grand", {})

@play("top")
async def top(ctx, input):
    return await ctx.run_play("c", "child", {})
"""


def test_a_child_runs_credits_count_its_own_children_at_every_level(deepline, write_play) -> None:
    """`runs show` of a run counts the credits of its child runs, whatever its depth: the
    middle run of three spent 1 itself and 2 through its child, so 3."""
    write_play(NESTED_CREDITS)
    assert deepline("run", "play.py:top", "--run-id", "top").code == 0
    listed = {r["play"]: r for r in deepline("runs", "list", "--json").json_lines()}
    credits = {name: json.loads(deepline("runs", "show", r["run_id"], "--json").stdout)["stats"]["credits"]
               for name, r in listed.items()}  # fmt: skip
    assert credits == {"top": 3, "child": 3, "grand": 2}, credits


PILOT_OF_ACCOUNTS = """
from deepline_cli import play, tool

@tool("demo.email", credits=1)
def email(input):
    return f'{input["name"]}@{input["domain"]}'

@play("people")
async def people(ctx, input):
    rows = await ctx.map("people", [{"name": f"p{i}", "domain": input["domain"]} for i in range(5)], key="name",
                         columns={"email": lambda row, rc: rc.tools.execute("e", "demo.email", row)})
    return len(rows)

async def contacts(row, rc):
    return await rc.run_play("people", "people", {"domain": row["domain"]})

@play("accounts")
async def accounts(ctx, input):
    rows = await ctx.map("accounts", [{"domain": f"c{i}.com"} for i in range(4)], key="domain",
                         columns={"contacts": contacts})
    return sum(r["contacts"] for r in rows)
"""


def test_a_pilot_runs_each_of_its_rows_child_plays_whole(deepline, write_play) -> None:
    """`--limit 2` is a pilot of the accounts list: it ran each account's child play with the
    limit too (2 of its 5 people), and the full run then took those cut results from the sheet
    (8 people where there are 20), never asking for the others."""
    write_play(PILOT_OF_ACCOUNTS)
    pilot = deepline("run", "play.py:accounts", "--limit", "2", "--run-id", "pilot", "--json")
    assert pilot.code == 0, pilot.stderr
    assert pilot.json_lines()[-1]["output"] == 10  # two accounts, every one of their people
    full = deepline("run", "play.py:accounts", "--run-id", "full", "--json")
    assert full.code == 0, full.stderr
    assert full.json_lines()[-1]["output"] == 20


def test_a_child_run_resumed_with_its_own_budget_is_told_to_raise_its_roots(deepline, write_play) -> None:
    """A child play spends its root run's budget, yet `resume CHILD --max-credits 1000` let
    the child spend past the root's 7 (the root then blamed calls in flight for 12 spent)."""
    write_play(PILOT_OF_ACCOUNTS)
    assert deepline("run", "play.py:accounts", "--run-id", "root", "--max-credits", "7", "--quiet").code == 1
    listed = deepline("runs", "list", "--json").json_lines()
    child = next(r["run_id"] for r in listed if r["play"] == "people" and r["status"] != "completed")
    resumed = deepline("resume", child, "--max-credits", "1000")
    assert resumed.code == 2, resumed.stderr
    assert f"Run {child} is a child play of run root" in resumed.stderr, resumed.stderr
    assert "deepline resume root --max-credits 1000" in resumed.stderr, resumed.stderr
    spent = json.loads(deepline("runs", "show", "root", "--json").stdout)["stats"]["credits"]
    assert spent <= 7, spent


def test_a_pilots_credits_per_row_count_what_its_rows_child_plays_spent(deepline, write_play) -> None:
    """Each account row runs a child play that pays for 5 people in its own map: the pilot
    spent 10 credits on 2 rows, yet projected "0 credits/row" (the children's calls were
    counted under their own map's rows, not under the row that ran them)."""
    write_play(PILOT_OF_ACCOUNTS)
    pilot = deepline("run", "play.py:accounts", "--limit", "2", "--run-id", "pilot", "--json")
    assert pilot.code == 0, pilot.stderr
    finished = pilot.json_lines()[-1]
    assert finished["stats"]["credits"] == 10
    (m,) = finished["stats"]["projection"]["maps"]
    assert m["credits_per_row"]["mean"] == 5, m
    assert finished["stats"]["projection"]["credits"] == 20, finished["stats"]["projection"]


def test_a_pilots_credits_per_row_count_a_child_map_named_as_its_parents(deepline, write_play) -> None:
    """The child's own map has the parent map's name: its calls were taken for rows of the
    parent's map with the child's row keys (which none has), and the pilot said 0 a row."""
    write_play(PILOT_OF_ACCOUNTS.replace('ctx.map("people",', 'ctx.map("accounts",'))
    pilot = deepline("run", "play.py:accounts", "--limit", "2", "--run-id", "pilot", "--json")
    assert pilot.code == 0, pilot.stderr
    finished = pilot.json_lines()[-1]
    (m,) = finished["stats"]["projection"]["maps"]
    assert (finished["stats"]["credits"], m["credits_per_row"]["mean"]) == (10, 5), m


FAILING_KIDS = """
from deepline_cli import play

@play("kid")
async def kid(ctx, input):
    if input["n"] % 3 == 0:
        raise ValueError(f"no data for {input['n']}")
    return input["n"] * 2

@play("mom")
async def mom(ctx, input):
    rows = await ctx.map("m", [{"n": n} for n in range(6)], key="n",
                         columns={"k": lambda row, rc: rc.run_play("kid", "kid", {"n": row["n"]})})
    return {"failed": rows.failed_count}
"""


def test_a_failed_child_play_is_counted_among_the_failed_calls(deepline, write_play):
    """Two of six child plays failed (their rows failed, their runs say so): the parent's
    `ctx.run_play` line said `live 4 failed 0`, live and in `runs show`. Counted failed
    (the call is still given back: a resume runs the child again)."""
    write_play(FAILING_KIDS)
    done = deepline("run", "play.py:mom", "--run-id", "kf", "--json")
    assert done.code == 0, done.stderr
    finished = done.json_lines()[-1]
    assert finished["output"] == {"failed": 2}
    live = finished["stats"]["tools"]["ctx.run_play"]
    assert (live["live"], live["failed"]) == (4, 2), live
    stored = show(deepline, "kf")["stats"]["tools"]["ctx.run_play"]
    assert (stored["live"], stored["failed"]) == (4, 2), stored


def test_a_child_run_is_given_no_watermark_of_its_parents_attempts() -> None:
    """A refresh flag kept from a parent's attempt N asks again the parent's own failures of
    attempts before N; N counts the parent's attempts, not the child's. A child compared its
    own attempts with it (lower, when a parent attempt never reached it) and asked again
    failures it had refreshed already under that flag."""
    from dataclasses import replace

    from deepline_cli.runtime.calls.identity import Identity

    kept = Identity(run_id="p", attempt=4, play="parent", workspace="default", lease_ttl=30, refresh_own_before=3)
    given = replace(kept, refresh_own_before=None)

    assert kept.child("c", 3, "child", "child.py").refresh_own_before == 0  # none of its own
    assert given.child("c", 3, "child", "child.py").refresh_own_before is None  # its earlier attempts'
