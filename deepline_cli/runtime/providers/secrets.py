"""Secrets: values from the environment or a `.env` file, redacted wherever they'd show."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from deepline_cli.errors import UsageError

# Shorter values (a port, a region, a PIN) are not redacted: their characters would be
# replaced wherever they appear in answers and data ("2019" in every founding year).
MIN_SECRET_LENGTH = 8
REDACTED = "[redacted]"


def read_dotenv(path: Path) -> dict[str, str]:
    """`KEY=value` lines, read as python-dotenv reads them: `# comments` (inline ones too,
    after a space), `export ` prefixes, single quotes (literal) and double quotes (escapes)."""
    if not path.is_file():
        return {}
    from dotenv import dotenv_values

    return {name: value or "" for name, value in dotenv_values(path, encoding="utf-8-sig").items()}


def encoded_forms(secret: str) -> set[str]:
    """The ways a provider may echo a secret back: as is, URL-encoded, base64 (at any
    alignment in the encoded stream, and inside `user:secret`), and each of those as it
    reads inside a JSON string (`\\"`, `\\/`)."""
    raw = secret.encode()
    forms = {secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret), urllib.parse.quote(secret)}
    for skip in range(3):  # the secret's bytes that share a base64 group with what precedes it
        whole = raw[skip : skip + 3 * ((len(raw) - skip) // 3)]
        forms.add(base64.b64encode(whole).decode())
        forms.add(base64.urlsafe_b64encode(whole).decode())
        # …and ending the encoded text, its last bytes padded (`…Jnk=`)
        forms.add(base64.b64encode(raw[skip:]).decode())
        forms.add(base64.urlsafe_b64encode(raw[skip:]).decode())
    escaped = set()
    for form in forms:
        inside_json = json.dumps(form)[1:-1]
        escaped |= {inside_json, inside_json.replace("/", "\\/")}
    return {form for form in forms | escaped if len(form) >= MIN_SECRET_LENGTH}


def _holds(pattern: re.Pattern[str], value: Any) -> bool:
    """Does a JSON value hold a match of `pattern` in any key or string (walked)?"""
    if isinstance(value, str):
        return pattern.search(value) is not None
    if isinstance(value, dict):
        return any(_holds(pattern, k) or _holds(pattern, v) for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return any(_holds(pattern, v) for v in value)
    if _is_dataclass(value):
        return _holds(pattern, dataclasses.asdict(value))
    return False


def _is_dataclass(value: Any) -> bool:
    """A dataclass's object (written as a JSON object of its fields)."""
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _as_written(forms: set[str]) -> tuple[str, ...] | None:
    """Each form as it reads inside a JSON string orjson writes (its quotes, backslashes and
    control characters escaped); None when one cannot be written (a lone surrogate from a
    value the environment could not decode): every value is then walked."""
    try:
        return tuple({orjson.dumps(form).decode()[1:-1] for form in forms})
    except orjson.JSONEncodeError:
        return None


