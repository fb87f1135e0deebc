"""`deepline --help` cold start: median wall time of N runs of the installed command.

python benchmarks/cold_start.py [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from installed import compiled


def command() -> list[str]:
    script = Path(sys.executable).parent / "deepline"
    if script.exists():
        return [str(script), "--help"]
    found = shutil.which("deepline")
    return [found, "--help"] if found else [sys.executable, "-m", "deepline_cli", "--help"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    cmd = command()
    compiled()
    subprocess.run(cmd, check=True, capture_output=True)  # warm the OS file cache once
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    print(
        json.dumps(
            {
                "benchmark": "cold_start",
                "command": " ".join(Path(cmd[0]).name if i == 0 else c for i, c in enumerate(cmd)),
                "runs": args.runs,
                "median_ms": round(statistics.median(times) * 1000, 1),
                "min_ms": round(min(times) * 1000, 1),
                "max_ms": round(max(times) * 1000, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
