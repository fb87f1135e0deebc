"""`deepline tools describe` and `deepline tools execute`, through the real command, with
the real loopback provider (tests/provider.py) counting the requests that reach it;
`execute` on each store backend (SQLite, then PostgreSQL when configured)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import Result
from tests.helpers import no_traceback, runs, show
from tests.provider import Provider, ProviderServer

SECRET = "sk-tools-8c2e4a6f1b3d"

CONFIG = """\
[tools."ht.echo"]
method = "POST"
url = "@URL@/v1/echo/{id}"
headers = { Authorization = "Bearer ${TT_TOKEN}", X-Team = "growth" }
query = { q = "{query}" }
json = { id = "{id}", domain = "{company.domain}" }
extract = { domain = "echo.domain" }
credits = 2
rate_limit = "5/s"
concurrency = 3
timeout_s = 12
retries = 1
idempotency_header = "X-Idem"
version = "3"

[tools."ht.batch"]
url = "@URL@/v1/batch"
json = { id = "{id}" }
batch = { max_size = 10, max_wait_ms = 5 }
"""

LOCAL_PLAY = """\
import os

from deepline_cli import ProviderTransientError, play, tool


@tool("local.score", credits=0.5, rate_limit="2/s", concurrency=1, version="2")
async def score(input, call):
    \"\"\"Score a company from its domain.\"\"\"
    with open(os.path.join(os.path.dirname(__file__), "score.log"), "a") as f:
        f.write(f"{call.idempotency_key}\\n")
    if os.path.exists(os.path.join(os.path.dirname(__file__), "flaky")):
        raise ProviderTransientError("the scorer is down")
    return {"score": len(input["domain"])}


@play("scoring")
async def scoring(ctx, input):
    return (await ctx.tools.execute("s", "local.score", input)).output
