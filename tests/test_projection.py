"""Pilot projection: a `--limit N` run projects the full list's credits and time."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from deepline_cli.runtime.map.projection import PilotSample, describe, mean_sd, project_map
from deepline_cli.store.records import MapRecord

# A waterfall with a realistic hit rate: finder A finds ~60% of rows, B half of the rest;
# a found email is validated. Deterministic per domain, so runs agree.
PLAY = """
import hashlib
from deepline_cli import Column, play, tool

def roll(*parts):
    return int(hashlib.sha256("|".join(parts).encode()).hexdigest()[:4], 16) % 100

@tool("pilot.finder_a", credits=1)
def finder_a(input):
    return {"email": f"a@{input['domain']}"} if roll("a", input["domain"]) < 60 else None

@tool("pilot.finder_b", credits=2)
def finder_b(input):
    return {"email": f"b@{input['domain']}"} if roll("b", input["domain"]) < 50 else None

@tool("pilot.validate", credits=0.5)
def validate(input):
    return {"ok": roll("v", input["email"]) < 90}

async def waterfall(row, rc):
    found = await rc.tools.execute("a", "pilot.finder_a", {"domain": row["domain"]})
    if found.output:
        return found.output
    return (await rc.tools.execute("b", "pilot.finder_b", {"domain": row["domain"]})).output

@play("pilot")
async def pilot(ctx, input):
    rows = await ctx.map("leads", ctx.csv(input["csv"]), key="domain", columns={
        "email": waterfall,
        "valid": Column(lambda row, rc: rc.tools.execute("v", "pilot.validate", {"email": row["email"]["email"]}),
                        run_if=lambda row: row["email"] is not None),
    })
    return {"rows": len(rows)}
