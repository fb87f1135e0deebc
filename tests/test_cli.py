"""The `deepline` command through its real entry point (§5): output, exit codes, errors,
idempotent `--run-id`, `runs …`, `receipts inspect`, busy runs and interrupts."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from deepline_cli import _json
from tests.conftest import Result, counts
from tests.helpers import logged, wait_until

RECEIPT_KEYS = {
    "key", "kind", "label", "tool", "status", "run_id", "attempt", "lease_expires_at",
    "failure_kind", "error", "created_at", "completed_at", "credits",
}  # fmt: skip

# Three `t.double` calls, three `t.label` calls, one step, one tool call that fails (and
# is caught by the play). `t.double` appends a line to input["log"] per invocation.
BASIC_PLAY = """
import asyncio

from deepline_cli import ToolExecutionError, play, tool


@tool("t.double", credits=1)
async def double(input, call):
    with open(input["log"], "a") as f:
        f.write(f"{input['n']} {call.attempt} {call.idempotency_key}\\n")
    return {"value": input["n"] * 2}


@tool("t.label")
def label(input):
    return f"n={input['n']}"


@tool("t.broken")
async def broken(input):
    raise RuntimeError("the broken tool broke")


@play("basic", description="a small play with local tools")
async def basic(ctx, input):
    ctx.log("basic play starting")
    n = input.get("n", 3)
    doubled = await asyncio.gather(
        *(ctx.tools.execute(f"double-{i}", "t.double", {"n": i, "log": input["log"]}) for i in range(n))
    )
    labels = [(await ctx.tools.execute(f"label-{i}", "t.label", {"n": i})).output for i in range(n)]
    try:
        await ctx.tools.execute("broken", "t.broken", {"why": "always"})
    except ToolExecutionError:
        ctx.log("the broken tool failed, as expected")
    total = await ctx.step("total", lambda: sum(r.output["value"] for r in doubled))
    ctx.log(f"total is {total}")
    return {"total": total, "labels": labels}
"""
BASIC_OUTPUT = {"total": 6, "labels": ["n=0", "n=1", "n=2"]}

# Raises ValueError (on the line marked RAISE) while input["flag"] exists.
FAILING_PLAY = """
import os

from deepline_cli import play, tool


@tool("t.count")
async def count(input):
    with open(input["log"], "a") as f:
        f.write("count\\n")
    return 41


@play("flaky")
async def flaky(ctx, input):
    value = (await ctx.tools.execute("count", "t.count", {"log": input["log"]})).output
    if os.path.exists(input["flag"]):
        raise ValueError("the flag file is still there")  # RAISE
    return {"answer": value + 1, "attempt": ctx.run.attempt}
"""

# One tool call that blocks for 30 s on the first attempt only.
BLOCKING_PLAY = """
import asyncio

from deepline_cli import play, tool


@tool("t.block")
async def block(input, call):
    with open(input["log"], "a") as f:
        f.write(f"start {call.attempt}\\n")
    if call.attempt == 1:
        await asyncio.sleep(30)
    return "done"


@play("blocker")
async def blocker(ctx, input):
    result = await ctx.tools.execute("block", "t.block", {"log": input["log"]})
    return {"result": result.output, "attempt": ctx.run.attempt}
"""

# input["n"] slow calls. `t.limited` has a per-tool concurrency limit and the play
# gathers every call at once (the queue waits in the governor); `t.free` has no limit
# and the play gathers in chunks of 5. Each invocation logs "start N ATTEMPT" and, when
# it returns, "end N ATTEMPT".
SLOW_PLAY = """
import asyncio

from deepline_cli import play, tool


async def _slow(input, call):
    with open(input["log"], "a") as f:
        f.write(f"start {input['i']} {call.attempt}\\n")
    await asyncio.sleep(0.05)
    with open(input["log"], "a") as f:
        f.write(f"end {input['i']} {call.attempt}\\n")
    return input["i"]


@tool("t.limited", concurrency=5)
async def limited(input, call):
    return await _slow(input, call)


@tool("t.free")
async def free(input, call):
    return await _slow(input, call)


@play("slow")
async def slow(ctx, input):
    tool_id, n = input["tool"], input["n"]
    chunk = n if tool_id == "t.limited" else 5
    total = 0
    for start in range(0, n, chunk):
        results = await asyncio.gather(
            *(
                ctx.tools.execute(f"slow-{i}", tool_id, {"i": i, "log": input["log"]})
                for i in range(start, min(n, start + chunk))
            )
        )
        total += sum(r.output for r in results)
    return {"total": total}
