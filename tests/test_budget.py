"""`--max-credits` is a promise, kept with tools whose answers say what they cost.

The promise (README, "Budgets"): a call is sent only while spent + what calls in flight are
expected to cost + its own expected cost fit the budget; a metered tool's expected cost is
the most one of its answers has cost (in this run, earlier attempts or earlier runs), at
least what is declared, and its first call goes alone. So the run overspends only by what
calls in flight when an overrun was learned cost beyond what was expected of them.

A real remote tool API (tests/provider.py's server) bills each idempotency key once and
says what each answer cost; its own count of what it billed is the truth these tests hold
the run to. Plays run through the real command, killed with a real SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import Result
from tests.helpers import runs, wait_until
from tests.provider import Provider, ProviderServer, Seen

KEY = "dl-remote-key-0123456789"
Run = Callable[..., Result]


class PricedProvider(Provider):
    """A remote tool API: payload {"n": n} costs `price(n)` credits, billed once per key."""

    def __init__(self, price: Callable[[int], float], latency_s: float = 0.0) -> None:
        super().__init__(latency_s=latency_s)
        self.price = price

    def answer(self, seen: Seen) -> tuple[int, dict[str, str], bytes]:
        key = seen.headers.get("x-deepline-idempotency-key", "")
        n = seen.body["payload"]["n"]
        if key not in self.answers:
            self.billed[key] += 1
            self.answers[key] = {"output": {"n": n}, "credits": self.price(n)}
        return 200, {"content-type": "application/json"}, json.dumps(self.answers[key]).encode()

    def spent(self) -> float:
        return sum(answer["credits"] for answer in self.answers.values())


PLAY = """
from deepline_cli import play

@play("priced")
async def priced(ctx, input):
    rows = await ctx.map("rows", [{"n": n} for n in range(input.get("rows", 40))], key="n", columns={
        "hit": lambda row, rc: rc.tools.execute("lookup", "vendor.lookup", {"n": row["n"]}),
    })
    return {"rows": len(rows)}
"""


@pytest.fixture
def server() -> Iterator[Callable[..., PricedProvider]]:
    """Start a priced provider (stopped when the test ends)."""
    with contextlib.ExitStack() as stack:

        def start(price: Callable[[int], float], latency_s: float = 0.0) -> PricedProvider:
            running = stack.enter_context(ProviderServer(PricedProvider(price, latency_s)))
            assert isinstance(running, PricedProvider)
            return running

        yield start


@pytest.fixture
def project(tmp_path: Path) -> Callable[..., Path]:
    def make(provider: PricedProvider, declared: str = "") -> Path:
        (tmp_path / "deepline.toml").write_text(
            f'[remote]\nbase_url = "{provider.url}"\napi_key_env = "METERED_KEY"\n{declared}\n'
        )
        play = tmp_path / "play.py"
        play.write_text(textwrap.dedent(PLAY))
        return play

    return make


def finished(result: Result) -> dict:
    event = result.json_lines()[-1]
    assert event["event"] == "run.finished", result.stderr
    return event


@pytest.mark.parametrize("declared", ["", "credits = 1"], ids=["undeclared", "declared-too-low"])
def test_answers_dearer_than_declared_never_overspend_a_flat_price(
    deepline: Run, project: Callable[..., Path], server: Callable[..., PricedProvider], declared: str
) -> None:
    """Every answer costs 4, declared nowhere or declared at 1, 50 calls in flight allowed:
    the first call goes alone, after it every call is expected at 4. The promise allows no
    overrun here (no answer costs more than the first): spent ≤ 20 exactly, as billed."""
    provider = server(lambda n: 4.0)
    play = project(provider, declared)
    run = deepline("run", str(play), "--max-credits", "20", "--json", METERED_KEY=KEY)
    event = finished(run)
    assert run.code == 1 and event["status"] == "failed"
    assert "--max-credits 20 would be exceeded" in event["error"]["message"]
    assert provider.spent() == event["stats"]["credits"] == 20  # 5 calls, what the provider billed
    assert len(provider.requests) == 5


def test_answers_of_varying_price_overspend_at_most_what_was_in_flight(
    deepline: Run, project: Callable[..., Path], server: Callable[..., PricedProvider]
) -> None:
    """Answers cost 1, 2 or 3 (n % 3 + 1); two calls in flight at most. The first answer
    (1) sets the expected cost, and a dearer answer raises it at once: the run can pass
    the budget only by what the calls in flight cost beyond what was expected of them, two
    calls × (3 - 1) = 4 credits at most."""
    provider = server(lambda n: n % 3 + 1.0, latency_s=0.01)
    play = project(provider)
    run = deepline("run", str(play), "--max-credits", "20", "--concurrency", "2", "--json", METERED_KEY=KEY)
    event = finished(run)
    assert run.code == 1
    spent = provider.spent()
    assert spent == event["stats"]["credits"]
    assert 18 <= spent <= 20 + 2 * (3 - 1), spent
    if spent > 20:
        assert f"{spent - 20:g} over" in event["error"]["message"]


@pytest.mark.process
def test_a_budget_holds_across_sigkill_and_resume(
    deepline: Run,
    spawn: Callable[..., subprocess.Popen[str]],
    project: Callable[..., Path],
    server: Callable[..., PricedProvider],
    store_url: str,
) -> None:
    """Answers cost 4 (undeclared); the run is killed half way through its budget, then
    resumed with the same budget: the resumed attempt remembers what answers cost (the
    store keeps it), so the two attempts together spend at most 100, as billed."""
    provider = server(lambda n: 4.0, latency_s=0.05)
    play = project(provider)
    env = {"METERED_KEY": KEY, "DEEPLINE_STORE": store_url}
    proc = spawn(
        "run", str(play), "--set", "rows=60", "--max-credits", "100", "--run-id", "budget-kill", "--json", **env
    )
    wait_until(lambda: len(provider.billed) >= 10, what="ten billed calls")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    resumed = deepline("resume", "budget-kill", "--max-credits", "100", "--json", **env)
    event = finished(resumed)
    assert resumed.code == 1 and "--max-credits 100 would be exceeded" in event["error"]["message"]
    assert provider.spent() == event["stats"]["credits"] == 100
    assert set(provider.billed.values()) == {1}  # nothing billed twice


TENTHS_PLAY = """
from deepline_cli import play, tool

