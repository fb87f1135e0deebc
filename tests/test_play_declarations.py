"""What a play declares on `@play(...)`: its input schema, the secrets it needs, its credit
budget, and `ctx.secrets.bearer`. Through the real `deepline` command, on each store
backend (SQLite, then PostgreSQL when DEEPLINE_TEST_POSTGRES_URL is set), with the real
loopback provider (tests/provider.py) counting every request that reaches it.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Result
from tests.helpers import no_traceback, runs, show
from tests.provider import Provider, ProviderServer

SECRET = "sk-decl-5f1e9a3c7b2d"  # over 8 characters: a secret, redacted wherever it would show


@pytest.fixture
def provider() -> Iterator[Provider]:
    with ProviderServer() as running:
        yield running


@pytest.fixture
def cli(deepline: Callable[..., Result], store_url: str) -> Callable[..., Result]:
    """`deepline` on the backend under test, with fast retries."""

    def run(*args: str, **env: str) -> Result:
        return deepline(*args, **{"DEEPLINE_STORE": store_url, "DEEPLINE_RETRY_BASE_S": "0.01", **env})

    return run


def write(path: Path, text: str, **values: Any) -> Path:
    body = textwrap.dedent(text)
    for name, value in values.items():
        body = body.replace(f"@{name}@", str(value))
    path.write_text(body)
    return path


def error_line(result: Result) -> str:
    """The one line a refused command writes on stderr."""
    no_traceback(result.stderr)
    (line,) = result.stderr.strip().splitlines()
    return line


ECHO_CONFIG = """\
[tools."decl.echo"]
method = "POST"
url = "@URL@/v1/echo"
json = { n = "{n}" }
credits = 1
"""


# --- input= -------------------------------------------------------------------------------

SCHEMA_PLAY = """\
from typing import Literal

from deepline_cli import play


@play("schema", input={"provider": Literal["alpha", "beta"], "limit": int, "tags": list[str] | None})
async def schema(ctx, input):
    await ctx.tools.execute("echo", "decl.echo", {"n": input["limit"]})
    return {"provider": input["provider"], "tags": input.get("tags")}
"""


def test_an_input_the_schema_refuses_stops_run_plan_and_enqueue_before_a_run_is_recorded(
    tmp_path: Path, cli: Callable[..., Result], provider: Provider
) -> None:
    write(tmp_path / "play.py", SCHEMA_PLAY)
    write(tmp_path / "deepline.toml", ECHO_CONFIG, URL=provider.url)
    refused = {
        ("run", "--input", '{"provider": "gamma", "limit": 1}'): (
            "Error: Input field 'provider' must be one of alpha, beta (got 'gamma')."
        ),
        ("run", "--set", "provider=alpha"): (
            "Error: Input field 'limit' is required; give it with --set limit=VALUE or --input JSON."
        ),
        ("run", "--input", '{"provider": "alpha", "limit": 1, "tags": ["a", 2]}'): (
            "Error: Input field 'tags[1]' must be a string (got 2)."
        ),
        ("run", "--enqueue", "--input", '{"provider": "beta", "limit": "ten"}'): (
            "Error: Input field 'limit' must be an integer (got 'ten')."
        ),
        ("plan", "--input", '{"provider": "beta"}'): (
            "Error: Input field 'limit' is required; give it with --set limit=VALUE or --input JSON."
        ),
    }
    for (command, *flags), expected in refused.items():
        result = cli(command, "play.py", *flags)
        assert result.code == 2, (flags, result.stderr)
        assert error_line(result) == expected
    assert runs(cli) == {}  # not one run was recorded
    assert provider.count() == 0

    ok = cli("run", "play.py", "--input", '{"provider": "beta", "limit": 2, "extra": "allowed"}', "--quiet")
    assert ok.code == 0, ok.stderr
    assert json.loads(ok.stdout) == {"provider": "beta", "tags": None}
    assert provider.count() == 1


TYPED_PLAY = """\
from __future__ import annotations

from typing import NotRequired, TypedDict

from deepline_cli import play


class Company(TypedDict):
    domain: str
    size: NotRequired[int]


class Input(TypedDict):
    company: Company


@play("typed", input=Input)
async def typed(ctx, input):
    return input
