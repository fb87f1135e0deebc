"""Corporate networks: HTTP tools through a real HTTP proxy (proxy.py, in a process of its
own), HTTPS through a CONNECT tunnel to a provider whose certificate comes from a test CA
(trustme) trusted with SSL_CERT_FILE, NO_PROXY, a tool's own `proxy`, and a proxy that
refuses, in one sentence."""

from __future__ import annotations

import ssl
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import Result
from tests.helpers import wait_until
from tests.provider import Provider, ProviderServer

trustme = pytest.importorskip("trustme", reason="trustme is a dev dependency (pip install -e '.[dev]')")
Run = Callable[..., Result]


class ProxyProcess:
    """proxy.py listening on a free port; its access log says what went through it."""

    def __init__(self, folder: Path, *extra: str) -> None:
        self.log = folder / "proxy.log"
        port_file = folder / "proxy.port"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "proxy", "--hostname", "127.0.0.1", "--port", "0", "--port-file", str(port_file),
             "--num-workers", "1", "--num-acceptors", "1", "--log-file", str(self.log), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.port = int(wait_until(lambda: port_file.exists() and port_file.read_text().strip(), what="proxy.py"))
        self.url = f"http://127.0.0.1:{self.port}"

    def lines(self) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if "access_log" in line]

    def carried(self, server: Provider) -> list[str]:
        """The access-log lines of what went through, up to a marker request sent through the
        proxy now (the proxy logs a request once its connection closes: the marker's line
        says every earlier one is written)."""
        marker = f"/_marker/{time.monotonic_ns()}"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": self.url}))
        try:
            opener.open(server.url.replace("https:", "http:") + marker, timeout=10).close()
        except urllib.error.HTTPError as refused:  # an https server asked in plain http: still logged
            refused.close()
        except OSError:  # …or the proxy hung up: logged all the same
            pass
        wait_until(lambda: any(marker in line for line in self.lines()), what="the proxy's marker line")
        return [line for line in self.lines() if "/_marker/" not in line]

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[ProxyProcess]:
    running = ProxyProcess(tmp_path)
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def ca(tmp_path: Path) -> tuple[object, Path]:
    authority = trustme.CA()
    pem = tmp_path / "company-ca.pem"
    authority.cert_pem.write_to_path(str(pem))
    return authority, pem


@pytest.fixture
def https_provider(ca: tuple[object, Path]) -> Iterator[Provider]:
    authority, _ = ca
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1", "localhost").configure_cert(context)  # type: ignore[attr-defined]
    provider = Provider()
    provider.scheme = "https"
    with ProviderServer(provider, ssl=context) as running:
        yield running


@pytest.fixture
def http_provider() -> Iterator[Provider]:
    with ProviderServer() as running:
        yield running


PLAY = """
from deepline_cli import play

@play("proxied")
async def proxied(ctx, input):
    result = await ctx.tools.execute("lookup", "corp.lookup", {"domain": "acme.com"})
    return result.output["path"]
"""


def project(tmp_path: Path, url: str, extra: str = "") -> Path:
    (tmp_path / "deepline.toml").write_text(
        textwrap.dedent(
            f"""\
            [tools."corp.lookup"]
            url = "{url}/v1/lookup"
            query = {{ domain = "{{domain}}" }}
            retries = 1
            {extra}
            """
        )
    )
    play = tmp_path / "play.py"
    play.write_text(textwrap.dedent(PLAY))
    return play


def test_https_goes_through_the_proxy_in_a_connect_tunnel_with_the_company_ca(
    deepline: Run, tmp_path: Path, proxy: ProxyProcess, https_provider: Provider, ca: tuple[object, Path]
) -> None:
    play = project(tmp_path, https_provider.url)
    result = deepline("run", str(play), HTTPS_PROXY=proxy.url, SSL_CERT_FILE=str(ca[1]))
    assert result.code == 0, result.stderr
    assert https_provider.count("/v1/lookup") == 1
    assert any(f"CONNECT 127.0.0.1:{https_provider.port}" in line for line in proxy.carried(https_provider))


def test_the_company_ca_is_needed_for_a_certificate_it_signed(
    deepline: Run, tmp_path: Path, https_provider: Provider, ca: tuple[object, Path]
) -> None:
    """A certificate the machine does not trust is the machine's settings, the same on every
    try: it was retried 5 times as a network error (~15 s a call) and kept as a transient
    failure. One sentence, exit 2, nothing recorded: the resume, once the CA is set, calls."""
    play = project(tmp_path, https_provider.url)
    result = deepline("run", str(play), "--run-id", "tls-1", DEEPLINE_RETRY_BASE_S="0.01")
    assert result.code == 2, result.stderr
    assert "is not trusted" in result.stderr and "SSL_CERT_FILE" in result.stderr, result.stderr
    assert "retried" not in result.stderr and "Traceback" not in result.stderr
    nowhere = tmp_path / "nowhere"
    missing = deepline("run", str(play), "--run-id", "tls-2", SSL_CERT_DIR=str(nowhere))
    assert missing.code == 2 and f"(SSL_CERT_DIR={nowhere} is not a folder)" in missing.stderr, missing.stderr
    assert https_provider.count() == 0
    fixed = deepline("resume", "tls-1", SSL_CERT_FILE=str(ca[1]))
    assert fixed.code == 0, fixed.stderr
    assert https_provider.count("/v1/lookup") == 1


