"""`ctx.csv` (SPEC §1 "The context", §2 rows, §5 exit codes): encodings, renames, required
columns, malformed files, and relative paths that survive a resume from elsewhere."""

from __future__ import annotations

import bz2
import gzip
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepline_cli.runtime.run.options import RunResult
from tests.helpers import run_play

# Tool invocations of the current test (the in-process plays import this list).
CALLS: list[str] = []

LEADS = "First Name,Last Name,Domain\nAda,Lovelace,acme.com\nGrace,Hopper,globex.io\nAlan,Turing,initech.dev\n"

# The play of the in-process tests: reads input["csv"] with the given rename/required,
# looks every row up through a tool, and returns the rows.
PLAY = """\
from deepline_cli import play, tool
from tests.test_csv import CALLS

@tool({tool_id!r})
def lookup(input):
    CALLS.append(input["domain"])
    return {{"seen": input["domain"]}}

@play("csv-play")
async def csv_play(ctx, input):
    rows = ctx.csv(input["csv"], rename=input.get("rename"), required=input.get("required"))
    ds = await ctx.map("leads", rows, key=None, columns={{
        "lookup": lambda row, rc: rc.tools.execute("lookup", {tool_id!r},
                                                   {{"domain": row.get("domain") or row.get("Domain")}}),
    }})
    return {{"columns": ds.columns, "rows": list(ds)}}
"""


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    CALLS.clear()


