"""The screen tells the truth, through the real command line: the verdict at the end,
retries and 429 pauses per tool, failures a waterfall recovered from told apart, barriers
in words while they run, steady progress lines in CI logs, counts that add up across a
resume, a live view that fits 80 and 50 columns, and help a newcomer can read."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deepline_cli import _json
from tests.conftest import ROOT, Result
from tests.faults import finish, kill, start
from tests.helpers import wait_until
from tests.provider import Provider, ProviderServer

pytestmark = pytest.mark.process

Run = Callable[..., Result]
LEADS = ROOT / "examples/lead_enrichment/play.py"
LEADS_CSV = ROOT / "examples/lead_enrichment/leads.csv"


def test_the_verdict_says_how_it_ended_what_it_cost_and_what_to_do_next(deepline: Run) -> None:
    done = deepline("run", str(LEADS), "--csv", str(LEADS_CSV), "--set", "latency=0", "--run-id", "v1")
    assert done.code == 0, done.stderr
    lines = done.stderr.splitlines()
    verdict = next(line for line in lines if line.startswith("✓ Run v1 completed in "))
    assert "290 rows (281 succeeded, 9 failed, 12 duplicate), 714 credits." in verdict
    next_step = (
        "Next: deepline export v1 --out lead-enrichment-export.csv · "
        "every failed row: deepline runs logs v1 --kind row.failed"
    )
    assert next_step in done.stderr
    # The waterfall's fallbacks are not final failures; the tools line tells them apart.
    finder_a = [line for line in lines if "demo.finder_a" in line][-1]  # the last word: the final counts
    assert re.search(r"failed 9 +fell back 28", finder_a), finder_a  # 9 rows failed at B too

    again = deepline("run", str(LEADS), "--csv", str(LEADS_CSV), "--set", "latency=0", "--run-id", "v2")
    assert "Nothing was paid: 290 rows came from earlier runs." in again.stderr
    assert "0 credits." in again.stderr

    quiet = deepline("run", str(LEADS), "--csv", str(LEADS_CSV), "--set", "latency=0", "--run-id", "v3", "-q")
    assert quiet.stderr.splitlines() == [next(ln for ln in quiet.stderr.splitlines() if ln.startswith("✓ Run v3"))]


FLAKY_PLAY = """
from deepline_cli import play

@play("flaky")
async def flaky(ctx, input):
    rows = await ctx.map("calls", [{"n": i} for i in range(input["n"])], key="n", concurrency=2, columns={
        "got": lambda row, rc: rc.tools.execute("c", "flaky.tool", {"n": row["n"]}),
    })
    return len(rows)