"""


def test_a_typeddict_schema_names_nested_fields_by_dotted_path(tmp_path: Path, cli: Callable[..., Result]) -> None:
    write(tmp_path / "play.py", TYPED_PLAY)  # string annotations (`from __future__`), NotRequired inside
    refused = cli("run", "play.py", "--set", "company.size=3")
    assert refused.code == 2
    assert error_line(refused) == "Error: Input field 'company.domain' is required."
    wrong = cli("run", "play.py", "--set", "company.domain=acme.com", "--set", "company.size=big")
    assert error_line(wrong) == "Error: Input field 'company.size' must be an integer (got 'big')."
    assert runs(cli) == {}
    ok = cli("run", "play.py", "--set", "company.domain=acme.com", "--quiet")
    assert ok.code == 0, ok.stderr
    assert json.loads(ok.stdout) == {"company": {"domain": "acme.com"}}  # nothing filled in


PARENT_PLAY = """\
from deepline_cli import play


@play("parent")
async def parent(ctx, input):
    return await ctx.run_play("enrich-1", "child.py", {"provider": input["provider"], "limit": 1})
"""

CHILD_PLAY = """\
from deepline_cli import play


@play("enrich", input={"type": "object", "properties": {"provider": {"enum": ["alpha", "beta"]},
                       "limit": {"type": "integer", "minimum": 1}}, "required": ["provider", "limit"]})
async def enrich(ctx, input):
    await ctx.tools.execute("echo", "decl.echo", {"n": input["limit"]})
    return {"enriched": input["provider"]}
"""


def test_a_child_play_refuses_its_input_in_its_parent_before_the_child_exists(
    tmp_path: Path, cli: Callable[..., Result], provider: Provider
) -> None:
    write(tmp_path / "play.py", PARENT_PLAY)
    write(tmp_path / "child.py", CHILD_PLAY)  # a JSON-Schema spelling
    write(tmp_path / "deepline.toml", ECHO_CONFIG, URL=provider.url)
    failed = cli("run", "play.py", "--set", "provider=gamma", "--json")
    assert failed.code == 2, failed.stderr
    finished = failed.json_lines()[-1]
    assert finished["status"] == "failed"
    assert finished["error"]["message"] == (
        "Child play 'enrich' (run_play 'enrich-1'): input field 'provider' must be one of alpha, beta (got 'gamma')."
    )
    recorded = runs(cli)
    assert [r["play"] for r in recorded.values()] == ["parent"]  # the child was never recorded
    assert provider.count() == 0

    ok = cli("run", "play.py", "--set", "provider=alpha", "--quiet")
    assert ok.code == 0, ok.stderr
    assert json.loads(ok.stdout) == {"enriched": "alpha"}
    assert provider.count() == 1


# --- secrets= -----------------------------------------------------------------------------

SECRETS_PLAY = """\
from deepline_cli import play


@play("needs-keys", secrets=["DECL_TOKEN", "DECL_OTHER"])
async def needs_keys(ctx, input):
    if input.get("wait"):
        await ctx.wait_for_event("go")
    await ctx.tools.execute("echo", "decl.echo", {"n": 1})
    return "called"
