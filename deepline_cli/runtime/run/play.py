"""Plays: the `@play` decorator and loading a play from `path.py[:function]`."""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from deepline_cli import _json
from deepline_cli.errors import InputError, PlayLoadError, UsageError
from deepline_cli.runtime.map.columns import PLAY_MODULE_PREFIX
from deepline_cli.runtime.map.failures import is_play_file
from deepline_cli.runtime.run.play_input import how_to_give
from deepline_cli.runtime.run.schema import Schema, SchemaDefinitionError, compile_schema, violation
from deepline_cli.runtime.run.triggers import Schedule, schedule_of

F = TypeVar("F", bound=Callable[..., Any])
BUILTIN_PREFIX = "builtin:"
_SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class PlayDef:
    """A play as `@play` declared it: its function, its file, and what is checked before
    anything runs (the input schema, the secrets it needs, its budget)."""

    name: str
    description: str
    fn: Callable[..., Any]
    file: str = ""
    input_schema: Schema | None = None  # JSON-Schema form of `@play(input=...)`
    secrets: tuple[str, ...] = ()  # names that must be set before the run makes any call
    max_credits_per_run: float | None = None  # the budget when --max-credits is not given
    builtin: bool = False  # shipped with deepline (runtime/builtin.py), found by name
    schedule: Schedule | None = None  # fired by `deepline worker --play FILE`
    webhook_secret: str | None = None  # the secret's name: `deepline serve` checks deliveries with it

    @property
    def function(self) -> str:
        return str(self.fn.__name__)

    @property
    def ref(self) -> str:
        """`/abs/path.py:function` (`builtin:NAME` for a built-in play): how a resume finds
        the play again."""
        return f"{BUILTIN_PREFIX}{self.name}" if self.builtin else f"{self.file}:{self.function}"

    def check_input(self, input: Any, *, subject: str = "Input") -> None:
        """Raise InputError naming the first field of `input` that the declared schema refuses."""
        if self.input_schema is None:
            return
        found = violation(self.input_schema, input)
        if found is not None:
            sentence = found.sentence(subject)
            if found.problem == "is required" and "." not in found.field and subject == "Input":
                sentence = f"{sentence[:-1]}; {how_to_give(found.field)}."  # a top-level field of the run's
            raise InputError(sentence)

    def missing_secret(self, lookup: Callable[[str], str | None]) -> str | None:
        """The first declared secret `lookup` does not find."""
        return next((name for name in self.secrets if lookup(name) is None), None)

    def require_secrets(self, lookup: Callable[[str], str | None], env_file: Path) -> None:
        """Raise UsageError naming the first declared secret that is not set, and where to set it."""
        name = self.missing_secret(lookup)
        if name is not None:
            raise UsageError(
                f"Play {self.name!r} needs the secret {name}, which is not set; export it or add it to {env_file}."
            )

    def tools(self) -> dict[str, Any]:
        """The @tools in the play's own module (defined or imported there), and in the play's
        own modules it imports (`import providers`), by id; the module's own win.

        A run calls these before the process-wide registry, so two versions of a play
        run by one worker each call their own version of a tool (and their versions are
        part of a map cell's fingerprint).
        """
        found: dict[str, Any] = {}
        for module in reversed(_play_modules(self.fn.__globals__)):
            found.update(tools_in(vars(module)))
        found.update(tools_in(self.fn.__globals__))
        return found


def _play_modules(namespace: Mapping[str, Any]) -> list[Any]:
    """The play's own modules a module imports, and those they import, nearest first."""
    found: list[Any] = []
    seen: set[int] = set()
    todo = [namespace]
    while todo:
        names = todo.pop(0)
        for value in list(names.values()):
            file = getattr(value, "__file__", None) if inspect.ismodule(value) else None
            if file and id(value) not in seen and is_play_file(file):
                seen.add(id(value))
                found.append(value)
                todo.append(vars(value))
    return found


