"""`deepline export` (SPEC §5, §2 Dataset): CSV and JSONL of a run's map, through the real CLI."""

from __future__ import annotations

import csv
import io
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deepline_cli import _json
from deepline_cli.runtime.calls.events import EventBus
from deepline_cli.runtime.run.options import RunOptions
from deepline_cli.runtime.run.runner import Runner
from tests.conftest import ROOT

PEOPLE = "Zeta,Alpha,Mid\nz1,a1,m1\nz2,bad,m2\nz3,a3,\nz1,a1,m1\n"

PLAY = """\
from deepline_cli import play

def tags(row):
    if row["Alpha"] == "bad":
        raise ValueError("bad alpha")
    return ["x", row["Zeta"]]

@play("export-me")
async def export_me(ctx, input):
    people = await ctx.map("people", ctx.csv(input["csv"]), columns={
        "score": lambda row: len(row["Alpha"]) * 1.5,
        "info": lambda row: {"alpha": row["Alpha"], "n": [1, 2]},
        "tags": tags,
        "note": lambda row: ('say "hi", ' + row["Mid"]) if row["Mid"] else None,
    })
    if input.get("two_maps"):
        await ctx.map("companies", [{"domain": "acme.com", "size": 3}], key="domain",
                      columns={"name": lambda row: row["domain"].split(".")[0]})
    return {"rows": len(people), "failed": people.failed_count}
"""


def run_in_process(tmp_path: Path, store_path: Path, run_id: str, **input: Any) -> None:
    (tmp_path / "people.csv").write_text(PEOPLE)
    play_file = tmp_path / "export_play.py"
    play_file.write_text(PLAY)
    runner = Runner(RunOptions(store=str(store_path), run_id=run_id), EventBus())
    try:
        result = runner.start(str(play_file), {"csv": str(tmp_path / "people.csv"), **input})
    finally:
        runner.close()
    assert result.status == "completed", result.error
    assert result.output == {"rows": 3, "failed": 1}