"""


def test_a_missing_declared_secret_stops_the_run_before_any_provider_request(
    tmp_path: Path, cli: Callable[..., Result], provider: Provider
) -> None:
    write(tmp_path / "play.py", SECRETS_PLAY)
    write(tmp_path / "deepline.toml", ECHO_CONFIG, URL=provider.url)
    (tmp_path / ".env").write_text("DECL_OTHER=from-dotenv-1234\n")

    missing = cli("run", "play.py")
    assert missing.code == 2
    assert error_line(missing) == (
        f"Error: Play 'needs-keys' needs the secret DECL_TOKEN, which is not set; "
        f"export it or add it to {tmp_path / '.env'}."
    )
    assert provider.count() == 0
    assert runs(cli) == {}

    # Set when the run starts, gone when it resumes: the resume stops before any call too.
    waiting = cli("run", "play.py", "--set", "wait=true", "--json", DECL_TOKEN=SECRET)
    assert waiting.code == 3, waiting.stderr
    run_id = waiting.json_lines()[-1]["run_id"]
    assert cli("events", "send", run_id, "go").code == 0
    stopped = cli("resume", run_id)
    assert stopped.code == 2
    assert "needs the secret DECL_TOKEN" in error_line(stopped)
    assert provider.count() == 0

    resumed = cli("resume", run_id, "--quiet", DECL_TOKEN=SECRET)
    assert resumed.code == 0, resumed.stderr
    assert provider.count() == 1
    (tmp_path / ".env").write_text(f"DECL_OTHER=from-dotenv-1234\nDECL_TOKEN={SECRET}\n")
    assert cli("run", "play.py", "--quiet").code == 0  # from .env next to the play


def test_a_resume_stopped_by_a_missing_secret_is_no_attempt_anywhere(
    tmp_path: Path, cli: Callable[..., Result], provider: Provider
) -> None:
    """A resume refused for a missing secret does not take the run: no attempt number, no
    attempt record (`runs show`, its stats and `--full` agree), the run still waiting."""
    write(tmp_path / "play.py", SECRETS_PLAY)
    write(tmp_path / "deepline.toml", ECHO_CONFIG, URL=provider.url)
    (tmp_path / ".env").write_text("DECL_OTHER=from-dotenv-1234\n")
    waiting = cli("run", "play.py", "--set", "wait=true", "--json", DECL_TOKEN=SECRET)
    assert waiting.code == 3, waiting.stderr
    run_id = waiting.json_lines()[-1]["run_id"]
    assert cli("events", "send", run_id, "go").code == 0
    assert cli("resume", run_id).code == 2  # the secret is missing: refused
    assert json.loads(cli("runs", "show", run_id, "--json").stdout)["status"] == "waiting"
    assert cli("resume", run_id, "--quiet", DECL_TOKEN=SECRET).code == 0  # attempt 2
    shown = json.loads(cli("runs", "show", run_id, "--json").stdout)
    assert (shown["attempt"], shown["stats"]["attempts"]) == (2, 2), shown["stats"]
    full = cli("runs", "show", run_id, "--full").stdout
    assert "#2" in full and "#3" not in full, full


def test_check_reports_declared_secrets_schema_and_budget(tmp_path: Path, cli: Callable[..., Result]) -> None:
    write(
        tmp_path / "play.py",
        """\
        from typing import Literal

        from deepline_cli import play


        @play("declared", description="all three", input={"provider": Literal["alpha", "beta"], "limit": int | None},
              secrets=["DECL_TOKEN"], max_credits_per_run=25)
        async def declared(ctx, input):
            return None
        """,
    )
    missing = cli("check", "play.py")
    assert missing.code == 2
    assert "provider  one of alpha, beta  (required)" in missing.stdout
    assert "limit     an integer or null  (optional)" in missing.stdout
    assert "secrets  DECL_TOKEN (not set)" in missing.stdout
    assert "budget   25 credits per run" in missing.stdout
    assert "Play 'declared' needs the secret DECL_TOKEN" in error_line(missing)

    report = cli("check", "play.py", "--json", DECL_TOKEN=SECRET)
    assert report.code == 0, report.stderr
    data = json.loads(report.stdout)
    (declared,) = data["plays"]
    assert declared["input_schema"] == {
        "type": "object",
        "properties": {"provider": {"enum": ["alpha", "beta"]}, "limit": {"type": ["integer", "null"]}},
        "required": ["provider"],
    }
    assert declared["secrets"] == ["DECL_TOKEN"] and declared["max_credits_per_run"] == 25
    assert data["missing_secrets"] == []
    assert SECRET not in report.stdout + report.stderr


# --- max_credits_per_run= ------------------------------------------------------------------

BUDGET_PLAY = """\
from deepline_cli import play


@play("budgeted", max_credits_per_run=2)
async def budgeted(ctx, input):
    for n in range(3):
        await ctx.tools.execute(f"echo-{n}", "decl.echo", {"n": n, "batch": input.get("batch", 0)})
    return "done"
"""


def test_max_credits_per_run_budgets_the_run_across_attempts_and_max_credits_overrides_it(
    tmp_path: Path, cli: Callable[..., Result], provider: Provider
) -> None:
    write(tmp_path / "play.py", BUDGET_PLAY)
    write(tmp_path / "deepline.toml", ECHO_CONFIG, URL=provider.url)

    stopped = cli("run", "play.py", "--json")
    assert stopped.code == 1
    finished = stopped.json_lines()[-1]
    run_id = finished["run_id"]
    assert finished["error"]["type"] == "BudgetExceededError"
    assert finished["error"]["message"].startswith(
        "max_credits_per_run 2 of play 'budgeted' would be exceeded by 'echo-2' (decl.echo, expected to cost 1; 2 spent"
    )
    assert provider.count() == 2

    again = cli("resume", run_id, "--json")  # the budget counts what earlier attempts spent
    assert again.code == 1
    assert provider.count() == 2

    raised = cli("resume", run_id, "--max-credits", "3", "--quiet")
    assert raised.code == 0, raised.stderr
    assert provider.count() == 3  # the first two were not paid again
    assert show(cli, run_id)["stats"]["credits"] == 3

    lower = cli("run", "play.py", "--set", "batch=1", "--max-credits", "1", "--json")  # overrides downwards too
    assert lower.code == 1
    assert lower.json_lines()[-1]["error"]["message"].startswith("--max-credits 1 would be exceeded by 'echo-1'")
    assert provider.count() == 4
    higher = cli("run", "play.py", "--set", "batch=2", "--max-credits", "10", "--quiet")
    assert higher.code == 0, higher.stderr
    assert provider.count() == 7


# --- ctx.secrets.bearer -------------------------------------------------------------------

# With DECL_GET set, the play asks `ctx.secrets.get` instead: the same error when missing.
BEARER_PLAY = """\
import os

