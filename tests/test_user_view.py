"""What a user sees (data and failures), through the real command line: a run's results
stay its own, errors in the play's code stop the map loudly, partial exports say so,
bad stores and CSVs are one sentence, a closed pipe interrupts, early events are kept,
log lines are not repeated by resumes, and `check` lists every play of a file."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from deepline_cli import _json
from tests.conftest import Result
from tests.faults import finish, kill, start
from tests.helpers import wait_until

pytestmark = pytest.mark.process

Run = Callable[..., Result]


def one_sentence(stderr: str) -> str:
    """The single `Error: …` line of a usage error, after checking nothing else was printed."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


# --- a run's results are its own ---------------------------------------------------------------

VERSIONED = """
from deepline_cli import play

@play("versioned")
async def versioned(ctx, input):
    rows = await ctx.map("rows", [{"id": i} for i in range(3)], key="id",
                         columns={"label": lambda row: f"VERSION-{row['id']}"})
    return len(rows)
"""


def test_a_finished_runs_export_does_not_change_when_a_later_run_recomputes(
    deepline: Run, write_play: Callable[..., Path]
) -> None:
    write_play(VERSIONED.replace("VERSION", "v1"))
    assert deepline("run", "play.py", "--run-id", "first").code == 0
    write_play(VERSIONED.replace("VERSION", "v2"))  # the column's code changed: cells recompute
    assert deepline("run", "play.py", "--run-id", "second").code == 0

    first = deepline("export", "first", "--format", "jsonl").json_lines()
    second = deepline("export", "second", "--format", "jsonl").json_lines()

    assert [r["label"] for r in first] == ["v1-0", "v1-1", "v1-2"]
    assert [r["label"] for r in second] == ["v2-0", "v2-1", "v2-2"]


# --- errors in the play's own code ----------------------------------------------------------------

TYPO = """
from deepline_cli import play, tool

@tool("t.count")
def count(input):
    with open(input["log"], "a") as log:
        log.write("x")
    return 1

@play("typo")
async def typo(ctx, input):
    rows = [{"website": f"s{i}.com", "log": input["log"]} for i in range(200)]
    done = await ctx.map("sites", rows, key="website", concurrency=4, columns={
        "n": lambda row, rc: rc.tools.execute("c", "t.count", {"log": row["log"], "site": row["website"]}),
        "domain": lambda row: row["websiet"].split(".")[0],
    })
    return done.failed_count
"""


