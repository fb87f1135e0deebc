"""What a play is given is checked before anything is paid: a blank required cell, a tool
nothing can run, an input field the run was not given, an empty CSV, columns told apart
by case only. Through the real `deepline` command."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Result

Run = Callable[..., Result]

LEADS = """
from pathlib import Path

from deepline_cli import play, tool

@tool("t.company", credits=1)
def company(input):
    with open(Path(__file__).parent / "calls.txt", "a") as calls:  # one line per real call
        calls.write(input["domain"] + "\\n")
    return {"name": input["domain"].upper()}

@play("leads")
async def leads(ctx, input):
    rows = ctx.csv(input["csv"], required=["domain"])
    done = await ctx.map("leads", rows, key="id", columns={
        "company": lambda row, rc: rc.tools.execute("c", "t.company", {"domain": row["domain"]}),
    })
    return {"rows": len(done), "failed": done.failed_count}
"""


def test_a_blank_required_cell_fails_its_row_without_a_call(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    write_play(LEADS)
    (tmp_path / "leads.csv").write_text("id,domain\n1,acme.com\n2,\n3,   \n4,b.com\n5,c.com\n")
    plan = deepline("plan", "play.py", "--csv", "leads.csv", "--json")
    assert plan.code == 0, plan.stderr
    (m,) = plan.json_lines()[-1]["maps"]
    assert (m["distinct"], m["blank_rows"], m["new_calls"]) == (5, 2, 3)
    assert "2 failing on their input (a blank required cell" in deepline("plan", "play.py", "--csv", "leads.csv").stdout

    run = deepline("run", "play.py", "--csv", "leads.csv", "--run-id", "B", "--json")
    assert run.code == 0, run.stderr  # the map goes on
    assert run.json_lines()[-1]["output"] == {"rows": 5, "failed": 2}
    assert sorted((tmp_path / "calls.txt").read_text().split()) == ["acme.com", "b.com", "c.com"]  # none for them
    failed = deepline("runs", "logs", "B", "--kind", "row.failed", "--json").json_lines()
    assert [(f["fields"]["row_key"], f["fields"]["error"]) for f in failed] == [
        ("2", "InputError: required column 'domain' is blank (leads.csv line 3)"),
        ("3", "InputError: required column 'domain' is blank (leads.csv line 4)"),
    ]
    # a later run gives the failures back like any failed cell; --refresh-failed checks them again
    again = deepline("run", "play.py", "--csv", "leads.csv", "--json").json_lines()[-1]
    assert (again["output"], again["stats"]["rows"]["reused"]) == ({"rows": 5, "failed": 2}, 5)
    refreshed = deepline("run", "play.py", "--csv", "leads.csv", "--refresh-failed", "--json").json_lines()[-1]
    assert refreshed["output"] == {"rows": 5, "failed": 2}
    assert len((tmp_path / "calls.txt").read_text().split()) == 3  # still no call for them
    # the plan after them: blank rows fail with nothing called, never "already paid" nor refreshed
    (after,) = deepline("plan", "play.py", "--csv", "leads.csv", "--json").json_lines()[-1]["maps"]
    assert (after["blank_rows"], after["paid_rows"], after["new_calls"]) == (2, 3, 0), after
    assert "--refresh-failed" not in deepline("plan", "play.py", "--csv", "leads.csv").stdout
    exported = list(csv.DictReader(io.StringIO(deepline("export", "B").stdout)))
    assert [(r["id"], r["domain"], r["_error"] != "") for r in exported] == [
        ("1", "acme.com", False), ("2", "", True), ("3", "   ", True), ("4", "b.com", False), ("5", "c.com", False)
    ]  # fmt: skip


def test_a_row_whose_input_is_mended_is_computed_on_the_next_run(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """A row failed by its input (a line short of a cell, a blank required cell) is computed
    once the input no longer has that fault: the line mended in the file, the column no
    longer required by the play. Its kept failure was the input's, not its columns'. A row
    whose input still has the fault keeps failing without a call."""
    write_play(LEADS.replace('required=["domain"]', 'required=["domain", "name"]'))
    (tmp_path / "leads.csv").write_text("id,domain,name\n1,acme.com,Acme\n2,b.com\n3,c.com,\n4,,Dee\n")
    first = deepline("run", "play.py", "--csv", "leads.csv", "--json").json_lines()[-1]
    assert first["output"] == {"rows": 4, "failed": 3}, first
    assert (tmp_path / "calls.txt").read_text().split() == ["acme.com"]

    write_play(LEADS)  # the play no longer requires `name`: row 3 is computed
    relaxed = deepline("run", "play.py", "--csv", "leads.csv", "--json").json_lines()[-1]
    assert relaxed["output"] == {"rows": 4, "failed": 2}, relaxed
    # line 3 given its missing cell (empty, as the short line was read): the same input as before
    (tmp_path / "leads.csv").write_text("id,domain,name\n1,acme.com,Acme\n2,b.com,\n3,c.com,\n4,,Dee\n")
    mended = deepline("run", "play.py", "--csv", "leads.csv", "--run-id", "R", "--json").json_lines()[-1]
    assert mended["output"] == {"rows": 4, "failed": 1}, mended  # row 4's domain is still blank
    assert (tmp_path / "calls.txt").read_text().split() == ["acme.com", "c.com", "b.com"]
    failed = deepline("runs", "logs", "R", "--kind", "row.failed", "--json").json_lines()
    assert [(f["fields"]["row_key"], f["fields"]["error"]) for f in failed] == [
        ("4", "InputError: required column 'domain' is blank (leads.csv line 5)")
    ]


def test_rows_whose_blank_required_cell_is_their_key_each_fail_on_their_own(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """A CRM export keyed by email, with holes in the email column: each blank row fails and
    is listed, none is skipped as a "duplicate" of the first blank one."""
    write_play(LEADS.replace('key="id"', 'key="domain"'))
    (tmp_path / "leads.csv").write_text("id,domain\n1,acme.com\n2,\n3,   \n4,\n5,b.com\n")
    (m,) = deepline("plan", "play.py", "--csv", "leads.csv", "--json").json_lines()[-1]["maps"]
    assert (m["distinct"], m["blank_rows"], m["new_calls"]) == (5, 3, 2)

    run = deepline("run", "play.py", "--csv", "leads.csv", "--run-id", "K", "--json")
    assert run.code == 0, run.stderr
    finished = run.json_lines()[-1]
    assert finished["output"] == {"rows": 5, "failed": 3}
    assert finished["stats"]["rows"]["duplicate"] == 0
    failed = deepline("runs", "logs", "K", "--kind", "row.failed", "--json").json_lines()
    assert [(f["fields"]["row_key"], f["fields"]["error"]) for f in failed] == [
        ("leads.csv line 3", "InputError: required column 'domain' is blank (leads.csv line 3)"),
        ("leads.csv line 4", "InputError: required column 'domain' is blank (leads.csv line 4)"),
        ("leads.csv line 5", "InputError: required column 'domain' is blank (leads.csv line 5)"),
    ]
    exported = list(csv.DictReader(io.StringIO(deepline("export", "K").stdout)))
    assert [(r["id"], r["_error"] != "") for r in exported] == [
        ("1", False), ("2", True), ("3", True), ("4", True), ("5", False)
    ]  # fmt: skip


def test_rows_with_a_blank_part_of_a_composite_key_each_fail_on_their_own(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """Keyed by (name, domain) with the domain required: two people of one name at unknown
    companies are two failed rows, not a failed row and a "duplicate" nobody sees."""
    write_play(LEADS.replace('key="id"', 'key=["name", "domain"]'))
    (tmp_path / "leads.csv").write_text("id,name,domain\n1,Ada,\n2,Ada,\n3,Ada,acme.com\n")
    run = deepline("run", "play.py", "--csv", "leads.csv", "--json")
    assert run.code == 0, run.stderr
    finished = run.json_lines()[-1]
    assert finished["output"] == {"rows": 3, "failed": 2}
    assert finished["stats"]["rows"]["duplicate"] == 0


def test_a_key_function_giving_every_part_blank_keys_the_row_by_its_place(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """A key function normalising a composite key (email, domain): a row with both blank has
    no identity, as with `key=["email", "domain"]`, and is a row of its own, not a duplicate
    of another such row."""
    write_play(LEADS.replace('key="id"', 'key=lambda row: [row["email"].strip().lower(), row["domain"].strip()]')
               .replace('required=["domain"]', "required=[]"))  # fmt: skip
    (tmp_path / "leads.csv").write_text("id,email,domain\n1,ada@a.com,a.com\n2,,\n3, , \n4,,\n")
    run = deepline("run", "play.py", "--csv", "leads.csv", "--json")
    assert run.code == 0, run.stderr
    finished = run.json_lines()[-1]
    assert finished["output"]["rows"] == 4 and finished["stats"]["rows"]["duplicate"] == 0, finished


def test_a_key_function_that_raises_names_the_map_the_row_and_the_error(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    write_play(LEADS.replace('key="id"', 'key=lambda row: row["email"].lower()'))
    (tmp_path / "leads.csv").write_text("id,domain\n1,acme.com\n")
    run = deepline("run", "play.py", "--csv", "leads.csv")
    assert run.code == 1, run.stderr
    assert "Map 'leads' stopped at input row 1: its key function raised KeyError: 'email' (play.py line" in run.stderr
    assert not (tmp_path / "calls.txt").exists()


LIST_ROWS = """
from deepline_cli import play

