"""The files a run's input names (`--csv leads.csv`, `--set list=…`): found, and stamped as
they were when the run started, so `--run-id` of a completed run is not reported again for
a file written anew since (a nightly export regenerated at the same path)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def named_files(value: Any, cwd: str) -> list[Path]:
    """The paths a run's input names, as the run found them: relative ones against the
    directory it was started in (whether or not a file is there)."""
    if isinstance(value, dict):
        return [path for item in value.values() for path in named_files(item, cwd)]
    if isinstance(value, list):
        return [path for item in value for path in named_files(item, cwd)]
    if isinstance(value, str) and value and len(value) < 4096 and "\n" not in value:
        return [Path(cwd or ".", value)]
    return []


def stamps(value: Any, cwd: str) -> dict[str, list[int]]:
    """Each regular file the input names, by path: its size and modification time."""
    found: dict[str, list[int]] = {}
    for path in named_files(value, cwd):
        stamp = _stamp(path)
        if stamp is not None:
            found[str(path)] = stamp
    return found


def changed(stamped: Any) -> str | None:
    """The first file of `stamped` (as `stamps` gave it) that is not as it was: written
    since, replaced or gone. None when all are as they were (or nothing was stamped)."""
    if not isinstance(stamped, dict):
        return None
    for path, stamp in stamped.items():
        if _stamp(Path(path)) != stamp:
            return str(path)
    return None


def _stamp(path: Path) -> list[int] | None:
    try:
        stat = path.stat()
    except (OSError, ValueError):  # no such file, a name too long, a NUL: no file named
        return None
    if not os.path.isfile(path):
        return None
    return [stat.st_size, stat.st_mtime_ns]
