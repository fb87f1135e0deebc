"""Plays that run themselves: schedules fired by `deepline worker --play FILE`, one run per
tick however many workers fire it, and webhooks received by `deepline serve`, one run per
delivery however often it is sent. Real processes, a real HTTP client."""

from __future__ import annotations

import calendar
import itertools
import json
import re
import signal
import socket
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepline_cli.runtime.run.triggers import Schedule, tick_run_ids
from deepline_cli.server.webhooks import sign
from deepline_cli.store import open_store
from tests.faults import finish, kill, start
from tests.helpers import wait_until

TICK_PLAY = """
from deepline_cli import play

@play("tick", schedule="* * * * * *", schedule_input={"log": "LOG"})
async def tick(ctx, input):
    with open(input["log"], "a") as log:
        log.write(ctx.run.id + "\\n")
    return {"ok": True}
"""

HOOK_PLAY = """
from deepline_cli import play

@play("inbound", input={"email": str}, webhook_secret="HOOK_SECRET")
async def inbound(ctx, input):
    return {"lead": input["email"].lower()}
"""
SECRET = "hook-secret-for-tests"


def runs_of(store: str, play: str) -> list:
    db = open_store(store)
    try:
        return db.runs.list_runs(play=play, limit=10_000)
    finally:
        db.close()


# --- schedules -------------------------------------------------------------------------------


@pytest.mark.process
@pytest.mark.postgres
def test_two_workers_fire_one_run_per_tick(tmp_path: Path, cli_env: dict[str, str], pg_url: str) -> None:
    log = tmp_path / "ran.log"
    (tmp_path / "play.py").write_text(TICK_PLAY.replace("LOG", str(log)))
    env = {**cli_env, "DEEPLINE_STORE": pg_url}
    workers = [start(["worker", "--play", "play.py"], env, tmp_path) for _ in range(2)]
    try:
        wait_until(lambda: len(set(log.read_text().split())) >= 12 if log.exists() else False,
                   what="12 ticks run", timeout=60)  # fmt: skip
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        outcomes = [finish(worker, timeout=30) for worker in workers]
        for worker in workers:
            kill(worker)
    for code, _, err in outcomes:
        assert code == 0, err
    ran = Counter(log.read_text().split())
    assert all(count == 1 for count in ran.values()), ran  # no tick's play ran twice
    runs = [r for r in runs_of(pg_url, "tick") if r.status == "completed"]
    assert {r.run_id for r in runs} == set(ran)
    assert all(r.attempt == 1 and r.options["trigger"].startswith("schedule ") for r in runs)
    # The ticks are consecutive seconds: none was skipped while both workers ran.
    stamps = sorted(calendar.timegm(time.strptime(r.run_id[-16:], "%Y%m%dT%H%M%SZ")) for r in runs)
    assert len(stamps) >= 12 and stamps[-1] - stamps[0] == len(stamps) - 1, stamps
    # Both workers fired: each queued ticks (whoever inserted first), never the same one.
    queued = [set(re.findall(r"queued run (\S+) for", err)) for _, _, err in outcomes]
    assert all(queued), outcomes
    assert not queued[0] & queued[1] and queued[0] | queued[1] == set(ran)


@pytest.mark.process
def test_a_worker_back_after_missed_ticks_fires_the_latest_once(tmp_path: Path, cli_env: dict[str, str]) -> None:
    log = tmp_path / "ran.log"
    (tmp_path / "play.py").write_text(TICK_PLAY.replace("LOG", str(log)).replace("* * * * * *", "* * * * * */2"))
    worker = start(["worker", "--play", "play.py"], cli_env, tmp_path)
    try:
        wait_until(lambda: log.exists() and len(log.read_text().split()) >= 2, what="2 ticks run", timeout=30)
        worker.send_signal(signal.SIGTERM)
        code, _, err = finish(worker, timeout=30)
        assert code == 0, err
    finally:
        kill(worker)
    stopped = time.time()
    before = {r.run_id for r in runs_of(cli_env["DEEPLINE_STORE"], "tick")}
    schedule = Schedule("* * * * * */2", {})
    time.sleep(max(0.0, schedule.next_tick(schedule.next_tick(stopped)) - time.time()) + 0.3)  # two ticks missed
    returned = time.time()
    again = start(["worker", "--play", "play.py", "--once"], cli_env, tmp_path)
    code, _, err = finish(again, timeout=30)
    assert code == 0, err
    # The worker fires the latest tick as it looks: at least the one when it came back, later
    # if its start took past the next tick; never a tick missed while no worker ran.
    latest = schedule.last_tick(returned)
    missed = tick_run_ids("tick", schedule.next_tick(stopped))[0]
    fired = {r.run_id for r in runs_of(cli_env["DEEPLINE_STORE"], "tick")} - before
    assert len(fired) == 1 and missed not in fired, (missed, sorted(fired))
    (run_id,) = fired
    assert calendar.timegm(time.strptime(run_id[-16:], "%Y%m%dT%H%M%SZ")) >= latest, (run_id, latest)
    assert Counter(log.read_text().split())[run_id] == 1
    assert "1 started, 1 completed" in err