"""


@pytest.fixture
def provider() -> Iterator[Provider]:
    with ProviderServer() as running:
        yield running


@pytest.fixture
def project(tmp_path: Path, provider: Provider) -> Path:
    (tmp_path / "deepline.toml").write_text(CONFIG.replace("@URL@", provider.url))
    (tmp_path / "play.py").write_text(LOCAL_PLAY)
    return tmp_path


def error_line(result: Result) -> str:
    no_traceback(result.stderr)
    (line,) = result.stderr.strip().splitlines()
    return line


# --- describe -----------------------------------------------------------------------------


def test_describe_an_http_tool_shows_its_request_and_settings_but_no_secret(
    project: Path, deepline: Callable[..., Result], provider: Provider
) -> None:
    described = deepline("tools", "describe", "ht.echo", "--json", TT_TOKEN=SECRET)
    assert described.code == 0, described.stderr
    assert json.loads(described.stdout) == {
        "id": "ht.echo",
        "kind": "http",
        "method": "POST",
        "url": f"{provider.url}/v1/echo/{{id}}",
        "headers": {"Authorization": "Bearer ${TT_TOKEN}", "X-Team": "growth"},
        "query": {"q": "{query}"},
        "json": {"id": "{id}", "domain": "{company.domain}"},
        "fields": ["company.domain", "id", "query"],
        "secrets": [{"name": "TT_TOKEN", "set": True}],
        "proxy": None,
        "credits": 2.0,
        "rate_limit": "5/s",
        "concurrency": 3,
        "timeout_s": 12.0,
        "retries": 1,
        "idempotency_header": "X-Idem",
        "batch": None,
        "extract": {"domain": "echo.domain"},
        "version": "3",
        "allow_hosts": [],
        "config": str(project / "deepline.toml"),
    }
    human = deepline("tools", "describe", "ht.echo")  # the token unset here
    assert human.code == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0] == f"ht.echo  (http tool, {project / 'deepline.toml'})"
    for expected in (
        f"request      POST {provider.url}/v1/echo/{{id}}",
        "headers      Authorization: Bearer ${TT_TOKEN}  X-Team: growth",
        "reads        company.domain, id, query",
        "secrets      TT_TOKEN (not set)",
        "credits      2 per call",
        "rate limit   5/s",
        "idempotency  X-Idem header",
        "extract      domain: echo.domain",
    ):
        assert expected in lines, (expected, lines)
    batch = json.loads(deepline("tools", "describe", "ht.batch", "--json").stdout)
    assert batch["batch"] == {"max_size": 10, "max_wait_ms": 5} and batch["method"] == "POST"
    assert SECRET not in described.stdout + human.stdout
    assert provider.count() == 0


def test_describe_a_secret_written_into_the_config_is_redacted(
    tmp_path: Path, deepline: Callable[..., Result], provider: Provider
) -> None:
    (tmp_path / "deepline.toml").write_text(
        f'[tools."ht.raw"]\nurl = "{provider.url}/v1/raw"\n'
        f'headers = {{ X-Key = "{SECRET}", X-Ref = "${{TT_TOKEN}}" }}\n'
    )
    described = deepline("tools", "describe", "ht.raw", "--json", TT_TOKEN=SECRET)
    assert described.code == 0, described.stderr
    assert json.loads(described.stdout)["headers"] == {"X-Key": "[redacted]", "X-Ref": "${TT_TOKEN}"}


def test_describe_a_local_tool_and_a_remote_one(project: Path, deepline: Callable[..., Result]) -> None:
    local = deepline("tools", "describe", "local.score", "--play", "play.py", "--json")
    assert local.code == 0, local.stderr
    data = json.loads(local.stdout)
    assert data == {
        "id": "local.score",
        "kind": "local",
        "module": str(project / "play.py"),
        "function": "score",
        "line": 6,
        "signature": "async def score(input, call)",
        "doc": "Score a company from its domain.",
        "takes_call": True,
        "credits": 0.5,
        "rate_limit": "2/s",
        "concurrency": 1,
        "version": "2",
        "batch": None,
    }
    human = deepline("tools", "describe", "local.score", "--play", "play.py")
    assert "signature    async def score(input, call)" in human.stdout.splitlines()
    # listed where its author wrote it, not under the loader's module name (deepline_play_…)
    listed = {row["id"]: row for row in deepline("tools", "list", "--play", "play.py", "--json").json_lines()}
    assert listed["local.score"]["target"] == "score in play.py line 6"

    remote_config = project / "remote.toml"
    remote_config.write_text('[remote]\nbase_url = "https://tools.example.com"\napi_key_env = "TT_REMOTE"\n')
    remote = deepline("tools", "describe", "apollo.people", "--config", str(remote_config), "--json")
    assert remote.code == 0, remote.stderr
    data = json.loads(remote.stdout)
    assert data["kind"] == "remote" and data["url"] == "https://tools.example.com/v1/tools/apollo.people/execute"
    assert data["headers"] == {"Authorization": "Bearer ${TT_REMOTE}"} and data["credits"] is None


def test_describe_an_unknown_tool_lists_the_known_ones(project: Path, deepline: Callable[..., Result]) -> None:
    unknown = deepline("tools", "describe", "ht.nope", "--play", "play.py")
    assert unknown.code == 2
    assert error_line(unknown) == "Error: Unknown tool 'ht.nope'; known tools: ht.batch, ht.echo, local.score."
    (project / "empty").mkdir()
    empty = deepline("tools", "describe", "ht.nope", cwd=project / "empty")  # no deepline.toml there
    assert empty.code == 2
    assert "no tools are declared here" in error_line(empty)


# --- execute ------------------------------------------------------------------------------


@pytest.fixture
def cli(deepline: Callable[..., Result], store_url: str) -> Callable[..., Result]:
    def run(*args: str, **env: str) -> Result:
        return deepline(*args, **{"DEEPLINE_STORE": store_url, "DEEPLINE_RETRY_BASE_S": "0.01", **env})

    return run


CALL = json.dumps({"id": 7, "query": "acme", "company": {"domain": "acme.com"}})


def test_execute_calls_once_then_reuses_the_receipt_and_force_pays_again(
    project: Path, cli: Callable[..., Result], provider: Provider
) -> None:
    first = cli("tools", "execute", "ht.echo", "--input", CALL, TT_TOKEN=SECRET)
    assert first.code == 0, first.stderr
    answer = json.loads(first.stdout)
    assert answer["path"] == "/v1/echo/7" and answer["echo"] == {"id": 7, "domain": "acme.com"}
    assert "Called ht.echo: 2 credits" in first.stderr
    assert provider.count() == 1
    (seen,) = provider.requests
    assert seen.headers["authorization"] == f"Bearer {SECRET}" and seen.query == "q=acme"

    (project / "input.json").write_text(CALL)
    again = cli("tools", "execute", "ht.echo", "--input", "@input.json", TT_TOKEN=SECRET)
    assert again.code == 0, again.stderr
    assert json.loads(again.stdout) == answer
    assert "From the receipt" in again.stderr and "no provider call" in again.stderr
    assert provider.count() == 1  # nothing was sent

    forced = cli("tools", "execute", "ht.echo", "--input", CALL, "--force", TT_TOKEN=SECRET)
    assert forced.code == 0, forced.stderr
    assert "Called ht.echo" in forced.stderr
    assert provider.count() == 2
    keys = [r.headers["x-idem"] for r in provider.requests]
    assert len(set(keys)) == 2  # a new paid call, under a new idempotency key

    # Three real runs in the store, with their credits and their receipt.
    recorded = runs(cli)
    assert [r["play"] for r in recorded.values()] == ["tools.execute"] * 3
    assert sorted(show(cli, run_id)["stats"]["credits"] for run_id in recorded) == [0, 2, 2]
    listed = cli("receipts", "inspect", "--tool", "ht.echo", "--json")
    (receipt,) = listed.json_lines()
    assert receipt["kind"] == "tool" and receipt["status"] == "completed" and receipt["credits"] == 2
    assert SECRET not in json.dumps([show(cli, run_id) for run_id in recorded]) + listed.stdout


def test_execute_json_prints_the_runs_events(project: Path, cli: Callable[..., Result], provider: Provider) -> None:
    result = cli("tools", "execute", "ht.echo", "--input", CALL, "--json", TT_TOKEN=SECRET)
    assert result.code == 0, result.stderr
    events = result.json_lines()
    assert [e["event"] for e in events] == ["run.started", "tool.call", "run.progress", "run.finished"]
    assert events[0]["play"] == "tools.execute"
    finished = events[-1]
    assert finished["status"] == "completed" and finished["output"]["execution"] == "live"
    assert finished["output"]["output"]["echo"] == {"id": 7, "domain": "acme.com"}
    assert finished["stats"]["tools"]["ht.echo"]["live"] == 1


def test_execute_is_not_served_from_a_plays_receipts(
    project: Path, cli: Callable[..., Result], provider: Provider
) -> None:
    (project / "caller.py").write_text(
        textwrap.dedent(
            f"""\
            from deepline_cli import play


            @play("caller")
            async def caller(ctx, input):
                return (await ctx.tools.execute("echo", "ht.echo", {CALL})).output
            """
        )
    )
    assert cli("run", "caller.py", "--quiet", TT_TOKEN=SECRET).code == 0
    assert provider.count() == 1
    executed = cli("tools", "execute", "ht.echo", "--input", CALL, TT_TOKEN=SECRET)
    assert executed.code == 0, executed.stderr
    assert "Called ht.echo" in executed.stderr
    assert provider.count() == 2  # receipts are keyed by play: `tools.execute` has its own


def test_execute_a_failing_provider_exits_1_with_one_sentence(
    project: Path, cli: Callable[..., Result], provider: Provider
) -> None:
    provider.script("/v1/echo/7", ["500", "500"])
    failed = cli("tools", "execute", "ht.echo", "--input", CALL, TT_TOKEN=SECRET)
    assert failed.code == 1
    line = error_line(failed)
    assert line.startswith('Error: 500 from ht.echo: {"error": "fault"} (retried 1x) (run r-')
    assert failed.stdout == ""
    assert provider.count() == 2  # the call and its one retry
    (run,) = runs(cli).values()
    assert run["status"] == "failed" and run["play"] == "tools.execute"


def test_execute_refuses_an_unknown_tool_or_a_missing_secret_before_any_run(
    project: Path, cli: Callable[..., Result], provider: Provider
) -> None:
    unknown = cli("tools", "execute", "ht.nope", "--input", "{}")
    assert unknown.code == 2
    assert error_line(unknown) == "Error: Unknown tool 'ht.nope'; known tools: ht.batch, ht.echo."
    secret = cli("tools", "execute", "ht.echo", "--input", CALL)
    assert secret.code == 2
    assert error_line(secret) == (
        f"Error: Tool 'ht.echo': secret TT_TOKEN is not set; export it or add it to {project / '.env'}."
    )
    bad = cli("tools", "execute", "ht.echo", "--input", "[1]", TT_TOKEN=SECRET)
    assert bad.code == 2
    assert runs(cli) == {}
    assert provider.count() == 0


def test_execute_a_local_tool_of_a_play_file_and_resume_it_from_elsewhere(
    project: Path, cli: Callable[..., Result], deepline: Callable[..., Result]
) -> None:
    (project / "flaky").write_text("")
    failed = cli("tools", "execute", "local.score", "--play", "play.py", "--input", '{"domain": "acme.com"}')
    assert failed.code == 1
    assert "the scorer is down" in error_line(failed)
    (run_id,) = runs(cli)
    (project / "flaky").unlink()

    elsewhere = project / "elsewhere"
    elsewhere.mkdir()
    resumed = cli("resume", run_id, "--quiet", cwd=elsewhere)  # the run knows which file holds its tools
    assert resumed.code == 0, resumed.stderr
    assert json.loads(resumed.stdout)["output"] == {"score": 8}
    calls = (project / "score.log").read_text().splitlines()
    assert len(calls) == 2 and calls[0] == calls[1]  # the retry went out under the same key

    reused = cli("tools", "execute", "local.score", "--play", "play.py", "--input", '{"domain": "acme.com"}')
    assert reused.code == 0, reused.stderr
    assert json.loads(reused.stdout) == {"score": 8} and "From the receipt" in reused.stderr
    assert len((project / "score.log").read_text().splitlines()) == 2


def test_check_and_describe_know_the_secret_of_a_tools_proxy(tmp_path: Path, deepline: Callable[..., Result]) -> None:
    """`proxy = "http://svc:${CORP_PROXY_PASSWORD}@…"`: check said every secret was set and
    describe said "secrets none", then the run stopped for the unset secret."""
    (tmp_path / "deepline.toml").write_text(
        '[tools."p.a"]\nurl = "http://127.0.0.1:9/ok/{domain}"\n'
        'proxy = "http://svc:${CORP_PROXY_PASSWORD}@127.0.0.1:18600"\n'
    )
    (tmp_path / "play.py").write_text(
        "from deepline_cli import play\n\n@play('p')\nasync def p(ctx, input):\n"
        "    return (await ctx.tools.execute('a', 'p.a', {'domain': 'a.com'})).output\n"
    )
    checked = deepline("check", "play.py", cwd=tmp_path)
    assert checked.code == 2 and "CORP_PROXY_PASSWORD" in checked.stderr + checked.stdout, checked
    described = deepline("tools", "describe", "p.a", "--json", cwd=tmp_path, CORP_PROXY_PASSWORD="pr0xy-passw0rd")
    d = json.loads(described.stdout)
    assert d["secrets"] == [{"name": "CORP_PROXY_PASSWORD", "set": True}], d
    assert d["proxy"] == "http://svc:${CORP_PROXY_PASSWORD}@127.0.0.1:18600"
    assert "pr0xy-passw0rd" not in described.stdout


def test_execute_says_a_failure_came_from_its_receipt_not_a_new_call(
    tmp_path: Path, deepline: Callable[..., Result], write_play: Callable[..., Path]
) -> None:
    """A failure kept on a receipt, given back again: the error says it came from the
    receipt and how to call again, so a fixed config is not taken for still broken."""
    write_play(
        """
        from deepline_cli import tool, ToolExecutionError

        @tool("te.bad")
        def bad(input):
            with open("calls.log", "a") as f:
                f.write("x\\n")
            raise ToolExecutionError("400: bad domain", category="validation", status_code=400)
        """
    )
    args = ("tools", "execute", "te.bad", "--play", "play.py", "--input", '{"d": 1}')
    first = deepline(*args)
    assert first.code == 1 and "receipt" not in first.stderr, first.stderr
    again = deepline(*args)
    assert again.code == 1
    assert "this failure is the one its receipt kept: the provider was not called again" in again.stderr
    assert (tmp_path / "calls.log").read_text().split() == ["x"]
