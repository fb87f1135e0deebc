"""Scale-out through the real CLI (SPEC §6, issue 6): `deepline run --enqueue`,
`deepline worker [--once] [--concurrency N]`, SIGKILL and SIGTERM of workers, receipts
shared between processes, rate limits shared between workers, NOTIFY wake-ups.

Every `deepline` invocation is a subprocess (`python -m deepline_cli`) against the
test's store (`store_url`: a SQLite file, then PostgreSQL when
DEEPLINE_TEST_POSTGRES_URL is set). Tools append to log files, so a test counts how
often a call was really paid for. Waits poll the store with deadlines; a wait for a
timer is computed from the stored due time.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deepline_cli.store import open_store
from deepline_cli.store.records import ReceiptQuery, RunRecord
from deepline_cli.store.roles import Store
from tests.helpers import is_postgres, logged, wait_until

pytestmark = pytest.mark.process  # every test here starts real worker processes

RUN_ID = re.compile(r"^r-[0-9a-f]{12}$")
LEASE_TTL = "3"

# --- plays --------------------------------------------------------------------------------

# VERSION is replaced per test: the snapshot test enqueues two versions of one file.
BASIC_PLAY = """
from deepline_cli import play, tool


@tool("w.echo")
def echo(input):
    with open(input["log"], "a") as f:
        f.write(input["label"] + "\\n")
    return input["label"].upper()


@play("basic")
async def basic(ctx, input):
    greeting = await ctx.tools.execute("greet", "w.echo", {"label": "VERSION-" + input["name"], "log": input["log"]})
    return {"version": "VERSION", "greeting": greeting.output, "attempt": ctx.run.attempt}
"""

# Five 0.1 s calls one after another; the body's wall-clock span goes in the output so a
# test can see which runs overlapped.
SEQUENCE_PLAY = """
import asyncio
import time

from deepline_cli import play, tool



@tool("w.step")
async def step(input):
    await asyncio.sleep(0.1)
    with open(input["log"], "a") as f:
        f.write(input["label"] + "\\n")
    return input["label"]


@play("sequence")
async def sequence(ctx, input):
    started = time.time()
    done = []
    for i in range(5):
        result = await ctx.tools.execute(f"s{i}", "w.step", {"label": f"{input['name']}-{i}", "log": input["log"]})
        done.append(result.output)
    return {"done": done, "span": [started, time.time()]}
"""

TOOL = """
from deepline_cli import play, tool


@tool("w.work")
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
    before = await ctx.tools.execute("before", "w.work", {"label": "before", "log": input["log"]})
    await ctx.sleep("nap", input["seconds"])
    after = await ctx.tools.execute("after", "w.work", {"label": "after", "log": input["log"]})
    return {"before": before.output, "after": after.output, "attempt": ctx.run.attempt}
"""
)

EVENT_PLAY = (
    TOOL
    + """

@play("approval")
async def approval(ctx, input):
    before = await ctx.tools.execute("before", "w.work", {"label": "before", "log": input["log"]})
    payload = await ctx.wait_for_event("approve")
    return {"before": before.output, "payload": payload, "attempt": ctx.run.attempt}
"""
)

# N slow-ish calls, at most 4 claimed at a time (the gate sits before the claim, so the
# receipts `running` at any moment are the calls really in flight). Each call appends its
# id to the log when it is paid for.
MANY_PLAY = """
import asyncio

from deepline_cli import play, tool


@tool("w.slow")
async def slow(input):
    await asyncio.sleep(0.03)
    with open(input["log"], "a") as f:
        f.write(str(input["i"]) + "\\n")
    return input["i"] * 2


@play("many")
async def many(ctx, input):
    gate = asyncio.Semaphore(4)

    async def one(i):
        async with gate:
            result = await ctx.tools.execute(f"c{i}", "w.slow", {"i": i, "log": input["log"]})
        return result.output

    outputs = await asyncio.gather(*(one(i) for i in range(input["n"])))
    return {"n": len(outputs), "sum": sum(outputs)}
"""

# Two processes, same calls: each waits for the `go` file (so both are running before
# either claims), then makes the N calls in its own shuffled order, 16 at a time.
SHARED_PLAY = """
import asyncio
import random
from pathlib import Path

from deepline_cli import play, tool


@tool("w.pay")
async def pay(input):
    await asyncio.sleep(0.02)
    with open(input["log"], "a") as f:
        f.write(str(input["i"]) + "\\n")
    return input["i"] * input["i"]


@play("shared")
async def shared(ctx, input):
    go = Path(input["go"])
    while not go.exists():
        await asyncio.sleep(0.01)
    order = list(range(input["n"]))
    random.Random(input["seed"]).shuffle(order)
    gate = asyncio.Semaphore(16)

    async def one(i):
        async with gate:
            result = await ctx.tools.execute(f"p{i}", "w.pay", {"i": i, "log": input["log"]})
        return result.output

    outputs = await asyncio.gather(*(one(i) for i in order))
    return {"n": len(outputs), "sum": sum(outputs)}
"""

# A local tool limited to 20 calls/s, shared by every process on the store. Each call
# appends its own start time; the body notes when it started.
RATED_PLAY = """
import asyncio
import time

from deepline_cli import play, tool


@tool("w.rated", rate_limit="20/s")
def rated(input):
    with open(input["log"], "a") as f:
        f.write(f"call {input['run']} {input['i']} {time.time()!r}\\n")
    return input["i"]


@play("rated")
async def rated_play(ctx, input):
    with open(input["log"], "a") as f:
        f.write(f"start {input['run']} - {time.time()!r}\\n")
    calls = [{"run": input["run"], "i": i, "log": input["log"]} for i in range(input["n"])]
    outputs = await asyncio.gather(*(ctx.tools.execute(f"r{c['i']}", "w.rated", c) for c in calls))
    return {"n": len(outputs)}
