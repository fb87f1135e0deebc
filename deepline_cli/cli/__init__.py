"""The command line: the only package that imports typer."""

from __future__ import annotations

import signal
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing before the handlers are in
if TYPE_CHECKING:
    from typing import Any


class Interrupted(BaseException):
    """Ctrl-C or SIGTERM before anything was started: the command stops at once.

    A BaseException of its own, so neither a library's `except Exception` nor Click's
    handling of KeyboardInterrupt (which would print "Aborted!" and exit 1) takes it.
    """


def stop_at_once(signum: int, frame: Any) -> None:
    raise Interrupted


def install() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop_at_once)


def main() -> None:
    # From the first line on (the imports below take a while): a signal stops the command
    # with one line. `deepline run` hands signals to the run once it exists (cli/run.py).
    install()
    try:
        from deepline_cli.cli.app import app

        app()
    except Interrupted:
        sys.stderr.write("Interrupted.\n")
        sys.exit(130)
