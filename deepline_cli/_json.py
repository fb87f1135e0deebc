"""JSON in one place: orjson, canonical form for digests, and a safe fallback."""

from __future__ import annotations

import functools
import hashlib
import math
import sys
from typing import Any

import orjson

_OPTS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def _default(value: Any) -> Any:
    # As `plain` writes data; anything else is shown by repr, so a tool's odd answer (paid
    # for) is still recorded instead of crashing.
    try:
        return _plain_default(value)
    except TypeError:
        pass
    try:
        return repr(value)
    except Exception:  # a repr that fails must not keep a paid answer from being recorded
        return f"<{type(value).__name__}>"


def decimal_number(value: Any) -> int | float | None:
    """A Decimal (money parsed from a CSV, a database driver's numeric) as the JSON number it
    is; None for anything else. `decimal` is looked up, not imported: whoever made a Decimal
    imported it, and a run that has none does not pay for the import."""
    decimal = sys.modules.get("decimal")
    if decimal is None or not isinstance(value, decimal.Decimal):
        return None
    return int(value) if value.is_finite() and value == value.to_integral_value() else float(value)


def dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value, default=_default, option=_OPTS)
    except orjson.JSONEncodeError as refused:
        try:
            return _dumps_mended(value)
        except orjson.JSONEncodeError as deep:
            if "Recursion limit" not in str(deep):
                raise
            return _dumps_deep(value)  # nested deeper than orjson writes (254): Python's json does
        except (RecursionError, ValueError):  # a value that holds itself: no JSON form at all
            raise refused from None


