"""Run statistics: tool calls live / reused / failed per tool, credits, rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ToolCounts:
    live: int = 0
    reused: int = 0
    failed: int = 0
    credits: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"live": self.live, "reused": self.reused, "failed": self.failed, "credits": self.credits}


@dataclass(slots=True)
class RunStats:
    tools: dict[str, ToolCounts] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=lambda: {"succeeded": 0, "failed": 0, "duplicate": 0, "reused": 0})
    steps: dict[str, int] = field(default_factory=lambda: {"live": 0, "reused": 0})

    def tool(self, tool_id: str) -> ToolCounts:
        counts = self.tools.get(tool_id)
        if counts is None:
            counts = self.tools[tool_id] = ToolCounts()
        return counts

    @property
    def credits(self) -> float:
        return sum(c.credits for c in self.tools.values())

    def to_dict(
        self, *, attempts: int, duration_s: float, previous: dict[str, Any], store_s: float = 0.0
    ) -> dict[str, Any]:
        """The stats of the whole run: paid work (live, failed, credits) adds up over
        attempts; reuse and rows describe the latest attempt, which saw every row."""
        tools: dict[str, dict[str, Any]] = {}
        for tool_id, before in (previous.get("tools") or {}).items():
            tools[tool_id] = {
                "live": before.get("live", 0),
                "reused": 0,
                "failed": before.get("failed", 0),
                "credits": before.get("credits", 0.0),
            }
        for tool_id, counts in self.tools.items():
            merged = tools.setdefault(tool_id, {"live": 0, "reused": 0, "failed": 0, "credits": 0.0})
            merged["live"] += counts.live
            merged["failed"] += counts.failed
            merged["credits"] += counts.credits
            merged["reused"] = counts.reused
        return {
            "rows": dict(self.rows),
            "tools": tools,
            "steps": dict(self.steps),
            "credits": sum(t["credits"] for t in tools.values()),
            "attempts": attempts,
            "duration_s": round(previous.get("duration_s", 0.0) + duration_s, 3),
            "store_s": round(previous.get("store_s", 0.0) + store_s, 3),  # the store thread's busy time
        }
