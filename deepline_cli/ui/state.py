"""What the human views show, folded from runtime events (no drawing here)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from deepline_cli.runtime.events import Event


@dataclass
class MapView:
    name: str
    total: int | None = None
    done: int = 0
    succeeded: int = 0
    failed: int = 0
    duplicate: int = 0
    reused: int = 0
    seeded: int = 0
    rows_per_s: float = 0.0
    eta_s: float | None = None
    completed: bool = False
    visibility: str | None = None
    finalization: str | None = None


@dataclass
class RunView:
    run_id: str = ""
    play: str = ""
    attempt: int = 0
    started: float = field(default_factory=time.monotonic)
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    paced: dict[str, float] = field(default_factory=dict)
    status: str | None = None
    maps: dict[str, MapView] = field(default_factory=dict)

    def apply(self, event: Event) -> None:
        data = event.data
        if event.event.startswith(("map.", "barrier.")):
            self._apply_map(event.event, data)
        elif event.event == "run.started":
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

    def _apply_map(self, name: str, data: dict[str, Any]) -> None:
        view = self.maps.setdefault(data["map"], MapView(data["map"]))
        if name == "map.started":
            view.total = data.get("total")
        elif name == "map.progress":
            for attr in (
                "total",
                "done",
                "succeeded",
                "failed",
                "duplicate",
                "reused",
                "seeded",
                "rows_per_s",
                "eta_s",
            ):
                setattr(view, attr, data.get(attr, getattr(view, attr)))
        elif name == "barrier.visibility":
            mark = "✓" if data["passed"] else "✗"
            reads = data["reads"]
            view.visibility = (
                f"{mark} {data['visible']:,}/{data['expected']:,} visible ({reads} read{'s' if reads != 1 else ''})"
            )
        elif name == "barrier.finalization":
            view.finalization = "✓ reconciled" if data["passed"] else f"✗ missing {data.get('missing')}"
        elif name == "map.completed":
            view.completed = True
            view.succeeded, view.failed = data["succeeded"], data["failed"]
            view.duplicate, view.reused = data["duplicate"], data["reused"]
            view.done = view.succeeded + view.failed
            view.total = view.done + view.duplicate