"""


def assert_one_error_sentence(result: Result) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: "), result.stderr


def run_json(deepline: Callable[..., Result], *args: str) -> list[dict[str, Any]]:
    result = deepline(*args, "--json")
    assert result.code == 0, result.stderr
    return result.json_lines()


@pytest.fixture
def basic(tmp_path: Path, write_play: Callable[..., Path]) -> tuple[Path, Path, str]:
    """(play file, tool log, --input JSON) for BASIC_PLAY."""
    log = tmp_path / "double.log"
    return write_play(BASIC_PLAY, "basic.py"), log, _json.dumps_str({"log": str(log)})


@pytest.fixture
def spawn(tmp_path: Path, cli_env: dict[str, str]) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start `python -m deepline_cli …` in the background (killed at teardown), its output
    in files (`spawned_output`) rather than conftest's pipes."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, **env: str) -> subprocess.Popen[str]:
        n = len(started)
        with (
            open(tmp_path / f"spawn{n}.out", "w") as out,
            open(tmp_path / f"spawn{n}.err", "w") as err,
        ):
            proc = subprocess.Popen(
                [sys.executable, "-m", "deepline_cli", *args],
                cwd=tmp_path,
                env={**cli_env, **env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                text=True,
            )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def spawned_output(tmp_path: Path, n: int = 0) -> tuple[str, str]:
    return (tmp_path / f"spawn{n}.out").read_text(), (tmp_path / f"spawn{n}.err").read_text()


# --- run: output, --json, errors ------------------------------------------------------------


def test_run_prints_the_output_json_on_stdout(deepline, basic) -> None:
    play, log, payload = basic
    result = deepline("run", str(play), "--input", payload)
    assert result.code == 0, result.stderr
    assert _json.loads(result.stdout) == BASIC_OUTPUT
    assert len(logged(log)) == 3


def test_json_mode_prints_only_ndjson_events(deepline, basic) -> None:
    play, _, payload = basic
    result = deepline("run", str(play), "--input", payload, "--json")
    assert result.code == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    events = [_json.loads(line) for line in lines]  # every stdout line is JSON
    assert all(isinstance(e, dict) for e in events)
    assert events[0]["event"] == "run.started"
    assert events[-1]["event"] == "run.finished"
    run_id = events[0]["run_id"]
    for event in events:
        assert {"event", "run_id", "ts"} <= event.keys(), event
        assert event["run_id"] == run_id
        assert isinstance(event["ts"], int | float)
    finished = events[-1]
    assert {"status", "output", "error", "stats"} <= finished.keys()
    assert finished["status"] == "completed"
    assert finished["output"] == BASIC_OUTPUT
    assert finished["error"] is None
    assert finished["stats"]["tools"]["t.double"]["live"] == 3
    assert finished["stats"]["tools"]["t.double"]["credits"] == 3
    logged = [e["message"] for e in events if e["event"] == "log"]
    assert "basic play starting" in logged
    assert "total is 6" in logged


@pytest.mark.parametrize(
    ("source", "ref", "needle"),
    [
        (None, "missing.py", "does not exist"),
        ("from deepline_cli import play\n\ndef broken(:\n    pass\n", "bad.py", "line 3"),
        (
            "from deepline_cli import play\n\n@play('a')\nasync def a(ctx, input):\n    return 1\n\n"
            "@play('b')\nasync def b(ctx, input):\n    return 2\n",
            "two.py",
            "two.py:NAME",
        ),
        (
            "from deepline_cli import play\n\n@play('a')\nasync def a(ctx, input):\n    return 1\n",
            "one.py:nope",
            "nope",
        ),
    ],
    ids=["missing-file", "syntax-error", "several-plays", "unknown-function"],
)
def test_play_load_errors_exit_2_with_one_sentence(
    deepline, write_play, source: str | None, ref: str, needle: str
) -> None:
    if source is not None:
        write_play(source, ref.partition(":")[0])
    result = deepline("run", ref)
    assert result.code == 2, result.stderr
    assert_one_error_sentence(result)
    assert needle in result.stderr
    assert result.stdout == ""


def test_debug_flag_shows_the_traceback(deepline) -> None:
    result = deepline("--debug", "run", "missing.py")
    assert result.code == 2
    assert "Traceback" in result.stderr
    assert "Error:" in result.stderr


def test_bad_input_json_exits_2_naming_the_flag(deepline, basic) -> None:
    play, _, _ = basic
    result = deepline("run", str(play), "--input", "{not json")
    assert result.code == 2
    assert_one_error_sentence(result)
    assert "--input" in result.stderr


def test_a_play_that_raises_fails_naming_the_play_line(deepline, tmp_path, write_play) -> None:
    play = write_play(FAILING_PLAY, "flaky.py")
    (tmp_path / "flag").touch()
    payload = _json.dumps_str({"log": str(tmp_path / "count.log"), "flag": str(tmp_path / "flag")})
    line = next(n for n, text in enumerate(play.read_text().splitlines(), 1) if "# RAISE" in text)
    result = deepline("run", str(play), "--input", payload)
    assert result.code == 1
    assert "Traceback" not in result.stderr
    assert "failed" in result.stderr
    assert "the flag file is still there" in result.stderr
    assert f"flaky.py line {line}" in result.stderr
    assert result.stdout == ""


# --- resume and --run-id --------------------------------------------------------------------


def test_resume_of_an_unknown_run_exits_2(deepline) -> None:
    result = deepline("resume", "no-such-run")
    assert result.code == 2
    assert_one_error_sentence(result)
    assert "no-such-run" in result.stderr


def test_resume_of_a_completed_run_reports_it(deepline, basic) -> None:
    play, log, payload = basic
    assert deepline("run", str(play), "--input", payload, "--run-id", "done-1").code == 0
    result = deepline("resume", "done-1")
    assert result.code == 0, result.stderr
    assert "already completed" in result.stderr
    assert _json.loads(result.stdout) == BASIC_OUTPUT
    assert len(logged(log)) == 3  # no tool ran again


@pytest.mark.parametrize("flag", ["--refresh-failed", "--force-refresh"])
def test_a_refresh_flag_on_a_completed_run_says_it_did_not_apply(deepline, basic, flag: str) -> None:
    """`resume RUN --refresh-failed` (or `run --run-id RUN`) of a completed run runs
    nothing: it says so, and how the failed rows are asked again (a new run), instead
    of dropping the flag without a word."""
    play, log, payload = basic
    assert deepline("run", str(play), "--input", payload, "--run-id", "done-2").code == 0
    for again in (("resume", "done-2", flag), ("run", str(play), "--input", payload, "--run-id", "done-2", flag)):
        result = deepline(*again, "--json")
        assert result.code == 0, result.stderr
        assert result.json_lines()[-1]["event"] == "run.finished"  # stdout stays NDJSON
        assert f"{flag} did not apply: run done-2 already completed" in result.stderr, again
        assert f"start a new run of the play with {flag} (without --run-id)" in result.stderr
    assert len(logged(log)) == 3  # nothing ran again


def test_a_budget_on_a_completed_run_says_it_did_not_apply(deepline, basic) -> None:
    """`resume RUN --max-credits N` of a completed run spends nothing and says so, as the
    refresh flags do, instead of dropping the budget without a word."""
    play, log, payload = basic
    assert deepline("run", str(play), "--input", payload, "--run-id", "done-3").code == 0
    for again in (("resume", "done-3"), ("run", str(play), "--input", payload, "--run-id", "done-3")):
        result = deepline(*again, "--max-credits", "1")
        assert result.code == 0, result.stderr
        said = "--max-credits did not apply: run done-3 already completed; nothing was run again, nor spent."
        assert said in result.stderr, again
        assert "--refresh-failed" not in result.stderr and "--force-refresh" not in result.stderr
    assert len(logged(log)) == 3  # nothing ran again


@pytest.mark.parametrize("empty", ["", " "])
def test_an_empty_run_id_is_refused_not_ignored(deepline, basic, empty: str) -> None:
    """`--run-id "$RUN_ID"` with the variable unset: refused (exit 2), not a new run under a
    random id each time, which would lose the idempotency the CI script asked for."""
    play, log, payload = basic
    result = deepline("run", str(play), "--input", payload, "--run-id", empty)
    assert result.code == 2, result.stderr
    assert "is empty (an unset variable?)" in result.stderr
    assert logged(log) == [] and deepline("runs", "list", "--json").stdout == ""


def test_a_play_that_prints_keeps_stdout_to_the_runs_own_output(deepline, write_play) -> None:
    """`print()` in a play (the README suggests `print(rows.count(), rows.peek(3))`) and in
    its tools goes to stderr: under --json stdout is NDJSON only, and without it stdout is
    the run's output alone (`deepline run play.py > out.json`)."""
    play = write_play(
        """
        import sys
        from deepline_cli import play, tool

        @tool("t.loud")
        def loud(input):
            print("tool says", input["n"])
            return input["n"]

        @play("chatty")
        async def chatty(ctx, input):
            print("peek:", [1, 2])
            sys.stdout.write("raw write\\n")
            rows = await ctx.map("rows", [{"n": 1}, {"n": 2}], key="n",
                                 columns={"x": lambda row, rc: rc.tools.execute("loud", "t.loud", {"n": row["n"]})})
            return {"rows": len(rows)}
        """
    )
    result = deepline("run", str(play), "--json")
    assert result.code == 0, result.stderr
    assert [line["event"] for line in result.json_lines()][-1] == "run.finished"  # every line is JSON
    assert "peek: [1, 2]" in result.stderr and "raw write" in result.stderr and "tool says 2" in result.stderr
    human = deepline("run", str(play), "--quiet")
    assert human.code == 0, human.stderr
    assert _json.loads(human.stdout) == {"rows": 2}
    assert "peek: [1, 2]" in human.stderr


@pytest.mark.process
def test_what_a_tools_subprocess_prints_keeps_off_stdout_too(deepline_process, write_play, tmp_path) -> None:
    """A tool that runs a program (`subprocess.run`, `os.system`) writes to file descriptor
    1, not to `sys.stdout`: under --json stdout is still NDJSON only, the program's output on
    stderr; without --json stdout is the run's output alone."""
    play = write_play(
        """
        import os, subprocess, sys
        from deepline_cli import play, tool

        @tool("t.shell")
        def shell(input):
            subprocess.run([sys.executable, "-c", f"print('child says {input['n']}')"], check=True)
            os.system(f"echo system says {input['n']}")
            return input["n"]

        @play("shelly")
        async def shelly(ctx, input):
            rows = await ctx.map("rows", [{"n": 1}, {"n": 2}], key="n",
                                 columns={"x": lambda row, rc: rc.tools.execute("sh", "t.shell", {"n": row["n"]})})
            return {"rows": len(rows)}
        """
    )
    result = deepline_process("run", str(play), "--json")
    assert result.code == 0, result.stderr
    assert [line["event"] for line in result.json_lines()][-1] == "run.finished"  # every line is JSON
    assert "child says 2" in result.stderr and "system says 1" in result.stderr
    human = deepline_process("run", str(play), "--quiet", DEEPLINE_STORE=str(tmp_path / "fresh.db"))
    assert human.code == 0, human.stderr
    assert _json.loads(human.stdout) == {"rows": 2}
    assert "child says 1" in human.stderr


