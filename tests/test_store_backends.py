"""The same end-to-end run on every store backend."""

from __future__ import annotations

from deepline_cli.runtime.events import EventBus
from deepline_cli.runtime.runner import Runner, RunOptions
from deepline_cli.store import open_store
from tests.conftest import ROOT, counts


def test_hello_example_runs_and_replays_on_each_backend(store_url: str) -> None:
    play = str(ROOT / "examples/hello/play.py")
    first = Runner(RunOptions(store=store_url), EventBus())
    try:
        result = first.start(play, {})
    finally:
        first.close()
    assert result.status == "completed", result.error
    assert result.stats["tools"]["hello.company"]["live"] == 3
    again = Runner(RunOptions(store=store_url), EventBus())
    try:
        replay = again.start(play, {})
    finally:
        again.close()
    assert replay.output == result.output
    assert counts(replay.stats["tools"]["hello.company"]) == {
        "live": 0,
        "reused": 3,
        "failed": 0,
        "credits": 0.0,
        "retries": 0,
    }
    store = open_store(store_url)
    try:
        assert {r.run_id for r in store.list_runs()} == {result.run_id, replay.run_id}
    finally:
        store.close()
