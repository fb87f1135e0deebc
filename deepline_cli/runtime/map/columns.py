"""Columns of a map: resolvers, their options, and their fingerprints.

A cell is reused only while its fingerprint is unchanged. The fingerprint covers what the
resolver can see: its code (and the code of the play's own functions and modules it
uses, and the play's modules those import), the module-level values it reads as the
play's source writes them (`PROVIDER = "hunter"`, a scoring table: their statements, not
their current value, which may be a cache or a counter the play fills; followed into the
play's own module it imports them from), the plain data (text, numbers, and lists, sets,
tuples and dicts of them, by their members in no order; an Enum member, a compiled
pattern, a frozen dataclass: not times or other objects) of the closure it was made in,
of its default arguments, of a partial's arguments and of the object it is a method of,
the play's input (or only the fields the column declares it reads,
`depends_on`), and the versions of the declared tools it calls (a version bumped: its
answers change meaning; a tool id built at run time: every declared tool's). After a `:`,
the names of the columns before it, which its resolver sees in the row.

A fingerprint leaves the process (it is stored with every cell), so it never depends on
the process: names are walked in sorted order, sets by their sorted members, and nothing
is fed that holds a memory address, Python's per-process hash seed or the play file's
place (its module's name).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import hashlib
import importlib.util
import inspect
import math
import os
import re
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepline_cli import _json
from deepline_cli.errors import UsageError
from deepline_cli.runtime.calls.tool_calls import Staleness, checked_staleness
from deepline_cli.runtime.map.failures import is_play_file


@dataclass(frozen=True)
class Column:
    """A map column with options.

    `run_if(row)` or `run_if(row, index)`, sync or async: a false answer leaves None.
    `stale_after_seconds`: the cell is recomputed once older than this, and its tool calls
    are made fresh (a new paid call) where their answer is older too.
    `recompute=True`: the resolver runs on every run (its calls still hit their receipts).
    `depends_on`: the play-input fields the resolver reads (dotted paths); a cell computed
    under other values of them is not reused. None (the default): the whole input.
    """

    fn: Callable[..., Any]
    _: dataclasses.KW_ONLY  # `Column(fn, 3600)` would take 3600 for run_if: the options are named
    run_if: Callable[..., Any] | None = None
    stale_after_seconds: Staleness = None
    recompute_on_error: bool = False
    recompute: bool = False
    depends_on: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise UsageError(f"A column's resolver must be a function, not {type(self.fn).__name__}.")
        if self.run_if is not None and not callable(self.run_if):
            raise UsageError(f"Column(run_if=...) must be a function of the row, not {self.run_if!r}.")
        checked_staleness(self.stale_after_seconds, "Column(stale_after_seconds=...)")
        if self.depends_on is not None and (
            isinstance(self.depends_on, str) or not all(isinstance(f, str) for f in self.depends_on)
        ):
            raise UsageError("Column(depends_on=...) takes a list of input field names, like ['provider'].")

    def staleness(self, previous: Any) -> float | None:
        """The cell's time to live in seconds given its previous value (None: forever)."""
        ttl = self.stale_after_seconds
        if not callable(ttl):
            return ttl
        answer: float | None = checked_staleness(
            ttl(previous), "The stale_after_seconds function's answer", function=False
        )
        return answer

    def functions(self) -> list[Callable[..., Any]]:
        """The functions that decide what this column holds (not when it goes stale: a new
        time to live recomputes nothing)."""
        return [self.fn] if self.run_if is None else [self.fn, self.run_if]


@dataclass(frozen=True)
class ResolvedColumn:
    name: str
    column: Column
    fingerprint: str
    arity: int = 2  # the resolver takes (row) or (row, rc)
    run_if_arity: int = 1  # run_if takes (row) or (row, index)
    legacy: str = ""  # the fingerprint as cells stored before `:` came to it had it (same_fingerprint)


@dataclass
class _Walk:
    """One fingerprint being computed: the digest and what it has taken in already."""

    h: Any = field(default_factory=hashlib.sha256)
    seen: set[int] = field(default_factory=set)  # ids: within this process only, never fed
    # The functions held in data (`(find_hunter, find_apollo)`) whose walks this one is inside:
    # each such function is walked on its own (its digest the same whatever was walked before).
    inside: frozenset[int] = frozenset()