@play("api")
async def api(ctx, input):
    rows = [{"email": "a@x.com", "score": 1.0}, {"email": None, "score": 2.0}, {"name": "C", "score": 3.0}]
    if input.get("nan"):
        rows = [{"email": "a@x.com", "score": 1.0}, {"email": "b@x.com", "score": float("nan")}]
    if input.get("nan_key"):  # pandas gives NaN for a missing email
        rows = [{"email": "a@x.com", "score": 1.0}, {"email": float("nan"), "score": 2.0}]
    return len(await ctx.map("contacts", rows, key="email", columns={"s": lambda row: row["score"]}))
"""


def test_a_list_row_without_its_key_field_is_named_by_its_place(deepline: Run, write_play: Callable[..., Path]) -> None:
    """Records from an API, one without an `email`: the map stopped with "Row has no key
    field 'email' (fields: name, score)", which row not said (a key function's error is)."""
    write_play(LIST_ROWS)
    run = deepline("run", "play.py")
    assert run.code == 2, run.stderr
    assert "Map 'contacts' stopped at input row 3: it has no key field 'email' (its fields: name, score)" in run.stderr


def test_nan_in_a_list_row_names_its_field_and_what_to_give_instead(
    deepline: Run, write_play: Callable[..., Path]
) -> None:
    """Rows from pandas hold NaN for a missing number: the map stopped with "A map row has
    no key or digest (NaN and Infinity are not JSON)", though the row had its key."""
    write_play(LIST_ROWS)
    run = deepline("run", "play.py", "--input", '{"nan": true}')
    assert run.code == 2, run.stderr
    said = run.stderr
    assert "Map 'contacts' stopped at input row 2: its field 'score' holds NaN, which is not JSON" in said, said
    assert "give None for a missing value" in said, said
    keyed = deepline("run", "play.py", "--input", '{"nan_key": true}')  # in its key: an input, not a play bug
    assert keyed.code == 2, keyed.stderr
    assert "Map 'contacts' stopped at input row 2: its field 'email' holds NaN" in keyed.stderr, keyed.stderr