def _dumps_deep(value: Any) -> bytes:
    """A value nested deeper than orjson writes (a provider's answer 300 levels deep, paid
    for): written by Python's json, which orjson reads back (up to 1,024 levels)."""
    import json  # only for these rare values

    try:
        data = json.dumps(_mend(value), default=_default, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (RecursionError, ValueError) as exc:
        raise TypeError(f"a value nested too deep to store ({exc})") from None
    return data.encode()


def _dumps_mended(value: Any) -> bytes:
    """What orjson refuses, written as JSON can hold it, never refused: an answer a provider
    was paid for must be recorded. Text with a lone surrogate (half an emoji, as Python's
    json reads a cut string) keeps U+FFFD in its place; an integer past 64 bits is the
    float it is read back as. Then written as any value is (dates, UUIDs as orjson writes them)."""
    return orjson.dumps(_mend(value), default=_default, option=_OPTS)


_FLOAT_MAX = int(sys.float_info.max)


def _mend(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if type(value) is int and not -(2**63) <= value < 2**64:
        # As it is read back once stored (a live answer is the replayed one): the float it
        # is, or, past what a float holds (a 400-digit number), null as Infinity is.
        return float(value) if -_FLOAT_MAX <= value <= _FLOAT_MAX else None
    if type(value) is float and not math.isfinite(value):
        return None  # as orjson writes NaN and Infinity
    if isinstance(value, dict):
        return {_mend_key(k): _mend(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_mend(v) for v in value]
    return value


def plain(value: Any, what: str) -> Any:
    """`value` as the JSON it is stored as, for a value the play computed (a cell, a step):
    an object with no JSON form is refused (a UsageError naming `what`), not stored as its
    repr ("<Thing object at 0x7f…>"), which holds nothing and changes every run."""
    try:
        data = orjson.dumps(value, default=_plain_default, option=_OPTS)
    except orjson.JSONEncodeError as exc:
        keyed = "Dict key" in str(exc)  # a key that is no text, number, bool or None
        if "not JSON serializable" not in str(exc) and not keyed:
            return loads(dumps(value))  # text or a number JSON cannot hold as it is: mended
        from deepline_cli.errors import UsageError

        found = "dict keyed by an object" if keyed else str(exc).rpartition(": ")[2]
        if found == "coroutine":
            found = "coroutine (an `await` missing before a ctx or rc call?)"
        raise UsageError(
            f"{what} holds a {found}, which has no JSON form: return data (a dict, list, text, number, "
            "True/False or None), or give the class a to_json() method."
        ) from None
    return orjson.loads(data)


def _plain_default(value: Any) -> Any:
    """Sets become lists, a Decimal a number, an object with `to_json` its JSON; anything
    else has no JSON form (TypeError)."""
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    number = decimal_number(value)
    if number is not None:  # past 64 bits, as an int is stored (the float it is, or null)
        return _mend(number) if type(number) is int else number
    if hasattr(value, "to_json"):
        return value.to_json()
    raise TypeError


def as_is(value: Any) -> bool:
    """Does JSON keep `value` as it is, stored and read back (checked without writing it)?
    None, True/False, ASCII text (other text may hold a lone surrogate), a 64-bit integer."""
    kind = type(value)
    if value is None or kind is bool or (kind is str and value.isascii()):
        return True
    return kind is int and -(2**63) <= value < 2**64


def as_stored(value: Any) -> Any:
    """`value` as a receipt gives it back once stored (a set or tuple a list, a date its text,
    NaN None): a local tool's answer live is the one every replay of it gives."""
    return value if as_is(value) else orjson.loads(dumps(value))


def dumps_str(value: Any) -> str:
    return dumps(value).decode()


def loads(data: bytes | str | None) -> Any:
    if data is None:
        return None
    return orjson.loads(data)


def _mend_key(key: Any) -> Any:
    if isinstance(key, str):
        return _mend(key)
    return key if key is None or isinstance(key, int | float) else str(key)


def loads_lenient(data: bytes | str) -> Any:
    """A provider's JSON, read as Python's json reads it where orjson is stricter (an escaped
    lone surrogate, NaN, an integer past 64 bits), then mended as `dumps` would record it:
    the answer the play gets live is the one a replay gives. ValueError if it is no JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        import json  # only for these rare bodies

        return _mend(json.loads(data))


def canonical(value: Any) -> bytes:
    """Sorted keys, no whitespace: equal inputs give equal bytes (receipt and row keys).

    JSON only, so a key never depends on memory (an object's repr holds its address) and
    two different inputs never meet: a value with no JSON form, a key that is not a
    string ({1: …} would meet {"1": …}) or NaN/Infinity (written as null) raise TypeError.
    """
    try:
        data = orjson.dumps(value, default=_to_json, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as exc:
        raise TypeError(_plain(str(exc))) from None
    if b"null" in data and not _finite(value):
        raise TypeError("NaN and Infinity are not JSON")
    return data


def _plain(message: str) -> str:
    """orjson's reason in the words of the error deepline shows."""
    if message.startswith("Type is not JSON serializable: "):
        return f"a value of type {message.rpartition(': ')[2]} is not JSON"
    if message == "Dict key must be str":
        return "a key that is not a string is not JSON"
    return message


def _to_json(value: Any) -> Any:
    number = decimal_number(value)
    if number is not None:
        return number
    if hasattr(value, "to_json"):  # a ToolResult, a Dataset…
        return value.to_json()
    raise TypeError(f"a value of type {type(value).__name__} is not JSON")


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_finite(v) for v in value)
    return True


def digest(*parts: str | bytes) -> str:
    """A hex SHA-256 over length-prefixed parts, so ("ab","c") != ("a","bc")."""
    return hashlib.sha256(b"".join([_frame(part) for part in parts])).hexdigest()


class Digest:
    """`digest(*head, middle, *tail)` for a head and a tail asked with many middles (a tool's
    receipt keys: its run's workspace and play, its id, auth and version around each input):
    the head hashed once, each key hashing only its middle and the tail after it."""

    __slots__ = ("_head", "_tail")

    def __init__(self, head: tuple[str, ...], tail: tuple[str, ...]) -> None:
        self._head = hashlib.sha256(b"".join([_frame(part) for part in head]))
        self._tail = b"".join([_frame(part) for part in tail])

    def of(self, middle: bytes) -> str:
        hashed = self._head.copy()
        hashed.update(_frame(middle) + self._tail)
        return hashed.hexdigest()


def _frame(part: str | bytes) -> bytes:
    """A part with its length before it (`digest`'s framing)."""
    return _framed(part) if isinstance(part, str) else len(part).to_bytes(8, "big") + part


@functools.lru_cache(maxsize=4096)
def _framed(part: str) -> bytes:
    """A text part with its length before it: the same few (a workspace, a play, a tool)
    come in every key, so each is framed once."""
    raw = part.encode()
    return len(raw).to_bytes(8, "big") + raw
