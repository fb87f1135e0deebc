"""The authoring surface real plays use: waterfalls, `rc.previous`, `Column(recompute=…)`,
staleness as a function, tool results (`.raw`, extracted values and lists, `description=`),
`ctx.csv(columns=…)` for messy headers, and a dataset's `count`, `peek` and `materialize`.

Plays run in-process through the real `Runner` (each store backend in turn) where the
engine's behaviour is what is tested, and through the real command in a subprocess where
what a person sees or gets from the command line is; HTTP tools call a real loopback
provider.
"""

from __future__ import annotations

import csv
import json
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from deepline_cli.runtime.calls.events import Event, EventBus
from deepline_cli.runtime.run.options import RunResult
from deepline_cli.testing import FakeProvider, Request
from tests.conftest import Result
from tests.helpers import run_play
from tests.provider import Provider, ProviderServer

Run = Callable[..., Result]
CALLS: list[str] = []  # every tool invocation of the current test: "tool:row"

HEADER = """\
from deepline_cli import Column, ProviderTransientError, ToolExecutionError, play, steps, tool
from tests.test_authoring import CALLS

P = {prefix!r}
"""


@pytest.fixture(autouse=True)
def _fresh_calls() -> Iterator[None]:
    CALLS.clear()
    yield
    CALLS.clear()


@pytest.fixture
def make_play(tmp_path: Path, request: pytest.FixtureRequest) -> Callable[[str], Path]:
    prefix = "ta." + request.node.name

    def write(body: str) -> Path:
        path = tmp_path / "play.py"
        path.write_text(HEADER.format(prefix=prefix) + textwrap.dedent(body))
        return path

    return write


def run(play: Path, store: str, input: dict[str, Any] | None = None, **options: Any) -> tuple[RunResult, list[Event]]:
    events: list[Event] = []
    result = run_play(play, store, input, bus=EventBus([events.append]), **options)
    assert result.status == "completed", result.error
    return result, events


# --- waterfalls ---------------------------------------------------------------------------------

WATERFALL = """
KNOWN = {"a": {"ada"}, "b": {"ada", "bob"}, "c": {"ada", "bob", "cy"}}


def provider(name):
    @tool(P + "." + name)
    def find(input):
        CALLS.append(name + ":" + input["who"])
        if name == "b" and input["who"] == "dee":
            raise ProviderTransientError("503 from b", category="upstream", status_code=503)
        if name == "c" and input["who"] == "eve":
            raise ToolExecutionError("404: nobody", category="validation", status_code=404)
        if name == "c" and input["who"] == "fay":
            raise ToolExecutionError("401: bad key", category="authentication", status_code=401)
        return {"email": input["who"] + "@" + name} if input["who"] in KNOWN[name] else {"email": None}
    return find


a, b, c = provider("a"), provider("b"), provider("c")


def ask(name):
    async def step(row, rc):
        result = await rc.tools.execute(name, P + "." + name, {"who": row["who"]})
        return result.get("email")
    return step


EMAIL = (
    steps()
    .step("a", ask("a"))
    .step("b", ask("b"))
    .step("c", ask("c"), run_if=lambda row, index: index != 1)  # never for the second row
)


@play("waterfall")
async def waterfall(ctx, input):
    rows = await ctx.map("people", [{"who": w} for w in input["who"]], key="who", columns={"email": EMAIL})
    return {r["who"]: [r["email"], r["email_step"], r.get("_error")] for r in rows}
"""


def test_a_waterfall_stops_at_the_first_step_that_finds_a_value(make_play, store_url: str) -> None:
    play = make_play(WATERFALL)
    result, events = run(play, store_url, {"who": ["ada", "bob", "cy", "dee", "eve", "fay", "zed"]})
    out = result.output
    assert out["ada"] == ["ada@a", "a", None]  # found by the first step: the others are not asked
    assert out["bob"] == ["bob@b", "b", None]
    assert out["cy"] == ["cy@c", "c", None]
    # b was unavailable (503) and c did not know dee: no value, and the row fails so that a
    # later run asks again
    assert out["dee"][0] is None and "no step found a value, and step 'b' was unavailable" in out["dee"][2]
    assert out["eve"] == [None, None, None]  # c's 404 is "not found": the row succeeds empty
    assert "authentication" in out["fay"][2]  # any other error fails the row
    assert out["zed"] == [None, None, None]
    assert sorted(c for c in CALLS if c.startswith("ada") or c.endswith(":ada")) == ["a:ada"]
    assert "c:bob" not in CALLS  # run_if(row, index): not for the second row
    hits = result.stats["waterfalls"]["people"]["email"]
    assert hits == {"a": 1, "b": 1, "c": 1, "none": 2}
    [completed] = [e.data for e in events if e.event == "map.completed"]
    assert completed["steps"] == {"email": hits}  # the live figures are the store's

    again, _ = run(play, store_url, {"who": ["ada", "bob", "cy", "dee", "eve", "fay", "zed"]})
    assert again.stats["waterfalls"] == result.stats["waterfalls"]
    assert again.stats["rows"]["reused"] == 7


