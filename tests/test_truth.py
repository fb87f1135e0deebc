"""Every figure a user reads equals what the store says: the HTML report, the live view,
`runs show` and the verdict, against runs whose counts are known."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest

from deepline_cli.runtime.calls.events import EventBus
from deepline_cli.runtime.run import attempt
from deepline_cli.runtime.run.options import RunOptions
from deepline_cli.runtime.run.runner import Runner
from deepline_cli.store import open_store
from deepline_cli.ui.console import ConsoleView, fit, map_pieces, tool_lines, tool_pieces
from deepline_cli.ui.report_data import read_report
from deepline_cli.ui.report_html import render
from deepline_cli.ui.state import RunView
from deepline_cli.ui.verdict import verdict
from tests.conftest import ROOT
from tests.helpers import resume_run, run_play
from tests.provider import Provider, ProviderServer

# 12 rows with known answers. Provider "first" finds 3 (its other answers hold nothing:
# {"email": None}, {}, and {"email": "", "tags": []}); "second", asked for the 9 others,
# finds 6; "company" finds 8 ([] for the last 4); "skip" is run for 3 rows only (run_if).
PLAY = """
from pathlib import Path
from deepline_cli import Column, play, steps, tool

ROWS = Path(__file__).with_name("rows.txt")  # how many rows: not the play's input, so cells are reused

@tool("t.first", credits=1)
def first(input):
    n = input["n"]
    return [{"email": f"{n}@a.com"}, {"email": None}, {}, {"email": "", "tags": []}][n % 4]

@tool("t.second", credits=1)
def second(input):
    n = input["n"]
    return {"email": f"{n}@b.com"} if n % 2 else {"email": None}

@tool("t.company", credits=1)
def company(input):
    return {"name": "acme", "size": None} if input["n"] < 8 else []

@tool("t.skip", credits=1)
def skip(input):
    return {"v": 1}

EMAIL = (
    steps()
    .step("first", lambda row, rc: rc.tools.execute("a", "t.first", {"n": row["n"]}))
    .step("second", lambda row, rc: rc.tools.execute("b", "t.second", {"n": row["n"]}))
)

@play("truth")
async def truth(ctx, input):
    count = int(ROWS.read_text()) if ROWS.exists() else 12
    rows = await ctx.map("rows", [{"n": n} for n in range(count)], key="n", columns={
        "email": EMAIL,
        "company": lambda row, rc: rc.tools.execute("c", "t.company", {"n": row["n"]}),
        "skipped": Column(lambda row, rc: rc.tools.execute("s", "t.skip", {"n": row["n"]}),
                          run_if=lambda row: row["n"] < 3),
    })
    return len(rows)
"""


def _report_text(store_path: Path | str, run_id: str) -> tuple[Any, str]:
    store = open_store(str(store_path))
    try:
        report = read_report(store, run_id)
    finally:
        store.close()
    return report, render(report)


def test_found_is_what_the_play_found_a_value_with(write_play, store_path) -> None:
    """Item 1: a provider's hit rate counts the answers the play found a value with;
    `{"email": null}`, `{}`, `[]` and `""`-valued answers are not found. One definition
    for the waterfall, the columns and the providers."""
    result = run_play(write_play(PLAY), store_path)
    assert result.status == "completed", result.error
    report, html = _report_text(store_path, result.run_id)
    found = {t: (f.found, f.answered) for t, f in report.tools.items()}
    assert found == {"t.first": (3, 12), "t.second": (6, 9), "t.company": (8, 12), "t.skip": (3, 3)}
    assert re.search(r"<td>t\.first</td>.*?25% <span class=\"muted\">3/12</span>", html)
    assert result.stats["waterfalls"]["rows"]["email"] == {"first": 3, "second": 6, "none": 3}
    email = report.maps[0].columns["email"]
    assert (email.found, email.not_found, email.failed, email.not_run) == (9, 3, 0, 0)
    company = report.maps[0].columns["company"]
    assert (company.found, company.not_found) == (8, 4)


def test_rows_run_if_skipped_are_not_run_never_not_found(write_play, store_path) -> None:
    """Item 2: a cell whose run_if said no is "not run"."""
    result = run_play(write_play(PLAY), store_path)
    report, html = _report_text(store_path, result.run_id)
    skipped = report.maps[0].columns["skipped"]
    assert (skipped.found, skipped.not_found, skipped.failed, skipped.not_run) == (3, 0, 0, 9)
    assert "<td>skipped</td><td class=n>25%</td><td class=n>0%</td><td class=n>0%</td><td class=n>75%</td>" in html


def test_sheet_reuse_counts_rows_reused_whole_and_cells_in_recomputed_rows(write_play, store_path) -> None:
    """Item 3: the rows taken whole from the sheet count across a resume, and cells taken
    from the sheet inside rows computed again count too."""
    play = write_play(PLAY)
    assert run_play(play, store_path).status == "completed"
    # 24 rows: the first 12 come whole from the sheet; the budget stops the run after 3 new
    # rows (3 calls of t.first at 1 credit... and more per row): resumed with a larger one.
    play.with_name("rows.txt").write_text("24")
    stopped = run_play(play, store_path, max_credits=6, run_id="more")
    assert stopped.status == "failed", stopped.stats
    done = resume_run("more", store_path, max_credits=1000)
    assert done.status == "completed", done.error
    rows = done.stats["rows"]
    assert rows["reused"] == 12 and rows["reused_cells"] == 12 * 3, rows
    report, html = _report_text(store_path, "more")
    (m,) = report.maps
    assert (m.reused_rows, m.reused_cells) == (12, 36)
    assert m.record.reused == 12  # the map's own record counts every attempt's reuse
    assert "<td class=n>12</td><td class=n>36</td><td>completed</td>" in html

    # The company column's code changes: its cells are computed again (through their
    # receipts), the two other columns' cells are taken from the sheet.
    play.with_name("rows.txt").write_text("12")
    play.write_text(PLAY.replace('rc.tools.execute("c", "t.company"', 'rc.tools.execute("c2", "t.company"'))
    again = run_play(play, store_path)
    assert again.status == "completed"
    assert again.stats["rows"]["reused"] == 0 and again.stats["rows"]["reused_cells"] == 12 * 2, again.stats
    _, html = _report_text(store_path, again.run_id)
    assert "<td class=n>0</td><td class=n>24</td><td>completed</td>" in html


PACED = """
from deepline_cli import play

@play("paced")
async def paced(ctx, input):
    rows = await ctx.map("calls", [{"n": n} for n in range(6)], key="n", columns={
        "got": lambda row, rc: rc.tools.execute("c", "slow.tool", {"n": row["n"]}),
    })
    return len(rows)
