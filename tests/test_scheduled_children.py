"""Under workers, child plays are queued runs of their own; the parent waits for them."""

from __future__ import annotations

import json
import sys

from tests.helpers import runs as runs_of

SCHEDULED = """
import asyncio
from pathlib import Path
from deepline_cli import ProviderTransientError, play, tool

@tool("sched.t")
async def t(input):
    if input["x"] == 1:
        await asyncio.sleep(input.get("slow", 0))
    if input["x"] == 3 and not Path(input["flag"]).exists():
        raise ProviderTransientError("child three is not ready")
    return {"v": input["x"] * 10}

@play("kid")
async def kid(ctx, input):
    return (await ctx.tools.execute("t", "sched.t", input)).output

@play("mom")
async def mom(ctx, input):
    xs = input["xs"]
    kids = [{"x": x, "flag": input["flag"], "slow": input.get("slow", 0)} for x in xs]
    got = await asyncio.gather(*(ctx.run_play(f"kid-{k['x']}", "kid", k) for k in kids))
    return {"values": [g["v"] for g in got]}
"""


def test_children_run_as_queued_runs_and_the_parent_resumes_with_their_results(deepline, write_play, tmp_path) -> None:
    play = write_play(SCHEDULED, "family.py")
    payload = json.dumps({"xs": [1, 2], "flag": str(tmp_path / "flag")})
    assert deepline("run", f"{play}:mom", "--enqueue", "--run-id", "fam-1", "--input", payload).code == 0

    worker = deepline("worker", "--once", "--concurrency", "2")
    assert worker.code == 0, worker.stderr

    runs = runs_of(deepline)
    assert runs["fam-1"]["status"] == "completed"
    assert runs["fam-1"]["output"] == {"values": [10, 20]}
    # Suspended for its children, then resumed. A parent is due again as soon as one of
    # its children has finished, so children that finish apart (a busy machine) resume
    # it once each: never more resumes than children.
    assert 2 <= runs["fam-1"]["attempt"] <= 3
    children = [r for r in runs.values() if r["parent_run_id"] == "fam-1"]
    assert len(children) == 2
    assert all(c["status"] == "completed" and c["attempt"] == 1 for c in children)
    assert "fam-1 waiting" in worker.stderr  # the parent waited at a batch of child boundaries


def test_a_failed_scheduled_child_raises_in_its_parent_and_a_resume_retries_it(deepline, write_play, tmp_path) -> None:
    play = write_play(SCHEDULED, "family.py")
    flag = tmp_path / "flag"
    payload = json.dumps({"xs": [1, 3], "flag": str(flag)})
    deepline("run", f"{play}:mom", "--enqueue", "--run-id", "fam-2", "--input", payload)
    deepline("worker", "--once", "--concurrency", "2")
    runs = runs_of(deepline)
    assert runs["fam-2"]["status"] == "failed"
    assert "child three is not ready" in runs["fam-2"]["error"]["message"]

    flag.write_text("ready")
    # Queue the failed parent again: under the worker it re-queues its failed child once.
    again = deepline("run", f"{play}:mom", "--enqueue", "--run-id", "fam-2", "--input", payload)
    assert again.code == 0, again.stderr
    assert runs_of(deepline)["fam-2"]["status"] == "queued"
    worker = deepline("worker", "--once", "--concurrency", "2")
    runs = runs_of(deepline)
    assert runs["fam-2"]["status"] == "completed", worker.stderr
    assert runs["fam-2"]["output"] == {"values": [10, 30]}
    children = {r["input"]["x"]: r for r in runs.values() if r["parent_run_id"] == "fam-2"}
    assert children[1]["attempt"] == 1  # the child that had succeeded was not run again
    assert children[3]["attempt"] == 2  # the failed one ran once more, under a worker


def test_a_child_that_failed_while_a_sibling_still_ran_is_not_run_again(deepline, write_play, tmp_path) -> None:
    """The parent resumes when the failed child ends, sees the failure while its sibling
    still runs, and waits for the sibling: when it resumes again, the failure is reported,
    not retried (nobody asked for a retry, and the retry would call the provider again)."""
    play = write_play(SCHEDULED, "family.py")
    payload = json.dumps({"xs": [1, 3], "flag": str(tmp_path / "flag"), "slow": 1.5})
    deepline("run", f"{play}:mom", "--enqueue", "--run-id", "fam-3", "--input", payload)
    worker = deepline("worker", "--once", "--concurrency", "2")
    runs = runs_of(deepline)
    assert runs["fam-3"]["status"] == "failed", worker.stderr
    assert "child three is not ready" in runs["fam-3"]["error"]["message"]
    children = {r["input"]["x"]: r for r in runs.values() if r["parent_run_id"] == "fam-3"}
    assert (children[3]["status"], children[3]["attempt"]) == ("failed", 1), worker.stderr
    assert (children[1]["status"], children[1]["attempt"]) == ("completed", 1)