@tool("cheap.lookup", credits=0.1, concurrency=1)
def cheap(input):
    return {"v": input["i"] * 2}

@play("tenths")
async def tenths(ctx, input):
    rows = await ctx.map("m", [{"i": i} for i in range(30)], key="i", concurrency=1, columns={
        "v": lambda row, rc: rc.tools.execute("c", "cheap.lookup", {"i": row["i"]}),
    })
    return {"rows": len(rows)}
"""


def test_calls_of_fractional_credits_fill_a_budget_exactly(deepline: Run, tmp_path: Path) -> None:
    """30 calls of 0.1 credits fit a budget of 3: credits add up as the decimals they are
    (not 2.9000000000000004 + 0.1 > 3), and every figure says 3."""
    play = tmp_path / "play.py"
    play.write_text(TENTHS_PLAY)
    result = deepline("run", str(play), "--max-credits", "3", "--json", "--run-id", "tenths")
    assert result.code == 0, result.stdout[-1500:] + result.stderr
    stats = result.json_lines()[-1]["stats"]
    assert stats["credits"] == 3
    assert stats["tools"]["cheap.lookup"]["credits"] == 3
    shown = json.loads(deepline("runs", "show", "tenths", "--json").stdout)
    assert shown["stats"]["credits"] == 3
    assert shown["stats"]["tools"]["cheap.lookup"]["credits"] == 3


def test_an_overrun_says_what_the_run_spent_once_its_calls_in_flight_ended() -> None:
    """Four calls in flight, each expected at 5, answer 8: the run passed the budget at the
    first answer past it, and the later ones added more. The error says what was spent in
    the end (as `runs show` and the receipts do) and what the calls were expected to cost."""
    import asyncio

    from deepline_cli.runtime.calls.budget import Budget

    async def scenario() -> str:
        budget = Budget(40.0, spent=20.0, known={"vendor.person": 5.0})
        held = [await budget.admit("vendor.person", 1.0, f"c{n}", metered=True) for n in range(4)]
        errors = [budget.settle(reservation, 8.0) for reservation in held]
        first = next(e for e in errors if e is not None)
        assert all(e is first for e in errors if e is not None)  # one error: the breaker keeps the first
        return str(first)

    message = asyncio.run(scenario())
    assert "52 credits spent, 12 over" in message, message
    assert "(the last one 8, 5 expected)" in message, message


def test_a_call_waits_while_calls_in_flight_hold_its_credits_and_is_refused_once_spent_leaves_no_room() -> None:
    """The budget is held whole by calls in flight: a new call waits for them (not refused
    at once, which stopped the held calls unsent). One of them fails, unbilled: its credits
    come back and the waiting call is admitted. Once all are spent, the next is refused,
    its message saying what was spent."""
    import asyncio

    from deepline_cli.errors import BudgetExceededError
    from deepline_cli.runtime.calls.budget import Budget

    async def scenario() -> str:
        budget = Budget(30.0)
        held = [await budget.admit("t.enrich", 2.0, f"c{n}") for n in range(15)]
        waiting = asyncio.create_task(budget.admit("t.enrich", 2.0, "w"))
        for _ in range(3):
            await asyncio.sleep(0)
        assert not waiting.done()  # the budget is held, not spent: it waits
        budget.release(held[0])  # a call that failed: not billed
        admitted = await asyncio.wait_for(waiting, 5)
        for reservation in [*held[1:], admitted]:
            budget.settle(reservation, 2.0)
        with pytest.raises(BudgetExceededError) as refused:
            await asyncio.wait_for(budget.admit("t.enrich", 2.0, "e"), 5)
        return str(refused.value)

    message = asyncio.run(scenario())
    said = "would be exceeded by 'e' (t.enrich, expected to cost 2; 30 spent, 0 held for calls in flight)"
    assert said in message, message


PACED_PLAY = """
from deepline_cli import play, tool