"""


def _leads(path: Path, n: int, duplicates: int = 0) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["domain"])
        for i in range(n):
            writer.writerow([f"c{i}.com"])
        for i in range(duplicates):
            writer.writerow([f"c{i}.com"])
    return path


def _finished(result) -> dict:
    assert result.code == 0, result.stderr
    return result.json_lines()[-1]


def test_pilot_of_100_rows_projects_the_full_list_within_20_percent(deepline, write_play, tmp_path) -> None:
    play = write_play(PLAY)
    leads = _leads(tmp_path / "leads.csv", 3000)
    pilot = _finished(deepline("run", str(play), "--csv", str(leads), "--limit", "100", "--json"))
    projection = pilot["stats"]["projection"]
    (m,) = projection["maps"]
    assert (m["pilot_rows"], m["full_rows"], m["new_rows"], m["already_paid"]) == (100, 3000, 2900, 0)
    assert m["columns"]["email"]["found"] > 0.5
    assert projection["spent"] == pilot["stats"]["credits"]

    full = _finished(deepline("run", str(play), "--csv", str(leads), "--json", DEEPLINE_STORE=str(tmp_path / "f.db")))
    actual = full["stats"]["credits"]
    assert "projection" not in full["stats"]  # no limit: nothing to project
    assert abs(projection["credits"] - actual) <= 0.2 * actual, (projection, actual)
    assert projection["low"] <= actual <= projection["high"], (projection, actual)


def test_human_summary_and_rows_already_paid(deepline, write_play, tmp_path) -> None:
    play = write_play(PLAY)
    leads = _leads(tmp_path / "leads.csv", 400, duplicates=50)
    middle = tmp_path / "middle.csv"  # companies 100 to 299, enriched by an earlier run
    middle.write_text("domain\n" + "".join(f"c{i}.com\n" for i in range(100, 300)))
    assert deepline("run", str(play), "--csv", str(middle), "--quiet").code == 0
    # A pilot of 100 new rows: of the 300 distinct rows after it, 200 are in the sheet already.
    result = deepline("run", str(play), "--csv", str(leads), "--limit", "100")
    assert result.code == 0, result.stderr
    assert "pilot leads: 100 of 400 rows" in result.stderr
    assert "full list of 400 rows ≈" in result.stderr
    assert "200 rows already paid" in result.stderr
    finished = _finished(deepline("run", str(play), "--csv", str(leads), "--limit", "100", "--json"))
    (m,) = finished["stats"]["projection"]["maps"]
    assert (m["already_paid"], m["new_rows"], m["input_rows"]) == (200, 100, 450)


def test_no_projection_when_the_limit_covers_the_list(deepline, write_play, tmp_path) -> None:
    play = write_play(PLAY)
    leads = _leads(tmp_path / "leads.csv", 20)
    finished = _finished(deepline("run", str(play), "--csv", str(leads), "--limit", "50", "--json"))
    assert "projection" not in finished["stats"]


def test_projection_math_is_a_prediction_interval() -> None:
    sample = PilotSample("leads", row_credits=[1.0, 3.0] * 50, elapsed_s=10.0)
    record = MapRecord("r", "leads", "s", total=100, succeeded=100)
    m = project_map(sample, record, {"rest_rows": 900, "rest_distinct": 900, "rest_paid": 100})
    mean, sd = mean_sd(sample.row_credits)
    assert mean == 2.0 and sd == pytest.approx(1.005, abs=1e-3)
    assert m["new_rows"] == 800 and m["rest_credits"] == 1600
    assert m["rest_margin"] == pytest.approx(1.96 * sd * (800**2 / 100 + 800) ** 0.5, abs=0.01)
    assert m["seconds_per_row"] == 0.1 and m["rest_s"] == 80
    lines = describe({"maps": [m], "credits": 1800, "margin": m["rest_margin"], "rest_s": 80})
    assert lines[-1].startswith("full list of 1,000 rows ≈ 1,800 credits (±")
    assert "2 credits/row ·" in lines[0], lines  # every pilot row measured: nothing more said
    # Five of twelve pilot rows new (the others answered in part by earlier runs): "±0" from
    # five equal rows read as certain; the line says what the mean stands on.
    few = PilotSample("leads", row_credits=[1.5] * 5, elapsed_s=1.0)
    m = project_map(few, MapRecord("r", "leads", "s", total=12, succeeded=12), {"rest_distinct": 300})
    lines = describe({"maps": [m], "credits": 450, "margin": 0, "rest_s": 10})
    assert "1.5 credits/row (from 5 new rows)" in lines[0], lines
    # Cheap tools (a validator at 0.1 credits a row): a whole-credit estimate said "≈ 0".
    cheap = PilotSample("leads", row_credits=[0.1] * 3, elapsed_s=1.0)
    m = project_map(cheap, MapRecord("r", "leads", "s", total=3, succeeded=3), {"rest_distinct": 5})
    lines = describe({"maps": [m], "credits": 0.5, "margin": 0.04, "rest_s": 1})
    assert "≈ 0.5 credits (±0.04, 95%)" in lines[-1], lines
    # A second pilot (its first rows from the first's sheet): its figure is its own spend and
    # the rest's, so it says both, and what is left to pay.
    lines = describe({"maps": [m], "credits": 30, "margin": 0, "rest_s": 1, "spent": 12})
    assert "≈ 30 credits (±0, 95%): 12 spent by this run, ≈ 18 more; " in lines[-1], lines


def test_a_pilots_time_is_its_rows_pace_not_one_rows_retries() -> None:
    """One pilot row of 100 waited 30 s in 5xx backoff: "≈ 37 s more" for a rest that took
    14. The time a row takes is read at the moment 90% of the pilot's rows had finished."""
    ends = [1.0 + i * 0.1 for i in range(99)] + [31.0]  # 99 rows in 10.8 s, one row 30 s more
    sample = PilotSample("leads", row_credits=[1.0] * 100, elapsed_s=31.0, row_ends=ends)
    record = MapRecord("r", "leads", "s", total=100, succeeded=100)
    m = project_map(sample, record, {"rest_rows": 900, "rest_distinct": 900, "rest_paid": 0})
    assert m["seconds_per_row"] == pytest.approx(ends[89] / 90, abs=1e-3)  # 0.11 s, not 0.31
    assert m["rest_s"] == pytest.approx(900 * ends[89] / 90, abs=0.1)
    few = project_map(PilotSample("leads", elapsed_s=4.0, row_ends=[1.0, 4.0]), MapRecord("r", "leads", "s", total=2),
                      {"rest_rows": 8, "rest_distinct": 8, "rest_paid": 0})  # fmt: skip
    assert few["seconds_per_row"] == 2.0  # too few rows to read a pace from: the whole time
    # A run_if that said yes to 1 row in 5: 20 rows made calls, 100 rows kept that pace.
    some = PilotSample("leads", elapsed_s=2.0, row_ends=[0.1 * (i + 1) for i in range(20)])
    m = project_map(some, record, {"rest_rows": 400, "rest_distinct": 400, "rest_paid": 0})
    assert m["seconds_per_row"] == pytest.approx(1.8 / 90, abs=1e-4)  # 18 of 20 in 1.8 s: 90 of 100 rows