@pytest.fixture
def csv_play(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    path = tmp_path / "csv_play.py"
    path.write_text(PLAY.format(tool_id="tc." + request.node.name))
    return path


def input_error(result: RunResult) -> str:
    """The run failed with an InputError (exit code 2): its message."""
    assert result.status == "failed", result.output
    assert result.error is not None
    assert result.error["type"] == "InputError", result.error
    assert result.exit_code == 2
    return str(result.error["message"])


# --- reading -----------------------------------------------------------------------------------


@pytest.mark.parametrize("bom", [False, True], ids=["plain", "bom"])
@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_csv_with_or_without_bom_and_rename(
    csv_play: Path, store_path: Path, tmp_path: Path, bom: bool, newline: str
) -> None:
    data = LEADS.replace("\n", newline).encode()
    (tmp_path / "leads.csv").write_bytes((b"\xef\xbb\xbf" if bom else b"") + data)

    result = run_play(
        csv_play,
        store_path,
        {
            "csv": str(tmp_path / "leads.csv"),
            "rename": {"First Name": "first_name", "Domain": "domain"},
            "required": ["first_name", "domain"],
        },
    )

    assert result.status == "completed", result.error
    assert result.output["columns"] == ["first_name", "Last Name", "domain", "lookup"]
    assert result.output["rows"] == [
        {"first_name": "Ada", "Last Name": "Lovelace", "domain": "acme.com", "lookup": {"seen": "acme.com"}},
        {"first_name": "Grace", "Last Name": "Hopper", "domain": "globex.io",
         "lookup": {"seen": "globex.io"}},
        {"first_name": "Alan", "Last Name": "Turing", "domain": "initech.dev",
         "lookup": {"seen": "initech.dev"}},
    ]  # fmt: skip
    assert sorted(CALLS) == ["acme.com", "globex.io", "initech.dev"]


def test_a_header_only_csv_is_an_empty_map(csv_play: Path, store_path: Path, tmp_path: Path) -> None:
    (tmp_path / "leads.csv").write_text("First Name,Domain\n")

    result = run_play(csv_play, store_path, {"csv": str(tmp_path / "leads.csv")})

    assert result.status == "completed", result.error
    assert result.output["rows"] == []
    assert CALLS == []


def test_blank_lines_are_skipped(csv_play: Path, store_path: Path, tmp_path: Path) -> None:
    (tmp_path / "leads.csv").write_text("Name,Domain\n\na,a.com\n\nb,b.com\n")

    result = run_play(csv_play, store_path, {"csv": str(tmp_path / "leads.csv")})

    assert result.status == "completed", result.error
    assert [r["Name"] for r in result.output["rows"]] == ["a", "b"]


def test_rows_of_empty_cells_are_skipped_as_blank_lines(csv_play: Path, store_path: Path, tmp_path: Path) -> None:
    """A spreadsheet's trailing rows of bare delimiters (`,,`) were rows: each keyed by its
    place, its tool called with every field empty, and exported as an empty row."""
    (tmp_path / "leads.csv").write_text("Name,Domain,Email\r\nA,a.com,x@a.com\r\n,,\r\nB,b.com,\r\n ,  ,\r\n,,\r\n")

    result = run_play(csv_play, store_path, {"csv": str(tmp_path / "leads.csv")})

    assert result.status == "completed", result.error
    assert [r["Name"] for r in result.output["rows"]] == ["A", "B"]
    assert sorted(CALLS) == ["a.com", "b.com"]


# --- input errors ------------------------------------------------------------------------------


def test_a_missing_required_column_fails_before_any_tool_call(csv_play: Path, store_path: Path, tmp_path: Path) -> None:
    (tmp_path / "leads.csv").write_text(LEADS)

    result = run_play(
        csv_play,
        store_path,
        {
            "csv": str(tmp_path / "leads.csv"),
            "rename": {"First Name": "first_name"},
            "required": ["first_name", "email"],
        },
    )

    message = input_error(result)
    assert "'email'" in message
    assert "leads.csv" in message
    assert CALLS == []


def test_required_refers_to_the_renamed_column_names(csv_play: Path, store_path: Path, tmp_path: Path) -> None:
    (tmp_path / "leads.csv").write_text(LEADS)

    # `first_name` exists only once "First Name" is renamed
    result = run_play(csv_play, store_path, {"csv": str(tmp_path / "leads.csv"), "required": ["first_name"]})

    assert "'first_name'" in input_error(result)
    assert CALLS == []


def test_an_empty_file_is_an_input_error(csv_play: Path, store_path: Path, tmp_path: Path) -> None:
    (tmp_path / "leads.csv").write_bytes(b"")

    message = input_error(run_play(csv_play, store_path, {"csv": str(tmp_path / "leads.csv")}))

    assert "leads.csv" in message
    assert "empty" in message
    assert CALLS == []


def test_a_ragged_row_fails_alone_naming_the_file_and_line(csv_play: Path, store_path: Path, tmp_path: Path) -> None:
    (tmp_path / "leads.csv").write_text("Name,Domain\na,a.com\nb,b.com\nc,c.com,extra\nd,d.com\n")

    result = run_play(csv_play, store_path, {"csv": str(tmp_path / "leads.csv")})

    assert result.status == "completed", result.error
    (failed,) = [row for row in result.output["rows"] if "_error" in row]
    assert failed["_error"].startswith("InputError: leads.csv line 4: 3 fields where the header has 2"), failed


@pytest.mark.parametrize("good_rows", [20, 3000], ids=["early", "late"])
def test_undecodable_bytes_name_the_file_and_line(
    csv_play: Path, store_path: Path, tmp_path: Path, good_rows: int
) -> None:
    """BUG (rows.py `CsvSource`): the line is taken from the csv reader's position when the
    text decoder fails, but the decoder works on 8 KiB blocks, so the reported line is the
    start of a block: "line 1" for a small file (the header read decodes the bad byte),
    "line 2700" for a bad byte on line 3002."""
    lines = [b"Name,Domain"] + [f"n{i},d{i}.com".encode() for i in range(good_rows)]
    lines += [b"bad\xff,bad.com", b"z,z.com"]
    (tmp_path / "leads.csv").write_bytes(b"\n".join(lines) + b"\n")
    bad_line = good_rows + 2

    message = input_error(run_play(csv_play, store_path, {"csv": str(tmp_path / "leads.csv")}))

    assert str(tmp_path / "leads.csv") in message
    assert "UTF-8" in message
    assert f"line {bad_line}" in message, message


# --- through the command line ------------------------------------------------------------------

CLI_PLAY = """\
from pathlib import Path

from deepline_cli import play

@play("rel")
async def rel(ctx, input):
    rows = ctx.csv(input["file"], rename={"First Name": "first_name"}, required=["first_name"])
    ds = await ctx.map("leads", rows, key="first_name",
                       columns={"upper": lambda row: row["first_name"].upper()})
    if input.get("flag") and Path(input["flag"]).exists():
        raise RuntimeError("the flag is up")
    return {"rows": [r["upper"] for r in ds], "csv": input.get("csv")}
"""


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"Name,Domain\nAda,acme.com\n", "required column 'first_name' is missing (looked for 'First Name')"),
        (b"", "empty"),
        (b"First Name,Domain\nAda,acme.com\nGr\xe9ce,globex.io\n", "line 3, column 3: not valid UTF-8 (a spreadsheet"),
        (gzip.compress(b"First Name,Domain\nAda,acme.com\n"), "is gzip-compressed, not a CSV: decompress it first"),
        (b"PK\x03\x04\x14\x00\x06\x00" + bytes(range(256)), "is a zip archive (an Excel .xlsx workbook is one)"),
        (bz2.compress(b"First Name,Domain\nAda,acme.com\n"), "is bzip2-compressed, not a CSV"),
        (b"First Name,Domain\nO\x92Brien,ob.com\n", "iconv -f cp1252 -t utf-8"),  # Excel on Windows: not latin1
        ("First Name,Domain\nAda,acme.com\n".encode("utf-16"), "is UTF-16 text (Excel's Unicode Text)"),
        ("First Name\tDomain\nAda\tacme.com\n".encode("utf-16-le"), "is UTF-16 text (Excel's Unicode Text)"),
        (b"First Name,,Domain,,Notes\nA,,a.com,,x\n", "columns 2 and 4 have no header"),
    ],
    ids=[
        "required",
        "empty",
        "undecodable",
        "gzip",
        "xlsx",
        "bzip2",
        "cp1252",
        "utf16",
        "utf16-no-bom",
        "unnamed",
    ],
)
def test_input_errors_exit_2_through_the_cli(deepline, tmp_path: Path, content: bytes, expected: str) -> None:
    (tmp_path / "play.py").write_text(CLI_PLAY)
    (tmp_path / "leads.csv").write_bytes(content)

    result = deepline("run", "play.py", "--set", "file=leads.csv", "--quiet")

    assert result.code == 2, result.stderr
    assert "leads.csv" in result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


def test_rename_finds_its_header_as_columns_aliases_do(deepline, tmp_path: Path) -> None:
    """An export's header spelt differently (` first name `): `rename` finds it, case and
    spaces aside, as `columns=` does."""
    (tmp_path / "play.py").write_text(CLI_PLAY)
    (tmp_path / "leads.csv").write_text(" first name ,Domain\nAda,acme.com\n")
    result = deepline("run", "play.py", "--set", "file=leads.csv", "--quiet")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["rows"] == ["ADA"]


