"""What the commands show a person hides nothing: every failed row of a run, a receipt's
key, input and output, credits written with thousands separators."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from deepline_cli._format import format_credits
from tests.conftest import Result

Run = Callable[..., Result]


def test_credits_are_written_with_thousands_separators() -> None:
    assert format_credits(12345.5) == "12,345.5"
    assert format_credits(1234567.5) == "1,234,567.5"  # never 1.23457e+06
    assert format_credits(1_000_000) == "1,000,000"
    assert (format_credits(0.5), format_credits(0), format_credits(2.25)) == ("0.5", "0", "2.25")


DEAR = """
from deepline_cli import play, tool

@tool("t.dear", credits=12345.5)
def dear(input):
    return {"ok": input["n"]}

@play("dear")
async def dear_play(ctx, input):
    return (await ctx.tools.execute("dear", "t.dear", {"n": 1})).output
"""


def test_runs_show_and_the_verdict_separate_thousands(deepline: Run, write_play: Callable[..., Path]) -> None:
    write_play(DEAR)
    run = deepline("run", "play.py", "--run-id", "D")
    assert run.code == 0, run.stderr
    assert "12,345.5 credits" in run.stderr
    shown = deepline("runs", "show", "D")
    assert shown.code == 0, shown.stderr
    assert "credits   12,345.5" in shown.stdout
    assert "t.dear: live 1  reused 0  failed 0  credits 12,345.5" in shown.stdout
    assert "12345.5" not in shown.stdout
    full = deepline("runs", "show", "D", "--full")
    assert "credits 12,345.5" in full.stdout and "12345.5" not in full.stdout
    listed = deepline("receipts", "inspect", "--run", "D")
    assert "12,345.5" in listed.stdout
    budget = deepline("run", "play.py", "--run-id", "E", "--max-credits", "10000", "--force-refresh")
    assert budget.code == 1
    assert "--max-credits 10,000 would be exceeded" in budget.stderr


MANY_FAILURES = """
from deepline_cli import play

def check(row):
    n = int(row["n"])
    if n % 10 == 0:
        return "ok"
    raise ValueError(f"no lead {n}")

@play("many")
async def many(ctx, input):
    rows = await ctx.map("leads", [{"n": str(n)} for n in range(77)], key="n", concurrency=1,
                         columns={"check": check})
    return {"failed": rows.failed_count}
"""


def test_runs_logs_lists_every_failed_row_not_only_those_the_map_logged(
    deepline: Run, write_play: Callable[..., Path]
) -> None:
    write_play(MANY_FAILURES)
    run = deepline("run", "play.py", "--run-id", "M")
    assert run.code == 0, run.stderr
    failing = [str(n) for n in range(77) if n % 10]
    assert len(failing) == 69
    hint = "(every one: deepline runs logs M --kind row.failed)"
    # the live log keeps the SPEC's wording, and says where the rest are
    assert f"66 additional row failure(s) omitted from map log {hint}" in run.stderr
    assert "every failed row: deepline runs logs M --kind row.failed" in run.stderr

    text = deepline("runs", "logs", "M", "--kind", "row.failed")
    assert text.code == 0, text.stderr
    lines = text.stdout.splitlines()
    assert len(lines) == 69
    for n, line in zip(failing, lines, strict=True):
        assert line.endswith(f"row {n} failed: ValueError: no lead {n} (play.py line 8)"), line

    as_json = deepline("runs", "logs", "M", "--kind", "row.failed", "--json").json_lines()
    assert [line["fields"]["row_key"] for line in as_json] == failing
    assert {line["kind"] for line in as_json} == {"row.failed"}
    # listed from the map's rows, not written lines: no id, rather than the first one's for all
    assert {line["id"] for line in as_json} == {None}
    stored = deepline("runs", "logs", "M", "--json").json_lines()
    assert len({line["id"] for line in stored}) == len(stored) and None not in {line["id"] for line in stored}
    last = {"map": "leads", "row_key": "76", "error": "ValueError: no lead 76 (play.py line 8)"}
    assert as_json[68]["fields"] == last
    one = deepline("runs", "logs", "M", "--kind", "row.failed", "--where", "row_key=55", "--json").json_lines()
    assert [line["message"] for line in one] == ["row 55 failed: ValueError: no lead 55 (play.py line 8)"]

    # every line as logged: the map's first three, and the omitted line with its hint
    logged = deepline("runs", "logs", "M").stdout
    assert logged.count(" failed: ValueError") == 3
    assert f"66 additional row failure(s) omitted from map log {hint}" in logged
    [omitted] = deepline("runs", "logs", "M", "--kind", "row.failed.omitted", "--json").json_lines()
    assert omitted["message"] == "66 additional row failure(s) omitted from map log"  # as the SPEC words it


ECHO = """
from deepline_cli import play, tool

