"""The example a newcomer runs first works through the real command."""

from __future__ import annotations

import ast
import json
import shlex

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


def test_the_hello_docstring_command_with_input_runs_as_written(deepline) -> None:
    hello = ROOT / "examples/hello/play.py"
    doc = ast.get_docstring(ast.parse(hello.read_text())) or ""
    [command] = [
        shlex.split(line) for line in doc.splitlines() if line.strip().startswith("deepline run") and "--set" in line
    ]
    people = json.loads(command[command.index("--set") + 1].partition("=")[2])

    result = deepline(*command[1:], cwd=ROOT)

    assert result.code == 0, result.stderr
    output = json.loads(result.stdout)
    assert [(p["name"], p["domain"]) for p in output["people"]] == [(p["name"], p["domain"]) for p in people]
