"""`--json`: every runtime event as one JSON object per line on stdout."""

from __future__ import annotations

import contextlib
import errno
import queue
import sys
import threading
from collections.abc import Callable
from typing import IO, Any

from deepline_cli import _json
from deepline_cli.runtime.calls.events import Event
from deepline_cli.ui.streams import silence

# Lines waiting for a reader that stopped reading, at most (a few MB): past them the run waits
# for it too, so a reader stalled for good does not fill the memory (one line a call).
WAITING_LINES = 20_000


class NdjsonView:
    """Writes events; when the reader goes away (`--json | head -1`) or stdout cannot be
    written (a full disk, a closed descriptor), it stops writing and calls `on_closed`
    once, so the run is interrupted (resumable) rather than failed.

    While a run goes on (inside `with`), lines after the first are written by a thread of
    their own: a reader that stops reading (`--json | slow-consumer`, a full pipe) keeps
    them waiting (up to WAITING_LINES), not the run, whose event loop makes the calls and
    keeps their leases. The first is written at once, so an output that cannot be written
    at all (`>&-`, a full disk) stops the run before it does anything."""

    def __init__(self, stream: IO[str] | None = None, on_closed: Callable[[], None] | None = None) -> None:
        # The real stdout (own_stdout's while the play runs: its prints go to stderr meanwhile).
        self.stream = stream or sys.stdout
        self._to_stdout = stream is None
        self.on_closed = on_closed
        self.closed = False
        self.failure: Exception | None = None  # why stdout could not be written (not a reader gone)
        self.reader_gone = False  # the reader closed its end (`--json | head -1`): the run was stopped for it
        self._lines: queue.Queue[str | None] | None = None  # to the writer thread, while there is one
        self._writer: threading.Thread | None = None
        self._written = False  # a line went out: the output can be written (later ones go by the thread)

    def handle(self, event: Event) -> None:
        self.write(event.to_dict())

    def write(self, payload: dict[str, Any]) -> None:
        if self.closed:
            return
        try:
            line = _json.dumps_str(payload) + "\n"
        except Exception as exc:  # a line that cannot be written
            self._reader_gone(exc)
            return
        if self._lines is not None and self._written:
            self._lines.put(line)
        else:  # the first line here: an output that cannot be written is known before any work
            self._write([line])
            self._written = not self.closed

    def _write(self, lines: list[str]) -> None:
        try:
            if self.stream is None:  # `>&-`: Python has no stdout at all
                raise OSError(errno.EBADF, "stdout is closed")
            self.stream.write("".join(lines))
            self.stream.flush()
        except Exception as exc:  # an output that fails (a full disk)
            self._reader_gone(exc)

    def _write_lines(self, lines: queue.Queue[str | None]) -> None:
        """The writer thread: every line waiting, one write and flush at a time, until None."""
        while True:
            waiting = [lines.get()]
            while not lines.empty():
                waiting.append(lines.get())
            end = None in waiting
            if not self.closed:
                self._write([line for line in waiting if line is not None])
            if end:
                return

    def _reader_gone(self, exc: Exception) -> None:
        self.closed = True
        if self._to_stdout and self.stream is not None:
            with contextlib.suppress(OSError, ValueError):
                silence(self.stream.fileno())
        if isinstance(exc, BrokenPipeError):
            self.reader_gone = True
        else:  # no reader to tell, the user is: said once the run ended
            self.failure = exc
        if self.on_closed is not None:
            self.on_closed()

    def said_unwritten(self, run_id: str, status: str) -> bool:
        """Say on stderr that the --json output could not be written, and what became of the
        run (interrupted: resumable; or it completed all the same). Whether that fails the
        command: an output a script will read (a full disk) does, a closed stdout does not."""
        exc = self.failure
        if exc is None:
            if self.reader_gone and status == "interrupted":  # stopped for it: said, or it looks like a crash
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    sys.stderr.write(
                        f"Run {run_id} stopped: the reader of its --json output went away; "
                        f"`deepline resume {run_id}` finishes it.\n"
                    )
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
        self._lines = queue.Queue(WAITING_LINES)
        self._writer = threading.Thread(
            target=self._write_lines, args=(self._lines,), name="deepline-json", daemon=True
        )
        self._writer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lines is not None and self._writer is not None:
            self._lines.put(None)
            self._writer.join()  # every line written (the reader reads them) before the command ends
            self._lines = self._writer = None
        if not self.closed and self.stream is not None:
            try:
                self.stream.flush()
            except OSError as exc:
                self._reader_gone(exc)