"""


def test_latency_is_the_providers_own_time_waiting_apart(tmp_path, write_play, store_path, monkeypatch) -> None:
    """Item 4: pacing (a rate limit) and a Retry-After wait are recorded apart from the
    provider's own time; the report's latency leaves them out."""
    monkeypatch.setenv("DEEPLINE_RETRY_BASE_S", "0.01")
    with ProviderServer(Provider()) as provider:
        provider.script("/v1/slow", ["429:0.3"])  # the first request: come back in 0.3 s
        write_play(PACED)
        (tmp_path / "deepline.toml").write_text(
            f'[tools."slow.tool"]\nurl = "{provider.url}/v1/slow"\nrate_limit = "10/s"\ncredits = 1\n'
        )
        result = run_play(tmp_path / "play.py", store_path)
    assert result.status == "completed", result.error
    report, html = _report_text(store_path, result.run_id)
    tool = report.tools["slow.tool"]
    calls = [c for c in report.calls if c.tool == "slow.tool"]
    assert len(calls) == 6 and len(tool.latencies) == 6
    for c in calls:  # the provider's time plus the wait is the call's whole time
        assert c.waited_s >= 0 and c.waited_s <= c.ended_at - c.started_at + 1e-6
    # Six calls at 10/s: the last waited about half a second for its turn; one waited out a 0.3 s 429.
    assert max(c.waited_s for c in calls) >= 0.3, [c.waited_s for c in calls]
    assert sum(c.waited_s for c in calls) >= 1.0, [c.waited_s for c in calls]
    assert max(tool.latencies) < max(c.waited_s for c in calls), (tool.latencies, [c.waited_s for c in calls])
    assert "waited (not in the latency)" in html


def test_the_timeline_scales_and_holders_read_as_a_person_reads_them(write_play, store_path) -> None:
    """Items 5 and 6: the timeline's SVG takes the page's width; an attempt's holder is its
    process and host, not `host:pid:start`."""
    from deepline_cli.runtime.run.holders import holder_words

    result = run_play(write_play(PLAY), store_path)
    report, html = _report_text(store_path, result.run_id)
    assert re.search(r'<svg class="timeline" width="100%" viewBox="0 0 1040 \d+"', html)
    assert 'width="1040"' not in html
    (attempt,) = report.attempts
    assert attempt.holder and attempt.holder.count(":") >= 1
    assert attempt.holder not in html
    words = holder_words(attempt.holder)
    assert re.fullmatch(r"pid \d+ on \S+", words) and f"<td>{words}</td>" in html
    assert holder_words("build-7:4242:boot-9f3e-1234") == "pid 4242 on build-7"


def test_failed_calls_say_what_failed_and_what_became_of_it(deepline, tmp_path) -> None:
    """Item 7: the lead enrichment example: finder A fails 37 calls (28 fall back to B),
    B fails 9 (404, failing their rows): 46 calls failed, 28 fell back, 18 final, 9 rows failed."""
    example = ROOT / "examples" / "lead_enrichment"
    run = deepline("run", str(example / "play.py"), "--csv", str(example / "leads.csv"), "--set", "latency=0",
                   "--run-id", "f7", "--json")  # fmt: skip
    assert run.code == 0, run.stderr
    stats = run.json_lines()[-1]["stats"]
    tools = stats["tools"]
    assert (tools["demo.finder_a"]["failed"], tools["demo.finder_a"]["recovered"]) == (37, 28)
    assert (tools["demo.finder_b"]["failed"], tools["demo.finder_b"]["not_found"]) == (9, 0)
    out = tmp_path / "f7.html"
    assert deepline("runs", "report", "f7", "--html", "--out", str(out)).code == 0
    html = out.read_text()
    said = (
        "46 calls failed (counted once each, however many attempts tried): 28 of them fell back to another "
        "provider of their cell, 18 were final; 9 rows failed."
    )
    assert f'<p id="failures-said">{said}</p>' in html
    assert "<small>28 fell back · 18 final</small>" in html
    assert '<td class=n>37 <span class="muted">(28 fell back)</span></td>' in html


# A row's first provider fails at once; its fallback answers after a moment, so the live
# counts are seen while the failure is not yet fallen back from.
FALLBACK = """
import asyncio
from deepline_cli import ProviderTransientError, play, steps, tool

@tool("t.down", credits=1)
def down(input):
    raise ProviderTransientError("503 from t.down", category="upstream", status_code=503)

@tool("t.slow", credits=1)
async def slow(input):
    # Longer than a progress tick (0.5 s); the last row longer still, so ticks come after the
    # first two rows fell back, while the run goes on.
    await asyncio.sleep(0.7 if input["n"] < 2 else 1.6)
    return {"email": "x@y.z"}

EMAIL = steps().step("down", lambda row, rc: rc.tools.execute("d", "t.down", {"n": row["n"]})).step(
    "slow", lambda row, rc: rc.tools.execute("s", "t.slow", {"n": row["n"]}))

@play("fallback")
async def fallback(ctx, input):
    return len(await ctx.map("rows", [{"n": n} for n in range(3)], key="n", columns={"email": EMAIL}))
"""


def test_a_failed_count_on_screen_never_goes_down_while_the_run_goes_on(write_play, store_path) -> None:
    """Item 8: a failure is shown as final or as fallen back once its row ended; while the
    row runs it is neither, so neither count goes down (the live view shows failed - fell back)."""
    seen: list[dict[str, Any]] = []
    bus = EventBus()
    bus.subscribe(lambda e: seen.append(e.data["tools"]) if e.event == "run.progress" else None)
    result = run_play(write_play(FALLBACK), store_path, bus=bus)
    assert result.status == "completed", result.error
    shown = [(int(t.get("failed", 0)) - int(t.get("recovered", 0)), int(t.get("recovered", 0)))
             for t in (tools.get("t.down") or {} for tools in seen)]  # fmt: skip
    assert (0, 2) in shown, shown  # seen while the third row still ran
    for (final_before, fell_before), (final, fell) in itertools.pairwise(shown):
        assert final >= final_before and fell >= fell_before, shown
    down = result.stats["tools"]["t.down"]
    assert (down["failed"], down["recovered"]) == (3, 3)  # the store agrees at the end


# A waterfall falls back from a provider that is down, then a later column fails the row.
FELL_BACK_THEN_FAILED = """
from deepline_cli import ProviderTransientError, play, steps, tool

@tool("t.down", credits=1)
def down(input):
    raise ProviderTransientError("503 from t.down", category="upstream", status_code=503)

@tool("t.up", credits=1)
def up(input):
    return {"email": f"x{input['n']}@y.z"}

@tool("t.check", credits=1)
def check(input):
    if input["email"] == "x1@y.z":
        raise ValueError("rejected")
    return True

EMAIL = steps().step("down", lambda row, rc: rc.tools.execute("d", "t.down", {"n": row["n"]})).step(
    "up", lambda row, rc: rc.tools.execute("u", "t.up", {"n": row["n"]}))

@play("fell-back")
async def fell_back(ctx, input):
    rows = await ctx.map("rows", [{"n": n} for n in range(3)], key="n", columns={
        "email": EMAIL,
        "ok": lambda row, rc: rc.tools.execute("c", "t.check", {"email": row["email"]["email"]}),
    })
    return rows.failed_count
