"""deepline's map beside the floor: a plain script doing the same durable work by hand.

The work, per row of a CSV: a durable call of a cheap sync local tool (its receipt keyed
by the sha256 of the tool and its canonical-JSON input) and one pure column; a receipt row
and a sheet row written; committed every 1,000 rows to a SQLite file in WAL mode. The
floor does exactly that and nothing else (no leases, no fencing, no resume, no barriers,
no progress); deepline runs the same play with all of it. Each side runs in its own
process, best of `--rounds` (and the median), with its CPU time and peak RSS; then
deepline re-runs the completed map in a new run (every cell reused, no call).

    python benchmarks/map_floor.py [--rows 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import resource
import sqlite3
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import orjson
from installed import compiled
from rounds import best_of, child_report

PLAY = textwrap.dedent(
    """
    from deepline_cli import play, tool

    @tool("floor.upper")
    def upper(input):
        return input["name"].upper()

    @play("floor")
    async def floor(ctx, input):
        rows = await ctx.map(
            "people", ctx.csv(input["csv"]), key="id",
            columns={
                "upper": lambda row, rc: rc.tools.execute("upper", "floor.upper", {"name": row["name"]}),
                "domain_len": lambda row: len(row["domain"]),
            },
        )
        return {"rows": len(rows)}
    """
)


def upper(input: dict) -> str:
    return input["name"].upper()


def floor(store: str, csv_path: str) -> int:
    """The hand-written durable map: what a careful engineer writes without deepline."""
    conn = sqlite3.connect(store, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE IF NOT EXISTS receipts (key TEXT PRIMARY KEY, output BLOB, at REAL)")
    conn.execute("CREATE TABLE IF NOT EXISTS sheet (key TEXT PRIMARY KEY, cells BLOB, at REAL)")
    receipts: list[tuple[str, bytes, float]] = []
    sheet: list[tuple[str, bytes, float]] = []
    done = 0

    def commit() -> None:
        conn.execute("BEGIN")
        conn.executemany("INSERT OR REPLACE INTO receipts VALUES (?, ?, ?)", receipts)
        conn.executemany("INSERT OR REPLACE INTO sheet VALUES (?, ?, ?)", sheet)
        conn.execute("COMMIT")
        receipts.clear()
        sheet.clear()

    with open(csv_path, newline="") as handle:
        for row in csv.DictReader(handle):
            tool_input = {"name": row["name"]}
            key = hashlib.sha256(b"floor.upper\0" + orjson.dumps(tool_input, option=orjson.OPT_SORT_KEYS)).hexdigest()
            output = upper(tool_input)
            now = time.time()
            receipts.append((key, orjson.dumps(output), now))
            cells = {"upper": output, "domain_len": len(row["domain"])}
            sheet.append((row["id"], orjson.dumps(cells), now))
            done += 1
            if len(sheet) >= 1000:
                commit()
    commit()
    conn.close()
    return done


def deepline(store: str, play: str, csv_path: str) -> int:
    from deepline_cli.runtime.calls.events import EventBus
    from deepline_cli.runtime.run.options import RunOptions
    from deepline_cli.runtime.run.runner import Runner

    runner = Runner(RunOptions(store=store), EventBus())
    try:
        result = runner.start(play, {"csv": csv_path})
    finally:
        runner.close()
    assert result.status == "completed", result.error
    return int(result.output["rows"])


def child(which: str, store: str, play: str, csv_path: str) -> None:
    """In its own process: one run, its wall and CPU seconds and peak RSS as JSON."""
    start, cpu = time.perf_counter(), time.process_time()
    rows = floor(store, csv_path) if which == "floor" else deepline(store, play, csv_path)
    print(
        json.dumps(
            {
                "rows": rows,
                "wall_s": time.perf_counter() - start,
                "cpu_s": time.process_time() - cpu,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def measure(which: str, store: Path, play: Path, csv_path: Path) -> dict:
    return child_report([sys.executable, __file__, "--child", which, str(store), str(play), str(csv_path)])


def summary(runs: list[dict], rows: int) -> dict:
    best = best_of(runs)
    return {
        **best,
        "cpu_us_per_row": round(best["cpu_s"] / rows * 1e6, 1),
        "rows_per_s": round(rows / best["wall_s"]),
        "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    compiled()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        play, data = root / "floor_play.py", root / "rows.csv"
        play.write_text(PLAY)
        with data.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["id", "name", "domain"])
            writer.writerows([i, f"person {i}", f"company{i % 5000}.com"] for i in range(args.rows))
        floors, firsts = [], []
        for n in range(args.rounds):  # interleaved, so both see the same machine
            floors.append(measure("floor", root / f"floor-{n}.db", play, data))
            firsts.append(measure("deepline", root / f"deepline-{n}.db", play, data))
        reruns = [measure("deepline", root / "deepline-0.db", play, data) for _ in range(args.rounds)]
    floor_s, first_s, rerun_s = (summary(r, args.rows) for r in (floors, firsts, reruns))
    print(
        json.dumps(
            {
                "benchmark": "map_floor",
                "rows": args.rows,
                "rounds": args.rounds,
                "floor": floor_s,
                "deepline_first_run": first_s,
                "deepline_rerun": rerun_s,
                "first_run_wall_ratio": round(first_s["wall_s"] / floor_s["wall_s"], 2),
                "first_run_cpu_ratio": round(first_s["cpu_s"] / floor_s["cpu_s"], 2),
                "rerun_rows_per_s_ratio": round(rerun_s["rows_per_s"] / floor_s["rows_per_s"], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