@tool("t.echo", credits=1)
def echo(input):
    return {"echo": input["domain"]}

@play("echo")
async def echo_play(ctx, input):
    token = ctx.secrets.get("ECHO_TOKEN")
    await ctx.tools.execute("small", "t.echo", {"domain": "acme.com", "token": token})
    await ctx.tools.execute("big", "t.echo", {"domain": "big.com", "blob": "x" * 5000})
    return "done"
"""


def test_receipts_inspect_shows_the_key_the_input_and_the_output(
    deepline: Run, write_play: Callable[..., Path]
) -> None:
    write_play(ECHO)
    assert deepline("run", "play.py", "--run-id", "E", "--quiet", ECHO_TOKEN="s3cret-token-value").code == 0
    small, big = sorted(deepline("receipts", "inspect", "--run", "E", "--json").json_lines(), key=lambda r: r["label"])[
        ::-1
    ]
    assert small["input"] == {"domain": "acme.com", "token": "[redacted]"}  # the call's input, the secret hidden
    assert small["output"] == {"echo": "acme.com"}
    assert big["input"] is None and big["output"] == {"echo": "big.com"}  # over 4 KB: not kept
    key = small["key"]

    # the table's key is a prefix to pass back, whole even on a narrow terminal
    table = deepline("receipts", "inspect", "--run", "E", COLUMNS="60", TTY_COMPATIBLE="1", NO_COLOR="1")
    assert table.code == 0, table.stderr
    assert key[:12] in table.stdout and big["key"][:12] in table.stdout
    assert "s3cret-token-value" not in table.stdout
    by_prefix = deepline("receipts", "inspect", key[:12], "--json").json_lines()
    assert [r["key"] for r in by_prefix] == [key]

    whole = deepline("receipts", "inspect", key)  # a whole key: that receipt, whole
    assert whole.code == 0, whole.stderr
    assert f"key          {key}" in whole.stdout
    assert 'input        {"domain":"acme.com","token":"[redacted]"}' in whole.stdout
    assert 'output       {"echo":"acme.com"}' in whole.stdout
    full = deepline("receipts", "inspect", "--run", "E", "--full")
    assert full.stdout.count("key          ") == 2
    assert "input        not kept (larger than 4 KB, or not JSON)" in full.stdout
    assert "s3cret-token-value" not in full.stdout + whole.stdout


def test_show_counts_the_retries_of_calls_an_interruption_abandoned(deepline: Run, store_path: Path) -> None:
    """A call retried once (a 429) and abandoned by Ctrl-C has no row in the calls ledger;
    its retry is kept with the attempt's outcome. `runs show --json` said 0 where the live
    view, `run.finished` and `runs list` said 1."""
    import time

    from deepline_cli import _json
    from deepline_cli.store import open_store
    from deepline_cli.store.records import RunRecord

    store = open_store(str(store_path))
    try:
        now = time.time()
        store.runs.insert_run(RunRecord(
            run_id="R", play="demo", play_ref="/tmp/play.py:demo", input={}, status="running", root_run_id="R",
            created_at=now, updated_at=now,
            stats={"tools": {"p.email": {"live": 0, "retries": 1, "retry_reasons": {"429": 1}}}},
        ))  # fmt: skip
    finally:
        store.close()
    shown = _json.loads(deepline("runs", "show", "R", "--json").stdout)
    assert shown["stats"]["tools"]["p.email"]["retries"] == 1, shown["stats"]
    listed = _json.loads(deepline("runs", "list", "--json").stdout.splitlines()[0])
    assert listed["stats"]["tools"]["p.email"]["retries"] == 1


def test_show_of_a_run_whose_process_died_says_so_and_counts_its_rows_from_the_store(
    deepline: Run, store_path: Path
) -> None:
    """A run SIGKILLed mid-map: `runs show` said `running`, its map "0 succeeded" (the map's
    record is written at its start and end) next to "rows succeeded 240", and the attempt
    `[running]`. It says the holder is gone and counts the map's rows as the store has them."""
    import socket
    import time

    from deepline_cli import _json
    from deepline_cli.store import open_store
    from deepline_cli.store.records import MapRecord, MapRow, RunRecord, Writes

    now = time.time()
    dead = f"{socket.gethostname()}:999999"  # no such process
    store = open_store(str(store_path))
    try:
        store.runs.insert_run(RunRecord(
            run_id="K", play="demo", play_ref="/tmp/play.py:demo", input={}, status="running", root_run_id="K",
            attempt=1, holder=dead, lease_expires_at=now + 60, created_at=now, updated_at=now,
        ))  # fmt: skip
        store.runs.begin_attempt("K", 1, dead, now)
        store.sheets.save_map(MapRecord("K", "accounts", "default/demo/accounts", total=5, status="running", attempt=1))
        rows = [MapRow("K", "accounts", i, i, f"k{i}", "succeeded" if i else "failed", attempt=1) for i in range(3)]
        store.receipts.apply(Writes(map_rows=rows), now)
    finally:
        store.close()
    text = deepline("runs", "show", "K").stdout
    assert "status    running (stale: its process is gone; deepline resume K continues it)" in text, text
    assert "accounts: 5 rows (2 succeeded, 1 failed, 0 duplicate, 0 reused)  [running]" in text, text
    full = deepline("runs", "show", "K", "--full").stdout
    assert "[its process is gone]" in full.split("attempt   #1")[1], full
    shown = _json.loads(deepline("runs", "show", "K", "--json").stdout)
    assert shown["stale"] is True and (shown["maps"][0]["succeeded"], shown["maps"][0]["failed"]) == (2, 1)