"""

# The body notes (outside any receipt) when it began, for wake-up latency.
STAMP_PLAY = """
import time

from deepline_cli import play


@play("stamp")
async def stamp(ctx, input):
    with open(input["log"], "a") as f:
        f.write(f"{ctx.run.id} {time.time()!r}\\n")
    return {"name": input["name"]}
"""

# The tool's *code* differs between versions (same id and version string): a worker must
# call the version each run was enqueued with. Both runs wait until both are loaded.
VERSIONED_TOOL_PLAY = """
import asyncio
import time
from pathlib import Path

from deepline_cli import play, tool


@tool("w.versioned")
def versioned(input):
    return "TOOLVERSION:" + input["name"]


@play("versioned")
async def versioned_play(ctx, input):
    marks = Path(input["marks"])
    (marks / ctx.run.id).write_text("loaded")
    deadline = time.monotonic() + 15
    while len(list(marks.iterdir())) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    result = await ctx.tools.execute("v", "w.versioned", {"name": input["name"]})
    return {"tool": result.output}
"""


# --- helpers ------------------------------------------------------------------------------


@dataclass
class Done:
    code: int
    stdout: str
    stderr: str


class CLI:
    """`deepline …` subprocesses against one store, from one working directory."""

    def __init__(self, store: str, cwd: Path) -> None:
        self.store = store
        self.cwd = cwd
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPLINE_")}
        self.env.update(
            DEEPLINE_LEASE_TTL=LEASE_TTL,
            DEEPLINE_STORE=store,
            PYTHONUNBUFFERED="1",
            XDG_CACHE_HOME=str(cwd / "cache"),  # snapshots land in the test's directory
        )
        self.procs: list[subprocess.Popen[bytes]] = []
        self._files: dict[int, tuple[str, Path, Path]] = {}  # pid -> (command, stdout file, stderr file)

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "deepline_cli", *args, "--store", self.store]

    def __call__(self, *args: str, timeout: float = 60) -> Done:
        proc = subprocess.run(
            self.argv(*args),
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        return Done(proc.returncode, proc.stdout, proc.stderr)

    def spawn(self, *args: str) -> subprocess.Popen[bytes]:
        """A background process; its output goes to files (read with `output`)."""
        n = len(self.procs) + 1
        out, err = self.cwd / f"proc-{n}.out", self.cwd / f"proc-{n}.err"
        with out.open("w") as stdout, err.open("w") as stderr:
            proc = subprocess.Popen(
                self.argv(*args), cwd=self.cwd, env=self.env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL
            )
        self.procs.append(proc)
        self._files[proc.pid] = (" ".join(args), out, err)
        return proc

    def output(self, proc: subprocess.Popen[bytes]) -> Done:
        _, out, err = self._files[proc.pid]
        return Done(proc.returncode if proc.returncode is not None else -1, out.read_text(), err.read_text())

    def finish(self, proc: subprocess.Popen[bytes], timeout: float = 60) -> Done:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            command = self._files[proc.pid][0]
            pytest.fail(f"deepline {command} did not finish within {timeout:g}s:\n{self.output(proc).stderr}")
        return self.output(proc)

    def enqueue(self, play: str, **input: Any) -> str:
        done = self("run", play, "--enqueue", "--input", json.dumps(input))
        assert done.code == 0, done.stderr
        run_id = done.stdout.strip()
        assert RUN_ID.match(run_id), done.stdout
        return run_id

    def worker_once(self, *args: str, timeout: float = 60) -> Done:
        done = self("worker", "--once", *args, timeout=timeout)
        assert done.code == 0, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        return done

    def runs(self) -> dict[str, dict[str, Any]]:
        done = self("runs", "list", "--json")
        assert done.code == 0, done.stderr
        return {row["run_id"]: row for row in map(json.loads, done.stdout.splitlines())}

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def cli(store_url: str, tmp_path: Path) -> Iterator[CLI]:
    runner = CLI(store_url, tmp_path)
    yield runner
    runner.close()


@pytest.fixture
def pg_cli(pg_url: str, tmp_path: Path) -> Iterator[CLI]:
    runner = CLI(pg_url, tmp_path)
    yield runner
    runner.close()


@contextmanager
def opened(url: str) -> Iterator[Store]:
    """The test's own connection to the store, to watch runs and receipts."""
    store = open_store(url)
    try:
        yield store
    finally:
        store.close()


def write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source))
    return path


def run_of(store: Store, run_id: str) -> RunRecord:
    record = store.runs.get_run(run_id)
    assert record is not None, run_id
    return record


def receipt_labels(store: Store, run_id: str, status: str) -> set[str]:
    return {r.label for r in store.receipts.query_receipts(ReceiptQuery(run_id=run_id, status=status))}


def ids_of(labels: set[str]) -> set[int]:
    return {int(label.removeprefix("c")) for label in labels}


# --- enqueue and worker --once ---------------------------------------------------------------


def test_enqueue_records_a_queued_run_that_worker_once_completes(cli: CLI, tmp_path: Path) -> None:
    play = write(tmp_path / "play.py", BASIC_PLAY.replace("VERSION", "v1"))
    log = tmp_path / "tools.log"

    done = cli("run", "play.py", "--enqueue", "--input", json.dumps({"name": "a", "log": str(log)}))
    assert done.code == 0, done.stderr
    run_id = done.stdout.strip()
    assert RUN_ID.match(run_id), f"stdout should be just the run id: {done.stdout!r}"
    assert "Traceback" not in done.stderr

    queued = cli.runs()[run_id]
    assert (queued["status"], queued["attempt"], queued["play"]) == ("queued", 0, "basic")
    assert queued["output"] is None
    assert logged(log) == [], "enqueueing must not execute anything"

    # The play changes after enqueueing: a second run is enqueued with the new version,
    # then the file is deleted. Each run executes the source it was enqueued with.
    write(play, BASIC_PLAY.replace("VERSION", "v2"))
    second = cli.enqueue("play.py", name="b", log=str(log))
    play.unlink()

    worker = cli.worker_once()
    assert "2 started, 2 completed" in worker.stderr, worker.stderr

    with opened(cli.store) as store:
        first_run, second_run = run_of(store, run_id), run_of(store, second)
    assert (first_run.status, first_run.attempt) == ("completed", 1), first_run.error
    assert first_run.output == {"version": "v1", "greeting": "V1-A", "attempt": 1}
    assert (second_run.status, second_run.attempt) == ("completed", 1), second_run.error
    assert second_run.output == {"version": "v2", "greeting": "V2-B", "attempt": 1}
    assert sorted(logged(log)) == ["v1-a", "v2-b"]


