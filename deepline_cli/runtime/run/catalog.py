"""The tools a play file and a config offer, and what each one is (`deepline tools list`,
`tools describe`, `tools execute`): looked at, never called.

A tool id resolves as a run resolves it: the play file's own @tools, then every @tool
loaded, then the HTTP tools of `deepline.toml`, then `[remote]` for any other id.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepline_cli.errors import UsageError
from deepline_cli.runtime.providers.config import Config, HttpToolSpec, RemoteSpec, find_config, load_config
from deepline_cli.runtime.providers.secrets import Secrets
from deepline_cli.runtime.providers.tools import ToolDef, registered_tools
from deepline_cli.runtime.run.play import load_module, split_ref, tools_in


@dataclass
class Catalog:
    """Every tool a run can call: the play's own @tools (and any it borrows) over the ones
    `deepline.toml` declares."""

    config: Config
    local: dict[str, ToolDef]  # @tools: the play file's own over any other loaded
    play_file: Path | None
    secrets: Secrets

    def ids(self) -> list[str]:
        return sorted(set(self.local) | set(self.config.tools))

    def kind(self, tool_id: str) -> str | None:
        if tool_id in self.local:
            return "local"
        if tool_id in self.config.tools:
            return "http"
        return "remote" if self.config.remote is not None else None

    def describe(self, tool_id: str) -> dict[str, Any]:
        """What `tool_id` is, as JSON; an unknown id is a UsageError listing the known ones."""
        kind = self.kind(tool_id)
        if kind == "local":
            return describe_local(self.local[tool_id])
        if kind == "http":
            described = describe_http(self.config.tools[tool_id], self.secrets)
        elif kind == "remote":
            assert self.config.remote is not None
            described = describe_remote(tool_id, self.config.remote, self.secrets)
        else:
            raise UsageError(self._unknown(tool_id))
        described["config"] = str(self.config.path) if self.config.path else None
        # `${NAME}` stays a name; a secret's value written out literally anywhere does not show.
        redacted: dict[str, Any] = self.secrets.redact_json(described)
        return redacted

    def missing_secret(self, tool_id: str) -> str | None:
        """The first credential of an HTTP or remote tool that is not set."""
        listed = self.describe(tool_id).get("secrets") or []
        return next((s["name"] for s in listed if not s["set"]), None)

    def _unknown(self, tool_id: str) -> str:
        known = self.ids()
        if known:
            return f"Unknown tool {tool_id!r}; known tools: {', '.join(known)}."
        where = f"in {self.config.path}" if self.config.path else "here (no deepline.toml found)"
        return f"Unknown tool {tool_id!r}: no tools are declared {where}; pass --config FILE or --play FILE."


def open_catalog(play: str | None, config: str | Path | None, cwd: Path) -> Catalog:
    """The tools of `--play FILE` (its @tools), and of `--config FILE`, else the
    deepline.toml next to the play (the one its runs read), else, with no play, the one in
    `cwd`."""
    base = cwd / "play.py"
    own: dict[str, ToolDef] = {}
    play_file = None
    if play:
        raw = Path(split_ref(play)[0]).expanduser()
        play_file = base = (raw if raw.is_absolute() else cwd / raw).resolve()
        own = tools_in(vars(load_module(play_file)))
    config_path = find_config(base, config)
    folder = play_file.parent if play_file else config_path.parent if config_path else cwd
    return Catalog(load_config(config_path), {**registered_tools(), **own}, play_file, Secrets(folder))


def describe_http(spec: HttpToolSpec, secrets: Secrets) -> dict[str, Any]:
    return {
        "id": spec.id,
        "kind": "http",
        "method": spec.method,
        "url": spec.url,
        "headers": spec.headers,
        "query": spec.query,
        "json": spec.json,
        "fields": spec.field_names(),
        "secrets": _secrets(sorted({*spec.secret_names(), *spec.proxy_secret_names()}), secrets),
        "proxy": _masked_proxy(spec.proxy),
        "credits": spec.credits,
        "rate_limit": spec.rate_limit,
        "concurrency": spec.concurrency,
        "timeout_s": spec.timeout_s,
        "retries": spec.retries,
        "idempotency_header": spec.idempotency_header,
        "batch": spec.batch,
        "extract": spec.extract,
        "version": spec.version,
        "allow_hosts": list(spec.allow_hosts),
    }


def describe_remote(tool_id: str, remote: RemoteSpec, secrets: Secrets) -> dict[str, Any]:
    """A tool id no play or config declares, sent to the `[remote]` execution API."""
    return {
        "id": tool_id,
        "kind": "remote",
        "method": "POST",
        "url": f"{remote.base_url}/v1/tools/{tool_id}/execute",
        "headers": {"Authorization": f"Bearer ${{{remote.api_key_env}}}"},
        "query": {},
        "json": {"tool": tool_id, "payload": "<the whole input>", "metadata": "<run id, receipt and idempotency keys>"},
        "fields": [],
        "secrets": _secrets(remote.secret_names(), secrets),
        "credits": remote.credits_for(tool_id),  # None: what each answer reports
        "rate_limit": None,
        "concurrency": None,
        "timeout_s": remote.timeout_s,
        "retries": remote.retries,
        "idempotency_header": "x-deepline-idempotency-key",
        "batch": None,
        "extract": {},
        "version": "1",
        "allow_hosts": [],
    }


def describe_local(tool: ToolDef) -> dict[str, Any]:
    fn = tool.fn
    try:
        file: str | None = inspect.getsourcefile(fn)
        line = inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        file, line = None, None
    doc = inspect.getdoc(fn)
    signature = inspect.signature(fn)
    return {
        "id": tool.id,
        "kind": "local",
        "module": file or fn.__module__,
        "function": fn.__qualname__,
        "line": line,
        "signature": f"{'async def' if inspect.iscoroutinefunction(fn) else 'def'} {fn.__name__}{signature}",
        "doc": doc.splitlines()[0] if doc else None,
        "takes_call": tool.wants_call,
        "credits": tool.credits,
        "rate_limit": tool.rate_limit,
        "concurrency": tool.concurrency,
        "version": tool.version,
        "batch": tool.batch,
    }


def _masked_proxy(proxy: str | None) -> str | None:
    """The tool's own proxy as written (its `${SECRET}`s as names, never values); a password
    written into the URL itself is masked."""
    if proxy is None:
        return None
    return re.sub(r"://([^:/@]+):(?!\$\{)[^@]*@", r"://\1:***@", proxy)


def _secrets(names: list[str], secrets: Secrets) -> list[dict[str, Any]]:
    return [{"name": name, "set": secrets.lookup(name) is not None} for name in names]
