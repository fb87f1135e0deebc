"""Stores: where runs, receipts, sheets and logs live. `open_store` picks the backend."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from deepline_cli.errors import NoStoreError, StoreOpenError, UsageError
from deepline_cli.store.roles import Store


def default_store_path() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("deepline", appauthor=False)) / "deepline.db"


def safe_url(url: str) -> str:
    """The URL without its password (`user:password@`, also in a URL missing a slash, or
    libpq's `password=`), for messages."""
    url = re.sub(r"(:/*[^:/@\s]+):[^@\s]*@", r"\1:***@", url)
    return re.sub(r"((?:^|[?&\s])(?:ssl)?password\s*=\s*)[^&#\s]*", r"\1***", url, flags=re.IGNORECASE)


def _is_file(target: str) -> bool:
    try:
        return Path(target).expanduser().exists()
    except (OSError, ValueError):  # a name too long for a file (a keyword string's long token)
        return False


def _shown(target: str) -> str:
    """A store target as a message shows it: without a password where it looks like a URL
    (`postgresql:/u:pw@host`, a slash missing), as it is where it is a path (`…12:30:00@x.db`)."""
    return safe_url(target) if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:/", target) else target


def resolve_store_url(url: str | None) -> str:
    """--store, else DEEPLINE_STORE, else deepline.db in the user data directory."""
    return url or os.environ.get("DEEPLINE_STORE") or str(default_store_path())


_CONNINFO = re.compile(  # libpq's `host=db sslmode=require …`
    r"^\s*(host|hostaddr|port|dbname|user|password|passfile|channel_binding|connect_timeout|client_encoding|options"
    r"|application_name|fallback_application_name|keepalives\w*|replication|gssencmode|sslmode|sslnegotiation"
    r"|sslcompression|sslcert|sslkey|sslpassword|sslcertmode|sslrootcert|sslcrl\w*|sslsni|requirepeer"
    r"|ssl_min_protocol_version|ssl_max_protocol_version|krbsrvname|gsslib|gssdelegation|service"
    r"|target_session_attrs|load_balance_hosts)\s*=",
    re.IGNORECASE,
)


def open_store(url: str | None = None, *, existing: bool | Literal["folder"] = False) -> Store:
    """Open the store at a path, `sqlite:///path` or `postgresql://…` URL. `existing`: for
    commands that only read, a store file that is not there (a mistyped --store, or nothing
    has run yet) is refused (NoStoreError), not created and shown empty ("folder": only a
    named store in a folder that is not there is refused, for a plan made before a store's
    first run)."""
    target = resolve_store_url(url)
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", target)
    if scheme and scheme.group(1).lower() not in ("sqlite", "postgresql", "postgres"):
        raise UsageError(
            f"Unknown store scheme {scheme.group(1)!r} in {safe_url(target)!r}; use a path, sqlite:///path or "
            "postgresql://…"
        )
    if scheme:  # `SQLITE:///x.db`, `PostgreSQL://…`: the scheme in any case
        target = scheme.group(1).lower() + target[len(scheme.group(1)) :]
    elif _CONNINFO.match(target) and not _is_file(target):  # not echoed: it may hold a password
        raise UsageError(
            "The store looks like a PostgreSQL keyword connection string (host=… dbname=…); give it as a URL: "
            "postgresql://user:password@host:5432/dbname."
        )
    if target.startswith(("postgresql://", "postgres://")):
        try:
            from deepline_cli.store.postgres import PostgresStore
        except ImportError:
            raise UsageError("PostgreSQL stores need psycopg: pip install 'deepline-cli[postgres]'.") from None
        return PostgresStore(target)
    as_url = target.startswith("sqlite:///")
    if as_url:
        target = target[len("sqlite:///") :]
        if "?" in target:  # `?mode=ro`: a URI's options, which a store file name would silently take in
            raise UsageError(
                f"The store URL {safe_url(target)!r} has options (after '?'); deepline takes none: give the path."
            )
    elif target.startswith("sqlite:"):
        raise UsageError(f"The store URL {_shown(target)!r} is not valid; use sqlite:///path/to/file.db.")
    from deepline_cli.store.sqlite import SQLiteStore

    path = Path(target).expanduser()
    named = url or os.environ.get("DEEPLINE_STORE")
    if existing and not path.exists():
        if named and not path.parent.is_dir():
            raise UsageError(
                f"There is no store at {_shown(str(path))}: the folder {_shown(str(path.parent))} does not "
                "exist. Check --store (or "
                "DEEPLINE_STORE); a run creates its store."
            )
        if existing is True:
            raise NoStoreError(_shown(str(path)))
    if named and not existing and not path.parent.is_dir():
        raise StoreOpenError(_no_folder(path, as_url))
    return SQLiteStore(path)


def _no_folder(path: Path, as_url: bool) -> str:
    """A named store whose folder is not there: a typo, or a path meant absolute, would
    otherwise start a new, empty store in a folder made for it (every call paid again)."""
    said = f"The store's folder {_shown(str(path.parent))} does not exist"
    if as_url and not path.is_absolute():
        absolute = "sqlite:///" + str(Path("/") / path)
        return (
            f"{said} (sqlite:///{_shown(str(path))} is a path relative to the current folder; an absolute path "
            f"takes a fourth slash: {_shown(absolute)}). Check --store (or DEEPLINE_STORE)."
        )
    return f"{said}; create it first, or check --store (or DEEPLINE_STORE)."


__all__ = ["Store", "default_store_path", "open_store", "resolve_store_url", "safe_url"]
