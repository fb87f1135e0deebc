"""Ctrl-C at any moment, from the process's start to its exit, stops the run: exit 130,
one line, never a traceback, and a run that exists is `interrupted` and resumable.

Real processes and real signals: the same play is started many times and interrupted a
little later each time, so the signal lands during imports, while the play loads, while
the run is recorded, just before and just after `run.started`, and while calls go out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deepline_cli.runtime.run.attempt import install_signals
from deepline_cli.store import open_store
from deepline_cli.store.records import ReceiptQuery
from tests.helpers import wait_until

PLAY = """
import asyncio

from deepline_cli import play, tool

@tool("sig.work")
async def work(input):
    await asyncio.sleep(0.02)  # a provider's latency: 5,000 rows take some 2 s
    with open(input["log"], "a") as log:
        log.write("x")
    return input["n"]

@play("signals")
async def signals(ctx, input):
    salt = input["salt"]  # each run its own rows and calls
    rows = await ctx.map("rows", [{"n": n, "salt": salt} for n in range(5000)], key=["salt", "n"], columns={
        "out": lambda row, rc: rc.tools.execute("w", "sig.work", {"n": row["n"], "salt": salt, "log": input["log"]}),
    })
    return {"rows": len(rows)}
"""

# From the moment the process is started: during imports, loading the play, creating the run,
# its first calls, and well into them. The middle ones are fractions of the time this machine
# takes to the play's first call (measured first: from 0.3 s to several on a loaded machine);
# the last ones come once the run's calls are seen going out, however long that took.
EARLY = (0.0, 0.05, 0.1)
OF_FIRST_CALL = (0.3, 0.6, 0.8, 0.9, 1.0, 1.1, 1.3)
AFTER_CALLS = (0.0, 0.3)


def start(tmp_path: Path, cli_env: dict[str, str], log: Path, run_id: str, salt: str) -> subprocess.Popen[str]:
    payload = json.dumps({"log": str(log), "salt": salt})
    return subprocess.Popen(
        [sys.executable, "-m", "deepline_cli", "run", "play.py", "--input", payload, "--run-id", run_id],
        cwd=tmp_path, env=cli_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def time_to_first_call(tmp_path: Path, cli_env: dict[str, str], log: Path) -> float:
    """Seconds from the process's start to the play's first call, on this machine now; the
    run is then interrupted like any other (exit 130)."""
    began = time.monotonic()
    proc = start(tmp_path, cli_env, log, "sig-first-call", "first-call")
    while not (log.exists() and log.stat().st_size):
        if proc.poll() is not None or time.monotonic() - began > 60:
            proc.kill()
            pytest.fail(f"no call within 60 s of the start: {proc.communicate()[1][-2000:]}")
        time.sleep(0.005)
    took = time.monotonic() - began
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err[-2000:]
    return took


def run_status(store: Path, run_id: str) -> str | None:
    if not store.exists():
        return None
    opened = open_store(str(store))
    try:
        record = opened.runs.get_run(run_id)
    finally:
        opened.close()
    return record.status if record else None


def interpreter_start(code: int, err: str, sig: signal.Signals) -> bool:
    """Did the signal end the process while the interpreter started, before deepline's first
    line of its own (`deepline_cli/__main__.py` has the handlers installed) could run?"""
    if code == -sig and err == "":
        return True
    ours = set(re.findall(r'File "[^"]*/deepline_cli/([^"]+)"', err))
    if not ours <= {"__init__.py"}:
        # A traceback through the command's own code is never the interpreter's. The
        # package's `__init__` is imported first, by Python, and runs no code of the
        # command (plays import it too): a signal while Python loads it is still Python's.
        return False
    # The interpreter's own words when a KeyboardInterrupt stops its start: while it sets up
    # its streams or `site` ("Fatal Python error: init_…"), while it imports runpy for `-m`,
    # or a plain traceback from the imports that lead to deepline's first line.
    said = ("Fatal Python error: init_", "Could not import runpy module", "Traceback")
    return code != 0 and err.startswith(said)


def dropped_by_interpreter(code: int, err: str) -> bool:
    """Did Python drop the signal while the interpreter started, before deepline's first line?
    A KeyboardInterrupt raised in an import lock's weakref callback is printed as "Exception
    ignored"; one raised in a `.pth` file's import is printed by `site` ("Error processing
    line"). Either way the program goes on: the run completes. Seen 15 times in 2,500 signals
    that landed in the interpreter's start; deepline cannot run code that early."""
    before_deepline = err.split("deepline  ", 1)[0]  # what was printed before deepline's header
    return (
        code == 0
        and "KeyboardInterrupt" in before_deepline
        and ("Exception ignored in" in before_deepline or "Error processing line" in before_deepline)
        and "/deepline_cli/" not in before_deepline
    )