def test_a_waterfall_column_is_exported_with_the_step_that_found_it(make_play, deepline: Run, tmp_path: Path) -> None:
    play = make_play(WATERFALL)
    started = deepline("run", str(play), "--set", 'who=["ada", "bob", "zed"]', PYTHONPATH=str(Path.cwd()))
    assert started.code == 0, started.stderr
    assert "people email found by: a 1 · b 1 · not found 1" in started.stderr
    run_id = started.stderr.split("Run ")[1].split()[0]
    out = tmp_path / "people.csv"
    assert deepline("export", run_id, "--out", str(out)).code == 0
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["who", "email", "email_step", "_error"]
    assert [(r["email"], r["email_step"]) for r in rows] == [("ada@a", "a"), ("bob@b", "b"), ("", "")]


# --- recompute, rc.previous, staleness as a function ------------------------------------------------


def test_recompute_runs_the_resolver_every_run_and_sees_the_previous_value(make_play, store_url: str) -> None:
    play = make_play(
        """
        @tool(P + ".lookup")
        def lookup(input):
            CALLS.append("lookup:" + input["id"])
            return {"seen": input["id"]}

        async def count(row, rc):
            await rc.tools.execute("lookup", P + ".lookup", {"id": row["id"]})
            CALLS.append("count:" + row["id"])
            return (rc.previous or 0) + 1

        @play("recompute")
        async def recompute(ctx, input):
            rows = await ctx.map("m", [{"id": "1"}, {"id": "2"}], key="id",
                                 columns={"runs": Column(count, recompute=True)})
            return [r["runs"] for r in rows]
        """
    )
    assert run(play, store_url)[0].output == [1, 1]
    second, _ = run(play, store_url)
    assert second.output == [2, 2]  # rc.previous: the value the sheet held
    assert sorted(CALLS) == ["count:1", "count:1", "count:2", "count:2", "lookup:1", "lookup:2"]  # calls reused


def test_a_tool_call_may_go_stale_by_its_stored_answer(make_play, store_url: str) -> None:
    play = make_play(
        """
        @tool(P + ".check")
        def check(input):
            CALLS.append("check:" + input["id"])
            return {"found": input["id"] == "1"}

        def recheck(previous):
            return 3600 if previous and previous["found"] else 0  # a not-found is asked every run

        @play("stale-call")
        async def stale_call(ctx, input):
            out = []
            for id in ("1", "2"):
                result = await ctx.tools.execute("check", P + ".check", {"id": id}, stale_after_seconds=recheck)
                out.append(result.execution)
            return out
        """
    )
    assert run(play, store_url)[0].output == ["live", "live"]
    assert run(play, store_url)[0].output == ["receipt", "live"]
    assert CALLS == ["check:1", "check:2", "check:2"]


# --- tool results: raw answers, extracted values and lists, descriptions ---------------------------


@pytest.fixture
def people_api() -> Iterator[tuple[FakeProvider, str]]:
    api = FakeProvider("people")

    @api.route("POST", "/enrich")
    def enrich(request: Request) -> Any:
        who = (request.json or {})["who"]
        if who == "nobody":
            return 422, {"error": "who is that?"}
        return {"data": [{"email": [{"email": f"{who}@a.com"}, {"email": f"{who}@b.com"}, {"phone": "1"}]}]}

    with api.running() as url:
        yield api, url


