"""SIGKILL in the middle of a map, then `deepline resume` (SPEC §2, §4): nothing finished is
redone, every input row is accounted for, and the export equals an uninterrupted run."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from deepline_cli import _json
from tests.helpers import wait_until

pytestmark = pytest.mark.process

DISTINCT = 1000
DUPLICATES = 50
KILL_AT = 250  # finished rows: the kill lands a quarter of the way through the map

PLAY = """\
import asyncio

from deepline_cli import play, tool

@tool("crash.first")
async def first(input):
    await asyncio.sleep(0.002 + (int(input["id"]) % 4) * 0.001)
    with open(input["log"], "a", encoding="utf-8") as log:
        log.write(input["id"] + "\\n")
        log.flush()
    return {"n": int(input["id"]) * 7}

@tool("crash.second")
async def second(input):
    await asyncio.sleep(0.002 + (input["n"] % 3) * 0.001)
    return {"label": input["name"].upper() + "-" + str(input["n"])}

@play("crashy")
async def crashy(ctx, input):
    rows = ctx.csv(input["csv"], required=["id", "name"])
    ds = await ctx.map("rows", rows, key="id", concurrency=8, columns={
        "first": lambda row, rc: rc.tools.execute(
            "first", "crash.first", {"id": row["id"], "log": input["log"]}),
        "second": lambda row, rc: rc.tools.execute(
            "second", "crash.second", {"name": row["name"], "n": row["first"]["n"]}),
    })
    return {"rows": len(ds), "failed": ds.failed_count}
"""


def write_rows(path: Path) -> None:
    """DISTINCT rows, with DUPLICATES repeats of earlier ids spread through the file."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "name"])
        every = DISTINCT // DUPLICATES
        for i in range(DISTINCT):
            writer.writerow([str(i), f"name {i}"])
            if i % every == every - 1:
                j = i // 2
                writer.writerow([str(j), f"name {j}"])


def finished_rows(store: Path, run_id: str) -> set[str]:
    """Row keys of the run's finished map rows, read through a read-only connection."""
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=5)
    try:
        return {key for (key,) in conn.execute("SELECT row_key FROM map_rows WHERE run_id = ?", (run_id,))}
    finally:
        conn.close()


def count_finished(store: Path, run_id: str) -> int:
    if not store.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=1)
    except sqlite3.Error:
        return 0
    try:
        return conn.execute("SELECT count(*) FROM map_rows WHERE run_id = ?", (run_id,)).fetchone()[0]
    except sqlite3.Error:  # not created yet
        return 0
    finally:
        conn.close()


def logs(store: Path, run_id: str) -> list[str]:
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        return [m for (m,) in conn.execute("SELECT message FROM logs WHERE run_id = ? ORDER BY id", (run_id,))]
    finally:
        conn.close()


