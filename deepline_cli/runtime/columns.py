"""Columns of a map: resolvers, their options, and their code fingerprints."""

from __future__ import annotations

import hashlib
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Column:
    """A map column with options: `Column(fn, run_if=..., stale_after_seconds=...)`."""

    fn: Callable[..., Any]
    run_if: Callable[[Mapping[str, Any]], Any] | None = None
    stale_after_seconds: float | None = None
    recompute_on_error: bool = False


@dataclass(frozen=True)
class ResolvedColumn:
    name: str
    column: Column
    fingerprint: str


def resolve_columns(columns: Mapping[str, Callable[..., Any] | Column]) -> list[ResolvedColumn]:
    resolved = []
    for name, spec in columns.items():
        column = spec if isinstance(spec, Column) else Column(spec)
        parts = [_code_fingerprint(column.fn)]
        if column.run_if is not None:
            parts.append(_code_fingerprint(column.run_if))
        resolved.append(ResolvedColumn(name, column, hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]))
    return resolved


def _code_fingerprint(fn: Any) -> str:
    """A digest of what a resolver does: its bytecode, constants and names (recursively).

    Changing a column's code recomputes its cells; renaming a local variable or moving
    the function in the file does not.
    """
    code = getattr(fn, "__code__", None)
    if code is None:
        inner = getattr(fn, "__call__", None)  # noqa: B004 - a callable object
        code = getattr(inner, "__code__", None)
    if code is None:
        return f"{type(fn).__module__}.{type(fn).__qualname__}"
    h = hashlib.sha256()
    _feed(h, code)
    return h.hexdigest()


def _feed(h: Any, code: types.CodeType) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _feed(h, const)
        else:
            h.update(repr(const).encode())