def test_tool_results_give_raw_answers_extracted_values_and_lists(
    people_api: tuple[FakeProvider, str], deepline: Run, tmp_path: Path
) -> None:
    api, url = people_api
    (tmp_path / "deepline.toml").write_text(
        f'[tools."people.enrich"]\nurl = "{url}/enrich"\njson = {{ who = "{{who}}" }}\n'
        'extract = { emails = "data[0].email[*].email", first = "data.0.email.0.email" }\n'
    )
    (tmp_path / "play.py").write_text(
        textwrap.dedent(
            """
            from deepline_cli import ToolExecutionError, play

            @play("results")
            async def results(ctx, input):
                found = await ctx.tools.execute("enrich", "people.enrich", {"who": "ada"},
                                                description="work emails of a lead")
                try:
                    await ctx.tools.execute("enrich", "people.enrich", {"who": "nobody"},
                                            description="work emails of a lead")
                except ToolExecutionError as exc:
                    error = str(exc)
                return {"raw": found.raw, "emails": found.get("emails"), "first": found.get("first"),
                        "extracted": found.extracted, "error": error}
            """
        )
    )
    result = deepline("run", "play.py", "--json")
    assert result.code == 0, result.stderr
    output = result.json_lines()[-1]["output"]
    assert output["emails"] == ["ada@a.com", "ada@b.com"]
    assert output["first"] == "ada@a.com"
    assert output["extracted"] == {"emails": output["emails"], "first": "ada@a.com"}
    assert output["raw"]["data"][0]["email"][2] == {"phone": "1"}
    assert output["error"].startswith("work emails of a lead: 422 from people.enrich")
    inspected = deepline("receipts", "inspect", "--tool", "people.enrich", "--json")
    assert {r["description"] for r in inspected.json_lines()} == {"work emails of a lead"}
    assert api.stats()["requests"] == 2


def test_a_description_from_the_plays_data_that_is_a_number_is_said_as_text(
    people_api: tuple[FakeProvider, str], deepline: Run, tmp_path: Path
) -> None:
    """`description=` built from a row's data may be a number (a list id): it is the call's
    description all the same, in its error and its receipt, not a TypeError."""
    _, url = people_api
    (tmp_path / "deepline.toml").write_text(
        f'[tools."people.enrich"]\nurl = "{url}/enrich"\njson = {{ who = "{{who}}" }}\n'
    )
    (tmp_path / "play.py").write_text(
        textwrap.dedent(
            """
            from deepline_cli import ToolExecutionError, play

            @play("numbered")
            async def numbered(ctx, input):
                try:
                    await ctx.tools.execute("enrich", "people.enrich", {"who": "nobody"}, description=2024)
                except ToolExecutionError as exc:
                    return {"error": str(exc)}
            """
        )
    )
    result = deepline("run", "play.py", "--json")
    assert result.code == 0, result.stderr
    assert result.json_lines()[-1]["output"]["error"].startswith("2024: 422 from people.enrich")
    inspected = deepline("receipts", "inspect", "--tool", "people.enrich", "--json")
    assert {r["description"] for r in inspected.json_lines()} == {"2024"}


# --- CSV: headers as they come, and a look before the map -------------------------------------------

MESSY = "\ufeff First name ,COMPANY WEBSITE,Title\nAda,https://acme.com,CTO\n\nGrace,www.cobol.dev,VP\n"


def test_csv_columns_find_a_column_by_the_headers_it_may_have(deepline: Run, tmp_path: Path) -> None:
    (tmp_path / "leads.csv").write_text(MESSY, encoding="utf-8")
    (tmp_path / "play.py").write_text(
        textwrap.dedent(
            """
            from deepline_cli import play

            @play("messy")
            async def messy(ctx, input):
                leads = ctx.csv(input["csv"], required=["first_name", "domain"], description="a trade-show list",
                                columns={"first_name": ["First Name", "Firstname"],
                                         "domain": ["Website", "Company Website"], "phone": ["Phone"]})
                ahead = {"count": leads.count(), "peek": leads.peek(1)}
                hello = {"hello": lambda row: "hi " + row["first_name"]}
                rows = await ctx.map("leads", leads, key="first_name", columns=hello)
                return {**ahead, "rows": rows.count(), "first": rows.peek(1), "all": len(rows.materialize())}
            """
        )
    )
    result = deepline("run", "play.py", "--csv", "leads.csv", "--json")
    assert result.code == 0, result.stderr
    output = result.json_lines()[-1]["output"]
    assert output["count"] == 2 and output["rows"] == 2 and output["all"] == 2
    assert output["peek"] == [{"first_name": "Ada", "domain": "https://acme.com", "Title": "CTO", "phone": ""}]
    assert output["first"][0]["hello"] == "hi Ada"
    shown = json.loads(deepline("runs", "show", result.json_lines()[-1]["run_id"], "--json").stdout)
    assert shown["maps"][0]["rows"] == 2

    (tmp_path / "other.csv").write_text("Name,Site\nAda,acme.com\n")
    missing = deepline("run", "play.py", "--csv", "other.csv")
    assert missing.code == 2
    assert "required column 'first_name' is missing (looked for 'First Name', 'Firstname')" in missing.stderr


