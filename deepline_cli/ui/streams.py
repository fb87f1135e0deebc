"""stdout as the command's own: what a play prints goes to stderr (`own_stdout`), and a
stream whose reader went away (`deepline run … | head`) is silenced, so neither a later
write nor the interpreter's last flush fails."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import IO


def silence(fileno: int) -> None:
    """Point the file descriptor at /dev/null."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fileno)
        finally:
            os.close(devnull)


@contextlib.contextmanager
def own_stdout() -> Iterator[IO[str]]:
    """While the play runs, everything it writes to stdout goes to stderr: `print`, and what
    writes to file descriptor 1 itself (a program a tool starts, `os.system`, a C library).
    Yields the command's stdout, kept for its own output (NDJSON under --json)."""
    out = sys.stdout
    try:
        on_fd1 = out.fileno() == 1 and sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):  # not a real file (a test's runner, a closed fd)
        on_fd1 = False
    if not on_fd1:
        with contextlib.redirect_stdout(sys.stderr):
            yield out
        return
    out.flush()
    kept = open(os.dup(1), "w", encoding=out.encoding, errors=out.errors)  # noqa: SIM115 (closed below)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield kept
    finally:
        with contextlib.suppress(OSError, ValueError):
            kept.flush()
        os.dup2(kept.fileno(), 1)  # silenced already if its reader went away
        with contextlib.suppress(OSError):
            kept.close()
