"""Runtime events: what the runtime tells the outside world while a run goes on.

The runtime emits; the UI (Rich view, plain lines, NDJSON) draws. Nothing here knows
how an event is shown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from deepline_cli import _json
from deepline_cli.errors import UsageError


@dataclass(slots=True)
class Event:
    event: str
    run_id: str
    ts: float
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.event, "run_id": self.run_id, "ts": self.ts, **self.data}


Listener = Callable[[Event], None]


class EventBus:
    """Fan-out of events to listeners; `wants` lets hot paths skip unwanted events."""

    def __init__(self, listeners: list[Listener] | None = None, *, per_call: bool = False) -> None:
        self._listeners = list(listeners or [])
        # `tool.call` events are one per call: only built when a listener asked for them.
        self.per_call = per_call
        # What listeners raised: each is unsubscribed then. A view's error never reaches the
        # run's work (a row whose call emitted the event would be kept as failed).
        self.failures: list[BaseException] = []

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def emit(self, name: str, run_id: str, **data: Any) -> None:
        if not self._listeners:
            return
        event = Event(name, run_id, time.time(), data)
        failed: list[Listener] | None = None  # none made for the events that go well
        for listener in self._listeners:
            try:
                listener(event)
            except Exception as exc:
                self.failures.append(exc)
                failed = [*failed, listener] if failed else [listener]
        if failed:
            self._listeners = [listener for listener in self._listeners if listener not in failed]


def log_fields(fields: dict[str, Any]) -> dict[str, Any] | None:
    """The fields a play attached to a log line (`ctx.log(msg, **fields)`): JSON values only,
    so they read back the same from either store."""
    for name, value in fields.items():
        try:
            _json.canonical(value)
        except TypeError as exc:
            raise UsageError(f"Log field {name!r} is not a JSON value: {exc}.") from None
    return dict(fields) or None
