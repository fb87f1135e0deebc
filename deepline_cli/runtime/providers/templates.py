"""Request templates of HTTP tools.

In any string, `{field}` (dotted paths allowed: `{company.domain}`) is replaced by the
input's value; a string that is exactly `"{field}"` takes the raw JSON value; `${NAME}`
is a secret from the environment or `.env`; `{{` and `}}` are literal braces. One pass,
so a value from the input can never expand into a secret.
"""

from __future__ import annotations

import functools
import re
import urllib.parse
from typing import Any

from deepline_cli import _json
from deepline_cli.errors import ToolExecutionError, UsageError
from deepline_cli.runtime.providers.secrets import Secrets

_TOKEN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\{\{|\}\}|\{([A-Za-z_][\w.-]*)\}")
_EXACT_FIELD = re.compile(r"\{([A-Za-z_][\w.-]*)\}")
_MISSING = object()


def references(template: Any) -> tuple[set[str], set[str]]:
    """The `${NAME}` secrets and `{field}` input fields a template (str, dict, list) uses."""
    secrets: set[str] = set()
    fields: set[str] = set()
    if isinstance(template, str):
        for match in _TOKEN.finditer(template):
            if match.group(1):
                secrets.add(match.group(1))
            elif match.group(2):
                fields.add(match.group(2))
    elif isinstance(template, dict | list):
        items = [*template.keys(), *template.values()] if isinstance(template, dict) else template
        for item in items:
            more_secrets, more_fields = references(item)
            secrets |= more_secrets
            fields |= more_fields
    return secrets, fields


def lookup(value: Any, path: str) -> Any:
    current = value
    for part in path.split("."):
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return _MISSING
    return current


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return _json.dumps_str(value)


# A tool's templates are a few strings asked on every call: what each holds is read once.
@functools.lru_cache(maxsize=4096)
def _plain(template: str) -> bool:
    """Does the template hold no token (no field, secret or escaped brace): is it its own value?"""
    return _TOKEN.search(template) is None


@functools.lru_cache(maxsize=4096)
def _exact_field(template: str) -> str | None:
    """The field a template that is exactly `"{field}"` takes whole (its raw JSON value)."""
    exact = _EXACT_FIELD.fullmatch(template)
    return exact.group(1) if exact else None


@functools.lru_cache(maxsize=4096)
def authority_end(url: str) -> int:
    """Where a URL template's scheme and host end and its path (or query) begins."""
    scheme = url.find("://")
    after = scheme + 3 if scheme >= 0 else 0
    ends = [i for i in (url.find(c, after) for c in "/?#") if i >= 0]
    return min(ends) if ends else len(url)


def render_url(template: str, input: Any, secrets: Secrets, *, tool: str) -> str:
    """Fill a tool's `url`: a `{field}` in its path or query is percent-encoded as one path
    segment or one query value (a row's `/`, `?`, `#` or `&` stays inside it, and a path
    segment that is only `.` or `..` is refused); one in its host is put in as it is, for
    `allow_hosts` to check. A `${NAME}` secret (or a field) in its credentials
    (`https://user:${PASS}@host/`) or query is percent-encoded whole, in its path all but
    its `/`: a generated key's `+`, `#` or `@` reaches the provider as it is, and never moves
    the request elsewhere."""
    if _plain(template):
        return template
    return _fill(template, input, secrets, tool, encode_from=authority_end(template))


def render_proxy(template: str, secrets: Secrets, *, tool: str) -> str:
    """A tool's `proxy` with its `${NAME}` secrets: one in the credentials (before `@`) is
    percent-encoded, so a generated password with `#`, `@` or `/` keeps the URL whole."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if not name:
            return match.group(0) if match.group(2) else match.group(0)[0]
        value = _secret(secrets, name, tool)
        return urllib.parse.quote(value, safe="") if match.start() < template.rfind("@") else value

    return _TOKEN.sub(replace, template)


def render(template: Any, input: Any, secrets: Secrets, *, tool: str) -> Any:
    """Fill a template (str, dict or list) from the call's input and the secrets."""
    if isinstance(template, dict):
        return {render(k, input, secrets, tool=tool): render(v, input, secrets, tool=tool) for k, v in template.items()}
    if isinstance(template, list):
        return [render(item, input, secrets, tool=tool) for item in template]
    if not isinstance(template, str) or _plain(template):
        return template
    exact = _exact_field(template)
    if exact is not None:
        return _field(input, exact, tool)
    return _fill(template, input, secrets, tool)


def _fill(template: str, input: Any, secrets: Secrets, tool: str, *, encode_from: int | None = None) -> str:
    """One pass over the template's tokens; fields from `encode_from` on are percent-encoded."""

    credentials_end = template.rfind("@", 0, encode_from) if encode_from is not None else -1

    def replace(match: re.Match[str]) -> str:
        secret, name = match.group(1), match.group(2)
        where = match.start()
        if secret:
            value = _secret(secrets, secret, tool)
            if encode_from is None or credentials_end <= where < encode_from:  # a body, a header, the host
                return value
            # Whole in the credentials and the query; in the path its `/` stays (a webhook's
            # secret path, `T0/B0/XXX`), its `?`, `#` and `%` do not end or change the path.
            in_path = where >= encode_from and "?" not in template[encode_from:where]
            return urllib.parse.quote(value, safe="/" if in_path else "")
        if name:
            text = _text(_field(input, name, tool))
            if encode_from is not None and where < credentials_end:  # a row's value in the credentials
                return urllib.parse.quote(text, safe="")
            if encode_from is None or where < encode_from:
                return text
            if text.strip() in ("", ".", "..") and _whole_segment(template, match):
                raise ToolExecutionError(
                    f"{tool}: the url path segment {{{name}}} is {text!r}, which would name another endpoint",
                    origin="caller", category="validation", retryable=False, tool=tool,
                )  # fmt: skip
            return urllib.parse.quote(text, safe="")
        return match.group(0)[0]  # "{{" → "{", "}}" → "}"

    return _TOKEN.sub(replace, template)


def _secret(secrets: Secrets, name: str, tool: str) -> str:
    value = secrets.lookup(name)
    if value is None:
        raise UsageError(f"Tool {tool!r}: secret {name} is not set; export it or add it to {secrets.env_file}.")
    return value


def _whole_segment(template: str, match: re.Match[str]) -> bool:
    """Is this `{field}` a whole segment of the url's path (`/v1/{id}/emails`)? Blank, `.` or
    `..`, such a segment names another endpoint (`/v1//emails`, the collection, a parent)."""
    before, after = template[: match.start()], template[match.end() : match.end() + 1]
    return "?" not in before and "#" not in before and before.endswith("/") and after in ("", "/", "?", "#")


def _field(input: Any, path: str, tool: str) -> Any:
    value = lookup(input, path)
    if value is _MISSING:
        fields = ", ".join(input) if isinstance(input, dict) else type(input).__name__
        raise UsageError(f"Tool {tool!r}: the template field {path!r} is not in the input (fields: {fields}).")
    return value
