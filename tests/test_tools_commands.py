"""`deepline tools describe`, through the real command, with the real loopback provider
(tests/provider.py) counting the requests that reach it (none should)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import Result
from tests.helpers import no_traceback
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
