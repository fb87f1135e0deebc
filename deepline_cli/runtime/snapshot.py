"""Snapshots of enqueued plays: the source travels with the run in the store.

A snapshot holds the play file, the modules it imported from its own folder (a
`helpers.py`, a `lib/` package next to it) and its `deepline.toml`, so a worker on
another machine runs exactly what was enqueued. Snapshots are kept once per digest in
their own table; a run names the one it uses.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

from deepline_cli import _json
from deepline_cli.errors import UsageError
from deepline_cli.runtime.play import PlayDef

MAX_SNAPSHOT_BYTES = 2 * 1024 * 1024  # the play and its local modules, together


def take_snapshot(play: PlayDef, config: Path | None) -> tuple[str, dict[str, Any]]:
    """(digest, snapshot) of a loaded play: its file, the local modules it imported, its config."""
    folder = Path(play.file).parent
    files = {Path(play.file).name: Path(play.file).read_text(encoding="utf-8")}
    for path in local_modules(folder):
        files[path.relative_to(folder).as_posix()] = path.read_text(encoding="utf-8")
    _check_size(files, folder)
    snapshot = {
        "play_file": Path(play.file).name,
        "function": play.function,
        "files": files,
        "config": config.read_text(encoding="utf-8") if config else None,
    }
    return _json.digest(_json.canonical(snapshot))[:32], snapshot


def local_modules(folder: Path) -> list[Path]:
    """Source files of the modules loaded from `folder` (and its subfolders), sorted."""
    found = set()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not file or not file.endswith(".py"):
            continue
        path = Path(file).resolve()
        if path.is_relative_to(folder) and "site-packages" not in path.parts:
            found.add(path)
    return sorted(found)


def _check_size(files: dict[str, str], folder: Path) -> None:
    total = sum(len(text.encode()) for text in files.values())
    if total <= MAX_SNAPSHOT_BYTES:
        return
    biggest = max(files, key=lambda name: len(files[name]))
    raise UsageError(
        f"The play and the modules it imports from {folder} come to {total / 1e6:.1f} MB, more than the "
        f"{MAX_SNAPSHOT_BYTES / 1e6:.0f} MB an enqueued run carries (the biggest is {biggest}, "
        f"{len(files[biggest].encode()) / 1e6:.1f} MB); keep data out of modules, or install it as a package."
    )


def materialize_snapshot(digest: str, snapshot: dict[str, Any]) -> tuple[str, str | None]:
    """Write a snapshot into the cache directory once; return (play ref, config path)."""
    import platformdirs

    folder = Path(platformdirs.user_cache_dir("deepline", appauthor=False)) / "snapshots" / digest
    files, play_file = _files(snapshot)
    for name, text in files.items():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_once(target, text)
    config = None
    if snapshot.get("config") is not None:
        config_file = folder / "deepline.toml"
        _write_once(config_file, snapshot["config"])
        config = str(config_file)
    return f"{folder / play_file}:{snapshot['function']}", config


def _files(snapshot: dict[str, Any]) -> tuple[dict[str, str], str]:
    if "files" in snapshot:
        return snapshot["files"], snapshot["play_file"]
    return {snapshot["file"]: snapshot["source"]}, snapshot["file"]  # deepline 0.1.0: the play file only


def _write_once(path: Path, text: str) -> None:
    """Write atomically, and trust an existing file only if it holds exactly `text`
    (another worker may be writing it, or one may have died half way)."""
    try:
        if path.read_text(encoding="utf-8") == text:
            return
    except (OSError, UnicodeDecodeError):
        pass
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