def test_worker_once_with_concurrency_drains_every_queued_run_once(cli: CLI, tmp_path: Path) -> None:
    write(tmp_path / "play.py", SEQUENCE_PLAY)
    log = tmp_path / "tools.log"
    names = ["a", "b", "c"]
    # Enqueue all three at once (three processes), then drain them with two threads.
    procs = [
        cli.spawn("run", "play.py", "--enqueue", "--input", json.dumps({"name": n, "log": str(log)})) for n in names
    ]
    run_ids = []
    for proc in procs:
        done = cli.finish(proc)
        assert done.code == 0, done.stderr
        run_ids.append(done.stdout.strip())
    assert len(set(run_ids)) == len(names)
    with opened(cli.store) as store:
        assert {run_of(store, r).status for r in run_ids} == {"queued"}

        worker = cli.worker_once("--concurrency", "2")
        assert "3 started, 3 completed, 0 failed" in worker.stderr, worker.stderr

        spans = []
        for run_id, name in zip(run_ids, names, strict=True):
            run = run_of(store, run_id)
            assert (run.status, run.attempt) == ("completed", 1), run.error
            assert run.output["done"] == [f"{name}-{i}" for i in range(5)]
            spans.append(run.output["span"])
    counts = Counter(logged(log))
    assert counts == Counter(f"{n}-{i}" for n in names for i in range(5)), "every call exactly once"

    # Two runs at a time, never more: the bodies' wall-clock spans overlap two by two.
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans], key=lambda e: (e[0], e[1]))
    at_once = peak = 0
    for _, step in edges:
        at_once += step
        peak = max(peak, at_once)
    assert peak == 2, f"runs at once peaked at {peak} with --concurrency 2: {spans}"


# --- timers and events ----------------------------------------------------------------------


def test_worker_continues_a_sleeping_run_after_its_stored_due_time(cli: CLI, tmp_path: Path) -> None:
    write(tmp_path / "play.py", SLEEP_PLAY)
    log = tmp_path / "tools.log"
    done = cli("run", "play.py", "--enqueue", "--max-inline-wait", "0", "--input",
               json.dumps({"log": str(log), "seconds": 2}))  # fmt: skip
    assert done.code == 0, done.stderr
    run_id = done.stdout.strip()

    # The first worker runs it up to the timer, where it suspends.
    first = cli.worker_once()
    assert "1 started, 0 completed, 0 failed, 1 waiting" in first.stderr, first.stderr
    with opened(cli.store) as store:
        run = run_of(store, run_id)
        assert (run.status, run.attempt) == ("waiting", 1)
        [nap] = [b for b in store.suspension.boundaries(run_id) if b.id == "sleep:nap"]
        assert (nap.kind, nap.status) == ("sleep", "waiting")
        due = nap.due_at
        assert due is not None
        assert logged(log) == ["before"]

        # Wait for the stored due time by the store's own clock.
        wait_until(lambda: store.now() >= due, what="the timer's due time", timeout=10, every=0.05)

    second = cli.worker_once()
    assert "1 started, 1 completed" in second.stderr, second.stderr
    with opened(cli.store) as store:
        run = run_of(store, run_id)
        assert (run.status, run.attempt) == ("completed", 2), run.error
        assert run.output == {"before": "BEFORE", "after": "AFTER", "attempt": 2}
        assert [b.status for b in store.suspension.boundaries(run_id) if b.id == "sleep:nap"] == ["resolved"]
    assert logged(log) == ["before", "after"], "the first call replays from its receipt"


NAP_PLAY = """
from deepline_cli import play

@play("napper")
async def napper(ctx, input):
    await ctx.sleep("nap", 1)
    return "rested"

@play("nap-parent")
async def nap_parent(ctx, input):
    return await ctx.run_play("kid", "napper", {})
"""


def test_a_worker_goes_on_with_a_run_started_by_hand_whose_child_play_waits(cli: CLI, tmp_path: Path) -> None:
    """`deepline run` ran the child play in its own process, up to its timer; the verdict
    says a worker resumes it. `worker --once` once the timer is due completes parent and
    child in one attempt each (it restarted the parent without end, ~130 times a second,
    never touching the child, which was no queued run of its own)."""
    write(tmp_path / "play.py", NAP_PLAY)
    started = cli("run", "play.py:nap_parent", "--run-id", "np1", "--max-inline-wait", "0")
    assert started.code == 3, started.stderr
    assert "(if a worker runs on this store, it resumes the run by itself)" in started.stderr
    with opened(cli.store) as store:
        [child] = [r for r in store.runs.list_runs() if r.parent_run_id == "np1"]
        [nap] = store.suspension.boundaries(child.run_id)
        due = nap.due_at
        assert due is not None
        wait_until(lambda: store.now() >= due, what="the child's timer", timeout=10, every=0.05)

    done = cli.worker_once(timeout=30)

    assert "1 started, 1 completed" in done.stderr, done.stderr
    with opened(cli.store) as store:
        parent, kid = run_of(store, "np1"), run_of(store, child.run_id)
        assert (parent.status, parent.attempt, parent.output) == ("completed", 2, "rested"), parent.error
        assert (kid.status, kid.attempt) == ("completed", 2), kid.error


