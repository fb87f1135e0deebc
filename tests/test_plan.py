"""`deepline plan`: rows, reusable cells, paid and new calls, credit bounds — no call made."""

from __future__ import annotations

from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "lead_enrichment"


def _plan(deepline, *args: str) -> dict:
    result = deepline("plan", *args, "--json")
    assert result.code == 0, result.stderr
    return result.json_lines()[-1]


def test_plan_bounds_the_real_run_and_then_everything_is_paid(deepline) -> None:
    args = (str(EXAMPLE / "play.py"), "--csv", str(EXAMPLE / "leads.csv"), "--set", "latency=0")
    before = _plan(deepline, *args)
    (m,) = before["maps"]
    assert (m["input_rows"], m["distinct"], m["duplicate"], m["paid_rows"]) == (302, 290, 12, 0)
    company, email, valid = m["columns"]
    assert company["tools"] == {"demo.company": 1.0} and company["new_calls"] == 290
    assert email["tools"] == {"demo.finder_a": 1.0, "demo.finder_b": 2.0}
    assert email["dependent_rows"] == 290 and "depends on 'company'" in email["notes"][0]
    assert valid["tools"] == {"demo.validate": 0.5}
    credits = before["totals"]["credits"]
    assert credits == {"min": 290.0, "expected": 725.0, "max": 1305.0}
    assert deepline("receipts", "inspect", "--json").stdout == ""  # planning called nothing

    run = deepline("run", *args, "--json")
    assert run.code == 0, run.stderr
    actual = run.json_lines()[-1]["stats"]["credits"]
    assert credits["min"] <= actual <= credits["max"]
    assert abs(credits["expected"] - actual) <= 0.1 * actual

    after = _plan(deepline, *args)
    assert after["complete"] and after["stopped"] is None
    totals = after["totals"]
    assert (totals["paid_rows"], totals["new_calls"], totals["dependent_calls"]) == (290, 0, 0)
    assert totals["credits"] == {"min": 0.0, "expected": 0.0, "max": 0.0}

    human = deepline("plan", *args)
    assert human.code == 0, human.stderr
    assert "rows 290 · 290 already paid" in human.stdout
    assert "0 new calls · max 0 credits" in human.stdout


def test_a_pilot_teaches_the_expected_case(deepline) -> None:
    args = (str(EXAMPLE / "play.py"), "--csv", str(EXAMPLE / "leads.csv"), "--set", "latency=0")
    assert deepline("run", *args, "--limit", "60", "--quiet").code == 0
    plan = _plan(deepline, *args)
    (m,) = plan["maps"]
    assert m["paid_rows"] == 60 and m["expected_from"] == "hit rates of 60 rows of earlier runs"
    assert _plan(deepline, *args, "--limit", "60")["totals"]["credits"]["max"] == 0
    run = deepline("run", *args, "--json")
    spent = run.json_lines()[-1]["stats"]["credits"]
    pilot_spent = 0.0
    for line in deepline("runs", "list", "--json").json_lines():
        if line["run_id"] != run.json_lines()[-1]["run_id"]:
            pilot_spent = line["stats"]["credits"]
    assert spent > 0 and pilot_spent > 0
    credits = plan["totals"]["credits"]
    assert credits["min"] <= spent <= credits["max"]
    assert abs(credits["expected"] - spent) <= 0.15 * spent


WATERFALL = """
from deepline_cli import play, tool

@tool("w.first", credits=1)
def first(input):
    return None if input["n"] % 2 else {"hit": "first"}

@tool("w.second", credits=3)
def second(input):
    return {"hit": "second"}

async def waterfall(row, rc):
    found = await rc.tools.execute("first", "w.first", {"n": row["n"]})
    if found.output:
        return found.output
    return (await rc.tools.execute("second", "w.second", {"n": row["n"]})).output{suffix}

@play("waterfall")
async def waterfall_play(ctx, input):
    rows = await ctx.map("rows", [{"n": n} for n in range(10)], key="n", columns={"hit": waterfall})
    return {"rows": len(rows)}
"""