def test_an_error_in_the_play_body_is_named_by_its_type(deepline, write_play) -> None:
    """`row["first_name"]` in the body (not in a column) failed the run with `'first_name'
    (play.py line 7)`: a KeyError, said as map rows say theirs."""
    play = write_play(
        """
        from deepline_cli import play

        @play("body")
        async def body(ctx, input):
            row = {"First Name": "Ada"}
            return row["first_name"]
        """
    )
    result = deepline("run", str(play))
    assert result.code == 1
    assert "failed: KeyError: 'first_name' (play.py line 7)" in result.stderr, result.stderr
    play.write_text(play.read_text().replace('return row["first_name"]', "assert not row"))
    bare = deepline("run", str(play))  # no message: named by its type, once
    assert bare.code == 1 and "failed: AssertionError (play.py line 7)" in bare.stderr, bare.stderr


def test_a_completed_pilot_under_a_run_id_is_not_reported_as_the_full_run(deepline, write_play) -> None:
    """`--run-id lim-1 --limit 5` (a pilot), then `--run-id lim-1` for every row: the second
    was told "already completed" with the pilot's 5 rows, and a CI job went green. Refused
    (exit 2), naming both; the same --limit again is reported as before."""
    play = write_play(
        """
        from deepline_cli import play

        @play("pilot")
        async def pilot(ctx, input):
            rows = await ctx.map("m", [{"i": i} for i in range(12)], key="i", columns={"d": lambda row: row["i"] * 2})
            return {"rows": len(rows)}
        """
    )
    first = deepline("run", str(play), "--run-id", "lim-1", "--limit", "5", "--quiet")
    assert first.code == 0 and _json.loads(first.stdout) == {"rows": 5}, first.stderr
    again = deepline("run", str(play), "--run-id", "lim-1", "--limit", "5", "--quiet")
    assert again.code == 0 and _json.loads(again.stdout) == {"rows": 5}, again.stderr
    full = deepline("run", str(play), "--run-id", "lim-1", "--quiet")
    assert full.code == 2, full.stderr
    assert "completed with --limit 5" in full.stderr and "asks for every row" in full.stderr, full.stderr
    other = deepline("run", str(play), "--run-id", "lim-1", "--limit", "8")
    assert other.code == 2 and "asks for --limit 8" in other.stderr, other.stderr
    assert deepline("run", str(play), "--run-id", "lim-1-full", "--quiet").stdout.strip() == '{"rows":12}'
    # A pilot that failed: the same command again resumes it; the whole list under its id is refused.
    failing = play.read_text().replace('    return {"rows": len(rows)}', '    raise RuntimeError("after the pilot")')
    play.write_text(failing)
    assert deepline("run", str(play), "--run-id", "lim-2", "--limit", "5", "--quiet").code == 1
    refused = deepline("run", str(play), "--run-id", "lim-2", "--quiet")
    assert refused.code == 2 and "was started with --limit 5" in refused.stderr, refused.stderr
    assert "deepline resume lim-2" in refused.stderr


def test_a_completed_run_with_failed_rows_exits_as_it_was_started_to_every_time(deepline, write_play) -> None:
    """Started with --fail-on-row-errors (exit 1 for its failed row), the run is reported by
    `resume` and `run --run-id` with the same exit code: a CI retry step does not turn green
    with nothing changed."""
    play = write_play(
        """
        from deepline_cli import play

        def check(row):
            if row["n"] == 2:
                raise ValueError("no such lead")
            return row["n"]

        @play("strict")
        async def strict(ctx, input):
            await ctx.map("rows", [{"n": 1}, {"n": 2}], key="n", columns={"x": check})
        """
    )
    strict = deepline("run", str(play), "--run-id", "strict-1", "--fail-on-row-errors", "--json")
    assert strict.code == 1
    # --json says why the process exits 1 ("completed" with no error, before)
    assert (strict.json_lines()[-1]["status"], strict.json_lines()[-1]["exit_code"]) == ("completed", 1)
    assert "completed with 1 failed row(s) (--fail-on-row-errors)" in strict.stderr  # a CI log shows stderr
    assert deepline("resume", "strict-1").code == 1
    reported = deepline("run", str(play), "--run-id", "strict-1", "--json")
    assert reported.code == 1 and reported.json_lines()[-1]["exit_code"] == 1
    assert deepline("runs", "tail", "strict-1").code == 1
    # Started without the flag it exited 0; a CI step that gives the flag to its rerun asks
    # for 1 on failed rows (README), and the flag is not kept for later reruns.
    assert deepline("run", str(play), "--run-id", "lax-1").code == 0
    assert deepline("run", str(play), "--run-id", "lax-1", "--fail-on-row-errors").code == 1
    assert deepline("run", str(play), "--run-id", "lax-1").code == 0


def test_a_fixed_run_id_over_a_csv_written_anew_is_refused_not_reported(deepline, write_play, tmp_path: Path) -> None:
    """A nightly job with a fixed --run-id and a CSV regenerated at the same path: tonight's
    file is not last night's input, so the completed run is not reported as tonight's
    result (exit 2, saying what to do); the same file, untouched, is reported as before."""
    play = write_play(
        """
        from deepline_cli import play

        @play("nightly")
        async def nightly(ctx, input):
            rows = await ctx.map("rows", ctx.csv(input["csv"]), key="id", columns={"x": lambda row: row["id"]})
            return {"rows": len(rows)}
        """
    )
    leads = tmp_path / "nightly.csv"
    leads.write_text("id\n1\n2\n")
    assert deepline("run", str(play), "--csv", "nightly.csv", "--run-id", "nightly").code == 0
    again = deepline("run", str(play), "--csv", "nightly.csv", "--run-id", "nightly")
    assert again.code == 0 and "already completed" in again.stderr
    leads.write_text("id\n1\n2\n")  # the same bytes, written again (a fresh checkout, a touch)
    os.utime(leads, ns=(1, 1))
    same = deepline("run", str(play), "--csv", "nightly.csv", "--run-id", "nightly")
    assert same.code == 0 and "already completed" in same.stderr, same.stderr
    leads.write_text("id\n1\n2\n3\n")
    tonight = deepline("run", str(play), "--csv", "nightly.csv", "--run-id", "nightly")
    assert tonight.code == 2, tonight.stderr
    assert "nightly.csv as it was then, and that file has been written since" in tonight.stderr
    assert "give this run a new --run-id" in tonight.stderr
    fresh = deepline("run", str(play), "--csv", "nightly.csv", "--run-id", "nightly-2", "--json")
    assert fresh.code == 0 and fresh.json_lines()[-1]["output"] == {"rows": 3}


