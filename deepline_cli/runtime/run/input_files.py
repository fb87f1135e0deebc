"""The files a run's input names (`--csv leads.csv`, `--set list=…`): found, and stamped as
they were when the run started, so `--run-id` of a completed run is not reported again for
a file whose content changed since (a nightly export regenerated at the same path). A file
touched, or checked out again, with the same bytes is the same input."""

from __future__ import annotations

import hashlib
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


def stamps(value: Any, cwd: str) -> dict[str, list[Any]]:
    """Each regular file the input names, by path: its size, modification time and digest."""
    found: dict[str, list[Any]] = {}
    for path in named_files(value, cwd):
        stamp = _stamp(path)
        if stamp is not None:
            found[str(path)] = stamp
    return found


def named_elsewhere(value: Any, then: str, here: str, stamped: Any = None) -> tuple[str, str] | None:
    """A relative path of the input that names another file from `here` than it did from
    `then` (the folder the run was started in): (that file, this one). None if none does, or
    if both hold what that one held when the run started (`stamped`: a CI job's checkout
    in another folder, the same bytes; a resume reads the run's folder's)."""
    if not then or os.path.realpath(then) == os.path.realpath(here):
        return None
    stamps = stamped if isinstance(stamped, dict) else {}
    for before, now in zip(named_files(value, then), named_files(value, here), strict=True):
        if before == now or not (before.is_file() or now.is_file()) or before.resolve() == now.resolve():
            continue
        stamp = stamps.get(str(before))
        if stamp is not None and _same(now, stamp) and _same(before, stamp):  # the same bytes, here and there
            continue
        return str(before), str(now)
    return None


def changed(stamped: Any) -> str | None:
    """The first file of `stamped` (as `stamps` gave it) that is not as it was: written
    since, replaced or gone. None when all are as they were (or nothing was stamped)."""
    if not isinstance(stamped, dict):
        return None
    for path, stamp in stamped.items():
        if not _same(Path(path), stamp):
            return str(path)
    return None


def _same(path: Path, stamp: Any) -> bool:
    """Is the file as `stamp` says: the same size, and the same time or else the same bytes?"""
    try:
        stat = path.stat()
    except (OSError, ValueError):
        return False
    if not isinstance(stamp, list) or len(stamp) < 2 or stat.st_size != stamp[0]:
        return False
    if stat.st_mtime_ns == stamp[1]:
        return True
    return len(stamp) > 2 and _digest(path) == stamp[2]


def _stamp(path: Path) -> list[Any] | None:
    try:
        stat = path.stat()
    except (OSError, ValueError):  # no such file, a name too long, a NUL: no file named
        return None
    if not os.path.isfile(path):
        return None
    return [stat.st_size, stat.st_mtime_ns, _digest(path)]


def _digest(path: Path) -> str | None:
    try:
        with path.open("rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError:
        return None