def test_receipts_are_followed_through_a_waterfall_when_cells_cannot_be_reused(deepline, write_play) -> None:
    play = write_play(WATERFALL.replace("{suffix}", ""))
    first = _plan(deepline, str(play))
    (column,) = first["maps"][0]["columns"]
    assert column["new_calls"] == 10 and column["credits"] == {"min": 10.0, "expected": 10.0, "max": 40.0}
    assert any("after w.first, may call w.second" in note for note in column["notes"])
    assert deepline("run", str(play), "--quiet").code == 0
    # The column's code changes: its cells are recomputed, but every call hits a receipt.
    play = write_play(WATERFALL.replace("{suffix}", " or {'hit': None}"))
    again = _plan(deepline, str(play))
    (column,) = again["maps"][0]["columns"]
    assert (column["reused_cells"], column["paid_calls"], column["new_calls"]) == (0, 15, 0)
    assert again["complete"] and again["totals"]["credits"]["max"] == 0


STEPS = """
from deepline_cli import play, tool

@tool("s.lookup", credits=2)
def lookup(input):
    return {"v": input["x"] * 2}

@play("steps")
async def steps(ctx, input):
    size = await ctx.step("size", lambda: input.get("size", 3))
    rows = await ctx.map("rows", [{"x": x} for x in range(size)], key="x",
                         columns={"v": lambda row, rc: rc.tools.execute("lookup", "s.lookup", {"x": row["x"]})})
    return {"rows": len(rows)}
"""


def test_steps_outside_maps_use_the_latest_run_with_the_same_input(deepline, write_play) -> None:
    play = write_play(STEPS)
    first = _plan(deepline, str(play))
    assert first["maps"] == [] and not first["complete"]
    assert first["stopped"] == "step 'size' runs only in a real run (no earlier run with this input)"
    assert first["body"]["may_also_call"] == {"s.lookup": 2.0}
    human = deepline("plan", str(play))
    assert "not planned beyond: step 'size'" in human.stdout
    assert deepline("run", str(play), "--quiet").code == 0
    second = _plan(deepline, str(play))
    assert second["complete"] and second["reference_run"] and second["body"]["paid_calls"] == 1
    assert second["totals"]["rows"] == 3 and second["totals"]["new_calls"] == 0
    other = _plan(deepline, str(play), "--set", "size=5")  # another input: no stored step
    assert other["stopped"].startswith("step 'size' runs only in a real run")


def test_body_calls_outside_maps(deepline) -> None:
    plan = _plan(deepline, str(ROOT / "examples" / "hello" / "play.py"))
    assert {c["tool"] for c in plan["body"]["new_calls"]} == {"hello.company"}
    assert plan["stopped"] == "new call to hello.company"
    assert plan["body"]["may_also_call"] == {"hello.email": 2.0}
    # Stopped before the play's end: no maximum is known (it said the run's 3 calls, which
    # the run then passed).
    assert not plan["complete"] and plan["totals"]["credits"]["max"] is None, plan["totals"]


def test_bad_input_is_one_sentence_and_exit_2(deepline, write_play, tmp_path) -> None:
    missing = deepline("plan", str(EXAMPLE / "play.py"), "--csv", str(tmp_path / "nope.csv"))
    assert missing.code == 2 and missing.stderr.startswith("Error: --csv file") and "Traceback" not in missing.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("Name,Email\nAda,a@b.c\n")
    column = deepline("plan", str(EXAMPLE / "play.py"), "--csv", str(bad))
    assert column.code == 2 and "required column 'first_name' is missing" in column.stderr
    assert deepline("plan", str(tmp_path / "nope.py")).code == 2
    source = STEPS.replace('"s.lookup", {"x"', '"s.nowhere", {"x"')
    unknown = write_play(source.replace('await ctx.step("size", lambda: input.get("size", 3))', "3"))
    result = deepline("plan", str(unknown))
    assert result.code == 2 and result.stderr == (
        "Error: Unknown tool 's.nowhere': declare it with @tool or in deepline.toml.\n"
    )
    asleep = write_play(
        STEPS.replace('await ctx.step("size", lambda: input.get("size", 3))', 'await ctx.sleep("nap", 1) or 3')
    )
    assert _plan(deepline, str(asleep))["stopped"] == "sleep:nap waits only in a real run"