def test_relative_csv_paths_resolve_against_the_run_directory_even_on_resume(deepline, tmp_path: Path) -> None:
    start_dir = tmp_path / "project"
    start_dir.mkdir()
    (start_dir / "play.py").write_text(CLI_PLAY)
    (start_dir / "leads.csv").write_text("First Name,Domain\nAda,acme.com\nGrace,globex.io\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # a decoy with the same name where the resume is started: it must not be read
    (elsewhere / "leads.csv").write_text("First Name,Domain\nMallory,evil.com\n")
    flag = tmp_path / "flag"
    flag.touch()

    first = deepline(
        "run", "play.py", "--csv", "leads.csv", "--set", "file=leads.csv", "--set", f"flag={flag}",
        "--run-id", "rel-1", "--quiet", cwd=start_dir,
    )  # fmt: skip
    assert first.code == 1, first.stderr
    assert "the flag is up" in first.stderr
    flag.unlink()

    resumed = deepline("resume", "rel-1", "--json", cwd=elsewhere)

    assert resumed.code == 0, resumed.stderr
    finished = resumed.json_lines()[-1]
    assert finished["event"] == "run.finished"
    assert finished["status"] == "completed"
    assert finished["output"] == {"rows": ["ADA", "GRACE"], "csv": str(start_dir / "leads.csv")}


def test_quoted_newlines_and_long_fields_are_rows_as_a_spreadsheet_shows_them(deepline, tmp_path: Path) -> None:
    """Addresses over three lines made a map of 10 rows "10 of 30" (its total was the file's
    line count), and a field over 128 KB (a pasted page) was refused as too large."""
    (tmp_path / "play.py").write_text(CLI_PLAY)
    rows = [f'P{n},"{n} Main St\nSuite {n}\nSpringfield"' for n in range(9)] + ["Long," + "x" * 200_000]
    (tmp_path / "leads.csv").write_text("First Name,Address\n" + "\n".join(rows) + "\n")
    result = deepline("run", "play.py", "--set", "file=leads.csv", "--run-id", "ml", "--json")
    assert result.code == 0, result.stderr
    events = result.json_lines()
    progress = [e for e in events if e["event"] == "map.progress"]
    assert progress[-1]["total"] == 10 and progress[-1]["done"] == 10, progress[-1]
    shown = deepline("runs", "show", "ml").stdout
    assert "leads: 10 rows (10 succeeded" in shown, shown


def test_a_list_with_duplicates_reaches_its_total_in_json_progress(deepline, tmp_path: Path) -> None:
    """A CI script reading `map.progress` as done/total: a CRM export naming a person twice
    ended at "2 of 3" (its total counted input rows, duplicates included; its done did not).
    Both count the map's distinct rows; the duplicates are said beside them."""
    (tmp_path / "play.py").write_text(CLI_PLAY)
    (tmp_path / "leads.csv").write_text("First Name,Address\nAda,1 Main St\nGrace,2 Main St\nAda,1 Main St\n")
    result = deepline("run", "play.py", "--set", "file=leads.csv", "--json")
    assert result.code == 0, result.stderr
    progress = [e for e in result.json_lines() if e["event"] == "map.progress"]
    last = progress[-1]
    assert (last["done"], last["total"], last["duplicate"]) == (2, 2, 1), last
    assert (last["succeeded"], last["failed"]) == (2, 0), last
    assert all(e["done"] <= e["total"] for e in progress), progress


@pytest.mark.parametrize(
    "content",
    [
        "First Name;Domain\r\nAda;acme.com\r\nGrace;globex.io\r\n",  # Excel in a European locale
        "First Name\tDomain\nAda\tacme.com\nGrace\tglobex.io\n",  # a tab-separated export
        "First Name,Domain,,,\nAda,acme.com,,,\nGrace,globex.io,,,\n",  # Excel's empty trailing columns
        # a European header with a comma in a name: it was split on commas, "Domain" missing
        "First Name;Domain;Revenue (k€, 2023)\r\nAda;acme.com;1,5\r\nGrace;globex.io;2\r\n",
        "First Name,Domain,Notes\nAda,acme.com,a;b;c\nGrace,globex.io,x;y\n",  # semicolons in comma cells
        "First Name;Domain;Phone\nAda;acme.com;\nGrace;globex.io;123\n",  # a blank last cell
        "First Name\tDomain\tPhone\nAda\tacme.com\t\nGrace\tglobex.io\t\n",
    ],
    ids=[
        "semicolons",
        "tabs",
        "empty-trailing-columns",
        "semicolons-and-a-comma",
        "commas-and-semicolons",
        "semicolons-blank-last-cell",
        "tabs-blank-last-cells",
    ],
)
def test_csv_files_as_spreadsheets_save_them_are_read(deepline, tmp_path: Path, content: str) -> None:
    (tmp_path / "play.py").write_text(CLI_PLAY)
    (tmp_path / "leads.csv").write_text(content, newline="")
    result = deepline("run", "play.py", "--set", "file=leads.csv", "--quiet")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["rows"] == ["ADA", "GRACE"]


def test_a_required_column_is_found_case_and_spaces_aside(deepline, tmp_path: Path) -> None:
    """`required=["first_name"]` and a header `First_Name ` (as `columns=` and `rename=`
    find theirs): it was "missing (columns: First_Name, ...)"."""
    (tmp_path / "play.py").write_text(CLI_PLAY.replace('rename={"First Name": "first_name"}, ', ""))
    (tmp_path / "leads.csv").write_text(" First_Name ,Domain\nAda,acme.com\n")
    result = deepline("run", "play.py", "--set", "file=leads.csv", "--quiet")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["rows"] == ["ADA"]


def test_a_quote_never_closed_is_an_error_naming_its_line(deepline, tmp_path: Path) -> None:
    """A stray opening quote that is never closed took every later line into one cell: three
    leads of five were gone, and the run said nothing. It is an error naming the line."""
    (tmp_path / "play.py").write_text(CLI_PLAY)
    lines = ["First Name,Domain", "Ada,acme.com", 'Bob,"globex.io', "Cy,initech.dev", "Di,hooli.com", "Ed,umbrella.co"]
    (tmp_path / "leads.csv").write_text("\r\n".join(lines) + "\r\n", newline="")
    result = deepline("run", "play.py", "--set", "file=leads.csv", "--quiet")
    assert result.code == 2, result.stderr
    assert "leads.csv line 3: a quote opened here is never closed" in result.stderr, result.stderr


def test_a_quoted_cell_over_lines_shaped_like_rows_is_warned_of(deepline, tmp_path: Path) -> None:
    """A stray quote closed by a later quoted cell: the lines between are read as part of one
    cell (valid CSV, so no error), but they look like rows of the file: the run warns,
    naming the line, so the lost leads are found."""
    (tmp_path / "play.py").write_text(CLI_PLAY)
    lines = [
        "First Name,Domain",
        "Ada,acme.com",
        'Bob,"globex.io',
        "Cy,initech.dev",
        "Di,hooli.com",
        'Ed,"umbrella.co"',
    ]
    (tmp_path / "leads.csv").write_text("\n".join(lines) + "\n")
    result = deepline("run", "play.py", "--set", "file=leads.csv", "--json")
    assert result.code == 0, result.stderr
    warned = [e["message"] for e in result.json_lines() if e["event"] == "log" and e.get("level") == "warning"]
    assert any("leads.csv line 3: a quoted cell runs over 4 lines, 3 of them shaped like rows" in m for m in warned), (
        warned
    )


@pytest.mark.parametrize(
    ("content", "line"),
    [
        ('domain\nacme.com\n"beta.io\ngamma.co\ndelta.de\n', 3),  # a list of domains
        ('name,domain,\nAcme,acme.com,\nBeta,"beta.io,\nGamma,gamma.co,\nDelta,delta.de,\n', 3),  # a trailing column
        ('name,domain,city\nAcme,acme.com,Paris\nBeta,"beta.io,Rome\nGamma,gamma.co,Oslo\nDelta,delta.de,Kyiv\n', 3),
    ],
    ids=["one-column", "trailing-empty-column", "middle-column"],
)
def test_a_quote_never_closed_names_its_line_whatever_the_columns(deepline, tmp_path: Path, content: str, line: int):
    """A stray quote in a list of one column, in a spreadsheet export with an empty trailing
    column, or in a middle column (then the row runs short): the error names the line where
    the quote opened (it went unseen, or named the last line)."""
    (tmp_path / "play.py").write_text(
        "from deepline_cli import play\n\n@play('q')\nasync def q(ctx, input):\n"
        "    rows = await ctx.map('m', ctx.csv(input['csv']), key='domain', columns={'n': lambda row: 1})\n"
        "    return len(rows)\n"
    )
    (tmp_path / "leads.csv").write_text(content)
    result = deepline("run", "play.py", "--csv", "leads.csv", "--quiet")
    assert result.code == 2, result.stderr
    assert f"leads.csv line {line}: " in result.stderr and "quote" in result.stderr, result.stderr


def test_a_cell_shaped_like_rows_is_warned_of_once(deepline, tmp_path: Path) -> None:
    """Addresses over lines with commas: warned of once per line, however often the file is
    read (its rows are counted before the map reads them)."""
    (tmp_path / "play.py").write_text(CLI_PLAY)
    (tmp_path / "leads.csv").write_text(
        "First Name,Domain,Address\n"
        'Ada,a.com,"1 Main St\nSpringfield, IL, 62701"\n'
        'Bo,b.io,"5 Oak Ave\nSuite 2, Floor 3, Austin"\n'
    )
    result = deepline("run", "play.py", "--set", "file=leads.csv", "--json")
    assert result.code == 0, result.stderr
    warned = [e["message"] for e in result.json_lines() if e["event"] == "log" and "quoted cell" in e["message"]]
    assert [w.split(":")[0] for w in warned] == ["leads.csv line 2", "leads.csv line 4"], warned


def test_two_columns_one_by_the_plays_rename_name_the_rename(deepline, tmp_path: Path) -> None:
    """`rename={"Website": "domain"}` over a file that has a `domain` column: the error blamed
    the file ("rename one of them in the file"); it names the play's rename."""
    (tmp_path / "play.py").write_text(
        CLI_PLAY.replace('rename={"First Name": "first_name"}', 'rename={"Website": "Domain"}')
    )
    (tmp_path / "leads.csv").write_text("first_name,Domain,Website\nAda,acme.com,acme.io\n")
    result = deepline("run", "play.py", "--set", "file=leads.csv", "--quiet")
    assert result.code == 2, result.stderr
    assert "the column 'Domain' appears twice (columns 2 and 3) ('Website' renamed to it by the play)" in result.stderr
    assert "change the play's rename= or columns=" in result.stderr


def test_a_short_row_of_a_semicolon_file_is_named_not_read_as_one_column(deepline, tmp_path: Path) -> None:
    """One row of a ';' file one cell short: the file was read as one column ("required
    column 'first_name' is missing (columns: First Name;Domain;…)"). The short row is named,
    as in a comma file, and fails on its own: the rows around it are done."""
    (tmp_path / "play.py").write_text(CLI_PLAY)
    rows = "".join(f"P{i};d{i}.io;{i};\n" for i in range(20))
    (tmp_path / "leads.csv").write_text("First Name;Domain;Phone;Fax\nAda;acme.com;1;\nGrace;globex.io;2\n" + rows)
    result = deepline("run", "play.py", "--set", "file=leads.csv", "--json")
    assert result.code == 0, result.stderr
    said = "leads.csv line 3: 3 fields where the header has 4: no cell for 'Fax' (column 4)."
    (failed,) = [e for e in result.json_lines() if e.get("kind") == "row.failed"]
    assert said in failed["message"], failed
    assert result.json_lines()[-1]["stats"]["rows"]["succeeded"] == 21


def test_a_crm_export_that_drops_a_rows_trailing_empty_cells_fails_that_row_alone(deepline, tmp_path: Path) -> None:
    """A line of fewer cells than the header, deep in a list: the whole run failed (exit 2)
    part way through, after paying for the rows before it. The row fails on its own, named
    by its line, before any call for it; the rest of the list is done."""
    (tmp_path / "play.py").write_text(CLI_PLAY)
    rows = [f"P{i},d{i}.io,x" for i in range(30)]
    rows[17] = "Short,short.com"  # line 19
    (tmp_path / "leads.csv").write_text("First Name,Domain,Extra\n" + "\n".join(rows) + "\n")
    result = deepline("run", "play.py", "--set", "file=leads.csv", "--json")
    assert result.code == 0, result.stderr
    (failed,) = [e for e in result.json_lines() if e.get("kind") == "row.failed"]
    assert "leads.csv line 19: 2 fields where the header has 3: no cell for 'Extra' (column 3)." in failed["message"]
    counted = result.json_lines()[-1]["stats"]["rows"]
    assert (counted["succeeded"], counted["failed"]) == (29, 1), counted
    # Read by the play itself (not a map), the same line is an error naming it.
    (tmp_path / "direct.py").write_text(
        "from deepline_cli import play\n\n"
        '@play("direct")\n'
        "async def direct(ctx, input):\n"
        '    return len(list(ctx.csv(input["file"])))\n'
    )
    direct = deepline("run", "direct.py", "--set", "file=leads.csv", "--quiet")
    assert direct.code == 2 and "leads.csv line 19: 2 fields where the header has 3" in direct.stderr, direct.stderr


REWRITTEN = """\
import csv
import os
import random
from pathlib import Path

from deepline_cli import play

ACTION = "{action}"

def change(path):
    head, *rows = path.read_text().splitlines(True)
    if ACTION == "resort":  # the sheet re-sorted and saved over the file (rows of several lines whole)
        with path.open(newline="") as f:
            header, *records = list(csv.reader(f))
        random.Random(1).shuffle(records)
        with path.open("w", newline="") as f:
            csv.writer(f, lineterminator="\\n").writerows([header, *records])
    elif ACTION == "touch":
        os.utime(path)
    elif ACTION == "same":  # saved again as it was
        path.write_text(head + "".join(rows))
    elif ACTION == "append":
        with path.open("a") as f:
            f.write("".join(f"{{i}},late{{i}},x\\n" for i in range(9000, 9050)))

def seen(row):
    if row["id"] == "50" and not Path("changed").exists():  # mid-map, once
        Path("changed").touch()
        change(Path("list.csv"))
    return row["id"]

@play("rewritten")
async def rewritten(ctx, input):
    ds = await ctx.map("rows", ctx.csv("list.csv"), key="id", concurrency=1, columns={{"seen": seen}})
    return len(ds)
"""


def _rows(spanned: bool) -> str:
    address = '"1 Main St\nSpringfield"' if spanned else "Springfield"  # rows of two lines each
    return "id,name,address\n" + "".join(f"{i},name{i},{address}\n" for i in range(1, 3001))


@pytest.mark.parametrize("spanned", [False, True], ids=["one-line rows", "two-line rows"])
def test_a_csv_rewritten_in_place_while_the_map_reads_it_stops_the_map(deepline, tmp_path: Path, spanned: bool) -> None:
    """The reader went on at its byte offset in the new content: the run "completed" with
    ~2,300 of 3,000 rows, 794 of them counted duplicates, ~700 ids never read. Rows of two
    lines each were checked only at the end (a line number never a multiple of 1,000), after
    thousands of rows read from the new content at the old offset."""
    (tmp_path / "play.py").write_text(REWRITTEN.format(action="resort"))
    (tmp_path / "list.csv").write_text(_rows(spanned))
    result = deepline("run", "play.py", "--run-id", "rw", "--quiet")
    assert result.code == 2, result.stderr
    assert "list.csv changed while the map read it" in result.stderr, result.stderr
    near = int(re.search(r"near line (\d+)", result.stderr).group(1))
    assert near < (6001 if spanned else 3001) * 0.75, result.stderr  # at the next block read, not at the end
    again = deepline("resume", "rw", "--json")
    assert again.code == 0, again.stderr
    assert again.json_lines()[-1]["output"] == 3000


@pytest.mark.parametrize("action", ["touch", "same", "append"])
def test_a_csv_touched_saved_as_it_was_or_appended_to_is_read_on(deepline, tmp_path: Path, action: str) -> None:
    """A change that leaves the bytes read where they were is no write over the file: it failed
    the run (touch, an editor saving it unchanged, rows appended as to a log)."""
    (tmp_path / "play.py").write_text(REWRITTEN.format(action=action))
    (tmp_path / "list.csv").write_text(_rows(False))
    result = deepline("run", "play.py", "--json")
    assert result.code == 0, result.stderr
    assert result.json_lines()[-1]["output"] == (3050 if action == "append" else 3000)


def test_a_pipe_as_the_csv_is_named_for_what_it_is(deepline, tmp_path: Path) -> None:
    """`--csv /dev/stdin` or `--csv <(cat a.csv)`: it was refused as a file that "does not exist"."""
    import os

    (tmp_path / "play.py").write_text(CLI_PLAY)
    fifo = tmp_path / "leads.csv"
    os.mkfifo(fifo)
    result = deepline("run", "play.py", "--csv", str(fifo), "--quiet")
    assert result.code == 2, result.stderr
    assert "not a regular file" in result.stderr and "does not exist" not in result.stderr, result.stderr


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["x", '"a\nb"', '"q""\n""r"', "", " ", '"\n\n"', '"a\r\nb"', '""', ",", ";"]),
            st.sampled_from([None, "", ",", " , ", ",,\t", ";"]),  # a line after it: blank, or of blank cells
        ),
        max_size=25,
    ),
    st.sampled_from(["\n", "\r\n"]),
    st.sampled_from(["", "\n", "\n\n", "\r\n", "\n,,", "\n,,\n", "\n , "]),
    st.integers(min_value=1, max_value=9),
)
@settings(max_examples=300, deadline=None)
def test_the_row_estimate_counts_records_not_lines(
    tmp_path_factory: pytest.TempPathFactory, cells: list[tuple[str, str | None]], newline: str, tail: str, block: int
) -> None:
    """The total a map shows before it has read its CSV counts what the map reads as rows:
    a line break inside a quoted cell, a blank line, or a line of empty cells (`,,,`, a
    spreadsheet's trailing rows) is no row; whatever the block the file is read in splits."""
    import csv as csv_module
    import io

    from deepline_cli.runtime.map.intake import count_records

    lines = ["id,v"]
    for n, (cell, after) in enumerate(cells):
        lines += [f"{n},{cell}", *([after] if after is not None else [])]
    text = newline.join(lines) + tail
    path = tmp_path_factory.mktemp("count") / "rows.csv"
    path.write_bytes(text.encode())
    rows = csv_module.reader(io.StringIO(text, newline=""))
    records = sum(1 for row in rows if any(cell.strip() for cell in row))  # as CsvSource skips them
    assert count_records(path, block_size=block) == records