CAUGHT_CHILD_PLAY = """
from deepline_cli import play

@play("kid")
async def kid(ctx, input):
    raise ValueError("no such account")

@play("parent")
async def parent(ctx, input):
    try:
        await ctx.run_play("k", "kid", {})
    except Exception:
        pass  # the play goes on without it
    await ctx.sleep("later", 600)
    return "done"
"""


def test_a_worker_leaves_a_parent_waiting_after_it_caught_its_childs_failure(cli: CLI, tmp_path: Path) -> None:
    """A queued child play failed; its parent caught the failure and sleeps for ten minutes.
    `worker --once` leaves the parent waiting and exits: it restarted the parent ~100 times
    in 8 s without end (the child's boundary stayed waiting, its failed child "due now")."""
    write(tmp_path / "play.py", CAUGHT_CHILD_PLAY)
    cli.enqueue("play.py:parent")

    done = cli.worker_once(timeout=30)

    runs = cli.runs()
    [parent] = [r for r in runs.values() if r["play"] == "parent"]
    assert (parent["status"], parent["attempt"]) == ("waiting", 2), (parent, done.stderr)
    assert done.stderr.count("worker: running") == 3, done.stderr  # the parent twice, its child once


MAP_OF_CHILDREN_PLAY = """
from deepline_cli import play

@play("enrich-one")
async def enrich_one(ctx, input):
    return {"domain": input["domain"].upper()}

@play("accounts")
async def accounts(ctx, input):
    rows = [{"domain": f"c{i}.io"} for i in range(20)]
    ds = await ctx.map("leads", rows, key="domain", columns={
        "enriched": lambda row, rc: rc.run_play("one", "enrich-one", {"domain": row["domain"]}),
    })
    return len(ds)
"""


def test_a_worker_resumes_a_parent_once_its_childrens_results_are_in_not_once_a_child(cli: CLI, tmp_path: Path) -> None:
    """A map whose 20 rows each run a child play, queued: the worker resumed the parent after
    every child that ended (21 attempts, each replaying the whole map: quadratic in the list).
    It waits for the children still running, for a few seconds at most after the first
    result came in, so a parent resumes once its children are in."""
    write(tmp_path / "play.py", MAP_OF_CHILDREN_PLAY)
    run_id = cli.enqueue("play.py:accounts")

    done = cli.worker_once(timeout=120)

    with opened(cli.store) as store:
        parent = run_of(store, run_id)
        assert (parent.status, parent.output) == ("completed", 20), (parent.error, done.stderr)
        assert parent.attempt <= 3, (parent.attempt, done.stderr)  # 2 when the children end within the window
        kids = [r for r in store.runs.list_runs(limit=100) if r.parent_run_id == run_id]
        assert len(kids) == 20 and all(k.status == "completed" and k.attempt == 1 for k in kids)


def test_worker_continues_a_run_once_its_event_is_sent(cli: CLI, tmp_path: Path) -> None:
    write(tmp_path / "play.py", EVENT_PLAY)
    log = tmp_path / "tools.log"
    started = cli("run", "play.py", "--run-id", "ev-1", "--quiet", "--input", json.dumps({"log": str(log)}))
    assert started.code == 3, started.stderr  # waiting

    with opened(cli.store) as store:
        # Nothing delivered yet: a worker leaves it alone.
        idle = cli.worker_once()
        assert "0 started" in idle.stderr, idle.stderr
        run = run_of(store, "ev-1")
        assert (run.status, run.attempt) == ("waiting", 1)

        sent = cli("events", "send", "ev-1", "approve", "--payload", json.dumps({"by": "ana"}))
        assert sent.code == 0, sent.stderr

        worker = cli.worker_once()
        assert "1 started, 1 completed" in worker.stderr, worker.stderr
        run = run_of(store, "ev-1")
        assert (run.status, run.attempt) == ("completed", 2), run.error
        assert run.output == {"before": "BEFORE", "payload": {"by": "ana"}, "attempt": 2}
    assert logged(log) == ["before"]


def test_a_worker_says_which_event_an_enqueued_run_waits_for(cli: CLI, tmp_path: Path) -> None:
    write(tmp_path / "play.py", EVENT_PLAY)
    run_id = cli.enqueue("play.py", log=str(tmp_path / "tools.log"))
    worker = cli.worker_once()
    assert f"… Run {run_id} is waiting: for event 'approve' (deepline events send {run_id} approve)." in worker.stderr
    assert "Next: once its event is sent (if a worker runs on this store" in worker.stderr, worker.stderr
    sent = cli("events", "send", run_id, "approve")
    assert sent.code == 0 and f"A `deepline worker` on this store continues run {run_id}" in sent.stderr, sent.stderr


# --- killed and stopped workers ---------------------------------------------------------------

CALLS = 200


def start_many(cli: CLI, tmp_path: Path) -> tuple[str, Path]:
    write(tmp_path / "play.py", MANY_PLAY)
    log = tmp_path / "calls.log"
    return cli.enqueue("play.py", n=CALLS, log=str(log)), log


def wait_for_some_completed(store: Store, run_id: str, proc: subprocess.Popen[bytes], least: int = 20) -> None:
    def enough() -> bool:
        assert proc.poll() is None, "the worker ended before the test could stop it"
        return len(receipt_labels(store, run_id, "completed")) >= least

    wait_until(enough, what=f"{least} completed receipts", timeout=30, every=0.01)


def kill_worker_mid_run(cli: CLI, store: Store, run_id: str) -> None:
    """A worker started on the queue, SIGKILLed once some of the run's calls completed."""
    worker = cli.spawn("worker")
    wait_for_some_completed(store, run_id, worker)
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    assert worker.returncode == -signal.SIGKILL


