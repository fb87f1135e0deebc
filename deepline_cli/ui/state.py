"""What the human views show, folded from runtime events (no drawing here)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from deepline_cli._format import sum_credits
from deepline_cli.runtime.calls.events import Event
from deepline_cli.store.records import NOT_FOUND
from deepline_cli.ui.text import printable


@dataclass
class MapView:
    name: str
    total: int | None = None
    done: int = 0  # distinct rows finished, of `total` (distinct rows, once a map.progress says it)
    succeeded: int = 0
    failed: int = 0
    duplicate: int = 0
    reused: int = 0  # rows taken whole from the sheet as earlier runs left them (every attempt)
    reused_cells: int = 0  # cells taken from the sheet
    seeded: int = 0  # rows an earlier attempt finished well (not run again)
    earlier: int = 0  # rows earlier attempts of this run finished (those they reused aside)
    rows_per_s: float = 0.0
    eta_s: float | None = None
    completed: bool = False
    visibility: str | None = None  # in words, pending or passed
    finalization: str | None = None
    waterfalls: dict[str, list[str]] = field(default_factory=dict)  # column -> its steps, in order
    steps: dict[str, dict[str, int]] = field(default_factory=dict)  # column -> step (or "none") -> rows
    limit: int | None = None  # a pilot's: its total counts distinct rows
    last_failed: str | None = None  # `row acme.com failed: …`: the latest, while the map runs


@dataclass
class RunView:
    """What the views show of a run, folded from its events: tools' counts, pacing and
    pauses, and each map's progress."""

    run_id: str = ""
    play: str = ""
    attempt: int = 0
    started: float = field(default_factory=time.monotonic)
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    paced: dict[str, float] = field(default_factory=dict)
    paused: dict[str, float] = field(default_factory=dict)
    maps: dict[str, MapView] = field(default_factory=dict)
    finished: dict[str, Any] | None = None  # the run.finished event

    def apply(self, event: Event) -> None:
        data = event.data
        if event.event.startswith(("map.", "barrier.")):
            self._apply_map(event.event, data)
        elif event.event == "run.started":
            self.run_id, self.play, self.attempt = event.run_id, printable(data["play"]), data["attempt"]
            self.started = time.monotonic()
        elif event.event == "run.progress":
            self.tools = _shown(data.get("tools", {}))
            self.paced = data.get("paced", {})
            self.paused = data.get("paused", {})
        elif event.event == "run.finished" and event.run_id == (self.run_id or event.run_id):
            self.finished = {"run_id": event.run_id, **data}
            self.tools = _shown(data.get("stats", {}).get("tools")) or self.tools
            self.paced, self.paused = {}, {}

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def credits(self) -> float:
        return sum_credits(float(c.get("credits", 0)) for c in self.tools.values())

    def _apply_map(self, name: str, data: dict[str, Any]) -> None:
        view = self.maps.setdefault(data["map"], MapView(printable(data["map"])))
        if name == "map.started":
            view.total = data.get("total")
            view.limit = data.get("limit")
            view.waterfalls = data.get("steps") or {}
        elif name == "map.progress":
            for attr in _PROGRESS:
                setattr(view, attr, data.get(attr, getattr(view, attr)))
        elif name == "barrier.visibility":
            view.visibility = visibility_words(data)
        elif name == "barrier.finalization":
            view.finalization = finalization_words(data)
        elif name == "map.completed":
            view.completed = True
            view.succeeded, view.failed = data["succeeded"], data["failed"]
            view.duplicate, view.reused = data["duplicate"], data["reused"]
            view.reused_cells, view.earlier = data.get("reused_cells", 0), data.get("earlier", 0)
            view.steps = data.get("steps") or view.steps
            view.done = view.total = view.succeeded + view.failed


_PROGRESS = ("total", "done", "succeeded", "failed", "duplicate", "reused", "reused_cells", "seeded", "earlier",
             "rows_per_s", "eta_s", "steps", "last_failed")  # fmt: skip


def step_hits(order: list[str], hits: dict[str, int]) -> str:
    """`hunter 120 · apollo 40 · not found 8`: a waterfall's hits, in its steps' order."""
    names = [*order, *(name for name in hits if name not in order and name != NOT_FOUND)]
    shown = [f"{name} {hits.get(name, 0):,}" for name in names]
    if hits.get(NOT_FOUND):
        shown.append(f"not found {hits[NOT_FOUND]:,}")
    return " · ".join(shown)


def visibility_words(data: dict[str, Any]) -> str:
    """The visibility barrier in a data engineer's words."""
    expected, visible, reads = data["expected"], data["visible"], data["reads"]
    if data["passed"] is None:
        return f"checking {expected:,} rows are stored…"
    if data["passed"]:
        return f"✓ {visible:,}/{expected:,} rows stored and read back ({reads} read{'s' if reads != 1 else ''})"
    return f"✗ only {visible:,} of {expected:,} rows visible in the store after {reads} reads"


def finalization_words(data: dict[str, Any]) -> str:
    rows, distinct, duplicate = data["rows"], data["distinct"], data["duplicate"]
    if data["passed"] is None:
        return f"checking all {rows:,} input rows are accounted for…"
    if data["passed"]:
        dup = f" + {duplicate:,} duplicate" if duplicate else ""
        return f"✓ all {rows:,} input rows accounted for ({distinct:,} distinct{dup})"
    return f"✗ input rows not accounted for: {', '.join(str(i) for i in data.get('missing') or [])}"


def _shown(tools: dict[str, Any] | None) -> dict[str, Any]:
    """Per tool, by its id as a terminal may show it (an id is the play's or its config's text)."""
    return {printable(tool): counts for tool, counts in (tools or {}).items()}
