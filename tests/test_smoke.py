"""The example a newcomer runs first works through the real command."""

from __future__ import annotations

from tests.conftest import ROOT, counts


def test_hello_example_runs_then_replays_from_receipts(deepline) -> None:
    first = deepline("run", str(ROOT / "examples/hello/play.py"), "--json")
    assert first.code == 0, first.stderr
    finished = first.json_lines()[-1]
    assert finished["event"] == "run.finished"
    assert finished["status"] == "completed"
    assert len(finished["output"]["people"]) == 3
    assert finished["stats"]["tools"]["hello.company"]["live"] == 3

    second = deepline("run", str(ROOT / "examples/hello/play.py"), "--json")
    stats = second.json_lines()[-1]["stats"]["tools"]
    assert counts(stats["hello.company"]) == {"live": 0, "reused": 3, "failed": 0, "credits": 0.0, "retries": 0}
    assert second.json_lines()[-1]["output"] == finished["output"]
