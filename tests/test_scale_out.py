"""Scale-out that survives production: workers find due runs among many sleeping ones,
runs and workers ride out a dropped PostgreSQL connection, an enqueued play brings its
local modules, a changed helper recomputes the cells that use it, and a store written by
deepline 0.1.0 migrates."""

from __future__ import annotations

import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from deepline_cli import _json
from deepline_cli.runtime.calls.events import EventBus
from deepline_cli.runtime.run.options import RunOptions
from deepline_cli.runtime.run.runner import Runner
from deepline_cli.store import open_store
from deepline_cli.store.records import ReceiptQuery
from tests.conftest import ROOT, Result
from tests.faults import finish, kill, start
from tests.helpers import wait_until
from tests.pgproxy import PgProxy

pytestmark = pytest.mark.process
Run = Callable[..., Result]


def test_a_store_written_by_0_1_0_migrates_and_its_queued_run_runs(deepline: Run, tmp_path: Path) -> None:
    store = tmp_path / "old.db"
    with sqlite3.connect(store) as conn:
        conn.executescript((ROOT / "tests/data/store-0.1.0.sql").read_text())
    env = {"DEEPLINE_STORE": str(store)}

    exported = deepline("export", "done-run", "--format", "jsonl", **env)
    assert exported.code == 0, exported.stderr
    assert [r["loud"]["said"] for r in exported.json_lines()] == ["A!", "B!"]

    worked = deepline("worker", "--once", **env)
    assert worked.code == 0, worked.stderr
    assert "1 started, 1 completed" in worked.stderr
    shown = _json.loads(deepline("runs", "show", "queued-run", "--json", **env).stdout)
    assert (shown["status"], shown["output"]) == ("completed", {"rows": 1})
    assert "snapshot" not in shown["options"]  # moved to its own table, keyed by digest


SLEEPER = """
from deepline_cli import play

@play("sleeper")
async def sleeper(ctx, input):
    await ctx.sleep("nap", 3 * 86400)
    return "woke"

@play("waiter")
async def waiter(ctx, input):
    return await ctx.wait_for_event("go")
"""


def test_a_worker_finds_the_run_whose_event_arrived_among_many_sleeping_runs(
    deepline: Run, write_play: Callable[..., Path], store_url: str
) -> None:
    play = write_play(SLEEPER)
    options = RunOptions(store=store_url, max_inline_wait=0)
    for _ in range(120):  # far more than a worker looks at in one scan
        runner = Runner(options, EventBus())
        try:
            assert runner.start(f"{play}:sleeper", {}).status == "waiting"
        finally:
            runner.close()
    env = {"DEEPLINE_STORE": store_url}
    waiting = deepline("run", f"{play}:waiter", "--run-id", "wanted", "--max-inline-wait", "0", **env)
    assert waiting.code == 3, waiting.stderr
    assert deepline("events", "send", "wanted", "go", "--payload", '"now"', **env).code == 0

    worked = deepline("worker", "--once", **env)

    assert "1 started, 1 completed" in worked.stderr, worked.stderr
    shown = _json.loads(deepline("runs", "show", "wanted", "--json", **env).stdout)
    assert (shown["status"], shown["output"]) == ("completed", "now")


HELPED = """
from deepline_cli import play
from helpers.text import shout
import tidy

@play("helped")
async def helped(ctx, input):
    rows = await ctx.map("w", [{"w": w} for w in input["words"]], key="w",
                         columns={"loud": lambda row: shout(tidy.strip(row["w"]))})
    return [r["loud"] for r in rows]
"""