def test_the_row_estimate_of_a_csv_with_a_literal_quote_in_a_cell_counts_its_lines(tmp_path: Path) -> None:
    """`Acme 27" Monitors` in an unquoted cell is a literal quote, as the csv module reads
    it: the estimate is not one row (a quote "opened" and never closed) but every line."""
    from deepline_cli.runtime.map.intake import count_records

    path = tmp_path / "inch.csv"
    path.write_text('name,domain\nAcme 27" Monitors,acme.com\n' + "".join(f"n{i},d{i}.com\n" for i in range(500)))
    assert count_records(path, block_size=97) == 502


def test_blank_lines_before_the_header_are_skipped(deepline, tmp_path: Path) -> None:
    """An export that starts with blank lines is not "empty: no header row"."""
    (tmp_path / "play.py").write_text(CLI_PLAY)
    (tmp_path / "leads.csv").write_text("\n\r\nFirst Name,Domain\nAda,acme.com\n\nGrace,globex.io\n")
    result = deepline("run", "play.py", "--set", "file=leads.csv", "--quiet")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["rows"] == ["ADA", "GRACE"]


def test_excels_sep_line_names_the_delimiter(deepline, tmp_path: Path) -> None:
    """Excel writes (and honours) a first line `sep=;`: it names the delimiter, and is not
    the header; lines are still counted as the file has them."""
    (tmp_path / "play.py").write_text(CLI_PLAY)
    (tmp_path / "leads.csv").write_bytes(b"sep=;\r\nFirst Name;Domain\r\nAda;acme.com\r\nGrace\r\n")
    result = deepline("run", "play.py", "--set", "file=leads.csv", "--json")
    said = "leads.csv line 4: 1 fields where the header has 2: no cell for 'Domain' (column 2)."
    (failed,) = [e for e in result.json_lines() if e.get("kind") == "row.failed"]
    assert result.code == 0 and said in failed["message"], result.stderr
    (tmp_path / "leads.csv").write_bytes(b"sep=;\r\nFirst Name;Domain\r\nAda;acme.com\r\nGrace;a;b.io\r\n")
    longer = deepline("run", "play.py", "--set", "file=leads.csv", "--json")
    (failed,) = [e for e in longer.json_lines() if e.get("kind") == "row.failed"]
    assert "line 4: 3 fields where the header has 2: column 3 has no header (a delimiter inside" in failed["message"]
    (tmp_path / "leads.csv").write_bytes(b"sep=;\r\nFirst Name;Domain\r\nAda;acme.com\r\nGrace;globex.io\r\n")
    result = deepline("run", "play.py", "--set", "file=leads.csv", "--quiet")
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["rows"] == ["ADA", "GRACE"]


