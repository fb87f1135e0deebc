"""Figures of runs killed along the way (SIGKILL, SIGTERM, then resumed): every view says the
same, and they add up (`retry_reasons` to `retries`; a map's duplicates in its line and the
run's `rows` line)."""

from __future__ import annotations

import hashlib
import json
import signal
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import wait_until
from tests.provider import Provider, ProviderServer, Seen

PLAY = """
from deepline_cli import play

@play("retries")
async def retries(ctx, input):
    leads = ctx.csv(input["csv"], required=["domain"])
    rows = await ctx.map("leads", leads, key="domain", columns={
        "company": lambda row, rc: rc.tools.execute("company", "acme.company", {"domain": row["domain"]}),
    })
    return {"rows": len(rows)}
"""


def _company_tool(folder: Path, url: str) -> None:
    (folder / "deepline.toml").write_text(
        f'[tools."acme.company"]\nurl = "{url}/company"\nquery = {{ domain = "{{domain}}" }}\ncredits = 1\n'
    )


@dataclass
class Flaky(Provider):
    """Answers 503 to the first request of one domain in four (then 200 under its key)."""

    failed_once: set[str] = field(default_factory=set)

    def answer(self, seen: Seen) -> tuple[int, dict[str, str], bytes]:
        domain = seen.query.partition("domain=")[2]
        if int(hashlib.sha256(domain.encode()).hexdigest()[:6], 16) % 4 == 0 and domain not in self.failed_once:
            self.failed_once.add(domain)
            return 503, {"content-type": "application/json"}, b'{"error": "try again"}'
        return super().answer(seen)


def _start(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "deepline_cli", *args, "--json"],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _stop_after(proc: subprocess.Popen[str], provider: Provider, more: int, sig: int) -> None:
    start = provider.served
    wait_until(lambda: provider.served >= start + more or proc.poll() is not None, what="requests", timeout=60)
    assert proc.poll() is None, "the attempt finished before it could be stopped: make the CSV longer"
    proc.send_signal(sig)
    proc.communicate(timeout=60)