def test_a_new_schedule_first_runs_at_its_next_tick_not_at_once(deepline, write_play, tmp_path: Path) -> None:
    """A nightly play deployed in the afternoon: its 06:00 tick of today was missed by no
    worker (none had it yet), so the first worker does not start a paid run at once. Once
    the schedule has run, a tick missed while no worker ran is caught up."""
    cron = f"{(time.gmtime().tm_min + 30) % 60} * * * *"  # its last tick was half an hour ago
    write_play(TICK_PLAY.replace("* * * * * *", cron).replace("LOG", str(tmp_path / "ran.log")))
    first = deepline("worker", "--play", "play.py", "--once")
    assert first.code == 0 and "0 started" in first.stderr, first.stderr
    assert deepline("runs", "list", "--json").stdout == ""
    earlier = tick_run_ids("tick", Schedule(cron, {}).last_tick(time.time() - 3600))[0]
    log = str(tmp_path / "ran.log")
    assert deepline("run", "play.py", "--run-id", earlier, "--set", f"log={log}", "--quiet").code == 0  # it ran
    again = deepline("worker", "--play", "play.py", "--once")
    assert again.code == 0 and "1 started, 1 completed" in again.stderr, again.stderr


def test_a_schedule_that_is_not_cron_fails_when_the_play_loads(deepline, write_play) -> None:
    write_play(TICK_PLAY.replace("* * * * * *", "every morning"))
    result = deepline("worker", "--play", "play.py", "--once")
    assert result.code == 2 and "is not a cron expression" in result.stderr, result.stderr


def test_schedules_list_shows_the_next_tick_and_the_last_run(deepline, write_play, tmp_path: Path) -> None:
    write_play(TICK_PLAY.replace("LOG", str(tmp_path / "ran.log")).replace("* * * * * *", "0 6 * * *"))
    before = deepline("schedules", "list", "play.py", "--json")
    assert before.code == 0, before.stderr
    [row] = before.json_lines()
    assert (row["play"], row["schedule"], row["last_run_id"]) == ("tick", "0 6 * * *", None)
    assert time.gmtime(row["next_tick"]).tm_hour == 6 and row["next_tick"] > time.time()
    if time.time() - Schedule("0 6 * * *", {}).last_tick(time.time()) > 120:  # (not in its first minute)
        assert deepline("worker", "--play", "play.py", "--once").code == 0  # a new schedule: nothing missed
        assert deepline("schedules", "list", "play.py", "--json").json_lines()[0]["last_run_id"] is None
    earlier = tick_run_ids("tick", Schedule("0 6 * * *", {}).last_tick(time.time() - 86_400))[0]
    log = str(tmp_path / "ran.log")
    assert deepline("run", "play.py", "--run-id", earlier, "--set", f"log={log}", "--quiet").code == 0  # it ran once
    assert deepline("worker", "--play", "play.py", "--once").code == 0  # today's (or yesterday's) 06:00, once
    [after] = deepline("schedules", "list", "play.py", "--json").json_lines()
    assert after["last_run_id"].startswith("sched-tick-") and after["last_status"] == "completed"
    listed = deepline("runs", "list")
    assert "schedule " in listed.stdout and "06:00:00 UTC" in listed.stdout


ACCOUNTS_PLAY = """
from deepline_cli import play

@play("refresh", input={"segment": str})
async def refresh(ctx, input):
    return {"segment": input["segment"]}
"""

SCHEDULES_TOML = """
[schedules.enterprise]
play = "refresh.py"
cron = "* * * * * *"
timezone = "Europe/Paris"
input = { segment = "enterprise" }

[schedules.smb]
play = "refresh.py"
cron = "30 7 * * 1-5"
input = { segment = "smb" }
catch_up = "none"
"""


def test_schedules_in_deepline_toml_give_one_play_two_inputs(
    deepline, write_play, tmp_path: Path, store_path: Path
) -> None:
    write_play(ACCOUNTS_PLAY, "refresh.py")
    (tmp_path / "deepline.toml").write_text(SCHEDULES_TOML)
    listed = deepline("schedules", "list", "deepline.toml", "--json")
    assert listed.code == 0, listed.stderr
    rows = {row["schedule_id"]: row for row in listed.json_lines()}
    assert set(rows) == {"refresh.enterprise", "refresh.smb"}
    assert (rows["refresh.enterprise"]["timezone"], rows["refresh.smb"]["catch_up"]) == ("Europe/Paris", "none")
    assert deepline("worker", "--play", "deepline.toml", "--once").code == 0
    runs = runs_of(str(store_path), "refresh")
    # smb does not catch up; enterprise fires its latest tick (a second ago, in Paris) once, with its own input
    [run] = runs
    assert run.run_id.startswith("sched-refresh.enterprise-") and run.status == "completed", run
    assert run.input == {"segment": "enterprise"} and run.output == {"segment": "enterprise"}
    [after] = [
        r
        for r in deepline("schedules", "list", "deepline.toml", "--json").json_lines()
        if r["schedule_id"] == "refresh.enterprise"
    ]
    assert after["last_run_id"] == run.run_id


@pytest.mark.process
def test_every_schedule_of_one_play_fires_each_tick(tmp_path: Path, cli_env: dict[str, str]) -> None:
    (tmp_path / "refresh.py").write_text(ACCOUNTS_PLAY)
    every_second = SCHEDULES_TOML.replace("0 6 * * *", "* * * * * *").replace("30 7 * * 1-5", "* * * * * *")
    (tmp_path / "deepline.toml").write_text(every_second)
    worker = start(["worker", "--play", "deepline.toml"], cli_env, tmp_path)

    def ticks() -> Counter[str]:
        runs = runs_of(cli_env["DEEPLINE_STORE"], "refresh")
        return Counter(r.input["segment"] for r in runs if r.status == "completed")

    try:
        wait_until(lambda: min(ticks()["enterprise"], ticks()["smb"]) >= 3, what="3 ticks of each", timeout=30)
    finally:
        worker.send_signal(signal.SIGTERM)
        code, _, err = finish(worker, timeout=30)
        kill(worker)
    assert code == 0, err
    ids = [r.run_id for r in runs_of(cli_env["DEEPLINE_STORE"], "refresh")]
    assert all(i.startswith(("sched-refresh.enterprise-", "sched-refresh.smb-")) for i in ids), ids


