"""PostgreSQL connection cuts: one run of a map whose local tool logs every execution, its
store reached through a TCP proxy that drops every open connection (as a failover or a
network blip would) every 0.2-0.8 s, refusing new ones for up to 0.5 s, until N cuts.
Afterwards:

- the run completed, every row once;
- each call was executed (the tool's own log) once at least, and the executions beyond
  that are at most the calls in flight at a cut (a cut may lose a commit's answer);
- the store holds one completed receipt per call and one ledger line per execution it
  knows of, with their credits.

    python tests/pg_cuts.py --rows 1500 --cuts 30 --url postgresql://postgres@127.0.0.1:5432/postgres

The database `deepline_cuts` is made anew on that server for each invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for where in (ROOT, ROOT / "benchmarks"):
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))

import psycopg  # noqa: E402
from workers import database  # noqa: E402

from tests.pgproxy import PgProxy  # noqa: E402
from tests.test_scale_out import WORK  # noqa: E402

IN_FLIGHT = 10  # WORK's map concurrency


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1500)
    parser.add_argument("--cuts", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres", help="a server's admin URL")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    url = database(args.url, "deepline_cuts")
    with tempfile.TemporaryDirectory(prefix="deepline-cuts-") as tmp, PgProxy(url) as proxy:
        folder = Path(tmp)
        (folder / "play.py").write_text(WORK)
        log, out, err = folder / "calls.log", folder / "out.jsonl", folder / "err.txt"
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPLINE_")}
        env |= {"DEEPLINE_STORE": proxy.url, "XDG_CACHE_HOME": str(folder / "cache")}
        payload = json.dumps({"n": args.rows, "log": str(log)})
        with out.open("w") as stdout, err.open("w") as stderr:
            command = ["run", "play.py", "--input", payload, "--run-id", "cuts", "--json"]
            proc = subprocess.Popen(
                [sys.executable, "-m", "deepline_cli", *command],
                cwd=folder, env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            while proc.poll() is None and not log.exists():  # cut once the run is under way, not while it opens
                time.sleep(0.05)
            cuts = 0
            while proc.poll() is None and cuts < args.cuts:
                time.sleep(rng.uniform(0.2, 0.8))
                if proc.poll() is None and proxy.cut(refuse_for_s=rng.uniform(0.0, 0.5)):
                    cuts += 1
            code = proc.wait(timeout=600)
        executed = log.read_text().split() if log.exists() else []
        lines = out.read_text().splitlines()
        finished = json.loads(lines[-1]) if lines else {}
        stderr_tail = err.read_text().strip().splitlines()[-3:]
    with psycopg.connect(url) as conn:
        receipts = conn.execute("SELECT status, count(*), coalesce(sum(credits), 0) FROM receipts GROUP BY status")
        by_status = {status: (count, float(credits)) for status, count, credits in receipts.fetchall()}
        ledger = conn.execute("SELECT count(*), count(DISTINCT key), coalesce(sum(credits), 0) FROM calls").fetchone()
    assert ledger is not None
    report = {
        "rows": args.rows,
        "cuts": cuts,
        "exit": code,
        "status": finished.get("status"),
        "output": finished.get("output"),
        "executed": len(executed),
        "distinct_executed": len(set(executed)),
        "receipts": by_status,
        "ledger_lines": ledger[0],
        "ledger_keys": ledger[1],
        "ledger_credits": float(ledger[2]),
        "stderr": stderr_tail,
    }
    report["ok"] = (
        code == 0
        and finished.get("status") == "completed"
        and finished.get("output") == args.rows
        and len(set(executed)) == args.rows
        and len(executed) <= args.rows + IN_FLIGHT * cuts
        and by_status == {"completed": (args.rows, float(args.rows))}
        and ledger[1] == args.rows
    )
    print(json.dumps(report))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
