"""The play's input from `--input`, `--csv` and `--set` (pure functions)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from deepline_cli.errors import InputError


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _Unstorable(ValueError):
    """A number the store cannot keep as it is: a resume would read back another one."""


def _int(text: str) -> int:
    value = int(text)
    if not -(2**63) <= value < 2**64:
        raise _Unstorable(f"the number {text} has more than 64 bits, so it cannot be stored as it is; give it as text")
    return value


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _Unstorable(f"the number {text} is too large to be stored")
    if value == 0 and any(digit in "123456789" for digit in text.lower().partition("e")[0]):
        raise _Unstorable(f"the number {text} is too small to be stored (it would be 0)")
    return value


def _strict_loads(text: str) -> Any:
    """JSON as the standard has it: NaN and Infinity are not numbers here, and a number is
    one the store keeps as it is (a resume reads back the input its first attempt saw)."""
    return json.loads(text, parse_constant=_reject_constant, parse_int=_int, parse_float=_float)


def _parse_json(text: str, *, flag: str) -> Any:
    try:
        return _strict_loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{flag} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}.") from None
    except _Unstorable as exc:
        raise InputError(f"{flag}: {exc}.") from None
    except ValueError as exc:
        raise InputError(f"{flag} is not valid JSON: {exc}.") from None


def parse_json_flag(text: str, *, flag: str) -> Any:
    return _parse_json(text, flag=flag)


def read_input(raw: str | None, *, cwd: Path) -> dict[str, Any]:
    """`--input '{"a": 1}'` or `--input @file.json` → the input object."""
    if raw is None:
        return {}
    if raw.startswith("@"):
        path = (cwd / raw[1:]).resolve() if not Path(raw[1:]).is_absolute() else Path(raw[1:])
        if not path.is_file():
            raise _not_a_file("--input", path)
        try:
            text = path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"--input file {path} cannot be read: {exc}.") from None
        value = _parse_json(text, flag=f"--input file {path}")
    else:
        value = _parse_json(raw, flag="--input")
    if not isinstance(value, dict):
        raise InputError("--input must be a JSON object, like '{\"limit\": 10}'.")
    return value


def parse_value(text: str) -> Any:
    """`--set` values: JSON when they parse (numbers, true, lists…), else the string."""
    try:
        return _strict_loads(text)
    except _Unstorable as exc:
        raise InputError(f"--set {text[:40]}: {exc} (quote it: '\"{text[:40]}\"').") from None
    except ValueError:
        return text


def apply_set(target: dict[str, Any], assignment: str) -> None:
    """`a.b=v` sets target["a"]["b"] = v, creating objects along the way."""
    name, sep, raw = assignment.partition("=")
    parts = name.strip().split(".")
    if not sep or not all(parts):
        raise InputError(f"--set {assignment!r} must look like key=value or a.b=value.")
    node = target
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise InputError(f"--set {assignment!r}: {part!r} is already a value, not an object.")
        node = child
    node[parts[-1]] = parse_value(raw)


def _not_a_file(flag: str, path: Path) -> InputError:
    if path.is_dir():
        return InputError(f"{flag} {path} is a folder, not a file.")
    if path.exists():  # a pipe (`<(…)`, /dev/stdin), a device
        return InputError(
            f"{flag} {path} is not a regular file (a pipe or a device): a map reads its CSV more than once "
            "and a resume reads it again; save it to a file first."
        )
    return InputError(f"{flag} file {path} does not exist.")


def build_input(raw: str | None, csv: Path | None, assignments: list[str], *, cwd: Path) -> dict[str, Any]:
    value = read_input(raw, cwd=cwd)
    if csv is not None:
        path = csv if csv.is_absolute() else cwd / csv
        if not path.is_file():
            raise _not_a_file("--csv", path)
        value["csv"] = str(path.resolve())
    given: dict[tuple[str, ...], str] = {}  # each --set's path: a later one may not replace an object they built
    for assignment in assignments:
        keys = tuple(part.strip() for part in assignment.partition("=")[0].split("."))
        inside = next(
            (earlier for prefix, earlier in given.items() if prefix[: len(keys)] == keys and prefix != keys), None
        )
        if inside is not None:
            raise InputError(f"--set {assignment!r} would replace what --set {inside!r} gave; give one of them.")
        apply_set(value, assignment)
        given[keys] = assignment
    _check_text(value, "")
    return value


def _check_text(value: Any, where: str) -> None:
    """Every string of the input is valid Unicode text: a command-line argument that is not
    valid UTF-8 arrives as lone surrogates, which no JSON (nor any provider) can carry."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            name = f"input field {where!r}" if where else "the input"
            raise InputError(f"The value of {name} is not valid UTF-8 text.") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, where)
            _check_text(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_text(item, f"{where}[{index}]")