def test_stopping_a_parent_stops_its_queued_children_and_a_resume_runs_them(
    deepline, write_play, tmp_path, store_path
) -> None:
    """Under workers a child play is a queued run of its own: `runs stop` on the parent left
    them queued, and workers ran every one of them, paying, after the operator stopped the
    run. They stop with it; the parent's resume runs them."""
    from deepline_cli.runtime.calls.events import EventBus
    from deepline_cli.runtime.run.holders import holder_id
    from deepline_cli.runtime.run.options import RunOptions
    from deepline_cli.runtime.run.runner import Runner
    from deepline_cli.store import open_store

    play = write_play(SCHEDULED, "family.py")
    payload = json.dumps({"xs": [1, 2], "flag": str(tmp_path / "flag")})
    assert deepline("run", f"{play}:mom", "--enqueue", "--run-id", "fam-s", "--input", payload).code == 0
    store = open_store(str(store_path))
    try:  # a worker takes the parent: it queues its children and waits for them
        claimed = store.queue.claim_queued_run(holder=holder_id(), expires_at=store.now() + 30)
        assert claimed is not None and claimed.run_id == "fam-s"
        runner = Runner(RunOptions(store=str(store_path), schedule_children=True), EventBus())
        try:
            assert runner.run_claimed(claimed).status == "waiting"
        finally:
            runner.close()
    finally:
        store.close()
    assert {r["status"] for r in runs_of(deepline).values() if r["parent_run_id"] == "fam-s"} == {"queued"}

    stopped = deepline("runs", "stop", "fam-s", "--reason", "stop spending")
    assert stopped.code == 0, stopped.stderr
    after = runs_of(deepline)
    assert after["fam-s"]["status"] == "interrupted"
    assert {r["status"] for r in after.values() if r["parent_run_id"] == "fam-s"} == {"interrupted"}
    idle = deepline("worker", "--once")
    assert idle.code == 0 and "0 started" in idle.stderr, idle.stderr  # nothing left to pay for
    # A child its parent queued just as it was stopped (before it heard): not run either.
    late = next(r["run_id"] for r in after.values() if r["parent_run_id"] == "fam-s")
    store = open_store(str(store_path))
    try:
        store.runs.set_status(late, "queued", holder=None)
    finally:
        store.close()
    skipped = deepline("worker", "--once")
    assert f"{late} not run: its parent run fam-s was stopped" in skipped.stderr, skipped.stderr
    assert runs_of(deepline)[late]["status"] == "interrupted"
    made = deepline("receipts", "inspect", "--tool", "sched.t", "--json")
    assert made.code == 0 and made.stdout == ""  # no child made its tool call

    assert deepline("run", f"{play}:mom", "--enqueue", "--run-id", "fam-s", "--input", payload).code == 0
    resumed = deepline("worker", "--once", "--concurrency", "2")
    done = runs_of(deepline)
    assert done["fam-s"]["status"] == "completed", resumed.stderr
    assert done["fam-s"]["output"] == {"values": [10, 20]}


def test_a_due_run_a_draining_worker_did_not_start_is_not_counted_failed(deepline, write_play, store_path) -> None:
    """A worker told to stop just as it took up a due run: the run is left as it was (still
    waiting), and the worker's summary said it failed."""
    from deepline_cli.runtime.run.worker import Worker
    from deepline_cli.store import open_store
    from tests.helpers import wait_until

    play = write_play(
        """
        from deepline_cli import play

        @play("nap")
        async def nap(ctx, input):
            await ctx.sleep("nap", 0.01)
            return 1
        """,
        "nap.py",
    )
    assert deepline("run", str(play), "--run-id", "due", "--max-inline-wait", "0").code == 3
    store = open_store(str(store_path))  # the run is due by the store's clock
    try:
        [nap] = store.suspension.boundaries("due")
        wait_until(lambda: store.now() >= (nap.due_at or 0.0), what="the timer's due time", timeout=10, every=0.01)
    finally:
        store.close()
    said: list[str] = []
    worker = Worker(str(store_path), report=said.append)
    worker.drain()

    worker._execute("due", lambda runner: runner.resume("due"))

    assert (worker.stats.started, worker.stats.failed) == (0, 0), said
    assert runs_of(deepline)["due"]["status"] == "waiting"