@tool("paced.lookup", credits=1, rate_limit="1000/s")
def lookup(input):
    with open(input["log"], "a") as f:
        f.write(f"{input['i']}\\n")
    return input["i"]

@play("paced")
async def paced(ctx, input):
    rows = await ctx.map("m", [{"i": i} for i in range(30)], key="i", columns={
        "v": lambda row, rc: rc.tools.execute("l", "paced.lookup", {"i": row["i"], "log": input["log"]}),
    })
    return {"rows": len(rows)}
"""


def test_a_budget_below_the_lists_cost_pays_what_it_allows_then_each_resume_goes_on(
    deepline: Run, tmp_path: Path
) -> None:
    """A rate-limited tool: every row holds its credits while it waits for its slot, so the
    eleventh row's call found the budget of 10 held, was refused, and the refusal stopped the
    ten held calls before any was sent: nothing was ever paid, on any resume. A call waits
    while calls in flight hold the credits it needs; it is refused once what was spent
    leaves no room. So 10 are paid, then 10 more on a resume with 20, then the rest."""
    play = tmp_path / "play.py"
    play.write_text(PACED_PLAY)
    log = tmp_path / "calls.log"
    payload = json.dumps({"log": str(log)})

    def paid() -> list[str]:
        return log.read_text().split() if log.exists() else []

    first = deepline("run", str(play), "--input", payload, "--max-credits", "10", "--run-id", "pace")
    assert first.code == 1, first.stderr
    assert "--max-credits 10 would be exceeded" in first.stderr and "10 spent" in first.stderr, first.stderr
    assert len(paid()) == 10
    second = deepline("resume", "pace", "--max-credits", "20")
    assert second.code == 1, second.stderr
    assert len(paid()) == 20 and len(set(paid())) == 20
    last = deepline("resume", "pace", "--max-credits", "30", "--json")
    assert last.code == 0, last.stderr
    assert last.json_lines()[-1]["stats"]["credits"] == 30
    assert sorted(map(int, paid())) == list(range(30))  # each paid once


SWALLOWING_PLAY = """
from deepline_cli import play, tool

@tool("paid.lookup", credits=1, concurrency=1)
def lookup(input):
    with open(input["log"], "a") as f:
        f.write(f"{input['i']}\\n")
    return {"v": input["i"] * 2}

@play("swallowing")
async def swallowing(ctx, input):
    async def careful(row, rc):
        try:
            return (await rc.tools.execute("l", "paid.lookup", {"i": row["i"], "log": input["log"]})).output["v"]
        except Exception:  # the defensive habit: a provider that fails leaves the cell empty
            return None

    rows = await ctx.map("m", [{"i": i} for i in range(6)], key="i", concurrency=1, columns={"v": careful})
    return {"values": [row["v"] for row in rows]}
