"""`deepline.toml`: HTTP tools and the remote tool API, declared next to the play.

    [tools."hunter.email"]
    method = "GET"
    url = "https://api.hunter.io/v2/email-finder"
    query = { domain = "{domain}", first_name = "{first_name}", api_key = "${HUNTER_API_KEY}" }
    extract = { email = "data.email" }
    credits = 1
    rate_limit = "15/s"

    [remote]
    base_url = "https://tools.example.com"
    api_key_env = "DEEPLINE_API_KEY"
    credits = { "apollo.people" = 2, "*" = 1 }   # or one number for every remote tool

Every mistake is one sentence naming the file, the tool and the field.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepline_cli.errors import UsageError
from deepline_cli.runtime.providers.governor import parse_rate
from deepline_cli.runtime.providers.templates import authority_end, references
from deepline_cli.runtime.providers.transport import InvalidRequest, Proxy

CONFIG_NAME = "deepline.toml"
METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})

_TOOL_KEYS = {
    "method": str,
    "url": str,
    "headers": dict,
    "query": dict,
    "json": (dict, list),
    "extract": dict,
    "credits": (int, float),
    "rate_limit": str,
    "concurrency": int,
    "timeout_s": (int, float),
    "retries": int,
    "idempotency_header": str,
    "batch": dict,
    "version": (str, int),
    "allow_hosts": list,
    "proxy": str,
}
_REMOTE_KEYS = {
    "base_url": str,
    "api_key_env": str,
    "timeout_s": (int, float),
    "retries": int,
    "credits": (int, float, dict),
    "proxy": str,
}
RETRIES = 5  # network errors, 5xx and 429, by default (SPEC §3): tools, remote tools and ctx.fetch
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP token (RFC 9110)
_BATCH_KEYS = {"max_size": int, "max_wait_ms": (int, float), "items_field": str, "results_field": str}


@dataclass(frozen=True)
class HttpToolSpec:
    id: str
    method: str
    url: str
    headers: dict[str, Any] = field(default_factory=dict)
    query: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    extract: dict[str, str] = field(default_factory=dict)
    credits: float = 0.0
    rate_limit: str | None = None
    concurrency: int | None = None
    timeout_s: float = 30.0
    retries: int = RETRIES
    idempotency_header: str = "Idempotency-Key"
    batch: dict[str, Any] | None = None
    version: str = "1"
    # Hosts (`host` or `host:port`) a templated URL may reach; empty: the URL's own host.
    allow_hosts: tuple[str, ...] = ()
    proxy: str | None = None  # this tool's proxy ("" for none); None: HTTP(S)_PROXY decide

    def secret_names(self) -> list[str]:
        """Every `${NAME}` the request templates use (the tool's credentials: its receipts are
        keyed by them)."""
        return sorted(references([self.url, self.headers, self.query, self.json])[0])

    def proxy_secret_names(self) -> list[str]:
        """Every `${NAME}` its `proxy` uses (a company proxy's password): needed to send a
        call, not part of what a call is keyed by."""
        return sorted(references([self.proxy or ""])[0])

    def field_names(self) -> list[str]:
        """Every `{field}` of the call's input the request templates use."""
        return sorted(references([self.url, self.headers, self.query, self.json])[1])


@dataclass(frozen=True)
class RemoteSpec:
    base_url: str
    api_key_env: str = "DEEPLINE_API_KEY"
    timeout_s: float = 60.0
    retries: int = RETRIES
    # Declared credits per call: by tool id, "*" for every other remote tool. A remote
    # answer that carries its own `credits` is billed at that; the declaration is what
    # the budget reserves before the call.
    credits: dict[str, float] = field(default_factory=dict)
    proxy: str | None = None

    def secret_names(self) -> list[str]:
        """The secrets a remote call needs: its API key, and any `${NAME}` of its base_url."""
        return [self.api_key_env, *sorted(references(self.base_url)[0] - {self.api_key_env})]

    def credits_for(self, tool_id: str) -> float | None:
        """The declared credits of a call to `tool_id`, None when nothing is declared."""
        return self.credits.get(tool_id, self.credits.get("*"))


@dataclass(frozen=True)
class Config:
    path: Path | None
    tools: dict[str, HttpToolSpec] = field(default_factory=dict)
    remote: RemoteSpec | None = None
    # `[snapshot] include = ["weights.json", "lists/*.txt"]`: data files an enqueued run
    # carries beside its play (globs in the deepline.toml's folder).
    snapshot_include: tuple[str, ...] = ()


def find_config(play_file: Path, explicit: str | Path | None) -> Path | None:
    """`--config FILE`, else `deepline.toml` next to the play (if there is one)."""
    if explicit:
        path = Path(explicit).expanduser().resolve()
        if not path.is_file():
            raise UsageError(f"Config file {path} does not exist.")
        return path
    candidate = play_file.parent / CONFIG_NAME
    return candidate if candidate.is_file() else None


def load_config(path: Path | None) -> Config:
    if path is None:
        return Config(None)
    data = read_toml(path)
    unknown = sorted(set(data) - {"tools", "remote", "schedules", "snapshot"})  # schedules: runtime/run/schedules.py
    if unknown:
        raise UsageError(
            f'{path}: unknown table or key {unknown[0]!r} (expected [tools."ID"], [remote], [schedules.NAME] and '
            "[snapshot])."
        )
    snapshot = data.get("snapshot", {})
    check_keys(path, "[snapshot]", snapshot, {"include": list})
    include = snapshot.get("include", [])
    if not all(isinstance(pattern, str) and pattern for pattern in include):
        raise UsageError(f'{path}: [snapshot] include must list file names or globs, like ["weights.json"].')
    declared = data.get("tools") or {}
    if not isinstance(declared, dict):
        raise UsageError(f'{path}: tools must be tables of tools, like [tools."hunter.email"] with a url.')
    tools = {tool_id: _tool(path, tool_id, spec) for tool_id, spec in declared.items()}
    remote = _remote(path, data["remote"]) if "remote" in data else None
    return Config(path, tools, remote, tuple(include))


def read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}.") from None
    except OSError as exc:
        raise UsageError(f"{path} cannot be read: {exc.strerror}.") from None


