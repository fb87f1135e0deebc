"""The play's input from `--input`, `--csv` and `--set` (deepline_cli/cli/inputs.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deepline_cli.cli.inputs import apply_set, build_input, parse_value, read_input
from deepline_cli.errors import InputError
from tests.conftest import ROOT


def input_error(fn: Any, *args: Any, **kwargs: Any) -> str:
    """Call `fn`, expect an InputError with exit code 2, return its message."""
    with pytest.raises(InputError) as info:
        fn(*args, **kwargs)
    assert info.value.exit_code == 2
    return str(info.value)


# --- --input ------------------------------------------------------------------------------


def test_no_input_is_an_empty_object(tmp_path: Path) -> None:
    assert read_input(None, cwd=tmp_path) == {}
    assert build_input(None, None, [], cwd=tmp_path) == {}


def test_input_json_object(tmp_path: Path) -> None:
    assert read_input('{"limit": 10, "names": ["Ada"], "nested": {"a": null}}', cwd=tmp_path) == {
        "limit": 10,
        "names": ["Ada"],
        "nested": {"a": None},
    }


def test_input_from_a_file_relative_to_cwd(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "input.json").write_text('{"from": "file", "n": 2}')

    assert read_input("@conf/input.json", cwd=tmp_path) == {"from": "file", "n": 2}
    assert read_input("@input.json", cwd=tmp_path / "conf") == {"from": "file", "n": 2}


def test_input_from_an_absolute_file(tmp_path: Path) -> None:
    path = tmp_path / "input.json"
    path.write_text('{"abs": true}')

    assert read_input(f"@{path}", cwd=tmp_path / "elsewhere") == {"abs": True}


def test_input_file_with_a_byte_order_mark(tmp_path: Path) -> None:
    (tmp_path / "bom.json").write_bytes('\ufeff{"name": "Zoë"}'.encode())

    assert read_input("@bom.json", cwd=tmp_path) == {"name": "Zoë"}


@pytest.mark.parametrize("raw", ["[1, 2]", '"text"', "3", "null", "true"])
def test_input_must_be_an_object(tmp_path: Path, raw: str) -> None:
    message = input_error(read_input, raw, cwd=tmp_path)

    assert "--input" in message
    assert "object" in message


def test_input_file_must_hold_an_object(tmp_path: Path) -> None:
    (tmp_path / "list.json").write_text("[1]")

    assert "object" in input_error(read_input, "@list.json", cwd=tmp_path)


def test_bad_input_json_names_the_flag_and_the_position(tmp_path: Path) -> None:
    message = input_error(read_input, '{"a": 1,}', cwd=tmp_path)

    assert message.startswith("--input ")
    assert "not valid JSON" in message
    assert "line 1 column 9" in message


def test_bad_json_in_an_input_file_names_the_file_and_the_position(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text('{\n  "a": 1,\n  "b": oops\n}\n')

    message = input_error(read_input, "@broken.json", cwd=tmp_path)

    assert "--input" in message
    assert str(tmp_path / "broken.json") in message
    assert "line 3 column 8" in message


def test_missing_input_file(tmp_path: Path) -> None:
    message = input_error(read_input, "@nope.json", cwd=tmp_path)

    assert str(tmp_path / "nope.json") in message
    assert "does not exist" in message


def test_input_file_that_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "dir.json").mkdir()

    assert str(tmp_path / "dir.json") in input_error(read_input, "@dir.json", cwd=tmp_path)


def test_input_file_that_is_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "latin.json").write_bytes(b'{"name": "Zo\xeb"}')

    message = input_error(read_input, "@latin.json", cwd=tmp_path)

    assert str(tmp_path / "latin.json") in message
    assert "cannot be read" in message


# --- --csv --------------------------------------------------------------------------------


def test_csv_sets_the_absolute_path(tmp_path: Path) -> None:
    (tmp_path / "data" / "sub").mkdir(parents=True)
    (tmp_path / "data" / "leads.csv").write_text("domain\nacme.com\n")
    expected = str((tmp_path / "data" / "leads.csv").resolve())

    relative = build_input(None, Path("data/leads.csv"), [], cwd=tmp_path)
    dotted = build_input(None, Path("../leads.csv"), [], cwd=tmp_path / "data" / "sub")
    absolute = build_input(None, tmp_path / "data" / "leads.csv", [], cwd=Path("/"))

    assert relative == {"csv": expected}
    assert dotted == {"csv": expected}
    assert absolute == {"csv": expected}
    assert Path(relative["csv"]).is_absolute()


def test_csv_is_added_to_the_input_object(tmp_path: Path) -> None:
    (tmp_path / "leads.csv").write_text("domain\n")

    value = build_input('{"limit": 5, "csv": "old.csv"}', Path("leads.csv"), [], cwd=tmp_path)

    assert value == {"limit": 5, "csv": str((tmp_path / "leads.csv").resolve())}


def test_missing_csv(tmp_path: Path) -> None:
    message = input_error(build_input, None, Path("missing.csv"), [], cwd=tmp_path)

    assert "--csv" in message
    assert str(tmp_path / "missing.csv") in message


def test_csv_that_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "dir.csv").mkdir()

    assert "--csv" in input_error(build_input, None, Path("dir.csv"), [], cwd=tmp_path)


# --- --set --------------------------------------------------------------------------------


def test_set_creates_nested_objects(tmp_path: Path) -> None:
    value = build_input(None, None, ["a.b.c=v", "a.b.d=w", "a.e=1", "top=x"], cwd=tmp_path)

    assert value == {"a": {"b": {"c": "v", "d": "w"}, "e": 1}, "top": "x"}


def test_set_merges_into_the_input_object(tmp_path: Path) -> None:
    value = build_input('{"a": {"keep": 1, "b": 2}, "n": 1}', None, ["a.b=3", "n=4"], cwd=tmp_path)

    assert value == {"a": {"keep": 1, "b": 3}, "n": 4}


def test_set_overrides_csv_and_later_set_wins(tmp_path: Path) -> None:
    (tmp_path / "leads.csv").write_text("domain\n")

    value = build_input(None, Path("leads.csv"), ["csv=other.csv", "x=1", "x=2"], cwd=tmp_path)

    assert value == {"csv": "other.csv", "x": 2}


@pytest.mark.parametrize(
    ("assignment", "expected"),
    [
        ("n=3", 3),
        ("n=-2.5", -2.5),
        ("flag=true", True),
        ("flag=false", False),
        ("nothing=null", None),
        ("xs=[1,2]", [1, 2]),
        ('obj={"k": "v"}', {"k": "v"}),
        ('quoted="3"', "3"),
        ("name=Ada Lovelace", "Ada Lovelace"),
        ("domain=acme.com", "acme.com"),
        ("word=True", "True"),
        ("broken=[1,", "[1,"),
        ("empty=", ""),
        ("url=https://x.test/?a=b&c=d", "https://x.test/?a=b&c=d"),
    ],
)
def test_set_values_are_json_when_they_parse_else_strings(assignment: str, expected: Any) -> None:
    target: dict[str, Any] = {}

    apply_set(target, assignment)

    [(name, value)] = target.items()
    assert name == assignment.partition("=")[0]
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_set_values_that_are_not_json_stay_strings(text: str) -> None:
    """NaN and Infinity are Python's json extensions, not JSON: they are plain strings."""
    assert parse_value(text) == text