@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ('[schedules.a]\nplay = "refresh.py"\ninput = { segment = "x" }\n', "needs cron"),
        ('[schedules.a]\nplay = "refresh.py"\ncron = "0 6 * * *"\ninput = { segment = 3 }\n', "segment"),
        ('[schedules.a]\nplay = "refresh.py"\ncron = "0 6 * * *"\nevery = "day"\n', "unknown key 'every'"),
        ('[schedules.a]\nplay = "nowhere.py"\ncron = "0 6 * * *"\n', "does not exist"),
        ('[schedules.a]\nplay = "refresh.py"\ncron = "at six"\n', "is not a cron expression"),
        ("[schedules]\n", "declares no schedule"),
    ],
)
def test_a_bad_schedule_in_deepline_toml_is_one_sentence(
    deepline, write_play, tmp_path: Path, toml: str, said: str
) -> None:
    write_play(ACCOUNTS_PLAY, "refresh.py")
    (tmp_path / "deepline.toml").write_text(toml)
    for args in (("schedules", "list", "deepline.toml"), ("worker", "--play", "deepline.toml", "--once")):
        result = deepline(*args)
        assert result.code == 2 and said in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


NIGHTLY_PLAY = """
from deepline_cli import play, tool

@tool("crm.account")
def account(input):
    return {"domain": input["domain"], "tier": "gold"}

@play("nightly", schedule="* * * * * *", schedule_input={"domains": ["a.com", "b.com", "c.com"]})
async def nightly(ctx, input):
    rows = await ctx.map("accounts", [{"domain": d} for d in input["domains"]], key="domain", columns={
        "account": lambda row, rc: rc.tools.execute("acct", "crm.account", {"domain": row["domain"]}),
    })
    return {"rows": len(rows)}
"""


def test_a_schedules_relative_csv_is_read_from_the_plays_folder_whichever_worker_fires_it(
    deepline, tmp_path: Path, store_path: Path
) -> None:
    """`schedule_input={"csv": "accounts.csv"}` beside the play: a worker started one folder
    up (`deepline worker --play s3/refresh.py`) queued the tick with its own folder, and the
    run failed for a CSV that is not there (a resume could not mend it)."""
    folder = tmp_path / "s3"
    folder.mkdir()
    (folder / "accounts.csv").write_text("domain\na.com\nb.com\n")
    listed = 'schedule_input={"domains": ["a.com", "b.com", "c.com"]}'
    play = NIGHTLY_PLAY.replace(listed, 'schedule_input={"csv": "accounts.csv"}')
    play = play.replace('[{"domain": d} for d in input["domains"]]', 'ctx.csv(input["csv"])')
    (folder / "refresh.py").write_text(play)
    fired = deepline("worker", "--play", "s3/refresh.py", "--once", cwd=tmp_path)
    assert fired.code == 0, fired.stderr
    (run,) = runs_of(str(store_path), "nightly")
    assert (run.status, run.output) == ("completed", {"rows": 2}), run.error


def test_a_toml_schedules_relative_paths_are_the_tomls_folders(deepline, tmp_path: Path, store_path: Path) -> None:
    """`play = "plays/refresh.py"` and `input = { csv = "data/accounts.csv" }`, both written
    beside deepline.toml: the input's path was read from the play's folder."""
    (tmp_path / "plays").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "accounts.csv").write_text("domain\na.com\nbb.com\n")
    play = NIGHTLY_PLAY.replace('schedule="* * * * * *", schedule_input={"domains": ["a.com", "b.com", "c.com"]}', "")
    (tmp_path / "plays" / "refresh.py").write_text(
        play.replace('[{"domain": d} for d in input["domains"]]', 'ctx.csv(input["csv"])')
    )
    (tmp_path / "deepline.toml").write_text(
        '[schedules.nightly]\nplay = "plays/refresh.py"\ncron = "* * * * * *"\ninput = { csv = "data/accounts.csv" }\n'
    )
    fired = deepline("worker", "--play", "deepline.toml", "--once")
    assert fired.code == 0, fired.stderr
    (run,) = runs_of(str(store_path), "nightly")
    assert (run.status, run.output) == ("completed", {"rows": 2}), run.error


def test_a_scheduled_run_missing_an_input_field_says_to_fix_the_schedule(deepline, write_play) -> None:
    """A tick whose input lacks `csv`: it said to give it with --csv FILE, which a schedule
    has not, and named the play's line twice."""
    write_play(NIGHTLY_PLAY.replace('[{"domain": d} for d in input["domains"]]', 'ctx.csv(input["csv"])'))
    fired = deepline("worker", "--play", "play.py", "--once")
    failed = [line for line in fired.stderr.splitlines() if "failed:" in line]
    assert failed and "give it in the schedule's input" in failed[0] and "--csv" not in failed[0], fired.stderr
    assert failed[0].count("play.py line") == 1, failed[0]
    assert "Next: fix the schedule's input" in fired.stderr, fired.stderr