MISUSE = """
from deepline_cli import Column, play, tool

@tool("m.echo")
def echo(input):
    return input

@play("misused")
async def misused(ctx, input):
    case = input["case"]
    rows = [{"d": "a.com"}]
    if case == "stale-text":
        await ctx.tools.execute("e", "m.echo", {"d": 1}, stale_after_seconds="3600")
    elif case == "step-stale-text":
        await ctx.step("s", lambda: 1, stale_after_seconds="10")
    elif case == "column-stale-text":
        await ctx.map("m", rows, columns={"e": Column(lambda row: 1, stale_after_seconds="3600")})
    elif case == "run-if-text":
        await ctx.map("m", rows, columns={"e": Column(lambda row: 1, run_if="has_domain")})
    elif case == "limit-zero":
        await ctx.map("m", rows, columns={"e": lambda row: 1}, limit=0)
    elif case == "limit-negative":
        await ctx.map("m", rows, columns={"e": lambda row: 1}, limit=-5)
    elif case == "step-id-number":
        await ctx.step(5, lambda: 1)
    elif case == "sleep-text":
        await ctx.sleep("z", "10")
    elif case == "stale-function-of-function":
        await ctx.tools.execute("e", "m.echo", {"d": 2})
        await ctx.tools.execute("e", "m.echo", {"d": 2}, stale_after_seconds=lambda previous: (lambda: 1))
    elif case == "pairs":
        done = await ctx.map("m", [[("d", "a.com")], [("d", "b.com")]], key="d", columns={"e": lambda row: 1})
        return len(done)
    elif case == "columns-list":
        await ctx.map("m", rows, columns=[lambda row: 1])
    elif case == "rows-text":
        await ctx.map("m", ["a.com", "b.com"], columns={"e": lambda row: 1})
    return case
"""


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("stale-text", "stale_after_seconds must be a number of seconds"),
        ("step-stale-text", "stale_after_seconds must be a number of seconds"),
        ("column-stale-text", "Column(stale_after_seconds=...) must be a number of seconds"),
        ("run-if-text", "Column(run_if=...) must be a function"),
        ("limit-zero", "limit must be a whole number of rows, 1 or more"),
        ("limit-negative", "limit must be a whole number of rows, 1 or more"),
        ("step-id-number", "The id of ctx.step must be text"),
        ("sleep-text", "seconds must be a number"),
        ("stale-function-of-function", "The stale_after_seconds function's answer must be a number"),
        ("columns-list", "columns must be a dict"),
        ("rows-text", "row 1 is a str, not a dict of fields"),
    ],
)
def test_a_misused_call_is_one_sentence_naming_the_plays_line_at_its_first_run(
    deepline: Run, write_play: Callable[..., Path], case: str, words: str
) -> None:
    """A text TTL passed the first run (nothing stored to compare) and crashed every later
    one with a raw TypeError; `run_if="has_domain"` failed every row; `limit=0` ran nothing
    and reported success; a number as a step's id, text as a sleep's seconds: TypeErrors."""
    write_play(MISUSE)
    result = deepline("run", "play.py", "--set", f"case={case}")
    assert result.code == 2, result.stderr
    assert words in result.stderr and "play.py line" in result.stderr, result.stderr


def test_rows_given_as_pairs_of_name_and_value_are_rows(deepline: Run, write_play: Callable[..., Path]) -> None:
    write_play(MISUSE)
    result = deepline("run", "play.py", "--set", "case=pairs")
    assert result.code == 0 and result.stdout.strip() == "2", result.stderr


