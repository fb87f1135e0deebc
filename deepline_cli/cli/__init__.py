"""The command line: the only package that imports typer."""

# Nothing here imports more than it must before the handlers are in: until then a Ctrl-C is
# the interpreter's, and an import in that window is where Python can drop one (a
# KeyboardInterrupt raised in an import lock's weakref callback is printed and ignored).
# So no `from __future__` (an import), and `_signal` rather than `signal` (which imports
# enum: some 6 ms more).
import _signal  # type: ignore[import-not-found]  # the C module under `signal`, without enum
import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing before the handlers are in
if TYPE_CHECKING:
    from typing import Any

_said = [b"Interrupted.\n"]  # what Ctrl-C prints before anything durable started


def stop_at_once(signum: int, frame: "Any") -> None:
    """Ctrl-C or SIGTERM while nothing durable has started (imports, loading a play, reading
    the store): end the process here, one line, exit 130. Whatever the store was doing is a
    transaction that is rolled back whole. Raising instead could land where Python ignores
    exceptions (a weakref callback, a finaliser), and the signal would be lost."""
    if _said[0]:
        os.write(2, _said[0])
    dataset = sys.modules.get("deepline_cli.runtime.map.dataset")
    for part in list(getattr(dataset, "PARTS", ())):  # an export cut short leaves no half file
        try:  # noqa: SIM105 (contextlib is an import this module makes no earlier than it must)
            os.unlink(part)
        except OSError:
            pass
    os._exit(130)


def stop_quietly() -> None:
    """For commands where Ctrl-C is the way to stop (`runs tail`): no line."""
    _said[0] = b""


def install() -> None:
    for sig in (_signal.SIGINT, _signal.SIGTERM):
        _signal.signal(sig, stop_at_once)


def main() -> None:
    # From the first line on (the imports below take a while). `deepline run` and `resume`
    # hand signals to the run just before it is recorded (cli/run.py); `worker` drains.
    install()
    from deepline_cli.cli.app import app

    app()