def parse_csv(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


EXPECTED_HEADER = ["Zeta", "Alpha", "Mid", "score", "info", "tags", "note", "_error"]
EXPECTED_ROWS = [
    ["z1", "a1", "m1", "3.0", '{"alpha":"a1","n":[1,2]}', '["x","z1"]', 'say "hi", m1', ""],
    ["z2", "bad", "m2", "4.5", '{"alpha":"bad","n":[1,2]}', "", "", "ValueError: bad alpha (export_play.py line 5)"],
    ["z3", "a3", "", "3.0", '{"alpha":"a3","n":[1,2]}', '["x","z3"]', "", ""],
]


def test_export_csv_to_stdout(deepline, tmp_path: Path, store_path: Path) -> None:
    run_in_process(tmp_path, store_path, "exp-1")

    result = deepline("export", "exp-1")

    assert result.code == 0, result.stderr
    rows = parse_csv(result.stdout)
    # original columns first in the CSV's order, new columns after, `_error` last
    assert rows[0] == EXPECTED_HEADER
    # every distinct row, in input order, failed ones with their error; non-scalars as compact JSON
    assert rows[1:] == EXPECTED_ROWS


def test_export_jsonl(deepline, tmp_path: Path, store_path: Path) -> None:
    run_in_process(tmp_path, store_path, "exp-2")

    result = deepline("export", "exp-2", "--format", "jsonl")

    assert result.code == 0, result.stderr
    lines = [_json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 3
    assert [row.get("_error") for row in lines] == [None, "ValueError: bad alpha (export_play.py line 5)", None]
    assert [{k: v for k, v in row.items() if k != "_error"} for row in lines] == [
        {"Zeta": "z1", "Alpha": "a1", "Mid": "m1", "score": 3.0, "info": {"alpha": "a1", "n": [1, 2]},
         "tags": ["x", "z1"], "note": 'say "hi", m1'},
        {"Zeta": "z2", "Alpha": "bad", "Mid": "m2", "score": 4.5, "info": {"alpha": "bad", "n": [1, 2]},
         "tags": None, "note": None},
        {"Zeta": "z3", "Alpha": "a3", "Mid": "", "score": 3.0, "info": {"alpha": "a3", "n": [1, 2]},
         "tags": ["x", "z3"], "note": None},
    ]  # fmt: skip


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_export_out_file(deepline, tmp_path: Path, store_path: Path, fmt: str) -> None:
    run_in_process(tmp_path, store_path, "exp-3")
    to_stdout = deepline("export", "exp-3", "--format", fmt)
    out_dir = tmp_path / "out"
    out_dir.mkdir()

    result = deepline("export", "exp-3", "--format", fmt, "--out", f"enriched.{fmt}", cwd=out_dir)

    assert result.code == 0, result.stderr
    assert result.stdout == ""
    written = (out_dir / f"enriched.{fmt}").read_text(encoding="utf-8")
    assert written == to_stdout.stdout
    assert "3 rows" in result.stderr


def test_export_with_several_maps_needs_map(deepline, tmp_path: Path, store_path: Path) -> None:
    run_in_process(tmp_path, store_path, "exp-4", two_maps=True)

    ambiguous = deepline("export", "exp-4")
    assert ambiguous.code == 2
    assert "people" in ambiguous.stderr
    assert "companies" in ambiguous.stderr
    assert "--map" in ambiguous.stderr
    assert ambiguous.stdout == ""
    assert "Traceback" not in ambiguous.stderr

    people = deepline("export", "exp-4", "--map", "people")
    assert people.code == 0, people.stderr
    assert parse_csv(people.stdout)[1:] == EXPECTED_ROWS

    companies = deepline("export", "exp-4", "--map", "companies")
    assert companies.code == 0, companies.stderr
    assert parse_csv(companies.stdout) == [
        ["domain", "size", "name", "_error"],
        ["acme.com", "3", "acme", ""],
    ]


def test_export_unknown_map_or_run_exits_2(deepline, tmp_path: Path, store_path: Path) -> None:
    run_in_process(tmp_path, store_path, "exp-5")

    unknown_map = deepline("export", "exp-5", "--map", "nope")
    assert unknown_map.code == 2
    assert "nope" in unknown_map.stderr
    assert "people" in unknown_map.stderr  # the maps it does have
    assert "Traceback" not in unknown_map.stderr

    unknown_run = deepline("export", "r-does-not-exist")
    assert unknown_run.code == 2
    assert "r-does-not-exist" in unknown_run.stderr
    assert "Traceback" not in unknown_run.stderr


def test_export_keeps_every_input_field_of_dict_rows(deepline, tmp_path: Path, store_path: Path) -> None:
    """BUG (map.py `MapRun._chunks`): a row's fields are added to the map's input columns only
    when the row has more fields than are known so far, so a later row with as many fields
    but a new one ("c" below) is dropped from `Dataset.columns` and from the CSV export."""
    play_file = tmp_path / "dict_play.py"
    play_file.write_text(
        "from deepline_cli import play\n\n"
        '@play("dicts")\n'
        "async def dicts(ctx, input):\n"
        '    rows = [{"id": "1", "b": "x"}, {"id": "2", "c": "y"}]\n'
        '    ds = await ctx.map("m", rows, key="id", columns={"v": lambda row: row["id"] * 2})\n'
        "    return ds.columns\n"
    )
    runner = Runner(RunOptions(store=str(store_path), run_id="exp-dicts"), EventBus())
    try:
        result = runner.start(str(play_file), {})
    finally:
        runner.close()
    assert result.status == "completed", result.error

    exported = deepline("export", "exp-dicts")

    assert exported.code == 0, exported.stderr
    assert parse_csv(exported.stdout) == [
        ["id", "b", "c", "v", "_error"],
        ["1", "x", "", "11", ""],
        ["2", "", "y", "22", ""],
    ]
    assert result.output == ["id", "b", "c", "v"]


def test_export_into_a_closed_pipe_is_not_an_internal_error(
    tmp_path: Path, store_path: Path, cli_env: dict[str, str]
) -> None:
    """BUG (cli/export.py): `deepline export RUN | head` ends with "Error: internal error:
    BrokenPipeError: [Errno 32] Broken pipe" on stderr once the reader stops reading."""
    play_file = tmp_path / "big_play.py"
    play_file.write_text(
        "from deepline_cli import play\n\n"
        '@play("big")\n'
        "async def big(ctx, input):\n"
        '    rows = [{"id": i} for i in range(3000)]\n'
        '    await ctx.map("m", rows, key="id", columns={"pad": lambda row: "x" * 200})\n'
    )
    runner = Runner(RunOptions(store=str(store_path), run_id="exp-big"), EventBus())
    try:
        assert runner.start(str(play_file), {}).status == "completed"
    finally:
        runner.close()

    proc = subprocess.Popen(
        [sys.executable, "-m", "deepline_cli", "export", "exp-big"],
        cwd=tmp_path,
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"id,pad")  # like `head -1`
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    proc.wait(timeout=60)
    proc.stderr.close()

    assert "internal error" not in stderr
    assert "BrokenPipeError" not in stderr


# --- the lead-enrichment example, end to end -------------------------------------------------


def test_lead_enrichment_example_runs_and_exports(deepline) -> None:
    leads = ROOT / "examples/lead_enrichment/leads.csv"
    with leads.open(newline="") as handle:
        source = list(csv.DictReader(handle))
    keys = [(r["First Name"], r["Last Name"], r["Domain"]) for r in source]
    assert len(source) == 302
    assert len(keys) - len(set(keys)) == 12

    run = deepline(
        "run", "examples/lead_enrichment/play.py", "--csv", "examples/lead_enrichment/leads.csv",
        "--run-id", "leads-e2e", "--set", "latency=0", "--json", cwd=ROOT,
    )  # fmt: skip

    assert run.code == 0, run.stderr
    events = run.json_lines()
    finished = events[-1]
    assert finished["event"] == "run.finished"
    assert finished["status"] == "completed"
    output = finished["output"]
    assert output["rows"] == 290
    [completed] = [e for e in events if e["event"] == "map.completed"]
    assert (completed["total"], completed["duplicate"]) == (290, 12)
    assert completed["succeeded"] + completed["failed"] == 290
    assert completed["failed"] == output["failed"]
    logs = [e["message"] for e in events if e["event"] == "log"]
    assert (
        f"Map completed: 290 results ({290 - output['failed']} succeeded, {output['failed']} failed, "
        "12 duplicate keys skipped)"
    ) in logs

    export = deepline("export", "leads-e2e", cwd=ROOT)

    assert export.code == 0, export.stderr
    rows = parse_csv(export.stdout)
    assert rows[0] == [
        "first_name", "last_name", "company_name", "domain", "company", "email", "valid", "_error",
    ]  # fmt: skip
    body = rows[1:]
    assert len(body) == 290
    assert [(r[0], r[1], r[3]) for r in body] == list(dict.fromkeys(keys))  # input order, distinct
    failed = [r for r in body if r[7]]
    assert len(failed) == output["failed"]
    for row in body:
        if row[4]:
            assert _json.loads(row[4])["domain"] == row[3]
        if row[6]:
            assert set(_json.loads(row[6])) == {"deliverable", "score"}

    jsonl = deepline("export", "leads-e2e", "--format", "jsonl", cwd=ROOT)
    assert jsonl.code == 0, jsonl.stderr
    objects = [_json.loads(line) for line in jsonl.stdout.splitlines()]
    assert len(objects) == 290
    assert sum(1 for o in objects if o.get("_error")) == output["failed"]


def test_export_of_a_failed_run_holding_every_row_does_not_call_itself_partial(
    deepline, write_play, tmp_path: Path
) -> None:
    """A map that fails on a row error, with every row in flight: all 10 rows are recorded
    (2 failed), yet the export said "10 of 10 rows: this export is partial"."""
    write_play(
        """
        import asyncio
        from deepline_cli import play

        async def check(row):
            await asyncio.sleep(0.01)  # every row is in flight when the first fails
            if row["n"] in (3, 7):
                raise ValueError(f"bad row {row['n']}")
            return row["n"] * 2

        @play("strict")
        async def strict(ctx, input):
            rows = await ctx.map("m", [{"n": n} for n in range(10)], key="n", on_row_error="fail",
                                 concurrency=10, columns={"v": check})
            return len(rows)
        """
    )
    assert deepline("run", "play.py", "--run-id", "f1", "--quiet").code == 1
    out = tmp_path / "f1.csv"
    result = deepline("export", "f1", "--out", str(out))
    assert result.code == 0, result.stderr
    assert len(out.read_text().splitlines()) == 11
    assert "partial" not in result.stderr, result.stderr
    assert "map 'm' has all its 10 rows (2 failed)" in result.stderr, result.stderr


def test_export_of_a_run_whose_process_is_gone_says_so(deepline, write_play, tmp_path: Path, store_path: Path) -> None:
    """A run killed mid-map is `running` in the store, its process gone: the export said
    "run … is running", where `runs show` says its process is gone and how to go on."""
    import sqlite3

    run_in_process(tmp_path, store_path, "gone-1")
    with sqlite3.connect(store_path) as db:  # as a SIGKILL leaves it: running, held by a process that is no more
        db.execute("UPDATE runs SET status = 'running', holder = 'nowhere:999999:x', lease_expires_at = 1")
    result = deepline("export", "gone-1", "--out", str(tmp_path / "out.csv"))
    assert result.code == 0, result.stderr
    assert "is running" not in result.stderr, result.stderr
    assert "its process is gone" in result.stderr and "deepline resume gone-1" in result.stderr, result.stderr


def test_export_out_dash_is_stdout(deepline, tmp_path: Path, store_path: Path) -> None:
    """`--out -` wrote a file named `-` (and said "Exported … to -.")."""
    run_in_process(tmp_path, store_path, "dash-1")
    result = deepline("export", "dash-1", "--out", "-")
    assert result.code == 0, result.stderr
    assert parse_csv(result.stdout)[0] == EXPECTED_HEADER
    assert not (tmp_path / "-").exists()


def test_export_of_a_run_a_live_process_is_at_does_not_say_resume_it(
    deepline, tmp_path: Path, store_path: Path
) -> None:
    """The export of a run still going said "Continue the run with: deepline resume …",
    which refuses (the run is held by a live process)."""
    import sqlite3
    import time

    from deepline_cli.runtime.run.holders import holder_id

    run_in_process(tmp_path, store_path, "live-1")
    with sqlite3.connect(store_path) as db:  # held by this very process, its lease current, a row to go
        db.execute(
            "UPDATE runs SET status = 'running', holder = ?, lease_expires_at = ?", (holder_id(), time.time() + 600)
        )
        db.execute("UPDATE maps SET status = 'running'")
        db.execute("DELETE FROM map_rows WHERE idx = 2")
    result = deepline("export", "live-1", "--out", str(tmp_path / "out.csv"))
    assert result.code == 0, result.stderr
    assert "is running" in result.stderr and "partial" in result.stderr, result.stderr
    assert "deepline resume" not in result.stderr, result.stderr


@pytest.mark.process
def test_an_export_that_fails_halfway_leaves_the_file_it_would_replace_whole(
    deepline, write_play, tmp_path: Path, store_path: Path, cli_env: dict[str, str]
) -> None:
    """The disk fills up (here: a file size limit) while an export replaces last week's
    file: that file is still there as it was, and no half-written one is left beside it."""
    import resource
    import signal

    play = write_play(
        """
        from deepline_cli import play

        @play("wide")
        async def wide(ctx, input):
            rows = [{"id": n} for n in range(3000)]
            await ctx.map("rows", rows, key="id", columns={"note": lambda row: f"row {row['id']:>6} " + "x" * 60})
        """
    )
    assert deepline("run", str(play), "--run-id", "exp-full").code == 0
    previous = tmp_path / "enriched.csv"
    previous.write_text("id,note\nlast,week\n")

    def small_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))  # the export is ~230 KB

    proc = subprocess.run(
        [sys.executable, "-m", "deepline_cli", "export", "exp-full", "--out", "enriched.csv"],
        cwd=tmp_path, env={**cli_env, "DEEPLINE_STORE": str(store_path)}, capture_output=True, text=True,
        timeout=60, preexec_fn=small_disk, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Cannot write enriched.csv" in proc.stderr
    assert previous.read_text() == "id,note\nlast,week\n"
    assert sorted(p.name for p in tmp_path.iterdir() if "enriched" in p.name) == ["enriched.csv"]


def test_export_out_jsonl_is_json_lines_without_format(deepline, tmp_path: Path, store_path: Path) -> None:
    """`--out rows.jsonl` (or .ndjson) writes JSON Lines, not CSV under a .jsonl name;
    `--format` still decides when given."""
    run_in_process(tmp_path, store_path, "exp-sfx")
    jsonl = deepline("export", "exp-sfx", "--format", "jsonl").stdout
    for name in ("rows.jsonl", "rows.NDJSON"):
        assert deepline("export", "exp-sfx", "--out", name).code == 0
        assert (tmp_path / name).read_text() == jsonl
    assert deepline("export", "exp-sfx", "--out", "rows.txt").code == 0
    assert parse_csv((tmp_path / "rows.txt").read_text())[0] == EXPECTED_HEADER
    assert deepline("export", "exp-sfx", "--out", "forced.jsonl", "--format", "csv").code == 0
    assert parse_csv((tmp_path / "forced.jsonl").read_text())[0] == EXPECTED_HEADER
    # `--out rows.json` wrote CSV under a .json name: asked which it is, nothing written.
    json_out = deepline("export", "exp-sfx", "--out", "rows.json")
    assert json_out.code == 2 and "rows.jsonl" in json_out.stderr, json_out.stderr
    assert not (tmp_path / "rows.json").exists()
    assert deepline("export", "exp-sfx", "--out", "rows.json", "--format", "jsonl").code == 0
    assert (tmp_path / "rows.json").read_text() == jsonl


def test_a_datasets_relative_file_is_written_where_the_run_started_whatever_resumes_it(
    deepline, write_play, tmp_path: Path
) -> None:
    """`ds.to_csv("out.csv")`: relative to the folder a resume was typed in, while the run's
    `ctx.csv` paths are relative to the folder it was started in."""
    write_play(
        """
        from deepline_cli import play

        @play("written")
        async def written(ctx, input):
            ds = await ctx.map("m", [{"a": 1}, {"a": 2}], key="a", columns={"b": lambda row: row["a"] * 2})
            await ctx.wait_for_event("go")
            return [ds.to_csv("out.csv"), ds.to_jsonl("out.jsonl")]
        """
    )
    started = tmp_path / "started"
    started.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert deepline("run", str(tmp_path / "play.py"), "--run-id", "w", cwd=started).code == 3
    assert deepline("events", "send", "w", "go").code == 0
    resumed = deepline("resume", "w", cwd=elsewhere)
    assert resumed.code == 0, resumed.stderr
    assert sorted(p.name for p in started.iterdir()) == ["out.csv", "out.jsonl"]
    assert list(elsewhere.iterdir()) == []


def test_export_to_dev_stdout_writes_after_what_the_redirected_file_holds(
    deepline, write_play, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """`deepline export RUN --out /dev/stdout >> app.txt` replaced app.txt (its lines lost),
    and `--out /dev/stdout | wc -l` could not open the pipe."""
    write_play(
        """
        from deepline_cli import play

        @play("small")
        async def small(ctx, input):
            return len(await ctx.map("m", [{"a": 1}, {"a": 2}], key="a", columns={"b": lambda row: row["a"]}))
        """
    )
    assert deepline("run", "play.py", "--run-id", "small").code == 0
    app = tmp_path / "app.txt"
    app.write_text("KEEP ME\n")
    command = [sys.executable, "-m", "deepline_cli", "export", "small"]
    with app.open("a") as appended:
        done = subprocess.run([*command, "--out", "/dev/stdout"], stdout=appended, env=cli_env, cwd=tmp_path)
    assert done.returncode == 0
    assert app.read_text().splitlines() == ["KEEP ME", "a,b,_error", "1,1,", "2,2,"]
    to_stderr = [*command, "--out", "/dev/stderr"]
    piped = subprocess.run(to_stderr, capture_output=True, text=True, env=cli_env, cwd=tmp_path)
    assert piped.returncode == 0 and piped.stderr.startswith("a,b,_error\n"), piped.stderr


@pytest.mark.process
def test_export_of_a_killed_map_over_a_list_has_the_lists_fields(deepline_process, deepline, write_play) -> None:
    """A map over a list learns its fields as it reads them and recorded them only once the
    list was read whole (or the map ended): a killed run's CSV export had only the computed
    columns (no `domain`, no `name`), where its JSONL export had them."""
    write_play(
        """
        import os, signal
        from deepline_cli import play

        def check(row):
            if row["n"] == 300:
                os.kill(os.getpid(), signal.SIGKILL)  # the process dies mid-map, as kill -9 leaves it
            return row["domain"].upper()

        @play("killed")
        async def killed(ctx, input):
            rows = [{"n": n, "domain": f"d{n}.com", "name": f"N{n}"} for n in range(5000)]
            return len(await ctx.map("m", rows, key="domain", concurrency=1, columns={"v": check}))
        """
    )
    assert deepline_process("run", "play.py", "--run-id", "k1", "--quiet").code == -signal.SIGKILL
    result = deepline("export", "k1")
    assert result.code == 0, result.stderr
    header, first = parse_csv(result.stdout)[:2]
    assert header == ["n", "domain", "name", "v", "_error"], header
    assert first[:4] == ["0", "d0.com", "N0", "D0.COM"], first


def test_a_csv_export_writes_true_and_false_as_json_does(deepline, write_play) -> None:
    """A yes/no column came out as Python's `True`/`False`, where the same file's nested
    values and the JSONL export say `true`/`false`."""
    write_play(
        """
        from deepline_cli import play

        @play("flags")
        async def flags(ctx, input):
            rows = [{"n": n} for n in range(2)]
            return len(await ctx.map("m", rows, key="n", columns={
                "even": lambda row: row["n"] % 2 == 0, "both": lambda row: {"even": row["n"] % 2 == 0},
            }))
        """
    )
    assert deepline("run", "play.py", "--run-id", "b1", "--quiet").code == 0
    rows = parse_csv(deepline("export", "b1").stdout)
    assert rows == [
        ["n", "even", "both", "_error"],
        ["0", "true", '{"even":true}', ""],
        ["1", "false", '{"even":false}', ""],
    ]


NAMES_OF_THE_EXPORT = """\
from deepline_cli import play, steps

EMAIL = steps().step("hunter", lambda row: "h@" + row["id"])

@play("names")
async def names(ctx, input):
    rows = await ctx.map("m", [{"id": "1"}], key="id", columns=dict(
        [("email", EMAIL), (input["name"], lambda row: "mine")]))
    return len(rows)
"""


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("_error", "the export's column for a row's failure"),
        ("email_step", "the column saying which step of waterfall 'email' found its value"),
    ],
)
def test_a_column_named_as_the_exports_own_is_refused_before_any_row(
    deepline, write_play, name: str, said: str
) -> None:
    """A column named `_error` lost its values in the export (the row's failure took its
    place), and one named `email_step` beside waterfall `email` hid which step found it:
    both under a header holding the name twice."""
    write_play(NAMES_OF_THE_EXPORT)
    result = deepline("run", "play.py", "--set", f"name={name}")
    assert result.code == 2, result.stderr
    assert f"Map 'm': a column may not be named {name!r}: it is {said}; rename it." in result.stderr, result.stderr