def resolve_columns(
    columns: Mapping[str, Callable[..., Any] | Column],
    play_input: Any = None,
    *,
    rows_path: str | None = None,
    cwd: str = "",
    tools: Mapping[str, str] | None = None,
    own_path: bool = True,
) -> list[ResolvedColumn]:
    """The map's columns with their fingerprints. `rows_path`: the file the map's rows come
    from, left out of the input a column is keyed on (each row's content is keyed already),
    however the input names it (relative ones from `cwd`, where the run started).
    `tools`: the declared tools' versions (a version bumped: the answers change meaning):
    a column's fingerprint has those its code names (all of them, if it calls a tool it does
    not name; none, if it calls none). `own_path`: the map reads `rows_path` itself (not
    through another map's rows, whose cells an earlier deepline keyed with that path)."""
    from deepline_cli.runtime.map.toolscan import calls_tools, string_constants

    every = _versions(tools) if tools is not None else None
    if not isinstance(columns, Mapping):
        raise UsageError(
            f"A map's columns must be a dict of column name → function, like {{'email': find_email}}, "
            f"not a {type(columns).__name__}."
        )
    resolved = []
    for position, (name, spec) in enumerate(columns.items()):
        column = spec if isinstance(spec, Column) else Column(spec)
        check_arity(column.fn, f"Column {name!r}'s function", "(row) or (row, rc)")
        if column.run_if is not None:
            check_arity(column.run_if, f"Column {name!r}'s run_if", "(row) or (row, index)")
        parts = [code_fingerprint(fn) for fn in column.functions()]
        parts += given_fewer(*column.functions())
        parts.append(input_fingerprint(play_input, column.depends_on, rows_path, cwd))
        then = parts if own_path else [*parts[:-1], input_fingerprint(play_input, column.depends_on, None, cwd)]
        legacy = _json.digest(*then, *([every] if every else []))[:16]  # every tool's versions
        if tools:
            named = set().union(*(string_constants(fn) for fn in column.functions())) & tools.keys()
            if named:
                parts.append(_versions({tool_id: tools[tool_id] for tool_id in named}))
            elif calls_tools(column.functions()) and every:
                parts.append(every)
        # The columns before it, which its resolver sees in the row: one moved after it or
        # taken out changes what it computes from (`same_fingerprint`).
        before = _json.digest(*list(columns)[:position])[:UPSTREAM_CHARS]
        resolved.append(
            ResolvedColumn(
                name,
                column,
                f"{_json.digest(*parts)[:16]}:{before}",
                arity(column.fn),
                arity(column.run_if) if column.run_if is not None else 1,
                legacy,
            )
        )
    return resolved


def _versions(tools: Mapping[str, str]) -> str:
    """A digest of tools' versions, the same in every process (ids in sorted order)."""
    return _json.digest(*(f"{tool_id}\0{version}" for tool_id, version in sorted(tools.items())))[:16]


UPSTREAM_CHARS = 8


def same_fingerprint(stored: str | None, column: ResolvedColumn) -> bool:
    """Is a cell stored under `stored` computed as the column would compute it now? Its
    code, inputs and the versions of the tools it calls (the first part), and the columns
    before it (after the `:`). A cell an earlier deepline stored (no `:`) is judged as it
    was then: by the fingerprint with every declared tool's versions (`legacy`)."""
    if stored == column.fingerprint:
        return True
    return stored is not None and ":" not in stored and stored == column.legacy


def input_fingerprint(
    play_input: Any, depends_on: Sequence[str] | None, rows_path: str | None = None, cwd: str = ""
) -> str:
    """The part of the play's input a column can see: all of it, or the declared fields."""
    if depends_on is None:
        seen = play_input if rows_path is None else _without_path(play_input, rows_path, cwd)
    else:
        seen = {path: _field(play_input, path) for path in sorted(depends_on)}
    return _data_digest(seen) or "?"


def _without_path(value: Any, rows_path: str, cwd: str) -> Any:
    """The input less the fields naming the map's CSV, however given (`--csv leads.csv`, an
    absolute path; `--set csv=leads.csv`, relative to where the run started; nested)."""
    if isinstance(value, dict):
        return {k: _without_path(v, rows_path, cwd) for k, v in value.items() if not _names_file(v, rows_path, cwd)}
    if isinstance(value, list):
        return [_without_path(v, rows_path, cwd) for v in value if not _names_file(v, rows_path, cwd)]
    return value


