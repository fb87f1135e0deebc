"""Stored text reaches the file system and the screen only in safe forms: run ids are
checked when a run is created, and control characters (ANSI escapes, NUL) in stored text
are shown escaped wherever it is printed or put in the HTML report."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from deepline_cli.store.records import LogLine, RunRecord, Writes
from deepline_cli.store.sqlite import SQLiteStore
from tests.conftest import ROOT, Result

Run = Callable[..., Result]
HELLO = str(ROOT / "examples/hello/play.py")


@pytest.mark.parametrize("run_id", ["x/../../esc", "r\x1b[31mred", "-rf", ".hidden", "a" * 129, "white space"])
def test_a_run_id_outside_the_rule_is_refused_before_anything(deepline: Run, tmp_path: Path, run_id: str) -> None:
    result = deepline("run", HELLO, "--run-id", run_id)
    assert result.code == 2, result.stderr
    assert "use letters, digits, '.', '_' and '-'" in result.stderr
    assert "\x1b" not in result.stderr
    assert deepline("runs", "list", "--json").stdout == ""  # nothing was created


def test_stored_control_characters_are_shown_escaped(deepline: Run, store_path: Path, tmp_path: Path) -> None:
    """A store written before ids were checked, with an escape in a run id, a play name and
    a log line, and a NUL: every view shows them escaped, and the report stays here."""
    store = SQLiteStore(store_path)
    now = time.time()
    hostile = "r-\x1b[2Jx/../../esc"
    store.runs.insert_run(RunRecord(run_id=hostile, play="play\x1b[31m", play_ref="p.py", input={}, status="running",
                               created_at=now, updated_at=now))  # fmt: skip
    store.runs.set_status(hostile, "failed", error={"message": "boom\x00\x1b[0m"})
    store.receipts.apply(Writes(logs=[LogLine(hostile, 1, now, "info", "clear\x1b[2J screen\x00 nul")]), now)
    store.close()

    for args in (("runs", "list"), ("runs", "show", hostile), ("runs", "logs", hostile)):
        shown = deepline(*args)
        assert shown.code == 0, (args, shown.stderr)
        assert "\x1b" not in shown.stdout and "\x00" not in shown.stdout, args
    assert "\\x1b[2J" in deepline("runs", "logs", hostile).stdout

    report = deepline("runs", "report", hostile, "--html", cwd=tmp_path)
    assert report.code == 0, report.stderr
    written = Path(report.stdout.strip())
    assert written.parent == tmp_path  # not ../esc.html
    page = written.read_text()
    assert "\x00" not in page and "\x1b" not in page
    assert "\\x00" in page


def test_a_play_logging_escapes_cannot_drive_the_terminal(deepline: Run, write_play: Callable[..., Path]) -> None:
    write_play(
        """
        from deepline_cli import play

        @play("loud")
        async def loud(ctx, input):
            ctx.log("\\x1b[2J\\x1b[Hgotcha")
            return {}
        """
    )
    result = deepline("run", "play.py")
    assert result.code == 0, result.stderr
    assert "\x1b" not in result.stderr and "\\x1b[2J\\x1b[Hgotcha" in result.stderr


_ANSWERS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(st.characters(codec=None)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(st.characters(codec=None)), inner, max_size=4),
    max_leaves=12,
)


@given(_ANSWERS)
@example(10**400)  # past what a float holds: written as null, as Infinity is (it raised OverflowError)
@example({"n": [-(10**400), 2**64]})
@settings(max_examples=300, deadline=None)
def test_every_answer_a_tool_can_give_is_written_as_json_the_store_reads_back(answer: object) -> None:
    """A paid answer is always recorded: text with lone surrogates, integers of any size,
    NaN and Infinity are written as JSON (U+FFFD, the number, null), never refused, and
    read back (as the store reads it) as the same value wherever JSON holds it as it is."""
    from deepline_cli import _json

    written = _json.dumps(answer)
    written.decode("utf-8")  # valid UTF-8: any database column takes it
    back = _json.loads(written)
    if _json_holds_as_is(answer):
        assert back == answer


def _json_holds_as_is(value: object) -> bool:
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")
    if isinstance(value, int) and not isinstance(value, bool):
        return -(2**63) <= value < 2**64
    if isinstance(value, str):
        return not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, list):
        return all(_json_holds_as_is(v) for v in value)
    if isinstance(value, dict):
        return all(_json_holds_as_is(k) and _json_holds_as_is(v) for k, v in value.items())
    return True


def test_a_value_that_holds_itself_is_refused_as_no_json() -> None:
    """It has no JSON form: a TypeError (a tool input "has no receipt key", an output is not
    JSON), not a RecursionError from the mending of values orjson refuses."""
    from deepline_cli import _json

    loop: list[object] = ["\ud83d"]
    loop.append(loop)
    with pytest.raises(TypeError):
        _json.dumps(loop)


DEEP_PLAY = """
from deepline_cli import play, tool