def test_a_scheduled_run_says_it_paid_only_for_new_rows(deepline, write_play, tmp_path: Path) -> None:
    write_play(NIGHTLY_PLAY)
    first = deepline("worker", "--play", "play.py", "--once")
    assert first.code == 0, first.stderr
    assert "Scheduled (" in first.stderr and "3 rows computed now (none reused from earlier runs)" in first.stderr, (
        first.stderr
    )
    schedule = Schedule("* * * * * *", {})
    time.sleep(max(0.0, schedule.next_tick(time.time()) - time.time()) + 0.05)  # the next tick: a new run
    again = deepline("worker", "--play", "play.py", "--once")
    assert again.code == 0, again.stderr
    said = [line for line in again.stderr.splitlines() if "Scheduled (" in line]
    assert (
        len(said) == 1 and "paid only for new or stale rows: 0 computed now, 3 reused from earlier runs" in said[0]
    ), said
    # Its HTML report and `runs list` say what started it.
    run_id = re.search(r"queued run (sched-nightly-\S+)", again.stderr).group(1)
    out = tmp_path / "report.html"
    assert deepline("runs", "report", run_id, "--html", "--out", str(out)).code == 0
    tick = run_id.removeprefix("sched-nightly-")
    when = f"{tick[:4]}-{tick[4:6]}-{tick[6:8]} {tick[9:11]}:{tick[11:13]}:{tick[13:15]} UTC"
    assert f'<span id="trigger">started by schedule {when}</span>' in out.read_text()


# --- webhooks --------------------------------------------------------------------------------