def test_an_error_in_the_plays_code_stops_the_map_at_the_first_row(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    write_play(TYPO)
    log = tmp_path / "calls"
    result = deepline("run", "play.py", "--set", f"log={log}")

    assert result.code == 1, result.stderr
    assert "KeyError: 'websiet'" in result.stderr
    assert "play.py line 15" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(log.read_text()) <= 8  # stopped at once: not 200 paid calls for nothing

    debug = deepline("--debug", "run", "play.py", "--set", f"log={log}")
    assert "Traceback" in debug.stderr and 'row["websiet"]' in debug.stderr


SAME_ERROR = """
from deepline_cli import ToolExecutionError, play, tool

@tool("t.auth")
def auth(input):
    with open(input["log"], "a") as log:
        log.write("x")
    raise ToolExecutionError("401 from t.auth: invalid API key", category="authentication", status_code=401)

@play("unauthorised")
async def unauthorised(ctx, input):
    rows = [{"id": i, "log": input["log"]} for i in range(300)]
    done = await ctx.map("rows", rows, key="id", concurrency=4, columns={
        "x": lambda row, rc: rc.tools.execute("a", "t.auth", {"id": row["id"], "log": row["log"]}),
    })
    return done.failed_count
"""


def test_a_map_whose_first_rows_all_fail_the_same_way_stops(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    write_play(SAME_ERROR)
    log = tmp_path / "calls"
    result = deepline("run", "play.py", "--set", f"log={log}")

    assert result.code == 1, result.stderr
    assert "first 20 rows all failed" in result.stderr and "401" in result.stderr
    assert "--refresh-failed" in result.stderr
    assert len(log.read_text()) < 40


ALL_IN_FLIGHT = """
import asyncio
from deepline_cli import ToolExecutionError, play, tool

@tool("t.find")
async def find(input):
    await asyncio.sleep(0.2)  # a provider's latency: every row of the list is in flight at once
    if input["domain"].startswith("unknown"):
        raise ToolExecutionError("404 from t.find: no such company", category="validation", status_code=404)
    return {"name": input["domain"]}

@play("accounts")
async def accounts(ctx, input):
    rows = [{"domain": f"unknown-x{i}.com"} for i in range(25)] + [{"domain": f"good{i}.com"} for i in range(10)]
    done = await ctx.map("accts", rows, key="domain", columns={
        "co": lambda row, rc: rc.tools.execute("co", "t.find", {"domain": row["domain"]}),
    })
    return done.failed_count
"""


def test_a_map_whose_every_row_ended_completes_though_its_first_rows_failed_the_same_way(
    deepline: Run, write_play: Callable[..., Path]
) -> None:
    """A list sorted by domain starting with 25 companies the provider does not know (404),
    every row in flight at once: all 35 ended, 10 found, yet the map was "stopped" as
    systemic, the run failed, and its advice (--refresh-failed) paid the 25 again. A stop
    that held nothing back is no stop: the map completes with its failed rows."""
    write_play(ALL_IN_FLIGHT)
    result = deepline("run", "play.py", "--json")
    assert result.code == 0, result.stderr
    finished = result.json_lines()[-1]
    assert (finished["status"], finished["output"]) == ("completed", 25)
    assert finished["stats"]["rows"]["succeeded"] == 10


ISOLATED = """
from deepline_cli import ProviderTransientError, play, tool

@tool("t.flaky")
def flaky(input):
    if input["id"] % 3 == 0:
        raise ProviderTransientError("503 from t.flaky", status_code=503)
    return input["id"]

def check(row):
    if row["id"] == 4:
        raise ValueError("no such lead")
    return True

@play("isolated")
async def isolated(ctx, input):
    done = await ctx.map("rows", [{"id": i} for i in range(12)], key="id", columns={
        "v": lambda row, rc: rc.tools.execute("f", "t.flaky", {"id": row["id"]}),
        "ok": check,
    })
    return done.failed_count
"""


def test_tool_and_data_errors_stay_isolated_and_name_where_they_came_from(
    deepline: Run, write_play: Callable[..., Path]
) -> None:
    write_play(ISOLATED)
    result = deepline("run", "play.py", "--run-id", "iso")
    assert result.code == 0, result.stderr
    assert _json.loads(result.stdout) == 5
    logs = deepline("runs", "logs", "iso").stdout
    assert "row 4 failed: ValueError: no such lead (play.py line 12)" in logs
    assert "row 0 failed: upstream: 503 from t.flaky" in logs


# --- partial exports, map counts --------------------------------------------------------------------

SLOW_MAP = """
import asyncio
from deepline_cli import play

async def slow(row):
    await asyncio.sleep(0.05 if row["id"] < 40 else 30)
    return row["id"]

@play("slowmap")
async def slowmap(ctx, input):
    done = await ctx.map("rows", [{"id": i} for i in range(100)], key="id", concurrency=5, columns={"v": slow})
    return len(done)
"""


def test_exporting_an_interrupted_run_says_it_is_partial(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path, cli_env: dict[str, str]
) -> None:
    write_play(SLOW_MAP)
    proc = start(["run", "play.py", "--run-id", "part", "--quiet"], cli_env, tmp_path)
    try:
        wait_until(lambda: _map_rows(Path(cli_env["DEEPLINE_STORE"])) >= 40, what="40 rows done")
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)
        code, _, _ = finish(proc)
    finally:
        kill(proc)
    assert code == 130

    exported = deepline("export", "part", "--out", "part.csv")
    assert exported.code == 0, exported.stderr
    assert "partial" in exported.stderr and "40 of 100 rows" in exported.stderr
    assert "deepline resume part" in exported.stderr
    [shown] = _json.loads(deepline("runs", "show", "part", "--json").stdout)["maps"]
    assert (shown["succeeded"], shown["status"]) == (40, "interrupted")


def _map_rows(store: Path) -> int:
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=1) as conn:
            return int(conn.execute("SELECT count(*) FROM map_rows").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


# --- bad input and bad stores -------------------------------------------------------------------------


def test_a_csv_with_a_column_twice_is_refused(deepline: Run, write_play: Callable[..., Path], tmp_path: Path) -> None:
    (tmp_path / "dup.csv").write_text("name,domain,Domain ,domain\na,b.com,c,d.com\n")
    write_play(
        """
        from deepline_cli import play

        @play("dups")
        async def dups(ctx, input):
            return len(await ctx.map("rows", ctx.csv(input["csv"]), columns={"x": lambda row: 1}))
        """
    )
    result = deepline("run", "play.py", "--csv", "dup.csv")
    assert result.code == 2
    [reason] = [line for line in result.stderr.splitlines() if " failed: " in line]
    assert "the column 'domain' appears twice (columns 2 and 4)" in reason
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("store", "words"),
    [
        ("postgressql://db/x", "unknown store scheme"),
        ("mysql://root@localhost/x", "unknown store scheme"),
        ("@dir", "directory"),
        ("@text", "not a deepline store"),
        ("@truncated", "not a deepline store"),
        ("postgresql://postgres@127.0.0.1:1/nothing", "Cannot connect"),
    ],
)
def test_store_problems_are_usage_errors(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path, store: str, words: str
) -> None:
    write_play(VERSIONED)
    (tmp_path / "dir").mkdir()
    (tmp_path / "text").write_text("hello, I am not a database\n" * 100)
    real = tmp_path / "real.db"
    assert deepline("run", "play.py", DEEPLINE_STORE=str(real)).code == 0
    (tmp_path / "truncated").write_bytes(real.read_bytes()[:3000])
    target = str(tmp_path / store[1:]) if store.startswith("@") else store
    result = deepline("run", "play.py", "--store", target)
    assert result.code == 2, result.stderr
    assert words.lower() in one_sentence(result.stderr).lower()


