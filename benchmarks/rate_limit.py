"""A tool's rate limit as its provider sees it: N calls under "R/s", run the way a user
runs them (a fresh `deepline` process), with arrival times measured at a loopback
provider. Prints the busiest one-second window (the limit says at most R, plus one at
the window's edge) and the span of the arrivals (paced exactly: (N - 1) / R seconds).
Exits 1 when the busiest window holds more than R + 1 arrivals.

python benchmarks/rate_limit.py [--calls 40] [--rate 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.provider import Provider, ProviderServer

PLAY = """\
import asyncio

from deepline_cli import play


@play("paced")
async def paced(ctx, input):
    calls = [ctx.tools.execute(f"c{i}", "bench.rated", {"i": i}) for i in range(input["calls"])]
    return len(await asyncio.gather(*calls))
"""


def one_round(folder: Path, calls: int, rate: int) -> dict[str, float]:
    with ProviderServer(Provider()) as provider:
        (folder / "deepline.toml").write_text(
            f'[tools."bench.rated"]\nurl = "{provider.url}/rated/{{i}}"\nrate_limit = "{rate}/s"\n'
        )
        store = folder / f"store-{len(list(folder.glob('store-*')))}.db"
        payload = json.dumps({"calls": calls})
        subprocess.run(
            [sys.executable, "-m", "deepline_cli", "run", "play.py", "--quiet", "--input", payload],
            cwd=folder, check=True, capture_output=True, env={"DEEPLINE_STORE": str(store), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        times = sorted(seen.at for seen in provider.requests)
    assert len(times) == calls, f"{len(times)} of {calls} calls arrived"
    busiest = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
    return {"busiest_second": busiest, "span_s": round(times[-1] - times[0], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--rate", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "play.py").write_text(PLAY)
        rounds = [one_round(folder, args.calls, args.rate) for _ in range(args.rounds)]
    worst = max(r["busiest_second"] for r in rounds)
    print(
        json.dumps(
            {
                "benchmark": "rate_limit",
                "calls": args.calls,
                "limit_per_s": args.rate,
                "paced_span_s": round((args.calls - 1) / args.rate, 3),
                "rounds": rounds,
                "worst_busiest_second": worst,
            }
        )
    )
    sys.exit(0 if worst <= args.rate + 1 else 1)


if __name__ == "__main__":
    main()