"""


def test_a_budget_refusal_the_play_catches_still_stops_the_run_and_keeps_no_empty_cell(
    deepline: Run, tmp_path: Path
) -> None:
    """A resolver's `except Exception` catches the budget's refusal: the run still fails on
    the budget (not "completed" with empty cells), the rows the refusal emptied are not
    recorded, and a resume with a bigger budget fills them, each call paid once."""
    play = tmp_path / "play.py"
    play.write_text(SWALLOWING_PLAY)
    log = tmp_path / "calls.log"
    payload = json.dumps({"log": str(log)})
    first = deepline("run", str(play), "--input", payload, "--max-credits", "3", "--run-id", "sw")
    assert first.code == 1, first.stderr
    assert "--max-credits 3" in first.stderr
    assert log.read_text().split() == ["0", "1", "2"]
    resumed = deepline("resume", "sw", "--max-credits", "10", "--json")
    assert resumed.code == 0, resumed.stderr
    assert resumed.json_lines()[-1]["output"] == {"values": [0, 2, 4, 6, 8, 10]}
    assert sorted(log.read_text().split()) == ["0", "1", "2", "3", "4", "5"]  # each paid once


STEP_CATCHING_PLAY = """
from deepline_cli import play, tool

@tool("paid.find", credits=1)
def find(input):
    with open(input["log"], "a") as f:
        f.write(input["d"] + "\\n")
    return {"email": "x@" + input["d"]}

@play("stepcatch")
async def stepcatch(ctx, input):
    first = (await ctx.tools.execute("a", "paid.find", {"d": "a.com", "log": input["log"]})).output["email"]

    async def lookup():
        try:
            return (await ctx.tools.execute("b", "paid.find", {"d": "b.com", "log": input["log"]})).output["email"]
        except Exception:
            return "fallback"

    return {"first": first, "second": await ctx.step("lookup", lookup)}
"""


def test_a_budget_refusal_caught_inside_a_step_is_not_kept_as_its_value(deepline: Run, tmp_path: Path) -> None:
    """`ctx.step` whose function catches the budget's refusal: the step's "fallback" is not
    recorded (a resume would replay it and never make the call); a resume with more budget
    makes the call."""
    play = tmp_path / "play.py"
    play.write_text(STEP_CATCHING_PLAY)
    log = tmp_path / "calls.log"
    payload = json.dumps({"log": str(log)})
    assert deepline("run", str(play), "--input", payload, "--max-credits", "1", "--run-id", "sc").code == 1
    resumed = deepline("resume", "sc", "--max-credits", "5", "--json")
    assert resumed.code == 0, resumed.stderr
    assert resumed.json_lines()[-1]["output"] == {"first": "x@a.com", "second": "x@b.com"}
    assert log.read_text().split() == ["a.com", "b.com"]


def test_a_run_stopped_by_its_budget_says_to_resume_it_with_a_higher_one(deepline: Run, tmp_path: Path) -> None:
    """Its `Next:` said `deepline resume RUN`, which stops again at once: the budget stays
    with the run."""
    play = tmp_path / "play.py"
    play.write_text(TENTHS_PLAY)
    stopped = deepline("run", str(play), "--max-credits", "1", "--run-id", "tight")
    assert stopped.code == 1, stopped.stderr
    assert "Next: deepline resume tight --max-credits N (N above 1, the budget it stopped at)" in stopped.stderr
    assert deepline("resume", "tight", "--max-credits", "5").code == 0


def test_a_refusal_the_run_stops_with_says_how_far_calls_in_flight_passed_the_budget() -> None:
    """A call refused while calls in flight held credits; those then cost more than
    expected, past the budget. The run's error (the refusal: the breaker keeps the first)
    said "would be exceeded" and "90 spent in the end", never that the budget was passed."""
    import asyncio

    from deepline_cli.errors import BudgetExceededError
    from deepline_cli.runtime.calls.budget import Budget

    async def scenario() -> str:
        budget = Budget(20.0, spent=18.0, known={"p.search": 1.0})
        held = [await budget.admit("p.search", 0.0, f"c{n}", metered=True) for n in range(2)]
        with pytest.raises(BudgetExceededError) as refused:
            budget.reserve("p.enrich", 3.0, "dear")  # 18 spent + 3 cannot fit 20, whatever ends
        for reservation in held:
            budget.settle(reservation, 8.0)
        return str(refused.value)

    message = asyncio.run(scenario())
    assert "34 spent in the end, 14 over" in message, message


def test_a_failed_run_queued_again_with_a_higher_budget_runs_with_it(deepline: Run, tmp_path: Path) -> None:
    """`run --enqueue --run-id RUN --max-credits N` of a run its budget stopped queued it
    again, said nothing of N, and the worker stopped it at the old budget once more (an
    attempt spent): the flags given hold for the runs it queues again, as for `resume`."""
    play = tmp_path / "play.py"
    play.write_text(TENTHS_PLAY)
    assert deepline("run", str(play), "--enqueue", "--run-id", "q-tight", "--max-credits", "1").code == 0
    assert deepline("worker", "--once").code == 0
    assert runs(deepline)["q-tight"]["status"] == "failed"
    again = deepline("run", str(play), "--enqueue", "--run-id", "q-tight", "--max-credits", "5")
    assert again.code == 0, again.stderr
    assert runs(deepline)["q-tight"]["options"]["max_credits"] == 5
    assert deepline("worker", "--once").code == 0
    run = runs(deepline)["q-tight"]
    assert (run["status"], run["output"]) == ("completed", {"rows": 30}), run


REFRESHED_PLAY = """
import os