@pytest.mark.process
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_at_any_moment_stops_the_run_with_one_line(
    tmp_path: Path, cli_env: dict[str, str], sig: signal.Signals
) -> None:
    (tmp_path / "play.py").write_text(PLAY)
    log = tmp_path / "calls.log"
    first_call = time_to_first_call(tmp_path, cli_env, log)
    outcomes: list[str | None] = []
    moments = [("start", d) for d in (*EARLY, *(share * first_call for share in OF_FIRST_CALL))]
    moments += [("calls", d) for d in AFTER_CALLS]
    for n, (since, delay) in enumerate(moments):
        run_id = f"sig-{n}"
        made = log.stat().st_size if log.exists() else 0
        proc = start(tmp_path, cli_env, log, run_id, f"{sig.name}-{n}")
        if since == "calls":  # once this run's calls are going out
            began = time.monotonic()
            while log.stat().st_size == made and proc.poll() is None and time.monotonic() - began < 60:
                time.sleep(0.005)
        time.sleep(delay)
        sent = time.monotonic()
        before = log.stat().st_size if log.exists() else 0
        proc.send_signal(sig)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(f"delay {delay}: still running 20 s after the signal; stderr: {err[-2000:]}")
        took = time.monotonic() - sent
        after = log.stat().st_size if log.exists() else 0
        status = run_status(Path(cli_env["DEEPLINE_STORE"]), run_id)
        if sig == signal.SIGINT and dropped_by_interpreter(proc.returncode, err):
            outcomes.append("dropped by the interpreter")
            continue
        if interpreter_start(proc.returncode, err, sig):
            # While the Python interpreter itself starts (its first few tens of ms, before any
            # of deepline runs), Python handles the signal: the process ends at once, nothing
            # exists yet. A shell shows 130 for SIGINT.
            assert status is None, f"delay {delay}: {err[-2000:]}"
            outcomes.append("interpreter")
            continue
        else:
            assert "Traceback" not in err, f"delay {delay}: {err}"
            assert proc.returncode == 130, f"delay {delay}: exit {proc.returncode}; {err[-2000:]}"
            said = [line for line in err.splitlines() if "nterrupted" in line and "interrupt received" not in line]
            assert len(said) == 1, f"delay {delay}: {err}"  # one line says it
        assert took < 10, f"delay {delay}: took {took:.1f}s to stop"
        assert after - before < 1000, f"delay {delay}: {after - before} calls after the signal"
        assert status in (None, "interrupted"), f"delay {delay}: the run is {status}"
        outcomes.append(status)
    # Both sides of the run's creation were hit, in deepline's own code.
    assert "interrupted" in outcomes and None in outcomes, (outcomes, first_call)


def test_a_sigint_while_the_attempt_gives_its_handlers_back_goes_to_the_process_handler() -> None:
    """asyncio's removal puts Python's default SIGINT handler back before ours is restored; a
    signal landing there raised KeyboardInterrupt into a run that had finished (exit 130).
    Here that moment is made certain: the removal hears a SIGINT with the default in place."""
    heard: list[int] = []

    def before(signum: int, frame: object) -> None:
        heard.append(signum)

    async def attempt() -> None:
        loop = asyncio.get_running_loop()
        restore = install_signals(loop, lambda: None)
        real_remove = loop.remove_signal_handler

        def remove_then_interrupted(sig: int) -> bool:
            removed = real_remove(sig)
            if sig == signal.SIGINT:
                signal.raise_signal(signal.SIGINT)  # the default handler is in place: KeyboardInterrupt
            return removed

        loop.remove_signal_handler = remove_then_interrupted  # type: ignore[method-assign]
        restore()

    previous = signal.signal(signal.SIGINT, before)
    try:
        asyncio.run(attempt())  # no KeyboardInterrupt
        assert heard == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is before
        assert signal.set_wakeup_fd(-1) == -1  # no wakeup fd left pointing at the closed loop
    finally:
        signal.signal(signal.SIGINT, previous)