def test_the_row_estimate_of_an_excel_csv_leaves_its_sep_line_out(tmp_path: Path) -> None:
    """The total a map shows until it has read the file: Excel's `sep=;` line is no row."""
    from deepline_cli.runtime.map.intake import estimate_total
    from deepline_cli.runtime.map.rows import CsvSource

    path = tmp_path / "leads.csv"
    path.write_bytes(b"sep=;\r\nFirst Name;Domain\r\n" + b"".join(b"P%d;p%d.com\r\n" % (i, i) for i in range(30)))
    assert estimate_total(CsvSource(path), None) == 30
    assert estimate_total(CsvSource(path), 12) == 12
    path.write_bytes(b"First Name;Domain\r\n" + b"".join(b"P%d;p%d.com\r\n" % (i, i) for i in range(30)))
    assert estimate_total(CsvSource(path), None) == 30


CLAIMING_PLAY = """\
from deepline_cli import play

@play("claiming")
async def claiming(ctx, input):
    rows = ctx.csv(input["file"], **input["how"])
    return [dict(r) for r in rows]
"""


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ({"columns": {"domain": ["Website"], "url": ["Website"]}}, "claimed by both 'url' and 'domain'"),
        ({"rename": {"Website": "url"}, "columns": {"domain": ["Website"]}}, "claimed by both 'domain' and 'url'"),
        ({"rename": {"Website": "url"}, "columns": {"domain": ["Website", "Company Domain"]}}, None),
        ({"required": "Website"}, None),
    ],
    ids=["two-columns", "rename-and-columns", "rename-then-fallback", "required-one-name"],
)
def test_two_names_claiming_one_header_are_refused_not_left_empty(
    deepline, tmp_path: Path, how: dict, expected: str | None
) -> None:
    """`columns={"domain": ["Website"], "url": ["Website"]}` left `url` empty in every row,
    and a `rename=` of the header a `columns=` alias also found was dropped: refused, naming
    both. A column with another alias takes that one. `required="Website"` is one name."""
    (tmp_path / "play.py").write_text(CLAIMING_PLAY)
    (tmp_path / "o.csv").write_text("First Name,Website,Company Domain\nA,a.com,b.com\n")
    result = deepline("run", "play.py", "--input", json.dumps({"file": "o.csv", "how": how}), "--quiet")
    if expected is None:
        assert result.code == 0, result.stderr
        (row,) = json.loads(result.stdout)
        assert row.get("url", row.get("Website")) == "a.com" and row.get("domain", "b.com") == "b.com", row
    else:
        assert result.code == 2 and expected in result.stderr, result.stderr