BUDGETED = """
import asyncio
from deepline_cli import play, tool

@tool("cost.one", credits=1)
async def one(input):
    with open(input["log"], "a") as f:
        f.write(f"one {input['k']}\\n")
    for _ in range(1000):  # all six children are in flight at once before any goes on
        with open(input["log"]) as f:
            if f.read().count("one ") >= 6:
                break
        await asyncio.sleep(0.01)
    return 1

@tool("cost.two", credits=2)
async def two(input):
    with open(input["log"], "a") as f:
        f.write(f"two {input['k']}\\n")
    return 2

@play("kid")
async def kid(ctx, input):
    a = (await ctx.tools.execute("one", "cost.one", input)).output
    b = (await ctx.tools.execute("two", "cost.two", input)).output
    return a + b

@play("budgeted")
async def budgeted(ctx, input):
    got = await asyncio.gather(*(ctx.run_play(f"kid-{k}", "kid", {"k": k, "log": input["log"]}) for k in range(6)))
    return sum(got)
"""


def test_a_budget_holds_across_the_children_a_worker_runs(deepline, write_play, tmp_path) -> None:
    """`--max-credits 7` over six children of 3 credits each, run by one worker taking six
    runs at once: the children spend from the one budget (at most 7 credits paid, not 18),
    and the run fails on the budget, resumable."""
    play = write_play(BUDGETED, "family.py")
    log = tmp_path / "calls.log"
    payload = json.dumps({"log": str(log)})
    queued = deepline(
        "run", f"{play}:budgeted", "--enqueue", "--run-id", "bud", "--max-credits", "7", "--input", payload
    )
    assert queued.code == 0, queued.stderr
    deepline("worker", "--once", "--concurrency", "6")
    paid = sum(1 if line.startswith("one") else 2 for line in log.read_text().splitlines())
    assert paid <= 7, log.read_text()
    assert runs_of(deepline)["bud"]["status"] == "failed"


DATA_BESIDE = """
import json
from pathlib import Path
from deepline_cli import play

WEIGHTS = json.loads((Path(__file__).parent / "weights.json").read_text())
SEGMENTS = (Path(__file__).parent / "lists" / "segments.txt").read_text().split()

@play("weighted")
async def weighted(ctx, input):
    return {"w": WEIGHTS["w"], "segments": SEGMENTS}
"""


def test_an_enqueued_play_reads_the_data_files_its_config_lists(deepline, write_play, tmp_path) -> None:
    """A worker runs an enqueued play from a copy of its code: a play reading a data file
    beside it (`Path(__file__).parent / "weights.json"`) failed to import there, saying only
    FileNotFoundError. The files `[snapshot] include` lists travel with the run, as they were
    when it was enqueued; without them, the error says how to list them."""
    write_play(DATA_BESIDE, "weighted.py")
    (tmp_path / "weights.json").write_text('{"w": 0.7}')
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "segments.txt").write_text("smb enterprise")
    (tmp_path / "service-account.json").write_text('{"private_key": "x"}')  # not listed: never carried
    assert deepline("run", "weighted.py", "--enqueue", "--run-id", "w-0").code == 0
    assert deepline("worker", "--once").code == 0
    failed = runs_of(deepline)["w-0"]
    assert failed["status"] == "failed" and "[snapshot]" in failed["error"]["message"], failed

    (tmp_path / "deepline.toml").write_text('[snapshot]\ninclude = ["weights.json", "lists/*.txt"]\n')
    assert deepline("run", "weighted.py", "--enqueue", "--run-id", "w-1").code == 0
    (tmp_path / "weights.json").write_text('{"w": 0.9}')  # changed after: the run has its own
    worker = deepline("worker", "--once")
    assert worker.code == 0, worker.stderr
    run = runs_of(deepline)["w-1"]
    assert (run["status"], run["output"]) == ("completed", {"w": 0.7, "segments": ["smb", "enterprise"]}), run
    snapshots = list((tmp_path / "cache").rglob("service-account.json"))
    assert snapshots == []

    (tmp_path / "deepline.toml").write_text('[snapshot]\ninclude = ["weight.json"]\n')
    refused = deepline("run", "weighted.py", "--enqueue", "--run-id", "w-2")
    assert refused.code == 2 and "'weight.json' matches no file" in refused.stderr, refused.stderr