from deepline_cli import play


@play("bearer")
async def bearer(ctx, input):
    ask = ctx.secrets.get if os.environ.get("DECL_GET") else ctx.secrets.bearer
    header = ask(input["name"])
    ctx.log(f"sending {header}")
    answer = await ctx.fetch("whoami", "@URL@/v1/whoami", headers={"Authorization": header})
    return {"header": header, "status": answer.status}
"""


def test_bearer_sends_the_secret_and_keeps_it_redacted(
    tmp_path: Path, cli: Callable[..., Result], provider: Provider
) -> None:
    write(tmp_path / "play.py", BEARER_PLAY, URL=provider.url)
    ok = cli("run", "play.py", "--set", "name=DECL_TOKEN", "--quiet", DECL_TOKEN=SECRET)
    assert ok.code == 0, ok.stderr
    (seen,) = provider.requests
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    assert json.loads(ok.stdout) == {"header": "Bearer [redacted]", "status": 200}
    run_id = next(iter(runs(cli)))
    logs = cli("runs", "logs", run_id)
    assert "sending Bearer [redacted]" in logs.stdout
    stored = json.dumps(show(cli, run_id)) + logs.stdout + ok.stderr
    assert SECRET not in stored

    bearer = cli("run", "play.py", "--set", "name=DECL_NOPE", "--json")
    get = cli("run", "play.py", "--set", "name=DECL_NOPE", "--json", DECL_GET="1")
    assert bearer.code == 2
    message = bearer.json_lines()[-1]["error"]["message"]
    assert message == f"Secret DECL_NOPE is not set; export it or add it to {tmp_path / '.env'}."
    assert get.json_lines()[-1]["error"]["message"] == message
    assert len(provider.requests) == 1


@pytest.mark.parametrize(
    ("option", "said"),
    [
        ("rate_limit='20 per second'", "rate_limit '20 per second' is not valid"),
        ("concurrency=0", "concurrency must be"),
        ("rate_limit=10", "rate_limit 10 is not valid"),
        # credits: a number, 0 or more (True was 1 credit, "5" five, -1 a refund, 10**400 an
        # OverflowError, NaN a budget that never stops)
        ("credits=True", "credits must be a number of credits, 0 or more, not True"),
        ("credits='5'", "credits must be a number of credits, 0 or more, not '5'"),
        ("credits=-1", "credits must be a number of credits, 0 or more, not -1"),
        ("credits=float('nan')", "credits must be a number of credits, 0 or more, not nan"),
        ("credits=float('inf')", "credits must be a number of credits, 0 or more, not inf"),
        ("credits=10**400", "credits must be a number of credits, 0 or more, not an integer of about 401 digits"),
        ("credits=10**5000", "not an integer of about 5001 digits"),  # its repr is refused past 4,300
    ],
)
def test_a_tools_bad_limit_is_refused_by_check(deepline, write_play, option: str, said: str) -> None:
    """`@tool(rate_limit="20 per second")`: `deepline check` said ok, and the run failed at
    the tool's first call."""
    write_play(
        f"""
        from deepline_cli import play, tool

        @tool("bad.limit", {option})
        def t(input):
            return 1

        @play("p")
        async def p(ctx, input):
            return (await ctx.tools.execute("t", "bad.limit", {{}})).output
        """
    )
    checked = deepline("check", "play.py")
    assert checked.code == 2, checked.stdout + checked.stderr
    assert said in checked.stderr and "Traceback" not in checked.stderr, checked.stderr


def test_a_tools_credits_may_be_any_real_number() -> None:
    """A Decimal (money as a price list holds it), a Fraction or a numpy number: what float()
    took before credits were checked is taken still."""
    from decimal import Decimal
    from fractions import Fraction

    from deepline_cli import tool
    from deepline_cli.runtime.providers.tools import registered_tools

    for n, credits in enumerate((Decimal("2.5"), Fraction(1, 4), 3)):

        @tool(f"credits.kind{n}", credits=credits)
        def priced(input: dict) -> int:
            return 1

        assert registered_tools()[f"credits.kind{n}"].credits == float(credits)