def test_runs_show_tells_a_live_process_that_let_its_lease_run_out_from_one_that_is_gone(
    deepline: Run, store_path: Path
) -> None:
    """A process stopped past its lease (Ctrl-Z, a debugger) is alive: `runs show` says it
    let its lease run out, not that it is gone."""
    import time

    from deepline_cli.runtime.run.holders import holder_id
    from deepline_cli.store import open_store
    from deepline_cli.store.records import RunRecord

    now = time.time()
    alive = holder_id()  # this very process: alive, as a stopped one is
    store = open_store(str(store_path))
    try:
        store.runs.insert_run(RunRecord(
            run_id="Z", play="demo", play_ref="/tmp/play.py:demo", input={}, status="running", root_run_id="Z",
            attempt=1, holder=alive, lease_expires_at=now - 5, created_at=now, updated_at=now,
        ))  # fmt: skip
        store.runs.begin_attempt("Z", 1, alive, now)
    finally:
        store.close()
    text = deepline("runs", "show", "Z").stdout
    assert (
        "status    running (stale: its process let its lease run out (stopped, or its machine lost); "
        "deepline resume Z continues it)"
    ) in text, text
    assert "[its process let its lease run out" in deepline("runs", "show", "Z", "--full").stdout


def test_retries_by_cause_add_up_when_an_attempt_was_killed() -> None:
    """Attempt 1 killed (its 24 retries counted by the ledger, their causes kept nowhere),
    attempt 2 ended with 59 retries on 5xx: `runs show --full` said "retries 83 (5xx 59)"."""
    from deepline_cli.ui.run_show import merged_tools

    counted = {"t.search": {"live": 200, "retries": 83}}
    recorded = {"t.search": {"retries": 59, "retry_reasons": {"5xx": 59}}}
    [tool] = merged_tools(counted, recorded).values()
    assert (tool["retries"], tool["retry_reasons"]) == (83, {"5xx": 59, "earlier": 24})


def test_the_same_timer_of_several_child_plays_is_said_once() -> None:
    """A map of 3 child plays each sleeping: "timer 'z' is due at …" was said three times."""
    from deepline_cli.ui.verdict import describe_waiting

    naps = [{"kind": "sleep", "id": "sleep:z", "due_at": 1_800_000_000.0, "run_id": f"r-{n}"} for n in range(3)]
    event = {"kind": "event", "id": "event:go", "event_id": "go", "run_id": "r-9"}
    said = describe_waiting([*naps, event])
    assert said.count("timer 'z'") == 1 and said.count("(3 child plays)") == 1, said
    assert said.endswith("for event 'go' (deepline events send r-9 go)"), said