FILL_THE_BLANKS = """\
from deepline_cli import Column, play, steps

EMAIL = steps().step("hunter", lambda row: "h@" + row["id"])

@play("fill")
async def fill(ctx, input):
    rows = [{"id": "1", "email": "old@x", "email_step": "apollo"}, {"id": "2", "email": "", "email_step": ""}]
    done = await ctx.map("m", rows, key="id", columns={"email": Column(EMAIL, run_if=lambda row: not row["email"])})
    return [[r["email"], r["email_step"]] for r in done]
"""


def test_a_waterfall_that_did_not_run_leaves_the_inputs_step_beside_its_value(deepline, write_play) -> None:
    """Filling the blanks of an earlier export: where the waterfall did not run, the input's
    email was kept and the step that found it (`apollo`) wiped."""
    write_play(FILL_THE_BLANKS)
    result = deepline("run", "play.py", "--quiet")
    assert result.code == 0, result.stderr
    assert _json.loads(result.stdout) == [["old@x", "apollo"], ["h@2", "hunter"]]


def test_the_export_of_a_pilot_says_it_holds_the_first_rows_of_the_list(deepline, tmp_path: Path) -> None:
    """A `--limit` pilot's export was a file like any other: passed on as the whole list."""
    (tmp_path / "people.csv").write_text(PEOPLE)
    (tmp_path / "export_play.py").write_text(PLAY)
    run = deepline("run", "export_play.py", "--set", "csv=people.csv", "--limit", "2", "--run-id", "pilot", "--quiet")
    assert run.code == 0, run.stderr
    result = deepline("export", "pilot")
    assert result.code == 0, result.stderr
    assert len(parse_csv(result.stdout)) == 3  # the header and 2 rows
    said = (
        "Warning: run pilot is a pilot (--limit 2): map 'people' has its first 2 of 3 rows; "
        "the whole list: run the play without --limit (the rows paid here are not paid again)."
    )
    assert said in result.stderr, result.stderr
