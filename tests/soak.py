"""Soak: one run of a 2-HTTP-tool map, hit by random SIGKILL, SIGSTOP and SIGTERM until
it has taken N faults, then finished. The loopback provider notes every request, its
idempotency key and when it arrived; afterwards:

- billed == distinct calls: each distinct call went out under exactly one key (a provider
  honouring keys billed it once), and every call was made;
- no same-key re-send without a fault: a key sent twice was first sent by a process
  that was then killed, terminated, or paused and taken over with the call in flight.
  Each process gets its own provider port, so every request is attributed to the process
  that sent it (not guessed from arrival times, which lag on a loaded machine);
- a paused process that was taken over sends nothing once it wakes;
- every row of the run succeeded, the run says `completed`, and the credits it reports
  (from the calls ledger, every attempt) are those of every call once.

A SIGSTOP pauses the process past its lease; a resume then takes the run over, and when
the paused process wakes it must stop (exit 4) without sending or writing anything.

    python tests/soak.py --events 50 --rows 2000                  # SQLite
    python tests/soak.py --events 50 --store postgresql://postgres@127.0.0.1:5432/soak
    python tests/soak.py --events 30 --latency-ms 300 --faults stop --pg-idle-s 1 --store postgresql://…/soak
                                    # every fault a pause; the server ends a paused transaction's session
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

from tests.provider import Provider, ProviderServer  # noqa: E402

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


@dataclass
class Process:
    """One `deepline` process of the soak, the provider port it alone calls, and its fate."""

    popen: subprocess.Popen[bytes]
    port: int
    fate: str = ""  # killed | terminated | taken over | exit N
    woke_at: float | None = None  # SIGCONT after it was taken over
    resumed: list[float] = field(default_factory=list)  # every SIGCONT (monotonic)

    def paused_between(self, first: float, again: float) -> bool:
        """Paused and woken between two sends: a call that timed out while the process was
        frozen is sent again, under the same key (a retry across the fault)."""
        return any(first < woke < again for woke in self.resumed)


@dataclass
class Soak:
    store: str
    rows: int = 2000
    events: int = 50
    ttl: float = 2.0
    latency_s: float = 1.0  # slow enough that the run outlasts the faults
    seed: int = 1
    kinds: tuple[str, ...] = ("kill", "kill", "stop", "term")  # drawn from for each fault
    pg_idle_s: float | None = None  # the server's idle-in-transaction bound (PostgreSQL), if not the default
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="deepline-soak-")))
    faults: list[str] = field(default_factory=list)  # kill | stop | term, in order
    takeovers: int = 0
    woke_busy: int = 0
    woke_exits: dict[int, int] = field(default_factory=dict)  # exit code -> processes woken after a takeover
    woke_said: list[list[str]] = field(default_factory=list)  # last lines of those that exited other than 4
    processes: list[Process] = field(default_factory=list)
    server: ProviderServer | None = None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPLINE_")}
        env = {**env, "DEEPLINE_STORE": self.store, "DEEPLINE_LEASE_TTL": str(self.ttl), "PYTHONUNBUFFERED": "1"}
        if self.pg_idle_s is not None:  # short: a process paused inside a transaction has its session ended
            env["DEEPLINE_PG_IDLE_IN_TRANSACTION_S"] = str(self.pg_idle_s)
        return env

    def start(self) -> Process:
        """`run --run-id`: starts the run, or resumes it (how a CI job reruns), calling the
        provider on a port of its own."""
        assert self.server is not None
        port = self.server.add_port()
        (self.work / "deepline.toml").write_text(textwrap.dedent(CONFIG.format(port=port)))
        args = ["run", "play.py", "--set", f"rows={self.rows}", "--run-id", "soak-run", "--quiet"]
        with (self.work / f"process-{len(self.processes) + 1}.log").open("wb") as log:
            popen = subprocess.Popen(
                [sys.executable, "-m", "deepline_cli", *args],
                cwd=self.work, env=self.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            )  # fmt: skip
        self.processes.append(Process(popen, port))
        return self.processes[-1]

    def run(self) -> dict[str, Any]:
        random.seed(self.seed)
        provider = Provider(latency_s=self.latency_s)
        self.server = ProviderServer(provider)
        with self.server:
            (self.work / "play.py").write_text(PLAY)
            started = time.monotonic()
            outcome = self._drive()
            return self._verdict(provider, outcome, time.monotonic() - started)

    def _drive(self) -> int:
        proc = self.start()
        while len(self.faults) < self.events:
            time.sleep(random.uniform(0.3, 1.5))
            code = proc.popen.poll()
            if code is not None:
                proc.fate = f"exit {code}"
                if code == 0:  # finished before enough faults: a fresh run id is not useful;
                    break  # the faults so far are what this soak measured
                proc = self.start()
                continue
            proc = self._fault(proc)
        return self._finish(proc)

    def _fault(self, proc: Process) -> Process:
        kind = random.choice(self.kinds)
        self.faults.append(kind)
        if kind == "kill":
            proc.popen.kill()
            proc.popen.wait()
            proc.fate = "killed"
            return self.start()
        if kind == "term":
            proc.popen.send_signal(signal.SIGTERM)
            proc.popen.wait(timeout=60)
            proc.fate = "terminated"
            return self.start()
        # Paused past its lease: another process takes the run over; the paused one, woken,
        # must stop without sending (exit 4) — or, if it finished its last call before the
        # pause, report the run as it left it.
        before = self._attempt()
        proc.popen.send_signal(signal.SIGSTOP)
        time.sleep(self.ttl + random.uniform(0.3, 1.0))
        successor = self.start()
        deadline = time.monotonic() + 60
        while self._attempt() == before and successor.popen.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until the successor has taken the run (a loaded machine starts slowly)
        time.sleep(random.uniform(0.2, 1.0))
        taken_over = self._attempt() != before
        proc.popen.send_signal(signal.SIGCONT)
        proc.resumed.append(time.monotonic())
        if not taken_over:  # the successor found the paused process's lease still current
            successor.fate = f"exit {successor.popen.wait(timeout=60)}"
            return proc
        proc.woke_at = time.monotonic()
        code = proc.popen.wait(timeout=60)
        proc.fate = "taken over"
        self.takeovers += 1
        self.woke_busy += code == 4
        self.woke_exits[code] = self.woke_exits.get(code, 0) + 1
        if code != 4:  # not "taken over": what it said, for the report
            said = (self.work / f"process-{self.processes.index(proc) + 1}.log").read_text(errors="replace")
            self.woke_said.append(said.strip().splitlines()[-3:])
        return successor

    def _attempt(self) -> int:
        from deepline_cli.store import open_store

        db = open_store(self.store)
        try:
            record = db.runs.get_run("soak-run")
            return record.attempt if record else 0
        finally:
            db.close()

    def _finish(self, proc: Process) -> int:
        while True:
            code = proc.popen.wait(timeout=600)
            proc.fate = f"exit {code}"
            if code == 0:
                return 0
            if code not in (1, 4, 130):
                stderr = (self.work / f"process-{len(self.processes)}.log").read_text()
                raise RuntimeError(f"deepline exited {code}: {stderr[-2000:]}")
            proc = self.start()

    def _reported_credits(self) -> float:
        from deepline_cli.store import open_store

        db = open_store(self.store)
        try:
            return float(db.ledger.run_stats("soak-run")["credits"])
        finally:
            db.close()

    def _verdict(self, provider: Provider, outcome: int, elapsed: float) -> dict[str, Any]:
        by_port = {p.port: p for p in self.processes}
        sends: dict[str, list[Process]] = {}
        stamps: dict[str, list[float]] = {}
        calls: dict[tuple[str, str], set[str]] = {}
        after_takeover = 0
        for seen in provider.requests:
            key = seen.headers.get("idempotency-key", "")
            sender = by_port[seen.port]
            sends.setdefault(key, []).append(sender)
            stamps.setdefault(key, []).append(seen.at)
            calls.setdefault((seen.path, json.dumps(seen.body, sort_keys=True)), set()).add(key)
            after_takeover += sender.woke_at is not None and seen.at > sender.woke_at
        faulted = ("killed", "terminated", "taken over")
        # A re-send is explained when the earlier sender is another process that was killed,
        # terminated or taken over (with the call in flight), or the same process woken from
        # a pause in between; never by a process that went on undisturbed.
        unexplained = [
            (key, self.processes.index(first) + 1, first.fate, first is again, round(t2 - t1, 3))
            for key, senders in sends.items()
            for (first, t1), (again, t2) in itertools.pairwise(zip(senders, stamps[key], strict=True))
            if (first is again and not first.paused_between(t1, t2))
            or (first is not again and first.fate not in faulted)
        ]
        distinct = 2 * self.rows
        credits = self._reported_credits()
        return {
            "store": self.store.split("://")[0] if "://" in self.store else "sqlite",
            "rows": self.rows,
            "faults": len(self.faults),
            "kills": self.faults.count("kill"),
            "stops": self.faults.count("stop"),
            "terms": self.faults.count("term"),
            "takeovers": self.takeovers,
            "stopped_woke_exit_4": self.woke_busy,
            "woken_exit_codes": self.woke_exits,
            "woken_said": self.woke_said,  # the last lines of each woken process that exited other than 4
            "processes": len(self.processes),
            "requests": len(provider.requests),
            "distinct_calls": distinct,
            "calls_made": len(calls),
            "billed": len(sends),
            "calls_under_two_keys": sum(1 for keys in calls.values() if len(keys) > 1),
            "resends_across_a_fault": sum(len(t) - 1 for t in sends.values()) - len(unexplained),
            "resends_without_a_fault": len(unexplained),
            "unexplained": unexplained[:10],
            "sent_after_taken_over": after_takeover,
            "credits_reported": credits,
            "credits_expected": 3 * self.rows,
            "exit": outcome,
            "elapsed_s": round(elapsed, 1),
            "ok": outcome == 0
            and len(sends) == distinct == len(calls)
            and not unexplained
            and not after_takeover
            and credits == 3 * self.rows,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=50)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--store", default=None, help="a store URL; default: a SQLite file in a temp folder")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--latency-ms", type=float, default=1000.0)
    parser.add_argument("--faults", default="kill,kill,stop,term", help="the faults drawn from, e.g. stop")
    parser.add_argument("--pg-idle-s", type=float, default=None, help="PostgreSQL's idle-in-transaction bound")
    args = parser.parse_args()
    soak = Soak(
        store="", rows=args.rows, events=args.events, seed=args.seed, latency_s=args.latency_ms / 1000,
        kinds=tuple(args.faults.split(",")), pg_idle_s=args.pg_idle_s,
    )  # fmt: skip
    soak.store = args.store or str(soak.work / "soak.db")
    result = soak.run()
    print(json.dumps(result), flush=True)
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
