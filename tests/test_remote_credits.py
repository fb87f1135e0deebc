"""`--max-credits` counts remote tools: answers carry their credits, the config declares them.

The remote execution API is the real loopback provider (tests/provider.py) answering in
the remote envelope, `{"output": ..., "credits": N}`; plays run through the real command.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from tests.provider import Provider, ProviderServer, Seen

KEY = "dl-remote-key-0123456789"


class MeteredProvider(Provider):
    """A remote tool API that bills `n % 3 + 1` credits for payload `{"n": n}` (once per
    idempotency key) and says so in its answer; `silent` leaves credits out."""

    silent: bool = False

    def answer(self, seen: Seen) -> tuple[int, dict[str, str], bytes]:
        key = seen.headers.get("x-deepline-idempotency-key", "")
        n = seen.body["payload"]["n"]
        self.billed[key] += 0 if key in self.answers else 1
        envelope = self.answers.setdefault(key, {"output": {"n": n, "found": True}, "credits": n % 3 + 1})
        body = {"output": envelope["output"]} if self.silent else envelope
        return 200, {"content-type": "application/json"}, json.dumps(body).encode()


@pytest.fixture
def remote() -> Iterator[MeteredProvider]:
    with ProviderServer(MeteredProvider()) as running:
        assert isinstance(running, MeteredProvider)
        yield running


PLAY = """
from deepline_cli import play

@play("metered")
async def metered(ctx, input):
    out = []
    for n in range(input.get("calls", 6)):
        out.append((await ctx.tools.execute(f"c{n}", "vendor.lookup", {"n": n})).credits)
    return out
"""


@pytest.fixture
def project(tmp_path, write_play, remote):
    def make(credits: str = "") -> str:
        (tmp_path / "deepline.toml").write_text(
            textwrap.dedent(
                f"""\
                [remote]
                base_url = "{remote.url}"
                api_key_env = "METERED_KEY"
                {credits}
                """
            )
        )
        return str(write_play(PLAY))

    return make


def _finished(result) -> dict:
    return result.json_lines()[-1]


def test_remote_answers_carry_their_credits(deepline, project, remote) -> None:
    play = project()
    run = deepline("run", play, "--json", METERED_KEY=KEY)
    assert run.code == 0, run.stderr
    finished = _finished(run)
    assert finished["output"] == [1, 2, 3, 1, 2, 3]
    assert finished["stats"]["credits"] == 12
    assert finished["stats"]["tools"]["vendor.lookup"]["credits"] == 12
    receipts = deepline("receipts", "inspect", "--run", finished["run_id"], "--json").json_lines()
    assert sorted(r["credits"] for r in receipts) == [1, 1, 2, 2, 3, 3]


def test_max_credits_stops_undeclared_remote_tools_at_what_they_reported(deepline, project, remote) -> None:
    play = project()
    run = deepline("run", play, "--max-credits", "5", "--json", METERED_KEY=KEY)
    finished = _finished(run)
    assert run.code == 1 and finished["status"] == "failed"
    # The first call goes alone (1 credit); the second is expected to cost 1 (the most an
    # answer cost) and costs 2 (3 spent); the third is expected at 2, 5 fits, and costs 3:
    # 6 spent, 1 over, the run stops at once and says so.
    assert "--max-credits 5 was passed: 6 credits spent, 1 over" in finished["error"]["message"]
    assert len(remote.requests) == 3 and finished["stats"]["credits"] == 6
    resumed = deepline("resume", finished["run_id"], "--max-credits", "100", "--json", METERED_KEY=KEY)
    assert resumed.code == 0, resumed.stderr
    assert _finished(resumed)["stats"]["credits"] == 12
    assert len(remote.requests) == 6 and set(remote.billed.values()) == {1}  # nothing paid twice


def test_declared_remote_credits_are_reserved_before_the_call(deepline, project, remote) -> None:
    play = project('credits = { "vendor.lookup" = 3, "*" = 1 }')
    run = deepline("run", play, "--max-credits", "5", "--json", METERED_KEY=KEY)
    finished = _finished(run)
    # Reserved 3 each: after the first two calls (1 + 2 = 3 spent) a third would reach 6 > 5.
    assert run.code == 1 and len(remote.requests) == 2
    assert finished["stats"]["credits"] == 3
    listed = {r["id"]: r for r in deepline("tools", "list", "--json").json_lines()}
    assert listed["*"]["credits"] == 1


def test_silent_remote_answers_are_billed_at_the_declared_credits(deepline, project, remote) -> None:
    remote.silent = True
    play = project("credits = 2")
    run = deepline("run", play, "--max-credits", "7", "--json", METERED_KEY=KEY)
    assert run.code == 1 and len(remote.requests) == 3
    assert _finished(run)["stats"]["credits"] == 6


def test_a_budget_says_once_that_it_cannot_hold_a_remote_tool_of_no_known_price(deepline, project, remote) -> None:
    """The API says no price and none is declared: `--max-credits 2` let every call through
    as free without a word. It still does (nothing known to count), but says so, once."""
    remote.silent = True
    play = project()
    run = deepline("run", play, "--max-credits", "2", "--json", METERED_KEY=KEY)
    assert run.code == 0, run.stderr
    said = [e["message"] for e in run.json_lines() if e["event"] == "log" and "without a price" in e["message"]]
    assert len(said) == 1 and "vendor.lookup" in said[0] and "[remote] credits" in said[0], said
    quiet = deepline("run", play, "--json", "--run-id", "no-budget", METERED_KEY=KEY)  # no budget: nothing to say
    assert not [e for e in quiet.json_lines() if e["event"] == "log" and "without a price" in e.get("message", "")]


def test_remote_credits_must_be_numbers(deepline, project) -> None:
    play = project('credits = { "vendor.lookup" = "two" }')
    result = deepline("run", play, METERED_KEY=KEY)
    assert result.code == 2
    assert "[remote] credits for 'vendor.lookup' must be a number of credits" in result.stderr


MAPPED = """
from deepline_cli import play

