"""Secrets: values from the environment or a `.env` file, redacted wherever they'd show."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from deepline_cli.errors import UsageError

MIN_SECRET_LENGTH = 8  # shorter values (a port, a region) are not treated as secrets
REDACTED = "[redacted]"


def read_dotenv(path: Path) -> dict[str, str]:
    """`KEY=value` lines; `#` comments, `export ` prefixes and quotes are understood."""
    values: dict[str, str] = {}
    if not path.is_file():
        return values
    for raw in path.read_text(encoding="utf-8-sig").splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[name.strip()] = value
    return values


class Secrets:
    def __init__(self, dotenv_dir: Path | None = None) -> None:
        self._dotenv_dir = dotenv_dir
        self._known: set[str] = set()
        self.reload()

    def reload(self) -> None:
        """Read `.env` again (a credential may have been rotated while the run goes on)."""
        self._dotenv = read_dotenv(self._dotenv_dir / ".env") if self._dotenv_dir else {}

    def lookup(self, name: str) -> str | None:
        value = os.environ.get(name, self._dotenv.get(name))
        if value is not None and len(value) >= MIN_SECRET_LENGTH:
            self._known.add(value)
        return value

    def get(self, name: str) -> str:
        value = self.lookup(name)
        if value is None:
            raise UsageError(f"Secret {name} is not set; export it or add it to .env next to the play.")
        return value

    def redact(self, text: str) -> str:
        for value in self._known:
            if value in text:
                text = text.replace(value, REDACTED)
        return text

    def redact_json(self, value: Any) -> Any:
        if not self._known:
            return value
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {k: self.redact_json(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.redact_json(v) for v in value]
        return value