from deepline_cli import play, tool

@tool("refreshed.lookup", credits=1)
def lookup(input):
    if input["i"] < 3 and os.path.exists(input["down"]):
        raise ValueError("no such company")
    with open(input["log"], "a") as f:
        f.write(f"{input['i']}\\n")
    return input["i"]

@play("refreshed")
async def refreshed(ctx, input):
    rows = await ctx.map("m", [{"i": i} for i in range(10)], key="i", concurrency=1, columns={
        "v": lambda row, rc: rc.tools.execute("l", "refreshed.lookup", {"i": row["i"], **input}),
    })
    return {"rows": len(rows), "failed": rows.failed_count}
"""


def test_a_refresh_a_budget_stopped_before_it_began_is_made_by_the_next_resume(deepline: Run, tmp_path: Path) -> None:
    """`resume --refresh-failed` with no budget left stopped before it asked the run's failed
    calls again; the resume the stop advises (`--max-credits` higher) kept the flag but asked
    none of them: the run completed with its rows still failed."""
    play = tmp_path / "play.py"
    play.write_text(REFRESHED_PLAY)
    log, down = tmp_path / "calls.log", tmp_path / "down"
    down.touch()
    payload = json.dumps({"log": str(log), "down": str(down)})

    first = deepline("run", str(play), "--input", payload, "--max-credits", "5", "--run-id", "nightly")
    assert first.code == 1 and "--max-credits 5" in first.stderr, first.stderr
    down.unlink()  # the provider knows those companies now
    refused = deepline("resume", "nightly", "--refresh-failed")
    assert refused.code == 1 and "--max-credits 5" in refused.stderr, refused.stderr
    done = deepline("resume", "nightly", "--max-credits", "100", "--json")

    assert done.code == 0, done.stderr
    assert done.json_lines()[-1]["output"] == {"rows": 10, "failed": 0}
    assert sorted(map(int, log.read_text().split())) == list(range(10))  # each paid once


PAID_ONE = """
import asyncio
from pathlib import Path

from deepline_cli import BudgetExceededError, play, tool

@tool("paid.one", credits=1)
async def one(input):
    with open(input["log"], "a") as f:
        f.write(f"{input['i']}\\n")
    return {"v": input["i"] * 2}

async def until(done, what):  # the order of the rows, by what they did (10 s at most)
    for _ in range(1000):
        if done():
            return
        await asyncio.sleep(0.01)
    raise TimeoutError(f"never came: {what}")  # the row fails: the test sees it

def paid(log):
    return len(Path(log).read_text().split()) if Path(log).exists() else 0

async def ask_last(ctx_tools, input):
    \"\"\"A later row: it asks once the first three rows' calls are paid, and says when the
    budget refused it (the first three rows are still at their own work then).\"\"\"
    await until(lambda: paid(input["log"]) >= 3, "the first three paid")
    try:
        return await ctx_tools.execute("x", "paid.one", input)
    except BudgetExceededError:
        Path(input["log"] + ".refused").touch()
        raise

async def finish_after_refusal(input):
    \"\"\"A first row, its call answered: its own work goes on until the budget refused another.\"\"\"
    await until(lambda: Path(input["log"] + ".refused").exists(), "a refusal")
"""

FINISHING_PLAY = (
    PAID_ONE
    + """
