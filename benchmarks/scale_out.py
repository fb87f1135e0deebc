"""PostgreSQL beside SQLite for one worker, round trips per durable call, and how fast a
worker starts a run whose event arrived among thousands of waiting runs.

1. One enqueued run of `--rows` rows x 2 HTTP calls (the headline's work: a loopback
   provider in its own process, 20 ms per request, 50 rows in flight), drained by one
   `deepline worker --once`, on a SQLite file and on PostgreSQL. Reported: both wall
   times and their ratio (goal: PostgreSQL <= 1.3x SQLite).
2. The same run on PostgreSQL through a counting TCP proxy: client requests that
   waited for an answer (round trips), divided by the durable calls made.
3. `--waiting` runs (default 10,000) waiting for events or sleeping for days, plus one
   waiting for "go"; a long-lived worker (LISTEN/NOTIFY) is idle; `deepline events send`
   delivers "go": the time until the worker says it is running that run (goal <= 1 s).

    python benchmarks/scale_out.py [--url postgresql://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from workers import CONFIG, PLAY, database, deepline, start_provider  # noqa: E402

from tests.pgproxy import PgProxy  # noqa: E402

WAITER = textwrap.dedent(
    """
    from deepline_cli import play

    @play("waiter")
    async def waiter(ctx, input):
        return await ctx.wait_for_event("go")
    """
)


def one_worker(store: str, play: Path, rows: int, env: dict[str, str]) -> dict[str, float]:
    env = {**env, "DEEPLINE_STORE": store}
    payload = json.dumps({"rows": rows, "tag": "one"})
    deepline("run", str(play), "--enqueue", "--run-id", "one", "--input", payload, "--quiet", env=env)
    start = time.perf_counter()
    deepline("worker", "--once", env=env)
    wall = time.perf_counter() - start
    shown = json.loads(deepline("runs", "show", "one", "--json", env=env).stdout)
    assert shown["status"] == "completed", shown["error"]
    calls = sum(t["live"] + t["reused"] for t in shown["stats"]["tools"].values())
    return {"wall_s": round(wall, 2), "store_s": shown["stats"]["store_s"], "calls": calls}


def fill_waiting(url: str, count: int) -> None:
    """`count` runs that a worker has no reason to touch: waiting for events that never
    come, or sleeping for days (as a store of a busy team holds)."""
    now = time.time()
    runs, boundaries = [], []
    for n in range(count):
        run_id = f"idle-{n}"
        event = n % 2 == 0
        runs.append((run_id, "waiter", "/gone/play.py:waiter", "{}", "waiting", 1, "default", "/", "{}", run_id,
                     now - n, now - n, None if event else now + 3 * 86400, "[]", ""))  # fmt: skip
        boundaries.append((run_id, "event:go" if event else "sleep:nap", "event" if event else "sleep", "waiting",
                           None if event else now + 3 * 86400, "go" if event else None, now))  # fmt: skip
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO runs (run_id, play, play_ref, input, status, attempt, workspace, cwd, options, root_run_id,"
            " created_at, updated_at, wake_at, ancestors, description) VALUES"
            " (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            runs,
        )
        cur.executemany(
            "INSERT INTO boundaries (run_id, id, kind, status, due_at, event_id, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            boundaries,
        )


def wake_up(url: str, folder: Path, waiting: int, env: dict[str, str]) -> dict[str, float]:
    env = {**env, "DEEPLINE_STORE": url}
    (folder / "waiter.py").write_text(WAITER)
    deepline("runs", "list", "--limit", "1", env=env)  # the schema, before the fill
    fill_waiting(url, waiting)
    subprocess.run(
        [sys.executable, "-m", "deepline_cli", "run", str(folder / "waiter.py"), "--run-id", "wanted",
         "--max-inline-wait", "0", "--quiet"], env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    worker = subprocess.Popen(
        [sys.executable, "-u", "-m", "deepline_cli", "worker"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        time.sleep(3)  # the worker has started, listened, and found nothing due
        sent = time.perf_counter()
        deepline("events", "send", "wanted", "go", "--payload", '"now"', env=env)
        assert worker.stderr is not None
        for line in worker.stderr:
            if "running wanted" in line:
                started = time.perf_counter() - sent
                break
        else:
            raise RuntimeError("the worker never ran the woken run")
    finally:
        worker.terminate()
        worker.communicate(timeout=30)
    return {"waiting_runs": waiting + 1, "event_to_start_s": round(started, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    args = parser.parse_args()
    provider, port = start_provider(args.latency_ms)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            play = folder / "workers_bench.py"
            play.write_text(PLAY)
            (folder / "deepline.toml").write_text(CONFIG.format(port=port))
            env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPLINE_")}
            env["XDG_CACHE_HOME"] = str(folder / "cache")
            sqlite = one_worker(str(folder / "one.db"), play, args.rows, env)
            postgres = one_worker(database(args.url, "deepline_bench_one"), play, args.rows, env)
            with PgProxy(database(args.url, "deepline_bench_rt")) as proxy:
                counted = one_worker(proxy.url, play, args.rows, env)
                trips = proxy.round_trips
            woken = wake_up(database(args.url, "deepline_bench_wake"), folder, args.waiting, env)
    finally:
        provider.kill()
        provider.wait()
    print(
        json.dumps(
            {
                "benchmark": "scale_out",
                "rows": args.rows,
                "sqlite": sqlite,
                "postgres": postgres,
                "postgres_over_sqlite": round(postgres["wall_s"] / sqlite["wall_s"], 2),
                "round_trips": trips,
                "round_trips_per_call": round(trips / counted["calls"], 2),
                **woken,
            }
        )
    )


if __name__ == "__main__":
    main()