@pytest.mark.parametrize("assignment", ["x", "", "=v", ".a=v", "a.=v", "a..b=v"])
def test_malformed_set(assignment: str) -> None:
    message = input_error(apply_set, {}, assignment)

    assert "--set" in message
    assert "key=value" in message


def test_set_through_an_existing_scalar_is_a_conflict() -> None:
    target: dict[str, Any] = {"a": 1, "list": [1]}

    message = input_error(apply_set, target, "a.b=2")
    assert "'a'" in message
    assert "already a value" in message
    assert "a.b=2" in message
    assert "list" in input_error(apply_set, target, "list.x=2")
    assert target == {"a": 1, "list": [1]}


def test_set_replaces_a_leaf_value() -> None:
    target: dict[str, Any] = {"a": {"b": {"deep": 1}}}

    apply_set(target, "a.b=2")

    assert target == {"a": {"b": 2}}


def test_a_later_set_may_not_replace_an_object_an_earlier_set_built(tmp_path: Path) -> None:
    """`--set a.b=2 --set a=1` quietly gave {"a": 1}, dropping a.b (the other order was
    refused): refused too; replacing --input's object, or a value twice, still works."""
    message = input_error(build_input, None, None, ["a.b=2", "a=1"], cwd=tmp_path)
    assert "--set 'a=1' would replace what --set 'a.b=2' gave" in message
    assert build_input('{"a": {"b": 1}}', None, ["a=5", "x=1", "x=2"], cwd=tmp_path) == {"a": 5, "x": 2}


def test_build_input_reports_the_conflict_as_input_error(tmp_path: Path) -> None:
    message = input_error(build_input, '{"a": "x"}', None, ["a.b=1"], cwd=tmp_path)

    assert "already a value" in message


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--set", "account=900000000000000000000001"), "has more than 64 bits"),
        (("--input", '{"x": 1e999}'), "is too large to be stored"),
        (("--set", "x=1e999"), "is too large to be stored"),
        (("--set", "x=1e-400"), "is too small to be stored"),
    ],
)
def test_a_number_the_store_cannot_keep_as_it_is_is_refused(deepline, args: tuple[str, ...], words: str) -> None:
    """A 24-digit account number was stored as the float it reads back as: the resume asked
    the same tool with another input, and paid again; 1e999 was seen as inf, stored as null."""
    result = deepline("run", str(ROOT / "examples" / "hello" / "play.py"), *args)
    assert result.code == 2, result.stderr
    assert words in result.stderr, result.stderr
