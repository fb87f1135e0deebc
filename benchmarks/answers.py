"""Answers of a real provider's size, under an API key: what each call costs deepline.

A loopback provider (its own process) answers every call 10 ms late with ~4 KB of JSON (a
people search: ten records); deepline runs a map of `--rows` rows, one HTTP tool call each,
the tool's `X-Api-Key` header from a secret as a real provider's is: so every answer is
searched for that secret as it arrives and as its row is kept. Each run in its own process
on a fresh SQLite store, with the secret and without one (the header a plain value), best
of `--rounds` (and the median): wall, CPU and CPU per call.

    python benchmarks/answers.py [--rows 3000] [--rounds 3]
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

from installed import compiled
from rounds import best_of, child_report

ROOT = Path(__file__).resolve().parent.parent
KEY = "pk-live-0123456789abcdef"

PLAY = textwrap.dedent(
    """
    from deepline_cli import play

    @play("answers")
    async def answers(ctx, input):
        rows = [{"domain": f"company{i}.com"} for i in range(input["rows"])]
        done = await ctx.map("people", rows, key="domain", columns={
            "people": lambda row, rc: rc.tools.execute("people", "people.search", {"domain": row["domain"]}),
        })
        return {"rows": len(done)}
    """
)

CONFIG = """
[tools."people.search"]
method = "POST"
url = "http://127.0.0.1:{port}/v1/people"
headers = {{ "X-Api-Key" = "{header}" }}
json = {{ domain = "{{domain}}" }}
"""


def person(n: int) -> dict:
    return {
        "id": f"p{n}", "first_name": "Ada", "last_name": "Lovelace", "title": "VP Engineering",
        "email": f"ada{n}@example.com", "linkedin_url": f"https://linkedin.com/in/ada{n}",
        "organization": {"name": "Analytical", "domain": "analytical.engine", "industry": "software",
                         "employees": 120, "address": {"city": "London", "country": "UK"}},
        "phones": [{"type": "work", "number": "+44 20 7946 0000"}], "seniority": "vp",
        "departments": ["engineering", "r&d"],
    }  # fmt: skip


def serve(port: int) -> None:
    """The provider: every call answered with the same ~4 KB of JSON, 10 ms late."""
    sys.path.insert(0, str(ROOT))
    from tests.provider import Provider, ProviderServer

    body = json.dumps({"people": [person(n) for n in range(10)], "pagination": {"page": 1, "total": 420}}).encode()

    class People(Provider):
        def answer(self, seen: object) -> tuple[int, dict[str, str], bytes]:
            return 200, {"content-type": "application/json"}, body

    provider = People(latency_s=0.01)
    provider.record = False
    with ProviderServer(provider, port=port):
        while True:
            time.sleep(3600)


def child(folder: str, rows: int) -> None:
    """One run, in its own process: its wall and CPU seconds as JSON."""
    from deepline_cli.runtime.calls.events import EventBus
    from deepline_cli.runtime.run.options import RunOptions
    from deepline_cli.runtime.run.runner import Runner

    start, cpu = time.perf_counter(), time.process_time()
    runner = Runner(RunOptions(store=str(Path(folder) / "store.db")), EventBus())
    try:
        result = runner.start(str(Path(folder) / "play.py"), {"rows": rows})
    finally:
        runner.close()
    assert result.status == "completed", result.error
    print(json.dumps({"wall_s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu}))


def measure(port: int, rows: int, secret: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="deepline-answers-") as tmp:
        (Path(tmp) / "play.py").write_text(PLAY)
        header = "${PEOPLE_KEY}" if secret else KEY
        (Path(tmp) / "deepline.toml").write_text(CONFIG.format(port=port, header=header))
        return child_report(
            [sys.executable, __file__, "--child", tmp, "--rows", str(rows)],
            cwd=tmp, env={**os.environ, "PEOPLE_KEY": KEY},
        )  # fmt: skip


def summary(runs: list[dict], rows: int) -> dict:
    best = best_of(runs)
    return {**best, "cpu_us_per_call": round(best["cpu_s"] / rows * 1e6)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.child:
        child(args.child, args.rows)
        return
    compiled()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    provider = subprocess.Popen([sys.executable, __file__, "--serve", str(port)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if provider.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the loopback provider did not start") from None
                time.sleep(0.05)
        with_secret, without = [], []
        for _ in range(args.rounds):  # interleaved, so both see the same machine
            with_secret.append(measure(port, args.rows, secret=True))
            without.append(measure(port, args.rows, secret=False))
    finally:
        provider.terminate()
        provider.wait()
    print(
        json.dumps(
            {
                "benchmark": "answers",
                "rows": args.rows,
                "rounds": args.rounds,
                "answer_bytes": len(json.dumps({"people": [person(n) for n in range(10)]})),
                "with_secret": summary(with_secret, args.rows),
                "without_secret": summary(without, args.rows),
            }
        )
    )


if __name__ == "__main__":
    main()