ONE_ID_TWO_CALLS = """
import os

from deepline_cli import play


@play("kid")
async def kid(ctx, input):
    return input["d"]


@play("ids")
async def ids(ctx, input):
    what = os.environ["ASK"]
    if what == "memo":  # the same call asked twice: its answer, twice
        load = lambda: {"n": 1}  # noqa: E731
        return [await ctx.step("config", load), await ctx.step("config", load)]
    if what == "cells":  # one id in two columns, each cell's own
        rows = await ctx.map("m", [{"d": "a"}, {"d": "b"}], key="d", columns={
            "x": lambda row, rc: rc.step("look", lambda: row["d"] + "x"),
            "y": lambda row, rc: rc.step("look", lambda: row["d"] + "y"),
        })
        return [(row["x"], row["y"]) for row in rows]
    out = []
    for d in ["acme.com", "globex.com"]:
        if what == "step":
            out.append(await ctx.step("company", lambda: d))
        elif what == "fetch":
            out.append((await ctx.fetch("company", f"{os.environ['PROVIDER']}/{d}")).status)
        elif what == "child":
            out.append(await ctx.run_play("company", "kid", {"d": d}))
        else:  # ctx (not rc) in a column
            rows = await ctx.map("m", [{"d": "a"}, {"d": "b"}], key="d",
                                 columns={"s": lambda row: ctx.step("s", lambda: row["d"])})
            return [row["s"] for row in rows]
    return out
"""


@pytest.mark.parametrize("ask", ["step", "fetch", "child", "column"])
def test_one_durable_id_given_to_two_different_calls_is_refused(
    tmp_path: Path, store_path: Path, monkeypatch: pytest.MonkeyPatch, ask: str
) -> None:
    """A loop's constant id (or `ctx.step` in a map column) named two calls as one: the
    second was answered with the first one's result (acme.com's for globex.com). Refused
    with one sentence; the same call asked again, and one id in two columns' cells, are not."""
    (tmp_path / "ids.py").write_text(ONE_ID_TWO_CALLS)
    monkeypatch.setenv("ASK", ask)
    with ProviderServer(Provider()) as provider:
        monkeypatch.setenv("PROVIDER", provider.url)
        result = run_play(Path(f"{tmp_path / 'ids.py'}:ids"), store_path)
    assert result.status == "failed" and result.exit_code == 2, (result.status, result.error, result.output)
    message = result.error["message"]
    assert "was given to two different calls in this run" in message, message
    assert ("rc.step keys it by the row" in message) == (ask == "column"), message


@pytest.mark.parametrize(("ask", "output"), [("memo", [{"n": 1}, {"n": 1}]), ("cells", [["ax", "ay"], ["bx", "by"]])])
def test_the_same_call_asked_again_or_one_id_in_two_cells_is_its_own(
    tmp_path: Path, store_path: Path, monkeypatch: pytest.MonkeyPatch, ask: str, output: Any
) -> None:
    (tmp_path / "ids.py").write_text(ONE_ID_TWO_CALLS)
    monkeypatch.setenv("ASK", ask)
    result = run_play(Path(f"{tmp_path / 'ids.py'}:ids"), store_path)
    assert (result.status, result.output) == ("completed", output), result.error


UNAWAITED = """
import asyncio
import os

from deepline_cli import play, tool


@tool("t.pay", credits=1)
def pay(input):
    with open(os.environ["PAID"], "a") as paid:
        paid.write(input["d"] + "\\n")
    return input["d"]


@play("gate")
async def gate(ctx, input):
    what = os.environ["ASK"]
    if what == "gathered":  # awaited through gather, another task calling meanwhile
        async def enrich():
            return (await ctx.tools.execute("p", "t.pay", {"d": "a"})).output
        return await asyncio.gather(ctx.sleep("nap", 0), enrich())
    if what == "wait":
        ctx.wait_for_event("approval")
    elif what == "sleep":
        ctx.sleep("nap", 100)
    else:  # asked last, never awaited
        ctx.wait_for_event("approval")
        return "done"
    return (await ctx.tools.execute("p", "t.pay", {"d": "a"})).output
"""