def test_plan_help_does_not_import_the_runtime(cli_env) -> None:
    import subprocess
    import sys

    from tests.test_help import PROBE, _heavy_in

    proc = subprocess.run(
        [sys.executable, "-c", PROBE, "plan", "--help"], capture_output=True, text=True, env=cli_env, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert "--csv" in proc.stdout and _heavy_in(set(proc.stdout.rpartition("@@MODULES@@")[2].split())) == []


CHAIN = """
from deepline_cli import play, tool

@tool("c.a", credits=1)
def a(input):
    return {"a": input["n"]}

@tool("c.b", credits=2)
def b(input):
    return {"b": input["a"]}

@tool("c.c", credits=4)
def c(input):
    return {"c": input["n"]}

@tool("c.d", credits=8)
def d(input):
    return {"d": input["b"]}

@play("chain")
async def chain(ctx, input):
    rows = await ctx.map("rows", [{"n": n} for n in range(5)], key="n", columns={
        "a": lambda row, rc: rc.tools.execute("a", "c.a", {"n": row["n"]}),
        "b": lambda row, rc: rc.tools.execute("b", "c.b", {"a": row["a"]}),
        "c": lambda row, rc: rc.tools.execute("c", "c.c", {"n": row["n"]}),
        "d": lambda row, rc: rc.tools.execute("d", "c.d", {"b": row.get("b")}),
        "size": lambda row: len(str(row["b"])),  # reads b, calls nothing
    })
    return {"rows": len(rows)}
"""


def test_a_column_depends_on_the_column_it_reads_not_on_the_first_unknown_one(deepline, write_play) -> None:
    play = write_play(CHAIN)
    (m,) = _plan(deepline, str(play))["maps"]
    a, b, c, d, size = m["columns"]
    assert (a["new_calls"], a["dependent_rows"], a["notes"]) == (5, 0, [])
    assert (b["new_calls"], b["dependent_rows"]) == (0, 5)
    assert b["notes"] == ["depends on 'a', known only after running (5 rows)"]
    # c reads only the row's input: its calls are certain, whatever a and b answer
    assert (c["new_calls"], c["dependent_rows"], c["notes"]) == (5, 0, [])
    assert c["credits"] == {"min": 20.0, "expected": 20.0, "max": 20.0}
    assert (d["new_calls"], d["dependent_rows"]) == (0, 5)
    assert d["notes"] == ["depends on 'b', known only after running (5 rows)"]
    assert (size["new_calls"], size["dependent_rows"]) == (0, 0)  # waits for b, but calls nothing
    assert m["dependent_calls"] == 10
    human = deepline("plan", str(play))
    assert human.code == 0, human.stderr
    lines = [line.strip() for line in human.stdout.splitlines() if "depends on" in line and ":" in line]
    assert lines == [
        "b: depends on 'a', known only after running (5 rows)",
        "d: depends on 'b', known only after running (5 rows)",
    ]


NOT_FOUND = """
from deepline_cli import ToolExecutionError, play, steps, tool

@tool("nf.first", credits=1)
def first(input):
    if input["n"] % 2:  # a 404: failed, not billed; the waterfall asks the next step
        raise ToolExecutionError("no such person", origin="provider", category="not_found", status_code=404)
    return {"hit": "first"}

@tool("nf.second", credits=2)
def second(input):
    return {"hit": "second"}

@play("not-found")
async def not_found(ctx, input):
    rows = await ctx.map("rows", [{"n": n} for n in range(40)], key="n", columns={
        "hit": steps()
            .step("first", lambda row, rc: rc.tools.execute("f", "nf.first", {"n": row["n"]}))
            .step("second", lambda row, rc: rc.tools.execute("s", "nf.second", {"n": row["n"]})),
    })
    return {"rows": len(rows)}
"""


def test_the_expected_cost_counts_only_calls_that_are_paid(deepline, write_play) -> None:
    """A pilot where half the first step's calls answer 404 (failed: not billed, the next
    step asked): the plan of the rest expects what the run then spends, not a credit for
    every call made."""
    play = write_play(NOT_FOUND)
    assert deepline("run", str(play), "--limit", "10", "--quiet").code == 0
    credits = _plan(deepline, str(play))["totals"]["credits"]
    run = deepline("run", str(play), "--json")
    spent = run.json_lines()[-1]["stats"]["credits"]
    assert spent == 45  # 15 found by the first step (1), 15 by the second (2)
    assert credits["min"] <= spent <= credits["max"]
    assert abs(credits["expected"] - spent) <= 0.1 * spent, credits


SHARED_LATER = """
from deepline_cli import play, tool

@tool("email.find", credits=1)
def find(input):
    return {"email": "x@" + input["domain"]}

@tool("co.lookup", credits=2)
def lookup(input):
    return {"name": input["domain"].upper()}

async def email(row, rc):
    return (await rc.tools.execute("email", "email.find", {"domain": row["domain"]})).output["email"]

async def summary(row, rc):
    # A column calling two tools; the second is the very call the 'email' column made.
    company = await rc.tools.execute("co", "co.lookup", {"domain": row["domain"]})
    found = await rc.tools.execute("email", "email.find", {"domain": row["domain"]})
    return company.output["name"] + " " + found.output["email"]

@play("shared-later")
async def shared_later(ctx, input):
    rows = [{"domain": f"d{n}.com"} for n in range(40)]
    done = await ctx.map("m", rows, key="domain", columns={"email": email, "summary": summary})
    return {"rows": len(done)}
"""


def test_a_call_a_later_column_repeats_after_another_is_expected_once(deepline, write_play) -> None:
    """A later column that makes a new call, then repeats the call an earlier column of the
    row made (the same receipt: paid once): the plan expected it paid twice (450 for 270)."""
    play = write_play(SHARED_LATER)
    assert deepline("run", str(play), "--limit", "10", "--quiet").code == 0
    credits = _plan(deepline, str(play))["totals"]["credits"]
    run = deepline("run", str(play), "--json")
    spent = run.json_lines()[-1]["stats"]["credits"]
    assert spent == 90  # 30 rows × (1 + 2)
    assert credits["min"] <= spent <= credits["max"]
    assert abs(credits["expected"] - spent) <= 0.1 * spent, credits


CHILD_IN_A_COLUMN = """
from deepline_cli import play, tool

@tool("kid.lookup", credits=2.5)
def lookup(input):
    return {"ok": input["d"]}

@play("kid")
async def kid(ctx, input):
    return (await ctx.tools.execute("look", "kid.lookup", {"d": input["d"]})).output

@play("parent")
async def parent(ctx, input):
    rows = [{"d": f"y{n}.com"} for n in range(5)]
    done = await ctx.map("m", rows, key="d", columns={"kid": lambda row, rc: rc.run_play("kid", "play.py:kid", row)})
    return {"rows": len(done)}
"""


def test_a_column_running_a_child_play_has_no_known_maximum(deepline, write_play) -> None:
    """A child play's calls are known only by running it: the plan said "max 0 credits" for a
    run that then spent 12.5, and printed its note once per row. Its maximum is unknown,
    said once."""
    play = write_play(CHILD_IN_A_COLUMN)
    plan = _plan(deepline, f"{play}:parent")
    (m,) = plan["maps"]
    assert m["credits"]["max"] is None and plan["totals"]["credits"]["max"] is None, plan["totals"]
    (column,) = m["columns"]
    note = "child play 'play.py:kid' runs only in a real run; what it calls is not counted (5 rows)"
    assert column["notes"] == [note]
    human = deepline("plan", f"{play}:parent")
    assert human.code == 0, human.stderr
    assert "max unknown" in human.stdout and human.stdout.count("runs only in a real run") == 1, human.stdout
    # After a pilot (an earlier run with this input), the rows it did not reach: the same, said once
    assert deepline("run", f"{play}:parent", "--limit", "2", "--quiet").code == 0
    after = _plan(deepline, f"{play}:parent")
    assert after["totals"]["credits"]["max"] is None, after["totals"]
    (column,) = after["maps"][0]["columns"]
    assert len([n for n in column["notes"] if "has no stored result" in n]) == 1, column["notes"]


OLD_CALL = '    return await rc.run_play("enrich", "play.py:kid", {"people": row["people"], "d": row["d"]})'
NEW_CALL = (
    '    people = await rc.tools.execute("p", "p.people", {"d": row["d"], "once": True})\n'
    '    return await rc.run_play("enrich", "play.py:kid", {"people": people.output, "d": row["d"]})'
)
OLD_COL = '"contacts": Column(contacts, run_if=lambda row: bool(row["people"])),'

CHILD_AFTER_A_CALL = """
from deepline_cli import Column, play, tool

@tool("p.people", credits=1)
def people(input):
    return [{"name": "ada"}, {"name": "grace"}]

@tool("kid.lookup", credits=2.5)
def lookup(input):
    return {"ok": input["name"]}

@play("kid")
async def kid(ctx, input):
    for person in input["people"]:
        await ctx.tools.execute("look-" + person["name"], "kid.lookup", {"name": person["name"], "d": input["d"]})
    return len(input["people"])

async def contacts(row, rc):
    return await rc.run_play("enrich", "play.py:kid", {"people": row["people"], "d": row["d"]})

@play("parent")
async def parent(ctx, input):
    rows = [{"d": f"y{n}.com"} for n in range(5)]
    done = await ctx.map("m", rows, key="d", columns={
        "people": lambda row, rc: rc.tools.execute("p", "p.people", {"d": row["d"]}),
        "contacts": Column(contacts, run_if=lambda row: bool(row["people"])),
    })
    return {"rows": len(done)}
"""


def test_a_child_play_column_that_waits_for_an_earlier_column_has_no_known_maximum(deepline, write_play) -> None:
    """The child play column reads the people an earlier column finds: the plan bounded it
    by the tools its code names (none) and said "max 5 credits"; the run spent 30."""
    play = write_play(CHILD_AFTER_A_CALL)
    plan = _plan(deepline, f"{play}:parent")
    assert plan["totals"]["credits"]["max"] is None, plan["totals"]
    run = deepline("run", f"{play}:parent", "--json")
    assert run.json_lines()[-1]["stats"]["credits"] == 30  # 5 rows × (1 + 2 × 2.5)
    # One column that makes its call, then runs the child play with its answer: the same.
    one_column = CHILD_AFTER_A_CALL.replace(OLD_CALL, NEW_CALL).replace(OLD_COL, '"contacts": contacts,')
    assert one_column.count("once") == 1 and '"contacts": contacts,' in one_column
    write_play(one_column)
    assert _plan(deepline, f"{play}:parent")["totals"]["credits"]["max"] is None


WATERFALL_AFTER_A_LOOKUP = """
from deepline_cli import play, steps, tool

@tool("t.company", credits=1)
def company(input):
    return {"domain": input["d"]}

@tool("t.first", credits=1)
def first(input):
    return None

@tool("t.second", credits=1)
def second(input):
    return {"email": "x@" + input["d"]}

EMAIL = (
    steps()
    .step("first", lambda row, rc: rc.tools.execute("a", "t.first", {"d": row["company"]["domain"]}))
    .step("second", lambda row, rc: rc.tools.execute("b", "t.second", {"d": row["company"]["domain"]}))
)

@play("wf")
async def wf(ctx, input):
    rows = [{"d": f"w{n}.com"} for n in range(6)]
    done = await ctx.map("m", rows, key="d", columns={
        "company": lambda row, rc: rc.tools.execute("c", "t.company", {"d": row["d"]}),
        "email": EMAIL,
    })
    return len(done)
"""


def test_the_calls_that_depend_on_data_are_bounded_by_every_tool_a_row_may_call(deepline, write_play) -> None:
    """ "6 new calls (+ up to 6 that depend on data)" for a run that then made 18: a row's
    two-step waterfall may make two calls, and the plan counted rows, not calls."""
    play = write_play(WATERFALL_AFTER_A_LOOKUP)
    totals = _plan(deepline, str(play))["totals"]
    run = deepline("run", str(play), "--json")
    made = sum(t["live"] for t in run.json_lines()[-1]["stats"]["tools"].values())
    assert made == 18
    assert totals["new_calls"] + totals["dependent_calls"] >= made, totals
    assert (totals["new_calls"], totals["dependent_calls"]) == (6, 12), totals


FAILED_ROW_THEN_BODY = """
from deepline_cli import play, tool

@tool("t.score", credits=1)
def score(input):
    if input["name"] == "bob":
        raise ValueError("no such lead")
    return {"score": len(input["name"])}

@play("scores")
async def scores(ctx, input):
    rows = [{"name": "ada"}, {"name": "bob"}]
    done = await ctx.map("leads", rows, key="name", columns={
        "score": lambda row, rc: rc.tools.execute("s", "t.score", {"name": row["name"]}),
        "tier": lambda row: "A" if row["score"]["score"] > 2 else "B",
    })
    return {"hot": sum(1 for row in done if row["tier"] == "A")}
"""


def test_a_plan_after_a_run_with_a_failed_row_gives_its_columns_as_none(deepline, write_play) -> None:
    """A play body reading a later column of the map's rows: the real run gives None for a
    failed row's columns after the failure; the plan's rows left them out (KeyError, exit 1)."""
    play = write_play(FAILED_ROW_THEN_BODY)
    assert deepline("run", str(play), "--quiet").code == 0
    plan = _plan(deepline, str(play))
    assert plan["complete"] and plan["totals"]["credits"]["max"] == 0, plan
    # bob's failure is kept: the plan says a run gives it back failed, and how to ask again.
    (m,) = plan["maps"]
    score = m["columns"][0]
    assert score["failed_rows"] == 1, (score, m)
    assert any("--refresh-failed asks again" in note for note in score["notes"]), score["notes"]


CHAINED_WATERFALL = """
from deepline_cli import play, steps, tool

@tool("t.company", credits=1)
def company(input):
    return {"name": "x"}

@tool("p.hunter", credits=1)
def hunter_tool(input):
    return {"email": None}

@tool("p.apollo", credits=3)
def apollo_tool(input):
    return {"email": f"a{input['id']}@x.com"}

async def hunter(row, rc):
    return (await rc.tools.execute("h", "p.hunter", {"id": row["id"]})).output["email"]

async def apollo(row, rc):
    return (await rc.tools.execute("a", "p.apollo", {"id": row["id"]})).output["email"]

EMAIL = steps().step("hunter", hunter).step("apollo", apollo)

@play("wf")
async def wf(ctx, input):
    base = await ctx.map("base", [{"id": i} for i in range(20)], key="id",
                         columns={"company": lambda row, rc: rc.tools.execute("c", "t.company", {"id": row["id"]})})
    rows = await ctx.map("leads", base, key="id", columns={"email": EMAIL})
    return len(rows)
"""


def test_a_waterfall_kept_in_a_module_global_is_among_what_the_play_may_also_call(deepline, write_play) -> None:
    """The second map's column is a waterfall built once at the top of the module: the plan
    stops at the first map, and names the waterfall's tools among those the rest may call."""
    plan = _plan(deepline, str(write_play(CHAINED_WATERFALL)))
    assert plan["body"]["may_also_call"] == {"p.hunter": 1.0, "p.apollo": 3.0}, plan["body"]
    # The same waterfall in a Column of a dict of columns, kept at the top of the module.
    kept = (
        CHAINED_WATERFALL.replace(
            'EMAIL = steps().step("hunter", hunter).step("apollo", apollo)',
            'COLUMNS = {"email": Column(steps().step("hunter", hunter).step("apollo", apollo), run_if=bool)}',
        )
        .replace('columns={"email": EMAIL}', "columns=COLUMNS")
        .replace("import play,", "import Column, play,")
    )
    plan = _plan(deepline, str(write_play(kept)))
    assert plan["body"]["may_also_call"] == {"p.hunter": 1.0, "p.apollo": 3.0}, plan["body"]


def test_a_plan_stopped_at_a_call_its_body_repeats_knows_no_maximum(deepline, write_play) -> None:
    """The play searches page 1, then loops over more pages of the same tool: planning stops
    at the first call, and said "max 1" for a run that then spent 3."""
    play = write_play(
        """
        from deepline_cli import play, tool

        @tool("crm.search", credits=1)
        def search(input):
            return {"more": input["page"] < 3}

        @play("pages")
        async def pages(ctx, input):
            page = 1
            while (await ctx.tools.execute(f"p{page}", "crm.search", {"page": page})).output["more"]:
                page += 1
            return page
        """
    )
    plan = _plan(deepline, str(play))
    assert not plan["complete"] and plan["totals"]["credits"]["max"] is None, plan["totals"]
    ran = deepline("run", str(play), "--json")
    assert ran.code == 0 and ran.json_lines()[-1]["stats"]["credits"] == 3


def test_a_resolver_made_in_the_play_body_that_uses_ctx_is_reused_by_the_plan(deepline, write_play, tmp_path) -> None:
    """A resolver defined inside the play body, using `ctx` (a log line, an async `run_if`
    awaiting a lookup): the plan said its cells must be recomputed (the context object it
    closes over is the planner's, of another type), while the run then reused them all."""
    csv = tmp_path / "in.csv"
    csv.write_text("domain\nx.com\ny.com\nz.com\n")
    play = write_play(
        """
        from deepline_cli import Column, play, tool

        @tool("demo.lookup", credits=1)
        def lookup(input):
            return {"domain": input["domain"], "employees": 42}

        @tool("demo.exists", credits=0.5)
        def exists(input):
            return {"exists": True}

        @play("clos")
        async def clos(ctx, input):
            rows = ctx.csv(input["csv"], required=["domain"])

            log = ctx.log  # a bound method of ctx, kept in a name

            async def size(row, rc):
                ctx.log("sizing")
                log("sized")
                r = await rc.tools.execute("l", "demo.lookup", {"domain": row["domain"]})
                return r.output["employees"]

            async def known(row):
                return (await ctx.tools.execute("e", "demo.exists", {"domain": row["domain"]})).output["exists"]

            ds = await ctx.map("m", rows, key="domain", columns={"size": size, "gated": Column(size, run_if=known)})
            return {"rows": len(ds)}
        """
    )
    args = (str(play), "--csv", str(csv))
    assert deepline("run", *args, "--quiet").code == 0
    (m,) = _plan(deepline, *args)["maps"]
    assert m["paid_rows"] == 3, m
    assert [c["reused_cells"] for c in m["columns"]] == [3, 3], m["columns"]
    again = deepline("run", *args, "--json")
    assert again.json_lines()[-1]["stats"]["rows"]["reused"] == 3


STEPS_WATERFALL = """
from deepline_cli import play, steps, tool

@tool("w.a", credits=1)
def a(input):
    return {"v": "a"} if input["n"] % 3 == 0 else None

@tool("w.b", credits=2)
def b(input):
    return {"v": "b"}

EMAIL = steps().step("a", lambda row, rc: rc.tools.execute("a", "w.a", {"n": row["n"]})).step(
    "b", lambda row, rc: rc.tools.execute("b", "w.b", {"n": row["n"]}))

@play("hits")
async def hits(ctx, input):
    rows = await ctx.map("rows", [{"n": n} for n in range(12)], key="n", columns={"v": EMAIL})
    return len(rows)
"""


def test_the_hit_rates_count_each_row_the_waterfall_ran_for_once(deepline, write_play) -> None:
    """A pilot of 6 rows, the whole list, then the whole list again: the waterfall ran for 12
    rows; the rows a later run took whole from the sheet were counted again (30 rows)."""
    play = str(write_play(STEPS_WATERFALL))
    for limit in ("6", None, None):
        assert deepline("run", play, "--quiet", *(("--limit", limit) if limit else ())).code == 0
    (column,) = _plan(deepline, play)["maps"][0]["columns"]
    assert column["step_hits"] == {"a": 4, "b": 8}, column["step_hits"]
    # Another column's code changes: the rows are recomputed, the waterfall's cells reused.
    play = str(write_play(STEPS_WATERFALL.replace('columns={"v": EMAIL}', 'columns={"v": EMAIL, "n2": lambda r: 2}')))
    assert deepline("run", play, "--quiet").code == 0
    (column, _) = _plan(deepline, play)["maps"][0]["columns"]
    assert column["step_hits"] == {"a": 4, "b": 8}, column["step_hits"]


def test_a_plan_says_why_its_rows_would_fail_not_only_zero_calls(deepline, write_play, tmp_path) -> None:
    """A column reading a misspelt field: the plan does not say "0 new calls, max 0
    credits" and nothing else; it names the error, where it is, and how many rows."""
    (tmp_path / "co.csv").write_text("Company Name,Website\nAcme,acme.com\nGlobex,globex.io\n")
    play = write_play(
        """
        from deepline_cli import play, tool

        @tool("t.y", credits=1)
        def y(input):
            return 1

        @play("typo")
        async def typo(ctx, input):
            rows = ctx.csv(input["csv"], columns={"domain": ["Website"]})
            return await ctx.map("co", rows, key="domain", columns={
                "x": lambda row, rc: rc.tools.execute("e", "t.y", {"domain": row["Webiste"]})})
        """
    )
    human = deepline("plan", str(play), "--csv", "co.csv")
    assert human.code == 0, human.stderr
    assert "x: stops the run at its first row: KeyError: 'Webiste' (play.py line 12); fix the play first (2 rows)" in (
        human.stdout
    ), human.stdout


HELPER_STEPS = """
from deepline_cli import tool

@tool("h.first", credits=1)
def first(input):
    return None

@tool("h.second", credits=2)
def second(input):
    return None

@tool("h.third", credits=3)
def third(input):
    return None

async def by_second(row, rc):
    return (await rc.tools.execute("second", "h.second", {"d": row["d"]})).output

async def by_third(row, rc):
    return (await rc.tools.execute("third", "h.third", {"d": row["d"]})).output
"""

HELPER_PLAY = """
from deepline_cli import play, steps
import helpers
from helpers import by_second

@play("helped")
async def helped(ctx, input):
    await ctx.tools.execute("first", "h.first", {"d": "x"})
    rows = await ctx.map("m", [{"d": "a"}], columns={
        "email": steps().step("second", by_second).step("third", helpers.by_third),
    })
    return len(rows)
"""


def test_the_plan_names_the_tools_the_play_calls_through_its_helper_module(deepline, write_play) -> None:
    """A waterfall's steps in a helpers.py next to the play, imported by name or reached as
    `helpers.fn`: the plan named none of their tools among those the play may also call."""
    write_play(HELPER_STEPS, "helpers.py")
    play = write_play(HELPER_PLAY)
    plan = _plan(deepline, str(play))
    assert plan["stopped"] == "new call to h.first"
    assert plan["body"]["may_also_call"] == {"h.second": 2.0, "h.third": 3.0}


def test_a_plan_says_what_refresh_failed_and_force_refresh_would_ask_again(deepline, write_play) -> None:
    """The plan's own note advised `--refresh-failed`, and `plan --refresh-failed` was no
    option: what the retry would cost could not be seen before paying it."""
    play = write_play(FAILED_ROW_THEN_BODY)
    assert deepline("run", str(play), "--quiet").code == 0
    kept = _plan(deepline, str(play))
    assert kept["totals"]["new_calls"] == 0, kept["totals"]
    retried = _plan(deepline, str(play), "--refresh-failed")
    assert retried["totals"]["new_calls"] == 1, retried["totals"]  # bob's failed call, asked again
    forced = _plan(deepline, str(play), "--force-refresh")
    assert forced["totals"]["new_calls"] == 2, forced["totals"]  # every call, paid again


TWO_COLUMNS = """
from deepline_cli import ToolExecutionError, play, tool

@tool("t.first", credits=1)
def first(input):
    if input["name"] in ("p1", "p3"):
        raise ToolExecutionError("500 from t.first", category="internal", status_code=500)
    return {"ok": True}

@tool("t.second", credits=5)
def second(input):
    return {"ok": True}

@play("two")
async def two(ctx, input):
    rows = [{"name": f"p{i}"} for i in range(int(input.get("n", 2)))]
    done = await ctx.map("leads", rows, key="name", columns={
        "a": lambda row, rc: rc.tools.execute("a", "t.first", {"name": row["name"]}),
        "b": lambda row, rc: rc.tools.execute("b", "t.second", {"name": row["name"]}),
    })
    return len(done)
"""


def test_at_least_counts_no_call_after_a_column_that_may_fail_its_row(deepline, write_play) -> None:
    """A call in a column after one whose provider has failed rows before is made only if
    that one does not fail the row: "at least" counted it, and the run paid less than the
    plan's least. (With no such history, calls are taken to answer: it is counted.)"""
    play = str(write_play(TWO_COLUMNS))
    fresh = _plan(deepline, play, "--set", "n=4")["totals"]["credits"]
    assert (fresh["min"], fresh["max"]) == (24, 24), fresh
    assert deepline("run", play, "--set", "n=2", "--quiet").code == 0  # p1's first call failed its row
    credits = _plan(deepline, play, "--set", "n=4")["totals"]["credits"]
    assert (credits["min"], credits["max"]) == (0, 12), credits  # p2 and p3: t.first fails half its calls


FILL_BLANKS = """
from deepline_cli import Column, play, tool

@tool("f.find", credits=1)
def find(input):
    return input["first"] + "@found.dev"

@tool("f.validate", credits=5)
def validate(input):
    return "valid"

async def email(row, rc):
    return (await rc.tools.execute("find", "f.find", {"first": row["first"]})).output

async def status(row, rc):
    return (await rc.tools.execute("check", "f.validate", {"email": row["email"]})).output

@play("fill")
async def fill(ctx, input):
    rows = [{"first": name, "email": email} for name, email in [("ada", ""), ("grace", "g@cobol.dev"), ("alan", "")]]
    done = await ctx.map("leads", rows, key="first", columns={
        "email": Column(email, run_if=lambda row: not row["email"]),  # fills the blank ones
        "status": Column(status, run_if=lambda row: bool(row["email"])),
    })
    return len(done)
"""


def test_a_column_named_like_an_input_field_is_unknown_to_the_columns_after_it(deepline, write_play) -> None:
    """An `email` column filling the CSV's blank emails: a validator after it reads the email
    found, not the blank the input had. The plan counted it on the input's value (one call,
    "at least" = max) and the run spent three times that; its bound holds the run's spend."""
    play = write_play(FILL_BLANKS)
    plan = _plan(deepline, str(play))
    run = deepline("run", str(play), "--json")
    assert run.code == 0, run.stderr
    spent = run.json_lines()[-1]["stats"]["credits"]
    assert spent == 2 + 3 * 5
    credits = plan["totals"]["credits"]
    assert credits["min"] <= spent <= credits["max"], (credits, spent)
