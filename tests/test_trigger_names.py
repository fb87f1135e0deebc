"""Schedules and webhook plays whose names are alike up to 60 characters, end to end: the
run ids of their ticks and deliveries were the name cut there, so the second schedule's
tick (or play's delivery) was taken for queued already and never ran."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import httpx
import pytest

from deepline_cli.server.webhooks import sign
from deepline_cli.store import open_store
from tests.faults import finish, kill, start
from tests.helpers import wait_until
from tests.provider import ProviderServer

PLAY = """
from deepline_cli import play

@play("nightly-firmographics-refresh-for-the-whole-crm", description="refresh one segment")
async def refresh(ctx, input):
    await ctx.tools.execute("enrich", "seg.enrich", {"segment": input["segment"], "tick": ctx.run.id})
    return {"segment": input["segment"]}
"""

TOML = """
[tools."seg.enrich"]
url = "http://127.0.0.1:PORT/v1/enrich"
method = "POST"
json = { segment = "{segment}", tick = "{tick}" }
credits = 1

[schedules.enterprise-emea]
play = "refresh.py"
cron = "* * * * * *"
input = { segment = "enterprise-emea" }

[schedules.enterprise-east]
play = "refresh.py"
cron = "* * * * * *"
input = { segment = "enterprise-east" }
"""


def _runs(store: str) -> list:
    db = open_store(store)
    try:
        return db.runs.list_runs(limit=10_000)
    finally:
        db.close()


@pytest.mark.process
def test_two_toml_schedules_with_long_names_each_fire_every_tick(tmp_path: Path, cli_env: dict[str, str]) -> None:
    with ProviderServer() as provider:
        (tmp_path / "refresh.py").write_text(PLAY)
        (tmp_path / "deepline.toml").write_text(TOML.replace("PORT", str(provider.port)))
        worker = start(["worker", "--play", "deepline.toml"], cli_env, tmp_path)
        try:
            wait_until(lambda: sum(1 for r in _runs(cli_env["DEEPLINE_STORE"]) if r.status == "completed") >= 6,
                       what="6 completed ticks", timeout=40)  # fmt: skip
        finally:
            worker.send_signal(signal.SIGTERM)
            code, _, err = finish(worker, timeout=30)
            kill(worker)
        assert code == 0, err
        segments = {r.body.get("segment") for r in provider.requests}
        assert all(n == 1 for n in provider.billed.values()), provider.billed  # nothing paid twice
        ran = {r.input["segment"] for r in _runs(cli_env["DEEPLINE_STORE"])}
    # Each schedule has its own input: both must have run (and been paid for).
    assert ran == {"enterprise-emea", "enterprise-east"}, ran
    assert segments == {"enterprise-emea", "enterprise-east"}, segments


HOOKS = """
from deepline_cli import play

@play("inbound-lead-enrichment-from-hubspot-form-submissions-for-region-emea", webhook_secret="HOOK_SECRET")
async def emea(ctx, input):
    await ctx.tools.execute("enrich", "seg.enrich", {"segment": "emea", "tick": input["email"]})
    return {"region": "emea"}

@play("inbound-lead-enrichment-from-hubspot-form-submissions-for-region-apac", webhook_secret="HOOK_SECRET")
async def apac(ctx, input):
    await ctx.tools.execute("enrich", "seg.enrich", {"segment": "apac", "tick": input["email"]})
    return {"region": "apac"}
"""
SECRET = "hook-secret-for-tests"
MESSAGE = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"  # one message, fanned out to both endpoints with its id


@pytest.mark.process
def test_one_message_fanned_out_to_two_long_named_hooks_queues_two_runs(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """Standard Webhooks: one message sent to several endpoints keeps its webhook-id."""
    with ProviderServer() as provider:
        (tmp_path / "hooks.py").write_text(HOOKS)
        (tmp_path / "deepline.toml").write_text(TOML.split("[schedules")[0].replace("PORT", str(provider.port)))
        (tmp_path / ".env").write_text(f"HOOK_SECRET={SECRET}\n")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        serve = ["serve", "hooks.py:emea", "hooks.py:apac", "--run-here", "--port", str(port)]
        server = start(serve, cli_env, tmp_path)
        url = f"http://127.0.0.1:{port}"
        try:

            def up() -> bool:
                try:
                    return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(up, what="serve to answer", timeout=30, every=0.1)
            answers = {}
            for region in ("emea", "apac"):
                body = f'{{"email": "lead@{region}.example"}}'.encode()
                stamp = str(int(time.time()))
                answers[region] = httpx.post(
                    f"{url}/hooks/inbound-lead-enrichment-from-hubspot-form-submissions-for-region-{region}",
                    content=body,
                    headers={"content-type": "application/json", "webhook-id": MESSAGE, "webhook-timestamp": stamp,
                             "webhook-signature": sign(SECRET.encode(), MESSAGE, stamp, body)},
                    timeout=30,
                )  # fmt: skip
        finally:
            server.send_signal(signal.SIGTERM)
            finish(server, timeout=30)
            kill(server)
        plays = {r.play for r in _runs(cli_env["DEEPLINE_STORE"])}
    assert all(a.status_code == 202 for a in answers.values()), {k: a.text for k, a in answers.items()}
    assert answers["emea"].json()["run_id"] != answers["apac"].json()["run_id"], answers["apac"].json()
    assert answers["apac"].json()["queued"] is True, answers["apac"].json()
    assert len(plays) == 2, plays