SLOW_LEADS = """
import asyncio
from pathlib import Path

from deepline_cli import play, tool

@tool("t.company", credits=1)
async def company(input):
    with open(Path(__file__).parent / "calls.txt", "a") as calls:  # one line per real call
        calls.write(input["domain"] + "\\n")
    await asyncio.sleep(0.2)
    return {"name": input["domain"].upper()}

@play("leads")
async def leads(ctx, input):
    rows = ctx.csv(input["csv"])
    done = await ctx.map("leads", rows, key=lambda row: row["email"].split("@")[1], columns={
        "company": lambda row, rc: rc.tools.execute("c", "t.company", {"domain": row["email"].split("@")[1]}),
    })
    return {"rows": len(done)}
"""


def test_a_key_function_failing_late_lets_the_calls_in_flight_finish_and_be_recorded(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """A key function fails on a row far down the list while earlier rows' calls are out:
    those calls finish and are recorded before the map stops, so the resume after the fix
    pays none of them again."""
    write_play(SLOW_LEADS)
    emails = [f"ceo@company{i}.com" for i in range(600)]
    emails[580] = "not an email"
    (tmp_path / "leads.csv").write_text("email\n" + "\n".join(emails) + "\n")
    run = deepline("run", "play.py", "--csv", "leads.csv", "--run-id", "late", "--json")
    finished = run.json_lines()[-1]
    assert run.code == 1 and "its key function raised IndexError" in finished["error"]["message"], finished
    made = (tmp_path / "calls.txt").read_text().split()
    assert made and len(made) == len(set(made)), made
    recorded = finished["stats"]["tools"]["t.company"]["live"]
    assert recorded == len(made)  # every call made was recorded: none left in flight

    emails[580] = "ceo@company580.com"
    (tmp_path / "leads.csv").write_text("email\n" + "\n".join(emails) + "\n")
    done = deepline("resume", "late", "--json")
    assert done.code == 0, done.stderr
    made = (tmp_path / "calls.txt").read_text().split()
    assert sorted(made) == sorted(e.split("@")[1] for e in emails)  # each company called once


def test_the_export_a_reported_run_suggests_never_writes_over_its_input(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """The play `leads` over leads.csv: the suggested export is named after the play, not
    the input's own name, and an export told to write over the run's input refuses."""
    write_play(LEADS)
    (tmp_path / "leads.csv").write_text("id,domain\n1,acme.com\n")
    assert deepline("run", "play.py", "--csv", "leads.csv", "--run-id", "E").code == 0
    again = deepline("run", "play.py", "--csv", "leads.csv", "--run-id", "E")
    assert "Next: deepline export E --out leads-export.csv" in again.stderr, again.stderr
    assert deepline("export", "E", "--out", "leads-export.csv").code == 0
    over = deepline("export", "E", "--out", "leads.csv")
    assert over.code == 2, over.stderr
    assert "leads.csv is an input of run E" in over.stderr, over.stderr
    assert (tmp_path / "leads.csv").read_text() == "id,domain\n1,acme.com\n"  # untouched


def test_the_export_a_run_of_several_maps_suggests_runs_as_printed(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """Companies, then their contacts: the suggested export names a map (without one the
    command refuses a run of several), and it works as it is printed."""
    write_play(
        LEADS.replace(
            '    return {"rows"',
            '    contacts = await ctx.map("contacts", [{"name": "Ada"}], key="name", columns={"n": lambda row: 1})\n'
            '    return {"rows"',
        )
    )
    (tmp_path / "leads.csv").write_text("id,domain\n1,acme.com\n")
    run = deepline("run", "play.py", "--csv", "leads.csv", "--run-id", "two")
    assert run.code == 0, run.stderr
    line = next(line for line in run.stderr.splitlines() if "Next: deepline export" in line)
    command = line.split("Next: deepline ", 1)[1].split(" · ", 1)[0]
    assert command == "export two --map contacts --out leads-contacts.csv", line
    assert " · other maps: leads" in line
    assert deepline(*command.split()).code == 0
    assert (tmp_path / "leads-contacts.csv").read_text().splitlines()[1:] == ["Ada,1,"]  # name, n, _error


def test_a_missing_csv_is_a_usage_error_naming_the_flag(deepline: Run, write_play: Callable[..., Path]) -> None:
    write_play(LEADS)
    run = deepline("run", "play.py")
    assert run.code == 2, run.stderr
    assert "The play's input has no field 'csv' (play.py line 14); give it with --csv FILE." in run.stderr
    assert "KeyError" not in run.stderr and "Traceback" not in run.stderr
    assert "Next: start a new run that gives it" in run.stderr
    plan = deepline("plan", "play.py")
    assert (plan.code, plan.stderr) == (
        2, "Error: The play's input has no field 'csv' (play.py line 14); give it with --csv FILE.\n"
    )  # fmt: skip
    other = write_play(LEADS.replace('input["csv"]', 'input["leads"]'), "other.py")
    said = deepline("run", str(other), "--quiet")
    assert said.code == 2 and "give it with --set leads=VALUE or --input JSON." in said.stderr


def test_a_folder_given_as_the_csv_is_named_a_folder(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    write_play(LEADS)
    (tmp_path / "exports").mkdir()
    run = deepline("run", "play.py", "--csv", "exports")
    assert run.code == 2
    assert run.stderr.splitlines()[0] == f"Error: --csv {tmp_path / 'exports'} is a folder, not a file."


def test_a_play_that_catches_the_keyerror_still_does(deepline: Run, write_play: Callable[..., Path]) -> None:
    write_play("""
from deepline_cli import play

@play("defaults")
async def defaults(ctx, input):
    try:
        limit = input["limit"]
    except KeyError:
        limit = 7
    return {"limit": limit, "tier": input.get("tier", "basic"), "has": "limit" in input}
""")
    run = deepline("run", "play.py", "--json")
    assert run.code == 0, run.stderr
    assert run.json_lines()[-1]["output"] == {"limit": 7, "tier": "basic", "has": False}


def test_check_refuses_a_tool_nothing_can_run(deepline: Run, write_play: Callable[..., Path], tmp_path: Path) -> None:
    write_play(LEADS.replace('"c", "t.company"', '"c", "t.compnay"'))
    check = deepline("check", "play.py")
    assert check.code == 2
    assert check.stderr == (
        "Error: play.py line 16 calls the tool 't.compnay' (did you mean 't.company'?), which is not a local @tool, "
        "not in a deepline.toml (none was found), and no [remote] table covers it.\n"
    )
    assert "unknown    t.compnay  (play.py line 16)" in check.stdout
    assert deepline("check", "play.py", "--json").code == 2

    (tmp_path / "deepline.toml").write_text('[tools."t.compnay"]\nurl = "https://api.example.com/c"\n')
    assert deepline("check", "play.py").code == 0, "declared in deepline.toml: known"
    (tmp_path / "deepline.toml").write_text('[remote]\nbase_url = "https://api.example.com"\n')
    covered = deepline("check", "play.py", DEEPLINE_API_KEY="k-123456789")
    assert covered.code == 0, covered.stderr  # a [remote] table runs any id


def test_a_header_only_csv_warns_that_it_has_no_rows(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    write_play(LEADS)
    (tmp_path / "empty.csv").write_text("id,domain\n")
    run = deepline("run", "play.py", "--csv", "empty.csv", "--run-id", "E")
    assert run.code == 0, run.stderr  # exit unchanged
    said = f"The CSV {tmp_path / 'empty.csv'} has no rows, only a header: there is nothing to do with it."
    assert said in run.stderr
    [line] = deepline("runs", "logs", "E", "--where", "level=warning", "--json").json_lines()
    assert line["message"] == said
    plan = deepline("plan", "play.py", "--csv", "empty.csv")
    assert plan.code == 0 and f"warning: {said}" in plan.stdout


def test_columns_told_apart_by_case_only_warn_and_export_apart(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    write_play(LEADS)
    (tmp_path / "leads.csv").write_text("id,domain,Company\n1,acme.com,Acme Inc\n")
    run = deepline("run", "play.py", "--csv", "leads.csv", "--run-id", "C")
    assert run.code == 0, run.stderr
    warning = "Map 'leads': the columns 'Company' and 'company' differ only in case"
    assert warning in run.stderr
    exported = deepline("export", "C")
    header, row = list(csv.reader(io.StringIO(exported.stdout)))
    assert header == ["id", "domain", "Company", "company", "_error"]
    assert row == ["1", "acme.com", "Acme Inc", '{"name":"ACME.COM"}', ""]
    assert "differ only in case" in exported.stderr
    lines = deepline("export", "C", "--format", "jsonl").stdout.splitlines()
    assert lines == ['{"id":"1","domain":"acme.com","Company":"Acme Inc","company":{"name":"ACME.COM"},"_error":null}']


BLANK_KEYS = """
from deepline_cli import play

@play("blank-keys")
async def blank_keys(ctx, input):
    rows = ctx.csv(input["csv"]) if input.get("csv") else [
        {"email": "", "name": "Ada"}, {"email": None, "name": "Grace"}, {"email": "a@x.com", "name": "Alan"},
    ]
    done = await ctx.map("people", rows, key="email", columns={"upper": lambda row: row["name"].upper()})
    return {"rows": len(done), "names": [row["upper"] for row in done]}
"""


def test_rows_with_a_blank_key_are_each_a_row_not_duplicates(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """A blank key is no identity: two people with no email were one row and a "duplicate"
    nobody sees. Each is a row of its own, keyed by where it is."""
    write_play(BLANK_KEYS)
    listed = deepline("run", "play.py", "--json").json_lines()[-1]
    assert listed["output"] == {"rows": 3, "names": ["ADA", "GRACE", "ALAN"]}, listed["output"]
    (tmp_path / "people.csv").write_text("email,name\n,Ada\n,Grace\na@x.com,Alan\na@x.com,Alan again\n")
    from_csv = deepline("run", "play.py", "--csv", "people.csv", "--json").json_lines()[-1]
    assert from_csv["output"] == {"rows": 3, "names": ["ADA", "GRACE", "ALAN"]}, from_csv["output"]
    assert from_csv["stats"]["rows"]["duplicate"] == 1  # the second a@x.com


@pytest.mark.parametrize("where", ["top", "parent"])
def test_a_run_failed_by_a_tools_own_failure_suggests_the_resume_that_retries_it(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path, where: str
) -> None:
    """A local tool that raises fails for good (its receipt keeps the failure): a plain
    resume replays the failure, so the verdict's next step is the resume that retries it,
    and that command, run as printed once the cause is fixed, completes the run; in the
    play itself or in a child play it calls."""
    write_play(
        """
        from pathlib import Path
        from deepline_cli import play, tool

        @tool("cf.t")
        def t(input):
            if Path(input["flag"]).exists():
                raise ValueError("tool broken")
            return "ok"

        @play("top")
        async def top(ctx, input):
            return (await ctx.tools.execute("t", "cf.t", {"flag": input["flag"]})).output

        @play("parent")
        async def parent(ctx, input):
            return await ctx.run_play("kid", "top", input)
        """
    )
    flag = tmp_path / "tool_broken"
    flag.touch()
    failed = deepline("run", f"play.py:{where}", "--set", f"flag={flag}", "--run-id", "tf1")
    assert failed.code == 1, failed.stderr
    assert "Next: fix the cause, then: deepline resume tf1 --refresh-failed" in failed.stderr, failed.stderr
    flag.unlink()
    assert deepline("resume", "tf1").code == 1  # a plain resume replays the kept failure
    resumed = deepline("resume", "tf1", "--refresh-failed")
    assert resumed.code == 0, resumed.stderr


def test_input_columns_told_apart_by_case_only_warn_at_the_run(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """`Notes` and `notes` in the CSV itself: the export warned, the run said nothing."""
    write_play(LEADS)
    (tmp_path / "leads.csv").write_text("id,domain,Notes,notes\n1,acme.com,a,b\n")
    run = deepline("run", "play.py", "--csv", "leads.csv")
    assert run.code == 0, run.stderr
    assert run.stderr.count("the columns 'Notes' and 'notes' differ only in case") == 1, run.stderr


def test_a_csv_named_relative_or_absolute_keys_its_cells_the_same(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """`--set csv=leads.csv` (relative, as typed) and `--csv leads.csv` (made absolute) name
    one file: the map's cells are reused between them (every cell was computed again)."""
    write_play(LEADS)
    (tmp_path / "leads.csv").write_text("id,domain\n1,acme.com\n2,globex.io\n")
    assert deepline("run", "play.py", "--set", "csv=leads.csv", "--quiet").code == 0
    again = deepline("run", "play.py", "--csv", "leads.csv", "--json")
    assert again.code == 0, again.stderr
    assert again.json_lines()[-1]["stats"]["rows"]["reused"] == 2


def test_export_never_writes_over_a_csv_the_play_itself_names(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """A play that reads `leads.csv` by default (not from its input): the export told to
    write there replaced the CSV, as the run's input said nothing of it."""
    write_play(
        """
        from deepline_cli import play

        @play("leads")
        async def leads(ctx, input):
            rows = await ctx.map("leads", ctx.csv("leads.csv"), key="id", columns={"n": lambda row: 1})
            return len(rows)
        """
    )
    (tmp_path / "leads.csv").write_text("id,domain\n1,acme.com\n")
    assert deepline("run", "play.py", "--run-id", "D").code == 0
    over = deepline("export", "D", "--out", "leads.csv")
    assert over.code == 2 and "leads.csv is an input of run D" in over.stderr, over.stderr
    assert (tmp_path / "leads.csv").read_text() == "id,domain\n1,acme.com\n"


@pytest.mark.parametrize("key", [["a", "b"], lambda row: (row["a"], row["b"])], ids=["fields", "function"])
def test_a_keys_parts_are_text_as_a_key_of_one_field_is(key: object) -> None:
    """`key="id"` takes 1 and "1" for one key (a CSV's keys are all text); a key of two
    fields kept [1, "x"] and ["1", "x"] apart, and None and "" (a blank from an API and
    from a CSV): the same person from two sources was two rows."""
    from deepline_cli.runtime.map.rows import key_function

    of = key_function(key)  # type: ignore[arg-type]
    assert of({"a": 1, "b": "x"}) == of({"a": "1", "b": "x"})
    assert of({"a": 2, "b": None}) == of({"a": 2, "b": ""})
    assert of({"a": True, "b": "x"}) == of({"a": "true", "b": "x"})
    assert of({"a": 1, "b": "x"}) != of({"a": 1, "b": "y"})
    assert of({"a": "1", "b": "x"}) == '["1","x"]'  # as a CSV's rows were keyed: their sheet rows found again


def test_a_failure_of_the_input_is_told_from_a_columns_own_in_cells_kept_before_they_said_so() -> None:
    """Cells an earlier deepline kept for a row's input fault carry no mark: their message
    tells them (CsvSource.blank's wording). A column's own InputError is its own failure."""
    from deepline_cli.store.records import Cell

    def kept(error: str, meta: dict[str, object] | None = None) -> bool:
        return Cell(None, error, 1.0, "f", meta).from_input

    assert kept("InputError: required column 'domain' is blank (leads.csv line 3)")
    assert kept("InputError: leads.csv line 19: 2 fields where the header has 3: no cell for 'Extra' (column 3).")
    assert kept("a message of any words", {"input": True})
    assert not kept("InputError: The json of ctx.fetch 'site' cannot be sent: Type is not JSON serializable: set.")
    assert not kept("InputError: required column 'domain' is blank (leads.csv line 3)", {"transient": True})
    assert not Cell("value", None, 1.0, "f").from_input
