"""What the human views show, folded from runtime events (no drawing here)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from deepline_cli.runtime.events import Event


@dataclass
class RunView:
    run_id: str = ""
    play: str = ""
    attempt: int = 0
    started: float = field(default_factory=time.monotonic)
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    paced: dict[str, float] = field(default_factory=dict)
    status: str | None = None

    def apply(self, event: Event) -> None:
        data = event.data
        if event.event == "run.started":
            self.run_id, self.play, self.attempt = event.run_id, data["play"], data["attempt"]
            self.started = time.monotonic()
        elif event.event == "run.progress":
            self.tools = data.get("tools", {})
            self.paced = data.get("paced", {})
        elif event.event == "run.finished":
            self.status = data["status"]
            self.tools = data.get("stats", {}).get("tools", self.tools)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started
