"""The examples that call providers over HTTP, run as a newcomer runs them: their offline
providers (examples/*/providers.py) in a process of their own, the play through the real
`deepline` command, each run in a new process, on SQLite and on PostgreSQL."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, Result

Run = Callable[..., Result]
WATERFALL = ROOT / "examples/email_waterfall"
REFRESH = ROOT / "examples/nightly_refresh"


class Providers:
    """An example's providers.py, started on a free port."""

    def __init__(self, folder: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(folder / "providers.py"), "--port", "0", "--latency-ms", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("listening on "), line + self.process.stderr.read()
        self.url = line.split()[-1]
        self.port = self.url.rsplit(":", 1)[1]

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as answer:
            return json.loads(answer.read())

    def stats(self) -> dict[str, Any]:
        return dict(self.get("/_stats"))

    def close(self) -> None:
        self.process.kill()
        self.process.communicate(timeout=10)


@pytest.fixture
def store(request: pytest.FixtureRequest, store_url: str) -> str:
    return store_url


def started(folder: Path) -> Iterator[Providers]:
    providers = Providers(folder)
    try:
        yield providers
    finally:
        providers.close()


@pytest.fixture
def waterfall_providers() -> Iterator[Providers]:
    yield from started(WATERFALL)


@pytest.fixture
def refresh_providers() -> Iterator[Providers]:
    yield from started(REFRESH)


def finished(result: Result) -> dict[str, Any]:
    assert result.code == 0, result.stderr[-3000:]
    event = result.json_lines()[-1]
    assert event["event"] == "run.finished"
    return event


def exported(deepline: Run, run_id: str, store: str, out: Path) -> list[dict[str, str]]:
    result = deepline("export", run_id, "--out", str(out), DEEPLINE_STORE=store)
    assert result.code == 0, result.stderr
    with out.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_the_email_waterfall_pays_once_and_says_which_provider_found_each_email(
    deepline: Run, waterfall_providers: Providers, store: str, tmp_path: Path
) -> None:
    env = {"DEMO_PROVIDERS_PORT": waterfall_providers.port, "DEEPLINE_RETRY_BASE_S": "0.01", "DEEPLINE_STORE": store}
    args = ("run", str(WATERFALL / "play.py"), "--csv", str(WATERFALL / "leads.csv"))
    first = finished(deepline(*args, "--json", **env))
    stats = first["stats"]
    sent = waterfall_providers.stats()
    assert sent["billed"] > 100

    rows = exported(deepline, first["run_id"], store, tmp_path / "leads.csv")
    assert len(rows) == first["output"]["leads"] == 121  # 126 leads, 5 of them the same person again
    found_by = Counter(row["email_step"] for row in rows if row["email_step"])
    # Every email was found by one step, in the waterfall's order of preference…
    assert set(found_by) <= {"hunter", "apollo", "dropcontact", "pattern"} and len(found_by) == 4
    assert sum(found_by.values()) == first["output"]["found"] == sum(1 for row in rows if row["email"])
    # …and the run's figures (what the verdict prints) are what the store holds.
    hits = stats["waterfalls"]["leads"]["email"]
    assert {k: v for k, v in hits.items() if k != "none"} == dict(found_by)
    # A later step was asked only for the leads the earlier ones did not find.
    paths = sent["by_path"]
    assert paths["/hunter/v2/email-finder"]["billed"] == 120  # every lead with a website
    assert paths["/apollo/v1/people/match"]["requests"] < 120 - found_by["hunter"] + 30  # retried 503s
    emails = {row["email"] for row in rows if row["email"]}
    assert paths["/zerobounce/v2/validate"]["billed"] == len(emails)  # the same address is validated once
    assert stats["tools"]["hunter.email_finder"]["credits"] == 120

    second = finished(deepline(*args, "--json", **env))
    assert waterfall_providers.stats()["requests"] == sent["requests"]  # not one request
    assert second["stats"]["rows"]["reused"] == 121  # failed rows too: their errors are kept
    assert second["output"] == first["output"]
    assert second["stats"]["waterfalls"] == stats["waterfalls"]

    shown = deepline(*args, **env)  # the verdict a person reads says the same
    assert "email found by: hunter " + str(hits["hunter"]) in shown.stderr, shown.stderr[-2000:]


def test_the_nightly_refresh_re_asks_exactly_the_rows_gone_stale(
    deepline: Run, refresh_providers: Providers, store: str
) -> None:
    env = {"COMPANY_API_PORT": refresh_providers.port, "DEEPLINE_STORE": store}
    args = ("run", str(REFRESH / "play.py"), "--csv", str(REFRESH / "accounts.csv"), "--max-credits", "100")
    first = finished(deepline(*args, "--json", **env))
    asked = refresh_providers.get("/_domains")
    assert len(asked) == first["output"]["accounts"] == 40 and set(asked.values()) == {1}
    unknown = first["output"]["unknown"]
    assert 0 < unknown < 40

    second = finished(deepline(*args, "--json", **env))  # the next night, nothing went stale
    assert refresh_providers.get("/_domains") == asked
    assert second["stats"]["rows"]["reused"] == 40

    time.sleep(0.5)  # past a not-found's time to live below (0.0001 h), measured by the store's clock
    third = finished(deepline(*args, "--set", "recheck_missing_hours=0.0001", "--json", **env))
    again = refresh_providers.get("/_domains")
    re_asked = {domain for domain, n in again.items() if n == 2}
    assert len(re_asked) == unknown  # the unknown companies, and only them
    assert all(n in (1, 2) for n in again.values())
    assert third["stats"]["rows"]["reused"] == 40 - unknown
    assert third["output"]["unknown"] == unknown
