"""Soak: one run of a 2-HTTP-tool map, hit by random SIGKILL, SIGSTOP and SIGTERM until
it has taken N faults, then finished. The loopback provider notes every request, its
idempotency key and when it arrived; afterwards:

- billed == distinct calls: each distinct call went out under exactly one key (a provider
  honouring keys billed it once), and every call was made;
- no same-key re-send that did not straddle a fault: a key sent twice had a fault
  between the two sends (the first sender died or was paused with the call in flight);
- every row of the run succeeded, and the run says `completed`.

A SIGSTOP pauses the process past its lease; a resume then takes the run over, and when
the paused process wakes it must stop (exit 4) without sending anything.

    python tests/soak.py --events 50 --rows 2000                  # SQLite
    python tests/soak.py --events 50 --store postgresql://postgres@127.0.0.1:5432/soak
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.provider import Provider, ProviderServer, Seen  # noqa: E402

PLAY = """
from deepline_cli import play


@play("soak")
async def soak(ctx, input):
    rows = [{"domain": f"d{i}.com"} for i in range(input["rows"])]

    async def email(row, rc):
        found = await rc.tools.execute("email", "soak.email", {"domain": row["domain"], "org": row["company"]["key"]})
        return found.output

    done = await ctx.map(
        "leads", rows, key="domain",
        columns={
            "company": lambda row, rc: rc.tools.execute("company", "soak.company", {"domain": row["domain"]}),
            "email": email,
        },
    )
    return {"rows": len(done), "failed": done.failed_count}
"""

CONFIG = """
[tools."soak.company"]
method = "POST"
url = "http://127.0.0.1:{port}/v1/company"
json = {{ domain = "{{domain}}" }}
credits = 1

[tools."soak.email"]
method = "POST"
url = "http://127.0.0.1:{port}/v1/email"
json = {{ domain = "{{domain}}", org = "{{org}}" }}
credits = 2
"""


class Stamped(list[Seen]):
    """The provider's request list, noting when each request arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.at: list[float] = []

    def append(self, seen: Seen) -> None:
        self.at.append(time.monotonic())
        super().append(seen)


