"""Runs measured each in a process of its own, reporting one JSON line; best of several."""

from __future__ import annotations

import json
import statistics
import subprocess
from typing import Any


def child_report(cmd: list[str], **options: Any) -> dict:
    """Run `cmd` to its end (it must succeed) and read the JSON line it printed last."""
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, **options)
    return json.loads(out.stdout.strip().splitlines()[-1])


def best_of(runs: list[dict]) -> dict:
    """The fastest run's wall and CPU seconds, and the median wall time."""
    best = min(runs, key=lambda r: r["wall_s"])
    return {
        "wall_s": round(best["wall_s"], 2),
        "wall_median_s": round(statistics.median(r["wall_s"] for r in runs), 2),
        "cpu_s": round(best["cpu_s"], 2),
    }
