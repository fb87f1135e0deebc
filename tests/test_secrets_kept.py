"""A secret is never stored or printed, whatever shape the play puts it in (SPEC §1: its value
is redacted everywhere it would be stored or printed). Each test reads every table and column
of the store for it, as well as what the command printed."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from tests.conftest import Result

Run = Callable[..., Result]

SECRET = "sk_live_51HkTESTKEY0123456789"

SHAPES = """
from dataclasses import dataclass
from deepline_cli import play, tool

@dataclass
class Auth:
    scheme: str
    token: str

@tool("t.echo", credits=1)
def echo(input):
    return {"seen": "ok"}

@play("child")
async def child(ctx, input):
    return {"got": len(input["auth"][1])}

@play("shapes")
async def shapes(ctx, input):
    key = ctx.secrets.get("API_KEY")
    ctx.log("auth", auth=("Bearer", key), as_object=Auth("Bearer", key))
    await ctx.tools.execute("echo", "t.echo", {"auth": ("Bearer", key), "obj": Auth("Bearer", key)})
    rows = await ctx.map("m", [{"id": "1", "auth": ("Bearer", key)}], key="id", columns={"n": lambda row: 1})
    told = await ctx.run_play("kid", "child", {"auth": ("Bearer", key)})
    return {"rows": len(rows), "child": told}
"""


def stored_text(store: Path) -> str:
    """Every value of every table of the store, as text."""
    conn = sqlite3.connect(store)
    try:
        tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return "\n".join(repr(row) for table in tables for row in conn.execute(f'SELECT * FROM "{table}"'))
    finally:
        conn.close()


def test_a_secret_in_a_tuple_a_dataclass_or_a_childs_input_is_stored_nowhere(
    deepline: Run, write_play: Callable[..., Path], store_path: Path
) -> None:
    """A tuple or a dataclass holding the key (log fields, a tool's input, a row's input) was
    kept as it was: redaction walked text, dicts and lists only. A child play run in the
    parent's process kept its input (the key) in clear. The key read from an environment that
    pads it (`echo key | base64` into a Kubernetes secret leaves a newline) was redacted only
    as padded, where a provider echoes it bare."""
    write_play(SHAPES)
    result = deepline("run", "play.py:shapes", "--json", API_KEY=SECRET + "\n")
    assert result.code == 0, result.stderr
    assert result.json_lines()[-1]["output"] == {"rows": 1, "child": {"got": len(SECRET) + 1}}
    shown = result.stdout + result.stderr
    for command in (("runs", "list", "--json"), ("export", result.json_lines()[-1]["run_id"])):
        shown += deepline(*command).stdout
    kept = stored_text(store_path)
    assert SECRET not in kept, kept[max(0, kept.find(SECRET) - 300) : kept.find(SECRET) + 100]
    assert SECRET not in shown
    assert "[redacted]" in kept


def test_a_key_a_provider_echoes_with_json_escapes_is_redacted_in_its_error() -> None:
    """ASP.NET writes `+` as `\\u002B`: the 401 body echoing the key was kept in clear."""
    from deepline_cli.runtime.providers.http import _readable
    from deepline_cli.runtime.providers.secrets import Secrets

    secrets = Secrets()
    key = "abc+def+ghi+jkl"
    import os

    os.environ["T_ESCAPED_KEY"] = key
    try:
        secrets.get("T_ESCAPED_KEY")
    finally:
        del os.environ["T_ESCAPED_KEY"]
    body = '{"error": "invalid key abc\\u002Bdef\\u002Bghi\\u002Bjkl"}'
    said = secrets.excerpt(_readable(body), 200)
    assert key not in said and "abc\\u002Bdef" not in said and "[redacted]" in said, said


SYS_EXIT = """
import sys
from deepline_cli import play

@play("sysexit")
async def sysexit(ctx, input):
    key = ctx.secrets.get("API_KEY")
    if input["where"] == "body":
        sys.exit(f"auth failed for key {key}")

    def column(row):
        sys.exit(f"auth failed for key {key}")

    await ctx.map("m", [{"a": 1}], key="a", columns={"c": column})
"""


def test_a_play_that_calls_sys_exit_fails_its_run_with_the_message_redacted(
    deepline: Run, write_play: Callable[..., Path], store_path: Path
) -> None:
    """`sys.exit(message)` in a play's body or a column printed the message (the key in it)
    raw, with a traceback for a column, and left the run `running`."""
    write_play(SYS_EXIT)
    for where in ("body", "column"):
        result = deepline("run", "play.py", "--set", f"where={where}", "--run-id", where, API_KEY=SECRET)
        assert result.code == 1, (where, result.stderr)
        assert SECRET not in result.stdout + result.stderr and "Traceback" not in result.stderr, result.stderr
        assert "auth failed for key [redacted]" in result.stderr, result.stderr
        shown = deepline("runs", "show", where, "--json")
        assert '"status": "failed"' in shown.stdout or '"status":"failed"' in shown.stdout, shown.stdout
    assert SECRET not in stored_text(store_path)