def test_sigkilled_worker_is_taken_over_and_nothing_is_paid_twice(cli: CLI, tmp_path: Path) -> None:
    run_id, log = start_many(cli, tmp_path)
    with opened(cli.store) as store:
        kill_worker_mid_run(cli, store, run_id)

        # The store as the dead worker left it: what was paid and recorded, what was in flight.
        completed_at_kill = ids_of(receipt_labels(store, run_id, "completed"))
        in_flight = ids_of(receipt_labels(store, run_id, "running"))
        assert 20 <= len(completed_at_kill) < CALLS, "the kill did not land mid-run"
        assert len(in_flight) <= 4, f"at most 4 calls are claimed at a time: {sorted(in_flight)}"
        assert run_of(store, run_id).status == "running"  # its holder is gone

        # Another worker takes it over and finishes it.
        taken = cli.worker_once()
        assert "1 started, 1 completed" in taken.stderr, taken.stderr
        run = run_of(store, run_id)
        assert (run.status, run.attempt) == ("completed", 2), run.error
        assert run.output == {"n": CALLS, "sum": sum(2 * i for i in range(CALLS))}
        assert ids_of(receipt_labels(store, run_id, "completed")) == set(range(CALLS))

    counts = Counter(int(line) for line in logged(log))
    assert set(counts) == set(range(CALLS)), "every call was paid for"
    repeated = {i for i, n in counts.items() if n > 1}
    assert repeated <= in_flight, (
        f"calls paid twice that were not in flight at the kill: {sorted(repeated - in_flight)}"
    )
    assert not repeated & completed_at_kill
    assert max(counts.values()) <= 2


def test_a_killed_workers_run_is_taken_before_the_queued_ones(cli: CLI, tmp_path: Path) -> None:
    """A worker killed mid-run: its run waited behind every queued run (and every tick of a
    schedule) before another worker took it over."""
    run_id, log = start_many(cli, tmp_path)
    with opened(cli.store) as store:
        kill_worker_mid_run(cli, store, run_id)
        queued = [cli.enqueue("play.py", n=3, log=str(log)) for _ in range(2)]
        cli.worker_once()
        attempts = [row for one in (run_id, *queued) for row in store.ledger.attempt_rows(one)]
        started = {row.run_id: row.started_at for row in attempts if row.run_id != run_id or row.attempt == 2}
        assert started[run_id] < min(started[other] for other in queued), started
        assert run_of(store, run_id).status == "completed"


def test_sigterm_drains_the_worker_and_requeues_the_run(cli: CLI, tmp_path: Path) -> None:
    run_id, log = start_many(cli, tmp_path)
    with opened(cli.store) as store:
        worker = cli.spawn("worker")
        wait_for_some_completed(store, run_id, worker)
        worker.send_signal(signal.SIGTERM)
        stopped = cli.finish(worker, timeout=20)
        assert stopped.code == 0, stopped.stderr
        assert "draining" in stopped.stderr and "1 re-queued" in stopped.stderr, stopped.stderr
        assert "Traceback" not in stopped.stderr
        assert "deepline resume" not in stopped.stderr and "it is queued again" in stopped.stderr, stopped.stderr

        run = run_of(store, run_id)
        assert run.status == "queued", f"a drained run goes back to the queue, not {run.status!r}"
        assert run.holder is None
        # Calls in flight finished and were recorded; claims not yet invoked were released
        # (their lease ended): nothing is left held.
        left = store.receipts.query_receipts(ReceiptQuery(run_id=run_id, status="running"))
        assert [r.label for r in left if r.lease_expires_at] == [], "a drained run holds no receipt lease"
        completed_at_stop = ids_of(receipt_labels(store, run_id, "completed"))
        assert 20 <= len(completed_at_stop) < CALLS, "the drain did not land mid-run"
        assert Counter(int(line) for line in logged(log)) == Counter(completed_at_stop)

        second = cli.worker_once()
        assert "1 started, 1 completed" in second.stderr, second.stderr
        run = run_of(store, run_id)
        assert (run.status, run.attempt) == ("completed", 2), run.error
        assert run.output == {"n": CALLS, "sum": sum(2 * i for i in range(CALLS))}

    counts = Counter(int(line) for line in logged(log))
    assert set(counts) == set(range(CALLS))
    assert [i for i, n in counts.items() if n > 1] == [], "a drained worker leaves nothing to pay twice"


SLOW_CALL_PLAY = """
import os
import time
from deepline_cli import play, tool

@tool("w.slow")
def slow(input):
    with open(input["log"], "a") as f:
        f.write(f"{input['n']}\\n")
    if "release" not in input:
        time.sleep(2)
    waited = time.monotonic() + 60
    while "release" in input and not os.path.exists(input["release"]) and time.monotonic() < waited:
        time.sleep(0.01)  # out until the test says
    return input["n"]

@play("slow")
async def slow_play(ctx, input):
    for n in range(3):
        await ctx.tools.execute(f"c{n}", "w.slow", {**input, "n": n})
    return {"ok": True}
"""


def test_a_run_being_stopped_when_its_worker_drains_stays_stopped_and_pays_nothing_twice(
    cli: CLI, tmp_path: Path
) -> None:
    """`runs stop` asks a worker's run to stop while a call is out; then the worker is told
    to drain (SIGTERM). The call in flight still finishes and is recorded (the drain is no
    second Ctrl-C), and the run stays stopped: the worker does not put it back in the queue."""
    write(tmp_path / "play.py", SLOW_CALL_PLAY)
    log, release = tmp_path / "calls.log", tmp_path / "release"
    run_id = cli.enqueue("play.py", log=str(log), release=str(release))
    worker = cli.spawn("worker")
    wait_until(lambda: log.exists() and log.read_text(), what="the first call sent", timeout=30, every=0.01)
    assert cli("runs", "stop", run_id, "--reason", "user says stop", "--no-wait").code == 0

    def heard() -> bool:  # the run says so in its log once it is carrying the stop out
        return "stop requested (user says stop)" in cli("runs", "logs", run_id, "--kind", "run.interrupted").stdout

    wait_until(heard, what="the run to hear the stop", timeout=30, every=0.05)
    worker.send_signal(signal.SIGTERM)
    release.touch()  # the call out answers now, the stop heard and the drain asked
    stopped = cli.finish(worker, timeout=20)
    assert stopped.code == 0, stopped.stderr
    with opened(cli.store) as store:
        run = run_of(store, run_id)
        assert run.status == "interrupted", f"a stopped run is not queued again: {run.status!r}"
        assert receipt_labels(store, run_id, "completed") == {"c0"}  # the call out finished, recorded
    resumed = cli("resume", run_id)
    assert resumed.code == 0, resumed.stderr
    assert logged(log) == ["0", "1", "2"], "no call paid twice"