def ctrl_c_once_a_call_went_out(
    provider: Any, run_id: str, tmp_path: Path, cli_env: dict[str, str], *args: str
) -> None:
    """`deepline run play.py`, Ctrl-C as soon as the provider has answered its first call:
    the run must end at once (not after the 5 s grace for calls in flight), exit 130, and
    nothing more was sent."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "deepline_cli", "run", "play.py", "--run-id", run_id, *args],
        cwd=tmp_path, env=cli_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    began = time.monotonic()
    while provider.count() < 1:
        assert proc.poll() is None and time.monotonic() - began < 60, proc.communicate()
        time.sleep(0.01)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    assert proc.returncode == 130, err
    assert took < 4, f"{took:.1f}s to stop: the grace for calls in flight (5 s) was waited out"
    assert provider.count() == 1


WAITING_PLAY = """
from deepline_cli import play

@play("patient")
async def patient(ctx, input):
    return (await ctx.tools.execute("q", "quota.lookup", {"n": 1})).output
"""


@pytest.mark.process
def test_ctrl_c_while_a_call_waits_out_a_retry_after_stops_at_once(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """A call waiting 60 s before its next try (a 429's Retry-After) has nothing at the
    provider: Ctrl-C ends the run at once, not after the grace given to calls in flight;
    the call is given back, and a resume sends it (the same key)."""
    from tests.provider import Provider, ProviderServer

    with ProviderServer(Provider()) as provider:
        provider.script("/quota", ["429:60", "ok"])
        (tmp_path / "play.py").write_text(WAITING_PLAY)
        (tmp_path / "deepline.toml").write_text(f'[tools."quota.lookup"]\nurl = "{provider.url}/quota"\n')
        ctrl_c_once_a_call_went_out(provider, "patient", tmp_path, cli_env)  # the 429: from here it only waits
        assert run_status(Path(cli_env["DEEPLINE_STORE"]), "patient") == "interrupted"
        resumed = subprocess.run(
            [sys.executable, "-m", "deepline_cli", "resume", "patient"],
            cwd=tmp_path, env=cli_env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        first, second = (r.headers["idempotency-key"] for r in provider.requests)
        assert first == second and set(provider.billed.values()) == {1}


PACED_PLAY = """
import asyncio
from deepline_cli import play

@play("paced")
async def paced(ctx, input):
    answers = await asyncio.gather(*(ctx.tools.execute(f"q{n}", "quota.lookup", {"n": n}) for n in range(2)))
    return [a.output for a in answers]
"""


@pytest.mark.process
def test_ctrl_c_while_a_call_waits_for_its_rate_limit_or_a_429_pause_stops_at_once(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """A call held back by its tool's rate limit (here 1/min: the second call's slot is a
    minute away) has nothing at the provider, as one waiting out a Retry-After: Ctrl-C ends
    the run at once, the call is given back, and the resume sends it."""
    from tests.provider import Provider, ProviderServer

    with ProviderServer(Provider()) as provider:
        (tmp_path / "play.py").write_text(PACED_PLAY)
        toml = f'[tools."quota.lookup"]\nurl = "{provider.url}/quota"\n'
        (tmp_path / "deepline.toml").write_text(toml + 'rate_limit = "1/min"\n')
        ctrl_c_once_a_call_went_out(provider, "paced", tmp_path, cli_env)  # the second waits for its slot
        # The call that never left is given back as never sent (skipped), not as maybe sent (released).
        opened = open_store(cli_env["DEEPLINE_STORE"])
        try:
            statuses = sorted(r.status for r in opened.receipts.query_receipts(ReceiptQuery(run_id="paced")))
        finally:
            opened.close()
        assert statuses == ["completed", "skipped"], statuses
        (tmp_path / "deepline.toml").write_text(toml)  # no limit now: the resume need not wait a minute
        resumed = subprocess.run(
            [sys.executable, "-m", "deepline_cli", "resume", "paced"],
            cwd=tmp_path, env=cli_env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        assert provider.count() == 2 and set(provider.billed.values()) == {1}


NAPPING_PLAY = """
from deepline_cli import play