def tools_in(namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The @tools a module's namespace holds (defined or imported there), by id. Two
    functions declared under one id are refused: the last would answer for both."""
    found: dict[str, Any] = {}
    for name, value in list(namespace.items()):
        definition = getattr(value, "__deepline_tool__", None)
        if definition is None:
            continue
        other = found.get(definition.id)
        if other is not None and other.fn is not definition.fn:
            raise UsageError(
                f"Tool {definition.id!r} is declared twice ({other.fn.__name__} and {name}): give each its own id."
            )
        found[definition.id] = definition
    return found


_ALL_PLAYS: dict[str, PlayDef] = {}


def play(
    name: str,
    *,
    description: str = "",
    input: Any = None,
    secrets: Sequence[str] | None = None,
    max_credits_per_run: float | None = None,
    schedule: str | None = None,
    schedule_input: Any = None,
    timezone: str | None = None,
    catch_up: str | None = None,
    webhook_secret: str | None = None,
) -> Callable[[F], F]:
    """Declare an `async def (ctx, input)` as a play named `name`.

    `input`: the input's schema (a dict of field → type, a TypedDict or dataclass class, or
    a JSON Schema), checked before a run is recorded. `secrets`: names that must be set
    (environment or `.env` next to the play) before any call. `max_credits_per_run`: the
    run's credit budget when `--max-credits` is not given.

    `schedule`: a cron expression (`"0 6 * * *"`; a sixth field is seconds) that `deepline
    worker --play FILE` fires with `schedule_input`, read in `timezone` (default UTC); a tick
    missed while no worker ran fires once when one returns (`catch_up="latest"`) or not at
    all (`"none"`). `webhook_secret`: the name of the secret `deepline serve` checks a
    delivery's signature with.
    """
    if not isinstance(name, str):  # `@play` with no name: it was given the function
        raise PlayLoadError('@play needs the play\'s name: @play("lead-enrichment").')
    schema = _schema(name, input)
    names = _secret_names(name, secrets)
    budget = _budget(name, max_credits_per_run)
    when = schedule_of(name, schedule, schedule_input, timezone, catch_up, schema=schema)  # runs: sched-<name>-…
    hook_secret = _secret_names(name, [webhook_secret])[0] if webhook_secret is not None else None

    def register(fn: F) -> F:
        if inspect.isasyncgenfunction(fn):
            raise PlayLoadError(f"Play {name!r} must return its output, not yield it: `async def (ctx, input)`.")
        if not inspect.iscoroutinefunction(fn):
            raise PlayLoadError(f"Play {name!r} must be an async function `async def (ctx, input)`.")
        if not _takes_ctx_and_input(fn):
            raise PlayLoadError(f"Play {name!r} must take (ctx, input): `async def {fn.__name__}(ctx, input)`.")
        file = str(Path(inspect.getfile(fn)).resolve())
        definition = PlayDef(name=name, description=description, fn=fn, file=file, input_schema=schema,
                             secrets=names, max_credits_per_run=budget, schedule=when,
                             webhook_secret=hook_secret)  # fmt: skip
        fn.__deepline_play__ = definition  # type: ignore[attr-defined]
        _ALL_PLAYS[name] = definition
        return fn

    return register


def _schema(play_name: str, spec: Any) -> Schema | None:
    if spec is None:
        return None
    try:
        return compile_schema(spec)
    except SchemaDefinitionError as exc:
        raise PlayLoadError(f"Play {play_name!r}: input schema: {exc}.") from None


def _secret_names(play_name: str, secrets: Sequence[str] | None) -> tuple[str, ...]:
    if secrets is None:
        return ()
    if isinstance(secrets, str) or not all(isinstance(s, str) and _SECRET_NAME.fullmatch(s) for s in secrets):
        raise PlayLoadError(f'Play {play_name!r}: secrets must be a list of variable names, like ["HUNTER_API_KEY"].')
    return tuple(secrets)


def _budget(play_name: str, credits: Any) -> float | None:
    if credits is None:
        return None
    if isinstance(credits, bool) or not isinstance(credits, int | float) or credits < 0:
        raise PlayLoadError(f"Play {play_name!r}: max_credits_per_run must be a number of credits (0 or more).")
    return float(credits)


def builtin(fn: Callable[..., Any]) -> PlayDef:
    """Mark a play shipped with deepline: its ref is `builtin:NAME` (a resume finds it in
    whatever installation runs it), and a user's play cannot `run_play` it by name."""
    definition: PlayDef = fn.__deepline_play__  # type: ignore[attr-defined]
    if _ALL_PLAYS.get(definition.name) is definition:
        del _ALL_PLAYS[definition.name]
    marked = replace(definition, builtin=True)
    fn.__deepline_play__ = marked  # type: ignore[attr-defined]
    return marked


def find_play_by_name(name: str) -> PlayDef | None:
    """A play any loaded module declared (for `run_play` by name)."""
    return _ALL_PLAYS.get(name)


def split_ref(ref: str) -> tuple[str, str | None]:
    """`file.py:function` → (`file.py`, `function`); a bare path has no selector."""
    path, sep, selector = ref.rpartition(":")
    if not sep or not path or not selector or "/" in selector or "\\" in selector:
        return ref, None
    if Path(ref).expanduser().is_file():  # a colon inside a directory or file name
        return ref, None
    return path, selector