BLANK_PLAY = """\
from deepline_cli import play

@play("blank")
async def blank(ctx, input):
    rows = ctx.csv(input["file"], required=["domain"])
    ds = await ctx.map("leads", rows, key="email", columns={"company": lambda row: row["domain"].upper()})
    return ds.failed_count
"""


def test_a_blank_required_cell_given_back_later_names_this_runs_file_and_line(deepline, tmp_path: Path) -> None:
    """Ada's domain is blank in a.csv (line 2) and in b.csv (line 3): the second run's export
    and row log said "(a.csv line 2)", the first run's file, for a row read from b.csv."""
    (tmp_path / "play.py").write_text(BLANK_PLAY)
    (tmp_path / "a.csv").write_text("email,domain\na@x.com,\n")
    (tmp_path / "b.csv").write_text("email,domain\nb@y.com,\na@x.com,\n")
    assert deepline("run", "play.py", "--set", "file=a.csv", "--run-id", "r1", "--quiet").code == 0
    second = deepline("run", "play.py", "--set", "file=b.csv", "--run-id", "r2", "--json")
    assert second.code == 0, second.stderr
    exported = deepline("export", "r2", "--format", "jsonl")
    errors = {row["email"]: row["_error"] for row in map(json.loads, exported.stdout.splitlines())}
    assert "b.csv line 3" in errors["a@x.com"] and "a.csv" not in errors["a@x.com"], errors
    assert "b.csv line 2" in errors["b@y.com"], errors
    logged = deepline("runs", "logs", "r2", "--kind", "row.failed")
    assert "a.csv" not in logged.stdout and "b.csv line 3" in logged.stdout, logged.stdout