@play("napping")
async def napping(ctx, input):
    await ctx.tools.execute("q", "quota.lookup", {"n": 1})
    await ctx.sleep("nap", input["nap"])  # under --max-inline-wait: slept in this process
    if input.get("event"):
        await ctx.wait_for_event("go", timeout_s=20)  # polled in this process
    return "done"
"""


@pytest.mark.process
@pytest.mark.parametrize("event", [False, True])
def test_ctrl_c_while_the_play_waits_inline_stops_at_once(tmp_path: Path, cli_env: dict[str, str], event: bool) -> None:
    """A run sleeping (or waiting for an event) in its own process has no call out: Ctrl-C
    ends it at once, not after the grace for calls in flight, and a resume goes on."""
    from tests.provider import Provider, ProviderServer

    with ProviderServer(Provider()) as provider:
        (tmp_path / "play.py").write_text(NAPPING_PLAY)
        waits = json.dumps({"nap": 0, "event": True} if event else {"nap": 20})
        (tmp_path / "deepline.toml").write_text(f'[tools."quota.lookup"]\nurl = "{provider.url}/quota"\n')
        ctrl_c_once_a_call_went_out(provider, "napping", tmp_path, cli_env, "--input", waits)
        assert run_status(Path(cli_env["DEEPLINE_STORE"]), "napping") == "interrupted"


def _paced_run_read_by(tmp_path: Path, cli_env: dict[str, str], provider: Any, *args: str) -> subprocess.Popen[bytes]:
    """`deepline run play.py ARGS` of 40 slow calls (5 s at 4 at a time), its stdout and stderr
    piped for a test to read, then go away from."""
    provider.default_fault = "slow:0.5"
    toml = f'[tools."quota.lookup"]\nurl = "{provider.url}/quota"\nconcurrency = 4\n'
    (tmp_path / "deepline.toml").write_text(toml)
    (tmp_path / "play.py").write_text(PACED_PLAY.replace("range(2)", "range(40)"))
    return subprocess.Popen(
        [sys.executable, "-m", "deepline_cli", "run", "play.py", *args],
        cwd=tmp_path, env={**cli_env, "DEEPLINE_PROGRESS_EVERY_S": "0"}, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


@pytest.mark.process
def test_a_view_whose_reader_goes_away_interrupts_the_run_resumable(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """`deepline run … 2>&1 | head`: the reader of the view goes away mid-run. The run is
    interrupted as on Ctrl-C (exit 130, its calls in flight recorded, resumable), not ended
    by the write that failed (rich's exit left it "running" with its calls out)."""
    from tests.provider import Provider, ProviderServer

    with ProviderServer(Provider()) as provider:
        proc = _paced_run_read_by(tmp_path, cli_env, provider, "--run-id", "piped")
        assert proc.stdout is not None and proc.stderr is not None
        proc.stderr.readline()  # the view's first line: then its reader goes away
        proc.stderr.close()
        assert proc.wait(timeout=60) == 130
        proc.stdout.close()
        assert run_status(Path(cli_env["DEEPLINE_STORE"]), "piped") == "interrupted"
        opened = open_store(cli_env["DEEPLINE_STORE"])
        try:
            held = opened.receipts.query_receipts(ReceiptQuery(run_id="piped", status="running"))
        finally:
            opened.close()
        assert held == [], "the calls out were recorded, none left held"


@pytest.mark.process
def test_a_json_reader_that_goes_away_stops_the_run_and_says_so(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """`deepline run --json | head -1`: the run stopped (exit 130, resumable) without a word
    on the terminal, as if it had crashed."""
    from tests.provider import Provider, ProviderServer

    with ProviderServer(Provider()) as provider:
        proc = _paced_run_read_by(tmp_path, cli_env, provider, "--run-id", "headed", "--json")
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.readline()  # `head -1`: the first event, then the reader goes away
        proc.stdout.close()
        assert proc.wait(timeout=60) == 130
        said = proc.stderr.read().decode()
        proc.stderr.close()
        assert "Run headed stopped: the reader of its --json output went away; `deepline resume headed`" in said, said
        assert run_status(Path(cli_env["DEEPLINE_STORE"]), "headed") == "interrupted"


IN_FLIGHT_PLAY = """
from deepline_cli import play

@play("slow-lookups")
async def slow_lookups(ctx, input):
    rows = [{"domain": d} for d in ("a.com", "b.com", "c.com")]
    ds = await ctx.map("m", rows, key="domain", columns={
        "v": lambda row, rc: rc.tools.execute("v", "corp.slow", {"domain": row["domain"]}),
    })
    return {"failed": ds.failed_count}
"""


def _logged(cli_env: dict[str, str], run_id: str, text: str) -> bool:
    """Has the run's log in the store a line holding `text`?"""
    db = open_store(cli_env["DEEPLINE_STORE"])
    try:
        return any(text in line.message for line in db.ledger.logs_after(run_id, 0, 1000))
    finally:
        db.close()


@contextlib.contextmanager
def _three_calls_out(
    tmp_path: Path, cli_env: dict[str, str], seconds: int, *args: str
) -> Iterator[tuple[Any, subprocess.Popen[str]]]:
    """`deepline run play.py ARGS` of IN_FLIGHT_PLAY, its provider answering in `seconds`: the
    provider and the process, once the run's three calls are out."""
    from tests.provider import Provider, ProviderServer

    with ProviderServer(Provider(default_fault=f"slow:{seconds}")) as provider:
        (tmp_path / "deepline.toml").write_text(
            f'[tools."corp.slow"]\nurl = "{provider.url}/v1/lookup"\nquery = {{ domain = "{{domain}}" }}\ncredits = 1\n'
        )
        (tmp_path / "play.py").write_text(IN_FLIGHT_PLAY)
        proc = subprocess.Popen(
            [sys.executable, "-m", "deepline_cli", "run", "play.py", *args],
            cwd=tmp_path, env=cli_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while provider.count("/v1/lookup") < 3:
                assert proc.poll() is None and time.monotonic() < deadline, "the three calls never went out"
                time.sleep(0.01)
            yield provider, proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


@pytest.mark.process
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_every_call_is_in_flight_interrupts_the_run(
    tmp_path: Path, cli_env: dict[str, str], sig: signal.Signals
) -> None:
    """Every call of the run already out when the signal comes (nothing left to hold back):
    the calls finished, the play returned, and the run ended `completed`, exit 0, as if no
    one had asked it to stop. A CI job's timeout (SIGTERM) must see 130 and a resumable run."""
    with _three_calls_out(tmp_path, cli_env, 2, "--run-id", "in-flight") as (provider, proc):
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, f"exit {proc.returncode}: {err[-1500:]}"
        assert run_status(Path(cli_env["DEEPLINE_STORE"]), "in-flight") == "interrupted"
        assert provider.count("/v1/lookup") == 3  # the calls out finished, recorded: nothing sent again
        resumed = subprocess.run(
            [sys.executable, "-m", "deepline_cli", "resume", "in-flight"],
            cwd=tmp_path, env=cli_env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        assert provider.count("/v1/lookup") == 3


@pytest.mark.process
def test_a_json_run_interrupted_says_so_on_stderr_too(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """A CI job's timeout (SIGTERM) under --json: stdout's NDJSON ends with run.finished, and
    the job's log (stderr) says the run was interrupted and how to resume it, as it does for
    a failed run. It said nothing."""
    with _three_calls_out(tmp_path, cli_env, 1, "--run-id", "ci-job", "--json") as (_, proc):
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, f"exit {proc.returncode}: {err[-1500:]}"
    finished = json.loads(out.splitlines()[-1])
    assert (finished["event"], finished["status"]) == ("run.finished", "interrupted"), finished
    assert "■ Run ci-job interrupted" in err and "deepline resume ci-job" in err, err


@pytest.mark.process
def test_a_second_ctrl_c_says_which_calls_it_cut_short(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """Ctrl-C twice while three calls are out: the second stops at once, and the calls it cut
    short (answered or not, none recorded) are asked again by the resume. The verdict said
    "nothing finished is lost", and the first line did not say what a second Ctrl-C does."""
    with _three_calls_out(tmp_path, cli_env, 5, "--run-id", "twice") as (_, proc):
        proc.send_signal(signal.SIGINT)
        # The first heard (its line in the run's log), so the second is not merged into it.
        wait_until(lambda: _logged(cli_env, "twice", "interrupt received"), what="the first Ctrl-C heard", alive=proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, f"exit {proc.returncode}: {err[-1500:]}"
    assert "Ctrl-C again stops at once" in err, err
    assert "3 calls in flight were cut short" in err and "nothing finished is lost" not in err, err
    db = open_store(str(cli_env["DEEPLINE_STORE"]))
    try:
        record = db.runs.get_run("twice")
        assert record is not None and record.status == "interrupted" and record.error["cut_short"] == 3, record
    finally:
        db.close()


def started_until(tmp_path: Path, cli_env: dict[str, str], log: Path, lines: int, *args: str) -> subprocess.Popen[str]:
    """`deepline ARGS` (stdout and stderr piped), once its play has written `lines` lines to `log`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "deepline_cli", *args],
        cwd=tmp_path, env=cli_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    wait_until(lambda: log.exists() and len(log.read_text().split()) >= lines, what=f"{lines} lines in {log.name}",
               alive=proc, every=0.01)  # fmt: skip
    return proc


BLOCKING_PLAY = """
import time

from deepline_cli import play

def pay(row, log):  # a sync SDK's paid call, 0.3 s: it blocks the event loop while it waits
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(f"{time.time():.6f}\\n")
    time.sleep(0.3)
    return {"paid": row["id"]}

@play("blocking")
async def blocking(ctx, input):
    rows = [{"id": str(i)} for i in range(40)]
    ds = await ctx.map("rows", rows, key="id", concurrency=20, columns={
        "paid": lambda row, rc: rc.step("pay", lambda: pay(row, input["log"])),
    })
    return len(ds)
"""


@pytest.mark.process
def test_ctrl_c_while_blocking_calls_hold_the_loop_starts_no_more_of_them(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """Twenty rows' blocking steps started together run one after another, the event loop
    held by each: Ctrl-C waited for the loop to be free, so the rows after the one running
    each made their paid call first (14 of 20, 4.5 s). Now the one running finishes and no
    other starts."""
    paid = tmp_path / "paid.log"
    (tmp_path / "play.py").write_text(BLOCKING_PLAY)
    proc = started_until(tmp_path, cli_env, paid, 3, "run", "play.py", "--set", f"log={paid}", "--run-id", "held")
    asked = time.time()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    after = [float(t) for t in paid.read_text().split() if float(t) > asked]
    assert not after, f"{len(after)} paid calls began after Ctrl-C"
    assert run_status(Path(cli_env["DEEPLINE_STORE"]), "held") == "interrupted"


SEQUENTIAL_PLAY = """
import time

from deepline_cli import play

def pay(i, log):  # a sync SDK's paid call: it blocks the event loop while it waits
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(f"{i}\\n")
    time.sleep(0.3)
    return i

@play("sequential")
async def sequential(ctx, input):
    out = []
    for i in range(10):  # one blocking step after another, no map
        out.append(await ctx.step(f"s{i}", lambda i=i: pay(i, input["log"])))
    return out
"""


@pytest.mark.process
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_a_blocking_step_leaves_the_run_interrupted_not_failed(
    tmp_path: Path, cli_env: dict[str, str], sig: signal.Signals
) -> None:
    """One blocking step after another, no map: the next step is refused by the signal's own
    handler before the loop hears the signal, and the run must end `interrupted` (it ended
    `failed`: "The run was interrupted. Next: fix the cause"), no step begun after it."""
    paid = tmp_path / "paid.log"
    (tmp_path / "play.py").write_text(SEQUENTIAL_PLAY)
    proc = started_until(tmp_path, cli_env, paid, 2, "run", "play.py", "--set", f"log={paid}", "--run-id", "seq")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert len(paid.read_text().split()) == 2, "no step began after the signal"
    assert run_status(Path(cli_env["DEEPLINE_STORE"]), "seq") == "interrupted", err[-800:]


NO_CALLS_PLAY = """
from deepline_cli import play

@play("nocalls")
async def nocalls(ctx, input):
    return {"ok": True}
"""

# `deepline` whose store is slow to read a run's history (a busy store): a worker's drain lands after the
# run is recorded and before its attempt installs its handlers (Runner.stop_pending).
SLOW_START = """
import sys, time
from deepline_cli.runtime.run import attempt
read = attempt.History.read
def slow(store, record, now):
    out = read(store, record, now)
    open("history.read", "w").close()
    time.sleep(1.5)
    return out
attempt.History.read = staticmethod(slow)
from deepline_cli.__main__ import entry
sys.argv = ["deepline", *sys.argv[1:]]
entry()
"""


@pytest.mark.process
def test_a_drain_heard_before_the_attempt_installs_its_handlers_is_no_signal(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """A worker's drain that lands after the run is recorded and before its attempt hears
    signals is no signal: a play that completes ends `completed` (not `interrupted` and
    queued again, its body to run again)."""
    (tmp_path / "play.py").write_text(NO_CALLS_PLAY)
    (tmp_path / "slow_start.py").write_text(SLOW_START)
    queued = subprocess.run(
        [sys.executable, "-m", "deepline_cli", "run", "play.py", "--enqueue", "--run-id", "drained"],
        cwd=tmp_path, env=cli_env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert queued.returncode == 0, queued.stderr
    worker = subprocess.Popen(
        [sys.executable, "slow_start.py", "worker"],
        cwd=tmp_path, env=cli_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    wait_until((tmp_path / "history.read").exists, what="the worker taking the run", alive=worker, every=0.01)
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert run_status(Path(cli_env["DEEPLINE_STORE"]), "drained") == "completed", err


CATCHING_PLAY = """
import asyncio

from deepline_cli import play, tool

@tool("crm.owner")
async def owner(input):
    await asyncio.sleep(0.02)
    with open(input["log"], "a") as log:
        log.write("x\\n")
    return "owner-" + str(input["n"])

async def owner_of(row, rc, log):  # a play's fallback: any failure of the lookup is "unknown"
    await asyncio.sleep(0.02)  # work of its own first: rows are out here when Ctrl-C comes
    try:
        return (await rc.tools.execute("owner", "crm.owner", {"n": row["n"], "log": log})).output
    except Exception as exc:
        return "unknown:" + type(exc).__name__

@play("catching")
async def catching(ctx, input):
    rows = await ctx.map("rows", [{"n": n} for n in range(400)], key="n", concurrency=10, columns={
        "owner": lambda row, rc: owner_of(row, rc, input["log"]),
    })
    return sorted({row["owner"] for row in rows if not row["owner"].startswith("owner-")})
"""


@pytest.mark.process
def test_a_resolver_that_catches_the_interrupt_does_not_keep_its_fallback(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """A column that catches every failure of its lookup (`except Exception: "unknown"`)
    caught the interrupt of a call Ctrl-C held back, and its row was recorded with the
    fallback: the resume gave it back as the row's value. Such a row is not recorded."""
    log = tmp_path / "calls.log"
    (tmp_path / "play.py").write_text(CATCHING_PLAY)
    proc = started_until(tmp_path, cli_env, log, 50, "run", "play.py", "--set", f"log={log}", "--run-id", "catch")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    resumed = subprocess.run(
        [sys.executable, "-m", "deepline_cli", "resume", "catch", "--json"],
        cwd=tmp_path, env=cli_env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.splitlines()[-1])["output"] == [], "rows kept the fallback of an interrupt"