def test_a_fixed_run_id_run_from_another_folder_whose_input_names_another_file_is_refused(
    deepline, write_play, tmp_path: Path
) -> None:
    """`--input '{"csv": "small.csv"}' --run-id rel` from another folder names that folder's
    small.csv: the completed run over the first folder's file was reported as its result.
    A file gone since is said to be gone, not "written since"."""
    play = write_play(
        """
        from deepline_cli import play

        @play("rel")
        async def rel(ctx, input):
            rows = await ctx.map("rows", ctx.csv(input["csv"]), key="id", columns={"x": lambda row: row["id"]})
            return {"rows": len(rows)}
        """
    )
    (tmp_path / "small.csv").write_text("id\n1\n2\n3\n4\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / "small.csv").write_text("id\n8\n9\n")
    payload = '{"csv": "small.csv"}'
    assert deepline("run", str(play), "--input", payload, "--run-id", "rel").code == 0
    checkout = tmp_path / "checkout"  # another folder holding the same file: a CI job's fresh checkout
    checkout.mkdir()
    (checkout / "small.csv").write_bytes((tmp_path / "small.csv").read_bytes())
    same = deepline("run", str(play), "--input", payload, "--run-id", "rel", cwd=checkout)
    assert same.code == 0 and "already completed" in same.stderr, same.stderr
    there = deepline("run", str(play), "--input", payload, "--run-id", "rel", cwd=other)
    assert there.code == 2, there.stderr
    (tmp_path / "small.csv").write_text("id\n9\n8\n7\n")  # the run's own folder's file changed since
    moved = deepline("run", str(play), "--input", payload, "--run-id", "rel", cwd=checkout)
    assert moved.code == 2, moved.stderr  # the checkout's same old bytes do not stand for it
    (tmp_path / "small.csv").write_bytes((checkout / "small.csv").read_bytes())
    assert f"{other / 'small.csv'}" in there.stderr and f"run it from {tmp_path}" in there.stderr, there.stderr
    (tmp_path / "small.csv").unlink()
    gone = deepline("run", str(play), "--input", payload, "--run-id", "rel")
    assert gone.code == 2 and "that file is gone since" in gone.stderr, gone.stderr


def test_run_id_twice_reports_the_completed_run_without_running_tools(deepline, basic) -> None:
    play, log, payload = basic
    first = run_json(deepline, "run", str(play), "--input", payload, "--run-id", "ci-1")
    assert first[-1]["status"] == "completed"
    assert len(logged(log)) == 3

    second = deepline("run", str(play), "--input", payload, "--run-id", "ci-1", "--json")
    assert second.code == 0, second.stderr
    events = second.json_lines()
    last = events[-1]
    assert last["event"] == "run.finished"
    assert last["run_id"] == "ci-1"
    assert last["status"] == "completed"
    assert last["output"] == BASIC_OUTPUT
    assert not [e for e in events if e["event"] == "tool.call"]

    third = deepline("run", str(play), "--input", payload, "--run-id", "ci-1")
    assert third.code == 0
    assert "already completed" in third.stderr
    assert _json.loads(third.stdout) == BASIC_OUTPUT

    assert len(logged(log)) == 3  # the tool was never invoked again
    shown = _json.loads(deepline("runs", "show", "ci-1", "--json").stdout)
    assert shown["attempt"] == 1


def test_run_id_of_another_play_or_input_is_refused_not_reported(deepline, basic, write_play) -> None:
    """A nightly job with a fixed --run-id and tonight's input must not be told "completed"
    for last night's run: a run id names one play and one input."""
    play, log, payload = basic
    assert deepline("run", str(play), "--input", payload, "--run-id", "nightly").code == 0
    other_input = _json.dumps_str({**_json.loads(payload), "n": 2})
    changed = deepline("run", str(play), "--input", other_input, "--run-id", "nightly")
    assert changed.code == 2, changed.stdout
    assert changed.stderr.splitlines()[0] == (
        "Error: Run nightly is a run of play 'basic' with another input; give this run a new "
        "--run-id, or continue that one as it was with `deepline resume nightly`."
    )
    other = write_play(BASIC_PLAY.replace('@play("basic"', '@play("other"'), "other.py")
    another = deepline("run", str(other), "--input", payload, "--run-id", "nightly")
    assert another.code == 2
    assert "Run nightly is a run of play 'basic', not 'other';" in another.stderr
    # Another workspace (its own receipts and sheets): not last night's run of the default one.
    elsewhere = deepline("run", str(play), "--input", payload, "--run-id", "nightly", DEEPLINE_WORKSPACE="acme")
    assert elsewhere.code == 2, elsewhere.stderr
    assert "Run nightly is a run of workspace 'default', not 'acme';" in elsewhere.stderr, elsewhere.stderr
    assert len(logged(log)) == 3  # nothing ran again
    assert deepline("run", str(play), "--input", payload, "--run-id", "nightly").code == 0  # the same: reported


def test_run_id_of_a_failed_run_imports_its_play_once(deepline, tmp_path, write_play) -> None:
    """Checking that `--run-id` names the same play loads it; the resume uses that load, not
    a second import (the play's module-level code runs once per command)."""
    loads, flag = tmp_path / "loads.txt", tmp_path / "flag"
    play = write_play(
        f"""
from pathlib import Path
from deepline_cli import play

with open({str(loads)!r}, "a") as f:
    f.write("load\\n")

@play("once")
async def once(ctx, input):
    if Path({str(flag)!r}).exists():
        raise RuntimeError("not yet")
    return "done"
""",
        "once.py",
    )
    flag.touch()
    assert deepline("run", str(play), "--run-id", "o-1").code == 1
    flag.unlink()
    before = loads.read_text().count("load")
    again = deepline("run", str(play), "--run-id", "o-1")
    assert again.code == 0, again.stderr
    assert loads.read_text().count("load") - before == 1


def test_a_reported_run_finished_event_carries_its_timestamp(deepline, basic) -> None:
    """§5: every --json event has `ts`; a completed run is reported with its stored
    `run.finished` event, so `ts` is when it finished, not null."""
    play, _, payload = basic
    first = run_json(deepline, "run", str(play), "--input", payload, "--run-id", "ts-1")
    for args in (("run", str(play), "--input", payload, "--run-id", "ts-1"), ("resume", "ts-1")):
        last = run_json(deepline, *args)[-1]
        assert (last["event"], last["run_id"], last["status"]) == ("run.finished", "ts-1", "completed")
        assert isinstance(last["ts"], int | float), f"{args[0]}: ts is {last['ts']!r}"
        assert first[0]["ts"] <= last["ts"] <= first[-1]["ts"] + 5


def test_run_id_of_a_failed_run_resumes_it(deepline, tmp_path, write_play) -> None:
    play = write_play(FAILING_PLAY, "flaky.py")
    flag, log = tmp_path / "flag", tmp_path / "count.log"
    flag.touch()
    payload = _json.dumps_str({"log": str(log), "flag": str(flag)})
    first = deepline("run", str(play), "--input", payload, "--run-id", "f-1")
    assert first.code == 1
    assert _json.loads(deepline("runs", "show", "f-1", "--json").stdout)["status"] == "failed"

    flag.unlink()
    events = run_json(deepline, "run", str(play), "--input", payload, "--run-id", "f-1")
    assert events[0]["event"] == "run.started"
    assert events[0]["attempt"] == 2
    finished = events[-1]
    assert finished["status"] == "completed"
    assert finished["attempt"] == 2
    assert finished["output"] == {"answer": 42, "attempt": 2}
    assert logged(log) == ["count"]  # the tool call of attempt 1 was reused
    shown = _json.loads(deepline("runs", "show", "f-1", "--json").stdout)
    assert (shown["status"], shown["attempt"]) == ("completed", 2)


# --- runs list / show / logs ----------------------------------------------------------------


def test_runs_list_show_and_logs(deepline, basic, tmp_path, write_play) -> None:
    play, _, payload = basic
    assert deepline("run", str(play), "--input", payload, "--run-id", "ok-1").code == 0
    flaky = write_play(FAILING_PLAY, "flaky.py")
    (tmp_path / "flag").touch()
    flaky_input = _json.dumps_str({"log": str(tmp_path / "c.log"), "flag": str(tmp_path / "flag")})
    assert deepline("run", str(flaky), "--input", flaky_input, "--run-id", "bad-1").code == 1

    table = deepline("runs", "list")
    assert table.code == 0, table.stderr
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines()[1:] if line.strip()}
    assert rows["ok-1"][1:3] == ["basic", "completed"]
    assert rows["bad-1"][1:3] == ["flaky", "failed"]

    listed = {r["run_id"]: r for r in run_json(deepline, "runs", "list")}
    assert set(listed) == {"ok-1", "bad-1"}
    for run_id, play_name, status in [("ok-1", "basic", "completed"), ("bad-1", "flaky", "failed")]:
        row = listed[run_id]
        assert {"run_id", "play", "status", "parent_run_id", "root_run_id"} <= row.keys()
        assert (row["play"], row["status"]) == (play_name, status)
        assert row["parent_run_id"] is None
        assert row["root_run_id"] == run_id
    assert [r["run_id"] for r in run_json(deepline, "runs", "list", "--status", "failed")] == ["bad-1"]

    text = deepline("runs", "show", "ok-1")
    assert text.code == 0, text.stderr
    assert "ok-1" in text.stdout
    assert "completed" in text.stdout
    assert "t.double" in text.stdout
    shown = _json.loads(deepline("runs", "show", "ok-1", "--json").stdout)
    assert (shown["run_id"], shown["play"], shown["status"]) == ("ok-1", "basic", "completed")
    assert shown["output"] == BASIC_OUTPUT
    assert shown["stats"]["tools"]["t.double"]["live"] == 3
    failed = _json.loads(deepline("runs", "show", "bad-1", "--json").stdout)
    assert "the flag file is still there" in failed["error"]["message"]

    logs = deepline("runs", "logs", "ok-1")
    assert logs.code == 0, logs.stderr
    assert "basic play starting" in logs.stdout
    assert "total is 6" in logs.stdout


