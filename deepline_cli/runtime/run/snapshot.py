"""Snapshots of enqueued plays: the source travels with the run in the store.

A snapshot holds the play file, the modules it imported from its own folder (a
`helpers.py`, a `lib/` package next to it), the child plays it runs by path
(`ctx.run_play(id, "kids/enrich.py")`) with theirs, and its `deepline.toml`, so a worker on
another machine runs exactly what was enqueued. Snapshots are kept once per digest in
their own table; a run names the one it uses.
"""

from __future__ import annotations

import ast
import base64
import os
import sys
import threading
from pathlib import Path
from typing import Any

from deepline_cli import _json
from deepline_cli.errors import UsageError
from deepline_cli.runtime.providers.config import load_config
from deepline_cli.runtime.run.play import PlayDef, load_play, on_path
from deepline_cli.store.records import CODE, RunRecord

MAX_SNAPSHOT_BYTES = 2 * 1024 * 1024  # the play and its local modules, together


# A file's content in a snapshot: its text when it is UTF-8, else {"base64": ...} (a module
# may declare another encoding: `# -*- coding: latin-1 -*-`).
Source = str | dict[str, str]


def take_snapshot(play: PlayDef, config: Path | None, root: Path | None = None) -> tuple[str, dict[str, Any]]:
    """(digest, snapshot) of a loaded play: its file, the local modules it imported, the
    child plays it runs by path (loaded, with theirs), its config. `root`: the folder of the
    play that runs this one as a child (`kids/enrich.py`): when the child is inside it, the
    snapshot is of that folder, as the child imports from it (its parent's `helpers.py`)."""
    file = Path(play.file)
    folder = root if root is not None and file.resolve().is_relative_to(root.resolve()) else file.parent
    name = file.resolve().relative_to(folder.resolve()).as_posix()
    files: dict[str, Source] = {name: _source(file.read_bytes())}
    modules = local_modules(folder)
    modules.update(child_plays(file, folder))
    modules.pop(name, None)
    for module, path in sorted(modules.items()):
        files[module] = _source(path.read_bytes())
    for data, path in included_files(config, folder).items():
        files.setdefault(data, _source(path.read_bytes()))
    _check_size(files, folder)
    snapshot = {
        "play_file": name,
        "function": play.function,
        "files": files,
        "config": _config_text(config) if config else None,
    }
    return _json.digest(_json.canonical(snapshot))[:32], snapshot


def included_files(config: Path | None, folder: Path) -> dict[str, Path]:
    """The data files `[snapshot] include` names (globs in the deepline.toml's folder), by
    their names in the play's `folder`: a play reading `Path(__file__).parent / "weights.json"`
    finds them where a worker runs its snapshot. Listed, never gathered: a folder may hold
    credentials and lead lists that must not reach the store."""
    if config is None:
        return {}
    found: dict[str, Path] = {}
    here = Path(os.path.abspath(folder))
    for pattern in load_config(config).snapshot_include:
        if Path(pattern).is_absolute():
            raise UsageError(f"{config}: [snapshot] include {pattern!r} must be relative to {config.parent}.")
        hidden = any(part.startswith(".") for part in Path(pattern).parts if part not in (".", ".."))
        taken = 0
        for path in sorted(path for path in config.parent.glob(pattern) if path.is_file()):
            # A hidden file (`.env`, a `.venv`'s) only when the pattern names one: `*.json` is not `.creds.json`.
            listed = [part for part in Path(os.path.relpath(path, config.parent)).parts if part != ".."]
            if not hidden and any(part.startswith(".") for part in listed):
                continue
            inside = Path(os.path.abspath(path))  # its name as listed (a link keeps its own name)
            if not path.resolve().is_relative_to(here.resolve()) or not inside.is_relative_to(here):
                raise UsageError(
                    f"{config}: [snapshot] include {pattern!r} names {path}, outside the play's folder {folder}: a "
                    "worker runs the play from a copy of that folder."
                )
            found[inside.relative_to(here).as_posix()] = path
            taken += 1
        if not taken:
            raise UsageError(
                f"{config}: [snapshot] include {pattern!r} matches no file in {config.parent} (a folder is listed "
                "by its files, `data/**/*`; a hidden file only by a pattern that names it)."
            )
    return found