def _names_file(value: Any, rows_path: str, cwd: str) -> bool:
    """Does this input value name the file at `rows_path` (a relative one from `cwd`, the
    directory the run started in, as `ctx.csv` reads it)?"""
    if not isinstance(value, str) or not value or len(value) > 4096 or "\0" in value:
        return False
    return os.path.normpath(os.path.join(cwd, os.path.expanduser(value))) == os.path.normpath(rows_path)


def _field(value: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def code_fingerprint(fn: Any) -> str:
    """A digest of what a function does: its bytecode, constants and names, the play's own
    functions, classes and modules it uses (in the play file or a module next to it,
    however deep), and the plain data (JSON) it reads from its module or closure. Renaming a
    local variable or moving the function in the file does not change it."""
    walk = _Walk()
    _feed_value(walk, fn, top=True)
    return str(walk.h.hexdigest())


def _feed_value(walk: _Walk, value: Any, *, top: bool = False) -> None:
    parts = getattr(value, "__fingerprint__", None)
    if callable(parts) and not isinstance(value, type):  # a waterfall: its steps
        _tag(walk, type(value).__qualname__.encode())
        for part in parts():
            _feed_value(walk, part, top=callable(part))
    elif isinstance(value, functools.partial):
        _tag(walk, b"partial")
        _feed_value(walk, value.func, top=top)
        for arg in value.args:
            _feed_value(walk, arg)
        for name in sorted(value.keywords):
            _tag(walk, name.encode())
            _feed_value(walk, value.keywords[name])
    elif isinstance(value, types.MethodType):
        _feed_value(walk, value.__func__, top=top)
        owner = value.__self__
        _feed_class(walk, owner if isinstance(owner, type) else type(owner))  # what `self.other()` runs
        _feed_instance(walk, owner)  # `Enricher("hunter").via`: what it was made with
    elif isinstance(value, types.FunctionType):
        if top or is_play_file(value.__code__.co_filename):
            _feed_function(walk, value)
        elif (
            callable(wrapped := getattr(value, "__wrapped__", None)) and wrapped is not value
        ):  # a library's decorator on the play's function
            _feed_value(walk, wrapped)
    elif isinstance(value, type):
        _feed_class(walk, value)
    elif isinstance(value, types.ModuleType):
        _feed_module(walk, value)
    elif top and callable(value):
        call = getattr(type(value), "__call__", None)  # noqa: B004
        if isinstance(call, types.FunctionType):
            _tag(walk, _kind(value))
            _feed_value(walk, call, top=True)
            _feed_class(walk, type(value))
            _feed_instance(walk, value)
        else:
            _tag(walk, _kind(value))
    else:
        _feed_data(walk, value)


def _feed_function(walk: _Walk, fn: types.FunctionType) -> None:
    if id(fn) in walk.seen:  # each function: two a factory made share their code, not their closures
        return
    walk.seen.add(id(fn))
    code = fn.__code__
    _feed_code(walk, code)
    scope = fn.__globals__
    written = _bindings(scope.get("__file__"))
    for name in _names(code):
        if name not in scope or (name in _SET_BY_PYTHON and name not in written):
            continue  # `fn.__name__` reads an attribute, not the module's name (where the play sits)
        _tag(walk, name.encode())
        value = scope[name]
        if _is_code(value) or name not in written:
            _feed_value(walk, value)
            if isinstance(value, types.ModuleType) and name in written:
                _tag(walk, written[name])  # `import settings` and what this module sets on it
        else:
            _tag(walk, _as_written(scope, name))  # the statements that set it
    for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
        try:
            contents = cell.cell_contents
        except ValueError:  # a cell not filled yet
            continue
        _tag(walk, name.encode())
        _feed_value(walk, contents)
    for default in fn.__defaults__ or ():
        _feed_value(walk, default)
    for name in sorted(fn.__kwdefaults__ or {}):
        _tag(walk, name.encode())
        _feed_value(walk, (fn.__kwdefaults__ or {})[name])


# Module-level names Python sets itself: they say where the module was loaded from.
_SET_BY_PYTHON = frozenset(
    {"__name__", "__file__", "__spec__", "__loader__", "__package__", "__builtins__", "__cached__", "__path__"}
)


def _feed_instance(walk: _Walk, obj: Any) -> None:
    """An object a resolver is a method of (or a callable object): what it holds, by name.
    The run's own objects (`ctx.log` is a method of ctx) by what they are (see _feed_data)."""
    if isinstance(obj, type | types.ModuleType) or id(obj) in walk.seen:
        return
    if hasattr(type(obj), "__fingerprint_as__"):
        _tag(walk, _kind(obj))
        return
    walk.seen.add(id(obj))
    attributes = _attributes(obj)
    for name in sorted(attributes):
        _tag(walk, name.encode())
        _feed_value(walk, attributes[name])


def _attributes(obj: Any) -> dict[str, Any]:
    """An object's attributes by name: in its `__dict__`, and in the slots its classes declare."""
    found = dict(getattr(obj, "__dict__", None) or {})
    for cls in type(obj).__mro__:
        slots = vars(cls).get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__") and slot not in found and hasattr(obj, slot):
                found[slot] = getattr(obj, slot)
    return found


def _as_written(scope: Mapping[str, Any], name: str, seen: set[tuple[str, str]] | None = None) -> bytes:
    """The statements that set a module-level name, as written, with those setting the
    module's names they read (`RULES = {"min": MIN_LEN}`: MIN_LEN's too). One that imports
    it from a module of the play's own (`from settings import PROVIDER`) is followed there:
    the value is set in that module's source, which an edit changes."""
    seen = set() if seen is None else seen
    file = str(scope.get("__file__"))
    if (file, name) in seen:
        return b""
    seen.add((file, name))
    origin = _imported_from(scope, name)
    if origin is not None:
        module, attr = origin
        if attr in _source(getattr(module, "__file__", None)).bound:
            return _as_written(vars(module), attr, seen)
    here = _source(scope.get("__file__"))
    parts = [here.bound.get(name, b"")]
    for used in sorted(here.reads.get(name, ())):
        value = scope.get(used)
        source = getattr(value, "__file__", None) if isinstance(value, types.ModuleType) else None
        if source and is_play_file(source) and (source, "") not in seen:  # `TIER = settings.TIER`
            seen.add((source, ""))
            parts.append(Path(source).read_bytes())
        if used != name and used in here.bound:
            parts.append(used.encode() + b"\0" + _as_written(scope, used, seen))
    return b"\n".join(parts)


def _imported_from(scope: Mapping[str, Any], name: str) -> tuple[types.ModuleType, str] | None:
    """The module (already imported) and name a module-level `name` was imported from."""
    found = _source(scope.get("__file__")).imported.get(name)
    if found is None:
        return None
    relative, attr = found
    try:
        module = sys.modules.get(importlib.util.resolve_name(relative, scope.get("__package__")))
    except (ImportError, ValueError):
        return None
    return (module, attr) if module is not None else None


def _feed_class(walk: _Walk, cls: type) -> None:
    """A class of the play's own: its methods (in name order)."""
    if id(cls) in walk.seen or not _is_play_object(cls):
        return
    walk.seen.add(id(cls))
    _tag(walk, cls.__qualname__.encode())
    for base in cls.__mro__[1:]:  # what it inherits from classes of the play's own
        _feed_class(walk, base)
    for name in sorted(vars(cls)):
        member = vars(cls)[name]
        if isinstance(member, staticmethod | classmethod):
            member = member.__func__
        if isinstance(member, types.FunctionType):
            _tag(walk, name.encode())
            _feed_function(walk, member)
    # …and its body as written: class attributes (`TIER = "gold"`, an Enum's members)
    _tag(walk, _source(inspect.getfile(cls)).bound.get(cls.__name__, b""))


def _feed_module(walk: _Walk, module: types.ModuleType) -> None:
    file = getattr(module, "__file__", None)
    if id(module) in walk.seen or not file or not is_play_file(file):
        return
    walk.seen.add(id(module))
    walk.h.update(Path(file).read_bytes())
    # …and the play's own modules it imports (`import settings` in scoring.py), however deep
    scope = vars(module)
    for name, value in sorted(scope.items()):
        if isinstance(value, types.ModuleType):
            _feed_module(walk, value)
        elif (origin := _imported_from(scope, name)) is not None:  # `from settings import MIN`
            _feed_module(walk, origin[0])


def _feed_data(walk: _Walk, value: Any) -> None:
    """A value not written in the play's source (a closure's, a default argument's, a
    partial's, an object's attribute): its content when it is plain and the same in every
    process — text, numbers, None, and tuples, frozensets and dicts of them (a config dict).
    Sets and lists count by their members in no order (a list made from a set is in the hash
    seed's order): an edit of them is seen, not a reordering. What cannot change, by what it
    holds: an Enum member, a compiled pattern, a frozen dataclass. Anything else by its type
    only: a time, a client, a lock, an object (whose state may change as the play runs)."""
    if _feed_fixed(walk, value):
        return
    digest = _content_digest(value)
    _tag(walk, digest.encode() if digest else _kind(value))
    if digest is None:  # objects of the play's own classes, alone or in a list or dict: their classes' code
        # (not their attributes: an object's state changes as the play runs); the play's own
        # functions in it (`(find_hunter, find_apollo)`): their code, closures and defaults. In the
        # order of their digests (classes a factory made share a name; a set has no order of its own).
        classes, functions = _play_code(value)
        digests = [_class_digest(cls) for cls in classes]
        for fn in functions:
            if id(fn) in walk.inside:  # it holds itself (through this value): taken in already
                continue
            inner = _Walk(inside=walk.inside | {id(fn)})
            _feed_function(inner, fn)
            digests.append(inner.h.digest())
        for each in sorted(digests):
            _tag(walk, each)


def _content_digest(value: Any) -> str | None:
    """Plain data's digest, in no order (None: not plain, or nested deeper than JSON goes)."""
    if not _plain(value):
        return None
    try:
        return _data_digest(_unordered(value))
    except (TypeError, RecursionError):
        return None


def _feed_fixed(walk: _Walk, value: Any) -> bool:
    """A value that cannot change, by what it holds (an Enum member, a compiled pattern, a
    frozen dataclass): fed, True; else False."""
    if isinstance(value, enum.Enum):
        _tag(walk, _kind(value) + value.name.encode())
    elif isinstance(value, re.Pattern):
        _tag(walk, _kind(value) + repr(value.pattern).encode() + str(int(value.flags)).encode())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type) and value.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        _tag(walk, _kind(value))
        for each in dataclasses.fields(value):
            _tag(walk, each.name.encode())
            _feed_value(walk, getattr(value, each.name))
    else:
        return False
    _feed_class(walk, type(value))  # a class of the play's own: its code
    return True