@pytest.mark.parametrize("ask", ["wait", "sleep", "last"])
def test_a_wait_or_sleep_not_awaited_stops_the_run_before_it_goes_on(
    tmp_path: Path, store_path: Path, monkeypatch: pytest.MonkeyPatch, ask: str
) -> None:
    """`ctx.wait_for_event("approval")` without `await` let the run go past its approval gate
    and pay (exit 0): the next durable call, or the body's end, refuses, naming the line."""
    play = tmp_path / "gate.py"
    play.write_text(UNAWAITED)
    paid = tmp_path / "paid.log"
    monkeypatch.setenv("ASK", ask)
    monkeypatch.setenv("PAID", str(paid))
    result = run_play(play, store_path)
    assert (result.status, result.exit_code) == ("failed", 2), (result.status, result.error)
    assert "was not awaited" in result.error["message"] and "(gate.py:" in result.error["message"], result.error
    assert not paid.exists()  # nothing paid past the gate


def test_a_sleep_awaited_through_gather_beside_calls_is_awaited(
    tmp_path: Path, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    play = tmp_path / "gate.py"
    play.write_text(UNAWAITED)
    monkeypatch.setenv("ASK", "gathered")
    monkeypatch.setenv("PAID", str(tmp_path / "paid.log"))
    result = run_play(play, store_path)
    assert (result.status, result.output) == ("completed", [None, "a"]), result.error


MUTATING = """
from deepline_cli import play


def score(row):
    row["d"] = "evil.com"  # a resolver that changes the row it is given
    row["extra"] = 1
    return 1


@play("mutating")
async def mutating(ctx, input):
    rows = await ctx.map("m", [{"d": "a.com", "n": "1"}, {"d": "b.com", "n": "2"}], key="d",
                         columns={"score": score, "seen": lambda row: row["d"]})
    return len(rows)
"""


def test_a_resolver_that_changes_its_row_changes_neither_the_stored_input_nor_the_export(
    deepline: Callable[..., Result], tmp_path: Path
) -> None:
    """The input is kept as given: a resolver that assigns to `row` is seen by the columns
    after it, not by the sheet, the export or the next run's reuse of the row."""
    (tmp_path / "play.py").write_text(MUTATING)
    run = deepline("run", "play.py", "--json")
    assert run.code == 0, run.stderr
    run_id = json.loads(run.stdout.splitlines()[-1])["run_id"]
    rows = [json.loads(line) for line in deepline("export", run_id, "--format", "jsonl").stdout.splitlines()]
    assert [(r["d"], r["n"], r.get("extra"), r["seen"]) for r in rows] == [
        ("a.com", "1", None, "evil.com"),
        ("b.com", "2", None, "evil.com"),
    ], rows
    again = deepline("run", "play.py", "--json")
    assert json.loads(again.stdout.splitlines()[-1])["stats"]["rows"]["reused"] == 2  # the same input


NOT_JSON_TOOL = """
import os

from deepline_cli import play, tool


class Company:
    def __init__(self, domain):
        self.domain = domain


@tool("local.company")
def company(input):
    return {"company": input["d"] if os.environ.get("FIXED") else Company(input["d"])}


@play("not-json")
async def not_json(ctx, input):
    return (await ctx.tools.execute("c", "local.company", {"d": "acme.com"})).output
"""


def test_a_local_tools_answer_with_no_json_form_is_refused_not_kept_as_its_repr(
    tmp_path: Path, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An @tool returning an object was stored as "<Company object at 0x…>" and reused
    forever: refused as a column's value is, and asked again once the tool is fixed."""
    play = tmp_path / "play.py"
    play.write_text(NOT_JSON_TOOL)
    refused = run_play(play, store_path)
    assert (refused.status, refused.exit_code) == ("failed", 2), refused.error
    assert "The answer of tool 'local.company' holds a Company" in refused.error["message"], refused.error
    monkeypatch.setenv("FIXED", "1")
    fixed = run_play(play, store_path)
    assert (fixed.status, fixed.output) == ("completed", {"company": "acme.com"}), fixed.error


ARITY = """
import os

from deepline_cli import Column, play, steps


def enrich(row, rc, provider):
    return provider


@play("arity")
async def arity(ctx, input):
    columns = {
        "fn": lambda: {"x": enrich},
        "none": lambda: {"x": lambda: 1},
        "run_if": lambda: {"x": Column(lambda row: 1, run_if=lambda row, rc, extra: True)},
        "step": lambda: {"x": steps().step("a", lambda: 1)},
    }[os.environ["ASK"]]()
    rows = await ctx.map("m", [{"d": str(n)} for n in range(30)], key="d", columns=columns)
    return len(rows)
"""


@pytest.mark.parametrize(
    ("ask", "said"),
    [
        ("fn", "Column 'x''s function (play.py line 7) takes 3 arguments; it is given (row) or (row, rc)."),
        ("none", "Column 'x''s function (play.py line 15) takes no argument; it is given (row) or (row, rc)."),
        ("run_if", "Column 'x''s run_if (play.py line 16) takes 3 arguments; it is given (row) or (row, index)."),
        ("step", "Waterfall step 'a' (play.py line 17) takes no argument; it is given (row) or (row, rc)."),
    ],
)
def test_a_resolver_that_cannot_take_what_it_is_given_is_refused_before_any_row(
    tmp_path: Path, store_path: Path, monkeypatch: pytest.MonkeyPatch, ask: str, said: str
) -> None:
    """Every row failed with a TypeError naming no line (and the run exited 0, or stopped
    after 20 rows): the map is refused before any row, naming the function's line."""
    play = tmp_path / "play.py"
    play.write_text(ARITY)
    monkeypatch.setenv("ASK", ask)
    result = run_play(play, store_path)
    assert (result.status, result.exit_code) == ("failed", 2), (result.status, result.error)
    assert said in result.error["message"], result.error["message"]


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("@play('one')\nasync def one(ctx):\n    return 1\n", "Play 'one' must take (ctx, input)"),
        ("@play('gen')\nasync def gen(ctx, input):\n    yield 1\n", "Play 'gen' must return its output, not yield it"),
        ("@play\nasync def bare(ctx, input):\n    return 1\n", "@play needs the play's name"),
        ("@tool\ndef t(input):\n    return 1\n\n@play('p')\nasync def p(ctx, input):\n    return 1\n",
         "@tool needs the tool's id"),
    ],
)  # fmt: skip
def test_a_play_or_tool_declared_wrong_is_refused_as_it_loads(
    deepline: Callable[..., Result], tmp_path: Path, source: str, said: str
) -> None:
    """`async def one(ctx)` was recorded as a run and failed with a TypeError naming no line;
    an `async def` that yields was told it must be an async function; a bare `@tool`
    registered nothing and said nothing. Each is refused as the play loads (exit 2)."""
    (tmp_path / "play.py").write_text("from deepline_cli import play, tool\n\n" + source)
    result = deepline("run", "play.py")
    assert result.code == 2 and said in result.stderr, result.stderr
    assert deepline("runs", "list").stdout.startswith("No runs yet")