def check_keys(path: Path, owner: str, table: Any, allowed: dict[str, Any]) -> None:
    """`table` has only `allowed` keys, each of its type; else one sentence naming the key."""
    if not isinstance(table, dict):
        raise UsageError(f"{path}: {owner} must be a table.")
    for key, value in table.items():
        if key not in allowed:
            raise UsageError(f"{path}: {owner} has an unknown key {key!r} (allowed: {', '.join(sorted(allowed))}).")
        if not isinstance(value, allowed[key]) or isinstance(value, bool):
            raise UsageError(f"{path}: {owner} key {key!r} has the wrong type ({type(value).__name__}).")


def _tool(path: Path, tool_id: str, spec: Any) -> HttpToolSpec:
    owner = f"tool {tool_id!r}"
    check_keys(path, owner, spec, _TOOL_KEYS)
    for required in ("url",):
        if required not in spec:
            raise UsageError(f"{path}: {owner} needs a {required!r}.")
    method = str(spec.get("method", "POST" if "json" in spec else "GET")).upper()
    if method not in METHODS:
        raise UsageError(f"{path}: {owner} method {method!r} is not one of {', '.join(sorted(METHODS))}.")
    if not str(spec["url"]).startswith(("http://", "https://", "{", "${")):
        raise UsageError(f"{path}: {owner} url must start with http:// or https://.")
    allow_hosts = spec.get("allow_hosts") or []
    if not all(isinstance(h, str) and h and "/" not in h for h in allow_hosts):
        raise UsageError(f'{path}: {owner} allow_hosts must list host names, like ["api.example.com"].')
    if references(_authority(spec["url"]))[1] and not allow_hosts:
        raise UsageError(
            f"{path}: {owner} url takes its host from the call's input, which would let a row choose where the "
            "tool's credentials go; fix the host in the url, or list the hosts it may reach in allow_hosts."
        )
    if "rate_limit" in spec:
        parse_rate(spec["rate_limit"], owner=f"{path}: {owner}")
    if "timeout_s" in spec and not 0 < spec["timeout_s"] < math.inf:
        raise UsageError(f"{path}: {owner} timeout_s must be a number of seconds more than 0.")
    if "credits" in spec and not 0 <= spec["credits"] < math.inf:
        raise UsageError(f"{path}: {owner} credits must be a number, 0 or more.")
    for name in [*(spec.get("headers") or {}), spec.get("idempotency_header", "Idempotency-Key")]:
        if not _HEADER_NAME.fullmatch(name) and not references(name)[1]:
            raise UsageError(f"{path}: {owner} header name {name!r} is not valid (letters, digits and -, no spaces).")
    for name in ("concurrency", "retries"):
        if name in spec and spec[name] < (1 if name == "concurrency" else 0):
            raise UsageError(f"{path}: {owner} {name} must be at least {1 if name == 'concurrency' else 0}.")
    if "batch" in spec:
        check_keys(path, f"{owner} batch", spec["batch"], _BATCH_KEYS)
        if spec["batch"].get("max_size", 1) < 1:
            raise UsageError(f"{path}: {owner} batch max_size must be at least 1.")
        if not 0 <= spec["batch"].get("max_wait_ms", 0) < math.inf:
            raise UsageError(f"{path}: {owner} batch max_wait_ms must be a number of milliseconds, 0 or more.")
        per_call = sorted(
            name
            for name in ("url", "query", "headers")
            if references(spec.get(name) or "")[1]  # the call's {fields}; ${SECRETS} are the same for every call
        )
        if per_call:
            raise UsageError(
                f"{path}: {owner} batches its calls, and a batch goes out as one request, but its "
                f"{' and '.join(per_call)} take{'s' if len(per_call) == 1 else ''} fields of each call (every call "
                "would go where the first one does); put those fields in its json body, or take `batch` out."
            )
    for name, json_path in (spec.get("extract") or {}).items():
        if not isinstance(json_path, str):
            raise UsageError(f'{path}: {owner} extract {name!r} must be a JSON path string like "data.email".')
    return HttpToolSpec(
        id=tool_id,
        method=method,
        url=spec["url"],
        headers=dict(spec.get("headers") or {}),
        query=dict(spec.get("query") or {}),
        json=spec.get("json"),
        extract=dict(spec.get("extract") or {}),
        credits=float(spec.get("credits", 0)),
        rate_limit=spec.get("rate_limit"),
        concurrency=spec.get("concurrency"),
        timeout_s=float(spec.get("timeout_s", 30.0)),
        retries=int(spec.get("retries", 5)),
        idempotency_header=spec.get("idempotency_header", "Idempotency-Key"),
        batch=spec.get("batch"),
        version=str(spec.get("version", "1")),
        allow_hosts=tuple(h.lower() for h in allow_hosts),
        proxy=_proxy(path, owner, spec),
    )