@play("mapped")
async def mapped(ctx, input):
    rows = await ctx.map("rows", [{"n": n} for n in range(4)], key="n", columns={
        "hit": lambda row, rc: rc.tools.execute("lookup", "vendor.lookup", {"n": row["n"]}),
    })
    return {"rows": len(rows)}
"""


def test_plan_counts_declared_remote_credits_and_then_what_was_paid(deepline, project, remote, write_play) -> None:
    project('credits = { "vendor.lookup" = 3 }')
    play = str(write_play(MAPPED))
    before = deepline("plan", play, "--json", METERED_KEY=KEY)
    assert before.code == 0, before.stderr
    (column,) = before.json_lines()[-1]["maps"][0]["columns"]
    assert column["tools"] == {"vendor.lookup": 3.0} and column["new_calls"] == 4
    assert before.json_lines()[-1]["totals"]["credits"]["max"] == 12
    assert remote.requests == []  # planning called nothing
    run = deepline("run", play, "--json", METERED_KEY=KEY)
    assert run.code == 0 and _finished(run)["stats"]["credits"] == 1 + 2 + 3 + 1  # what the answers said
    after = deepline("plan", play, "--json", METERED_KEY=KEY).json_lines()[-1]
    assert after["totals"]["new_calls"] == 0 and after["totals"]["paid_rows"] == 4


def test_plan_has_no_maximum_for_a_remote_tool_of_no_known_price(deepline, project, remote, write_play) -> None:
    """No price declared and none learned: the plan said "max 0 credits" for a list that
    then cost 1,116."""
    project()
    plan = deepline("plan", str(write_play(MAPPED)), "--json", METERED_KEY=KEY).json_lines()[-1]
    assert plan["totals"]["credits"]["max"] is None, plan["totals"]
    assert any("prices its answers itself" in note for note in plan["maps"][0]["columns"][0]["notes"]), plan


def test_plan_bounds_a_remote_tool_at_the_most_it_has_cost_on_this_store(deepline, project, remote, write_play) -> None:
    """Declared at 1 credit, a remote tool's answers have cost up to 3 on this store: the
    budget holds 3 for each of its calls, and the plan's bound says the same (it used 1,
    and the run then paid past the plan's "max")."""
    project('credits = { "vendor.lookup" = 1 }')
    play = str(write_play(MAPPED))
    assert deepline("run", play, "--quiet", METERED_KEY=KEY).code == 0  # answers of 1, 2, 3 and 1 credits
    other = str(write_play(MAPPED.replace('{"n": row["n"]}', '{"n": row["n"] + 10}')))
    plan = deepline("plan", other, "--json", METERED_KEY=KEY).json_lines()[-1]
    (column,) = plan["maps"][0]["columns"]
    assert column["tools"] == {"vendor.lookup": 3.0}, column
    assert plan["totals"]["credits"]["max"] == 12


