"""Map throughput and memory.

1. A CSV of N rows (default 1,000,000) through a map with two cheap local-tool columns:
   rows/s and peak RSS of the process.
2. Re-running a completed map of M rows (default 100,000) in a new run: every cell is
   reused, zero tool calls: rows/s.

Each part runs in its own subprocess so peak RSS is that run's alone.

    python benchmarks/map_rows.py [--rows N] [--rerun-rows M]
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PLAY = textwrap.dedent(
    """
    from deepline_cli import play, tool

    @tool("bench.upper")
    async def upper(input):
        return input["name"].upper()

    @tool("bench.length")
    async def length(input):
        return len(input["name"])

    @play("bench-map")
    async def bench(ctx, input):
        rows = await ctx.map(
            "people", ctx.csv(input["csv"]), key="id",
            columns={
                "upper": lambda row, rc: rc.tools.execute("upper", "bench.upper", {"name": row["name"]}),
                "length": lambda row, rc: rc.tools.execute("length", "bench.length", {"name": row["name"]}),
            },
        )
        return {"rows": len(rows), "failed": rows.failed_count}
    """
)


def write_csv(path: Path, rows: int) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "name", "domain"])
        for i in range(rows):
            writer.writerow([i, f"person {i}", f"company{i % 5000}.com"])


def one_run(store: str, play: str, csv_path: str) -> None:
    """Child process: run the play once, print seconds, stats and peak RSS as JSON."""
    from deepline_cli.runtime.calls.events import EventBus
    from deepline_cli.runtime.run.options import RunOptions
    from deepline_cli.runtime.run.runner import Runner

    runner = Runner(RunOptions(store=store), EventBus())
    start = time.perf_counter()
    result = runner.start(play, {"csv": csv_path})
    seconds = time.perf_counter() - start
    runner.close()
    assert result.status == "completed", result.error
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "stats": result.stats, "peak_rss_mb": peak_mb}))


def measure(store: Path, play: Path, csv_path: Path) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(store), str(play), str(csv_path)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rerun-rows", type=int, default=100_000)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        one_run(*args.child)
        return
    report: dict = {"benchmark": "map_rows"}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        play = root / "bench_map.py"
        play.write_text(PLAY)
        big = root / "big.csv"
        write_csv(big, args.rows)
        first = measure(root / "big.db", play, big)
        tools = first["stats"]["tools"]
        assert first["stats"]["rows"]["succeeded"] == args.rows, first["stats"]
        report.update(
            rows=args.rows,
            seconds=round(first["seconds"], 2),
            rows_per_s=round(args.rows / first["seconds"]),
            peak_rss_mb=round(first["peak_rss_mb"]),
            tool_calls=sum(t["live"] for t in tools.values()),
        )
        small = root / "small.csv"
        write_csv(small, args.rerun_rows)
        measure(root / "rerun.db", play, small)  # fills the sheet
        again = measure(root / "rerun.db", play, small)  # every cell reused
        live = sum(t["live"] for t in again["stats"]["tools"].values())
        assert live == 0 and again["stats"]["rows"]["reused"] == args.rerun_rows, again["stats"]
        report.update(
            rerun_rows=args.rerun_rows,
            rerun_seconds=round(again["seconds"], 2),
            rerun_rows_per_s=round(args.rerun_rows / again["seconds"]),
            rerun_tool_calls=live,
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