"""


@pytest.fixture
def flaky(tmp_path: Path) -> Iterator[Provider]:
    with ProviderServer(Provider()) as provider:
        (tmp_path / "play.py").write_text(FLAKY_PLAY)
        (tmp_path / "deepline.toml").write_text(
            f'[tools."flaky.tool"]\nurl = "http://127.0.0.1:{provider.port}/v1/flaky"\ncredits = 1\n'
        )
        yield provider


def test_retries_and_429_pauses_are_shown_per_tool(
    deepline: Run, flaky: Provider, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    flaky.script("/v1/flaky", ["503", "502", "429:6", "ok"])
    result = deepline("run", "play.py", "--set", "n=4", DEEPLINE_RETRY_BASE_S="0.01")
    assert result.code == 0, result.stderr
    plain = result.stderr
    assert re.search(r"paused \(429\) \d+(\.\d)?s", plain), plain  # printed while the tool waited out the 429
    final = [line for line in plain.splitlines() if line.startswith("tools ") and "flaky.tool" in line][-1]
    assert "retries 3 (429 1, 5xx 2)" in final, final
    assert "paced 0/s" not in plain


def test_retries_of_a_call_an_interrupt_abandoned_still_count(
    flaky: Provider, tmp_path: Path, cli_env: dict[str, str], deepline: Run
) -> None:
    """A call that failed and was waiting to be retried when Ctrl-C came has no ledger row;
    the retries the live view showed stay in the verdict and in the next attempt's counts."""
    flaky.default_fault = "500"
    proc = start(["run", "play.py", "--set", "n=1", "--run-id", "ab", "--json"], cli_env, tmp_path)
    try:
        wait_until(lambda: flaky.count() >= 2, what="a retry")
        proc.send_signal(signal.SIGINT)
        code, out, err = finish(proc)
    finally:
        kill(proc)
    assert code == 130, err
    finished = _json.loads(out.splitlines()[-1])
    retries = finished["stats"]["tools"]["flaky.tool"]["retries"]
    # Every request after the first is a retry, and only those: a retry abandoned during its
    # backoff was counted though never sent.
    assert retries == flaky.count() - 1 >= 1, (retries, flaky.count())
    report = deepline("runs", "report", "ab", "--html", "--out", str(tmp_path / "ab.html"))
    assert report.code == 0, report.stderr
    assert f"({retries:,} retries)" in (tmp_path / "ab.html").read_text()  # the report agrees
    flaky.default_fault = "ok"
    resumed = deepline("resume", "ab", "--json")
    assert resumed.code == 0, resumed.stderr
    tool = _json.loads(resumed.stdout.splitlines()[-1])["stats"]["tools"]["flaky.tool"]
    assert tool["retries"] >= retries  # counts across attempts never go down
    assert sum(tool["retry_reasons"].values()) == tool["retries"]  # and their reasons add up


def test_retry_causes_of_a_killed_attempt_add_up_in_json_too(
    flaky: Provider, tmp_path: Path, cli_env: dict[str, str], deepline: Run
) -> None:
    """Attempt 1 retried calls (5xx) that ended, recorded, and was SIGKILLed: its causes
    died with it. The resume's run.finished (--json) gave retries 4 with reasons {}: they
    did not add up, as they do on screen and in `runs show` (`earlier`)."""
    flaky.default_fault = "ok"
    flaky.script("/v1/flaky", ["503", "ok", "503", "ok"])
    proc = start(
        ["run", "play.py", "--set", "n=400", "--run-id", "kk", "--json"],
        cli_env | {"DEEPLINE_RETRY_BASE_S": "0.01"},
        tmp_path,
    )
    try:
        wait_until(lambda: flaky.count() >= 60, what="60 requests, two of them retries")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        kill(proc)
    resumed = deepline("resume", "kk", "--json")
    assert resumed.code == 0, resumed.stderr
    tool = _json.loads(resumed.stdout.splitlines()[-1])["stats"]["tools"]["flaky.tool"]
    assert tool["retries"] == 2, tool
    assert tool["retry_reasons"] == {"earlier": 2}, tool


SLOW_PLAY = """
import asyncio
from deepline_cli import play, tool

@tool("slow.work", credits=1)
async def work(input):
    await asyncio.sleep(0.05)
    return input["i"]

@play("slow")
async def slow(ctx, input):
    rows = await ctx.map("leads", [{"i": i} for i in range(input["n"])], key="i", concurrency=4, columns={
        "v": lambda row, rc: rc.tools.execute("w", "slow.work", {"i": row["i"]}),
    })
    return len(rows)
"""


def test_ci_logs_get_steady_progress_lines_and_barriers_in_words(
    deepline: Run, write_play: Callable[..., Path]
) -> None:
    write_play(SLOW_PLAY)
    # About 2 s at 4 rows of 50 ms at a time, a progress line every 0.5 s (5 s by default).
    result = deepline("run", "play.py", "--set", "n=150", DEEPLINE_PROGRESS_EVERY_S="0.5")
    assert result.code == 0, result.stderr
    progress = [line for line in result.stderr.splitlines() if re.match(r"\d+:\d\d leads +[\d,]+/150 +\d+%", line)]
    assert len(progress) >= 2, result.stderr  # one every few seconds, not one per row
    assert all("rows/s" in line and "ETA" in line for line in progress)
    assert "leads  checking 150 rows are stored…" in result.stderr
    assert "leads  ✓ 150/150 rows stored and read back" in result.stderr
    assert "leads  ✓ all 150 input rows accounted for (150 distinct)" in result.stderr
    assert len(result.stderr.splitlines()) < 40  # progress people can read, not log spam