# --- receipts inspect -----------------------------------------------------------------------


def test_receipts_inspect_lists_and_filters_the_receipts_of_a_run(deepline, basic) -> None:
    play, _, payload = basic
    assert deepline("run", str(play), "--input", payload, "--run-id", "rc-1").code == 0
    receipts = run_json(deepline, "receipts", "inspect", "--run", "rc-1")
    assert len(receipts) == 8  # 3 double + 3 label + 1 broken + 1 step
    for r in receipts:
        assert r.keys() >= RECEIPT_KEYS, r.keys()
        assert r["run_id"] == "rc-1"
        assert r["attempt"] == 1
        assert r["created_at"] is not None
    by_label = {r["label"]: r for r in receipts}
    assert set(by_label) == {
        "double-0", "double-1", "double-2", "label-0", "label-1", "label-2", "broken", "total",
    }  # fmt: skip
    double = by_label["double-1"]
    assert (double["kind"], double["tool"], double["status"]) == ("tool", "t.double", "completed")
    assert double["credits"] == 1
    assert double["completed_at"] is not None
    assert double["failure_kind"] is None
    assert (by_label["total"]["kind"], by_label["total"]["status"]) == ("step", "completed")
    broken = by_label["broken"]
    assert (broken["status"], broken["failure_kind"]) == ("failed", "internal")
    assert "the broken tool broke" in _json.dumps_str(broken["error"])

    table = deepline("receipts", "inspect", "--run", "rc-1")
    assert table.code == 0, table.stderr
    assert "double-0" in table.stdout
    assert "t.label" in table.stdout

    failed = run_json(deepline, "receipts", "inspect", "--run", "rc-1", "--status", "failed")
    assert [r["label"] for r in failed] == ["broken"]
    completed = run_json(deepline, "receipts", "inspect", "--status", "completed")
    assert sorted(r["label"] for r in completed) == sorted(set(by_label) - {"broken"})

    labels = run_json(deepline, "receipts", "inspect", "--run", "rc-1", "--tool", "t.label")
    assert sorted(r["label"] for r in labels) == ["label-0", "label-1", "label-2"]

    key = by_label["double-2"]["key"]
    prefix = key[:5]
    found = run_json(deepline, "receipts", "inspect", prefix)
    assert key in [r["key"] for r in found]
    assert all(r["key"].startswith(prefix) for r in found)
    assert len(found) == sum(r["key"].startswith(prefix) for r in receipts)


REFRESHED_PLAY = """
from deepline_cli import Column, play, tool

@tool("t.rev", credits=1)
def rev(input):
    with open(input["log"], "a") as f:
        f.write("x")
    with open(input["log"]) as f:
        return {"rev": len(f.read())}

@play("refreshed")
async def refreshed(ctx, input):
    async def firm(row, rc):
        return (await rc.tools.execute("rev", "t.rev", {"d": row["d"], "log": input["log"]})).output["rev"]

    rows = await ctx.map("m", [{"d": "a.com"}], key="d", columns={"firm": Column(firm, stale_after_seconds=0)})
    return [row["firm"] for row in rows]
"""


def test_receipts_inspect_of_a_run_shows_the_answer_it_paid_though_a_later_run_refreshed_it(
    deepline, write_play, tmp_path: Path
) -> None:
    """Run A refreshed a receipt (generation 2), run B refreshed it again (3): `receipts
    inspect --run A` listed generation 3, B's, as A's, while A's export shows its own."""
    play = write_play(REFRESHED_PLAY)
    payload = _json.dumps_str({"log": str(tmp_path / "calls.log")})
    for run_id in ("first", "a", "b"):
        assert deepline("run", str(play), "--input", payload, "--run-id", run_id).code == 0
    (paid,) = run_json(deepline, "receipts", "inspect", "--run", "a")
    assert (paid["run_id"], paid["generation"], paid["output"]) == ("a", 2, {"rev": 2}), paid
    (latest,) = run_json(deepline, "receipts", "inspect", "--run", "b")
    assert (latest["run_id"], latest["generation"], latest["output"]) == ("b", 3, {"rev": 3}), latest


def test_receipts_inspect_rejects_an_unknown_status(deepline) -> None:
    result = deepline("receipts", "inspect", "--status", "bogus")
    assert result.code == 2
    assert_one_error_sentence(result)
    assert "bogus" in result.stderr
    unknown_run = deepline("receipts", "inspect", "--run", "no-such-run")
    assert unknown_run.code == 2
    assert_one_error_sentence(unknown_run)


def test_receipts_inspect_run_lists_receipts_reused_from_an_earlier_run(deepline, basic) -> None:
    play, log, payload = basic
    assert deepline("run", str(play), "--input", payload, "--run-id", "first").code == 0
    second = run_json(deepline, "run", str(play), "--input", payload, "--run-id", "second")
    assert counts(second[-1]["stats"]["tools"]["t.double"]) == {"live": 0, "reused": 3, "failed": 0,
                                                                "credits": 0.0, "retries": 0}  # fmt: skip
    assert len(logged(log)) == 3

    of_first = {r["key"]: r for r in run_json(deepline, "receipts", "inspect", "--run", "first")}
    of_second = {r["key"]: r for r in run_json(deepline, "receipts", "inspect", "--run", "second")}
    tool_keys = {k for k, r in of_first.items() if r["kind"] == "tool" and r["status"] == "completed"}
    assert len(tool_keys) == 6
    assert tool_keys <= of_second.keys()  # reused receipts are listed under the new run
    for key in tool_keys:
        assert of_second[key]["run_id"] == "first"  # the owner is still the run that paid
    # The failed tool receipt is reused (not retried) too.
    assert [r["label"] for r in of_second.values() if r["status"] == "failed"] == ["broken"]


# --- busy runs and takeover -----------------------------------------------------------------


def _status_of(deepline: Callable[..., Result], run_id: str) -> str | None:
    result = deepline("runs", "list", "--json")
    for row in result.json_lines() if result.code == 0 else []:
        if row["run_id"] == run_id:
            return str(row["status"])
    return None


def test_resume_refuses_a_live_run_then_takes_over_a_killed_one(deepline, spawn, tmp_path, write_play) -> None:
    play = write_play(BLOCKING_PLAY, "blocker.py")
    log = tmp_path / "block.log"
    payload = _json.dumps_str({"log": str(log)})
    # A long lease: taking over the killed run must not wait for it to expire.
    ttl = {"DEEPLINE_LEASE_TTL": "60"}
    holder = spawn("run", str(play), "--input", payload, "--run-id", "busy-1", "--quiet", **ttl)
    wait_until(lambda: _status_of(deepline, "busy-1") == "running", what="busy-1 to be running")
    wait_until(lambda: logged(log) == ["start 1"], what="the tool call to be in flight")

    busy = deepline("resume", "busy-1", **ttl)
    assert busy.code == 4, busy.stderr
    assert_one_error_sentence(busy)
    again = deepline("run", str(play), "--input", payload, "--run-id", "busy-1", **ttl)
    assert again.code == 4, again.stderr  # --run-id of a held run: busy too
    assert holder.poll() is None  # the holder was left alone

    holder.send_signal(signal.SIGKILL)
    holder.wait()
    started = time.monotonic()
    taken = deepline("resume", "busy-1", "--json", timeout=40, **ttl)
    elapsed = time.monotonic() - started
    assert taken.code == 0, taken.stderr
    finished = taken.json_lines()[-1]
    assert finished["status"] == "completed"
    assert finished["attempt"] == 2
    assert finished["output"] == {"result": "done", "attempt": 2}
    assert elapsed < 20, f"the takeover waited {elapsed:.1f}s (for a lease?)"
    assert logged(log) == ["start 1", "start 2"]
    shown = _json.loads(deepline("runs", "show", "busy-1", "--json").stdout)
    assert (shown["status"], shown["attempt"]) == ("completed", 2)


