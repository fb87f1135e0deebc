"""Helpers shared by the test files: polling with a deadline, reading the logs tools
append to, the `deepline` command's JSON views of runs, and in-process runs of a play
through the real `Runner`."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deepline_cli.runtime.calls.events import EventBus
from deepline_cli.runtime.run.options import RunOptions, RunResult
from deepline_cli.runtime.run.runner import Runner
from deepline_cli.store.roles import Store


def is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def wait_until(
    predicate: Callable[[], Any],
    *,
    what: str,
    timeout: float = 30.0,
    every: float = 0.02,
    alive: subprocess.Popen[Any] | None = None,
) -> Any:
    """Poll `predicate` until it returns something truthy (returned), or fail the test
    after `timeout` seconds naming `what` it waited for; at once if the process `alive`
    (the one that should make it true) has ended."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if alive is not None and alive.poll() is not None:
            pytest.fail(f"the process ended (exit {alive.returncode}) before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def logged(path: Path) -> list[str]:
    """The lines a tool appended to `path`, in order (each one a real invocation)."""
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def as_json(value: Any) -> str:
    return json.dumps(value)


def no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr


def show(deepline: Callable[..., Any], run_id: str) -> dict[str, Any]:
    """`deepline runs show RUN_ID --json`."""
    result = deepline("runs", "show", run_id, "--json")
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)


def runs(deepline: Callable[..., Any], **env: str) -> dict[str, dict[str, Any]]:
    """`deepline runs list --json`, by run id."""
    result = deepline("runs", "list", "--json", **env)
    assert result.code == 0, result.stderr
    return {row["run_id"]: row for row in result.json_lines()}


def run_play(
    play_file: Path,
    store: str | Path,
    input: dict[str, Any] | None = None,
    *,
    bus: EventBus | None = None,
    opened: Store | None = None,
    **options: Any,
) -> RunResult:
    """Start `play_file` in this process against `store` (a path or URL); `opened` hands
    the runner a store object of the test's own (a test double) instead."""
    runner = Runner(RunOptions(store=str(store), **options), bus or EventBus(), store=opened)
    try:
        return runner.start(str(play_file), input or {})
    finally:
        runner.close()


def resume_run(run_id: str, store: str | Path, *, bus: EventBus | None = None, **options: Any) -> RunResult:
    """`deepline resume RUN_ID`, in this process."""
    runner = Runner(RunOptions(store=str(store), **options), bus or EventBus())
    try:
        return runner.resume(run_id)
    finally:
        runner.close()
