"""Helpers for the fault tests: a timed loopback provider, deepline processes to pause,
kill and resume, and the one play they all run (a map over HTTP tools)."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.provider import Provider, Seen

MAP_PLAY = """
from deepline_cli import play


@play("faults")
async def faults(ctx, input):
    rows = [{"domain": f"d{i}.com"} for i in range(input["n"])]
    done = await ctx.map(
        "rows",
        rows,
        key="domain",
        columns={
            "info": lambda row, rc: rc.tools.execute("lookup", "p.lookup", {"domain": row["domain"]}),
        },
    )
    return {"rows": len(done), "failed": done.failed_count}
"""


def tool_config(port: int, *, concurrency: int = 2, credits: int = 1, extra: str = "") -> str:
    return textwrap.dedent(
        f"""
        [tools."p.lookup"]
        method = "POST"
        url = "http://127.0.0.1:{port}/v1/lookup"
        json = {{ domain = "{{domain}}" }}
        credits = {credits}
        concurrency = {concurrency}
        retries = 0
        {extra}
        """
    )


@dataclass
class TimedProvider(Provider):
    """The loopback provider, noting when each answer was given (monotonic clock)."""

    answered: list[tuple[float, str]] = field(default_factory=list)  # (when, idempotency key)

    def answer(self, seen: Seen) -> tuple[int, dict[str, str], bytes]:
        status, headers, body = super().answer(seen)
        self.answered.append((time.monotonic(), seen.headers.get("idempotency-key", "")))
        if seen.path.endswith("/batch") and isinstance(seen.body, dict):  # one result per item sent
            body = json.dumps({"results": [{"domain": item["domain"]} for item in seen.body["items"]]}).encode()
        return status, headers, body

    def sends(self) -> collections.Counter[str]:
        """How many requests carried each idempotency key."""
        return collections.Counter(r.headers.get("idempotency-key", "") for r in self.requests)


def start(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    """`deepline ARGS` in the background."""
    return subprocess.Popen(
        [sys.executable, "-m", "deepline_cli", *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 60.0) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def ensure_alive(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is not None:
        _, err = proc.communicate()
        raise AssertionError(f"the process ended early ({proc.returncode}): {err[-2000:]}")


def kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL (a stopped process too), then reap it and close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=10)