def child_plays(play_file: Path, folder: Path) -> dict[str, Path]:
    """The play files `ctx.run_play(id, "path/child.py[:fn]")` names, in this play and in
    those children in turn, with the local modules each imports, by name in `folder`. Each
    is loaded (a child that does not load fails the enqueue, not the worker's run after the
    parent has paid); one outside the play's folder is refused: a worker would not find it."""
    found: dict[str, Path] = {}
    done, todo = {play_file.resolve()}, [play_file]
    while todo:
        parent = todo.pop()
        for ref in _run_play_refs(parent):
            child = Path(load_play(ref, base=parent.parent).file).resolve()
            if not child.is_relative_to(folder.resolve()):
                raise UsageError(
                    f"{parent.name} runs the play {ref!r}, outside the play's folder {folder}: an enqueued run "
                    "carries only the play's folder; move the child play into it."
                )
            found.update(local_modules(folder))  # now: loading the next may forget its folder's modules
            found[child.relative_to(folder.resolve()).as_posix()] = child
            if child not in done:
                done.add(child)
                todo.append(child)
    return found


def _run_play_refs(path: Path) -> list[str]:
    """The literal play paths a file's `run_play(...)` calls name (`"kids/enrich.py:main"`)."""
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return []
    refs = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "run_play"):
            continue
        given = (
            node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "play_ref"), None)
        )
        if isinstance(given, ast.Constant) and isinstance(given.value, str) and ".py" in given.value:
            refs.append(given.value)
    return refs


def local_modules(folder: Path) -> dict[str, Path]:
    """The modules loaded from `folder` (and its subfolders), by their name in it, sorted.

    A module may be a link: one to a file inside the play's folder is taken (its content),
    one to a file outside is refused — a worker would not find it."""
    found: dict[str, Path] = {}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not file or not file.endswith(".py"):
            continue
        path = Path(os.path.abspath(file))  # as imported: a link stays a link here
        if not path.is_relative_to(folder) or "site-packages" in path.parts:
            continue
        target = path.resolve()
        if not target.is_relative_to(folder.resolve()):
            raise UsageError(
                f"{path.relative_to(folder)} is a link to {target}, outside the play's folder {folder}: "
                "an enqueued run carries only the play's folder; copy the module in, or install it as a package."
            )
        found[path.relative_to(folder).as_posix()] = target
    return dict(sorted(found.items()))


def code_record(play: PlayDef) -> dict[str, Any]:
    """What a run started from a file keeps of its play's code (the run option CODE): the
    play file and the modules it had imported from its folder, by their names in it, and
    their digest."""
    file = os.path.abspath(play.file)
    folder = os.path.dirname(file)
    scan = (file, len(sys.modules))
    files = _MODULES_SEEN.get(scan)
    if files is None:  # looked for again only when modules were imported since
        inside = folder.rstrip(os.sep) + os.sep
        paths = {file}
        for module in list(sys.modules.values()):
            name = getattr(module, "__file__", None)
            if name and name.endswith(".py") and name.startswith(inside) and "site-packages" not in name:
                paths.add(os.path.abspath(name))
        files = _MODULES_SEEN[scan] = tuple(sorted(os.path.relpath(path, folder) for path in paths))
    return {"files": list(files), "digest": _code_digest(folder, files, play.function)}


def code_changed(play: PlayDef, record: RunRecord) -> bool:
    """Has the run's play code changed since it started (or is that not known: a run of an
    earlier deepline)? The files it started from are read again: a module imported since, or
    not imported in this process, makes no difference. A run from a snapshot runs the code
    it was enqueued with."""
    if record.snapshot:
        return False
    kept = record.options.get(CODE)
    if not isinstance(kept, dict) or not isinstance(kept.get("files"), list):
        return True
    folder = os.path.dirname(os.path.abspath(play.file))
    return _code_digest(folder, tuple(str(f) for f in kept["files"]), play.function) != kept.get("digest")


