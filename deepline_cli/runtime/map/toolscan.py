"""Which tools a column resolver may call, read from its code without running it.

The tool ids a resolver names appear as string constants in its bytecode, or in the
bytecode of the play's own functions it calls (in its file or a module next to it, by
name or as `helpers.fn`, and through closures, however deep). What the scan cannot see: a tool id built at run
time (`f"finder.{name}"`), and how many times a loop calls a tool; `deepline plan`
says its bound assumes each tool at most once per row and column.

`deepline check` wants the ids a play calls, not every string that looks like one (a
domain, a file name): `called_tools` reads them from the source, where a call
`….tools.execute(id, "vendor.tool", …)` names its tool as a literal.
"""

from __future__ import annotations

import ast
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from deepline_cli.runtime.map.columns import Column
from deepline_cli.runtime.map.failures import is_play_file


def string_constants(fn: Any) -> list[str]:
    """Every string constant of `fn` and the play functions it reaches, in code order."""
    seen: set[int] = set()
    found: dict[str, None] = {}
    for text in _walk(fn, seen):
        found.setdefault(text, None)
    return list(found)


def runs_child_plays(fns: list[Any]) -> bool:
    """Whether `fns`, or the play functions they reach, call `run_play` (a child play, whose
    calls only a real run can tell)."""
    return any("run_play" in _walk(fn, set(), _names) for fn in fns)


def calls_tools(fns: list[Any]) -> bool:
    """Whether `fns`, or the play functions they reach, call a tool at all (`tools.execute`,
    with an id the scan may not see: one built at run time)."""
    return any("execute" in _walk(fn, set(), _names) for fn in fns)


def tool_ids(fns: list[Any], is_tool: Callable[[str], bool]) -> list[str]:
    """The tool ids `fns` name, in the order they appear (the first is a waterfall's first)."""
    found: dict[str, None] = {}
    for fn in fns:
        for text in string_constants(fn):
            if is_tool(text):
                found.setdefault(text, None)
    return list(found)


def _is_waterfall(fn: Any) -> bool:
    return callable(getattr(fn, "__fingerprint__", None)) and not isinstance(fn, type)


def _walk(fn: Any, seen: set[int], take: Callable[[types.CodeType], Iterator[str]] | None = None) -> Iterator[str]:
    """What `take` reads of the code of `fn` and of the play functions it reaches: its
    string constants (by default), or the names it uses."""
    take = take or _code_strings
    if _is_waterfall(fn):  # its steps, in order
        for part in fn.__fingerprint__():
            if callable(part):
                yield from _walk(part, seen, take)
        return
    code = getattr(fn, "__code__", None)
    if code is None:
        code = getattr(getattr(fn, "__call__", None), "__code__", None)  # noqa: B004 - a callable object
    if not isinstance(code, types.CodeType) or id(fn) in seen:
        return
    seen.add(id(fn))
    module = getattr(fn, "__module__", None)
    namespace = getattr(fn, "__globals__", {})
    yield from take(code)
    names = list(dict.fromkeys(_names(code)))
    for name in names:
        value = namespace.get(name)
        if isinstance(value, types.ModuleType):  # `helpers.find_email`: a module of the play's own
            values = [getattr(value, attr, None) for attr in names] if _own(value) else []
        else:
            values = list(value.values()) if isinstance(value, dict) else [value]
        # The play's own functions (its file's, or a module's next to it), and the columns
        # and waterfalls it built (their classes are deepline's), alone or in a dict of columns.
        for found in values:
            if isinstance(found, Column):
                yield from _walk(found.fn, seen, take)
                if found.run_if is not None:
                    yield from _walk(found.run_if, seen, take)
            elif callable(found) and (
                getattr(found, "__module__", None) == module or _is_waterfall(found) or _own(found)
            ):
                yield from _walk(found, seen, take)
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(value):
            yield from _walk(value, seen, take)


def _own(value: Any) -> bool:
    """A function or module of the play's own: in its file or a module next to it."""
    code = getattr(value, "__code__", None)
    file = code.co_filename if isinstance(code, types.CodeType) else getattr(value, "__file__", None)
    return isinstance(file, str) and is_play_file(file)


def _code_strings(code: types.CodeType) -> Iterator[str]:
    for const in code.co_consts:
        if isinstance(const, str):
            yield const
        elif isinstance(const, types.CodeType):
            yield from _code_strings(const)
        elif isinstance(const, tuple):
            yield from (c for c in const if isinstance(c, str))
        elif isinstance(const, frozenset):  # its order follows the hash seed: sorted
            yield from sorted(c for c in const if isinstance(c, str))


def _names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def called_tools(path: Path) -> list[tuple[str, int]]:
    """(tool id, line) of each `tools.execute(id, "tool", …)` in a source file whose tool
    is a string literal (`rc.tools.execute`, `ctx.tools.execute`, `tools.execute`)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return []  # not readable here: the play loaded, so this is a module the scan skips
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_tools_execute(node.func):
            tool = (
                node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "tool"), None)
            )
            if isinstance(tool, ast.Constant) and isinstance(tool.value, str):
                found.append((tool.value, node.lineno))
    return sorted(found, key=lambda f: f[1])


def _is_tools_execute(func: ast.expr) -> bool:
    if not isinstance(func, ast.Attribute) or func.attr != "execute":
        return False
    owner = func.value
    return (isinstance(owner, ast.Attribute) and owner.attr == "tools") or (
        isinstance(owner, ast.Name) and owner.id == "tools"
    )