def test_an_enqueued_run_a_worker_cannot_start_says_when_it_ended(deepline, write_play, monkeypatch) -> None:
    """A queued run whose secret is not set where the worker runs fails there before its
    first attempt: `runs show` had no `finished` for it."""
    write_play(
        """
        from deepline_cli import play

        @play("secretive", secrets=["SECRETIVE_KEY"])
        async def secretive(ctx, input):
            return 1
        """,
        "secretive.py",
    )
    monkeypatch.setenv("SECRETIVE_KEY", "k")
    assert deepline("run", "secretive.py", "--enqueue", "--run-id", "s-1").code == 0
    monkeypatch.delenv("SECRETIVE_KEY")
    deepline("worker", "--once")
    run = runs_of(deepline)["s-1"]
    assert run["status"] == "failed" and "SECRETIVE_KEY" in run["error"]["message"], run
    assert run["finished_at"] is not None, run


FIXED_LATER = """
from pathlib import Path
from deepline_cli import play, tool

@tool("lookup.once")
def lookup(input):
    if not Path(input["flag"]).exists():
        raise ValueError("no such company")
    return "found"

@play("fixed")
async def fixed(ctx, input):
    return (await ctx.tools.execute("l", "lookup.once", {"flag": input["flag"]})).output
"""


def test_a_failed_run_queued_again_with_refresh_failed_asks_its_failures_again(deepline, write_play, tmp_path) -> None:
    """`run --enqueue --run-id RUN --refresh-failed` of a failed run: the worker replayed the
    run's own failure (the flag was kept, but not as given to that attempt) and the run failed
    again; `deepline resume RUN --refresh-failed` asked it again."""
    write_play(FIXED_LATER, "fixed.py")
    payload = json.dumps({"flag": str(tmp_path / "flag")})
    assert deepline("run", "fixed.py", "--enqueue", "--run-id", "fx", "--input", payload).code == 0
    deepline("worker", "--once")
    assert runs_of(deepline)["fx"]["status"] == "failed"
    (tmp_path / "flag").write_text("")
    again = deepline("run", "fixed.py", "--enqueue", "--run-id", "fx", "--input", payload, "--refresh-failed")
    assert again.code == 0, again.stderr
    deepline("worker", "--once")
    run = runs_of(deepline)["fx"]
    assert (run["status"], run["output"]) == ("completed", "found"), run


def test_snapshot_include_takes_names_as_listed_and_leaves_hidden_files(deepline, write_play, tmp_path) -> None:
    """A linked data file was carried under its target's name (the play found no
    `weights.json`); `*.json` carried `.creds.json`; an absolute pattern ended in an internal
    error."""
    from deepline_cli.runtime.run.snapshot import included_files

    (tmp_path / "versions").mkdir()
    (tmp_path / "versions" / "v3.json").write_text("{}")
    (tmp_path / "weights.json").symlink_to(tmp_path / "versions" / "v3.json")
    (tmp_path / ".creds.json").write_text('{"key": "x"}')
    config = tmp_path / "deepline.toml"
    (tmp_path / ".venv" / "bin").mkdir(parents=True)  # a hidden link out of the folder, not asked for
    (tmp_path / ".venv" / "bin" / "python").symlink_to(sys.executable)
    config.write_text('[snapshot]\ninclude = ["*.json", "**/*.json"]\n')
    assert sorted(included_files(config, tmp_path)) == ["versions/v3.json", "weights.json"]
    config.write_text('[snapshot]\ninclude = ["**/*"]\n')
    assert ".venv/bin/python" not in included_files(config, tmp_path)
    config.write_text('[snapshot]\ninclude = [".creds.json"]\n')  # named: taken, as asked
    assert sorted(included_files(config, tmp_path)) == [".creds.json"]
    conf = tmp_path / "conf"  # a deepline.toml in a folder of its own: `..` back to the play's
    conf.mkdir()
    (conf / "deepline.toml").write_text('[snapshot]\ninclude = ["../weights.json", "../versions/*.json"]\n')
    assert sorted(included_files(conf / "deepline.toml", tmp_path)) == ["versions/v3.json", "weights.json"]
    config.write_text('[snapshot]\ninclude = ["/etc/hostname"]\n')
    write_play(FIXED_LATER, "fixed.py")
    refused = deepline("run", "fixed.py", "--enqueue", "--run-id", "abs", "--set", "flag=x")
    assert refused.code == 2 and "must be relative to" in refused.stderr, refused.stderr
