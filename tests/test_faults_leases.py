"""Billed once under every fault (leases): a paused process never sends a call another
process took over, refreshes get fresh idempotency keys, a crashed batch is sent again
as the same batch, a run taken over exits 4, and a reused PID never holds a run.

Real parts throughout: `deepline` subprocesses paused with SIGSTOP and killed with
SIGKILL, the loopback provider counting every request and its idempotency key.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deepline_cli import _json
from deepline_cli.store import open_store
from deepline_cli.store.records import ReceiptQuery, RunRecord
from tests.conftest import Result
from tests.faults import MAP_PLAY, TimedProvider, ensure_alive, finish, kill, start, tool_config
from tests.helpers import wait_until
from tests.provider import ProviderServer

pytestmark = pytest.mark.process


@pytest.fixture
def provider() -> Iterator[TimedProvider]:
    with ProviderServer(TimedProvider(latency_s=0.3)) as p:
        yield p  # type: ignore[misc]


@pytest.fixture
def env(cli_env: dict[str, str], store_url: str) -> dict[str, str]:
    return {**cli_env, "DEEPLINE_STORE": store_url, "DEEPLINE_LEASE_TTL": "1"}


def test_a_paused_process_never_sends_a_call_another_process_took_over(
    tmp_path: Path, provider: TimedProvider, env: dict[str, str]
) -> None:
    """Process A claims 24 calls and sends two (concurrency 2); it is paused past its
    leases; B takes the calls over and completes them all. When A wakes, the 22 calls
    still waiting for a slot must not go out: their receipts are B's now."""
    (tmp_path / "play.py").write_text(MAP_PLAY)
    (tmp_path / "deepline.toml").write_text(tool_config(provider.port, concurrency=2))
    payload = '{"n": 24}'
    a = start(["run", "play.py", "--input", payload, "--run-id", "run-a", "--quiet"], env, tmp_path)
    try:
        wait_until(lambda: provider.count() >= 2, what="A's first calls")
        ensure_alive(a)
        os.kill(a.pid, signal.SIGSTOP)
        stopped_with = provider.count()
        b = subprocess.run(
            [sys.executable, "-m", "deepline_cli", "run", "play.py", "--input", payload, "--run-id", "run-b", "--json"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert b.returncode == 0, b.stderr
        woke = time.monotonic()
        os.kill(a.pid, signal.SIGCONT)
        code, _, err = finish(a)
    finally:
        kill(a)
    late = [key for when, key in provider.answered if when > woke]
    assert late == [], f"A sent {len(late)} calls after waking, though B had taken them over"
    sends = provider.sends()
    assert len(sends) == 24  # billed == distinct calls
    repeated = {key for key, n in sends.items() if n > 1}
    assert len(repeated) <= stopped_with  # only calls A had in flight when paused went out twice
    assert all(n <= 2 for n in sends.values())
    assert code == 0, err  # A finds B's answers and completes without paying again


def test_refreshes_send_fresh_idempotency_keys(tmp_path: Path, provider: TimedProvider, env: dict[str, str]) -> None:
    """A stale or forced refresh is a new paid call: a provider that honours keys would
    otherwise replay its old answer while deepline counts new credits."""
    provider.latency_s = 0.0
    (tmp_path / "deepline.toml").write_text(tool_config(provider.port))
    (tmp_path / "play.py").write_text(
        """
from deepline_cli import play

@play("refresh")
async def refresh(ctx, input):
    kw = {"force": True} if input["how"] == "force" else {"stale_after_seconds": 0}
    r = await ctx.tools.execute("lookup", "p.lookup", {"domain": "acme.com"}, **kw)
    return {"execution": r.execution, "key": r.output["key"]}
"""
    )
    outputs = []
    for how in ("stale", "stale", "force", "force"):
        done = subprocess.run(
            [sys.executable, "-m", "deepline_cli", "run", "play.py", "--set", f"how={how}"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        outputs.append(_json.loads(done.stdout))
    assert [o["execution"] for o in outputs] == ["live"] * 4
    keys = [o["key"] for o in outputs]
    assert len(set(keys)) == 4, keys  # each refresh was billed as the new call it is
    assert len(provider.billed) == 4


BATCH_PLAY = """
from deepline_cli import play


@play("batched")
async def batched(ctx, input):
    rows = [{"domain": f"d{i}.com"} for i in range(input["n"])]
    done = await ctx.map(
        "rows", rows, key="domain",
        columns={"info": lambda row, rc: rc.tools.execute("b", "p.batch", {"domain": row["domain"]})},
    )
    return {"rows": len(done), "failed": done.failed_count}
"""


BATCHED = "batch = { max_size = 5, max_wait_ms = 50 }"


def _p_batch(provider: TimedProvider, path: str, last: str) -> str:
    """deepline.toml for BATCH_PLAY's tool `p.batch` (1 credit a call, no retry) on `path`,
    with `last` as its last setting."""
    return f"""
[tools."p.batch"]
method = "POST"
url = "http://127.0.0.1:{provider.port}{path}"
json = {{ domain = "{{domain}}" }}
credits = 1
retries = 0
timeout_s = 60
{last}
"""


def _batch_project(tmp_path: Path, provider: TimedProvider) -> None:
    """BATCH_PLAY and its batch tool (1 credit a member, batches of 5); one batch answers,
    the rest hang past a kill."""
    provider.latency_s = 0.0
    provider.script("/v1/batch", ["ok", *["slow:4"] * 10])
    (tmp_path / "play.py").write_text(BATCH_PLAY)
    (tmp_path / "deepline.toml").write_text(_p_batch(provider, "/v1/batch", BATCHED))


def _killed_with_calls_out(
    run_id: str, path: str, requests: int, provider: TimedProvider, env: dict[str, str], tmp_path: Path
) -> None:
    """BATCH_PLAY over 20 rows, SIGKILLed once `requests` requests reached `path` and 5
    answers are recorded (the rest hang past the kill); the provider answers at once after."""
    a = start(["run", "play.py", "--set", "n=20", "--run-id", run_id, "--quiet"], env, tmp_path)
    try:
        wait_until(lambda: provider.count(path) >= requests, what=f"{requests} requests sent")
        wait_until(lambda: len(_completed(env, "p.batch")) >= 5, what="the first answers recorded")
        ensure_alive(a)
    finally:
        kill(a)
    provider.script(path, [])


@pytest.mark.parametrize("unbatched", [False, True], ids=["as-it-was", "batch-removed-before-the-resume"])
def test_a_batch_in_flight_at_a_crash_is_sent_again_as_the_same_batch(
    tmp_path: Path, provider: TimedProvider, env: dict[str, str], unbatched: bool
) -> None:
    """Members of a batch that was in flight when the process died go out again in that
    same batch, under its key, even when the resumed run would group rows otherwise. With
    `batch` removed from deepline.toml before the resume, they went out one by one under
    their own keys: billed twice. The resume is refused until `batch` is back."""
    _batch_project(tmp_path, provider)
    _killed_with_calls_out("batch-run", "/v1/batch", 4, provider, env, tmp_path)
    resume = [sys.executable, "-m", "deepline_cli", "resume", "batch-run", "--concurrency", "3", "--json"]
    if unbatched:
        config = tmp_path / "deepline.toml"
        batched = config.read_text()
        config.write_text(batched.replace("batch = {", "# batch = {"))
        sent = len(provider.requests)
        refused = subprocess.run(
            resume, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL
        )
        assert refused.returncode == 2, refused.stderr
        assert "put its `batch` setting back" in refused.stdout, refused.stdout  # run.finished (--json)
        assert len(provider.requests) == sent  # nothing sent alone
        config.write_text(batched)
    resumed = subprocess.run(
        resume, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL
    )
    assert resumed.returncode == 0, resumed.stderr
    # A provider honouring idempotency keys bills each key it receives once.
    members: dict[str, set[str]] = {}
    for seen in provider.requests:
        sent_items = seen.body.get("items", [seen.body])  # a batch, or one call alone
        members.setdefault(seen.headers["idempotency-key"], set()).update(i["domain"] for i in sent_items)
    billed = [domain for key in members for domain in members[key]]
    assert sorted(billed) == sorted(f"d{i}.com" for i in range(20)), "a member was billed in two batches"
    finished = _json.loads(resumed.stdout.splitlines()[-1])
    assert finished["output"] == {"rows": 20, "failed": 0}


def test_a_crashed_batch_refused_on_resume_is_refreshed_as_that_batch(
    tmp_path: Path, provider: TimedProvider, env: dict[str, str]
) -> None:
    """Batches in flight at a crash (the provider may have processed them) were sent again by
    the resume and refused as keys in use (409: not transient). A later run with
    `--refresh-failed` asked their members in new batches, under new keys: billed twice.
    They go out as the batches they were sent in, under those batches' keys."""
    _batch_project(tmp_path, provider)
    _killed_with_calls_out("refused-run", "/v1/batch", 4, provider, env, tmp_path)
    provider.script("/v1/batch", ["409"] * 10)
    resumed = subprocess.run(
        [sys.executable, "-m", "deepline_cli", "resume", "refused-run", "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    refused = _json.loads(resumed.stdout.splitlines()[-1])["output"]["failed"]
    assert refused >= 5, resumed.stdout  # the batches cut off by the kill, refused
    provider.script("/v1/batch", [])
    refreshed = subprocess.run(
        [sys.executable, "-m", "deepline_cli", "run", "play.py", "--set", "n=20", "--refresh-failed", "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert refreshed.returncode == 0, refreshed.stderr
    assert _json.loads(refreshed.stdout.splitlines()[-1])["output"] == {"rows": 20, "failed": 0}
    keys_of: dict[str, set[str]] = {}
    for seen in provider.requests:
        for item in seen.body["items"]:
            keys_of.setdefault(item["domain"], set()).add(seen.headers["idempotency-key"])
    assert sorted(keys_of) == sorted(f"d{i}.com" for i in range(20))
    assert {d: k for d, k in keys_of.items() if len(k) > 1} == {}, "a member was sent in two batches"


def test_a_batch_setting_added_before_a_resume_never_sends_a_call_again_in_a_batch(
    tmp_path: Path, provider: TimedProvider, env: dict[str, str]
) -> None:
    """Calls sent one by one were in flight at a crash; `batch` was then added to the tool.
    The resume sent them again inside batches, under the batches' keys: billed twice. It
    is refused until `batch` is taken out; then each goes out alone under its first key."""
    provider.latency_s = 0.0
    provider.script("/v1/one", [*["ok"] * 5, *["slow:4"] * 10])  # five answer, the rest hang past the kill
    (tmp_path / "play.py").write_text(BATCH_PLAY)
    config = tmp_path / "deepline.toml"
    alone = _p_batch(provider, "/v1/one", "concurrency = 8")
    config.write_text(alone)
    _killed_with_calls_out("alone-run", "/v1/one", 8, provider, env, tmp_path)
    config.write_text(alone + BATCHED + "\n")
    resume = [sys.executable, "-m", "deepline_cli", "resume", "alone-run", "--json"]
    sent = len(provider.requests)
    refused = subprocess.run(
        resume, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL
    )
    assert refused.returncode == 2, refused.stderr
    assert "take its `batch` setting out" in refused.stdout, refused.stdout  # run.finished (--json)
    assert len(provider.requests) == sent  # nothing sent in a batch
    config.write_text(alone)
    resumed = subprocess.run(
        resume, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL
    )
    assert resumed.returncode == 0, resumed.stderr
    keys_of: dict[str, set[str]] = {}
    for seen in provider.requests:
        for item in seen.body.get("items", [seen.body]):
            keys_of.setdefault(item["domain"], set()).add(seen.headers["idempotency-key"])
    assert sorted(keys_of) == sorted(f"d{i}.com" for i in range(20))
    assert all(len(keys) == 1 for keys in keys_of.values()), keys_of  # each billed once
    assert _json.loads(resumed.stdout.splitlines()[-1])["output"] == {"rows": 20, "failed": 0}


SLOW_PLAY = """
import asyncio
from deepline_cli import play, tool


@tool("slow.work", credits=1)
async def work(input):
    await asyncio.sleep(input["s"])
    return input["i"]


@play("slow")
async def slow(ctx, input):
    total = 0
    for i in range(input["n"]):
        total += (await ctx.tools.execute(f"w{i}", "slow.work", {"i": i, "s": input["s"]})).output
    return {"total": total}
"""


def test_a_run_taken_over_while_paused_exits_4_and_leaves_the_new_owners_record(
    tmp_path: Path, deepline: Callable[..., Result], env: dict[str, str]
) -> None:
    """A holder that stopped heartbeating (paused past its lease) loses the run to a
    resume; when it wakes it stops without recording anything, and exits 4 (busy)."""
    (tmp_path / "play.py").write_text(SLOW_PLAY)
    a = start(["run", "play.py", "--input", '{"n": 6, "s": 0.2}', "--run-id", "held", "--quiet"], env, tmp_path)
    try:
        wait_until(lambda: _status(env, "held") == "running", what="the run to start")
        time.sleep(0.3)  # a call or two done
        os.kill(a.pid, signal.SIGSTOP)
        resumed = wait_until(lambda: _resume_when_expired(deepline, env), timeout=20, what="the lease to expire")
        assert resumed.code == 0, resumed.stderr
        os.kill(a.pid, signal.SIGCONT)
        code, _, err = finish(a)
    finally:
        kill(a)
    assert code == 4, err
    assert "taken over" in err
    db = open_store(env["DEEPLINE_STORE"])
    try:
        record = db.runs.get_run("held")
        assert record is not None and record.status == "completed"
        assert record.output == {"total": 15}
        # `runs show --full`: the paused attempt lived to hear it was taken over (not "killed").
        assert [a.status for a in db.ledger.attempt_rows("held")][:1] == ["taken_over"]
    finally:
        db.close()


CHILDREN_PLAY = (
    SLOW_PLAY
    + """

@play("kid")
async def kid(ctx, input):
    first = await ctx.tools.execute("a", "slow.work", {"i": input["i"], "s": input["s"]})
    second = await ctx.tools.execute("b", "slow.work", {"i": input["i"] + 100, "s": input["s"]})
    return first.output + second.output


@play("parent")
async def parent(ctx, input):
    rows = await ctx.map("m", [{"i": i} for i in range(input["n"])], key="i", concurrency=3, columns={
        "v": lambda row, rc: rc.run_play("kid", "kid", {"i": row["i"], "s": input["s"]}),
    })
    return {"total": sum(row["v"] for row in rows)}
"""
)


def test_a_process_taken_over_leaves_the_child_runs_the_new_owner_finished_alone(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """Paused with child plays in flight, its run taken over by a resume, and woken while the
    resume runs those children again: it wrote them `failed` (taken over) or `interrupted`
    over the new owner's attempts, which then could not record them completed. The parent
    completed with their outputs; the children stayed failed for good, their credits short
    of the parent's."""
    (tmp_path / "play.py").write_text(CHILDREN_PLAY)
    payload = '{"n": 6, "s": 0.5}'
    a = start(["run", "play.py:parent", "--input", payload, "--run-id", "held", "--quiet"], env, tmp_path)
    b = None
    try:
        wait_until(lambda: _status(env, "held") == "running", what="the run to start")
        wait_until(lambda: len(_kids(env)) == 3, what="three children started")
        os.kill(a.pid, signal.SIGSTOP)
        wait_until(lambda: _lease_expired(env, "held"), timeout=20, what="the paused run's lease to expire")
        b = start(["resume", "held", "--quiet"], env, tmp_path)
        # The resume runs again a child the paused process held: wake that process now.
        wait_until(lambda: any(k.attempt == 2 for k in _kids(env)), alive=b, what="a child taken over")
        os.kill(a.pid, signal.SIGCONT)
        code, _, err = finish(a)
        resumed, _, resumed_err = finish(b)
    finally:
        kill(a)
        if b is not None:
            kill(b)
    assert code == 4, err
    assert resumed == 0, resumed_err
    db = open_store(env["DEEPLINE_STORE"])
    try:
        parent = db.runs.get_run("held")
        assert parent is not None and parent.status == "completed" and parent.output == {"total": 630}
        kids = [r for r in db.runs.list_runs(limit=100) if r.parent_run_id == "held"]
        assert len(kids) == 6 and {k.status for k in kids} == {"completed"}, [(k.run_id, k.status) for k in kids]
        assert sum(k.stats.get("credits", 0) for k in kids) == 12 == parent.stats["credits"]
        # `runs show --full`: the paused process's attempts of the children are not said to have
        # failed (taken over; interrupted, if it reached one first; killed, if it exited first).
        attempts = [[a.status for a in db.ledger.attempt_rows(k.run_id)] for k in kids if k.attempt == 2]
        assert attempts and all(a[1:] == ["completed"] for a in attempts), attempts
        assert all(a[0] in ("taken_over", "interrupted", "killed") for a in attempts), attempts
    finally:
        db.close()


def _kids(env: dict[str, str]) -> list[RunRecord]:
    db = open_store(env["DEEPLINE_STORE"])
    try:
        return [r for r in db.runs.list_runs(limit=100) if r.parent_run_id == "held"]
    finally:
        db.close()


def _lease_expired(env: dict[str, str], run_id: str) -> bool:
    db = open_store(env["DEEPLINE_STORE"])
    try:
        record = db.runs.get_run(run_id)
        return record is not None and record.lease_expires_at < db.now() - 0.2
    finally:
        db.close()


def _completed(env: dict[str, str], tool: str) -> list[object]:
    db = open_store(env["DEEPLINE_STORE"])
    try:
        return list(db.receipts.query_receipts(ReceiptQuery(tool=tool, status="completed")))
    finally:
        db.close()


def _status(env: dict[str, str], run_id: str) -> str | None:
    db = open_store(env["DEEPLINE_STORE"])
    try:
        record = db.runs.get_run(run_id)
        return record.status if record else None
    finally:
        db.close()


def _resume_when_expired(deepline: Callable[..., Result], env: dict[str, str]) -> Result | None:
    result: Result = deepline("resume", "held", "--quiet", DEEPLINE_STORE=env["DEEPLINE_STORE"], DEEPLINE_LEASE_TTL="1")
    if result.code == 4:
        time.sleep(0.2)
        return None
    return result


@pytest.mark.parametrize("legacy", [False, True], ids=["start-time", "legacy-holder"])
def test_a_reused_pid_does_not_hold_a_run(
    tmp_path: Path, deepline: Callable[..., Result], env: dict[str, str], legacy: bool
) -> None:
    """After a reboot the holder's PID may belong to another process. A holder records its
    process start time; an old-style holder (host:pid) counts as gone once its lease expired."""
    (tmp_path / "play.py").write_text(SLOW_PLAY)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host = socket.gethostname()
        now = time.time()
        holder, expires = (f"{host}:{other.pid}", now - 5) if legacy else (f"{host}:{other.pid}:bootx-123", now + 600)
        db = open_store(env["DEEPLINE_STORE"])
        try:
            db.runs.insert_run(
                RunRecord(
                    run_id="orphan", play="slow", play_ref=f"{tmp_path / 'play.py'}:slow", input={"n": 2, "s": 0.0},
                    status="running", attempt=1, cwd=str(tmp_path), root_run_id="orphan", holder=holder,
                    lease_expires_at=expires, created_at=now, updated_at=now,
                )
            )  # fmt: skip
        finally:
            db.close()
        resumed = deepline("resume", "orphan", "--quiet", DEEPLINE_STORE=env["DEEPLINE_STORE"])
    finally:
        other.kill()
        other.wait()
    assert resumed.code == 0, resumed.stderr
    assert _json.loads(resumed.stdout) == {"total": 1}


def test_the_same_run_id_started_twice_at_once_runs_once(tmp_path: Path, env: dict[str, str], store_url: str) -> None:
    """Two `run --run-id X` at the same moment: one runs it, the other exits 4 (busy) or
    reports it finished; never a database error."""
    (tmp_path / "play.py").write_text(SLOW_PLAY)
    for attempt in range(6):
        run_id = f"twice-{attempt}"
        args = ["run", "play.py", "--input", '{"n": 3, "s": 0.15}', "--run-id", run_id, "--quiet"]
        both = [start(args, env, tmp_path) for _ in range(2)]
        results = [finish(p) for p in both]
        codes = sorted(code for code, _, _ in results)
        assert codes in ([0, 0], [0, 4]), results
        for code, _, err in results:
            assert "Traceback" not in err and "UNIQUE" not in err and "duplicate key" not in err, err
            if code == 4:
                assert err.count("\n") == 1 and "held by a live process" in err, err


def test_a_process_woken_after_a_takeover_writes_no_rows(
    tmp_path: Path, deepline: Callable[..., Result], env: dict[str, str]
) -> None:
    """A process paused with a provider's answer on its way wakes after another process
    took the run over. Its settlement is refused (the receipt is the new owner's) and it
    must not write the row either: a row written from a result no receipt recorded would
    be reused by every later attempt while the paid call never reaches the ledger.

    A sends the call and is paused; B takes the run over, sends the call again (same
    key) and is killed before its answer; A wakes with its answer. C then finishes."""
    with ProviderServer(TimedProvider(latency_s=0.8)) as provider:
        (tmp_path / "play.py").write_text(MAP_PLAY)
        (tmp_path / "deepline.toml").write_text(tool_config(provider.port, concurrency=1))
        args = ["run", "play.py", "--input", '{"n": 1}', "--run-id", "woken", "--quiet"]
        a = start(args, env, tmp_path)
        b = None
        try:
            wait_until(lambda: provider.count() >= 1, what="A's call")
            os.kill(a.pid, signal.SIGSTOP)
            time.sleep(1.3)  # past A's lease (1 s)
            b = start(args, env, tmp_path)
            wait_until(lambda: provider.count() >= 2 or b.poll() is not None, what="B's call")
            ensure_alive(b)
            kill(b)  # B's answer never arrives; its receipt stays B's
            os.kill(a.pid, signal.SIGCONT)  # A's answer came while it was paused
            code, _, err = finish(a)
        finally:
            kill(a)
            if b is not None:
                kill(b)
        assert code == 4, err
        db = open_store(env["DEEPLINE_STORE"])
        try:
            assert db.sheets.count_map_rows("woken", "rows") == {}, "the taken-over process wrote a map row"
            assert db.sheets.load_sheet_rows("default/faults/rows", ["d0.com"]) == {}, "... and its sheet row"
            assert [m.status for m in db.sheets.get_maps("woken")] == ["running"], "... or its map's record over B's"
        finally:
            db.close()
        c = deepline("run", "play.py", "--input", '{"n": 1}', "--run-id", "woken", "--quiet", **env)
        assert c.code == 0, c.stderr
        assert provider.count() == 3  # A's, B's and C's send of the one call, all under one key
        assert len(provider.sends()) == 1
    shown = deepline("runs", "show", "woken", "--json", **env)
    assert _json.loads(shown.stdout)["stats"]["credits"] == 1  # the call C settled is in the ledger
    assert [r.status for r in _completed(env, "p.lookup")] == ["completed"]


LATE_PLAY = """
import asyncio
import sqlite3

from deepline_cli import play, tool


@tool("late.work", credits=1)
async def work(input, call):
    # While it is out, another process takes the call over (this one paused past its lease):
    # the receipt's lease is another's when its answer comes.
    with sqlite3.connect(input["store"], timeout=30) as db:
        db.execute("UPDATE receipts SET lease_id = 'another-process' WHERE key = ?", (call.receipt_key,))
    await asyncio.sleep(0.05)
    return input["i"]


@play("late")
async def late(ctx, input):
    rows = await ctx.map("m", [{"i": i} for i in range(8)], key="i", concurrency=8, columns={
        "v": lambda row, rc: rc.tools.execute("w", "late.work", {"i": row["i"], "store": input["store"]}),
    })
    return len(rows)
"""


def test_calls_answered_after_a_takeover_are_said_in_two_lines_not_one_each(
    tmp_path: Path, deepline: Callable[..., Result], store_path: Path
) -> None:
    """A worker paused past its leases with many calls out, woken: each answer another
    process had taken over was logged on a line of its own (50 lines for a map's 50 rows)."""
    (tmp_path / "play.py").write_text(LATE_PLAY)
    result = deepline("run", "play.py", "--set", f"store={store_path}", DEEPLINE_STORE=str(store_path))
    assert result.code == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "after another process took" in line]
    assert len(said) == 2, said
    assert "answered after another process took the call over; its record is kept" in said[0]
    assert "7 more calls answered after another process took them over; their records are kept" in said[1]