def test_the_projection_counts_blank_key_rows_as_the_run_will(deepline, write_play, tmp_path) -> None:
    """Rows with a blank key are each a row of their own in the run: the projection of the
    rest of the list took them all for one."""
    play = write_play(PLAY)
    leads = tmp_path / "leads.csv"
    blank_keys = "".join(f",lead {i}\n" for i in range(30))  # a name, no domain (a row of empty cells is no row)
    leads.write_text("domain,name\n" + "".join(f"c{i}.com,n{i}\n" for i in range(20)) + blank_keys + "c0.com,n0\n")
    pilot = _finished(deepline("run", str(play), "--csv", str(leads), "--limit", "10", "--json"))
    (m,) = pilot["stats"]["projection"]["maps"]
    assert (m["full_rows"], m["new_rows"]) == (50, 40), m  # 20 companies and 30 blank rows; one duplicate


def test_a_pilot_of_rows_all_paid_before_does_not_project_a_cost_it_cannot_know(deepline, write_play, tmp_path):
    """Every pilot row was taken from the sheet (paid by an earlier run): nothing says what
    a new row costs, so the projection says the rest's cost is unknown, not "≈ 0 ± 0"."""
    play = write_play(PLAY)
    leads = _leads(tmp_path / "leads.csv", 40)
    assert deepline("run", str(play), "--csv", str(leads), "--limit", "10", "--quiet").code == 0
    again = deepline("run", str(play), "--csv", str(leads), "--limit", "10", "--json")
    projection = _finished(again)["stats"]["projection"]
    (m,) = projection["maps"]
    assert (m["new_rows"], m["credits_per_row"]["sample"]) == (30, 0), m
    assert (m["rest_credits"], projection["credits"], projection["margin"]) == (None, None, None), projection
    shown = deepline("run", str(play), "--csv", str(leads), "--limit", "10")
    assert "full list of 40 rows: the cost of its 30 new rows is unknown" in shown.stderr, shown.stderr
    assert "≈ 0 credits" not in shown.stderr


TOOLS_AB = """
from deepline_cli import play, tool

@tool("t.a", credits=1)
def a(input):
    return {"v": 1}

@tool("t.b", credits=10)
def b(input):
    return {"w": 2}
"""

CHAINED = (
    TOOLS_AB
    + """
@play("chain")
async def chain(ctx, input):
    first = await ctx.map("first", [{"id": i} for i in range(100)], key="id", columns={
        "a": lambda row, rc: rc.tools.execute("a", "t.a", {"id": row["id"]})})
    second = await ctx.map("second", first, key="id", columns={
        "b": lambda row, rc: rc.tools.execute("b", "t.b", {"id": row["id"]})})
    seeds = await ctx.map("seeds", [{"id": "x"}], key="id", columns={"n": lambda row: 1})
    return len(second) + len(seeds)
"""
)


def test_a_map_over_a_pilot_maps_rows_is_projected_with_it(deepline, write_play) -> None:
    """Companies, then a map over their rows: the pilot cut the first map only, but the
    second runs on as many rows as the first will have; both are projected. A map over a
    list of its own, run whole, is named as not projected."""
    play = write_play(CHAINED)
    pilot = _finished(deepline("run", str(play), "--limit", "10", "--json"))
    projection = pilot["stats"]["projection"]
    assert {m["map"]: m["full_rows"] for m in projection["maps"]} == {"first": 100, "second": 100}
    assert (projection["credits"], projection["margin"]) == (1100, 0), projection
    assert projection["unprojected"] == ["seeds"]
    full = _finished(deepline("run", str(play), "--json"))
    assert pilot["stats"]["credits"] + full["stats"]["credits"] == 1100


REUSED_BY_RECEIPT = """
from deepline_cli import play, tool

@tool("t.co", credits=2)
def co(input):
    return {"v": input["d"]}

@play("p6")
async def p6(ctx, input):
    rows = [{"d": f"x{i}.io"} for i in range(50)]
    a = await ctx.map("a", rows, key="d", columns={"c": lambda row, rc: rc.tools.execute("e", "t.co", {"d": row["d"]})})
    return {"a": len(a)}
"""