def _authority(url: str) -> str:
    """The scheme and host part of a URL template: everything before its path."""
    return url[: authority_end(url)]


def _remote(path: Path, spec: Any) -> RemoteSpec:
    check_keys(path, "[remote]", spec, _REMOTE_KEYS)
    if "base_url" not in spec:
        raise UsageError(f"{path}: [remote] needs a 'base_url'.")
    if not spec["base_url"].startswith(("http://", "https://")):
        raise UsageError(f"{path}: [remote] base_url must start with http:// or https:// ({spec['base_url']!r}).")
    if "timeout_s" in spec and not 0 < spec["timeout_s"] < math.inf:
        raise UsageError(f"{path}: [remote] timeout_s must be a number of seconds more than 0.")
    return RemoteSpec(
        base_url=spec["base_url"].rstrip("/"),
        api_key_env=spec.get("api_key_env", "DEEPLINE_API_KEY"),
        timeout_s=float(spec.get("timeout_s", 60.0)),
        retries=int(spec.get("retries", 5)),
        credits=_remote_credits(path, spec.get("credits", {})),
        proxy=_proxy(path, "[remote]", spec),
    )


def _proxy(path: Path, owner: str, spec: dict[str, Any]) -> str | None:
    """`proxy = "http://proxy.corp:3128"` (or "" to go direct whatever the environment says)."""
    if "proxy" not in spec:
        return None
    value = str(spec["proxy"]).strip()
    if value:
        try:
            Proxy.parse(value)
        except InvalidRequest as exc:
            raise UsageError(f"{path}: {owner} proxy: {exc}.") from None
    return value


def _remote_credits(path: Path, declared: Any) -> dict[str, float]:
    """`credits = 2` (every remote tool) or `credits = { "tool.id" = 2, "*" = 1 }`."""
    table = declared if isinstance(declared, dict) else {"*": declared}
    for tool_id, value in table.items():
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < math.inf:
            raise UsageError(f"{path}: [remote] credits for {tool_id!r} must be a number of credits (0 or more).")
    return {tool_id: float(value) for tool_id, value in table.items()}
