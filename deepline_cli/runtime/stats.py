"""Run statistics: tool calls live / reused / failed per tool, retries, credits.

While a run goes on these are counted in memory, on top of what earlier attempts did
(read from the store when the attempt starts), for the live view and `run.progress`.
When the attempt ends, the run's stats are read back from the store (`Store.run_stats`):
the calls ledger, the receipts it reused, its map rows and attempts, so an attempt that
was killed is counted too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ToolCounts:
    live: int = 0
    reused: int = 0
    failed: int = 0
    credits: float = 0.0
    retries: int = 0
    retry_reasons: Counter[str] = field(default_factory=Counter)  # "429", "5xx", "network"
    recovered: int = 0  # failures of rows that still succeeded (a waterfall fell through)

    def note_retry(self, reason: str) -> None:
        self.retries += 1
        self.retry_reasons[reason] += 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "live": self.live,
            "reused": self.reused,
            "failed": self.failed,
            "credits": self.credits,
            "retries": self.retries,
            "retry_reasons": dict(self.retry_reasons),
            "recovered": self.recovered,
        }


@dataclass(slots=True)
class RunStats:
    tools: dict[str, ToolCounts] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=lambda: {"live": 0, "reused": 0})

    @classmethod
    def since(cls, before: dict[str, Any], recovered: dict[str, Any]) -> RunStats:
        """Counts that start from what earlier attempts did (`Store.run_stats`, and the
        recovered failures and retries the run's last stats kept)."""
        stats = cls()
        for tool_id, c in (before.get("tools") or {}).items():
            stats.tools[tool_id] = ToolCounts(
                c.get("live", 0), c.get("reused", 0), c.get("failed", 0), c.get("credits", 0.0), c.get("retries", 0)
            )
        for tool_id, c in recovered.items():
            counts = stats.tool(tool_id)
            counts.recovered = int(c.get("recovered", 0))
            # Retries of calls an interruption abandoned are in no ledger row: the last
            # attempt's outcome counted them.
            counts.retries = max(counts.retries, int(c.get("retries", 0)))
            counts.retry_reasons.update(c.get("retry_reasons") or {})
        stats.steps.update(before.get("steps") or {})
        return stats

    def tool(self, tool_id: str) -> ToolCounts:
        counts = self.tools.get(tool_id)
        if counts is None:
            counts = self.tools[tool_id] = ToolCounts()
        return counts

    @property
    def credits(self) -> float:
        return sum(c.credits for c in self.tools.values())
