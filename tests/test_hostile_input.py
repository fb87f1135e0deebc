"""Secrets and hostile input: a secret echoed back in any encoding is redacted, a row
cannot build a request that smuggles headers or reaches another host or scheme, and
`ctx.fetch` can be kept off private addresses.

The loopback provider is real; the checks read the store file, stdout, stderr, the
export and `receipts inspect` for every encoded form of the secret.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, Result
from tests.provider import Provider, ProviderServer, Seen

Run = Callable[..., Result]
SECRET = 'sk-live/Ab"cd+ef=gh&12?xy9Q'


def encoded_forms(secret: str) -> dict[str, bytes]:
    raw = secret.encode()
    json_escaped = json.dumps(secret)[1:-1]
    return {
        "raw": raw,
        "json": json_escaped.encode(),
        "json-slash": json_escaped.replace("/", "\\/").encode(),
        "url": urllib.parse.quote(secret, safe="").encode(),
        "url-plus": urllib.parse.quote_plus(secret).encode(),
        "base64": base64.b64encode(raw),
        "base64-basic": base64.b64encode(b"user:" + raw),
        "base64-url": base64.urlsafe_b64encode(b"ab" + raw),
    }


@dataclass
class EchoingProvider(Provider):
    """Answers with the Authorization header's token in every encoding it knows."""

    def answer(self, seen: Seen) -> tuple[int, dict[str, str], bytes]:
        token = seen.headers.get("authorization", "").removeprefix("Bearer ")
        forms = {name: value.decode() for name, value in encoded_forms(token).items()}
        body = json.dumps({"nested": json.dumps({"token": token}), **forms})
        body = body.replace("/", "\\/")  # some providers escape slashes
        return 200, {"content-type": "application/json"}, body.encode()


@pytest.fixture
def echo() -> Iterator[Provider]:
    with ProviderServer(EchoingProvider()) as p:
        yield p