# --- interrupts -----------------------------------------------------------------------------


@pytest.mark.process
@pytest.mark.parametrize(
    ("signum", "tool_id"),
    [(signal.SIGINT, "t.limited"), (signal.SIGTERM, "t.free")],
    ids=["SIGINT-concurrency-limited-tool", "SIGTERM-unlimited-tool"],
)
def test_interrupt_then_resume_does_every_call_once(
    deepline, spawn, tmp_path, write_play, signum: int, tool_id: str
) -> None:
    n = 120
    play = write_play(SLOW_PLAY, "slow.py")
    log = tmp_path / "slow.log"
    payload = _json.dumps_str({"log": str(log), "n": n, "tool": tool_id})
    proc = spawn("run", str(play), "--input", payload, "--run-id", "int-1", "--quiet")
    wait_until(lambda: sum(line.startswith("end ") for line in logged(log)) >= 20,
             what="20 calls to finish")  # fmt: skip
    proc.send_signal(signum)
    assert proc.wait(timeout=30) == 130, spawned_output(tmp_path)
    out, err = spawned_output(tmp_path)
    assert out == ""
    assert "interrupted" in err
    assert "Traceback" not in err
    first_attempt = logged(log)
    assert sum(line.startswith("end ") for line in first_attempt) < n  # really interrupted

    shown = _json.loads(deepline("runs", "show", "int-1", "--json").stdout)
    assert shown["status"] == "interrupted"

    resumed = deepline("resume", "int-1")
    assert resumed.code == 0, resumed.stderr
    assert _json.loads(resumed.stdout) == {"total": sum(range(n))}
    shown = _json.loads(deepline("runs", "show", "int-1", "--json").stdout)
    assert (shown["status"], shown["attempt"]) == ("completed", 2)

    starts = collections.Counter(int(line.split()[1]) for line in logged(log) if line.startswith("start "))
    finished_in_1 = {int(line.split()[1]) for line in first_attempt if line.startswith("end ")}
    started_in_1 = {int(line.split()[1]) for line in first_attempt if line.startswith("start ")}
    assert set(starts) == set(range(n))  # every call executed
    for i in finished_in_1:
        assert starts[i] == 1, f"call {i} returned before the interrupt but was executed again"
    twice = {i for i, count in starts.items() if count > 1}
    assert twice <= started_in_1 - finished_in_1  # only calls in flight at the signal
    assert max(starts.values()) <= 2


def test_runs_list_says_when_its_filters_match_nothing(deepline, tmp_path) -> None:
    assert "No runs yet: there is no store at" in deepline("runs", "list").stdout
    assert not (tmp_path / "deepline.db").exists()  # a listing creates no store
    (tmp_path / "play.py").write_text(
        "from deepline_cli import play\n\n@play('one')\nasync def one(ctx, input):\n    return 1\n"
    )
    assert deepline("run", "play.py", "--quiet").code == 0
    assert "No run matches these filters." in deepline("runs", "list", "--play", "other").stdout
    assert "No run matches these filters." in deepline("runs", "list", "--status", "waiting").stdout


def test_a_run_on_a_store_in_a_folder_that_is_not_there_is_refused(deepline, tmp_path: Path) -> None:
    """A run's store named in a folder that does not exist is a typo, or `sqlite:///` taken
    for an absolute path (it is followed by a relative one, as in SQLAlchemy): refused, so
    a CI job does not start a new, empty store in a new folder each time and pay every call
    again. Four slashes name an absolute path; the default store's folder is made."""
    (tmp_path / "play.py").write_text(
        "from deepline_cli import play\n\n@play('one')\nasync def one(ctx, input):\n    return 1\n"
    )
    absolute = tmp_path / "stores" / "x.db"
    meant = deepline("run", "play.py", "--store", f"sqlite://{absolute}")  # three slashes: relative
    assert meant.code == 2, meant.stderr
    relative = str(absolute).lstrip("/")
    assert f"sqlite:///{relative} is a path relative to the current folder" in meant.stderr
    assert f"sqlite:///{absolute}" in meant.stderr  # the URL it meant, four slashes
    typo = deepline("run", "play.py", "--store", str(absolute))
    assert typo.code == 2 and f"The store's folder {absolute.parent} does not exist" in typo.stderr
    worker = deepline("worker", "--once", "--store", str(absolute))  # said at once, no thread's traceback
    assert worker.code == 2 and f"The store's folder {absolute.parent} does not exist" in worker.stderr
    assert "Traceback" not in worker.stderr and "worker: done" not in worker.stderr, worker.stderr
    assert not (tmp_path / "stores").exists() and not (tmp_path / relative.split("/")[0]).exists()
    absolute.parent.mkdir()
    assert deepline("run", "play.py", "--store", f"sqlite:///{absolute}", "--quiet").code == 0
    assert absolute.exists()
    home = tmp_path / "home"
    made = deepline("run", "play.py", "--quiet", DEEPLINE_STORE="", XDG_DATA_HOME=str(home))
    assert made.code == 0, made.stderr
    assert (home / "deepline" / "deepline.db").exists()


def test_an_empty_workspace_is_refused_not_a_workspace_of_its_own(deepline, tmp_path: Path) -> None:
    """`--workspace "$WS"` with WS unset (or " acme") would key every receipt anew, and pay
    every call again: refused, as an empty --run-id is. DEEPLINE_WORKSPACE set empty is unset."""
    (tmp_path / "play.py").write_text(
        "from deepline_cli import play\n\n@play('one')\nasync def one(ctx, input):\n    return 1\n"
    )
    for name, said in (("", "is empty (an unset variable?)"), (" acme", "has spaces around it")):
        refused = deepline("run", "play.py", "--workspace", name)
        assert refused.code == 2 and said in refused.stderr, refused.stderr
    assert deepline("runs", "list").stdout.startswith("No runs yet")
    unset = deepline("run", "play.py", "--json", DEEPLINE_WORKSPACE="")
    assert unset.code == 0, unset.stderr
    [run] = [_json.loads(line) for line in deepline("runs", "list", "--json").stdout.splitlines()]
    assert run["workspace"] == "default"


BUDGETED_PLAY = """\
from deepline_cli import play, tool


@tool("demo.paid", credits=1)
def paid(input):
    return input["n"] * 2


@play("budgeted", secrets=["DEMO_KEY"])
async def budgeted(ctx, input):
    return [(await ctx.tools.execute(f"n{n}", "demo.paid", {"n": n})).output for n in range(3)]
"""


def test_a_resume_refused_before_its_play_runs_leaves_the_run_as_it_was(deepline, tmp_path: Path) -> None:
    """A resume whose play no longer loads (moved, a syntax error) or whose secret is not
    set is refused (exit 2) before it takes the run: no attempt is counted, and the run
    keeps its status and the error it stopped on. Fixed, the resume is attempt 2."""
    play = tmp_path / "play.py"
    play.write_text(BUDGETED_PLAY)
    stopped = deepline("run", str(play), "--run-id", "b", "--max-credits", "2", DEMO_KEY="k")
    assert stopped.code == 1, stopped.stderr

    def shown() -> dict:
        return _json.loads(deepline("runs", "show", "b", "--json").stdout)

    before = shown()
    assert (before["status"], before["attempt"]) == ("failed", 1)
    play.rename(tmp_path / "moved.py")
    assert deepline("resume", "b", "--max-credits", "9", DEMO_KEY="k").code == 2
    (tmp_path / "moved.py").rename(play)
    play.write_text(BUDGETED_PLAY + "\nthis is not python\n")
    assert deepline("resume", "b", "--max-credits", "9", DEMO_KEY="k").code == 2
    play.write_text(BUDGETED_PLAY)
    unset = deepline("resume", "b", "--max-credits", "9")
    assert unset.code == 2 and "needs the secret DEMO_KEY" in unset.stderr, unset.stderr
    after = shown()
    assert (after["status"], after["attempt"], after["error"]) == ("failed", 1, before["error"])
    assert after["stats"]["attempts"] == 1
    done = deepline("resume", "b", "--max-credits", "9", "--json", DEMO_KEY="k")
    assert done.code == 0, done.stderr
    assert (shown()["attempt"], shown()["output"]) == (2, [0, 2, 4])