@pytest.mark.parametrize("concurrency", [0, -1, "5", True])
def test_a_maps_concurrency_that_is_no_whole_number_of_one_or_more_is_refused(
    tmp_path: Path, store_path: Path, concurrency: Any
) -> None:
    play = tmp_path / "play.py"
    play.write_text(
        "from deepline_cli import play\n\n@play('c')\nasync def c(ctx, input):\n"
        f"    return len(await ctx.map('m', [{{'d': 'a'}}], key='d', columns={{'x': lambda row: 1}}, "
        f"concurrency={concurrency!r}))\n"
    )
    result = run_play(play, store_path)
    assert (result.status, result.exit_code) == ("failed", 2), result.error
    assert f"Map 'm': concurrency must be a whole number, 1 or more, not {concurrency!r}." in result.error["message"]


def test_a_columns_options_are_named() -> None:
    """`Column(fn, 3600)` took 3600 for its run_if: the options are keyword-only."""
    from deepline_cli import Column

    with pytest.raises(TypeError):
        Column(lambda row: 1, 3600)  # type: ignore[misc]


def test_two_tools_declared_under_one_id_are_refused(deepline: Callable[..., Result], tmp_path: Path) -> None:
    """Two functions under one @tool id in a module: the last answered for both, silently."""
    (tmp_path / "play.py").write_text(
        "from deepline_cli import play, tool\n\n@tool('x.t')\ndef first(input):\n    return 1\n\n"
        "@tool('x.t')\ndef second(input):\n    return 2\n\nalias = second\n\n"
        "@play('p')\nasync def p(ctx, input):\n    return (await ctx.tools.execute('a', 'x.t', {})).output\n"
    )
    said = "Tool 'x.t' is declared twice (first and second): give each its own id."
    checked = deepline("check", "play.py")
    assert checked.code == 2 and said in checked.stderr, checked.stderr
    run = deepline("run", "play.py")
    assert run.code == 2 and said in run.stderr, run.stderr