_MODULES_SEEN: dict[tuple[str, int], tuple[str, ...]] = {}
_DIGESTS: dict[tuple[Any, ...], str] = {}


def _code_digest(folder: str, files: tuple[str, ...], function: str) -> str:
    """The digest of `files`' contents (read again only when one's size or time changed: a
    map of child plays asks it for each)."""
    paths = [os.path.join(folder, name) for name in files]
    stamps: list[tuple[int, int] | None] = []
    for path in paths:
        try:
            stat = os.stat(path)
            stamps.append((stat.st_mtime_ns, stat.st_size))
        except OSError:
            stamps.append(None)
    key = (folder, files, function, tuple(stamps))
    known = _DIGESTS.get(key)
    if known is None:
        parts = [function]
        for name, path in zip(files, paths, strict=True):
            try:
                with open(path, "rb") as handle:
                    parts.append(f"{name}\0{_json.digest(handle.read())}")
            except OSError:
                parts.append(f"{name}\0missing")
        known = _DIGESTS[key] = _json.digest(*parts)[:32]
    return known


def _source(raw: bytes) -> Source:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(raw).decode()}


def _raw(content: Source) -> bytes:
    return content.encode() if isinstance(content, str) else base64.b64decode(content["base64"])


def _config_text(config: Path) -> str:
    try:
        return config.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise UsageError(f"{config} is not UTF-8 text (TOML must be).") from None


def _check_size(files: dict[str, Source], folder: Path) -> None:
    sizes = {name: len(_raw(content)) for name, content in files.items()}
    total = sum(sizes.values())
    if total <= MAX_SNAPSHOT_BYTES:
        return
    biggest = max(sizes, key=lambda name: sizes[name])
    raise UsageError(
        f"The play, the modules it imports from {folder} and the files [snapshot] includes come to "
        f"{total / 1e6:.1f} MB, more than the "
        f"{MAX_SNAPSHOT_BYTES / 1e6:.0f} MB an enqueued run carries (the biggest is {biggest}, "
        f"{sizes[biggest] / 1e6:.1f} MB); keep data out of modules, or install it as a package."
    )


def _snapshots() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("deepline", appauthor=False)) / "snapshots"


def child_root(play_file: str) -> Path:
    """The folder a child play's snapshot is taken of, for a parent run from `play_file`:
    the parent's folder, or, for a parent run from a snapshot, that snapshot's whole folder
    (a grandchild in `kids/` imports from the top folder as its parent did)."""
    path = Path(play_file)
    snapshots = _snapshots()
    return next((folder for folder in path.parents if folder.parent == snapshots), path.parent)


def materialize_snapshot(digest: str, snapshot: dict[str, Any]) -> tuple[str, str | None]:
    """Write a snapshot into the cache directory once; return (play ref, config path)."""
    folder = _snapshots() / digest
    files, play_file = _files(snapshot)
    for name, content in files.items():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_once(target, _raw(content))
    if "/" in play_file:  # a child play in a subfolder imports from its parent's folder too
        on_path(folder)
    config = None
    if snapshot.get("config") is not None:
        config_file = folder / "deepline.toml"
        _write_once(config_file, snapshot["config"].encode())
        config = str(config_file)
    return f"{folder / play_file}:{snapshot['function']}", config


def _files(snapshot: dict[str, Any]) -> tuple[dict[str, Source], str]:
    if "files" in snapshot:
        return snapshot["files"], snapshot["play_file"]
    return {snapshot["file"]: snapshot["source"]}, snapshot["file"]  # deepline 0.1.0: the play file only


def _write_once(path: Path, content: bytes) -> None:
    """Write atomically, and trust an existing file only if it holds exactly `content`
    (another worker may be writing it, or one may have died half way)."""
    try:
        if path.read_bytes() == content:
            return
    except OSError:
        pass
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    partial.write_bytes(content)
    os.replace(partial, path)