def test_a_closed_output_pipe_interrupts_the_run_resumably(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path, cli_env: dict[str, str]
) -> None:
    write_play(SLOW_MAP.replace("else 30", "else 0.05"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "deepline_cli", "run", "play.py", "--run-id", "piped", "--json"],
        cwd=tmp_path, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.readline()  # `| head -1`
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    shown = _json.loads(deepline("runs", "show", "piped", "--json").stdout)
    assert shown["status"] == "interrupted"
    assert all(m["status"] != "running" for m in shown["maps"])
    resumed = deepline("resume", "piped")
    assert resumed.code == 0 and resumed.stdout.strip() == "100"


def test_export_into_a_missing_directory_is_a_usage_error(deepline: Run, write_play: Callable[..., Path]) -> None:
    write_play(VERSIONED)
    assert deepline("run", "play.py", "--run-id", "v").code == 0
    result = deepline("export", "v", "--out", "no/such/dir/out.csv")
    assert result.code == 2
    assert "no/such/dir" in one_sentence(result.stderr)


# --- events, logs, check ------------------------------------------------------------------------------

EARLY = """
import asyncio
import os
from deepline_cli import play


async def gate():
    while not os.path.exists("gate"):  # the test opens it once the event was sent
        await asyncio.sleep(0.02)


@play("early")
async def early(ctx, input):
    ctx.log("started once")
    await ctx.step("gate", gate)
    got = await ctx.wait_for_event("go")
    await ctx.sleep("nap", 1.5)
    return got
"""


def test_an_event_sent_before_the_run_waits_is_kept_and_logs_are_not_repeated(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path, cli_env: dict[str, str]
) -> None:
    write_play(EARLY)
    proc = start(["run", "play.py", "--run-id", "early", "--quiet", "--max-inline-wait", "0"], cli_env, tmp_path)
    try:
        wait_until(lambda: deepline("runs", "show", "early").code == 0, what="the run to exist")
        sent = deepline("events", "send", "early", "go", "--payload", '{"ok": true}')
        assert sent.code == 0, sent.stderr
        assert "kept" in sent.stderr
        (tmp_path / "gate").touch()
        code, _, err = finish(proc)
    finally:
        kill(proc)
    assert code == 3, err  # it got the event without waiting for it, then suspended at the nap
    done = wait_until(lambda: (r := deepline("resume", "early")).code == 0 and r, timeout=20, what="the nap to end")
    assert _json.loads(done.stdout) == {"ok": True}
    logs = deepline("runs", "logs", "early").stdout
    assert logs.count("started once") == 1


def test_check_lists_every_play_of_a_file(deepline: Run, write_play: Callable[..., Path]) -> None:
    write_play(
        """
        from deepline_cli import play

        @play("first", description="one")
        async def first(ctx, input):
            return 1

        @play("second", description="two")
        async def second(ctx, input):
            return 2
        """
    )
    result = deepline("check", "play.py")
    assert result.code == 0, result.stderr
    assert "first" in result.stdout and "second" in result.stdout
    assert "ok:" in result.stdout


def test_store_path_says_where_the_store_is_without_its_password(deepline: Run, store_path: Path) -> None:
    assert deepline("store", "path").stdout.strip() == str(store_path)
    hidden = deepline("store", "path", DEEPLINE_STORE="postgresql://ana:s3cret-pass@db.internal/deepline")
    assert hidden.stdout.strip() == "postgresql://ana:***@db.internal/deepline"


# --- an output that cannot be written (a full disk, a closed descriptor) ----------------------------

QUICK_MAP = SLOW_MAP.replace('0.05 if row["id"] < 40 else 30', "0")


def _output_to(target: str, args: list[str], tmp_path: Path, cli_env: dict[str, str]) -> subprocess.CompletedProcess:
    """`deepline ARGS > /dev/full` (stdout), `2> /dev/full` (stderr), or `>&-` (closed)."""
    command = [sys.executable, "-m", "deepline_cli", *args]
    if target in ("closed", "both"):
        closing = "os.close(1); os.close(2)" if target == "both" else "os.close(1)"
        script = f"import os, subprocess, sys; {closing}; sys.exit(subprocess.call(sys.argv[1:], stdout=None))"
        command = [sys.executable, "-c", script, *command]
    with open("/dev/full", "w") as full:
        out = {"stdout": full} if target == "stdout" else {"stdout": subprocess.DEVNULL}
        err = {"stderr": full} if target == "stderr" else {"stderr": subprocess.PIPE}
        if target == "closed":
            out = {}
        if target == "both":
            out, err = {}, {}
        return subprocess.run(
            command, cwd=tmp_path, env=cli_env, stdin=subprocess.DEVNULL, text=True, timeout=60, **out, **err
        )


@pytest.mark.parametrize(("target", "json"), [("stdout", True), ("stderr", False), ("closed", True)])
def test_an_output_that_cannot_be_written_interrupts_the_run_resumably(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path, cli_env: dict[str, str], target: str, json: bool
) -> None:
    """`--json > /dev/full`, `2> /dev/full`, `--json >&-`: the run failed with an internal
    error and was left "running" (its holder gone); a resume had to wait for its lease."""
    write_play(QUICK_MAP)
    args = ["run", "play.py", "--run-id", "full", *(["--json"] if json else [])]
    proc = _output_to(target, args, tmp_path, cli_env)
    assert proc.returncode == 130, proc.stderr
    if target != "stderr":
        assert "internal error" not in proc.stderr and "could not be written" in proc.stderr, proc.stderr
    assert _json.loads(deepline("runs", "show", "full", "--json").stdout)["status"] == "interrupted"
    resumed = deepline("resume", "full")
    assert resumed.code == 0 and resumed.stdout.strip() == "100", resumed.stderr


NO_MAP = """
from deepline_cli import play

@play("nomap")
async def nomap(ctx, input):
    return {"ok": True}
"""


@pytest.mark.parametrize("target", ["stdout", "closed"])
def test_json_that_cannot_be_written_says_what_became_of_the_run(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path, cli_env: dict[str, str], target: str
) -> None:
    """A run its sheet answered whole (`--json >&-`): stderr said "run c1 stops here;
    `deepline resume c1` finishes it", the run completed and exited 0. It is interrupted
    now (the map checks as it goes); a run that completes all the same (no map to stop)
    says so, exit 1 where a script would read its output (a full disk), 0 for a closed one."""
    write_play(QUICK_MAP)
    assert deepline("run", "play.py", "--run-id", "base", "--quiet").code == 0
    proc = _output_to(target, ["run", "play.py", "--run-id", "c1", "--json"], tmp_path, cli_env)
    assert proc.returncode == 130, proc.stderr
    assert "`deepline resume c1` finishes it" in proc.stderr, proc.stderr
    assert _json.loads(deepline("runs", "show", "c1", "--json").stdout)["status"] == "interrupted"
    write_play(NO_MAP)
    done = _output_to(target, ["run", "play.py", "--run-id", "n1", "--json"], tmp_path, cli_env)
    assert done.returncode == (1 if target == "stdout" else 0), done.stderr
    assert "run n1 completed all the same" in done.stderr and "resume" not in done.stderr, done.stderr
    assert _json.loads(deepline("runs", "show", "n1", "--json").stdout)["status"] == "completed"
    queued = _output_to(target, ["run", "play.py", "--enqueue", "--json"], tmp_path, cli_env)
    assert queued.returncode == (1 if target == "stdout" else 0), queued.stderr  # its id, the one output, lost
    assert "queued all the same: deepline runs show" in queued.stderr, queued.stderr


def test_a_failed_run_under_json_says_why_on_stderr_too(deepline: Run, write_play: Callable[..., Path]) -> None:
    """`--json 2>err` of a failed run: stderr was empty, and a CI log showed nothing."""
    write_play(NO_MAP.replace('return {"ok": True}', 'raise ValueError("the CRM export is empty")'))
    failed = deepline("run", "play.py", "--json")
    assert failed.code == 1, failed.stderr
    assert "failed: ValueError: the CRM export is empty" in failed.stderr, failed.stderr
    assert _json.loads(failed.stdout.splitlines()[-1])["status"] == "failed"  # stdout: NDJSON only


def test_a_run_whose_stdout_is_closed_still_completes(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """`deepline run play.py >&-` (no --json): the run completed, then printing its output
    failed as an internal error, exit 1."""
    write_play(QUICK_MAP)
    proc = _output_to("closed", ["run", "play.py", "--run-id", "shut"], tmp_path, cli_env)
    assert proc.returncode == 0, proc.stderr
    assert "internal error" not in proc.stderr
    assert _json.loads(deepline("runs", "show", "shut", "--json").stdout)["status"] == "completed"


def test_a_run_with_stdout_and_stderr_closed_completes_and_exits_0(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """`deepline run play.py >&- 2>&-` (a CI runner closing both): the run completed, then
    the warning that its output could not be printed could not be written either, and the
    command exited 1, a completed run taken for a failure."""
    write_play(QUICK_MAP)
    proc = _output_to("both", ["run", "play.py", "--run-id", "both"], tmp_path, cli_env)
    assert proc.returncode == 0
    assert _json.loads(deepline("runs", "show", "both", "--json").stdout)["status"] == "completed"


def test_a_run_whose_output_cannot_be_written_completes_and_exits_1(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """`deepline run play.py > out.json` on a full disk: the run completed and exited 0, so
    `&& upload out.json` went on with an empty file."""
    write_play(QUICK_MAP)
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "deepline_cli", "run", "play.py", "--run-id", "full-out"],
            cwd=tmp_path, env=cli_env, stdin=subprocess.DEVNULL, stdout=full, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "Error: the run's output could not be written" in proc.stderr, proc.stderr
    assert _json.loads(deepline("runs", "show", "full-out", "--json").stdout)["status"] == "completed"


def test_export_with_stdout_closed_is_one_sentence(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """`deepline export RUN >&-`: an internal error (AttributeError), exit 1."""
    write_play(QUICK_MAP)
    assert deepline("run", "play.py", "--run-id", "shut-export", "--quiet").code == 0
    proc = _output_to("closed", ["export", "shut-export"], tmp_path, cli_env)
    assert proc.returncode == 2, proc.stderr
    assert "Cannot write the rows to stdout: it is closed" in proc.stderr and "internal error" not in proc.stderr
