"""`--json`: every runtime event as one JSON object per line on stdout."""

from __future__ import annotations

import contextlib
import errno
import sys
from collections.abc import Callable
from typing import IO, Any

from deepline_cli import _json
from deepline_cli.runtime.calls.events import Event
from deepline_cli.ui.streams import silence


class NdjsonView:
    """Writes events; when the reader goes away (`--json | head -1`) or stdout cannot be
    written (a full disk, a closed descriptor), it stops writing and calls `on_closed`
    once, so the run is interrupted (resumable) rather than failed."""

    def __init__(self, stream: IO[str] | None = None, on_closed: Callable[[], None] | None = None) -> None:
        # The real stdout (own_stdout's while the play runs: its prints go to stderr meanwhile).
        self.stream = stream or sys.stdout
        self._to_stdout = stream is None
        self.on_closed = on_closed
        self.closed = False
        self.failure: Exception | None = None  # why stdout could not be written (not a reader gone)

    def handle(self, event: Event) -> None:
        self.write(event.to_dict())

    def write(self, payload: dict[str, Any]) -> None:
        if self.closed:
            return
        try:
            if self.stream is None:  # `>&-`: Python has no stdout at all
                raise OSError(errno.EBADF, "stdout is closed")
            self.stream.write(_json.dumps_str(payload) + "\n")
            self.stream.flush()
        except Exception as exc:  # an output that fails (a full disk), or a line that cannot be written
            self._reader_gone(exc)

    def _reader_gone(self, exc: Exception) -> None:
        self.closed = True
        if self._to_stdout and self.stream is not None:
            with contextlib.suppress(OSError, ValueError):
                silence(self.stream.fileno())
        if not isinstance(exc, BrokenPipeError):  # no reader to tell, the user is: said once the run ended
            self.failure = exc
        if self.on_closed is not None:
            self.on_closed()

    def said_unwritten(self, run_id: str, status: str) -> bool:
        """Say on stderr that the --json output could not be written, and what became of the
        run (interrupted: resumable; or it completed all the same). Whether that fails the
        command: an output a script will read (a full disk) does, a closed stdout does not."""
        exc = self.failure
        if exc is None:
            return False
        said = f"the --json output could not be written ({getattr(exc, 'strerror', None) or exc})"
        closed = getattr(exc, "errno", None) == errno.EBADF
        if status in ("completed", "queued"):
            text = f"{'Warning' if closed else 'Error'}: {said}; run {run_id} {status} all the same: "
            text += f"deepline runs show {run_id} --json"
        elif status == "interrupted":
            text = f"Error: {said}: run {run_id} stopped; `deepline resume {run_id}` finishes it"
        else:
            text = f"Error: {said}; run {run_id} ended {status}: deepline runs show {run_id}"
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stderr.write(text + ".\n")
        return status in ("completed", "queued") and not closed

    def __enter__(self) -> NdjsonView:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.closed and self.stream is not None:
            try:
                self.stream.flush()
            except OSError as exc:
                self._reader_gone(exc)