@dataclass
class Soak:
    store: str
    rows: int = 2000
    events: int = 50
    ttl: float = 2.0
    latency_s: float = 1.0  # slow enough that the run outlasts the faults
    seed: int = 1
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="deepline-soak-")))
    faults: list[tuple[float, str]] = field(default_factory=list)  # (when, what)
    takeovers: int = 0
    woke_busy: int = 0
    started: int = 0  # processes started

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPLINE_")}
        return {**env, "DEEPLINE_STORE": self.store, "DEEPLINE_LEASE_TTL": str(self.ttl), "PYTHONUNBUFFERED": "1"}

    def start(self) -> subprocess.Popen[bytes]:
        """`run --run-id`: starts the run, or resumes it (how a CI job reruns)."""
        args = ["run", "play.py", "--set", f"rows={self.rows}", "--run-id", "soak-run", "--quiet"]
        self.started += 1
        with (self.work / f"process-{self.started}.log").open("wb") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "deepline_cli", *args],
                cwd=self.work, env=self.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            )  # fmt: skip

    def run(self) -> dict[str, Any]:
        random.seed(self.seed)
        provider = Provider(latency_s=self.latency_s)
        provider.requests = Stamped()
        with ProviderServer(provider) as p:
            (self.work / "play.py").write_text(PLAY)
            (self.work / "deepline.toml").write_text(textwrap.dedent(CONFIG.format(port=p.port)))
            started = time.monotonic()
            outcome = self._drive()
            return self._verdict(p, outcome, time.monotonic() - started)

    def _drive(self) -> int:
        proc = self.start()
        while len(self.faults) < self.events:
            time.sleep(random.uniform(0.3, 1.5))
            if proc.poll() is not None:
                if proc.returncode == 0:  # finished before enough faults: a fresh run id is not
                    break  # useful; the faults so far are what this soak measured
                proc = self.start()
                continue
            proc = self._fault(proc)
        return self._finish(proc)

    def _fault(self, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        kind = random.choice(["kill", "kill", "stop", "term"])
        self.faults.append((time.monotonic(), kind))
        if kind == "kill":
            proc.kill()
            proc.wait()
            return self.start()
        if kind == "term":
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            return self.start()
        # Paused past its lease: another process takes the run over; the paused one, woken,
        # must stop without sending (exit 4) — or, if it finished its last call before the
        # pause, report the run as it left it.
        before = self._attempt()
        proc.send_signal(signal.SIGSTOP)
        time.sleep(self.ttl + random.uniform(0.3, 1.0))
        successor = self.start()
        deadline = time.monotonic() + 60
        while self._attempt() == before and successor.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until the successor has taken the run (a loaded machine starts slowly)
        time.sleep(random.uniform(0.2, 1.0))
        proc.send_signal(signal.SIGCONT)
        if successor.poll() not in (None, 0):  # it found the paused process's lease still current
            return proc
        code = proc.wait(timeout=60)
        self.takeovers += 1
        self.woke_busy += code == 4
        return successor

    def _attempt(self) -> int:
        from deepline_cli.store import open_store

        db = open_store(self.store)
        try:
            record = db.get_run("soak-run")
            return record.attempt if record else 0
        finally:
            db.close()

    def _finish(self, proc: subprocess.Popen[bytes]) -> int:
        while True:
            code = proc.wait(timeout=600)
            if code == 0:
                return 0
            if code not in (1, 4, 130):
                stderr = (self.work / f"process-{self.started}.log").read_text()
                raise RuntimeError(f"deepline exited {code}: {stderr[-2000:]}")
            proc = self.start()

    def _verdict(self, provider: Provider, outcome: int, elapsed: float) -> dict[str, Any]:
        requests: Stamped = provider.requests  # type: ignore[assignment]
        sends: dict[str, list[float]] = {}
        calls: dict[tuple[str, str], set[str]] = {}
        for seen, at in zip(requests, requests.at, strict=True):
            key = seen.headers.get("idempotency-key", "")
            sends.setdefault(key, []).append(at)
            calls.setdefault((seen.path, json.dumps(seen.body, sort_keys=True)), set()).add(key)
        fault_times = [t for t, _ in self.faults]
        unexplained = [
            key
            for key, times in sends.items()
            for first, again in itertools.pairwise(times)
            if not any(first < t < again for t in fault_times)
        ]
        distinct = 2 * self.rows
        return {
            "store": self.store.split("://")[0] if "://" in self.store else "sqlite",
            "rows": self.rows,
            "faults": len(self.faults),
            "kills": sum(1 for _, k in self.faults if k == "kill"),
            "stops": sum(1 for _, k in self.faults if k == "stop"),
            "terms": sum(1 for _, k in self.faults if k == "term"),
            "stopped_woke_exit_4": self.woke_busy,
            "requests": len(requests),
            "distinct_calls": distinct,
            "calls_made": len(calls),
            "billed": len(sends),
            "calls_under_two_keys": sum(1 for keys in calls.values() if len(keys) > 1),
            "resends_across_a_fault": sum(len(t) - 1 for t in sends.values()) - len(unexplained),
            "resends_without_a_fault": len(unexplained),
            "exit": outcome,
            "elapsed_s": round(elapsed, 1),
            "ok": outcome == 0 and len(sends) == distinct == len(calls) and not unexplained,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=50)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--store", default=None, help="a store URL; default: a SQLite file in a temp folder")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--latency-ms", type=float, default=1000.0)
    args = parser.parse_args()
    soak = Soak(store="", rows=args.rows, events=args.events, seed=args.seed, latency_s=args.latency_ms / 1000)
    soak.store = args.store or str(soak.work / "soak.db")
    result = soak.run()
    print(json.dumps(result), flush=True)
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
