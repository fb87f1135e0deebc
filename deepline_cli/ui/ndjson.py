"""`--json`: every runtime event as one JSON object per line on stdout."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import IO, Any

from deepline_cli import _json
from deepline_cli.runtime.calls.events import Event
from deepline_cli.ui.streams import silence


class NdjsonView:
    """Writes events; when the reader goes away (`--json | head -1`), it stops writing and
    calls `on_closed` once, so the run is interrupted (resumable) rather than failed."""

    def __init__(self, stream: IO[str] | None = None, on_closed: Callable[[], None] | None = None) -> None:
        # The real stdout (own_stdout's while the play runs: its prints go to stderr meanwhile).
        self.stream = stream or sys.stdout
        self._to_stdout = stream is None
        self.on_closed = on_closed
        self.closed = False

    def handle(self, event: Event) -> None:
        self.write(event.to_dict())

    def write(self, payload: dict[str, Any]) -> None:
        if self.closed:
            return
        try:
            self.stream.write(_json.dumps_str(payload) + "\n")
            self.stream.flush()
        except BrokenPipeError:
            self._reader_gone()

    def _reader_gone(self) -> None:
        self.closed = True
        if self._to_stdout:
            silence(self.stream.fileno())
        if self.on_closed is not None:
            self.on_closed()

    def __enter__(self) -> NdjsonView:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.closed:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._reader_gone()
