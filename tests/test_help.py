"""`deepline --help` starts fast: it imports neither the runtime, the store, rich nor an
HTTP client; and the package's public names are exactly the documented ones."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest

import deepline_cli
from tests.conftest import ROOT

# Modules `--help` must not import (a name, or any submodule of it).
HEAVY = ["httpx", "sqlite3", "sqlite_utils", "rich", "deepline_cli.runtime", "deepline_cli.store"]

# Runs the real `deepline_cli.cli.main` with argv, then prints the loaded modules.
PROBE = """
import sys
sys.argv = ["deepline", *sys.argv[1:]]
from deepline_cli.cli import main
try:
    main()
except SystemExit as exc:
    code = exc.code or 0
else:
    code = 0
print("@@MODULES@@", " ".join(sorted(sys.modules)))
sys.exit(code)
"""


def _heavy_in(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["run", "--help"],
        ["resume", "--help"],
        ["receipts", "inspect", "--help"],
        ["runs", "tail", "--help"],
        ["runs", "stop", "--help"],
        ["runs", "logs", "--help"],
        ["tools", "describe", "--help"],
        ["tools", "execute", "--help"],
    ],
    ids=" ".join,
)
def test_help_does_not_import_the_runtime(cli_env, argv: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        capture_output=True, text=True, env=cli_env, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    help_text, _, modules = proc.stdout.rpartition("@@MODULES@@")
    loaded = set(modules.split())
    assert "deepline_cli.cli" in loaded  # the probe really ran the CLI
    assert _heavy_in(loaded) == []
    assert "Usage:" in help_text


def test_python_m_help_lists_the_commands_without_heavy_imports(cli_env) -> None:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "deepline_cli", "--help"],
        capture_output=True, text=True, env=cli_env, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    commands = set()
    for line in proc.stdout.splitlines():
        words = line.split()
        if line.startswith("  ") and words:
            commands.add(words[0])
    assert {"run", "resume", "receipts", "runs"} <= commands, proc.stdout
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    assert "deepline_cli.cli.app" in imported  # importtime output was parsed
    assert _heavy_in(imported) == []


def test_the_runtime_a_run_loads_imports_neither_croniter_nor_h11(cli_env) -> None:
    """Each costs a run's start milliseconds; a schedule or a proxy tunnel imports its own
    (and a play that makes a Decimal, `decimal`)."""
    probe = (
        "import sys; import deepline_cli.runtime.run.runner, deepline_cli.runtime.providers.http;"
        " print(' '.join(sorted(sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=cli_env, cwd=ROOT)
    loaded = set(proc.stdout.split())
    assert "deepline_cli.runtime.providers.transport" in loaded, proc.stderr  # the probe imported the runtime
    assert sorted(m for m in loaded if m.split(".")[0] in ("croniter", "h11", "dateutil", "decimal")) == []


EXPECTED_ALL = [
    "BudgetExceededError",
    "Column",
    "Context",
    "Dataset",
    "DeeplineError",
    "EventTimeoutError",
    "GovernanceError",
    "InputError",
    "MapAccountingError",
    "PlayLoadError",
    "ProviderTransientError",
    "ReceiptLeaseLostError",
    "SheetVisibilityError",
    "StoreError",
    "ToolCall",
    "ToolExecutionError",
    "ToolResult",
    "Waterfall",
    "play",
    "steps",
    "tool",
]


def test_public_names_are_the_documented_ones_and_resolve() -> None:
    assert sorted(deepline_cli.__all__) == EXPECTED_ALL
    module = importlib.import_module("deepline_cli")
    for name in deepline_cli.__all__:
        assert getattr(module, name) is not None, name
    namespace: dict[str, object] = {}
    exec("from deepline_cli import *", namespace)
    assert set(EXPECTED_ALL) <= namespace.keys()
    errors = importlib.import_module("deepline_cli.errors")
    for name in EXPECTED_ALL:
        if name.endswith("Error"):
            assert issubclass(getattr(module, name), errors.DeeplineError), name
    with pytest.raises(AttributeError):
        _ = module.NoSuchName


# Prints every command's `--help` through the real entry point, one process for them all.
EVERY_HELP = """
import sys
import typer.main
from deepline_cli.cli import main
from deepline_cli.cli.app import app

def paths(command, path):
    yield path
    for name, sub in sorted((getattr(command, "commands", None) or {}).items()):
        yield from paths(sub, [*path, name])

for path in paths(typer.main.get_command(app), []):
    sys.argv = ["deepline", *path, "--help"]
    print("@@COMMAND@@", " ".join(path), flush=True)
    try:
        main()
    except SystemExit as exc:
        assert not exc.code, (path, exc.code)
    sys.stdout.flush()
"""

# How Typer names a value by its Python type: `<str>`, `<int range>`, `<path>`, or Click's
# `TEXT`, `INTEGER`… (`PATH.py` in a description is the user's file, not a type).
PYTHON_METAVAR = re.compile(r"<[a-z][a-z_ \[\]|,]*>|\b(?:TEXT|INTEGER|FLOAT|BOOLEAN|PATH|FILENAME|DIRECTORY)\b(?!\.)")


def test_every_command_names_its_values_as_a_person_types_them(cli_env) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", EVERY_HELP], capture_output=True, text=True, env=cli_env, cwd=ROOT, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    pages = dict(page.split("\n", 1) for page in proc.stdout.split("@@COMMAND@@ ")[1:])
    assert {"run", "plan", "runs report", "runs stop", "receipts inspect", "tools execute"} <= set(pages)
    for command, page in pages.items():
        assert "Usage:" in page, command
        bad = [line.strip() for line in page.splitlines() if PYTHON_METAVAR.search(line)]
        assert bad == [], f"deepline {command} --help: {bad}"
    # the same option reads the same in every command that has it
    for command in ("run", "plan"):
        for shown in ("--csv FILE", "--set KEY=VALUE", "--limit N", "--store URL", "--input JSON|@FILE"):
            assert shown in pages[command], (command, shown)
    assert "PLAY  " in pages["plan"] and "RUN_ID  " in pages["runs report"]
    assert "--out FILE" in pages["runs report"] and "--reason REASON" in pages["runs stop"]
