"""A stream whose reader went away (`deepline run … | head`): what is still written to it
goes nowhere, so neither a later write nor the interpreter's last flush fails."""

from __future__ import annotations

import contextlib
import os


def silence(fileno: int) -> None:
    """Point the file descriptor at /dev/null."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fileno)
        finally:
            os.close(devnull)