BUDGET_STOPPED = """
import time
from deepline_cli import play, tool

@tool("pay.local", credits=2.5)
def local(input):
    time.sleep(0.06)  # the map lasts past its first progress line (0.25 s)
    return {"n": input["n"]}

@play("stopped")
async def stopped(ctx, input):
    rows = await ctx.map("m", [{"n": n} for n in range(20)], key="n", concurrency=1, columns={
        "l": lambda row, rc: rc.tools.execute("l", "pay.local", {"n": row["n"]}),
    })
    return len(rows)
"""


def test_ci_logs_end_a_map_a_failure_stopped_with_its_last_counts(
    deepline: Run, write_play: Callable[..., Path]
) -> None:
    """The budget stops the map after 8 rows, between two progress lines: the log's last
    line of the map said the count of its first line (0 or 1 of 20), not 8."""
    write_play(BUDGET_STOPPED)
    result = deepline("run", "play.py", "--max-credits", "20", DEEPLINE_PROGRESS_EVERY_S="3600")
    assert result.code == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if re.match(r"\d+:\d\d m +[\d,]+/20 ", line)]
    assert lines and re.match(r"\d+:\d\d m +8/20 +40% +✓ 8 ", lines[-1]), result.stderr


def test_counts_after_a_resume_are_the_whole_runs(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path, cli_env: dict[str, str]
) -> None:
    write_play(SLOW_PLAY.replace("0.05", "0.2"))
    proc = start(["run", "play.py", "--set", "n=60", "--run-id", "twice", "--quiet"], cli_env, tmp_path)
    try:
        wait_until(lambda: _live_calls(deepline) >= 12, what="12 calls")
        proc.send_signal(signal.SIGINT)
        code, _, _ = finish(proc)
    finally:
        kill(proc)
    assert code == 130
    before = _live_calls(deepline)
    resumed = deepline("resume", "twice", "--json")
    assert resumed.code == 0, resumed.stderr
    events = resumed.json_lines()
    first_progress = next(e for e in events if e["event"] == "map.progress")
    first_tools = next(e for e in events if e["event"] == "run.progress")
    assert first_progress["done"] >= before  # the rows an earlier attempt finished count
    assert first_tools["tools"]["slow.work"]["live"] >= before  # so do the calls it paid for
    assert events[-1]["stats"]["tools"]["slow.work"]["live"] == 60


def _live_calls(deepline: Run) -> int:
    shown = deepline("runs", "show", "twice", "--json")
    if shown.code != 0:
        return 0  # not started yet
    return int(((_json.loads(shown.stdout)["stats"].get("tools") or {}).get("slow.work") or {}).get("live", 0))