def _serve(source: str, cli_env: dict[str, str], tmp_path: Path) -> tuple[Any, str]:
    """`deepline serve --run-here` of one play on a free port: the process and its URL, once
    it answers."""
    (tmp_path / "inbound.py").write_text(source)
    (tmp_path / ".env").write_text(f"HOOK_SECRET={SECRET}\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = start(["serve", "inbound.py", "--run-here", "--port", str(port)], cli_env, tmp_path)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if server.poll() is not None:
            raise AssertionError(finish(server)[2])
        return _healthy(url)

    try:
        wait_until(up, what="deepline serve to answer", timeout=30, every=0.1)
    except BaseException:
        kill(server)
        raise
    return server, url


@pytest.fixture
def served(tmp_path: Path, cli_env: dict[str, str]) -> Iterator[str]:
    server, url = _serve(HOOK_PLAY, cli_env, tmp_path)
    try:
        yield url
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            finish(server, timeout=30)
        finally:
            kill(server)


def deliver(url: str, body: bytes, delivery: str = "d-1", *, at: float | None = None, **headers: str) -> httpx.Response:
    stamp = str(int(time.time() if at is None else at))
    sent = {
        "content-type": "application/json",
        "webhook-id": delivery,
        "webhook-timestamp": stamp,
        "webhook-signature": sign(SECRET.encode(), delivery, stamp, body),
        **headers,
    }
    return httpx.post(f"{url}/hooks/inbound", content=body, headers=sent, timeout=30)


@pytest.mark.process
def test_a_signed_delivery_runs_once_however_often_it_is_sent(served: str, cli_env: dict[str, str]) -> None:
    body = json.dumps({"email": "Ada@Example.com"}).encode()
    first = deliver(served, body)
    assert first.status_code == 202, first.text
    run_id = first.json()["run_id"]
    again = deliver(served, body)  # the sender retries the same delivery
    assert again.status_code == 202 and again.json() == {"run_id": run_id, "queued": False}

    def completed() -> dict | None:
        shown = httpx.get(f"{served}/runs/{run_id}").json()
        return shown if shown["status"] == "completed" else None

    shown = wait_until(completed, what="the delivered run to complete", timeout=30, every=0.1)
    assert shown["output"] == {"lead": "ada@example.com"} and shown["trigger"] == "webhook d-1"
    assert [r.run_id for r in runs_of(cli_env["DEEPLINE_STORE"], "inbound")] == [run_id]
    assert httpx.get(f"{served}/runs/r-unknown").status_code == 404


@pytest.mark.process
def test_bad_deliveries_get_4xx_with_one_sentence_and_queue_nothing(served: str, cli_env: dict[str, str]) -> None:
    body = json.dumps({"email": "ada@example.com"}).encode()
    cases = {
        "bad signature": deliver(served, body, **{"webhook-signature": "v1,bm90IHRoZSBzaWduYXR1cmU="}),
        "replayed": deliver(served, body, at=time.time() - 3600),
        "10 MB body": deliver(served, b'{"email": "' + b"a" * (10 << 20) + b'"}'),
        "unknown play": httpx.post(f"{served}/hooks/nope", content=body, headers={"content-type": "application/json"}),
        "not JSON": deliver(served, body, **{"content-type": "text/plain"}),
        "no delivery id": httpx.post(f"{served}/hooks/inbound", content=body,
                                     headers={"content-type": "application/json"}),
        "input refused": deliver(served, json.dumps({"email": 5}).encode(), "d-2"),
        "field missing": deliver(served, json.dumps({"name": "Ada"}).encode(), "d-3"),
    }  # fmt: skip
    codes = {name: response.status_code for name, response in cases.items()}
    assert codes == {
        "bad signature": 401, "replayed": 401, "10 MB body": 413, "unknown play": 404, "not JSON": 415,
        "no delivery id": 400, "input refused": 422, "field missing": 422,
    }  # fmt: skip
    for name, response in cases.items():
        message = response.json()["error"]
        assert message.endswith(".") and "\n" not in message, (name, message)
        assert "--" not in message, (name, message)  # a sender has no command line: no flag to give
    assert cases["field missing"].json()["error"] == "The delivery's body field 'email' is required.", cases
    assert runs_of(cli_env["DEEPLINE_STORE"], "inbound") == []


def test_serve_refuses_a_play_without_a_webhook_secret(deepline, write_play) -> None:
    write_play(HOOK_PLAY.replace(', webhook_secret="HOOK_SECRET"', ""))
    result = deepline("serve", "play.py")
    assert result.code == 2 and "declares no webhook_secret" in result.stderr, result.stderr
    write_play(HOOK_PLAY)
    unset = deepline("serve", "play.py")
    assert unset.code == 2 and "needs the secret HOOK_SECRET" in unset.stderr, unset.stderr


def test_a_schedules_runs_are_told_from_a_longer_names() -> None:
    from deepline_cli.runtime.run.triggers import is_tick_of

    tick = tick_run_ids("daily", 1_780_000_000)[0]
    assert is_tick_of(tick, "daily") and not is_tick_of(tick_run_ids("daily-eu", 1_780_000_000)[0], "daily")
    assert not is_tick_of("sched-daily-by-hand", "daily")


def test_names_alike_up_to_their_cut_or_their_unsafe_characters_get_run_ids_of_their_own() -> None:
    """Run ids are made of the schedule's (or play's) name, cut to 60 characters: two schedules
    of a play with a long name (`<play>.enterprise-emea` and `<play>.enterprise-east`) had one
    run id per tick, and the second was taken for queued already and never ran; two webhook
    plays alike, one delivery each. Names that are their own slug keep their run ids."""
    from deepline_cli.runtime.run.triggers import delivery_run_ids, is_delivery_run, is_tick_of

    long = "nightly-firmographics-refresh-for-the-whole-crm"
    emea, east = f"{long}.enterprise-emea", f"{long}.enterprise-east"
    east_tick = tick_run_ids(east, 1_780_000_000)[0]
    assert tick_run_ids(emea, 1_780_000_000)[0] != east_tick
    assert is_tick_of(east_tick, east) and not is_tick_of(east_tick, emea)
    hooks = [f"inbound-lead-enrichment-from-hubspot-form-submissions-for-region-{r}" for r in ("emea", "apac")]
    assert delivery_run_ids(hooks[0], "msg_1")[0] != delivery_run_ids(hooks[1], "msg_1")[0]
    assert is_delivery_run(delivery_run_ids(hooks[1], "msg_1")[0], hooks[1])
    assert tick_run_ids("daily eu", 1)[0] != tick_run_ids("daily-eu", 1)[0]  # made alike by the characters taken out
    assert tick_run_ids("daily", 1_780_000_000)[0] == "sched-daily-20260528T202640Z"  # as before


ALIKE_SCHEDULES = """
from deepline_cli import play

@play("nightly-refresh", schedule="0 6 * * *")
async def dashed(ctx, input):
    return 1

@play("nightly refresh", schedule="0 6 * * *")
async def spaced(ctx, input):
    return 2
"""


def test_ticks_and_deliveries_an_earlier_deepline_named_are_still_the_schedules_and_plays(tmp_path: Path) -> None:
    """Run ids of names that are not their own slug (a space, over 60 characters) changed when
    they were given a digest: ticks and deliveries queued under the earlier id must stay the
    schedule's and play's (catch-up after an upgrade, `schedules list`, `GET /runs/ID`), and
    a tick or a delivery sent again is not queued a second time under the new id."""
    from deepline_cli.runtime.calls.events import EventBus
    from deepline_cli.runtime.run.options import RunOptions
    from deepline_cli.runtime.run.runner import Runner
    from deepline_cli.runtime.run.schedules import Ticks, scheduled_plays
    from deepline_cli.runtime.run.triggers import delivery_run_ids, is_delivery_run, is_tick_of, tick_run_ids
    from deepline_cli.server.webhooks import _enqueue

    (tmp_path / "refresh.py").write_text(ALIKE_SCHEDULES)
    (play,) = [p for p in scheduled_plays(str(tmp_path / "refresh.py")) if p.name == "nightly refresh"]
    store = str(tmp_path / "deepline.db")
    six = (1_750_000_000 // 86_400) * 86_400 + 6 * 3600.0
    new_id, earlier_id = tick_run_ids("nightly refresh", six - 86_400)
    assert earlier_id == "sched-nightly-refresh-" + new_id[-16:] and is_tick_of(earlier_id, "nightly refresh")
    runner = Runner(RunOptions(store=store), EventBus([]))
    try:  # yesterday's tick, queued by an earlier deepline
        assert runner.enqueue_new(play, {}, earlier_id, "schedule")
    finally:
        runner.close()
    ticks = Ticks(store, [play], lambda said: None, lambda: None)
    ticks.catch_up(six + 2 * 3600)  # down at 06:00 for the upgrade: today's tick is caught up
    ticks.catch_up(six - 86_400 + 60)  # yesterday's again: it ran, under its earlier id
    db = open_store(store)
    try:
        ids = sorted(r.run_id for r in db.runs.list_runs(limit=100))
    finally:
        db.close()
    assert ids == sorted([earlier_id, tick_run_ids("nightly refresh", six)[0]]), ids
    hook_new, hook_earlier = delivery_run_ids("Lead Emails", "msg_1")
    assert is_delivery_run(hook_earlier, "Lead Emails") and is_delivery_run(hook_new, "Lead Emails")
    assert _enqueue(store, play, {}, [hook_new, hook_earlier], "msg_1") == (hook_new, True)
    assert _enqueue(store, play, {}, [hook_new, hook_earlier], "msg_1") == (hook_new, False)
    assert _enqueue(store, play, {}, ["hook-x-new", hook_new], "msg_1") == (hook_new, False)  # queued before


def test_a_schedule_whose_earlier_slug_is_another_schedules_slug_still_fires(tmp_path: Path) -> None:
    """`nightly refresh`'s earlier id is `nightly-refresh`'s id now: both ticks due at 06:00,
    one was taken for the other's, queued already, and never ran."""
    from deepline_cli.runtime.run.schedules import Ticks, scheduled_plays
    from deepline_cli.runtime.run.triggers import tick_run_ids

    (tmp_path / "two.py").write_text(ALIKE_SCHEDULES)
    plays = scheduled_plays(str(tmp_path / "two.py"))
    assert sorted(p.name for p in plays) == ["nightly refresh", "nightly-refresh"]
    store = str(tmp_path / "deepline.db")
    six = (1_750_000_000 // 86_400) * 86_400 + 6 * 3600.0
    Ticks(store, plays, lambda said: None, lambda: None).catch_up(six + 10)  # both ticks are due at 06:00
    db = open_store(store)
    try:
        runs = {r.run_id: r.play for r in db.runs.list_runs(limit=100)}
    finally:
        db.close()
    assert sorted(runs.values()) == ["nightly refresh", "nightly-refresh"], (
        f"one schedule's tick was taken for queued already, under the other's id: {runs}; "
        f"ids {tick_run_ids('nightly refresh', six)} vs {tick_run_ids('nightly-refresh', six)}"
    )


def test_a_delivery_to_a_play_whose_earlier_slug_is_another_plays_slug_is_queued(tmp_path: Path) -> None:
    """One event (its delivery id) sent to both plays' endpoints: the second was answered with
    the other play's run."""
    from deepline_cli.runtime.run.schedules import scheduled_plays
    from deepline_cli.runtime.run.triggers import delivery_run_ids
    from deepline_cli.server.webhooks import _enqueue

    (tmp_path / "two.py").write_text(ALIKE_SCHEDULES)
    dashed, spaced = sorted(scheduled_plays(str(tmp_path / "two.py")), key=lambda p: p.name != "nightly-refresh")
    store = str(tmp_path / "deepline.db")
    # One event (the same delivery id) sent to both plays' endpoints.
    assert _enqueue(store, dashed, {}, delivery_run_ids(dashed.name, "evt_1"), "evt_1")[1] is True
    run_id, queued = _enqueue(store, spaced, {}, delivery_run_ids(spaced.name, "evt_1"), "evt_1")
    assert queued, f"the delivery to {spaced.name!r} was answered with {dashed.name!r}'s run {run_id} and never ran"


def test_a_schedule_that_never_ran_does_not_catch_up_from_another_schedules_ticks(tmp_path: Path) -> None:
    """`_has_run` takes the other schedule's ticks for its own: a schedule deployed in the
    afternoon fires at once (catch-up), not at its next tick."""
    from deepline_cli.runtime.calls.events import EventBus
    from deepline_cli.runtime.run.options import RunOptions
    from deepline_cli.runtime.run.runner import Runner
    from deepline_cli.runtime.run.schedules import Ticks, scheduled_plays
    from deepline_cli.runtime.run.triggers import tick_run_ids

    (tmp_path / "two.py").write_text(ALIKE_SCHEDULES)
    dashed, spaced = sorted(scheduled_plays(str(tmp_path / "two.py")), key=lambda p: p.name != "nightly-refresh")
    store = str(tmp_path / "deepline.db")
    six = (1_750_000_000 // 86_400) * 86_400 + 6 * 3600.0
    runner = Runner(RunOptions(store=store), EventBus([]))
    try:  # the dashed schedule ran yesterday
        assert runner.enqueue_new(dashed, {}, tick_run_ids(dashed.name, six - 86_400)[0], "schedule")
    finally:
        runner.close()
    Ticks(store, [spaced], lambda said: None, lambda: None).catch_up(six + 8 * 3600)  # spaced: new, deployed at 14:00
    db = open_store(store)
    try:
        runs = [r.play for r in db.runs.list_runs(limit=100)]
    finally:
        db.close()
    assert runs.count("nightly refresh") == 0, "a schedule that never ran caught up a tick 8 hours late"


def test_a_schedule_input_the_plays_schema_refuses_fails_when_the_play_loads(deepline, write_play) -> None:
    write_play(
        ACCOUNTS_PLAY.replace(
            '@play("refresh",', '@play("refresh", schedule="0 6 * * *", schedule_input={"segment": 3},'
        )
    )
    result = deepline("worker", "--play", "play.py", "--once")
    assert result.code == 2 and "Play 'refresh': schedule_input:" in result.stderr and "segment" in result.stderr, (
        result.stderr
    )


def test_the_status_of_a_run_on_a_store_that_cannot_be_opened_is_one_sentence(tmp_path: Path) -> None:
    """`GET /runs/ID` when the store cannot be opened (a database down, a wrong path): a 503
    with the reason in one sentence, as a delivery gets, not a 500 and a traceback."""
    import asyncio

    from deepline_cli.runtime.run.play import PlayDef
    from deepline_cli.runtime.run.triggers import delivery_run_ids
    from deepline_cli.server.webhooks import Hook, create_app

    served = PlayDef("inbound", "", lambda ctx, input: None, file=str(tmp_path / "play.py"))
    app = create_app({"inbound": Hook(served, b"s")}, str(tmp_path))  # a directory: no store opens there

    async def ask() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://deepline") as client:
            return await client.get(f"/runs/{delivery_run_ids('inbound', 'd-1')[0]}")

    answer = asyncio.run(ask())
    assert answer.status_code == 503, answer.text
    assert answer.json() == {"error": f"Cannot open the store {tmp_path}: it is a directory; give a file path."}


def test_a_file_of_several_plays_gives_the_schedules_of_those_that_have_one(deepline, write_play) -> None:
    """An hourly and a daily play beside a helper play in one file: `schedules list` and a
    worker given the file take both schedules (a module may hold several plays)."""
    write_play(
        """
        from deepline_cli import play

        @play("hourly-a", schedule="0 * * * *")
        async def a(ctx, input):
            return 1

        @play("helper-b")
        async def b(ctx, input):
            return 2

        @play("daily-c", schedule="0 6 * * *")
        async def c(ctx, input):
            return 3
        """,
        "plays.py",
    )
    listed = deepline("schedules", "list", "plays.py", "--json")
    assert listed.code == 0, listed.stderr
    assert sorted(row["play"] for row in listed.json_lines()) == ["daily-c", "hourly-a"]
    picked = deepline("schedules", "list", "plays.py:c", "--json")
    assert [row["play"] for row in picked.json_lines()] == ["daily-c"]
    assert deepline("worker", "--play", "plays.py", "--once").code == 0
    none = deepline("schedules", "list", "plays.py:b")
    assert none.code == 0 and "daily-c" not in none.stdout


@pytest.mark.parametrize(
    ("cron", "zone", "night"),
    [("30 2 * * *", "Europe/Paris", "2026-10-25"), ("30 1 * * *", "America/New_York", "2026-11-01")],
)
def test_a_daily_schedule_fires_once_on_the_night_clocks_go_back(cron: str, zone: str, night: str) -> None:
    """The wall-clock time comes twice that night: a daily schedule fires at the first, as
    cron does, not again an hour later (a second paid run of the nightly refresh)."""
    import datetime as dt

    schedule = Schedule(cron, {}, zone)
    start = dt.datetime.fromisoformat(f"{night}T00:00:00").replace(tzinfo=dt.UTC).timestamp() - 86_400
    ticks = [schedule.next_tick(start)]
    while len(ticks) < 3:
        ticks.append(schedule.next_tick(ticks[-1]))
    hours = [round((b - a) / 3600) for a, b in itertools.pairwise(ticks)]
    assert hours == [24, 25], [dt.datetime.fromtimestamp(t, dt.UTC).isoformat() for t in ticks]
    assert schedule.last_tick(ticks[1] + 2 * 3600) == ticks[1]  # the hour after: still that night's one tick
    every_minute = Schedule("* * * * *", {}, zone)  # not a daily time: it goes on through the repeated hour
    assert every_minute.next_tick(ticks[1] + 3600) - (ticks[1] + 3600) <= 60
    hourly = Schedule("@hourly", {}, zone)  # a macro: every hour too
    assert hourly.next_tick(ticks[1] + 1) - ticks[1] <= 3600
    daily = Schedule("@daily", {}, zone)
    assert daily.next_tick(ticks[1]) - daily.last_tick(ticks[1] + 1) in (23 * 3600, 24 * 3600, 25 * 3600)


SLOW_HOOK_PLAY = """
import asyncio
from deepline_cli import play, tool

@tool("hook.slow")
async def slow(input):
    with open(input["log"], "a") as log:
        log.write("called\\n")
    await asyncio.sleep(1.5)
    return "ok"

@play("inbound", input={"log": str}, webhook_secret="HOOK_SECRET")
async def inbound(ctx, input):
    return (await ctx.tools.execute("slow", "hook.slow", {"log": input["log"]})).output
"""


@pytest.mark.process
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_stopping_serve_run_here_lets_the_call_in_flight_finish_and_requeues_the_run(
    tmp_path: Path, cli_env: dict[str, str], sig: signal.Signals
) -> None:
    """Ctrl-C or SIGTERM to `serve --run-here` while a run's call is out: the call finishes
    and is recorded, the run ends (or goes back to the queue), and a worker continuing it
    does not call again. serve exited at once ("Interrupted."), the run left `running`, and the
    call was made a second time."""
    server, url = _serve(SLOW_HOOK_PLAY, cli_env, tmp_path)
    log = tmp_path / "calls.log"
    try:
        assert deliver(url, json.dumps({"log": str(log)}).encode()).status_code == 202
        wait_until(log.exists, what="the call to go out", timeout=30, every=0.02)
        server.send_signal(sig)
        finish(server, timeout=30)
    finally:
        kill(server)
    [run] = runs_of(cli_env["DEEPLINE_STORE"], "inbound")
    assert run.status in ("queued", "interrupted", "completed"), run  # not `running`, its process gone
    done = start(["worker", "--once"], cli_env, tmp_path)
    finish(done, timeout=60)
    [run] = runs_of(cli_env["DEEPLINE_STORE"], "inbound")
    assert (run.status, run.output) == ("completed", "ok"), run
    assert log.read_text().splitlines() == ["called"]  # once: recorded before serve stopped


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz").json() == {"ok": True}
    except httpx.TransportError:
        return False


@pytest.mark.process
def test_serve_run_here_on_a_store_a_newer_deepline_wrote_stops_in_one_sentence(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """Its worker gave up ("the store cannot be reached") and serve went on answering with
    no one to run what it queued, exit 0 later."""
    (tmp_path / "inbound.py").write_text(HOOK_PLAY)
    (tmp_path / ".env").write_text(f"HOOK_SECRET={SECRET}\n")
    open_store(cli_env["DEEPLINE_STORE"]).close()
    conn = sqlite3.connect(cli_env["DEEPLINE_STORE"])
    conn.execute("INSERT INTO _migrations (name, applied_at) VALUES ('9999_future', 0)")
    conn.commit()
    conn.close()
    server = start(["serve", "inbound.py", "--run-here", "--port", "0"], cli_env, tmp_path)
    try:
        code, _, err = finish(server, timeout=60)
    finally:
        kill(server)
    assert code == 1, err
    assert "written by a newer deepline" in err and "cannot be reached" not in err, err
    assert "Traceback" not in err, err


def test_serve_on_a_port_in_use_is_one_sentence_before_anything_starts(deepline, write_play) -> None:
    """The README's walkthrough starts its providers on 8787, serve's default: a port in
    use is refused in one sentence (exit 2), with no "listening" line and no worker."""
    write_play(
        """
        from deepline_cli import play

        @play("inbound", webhook_secret="HOOK_SECRET")
        async def inbound(ctx, input):
            return input
        """
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = deepline("serve", "play.py", "--port", str(port), "--run-here", HOOK_SECRET="s")
    assert result.code == 2, result.stderr
    assert (
        result.stderr
        == f"Error: Port {port} on 127.0.0.1 is in use (another process listens there); pick another with --port N.\n"
    )


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["* * * * * *", "*/5 * * * * *", "* * * * *", "0 6 * * *"]),
    st.sampled_from(["UTC", "Europe/Paris"]),
    st.integers(1_700_000_000, 1_900_000_000),
    st.sampled_from([0.0, 0.0005, 0.5, 0.999, 0.9995, 0.999999]),
)
def test_the_latest_tick_is_never_after_the_time_asked(cron: str, zone: str, second: int, fraction: float) -> None:
    """In a second's last millisecond too: a worker starting then fired nothing of a schedule
    over every second (its latest tick was taken as the next one, and refused as not yet)."""
    schedule = Schedule(cron, {}, zone)
    at = second + fraction
    latest = schedule.last_tick(at)
    assert latest <= at
    assert schedule.next_tick(latest) > at  # and no tick between it and `at`


def test_the_status_endpoint_answers_only_for_the_runs_its_webhooks_queued(
    deepline, write_play, store_path: Path
) -> None:
    """`GET /runs/ID` gave any run of the store, its output and error too (a CRM sync's
    leads), to whoever could reach the server and guess an id (`nightly-2026-12-05`). It
    answers for the runs its hooks queued (their ids come from a signed delivery's id)."""
    import asyncio

    from deepline_cli.runtime.run.triggers import delivery_run_ids
    from deepline_cli.server.webhooks import Hook, create_app

    write_play(
        """
        from deepline_cli import play

        @play("inbound", input={"email": str}, webhook_secret="HOOK_SECRET")
        async def inbound(ctx, input):
            return {"lead": input["email"]}
        """
    )
    assert deepline("run", "play.py", "--run-id", "nightly-2026-12-05", "--set", "email=a@x.com").code == 0
    from deepline_cli.runtime.run.play import load_play

    play = load_play("play.py", base=store_path.parent)
    hooked = delivery_run_ids("inbound", "d-9")[0]
    assert deepline("run", "play.py", "--run-id", hooked, "--set", "email=b@x.com").code == 0
    app = create_app({"inbound": Hook(play, b"secret")}, str(store_path))

    async def ask(run_id: str) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://deepline") as client:
            return await client.get(f"/runs/{run_id}")

    assert asyncio.run(ask("nightly-2026-12-05")).status_code == 404
    shown = asyncio.run(ask(hooked))
    assert shown.status_code == 200 and shown.json()["output"] == {"lead": "b@x.com"}, shown.text


def test_a_delivery_whose_sender_goes_away_mid_body_is_dropped_without_a_traceback(tmp_path: Path) -> None:
    """A sender that closes its connection before its body is whole: `deepline serve` logged a
    40-line ASGI traceback (starlette's ClientDisconnect) for it. It is answered 400 (to no
    one) and nothing is queued."""
    import asyncio

    from deepline_cli.runtime.run.play import PlayDef
    from deepline_cli.server.webhooks import Hook, create_app

    async def inbound(ctx: Any, input: Any) -> Any:
        return input

    hooks = {"inbound": Hook(PlayDef("inbound", "", inbound), SECRET.encode())}
    app = create_app(hooks, str(tmp_path / "store.db"))
    body = b'{"email": "ada@'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"100"), (b"webhook-id", b"d-1"),
               (b"webhook-timestamp", str(int(time.time())).encode()), (b"webhook-signature", b"v1,x")]  # fmt: skip
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/hooks/inbound", "raw_path": b"/hooks/inbound", "query_string": b"", "headers": headers,
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000), "root_path": ""}  # fmt: skip
    messages = [{"type": "http.request", "body": body, "more_body": True}, {"type": "http.disconnect"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))  # raised ClientDisconnect through the app
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 400, sent
    assert not (tmp_path / "store.db").exists()  # nothing queued: the store not even opened