def test_a_run_stopped_while_its_worker_drains_stays_stopped_with_its_reason(cli: CLI, tmp_path: Path) -> None:
    """The other order: the worker is told to drain (SIGTERM) while a call is out, then the
    run is stopped (`runs stop`) before the call ends. The stop's reason is the run's, and
    the worker does not put it back in the queue."""
    write(tmp_path / "play.py", SLOW_CALL_PLAY)
    log = tmp_path / "calls.log"
    run_id = cli.enqueue("play.py", log=str(log))  # each call out 2 s: the run hears the stop meanwhile
    worker = cli.spawn("worker")
    wait_until(lambda: log.exists() and log.read_text(), what="the first call sent", timeout=30, every=0.01)
    worker.send_signal(signal.SIGTERM)
    assert cli("runs", "stop", run_id, "--reason", "not tonight", "--no-wait").code == 0
    stopped = cli.finish(worker, timeout=20)
    assert stopped.code == 0, stopped.stderr
    with opened(cli.store) as store:
        run = run_of(store, run_id)
        assert (run.status, (run.error or {}).get("reason")) == ("interrupted", "not tonight"), (run.status, run.error)
    assert cli("resume", run_id).code == 0
    assert logged(log) == ["0", "1", "2"], "no call paid twice"


@pytest.mark.process
def test_a_worker_whose_store_refuses_says_so_in_one_sentence(tmp_path: Path) -> None:
    """A PostgreSQL store that refuses connections (down, a wrong port): the worker stops
    with one sentence, not a thread's traceback nor talk of re-queueing runs it never had."""
    url = "postgresql://postgres@127.0.0.1:9/nowhere"
    done = subprocess.run(
        [sys.executable, "-m", "deepline_cli", "worker", "--store", url],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if not k.startswith("DEEPLINE_")},
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "interrupting runs" not in done.stderr, done.stderr
    # Nor "stopping" and "done — 0 started" before it: it never had the store.
    [said] = [line for line in done.stderr.splitlines() if line.strip()]
    assert said.startswith("Error: the worker stopped: ") and f"Cannot connect to the store {url}" in said, said


@pytest.mark.postgres
def test_a_worker_given_a_database_that_does_not_exist_stops_with_exit_2(tmp_path: Path, pg_url: str) -> None:
    """`deepline worker --store postgresql://…/nosuchdb` (a typo): "the store cannot be
    reached", exit 1, as for a server that is down and may come back. The server answered:
    the URL is wrong, exit 2."""
    url = pg_url.rpartition("/")[0] + "/deepline_no_such_db"
    done = subprocess.run(
        [sys.executable, "-m", "deepline_cli", "worker", "--once", "--store", url],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if not k.startswith("DEEPLINE_")},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "does not exist" in done.stderr and "cannot be reached" not in done.stderr, done.stderr


def mark_newer_schema(store: str) -> None:
    """The store as a newer deepline leaves it: a migration this one does not know."""
    sql = "INSERT INTO _migrations (name, applied_at) VALUES ('9999_future', 0)"
    if is_postgres(store):
        import psycopg

        with psycopg.connect(store, autocommit=True) as conn:
            conn.execute(sql)
        return
    conn = sqlite3.connect(store)
    conn.execute(sql)
    conn.commit()
    conn.close()


def test_a_worker_whose_store_a_newer_deepline_upgraded_stops_in_one_sentence(cli: CLI, tmp_path: Path) -> None:
    """A newer deepline migrated the store while a worker ran: the worker's thread died with
    a traceback as it opened the store for the next run due, and the worker exited 0, as if
    it had drained. It stops with one sentence and exit 1."""
    write(tmp_path / "play.py", SLEEP_PLAY)
    done = cli("run", "play.py", "--enqueue", "--max-inline-wait", "0", "--input",
               json.dumps({"log": str(tmp_path / "tools.log"), "seconds": 1}))  # fmt: skip
    run_id = done.stdout.strip()
    worker = cli.spawn("worker")
    with opened(cli.store) as store:
        wait_until(lambda: run_of(store, run_id).status == "waiting", what="the run waits", timeout=30)
    mark_newer_schema(cli.store)

    ended = cli.finish(worker, timeout=60)  # the timer comes due: the worker opens the store again

    assert ended.code == 1, ended.stderr
    assert "Traceback" not in ended.stderr, ended.stderr
    assert "written by a newer deepline" in ended.stderr, ended.stderr


# --- snapshots under a concurrent worker --------------------------------------------------------