def test_a_pilot_answered_from_receipts_learns_no_cost_from_those_rows(deepline, write_play) -> None:
    """The play's input changed since a pilot: its cells are computed again, their calls
    answered by the earlier run's receipts (no credit). Those rows say nothing of what a new
    row costs: with all of them so, the cost is unknown (it said ≈ 0 ± 0); with half, the
    other half's 2 credits a row are projected."""
    play = write_play(REUSED_BY_RECEIPT)
    assert deepline("run", str(play), "--limit", "10", "--quiet").code == 0
    again = _finished(deepline("run", str(play), "--limit", "10", "--set", "v=2", "--json"))
    assert again["stats"]["projection"]["credits"] is None, again["stats"]["projection"]
    half = _finished(deepline("run", str(play), "--limit", "20", "--set", "v=3", "--json"))
    (m,) = half["stats"]["projection"]["maps"]
    assert (m["credits_per_row"]["mean"], m["credits_per_row"]["sample"]) == (2.0, 10), m
    assert half["stats"]["projection"]["credits"] == half["stats"]["credits"] + 30 * 2


CONTACTS = """
from deepline_cli import play, tool

@tool("t.company", credits=2)
def company(input):
    return {"size": len(input["domain"])}

@tool("t.email", credits=1)
def email(input):
    return input["first"] + "@" + input["domain"]

@tool("t.verify", credits=0.5)
def verify(input):
    return True

@play("contacts")
async def contacts(ctx, input):
    people = await ctx.map("people", ctx.csv(input["csv"]), key=["first", "domain"], columns={
        "company": lambda row, rc: rc.tools.execute("co", "t.company", {"domain": row["domain"]}),
        "email": lambda row, rc: rc.tools.execute("em", "t.email", {"first": row["first"], "domain": row["domain"]}),
    })
    verified = await ctx.map("verified", people, key="email", columns={
        "ok": lambda row, rc: rc.tools.execute("v", "t.verify", {"email": row["email"]}),
    })
    return len(verified)
"""


def _people(path: Path, firsts: list[str], domains: int) -> Path:
    path.write_text("first,domain\n" + "".join(f"{f},d{i}.com\n" for f in firsts for i in range(domains)))
    return path


def test_a_pilot_whose_rows_reused_some_answers_projects_what_they_paid(deepline, write_play, tmp_path) -> None:
    """New contacts at companies looked up before: each pilot row's company comes from a
    receipt, its email is paid. The projection learns from what those rows paid (it said
    'no pilot row was paid for', and '60 new rows' of a 30-row list, counting the fed map)."""
    play = write_play(CONTACTS)
    assert deepline("run", str(play), "--csv", str(_people(tmp_path / "old.csv", ["ann"], 30)), "-q").code == 0
    new = _people(tmp_path / "new.csv", ["bob"], 30)
    pilot = _finished(deepline("run", str(play), "--csv", str(new), "--limit", "10", "--json"))
    projection = pilot["stats"]["projection"]
    people, verified = projection["maps"]
    assert (people["credits_per_row"]["mean"], people["credits_per_row"]["sample"]) == (1.0, 10), people
    assert (people["new_rows"], verified["new_rows"]) == (20, 20)
    full = _finished(deepline("run", str(play), "--csv", str(new), "--json"))
    assert projection["credits"] == pilot["stats"]["credits"] + full["stats"]["credits"] == 45, projection
    shown = deepline("run", str(play), "--csv", str(_people(tmp_path / "x.csv", ["cy"], 30)), "--limit", "10")
    assert "reused some answers paid before" in shown.stderr, shown.stderr
    assert "full list of 30 rows ≈ 45 credits" in shown.stderr, shown.stderr