def test_an_unusable_proxy_or_certificate_file_stops_only_the_calls_that_need_it(
    deepline: Run, tmp_path: Path, http_provider: Provider
) -> None:
    """A socks proxy set for other programs (ALL_PROXY), an https:// one, or an unreadable
    SSL_CERT_FILE failed every run at its start, even one calling nothing through them,
    as an internal error (exit 1) that left the run `running`."""
    offline = tmp_path / "offline.py"
    offline.write_text(
        "from deepline_cli import play\n\n@play('offline')\nasync def offline(ctx, input):\n"
        "    return await ctx.step('answer', lambda: 42)\n"
    )
    socks = {"ALL_PROXY": "socks5h://127.0.0.1:1080", "NO_PROXY": "*"}
    assert deepline("run", str(offline), **socks).code == 0
    assert deepline("run", str(offline), "--force-refresh", SSL_CERT_FILE="/nonexistent.pem").code == 0
    play = project(tmp_path, http_provider.url)
    used = deepline("run", str(play), "--run-id", "px-1", ALL_PROXY="socks5h://127.0.0.1:1080")
    assert used.code == 2, used.stderr
    assert "is not an http:// proxy" in used.stderr and "internal error" not in used.stderr, used.stderr
    assert '"running"' not in deepline("runs", "show", "px-1", "--json").stdout
    assert deepline("resume", "px-1").code == 0  # the proxy unset: the call goes out once
    assert http_provider.count("/v1/lookup") == 1


def test_http_goes_through_the_proxy_and_no_proxy_goes_direct(
    deepline: Run, tmp_path: Path, proxy: ProxyProcess, http_provider: Provider
) -> None:
    play = project(tmp_path, http_provider.url)
    through = deepline("run", str(play), HTTP_PROXY=proxy.url)
    assert through.code == 0, through.stderr
    assert any(f"GET 127.0.0.1:{http_provider.port}/v1/lookup" in line for line in proxy.carried(http_provider))

    direct = deepline("run", str(play), "--force-refresh", HTTP_PROXY=proxy.url, NO_PROXY="localhost,127.0.0.1")
    assert direct.code == 0, direct.stderr
    assert http_provider.count("/v1/lookup") == 2
    assert len(proxy.carried(http_provider)) == 1  # the second call did not go through it


def test_a_tool_may_name_its_own_proxy_or_none(
    deepline: Run, tmp_path: Path, proxy: ProxyProcess, http_provider: Provider
) -> None:
    play = project(tmp_path, http_provider.url, f'proxy = "{proxy.url}"')
    assert deepline("run", str(play)).code == 0
    assert len(proxy.carried(http_provider)) == 1
    play = project(tmp_path, http_provider.url, 'proxy = ""')  # direct, whatever the environment says
    assert deepline("run", str(play), "--force-refresh", HTTP_PROXY=proxy.url).code == 0
    assert len(proxy.carried(http_provider)) == 1 and http_provider.count("/v1/lookup") == 2


def test_a_proxy_that_refuses_is_one_sentence(
    deepline: Run, tmp_path: Path, https_provider: Provider, ca: tuple[object, Path]
) -> None:
    """One that wants credentials it was not given (407), and one that is not there."""
    guarded = ProxyProcess(tmp_path, "--basic-auth", "corp:secret")
    try:
        play = project(tmp_path, https_provider.url)
        refused = deepline("run", str(play), HTTPS_PROXY=guarded.url, SSL_CERT_FILE=str(ca[1]))
        let_in = deepline(
            "run", str(play), HTTPS_PROXY=guarded.url.replace("://", "://corp:secret@"), SSL_CERT_FILE=str(ca[1])
        )
    finally:
        guarded.close()
    assert refused.code == 2, refused.stderr  # configuration: nothing recorded on the receipt
    assert "refused a tunnel to 127.0.0.1" in refused.stderr and "407" in refused.stderr
    assert "retried" not in refused.stderr  # not worth another attempt
    assert let_in.code == 0, let_in.stderr
    assert "secret" not in let_in.stderr + refused.stderr

    absent = deepline(
        "run", str(play), "--force-refresh", HTTPS_PROXY="http://127.0.0.1:9", DEEPLINE_RETRY_BASE_S="0.01"
    )
    assert absent.code == 1
    assert "cannot connect to the proxy 127.0.0.1:9" in absent.stderr
    for result in (refused, absent):
        assert "Traceback" not in result.stderr
    assert https_provider.count("/v1/lookup") == 1


