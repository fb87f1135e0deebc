"""Snapshots of enqueued plays: the source and config travel with the run in the store."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from deepline_cli import _json
from deepline_cli.runtime.play import PlayDef


def take_snapshot(play: PlayDef, config: Path | None) -> dict[str, Any]:
    """The play's source and config, kept with an enqueued run so a worker on another
    machine runs exactly what was enqueued. (Modules the play imports are not included.)"""
    path = Path(play.file)
    return {
        "file": path.name,
        "function": play.function,
        "source": path.read_text(encoding="utf-8"),
        "config": config.read_text(encoding="utf-8") if config else None,
    }


def materialize_snapshot(snapshot: dict[str, Any]) -> tuple[str, str | None]:
    """Write a snapshot to the cache directory once; return (play ref, config path)."""
    import platformdirs

    digest = _json.digest(snapshot["source"], snapshot.get("config") or "")[:16]
    folder = Path(platformdirs.user_cache_dir("deepline", appauthor=False)) / "snapshots" / digest
    folder.mkdir(parents=True, exist_ok=True)
    play_file = folder / snapshot["file"]
    _write_once(play_file, snapshot["source"])
    config = None
    if snapshot.get("config") is not None:
        config_file = folder / "deepline.toml"
        _write_once(config_file, snapshot["config"])
        config = str(config_file)
    return f"{play_file}:{snapshot['function']}", config


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