def run_cli(args: list[str], cwd: Path, env: dict[str, str]) -> Result:
    proc = subprocess.run(
        [sys.executable, "-m", "deepline_cli", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return Result(proc.returncode, proc.stdout, proc.stderr)


def test_a_secret_echoed_back_in_any_encoding_is_redacted_everywhere(
    tmp_path: Path, echo: Provider, cli_env: dict[str, str], store_path: Path
) -> None:
    (tmp_path / "deepline.toml").write_text(
        f"""
[tools."echo.tool"]
url = "http://127.0.0.1:{echo.port}/v1/echo"
headers = {{ Authorization = "Bearer ${{API_KEY}}" }}
"""
    )
    (tmp_path / "play.py").write_text(
        f"""
from deepline_cli import play

@play("leaky")
async def leaky(ctx, input):
    key = ctx.secrets.get("API_KEY")
    page = await ctx.fetch("page", "http://127.0.0.1:{echo.port}/v1/page",
                           headers={{"Authorization": f"Bearer {{key}}"}})
    rows = await ctx.map("rows", [{{"id": 1}}], key="id", columns={{
        "echoed": lambda row, rc: rc.tools.execute("e", "echo.tool", {{"id": row["id"]}}),
        "text": lambda row, rc: page.text,
    }})
    ctx.log(page.text)
    return {{"text": page.text, "json": page.json, "rows": len(rows)}}
"""
    )
    env = {**cli_env, "API_KEY": SECRET}
    ran = run_cli(["run", "play.py", "--run-id", "leaky", "--json"], tmp_path, env)
    assert ran.code == 0, ran.stderr
    exported = run_cli(["export", "leaky", "--format", "jsonl"], tmp_path, env)
    inspected = run_cli(["receipts", "inspect", "--run", "leaky", "--json"], tmp_path, env)
    logs = run_cli(["runs", "logs", "leaky"], tmp_path, env)
    assert len(echo.requests) == 2
    places = {
        "stdout": ran.stdout.encode(),
        "stderr": ran.stderr.encode(),
        "export": exported.stdout.encode(),
        "receipts": inspected.stdout.encode(),
        "logs": logs.stdout.encode(),
        "store": b"".join(p.read_bytes() for p in tmp_path.glob(f"{store_path.name}*")),
    }
    assert b"[redacted]" in places["export"]
    leaks = [(form, place) for form, value in encoded_forms(SECRET).items() for place, data in places.items()
             if value in data]  # fmt: skip
    assert leaks == []


def header_play(port: int) -> str:
    return """
from deepline_cli import play

@play("hostile")
async def hostile(ctx, input):
    rows = await ctx.map("rows", input["rows"], key="id", columns={
        "named": lambda row, rc: rc.tools.execute("n", "named.tool", {"name": row["name"]}),
        "page": lambda row, rc: rc.fetch("p", row["url"]),
    })
    return [r.get("_error") for r in rows]
"""


def test_a_row_cannot_smuggle_headers_or_schemes_and_is_not_retried(
    tmp_path: Path, cli_env: dict[str, str], deepline: Callable[..., Result]
) -> None:
    with ProviderServer(Provider()) as provider:
        (tmp_path / "deepline.toml").write_text(
            f"""
[tools."named.tool"]
url = "http://127.0.0.1:{provider.port}/v1/named"
headers = {{ X-Name = "{{name}}" }}
retries = 3
"""
        )
        (tmp_path / "play.py").write_text(header_play(provider.port))
        rows = [
            {"id": 1, "name": "ok\r\nX-Injected: 1", "url": f"http://127.0.0.1:{provider.port}/fine"},
            {"id": 2, "name": "two", "url": "file:///etc/passwd"},
            {"id": 3, "name": "three", "url": "gopher://127.0.0.1:70/x"},
        ]
        ran = run_cli(["run", "play.py", "--input", json.dumps({"rows": rows}), "--run-id", "hostile"], tmp_path,
                      cli_env)  # fmt: skip
        assert ran.code == 0, ran.stderr
        errors = json.loads(ran.stdout)
        assert all(e and e.startswith("validation:") for e in errors), errors
        assert [r.path for r in provider.requests] == ["/v1/named", "/v1/named"]  # rows 2, 3: headers fine
        assert all("x-injected" not in r.headers for r in provider.requests)
    listed = deepline("receipts", "inspect", "--run", "hostile", "--status", "failed", "--json").json_lines()
    assert {r["failure_kind"] for r in listed} == {"validation"}
    assert len(listed) == 3


@pytest.mark.parametrize(
    ("url", "extra", "message"),
    [
        ("{url}", "", "host"),
        ("https://api.example.com{path}", "", "host"),
        ("https://{region}.example.com/v1", "", "host"),
    ],
)
def test_a_tools_host_is_fixed_by_its_config(
    tmp_path: Path, deepline: Callable[..., Result], url: str, extra: str, message: str
) -> None:
    (tmp_path / "deepline.toml").write_text(f'[tools."t.x"]\nurl = "{url}"\n{extra}')
    (tmp_path / "play.py").write_text(
        "from deepline_cli import play\n\n@play('p')\nasync def p(ctx, input):\n    return 1\n"
    )
    checked = deepline("check", "play.py")
    assert checked.code == 2
    assert message in checked.stderr and "allow_hosts" in checked.stderr
    assert len(checked.stderr.strip().splitlines()) == 1


def test_allow_hosts_lets_a_row_pick_among_listed_hosts_only(tmp_path: Path, cli_env: dict[str, str]) -> None:
    with ProviderServer(Provider()) as provider:
        (tmp_path / "deepline.toml").write_text(
            f"""
[tools."t.pick"]
url = "http://{{host}}/v1/pick"
allow_hosts = ["127.0.0.1:{provider.port}"]
"""
        )
        (tmp_path / "play.py").write_text(
            """
from deepline_cli import play

@play("pick")
async def pick(ctx, input):
    rows = await ctx.map("rows", input["rows"], key="host", columns={
        "got": lambda row, rc: rc.tools.execute("p", "t.pick", {"host": row["host"]}),
    })
    return [r.get("_error") for r in rows]
"""
        )
        rows = [{"host": f"127.0.0.1:{provider.port}"}, {"host": "169.254.169.254"}, {"host": "evil.example@x"}]
        ran = run_cli(["run", "play.py", "--input", json.dumps({"rows": rows})], tmp_path, cli_env)
        assert ran.code == 0, ran.stderr
        errors = json.loads(ran.stdout)
        assert errors[0] is None
        assert errors[1].startswith("validation:") and "allow_hosts" in errors[1]
        assert errors[2].startswith("validation:")
        assert len(provider.requests) == 1


def test_fetch_can_be_kept_off_private_addresses(tmp_path: Path, cli_env: dict[str, str]) -> None:
    with ProviderServer(Provider()) as provider:
        (tmp_path / "play.py").write_text(
            """
from deepline_cli import play

@play("ssrf")
async def ssrf(ctx, input):
    rows = await ctx.map("rows", input["urls"], key="url", columns={
        "page": lambda row, rc: rc.fetch("p", row["url"]),
    })
    return [r.get("_error") for r in rows]
"""
        )
        urls = [{"url": f"http://127.0.0.1:{provider.port}/x"}, {"url": "http://169.254.169.254/latest/meta-data/"},
                {"url": "http://10.1.2.3/"}, {"url": "http://localhost:9/"}]  # fmt: skip
        payload = json.dumps({"urls": urls})
        guarded = run_cli(
            ["run", "play.py", "--input", payload], tmp_path, {**cli_env, "DEEPLINE_FETCH_PUBLIC_ONLY": "1"}
        )
        assert guarded.code == 0, guarded.stderr
        errors = json.loads(guarded.stdout)
        assert all(e and e.startswith("validation:") and "private" in e for e in errors), errors
        assert provider.requests == []
        again = ["run", "play.py", "--input", json.dumps({"urls": urls[:1]}), "--refresh-failed"]
        allowed = run_cli(again, tmp_path, cli_env)
        assert json.loads(allowed.stdout) == [None]  # off by default: local plays may fetch local services
        assert len(provider.requests) == 1


# --- what used to end as "internal error" --------------------------------------------------


def test_an_input_value_that_is_not_utf8_is_a_usage_error(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """A command-line argument that is not valid UTF-8 arrives as lone surrogates."""
    proc = subprocess.run(
        [sys.executable, "-m", "deepline_cli", "run", str(ROOT / "examples/hello/play.py"), "--set", b"name=\xff\xfe"],
        capture_output=True, env=cli_env, cwd=tmp_path,
    )  # fmt: skip
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, err
    assert "input field 'name' is not valid UTF-8 text" in err and "Traceback" not in err


def test_export_to_a_directory_or_a_full_disk_is_one_sentence(deepline: Run, tmp_path: Path) -> None:
    leads = ROOT / "examples/lead_enrichment"
    run = deepline("run", str(leads / "play.py"), "--csv", str(leads / "leads.csv"), "--set", "latency=0",
                   "--limit", "5", "--run-id", "ex")  # fmt: skip
    assert run.code == 0, run.stderr
    folder = deepline("export", "ex", "--out", str(tmp_path))
    assert folder.code == 2 and "is a directory" in folder.stderr, folder.stderr
    full = deepline("export", "ex", "--out", "/dev/full")
    assert full.code == 2 and "No space left on device" in full.stderr, full.stderr
    for result in (folder, full):
        assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, result.stderr


def test_plan_of_a_play_whose_rows_never_end_is_bounded(deepline: Run, write_play: Callable[..., Path]) -> None:
    write_play(
        """
        import itertools
        from deepline_cli import play

        @play("endless")
        async def endless(ctx, input):
            rows = ({"n": n} for n in itertools.count())
            await ctx.map("rows", rows, key="n", columns={"double": lambda row: row["n"] * 2})
            return {}
        """
    )
    result = deepline("plan", "play.py", timeout=120)
    assert result.code == 0, result.stderr
    assert "map rows: 100,000 rows" in result.stdout
    assert "did not end within 100,000 rows" in result.stdout


def test_an_excerpt_of_a_text_never_holds_part_of_a_secret() -> None:
    """An error body is kept to its first 200 characters, redacted first. Each redaction
    makes the text shorter: a secret beyond the first window's end moved back before the cut,
    and 13 of its characters were kept in clear."""
    import os

    from deepline_cli.runtime.providers.secrets import Secrets

    key = "sk_live_ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcd"  # 44 characters
    os.environ["HI_EXCERPT_KEY"] = key
    try:
        secrets = Secrets()
        secrets.get("HI_EXCERPT_KEY")
    finally:
        del os.environ["HI_EXCERPT_KEY"]
    for pad in range(0, 260, 7):
        body = f'{{"error": "bad key {key} / {key} / {key}", "hint": "{"x" * pad} retry with {key} and more"}}'
        out = secrets.excerpt(body, 200)
        assert len(out) <= 200 and not any(key[:n] in out for n in range(8, len(key) + 1)), (pad, out)
    assert secrets.excerpt("short, no secret", 200) == "short, no secret"


def test_a_short_secret_is_not_redacted_but_warned_of_and_a_secret_ending_a_base64_text_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 4-character value asked for as a secret was redacted in every answer ("founded":
    [redacted] for 2019), leaving the JSON unreadable for good: a value under 8 characters
    is not redacted, and the run warns of it once. The base64 of a secret that ends the
    encoded text kept its padded tail (`[redacted]Jnk=`: its last characters)."""
    from deepline_cli.runtime.providers.secrets import Secrets

    monkeypatch.setenv("HI_PIN", "2019")
    monkeypatch.setenv("HI_B64_KEY", "s3cr3t+/value=x&y")
    secrets = Secrets()
    warned: list[str] = []
    secrets.warn = warned.append
    assert secrets.get("HI_PIN") == secrets.get("HI_PIN") == "2019"
    assert len(warned) == 1 and "HI_PIN is shorter than 8 characters" in warned[0], warned
    secrets.get("HI_B64_KEY")
    echoed = base64.b64encode(b"s3cr3t+/value=x&y").decode()
    said = '{"founded": 2019, "employees": 120190, "b64": "' + echoed + '"}'
    assert secrets.redact(said) == '{"founded": 2019, "employees": 120190, "b64": "[redacted]"}'


_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
_SECRETS = st.sampled_from(["sk-live-7f3c9a1e5b2d4c6e", 'p@ss"wörd/+=\\', "tab\tand\nline12", "ключ-секрет-42"])


def _walked_redaction(secrets: Any, value: Any) -> Any:
    """What redact_json gave by walking every value (its behaviour before any shortcut)."""
    if isinstance(value, str):
        return secrets.redact(value)
    if isinstance(value, dict):
        return {secrets.redact(k) if isinstance(k, str) else k: _walked_redaction(secrets, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_walked_redaction(secrets, v) for v in value]
    return value


@given(
    secret=_SECRETS,
    shape=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT | st.just("§SECRET§"),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT | st.just("§SECRET§"), inner, max_size=4),
        max_leaves=10,
    ),
    form=st.sampled_from(["as is", "quoted", "base64", "inside"]),
)
@settings(max_examples=400, deadline=None)
def test_redacting_a_json_value_redacts_what_walking_it_did(secret: str, shape: Any, form: str) -> None:
    """A JSON value with no secret in it is given back without a walk; one with a secret
    anywhere (a key, a value, encoded as a provider echoes it) is redacted as the walk did."""
    from deepline_cli.runtime.providers.secrets import Secrets

    with pytest.MonkeyPatch.context() as env:
        env.setenv("T_PROP_SECRET", secret)
        secrets = Secrets()
        secrets.lookup("T_PROP_SECRET")
    shown = {
        "as is": secret,
        "quoted": urllib.parse.quote(secret, safe=""),
        "base64": base64.b64encode(secret.encode()).decode(),
        "inside": f"Bearer {secret} (expired)",
    }[form]
    value = json.loads(json.dumps(shape).replace("§SECRET§", json.dumps(shown)[1:-1]))
    assert secrets.redact_json(value) == _walked_redaction(secrets, value)
    assert secrets.holds(value) == (_walked_redaction(secrets, value) != value)