CHAINED_PLAY = """
from deepline_cli import play

def site(row):
    with open(row["log"], "a") as log:
        log.write(row["domain"] + "\\n")
    return "https://" + row["domain"]

@play("chained")
async def chained(ctx, input):
    leads = await ctx.map("leads", ctx.csv(input["csv"]), key="domain",
                          columns={"log": lambda row: input["log"]})
    companies = await ctx.map("companies", leads, key="domain", columns={"site": site})
    return [row["site"] for row in companies]
"""


def test_a_map_over_a_csv_maps_rows_is_not_recomputed_for_the_files_new_name(deepline, tmp_path: Path) -> None:
    """This week's export under a dated name, its rows as last week's: the map reading the CSV
    gave its cells back, but the map over that map's rows computed every cell again (its
    cells were keyed on the play's input, the CSV's path included)."""
    (tmp_path / "play.py").write_text(CHAINED_PLAY)
    for week in ("week1", "week2"):
        (tmp_path / f"leads-{week}.csv").write_text("domain\nacme.com\nbeta.io\n")
    log = tmp_path / "resolved.log"
    for week in ("week1", "week2"):
        result = deepline("run", "play.py", "--set", f"csv=leads-{week}.csv", "--set", f"log={log}", "--json")
        assert result.code == 0, result.stderr
        assert result.json_lines()[-1]["output"] == ["https://acme.com", "https://beta.io"]
    assert sorted(log.read_text().split()) == ["acme.com", "beta.io"]  # once each, in the first week


KEYED_PLAY = """\
from deepline_cli import play

@play("keyed")
async def keyed(ctx, input):
    rows = ctx.csv(input["file"], required=["domain"])
    ds = await ctx.map("leads", rows, key="domain", columns={"upper": lambda row: row["domain"].upper()})
    return {"rows": [r["upper"] for r in ds], "failed": ds.failed_count}
"""


def keyed_run(deepline, tmp_path: Path, content: bytes) -> tuple[dict, list[str]]:
    """The keyed play over `content`: its finished event and its failed rows' errors."""
    (tmp_path / "play.py").write_text(KEYED_PLAY)
    (tmp_path / "leads.csv").write_bytes(content)
    result = deepline("run", "play.py", "--set", "file=leads.csv", "--json")
    assert result.code == 0, result.stderr
    failed = [e["fields"]["error"] for e in result.json_lines() if e.get("kind") == "row.failed"]
    return result.json_lines()[-1], failed


def test_a_short_first_row_fails_alone_as_any_other_line_does(deepline, tmp_path: Path) -> None:
    finished, failed = keyed_run(deepline, tmp_path, b"domain,name,extra\nd1.com,a\nd2.com,b,x\n")
    assert finished["output"] == {"rows": [None, "D2.COM"], "failed": 1}, finished
    assert failed == ["InputError: leads.csv line 2: 2 fields where the header has 3: no cell for 'extra' (column 3)."]


def test_lines_whose_cells_shifted_are_no_duplicates_of_each_other(deepline, tmp_path: Path) -> None:
    """`Acme, Inc,acme.com` under `name,domain`: its domain cell holds ` Inc`, and so does the
    next such line's. Each fails on its own, keyed by its line, neither is a hidden duplicate."""
    content = b"name,domain\nAcme, Inc,acme.com\nGlobex, Inc,globex.com\nInitech,initech.com\n"
    finished, failed = keyed_run(deepline, tmp_path, content)
    assert finished["output"]["failed"] == 2 and len(finished["output"]["rows"]) == 3, finished
    assert finished["stats"]["rows"]["duplicate"] == 0
    assert [f.split(":")[1].strip() for f in failed] == ["leads.csv line 2", "leads.csv line 3"], failed


