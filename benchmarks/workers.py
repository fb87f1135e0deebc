"""Scale-out on PostgreSQL: the same enqueued work drained by 1, 2 and 4 worker processes.

The work: `--runs` runs (default 4) of `--rows` rows each (default 1,000), every row two
HTTP tool calls one after the other to a loopback provider with 20 ms latency (started
as its own process), 50 rows in flight per run. Each worker process runs one run at a
time. Reported per worker count: wall time, rows/s, and the store's share of the time
(the runs' store-thread busy time over their duration).

    python benchmarks/workers.py [--url postgresql://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent

PLAY = textwrap.dedent(
    """
    from deepline_cli import play

    @play("workers-bench")
    async def bench(ctx, input):
        rows = [{"domain": f"{input['tag']}-{i}.example"} for i in range(input["rows"])]
        done = await ctx.map(
            "rows", rows, key="domain", concurrency=50,
            columns={
                "company": lambda row, rc: rc.tools.execute("company", "bench.company", {"domain": row["domain"]}),
                "email": lambda row, rc: rc.tools.execute(
                    "email", "bench.email", {"domain": row["domain"], "path": row["company"]["path"]}
                ),
            },
        )
        return {"rows": len(done), "failed": done.failed_count}
    """
)
CONFIG = textwrap.dedent(
    """
    [tools."bench.company"]
    method = "POST"
    url = "http://127.0.0.1:{port}/v1/company"
    json = {{ domain = "{{domain}}" }}

    [tools."bench.email"]
    method = "POST"
    url = "http://127.0.0.1:{port}/v1/email"
    json = {{ domain = "{{domain}}", from = "{{path}}" }}
    """
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_provider(latency_ms: float) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "provider.py"), "--port", str(port), "--latency-ms", str(latency_ms)],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the loopback provider did not start")


def database(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    head, _, _ = admin_url.partition("?")[0].rpartition("/")
    return f"{head}/{name}"


def deepline(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deepline_cli", *args], env=env, check=True, capture_output=True, text=True
    )


def measure(workers: int, args: argparse.Namespace, play: Path, env: dict[str, str]) -> dict[str, float]:
    url = database(args.url, f"deepline_bench_w{workers}")
    env = {**env, "DEEPLINE_STORE": url}
    for n in range(args.runs):
        payload = json.dumps({"rows": args.rows, "tag": f"w{workers}r{n}"})
        deepline("run", str(play), "--enqueue", "--input", payload, "--quiet", env=env)
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "deepline_cli", "worker", "--once"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(workers)
    ]
    for proc in procs:
        proc.wait()
    wall = time.perf_counter() - start
    runs = [json.loads(line) for line in deepline("runs", "list", "--json", env=env).stdout.splitlines()]
    assert all(r["status"] == "completed" for r in runs), [r["status"] for r in runs]
    rows = sum(r["output"]["rows"] for r in runs)
    assert rows == args.runs * args.rows, rows
    store_s = sum(r["stats"]["store_s"] for r in runs)
    busy_s = sum(r["stats"]["duration_s"] for r in runs)
    with psycopg.connect(args.url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "deepline_bench_w{workers}" WITH (FORCE)')
    return {
        "workers": workers,
        "wall_s": round(wall, 2),
        "rows_per_s": round(rows / wall),
        "calls_per_s": round(2 * rows / wall),
        "store_share": round(store_s / busy_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--workers", default="1,2,4")
    args = parser.parse_args()
    provider, port = start_provider(args.latency_ms)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            play = Path(tmp) / "workers_bench.py"
            play.write_text(PLAY)
            (Path(tmp) / "deepline.toml").write_text(CONFIG.format(port=port))
            env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPLINE_")}
            env["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")
            results = [measure(int(w), args, play, env) for w in args.workers.split(",")]
    finally:
        provider.kill()
        provider.wait()
    print(
        json.dumps({"benchmark": "workers_postgres", "runs": args.runs, "rows_per_run": args.rows, "results": results})
    )


if __name__ == "__main__":
    main()