TOOL_MAP = """
from deepline_cli import play, tool

@tool("t.echo")
def echo(input):
    return input["n"]

@play("echoes")
async def echoes(ctx, input):
    rows = await ctx.map("rows", [{"n": n} for n in range(60)], key="n", columns={
        "v": lambda row, rc: rc.tools.execute("echo", "t.echo", {"n": row["n"]})})
    return {"rows": len(rows), "failed": rows.failed_count}
"""


def test_a_view_that_fails_mid_run_fails_no_row(write_play: Callable[..., Path], store_path: Path) -> None:
    """The NDJSON view's stdout filled up (a full disk) in the middle of a map: its OSError
    rose out of the event each call emits, into the rows, which were kept as failed for
    good (their answers paid), blamed on the play's own line."""
    from deepline_cli.runtime.calls.events import EventBus
    from tests.helpers import run_play

    heard: list[str] = []

    def full_disk(event) -> None:
        heard.append(event.event)
        if len(heard) > 20:
            raise OSError(28, "No space left on device")

    play = write_play(TOOL_MAP)
    result = run_play(play, store_path, bus=EventBus([full_disk], per_call=True))
    assert (result.status, result.output) == ("completed", {"rows": 60, "failed": 0}), result.error


def test_an_ndjson_line_that_cannot_be_written_stops_the_run_resumably() -> None:
    """The --json view swallowed by the event bus (its error not an OSError): every later
    event was lost, run.finished too, and the process exited 0."""
    import io

    from deepline_cli.runtime.calls.events import Event
    from deepline_cli.ui.ndjson import NdjsonView

    class Refusing(io.StringIO):
        def write(self, text: str) -> int:
            raise TypeError("cannot serialise this")

    stopped: list[bool] = []
    view = NdjsonView(Refusing(), on_closed=lambda: stopped.append(True))
    view.handle(Event("log", "r-1", 0.0, {"message": "hello"}))
    assert stopped == [True] and view.closed


def test_a_long_table_is_written_line_by_line_with_every_row(capsys) -> None:
    """`receipts inspect --run` of a 200,000-call run: rich laid the whole table out first,
    two minutes and 2.3 GB before the first line."""
    import time

    from deepline_cli.cli.tables import print_table

    rows = [(f"k{n:06d}", "completed", "x" * (n % 90), None) for n in range(20_000)]
    started = time.process_time()
    print_table(["key", "status", "label", "credits"], rows, empty="none", whole=["key"])
    spent = time.process_time() - started
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + len(rows) and lines[1].startswith("k000000  completed")
    assert max(len(line) for line in lines[1:]) <= 7 + 2 + 9 + 2 + 60  # a long cell cut at 60 (credits blank)
    assert spent < 5, spent  # rich took ~12 s for as many (a bound far from the cost it had)


@pytest.mark.process
def test_a_json_reader_that_stops_reading_does_not_stop_the_run(spawn, write_play, store_path) -> None:
    """`deepline run --json | slow-consumer`: once the pipe was full, writing an event blocked
    the event loop, so the run stopped making calls and heartbeating its leases (another
    process could take them over). The events wait for the reader; the run goes on."""
    import json
    import sqlite3
    import time

    write_play(
        """
        from deepline_cli import play, tool

        @tool("t.n")
        def n(input):
            return input["n"]

        @play("many")
        async def many(ctx, input):
            rows = await ctx.map("m", [{"n": i} for i in range(3000)], key="n",
                                 columns={"v": lambda row, rc: rc.tools.execute("n", "t.n", {"n": row["n"]})})
            return len(rows)
        """
    )
    proc = spawn("run", "play.py", "--run-id", "j1", "--json")  # its stdout not read until the run is done
    deadline, status = time.monotonic() + 90, None
    while time.monotonic() < deadline and status != "completed":
        time.sleep(0.2)
        try:
            with sqlite3.connect(store_path) as db:
                found = db.execute("SELECT status FROM runs WHERE run_id = 'j1'").fetchone()
        except sqlite3.OperationalError:  # the store is being made
            continue
        status = found[0] if found else None
    assert status == "completed"  # 3,000 tool.call events (~600 KB) waited in the process for the reader
    out, err = proc.communicate(timeout=60)
    lines = [json.loads(line) for line in out.splitlines()]
    assert proc.returncode == 0, err
    assert sum(1 for e in lines if e["event"] == "tool.call") == 3000
    assert lines[-1]["event"] == "run.finished" and lines[-1]["output"] == 3000
