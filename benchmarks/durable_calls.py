"""Durable calls per second: a no-op local tool through ctx.tools.execute.

100,000 distinct calls, 64 in flight, on a fresh SQLite store, beside the same loop
with no store at all (the cost of asyncio alone).

    python benchmarks/durable_calls.py [--calls N] [--in-flight K]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path

PLAY = textwrap.dedent(
    """
    import asyncio
    from deepline_cli import play, tool

    @tool("bench.noop")
    async def noop(input):
        return {"n": input["n"]}

    @play("bench-durable")
    async def bench(ctx, input):
        total, in_flight = input["calls"], input["in_flight"]
        queue = iter(range(total))

        async def worker():
            for n in queue:
                await ctx.tools.execute("noop", "bench.noop", {"n": n})

        await asyncio.gather(*(worker() for _ in range(in_flight)))
        return {"calls": total}
    """
)


async def plain_loop(total: int, in_flight: int) -> None:
    async def noop(input: dict) -> dict:
        return {"n": input["n"]}

    queue = iter(range(total))

    async def worker() -> None:
        for n in queue:
            await noop({"n": n})

    await asyncio.gather(*(worker() for _ in range(in_flight)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--in-flight", type=int, default=64)
    args = parser.parse_args()

    from deepline_cli.runtime.calls.events import EventBus
    from deepline_cli.runtime.run.options import RunOptions
    from deepline_cli.runtime.run.runner import Runner

    with tempfile.TemporaryDirectory() as tmp:
        play_file = Path(tmp) / "bench_play.py"
        play_file.write_text(PLAY)
        runner = Runner(RunOptions(store=os.path.join(tmp, "bench.db")), EventBus())
        start = time.perf_counter()
        result = runner.start(str(play_file), {"calls": args.calls, "in_flight": args.in_flight})
        durable_s = time.perf_counter() - start
        runner.close()
        assert result.status == "completed", result.error
        live = result.stats["tools"]["bench.noop"]["live"]
        assert live == args.calls, live

    start = time.perf_counter()
    asyncio.run(plain_loop(args.calls, args.in_flight))
    plain_s = time.perf_counter() - start
    report = {
        "benchmark": "durable_calls",
        "calls": args.calls,
        "in_flight": args.in_flight,
        "durable_s": round(durable_s, 3),
        "durable_calls_per_s": round(args.calls / durable_s),
        "no_store_s": round(plain_s, 3),
        "no_store_calls_per_s": round(args.calls / plain_s),
        "python": sys.version.split()[0],
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
