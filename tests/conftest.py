"""Shared fixtures: real SQLite files in tmp_path, the real `deepline` command, and a
PostgreSQL database per test process (tests/helpers.py holds the shared functions)."""

from __future__ import annotations

import compileall
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from deepline_cli import _json
from deepline_cli.store.migrations import MIGRATIONS

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    """Compile the package once, before any test (and before xdist's workers start).

    Hundreds of tests start `deepline` in a subprocess. Where the environment sets
    PYTHONDONTWRITEBYTECODE, no process ever writes the package's bytecode, so each of
    them would compile every module again (about a third of its start-up time).
    """
    if not hasattr(config, "workerinput"):
        compileall.compile_dir(ROOT / "deepline_cli", quiet=1)


_SUBPROCESS_FIXTURES = {"deepline_process", "spawn", "cli", "pg_cli"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run order for xdist's workers: tests that start `deepline` processes first, then the
    short in-process ones, which fill the workers' last gaps."""

    def rank(item: pytest.Item) -> int:
        starts_processes = _SUBPROCESS_FIXTURES & set(getattr(item, "fixturenames", ()))
        return 1 if starts_processes or item.get_closest_marker("process") is not None else 2

    items.sort(key=rank)


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json_lines(self) -> list[dict]:
        return [_json.loads(line) for line in self.stdout.splitlines() if line.strip()]


COUNTED = ("live", "reused", "failed", "credits", "retries")


def counts(tool_stats: dict) -> dict:
    """A tool's call counts from a run's stats (what it paid, reused, failed, retried)."""
    return {name: tool_stats.get(name) for name in COUNTED}


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
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # snapshots of enqueued plays
    return env


@pytest.fixture
def deepline(tmp_path: Path, cli_env: dict[str, str]) -> Callable[..., Result]:
    """Run the real command line in this process (typer's CliRunner), as a person types it:
    `deepline("run", "play.py")`, in `tmp_path` (or `cwd`), with `cli_env` and `env` as the
    environment. For what needs a process of its own (signals, kills, hash seeds, another
    process's locks), use `deepline_process`."""
    from typer.testing import CliRunner

    from deepline_cli.cli.app import app

    def invoke(*args: str, cwd: Path | None = None, timeout: float = 120, **env: str) -> Result:
        environment: dict[str, str | None] = {k: None for k in os.environ if k.startswith("DEEPLINE_")}
        environment.update({**cli_env, **env})
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            with contextlib.chdir(cwd or tmp_path), a_new_process():
                result = CliRunner().invoke(app, list(args), env=environment, catch_exceptions=False)
        finally:
            for sig, handler in handlers.items():  # a run hands signals to itself: give them back
                signal.signal(sig, handler)
        return Result(result.exit_code, result.stdout, result.stderr)

    return invoke


@contextlib.contextmanager
def a_new_process() -> Iterator[None]:
    """What a command sees as a process of its own: no plays or tools registered by earlier
    commands of this test process (each command loads its play again)."""
    from deepline_cli.runtime.providers import tools
    from deepline_cli.runtime.run import play

    saved = (dict(play._ALL_PLAYS), dict(tools._REGISTRY))
    play._ALL_PLAYS.clear()
    tools._REGISTRY.clear()
    try:
        yield
    finally:
        play._ALL_PLAYS.clear()
        play._ALL_PLAYS.update(saved[0])
        tools._REGISTRY.clear()
        tools._REGISTRY.update(saved[1])


@pytest.fixture
def deepline_process(tmp_path: Path, cli_env: dict[str, str]) -> Callable[..., Result]:
    """Run the real command in a subprocess: `deepline_process("run", "play.py")`."""

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
def spawn(tmp_path: Path, cli_env: dict[str, str]) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start `deepline` in the background (stdout and stderr piped); whatever a test
    leaves running is killed."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, **env: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deepline_cli", *args],
            cwd=tmp_path,
            env={**cli_env, **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


@pytest.fixture
def write_play(tmp_path: Path) -> Callable[..., Path]:
    """Write a play file (dedented) into tmp_path and return its path."""

    def write(source: str, name: str = "play.py") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path

    return write


@pytest.fixture(autouse=True)
def _isolated_store(monkeypatch: pytest.MonkeyPatch, store_path: Path, tmp_path: Path) -> Iterator[None]:
    """In-process code never touches the user's real store or cache directory."""
    monkeypatch.setenv("DEEPLINE_STORE", str(store_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    yield


# --- PostgreSQL ---------------------------------------------------------------------------

PG_URL = os.environ.get("DEEPLINE_TEST_POSTGRES_URL")
PG_SKIP = "DEEPLINE_TEST_POSTGRES_URL is not set (CI sets it): PostgreSQL tests are skipped"


def _with_database(url: str, name: str) -> str:
    base, _, query = url.partition("?")
    head, _, _ = base.rpartition("/")
    return f"{head}/{name}" + (f"?{query}" if query else "")


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A fresh database for this test process on DEEPLINE_TEST_POSTGRES_URL's server:
    each xdist worker has its own (named after it), dropped when the worker ends."""
    if not PG_URL:
        pytest.skip(PG_SKIP)
    import secrets

    import psycopg

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    name = f"deepline_test_{worker}_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        # Racing tests deadlock on purpose (the store must retry); PostgreSQL looks for a
        # deadlock only after `deadlock_timeout` (1 s), which would be most of their time.
        # No test crashes the server, so commits need not wait for the disk either.
        admin.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):  # a role may not: slower, not wrong
            admin.execute(f'ALTER DATABASE "{name}" SET deadlock_timeout = 50')
    try:
        yield _with_database(PG_URL, name)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_database: str) -> str:
    """The session's database, emptied: every test starts with no runs and no receipts."""
    import psycopg

    with psycopg.connect(pg_database, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> '_migrations'"
            )
        ]
        # DELETE, not TRUNCATE: these tables hold a test's few rows, and TRUNCATE's new
        # files per table cost three times as long (about 40 ms a test).
        with conn.transaction():
            for table in tables:
                conn.execute(f'DELETE FROM "{table}"')
            if any(r[0] == "_migrations" for r in conn.execute("SELECT tablename FROM pg_tables")):
                # A test may leave the store as a newer deepline would (a migration this one
                # does not know): the next test on this database starts from this deepline's.
                known = [name for name, _ in MIGRATIONS]
                conn.execute("DELETE FROM _migrations WHERE NOT (name = ANY(%s))", (known,))
    return pg_database


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each store backend in turn: a SQLite file, then (when configured) PostgreSQL."""
    if request.param == "sqlite":
        return str(tmp_path / "contract.db")
    return str(request.getfixturevalue("pg_url"))