def load_module(path: Path) -> Any:
    """Import the play file as a fresh module; every failure is one clear sentence."""
    if not path.exists():
        raise PlayLoadError(f"Play file {path} does not exist.")
    if path.is_dir():
        raise PlayLoadError(f"Play file {path} is a directory; pass a .py file.")
    module_name = f"{PLAY_MODULE_PREFIX}{_json.digest(str(path))[:12]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise PlayLoadError(f"Play file {path} cannot be imported (is it a .py file?).")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    # Let a play import helper modules that sit next to it — its own versions of them: a
    # worker runs plays from several folders (several snapshots of one play, say).
    on_path(path.parent)
    try:
        # Compile from source every time: a cached .pyc is trusted by file size and
        # modification second, and a play edited within that second would run stale code.
        code = compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        exec(code, module.__dict__)
    except SyntaxError as exc:
        sys.modules.pop(module_name, None)
        raise PlayLoadError(f"Syntax error in {exc.filename or path} line {exc.lineno}: {exc.msg}.") from exc
    except PlayLoadError:
        sys.modules.pop(module_name, None)
        raise
    except BaseException as exc:
        sys.modules.pop(module_name, None)
        line = _line_in(path, exc)
        where = f"{path} line {line}" if line else str(path)
        said = f"Importing {where} failed: {type(exc).__name__}: {exc}".rstrip(".") + "."
        if isinstance(exc, FileNotFoundError) and "snapshots" in path.parts:
            said += (
                " A worker runs an enqueued play from a copy of its code: list the data files it reads beside it "
                'in its deepline.toml (`[snapshot]` include = ["weights.json"]), or read them from a path in its input.'
            )
        raise PlayLoadError(said) from exc
    return module


def on_path(folder: Path) -> None:
    """Put `folder` first on the import path, its modules imported from there from now on."""
    if str(folder) in sys.path:  # first, even if it is there already: another folder's same-named module is not it
        sys.path.remove(str(folder))
    sys.path.insert(0, str(folder))
    _forget_other_versions(folder)


def _forget_other_versions(folder: Path) -> None:
    """Modules named like ones in `folder` are imported again when the play is: one loaded
    from elsewhere is another play's, and one loaded from here may have changed since (a
    worker or a test runs many plays in one process). deepline's own modules and installed
    packages are never forgotten."""
    names = {p.stem for p in folder.glob("*.py")} | {p.parent.name for p in folder.glob("*/__init__.py")}
    for name in names:
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if module is not None and file and is_play_file(file):
            for loaded in [n for n in sys.modules if n == name or n.startswith(name + ".")]:
                del sys.modules[loaded]


def _line_in(path: Path, exc: BaseException) -> int | None:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
    return frames[-1].lineno if frames else None


def _takes_ctx_and_input(fn: Callable[..., Any]) -> bool:
    """Can `fn` be called as `fn(ctx, input)`?"""
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        return False
    except ValueError:  # no signature to read: given the benefit of the doubt
        return True
    return True


def plays_in(module: Any) -> list[PlayDef]:
    """The plays declared by the module itself (not those it imports), in file order."""
    found = {  # one play bound to two names is still one play
        id(value.__deepline_play__): value.__deepline_play__
        for value in vars(module).values()
        if hasattr(value, "__deepline_play__") and getattr(value, "__module__", None) == module.__name__
    }
    return sorted(found.values(), key=lambda p: p.fn.__code__.co_firstlineno)


def load_play(ref: str, *, base: Path | None = None) -> PlayDef:
    """Load `path.py[:function-or-play-name]`, relative paths against `base`."""
    path, selector, plays = _load_plays(ref, base)
    return _select(path, selector, plays)


def _select(path: Path, selector: str | None, plays: list[PlayDef]) -> PlayDef:
    if selector is None:
        if len(plays) > 1:
            raise PlayLoadError(f"{path} declares several plays ({_named(plays)}); pick one with {path.name}:NAME.")
        return plays[0]
    for candidate in plays:
        if selector in (candidate.function, candidate.name):
            return candidate
    raise PlayLoadError(f"{path} has no play {selector!r}; it declares: {_named(plays)}.")


def _named(plays: list[PlayDef]) -> str:
    """The plays a file declares, as a person picks one: its function, and its play's name."""
    return ", ".join(p.function if p.name == p.function else f"{p.function} (play {p.name!r})" for p in plays)


def load_plays(ref: str) -> list[PlayDef]:
    """Every play `path.py` declares (or the one `path.py:NAME` picks)."""
    path, selector, plays = _load_plays(ref, None)
    return plays if selector is None else [_select(path, selector, plays)]


def _load_plays(ref: str, base: Path | None) -> tuple[Path, str | None, list[PlayDef]]:
    raw_path, selector = split_ref(ref)
    path = Path(raw_path).expanduser()
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    path = path.resolve()
    if path.suffix != ".py" and not path.exists() and path.with_suffix(".py").exists():
        path = path.with_suffix(".py")
    plays = plays_in(load_module(path))
    if not plays:
        raise PlayLoadError(f"{path} declares no play; decorate an async function with @play.")
    return path, selector, plays
