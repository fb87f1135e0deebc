"""`--json`: every runtime event as one JSON object per line on stdout."""

from __future__ import annotations

import sys
from typing import IO, Any

from deepline_cli import _json
from deepline_cli.runtime.events import Event


class NdjsonView:
    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream or sys.stdout

    def handle(self, event: Event) -> None:
        self.write(event.to_dict())

    def write(self, payload: dict[str, Any]) -> None:
        self._stream.write(_json.dumps_str(payload) + "\n")
        self._stream.flush()

    def __enter__(self) -> NdjsonView:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.flush()