def test_a_map_over_a_pilot_map_counts_the_rows_paid_before_in_its_rest(deepline, write_play, tmp_path) -> None:
    """The list's last 20 rows ran whole before; a pilot of its first 10: the rest costs
    nothing, for the verifying map over its rows too (it projected 20 rows × 0.5)."""
    play = write_play(CONTACTS)
    whole = _people(tmp_path / "all.csv", ["ann"], 30)
    tail = tmp_path / "tail.csv"
    tail.write_text("first,domain\n" + "".join(whole.read_text().splitlines(keepends=True)[11:]))
    assert deepline("run", str(play), "--csv", str(tail), "-q").code == 0
    pilot = _finished(deepline("run", str(play), "--csv", str(whole), "--limit", "10", "--json"))
    projection = pilot["stats"]["projection"]
    people, verified = projection["maps"]
    assert (people["already_paid"], verified["already_paid"]) == (20, 20), projection
    assert projection["credits"] == pilot["stats"]["credits"], projection
    full = _finished(deepline("run", str(play), "--csv", str(whole), "--json"))
    assert full["stats"]["credits"] == 0


DERIVED = (
    TOOLS_AB
    + """
@play("derived")
async def derived(ctx, input):
    companies = await ctx.map("companies", [{"id": i} for i in range(100)], key="id", columns={
        "a": lambda row, rc: rc.tools.execute("a", "t.a", {"id": row["id"]})})
    people = [{"id": f"{c['id']}-{n}"} for c in companies for n in range(2)]  # two people a company
    found = await ctx.map("people", people, key="id", columns={
        "b": lambda row, rc: rc.tools.execute("b", "t.b", {"id": row["id"]})})
    return len(found)
"""
)


def test_a_map_over_a_list_made_from_a_pilots_rows_is_not_projected_as_a_whole_list(deepline, write_play) -> None:
    """People found for the pilot's companies: the limit cut that list too, and the rest of
    it (the pilot companies' people) was projected as the whole list: 20 rows where the
    full run has 200, a confident projection ten times too low."""
    play = write_play(DERIVED)
    pilot = _finished(deepline("run", str(play), "--limit", "10", "--json"))
    projection = pilot["stats"]["projection"]
    assert [m["map"] for m in projection["maps"]] == ["companies"]
    assert projection["unprojected"] == ["people"]
    # the full list's figure says what it leaves out (it read as the whole run's cost)
    shown = deepline("run", str(play), "--limit", "10")
    (headline,) = [line for line in shown.stderr.splitlines() if "full list of" in line]
    assert headline.endswith("(not counting people)"), headline


CHILD_PAID = """
from deepline_cli import play, tool

@tool("k.paid", credits=1)
def paid(input):
    return {"d": input["domain"]}

@play("summary")
async def summary(ctx, input):
    return (await ctx.tools.execute("p", "k.paid", {"domain": input["domain"]})).output

@play("kids")
async def kids(ctx, input):
    rows = await ctx.map("accounts", [{"d": f"c{i}.com"} for i in range(50)], key="d",
        columns={"summary": lambda row, rc: rc.run_play("sum", "summary", {"domain": row["d"]})})
    return len(rows)
"""


def test_a_pilot_counts_what_a_rows_child_plays_paid(deepline, write_play) -> None:
    """A column that runs a child play per row (which pays 1 credit): the pilot paid 10 on
    10 rows and projected "0 credits/row", the full list at what the pilot had paid."""
    play = write_play(CHILD_PAID)
    pilot = _finished(deepline("run", f"{play}:kids", "--limit", "10", "--json"))
    projection = pilot["stats"]["projection"]
    (m,) = projection["maps"]
    assert (pilot["stats"]["credits"], m["credits_per_row"]["mean"]) == (10, 1), m
    assert projection["credits"] == 50, projection


def test_the_projection_prices_no_row_that_fails_on_its_input(deepline, write_play, tmp_path) -> None:
    """Rows of the rest with a blank required cell fail before any call (the plan says so,
    and the run pays nothing for them): the projection priced each like a new row."""
    play = write_play(PLAY.replace('ctx.csv(input["csv"])', 'ctx.csv(input["csv"], required=["domain"])'))
    leads = tmp_path / "leads.csv"
    blank = "".join(f",lead {i}\n" for i in range(30))
    leads.write_text("domain,name\n" + "".join(f"c{i}.com,n{i}\n" for i in range(20)) + blank)
    pilot = _finished(deepline("run", str(play), "--csv", str(leads), "--limit", "10", "--json"))
    (m,) = pilot["stats"]["projection"]["maps"]
    assert (m["full_rows"], m["new_rows"], m["failing_rows"]) == (50, 10, 30), m