@play("finishing")
async def finishing(ctx, input):
    async def cell(row, rc):
        asked = {"i": row["i"], "log": input["log"]}
        if row["i"] < 3:  # asked at once, then the row's own work goes on after its answer
            found = await rc.tools.execute("x", "paid.one", asked)
            await finish_after_refusal(asked)
            return found.output["v"]
        return (await ask_last(rc.tools, asked)).output["v"]  # the budget runs out among these

    rows = await ctx.map("m", [{"i": i} for i in range(10)], key="i", columns={"v": cell})
    return {"values": [row["v"] for row in rows]}
"""
)


def test_rows_whose_calls_all_answered_are_kept_when_another_row_meets_the_budget(
    deepline: Run, tmp_path: Path
) -> None:
    """The budget stopped the run while three rows, their calls answered and paid, were
    still at their own work: they were dropped with the rows that were refused (`runs show`
    said 0 succeeded and the export had none of them, though their answers were paid)."""
    play = tmp_path / "play.py"
    play.write_text(FINISHING_PLAY)
    log = tmp_path / "calls.log"
    payload = json.dumps({"log": str(log)})
    first = deepline("run", str(play), "--input", payload, "--max-credits", "5", "--run-id", "fin", "--json")
    assert first.code == 1, first.stderr
    shown = deepline("runs", "show", "fin", "--json")
    (m,) = json.loads(shown.stdout)["maps"]
    paid = sorted(map(int, log.read_text().split()))
    assert paid[:3] == [0, 1, 2] and len(paid) == 5
    # The first three, at their own work when the refusal came, and the two paid after them.
    assert (m["succeeded"], m["failed"]) == (5, 0), m
    resumed = deepline("resume", "fin", "--max-credits", "20", "--json")
    assert resumed.code == 0, resumed.stderr
    assert resumed.json_lines()[-1]["output"] == {"values": [i * 2 for i in range(10)]}
    assert sorted(map(int, log.read_text().split())) == list(range(10))  # each paid once


CATCHING_PARENT = """
from deepline_cli import play

@play("parent")
async def parent(ctx, input):
    async def person(row, rc):
        try:
            return (await rc.run_play("kid", "kid.py", {"i": row["i"], "log": input["log"]}))["v"]
        except Exception:  # the defensive habit: a child that fails leaves the cell empty
            return None

    rows = await ctx.map("m", [{"i": i} for i in range(4)], key="i", concurrency=1, columns={"v": person})
    return {"values": [row["v"] for row in rows]}
"""

PAID_KID = """
from deepline_cli import play, tool

@tool("paid.kid", credits=1)
def lookup(input):
    with open(input["log"], "a") as f:
        f.write(f"{input['i']}\\n")
    return {"v": input["i"] * 3}
"""

CATCHING_KID = (
    PAID_KID
    + """
@play("kid")
async def kid(ctx, input):
    async def v(row, rc):
        return (await rc.tools.execute("l", "paid.kid", {"i": row["i"], "log": row["log"]})).output["v"]

    rows = await ctx.map("k", [input], key="i", columns={"v": v})
    return {"v": next(iter(rows))["v"]}
"""
)


def test_a_childs_budget_refusal_the_parent_catches_keeps_no_empty_cell(deepline: Run, tmp_path: Path) -> None:
    """The refusal met inside a child play's own map, caught by the parent's resolver: the
    parent's row is not kept with the empty value it made of it; a resume fills it."""
    (tmp_path / "kid.py").write_text(CATCHING_KID)
    play = tmp_path / "play.py"
    play.write_text(CATCHING_PARENT)
    log = tmp_path / "calls.log"
    payload = json.dumps({"log": str(log)})
    assert deepline("run", str(play), "--input", payload, "--max-credits", "2", "--run-id", "kc").code == 1
    resumed = deepline("resume", "kc", "--max-credits", "10", "--json")
    assert resumed.code == 0, resumed.stderr
    assert resumed.json_lines()[-1]["output"] == {"values": [0, 3, 6, 9]}
    assert sorted(log.read_text().split()) == ["0", "1", "2", "3"]  # each paid once


FINISHING_KID = (
    PAID_ONE
    + """
@play("kid")
async def kid(ctx, input):
    if input["i"] < 3:  # asked at once, then the child's own work goes on after its answer
        found = await ctx.tools.execute("x", "paid.one", input)
        await finish_after_refusal(input)
        return {"v": found.output["v"]}
    return {"v": (await ask_last(ctx.tools, input)).output["v"]}  # the budget runs out among these
"""
)

