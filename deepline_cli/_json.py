"""JSON in one place: orjson, canonical form for digests, and a safe fallback."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

_OPTS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def _default(value: Any) -> Any:
    # Sets and tuples-in-odd-places become lists; anything else is shown by repr so a
    # play returning an odd object still produces a readable result instead of crashing.
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    if hasattr(value, "to_json"):
        return value.to_json()
    return repr(value)


def dumps(value: Any) -> bytes:
    return orjson.dumps(value, default=_default, option=_OPTS)


def dumps_str(value: Any) -> str:
    return dumps(value).decode()


def loads(data: bytes | str | None) -> Any:
    if data is None:
        return None
    return orjson.loads(data)


def canonical(value: Any) -> bytes:
    """Sorted keys, no whitespace: equal inputs give equal bytes (the receipt key)."""
    return orjson.dumps(value, default=_default, option=_OPTS | orjson.OPT_SORT_KEYS)


def digest(*parts: str | bytes) -> str:
    """A hex SHA-256 over length-prefixed parts, so ("ab","c") != ("a","bc")."""
    raws = [part.encode() if isinstance(part, str) else part for part in parts]
    framed = b"".join(len(raw).to_bytes(8, "big") + raw for raw in raws)
    return hashlib.sha256(framed).hexdigest()
