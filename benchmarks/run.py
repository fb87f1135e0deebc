"""Run every benchmark, one after the other, and print one JSON line each.

    python benchmarks/run.py            # the figures in BENCHMARKS.md (about 30 minutes)
    python benchmarks/run.py --quick    # smaller sizes, for a smoke check
    python benchmarks/run.py --postgres postgresql://postgres@127.0.0.1:5432/postgres
                                        # ... and the PostgreSQL scale-out figures

Results are also written to benchmarks/results/latest.jsonl.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from installed import compiled

HERE = Path(__file__).resolve().parent

FULL = [
    ["cold_start.py", "--runs", "10"],
    ["durable_calls.py", "--calls", "100000", "--in-flight", "64"],
    ["map_rows.py", "--rows", "1000000", "--rerun-rows", "100000"],
    ["headline.py", "--rows", "10000"],
    ["answers.py", "--rows", "3000", "--rounds", "3"],
    ["rate_limit.py", "--calls", "40", "--rounds", "3"],
    ["map_floor.py", "--rows", "100000", "--rounds", "3"],
]
POSTGRES = [
    ["workers.py", "--workers", "1,2,4"],
    ["scale_out.py", "--rows", "10000", "--waiting", "10000"],
]
POSTGRES_QUICK = [
    ["workers.py", "--workers", "1,2", "--rows", "200"],
    ["scale_out.py", "--rows", "500", "--waiting", "1000"],
]
QUICK = [
    ["cold_start.py", "--runs", "5"],
    ["durable_calls.py", "--calls", "10000"],
    ["map_rows.py", "--rows", "20000", "--rerun-rows", "20000"],
    ["headline.py", "--rows", "1000", "--skip-dbos"],
    ["answers.py", "--rows", "500", "--rounds", "1"],
    ["rate_limit.py", "--calls", "40", "--rounds", "1"],
    ["map_floor.py", "--rows", "20000", "--rounds", "1"],
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--postgres", metavar="URL", help="also the PostgreSQL benchmarks, against this server")
    args = parser.parse_args()
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    lines = []
    plan = QUICK if args.quick else FULL
    if args.postgres:
        plan = plan + [[*cmd, "--url", args.postgres] for cmd in (POSTGRES_QUICK if args.quick else POSTGRES)]
    compiled()  # once for every benchmark's processes, as an install has it
    for script, *flags in plan:
        print(f"# {script} {' '.join(flags)}", file=sys.stderr, flush=True)
        out = subprocess.run([sys.executable, str(HERE / script), *flags], check=True, capture_output=True, text=True)
        line = out.stdout.strip().splitlines()[-1]
        print(line, flush=True)
        lines.append(line)
    (results / "latest.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