def test_a_queued_run_resumed_by_hand_reads_its_snapshots_config(deepline, tmp_path: Path) -> None:
    """`run --enqueue` keeps the play and its deepline.toml in a snapshot: `deepline resume`
    of that run reads the snapshot's config, not the file it was enqueued from (gone, or
    edited since), as a worker would."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "play.py").write_text(
        "from deepline_cli import play\n\n@play('snap')\nasync def snap(ctx, input):\n    return {'ok': 1}\n"
    )
    (project / "deepline.toml").write_text('[tools."demo.http"]\nmethod = "GET"\nurl = "http://127.0.0.1:9/x"\n')
    queued = deepline("run", "proj/play.py", "--enqueue", "--run-id", "q1")
    assert queued.code == 0, queued.stderr
    (project / "deepline.toml").unlink()  # the project moved on; the snapshot holds the config
    resumed = deepline("resume", "q1", "--json")
    assert resumed.code == 0, resumed.stderr
    assert _json.loads(resumed.stdout.splitlines()[-1])["output"] == {"ok": 1}


def test_a_read_only_command_on_a_mistyped_store_path_creates_nothing(deepline, tmp_path: Path) -> None:
    """`runs list --store /no/such/dir/x.db` is a typo: refused (exit 2) with the path, and
    no folder or empty store is left behind to look like a store with no runs. A store URL
    missing its slashes (`sqlite:rel.db`) is refused too, not made a file of that name."""
    missing = tmp_path / "no" / "such" / "x.db"
    for args in (
        ("runs", "list"), ("runs", "show", "r-1"), ("export", "r-1"), ("receipts", "inspect"),
        ("runs", "stop", "r-1"), ("events", "send", "r-1", "go"),
    ):  # fmt: skip
        result = deepline(*args, "--store", str(missing))
        assert result.code == 2, (args, result.stderr)
        assert f"There is no store at {missing}: the folder {missing.parent} does not exist" in result.stderr
    assert not (tmp_path / "no").exists()
    bad = deepline("runs", "list", "--store", "sqlite:rel.db")
    assert bad.code == 2 and "use sqlite:///path/to/file.db" in bad.stderr
    assert not (tmp_path / "sqlite:rel.db").exists()
    options = deepline("runs", "list", "--store", "sqlite:///x.db?mode=ro")
    assert options.code == 2 and "has options (after '?')" in options.stderr
    upper = deepline("runs", "list", "--store", "SQLITE:///upper.db")  # the scheme in any case
    assert upper.code == 0, upper.stderr
    assert "No runs yet: there is no store at upper.db" in upper.stdout, upper.stdout
    assert not (tmp_path / "upper.db").exists() and not (tmp_path / "SQLITE:").exists()
    # A file that is not there, in a folder that is: a typo too (or nothing has run yet).
    for args in (("runs", "show", "r-1"), ("export", "r-1"), ("receipts", "inspect"), ("events", "send", "r-1", "go")):
        result = deepline(*args, "--store", "typo.db")
        assert result.code == 2, (args, result.stderr)
        assert "There is no store at typo.db (a run creates it)" in result.stderr, result.stderr
    listed = deepline("runs", "list", "--store", "typo.db")
    assert listed.code == 0 and "No runs yet: there is no store at typo.db" in listed.stdout
    assert not (tmp_path / "typo.db").exists()


@pytest.mark.parametrize(
    ("returned", "says"),
    [
        ('ctx.map("m", [{"a": 1}], columns={"b": lambda row: row["a"] + 1})', "returned Context.map() without"),
        ('{"r": ctx.tools.execute("x", "t.none", {})}', "an `await` missing before a ctx or rc call"),
        ("Lead()", "holds a Lead, which has no JSON form"),
    ],
    ids=["missing-await", "missing-await-inside", "object"],
)
def test_a_play_returning_no_json_fails_in_one_sentence_not_completes_with_a_repr(
    deepline, write_play, returned: str, says: str
) -> None:
    """A forgotten `await` (the map never ran) or an object with no JSON form is not a
    completed run whose output is "<coroutine object … at 0x…>": the run fails, saying why."""
    play = write_play(
        f"""
        from deepline_cli import play

        class Lead:
            pass

        @play("odd")
        async def odd(ctx, input):
            return {returned}
        """
    )
    result = deepline("run", str(play))
    assert result.code == 2, result.stderr
    assert "The play" in result.stderr and says in result.stderr, result.stderr
    assert "0x" not in result.stderr and "RuntimeWarning" not in result.stderr
    assert result.stdout == ""


def test_every_log_kind_the_runtime_writes_can_be_filtered_on(deepline, basic) -> None:
    """`runs logs --kind K` takes every kind a run writes (the README lists them)."""
    from deepline_cli.store.records import LOG_KINDS

    play, _log, payload = basic
    assert deepline("run", str(play), "--input", payload, "--run-id", "kinds").code == 0
    for kind in (*LOG_KINDS, "store.lost", "store.reconnected"):  # the outage's two lines among them
        result = deepline("runs", "logs", "kinds", "--kind", kind)
        assert result.code == 0, (kind, result.stderr)


def test_plan_check_and_tools_execute_keep_stdout_to_their_own_output(deepline, write_play) -> None:
    """A play that prints as it loads and as it runs: `plan --json`, `check --json` and
    `tools execute --play` print only their own output on stdout (the prints go to stderr)."""
    import json

    write_play(
        """
        from deepline_cli import play, tool
        print("loading!")

        @tool("pr.t")
        def t(input):
            return 1

        @play("pr")
        async def pr(ctx, input):
            print("body!")
            return (await ctx.tools.execute("t", "pr.t", {})).output
        """
    )
    for args in (("plan", "play.py", "--json"), ("check", "play.py", "--json")):
        result = deepline(*args)
        assert result.code == 0, (args, result.stderr)
        json.loads(result.stdout)
        assert "loading!" in result.stderr
    executed = deepline("tools", "execute", "pr.t", "--play", "play.py")
    assert executed.code == 0, executed.stderr
    assert json.loads(executed.stdout) == 1


def test_a_sqlite_file_of_another_program_is_refused_and_left_as_it_was(deepline, tmp_path: Path) -> None:
    """`runs list --store crm.db` (another program's SQLite file): it printed "No runs yet",
    having switched the file to WAL and added deepline's tables to it."""
    import sqlite3

    for own_migrations in (False, True):  # an application with a `_migrations` table of its own too
        other = tmp_path / f"crm-{own_migrations}.db"
        conn = sqlite3.connect(other)
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        if own_migrations:
            conn.execute("CREATE TABLE _migrations (id INTEGER PRIMARY KEY, name TEXT, applied_at REAL)")
        conn.commit()
        conn.close()
        for args in (("runs", "list"), ("receipts", "inspect")):
            result = deepline(*args, "--store", str(other))
            assert result.code == 2, result.stderr
            assert "another program's database" in result.stderr and "customers" in result.stderr, result.stderr
        conn = sqlite3.connect(other)
        try:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
            assert len(list(conn.execute("SELECT name FROM sqlite_master"))) == 1 + own_migrations
        finally:
            conn.close()


def test_a_worker_or_server_on_a_store_it_cannot_use_stops_at_once_with_exit_2(deepline, write_play, tmp_path) -> None:
    """`deepline worker` on another program's database said "the store cannot be reached"
    (it answered) and exited 1; `deepline serve` started on it and said /healthz ok, then
    answered every delivery 503."""
    import sqlite3

    crm = tmp_path / "crm.db"
    conn = sqlite3.connect(crm)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    worker = deepline("worker", "--once", "--store", str(crm))
    assert worker.code == 2, worker.stderr
    assert "another program's database" in worker.stderr and "cannot be reached" not in worker.stderr, worker.stderr
    write_play(
        """
        from deepline_cli import play

        @play("inbound", webhook_secret="HOOK_SECRET")
        async def inbound(ctx, input):
            return input
        """
    )
    served = deepline("serve", "play.py", "--port", "0", "--store", str(crm), HOOK_SECRET="s" * 32)
    assert served.code == 2, served.stderr
    assert "another program's database" in served.stderr and "deepline serve: http" not in served.stderr


def test_every_failed_row_is_listed_with_the_attempt_it_failed_in(deepline, write_play) -> None:
    """`runs logs --kind row.failed` labelled every failed row with the attempt that logged
    the map's summary: `--where attempt=1` found none of the rows attempt 1 failed."""
    write_play(
        """
        from deepline_cli import play

        @play("two")
        async def two(ctx, input):
            async def check(row):
                if row["id"] == "b":
                    await ctx.wait_for_event("go")  # the run waits here; its resume goes on
                raise ValueError(f"no company for {row['id']}")

            rows = await ctx.map("m", [{"id": "a"}, {"id": "b"}], key="id", columns={"v": check})
            return rows.failed_count
        """
    )
    assert deepline("run", "play.py", "--run-id", "two").code == 3
    assert deepline("events", "send", "two", "go").code == 0
    assert deepline("resume", "two").code == 0
    lines = deepline("runs", "logs", "two", "--kind", "row.failed", "--json").json_lines()
    assert {line["fields"]["row_key"]: line["attempt"] for line in lines} == {"a": 1, "b": 2}
    first = deepline("runs", "logs", "two", "--kind", "row.failed", "--where", "attempt=1", "--json")
    assert [line["fields"]["row_key"] for line in first.json_lines()] == ["a"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("run", "play.py", "--limit", "0"), "Invalid value for '--limit': must be 1 or more, not 0."),
        (("run", "play.py", "--max-credits", "-1"), "Invalid value for '--max-credits': must be 0 or more, not -1."),
        (("run", "play.py", "--concurrency", "many"), "Invalid value for '--concurrency': must be a whole number"),
        (("serve", "play.py", "--port", "70000"), "Invalid value for '--port': must be from 0 to 65535, not 70000."),
        (("export", "r-1", "--format", "xml"), "Invalid value for '--format': must be csv or jsonl, not 'xml'."),
    ],
)
def test_an_option_out_of_its_range_is_said_in_words(deepline, args: tuple[str, ...], words: str) -> None:
    """`--limit 0` said "Input should be greater than or equal to 1"."""
    result = deepline(*args)
    assert result.code == 2 and words in result.stderr, result.stderr