FINISHING_PARENT = """
from deepline_cli import play

@play("parent")
async def parent(ctx, input):
    async def person(row, rc):
        return (await rc.run_play("kid", "kid.py", {"i": row["i"], "log": input["log"]}))["v"]

    rows = await ctx.map("m", [{"i": i} for i in range(10)], key="i", columns={"v": person})
    return {"values": [row["v"] for row in rows]}
"""


def test_child_plays_whose_calls_all_answered_complete_when_a_sibling_meets_the_budget(
    deepline: Run, tmp_path: Path
) -> None:
    """Children finishing their own work after a sibling's call met the budget failed with
    the budget's error though they met no refusal: their paid answers were in no row
    (`runs show`: 0 succeeded; the export empty), and the resume ran them again."""
    (tmp_path / "kid.py").write_text(FINISHING_KID)
    play = tmp_path / "play.py"
    play.write_text(FINISHING_PARENT)
    log = tmp_path / "calls.log"
    payload = json.dumps({"log": str(log)})
    first = deepline("run", str(play), "--input", payload, "--max-credits", "5", "--run-id", "kf")
    assert first.code == 1, first.stderr
    (m,) = json.loads(deepline("runs", "show", "kf", "--json").stdout)["maps"]
    assert (m["succeeded"], m["failed"]) == (5, 0), m  # as above: three at their own work, two paid after
    children = [json.loads(line) for line in deepline("runs", "list", "--play", "kid", "--json").stdout.splitlines()]
    done = [c for c in children if c.get("parent_run_id") == "kf" and c["status"] == "completed"]
    assert len(done) == m["succeeded"], (m, children)
    resumed = deepline("resume", "kf", "--max-credits", "20", "--json")
    assert resumed.code == 0, resumed.stderr
    assert resumed.json_lines()[-1]["output"] == {"values": [i * 2 for i in range(10)]}
    assert sorted(map(int, log.read_text().split())) == list(range(10))  # each paid once


SWALLOWING_KID = (
    PAID_KID
    + """
@play("kid")
async def kid(ctx, input):
    try:
        return {"v": (await ctx.tools.execute("l", "paid.kid", input)).output["v"]}
    except Exception:  # the child swallows the refusal itself
        return {"v": None}
"""
)


def test_a_child_that_catches_its_own_budget_refusal_is_not_completed_with_what_it_made_of_it(
    deepline: Run, tmp_path: Path
) -> None:
    (tmp_path / "kid.py").write_text(SWALLOWING_KID)
    play = tmp_path / "play.py"
    play.write_text(CATCHING_PARENT)
    log = tmp_path / "calls.log"
    payload = json.dumps({"log": str(log)})
    assert deepline("run", str(play), "--input", payload, "--max-credits", "2", "--run-id", "ks").code == 1
    kids = [json.loads(line) for line in deepline("runs", "list", "--play", "kid", "--json").stdout.splitlines()]
    assert sorted(k["status"] for k in kids) == ["completed", "completed", "failed"], kids
    resumed = deepline("resume", "ks", "--max-credits", "10", "--json")
    assert resumed.code == 0, resumed.stderr
    assert resumed.json_lines()[-1]["output"] == {"values": [0, 3, 6, 9]}
    assert sorted(log.read_text().split()) == ["0", "1", "2", "3"]  # each paid once


def test_a_child_run_stopped_by_the_budget_says_to_resume_its_root_with_a_higher_one(
    deepline: Run, tmp_path: Path
) -> None:
    """A child resumed on its own that meets the budget said `deepline resume CHILD
    --max-credits N`, which is refused (a child spends its root's budget)."""
    (tmp_path / "kid.py").write_text(CATCHING_KID)
    play = tmp_path / "play.py"
    play.write_text(CATCHING_PARENT.replace("        except Exception:", "        except KeyError:"))
    log = tmp_path / "calls.log"
    payload = json.dumps({"log": str(log)})
    assert deepline("run", str(play), "--input", payload, "--max-credits", "2", "--run-id", "kb").code == 1
    kids = [json.loads(line) for line in deepline("runs", "list", "--play", "kid", "--json").stdout.splitlines()]
    (stopped,) = [k for k in kids if k["status"] == "failed"]
    again = deepline("resume", stopped["run_id"])
    assert again.code == 1, again.stderr
    assert "Next: deepline resume kb --max-credits N" in again.stderr, again.stderr
    assert deepline("resume", "kb", "--max-credits", "10").code == 0