def test_a_remote_base_url_takes_its_secrets_like_every_url(deepline, tmp_path, write_play, remote) -> None:
    """`base_url = "http://127.0.0.1:${VENDOR_PORT}"`: filled from the environment as tool
    URLs are; `deepline check` names it when it is not set, instead of calling the config
    valid and every call failing on a port "${VENDOR_PORT}"."""
    port = remote.url.rsplit(":", 1)[1]
    (tmp_path / "deepline.toml").write_text(
        '[remote]\nbase_url = "http://127.0.0.1:${VENDOR_PORT}"\napi_key_env = "METERED_KEY"\n'
    )
    play = str(write_play(PLAY))
    unset = deepline("check", play, METERED_KEY=KEY)
    assert unset.code == 2 and "VENDOR_PORT" in unset.stderr + unset.stdout, unset.stdout + unset.stderr
    run = deepline("run", play, "--json", "--input", '{"calls": 2}', METERED_KEY=KEY, VENDOR_PORT=port)
    assert run.code == 0, run.stderr
    assert _finished(run)["output"] == [1, 2]


class OddCredits(MeteredProvider):
    """Answers each call with the credits text it is given, as it is written (raw JSON)."""

    credits_text: str = "1"

    def answer(self, seen: Seen) -> tuple[int, dict[str, str], bytes]:
        key = seen.headers.get("x-deepline-idempotency-key", "")
        self.billed[key] += 1
        body = f'{{"output": {{"n": {seen.body["payload"]["n"]}}}, "credits": {self.credits_text}}}'
        return 200, {"content-type": "application/json"}, body.encode()


def _run_answering(deepline, tmp_path, write_play, credits_text: str) -> tuple[Any, OddCredits]:
    with ProviderServer(OddCredits()) as running:
        assert isinstance(running, OddCredits)
        running.credits_text = credits_text
        (tmp_path / "deepline.toml").write_text(
            f'[remote]\nbase_url = "{running.url}"\napi_key_env = "METERED_KEY"\nretries = 0\n'
        )
        play = write_play(PLAY.replace('input.get("calls", 6)', "1"))
        return deepline("run", str(play), "--json", METERED_KEY=KEY), running


@pytest.mark.parametrize("credits_text", ["1" + "0" * 400, "-1" + "0" * 400, "1e999", "-1e999"])
def test_an_answer_whose_credits_json_cannot_hold_is_kept_and_its_credits_not_said(
    deepline, tmp_path, write_play, credits_text
) -> None:
    """A paid answer whose credits no float holds (a 400-digit integer: the recorder raised
    OverflowError and kept the paid answer as a failure) is kept, its credits recorded as
    JSON holds them (null: not said, as Infinity is), so the declared price counts."""
    run, provider = _run_answering(deepline, tmp_path, write_play, credits_text)
    finished = _finished(run)
    assert run.code == 0 and finished["status"] == "completed", (run.stderr, finished.get("error"))
    assert finished["output"] == [0.0] and finished["stats"]["credits"] == 0
    assert sum(provider.billed.values()) == 1


@pytest.mark.parametrize("credits_text", ["true", "-2", '"3"'])
def test_an_answer_whose_credits_are_no_count_of_credits_fails_its_call_and_says_why(
    deepline, tmp_path, write_play, credits_text
) -> None:
    run, _ = _run_answering(deepline, tmp_path, write_play, credits_text)
    finished = _finished(run)
    assert run.code == 1 and finished["status"] == "failed", run.stderr
    assert "Traceback" not in run.stderr
    message = finished["error"]["message"]
    assert "vendor.lookup" in message and "credits" in message and "not a number" in message, message
    assert finished["stats"]["credits"] == 0
