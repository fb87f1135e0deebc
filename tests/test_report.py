"""`deepline runs report RUN --html`: one self-contained file, checked in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "lead_enrichment"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = "Chromium is not installed (apt-get install chromium; .ci/run installs it): the browser check is skipped"


def chromium(tmp_path: Path, page: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run",
            f"--user-data-dir={tmp_path / 'chromium'}", *flags, page.as_uri(),
        ],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _run(deepline, *args: str) -> dict:
    result = deepline("run", *args, "--json")
    assert result.code == 0, result.stderr
    return result.json_lines()[-1]


@pytest.fixture
def example_run(deepline) -> dict:
    return _run(deepline, str(EXAMPLE / "play.py"), "--csv", str(EXAMPLE / "leads.csv"), "--set", "latency=0")


def test_the_report_renders_in_headless_chromium(deepline, example_run, tmp_path) -> None:
    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    run_id, stats = example_run["run_id"], example_run["stats"]
    result = deepline("runs", "report", run_id, "--html")
    assert result.code == 0, result.stderr
    page = Path(result.stdout.strip())
    assert page == tmp_path / f"deepline-report-{run_id}.html"
    text = page.read_text()
    # Self-contained: nothing is fetched (no scripts, no external URL, no link element).
    assert "<script" not in text and "<link" not in text and not re.search(r"(src|href)=\"?https?:", text)

    dom = chromium(tmp_path, page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr
    html = dom.stdout
    calls = sum(t["live"] + t["not_found"] + t["failed"] for t in stats["tools"].values())
    rows = stats["rows"]["succeeded"] + stats["rows"]["failed"]
    assert f'id="card-credits"><span>credits</span><b>{stats["credits"]:,.6g}</b>' in html
    assert f'id="card-tool-calls"><span>tool calls</span><b>{calls:,}</b>' in html
    assert f'id="card-rows"><span>rows</span><b>{rows:,}</b>' in html
    assert html.count('class="call live"') + html.count('class="call failed"') == calls
    for heading in ("Timeline", "Tool latency", "Credits and hit rate per provider", "Map leads", "Attempts"):
        assert f"<h2>{heading}</h2>" in html
    assert "302 input rows = 281 succeeded + 9 failed + 12 duplicate" in html
    assert "validation: 404: no email known" in html  # the first failures, with their errors

    shot = tmp_path / "report.png"
    taken = chromium(tmp_path, page, f"--screenshot={shot}", "--window-size=1280,2000")
    assert taken.returncode == 0, taken.stderr
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_reused_calls_attempts_and_a_pilot_projection_are_reported(deepline, tmp_path) -> None:
    hello = str(ROOT / "examples" / "hello" / "play.py")
    _run(deepline, hello)
    again = _run(deepline, hello)  # every call comes back from a receipt
    out = tmp_path / "out" / "again.html"
    out.parent.mkdir()
    result = deepline("runs", "report", again["run_id"], "--html", "--out", str(out))
    assert result.code == 0 and result.stdout.strip() == str(out)
    text = out.read_text()
    assert text.count('class="call reused"') == 6 and 'class="call live"' not in text
    assert "No calls were made by this run" in text

    pilot = _run(
        deepline, str(EXAMPLE / "play.py"), "--csv", str(EXAMPLE / "leads.csv"), "--limit", "40", "--set", "latency=0"
    )
    assert deepline("runs", "report", pilot["run_id"], "--html", "--out", str(out)).code == 0
    text = out.read_text()
    assert "<h2>Pilot projection</h2>" in text and "full list of 290 rows ≈" in text
    # The latency table counts each call sent (one a later attempt sent again, again), where the
    # tool-calls card counts each call once: its column says so.
    assert "<th class=n>sent</th>" in text and "counts each time a call was sent" in text
    assert "<td>completed</td>" in text  # the attempt and its status


def test_report_errors_are_one_sentence(deepline) -> None:
    no_store = deepline("runs", "report", "r-nope", "--html")
    assert no_store.code == 2 and no_store.stderr.startswith("Error: There is no store at")
    hello = _run(deepline, str(ROOT / "examples" / "hello" / "play.py"))
    unknown = deepline("runs", "report", "r-nope", "--html")
    assert unknown.code == 2 and unknown.stderr.startswith("Error: No run 'r-nope'")
    no_format = deepline("runs", "report", hello["run_id"])
    assert no_format.code == 2 and "--html" in no_format.stderr


def test_ledger_queries_on_both_backends(deepline, write_play, tmp_path, store_url) -> None:
    """The pilot projection, plan's observed hit rates and the report read the calls
    ledger the same way on SQLite and PostgreSQL."""
    from tests.test_projection import PLAY, _leads

    play, leads = str(write_play(PLAY)), str(_leads(tmp_path / "leads.csv", 300))
    env = {"DEEPLINE_STORE": store_url}
    pilot = deepline("run", play, "--csv", leads, "--limit", "50", "--json", **env)
    assert pilot.code == 0, pilot.stderr
    finished = pilot.json_lines()[-1]
    (m,) = finished["stats"]["projection"]["maps"]
    assert (m["pilot_rows"], m["new_rows"]) == (50, 250) and m["credits_per_row"]["sample"] == 50
    plan = deepline("plan", play, "--csv", leads, "--json", **env)
    assert plan.code == 0, plan.stderr
    assert plan.json_lines()[-1]["maps"][0]["expected_from"] == "hit rates of 50 rows of earlier runs"
    out = tmp_path / "r.html"
    assert deepline("runs", "report", finished["run_id"], "--html", "--out", str(out), **env).code == 0
    credits = finished["stats"]["credits"]
    assert f'id="card-credits"><span>credits</span><b>{credits:,.6g}</b>' in out.read_text()


def test_the_reports_first_failures_number_input_rows_from_one(deepline, write_play, tmp_path) -> None:
    """The third row of the list was "input row 2", beside logs that number lines from one."""
    write_play(
        """
        from deepline_cli import play

        def check(row):
            if row["id"] == "c":
                raise ValueError("no such company")
            return row["id"]

        @play("numbered")
        async def numbered(ctx, input):
            rows = await ctx.map("m", [{"id": "a"}, {"id": "b"}, {"id": "c"}], key="id", columns={"v": check})
            return len(rows)
        """
    )
    run_id = _run(deepline, "play.py")["run_id"]
    page = Path(deepline("runs", "report", run_id, "--html").stdout.strip())
    assert "<tr><td class=n>3</td><td>c</td>" in page.read_text()


def test_the_report_of_a_run_no_process_holds_says_so(deepline, tmp_path, store_path) -> None:
    """A run killed mid-way: its report said `running`, its attempt `running` (runs show says
    the process is gone and how to continue it)."""
    from deepline_cli.store import open_store

    hello = str(ROOT / "examples" / "hello" / "play.py")
    run_id = _run(deepline, hello)["run_id"]
    store = open_store(str(store_path))
    try:  # as a SIGKILL leaves it: running, its attempt not ended, its lease out
        store._conn.execute(
            "UPDATE runs SET status = 'running', holder = 'gone-host:4194303:1', lease_expires_at = 0,"
            " finished_at = NULL WHERE run_id = ?",
            (run_id,),
        )
        store._conn.execute("UPDATE attempts SET ended_at = NULL, status = 'running' WHERE run_id = ?", (run_id,))
        store._conn.commit()
    finally:
        store.close()
    out = tmp_path / "killed.html"
    assert deepline("runs", "report", run_id, "--html", "--out", str(out)).code == 0
    text = out.read_text()
    assert f"no live process holds it; deepline resume {run_id} continues it" in text, text[:2000]
    assert "<td>running</td>" not in text


def test_answers_whose_rows_a_budget_stop_left_unrecorded_are_judged_by_themselves(
    deepline, write_play, store_path
) -> None:
    """A budget stop after each row's company lookup answered, before its email call: the
    rows were not recorded, and the report said the company tool found 0% (0/4) of answers
    that all held a company. Answers in no recorded row are judged by themselves, as calls
    outside a map are."""
    from deepline_cli.store import open_store
    from deepline_cli.ui.report_data import read_report

    write_play(
        """
        import asyncio
        from deepline_cli import play, tool

        @tool("co.lookup", credits=1)
        async def lookup(input):
            return {"name": input["d"].split(".")[0].title()}

        @tool("co.email", credits=5)
        async def email(input):
            return {"email": "ada@" + input["d"]}

        @play("stopped")
        async def stopped(ctx, input):
            answered, all_in = [], asyncio.Event()

            async def both(row, rc):
                company = await rc.tools.execute("c", "co.lookup", {"d": row["d"]})
                answered.append(row["d"])
                if len(answered) == 4:
                    all_in.set()
                await asyncio.wait_for(all_in.wait(), 30)  # the four lookups answer before any email is asked
                found = await rc.tools.execute("e", "co.email", {"d": row["d"]})
                return {"company": company.output["name"], "email": found.output["email"]}

            rows = await ctx.map("m", [{"d": f"c{i}.io"} for i in range(4)], key="d", columns={"v": both})
            return len(rows)
        """
    )
    result = deepline("run", "play.py", "--max-credits", "4", "--run-id", "stop-1")
    assert result.code == 1, result.stderr
    db = open_store(str(store_path))
    try:
        tools = read_report(db, "stop-1").tools
    finally:
        db.close()
    assert (tools["co.lookup"].live, tools["co.lookup"].found) == (4, 4), tools["co.lookup"]