def test_a_run_id_not_completed_is_not_resumed_from_a_folder_whose_copy_no_longer_matches(
    deepline, write_play, tmp_path: Path
) -> None:
    """A failed run over a.csv, its file rewritten since; `--run-id` again from a checkout
    holding the old bytes went on with the run, which read the rewritten file."""
    play = write_play(
        """
        from pathlib import Path
        from deepline_cli import play

        @play("gated")
        async def gated(ctx, input):
            rows = await ctx.map("rows", ctx.csv(input["csv"]), key="id", columns={"x": lambda row: row["id"]})
            if not (Path(__file__).parent / "gate").exists():
                raise ValueError("the gate is shut")
            return [row["id"] for row in rows]
        """
    )
    (tmp_path / "small.csv").write_text("id\n1\n2\n")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "small.csv").write_text("id\n1\n2\n")
    payload = '{"csv": "small.csv"}'
    assert deepline("run", str(play), "--input", payload, "--run-id", "g").code == 1
    (tmp_path / "small.csv").write_text("id\n9\n8\n7\n")
    (tmp_path / "gate").write_text("open")
    again = deepline("run", str(play), "--input", payload, "--run-id", "g", cwd=checkout)
    assert again.code == 2, again.stdout + again.stderr


def test_a_keyword_connection_string_as_the_store_is_refused_without_its_password(deepline, tmp_path: Path) -> None:
    """`--store 'host=db user=app password=… dbname=x'` (libpq's keyword form) was taken for a
    file name: `runs list` said there was no store at it, the password in clear, and a run
    would have written a local file no worker reads. Refused, asking for the URL form."""
    for conninfo in (
        "host=127.0.0.1 user=app password=Sup3rS3cret dbname=x",
        "sslmode=require host=127.0.0.1 password=Sup3rS3cret dbname=x",
        "connect_timeout=5 host=127.0.0.1 password=Sup3rS3cret",
        "host=db password=Sup3rS3cret" + "x" * 300 + " sslmode=require",  # a name too long for a file
    ):
        for args in (("runs", "list"), ("run", "hello")):
            refused = deepline(*args, "--store", conninfo)
            assert refused.code == 2, (args, refused.stderr)
            assert "postgresql://user:password@host" in refused.stderr and "Sup3rS3cret" not in refused.stderr
    assert [p.name for p in tmp_path.iterdir() if "=" in p.name] == []
    for mistyped in (
        "postgresq://u:Sup3rS3cret@h/db", "postgresql:/u:Sup3rS3cret@h/db", "sqlite:///x.db?password=Sup3rS3cret"
    ):  # never echoed whole  # fmt: skip
        refused = deepline("runs", "list", "--store", mistyped)
        assert refused.code == 2 and "Sup3rS3cret" not in refused.stderr + refused.stdout, refused.stderr
    # A store file whose name holds `=` (not a keyword of libpq's) opens, and a path is shown as it is.
    hello = str(Path(__file__).resolve().parents[1] / "examples" / "hello" / "play.py")
    made = deepline("run", hello, "--store", str(tmp_path / "env=prod.db"), "--quiet")
    assert made.code == 0, made.stderr
    listed = deepline("runs", "list", "--store", "env=prod.db")
    assert listed.code == 0 and "hello" in listed.stdout, listed.stderr
    odd = tmp_path / "runs-12:30:00@prod.db"
    missing = deepline("runs", "list", "--store", str(odd))
    assert str(odd) in missing.stderr + missing.stdout, missing.stderr


RESUMED_AFTER_MAP_PLAY = """
from pathlib import Path
from deepline_cli import play

@play("after-map")
async def after_map(ctx, input):
    rows = await ctx.map("m", [{"n": n} for n in range(5)], key="n", columns={
        "v": lambda row: 1 // (row["n"] - 2),  # row 2 fails: a failure line and the summary
    })
    if Path(input["flag"]).exists():
        raise RuntimeError("stopped after the map")
    return len(rows)
"""


def test_a_resume_that_replays_a_finished_map_does_not_log_its_summary_again(
    deepline, write_play, tmp_path: Path
) -> None:
    """Each resume wrote the finished map's "Map completed" and failed-row lines again:
    `runs logs` of a run resumed twice said its map completed three times."""
    play = write_play(RESUMED_AFTER_MAP_PLAY)
    flag = tmp_path / "flag"
    flag.touch()
    payload = _json.dumps_str({"flag": str(flag)})
    assert deepline("run", str(play), "--input", payload, "--run-id", "am").code == 1
    assert deepline("resume", "am").code == 1
    flag.unlink()
    assert deepline("resume", "am").code == 0
    lines = deepline("runs", "logs", "am").stdout.splitlines()
    assert sum("Map completed: 5 results (4 succeeded, 1 failed" in line for line in lines) == 1, lines
    assert sum("row 2 failed: ZeroDivisionError" in line for line in lines) == 1, lines