def test_spaces_under_empty_trailing_columns_are_empty_cells(deepline, tmp_path: Path) -> None:
    finished, failed = keyed_run(deepline, tmp_path, b"domain,name,,\nd1.com,a,,\nd2.com,b, ,\nd3.com,c,,\t\n")
    assert finished["output"] == {"rows": ["D1.COM", "D2.COM", "D3.COM"], "failed": 0}, failed


def test_rows_of_empty_cells_above_the_header_are_skipped(deepline, tmp_path: Path) -> None:
    finished, _ = keyed_run(deepline, tmp_path, b",,\n , ,\ndomain,name,\nd1.com,a,\n")
    assert finished["output"] == {"rows": ["D1.COM"], "failed": 0}, finished


def test_the_row_estimate_of_a_csv_with_old_mac_line_ends_counts_its_lines(tmp_path: Path) -> None:
    """Excel for Mac's "CSV (Macintosh)" ends lines with a lone CR: the map reads its rows,
    and the total it shows before it has read them counts them too (not 0)."""
    from deepline_cli.runtime.map.intake import count_records

    path = tmp_path / "mac.csv"
    path.write_bytes(b"domain,name\r" + b"".join(b"d%d.com,n\r" % i for i in range(40)))
    assert count_records(path) == 41
    assert count_records(path, block_size=7) == 41


def test_a_key_the_csv_has_no_column_for_is_refused_before_any_row_naming_its_columns(deepline, tmp_path: Path) -> None:
    """`key="domain"` over a CSV whose header says `Domain`: said before any row is done, by
    the header's names (not as line 2's fault)."""
    (tmp_path / "play.py").write_text(KEYED_PLAY.replace('required=["domain"]', "required=[]"))
    (tmp_path / "leads.csv").write_text("Domain,Name\nacme.com,Acme\n")
    result = deepline("run", "play.py", "--set", "file=leads.csv")
    assert result.code == 2, result.stderr
    said = "Map 'leads': its key field 'domain' is not a column of leads.csv (its columns: Domain, Name)"
    assert said in result.stderr and "did you mean 'Domain'?" in result.stderr, result.stderr
    assert "line 2" not in result.stderr


def test_a_byte_that_is_not_utf8_deep_in_the_file_is_refused_before_any_row(deepline, tmp_path: Path) -> None:
    """A cp1252 `é` past the first block read to guess the delimiter was found mid-map,
    after the rows before it were paid for: the whole file is checked before the first row."""
    (tmp_path / "play.py").write_text(KEYED_PLAY)
    rows = b"".join(b"d%d.com,Company %d\n" % (i, i) for i in range(6000))
    (tmp_path / "leads.csv").write_bytes(b"domain,name\n" + rows + b"soci\xe9t\xe9.fr,Soci\xe9t\xe9\n")
    assert len(rows) > 70_000
    result = deepline("run", "play.py", "--set", "file=leads.csv", "--run-id", "U", "--json")
    assert result.code == 2, result.stderr
    assert "leads.csv line 6002, column 5: not valid UTF-8" in result.stderr, result.stderr
    shown = json.loads(deepline("runs", "show", "U", "--json").stdout)
    assert shown["stats"]["rows"]["succeeded"] == 0, shown["stats"]["rows"]


def test_a_line_repeating_the_header_fails_alone_as_two_files_joined(deepline, tmp_path: Path) -> None:
    """Two exports joined with `cat`: the second's header (its byte order mark too) was a
    lead named `domain`, paid for like any other."""
    first = b"\xef\xbb\xbfdomain,name\nd1.com,A\n"
    finished, failed = keyed_run(deepline, tmp_path, first + first.replace(b"d1", b"d2"))
    assert finished["output"] == {"rows": ["D1.COM", None, "D2.COM"], "failed": 1}, finished
    assert failed == ["InputError: leads.csv line 3: it repeats the header (two files joined into one?)"], failed


def test_keys_differing_only_by_case_or_spaces_are_warned_of(deepline, tmp_path: Path) -> None:
    """`acme.com` and ` ACME.com` are two rows, each paid: said once, with what to do."""
    (tmp_path / "play.py").write_text(KEYED_PLAY)
    (tmp_path / "leads.csv").write_text("domain,name\nacme.com,A\nb.com,B\n ACME.com,A2\nB.com,B2\n")
    result = deepline("run", "play.py", "--set", "file=leads.csv", "--json")
    assert result.code == 0, result.stderr
    assert result.json_lines()[-1]["output"]["rows"] == ["ACME.COM", "B.COM", " ACME.COM", "B.COM"]
    warned = [e["message"] for e in result.json_lines() if e.get("level") == "warning"]
    assert warned == [
        "Map 'leads': the keys 'acme.com' and ' ACME.com' differ only by case or spaces: two rows, each "
        "computed (and paid for) on its own; to take them as one, normalise the key "
        '(key=lambda row: row["domain"].strip().lower())'
    ], warned


def test_record_ids_told_apart_by_case_are_not_warned_of(deepline, tmp_path: Path) -> None:
    """A CRM's 15-character record ids differ by case alone and name two records."""
    (tmp_path / "play.py").write_text(
        KEYED_PLAY.replace('key="domain"', 'key="id"').replace('required=["domain"]', "required=[]")
    )
    (tmp_path / "leads.csv").write_text("id,domain\n001A000001abcDE,a.com\n001A000001ABCde,b.com\n")
    result = deepline("run", "play.py", "--set", "file=leads.csv", "--json")
    assert result.code == 0, result.stderr
    assert [e for e in result.json_lines() if e.get("level") == "warning"] == []