PLAY_CLASS_LOOKS = 2000  # values a scan for objects looks at: a list of rows is data, not code


def _play_code(value: Any) -> tuple[set[type], list[types.FunctionType]]:
    """The classes of the play's own whose objects `value` is or holds (`[Hunter(), Apollo()]`),
    and the play's own functions it holds, at most PLAY_CLASS_LOOKS values looked at, each
    container once (a tree with parent links)."""
    found: set[type] = set()
    functions: list[types.FunctionType] = []
    judged: dict[type, str] = {types.FunctionType: "function"}  # "mapping", "items" (a list, a set…), "own"…
    seen: set[int] = set()
    stack, left = [value], PLAY_CLASS_LOOKS
    while stack and left > 0:
        item = stack.pop()
        left -= 1
        kind = type(item)
        judgement = judged.get(kind)
        if judgement is None:
            judgement = judged[kind] = _judged(kind)
        if judgement == "own":
            found.add(kind)
        elif judgement == "function":
            if is_play_file(item.__code__.co_filename) and id(item) not in seen:
                seen.add(id(item))
                functions.append(item)
        elif judgement != "other" and id(item) not in seen:  # a defaultdict, a namedtuple: looked into too
            seen.add(id(item))
            stack.extend(item.values() if judgement == "mapping" else item)
    return found, functions