def test_sigkill_mid_map_then_resume(deepline, tmp_path: Path, store_path: Path, cli_env) -> None:
    write_rows(tmp_path / "rows.csv")
    (tmp_path / "play.py").write_text(PLAY)
    tool_log = tmp_path / "tool.log"

    with (tmp_path / "killed.out").open("w") as out, (tmp_path / "killed.err").open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deepline_cli", "run", "play.py", "--csv", "rows.csv",
             "--set", f"log={tool_log}", "--run-id", "crash-1", "--quiet"],
            cwd=tmp_path, env=cli_env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while count_finished(store_path, "crash-1") < KILL_AT:
                assert proc.poll() is None, "the run ended before it could be killed"
                assert time.monotonic() < deadline, f"the map never reached {KILL_AT} finished rows"
                time.sleep(0.005)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    at_kill = finished_rows(store_path, "crash-1")
    assert KILL_AT <= len(at_kill) < DISTINCT, "the kill did not land mid-way through the map"
    # `runs show` of the killed run: the duplicates read before its furthest row (it said 0)
    with (tmp_path / "rows.csv").open(newline="") as handle:
        ids = [line[0] for line in csv.reader(handle)][1:]
    first = {}
    for place, key in enumerate(ids):
        first.setdefault(key, place)
    furthest = max(first[key] for key in at_kill)
    killed_run = json.loads(deepline("runs", "show", "crash-1", "--json").stdout)
    (shown,) = killed_run["maps"]
    assert shown["duplicate"] == furthest + 1 - len(set(ids[: furthest + 1])) > 0, shown
    # as long as its calls went on at least (it said 0.05s: its record's creation to its update)
    conn = sqlite3.connect(f"file:{store_path}?mode=ro", uri=True)
    try:
        (span,) = conn.execute("SELECT max(ended_at) - min(started_at) FROM calls WHERE run_id = 'crash-1'").fetchone()
    finally:
        conn.close()
    assert killed_run["stats"]["duration_s"] >= span > 0, (killed_run["stats"]["duration_s"], span)

    resumed = deepline("resume", "crash-1", "--json")

    events = resumed.json_lines()
    assert resumed.code == 0, resumed.stderr or events[-1].get("error")
    finished = events[-1]
    assert (finished["event"], finished["status"], finished["attempt"]) == ("run.finished", "completed", 2)
    assert finished["output"] == {"rows": DISTINCT, "failed": 0}
    [started] = [e for e in events if e["event"] == "map.started"]
    assert started["seeded"] == len(at_kill)

    # the killed attempt is shown ended (killed, when it was last heard of), not running
    full = json.loads(deepline("runs", "show", "crash-1", "--full", "--json").stdout)
    killed, done = full["attempts"]
    assert (killed["status"], done["status"]) == ("killed", "completed")
    assert killed["started_at"] < killed["ended_at"] <= done["started_at"]

    # every input row is accounted for
    assert finished_rows(store_path, "crash-1") == {str(i) for i in range(DISTINCT)}
    summary = f"Map completed: {DISTINCT} results ({DISTINCT} succeeded, 0 failed, {DUPLICATES} duplicate keys skipped)"
    assert summary in logs(store_path, "crash-1")

    # rows finished before the kill were not executed again
    invoked = Counter(tool_log.read_text().split())
    assert set(invoked) == {str(i) for i in range(DISTINCT)}
    again = sorted(key for key in at_kill if invoked[key] != 1)
    assert again == [], f"finished rows executed again: {again[:10]}"

    # the export equals an uninterrupted run of the same play in a fresh store
    fresh = tmp_path / "fresh.db"
    reference = deepline(
        "run", "play.py", "--csv", "rows.csv", "--set", f"log={tmp_path / 'reference.log'}",
        "--run-id", "reference-1", "--quiet", DEEPLINE_STORE=str(fresh),
    )  # fmt: skip
    assert reference.code == 0, reference.stderr
    exported = deepline("export", "crash-1")
    expected = deepline("export", "reference-1", DEEPLINE_STORE=str(fresh))
    assert exported.code == 0, exported.stderr
    assert expected.code == 0, expected.stderr
    got = list(csv.reader(io.StringIO(exported.stdout)))
    want = list(csv.reader(io.StringIO(expected.stdout)))
    assert got[0] == want[0] == ["id", "name", "first", "second", "_error"]
    assert len(got) == DISTINCT + 1
    assert sorted(got[1:]) == sorted(want[1:])
    assert got[1:] == want[1:]  # both in input order
    assert _json.loads(got[1 + 567][3]) == {"label": f"NAME 567-{567 * 7}"}