@pytest.mark.parametrize("columns", [120, 80, 50])
def test_the_live_view_fits_the_terminal(tmp_path: Path, cli_env: dict[str, str], columns: int) -> None:
    screen = _in_terminal(
        [sys.executable, "-m", "deepline_cli", "run", str(LEADS), "--csv", str(LEADS_CSV), "--set", "latency=1"],
        columns, cli_env, tmp_path,
    )  # fmt: skip
    live = [line for line in screen if line and not line.startswith("{")]  # the play's output is stdout's
    assert live, screen
    # Nothing is wider than the terminal (the verdict too), but a command: it is never broken, so one
    # wider than the terminal has a line of its own, whole (the terminal wraps it; a copy keeps it).
    wide = [line for line in live if len(line) > columns]
    whole = r" *deepline (export r-\w+ --out lead-enrichment-export\.csv|runs logs r-\w+ --kind row\.failed)"
    assert all(re.fullmatch(whole, line) or "omitted from map log" in line for line in wide), wide
    commands = [line.strip() for line in live if "deepline export" in line or "deepline runs logs" in line]
    export = r"(Next: )?deepline export r-\w+ --out lead-enrichment-export\.csv( · .*)?"
    assert any(re.fullmatch(export, c) for c in commands), commands
    assert any(re.search(r"(^|: )deepline runs logs r-\w+ --kind row\.failed$", c) for c in commands), commands
    tools = [line for line in screen if "demo.finder_b" in line]
    assert tools and all("live" in line and "failed" in line and "credits" in line for line in tools), tools
    assert any("✓" in line and "✗" in line for line in screen if "leads" in line)
    cut = [line for line in live if line.startswith("leads ") and line.endswith("…")]
    assert not cut, cut  # the map's counts are fitted to what is left beside its name


def test_retries_are_shortened_before_they_are_dropped_on_a_narrow_line() -> None:
    from deepline_cli.ui.console import fit, tool_pieces

    counts = {"live": 271, "failed": 0, "retries": 66, "retry_reasons": {"429": 19, "5xx": 47}, "credits": 542}
    pieces = tool_pieces("acme.firmographics", counts, {"acme.firmographics": 60.0}, {})
    wide, narrow, tiny = fit(pieces, 113), fit(pieces, 76), fit(pieces, 43)
    assert "retries 66 (429 19, 5xx 47)" in wide and "paced 60/s" in wide, wide
    assert "retries 66" in narrow and "(429" not in narrow and len(narrow) <= 76, narrow
    assert "failed 0" in tiny and "credits 542" in tiny and len(tiny) <= 43, tiny


def test_a_tool_shorter_named_than_another_still_says_it_is_paced_or_paused() -> None:
    """Tool names are padded to line up: the pacing and 429 pause of one shorter than the
    longest are still shown."""
    from deepline_cli.ui.console import tool_lines
    from deepline_cli.ui.state import RunView

    counts = {"live": 15, "failed": 0, "credits": 15}
    view = RunView(tools={"t.paced": counts, "t.paused": counts, "t.longer.name": counts},
                   paced={"t.paced": 5.0}, paused={"t.paused": 2.5})  # fmt: skip
    lines = {line.split()[1] if line.startswith("tools") else line.split()[0]: line for line in tool_lines(view, 160)}
    assert "paced 5/s" in lines["t.paced"] and "paused (429) 2.5s" in lines["t.paused"], lines
    assert len({line.index("live") for line in lines.values()}) == 1  # still lined up


@pytest.mark.parametrize("width", [120, 80, 50])
def test_a_maps_counts_fit_beside_its_name(width: int) -> None:
    import io

    from deepline_cli.ui.console import ConsoleView
    from deepline_cli.ui.state import MapView

    view = ConsoleView(io.StringIO(), live=False)
    m = MapView("accounts", total=1501, done=247, succeeded=245, failed=2, duplicate=0, reused=3)
    [line, *_] = view._render_map(m, width)
    assert len(line.plain) <= width and not line.plain.endswith("…"), line.plain
    assert "✗ 2" in line.plain and "247/1,501" in line.plain, line.plain
    # A long name (a play naming its map by its purpose) is shortened before the counts go.
    m.name = "enterprise_accounts_in_emea_with_open_opportunities_for_q3_refresh"
    [line, *_] = view._render_map(m, width)
    assert len(line.plain) <= width, line.plain
    assert "✗ 2" in line.plain and "247/1,501" in line.plain and line.plain.startswith("enterprise"), line.plain