def _judged(kind: type) -> str:
    if issubclass(kind, dict):
        return "mapping"
    if issubclass(kind, list | tuple | set | frozenset):
        return "items"
    if kind in _PLAIN_TYPES or not _is_play_object(kind):
        return "other"
    return "own"


def _class_digest(cls: type) -> bytes:
    """What a class's code is, as a fingerprint of its own."""
    walk = _Walk()
    _feed_class(walk, cls)
    return walk.h.digest()  # type: ignore[no-any-return]


_PLAIN_TYPES = frozenset({str, int, float, bool, type(None), bytes})


def _kind(value: Any) -> bytes:
    """What a value is, by its type: the run's own objects (ctx, ctx.tools, a Dataset) by the
    name they give (`__fingerprint_as__`: the same in a run and in `deepline plan`)."""
    kind = type(value)
    module = kind.__module__
    if module.startswith(PLAY_MODULE_PREFIX):  # the play file's: named after where it sits
        module = "play"
    return f"<{getattr(kind, '__fingerprint_as__', None) or f'{module}.{kind.__qualname__}'}>".encode()


PLAY_MODULE_PREFIX = "deepline_play_"  # a play file's module name (runtime/run/play.py, load_module)


def _unordered(value: Any) -> Any:
    """Plain data as JSON with its tuples and frozensets as sorted lists: a tuple made from a
    set (`tuple({"email", "phone"})`) is in the hash seed's order. (A reordered tuple is not
    seen: its content is.) NaN and infinities, which JSON has not, are written as text."""
    if isinstance(value, tuple | frozenset | set | list):
        if all(type(v) is str for v in value):  # text only: its own order is the same everywhere
            return sorted(value)
        return sorted((_unordered(v) for v in value), key=_json.canonical)
    if isinstance(value, dict):
        return {k: _unordered(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return f"<float {value!r}>"
    return value


def _plain(value: Any) -> bool:
    """Is `value` plain data all through? (A container that holds itself, a tree with parent
    links, or one nested deeper than Python's recursion limit, is not.)"""
    try:
        return _plain_within(value, set())
    except RecursionError:
        return False


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _plain_within(value: Any, within: set[int]) -> bool:
    """`_plain`, `within` the containers it is inside (their ids)."""
    if type(value) in _SCALARS or isinstance(value, bool | int | float | str):
        return True
    if id(value) in within:
        return False
    if type(value) is dict:
        if not all(isinstance(k, str) for k in value):
            return False
        items: Any = value.values()
    elif isinstance(value, tuple | frozenset | set | list):
        items = value
    else:  # a dict of another kind (a defaultdict), an object: not plain
        return False
    if all(type(v) in _SCALARS for v in items):  # a list of domains, a config of settings: at C speed
        return True
    within.add(id(value))
    try:
        return all(_plain_within(v, within) for v in items)
    finally:
        within.discard(id(value))


def _is_code(value: Any) -> bool:
    return isinstance(value, types.FunctionType | types.MethodType | types.ModuleType | type | functools.partial)


def _bindings(file: str | None) -> dict[str, bytes]:
    """For a play file: each module-level name and the source of the statements binding it."""
    return _source(file).bound


@dataclass(frozen=True)
class _Module:
    """A play module's source, read for fingerprints: what binds each module-level name
    (its statements, dumped), the names it imports from where, and the names each binding
    reads."""

    bound: dict[str, bytes] = field(default_factory=dict)
    imported: dict[str, tuple[str, str]] = field(default_factory=dict)
    reads: dict[str, frozenset[str]] = field(default_factory=dict)


def _source(file: str | None) -> _Module:
    if not file or not is_play_file(file):
        return _Module()
    try:
        stat = os.stat(file)
    except OSError:
        return _Module()
    return _parsed(file, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _parsed(file: str, mtime_ns: int, size: int) -> _Module:
    try:
        tree = ast.parse(Path(file).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return _Module()
    bound: dict[str, list[bytes]] = {}
    imported: dict[str, tuple[str, str]] = {}
    reads: dict[str, set[str]] = {}
    for node in tree.body:
        names = _bound_names(node)
        if names:
            dumped = ast.dump(node).encode()
            loaded = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            for name in names:
                bound.setdefault(name, []).append(dumped)
                reads.setdefault(name, set()).update(loaded)
        for inner in ast.walk(node):  # at module level, or in a `try` / `if` there
            if isinstance(inner, ast.ImportFrom):
                for alias in inner.names:
                    imported[alias.asname or alias.name] = ("." * inner.level + (inner.module or ""), alias.name)
    return _Module(
        {name: b"\n".join(parts) for name, parts in bound.items()},
        imported,
        {name: frozenset(used) for name, used in reads.items()},
    )


def _bound_names(node: ast.stmt) -> list[str]:
    """The module-level names a statement binds: assigned, imported, defined, or set inside
    an `if`, `try`, `with` or loop at module level (`if PROD: LABEL = … else: LABEL = …`)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):  # `RULES.update(tier="gold")`
        target = node.value.func
        while isinstance(target, ast.Attribute | ast.Subscript):
            target = target.value
        return [target.id] if isinstance(target, ast.Name) and target is not node.value.func else []
    if isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
        return sorted({name for inner in ast.walk(node) if isinstance(inner, ast.stmt) and inner is not node
                       for name in _bound_names(inner)})  # fmt: skip
    if isinstance(node, ast.Assign):
        targets: list[ast.expr] = list(node.targets)
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    elif isinstance(node, ast.Import | ast.ImportFrom):
        return [(alias.asname or alias.name).split(".")[0] for alias in node.names]
    else:
        return []
    return [n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)]


def _data_digest(value: Any) -> str | None:
    if isinstance(value, set | frozenset):
        value = sorted(_data_digest(v) or "?" for v in value)
    try:
        return hashlib.sha256(_json.canonical(value)).hexdigest()
    except TypeError:
        return None


def _is_play_object(value: Any) -> bool:
    try:
        return is_play_file(inspect.getfile(value))
    except (TypeError, OSError):
        return False


def _tag(walk: _Walk, data: bytes) -> None:
    walk.h.update(len(data).to_bytes(4, "big") + data)


def _names(code: types.CodeType) -> list[str]:
    """The global names a function and the functions nested in it use, sorted."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(_names(const))
    return sorted(names)


def _feed_code(walk: _Walk, code: types.CodeType) -> None:
    _tag(walk, code.co_code)
    _tag(walk, repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _feed_code(walk, const)
        else:
            _tag(walk, _stable_repr(const).encode())


def _stable_repr(const: Any) -> str:
    """A constant's repr, with sets (`x in {"a", "b"}` compiles to a frozenset, whose order
    follows the hash seed) written in sorted order."""
    if isinstance(const, frozenset | set):
        return "{" + ", ".join(sorted(_stable_repr(c) for c in const)) + "}"
    if isinstance(const, tuple):
        return "(" + ", ".join(_stable_repr(c) for c in const) + ")"
    return repr(const)


def arity(fn: Callable[..., Any]) -> int:
    """How many positional arguments `fn` is given: 1 (the row) or 2 (the row, and `rc` or
    the row's index): 2 when it takes them without a default, or any number, or names its
    second `rc` or `index` (`def enrich(row, rc=None)`). Another parameter with a default
    keeps it: `def has(row, field="domain")`, a column made in a loop (`lambda row, p=p: …`)."""
    positional = _positional(fn)
    if positional is None:
        return 2
    required = _required(positional)
    if required < 2 and len(positional) > 1 and positional[1].name in ("rc", "index"):
        return 2
    return max(1, required)


def check_arity(fn: Callable[..., Any], what: str, given: str) -> None:
    """Refuse, before any row, a function that cannot take what it is given (`given`: "(row)
    or (row, rc)"): every row would fail with a TypeError that names no line of the play."""
    positional = _positional(fn)
    if positional is None:
        return
    required = _required(positional)
    if 1 <= required <= 2 or (required == 0 and positional):
        return
    code = getattr(fn, "__code__", None)
    place = f" ({Path(code.co_filename).name} line {code.co_firstlineno})" if code is not None else ""
    takes = "no argument" if not positional else f"{required} arguments"
    raise UsageError(f"{what}{place} takes {takes}; it is given {given}.")


def _required(positional: list[inspect.Parameter]) -> int:
    """How many of these parameters have no default."""
    return sum(1 for p in positional if p.default is p.empty)


def _given_before(fn: Callable[..., Any]) -> int:
    """How many arguments an earlier deepline gave `fn`: the row alone when it took exactly
    one positional parameter, defaults counted; else the row and rc (or the index)."""
    positional = _positional(fn)
    return 1 if positional is not None and len(positional) == 1 else 2


def _positional(fn: Callable[..., Any]) -> list[inspect.Parameter] | None:
    """`fn`'s positional parameters; None when it takes any number (or has no signature)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None
    return [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def given_fewer(*fns: Callable[..., Any] | None) -> list[str]:
    """Fingerprint parts for the functions given fewer arguments than an earlier deepline
    gave them (a parameter with a default keeps it now): their cells, computed with the
    row's index or rc in them, are computed again."""
    return [f"given {arity(fn)}" for fn in fns if fn is not None and min(arity(fn), 2) != _given_before(fn)]