def _shown(folder: Path, env: dict[str, str], run_id: str) -> dict[str, Any]:
    """`deepline runs show RUN_ID --json`."""
    shown = subprocess.run(
        [sys.executable, "-m", "deepline_cli", "runs", "show", run_id, "--json"],
        cwd=folder, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(shown.stdout)


def _company(stats: dict[str, Any]) -> dict[str, Any]:
    return stats["tools"]["acme.company"]


@pytest.mark.process
def test_retry_reasons_add_up_to_retries_after_kill_term_kill_resume(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """An outcome kept `earlier` (the retries of a killed attempt) from the stopped attempt: the
    next killed attempt's were put in its place, not added, and `run.finished` and `runs show`
    said different causes, neither adding up."""
    with ProviderServer(Flaky(latency_s=0.02)) as provider:
        (tmp_path / "play.py").write_text(PLAY)
        _company_tool(tmp_path, provider.url)
        (tmp_path / "leads.csv").write_text("domain\n" + "".join(f"co{i}.com\n" for i in range(4000)))

        run = _start(tmp_path, cli_env, "run", "play.py", "--csv", "leads.csv", "--run-id", "rr")
        _stop_after(run, provider, 500, signal.SIGKILL)
        _stop_after(_start(tmp_path, cli_env, "resume", "rr"), provider, 500, signal.SIGTERM)
        _stop_after(_start(tmp_path, cli_env, "resume", "rr"), provider, 500, signal.SIGKILL)
        last = _start(tmp_path, cli_env, "resume", "rr")
        out, err = last.communicate(timeout=120)
        assert last.returncode == 0, err

    finished = json.loads(out.splitlines()[-1])
    assert finished["event"] == "run.finished" and finished["status"] == "completed"
    shown = _shown(tmp_path, cli_env, "rr")

    in_finished, in_show = _company(finished["stats"]), _company(shown["stats"])
    assert sum(in_finished["retry_reasons"].values()) == in_finished["retries"], in_finished
    assert sum(in_show["retry_reasons"].values()) == in_show["retries"], in_show
    assert in_finished["retry_reasons"] == in_show["retry_reasons"], (in_finished, in_show)


@pytest.mark.process
def test_runs_show_of_a_killed_run_agrees_with_itself_on_duplicates(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """A map killed before its input was read whole: its line counted the duplicates skipped
    so far (from its rows), and the run's `rows` line said 0."""
    with ProviderServer(Provider(latency_s=0.02)) as provider:
        (tmp_path / "play.py").write_text(PLAY)
        _company_tool(tmp_path, provider.url)
        # every 5th row repeats the key of the row before it
        rows = [f"co{i - 1 if i % 5 == 0 and i else i}.com" for i in range(3000)]
        (tmp_path / "leads.csv").write_text("domain\n" + "".join(f"{d}\n" for d in rows))
        proc = subprocess.Popen(
            [sys.executable, "-m", "deepline_cli", "run", "play.py", "--csv", "leads.csv", "--run-id", "k", "--json"],
            cwd=tmp_path, env=cli_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        wait_until(lambda: provider.served >= 800 or proc.poll() is not None, what="800 requests", timeout=60)
        assert proc.poll() is None
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)

    shown = _shown(tmp_path, cli_env, "k")
    (leads,) = shown["maps"]
    assert leads["duplicate"] > 0  # the map line counts the duplicates skipped before the kill
    assert shown["stats"]["rows"]["duplicate"] == leads["duplicate"], (shown["stats"]["rows"], leads)


@pytest.mark.process
def test_interrupted_resume_keeps_earlier_failed_rows_in_every_figure(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """A resume asking the rows an earlier attempt failed (--refresh-failed), stopped before
    they ended again (one in flight, one still queued: concurrency 1): the live view's failed
    count and the map's record dropped them, while the store's rows (`runs show`,
    run.finished) kept them failed."""
    (tmp_path / "play.py").write_text(PLAY)
    (tmp_path / "leads.csv").write_text("domain\nx.com\ny.com\na.com\nb.com\nc.com\n")
    provider = Provider()
    # x.com and y.com: 503 in attempt 1 (no retries: the rows fail, transiently); hang in attempt 2.
    provider.script("/v1/x.com", ["503", "slow:30"])
    provider.script("/v1/y.com", ["503", "slow:30"])
    with ProviderServer(provider) as p:
        (tmp_path / "deepline.toml").write_text(
            f'[tools."acme.company"]\nurl = "{p.url}/v1/{{domain}}"\ncredits = 1\nretries = 0\ntimeout_s = 60\n'
        )
        env = {**cli_env}
        first = subprocess.run(
            [sys.executable, "-m", "deepline_cli", "run", "play.py", "--csv", "leads.csv", "--run-id", "r1",
             "--concurrency", "1", "--max-credits", "1", "--json"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert first.returncode == 1, first.stderr  # the budget stopped it after a.com
        proc = subprocess.Popen(
            [sys.executable, "-m", "deepline_cli", "resume", "r1", "--refresh-failed", "--max-credits", "100",
             "--concurrency", "1", "--json"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        wait_until(lambda: p.count("/v1/x.com") >= 2, what="attempt 2 to ask x.com again")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    finished = events[-1]
    assert finished["event"] == "run.finished"
    progress = [e for e in events if e["event"] == "map.progress"]

    db = sqlite3.connect(cli_env["DEEPLINE_STORE"])
    stored_failed = db.execute("SELECT count(*) FROM map_rows WHERE run_id='r1' AND outcome='failed'").fetchone()[0]
    maps_failed = db.execute("SELECT failed FROM maps WHERE run_id='r1'").fetchone()[0]
    assert stored_failed == 2  # x.com's and y.com's rows, failed by attempt 1, never settled again
    assert finished["stats"]["rows"]["failed"] == stored_failed
    # The same moment, other figures: the maps table and the live progress.
    live_failed = progress[-1]["failed"] if progress else None
    assert (maps_failed, live_failed) == (stored_failed, stored_failed), (
        f"maps.failed={maps_failed}, last map.progress failed={live_failed}, "
        f"but map_rows and run.finished.stats.rows.failed say {stored_failed}"
    )