def killed_when(tmp_path: Path, env: dict[str, str], run_id: str, ready: Callable[[], bool], *args: str) -> None:
    """`deepline run play.py ARGS --run-id RUN_ID`, SIGKILLed as soon as `ready()` says so."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "deepline_cli", "run", "play.py", *args, "--run-id", run_id, "--quiet"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready():
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "the run never got to where it was to be killed"
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)


def killed_while_held(tmp_path: Path, store: Path, env: dict[str, str], run_id: str, finished: int, *args: str) -> None:
    """`deepline run play.py` with `mark` set to a file its held row creates: SIGKILLed once
    that row is held and `finished` rows are recorded."""
    mark = tmp_path / "holding"

    def held() -> bool:
        return mark.exists() and count_finished(store, run_id) >= finished

    killed_when(tmp_path, env, run_id, held, *args, "--set", f"mark={mark}")


def test_a_killed_maps_row_total_counts_csv_rows_not_lines(deepline, tmp_path: Path, store_path: Path, cli_env) -> None:
    """A CSV of 101 lines holding 50 rows (each with a quoted newline) and 40 distinct keys,
    killed while its third row is out (most rows not yet handed out): its input is read
    ahead, so the map's total is 40 for `runs show` and `export`, as when the map completes
    (it was the file's line count, 100, and then the rows handed out so far)."""
    rows = [f'{i},"two\nlines"\n' for i in range(1, 41)] + [f'{i},"two\nlines"\n' for i in range(1, 11)]
    (tmp_path / "rows.csv").write_text("id,note\n" + "".join(rows))
    (tmp_path / "play.py").write_text(
        "import asyncio\n"
        "from deepline_cli import play, tool\n\n"
        '@tool("hold.row")\n'
        "async def hold(input):\n"
        '    if input["id"] == "3":\n'
        '        open(input["mark"], "w").close()\n'
        "        await asyncio.sleep(60)\n"
        '    return input["id"]\n\n'
        '@play("held")\n'
        "async def held(ctx, input):\n"
        '    rows = await ctx.map("rows", ctx.csv(input["csv"]), key="id", concurrency=1, columns={\n'
        '        "v": lambda row, rc: rc.tools.execute("hold", "hold.row", {"id": row["id"], "mark": input["mark"]}),\n'
        "    })\n"
        "    return len(rows)\n"
    )
    killed_while_held(tmp_path, store_path, cli_env, "lines", 2, "--csv", "rows.csv")
    shown = json.loads(deepline("runs", "show", "lines", "--json").stdout)
    [rows] = shown["maps"]
    assert (rows["rows"], rows["duplicate"]) == (40, 10), rows
    export = deepline("export", "lines")
    assert "2 of 40 rows" in export.stderr, export.stderr


FLAKY_TENTH = """\
import asyncio

from pathlib import Path

from deepline_cli import ProviderTransientError, play, tool

STOP = Path(__file__).with_name("stop")

@tool("flaky.tenth")
async def tenth(input):
    await asyncio.sleep(0.003)
    if input["n"] % 10 == 0:  # a provider that is down for these, every time
        raise ProviderTransientError(f"503 for {input['n']}", category="upstream", status_code=503)
    return input["n"]

async def value(row, rc):
    if row["n"] == 150 and STOP.exists():  # a row that failed before: the resume asks it again early
        return {}["a bug"]  # a bug in the play: the map stops there, the later failed rows not asked again
    return await rc.tools.execute("t", "flaky.tenth", {"n": row["n"]})

@play("tenths")
async def tenths(ctx, input):
    rows = await ctx.map("m", [{"n": n} for n in range(1, 1201)], key="n", concurrency=8, columns={"v": value})
    return {"rows": len(rows), "failed": rows.failed_count}
"""


def test_a_resume_that_asks_again_the_rows_that_failed_is_not_stopped_as_a_systemic_failure(
    deepline, tmp_path: Path, store_path: Path, cli_env
) -> None:
    """Attempt 1 was stopped with 30-odd rows failed (every tenth: that provider is down for
    them). A resume asks those again first; they fail again, the same way, and were taken
    for the map's "first 20 rows all failing the same way": every resume stopped there, the
    rest of the list never computed, --refresh-failed or not. Those rows are not the map's
    first: the resume goes on through the list."""
    (tmp_path / "play.py").write_text(FLAKY_TENTH)
    proc = subprocess.Popen(
        [sys.executable, "-m", "deepline_cli", "run", "play.py", "--run-id", "tenths", "--quiet"],
        cwd=tmp_path, env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while count_finished(store_path, "tenths") < 300:
            assert proc.poll() is None, "the run ended before it could be stopped"
            assert time.monotonic() < deadline, "the map never reached 300 finished rows"
            time.sleep(0.005)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        proc.kill()
        proc.wait(timeout=30)
        assert proc.stderr is not None
        proc.stderr.close()
    (tmp_path / "stop").touch()
    stopped = deepline("resume", "tenths")  # stops at the play's bug among the rows that failed
    assert stopped.code == 1 and "row 150" in stopped.stderr, stopped.stderr
    # The stopped map's line counts the rows its run counts (it gave its last attempt's tally,
    # without the failed rows of the first attempt it had not asked again).
    shown = json.loads(deepline("runs", "show", "tenths", "--json").stdout)
    (m,) = shown["maps"]
    rows = shown["stats"]["rows"]
    assert (m["succeeded"], m["failed"]) == (rows["succeeded"], rows["failed"]), (m, rows)
    (tmp_path / "stop").unlink()
    resumed = deepline("resume", "tenths", "--json")
    finished = resumed.json_lines()[-1]
    assert (finished["status"], finished["output"]) == ("completed", {"rows": 1200, "failed": 120}), resumed.stderr


def test_the_failed_rows_of_a_killed_run_are_listed(deepline, tmp_path: Path, store_path: Path, cli_env) -> None:
    """`runs logs --kind row.failed` of a SIGKILLed run printed nothing, while `runs show`
    and the export had its failed rows: the map's failed count, which it writes as it ends,
    said none. Its failed rows are read from the store, as for a map that ended."""
    (tmp_path / "play.py").write_text(
        "import asyncio\n"
        "from deepline_cli import play, tool\n\n"
        '@tool("hold.row")\n'
        "async def hold(input):\n"
        '    if input["n"] == 6:\n'
        '        open(input["mark"], "w").close()\n'
        "        await asyncio.sleep(60)\n"
        '    if input["n"] % 2:\n'
        "        raise ValueError(f\"no lead {input['n']}\")\n"
        '    return input["n"]\n\n'
        '@play("held")\n'
        "async def held(ctx, input):\n"
        '    rows = await ctx.map("rows", [{"n": n} for n in range(10)], key="n", concurrency=1, columns={\n'
        '        "v": lambda row, rc: rc.tools.execute("hold", "hold.row", {"n": row["n"], "mark": input["mark"]}),\n'
        "    })\n"
        "    return len(rows)\n"
    )
    killed_while_held(tmp_path, store_path, cli_env, "killed", 6)
    listed = deepline("runs", "logs", "killed", "--kind", "row.failed", "--json")
    assert listed.code == 0, listed.stderr
    assert [line["fields"]["row_key"] for line in listed.json_lines()] == ["1", "3", "5"], listed.stdout


BLOCKING_STEPS = """\
import time

from deepline_cli import play

def pay(row, log):  # a sync SDK's paid call: it blocks the event loop while it waits
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(row["id"] + "\\n")
    time.sleep(0.04)
    return {"paid": row["id"]}

@play("blocking")
async def blocking(ctx, input):
    rows = [{"id": str(i)} for i in range(30)]
    ds = await ctx.map("rows", rows, key="id", concurrency=10, columns={
        "paid": lambda row, rc: rc.step("pay", lambda: pay(row, input["log"])),
    })
    return {"rows": len(ds), "failed": ds.failed_count}
"""


# The same paid call in an `async def` that blocks all the same (a sync SDK called inside it):
# as a step, and as a local tool.
ASYNC_BLOCKING_STEPS = BLOCKING_STEPS.replace("def pay(row, log):", "async def pay(row, log):")
ASYNC_BLOCKING_TOOL = """\
import time

from deepline_cli import play, tool

@tool("sdk.pay")
async def pay(input):  # awaits nothing: the sync SDK's call holds the event loop
    with open(input["log"], "a", encoding="utf-8") as handle:
        handle.write(input["id"] + "\\n")
    time.sleep(0.04)
    return {"paid": input["id"]}

@play("blocking")
async def blocking(ctx, input):
    rows = [{"id": str(i)} for i in range(30)]
    ds = await ctx.map("rows", rows, key="id", concurrency=10, columns={
        "paid": lambda row, rc: rc.tools.execute("pay", "sdk.pay", {"id": row["id"], "log": input["log"]}),
    })
    return {"rows": len(ds), "failed": ds.failed_count}
"""


@pytest.mark.parametrize(
    "source", [BLOCKING_STEPS, ASYNC_BLOCKING_STEPS, ASYNC_BLOCKING_TOOL], ids=["def-step", "async-step", "async-tool"]
)
def test_a_kill_does_not_pay_again_the_blocking_steps_answered_before_it(
    deepline, tmp_path: Path, store_url: str, cli_env, source: str
) -> None:
    """A step or tool that blocks (a sync SDK inside `rc.step`, or inside an `async def`)
    holds the event loop: its answer is committed as it returns, so a kill asks again only
    the call it cut."""
    (tmp_path / "play.py").write_text(source)
    cli_env["DEEPLINE_STORE"] = store_url
    paid = tmp_path / "paid.log"

    def fourteen_paid() -> bool:
        return paid.exists() and len(paid.read_text().split()) >= 14

    killed_when(tmp_path, cli_env, "blocking-1", fourteen_paid, "--set", f"log={paid}")
    before = len(paid.read_text().split())

    resumed = deepline("resume", "blocking-1", "--json", DEEPLINE_STORE=store_url)

    assert resumed.code == 0, resumed.stderr
    assert resumed.json_lines()[-1]["output"] == {"rows": 30, "failed": 0}
    calls = Counter(paid.read_text().split())
    assert set(calls) == {str(i) for i in range(30)}
    again = sorted((key for key, n in calls.items() if n > 1), key=int)
    assert len(again) <= 1, f"{len(again)} steps answered before the kill ({before} paid) were paid again: {again}"


HELD_BY_TURNS = """\
import asyncio
import time

from deepline_cli import play

def paid(log, tag):
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(tag + "\\n")

async def a(log):  # a sync SDK's paid call, then one await before it returns
    paid(log, "a")
    time.sleep(0.05)
    await asyncio.sleep(0)
    return "a"

async def x(log):  # another blocking call that returns while `a` is suspended: commit_now
    paid(log, "x")
    time.sleep(0.05)
    return "x"

async def b(log, mark):  # the next blocking call: holds the loop 30 s
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    paid(log, "b")
    open(mark, "w").close()
    time.sleep(30)
    return "b"

@play("cap")
async def cap(ctx, input):
    log, mark = input["log"], input["mark"]
    return await asyncio.gather(
        ctx.step("a", lambda: a(log)), ctx.step("x", lambda: x(log)), ctx.step("b", lambda: b(log, mark)),
    )
"""


@pytest.mark.process
def test_an_answered_step_is_committed_before_the_next_blocking_call(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """A blocking `async def` step that awaits once more before it returns, while another
    call's answer is committed on the loop: its hold was counted only from that commit (none),
    so its answer waited for the writer, the next blocking call held the loop, and a kill paid
    it again. An outer step leaves out only what was counted inside its own steps."""
    (tmp_path / "play.py").write_text(HELD_BY_TURNS)
    log, mark = tmp_path / "paid.log", tmp_path / "blocking"
    proc = subprocess.Popen(
        [sys.executable, "-m", "deepline_cli", "run", "play.py", "--set", f"log={log}", "--set", f"mark={mark}",
         "--run-id", "cap-1", "--quiet"],
        cwd=tmp_path, env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(mark.exists, what="the run reaching b", alive=proc, every=0.005)
        os.kill(proc.pid, signal.SIGKILL)  # b holds the loop (30 s): nothing more is committed
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert log.read_text().split() == ["a", "x", "b"]
    mark.unlink()
    # b blocks 30 s again on the resume: only a's and x's payments matter, so it is killed there.
    resumed = subprocess.Popen(
        [sys.executable, "-m", "deepline_cli", "resume", "cap-1", "--quiet"],
        cwd=tmp_path, env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(mark.exists, what="the resume reaching b", alive=resumed, every=0.005)
    finally:
        resumed.kill()
        resumed.wait(timeout=30)
    paid = log.read_text().split()
    assert paid.count("x") == 1
    assert paid.count("a") == 1, f"a, answered before the kill, was paid again: {paid}"


NONDETERMINISTIC_BEFORE = """
import os, signal, time
from pathlib import Path
from deepline_cli import play

HERE = Path(__file__).parent

def stamp(row):
    return time.time_ns()  # another value each time the row is computed

async def label(row, rc):
    def make():
        time.sleep(0.03)  # held the loop: its answer is committed at once
        with open(HERE / "made.txt", "a") as made:
            made.write(row["id"] + "\\n")
        return "L" + row["id"]
    return await rc.step("label", make)

def boom(row):
    flag = HERE / "killed"
    if not flag.exists():
        flag.touch()
        os.kill(os.getpid(), signal.SIGKILL)  # after the step was recorded, before the row was
    return 1

@play("nondet")
async def nondet(ctx, input):
    rows = await ctx.map("m", [{"id": "1"}], key="id", concurrency=1,
                         columns={"at": stamp, "label": label, "boom": boom})
    return [r["label"] for r in rows]
"""


@pytest.mark.process
def test_an_rc_step_is_given_back_to_its_row_redone_after_a_kill_whatever_the_columns_before_it_hold(
    deepline_process, tmp_path: Path
) -> None:
    """A row cut short by a kill after its `rc.step` was recorded is computed again on resume;
    a column before the step gives another value (a time) then, and the step was made again
    (an rc.fetch: paid again) where nothing of its cell's code or input had changed."""
    (tmp_path / "play.py").write_text(NONDETERMINISTIC_BEFORE)
    killed = deepline_process("run", "play.py", "--run-id", "nd")
    assert killed.code == -signal.SIGKILL, killed.stderr
    resumed = deepline_process("resume", "nd", "--quiet")
    assert resumed.code == 0, resumed.stderr
    assert json.loads(resumed.stdout) == ["L1"]
    assert (tmp_path / "made.txt").read_text().split() == ["1"]  # made once