def test_an_enqueued_play_brings_the_modules_it_imports_from_its_folder(
    deepline: Run, tmp_path: Path, store_path: Path
) -> None:
    folder = tmp_path / "plays"
    (folder / "helpers").mkdir(parents=True)
    (folder / "play.py").write_text(HELPED)
    (folder / "tidy.py").write_text("def strip(w):\n    return w.strip()\n")
    (folder / "helpers" / "__init__.py").write_text("")
    (folder / "helpers" / "text.py").write_text("def shout(w):\n    return w.upper() + '!'\n")
    queued = deepline("run", "plays/play.py", "--input", '{"words": [" a", "b "]}', "--run-id", "q", "--enqueue")
    assert queued.code == 0, queued.stderr
    shutil.move(folder, tmp_path / "gone")  # the worker has only what the snapshot holds

    worked = deepline("worker", "--once", cwd=tmp_path)

    assert "1 started, 1 completed" in worked.stderr, worked.stderr
    assert _json.loads(deepline("runs", "show", "q", "--json").stdout)["output"] == ["A!", "B!"]


PARENT = """\
from deepline_cli import play

@play("parent")
async def parent(ctx, input):
    return await ctx.run_play("kid", "kids/child.py", {"word": input["word"]})
"""
CHILD = """\
from deepline_cli import play
from kidlib import shout

@play("child")
async def child(ctx, input):
    return await ctx.run_play("grandkid", "grandchild.py:grand", {"word": shout(input["word"])})
"""
GRANDCHILD = """\
from deepline_cli import play

@play("grand")
async def grand(ctx, input):
    return input["word"] + "?"
"""


def test_an_enqueued_play_brings_the_child_plays_it_runs_by_path(deepline: Run, tmp_path: Path) -> None:
    """`ctx.run_play("kid", "kids/child.py")` names a play file the parent never imports: it
    travels with the run too (with what it imports, and the plays it runs in turn)."""
    folder = tmp_path / "plays"
    (folder / "kids").mkdir(parents=True)
    (folder / "play.py").write_text(PARENT)
    (folder / "kids" / "child.py").write_text(CHILD)
    (folder / "kids" / "kidlib.py").write_text("def shout(w):\n    return w.upper()\n")
    (folder / "kids" / "grandchild.py").write_text(GRANDCHILD)
    queued = deepline("run", "plays/play.py", "--set", "word=hi", "--run-id", "q", "--enqueue")
    assert queued.code == 0, queued.stderr
    shutil.move(folder, tmp_path / "gone")  # the worker has only what the snapshot holds

    worked = deepline("worker", "--once", cwd=tmp_path)

    assert "3 completed, 0 failed" in worked.stderr, worked.stderr  # the parent, its child, its grandchild
    assert _json.loads(deepline("runs", "show", "q", "--json").stdout)["output"] == "HI?"


COUSIN = """\
from deepline_cli import play
from tidy import strip

@play("cousin")
async def cousin(ctx, input):
    return await ctx.run_play("g", "deeper/grand.py", {"word": strip(input["word"])}) + "!"
"""
GRAND = """\
from deepline_cli import play
from tidy import strip

@play("grand")
async def grand(ctx, input):
    return strip(input["word"]) + "?"
"""