class Secrets:
    """The secrets a run may use: the environment, then the play folder's `.env`. Every value
    read is remembered so that it is redacted from outputs, errors, logs and receipts."""

    def __init__(self, dotenv_dir: Path | None = None) -> None:
        self._dotenv_dir = dotenv_dir
        self._known: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self._written: tuple[str, ...] | None = ()  # the forms as JSON text holds them (`_as_written`)
        self._short: set[str] = set()  # names of short values asked for (warned of once)
        self.warn: Callable[[str], None] | None = None  # how the run warns (its log)
        self.reload()

    @property
    def env_file(self) -> Path:
        """The `.env` file read besides the environment (where a missing secret can be set)."""
        return (self._dotenv_dir or Path.cwd()) / ".env"

    def reload(self) -> None:
        """Read `.env` again (a credential may have been rotated while the run goes on)."""
        self._dotenv = read_dotenv(self._dotenv_dir / ".env") if self._dotenv_dir else {}

    def lookup(self, name: str) -> str | None:
        """The value of `name`, remembered for redaction (when it is long enough to be a secret),
        and so is it without the spaces or line end around it (`echo key | base64` into a
        cluster's secret leaves a newline; the provider strips it, and echoes the key bare)."""
        value = os.environ.get(name, self._dotenv.get(name))
        if value is None:
            return None
        new = {v for v in (value, value.strip()) if len(v) >= MIN_SECRET_LENGTH} - self._known
        if new:
            self._known |= new
            forms = set().union(*(encoded_forms(known) for known in self._known))
            # One pass over a text for every form; the longest first, so none is half replaced.
            self._pattern = re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)))
            self._written = _as_written(forms)
        return value

    def get(self, name: str) -> str:
        value = self.lookup(name)
        if value is None:
            raise UsageError(f"Secret {name} is not set; export it or add it to {self.env_file}.")
        if len(value) < MIN_SECRET_LENGTH and name not in self._short and self.warn is not None:
            self._short.add(name)
            self.warn(
                f"Secret {name} is shorter than {MIN_SECRET_LENGTH} characters, so it is not redacted: its "
                "characters would be replaced wherever they appear in answers and data"
            )
        return value

    def bearer(self, name: str) -> str:
        """`"Bearer <value>"` for an Authorization header; the value is redacted as `get`'s is."""
        return f"Bearer {self.get(name)}"

    @property
    def active(self) -> bool:
        """Has a secret been read (so there is something to redact)?"""
        return self._pattern is not None

    def redact(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(REDACTED, text)

    def excerpt(self, text: str, limit: int) -> str:
        """The first `limit` characters of `text` as redacted: a secret across the cut is
        replaced whole, not kept in part (a part no longer matches any form). The text is
        read only as far as the excerpt needs."""
        if self._pattern is None:
            return text[:limit]
        parts: list[str] = []
        size = start = 0
        for match in self._pattern.finditer(text):
            parts.append(text[start : match.start()])
            size += match.start() - start
            if size >= limit:  # the excerpt ends before this secret
                break
            parts.append(REDACTED)
            size += len(REDACTED)
            start = match.end()
            if size >= limit:
                break
        else:
            parts.append(text[start : start + limit])
        return "".join(parts)[:limit]

    def holds(self, value: Any) -> bool:
        """Does a JSON value hold a secret anywhere (nothing copied to tell)?"""
        pattern = self._pattern
        if pattern is None:
            return False
        if isinstance(value, dict | list | tuple) and not self._maybe_in(value):
            return False
        return _holds(pattern, value)

    def redact_json(self, value: Any) -> Any:
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.redact(value)
        walked = isinstance(value, dict | list | tuple | set | frozenset) or _is_dataclass(value)
        if walked and self._maybe_in(value):
            return self._redacted(value)
        return value  # a number, or an object or list no secret is in (given back as it is)

    def _redacted(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):  # keys too: a usage endpoint answers {"<api key>": {...}}
            return {self.redact(k) if isinstance(k, str) else k: self._redacted(v) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):  # as JSON writes them: a list
            return [self._redacted(v) for v in value]
        if _is_dataclass(value):  # as JSON writes it: an object of its fields
            return self._redacted(dataclasses.asdict(value))
        return value

    def _maybe_in(self, value: Any) -> bool:
        """Could a secret be in this object or list? Its JSON text (written at C speed) is
        searched for every form of every secret as JSON writes it: a text escapes each
        character on its own, so a form in any key or string is in the text too. No form
        there: nothing to redact, and no walk of every value (a provider's answer of a few
        KB took ~100 µs a walk, and an answer is redacted as it arrives and as it is kept).
        A value JSON cannot write as it is (a key that is not text, an object) is walked."""
        written = self._written
        if written is None:
            return True
        try:
            text = orjson.dumps(value).decode()
        except (TypeError, orjson.JSONEncodeError):
            return True
        return any(form in text for form in written)