def test_a_plain_http_proxy_that_wants_credentials_is_one_sentence_and_takes_them_from_env(
    deepline: Run, tmp_path: Path, http_provider: Provider
) -> None:
    """A tool's `proxy` with `${NAME}` for its password, as every other string of a tool
    may have: it was sent as written. And an http:// request the proxy refuses (407) was
    recorded as the call's failure and replayed after the fix, instead of stopping the
    run in one sentence with nothing recorded."""
    guarded = ProxyProcess(tmp_path, "--basic-auth", "corp:proxy-password-1")
    try:
        with_secret = 'proxy = "' + guarded.url.replace("://", "://corp:${CORP_PROXY_PASSWORD}@") + '"'
        play = project(tmp_path, http_provider.url, with_secret)
        (tmp_path / ".env").write_text("CORP_PROXY_PASSWORD=wrong-password-1\n")
        refused = deepline("run", str(play), "--run-id", "px")
        (tmp_path / ".env").write_text("CORP_PROXY_PASSWORD=proxy-password-1\n")
        resumed = deepline("resume", "px")
    finally:
        guarded.close()
    assert refused.code == 2, refused.stderr  # configuration: nothing recorded on the receipt
    assert "407" in refused.stderr and "Traceback" not in refused.stderr
    assert resumed.code == 0, resumed.stderr
    assert http_provider.count("/v1/lookup") == 1
    assert "proxy-password-1" not in refused.stderr + resumed.stderr
    assert "wrong-password-1" not in refused.stderr


def test_a_proxy_password_from_env_keeps_the_url_whole_whatever_it_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A generated password with `#`, `@`, `/` or `:` in `${NAME}` broke the proxy URL (and
    its error showed part of the password): it is percent-encoded into the credentials."""
    import base64

    from deepline_cli.runtime.providers.secrets import Secrets
    from deepline_cli.runtime.providers.templates import render_proxy
    from deepline_cli.runtime.providers.transport import Proxy

    monkeypatch.setenv("CORP_PROXY_PASSWORD", "Xy7#a@b/c:d%e")
    url = render_proxy("http://svc:${CORP_PROXY_PASSWORD}@proxy.corp:3128", Secrets(), tool="corp.lookup")
    proxy = Proxy.parse(url)
    assert (proxy.host, proxy.port) == ("proxy.corp", 3128)
    assert proxy.authorization is not None
    assert base64.b64decode(proxy.authorization.split()[1]) == b"svc:Xy7#a@b/c:d%e"
    assert "Xy7" not in proxy.url


def test_a_proxy_url_python_cannot_split_is_one_sentence(
    deepline: Run, tmp_path: Path, http_provider: Provider
) -> None:
    """`HTTP_PROXY='http://[::1'`: its error message split the URL again and raised, so every
    row failed for good as an internal ValueError (and `check` of a tool naming it crashed)."""
    play = project(tmp_path, http_provider.url)
    bad = deepline("run", str(play), "--run-id", "v6", HTTP_PROXY="http://user:pw@[::1")
    assert bad.code == 2, bad.stderr
    assert "is not valid" in bad.stderr and "internal error" not in bad.stderr and "pw@" not in bad.stderr, bad.stderr
    assert deepline("resume", "v6").code == 0  # nothing was recorded against the call
    assert http_provider.count("/v1/lookup") == 1
    project(tmp_path, http_provider.url, extra='proxy = "http://[::1"')
    checked = deepline("check", str(play))
    assert checked.code == 2 and "internal error" not in checked.stderr, checked.stderr


@pytest.mark.parametrize(
    ("no_proxy", "host", "port", "direct"),
    [
        ("corp.com", "api.corp.com", 443, True),
        (".corp.com", "api.corp.com", 443, True),
        ("*.corp.com", "api.corp.com", 443, True),  # as Windows and many tools write it
        ("*.corp.com", "corp.com", 443, True),
        ("*.corp.com", "notcorp.com", 443, False),
        ("corp.com:8443", "api.corp.com", 443, False),
        ("corp.com:8443", "api.corp.com", 8443, True),
        ("[::1]:80", "::1", 80, True),  # an IPv6 address with a port, bracketed
        ("[::1]:80", "::1", 81, False),
        ("::1", "::1", 80, True),
        ("10.0.0.0/8", "10.2.3.4", 80, True),
        ("*", "anything.example", 80, True),
    ],
)
def test_no_proxy_entries_as_people_write_them(no_proxy: str, host: str, port: int, direct: bool) -> None:
    """NO_PROXY as corporate machines set it: `*.corp.com` and a bracketed IPv6 address with
    its port (`[::1]:80`) went through the proxy."""
    from deepline_cli.runtime.providers.transport import Proxies

    proxies = Proxies({"HTTPS_PROXY": "http://proxy.corp:3128", "HTTP_PROXY": "http://proxy.corp:3128",
                       "NO_PROXY": no_proxy})  # fmt: skip
    scheme = "https" if port == 443 else "http"
    assert (proxies.route((scheme, host, port), None) is None) is direct
