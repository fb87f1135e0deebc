"""Columns of a map: resolvers, their options, and their code fingerprints."""

from __future__ import annotations

import hashlib
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepline_cli.runtime.failures import is_play_file


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
    """A digest of what a resolver does: its bytecode, constants and names, and those of
    the play's own functions it calls (in the play file or a module next to it, however
    deep), so a changed helper recomputes the cells that use it. Renaming a local
    variable or moving the function in the file does not."""
    code = getattr(fn, "__code__", None)
    if code is None and getattr(getattr(fn, "__call__", None), "__code__", None) is None:  # noqa: B004
        return f"{type(fn).__module__}.{type(fn).__qualname__}"
    h = hashlib.sha256()
    _feed_function(h, fn if code is not None else fn.__call__, set())
    return h.hexdigest()


def _feed_function(h: Any, fn: Any, seen: set[int]) -> None:
    code: types.CodeType = fn.__code__
    if id(code) in seen:
        return
    seen.add(id(code))
    _feed(h, code)
    names = _names(code)
    scope = getattr(fn, "__globals__", {})
    refs = [scope[name] for name in names if name in scope]
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            refs.append(cell.cell_contents)
        except ValueError:  # a cell not filled yet
            continue
    for value in refs:
        _feed_reference(h, value, seen)


def _feed_reference(h: Any, value: Any, seen: set[int]) -> None:
    """A function or module of the play's own that a resolver uses goes into its digest."""
    if isinstance(value, types.FunctionType) and is_play_file(value.__code__.co_filename):
        _feed_function(h, value, seen)
    elif isinstance(value, types.ModuleType) and id(value) not in seen:
        file = getattr(value, "__file__", None)
        if file and is_play_file(file):
            seen.add(id(value))
            h.update(Path(file).read_bytes())


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _feed(h: Any, code: types.CodeType) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _feed(h, const)
        else:
            h.update(repr(const).encode())
