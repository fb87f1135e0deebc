"""The provider layer (SPEC §3): HTTP tools from deepline.toml, retries, idempotency,
secrets, remote tools, batch tools, the governor, budgets and the circuit breaker.

Every test talks to a REAL loopback HTTP provider (tests/provider.py, an asyncio server
in a thread) and checks what the provider received: paths, query strings, headers,
bodies, idempotency keys, arrival times and what it billed. Plays run in-process through
the real `Runner` against a private SQLite file, or through the real `deepline` command
in a subprocess where the command line itself is what is tested.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import json
import math
import sqlite3
import textwrap
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from deepline_cli.errors import StoreError
from deepline_cli.runtime.calls.events import Event, EventBus
from deepline_cli.runtime.calls.receipts import idempotency_key
from deepline_cli.runtime.run.options import RunOptions, RunResult
from deepline_cli.runtime.run.runner import Runner
from deepline_cli.store.records import Applied, Receipt, ReceiptQuery, Writes
from deepline_cli.store.sqlite import SQLiteStore
from tests.conftest import counts
from tests.helpers import wait_until
from tests.provider import Provider, ProviderServer, Seen

SECRET = "sk-live-7f3c9a1e5b2d4c6e"  # well over 8 characters: treated as a secret
ROTATED = "sk-live-NEW-0a9b8c7d6e5f"


# --- the provider, with arrival times, hooks and batch answers -----------------------------


@dataclass
class LoopbackProvider(Provider):
    """tests/provider.py's provider, plus what these tests need to observe.

    - `times(path)`: when each request arrived at the provider (`Seen.at`, monotonic), and
      `wall_times` the wall-clock instants (for HTTP-date Retry-After values);
    - `hooks[path]`: called when a request for `path` arrives, before it is answered;
    - in-flight accounting for "ok"/"slow" answers (`max_inflight`);
    - paths ending in `/batch` answer `{"results": [...]}`, one result per item sent,
      still billing each idempotency key once and replaying its first answer.
    """

    wall_times: list[float] = field(default_factory=list)
    hooks: dict[str, Callable[[str], None]] = field(default_factory=dict)
    inflight: int = 0
    max_inflight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _fault_for(self, path: str) -> str:
        with self._lock:
            self.wall_times.append(time.time())
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
        hook = self.hooks.get(path)
        if hook is not None:
            hook(path)
        fault = super()._fault_for(path)
        if fault.partition(":")[0] not in ("ok", "slow"):
            with self._lock:
                self.inflight -= 1
        return fault

    def answer(self, seen: Seen) -> tuple[int, dict[str, str], bytes]:
        with self._lock:
            self.inflight -= 1
        if seen.path.endswith("/quote401"):  # a 401 whose message quotes the request, far into its body
            quoted = f" Request: GET {seen.path}?{seen.query}"
            pad = 190 - len('{"error": {"message": "') - (quoted.find("api_key=") + len("api_key="))
            said = "x" * pad + quoted  # the key starts 10 characters before the 200th
            return 401, {"content-type": "application/json"}, json.dumps({"error": {"message": said}}).encode()
        if seen.path.endswith("/batch") and isinstance(seen.body, dict):
            key = seen.headers.get("idempotency-key", "")
            if key in self.answers:
                payload = self.answers[key]
            else:
                payload = {"results": [{"echo": item, "n": len(self.answers)} for item in seen.body["items"]]}
                self.answers[key] = payload
                self.billed[key] += 1
            return 200, {"content-type": "application/json"}, json.dumps(payload).encode()
        return super().answer(seen)

    def on(self, path: str) -> list[Seen]:
        return [r for r in self.requests if r.path == path]

    def times(self, path: str | None = None) -> list[float]:
        return [r.at for r in self.requests if path is None or r.path == path]


class DrainingServer(ProviderServer):
    """Stops only once every connection handler has ended: a `slow` answer may outlive
    the run that gave up on it, and a handler task destroyed mid-sleep leaks its socket."""

    async def _stop(self) -> None:
        current = asyncio.current_task()
        handlers = [t for t in asyncio.all_tasks() if t is not current]
        if handlers:
            _, pending = await asyncio.wait(handlers, timeout=8)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await super()._stop()


@pytest.fixture
def provider() -> Iterator[LoopbackProvider]:
    with DrainingServer(LoopbackProvider()) as running:
        assert isinstance(running, LoopbackProvider)
        yield running


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPLINE_RETRY_BASE_S", "0.01")
    monkeypatch.setenv("HT_TOKEN", SECRET)


@pytest.fixture
def cli(deepline: Callable[..., Any]) -> Callable[..., Any]:
    """The real `deepline` command (conftest's fixture), with fast retries as well."""

    def run(*args: str, **env: str) -> Any:
        return deepline(*args, **{"DEEPLINE_RETRY_BASE_S": "0.01", **env})

    return run


def assert_billed_once(provider: Provider) -> None:
    """The provider never billed one idempotency key twice (and billed something)."""
    assert provider.billed, "the provider billed nothing"
    assert set(provider.billed.values()) == {1}, provider.billed


# --- plays, configs and runs ---------------------------------------------------------------

CALLS_PLAY = """\
import asyncio

from deepline_cli import ToolExecutionError, play


@play("calls")
async def calls(ctx, input):
    async def one(c):
        try:
            r = await ctx.tools.execute(
                c.get("id", "call"), c["tool"], c["input"],
                force=c.get("force", False), timeout_s=c.get("timeout_s"),
            )
        except ToolExecutionError as exc:
            if not input.get("catch"):
                raise
            return {"error": exc.to_dict(), "type": type(exc).__name__}
        return {
            "output": r.output, "execution": r.execution, "key": r.receipt_key,
            "credits": r.credits, "get": {n: r.get(n) for n in c.get("get", [])},
        }

    if input.get("gather"):
        return await asyncio.gather(*(one(c) for c in input["calls"]))
    return [await one(c) for c in input["calls"]]
"""


@dataclass
class Outcome:
    result: RunResult
    events: list[Event]

    @property
    def output(self) -> Any:
        assert self.result.status == "completed", self.result.error
        return self.result.output

    def logs(self) -> list[str]:
        return [e.data["message"] for e in self.events if e.event == "log"]


@dataclass
class Project:
    """A play directory: play.py, deepline.toml (with @URL@ → the provider) and .env."""

    dir: Path
    store: Path
    provider: LoopbackProvider

    def config(self, text: str) -> Path:
        path = self.dir / "deepline.toml"
        path.write_text(textwrap.dedent(text).replace("@URL@", self.provider.url))
        return path

    def dotenv(self, **values: str) -> None:
        (self.dir / ".env").write_text("".join(f"{k}={v}\n" for k, v in values.items()))

    def play(self, source: str = CALLS_PLAY, name: str = "play.py") -> Path:
        path = self.dir / name
        path.write_text(textwrap.dedent(source))
        return path

    def run(self, input: Any, *, play: str = "play.py", store: SQLiteStore | None = None, **options: Any) -> Outcome:
        events: list[Event] = []
        runner = Runner(RunOptions(store=str(self.store), **options), EventBus([events.append]), store=store)
        try:
            result = runner.start(str(self.dir / play), input)
        finally:
            runner.close()
        return Outcome(result, events)

    def resume(self, run_id: str, **options: Any) -> Outcome:
        events: list[Event] = []
        runner = Runner(RunOptions(store=str(self.store), **options), EventBus([events.append]))
        try:
            result = runner.resume(run_id)
        finally:
            runner.close()
        return Outcome(result, events)

    def receipts(self, *, tool: str | None = None, status: str | None = None) -> list[Receipt]:
        store = SQLiteStore(self.store)
        try:
            return store.receipts.query_receipts(ReceiptQuery(tool=tool, status=status))
        finally:
            store.close()


@pytest.fixture
def project(tmp_path: Path, store_path: Path, provider: LoopbackProvider) -> Project:
    proj = Project(tmp_path, store_path, provider)
    proj.play()
    return proj


def calls(*specs: dict[str, Any], catch: bool = False, gather: bool = False) -> dict[str, Any]:
    return {"calls": list(specs), "catch": catch, "gather": gather}


def call(tool: str, input: Any, **extra: Any) -> dict[str, Any]:
    return {"tool": tool, "input": input, **extra}


ECHO_TOOL = """\
[tools."ht.echo"]
method = "POST"
url = "@URL@/v1/echo"
json = { value = "{value}" }
retries = {retries}
"""


def echo_tool(retries: int = 5, extra: str = "") -> str:
    return ECHO_TOOL.replace("{retries}", str(retries)) + extra


# --- templates ------------------------------------------------------------------------------


def test_templates_fill_url_query_headers_and_body_as_the_provider_receives_them(
    project: Project, provider: LoopbackProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HT_REGION", "eu-1")  # a short value: not a secret
    project.dotenv(HT_FROM_DOTENV="dotenv-value-1234", HT_PORT=str(provider.port))
    project.config(
        """\
        [tools."ht.people"]
        method = "POST"
        url = "http://127.0.0.1:${HT_PORT}/v1/{company.slug}/people"
        query = { domain = "{company.domain}", q = "{first} {last}", n = "{count}" }

        [tools."ht.people".headers]
        Authorization = "Bearer ${HT_TOKEN}"
        X-From-Dotenv = "${HT_FROM_DOTENV}"
        X-Region = "${HT_REGION}"
        X-Literal = "{{not-a-field}}"
        X-Count = "{count}"

        [tools."ht.people".json]
        name = "{first}"
        count = "{count}"
        company = "{company}"
        tags = "{tags}"
        missing_ok = "{nothing}"
        greeting = "Hi {first}, you are #{count}"
        literal = "{{first}}"
        nested = { deep = "{company.domain}" }
        list = ["{count}", "x{count}", "{tags.1}"]
        raw = "{raw}"
        """
    )
    person = {
        "first": "Ada",
        "last": "Lovelace",
        "count": 3,
        "company": {"slug": "acme", "domain": "acme.com"},
        "tags": ["a", "b"],
        "nothing": None,
        "raw": "${HT_TOKEN}",  # an input value never expands into a secret
    }
    out = project.run(calls(call("ht.people", person))).output

    (seen,) = provider.requests
    assert seen.method == "POST"
    assert seen.path == "/v1/acme/people"
    assert seen.query == "domain=acme.com&q=Ada+Lovelace&n=3"
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    assert seen.headers["x-from-dotenv"] == "dotenv-value-1234"
    assert seen.headers["x-region"] == "eu-1"
    assert seen.headers["x-literal"] == "{not-a-field}"
    assert seen.headers["x-count"] == "3"
    assert seen.body == {
        "name": "Ada",
        "count": 3,  # exactly "{field}": the raw JSON value, type kept
        "company": {"slug": "acme", "domain": "acme.com"},
        "tags": ["a", "b"],
        "missing_ok": None,
        "greeting": "Hi Ada, you are #3",
        "literal": "{first}",
        "nested": {"deep": "acme.com"},
        "list": [3, "x3", "b"],
        "raw": "${HT_TOKEN}",
    }
    assert out[0]["output"]["echo"] == seen.body


def test_environment_wins_over_dotenv_and_dotenv_is_read_next_to_the_play(
    project: Project, provider: LoopbackProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HT_BOTH", "from-the-environment")
    project.dotenv(HT_BOTH="from-the-dotenv-file", HT_ONLY_FILE="only-in-the-file")
    project.config(
        """\
        [tools."ht.env"]
        url = "@URL@/env"
        headers = { X-Both = "${HT_BOTH}", X-File = "${HT_ONLY_FILE}" }
        """
    )
    project.run(calls(call("ht.env", {})))
    (seen,) = provider.requests
    assert seen.method == "GET"  # no json: GET by default
    assert seen.headers["x-both"] == "from-the-environment"
    assert seen.headers["x-file"] == "only-in-the-file"


def test_extract_declares_what_tool_result_get_returns(project: Project) -> None:
    project.config(
        """\
        [tools."ht.extract"]
        url = "@URL@/extract"
        json = { person = { name = "{name}" }, tags = "{tags}" }

        [tools."ht.extract".extract]
        name = "echo.person.name"
        first_tag = "echo.tags.0"
        last_tag = "$.echo.tags.-1"
        nope = "echo.missing.deep"
        """
    )
    out = project.run(
        calls(
            call(
                "ht.extract",
                {"name": "Grace", "tags": ["x", "y", "z"]},
                get=["name", "first_tag", "last_tag", "nope", "ok"],
            )
        )
    ).output
    assert out[0]["get"] == {"name": "Grace", "first_tag": "x", "last_tag": "z", "nope": None, "ok": True}


@pytest.mark.parametrize("fault", ["html", "empty_json"])
def test_a_200_that_is_not_the_json_a_tool_reads_is_not_kept_as_its_answer(
    project: Project, provider: LoopbackProvider, fault: str
) -> None:
    """A bot check's HTML page (or an empty body said to be JSON), with a 200, answered a
    tool whose `extract` paths read JSON: it was kept as a completed answer, for good (no
    resume or --refresh-failed asked again). It fails as transient, and the next run asks
    again, under the same idempotency key, and keeps the JSON answer."""
    project.config(
        """        [tools."ht.person"]
        url = "@URL@/person/{name}"

        [tools."ht.person".extract]
        email = "path"
        """
    )
    provider.script("/person/ada", [fault])
    first = project.run(calls(call("ht.person", {"name": "ada"}, get=["email"]), catch=True)).output
    assert first[0].get("type") == "ProviderTransientError", first
    said = "where JSON was expected (Just a moment...)" if fault == "html" else "its content type says JSON"
    assert said in first[0]["error"]["message"], first
    (receipt,) = project.receipts(tool="ht.person")
    assert (receipt.status, receipt.retryable) == ("failed", True)
    again = project.run(calls(call("ht.person", {"name": "ada"}, get=["email"]))).output
    assert again[0]["get"] == {"email": "/person/ada"}
    keys = [r.headers.get("idempotency-key") for r in provider.requests]
    assert len(keys) == 2 and len(set(keys)) == 1


@pytest.mark.parametrize("name", ["../../admin/delete", "Ben & Jerry#s", "What? Inc", "AT&T", "100%/50 co"])
def test_a_field_in_the_url_is_one_path_segment_or_one_query_value(
    project: Project, provider: LoopbackProvider, name: str
) -> None:
    """A CSV cell put into a URL as it was could climb out of its segment (`../`), end the
    path (`?`, `#`) or add a query parameter (`&`): move where the tool's credentials go.
    Filled into the path or the query of `url`, a value is percent-encoded as one."""
    project.config(
        """\
        [tools."ht.profile"]
        url = "@URL@/v1/companies/{name}/profile"

        [tools."ht.find"]
        url = "@URL@/v2/find?company={name}&country=us"
        """
    )
    project.run(calls(call("ht.profile", {"name": name}), call("ht.find", {"name": name})))
    profile, find = provider.requests
    prefix, _, rest = profile.path.partition("/v1/companies/")
    segment, _, tail = rest.partition("/")
    assert (prefix, urllib.parse.unquote(segment), tail, profile.query) == ("", name, "profile", "")
    assert find.path == "/v2/find"
    assert urllib.parse.parse_qs(find.query) == {"company": [name], "country": ["us"]}


@pytest.mark.parametrize("key", ["Zm9vYmFy+S3CR3T/base64==", "p@ss/w#rd:0&x?y%z"])
def test_a_secret_in_the_url_reaches_the_provider_whole(
    project: Project, provider: LoopbackProvider, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A generated key (`+ / = # @ & ?`) put into `url` as it was: its `+` read as a space in
    the query, its `#` cut the path (another endpoint, a piece of the key kept in the answer),
    its `@` in the credentials sent the request to a host named by part of the password."""
    monkeypatch.setenv("HT_URL_KEY", key)
    project.config(
        """\
        [tools."ht.query"]
        url = "@URL@/v2/find?api_key=${HT_URL_KEY}&company={name}"

        [tools."ht.path"]
        url = "@URL@/v1/${HT_URL_KEY}/profile"

        [tools."ht.basic"]
        url = "@URL@/v3/basic"
        """
    )
    with_password = provider.url.replace("://", "://svc:${HT_URL_KEY}@") + "/v3/basic"
    toml = project.dir / "deepline.toml"
    toml.write_text(toml.read_text() + f'\n[tools."ht.userinfo"]\nurl = "{with_password}"\n')
    project.run(calls(call("ht.query", {"name": "acme"}), call("ht.path", {}), call("ht.userinfo", {})))
    query, path, basic = provider.requests
    assert urllib.parse.parse_qs(query.query) == {"api_key": [key], "company": ["acme"]}
    assert urllib.parse.unquote(path.path) == f"/v1/{key}/profile"  # a secret path's `/` kept, nothing cut
    scheme, _, encoded = basic.headers["authorization"].partition(" ")
    assert (scheme, basic.path) == ("Basic", "/v3/basic")
    assert base64.b64decode(encoded).decode() == f"svc:{key}"


def test_a_path_segment_that_is_only_dots_or_blank_is_refused_unsent(
    project: Project, provider: LoopbackProvider
) -> None:
    """`..` percent-encoded is still `..` to a server that normalizes paths, and a blank cell
    names the collection: a row whose value for a whole path segment is `.`, `..` or blank
    fails as `validation`, and nothing is sent."""
    project.config('[tools."ht.profile"]\nurl = "@URL@/v1/companies/{name}/profile"\n')
    for name in ("..", ".", "", None):  # a blank cell names the collection: /v1/companies//profile
        out = project.run(calls(call("ht.profile", {"name": name}), catch=True)).output
        assert out[0]["error"]["category"] == "validation", out
        assert f"is {('' if name is None else name)!r}" in out[0]["error"]["message"], out
    assert provider.requests == []


def test_a_template_field_missing_from_the_input_fails_the_run_naming_tool_and_field(
    project: Project, provider: LoopbackProvider
) -> None:
    project.config(
        """\
        [tools."ht.needs_domain"]
        url = "@URL@/d"
        query = { domain = "{company.domain}" }
        """
    )
    outcome = project.run(calls(call("ht.needs_domain", {"company": {"name": "Acme"}})))
    assert outcome.result.status == "failed"
    assert outcome.result.exit_code == 2
    message = outcome.result.error["message"]
    assert "ht.needs_domain" in message and "company.domain" in message
    assert provider.requests == []
    assert project.receipts(status="failed") == []  # a usage error is not the call's failure

    # Inside a map it is not isolated as a row failure: the run fails the same way.
    project.play(MAP_PLAY.replace('"ht.echo", {"value": row["id"]}', '"ht.needs_domain", {"id": row["id"]}'), "m.py")
    in_map = project.run({"n": 3}, play="m.py")
    assert in_map.result.status == "failed"
    assert in_map.result.exit_code == 2
    assert "company.domain" in in_map.result.error["message"]
    assert provider.requests == []


# --- idempotency keys -----------------------------------------------------------------------


def test_idempotency_key_header_is_the_calls_key_and_is_stable_across_runs(
    project: Project, provider: LoopbackProvider
) -> None:
    project.config(echo_tool())
    first = project.run(calls(call("ht.echo", {"value": 1}))).output
    (receipt,) = project.receipts(tool="ht.echo")
    (seen,) = provider.requests
    assert seen.headers["idempotency-key"] == receipt.idempotency_key
    assert receipt.idempotency_key == idempotency_key(first[0]["key"])
    assert first[0]["output"]["key"] == receipt.idempotency_key  # what the provider billed under

    second = project.run(calls(call("ht.echo", {"value": 1}))).output
    assert second[0]["execution"] == "receipt"
    assert len(provider.requests) == 1  # reused: no second call at all
    assert_billed_once(provider)


def test_idempotency_key_is_the_same_across_retries_and_a_resume_after_a_failure(
    project: Project, provider: LoopbackProvider
) -> None:
    project.config(echo_tool(retries=1))
    provider.script("/v1/echo", ["500", "503"])
    failed = project.run(calls(call("ht.echo", {"value": 7})))
    assert failed.result.status == "failed"
    assert failed.result.error["category"] == "upstream"
    resumed = project.resume(failed.result.run_id)
    assert resumed.output[0]["execution"] == "live"
    keys = [r.headers["idempotency-key"] for r in provider.requests]
    assert len(keys) == 3
    assert len(set(keys)) == 1
    assert_billed_once(provider)


def test_force_sends_a_new_idempotency_key_and_is_a_new_paid_call(project: Project, provider: LoopbackProvider) -> None:
    project.config(echo_tool())
    project.run(calls(call("ht.echo", {"value": 1})))
    forced = project.run(calls(call("ht.echo", {"value": 1}, force=True))).output
    assert forced[0]["execution"] == "live"
    first_key, forced_key = (r.headers["idempotency-key"] for r in provider.requests)
    assert first_key != forced_key
    (receipt,) = project.receipts(tool="ht.echo")
    assert receipt.idempotency_key == forced_key
    assert dict(provider.billed) == {first_key: 1, forced_key: 1}


def test_a_forced_call_completed_before_a_failure_is_not_paid_again_on_resume(
    project: Project, provider: LoopbackProvider
) -> None:
    """SPEC: `deepline resume` continues exactly where the run stopped and a call that
    was paid for is never paid for again. A play with `force=True` re-executes on resume;
    the forced call this very run already paid for must not be paid a second time."""
    project.config(
        echo_tool(retries=0)
        + """
        [tools."ht.flaky"]
        url = "@URL@/flaky"
        retries = 0
        """
    )
    provider.script("/flaky", ["500"])
    first = project.run(calls(call("ht.echo", {"value": 1}, force=True), call("ht.flaky", {})))
    assert first.result.status == "failed"
    resumed = project.resume(first.result.run_id)
    assert resumed.result.status == "completed", resumed.result.error
    echo_keys = [r.headers["idempotency-key"] for r in provider.on("/v1/echo")]
    assert len(echo_keys) == 1, f"the forced call was paid again on resume under new keys {echo_keys}"


def test_the_idempotency_header_name_is_configurable(project: Project, provider: LoopbackProvider) -> None:
    project.config(echo_tool(extra='idempotency_header = "X-Dedupe-Token"\n'))
    out = project.run(calls(call("ht.echo", {"value": 1}))).output
    (seen,) = provider.requests
    assert seen.headers["x-dedupe-token"] == idempotency_key(out[0]["key"])
    assert "idempotency-key" not in seen.headers


# --- retries, failure categories, transient vs permanent ------------------------------------


def test_5xx_then_ok_is_retried_with_the_same_key_and_billed_once(project: Project, provider: LoopbackProvider) -> None:
    project.config(echo_tool())
    provider.script("/v1/echo", ["500", "502", "503", "ok"])
    outcome = project.run(calls(call("ht.echo", {"value": 1})))
    assert outcome.output[0]["output"]["echo"] == {"value": 1}
    assert len(provider.requests) == 4
    assert len({r.headers["idempotency-key"] for r in provider.requests}) == 1
    assert_billed_once(provider)
    assert counts(outcome.result.stats["tools"]["ht.echo"]) == {
        "live": 1,
        "reused": 0,
        "failed": 0,
        "credits": 0.0,
        "retries": 3,  # the three 5xx answers before the 200
    }
    (receipt,) = project.receipts(tool="ht.echo")
    assert receipt.status == "completed"


def test_retries_is_honoured_then_the_receipt_fails_as_upstream(project: Project, provider: LoopbackProvider) -> None:
    project.config(echo_tool(retries=2))
    provider.default_fault = "500"
    out = project.run(calls(call("ht.echo", {"value": 1}), catch=True)).output
    assert len(provider.requests) == 3  # N + 1
    error = out[0]["error"]
    assert out[0]["type"] == "ProviderTransientError"
    assert error["category"] == "upstream"
    assert error["status_code"] == 500
    assert error["retryable"] is True
    assert error["message"].endswith("(retried 2x)")
    (receipt,) = project.receipts(tool="ht.echo")
    assert receipt.status == "failed"
    assert receipt.failure_kind == "upstream"
    assert receipt.error["message"].endswith("(retried 2x)")


def test_429_waits_at_least_retry_after_and_slows_the_tool(project: Project, provider: LoopbackProvider) -> None:
    project.config(echo_tool())
    provider.script("/v1/echo", ["429:0.6", "ok"])
    out = project.run(calls(call("ht.echo", {"value": 1}))).output
    assert out[0]["execution"] == "live"
    first, second = provider.times("/v1/echo")
    assert second - first >= 0.6  # measured where it matters: at the provider
    assert_billed_once(provider)


def test_an_http_date_retry_after_is_honoured(project: Project, provider: LoopbackProvider) -> None:
    project.config(echo_tool())
    target = math.floor(time.time()) + 2  # an HTTP date has whole seconds: 1 to 2 s from now
    provider.script("/v1/echo", [f"429:{email.utils.formatdate(target, usegmt=True)}", "ok"])
    out = project.run(calls(call("ht.echo", {"value": 1}))).output
    assert out[0]["execution"] == "live"
    assert len(provider.requests) == 2
    assert provider.wall_times[1] >= target - 0.02, "retried before the date the provider gave"
    assert_billed_once(provider)


@pytest.mark.parametrize("wait", ["86400", "inf"])
def test_a_retry_after_longer_than_a_call_waits_fails_the_call_at_once(
    project: Project, provider: LoopbackProvider, wait: str
) -> None:
    """A provider out of its daily quota (`Retry-After: 86400`) does not hang the run for a
    day: the call fails at once, transient (a resume asks again), saying why."""
    project.config(echo_tool())
    provider.script("/v1/echo", [f"429:{wait}", "ok"])
    started = time.monotonic()
    out = project.run(calls(call("ht.echo", {"value": 1}), catch=True)).output
    assert time.monotonic() - started < 10
    assert len(provider.requests) == 1
    error = out[0]["error"]
    assert (out[0]["type"], error["category"], error["retryable"]) == ("ProviderTransientError", "rate_limit", True)
    assert "asked to wait" in error["message"] and "a later run with --refresh-failed asks again" in error["message"], (
        error
    )


def test_a_429_with_an_unreadable_retry_after_is_still_retried(project: Project, provider: LoopbackProvider) -> None:
    """A provider's odd Retry-After value must not turn a 429 into a permanent failure."""
    project.config(echo_tool())
    provider.script("/v1/echo", ["429:soon", "ok"])
    out = project.run(calls(call("ht.echo", {"value": 1}), catch=True)).output
    assert "error" not in out[0], out[0]
    assert len(provider.requests) == 2
    assert project.receipts(status="failed") == []


BACKOFF_PLAY = """\
import asyncio

from deepline_cli import play


@play("backoff")
async def backoff(ctx, input):
    first = asyncio.create_task(ctx.tools.execute("a", "ht.paced", {"p": "a"}))
    # Wait (on a condition, not a guess) until the 429 put the tool on hold, then call it
    # with another input: that call must wait for the hold as well.
    while "ht.paced" not in ctx._s.effects.governor.paused():
        await asyncio.sleep(0.005)
    second = await ctx.tools.execute("b", "ht.paced", {"p": "b"})
    return [(await first).execution, second.execution]
"""


def test_a_429_holds_back_every_call_of_the_tool_in_the_run(project: Project, provider: LoopbackProvider) -> None:
    project.config(
        """\
        [tools."ht.paced"]
        url = "@URL@/paced/{p}"
        """
    )
    project.play(BACKOFF_PLAY, "backoff.py")
    provider.script("/paced/a", ["429:0.8", "ok"])
    assert project.run({}, play="backoff.py").output == ["live", "live"]
    (rejected, retried), (other,) = provider.times("/paced/a"), provider.times("/paced/b")
    assert retried - rejected >= 0.8
    assert other - rejected >= 0.8 * 0.95, "a call of the same tool went out during the 429 back-off"


FOUR_XX = {
    "400": "validation",
    "401": "authentication",
    "402": "billing",
    "403": "authorization",
    "404": "validation",
    "409": "conflict",
    "422": "validation",
}


def test_other_4xx_are_not_retried_and_fail_for_good(project: Project, provider: LoopbackProvider) -> None:
    project.config('[tools."ht.status"]\nurl = "@URL@/status/{code}"\n')
    for code in FOUR_XX:
        provider.script(f"/status/{code}", [code])
    specs = [call("ht.status", {"code": code}, id=code) for code in FOUR_XX]
    out = project.run(calls(*specs, catch=True)).output
    assert len(provider.requests) == len(FOUR_XX)  # one request each: no retry
    for (code, category), answer in zip(FOUR_XX.items(), out, strict=True):
        assert answer.get("type") == "ToolExecutionError", (code, answer)
        assert answer["error"]["category"] == category, code
        assert answer["error"]["status_code"] == int(code)
        assert answer["error"]["retryable"] is False
    stored = {r.label: (r.status, r.failure_kind) for r in project.receipts(tool="ht.status")}
    assert stored == {code: ("failed", category) for code, category in FOUR_XX.items()}

    # A permanent failure is not retried on the next run: the stored failure comes back...
    again = project.run(calls(*specs, catch=True)).output
    assert len(provider.requests) == len(FOUR_XX)
    assert [a["error"]["category"] for a in again] == list(FOUR_XX.values())
    # ... only with --refresh-failed, and the provider now answers.
    refreshed = project.run(calls(*specs), refresh_failed=True).output
    assert [a["execution"] for a in refreshed] == ["live"] * len(FOUR_XX)
    assert len(provider.requests) == 2 * len(FOUR_XX)
    assert_billed_once(provider)


def test_transient_failures_have_their_category_and_are_retried_on_the_next_run(
    project: Project, provider: LoopbackProvider
) -> None:
    project.config(
        """\
        [tools."ht.fault"]
        url = "@URL@/fault/{name}"
        retries = 0
        timeout_s = 0.3
        """
    )
    faults = {
        "e500": ("500", "upstream"),
        "e503": ("503", "upstream"),
        "e429": ("429:0", "rate_limit"),
        "slow": ("slow:1.5", "network"),
        "malformed": ("malformed", "upstream"),
        "reset": ("reset", "network"),
    }
    for name, (fault, _) in faults.items():
        provider.script(f"/fault/{name}", [fault])
    specs = [call("ht.fault", {"name": name}, id=name) for name in faults]
    out = project.run(calls(*specs, catch=True)).output
    for (name, (_, category)), answer in zip(faults.items(), out, strict=True):
        assert answer.get("type") == "ProviderTransientError", (name, answer)
        assert answer["error"]["category"] == category, name
    failed = {r.label: r for r in project.receipts(tool="ht.fault")}
    assert {label: r.failure_kind for label, r in failed.items()} == {n: c for n, (_, c) in faults.items()}
    assert all(r.status == "failed" and r.retryable for r in failed.values())
    assert "malformed JSON" in failed["malformed"].error["message"]
    assert "timed out" in failed["slow"].error["message"]

    # Transient: the next run (no flag) calls again, and now the provider answers.
    again = project.run(calls(*specs)).output
    assert [a["execution"] for a in again] == ["live"] * len(faults)
    assert [r.status for r in project.receipts(tool="ht.fault")] == ["completed"] * len(faults)
    assert len(provider.requests) == 2 * len(faults)
    assert_billed_once(provider)


def test_a_timeout_or_a_reset_is_retried_within_the_call(project: Project, provider: LoopbackProvider) -> None:
    project.config(
        """\
        [tools."ht.fault"]
        url = "@URL@/fault/{name}"
        retries = 2
        timeout_s = 0.3
        """
    )
    provider.script("/fault/slow", ["slow:1", "ok"])
    provider.script("/fault/reset", ["reset", "ok"])
    out = project.run(calls(call("ht.fault", {"name": "slow"}), call("ht.fault", {"name": "reset"}))).output
    assert [a["execution"] for a in out] == ["live", "live"]
    assert len(provider.on("/fault/slow")) == 2
    assert len(provider.on("/fault/reset")) == 2
    slow_first, slow_retry = provider.times("/fault/slow")
    assert slow_retry - slow_first >= 0.3  # the timeout passed before it was retried
    assert_billed_once(provider)


def test_nothing_is_billed_twice_across_retries_resumes_and_reruns(
    project: Project, provider: LoopbackProvider
) -> None:
    project.config(
        echo_tool(retries=1)
        + """
        [tools."ht.last"]
        url = "@URL@/last"
        retries = 0
        """
    )
    provider.script("/v1/echo", ["500", "ok", "503", "ok"])
    provider.script("/last", ["502"])
    specs = [call("ht.echo", {"value": i}) for i in range(6)] + [call("ht.last", {})]
    first = project.run(calls(*specs))
    assert first.result.status == "failed"
    resumed = project.resume(first.result.run_id)
    assert resumed.result.status == "completed"
    rerun = project.run(calls(*specs))
    assert [a["execution"] for a in rerun.output] == ["receipt"] * 7
    assert len(provider.requests) == 2 + 6 + 2  # 2 retries, 6 echo calls, /last twice
    assert len(provider.billed) == 7
    assert_billed_once(provider)


# --- the circuit breaker ----------------------------------------------------------------------


class UnrecordableStore(SQLiteStore):
    """A real SQLite store whose writes carrying a completed call fail after `ok` of them."""

    def __init__(self, path: Path, ok: int, provider: LoopbackProvider) -> None:
        super().__init__(path)
        self.ok = ok
        self.provider = provider
        self.batches = 0
        self.requests_at_failure: int | None = None

    def apply(self, writes: Writes, now: float) -> Applied:
        if any(s.status == "completed" for s in writes.settlements):
            self.batches += 1
            if self.batches > self.ok:
                if self.requests_at_failure is None:
                    self.requests_at_failure = len(self.provider.requests)
                raise StoreError("disk I/O error (test double)")
        return super().apply(writes, now)


def test_a_completed_call_that_cannot_be_recorded_stops_all_provider_calls(
    project: Project, provider: LoopbackProvider
) -> None:
    project.config(echo_tool())
    store = UnrecordableStore(project.store, ok=3, provider=provider)
    specs = [call("ht.echo", {"value": i}) for i in range(20)]
    outcome = project.run(calls(*specs), store=store)
    assert outcome.result.status == "failed"
    assert outcome.result.error["type"] == "StoreError"
    assert store.requests_at_failure is not None
    assert len(provider.requests) == store.requests_at_failure  # not one call more
    assert len(provider.requests) < 20
    assert project.receipts(status="failed") == []  # no false failures

    # The store works again: a resume pays only for what the provider never billed.
    resumed = project.resume(outcome.result.run_id)
    assert resumed.result.status == "completed", resumed.result.error
    assert len(provider.billed) == 20
    assert_billed_once(provider)


MAP_PLAY = """\
from deepline_cli import play


@play("rows")
async def rows(ctx, input):
    data = [{"id": i} for i in range(input["n"])]
    result = await ctx.map(
        "rows", data, key="id", concurrency=input.get("concurrency", 4),
        columns={"answer": lambda row, rc: rc.tools.execute("echo", "ht.echo", {"value": row["id"]})},
    )
    return {"rows": len(result), "failed": result.failed_count}
"""


def test_the_circuit_breaker_in_a_map_rejects_waiting_rows_without_false_failures(
    project: Project, provider: LoopbackProvider, store_path: Path
) -> None:
    project.config(echo_tool())
    project.play(MAP_PLAY, "rows.py")
    provider.default_fault = "slow:0.02"
    store = UnrecordableStore(project.store, ok=2, provider=provider)
    outcome = project.run({"n": 40, "concurrency": 4}, play="rows.py", store=store)
    assert outcome.result.status == "failed"
    assert outcome.result.error["type"] == "StoreError"
    assert store.requests_at_failure is not None
    # Calls already on the wire may finish; nothing new is dispatched once it tripped.
    assert len(provider.requests) <= store.requests_at_failure + 4
    assert project.receipts(status="failed") == []
    conn = sqlite3.connect(store_path)
    try:
        failed_rows = conn.execute("SELECT COUNT(*) FROM map_rows WHERE outcome = 'failed'").fetchone()[0]
    finally:
        conn.close()
    assert failed_rows == 0

    resumed = project.resume(outcome.result.run_id)
    assert resumed.output == {"rows": 40, "failed": 0}
    assert len(provider.billed) == 40
    assert_billed_once(provider)


# --- budgets ----------------------------------------------------------------------------------

CREDIT_TOOL = echo_tool(extra="credits = 1\n")


def test_max_credits_stops_before_exceeding_and_a_higher_budget_resumes_without_repaying(
    project: Project, provider: LoopbackProvider
) -> None:
    project.config(CREDIT_TOOL)
    specs = [call("ht.echo", {"value": i}) for i in range(5)]
    stopped = project.run(calls(*specs), max_credits=3)
    assert stopped.result.status == "failed"
    assert stopped.result.error["type"] == "BudgetExceededError"
    assert "raise --max-credits" in stopped.result.error["message"]
    assert len(provider.requests) == 3
    assert stopped.result.stats["tools"]["ht.echo"]["credits"] == 3
    assert project.receipts(status="failed") == []

    # Resuming with the same budget makes no further call.
    still = project.resume(stopped.result.run_id)
    assert still.result.status == "failed"
    assert still.result.error["type"] == "BudgetExceededError"
    assert len(provider.requests) == 3

    raised = project.resume(stopped.result.run_id, max_credits=10)
    assert [a["execution"] for a in raised.output] == ["receipt"] * 3 + ["live"] * 2
    assert len(provider.requests) == 5
    assert_billed_once(provider)
    assert raised.result.stats["tools"]["ht.echo"]["credits"] == 5
    assert raised.result.stats["credits"] == 5


def test_max_credits_reserves_credits_of_calls_in_flight(project: Project, provider: LoopbackProvider) -> None:
    project.config(CREDIT_TOOL)
    provider.default_fault = "slow:0.2"
    specs = [call("ht.echo", {"value": i}) for i in range(10)]
    outcome = project.run(calls(*specs, gather=True), max_credits=4)
    assert outcome.result.status == "failed"
    assert outcome.result.error["type"] == "BudgetExceededError"
    assert len(provider.requests) == 4
    assert outcome.result.stats["credits"] <= 4


def test_credits_per_tool_appear_in_the_stats_and_runs_show(project: Project, cli: Callable[..., Any]) -> None:
    project.config(
        CREDIT_TOOL
        + """
        [tools."ht.pricey"]
        url = "@URL@/pricey"
        credits = 2.5
        """
    )
    first = project.run(calls(call("ht.echo", {"value": 1}), call("ht.echo", {"value": 2}), call("ht.pricey", {})))
    assert [a["credits"] for a in first.output] == [1, 1, 2.5]
    assert first.result.stats["tools"]["ht.echo"]["credits"] == 2
    assert first.result.stats["tools"]["ht.pricey"]["credits"] == 2.5
    assert first.result.stats["credits"] == 4.5
    shown = cli("runs", "show", first.result.run_id, "--json")
    assert shown.code == 0, shown.stderr
    stats = json.loads(shown.stdout)["stats"]
    assert (stats["tools"]["ht.echo"]["credits"], stats["tools"]["ht.pricey"]["credits"]) == (2, 2.5)
    human = cli("runs", "show", first.result.run_id)
    assert any("ht.pricey" in line and "credits 2.5" in line for line in human.stdout.splitlines()), human.stdout
    again = project.run(calls(call("ht.echo", {"value": 1})))
    assert counts(again.result.stats["tools"]["ht.echo"]) == {
        "live": 0,
        "reused": 1,
        "failed": 0,
        "credits": 0,
        "retries": 0,
    }


# --- batch tools --------------------------------------------------------------------------------

BATCH_TOOL = """\
[tools."ht.batch"]
method = "POST"
url = "@URL@/people/batch"
json = { domain = "{domain}" }
batch = { max_size = 5, max_wait_ms = 50 }
credits = 1
"""


def test_batch_tools_send_members_together_and_keep_a_receipt_per_member(
    project: Project, provider: LoopbackProvider
) -> None:
    project.config(BATCH_TOOL)
    specs = [call("ht.batch", {"domain": f"d{i}.com"}) for i in range(12)]
    out = project.run(calls(*specs, gather=True)).output
    sent = provider.on("/people/batch")
    assert sorted(len(r.body["items"]) for r in sent) == [2, 5, 5]
    assert sorted(item["domain"] for r in sent for item in r.body["items"]) == sorted(f"d{i}.com" for i in range(12))
    assert [a["output"]["echo"] for a in out] == [{"domain": f"d{i}.com"} for i in range(12)]
    keys = [r.headers["idempotency-key"] for r in sent]
    assert len(set(keys)) == 3
    assert_billed_once(provider)
    members = project.receipts(tool="ht.batch")
    assert len(members) == 12 and {m.status for m in members} == {"completed"}
    aggregates = project.receipts(tool="ht.batch#batch")
    assert sorted(a.idempotency_key for a in aggregates) == sorted(keys)

    # The report counts the 12 calls made, not the 3 requests carrying them as 3 calls more.
    from deepline_cli.ui.report_data import read_report
    from deepline_cli.ui.report_html import render

    (run_id,) = [r.run_id for r in members][:1]
    store = SQLiteStore(project.store)
    try:
        html = render(read_report(store, run_id))
    finally:
        store.close()
    assert "<span>tool calls</span><b>12</b><small>12 answered · 0 failed · 3 batch requests</small>" in html

    # Members are reused one by one: only the new ones go out, in one request.
    more = [call("ht.batch", {"domain": f"d{i}.com"}) for i in range(15)]
    again = project.run(calls(*more, gather=True)).output
    assert [a["execution"] for a in again] == ["receipt"] * 12 + ["live"] * 3
    assert len(provider.on("/people/batch")) == 4
    assert len(provider.on("/people/batch")[-1].body["items"]) == 3
    assert_billed_once(provider)


def test_forced_batch_members_go_out_in_a_new_batch_and_are_billed_as_sent(
    project: Project, provider: LoopbackProvider
) -> None:
    """`force=True` on the members of a batch tool: a new request under a new key, not the
    earlier batch's answer passed off (and charged) as a new paid call."""
    project.config(BATCH_TOOL)
    specs = [call("ht.batch", {"domain": f"d{i}.com"}) for i in range(3)]
    project.run(calls(*specs, gather=True))
    assert len(provider.on("/people/batch")) == 1
    forced = [call("ht.batch", {"domain": f"d{i}.com"}, force=True) for i in range(3)]
    outcome = project.run(calls(*forced, gather=True))
    assert [a["execution"] for a in outcome.output] == ["live"] * 3
    sent = provider.on("/people/batch")
    assert len(sent) == 2, "the forced members were answered from the earlier batch"
    assert sent[0].headers["idempotency-key"] != sent[1].headers["idempotency-key"]
    assert outcome.result.stats["credits"] == 3  # the three members sent, each once
    assert_billed_once(provider)


def test_a_batch_that_failed_transiently_is_sent_again_as_that_batch(
    project: Project, provider: LoopbackProvider
) -> None:
    """A batch timed out (its request may have been processed, and billed); the next run
    asked its members again grouped with other calls, under a new batch's key: the provider
    billed them twice. They go out again as that batch, under its key, the others apart."""
    project.config(BATCH_TOOL.replace("credits = 1", "credits = 1\nretries = 0\ntimeout_s = 0.5"))
    provider.script("/people/batch", ["slow:1"])  # the first batch: answered after the timeout
    first = [call("ht.batch", {"domain": f"d{i}.com"}) for i in range(2)]
    failed = project.run(calls(*first, gather=True, catch=True)).output
    assert all("timed out" in str(a.get("error")) for a in failed), failed
    more = [call("ht.batch", {"domain": f"d{i}.com"}) for i in range(5)]
    answered = project.run(calls(*more, gather=True)).output
    assert [a["output"]["echo"] for a in answered] == [{"domain": f"d{i}.com"} for i in range(5)]
    keys_of: dict[str, set[str]] = {}
    for sent in provider.on("/people/batch"):
        for item in sent.body["items"]:
            keys_of.setdefault(item["domain"], set()).add(sent.headers["idempotency-key"])
    assert all(len(keys) == 1 for keys in keys_of.values()), keys_of  # each item billed once
    assert len(keys_of) == 5


def test_a_batch_sent_again_answers_its_other_members_later(project: Project, provider: LoopbackProvider) -> None:
    """A batch of two timed out; the next run asked one of them (the batch went out again,
    under its key, and answered) and the one after the other: the batch's receipt had lost
    what it sent, and that run failed ("not in the store") for a call already paid."""
    project.config(BATCH_TOOL.replace("credits = 1", "credits = 1\nretries = 0\ntimeout_s = 0.5"))
    provider.script("/people/batch", ["slow:1"])
    both = [call("ht.batch", {"domain": f"d{i}.com"}) for i in range(2)]
    project.run(calls(*both, gather=True, catch=True))
    for i in range(2):
        (answer,) = project.run(calls(call("ht.batch", {"domain": f"d{i}.com"}))).output
        assert answer["output"]["echo"] == {"domain": f"d{i}.com"}, answer
    sent = provider.on("/people/batch")
    assert len(sent) == 2 and len({r.headers["idempotency-key"] for r in sent}) == 1  # the batch, twice
    assert_billed_once(provider)


@pytest.mark.parametrize("first", ["slow:1", "502"])
def test_a_refreshed_batch_whose_first_try_went_unanswered_goes_out_as_that_batch(
    project: Project, provider: LoopbackProvider, first: str
) -> None:
    """A batch's first try timed out (or got a 502) and the provider may have billed it; its
    retry was refused as a key in use (409: not transient). `--refresh-failed` asked its
    members again in a new batch, under a new key: billed twice. They go out as that batch,
    under its key, and a later refresh of the batch's other member takes the same answer."""
    project.config(BATCH_TOOL.replace("credits = 1", "credits = 1\nretries = 1\ntimeout_s = 0.5"))
    provider.script("/people/batch", [first, "409"])
    both = [call("ht.batch", {"domain": f"d{i}.com"}) for i in range(2)]
    failed = project.run(calls(*both, gather=True, catch=True)).output
    assert all(a["error"]["category"] == "conflict" for a in failed), failed
    first_key = provider.on("/people/batch")[0].headers["idempotency-key"]
    one = project.run(calls(call("ht.batch", {"domain": "d0.com"})), refresh_failed=True).output
    assert one[0]["output"]["echo"] == {"domain": "d0.com"}, one
    other = project.run(calls(call("ht.batch", {"domain": "d1.com"})), refresh_failed=True).output
    assert other[0]["output"]["echo"] == {"domain": "d1.com"}, other
    keys = [seen.headers["idempotency-key"] for seen in provider.on("/people/batch")]
    assert set(keys) == {first_key}, keys
    assert_billed_once(provider)


def test_a_call_that_failed_transiently_alone_is_never_sent_again_in_a_batch(
    project: Project, provider: LoopbackProvider
) -> None:
    """A call sent alone timed out (it may have been processed, and billed); `batch` was then
    added to the tool, and the next run sent the call in a batch under the batch's key: billed
    twice. It is refused while the tool batches; without `batch`, it goes out under its key."""
    alone = BATCH_TOOL.replace("batch = { max_size = 5, max_wait_ms = 50 }\n", "").replace(
        "/people/batch", "/people/one"
    )
    project.config(alone.replace("credits = 1", "credits = 1\nretries = 0\ntimeout_s = 0.5"))
    provider.script("/people/one", ["slow:1"])
    (failed,) = project.run(calls(call("ht.batch", {"domain": "d0.com"}), catch=True)).output
    assert "timed out" in str(failed.get("error")), failed
    project.config(BATCH_TOOL)
    refused = project.run(calls(call("ht.batch", {"domain": "d0.com"}), catch=True)).result
    assert refused.error is not None and refused.error["exit_code"] == 2, refused.error
    assert "take its `batch` setting out" in refused.error["message"], refused.error
    assert provider.on("/people/batch") == []  # nothing sent in a batch
    project.config(alone)
    (answered,) = project.run(calls(call("ht.batch", {"domain": "d0.com"}))).output
    assert answered["output"]["echo"] == {"domain": "d0.com"}, answered
    keys = {r.headers["idempotency-key"] for r in provider.on("/people/one")}
    assert len(keys) == 1 and len(provider.on("/people/one")) == 2  # the same call, under its first key


def test_a_batch_tool_whose_request_line_or_headers_take_the_calls_fields_is_refused(
    project: Project, provider: LoopbackProvider, cli: Callable[..., Any]
) -> None:
    """A batch goes out as one request: with `query = { region = "{region}" }` every call of
    a batch went to the first call's region (and `X-Account` the first call's account),
    billed to the wrong account. Refused where it is written; the body may take them."""
    for where in ('query = { region = "{region}" }', 'headers = { "X-Account" = "{account}" }'):
        project.config(BATCH_TOOL + where + "\n")
        refused = cli("check", str(project.play()))
        assert refused.code == 2, refused.stderr
        assert "batch" in refused.stderr and "one request" in refused.stderr, refused.stderr
    assert provider.requests == []


# --- remote tools ---------------------------------------------------------------------------------


def test_remote_tools_post_to_the_execution_api_with_key_and_metadata(
    project: Project, provider: LoopbackProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HT_REMOTE_KEY", "dl-api-key-0123456789")
    project.config(
        """\
        [remote]
        base_url = "@URL@/"
        api_key_env = "HT_REMOTE_KEY"
        """
    )
    outcome = project.run(calls(call("acme.people_search", {"domain": "acme.com"})))
    out = outcome.output
    (seen,) = provider.requests
    assert seen.method == "POST"
    assert seen.path == "/v1/tools/acme.people_search/execute"
    assert seen.headers["authorization"] == "Bearer dl-api-key-0123456789"
    assert seen.headers["x-deepline-idempotency-key"] == idempotency_key(out[0]["key"])
    assert seen.headers["x-request-id"]
    assert seen.body["tool"] == "acme.people_search"
    assert seen.body["payload"] == {"domain": "acme.com"}
    assert seen.body["metadata"] == {
        "parent_run_id": outcome.result.run_id,
        "receipt_key": out[0]["key"],
        "idempotency_key": seen.headers["x-deepline-idempotency-key"],
    }
    assert out[0]["output"]["echo"]["payload"] == {"domain": "acme.com"}
    again = project.run(calls(call("acme.people_search", {"domain": "acme.com"}))).output
    assert again[0]["execution"] == "receipt"
    assert len(provider.requests) == 1
    assert_billed_once(provider)


def test_echoed_credentials_are_redacted_before_they_reach_the_store(
    project: Project, provider: LoopbackProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider echoes the request headers (Authorization included) back: neither
    the HTTP tool's token nor the remote API key may land in the store, WAL included."""
    monkeypatch.setenv("HT_REMOTE_KEY", "dl-api-key-0123456789")
    project.config(
        """\
        [tools."ht.echo"]
        url = "@URL@/echo"
        headers = { Authorization = "Bearer ${HT_TOKEN}" }

        [remote]
        base_url = "@URL@"
        api_key_env = "HT_REMOTE_KEY"
        """
    )
    provider.default_fault = "echo"
    runner = Runner(RunOptions(store=str(project.store)), EventBus())
    try:
        result = runner.start(str(project.dir / "play.py"), calls(call("ht.echo", {}), call("acme.echo", {})))
        assert result.status == "completed", result.error
        assert [a["output"]["authorization"] for a in result.output] == ["Bearer [redacted]"] * 2
        assert provider.requests[0].headers["authorization"] == f"Bearer {SECRET}"
        assert Path(f"{project.store}-wal").exists()  # the store is still open: scan its WAL too
        assert_no_secret(project.store, SECRET.encode())
        assert_no_secret(project.store, b"dl-api-key-0123456789")
    finally:
        runner.close()
    assert_no_secret(project.store, SECRET.encode())
    assert_no_secret(project.store, b"dl-api-key-0123456789")


def test_a_secret_a_provider_echoes_as_an_object_key_is_redacted(project: Project, provider: LoopbackProvider) -> None:
    """A usage endpoint answering `{"<api key>": {"used": 12}}`: only values were redacted,
    so the key was stored, exported and printed in clear."""
    project.config(
        """\
        [tools."ht.echo"]
        url = "@URL@/echo"
        headers = { Authorization = "Bearer ${HT_TOKEN}" }
        """
    )
    provider.default_fault = "echo_keys"
    output = project.run(calls(call("ht.echo", {}))).output
    assert output[0]["output"]["Bearer [redacted]"] == "authorization", output
    assert_no_secret(project.store, SECRET.encode())


# --- credentials changed mid-run --------------------------------------------------------------------


def test_a_401_after_the_credential_changed_rekeys_once_and_records_no_failure(
    project: Project, provider: LoopbackProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HT_TOKEN")
    project.dotenv(HT_TOKEN=SECRET)
    project.config(
        """\
        [tools."ht.auth"]
        url = "@URL@/auth"
        headers = { Authorization = "Bearer ${HT_TOKEN}" }
        """
    )
    # The account is switched while the first request is at the provider, which then
    # rejects the old credential.
    provider.hooks["/auth"] = lambda _: project.dotenv(HT_TOKEN=ROTATED)
    provider.script("/auth", ["401", "ok"])
    outcome = project.run(calls(call("ht.auth", {"q": 1})))
    assert outcome.output[0]["execution"] == "live"
    old, new = provider.on("/auth")
    assert old.headers["authorization"] == f"Bearer {SECRET}"
    assert new.headers["authorization"] == f"Bearer {ROTATED}"
    assert old.headers["idempotency-key"] != new.headers["idempotency-key"]  # another account, another key
    assert any("credentials of tool 'ht.auth' changed" in line for line in outcome.logs())
    assert project.receipts(status="failed") == []
    assert [r.status for r in project.receipts(tool="ht.auth", status="completed")] == ["completed"]
    assert outcome.result.stats["tools"]["ht.auth"]["failed"] == 0


def test_credentials_changing_again_after_the_rekey_is_not_retried_forever(
    project: Project, provider: LoopbackProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HT_TOKEN")
    project.dotenv(HT_TOKEN=SECRET)
    project.config('[tools."ht.auth"]\nurl = "@URL@/auth"\nheaders = { Authorization = "Bearer ${HT_TOKEN}" }\n')
    tokens = iter([ROTATED, ROTATED + "-again", ROTATED + "-third", ROTATED + "-fourth"])
    provider.hooks["/auth"] = lambda _: project.dotenv(HT_TOKEN=next(tokens))
    provider.default_fault = "401"
    outcome = project.run(calls(call("ht.auth", {"q": 1})))
    assert outcome.result.status == "failed"
    assert len(provider.on("/auth")) == 2  # the call, and one re-keyed call


def test_a_401_with_unchanged_credentials_fails_as_authentication(project: Project, provider: LoopbackProvider) -> None:
    project.config('[tools."ht.auth"]\nurl = "@URL@/auth"\nheaders = { Authorization = "Bearer ${HT_TOKEN}" }\n')
    provider.script("/auth", ["401"])
    out = project.run(calls(call("ht.auth", {}), catch=True)).output
    assert out[0]["error"]["category"] == "authentication"
    assert len(provider.requests) == 1
    (receipt,) = project.receipts(tool="ht.auth")
    assert receipt.failure_kind == "authentication"


def test_switching_accounts_never_reuses_another_accounts_results(
    project: Project, provider: LoopbackProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    project.config('[tools."ht.auth"]\nurl = "@URL@/auth"\nheaders = { Authorization = "Bearer ${HT_TOKEN}" }\n')
    project.run(calls(call("ht.auth", {"q": 1})))
    monkeypatch.setenv("HT_TOKEN", ROTATED)
    out = project.run(calls(call("ht.auth", {"q": 1}))).output
    assert out[0]["execution"] == "live"
    assert len(provider.requests) == 2
    monkeypatch.setenv("HT_TOKEN", SECRET)
    back = project.run(calls(call("ht.auth", {"q": 1}))).output
    assert back[0]["execution"] == "receipt"


# --- the governor ---------------------------------------------------------------------------------


def test_tool_and_run_concurrency_bound_calls_in_flight_at_the_provider(
    project: Project, provider: LoopbackProvider
) -> None:
    project.config(
        """\
        [tools."ht.two"]
        url = "@URL@/two/{i}"
        concurrency = 2

        [tools."ht.free"]
        url = "@URL@/free/{i}"
        """
    )
    provider.default_fault = "slow:0.1"
    project.run(calls(*[call("ht.two", {"i": i}) for i in range(8)], gather=True))
    assert len(provider.requests) == 8
    assert provider.max_inflight == 2

    provider.max_inflight = 0
    project.run(calls(*[call("ht.free", {"i": i}) for i in range(9)], gather=True), concurrency=3)
    assert len(provider.requests) == 17
    assert provider.max_inflight == 3


@pytest.mark.process
def test_rate_limit_is_accurate_at_the_provider(
    project: Project, provider: LoopbackProvider, cli: Callable[..., Any]
) -> None:
    """40 calls under "20/s", run the way a user runs them (a fresh `deepline` process),
    measured at the provider: the 40 arrivals spread over at least 1.75 s (1.95 s paced
    exactly), and the live view says the tool is paced. A busy machine can only spread
    them more; the busiest one-second window is measured by `benchmarks/rate_limit.py`."""
    project.config(
        """\
        [tools."ht.rate"]
        url = "@URL@/rate/{i}"
        rate_limit = "20/s"
        """
    )
    payload = json.dumps(calls(*[call("ht.rate", {"i": i}) for i in range(40)], gather=True))
    result = cli("run", "play.py", "--json", "--input", payload)
    assert result.code == 0, result.stderr
    times = sorted(provider.times())
    assert len(times) == 40
    offsets = [round(t - times[0], 3) for t in times]
    assert times[-1] - times[0] >= 1.75, f"40 requests within {offsets[-1]} s under a 20/s limit"
    paced = [e["paced"] for e in result.json_lines() if e["event"] == "run.progress"]
    assert any(p.get("ht.rate") == 20.0 for p in paced), "the live view never showed the tool being paced"


def _busiest_second(times: list[float]) -> int:
    return max(sum(1 for b in times if a <= b < a + 1.0) for a in times)


@pytest.mark.process
def test_retries_keep_to_the_rate_limit_and_a_429_holds_the_calls_waiting_for_their_pace(
    project: Project, provider: LoopbackProvider, cli: Callable[..., Any]
) -> None:
    """A "5/s" tool whose first five answers are 500s: its retries go out on the tool's pace
    too (they went out at once: 10 requests in a second). Then a 429 asking for 2 s: the
    calls already waiting for their pace wait it out as well (nine went out during it)."""
    project.config(
        """\
        [tools."ht.paced"]
        method = "POST"
        url = "@URL@/paced"
        json = { i = "{i}" }
        rate_limit = "5/s"
        """
    )
    payload = json.dumps(calls(*[call("ht.paced", {"i": i}) for i in range(10)], gather=True))
    provider.script("/paced", ["500"] * 5)
    assert cli("run", "play.py", "--input", payload, "--quiet").code == 0
    times = sorted(provider.times("/paced"))
    assert len(times) == 15 and _busiest_second(times) <= 6, [round(t - times[0], 2) for t in times]

    provider.requests.clear()
    provider.script("/paced", ["429:2"])
    payload = json.dumps(calls(*[call("ht.paced", {"i": i}) for i in range(10, 16)], gather=True))
    assert cli("run", "play.py", "--input", payload, "--quiet").code == 0
    first, *rest = sorted(provider.times("/paced"))
    during = [round(t - first, 2) for t in rest if t - first < 1.9]
    assert during == [], f"requests during the 429's 2 s pause: {during}"


# --- ctx.fetch ------------------------------------------------------------------------------------

FETCH_PLAY = """\
from deepline_cli import play


@play("fetches")
async def fetches(ctx, input):
    url = input["url"]
    auth = {"Authorization": "Bearer " + ctx.secrets.get("HT_TOKEN")}
    echo = await ctx.fetch("echo", url + "/f/echo", headers=auth)
    missing = await ctx.fetch("missing", url + "/f/missing")
    flaky = await ctx.fetch("flaky", url + "/f/flaky", method="POST", json={"a": 1})
    if ctx.run.attempt == 1:
        raise RuntimeError("the play fails after its fetches on the first attempt")
    return {
        "echo": [echo.ok, echo.status, echo.json],
        "missing": [missing.ok, missing.status],
        "flaky": [flaky.ok, flaky.status, flaky.json["echo"]],
    }
"""


def test_ctx_fetch_is_durable_retries_5xx_and_redacts_secrets(project: Project, provider: LoopbackProvider) -> None:
    project.play(FETCH_PLAY, "fetch.py")
    provider.script("/f/echo", ["echo"])
    provider.script("/f/missing", ["404"])
    provider.script("/f/flaky", ["500", "ok"])
    first = project.run({"url": provider.url}, play="fetch.py")
    assert first.result.status == "failed"
    assert len(provider.requests) == 4
    # Fetches are durable per run: the resumed body replays them, no new requests.
    out = project.resume(first.result.run_id).output
    assert len(provider.requests) == 4
    assert provider.on("/f/echo")[0].headers["authorization"] == f"Bearer {SECRET}"
    assert out["echo"][:2] == [True, 200]
    assert out["echo"][2]["authorization"] == "Bearer [redacted]"
    assert out["missing"] == [False, 404]
    assert out["flaky"] == [True, 200, {"a": 1}]
    assert len(provider.on("/f/flaky")) == 2
    # SPEC §3: every provider call carries an idempotency key derived from its receipt, the
    # same on its retry (a POST to a paid API retried after a 500 was sent with none).
    keys = [seen.headers.get("idempotency-key") for seen in provider.on("/f/flaky")]
    assert keys[0] and keys[0].startswith("dl-") and keys == [keys[0]] * 2, keys
    assert_no_secret(project.store, SECRET.encode())


FETCH_RETRIES_PLAY = """\
from deepline_cli import play


@play("fetchretries")
async def fetchretries(ctx, input):
    page = await ctx.fetch("page", input["url"] + "/f/busy")
    return [page.ok, page.status]
"""


def test_ctx_fetch_retries_as_often_as_a_tool_by_default(project: Project, provider: LoopbackProvider) -> None:
    """A tool is retried up to 5 times (SPEC §3); `ctx.fetch` gave up after 3."""
    project.play(FETCH_RETRIES_PLAY, "retries.py")
    provider.script("/f/busy", ["500", "500", "500", "500", "ok"])
    assert project.run({"url": provider.url}, play="retries.py").output == [True, 200]
    assert len(provider.on("/f/busy")) == 5


FETCH_4XX_PLAY = """\
from deepline_cli import play


@play("fetch4xx")
async def fetch4xx(ctx, input):
    missing = await ctx.fetch("missing", input["url"] + "/f/missing")
    return {"ok": missing.ok, "status": missing.status, "text": missing.text, "json": missing.json}
"""


def test_ctx_fetch_of_a_4xx_keeps_the_providers_body(project: Project, provider: LoopbackProvider) -> None:
    """`FetchResult.text`/`.json` of a 404 are the provider's answer, not an error message."""
    project.play(FETCH_4XX_PLAY, "fetch4xx.py")
    provider.script("/f/missing", ["404"])
    out = project.run({"url": provider.url}, play="fetch4xx.py").output
    assert out == {"ok": False, "status": 404, "text": '{"error": "fault"}', "json": {"error": "fault"}}


# --- secrets never stored or printed ----------------------------------------------------------------


def assert_no_secret(store_path: Path, secret: bytes, *texts: str) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        path = Path(str(store_path) + suffix)
        if path.exists():
            assert secret not in path.read_bytes(), f"the secret is stored in {path.name}"
    for text in texts:
        assert secret.decode() not in text


SECRET_PLAY = """\
from deepline_cli import play


@play("leaky")
async def leaky(ctx, input):
    rows = [{"id": i} for i in range(input["n"])]
    async def answer(row, rc):
        r = await rc.tools.execute("echo", "ht.echo", {"id": row["id"]})
        rc.log(f"row {row['id']} got {r.output}")
        return r
    data = await ctx.map("rows", rows, key="id", columns={
        "answer": answer,
        "query": lambda row, rc: rc.tools.execute("q", "ht.query", {"id": row["id"]}),
    })
    fetched = await ctx.fetch("f", input["url"] + "/echo", headers={"X-Key": ctx.secrets.get("HT_TOKEN")})
    ctx.log("secret is " + ctx.secrets.get("HT_TOKEN"))
    # Ids a play builds with a secret in them (a habit: one step per API key).
    token = ctx.secrets.get("HT_TOKEN")
    await ctx.step(f"step-{token}", lambda: 1)
    await ctx.fetch(f"fetch-{token}", input["url"] + "/echo")
    if ctx.run.attempt == 1 and input.get("fail_once"):
        raise RuntimeError("after the steps")  # a resume reaches the same ids: the same, redacted
    return {"rows": len(data), "fetched": fetched.text, "secret": ctx.secrets.get("HT_TOKEN")}
"""


def test_a_fetch_whose_json_is_not_json_is_refused_before_it_is_sent(
    project: Project, provider: LoopbackProvider, cli: Callable[..., Any]
) -> None:
    """`ctx.fetch(json={"o": Lead()})` sent `"<Lead object at 0x7f…>"` and completed; a tool's
    input with the same value is refused. So is the fetch's: exit 2, nothing sent."""
    project.play(
        """\
from deepline_cli import play

class Lead:
    pass

@play("poster")
async def poster(ctx, input):
    return (await ctx.fetch("post", input["url"] + "/echo", method="POST", json={"o": Lead()})).status
""",
        "poster.py",
    )
    result = cli("run", "poster.py", "--input", json.dumps({"url": provider.url}))
    assert result.code == 2, result.stderr
    assert "The json of ctx.fetch 'post' cannot be sent: a value of type Lead is not JSON" in result.stderr
    assert provider.on("/echo") == []


def test_reading_json_of_a_fetch_that_is_not_json_says_so_at_the_plays_line(
    project: Project, provider: LoopbackProvider, cli: Callable[..., Any]
) -> None:
    """`.json` of a text answer failed the run with orjson's words, placed in deepline's own
    _json.py: every deepline module outside runtime/ was taken for the play's code."""
    project.play(
        """\
from deepline_cli import play

@play("reader")
async def reader(ctx, input):
    fetched = await ctx.fetch("page", input["url"] + "/page")
    return fetched.json
""",
        "reader.py",
    )
    provider.script("/page", ["html"])
    result = cli("run", "reader.py", "--input", json.dumps({"url": provider.url}))
    assert result.code == 1
    assert "the fetched answer is not JSON (200, text/html)" in result.stderr, result.stderr
    assert "(reader.py line 6)" in result.stderr and "_json.py" not in result.stderr, result.stderr


def test_deeplines_own_modules_are_never_the_plays_code() -> None:
    import deepline_cli
    from deepline_cli.runtime.map import failures

    package = Path(deepline_cli.__file__).parent
    for module in ("_json.py", "cli/run.py", "store/sqlite.py", "runtime/map/engine.py"):
        assert not failures.is_play_file(str(package / module)), module


def test_secrets_are_never_stored_logged_exported_or_printed(
    project: Project, provider: LoopbackProvider, cli: Callable[..., Any], tmp_path: Path, store_path: Path
) -> None:
    project.dotenv(HT_DOTENV_TOKEN=SECRET)
    project.config(
        """\
        [tools."ht.echo"]
        url = "@URL@/echo"
        headers = { Authorization = "Bearer ${HT_DOTENV_TOKEN}" }

        [tools."ht.query"]
        url = "@URL@/query"
        query = { api_key = "${HT_DOTENV_TOKEN}", id = "{id}" }
        """
    )
    project.play(SECRET_PLAY.replace('"HT_TOKEN"', '"HT_DOTENV_TOKEN"'), "leaky.py")
    provider.script("/echo", ["echo"] * 50)

    as_json = cli("run", "leaky.py", "--json", "--input", json.dumps({"n": 3, "url": provider.url}))
    assert as_json.code == 0, as_json.stderr
    finished = as_json.json_lines()[-1]
    run_id = finished["run_id"]
    payload = json.dumps({"n": 4, "url": provider.url, "fail_once": True})
    failed = cli("run", "leaky.py", "--input", payload, "--run-id", "leaky-h")
    assert failed.code == 1, failed.stderr
    human = cli("resume", "leaky-h")
    assert human.code == 0, human.stderr  # the journal's ids, kept redacted, matched again
    # The secret did reach the provider, in a header and in a query string.
    assert provider.on("/echo")[0].headers["authorization"] == f"Bearer {SECRET}"
    assert SECRET in provider.on("/query")[0].query
    assert "[redacted]" in as_json.stdout

    outputs = [as_json.stdout, as_json.stderr, failed.stdout, failed.stderr, human.stdout, human.stderr]
    for args in (
        ("runs", "logs", run_id),
        ("runs", "show", run_id, "--json"),
        ("runs", "show", run_id),
        ("runs", "list", "--json"),
        ("receipts", "inspect", "--json"),
        ("receipts", "inspect"),
        ("export", run_id, "--format", "jsonl"),
        ("export", run_id, "--format", "csv"),
    ):
        shown = cli(*args)
        assert shown.code == 0, (args, shown.stderr)
        outputs += [shown.stdout, shown.stderr]
    assert any("[redacted]" in text for text in outputs[6:])
    assert_no_secret(store_path, SECRET.encode(), *outputs)


def test_a_secret_a_provider_quotes_far_into_an_error_is_redacted_whole(
    project: Project, provider: LoopbackProvider, cli: Callable[..., Any], store_path: Path
) -> None:
    """An error body is kept to its first 200 characters: cut before it was redacted, a key
    quoted across the cut kept its first part in clear (in the store, logs and export)."""
    project.dotenv(HT_DOTENV_TOKEN=SECRET)
    project.config(
        """\
        [tools."ht.quote"]
        url = "@URL@/quote401"
        query = { domain = "{domain}", api_key = "${HT_DOTENV_TOKEN}" }
        """
    )
    project.play(
        """\
        from deepline_cli import play

        @play("quoted")
        async def quoted(ctx, input):
            rows = await ctx.map("rows", [{"domain": "acme.com"}], key="domain", columns={
                "a": lambda row, rc: rc.tools.execute("q", "ht.quote", {"domain": row["domain"]}),
            })
            return {"failed": rows.failed_count}
        """,
        "quoted.py",
    )
    run = cli("run", "quoted.py", "--run-id", "Q")
    assert run.code == 0, run.stderr
    assert SECRET in provider.requests[0].query
    outputs = [run.stdout, run.stderr]
    for args in (("runs", "logs", "Q"), ("export", "Q"), ("receipts", "inspect", "--full")):
        outputs.append(cli(*args).stdout)
    for piece in (SECRET[:10], SECRET[5:15], SECRET[-10:]):
        assert_no_secret(store_path, piece.encode(), *outputs)


SECRET_IN_A_CELL_PLAY = """\
import os
from pathlib import Path

from deepline_cli import play, tool


@tool("ht.fetch_signed", credits=1)
def fetch_signed(input):
    with open(Path(__file__).with_name("fetched.log"), "a") as log:
        log.write("signed\\n" if input["url"].endswith(os.environ["HT_TOKEN"]) else "redacted\\n")
    return {"bytes": 10}


@play("static-maps")
async def static_maps(ctx, input):
    key = ctx.secrets.get("HT_TOKEN")
    rows = await ctx.map("offices", [{"city": "Paris"}], key="city", columns={
        "map_url": lambda row: f"https://maps.example/staticmap?center={row['city']}&key={key}",
        "with_key": lambda row: {"city": row["city"], "auth": key},
        "image": lambda row, rc: rc.tools.execute("img", "ht.fetch_signed", {"url": row["map_url"]}),
    })
    return {"rows": len(rows)}
"""


def test_a_secret_a_column_puts_in_its_value_is_not_stored_or_exported(
    project: Project, cli: Callable[..., Any], store_path: Path
) -> None:
    """A cell built with a secret (a signed link, a header kept for later) was written to the
    sheet and the export in clear, while a step or a tool's answer was redacted."""
    project.play(SECRET_IN_A_CELL_PLAY, "cells.py")
    outcome = project.run({}, play="cells.py")
    assert outcome.output == {"rows": 1}
    exported = cli("export", outcome.result.run_id, "--format", "jsonl")
    assert exported.code == 0, exported.stderr
    assert "key=[redacted]" in exported.stdout
    assert_no_secret(store_path, SECRET.encode(), exported.stdout)
    # The column after it got the real link (only what is stored is redacted); a later run
    # computes the redacted cell again, and its tool call is the same one, reused.
    again = project.run({}, play="cells.py")
    assert again.output == {"rows": 1} and again.result.stats["credits"] == 0
    assert (project.dir / "fetched.log").read_text().split() == ["signed"]


LEAKY_TOOL_PLAY = """\
from deepline_cli import play, tool


@tool("ht.leaky_local")
def leaky(input):
    raise RuntimeError("the provider rejected key " + input["key"])


@play("leaky_errors")
async def leaky_errors(ctx, input):
    key = ctx.secrets.get("HT_TOKEN")
    rows = await ctx.map("rows", [{"id": 1}], key="id", columns={
        "a": lambda row, rc: rc.tools.execute("leak", "ht.leaky_local", {"key": key}),
    })
    return {"failed": rows.failed_count}
"""


def test_a_failed_calls_error_never_stores_a_secret_in_clear(
    project: Project, cli: Callable[..., Any], store_path: Path
) -> None:
    """ctx.secrets values are redacted everywhere they would be stored or printed,
    including the error of a failed receipt and a failed row's `_error`."""
    project.play(LEAKY_TOOL_PLAY, "leaky_errors.py")
    outcome = project.run({}, play="leaky_errors.py")
    assert outcome.output == {"failed": 1}
    (receipt,) = project.receipts(tool="ht.leaky_local")
    assert "[redacted]" in receipt.error["message"]
    exported = cli("export", outcome.result.run_id, "--format", "jsonl")
    assert exported.code == 0, exported.stderr
    assert_no_secret(store_path, SECRET.encode(), exported.stdout)


# --- the command line: configuration errors, check, tools list ---------------------------------------

BAD_CONFIGS = {
    "invalid-toml": ('[tools."ht.x"]\nurl = "@URL@/x\n', ["deepline.toml", "TOML"]),
    "unknown-key": ('[tools."ht.x"]\nurl = "@URL@/x"\nretry = 3\n', ["ht.x", "'retry'"]),
    "unknown-table": ('[tool."ht.x"]\nurl = "@URL@/x"\n', ["deepline.toml", "'tool'"]),
    "bad-rate-limit": ('[tools."ht.x"]\nurl = "@URL@/x"\nrate_limit = "fast"\n', ["ht.x", "rate_limit"]),
    "zero-rate-limit": ('[tools."ht.x"]\nurl = "@URL@/x"\nrate_limit = "0/s"\n', ["ht.x", "rate_limit"]),
    "wrong-type": ('[tools."ht.x"]\nurl = "@URL@/x"\nretries = "three"\n', ["ht.x", "'retries'"]),
    "bad-method": ('[tools."ht.x"]\nurl = "@URL@/x"\nmethod = "FETCH"\n', ["ht.x", "FETCH"]),
    "bad-batch": ('[tools."ht.x"]\nurl = "@URL@/x"\nbatch = { size = 3 }\n', ["ht.x", "'size'"]),
    "remote-no-url": ('[remote]\napi_key_env = "X"\n', ["[remote]", "base_url"]),
    "zero-timeout": ('[tools."ht.x"]\nurl = "@URL@/x"\ntimeout_s = 0\n', ["ht.x", "timeout_s"]),
    "negative-credits": ('[tools."ht.x"]\nurl = "@URL@/x"\ncredits = -1\n', ["ht.x", "credits"]),
    "nan-credits": ('[tools."ht.x"]\nurl = "@URL@/x"\ncredits = nan\n', ["ht.x", "credits"]),
    "inf-credits": ('[tools."ht.x"]\nurl = "@URL@/x"\ncredits = inf\n', ["ht.x", "credits"]),
    "inf-timeout": ('[tools."ht.x"]\nurl = "@URL@/x"\ntimeout_s = inf\n', ["ht.x", "timeout_s"]),
    "tools-not-a-table": ('tools = "ht.x"\n', ["deepline.toml", "tools"]),
    "bad-header-name": ('[tools."ht.x"]\nurl = "@URL@/x"\nheaders = { "X Api Key" = "1" }\n', ["ht.x", "'X Api Key'"]),
    "bad-idempotency-header": (
        '[tools."ht.x"]\nurl = "@URL@/x"\nidempotency_header = "Idempotency Key"\n',
        ["ht.x", "'Idempotency Key'"],
    ),
    "zero-batch": ('[tools."ht.x"]\nurl = "@URL@/x"\nbatch = { max_size = 0 }\n', ["ht.x", "max_size"]),
    "remote-no-scheme": ('[remote]\nbase_url = "127.0.0.1:9"\n', ["[remote]", "base_url"]),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_an_invalid_config_is_exit_2_with_one_sentence_naming_tool_and_field(
    project: Project, provider: LoopbackProvider, cli: Callable[..., Any], case: str
) -> None:
    text, named = BAD_CONFIGS[case]
    project.config(text)
    result = cli("run", "play.py", "--input", json.dumps(calls(call("ht.x", {}))))
    assert result.code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    for word in named:
        assert word in lines[0], (word, lines[0])
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert provider.requests == []
    checked = cli("check", "play.py")
    assert checked.code == 2 and checked.stderr.strip().splitlines() == lines


@pytest.mark.parametrize(
    ("config", "input", "named"),
    [
        (
            '[tools."ht.x"]\nurl = "@URL@/x"\nheaders = { Authorization = "Bearer ${HT_NOT_SET_ANYWHERE}" }\n',
            {},
            ["ht.x", "HT_NOT_SET_ANYWHERE"],
        ),
        ('[tools."ht.x"]\nurl = "@URL@/x"\njson = { d = "{domain}" }\n', {"name": "n"}, ["ht.x", "'domain'"]),
    ],
    ids=["missing-secret", "missing-input-field"],
)
def test_a_missing_secret_or_input_field_is_exit_2_naming_tool_and_field(
    project: Project,
    provider: LoopbackProvider,
    cli: Callable[..., Any],
    config: str,
    input: dict[str, Any],
    named: list[str],
) -> None:
    project.config(config)
    result = cli("run", "play.py", "--quiet", "--input", json.dumps(calls(call("ht.x", input))))
    assert result.code == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert len([x for x in result.stderr.splitlines() if all(word in x for word in named)]) == 1, result.stderr
    assert provider.requests == []
    as_json = cli("run", "play.py", "--json", "--input", json.dumps(calls(call("ht.x", input))))
    assert as_json.code == 2
    message = as_json.json_lines()[-1]["error"]["message"]
    assert "\n" not in message and all(word in message for word in named)


TWO_TOOLS = """\
[tools."ht.people"]
method = "POST"
url = "@URL@/people"
headers = { Authorization = "Bearer ${HT_CHECK_TOKEN}" }
json = { domain = "{company.domain}" }
credits = 2
rate_limit = "5/s"
concurrency = 3

[tools."ht.plain"]
url = "@URL@/plain/{id}"

[remote]
base_url = "@URL@"
api_key_env = "HT_CHECK_REMOTE"
"""


def test_check_loads_play_and_config_and_makes_no_call(
    project: Project, provider: LoopbackProvider, cli: Callable[..., Any]
) -> None:
    project.config(TWO_TOOLS)
    project.dotenv(HT_CHECK_TOKEN="check-token-123456", HT_CHECK_REMOTE="remote-key-123456")
    ok = cli("check", "play.py")
    assert ok.code == 0, ok.stderr
    assert "ht.people" in ok.stdout and "ht.plain" in ok.stdout and "calls" in ok.stdout
    assert "ok:" in ok.stdout
    assert "check-token-123456" not in ok.stdout + ok.stderr
    report = cli("check", "play.py", "--json")
    assert report.code == 0, report.stderr
    data = json.loads(report.stdout)
    assert [p["name"] for p in data["plays"]] == ["calls"]
    assert data["missing_secrets"] == []
    assert {t["id"] for t in data["tools"]} >= {"ht.people", "ht.plain", "*"}
    assert provider.requests == []

    project.dotenv(HT_CHECK_REMOTE="remote-key-123456")  # the tool's token is gone
    missing = cli("check", "play.py")
    assert missing.code == 2
    (line,) = missing.stderr.strip().splitlines()
    assert "ht.people" in line and "HT_CHECK_TOKEN" in line
    assert provider.requests == []


def test_tools_list_json_describes_every_tool(
    project: Project, provider: LoopbackProvider, cli: Callable[..., Any]
) -> None:
    project.config(TWO_TOOLS)
    listed = cli("tools", "list", "--json")
    assert listed.code == 0, listed.stderr
    rows = {row["id"]: row for row in listed.json_lines()}
    assert rows["ht.people"] == {
        "id": "ht.people",
        "kind": "http",
        "credits": 2.0,
        "rate_limit": "5/s",
        "concurrency": 3,
        "target": f"POST {provider.url}/people",
        "secrets": ["HT_CHECK_TOKEN"],
        "fields": ["company.domain"],
    }
    assert rows["ht.plain"]["kind"] == "http" and rows["ht.plain"]["fields"] == ["id"]
    assert rows["*"]["kind"] == "remote" and rows["*"]["secrets"] == ["HT_CHECK_REMOTE"]
    human = cli("tools", "list")
    assert human.code == 0 and "ht.people" in human.stdout
    assert provider.requests == []


def test_a_429_pause_and_the_rate_limit_wait_through_the_calls_pause() -> None:
    """The governor's waits (a tool paused after a 429, a rate limit's next slot) go through
    the pause it is given: a run's pause raises when the run stops dispatching, so an
    interrupt never waits for a call that is not out."""
    from deepline_cli.runtime.providers.governor import Governor

    asked: list[float] = []

    async def stopped(seconds: float) -> None:
        asked.append(seconds)
        raise KeyboardInterrupt  # the run stopped: the call gives its slot back

    async def scenario() -> None:
        governor = Governor()
        governor.configure_tool("paced", concurrency=1, rate_limit="1/min")
        async with governor.slot("paced", stopped):  # the first slot is now: no wait
            pass
        with pytest.raises(KeyboardInterrupt):
            async with governor.slot("paced", stopped):  # the next is a minute away
                raise AssertionError("sent while it should wait")
        governor.back_off("held", 30)
        with pytest.raises(KeyboardInterrupt):
            async with governor.slot("held", stopped):
                raise AssertionError("sent while it should wait")

    asyncio.run(scenario())
    assert len(asked) == 2 and 55 < asked[0] <= 60 and 25 < asked[1] <= 30


def test_a_rows_value_in_the_urls_credentials_cannot_move_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """`https://{user}:${PASS}@api.example.com/` with a user `evil.com/x?`: put in as it was,
    the request went to evil.com, the password in its query."""
    from deepline_cli.runtime.providers.secrets import Secrets
    from deepline_cli.runtime.providers.templates import render_url

    monkeypatch.setenv("HT_CRED_PASS", "pa/ss#word")
    url = render_url("https://{user}:${HT_CRED_PASS}@api.example.com/v1", {"user": "evil.com/x?"}, Secrets(), tool="t")
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname == "api.example.com" and parts.path == "/v1"
    assert (urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password or "")) == (
        "evil.com/x?", "pa/ss#word"
    )  # fmt: skip


def test_a_refreshed_failure_whose_first_try_went_unanswered_keeps_its_key(
    project: Project, provider: LoopbackProvider
) -> None:
    """The first try timed out (the provider processed and billed it), the retry under the
    same key was refused as a key in use (409: not transient), and `--refresh-failed` asked
    under a fresh key: billed twice. A failed call one of whose tries went unanswered is
    asked again under its key (a provider that honours it gives back what it billed)."""
    project.config(
        """\
        [tools."ht.email"]
        url = "@URL@/v1/email"
        timeout_s = 0.3
        retries = 1
        """
    )
    provider.script("/v1/email", ["slow:0.6", "409"])
    failed = project.run(calls(call("ht.email", {"d": 1}), catch=True)).output
    assert failed[0]["error"]["category"] == "conflict", failed
    first = provider.on("/v1/email")[0].headers["idempotency-key"]
    wait_until(lambda: provider.billed.get(first) == 1, what="the timed-out try billed", timeout=5)
    refreshed = project.run(calls(call("ht.email", {"d": 1})), refresh_failed=True).output
    keys = [seen.headers["idempotency-key"] for seen in provider.on("/v1/email")]
    assert keys == [first, first, first], keys
    assert refreshed[0]["execution"] == "live"
    assert_billed_once(provider)


@pytest.mark.parametrize("first", ["502", "504", "500"])
def test_a_refreshed_failure_whose_first_try_got_a_server_error_keeps_its_key(
    project: Project, provider: LoopbackProvider, first: str
) -> None:
    """A 5xx may come after the provider processed the call (a gateway gave up waiting on
    it). Its retry refused as a key in use (409), `--refresh-failed` asked under a fresh
    key: a provider that had billed the first try billed the call twice. Kept, as after a
    timeout."""
    project.config(
        """\
        [tools."ht.email"]
        url = "@URL@/v1/email"
        retries = 1
        """
    )
    provider.script("/v1/email", [first, "409"])
    failed = project.run(calls(call("ht.email", {"d": 1}), catch=True)).output
    assert failed[0]["error"]["category"] == "conflict", failed
    first_key = provider.on("/v1/email")[0].headers["idempotency-key"]
    project.run(calls(call("ht.email", {"d": 1})), refresh_failed=True)
    keys = [seen.headers["idempotency-key"] for seen in provider.on("/v1/email")]
    assert keys == [first_key] * 3, keys


def test_a_forced_refresh_of_a_failure_that_may_have_been_processed_goes_out_under_a_fresh_key(
    project: Project, provider: LoopbackProvider
) -> None:
    """A provider that stores its answer under the key (a 502 as well as a 200) gives back
    that 502 to every call under it: a failure kept under its key could never be answered.
    `--refresh-failed` keeps the key (the 502 may have been billed); `--force-refresh`, which
    asks for new paid calls of everything, asks it under a fresh key."""
    project.config(
        """\
        [tools."ht.email"]
        url = "@URL@/v1/email"
        retries = 0
        """
    )
    provider.script("/v1/email", ["502", "502", "200"])
    project.run(calls(call("ht.email", {"d": 1}), catch=True))
    project.run(calls(call("ht.email", {"d": 1}), catch=True), refresh_failed=True)
    forced = project.run(calls(call("ht.email", {"d": 1})), force_refresh=True).output
    keys = [seen.headers["idempotency-key"] for seen in provider.on("/v1/email")]
    assert keys[0] == keys[1] != keys[2], keys
    assert keys[2].startswith(keys[0] + "-"), keys
    assert forced[0]["execution"] == "live"


@pytest.mark.parametrize("batched", [False, True], ids=["alone", "in-a-batch"])
def test_a_failure_that_may_have_been_processed_keeps_that_across_runs(
    project: Project, provider: LoopbackProvider, batched: bool
) -> None:
    """Run 1's only try got a 502 (it may have been processed); run 2 asked again under the
    same key and was refused as a key in use (409). That failure forgot the first: run 3's
    `--refresh-failed` went out under a fresh key (a batch: as that batch, under a new key)."""
    if batched:
        project.config(BATCH_TOOL.replace("credits = 1", "credits = 1\nretries = 0"))
        path, asked = "/people/batch", [call("ht.batch", {"domain": f"d{i}.com"}) for i in range(2)]
    else:
        project.config(
            """\
            [tools."ht.email"]
            url = "@URL@/v1/email"
            retries = 0
            """
        )
        path, asked = "/v1/email", [call("ht.email", {"d": 1})]
    provider.script(path, ["502", "409"])
    project.run(calls(*asked, gather=True, catch=True))
    refused = project.run(calls(*asked, gather=True, catch=True)).output
    assert all(a["error"]["category"] == "conflict" for a in refused), refused
    project.run(calls(*asked, gather=True, catch=True), refresh_failed=True)
    keys = [seen.headers["idempotency-key"] for seen in provider.on(path)]
    assert len(keys) == 3 and len(set(keys)) == 1, keys


def test_a_refused_then_rejected_call_is_refreshed_under_a_fresh_key(
    project: Project, provider: LoopbackProvider
) -> None:
    """A 429 (refused before anything was done), then the next run's retry under the same
    key rejected (400): neither try may have been processed, and `--refresh-failed` sends a
    fresh key, as for any failure asked again (the mark of an unanswered try is not taken
    from a transient failure alone)."""
    project.config(
        """\
        [tools."ht.email"]
        url = "@URL@/v1/email"
        retries = 0
        """
    )
    provider.script("/v1/email", ["429", "400"])
    project.run(calls(call("ht.email", {"d": 1}), catch=True))
    project.run(calls(call("ht.email", {"d": 1}), catch=True))
    project.run(calls(call("ht.email", {"d": 1}), catch=True), refresh_failed=True)
    keys = [seen.headers["idempotency-key"] for seen in provider.on("/v1/email")]
    assert len(keys) == 3 and keys[0] == keys[1] != keys[2], keys


def test_a_call_refused_as_a_key_in_use_is_refreshed_under_that_key(
    project: Project, provider: LoopbackProvider
) -> None:
    """A 409 for the idempotency key in use: the provider has seen that key (an earlier try,
    a store written before the mark of an unanswered try existed, another store's run). Its
    `--refresh-failed` went out under a fresh key, and a provider that had processed the key
    billed the call again. Asked again under that key."""
    project.config(
        """\
        [tools."ht.email"]
        url = "@URL@/v1/email"
        retries = 0
        """
    )
    provider.script("/v1/email", ["409"])
    failed = project.run(calls(call("ht.email", {"d": 1}), catch=True)).output
    assert failed[0]["error"]["category"] == "conflict", failed
    project.run(calls(call("ht.email", {"d": 1})), refresh_failed=True)
    keys = [seen.headers["idempotency-key"] for seen in provider.on("/v1/email")]
    assert len(keys) == 2 and len(set(keys)) == 1, keys


def test_a_409_is_asked_again_under_its_key_once_then_under_a_fresh_one(
    project: Project, provider: LoopbackProvider
) -> None:
    """A 409 that is a conflict of the provider's own (a record that exists already) came
    back under the same key forever: the call could never be asked again. Asked once under
    its key (the provider may have processed it), then under a fresh key; and a 400 after a
    409 is not taken for a try that may have been processed."""
    project.config(
        """\
        [tools."ht.email"]
        url = "@URL@/v1/email"
        retries = 0
        """
    )
    provider.script("/v1/email", ["409", "409", "409"])
    for refresh in (False, True, True):
        project.run(calls(call("ht.email", {"d": 1}), catch=True), refresh_failed=refresh)
    keys = [seen.headers["idempotency-key"] for seen in provider.on("/v1/email")]
    assert len(keys) == 3 and keys[0] == keys[1] != keys[2], keys

    provider.script("/v1/email", ["409", "400", "200"])
    for refresh in (False, True, True):
        project.run(calls(call("ht.email", {"d": 2}), catch=True), refresh_failed=refresh)
    keys = [seen.headers["idempotency-key"] for seen in provider.on("/v1/email")][3:]
    assert len(keys) == 3 and keys[0] == keys[1] != keys[2], keys


@pytest.mark.parametrize(
    ("urls", "warmed"),
    [
        (["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"], False),
        (["http://127.0.0.1:9/a", "https://api.example.com/b"], True),
        (["{base}/v1/find"], True),  # the scheme is the call's: it may be https
    ],
)
def test_the_tls_context_is_built_before_the_run_only_when_a_tool_may_need_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, urls: list[str], warmed: bool
) -> None:
    """Loading the system's certificate authorities costs ~100 ms of CPU; a run whose
    tools are all plain http (a local provider, a sidecar) never uses them."""
    from deepline_cli.runtime.providers import http as http_module
    from deepline_cli.runtime.providers.config import load_config

    built: list[bool] = []
    monkeypatch.setattr(http_module, "warm_up", lambda: built.append(True))
    tools = "".join(f'[tools."t.n{i}"]\nurl = "{url}"\nallow_hosts = ["*.example.com"]\n' for i, url in enumerate(urls))
    (tmp_path / "deepline.toml").write_text(tools)
    http_module.HttpTools(load_config(tmp_path / "deepline.toml"), None)  # type: ignore[arg-type]
    assert built == ([True] if warmed else [])