def test_concurrent_worker_runs_each_run_with_the_tool_code_it_was_enqueued_with(
    tmp_path: Path, store_path: Path
) -> None:
    """Two versions of one play file, enqueued one after the other, where the tool's code
    changed (same tool id): a `--concurrency 2` worker runs both at once, and each must
    call its own version of the tool."""
    cli = CLI(str(store_path), tmp_path)
    try:
        play = tmp_path / "play.py"
        marks = tmp_path / "marks"
        marks.mkdir()
        write(play, VERSIONED_TOOL_PLAY.replace("TOOLVERSION", "v1"))
        old = cli.enqueue("play.py", name="old", marks=str(marks))
        write(play, VERSIONED_TOOL_PLAY.replace("TOOLVERSION", "v2"))
        new = cli.enqueue("play.py", name="new", marks=str(marks))

        worker = cli.worker_once("--concurrency", "2")
        assert "2 started, 2 completed" in worker.stderr, worker.stderr
        with opened(cli.store) as store:
            outputs = {run_id: run_of(store, run_id).output for run_id in (old, new)}
        assert outputs == {old: {"tool": "v1:old"}, new: {"tool": "v2:new"}}, "a run called another version's tool"
    finally:
        cli.close()


def test_a_partly_written_snapshot_file_is_not_trusted(
    tmp_path: Path, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker materializes a snapshot into its cache directory; a file left half
    written there (a worker killed mid-write, or a second worker thread reading while
    the first still writes) must not be loaded as the play."""
    from deepline_cli.runtime.run.snapshot import materialize_snapshot

    cli = CLI(str(store_path), tmp_path)
    try:
        source = textwrap.dedent(BASIC_PLAY.replace("VERSION", "v1"))
        write(tmp_path / "play.py", source)
        log = tmp_path / "tools.log"
        run_id = cli.enqueue("play.py", name="a", log=str(log))

        # Where the worker will materialize this snapshot; leave half of it there.
        monkeypatch.setenv("XDG_CACHE_HOME", cli.env["XDG_CACHE_HOME"])
        with opened(cli.store) as store:
            digest = run_of(store, run_id).snapshot
            assert digest is not None
            snapshot = store.queue.get_snapshot(digest)
        assert snapshot is not None
        ref, _ = materialize_snapshot(digest, snapshot)
        cached = Path(ref.rpartition(":")[0])
        assert cached.read_text() == source
        cached.write_text(source[: len(source) // 2])

        cli.worker_once()
        with opened(cli.store) as store:
            run = run_of(store, run_id)
        assert run.status == "completed", f"the run failed on a partial snapshot file: {run.error}"
        assert run.output == {"version": "v1", "greeting": "V1-A", "attempt": 1}
    finally:
        cli.close()


def test_enqueue_with_the_run_id_of_a_queued_run_does_not_execute_it(tmp_path: Path, store_path: Path) -> None:
    """`run --enqueue --run-id X` twice (an idempotent CI step): the second invocation
    reports X as queued; it must not execute the run in the enqueuing process."""
    cli = CLI(str(store_path), tmp_path)
    try:
        write(tmp_path / "play.py", BASIC_PLAY.replace("VERSION", "v1"))
        log = tmp_path / "tools.log"
        args = (
            "run",
            "play.py",
            "--enqueue",
            "--run-id",
            "nightly-1",
            "--input",
            json.dumps({"name": "a", "log": str(log)}),
        )
        first = cli(*args)
        assert (first.code, first.stdout.strip()) == (0, "nightly-1"), first.stderr
        again = cli(*args)
        assert again.code == 0, again.stderr
        assert logged(log) == [], "--enqueue executed the queued run in the enqueuing process"
        assert again.stdout.strip() == "nightly-1", again.stdout
        assert "Queued run nightly-1;" in first.stderr
        assert "Run nightly-1 is already queued;" in again.stderr
        with opened(cli.store) as store:
            run = run_of(store, "nightly-1")
        assert (run.status, run.attempt) == ("queued", 0)
    finally:
        cli.close()


# --- PostgreSQL: several processes on one database ----------------------------------------------


@pytest.mark.postgres
def test_two_runs_at_once_pay_each_distinct_call_once(pg_cli: CLI, tmp_path: Path) -> None:
    n = 300
    write(tmp_path / "play.py", SHARED_PLAY)
    log, go = tmp_path / "pay.log", tmp_path / "go"
    procs = {
        run_id: pg_cli.spawn("run", "play.py", "--run-id", run_id, "--quiet", "--input",
                             json.dumps({"n": n, "seed": seed, "log": str(log), "go": str(go)}))
        for run_id, seed in (("shared-a", 1), ("shared-b", 2))
    }  # fmt: skip
    with opened(pg_cli.store) as store:
        # Both are running (waiting at the `go` file) before either makes a call.
        wait_until(lambda: {r.run_id for r in store.runs.list_runs(status="running")} == set(procs),
                   what="both runs to start")  # fmt: skip
        go.touch()
        results = {run_id: pg_cli.finish(proc) for run_id, proc in procs.items()}
        for run_id, done in results.items():
            assert done.code == 0, f"{run_id}: {done.stderr}"
            assert json.loads(done.stdout) == {"n": n, "sum": sum(i * i for i in range(n))}

        counts = Counter(int(line) for line in logged(log))
        assert set(counts) == set(range(n))
        assert [i for i, c in counts.items() if c > 1] == [], "a call was paid twice"

        stats = {run_id: run_of(store, run_id).stats["tools"]["w.pay"] for run_id in procs}
        live = {run_id: s["live"] for run_id, s in stats.items()}
        assert sum(live.values()) == n, stats
        for s in stats.values():
            assert s["live"] + s["reused"] == n, stats
        # Both really ran at once: each paid for part of the calls and reused the rest.
        assert all(v > 0 for v in live.values()), stats
        owners = Counter(
            r.run_id for r in store.receipts.query_receipts(ReceiptQuery(tool="w.pay", status="completed"))
        )
        assert owners == Counter(live), (owners, live)


@pytest.mark.postgres
def test_two_workers_share_one_rate_limit(pg_cli: CLI, tmp_path: Path) -> None:
    per_run = 40  # 80 calls: about 4 s at the shared 20/s
    write(tmp_path / "play.py", RATED_PLAY)
    log = tmp_path / "rated.log"
    enqueues = [
        pg_cli.spawn("run", "play.py", "--enqueue", "--input", json.dumps({"n": per_run, "run": name, "log": str(log)}))
        for name in ("a", "b")
    ]
    for proc in enqueues:
        assert pg_cli.finish(proc).code == 0, pg_cli.output(proc).stderr

    workers = [pg_cli.spawn("worker", "--once") for _ in range(2)]
    for proc in workers:
        done = pg_cli.finish(proc, timeout=60)
        assert done.code == 0, done.stderr
        # Each worker ran one of the two runs: they ran side by side.
        assert "1 started, 1 completed" in done.stderr, done.stderr

    lines = [line.split() for line in logged(log)]
    starts = {run: float(ts) for kind, run, _, ts in lines if kind == "start"}
    calls = [(float(ts), run) for kind, run, _, ts in lines if kind == "call"]
    assert len(calls) == 2 * per_run
    assert Counter(run for _, run in calls) == {"a": per_run, "b": per_run}
    times = sorted(t for t, _ in calls)
    # Both bodies were running before the first run's calls were done (so without a shared
    # limit the combined rate would have been 40/s).
    assert max(starts.values()) < min(max(t for t, r in calls if r == run) for run in ("a", "b"))

    # The two share the limit: together no faster than 20/s (+10%). A busy machine can
    # only slow them; how close to the limit they run is a benchmark's figure.
    rate = (len(times) - 1) / (times[-1] - times[0])
    assert rate <= 22.0, f"combined rate {rate:.2f}/s, limit 20/s"


@pytest.mark.postgres
def test_worker_wakes_on_notify(pg_cli: CLI, pg_url: str, tmp_path: Path) -> None:
    import psycopg

    write(tmp_path / "play.py", STAMP_PLAY)
    log = tmp_path / "stamp.log"
    # An idle worker that would look for work only once a minute: only NOTIFY wakes it in time.
    pg_cli.env["DEEPLINE_WORKER_POLL_S"] = "60"
    worker = pg_cli.spawn("worker")

    def listening() -> bool:
        assert worker.poll() is None, pg_cli.output(worker).stderr
        with psycopg.connect(pg_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query = 'LISTEN deepline_work' AND pid <> pg_backend_pid()"
            ).fetchone()
        return bool(row and row[0])

    wait_until(listening, what="the worker to LISTEN", timeout=20, every=0.05)

    with opened(pg_cli.store) as store:
        for name in ("a", "b", "c"):
            run_id = pg_cli.enqueue("play.py", name=name, log=str(log))

            def completed(run_id: str = run_id) -> bool:
                return run_of(store, run_id).status == "completed"

            wait_until(completed, what=f"run {name} to complete", timeout=20)
            assert run_of(store, run_id).output == {"name": name}

    worker.send_signal(signal.SIGTERM)
    stopped = pg_cli.finish(worker, timeout=15)
    assert stopped.code == 0, stopped.stderr
    assert "3 started, 3 completed" in stopped.stderr, stopped.stderr


def test_a_worker_killed_between_its_claim_and_its_attempt_leaves_that_attempt_counted(
    cli: CLI, tmp_path: Path
) -> None:
    """A worker killed just after claiming a queued run (its attempt number taken, its
    attempt not yet recorded): the run said attempt 2 and `stats.attempts` 1, and `runs
    show --full` listed attempt #2 alone. The attempt is counted as killed."""
    write(tmp_path / "play.py", MAP_OF_CHILDREN_PLAY.replace("range(20)", "range(2)"))
    run_id = cli.enqueue("play.py:enrich-one", domain="x1.com")
    with opened(cli.store) as store:
        claimed = store.queue.claim_queued_run(holder=f"{socket.gethostname()}:999999999", expires_at=0.0)
        assert claimed is not None and claimed.attempt == 1  # and the worker is killed here
    cli.worker_once()  # its holder is gone: the run is taken over
    with opened(cli.store) as store:
        run = run_of(store, run_id)
        assert (run.status, run.attempt, run.stats["attempts"]) == ("completed", 2, 2), run.stats
        assert [(a.attempt, a.status) for a in store.ledger.attempt_rows(run_id)] == [(1, "killed"), (2, "completed")]


RETRIED_CHILDREN_PLAY = """
from deepline_cli import play

@play("lookup-one")
async def lookup_one(ctx, input):
    return (await ctx.tools.execute("c", "acme.company", {"domain": input["domain"]})).output

@play("accounts")
async def accounts(ctx, input):
    rows = await ctx.map("leads", [{"domain": "a.io"}, {"domain": "b.io"}], key="domain", columns={
        "company": lambda row, rc: rc.run_play("one", "lookup-one", {"domain": row["domain"]}),
    })
    return len(rows)
"""


def test_a_parents_retries_by_cause_count_its_queued_childrens(cli: CLI, tmp_path: Path) -> None:
    """Under a worker each child play is a run of its own: the parent's stats counted their
    retries (from the ledger) but not their causes (in the children's processes), and said
    every one `earlier` (attempts killed before their outcome), though none was killed."""
    from tests.provider import Provider, ProviderServer

    with ProviderServer(Provider()) as provider:
        provider.script("/v1/company", ["503", "503"])
        (tmp_path / "deepline.toml").write_text(
            f'[tools."acme.company"]\nurl = "{provider.url}/v1/company"\nmethod = "POST"\n'
            'json = { domain = "{domain}" }\ncredits = 1\n'
        )
        write(tmp_path / "play.py", RETRIED_CHILDREN_PLAY)
        cli.env["DEEPLINE_RETRY_BASE_S"] = "0.01"
        run_id = cli.enqueue("play.py:accounts")
        cli.worker_once()
    with opened(cli.store) as store:
        run = run_of(store, run_id)
        assert run.status == "completed", run.error
        counts = run.stats["tools"]["acme.company"]
        assert (counts["retries"], counts["retry_reasons"]) == (2, {"5xx": 2}), counts