def test_a_child_play_in_a_subfolder_imports_a_module_from_its_parents_folder_under_a_worker(
    deepline: Run, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """`kids/cousin.py` (and the `kids/deeper/grand.py` it runs) import `tidy` from the top
    play's folder, as they do when the parent runs them in its own process (that folder is
    on the path): under a worker, in a process of its own, each one's snapshot carries it."""
    folder = tmp_path / "plays"
    (folder / "kids").mkdir(parents=True)
    (folder / "play.py").write_text(PARENT.replace("kids/child.py", "kids/cousin.py"))
    (folder / "kids" / "cousin.py").write_text(COUSIN)
    (folder / "kids" / "deeper").mkdir()
    (folder / "kids" / "deeper" / "grand.py").write_text(GRAND)
    (folder / "tidy.py").write_text("def strip(w):\n    return w.strip()\n")
    queued = deepline("run", "plays/play.py", "--set", "word= hi ", "--run-id", "q", "--enqueue")
    assert queued.code == 0, queued.stderr
    shutil.move(folder, tmp_path / "gone")  # the worker has only what the snapshot holds

    code, _, err = finish(start(["worker", "--once"], cli_env, tmp_path), timeout=60)

    assert code == 0 and "3 completed, 0 failed" in err, err
    assert _json.loads(deepline("runs", "show", "q", "--json").stdout)["output"] == "hi?!"
    # The children ran in the parent's worker, which had `tidy` loaded already; a worker on
    # another machine has only a child's snapshot: it must hold the module, a level down too.
    db = open_store(cli_env["DEEPLINE_STORE"])
    try:
        (kid,) = db.runs.child_runs("q")
        (child,) = db.runs.child_runs(kid.run_id)
        snapshot = db.queue.get_snapshot(child.snapshot or "")
    finally:
        db.close()
    assert snapshot is not None and "tidy.py" in snapshot["files"], sorted(snapshot["files"]) if snapshot else None
    # And in a process of its own, the child's snapshot alone loads and runs it.
    loads = (
        "import asyncio, json, sys\n"
        "from deepline_cli.runtime.run.snapshot import materialize_snapshot\n"
        "from deepline_cli.runtime.run.play import load_play\n"
        "ref, _ = materialize_snapshot(sys.argv[1], json.loads(sys.stdin.read()))\n"
        "print(asyncio.run(load_play(ref).fn(None, {'word': ' yo '})))\n"
    )
    alone = subprocess.run(
        [sys.executable, "-c", loads, child.snapshot or ""], input=_json.dumps_str(snapshot), env=cli_env,
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert alone.returncode == 0 and alone.stdout.strip() == "yo?", alone.stderr


SECRETIVE = """\
from deepline_cli import play

@play("secretive", secrets=["QUEUE_TOKEN"])
async def secretive(ctx, input):
    return len(ctx.secrets.get("QUEUE_TOKEN"))
"""


def test_an_enqueued_run_taken_here_reads_the_dotenv_of_the_folder_it_runs_in(deepline: Run, tmp_path: Path) -> None:
    """Secrets do not travel with a snapshot: a queued run run here (by `run --run-id` or
    `resume` in the play's folder, or a worker started there) reads that folder's `.env`."""
    folder = tmp_path / "plays"
    folder.mkdir()
    (folder / "play.py").write_text(SECRETIVE)
    (folder / ".env").write_text("QUEUE_TOKEN=abcdefgh12345\n")
    assert deepline("run", "play.py", "--run-id", "q", "--enqueue", cwd=folder).code == 0
    ran = deepline("run", "play.py", "--run-id", "q", cwd=folder)
    assert ran.code == 0, ran.stderr
    assert ran.stdout.strip() == "13"


def test_an_enqueued_play_brings_linked_and_non_utf8_modules_and_refuses_links_outside(
    deepline: Run, tmp_path: Path
) -> None:
    """`tidy.py` is a link to a file in the play's folder, `helpers/text.py` is Latin-1 (it
    says so): both travel with the run. A module linked from outside the folder is refused
    in one sentence (a worker would not have it)."""
    folder = tmp_path / "plays"
    (folder / "helpers").mkdir(parents=True)
    (folder / "shared").mkdir()
    (folder / "play.py").write_text(HELPED)
    (folder / "shared" / "tidy_impl.py").write_text("def strip(w):\n    return w.strip()\n")
    (folder / "tidy.py").symlink_to(folder / "shared" / "tidy_impl.py")
    (folder / "helpers" / "__init__.py").write_text("")
    latin = "# -*- coding: latin-1 -*-\nMARK = 'é'\ndef shout(w):\n    return w.upper() + MARK\n"
    (folder / "helpers" / "text.py").write_bytes(latin.encode("latin-1"))
    queued = deepline("run", "plays/play.py", "--input", '{"words": [" a"]}', "--run-id", "q", "--enqueue")
    assert queued.code == 0, queued.stderr
    shutil.move(folder, tmp_path / "gone")

    worked = deepline("worker", "--once", cwd=tmp_path)

    assert "1 started, 1 completed" in worked.stderr, worked.stderr
    assert _json.loads(deepline("runs", "show", "q", "--json").stdout)["output"] == ["Aé"]

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "tidy.py").write_text("def strip(w):\n    return w\n")
    moved = tmp_path / "gone"
    (moved / "tidy.py").unlink()
    (moved / "tidy.py").symlink_to(outside / "tidy.py")
    refused = deepline("run", "gone/play.py", "--input", '{"words": []}', "--enqueue")
    assert refused.code == 2, refused.stderr
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "tidy.py is a link to" in lines[0] and "outside the play's folder" in lines[0]


def test_a_snapshot_past_its_size_bound_is_refused_in_one_sentence(
    deepline: Run, tmp_path: Path, write_play: Callable[..., Path]
) -> None:
    write_play(HELPED.replace("from helpers.text import shout\n", "from bulky import shout\n"))
    (tmp_path / "tidy.py").write_text("def strip(w):\n    return w\n")
    (tmp_path / "bulky.py").write_text("DATA = " + repr("x" * 3_000_000) + "\ndef shout(w):\n    return w\n")
    result = deepline("run", "play.py", "--set", "words=[]", "--enqueue")
    assert result.code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "bulky.py" in lines[0] and "MB" in lines[0], result.stderr


FINGERPRINTED = """
from deepline_cli import play
from wording import polish

def tidy(word):
    return word.strip().VERSION()

@play("fp")
async def fp(ctx, input):
    rows = await ctx.map("w", [{"w": w} for w in ["ab ", " cd"]], key="w",
                         columns={"clean": lambda row: polish(tidy(row["w"]))})
    return [r["clean"] for r in rows]
"""


def test_changing_a_helper_a_column_calls_recomputes_its_cells(
    deepline: Run, tmp_path: Path, write_play: Callable[..., Path]
) -> None:
    (tmp_path / "wording.py").write_text("def polish(w):\n    return w\n")
    write_play(FINGERPRINTED.replace("VERSION", "upper"))
    assert _json.loads(deepline("run", "play.py").stdout) == ["AB", "CD"]
    write_play(FINGERPRINTED.replace("VERSION", "title"))  # a helper in the play file changed
    assert _json.loads(deepline("run", "play.py").stdout) == ["Ab", "Cd"]
    (tmp_path / "wording.py").write_text("def polish(w):\n    return w + '.'\n")  # one in a module next to it
    assert _json.loads(deepline("run", "play.py").stdout) == ["Ab.", "Cd."]


# --- a dropped PostgreSQL connection ------------------------------------------------------------

WORK = """
import asyncio
from deepline_cli import play, tool

@tool("pg.work", credits=1)
async def work(input):
    with open(input["log"], "a") as f:
        f.write(f"{input['i']}\\n")
    await asyncio.sleep(0.05)
    return input["i"]

@play("pgwork")
async def pgwork(ctx, input):
    rows = await ctx.map("r", [{"i": i} for i in range(input["n"])], key="i", concurrency=10, columns={
        "v": lambda row, rc: rc.tools.execute("w", "pg.work", {"i": row["i"], "log": input["log"]}),
    })
    return len(rows)
"""


@pytest.fixture
def proxy(pg_url: str) -> Iterator[PgProxy]:
    with PgProxy(pg_url) as p:
        yield p


def _calls(pg_url: str) -> int:
    db = open_store(pg_url)
    try:
        return len(db.receipts.query_receipts(ReceiptQuery(tool="pg.work", status="completed")))
    finally:
        db.close()


@pytest.mark.postgres
def test_a_run_rides_out_a_dropped_postgresql_connection(
    tmp_path: Path, cli_env: dict[str, str], proxy: PgProxy, pg_url: str
) -> None:
    (tmp_path / "play.py").write_text(WORK)
    log = tmp_path / "calls.log"
    env = {**cli_env, "DEEPLINE_STORE": proxy.url}
    payload = _json.dumps_str({"n": 300, "log": str(log)})
    proc = start(["run", "play.py", "--input", payload, "--run-id", "blip", "--json"], env, tmp_path)
    try:
        wait_until(lambda: _calls(pg_url) >= 60, what="60 calls recorded")
        assert proxy.cut(refuse_for_s=2.0) >= 1
        code, out, err = finish(proc, timeout=120)
    finally:
        kill(proc)
    assert code == 0, err
    finished = _json.loads(out.splitlines()[-1])
    assert (finished["status"], finished["output"]) == ("completed", 300)
    assert finished["stats"]["tools"]["pg.work"]["live"] == 300
    executed = log.read_text().split()
    assert len(set(executed)) == 300 and len(executed) <= 310  # at most the calls in flight again
    warnings = [e["message"] for e in map(_json.loads, out.splitlines()) if e["event"] == "log"]
    assert any("reconnected" in message for message in warnings), warnings
    # one sentence each: no store error nested in another, no driver's own lines on stderr
    assert not any("(The store" in message for message in warnings), warnings
    assert "psycopg" not in err and " at 0x" not in err, err


def _start_work(
    tmp_path: Path, cli_env: dict[str, str], proxy: PgProxy, run_id: str
) -> tuple[Any, Path, dict[str, str]]:
    """WORK's 300 calls, started through the proxy: the process, its calls log, its env."""
    (tmp_path / "play.py").write_text(WORK)
    log = tmp_path / "calls.log"
    env = {**cli_env, "DEEPLINE_STORE": proxy.url}
    payload = _json.dumps_str({"n": 300, "log": str(log)})
    return start(["run", "play.py", "--input", payload, "--run-id", run_id], env, tmp_path), log, env


def _ctrl_c(proc: Any, timeout: float) -> tuple[int, str, float]:
    """Ctrl-C to the run: its exit code, its stderr, and how long it took to stop."""
    asked = time.monotonic()
    proc.send_signal(signal.SIGINT)
    code, _, err = finish(proc, timeout=timeout)
    return code, err, time.monotonic() - asked


def _resume_pays_each_once(run_id: str, env: dict[str, str], tmp_path: Path, log: Path) -> None:
    again = subprocess.run(
        [sys.executable, "-m", "deepline_cli", "resume", run_id, "--quiet"], env=env, cwd=tmp_path,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    executed = log.read_text().split()
    assert len(set(executed)) == 300 and len(executed) <= 300 + 10  # at most the calls in flight again


@pytest.mark.postgres
def test_ctrl_c_while_the_store_is_down_stops_within_seconds_and_says_the_end_is_not_recorded(
    tmp_path: Path, cli_env: dict[str, str], proxy: PgProxy, pg_url: str
) -> None:
    """The store is unreachable (refused for two minutes) and the person presses Ctrl-C:
    the run stops in seconds, not after the minute of reconnecting, exits 130, and says its
    end could not be recorded and how to go on. A resume once the store is back finishes it,
    nothing paid twice."""
    proc, log, env = _start_work(tmp_path, cli_env, proxy, "down")
    try:
        wait_until(lambda: _calls(pg_url) >= 30, what="30 calls recorded")
        proxy.cut(refuse_for_s=120)
        wait_until(lambda: proxy.refused >= 2, what="the run trying to reconnect")
        code, err, took = _ctrl_c(proc, timeout=60)
    finally:
        kill(proc)
    assert code == 130, err
    assert took < 20, f"Ctrl-C took {took:.1f}s during the outage"
    assert "■ Run down interrupted after" in err and "while its store was unreachable: its end is not recorded" in err
    assert "Next: once the store is back: deepline resume down" in err and "Traceback" not in err, err
    proxy.cut(refuse_for_s=0)
    _resume_pays_each_once("down", env, tmp_path, log)


@pytest.mark.postgres
def test_ctrl_c_while_the_store_has_stopped_answering_stops_the_run(
    tmp_path: Path, cli_env: dict[str, str], proxy: PgProxy, pg_url: str
) -> None:
    """The connection stays open but the store no longer answers (a hung server or
    middlebox: nothing is refused or reset, so no reconnect starts). Ctrl-C stops the run
    within half a minute, exit 130, its end said not recorded; a resume once the store answers again
    finishes it, nothing paid twice."""
    proc, log, env = _start_work(tmp_path, cli_env, proxy, "stalled")
    try:
        wait_until(lambda: _calls(pg_url) >= 30, what="30 calls recorded")
        proxy.stall()
        stalled_at = _calls(pg_url)  # read directly, not through the proxy
        time.sleep(1.0)  # the run now waits on the store
        assert _calls(pg_url) == stalled_at and proc.poll() is None
        code, err, took = _ctrl_c(proc, timeout=120)
    finally:
        kill(proc)
        proxy.stall(False)
    assert code == 130, err
    assert took < 30, f"Ctrl-C took {took:.1f}s while the store did not answer"
    assert "■ Run stalled interrupted after" in err and "its end is not recorded" in err, err
    assert "Traceback" not in err, err
    _resume_pays_each_once("stalled", env, tmp_path, log)


GATED = """
import os
import time
from deepline_cli import play

open("loading", "w").close()
while not os.path.exists("gate"):  # loading waits until the test has cut the connection
    time.sleep(0.02)


@play("gated")
async def gated(ctx, input):
    return await ctx.step("one", lambda: 1)
"""


@pytest.mark.postgres
def test_a_connection_dropped_while_a_run_starts_is_reconnected(
    tmp_path: Path, cli_env: dict[str, str], proxy: PgProxy
) -> None:
    """The store is opened, the play is loading, the connection drops: the run's first
    writes (its record, its lease) are made on a new connection, not refused."""
    (tmp_path / "play.py").write_text(GATED)
    env = {**cli_env, "DEEPLINE_STORE": proxy.url}
    proc = start(["run", "play.py", "--run-id", "gated", "--json"], env, tmp_path)
    try:
        wait_until(lambda: (tmp_path / "loading").exists(), what="the play to load")
        assert proxy.cut() >= 1  # the connection the command opened its store on
        (tmp_path / "gate").touch()
        code, out, err = finish(proc, timeout=60)
    finally:
        kill(proc)
    assert code == 0, err
    assert _json.loads(out.splitlines()[-1])["status"] == "completed"


@pytest.mark.postgres
def test_a_worker_rides_out_a_dropped_connection_and_gives_up_loudly_when_it_stays_down(
    deepline: Run, tmp_path: Path, cli_env: dict[str, str], proxy: PgProxy, pg_url: str
) -> None:
    (tmp_path / "play.py").write_text(WORK)
    log = tmp_path / "calls.log"
    payload = _json.dumps_str({"n": 300, "log": str(log)})
    assert (
        deepline("run", "play.py", "--input", payload, "--run-id", "w1", "--enqueue", DEEPLINE_STORE=pg_url).code == 0
    )
    env = {**cli_env, "DEEPLINE_STORE": proxy.url, "DEEPLINE_STORE_RECONNECT_S": "2.5"}
    worker = start(["worker", "--once"], env, tmp_path)
    try:
        wait_until(lambda: _calls(pg_url) >= 60, what="60 calls recorded")
        proxy.cut(refuse_for_s=1.0)
        code, _, err = finish(worker, timeout=120)
    finally:
        kill(worker)
    assert code == 0, err
    assert "1 started, 1 completed" in err
    assert len(set(log.read_text().split())) == 300

    other = _json.dumps_str({"n": 600, "log": str(log)})  # rows 300-599 are new: their calls too
    assert deepline("run", "play.py", "--input", other, "--run-id", "w2", "--enqueue", DEEPLINE_STORE=pg_url).code == 0
    worker = start(["worker", "--once"], env, tmp_path)
    try:
        wait_until(lambda: _calls(pg_url) >= 360, what="60 more calls recorded")
        proxy.cut(refuse_for_s=60.0)  # down for good, as far as this worker is concerned
        cut = time.monotonic()
        code, _, err = finish(worker, timeout=120)
        gave_up_after = time.monotonic() - cut
    finally:
        kill(worker)
    assert code == 1, err
    assert "unreachable" in err and "Traceback" not in err
    # Once, for the bound (2.5 s): recording how the run ended and putting it back try once
    # more each, not for the whole bound again (the bound is reached at the first backoff
    # delay that passes it).
    assert gave_up_after < 2 * 2.5 + 6, gave_up_after


HELD = """
import asyncio, time
from deepline_cli import play, tool

@tool("pg.slot", credits=1, concurrency=2)
async def slot(input):
    with open(input["log"], "a") as f:
        f.write(f"{input['i']} {time.time()}\\n")
    await asyncio.sleep(0.05)
    return input["i"]

@play("held")
async def held(ctx, input):
    rows = await ctx.map("r", [{"i": i} for i in range(input["n"])], key="i", concurrency=30, columns={
        "v": lambda row, rc: rc.tools.execute("s", "pg.slot", {"i": row["i"], "log": input["log"]}),
    })
    return len(rows)
"""


@pytest.mark.postgres
def test_no_call_goes_out_while_the_store_cannot_record_it(
    tmp_path: Path, cli_env: dict[str, str], proxy: PgProxy, pg_url: str
) -> None:
    """Calls claimed before PostgreSQL went away (waiting for one of the tool's 2 slots) went
    out while the run tried to reconnect, though no answer could be recorded: a resume
    after an outage it could not ride out paid them again. The run holds them until the
    store is back (SPEC §3: stop dispatching when a call cannot be recorded)."""
    (tmp_path / "play.py").write_text(HELD)
    log = tmp_path / "calls.log"
    env = {**cli_env, "DEEPLINE_STORE": proxy.url}
    payload = _json.dumps_str({"n": 200, "log": str(log)})
    proc = start(["run", "play.py", "--input", payload, "--run-id", "held", "--json"], env, tmp_path)
    try:
        wait_until(lambda: log.exists() and len(log.read_text().split("\n")) > 40, what="40 calls made")
        cut = time.time()
        assert proxy.cut(refuse_for_s=3.0) >= 1
        code, out, err = finish(proc, timeout=120)
    finally:
        kill(proc)
    assert code == 0, err
    assert _json.loads(out.splitlines()[-1])["output"] == 200
    started = [float(line.split()[1]) for line in log.read_text().splitlines()]
    assert len(started) == 200  # each call made once
    # Calls in flight when the connection dropped finish; none starts while it is down.
    during = [t for t in started if cut + 0.5 < t < cut + 2.9]
    assert during == [], f"{len(during)} calls went out while the store could not record them"
    said = [e["message"] for e in map(_json.loads, out.splitlines()) if e["event"] == "log"]
    assert any("no call goes out until it is back" in message for message in said), said


def test_a_worker_opens_a_runs_store_again_when_its_connection_drops_as_it_opens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PostgreSQL ending backends while a worker started a run: the run's own store
    connection dropped as it opened (its migration check), and the worker stopped for good
    ("the store cannot be used"), the run it had claimed left running."""
    from deepline_cli.errors import StoreConnectionLost
    from deepline_cli.runtime.run import worker as worker_module
    from deepline_cli.runtime.run.options import RunOptions

    opened: list[object] = []

    class Flaky:
        def __init__(self, options: object, bus: object) -> None:
            if len(opened) < 2:
                opened.append(None)
                raise StoreConnectionLost("The store dropped the connection: terminating connection.")
            opened.append(self)

    monkeypatch.setattr(worker_module, "Runner", Flaky)
    monkeypatch.setattr(time, "sleep", lambda _: None)
    worker = worker_module.Worker("postgresql://example/none", report=lambda _: None)
    runner = worker._runner(RunOptions(store="postgresql://example/none"), "r-1")
    assert isinstance(runner, Flaky) and len(opened) == 3