"""


def test_a_call_a_waterfall_fell_back_from_stays_fallen_back_when_a_later_column_fails(
    write_play, store_path, deepline
) -> None:
    """Row 1's email was found by the second step, then its check failed: the first step's
    failure was fallen back from all the same (every row's was). It was counted final, as
    if the row's failure were its own: the live view, runs show and the report said 1 final."""
    result = run_play(write_play(FELL_BACK_THEN_FAILED), store_path, run_id="fb")
    assert (result.status, result.output) == ("completed", 1), result.error
    down, check = result.stats["tools"]["t.down"], result.stats["tools"]["t.check"]
    assert (down["failed"], down["recovered"]) == (3, 3), down
    assert (check["failed"], check["recovered"]) == (1, 0), check
    shown = deepline("runs", "show", "fb", "--json", DEEPLINE_STORE=str(store_path))
    assert json.loads(shown.stdout)["stats"]["tools"]["t.down"]["recovered"] == 3


def test_a_resume_keeps_the_calls_a_failed_row_fell_back_from(write_play, store_path) -> None:
    """The same play failing after its map on the first attempt: the resume takes row 1 (its
    check failed) back whole, and its fallen-back call was counted final again."""
    source = FELL_BACK_THEN_FAILED.replace(
        "    return rows.failed_count",
        '    if ctx.run.attempt == 1:\n        raise RuntimeError("after the map")\n    return rows.failed_count',
    )
    first = run_play(write_play(source), store_path, run_id="fbr")
    assert first.status == "failed"
    again = resume_run("fbr", store_path)
    assert (again.status, again.output) == ("completed", 1), again.error
    down = again.stats["tools"]["t.down"]
    assert (down["failed"], down["recovered"]) == (3, 3), down


RECOVERED_ON_RESUME = """
from pathlib import Path
from deepline_cli import ProviderTransientError, play, steps, tool

FLAG = Path(__file__).with_name("c.down")

@tool("t.b", credits=1)
def b(input):
    raise ProviderTransientError("502 from t.b", category="upstream", status_code=502)

@tool("t.c", credits=1)
def c(input):
    if FLAG.exists():
        raise ProviderTransientError("503 from t.c", category="upstream", status_code=503)
    return {"email": f"x{input['n']}@y.z"}

EMAIL = steps().step("b", lambda row, rc: rc.tools.execute("b", "t.b", {"n": row["n"]})).step(
    "c", lambda row, rc: rc.tools.execute("c", "t.c", {"n": row["n"]}))

@play("recovered")
async def recovered(ctx, input):
    rows = await ctx.map("rows", [{"n": n} for n in range(2)], key="n", columns={"email": EMAIL})
    if ctx.run.attempt == 1:
        raise RuntimeError("after the map")
    return rows.failed_count
"""


def test_a_failure_a_resume_got_past_is_counted_fallen_back_not_final(write_play, store_path) -> None:
    """Attempt 1: steps b and c failed: the rows failed, b's failure final. The resume (with
    --refresh-failed) asked again: b failed again, c answered, so b was fallen back from
    after all. It stayed final (the earlier attempt's word for the row was kept)."""
    path = write_play(RECOVERED_ON_RESUME)
    (path.parent / "c.down").touch()
    first = run_play(path, store_path, run_id="rec")
    assert first.status == "failed"
    (path.parent / "c.down").unlink()
    from tests.helpers import resume_run as resume

    again = resume("rec", store_path, refresh_failed=True)
    assert (again.status, again.output) == ("completed", 0), again.error
    b = again.stats["tools"]["t.b"]
    assert (b["failed"], b["recovered"]) == (2, 2), b


def test_the_live_counts_settle_a_rows_failures_by_the_cell_that_failed_it() -> None:
    """What the live view counts while the run goes on, for the same row: the waterfall's
    failed step fell back (its cell got a value), the check's failure is final."""
    from deepline_cli.runtime.calls.stats import RunStats

    stats = RunStats()
    stats.call_failed("k-down", "t.down", in_row=True)
    stats.call_failed("k-check", "t.check", in_row=True)
    stats.row_ended(["k-down"], ["k-check"])
    tools = {tool: counts.to_dict() for tool, counts in stats.tools.items()}
    assert (tools["t.down"]["failed"], tools["t.down"]["recovered"]) == (1, 1), tools
    assert (tools["t.check"]["failed"], tools["t.check"]["recovered"]) == (1, 0), tools


# Calls that fail in a first attempt and are tried again by the next: n=0 fails for good
# (transiently, every time), n=1 only while the flag file exists. The budget stops the
# first attempt after its rows; a resume with --refresh-failed tries both again.
RETRIED = """
from pathlib import Path
from deepline_cli import ProviderTransientError, play, tool

FLAG = Path(__file__).with_name("flaky.on")

@tool("t.flaky", credits=1)
def flaky(input):
    if input["n"] == 0 or (input["n"] == 1 and FLAG.exists()):
        raise ProviderTransientError("503 from t.flaky", category="upstream", status_code=503)
    return {"ok": input["n"]}

@play("retried")
async def retried(ctx, input):
    rows = await ctx.map("rows", [{"n": n} for n in range(6)], key="n", concurrency=1, columns={
        "v": lambda row, rc: rc.tools.execute("f", "t.flaky", {"n": row["n"]}),
    })
    return len(rows)
"""


def test_a_call_retried_by_a_resumed_attempt_counts_once(write_play, store_url, tmp_path, deepline) -> None:
    """Item 9: each call's final outcome counts once: the report and `runs show` agree
    with the rows that really failed."""
    play = write_play(RETRIED)
    (tmp_path / "flaky.on").write_text("")
    first = run_play(play, store_url, max_credits=3, run_id="twice")
    assert first.status == "failed", first.stats
    (tmp_path / "flaky.on").unlink()
    done = resume_run("twice", store_url, max_credits=100, refresh_failed=True)
    assert done.status == "completed", done.error
    assert done.stats["rows"]["failed"] == 1  # n=0, for good
    flaky = done.stats["tools"]["t.flaky"]
    assert (flaky["live"], flaky["failed"]) == (5, 1), flaky
    shown = deepline("runs", "show", "twice", "--json", DEEPLINE_STORE=store_url)
    assert shown.code == 0, shown.stderr
    tool = json.loads(shown.stdout)["stats"]["tools"]["t.flaky"]
    assert (tool["live"], tool["failed"]) == (5, 1), tool
    text = deepline("runs", "show", "twice", DEEPLINE_STORE=store_url).stdout
    assert "tool      t.flaky: live 5  reused 0  failed 1  credits 5" in text, text
    report, html = _report_text(store_url, "twice")
    assert report.tools["t.flaky"].failed == 1
    assert 'id="card-failed-calls"><span>failed calls</span><b>1</b>' in html
    # The earlier failures tried again are drawn as such, not as failed calls.
    assert html.count('class="call failed"') == 1 and html.count('class="call tried-again"') == 2


def test_rows_from_earlier_attempts_and_earlier_runs_are_told_apart(write_play, store_path) -> None:
    """Item 10: after a resume, the verdict and the live view say where the rows came from."""
    play = write_play(PLAY)
    assert run_play(play, store_path).status == "completed"
    bus, events = EventBus(), []
    bus.subscribe(events.append)
    play.with_name("rows.txt").write_text("24")
    stopped = run_play(play, store_path, max_credits=6, run_id="told", concurrency=1)  # two new rows, then no credit
    assert stopped.status == "failed"
    done = resume_run("told", store_path, max_credits=1000, bus=bus)
    rows = done.stats["rows"]
    earlier = rows["from_earlier_attempts"]
    assert rows["reused"] == 12 and earlier >= 1 and rows["succeeded"] == 24, rows
    said = verdict("told", "completed", done.stats, None, "truth")
    origin = f"{earlier} from earlier attempts · 12 reused from earlier runs · {12 - earlier} computed now"
    assert f"  Rows: {origin}; 36 cells reused." in said, said
    view = RunView()
    for event in events:
        view.apply(event)
    m = view.maps["rows"]
    assert (m.earlier, m.reused) == (earlier, 12), (m.earlier, m.reused)
    line = fit(map_pieces(m), 200)
    assert f"from earlier attempts {earlier}" in line and "reused from earlier runs 12" in line, line


def test_a_narrow_terminal_keeps_live_and_never_breaks_a_command() -> None:
    """Item 11: at 50 columns the tool lines keep `live`, failures and credits whole; a
    `Next:` line too long for the terminal puts each command on a line of its own."""
    from deepline_cli.ui.console import next_lines

    view = RunView()
    view.tools = {
        "apollo.people_match": {"live": 55, "failed": 2, "credits": 110, "recovered": 1},
        "hunter.email_finder": {"live": 120, "failed": 0, "credits": 120},
    }
    for line in tool_lines(view, 50):
        assert len(line) <= 50 and not line.endswith("…"), line
        assert re.search(r"live \d+ +failed \d+ +credits \d+$", line), line
    pieces = tool_pieces("acme.firmographics", {"live": 271, "failed": 0, "credits": 542}, {}, {})
    assert fit(pieces, 50) == "acme.firmographics live 271 failed 0 credits 542"

    line = "  Next: deepline export r-9533f2ab747f --out lead-enrichment-export.csv · every failed row: deepline runs logs r-9533f2ab747f"  # noqa: E501
    assert next_lines(line, 200) == [line]
    assert next_lines(line, 80) == [
        "  Next:",
        "    deepline export r-9533f2ab747f --out lead-enrichment-export.csv",
        "    every failed row: deepline runs logs r-9533f2ab747f",
    ]
    assert next_lines(line, 50) == [
        "  Next:",
        "    deepline export r-9533f2ab747f --out lead-enrichment-export.csv",  # wider than 50, but whole
        "    every failed row:",
        "    deepline runs logs r-9533f2ab747f",
    ]
    waiting = (
        "  Next: once it is due (if a worker runs on this store, it resumes the run by itself): "
        "deepline resume r-9533f2ab747f"
    )
    assert next_lines(waiting, 50)[-1] == "    deepline resume r-9533f2ab747f"


def test_the_live_verdict_on_a_narrow_terminal_keeps_commands_whole() -> None:
    import io

    class Narrow(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Narrow()
    view = ConsoleView(stream, live=True)
    view.console.width = 50
    stats = {"rows": {"succeeded": 281, "failed": 9, "duplicate": 12}, "credits": 714, "duration_s": 18}
    view.state.finished = {"run_id": "r-9533f2ab747f", "status": "completed", "stats": stats}
    view.state.play = "lead-enrichment"
    view.__exit__(None, None, None)
    lines = stream.getvalue().splitlines()
    assert "    deepline export r-9533f2ab747f --out lead-enrichment-export.csv" in lines, lines
    assert "    deepline runs logs r-9533f2ab747f --kind row.failed" in lines, lines


# Ten rows, two distinct calls (de, fr): every other row asks what an earlier row asked.
SHARED = """
import asyncio
from deepline_cli import Column, play, tool

@tool("t.country", credits=1)
async def country(input):
    await asyncio.sleep(0.002)  # long enough for the live view to look in between
    return {"country": input["tld"].upper()}

@play("shared")
async def shared(ctx, input):
    rows = [{"id": i, "tld": "de" if i % 2 else "fr"} for i in range(10)]
    done = await ctx.map("m", rows, key="id", concurrency=input["concurrency"], columns={
        "c": Column(lambda row, rc: rc.tools.execute("geo", "t.country", {"tld": row["tld"]}), recompute=True),
    })
    return len(done)
"""


def test_calls_answered_by_this_runs_own_calls_are_not_counted_as_reused(write_play, store_path, monkeypatch) -> None:
    """A call answered by an identical call of the same run (in flight at once, or its
    receipt a moment later) was paid once: `live` counts it, and `reused` — receipts of
    earlier runs, each counted once — does not, on screen while the run goes on and in the
    store at its end. A later run reuses the two receipts: reused 2."""
    monkeypatch.setattr(attempt, "PROGRESS_EVERY_S", 0.001)
    play = write_play(SHARED)
    for concurrency, (live, reused) in ((10, (2, 0)), (1, (0, 2)), (10, (0, 2))):
        seen: list[dict[str, Any]] = []
        bus = EventBus()
        bus.subscribe(lambda e, seen=seen: seen.append(e.data["tools"]) if e.event == "run.progress" else None)
        runner = Runner(RunOptions(store=str(store_path)), bus)
        try:
            result = runner.start(str(play), {"concurrency": concurrency})
        finally:
            runner.close()
        assert result.status == "completed", result.error
        stored = result.stats["tools"]["t.country"]
        assert (stored["live"], stored["reused"]) == (live, reused)
        assert runner.attempt is not None
        counted = runner.attempt.stats.tools["t.country"]  # what the live view shows last
        assert (counted.live, counted.reused) == (live, reused)
        shown = [(t["t.country"]["live"], t["t.country"]["reused"]) for t in seen if "t.country" in t]
        assert all(lv <= live and ru <= reused for lv, ru in shown), shown


def test_a_verdict_says_one_credit_and_two_credits() -> None:
    one = verdict("r-1", "completed", {"credits": 1, "duration_s": 1}, None)[0]
    many = verdict("r-2", "completed", {"credits": 2.5, "duration_s": 1}, None)[0]
    assert one.endswith(", 1 credit.") and many.endswith(", 2.5 credits."), (one, many)


def test_a_pilots_verdict_says_how_to_run_the_full_list() -> None:
    """A pilot's `Next:` named only its export; a resume keeps the limit, so a person was
    left to find that the full list is a new run without --limit."""
    projection = {"credits": 10, "margin": 1, "rest_s": 1, "spent": 2, "maps": []}
    stats = {"rows": {"succeeded": 5}, "duration_s": 1, "projection": projection}
    said = verdict("r-1", "completed", stats, None, "pilot")[-1]
    assert "the full list: the same command without --limit" in said, said
    assert "without --limit" not in verdict("r-2", "completed", {**stats, "projection": None}, None, "p")[-1]


def test_a_verdict_of_several_maps_says_its_rows_are_theirs() -> None:
    """Two maps (3 companies, then 2 people found at them) said "5 rows": a list of 5."""
    rows = {"succeeded": 4, "failed": 1}
    two = verdict("r-1", "completed", {"rows": rows, "maps": ["first", "second"], "duration_s": 1}, None)[0]
    one = verdict("r-2", "completed", {"rows": rows, "maps": ["only"], "duration_s": 1}, None)[0]
    assert ": 5 rows of 2 maps (4 succeeded, 1 failed)," in two, two
    assert ": 5 rows (4 succeeded, 1 failed)," in one, one


# A waterfall whose first step fails at once and whose second costs a credit: a budget of 1
# stops the map while a row's first step has failed and its second was not made.
STOPPED_MID_WATERFALL = """
from deepline_cli import ProviderTransientError, play, steps, tool

@tool("t.down")
def down(input):
    raise ProviderTransientError("503 from t.down", category="upstream", status_code=503)

@tool("t.up", credits=1)
def up(input):
    return {"email": "x@y.z"}

EMAIL = steps().step("down", lambda row, rc: rc.tools.execute("d", "t.down", {"n": row["n"]})).step(
    "up", lambda row, rc: rc.tools.execute("u", "t.up", {"n": row["n"]}))

@play("stopped")
async def stopped(ctx, input):
    return len(await ctx.map("rows", [{"n": n} for n in range(3)], key="n", concurrency=1,
                             columns={"email": EMAIL}))
"""


def test_a_failure_whose_row_did_not_end_is_not_counted_final_by_the_store(write_play, store_path) -> None:
    """Stopped mid-waterfall, a row's failed first step is neither final nor fallen back:
    its row did not end. The store counted it failed, and the count went down once the
    resume fell back from it."""
    play = write_play(STOPPED_MID_WATERFALL)
    first = run_play(play, store_path, max_credits=1)
    assert first.status == "failed", first.error
    down = first.stats["tools"]["t.down"]
    assert (down["failed"], down["recovered"]) == (1, 1), down  # row 0 fell back; row 1's is pending
    done = resume_run(first.run_id, store_path, max_credits=10)
    assert done.status == "completed", done.error
    down = done.stats["tools"]["t.down"]
    assert (down["failed"], down["recovered"]) == (3, 3), down


ONE_CALL_A_ROW = """
import asyncio
from deepline_cli import play, tool

@tool("t.lookup", credits=1)
async def lookup(input):
    await asyncio.sleep(0.002)
    return input["id"]

@play("frames")
async def frames(ctx, input):
    done = await ctx.map("m", [{"id": i} for i in range(300)], key="id", concurrency=4, columns={
        "v": lambda row, rc: rc.tools.execute("v", "t.lookup", {"id": row["id"]}),
    })
    return len(done)
"""


def test_a_maps_progress_and_the_runs_are_said_at_one_moment(write_play, store_path, monkeypatch) -> None:
    """Each row makes one call: in every frame the views draw, the calls counted are at least
    the rows counted done. The map's progress is said right after the run's, of one moment
    (on timers of their own, a frame showed more rows found than calls made)."""
    monkeypatch.setattr(attempt, "PROGRESS_EVERY_S", 0.01)
    play = write_play(ONE_CALL_A_ROW)
    events: list[Any] = []
    runner = Runner(RunOptions(store=str(store_path)), EventBus([events.append]))
    try:
        assert runner.start(str(play), {}).status == "completed"
    finally:
        runner.close()
    frames = [(a.data, b.data) for a, b in itertools.pairwise(events) if b.event == "map.progress"]
    ticked = [(run, rows) for run, rows in frames[:-1] if "tools" in run]  # the last is the map's own, at its end
    assert len(ticked) >= 5, [e.event for e in events][:40]
    assert len(ticked) == len(frames) - 1, "every map.progress but the last follows the run's"
    for run, rows in ticked:
        live = run["tools"].get("t.lookup", {}).get("live", 0)
        assert live >= rows["succeeded"], (run["tools"], rows)


# The play handles a provider's failure itself (a 410 caught, no next provider asked) in
# one column, and a waterfall gets past the same kind of failure with its next step. (A 404
# is no failure where the row goes on: a "not found" answer, counted apart.)
HANDLED = """
from deepline_cli import ProviderTransientError, ToolExecutionError, play, steps, tool

@tool("t.missing", credits=1)
def missing(input):
    raise ProviderTransientError("410 from t.missing", category="validation", status_code=410)

@tool("t.up", credits=1)
def up(input):
    return {"n": input["n"]}

async def firmographics(row, rc):
    try:
        return (await rc.tools.execute("m", "t.missing", {"n": row["n"]})).output
    except ToolExecutionError:
        return None  # not known there: the row goes on without it

EMAIL = steps().step("missing", lambda row, rc: rc.tools.execute("w", "t.missing", {"w": row["n"]})).step(
    "up", lambda row, rc: rc.tools.execute("u", "t.up", {"n": row["n"]}))

@play("handled")
async def handled(ctx, input):
    rows = await ctx.map("rows", [{"n": n} for n in range(3)], key="n", columns={
        "firmographics": firmographics,
        "email": EMAIL,
    })
    return rows.failed_count
"""


def test_a_failure_the_play_handles_itself_is_final_not_fallen_back(write_play, store_path, deepline) -> None:
    """A call whose failure the play caught, asking no other provider, was shown as "fell
    back" (and the report said the next provider's answer was kept): it is final. Only the
    waterfall's failed step, got past by its next step, fell back."""
    result = run_play(write_play(HANDLED), store_path, run_id="hd")
    assert (result.status, result.output) == ("completed", 0), result.error
    missing = result.stats["tools"]["t.missing"]
    assert (missing["failed"], missing["recovered"]) == (6, 3), missing
    shown = json.loads(deepline("runs", "show", "hd", "--json", DEEPLINE_STORE=str(store_path)).stdout)
    stored = shown["stats"]["tools"]["t.missing"]
    assert (stored["failed"], stored["recovered"]) == (6, 3), stored
    html = render(read_report(open_store(str(store_path)), "hd"))
    assert "3 of them fell back to another provider of their cell, 3 were final" in html, html


def test_a_resume_keeps_a_handled_failure_final(write_play, store_path) -> None:
    source = HANDLED.replace(
        "    return rows.failed_count",
        '    if ctx.run.attempt == 1:\n        raise RuntimeError("after the map")\n    return rows.failed_count',
    )
    assert run_play(write_play(source), store_path, run_id="hdr").status == "failed"
    again = resume_run("hdr", store_path)
    assert (again.status, again.output) == ("completed", 0), again.error
    missing = again.stats["tools"]["t.missing"]
    assert (missing["failed"], missing["recovered"]) == (6, 3), missing


GATED_WATERFALL = """
from deepline_cli import Column, play, steps, tool

@tool("t.exists", credits=0.1)
def exists(input):
    return {"exists": True}

@tool("t.enrich", credits=1)
def enrich(input):
    return {"employees": 42} if input["n"] else {}

@play("gated")
async def gated(ctx, input):
    async def known(row):
        return (await ctx.tools.execute("exists", "t.exists", {"n": row["n"]})).output["exists"]

    rows = await ctx.map("m", [{"n": n} for n in range(3)], key="n", columns={"employees": Column(
        steps().step("enrich", lambda row, rc: rc.tools.execute("e", "t.enrich", {"n": row["n"]})),
        run_if=known)})
    return len(rows)
"""


def test_a_lookup_in_the_run_if_of_a_waterfall_is_found_as_in_a_plain_column(write_play, store_path) -> None:
    """The run_if's lookup answered for 3 rows, and the waterfall found a value for 2 of them:
    the lookup's found rate is 2/3, as it is for a plain column (it was 0/3: only the winning
    step's calls counted, and the run_if's are none of them)."""
    result = run_play(write_play(GATED_WATERFALL), store_path, run_id="gw")
    assert result.status == "completed", result.error
    report = read_report(open_store(str(store_path)), "gw")
    assert (report.tools["t.exists"].found, report.tools["t.exists"].answered) == (2, 3)
    assert (report.tools["t.enrich"].found, report.tools["t.enrich"].answered) == (2, 3)


RACE = """
import asyncio
from deepline_cli import play, tool

SLOW = "{slow}"

@tool("t.a", credits=0)
async def a(input):
    await asyncio.sleep(0.05 if SLOW == "a" else 0)
    raise ValueError("no such person")

@tool("t.b", credits=1)
async def b(input):
    await asyncio.sleep(0.05 if SLOW == "b" else 0)
    return {{"email": input["n"]}}

async def race(row, rc):  # ask both at once, keep the one with a value
    got = await asyncio.gather(rc.tools.execute("a", "t.a", {{"n": row["n"]}}),
                               rc.tools.execute("b", "t.b", {{"n": row["n"]}}), return_exceptions=True)
    return next((r.get("email") for r in got if not isinstance(r, BaseException)), None)

@play("race")
async def race_play(ctx, input):
    return len(await ctx.map("m", [{{"n": n}} for n in range(3)], key="n", columns={{"email": race}}))
"""


def test_a_failure_another_provider_answered_beside_fell_back_whichever_answered_first(
    write_play, tmp_path: Path
) -> None:
    """Two providers asked at once, the one that failed got past by the other's answer:
    "fell back" in both orders (by which call finished last, it was final in one)."""
    for slow in ("a", "b"):
        store = tmp_path / f"{slow}.db"
        result = run_play(write_play(RACE.format(slow=slow), name=f"race_{slow}.py"), store)
        assert result.status == "completed", result.error
        a = result.stats["tools"]["t.a"]
        assert (a["failed"], a["recovered"]) == (3, 3), (slow, a)


def test_retries_whose_causes_no_record_kept_are_said_earlier() -> None:
    """Every retry of a tool made in an attempt that was killed: `retries 5` with no cause at
    all (where some causes were known, the rest showed as `earlier`)."""
    from deepline_cli._format import retry_causes

    assert retry_causes({}, 5) == {"earlier": 5}
    assert retry_causes(None, 5) == {"earlier": 5}
    assert retry_causes({"429": 25}, 33) == {"429": 25, "earlier": 8}
    assert retry_causes({"5xx": 2}, 2) == {"5xx": 2}
    assert retry_causes({}, 0) == {}
    # An outcome kept `earlier` already (a run killed, stopped, then killed again): the retries
    # of the later killed attempt are added to it, not put in its place.
    assert retry_causes({"5xx": 422, "earlier": 53}, 515) == {"5xx": 422, "earlier": 93}


def test_a_resume_over_rows_in_another_order_keeps_a_handled_failure_final(write_play, store_path) -> None:
    """The rows came back in another order: each was taken back whole at its new place, and its
    caught 404 (final) became "fell back" (the row kept no word of it)."""
    source = HANDLED.replace(
        '[{"n": n} for n in range(3)]',
        '[{"n": int(n)} for n in Path(__file__).with_name("order.txt").read_text().split()]',
    ).replace(
        "    return rows.failed_count",
        '    if ctx.run.attempt == 1:\n        raise RuntimeError("after the map")\n    return rows.failed_count',
    )
    play = write_play("from pathlib import Path\n" + source)
    order = play.with_name("order.txt")
    order.write_text("0 1 2")
    assert run_play(play, store_path, run_id="hdo").status == "failed"
    order.write_text("2 1 0")
    again = resume_run("hdo", store_path)
    assert (again.status, again.output) == ("completed", 0), again.error
    missing = again.stats["tools"]["t.missing"]
    assert (missing["failed"], missing["recovered"]) == (6, 3), missing


def test_a_handled_failure_after_a_run_if_lookup_is_final(write_play, store_path) -> None:
    """The run_if's lookup answered, then the resolver's only call 404'd and was caught: the
    lookup counted as another call of the cell answering, and the 404 "fell back"."""
    source = HANDLED.replace(
        '"firmographics": firmographics,',
        '"firmographics": Column(firmographics, run_if=known),',
    ).replace(
        "async def firmographics(row, rc):",
        "async def known(row):\n"
        '    return (await ctx_tools().execute("k", "t.up", {"n": -row["n"]})).output is not None\n\n'
        "async def firmographics(row, rc):",
    )
    source = source.replace(
        "from deepline_cli import ProviderTransientError, ToolExecutionError, play, steps, tool",
        "from deepline_cli import Column, ProviderTransientError, ToolExecutionError, play, steps, tool\n\n"
        "CTX = []\n\ndef ctx_tools():\n    return CTX[0].tools",
    ).replace("async def handled(ctx, input):\n", "async def handled(ctx, input):\n    CTX.append(ctx)\n")
    result = run_play(write_play(source), store_path, run_id="hdg")
    assert (result.status, result.output) == ("completed", 0), result.error
    missing = result.stats["tools"]["t.missing"]
    assert (missing["failed"], missing["recovered"]) == (6, 3), missing


LAST_STEP_FAILS = """
from deepline_cli import ToolExecutionError, play, steps, tool

@tool("t.empty", credits=1)
def empty(input):
    return {"email": None}

@tool("t.gone", credits=1)
def gone(input):
    raise ToolExecutionError("404: unknown", category="validation", status_code=404)

EMAIL = steps().step("a", lambda row, rc: rc.tools.execute("a", "t.empty", {"n": row["n"]})).step(
    "b", lambda row, rc: rc.tools.execute("b", "t.gone", {"n": row["n"]}))

@play("last")
async def last(ctx, input):
    return len(await ctx.map("rows", [{"n": n} for n in range(2)], key="n", columns={"email": EMAIL}))
"""


def test_a_404_nothing_found_a_value_after_is_not_found_not_fallen_back(deepline, write_play) -> None:
    """A waterfall whose first step answers with nothing and whose last step says 404: no
    provider found the value ("fell back to another provider, which answered" would be
    false), and none failed: the 404s are answers that found nothing, live and in the store."""
    write_play(LAST_STEP_FAILS)
    run = deepline("run", "play.py", "--run-id", "last", "--json")
    assert run.code == 0, run.stderr
    gone = run.json_lines()[-1]["stats"]["tools"]["t.gone"]
    assert (gone["failed"], gone["recovered"], gone["not_found"]) == (0, 0, 2), gone
    shown = json.loads(deepline("runs", "show", "last", "--json").stdout)["stats"]["tools"]["t.gone"]
    assert (shown["failed"], shown["recovered"], shown["not_found"]) == (0, 0, 2), shown


def test_the_progress_bar_shows_how_far_a_map_is_without_colours() -> None:
    """Done and to-do were the same character in two colours: under NO_COLOR (or on a
    monochrome terminal) a map 18% through looked done."""
    from deepline_cli.ui.console import _bar
    from deepline_cli.ui.state import MapView

    half = _bar(MapView("m", total=100, done=50, succeeded=50), 10).plain
    assert half == "━━━━━─────", half
    assert _bar(MapView("m", total=100, done=100, succeeded=100, completed=True), 10).plain == "━" * 10


def test_the_live_view_draws_nothing_before_the_run_is_known() -> None:
    """A play that failed to load left "deepline  run   attempt 0" on screen above its error."""
    import io

    view = ConsoleView(io.StringIO(), live=False)
    view.console.print(view.render())
    assert view._stream.getvalue() == ""  # type: ignore[attr-defined]


# Two plays' maps ask a tool the same questions: the second gets the first's answers and
# failures back from their receipts, without asking the tool again.
KEPT_FAILURES = """
from pathlib import Path
from deepline_cli import play, tool

ASKED = Path(__file__).with_name("asked.log")

@tool("t.company", credits=1)
def company(input):
    with ASKED.open("a") as log:
        log.write(f"{input['n']}\\n")
    if input["n"] % 2:
        raise ValueError(f"no company for {input['n']}")
    return {"name": f"c{input['n']}"}

@play("kept")
async def kept(ctx, input):
    rows = await ctx.map(input["map"], [{"n": n} for n in range(8)], key="n", columns={
        "company": lambda row, rc: rc.tools.execute("c", "t.company", {"n": row["n"]}),
    })
    return rows.failed_count
"""


def test_a_failure_given_back_from_an_earlier_runs_receipt_is_not_counted_as_a_call(
    write_play, store_path, tmp_path, deepline
) -> None:
    """A second map asking a tool what a first one asked: its 4 failures came back from
    their receipts, no request made, yet every view counted them among the run's calls
    (the report said 4 tool calls; the tool was asked none)."""
    play = write_play(KEPT_FAILURES)
    asked = tmp_path / "asked.log"
    first = run_play(play, store_path, {"map": "first"})
    assert first.status == "completed" and first.output == 4, first.error
    assert len(asked.read_text().splitlines()) == 8
    seen: list[dict[str, Any]] = []
    bus = EventBus()
    bus.subscribe(lambda e: seen.append(e.data["tools"]) if e.event == "run.progress" else None)
    second = run_play(play, store_path, {"map": "second"}, bus=bus)
    assert second.status == "completed" and second.output == 4, second.error
    assert len(asked.read_text().splitlines()) == 8  # nothing asked again
    counts = second.stats["tools"]["t.company"]
    assert (counts["live"], counts["reused"], counts["failed"], counts["kept"]) == (0, 4, 4, 4), counts
    live = seen[-1]["t.company"]  # the live view's last counts: the store's
    assert (live["live"], live["reused"], live["failed"], live["kept"]) == (0, 4, 4, 4), live
    line = fit(tool_pieces("t.company", counts, {}, {}), 200)
    assert "failed 4" in line and "4 given back from earlier runs" in line, line
    _, html = _report_text(store_path, second.run_id)
    assert '<div class="card" id="card-tool-calls"><span>tool calls</span><b>0</b>' in html, html
    assert "4 given back from earlier runs" in html
    shown = deepline("runs", "show", second.run_id)
    assert shown.code == 0 and "4 given back from earlier runs" in shown.stdout, shown.stdout
    said = " ".join(verdict(second.run_id, "completed", second.stats, None, "kept"))
    assert "Nothing was paid: 8 calls came from earlier runs" in said, said
    # The first run made its calls: none of its failures was given back.
    counts = first.stats["tools"]["t.company"]
    assert (counts["live"], counts["failed"], counts["kept"]) == (4, 4, 0), counts


KEPT_THEN_SENT = """
from deepline_cli import play, tool

@tool("t.bad", credits=1)
def bad(input):
    raise ValueError("no company")

@play("kept-then-sent")
async def kept_then_sent(ctx, input):
    try:
        await ctx.tools.execute("c", "t.bad", {"n": 1})
    except Exception:
        pass
    raise RuntimeError("stop here")
"""


def test_a_kept_failure_asked_again_is_the_runs_own_on_screen_as_in_the_store(write_play, store_path) -> None:
    """Run B got run A's stored failure back (kept), then its resume with --force-refresh
    asked the tool again and it failed: the store counts B's own failure (not kept), the
    live view still said "1 given back from earlier runs"."""
    play = write_play(KEPT_THEN_SENT)
    assert run_play(play, store_path, {"who": "a"}).status == "failed"
    b = run_play(play, store_path, {"who": "b"})
    assert b.stats["tools"]["t.bad"]["kept"] == 1, b.stats["tools"]
    seen: list[dict[str, Any]] = []
    bus = EventBus()
    bus.subscribe(lambda e: seen.append(e.data["tools"]) if e.event == "run.progress" else None)
    again = resume_run(b.run_id, store_path, bus=bus, force_refresh=True)
    stored = again.stats["tools"]["t.bad"]
    assert (stored["failed"], stored["kept"]) == (1, 0), stored
    live = seen[-1]["t.bad"]
    assert (live["failed"], live["kept"]) == (1, 0), live


KID_FAILS = """
from deepline_cli import play, tool

@tool("t.bad", credits=1)
def bad(input):
    raise ValueError(f"no company for {input['n']}")

@play("kid")
async def kid(ctx, input):
    try:
        await ctx.tools.execute("c", "t.bad", {"n": input["n"] + 100})
    except Exception:
        pass
    return 1
"""

PARENT_OF_KID = """
from deepline_cli import play
import kid

async def go(row, rc):
    await rc.run_play("k", "kid.py", {"n": row["n"]})
    return await rc.tools.execute("c", "t.bad", {"n": row["n"]})

@play("parent")
async def parent(ctx, input):
    rows = await ctx.map("m", [{"n": 0}, {"n": 1}], key="n", columns={"x": go})
    return rows.failed_count
"""


@pytest.mark.parametrize("kid_map", [False, True], ids=["no-map", "a-map-named-as-its-parents"])
def test_a_child_plays_failed_call_made_for_a_row_counts_as_the_rows(write_play, store_path, kid_map) -> None:
    """A child play run for a map row made a call that failed: the live view counted it
    (final: the row failed), the store did not (it looked for the row among the child
    run's own map rows, where there are none, also when the child has a map of that name).
    Known limit: a child's own map row of the same key as its parent's row is taken for it."""
    kid = KID_FAILS
    if kid_map:
        kid = kid.replace(
            "    return 1\n",
            '    await ctx.map("m", [{"z": 99}], key="z", columns={"y": lambda row: 1})\n    return 1\n',
        )
    write_play(kid, "kid.py")
    seen: list[dict[str, Any]] = []
    bus = EventBus()
    bus.subscribe(lambda e: seen.append(e.data["tools"]) if e.event == "run.progress" else None)
    result = run_play(write_play(PARENT_OF_KID, "parent.py"), store_path, bus=bus)
    assert result.status == "completed" and result.output == 2, result.error
    stored, live = result.stats["tools"]["t.bad"], seen[-1]["t.bad"]
    assert (stored["failed"], stored["recovered"]) == (4, 0), stored
    assert (live["failed"], live["recovered"]) == (4, 0), live


REFRESHED_LATER = """
from pathlib import Path
from deepline_cli import play, tool

DOWN = Path(__file__).with_name("down")

@tool("t.lookup", credits=1)
def lookup(input):
    if DOWN.exists():
        raise ValueError("lookup is down")
    return {"name": "acme"}

@play("refreshed")
async def refreshed(ctx, input):
    try:
        await ctx.tools.execute("l", "t.lookup", {"domain": "acme.com"}, stale_after_seconds=input.get("ttl"))
    except Exception:
        if input.get("strict"):
            raise
        return "failed"
    return "answered"
"""


def test_a_finished_runs_figures_stay_when_a_later_run_refreshes_what_it_reused(
    write_play, store_path, tmp_path
) -> None:
    """Run B was answered from A's receipt; run C refreshed that receipt and the refresh
    failed: B's figures then said it had a failed call, given back from an earlier run."""
    play = write_play(REFRESHED_LATER)
    assert run_play(play, store_path, {"ttl": 100000}).output == "answered"
    b = run_play(play, store_path, {"ttl": 100000, "b": 1})
    assert b.output == "answered"
    before = b.stats["tools"]["t.lookup"]
    assert (before["live"], before["reused"], before["failed"]) == (0, 1, 0), before
    (tmp_path / "down").write_text("")
    assert run_play(play, store_path, {"ttl": 0}).output == "failed"
    store = open_store(str(store_path))
    try:
        after = store.ledger.run_stats(b.run_id)["tools"]["t.lookup"]
    finally:
        store.close()
    assert (after["live"], after["reused"], after["failed"], after["kept"]) == (0, 1, 0, 0), after


def test_a_failure_given_back_then_answered_by_a_resume_counts_as_answered(write_play, store_path, tmp_path) -> None:
    """Run A was given X's stored failure and failed; B asked again (--refresh-failed) and got
    an answer; A's resume was answered from B's receipt. A's figures kept "failed 1 (1 given
    back)": the store kept how the receipt answered A the first time."""
    play = write_play(REFRESHED_LATER)
    (tmp_path / "down").write_text("")
    assert run_play(play, store_path, {"who": "x"}).output == "failed"
    a = run_play(play, store_path, {"who": "a", "strict": True})
    assert a.status == "failed" and a.stats["tools"]["t.lookup"]["kept"] == 1, a.stats["tools"]
    (tmp_path / "down").unlink()
    assert run_play(play, store_path, {"who": "b"}, refresh_failed=True).output == "answered"
    resumed = resume_run(a.run_id, store_path)
    assert resumed.status == "completed", resumed.error
    counts = resumed.stats["tools"]["t.lookup"]
    assert (counts["live"], counts["reused"], counts["failed"], counts["kept"]) == (0, 1, 0, 0), counts


PACED_PLAY = """
import time
from deepline_cli import Column, play

def slow(row):
    time.sleep(0.02 if row["n"] >= 200 else 0)  # the row's own work: the 20 new rows take 0.4 s at least
    return row["n"] * 2

@play("paced")
async def paced(ctx, input):
    rows = [{"n": n} for n in range(input["rows"])]
    done = await ctx.map("m", rows, key="n", concurrency=1, columns={"v": Column(slow, depends_on=[])})
    return len(done)
"""


def test_the_rate_counts_the_rows_computed_now_not_those_taken_back_from_the_sheet(write_play, store_path) -> None:
    """200 rows an earlier run made, taken back whole at once, then 20 new ones at 50 a second:
    the rate said ~200 rows/s, the ETA of a long list a few seconds where it would take minutes."""
    play = write_play(PACED_PLAY)
    assert run_play(play, store_path, {"rows": 200}).status == "completed"
    seen: list[Any] = []
    bus = EventBus()
    bus.subscribe(lambda event: seen.append(event) if event.event == "map.progress" else None)
    assert run_play(play, store_path, {"rows": 220}, bus=bus).status == "completed"
    last = seen[-1].data
    assert (last["done"], last["reused"]) == (220, 200), last
    assert last["rows_per_s"] <= 50.5, last  # 20 rows computed in 0.4 s or more


FAILING_ROWS = """
import asyncio
from deepline_cli import play

async def company(row):
    await asyncio.sleep(0.01)
    if row["domain"].startswith("x"):
        raise ValueError("no such company")
    return row["domain"].upper()

@play("failing")
async def failing(ctx, input):
    rows = [{"domain": f"{'x' if i % 4 == 0 else 'c'}{i}.io"} for i in range(12)]
    return (await ctx.map("m", rows, key="domain", concurrency=2, columns={"co": company})).failed_count
"""


def test_the_live_view_says_the_latest_row_failure_while_its_map_runs(write_play, store_path) -> None:
    """SPEC's live view shows `row acme.com failed: …` as it happens; a row's failure was
    only said when its map ended (a map failing for minutes showed a rising ✗ and no reason)."""
    import io

    play = write_play(FAILING_ROWS)
    view = ConsoleView(io.StringIO(), live=False)
    frames: list[str] = []

    def looked(event: Any) -> None:
        view.state.apply(event)
        if event.event == "map.progress" and view.state.maps["m"].failed and not view.state.maps["m"].completed:
            frames.append(" ".join(text.plain for text in view._render_map(view.state.maps["m"], 100)))

    bus = EventBus()
    bus.subscribe(looked)
    assert run_play(play, store_path, bus=bus).output == 3
    assert any(re.search(r"row x\d+\.io failed: ValueError: no such company", frame) for frame in frames), frames
    done = view._render_map(view.state.maps["m"], 100)
    assert not any("failed: ValueError" in text.plain for text in done)  # its log says them once it ends


# A waterfall whose middle provider does not know most people (404): a "not found" answer,
# as an empty answer is, passed on to the next provider.
NOT_FOUND = """
from deepline_cli import ToolExecutionError, play, steps, tool

@tool("t.one", credits=1)
def one(input):
    return {"email": None}

@tool("t.two", credits=1)
def two(input):
    if input["n"] >= 2:
        raise ToolExecutionError("404 from t.two: no such person", category="validation", status_code=404)
    return {"email": f"{input['n']}@two.io"}

@tool("t.three", credits=1)
def three(input):
    return {"email": f"{input['n']}@three.io"}

def ask(tool):
    async def step(row, rc):
        return (await rc.tools.execute(tool, tool, {"n": row["n"]})).get("email")
    return step

EMAIL = steps().step("one", ask("t.one")).step("two", ask("t.two")).step("three", ask("t.three"))

@play("notfound")
async def notfound(ctx, input):
    rows = await ctx.map("people", [{"n": n} for n in range(10)], key="n", columns={
        "email": EMAIL,
        # a plain column: its 404 fails the row (a failed call: a wrong URL 404s every call)
        "strict": lambda row, rc: rc.tools.execute("strict", "t.two", {"n": row["n"] + 100})
        if row["n"] == 9 else None,
    })
    return rows.failed_count
"""


def test_a_404_a_waterfall_passes_on_is_a_not_found_answer_not_a_failure(write_play, store_path) -> None:
    """Eight of ten people unknown to the middle provider (404): its line said `live 2 failed
    4 fell back 4` (failed or fallen back as the next provider found a value or not), and the
    report gave it a 100% (2/2) find rate. They are answers that found nothing, as empty
    answers are: `not found 8`, found 2 of 10. A 404 its row fails on is a failed call."""
    seen: list[dict[str, Any]] = []
    bus = EventBus()
    bus.subscribe(lambda e: seen.append(e.data["tools"]) if e.event == "run.progress" else None)
    result = run_play(write_play(NOT_FOUND), store_path, bus=bus)
    assert result.status == "completed" and result.output == 1, result.error
    two = result.stats["tools"]["t.two"]  # read from the store
    assert (two["live"], two["not_found"], two["failed"], two["recovered"]) == (2, 8, 1, 0), two
    live = seen[-1]["t.two"]  # as the live view counted it, call by call
    assert (live["live"], live["not_found"], live["failed"], live["recovered"]) == (2, 8, 1, 0), live
    line = fit(tool_pieces("t.two", two, {}, {}), 200)
    assert "not found 8" in line and "fell back" not in line, line
    report, html = _report_text(store_path, result.run_id)
    figures = report.tools["t.two"]
    assert (figures.found, figures.answered) == (2, 10), (figures.found, figures.answered)
    assert "20%" in html


def test_a_resume_that_computes_a_later_column_anew_keeps_a_handled_failure_final(write_play, store_path) -> None:
    """A column after the handled failure edited between the attempts: the resume computed
    that column again, reused the others, and wrote the row without saying what it got past,
    so its caught failure (final) was counted as fallen back."""
    source = HANDLED.replace(
        '        "email": EMAIL,\n',
        '        "email": EMAIL,\n        "label": lambda row: "v1",\n',
    ).replace(
        "    return rows.failed_count",
        '    if ctx.run.attempt == 1:\n        raise RuntimeError("after the map")\n    return rows.failed_count',
    )
    play = write_play(source)
    assert run_play(play, store_path, run_id="hdl").status == "failed"
    play.write_text(source.replace('"v1"', '"v2"'))
    again = resume_run("hdl", store_path)
    assert (again.status, again.output) == ("completed", 0), again.error
    missing = again.stats["tools"]["t.missing"]
    assert (missing["failed"], missing["recovered"]) == (6, 3), missing


def test_a_404_given_back_from_an_earlier_runs_receipt_is_an_answer_reused(deepline, write_play) -> None:
    """The cells computed again (another input): the 404s come back from their receipts, no
    request made: answers reused, neither failed nor calls made."""
    write_play(NOT_FOUND)
    assert deepline("run", "play.py", "--quiet").code == 0
    again = deepline("run", "play.py", "--set", "v=2", "--run-id", "again", "--json")
    assert again.code == 0, again.stderr
    two = again.json_lines()[-1]["stats"]["tools"]["t.two"]
    assert (two["live"], two["reused"], two["not_found"], two["failed"], two["kept"]) == (0, 10, 0, 1, 1), two
    shown = json.loads(deepline("runs", "show", "again", "--json").stdout)["stats"]["tools"]["t.two"]
    assert shown == {k: two[k] for k in shown}, (shown, two)


def test_what_explains_a_tools_failures_outlasts_its_retries_on_a_narrow_line() -> None:
    """ "not found" and "fell back" say why a tool's calls did not all answer: on a narrow
    line its retries go before them, so a tool that found nothing does not look as if it
    failed."""
    from deepline_cli.ui.console import fit, tool_pieces

    counts = {"live": 3277, "failed": 280, "recovered": 280, "not_found": 1877, "retries": 280,
              "retry_reasons": {"5xx": 280}, "credits": 3277}  # fmt: skip
    pieces = tool_pieces("people.alpha", counts, {}, {})
    line = fit(pieces, 90)
    assert "not found 1,877" in line and "fell back 280" in line and "retries" not in line, line
    assert len(line) <= 90


def test_plain_lines_without_a_terminal_leave_nothing_out() -> None:
    """A CI log or a file has no width: a tool's plain line keeps every count."""
    import io

    from deepline_cli.runtime.calls.events import Event
    from deepline_cli.ui.console import ConsoleView

    out = io.StringIO()
    view = ConsoleView(out, live=False)
    counts = {"live": 1646, "failed": 190, "recovered": 128, "not_found": 989, "kept": 3, "retries": 128,
              "retry_reasons": {"5xx": 100, "429": 28}, "credits": 1646}  # fmt: skip
    name = "people.alpha.with.a.rather.long.tool.name"
    with view:
        view.handle(Event("run.progress", "r-1", 0.0, {"tools": {name: counts, "people.beta": counts}}))
    [line] = [line for line in out.getvalue().splitlines() if name in line]
    pieces = ("live 1,646", "not found 989", "failed 62", "fell back 128", "retries 128 (429 28, 5xx 100)", "(3 given")
    assert all(piece in line for piece in pieces), line


def test_the_workers_lines_on_a_terminal_wrap_at_words_and_keep_commands_whole() -> None:
    """`deepline worker` on a terminal: a long line is wrapped at words (not cut mid-word by
    the terminal), and a verdict's next commands each keep a line of their own; in a log
    each line is written as it is."""
    import io

    from rich.console import Console

    from deepline_cli.cli.worker import reporter

    failure = "worker: r-4b3f: row d25.example.com failed: internal: local.score: ValueError: cannot score it"
    verdict = "  ✓ Run r-4b3f completed in 0:02: 550 rows (470 succeeded, 80 failed, 50 duplicate), 879 credits."
    steps = "    Next: deepline export r-4b3f --out x.csv · deepline runs logs r-4b3f --kind row.failed"
    out = io.StringIO()
    terminal = Console(file=out, force_terminal=True, width=60, highlight=False, markup=False, color_system=None)
    report = reporter(out, terminal)
    for line in (failure, verdict, steps):
        report(line)
    shown = [line.rstrip() for line in out.getvalue().splitlines()]
    assert all(len(line) <= 60 for line in shown), shown
    words = " ".join(" ".join(shown).split())
    assert " ".join(failure.split()) in words and " ".join(verdict.split()) in words
    assert "      deepline export r-4b3f --out x.csv" in shown
    assert "      deepline runs logs r-4b3f --kind row.failed" in shown
    log = io.StringIO()
    plain = reporter(log, Console(file=log, force_terminal=False))
    plain(failure)
    assert log.getvalue() == failure + "\n"