def nested(depth):
    value = 1
    for _ in range(depth):
        value = {"a": value}
    return value

@tool("d.deep", credits=1)
def deep(input):
    with open(input["log"], "a") as log:
        log.write(input["id"] + "\\n")
    return nested(300) if input["id"] == "deep" else {"ok": input["id"]}

@play("deep")
async def deep_play(ctx, input):
    rows = [{"id": "deep"}, *({"id": f"r{i}"} for i in range(9))]
    done = await ctx.map("m", rows, key="id", columns={
        "a": lambda row, rc: rc.tools.execute("d", "d.deep", {"id": row["id"], "log": input["log"]}),
        "depth": lambda row: len(str(row["a"])),
    })
    return {"rows": len(done), "failed": done.failed_count}
"""


def test_an_answer_nested_300_deep_is_recorded_and_never_asked_again(
    deepline: Run, write_play: Callable[..., Path], tmp_path: Path
) -> None:
    """orjson writes 254 levels at most: the paid answer could not be recorded, the run
    stopped with the calls of its write batch unrecorded, and every resume sent them again."""
    write_play(DEEP_PLAY)
    log = tmp_path / "calls.log"
    first = deepline("run", "play.py", "--set", f"log={log}", "--run-id", "deep", "--json")
    assert first.code == 0, first.stdout[-2000:]
    assert first.json_lines()[-1]["output"] == {"rows": 10, "failed": 0}
    again = deepline("run", "play.py", "--set", f"log={log}", "--json")  # a new run: every call from its receipt
    assert again.code == 0 and again.json_lines()[-1]["stats"]["credits"] == 0
    assert sorted(log.read_text().split()) == sorted(["deep", *(f"r{i}" for i in range(9))])  # each paid once


def test_names_with_brackets_or_escapes_are_shown_as_they_are(deepline: Run, write_play: Callable[..., Path]) -> None:
    """A map named "accounts [/tier]" stopped the plain view (a closing tag of Rich's markup)
    before its verdict; "[b]" turned text bold; a play name's escape sequence reached the terminal."""
    write_play(
        """
        from deepline_cli import play

        @play("odd\\x1b[2Jplay")
        async def odd(ctx, input):
            done = await ctx.map(input["m"], [{"d": "a"}, {"d": "b"}], key="d", columns={"x": lambda row: 1})
            return len(done)
        """
    )
    result = deepline("run", "play.py", "--set", "m=accounts [/tier] [b]")
    assert result.code == 0, result.stderr
    assert "accounts [/tier] [b]" in result.stderr and "Map completed: 2 results" in result.stderr, result.stderr
    assert "✓ Run" in result.stderr and "\x1b" not in result.stderr, result.stderr


def test_a_deep_answer_holding_nan_is_stored_as_the_store_reads_back() -> None:
    """Python's json (the path for answers deeper than 254 levels) writes NaN as `NaN`,
    which no JSON reader takes back: the receipt could not be read by any replay."""
    from deepline_cli import _json

    value: object = {"score": float("nan"), "top": float("inf")}
    for _ in range(300):
        value = {"a": value}
    back = _json.loads(_json.dumps(value))
    for _ in range(300):
        back = back["a"]
    assert back == {"score": None, "top": None}


def test_a_decimal_past_64_bits_is_written_as_the_number_json_holds() -> None:
    """A Decimal (a database driver's numeric, money from a CSV) past 64 bits in a paid
    answer was an int orjson refuses: `TypeError: Integer exceeds 64-bit range`, the answer
    not recorded. It is the float it is, or null past what a float holds, as an int is."""
    from decimal import Decimal

    from deepline_cli import _json

    assert _json.loads(_json.dumps({"n": Decimal("1e30")})) == {"n": 1e30}
    assert _json.loads(_json.dumps([Decimal("-123456789012345678901234567890")])) == [-1.2345678901234568e29]
    assert _json.loads(_json.dumps({"n": Decimal("1e400")})) == {"n": None}
    assert _json.loads(_json.dumps({"n": Decimal("12.50"), "m": Decimal("7")})) == {"n": 12.5, "m": 7}
    assert _json.plain({"n": Decimal("1e30")}, "a cell") == {"n": 1e30}