def _in_terminal(command: list[str], columns: int, env: dict[str, str], cwd: Path) -> list[str]:
    """Run `command` in a pseudo-terminal `columns` wide; the lines it drew, escapes removed."""
    code, drawn = _raw_in_terminal(command, env, cwd, columns)
    assert code == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07", "", drawn)
    return [line.rstrip() for line in re.split(r"\r\n|\r|\n", text)]


def _raw_in_terminal(command: list[str], env: dict[str, str], cwd: Path, columns: int = 80) -> tuple[int, str]:
    """Run `command` in a pseudo-terminal `columns` wide: its exit code and all it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen(
        command, cwd=cwd, env={**env, "TERM": "xterm-256color", "COLUMNS": str(columns), "LINES": "40"},
        stdin=slave, stdout=slave, stderr=slave,
        close_fds=True,
    )  # fmt: skip
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            data = os.read(master, 65536)
        except OSError:  # the terminal closed: the process ended
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=30)
    os.close(master)
    return proc.returncode, b"".join(chunks).decode("utf-8", "replace")


def test_help_reads_well(deepline: Run, deepline_process: Run) -> None:
    top = deepline("--help")
    assert "Examples:" in top.stdout and "deepline run examples/hello/play.py" in top.stdout
    assert "--install-completion" in top.stdout
    run = deepline("run", "--help").stdout
    assert "--set KEY=VALUE" in run and "--input JSON|@FILE" in run and "--limit N" in run
    assert "<list" not in run and "<int" not in run and "<float" not in run
    # The shell named, not detected from the processes above the test (there may be none).
    completion = deepline_process("--show-completion", "bash", _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1")
    assert completion.code == 0 and "COMPREPLY" in completion.stdout


def test_export_to_a_terminal_shows_escape_sequences_escaped(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """A provider's answer holding ESC[2J (clear the screen) or OSC 52 (write the clipboard):
    `deepline export RUN` on a terminal acted on them; to a file or a pipe they stay as they are."""
    write_play(
        """
        from deepline_cli import play

        @play("esc")
        async def esc(ctx, input):
            rows = [{"d": "a", "note": "hi\\x1b[2J\\x1b]52;c;aGk=\\x07there"}]
            return len(await ctx.map("m", rows, key="d", columns={"x": lambda row: row["note"]}))
        """
    )
    assert deepline("run", "play.py", "--run-id", "esc").code == 0
    code, shown = _raw_in_terminal([sys.executable, "-m", "deepline_cli", "export", "esc"], cli_env, tmp_path)
    assert code == 0 and "hi\\x1b[2J\\x1b]52;c;aGk=\\x07there" in shown, shown
    assert "\x1b" not in shown and "\x07" not in shown
    piped = deepline("export", "esc")  # not a terminal: the data as it is
    assert "hi\x1b[2J\x1b]52;c;aGk=\x07there" in piped.stdout


def test_a_runs_last_frame_adds_no_line_to_a_log(write_play, store_path) -> None:
    """Without a terminal (a CI log), the final progress frame printed the tools block, and
    the verdict printed it again just after."""
    import io

    from deepline_cli.runtime.calls.events import Event, EventBus
    from deepline_cli.ui.console import ConsoleView
    from tests.helpers import run_play

    seen: list[Event] = []
    play = write_play(
        """
        from deepline_cli import play, tool

        @tool("t.one", credits=1)
        def one(input):
            return input["n"]

        @play("short")
        async def short(ctx, input):
            return [(await ctx.tools.execute("one", "t.one", {"n": n})).output for n in range(3)]
        """
    )
    assert run_play(play, store_path, bus=EventBus([seen.append])).status == "completed"
    assert any(e.event == "run.progress" and e.data.get("final") for e in seen)
    out = io.StringIO()
    view = ConsoleView(out, live=False)
    with view:
        for event in seen:
            if event.event != "run.progress" or event.data.get("final"):  # no tick: the last frame alone
                view.handle(event)
    assert sum(1 for line in out.getvalue().splitlines() if "t.one" in line) == 1, out.getvalue()
