"""Shared test helpers: real SQLite files in tmp_path and the real `deepline` command."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from deepline_cli import _json

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json_lines(self) -> list[dict]:
        return [_json.loads(line) for line in self.stdout.splitlines() if line.strip()]


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "deepline.db"


@pytest.fixture
def cli_env(tmp_path: Path, store_path: Path) -> dict[str, str]:
    """The environment for `deepline` subprocesses: a private store, no inherited flags."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPLINE_")}
    env["DEEPLINE_STORE"] = str(store_path)
    env["DEEPLINE_LEASE_TTL"] = "5"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def deepline(tmp_path: Path, cli_env: dict[str, str]) -> Callable[..., Result]:
    """Run the real command line in a subprocess: `deepline("run", "play.py")`."""

    def invoke(*args: str, cwd: Path | None = None, timeout: float = 120, **env: str) -> Result:
        proc = subprocess.run(
            [sys.executable, "-m", "deepline_cli", *args],
            cwd=cwd or tmp_path,
            env={**cli_env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    return invoke


@pytest.fixture
def write_play(tmp_path: Path) -> Callable[..., Path]:
    """Write a play file (dedented) into tmp_path and return its path."""

    def write(source: str, name: str = "play.py") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path

    return write


@pytest.fixture(autouse=True)
def _isolated_store(monkeypatch: pytest.MonkeyPatch, store_path: Path) -> Iterator[None]:
    """In-process code never touches the user's real store."""
    monkeypatch.setenv("DEEPLINE_STORE", str(store_path))
    yield
