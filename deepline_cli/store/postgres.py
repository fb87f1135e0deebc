"""The PostgreSQL store: one database shared by every process on every machine.

Claims lock the receipt rows they decide on (`SELECT … FOR UPDATE`), and a key another
process inserted first is decided again, so two machines never both own one receipt.
Lease times come from the database server's clock, so machines' clocks don't matter.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from deepline_cli.backoff import delays
from deepline_cli.errors import (
    StoreConflict,
    StoreConnectionLost,
    StoreError,
    StoreOpenError,
    StoreRefusedConnection,
)
from deepline_cli.store import safe_url
from deepline_cli.store.migrations import MIGRATIONS, POSTGRES, migrate
from deepline_cli.store.records import Claim, Receipt, Settlement
from deepline_cli.store.sql import SqlStore, settle_statement
from deepline_cli.store.sql_rows import (
    CLAIM_INSERT_COLUMNS,
    SETTLE_END,
    claim_row,
)

# psycopg logs what it ignores while a dropped connection is closed (several lines, memory
# addresses) to Python's last-resort handler, on stderr: the store says it in one sentence.
logging.getLogger("psycopg").addHandler(logging.NullHandler())

R = TypeVar("R")

_MIGRATION_LOCK = 7_283_551  # pg_advisory_xact_lock key: one migrating process at a time
OPEN_TRIES = 6  # of the migration check, on a connection that dropped: 0.2, 0.4 … 1.6 s apart


@lru_cache(maxsize=512)
def _pg(sql: str) -> str:
    """The shared SQL uses `?` placeholders; psycopg wants `%s`."""
    return sql.replace("?", "%s")


# psycopg ends a pipeline with a Sync and a Flush, sent together. PostgreSQL runs the
# statements (waiting for row locks as it must), answers the Sync with ReadyForQuery, which
# starts its idle-in-transaction timer, then reads the Flush: a message of its own, which
# stops the timer and starts no other. A process frozen (SIGSTOP, a paused VM) while its
# pipeline waited would hold its row locks until it was resumed or killed. So a transaction
# sends no pipeline on its hot path (`_Tx`, `PostgresStore._settle_all`); where it must (a
# batch of releases, rows a later read names), the pipeline is synced inside (the statements'
# answers end with ReadyForQuery) and a plain statement after it starts the timer again.
_WRITES_TO = re.compile(r"\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+(\w+)", re.IGNORECASE)
_WORDS = re.compile(r"\w+")


@lru_cache(maxsize=512)
def _table_written(sql: str) -> str | None:
    """The table a write names first (None: not recognised, so taken to touch any)."""
    written = _WRITES_TO.match(sql)
    return written.group(1).lower() if written else None


@lru_cache(maxsize=512)
def _words(sql: str) -> frozenset[str]:
    """A statement's words, lower case: every table it may read is among them."""
    return frozenset(_WORDS.findall(sql.lower()))


class _Tx:
    """A transaction's connection, speaking the shared SQL.

    Writes whose results nobody reads (`executemany`) wait, in order, and go out with the
    COMMIT in one pipeline (after it, no transaction is open for a Flush to matter), or
    before a statement that names their table, which may read them: a batch's rows cost one
    round trip, not one per table."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._unsent: list[tuple[str, list[Sequence[Any]], str | None]] = []  # (sql, rows, the table written)
        self._begun = False  # BEGIN goes out with the first statement, where it may (a round trip less)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        """Run now; its rows and rowcount are there on return."""
        if self._unsent and any(table is None or table in _words(sql) for _, _, table in self._unsent):
            self._in_pipeline(lambda: None)  # the rows it may read go first; it starts the timer again
        elif not self._begun and "%b" not in sql:
            # BEGIN and the first statement (a batch's fencing check) in one round trip: one
            # simple query, its values written in by psycopg, answered by one ReadyForQuery that
            # starts the server's idle timer as any statement's does (a pipeline's Flush would
            # stop it: a process frozen after it would keep its transaction open for good).
            # Binary parameters (arrays) cannot be written in: BEGIN goes first on its own.
            self._begun = True
            text = psycopg.ClientCursor(self._conn).mogrify(_pg(sql), _no_nul(params))
            cursor = self._conn.execute("BEGIN; " + text)
            cursor.nextset()  # the SELECT's rows, after BEGIN's empty result
            return cursor
        self._begin()
        return self._conn.execute(_pg(sql), _no_nul(params))

    def _begin(self) -> None:
        if not self._begun:
            self._begun = True
            self._conn.execute("BEGIN")

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Sent with the COMMIT, or before a statement that names the table (an error in it
        is raised there, and fails the transaction as it would have here)."""
        self._unsent.append((_pg(sql), [_no_nul(row) for row in rows], _table_written(sql)))

    def changed_each(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[bool]:
        """Run UPDATEs in one pipeline (one round trip, not one each); which changed a row."""
        cursors = self._in_pipeline(
            lambda: [self._conn.execute(_pg(sql), _no_nul(params)) for sql, params in statements]
        )
        self._conn.execute("SELECT 1")  # a plain statement: the server's idle timer runs again
        return [cursor.rowcount == 1 for cursor in cursors]

    def commit(self) -> None:
        """The writes waiting, then COMMIT: one round trip (none where nothing was sent)."""
        if not self._unsent:
            if self._begun:
                self._conn.execute("COMMIT")
            return
        with self._conn.pipeline():
            self._send()
            self._conn.execute("COMMIT")

    def _in_pipeline(self, work: Callable[[], R]) -> R:
        """The writes waiting, then `work`, in one pipeline inside the transaction, synced
        before it ends (see above); the caller's next statement must be a plain one."""
        with self._conn.pipeline() as pipeline:
            self._send()
            done = work()
            pipeline.sync()
        return done

    def _send(self) -> None:
        """BEGIN if not sent yet, then the writes waiting (inside a pipeline)."""
        self._begin()
        unsent, self._unsent = self._unsent, []
        with self._conn.cursor() as cur:
            for sql, rows, _ in unsent:
                cur.executemany(sql, rows)


def _cut(conn: psycopg.Connection[Any], exc: BaseException) -> bool:
    """A connection the server ended that psycopg has not marked broken yet: inside a
    pipeline (a batch of settlements) it says "cannot exit pipeline mode while busy" first.
    Taken as a dropped connection: reconnected, and the transaction run again."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    try:
        bad = conn.pgconn.status == pq.ConnStatus.BAD
    except Exception:  # no libpq connection left to ask
        return True
    return bad or "pipeline mode" in str(exc)


_WRONG_URL = ("does not exist", "authentication failed", "no pg_hba.conf entry", "permission denied")


def _refused_login(exc: BaseException) -> bool:
    """The server answered the connection and refused it for good (psycopg gives no SQLSTATE
    at connect: libpq's FATAL line says why; one in another language is taken as transient)."""
    text = str(exc)
    return "FATAL:" in text and any(words in text for words in _WRONG_URL)


def _reason(exc: BaseException) -> str:
    """psycopg's message, first line (the rest is hints for a person at a psql prompt)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _no_nul(params: Sequence[Any]) -> Sequence[Any]:
    """PostgreSQL text cannot hold NUL; one in a log line must not sink a whole batch. Reads
    ask with the same text (a row key with a NUL is found as it was written)."""
    if any(isinstance(p, str) and "\x00" in p for p in params):
        return [p.replace("\x00", "\ufffd") if isinstance(p, str) else p for p in params]
    return params


def _schema_of_its_own(c: _Tx, url: str) -> bool:
    """The schema deepline keeps its tables in (the first of the URL's search_path that
    exists and may be used): refused when there is none, or when it holds tables (or views)
    and no deepline migrations: another program's (its own `runs` or `events` would be taken
    for deepline's). Tables an extension made (PostGIS's `spatial_ref_sys`) are not counted.
    Whether deepline's `_migrations` table is there already."""
    said = c.execute("SELECT current_schema(), current_setting('search_path'), current_user").fetchall()
    schema, path, user = said[0]
    if schema is None:
        raise StoreOpenError(
            f"The store {url} has no schema to keep its tables in: no schema of its search_path ({path}) exists "
            f"or may be used by {user}; CREATE SCHEMA (and GRANT USAGE, CREATE ON it to {user}), or fix the URL."
        )
    names = [
        name
        for (name,) in c.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v', 'm', 'f')"
            " AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = c.oid AND d.deptype = 'e')"
            " ORDER BY c.relname"
        ).fetchall()
    ]
    if "_migrations" in names and _ours(c):
        return True
    if names:
        shown = ", ".join(names[:5]) + (", …" if len(names) > 5 else "")
        first = path.split(",")[0].strip().strip('"')
        passed = f" (schema {first} of its search_path does not exist or may not be used by {user})"
        add = "&" if "?" in url else "?"
        raise StoreOpenError(
            f"The store {url} is another program's database (tables {shown} in schema {schema}"
            f"{passed if first not in (schema, '$user') else ''}), not a deepline store; give deepline a "
            "database of its own, or a schema of its own: CREATE SCHEMA deepline, then add "
            f"{add}options=-csearch_path%3Ddeepline to the URL."
        )
    return False


def _ours(c: _Tx) -> bool:
    """Is this schema's `_migrations` deepline's (it lists deepline's first migration)?"""
    named = c.execute(
        "SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema()"
        " AND table_name = '_migrations' AND column_name = 'name'"
    ).fetchall()
    if not named[0][0]:
        return False
    return bool(c.execute("SELECT count(*) FROM _migrations WHERE name = ?", (MIGRATIONS[0][0],)).fetchall()[0][0])


CHANNEL = "deepline_work"  # NOTIFY channel: new queued runs, delivered events


# A process frozen inside a transaction (SIGSTOP, a paused VM, a debugger) keeps its row
# locks, and every other process touching those rows waits for it. The store's transactions
# never sit idle for more than milliseconds; past this the server ends such a session (its
# locks go with it), and the frozen process, when it wakes, finds its connection gone and
# its run taken over.
IDLE_IN_TRANSACTION_S = float(os.environ.get("DEEPLINE_PG_IDLE_IN_TRANSACTION_S", "10"))


# How a connection to a server that stopped answering is found dead, unless the URL says
# otherwise: a connect that gets no answer gives up (psycopg's own default is 130 s); an idle
# connection, or one waiting for an answer, is probed by TCP keepalives; data the network
# never acknowledges fails the connection (a dropped route, a VPN gone). A server that
# still acknowledges but never answers is only ended by a stop (StoreIO.unstick).
CONNECT_TIMEOUT_S = 10
HURRIED_CONNECT_TIMEOUT_S = 2  # libpq's least
_DEAD_PEER = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "tcp_user_timeout": 60_000,  # ms
}


def _connect(url: str, hurry: bool = False) -> psycopg.Connection[Any]:
    given = conninfo_to_dict(url)
    extra: dict[str, Any] = {name: value for name, value in _DEAD_PEER.items() if name not in given}
    if hurry:
        extra["connect_timeout"] = HURRIED_CONNECT_TIMEOUT_S
    elif "connect_timeout" not in given:
        extra["connect_timeout"] = CONNECT_TIMEOUT_S
    conn = psycopg.connect(url, autocommit=True, **extra)
    conn.execute(f"SET idle_in_transaction_session_timeout = {int(IDLE_IN_TRANSACTION_S * 1000)}")
    # psycopg prepares a statement run five times; PostgreSQL then may keep one generic plan
    # for it, costed when the tables were empty (a run's first batches): a sequential scan of
    # receipts and sheet rows per batch, ever slower as they fill (a 20,000-row map took
    # 12.4 s instead of 5.9 s). Each execution is planned with its own values instead.
    conn.execute("SET plan_cache_mode = force_custom_plan")
    return conn


# SETTLE_END for many calls at once: the arrays are SETTLE_END's parameters in its order
# (status … completed_at, the generation's bump, key, lease), one element per settlement. They go
# in binary (`%b`): in text, psycopg escapes each quote of the JSON answers in Python, ~0.7 µs
# apiece, inside the transaction (a 40 MB answer of quotes took longer than the server's
# idle-in-transaction bound, and was never settled).
SETTLE_ENDS = (
    "UPDATE receipts AS r SET status = u.status, output = u.output, error = u.error,"
    " failure_kind = u.failure_kind, retryable = u.retryable, credits = u.credits, completed_at = u.completed_at,"
    " generation = r.generation + u.bump, lease_expires_at = NULL"
    " FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::int[], %b::float8[], %b::float8[], %b::int[],"
    " %b::text[], %b::text[]) AS u(status, output, error, failure_kind, retryable, credits, completed_at, bump,"
    " key, lease_id)"
    " WHERE r.key = u.key COLLATE \"C\" AND r.lease_id = u.lease_id AND r.status = 'running'"
    " RETURNING r.key, r.lease_id"
)

# A batch's new receipts in one statement over arrays, one per value of `claim_row`, in key
# order (rows lock in one order). As one row of parameters each, a batch of 16 claims was
# 208 parameters: psycopg parses and converts a statement of over 50 anew on every call
# (~1 ms of Python, holding the interpreter lock the event loop needs), and the server plans
# it anew: 2.3 ms a batch, its slowest step. This text is the same for every batch.
CLAIM_INSERTS = (
    f"INSERT INTO receipts ({CLAIM_INSERT_COLUMNS})"
    " SELECT c.kind, c.label, c.tool, c.run_id, c.attempt, c.lease_id, c.lease_expires_at, c.idempotency_key,"
    " c.created_at, c.batch_key, c.request, c.description, c.input, c.key, 'running', 0, 0"
    " FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::int[], %b::text[], %b::float8[],"
    " %b::text[], %b::float8[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[])"
    " AS c(kind, label, tool, run_id, attempt, lease_id, lease_expires_at, idempotency_key, created_at,"
    " batch_key, request, description, input, key)"
    ' ORDER BY c.key COLLATE "C"'
    " ON CONFLICT (key) DO NOTHING RETURNING key"
)
_FLOAT_COLUMNS = (6, 8)  # lease_expires_at, created_at; attempt is the one integer, the rest are text
_INT_COLUMN = 4


class PostgresStore(SqlStore):
    """The store on PostgreSQL: row locks instead of SQLite's single writer, SKIP LOCKED for
    workers claiming runs, LISTEN/NOTIFY to wake them."""

    row_lock = " FOR UPDATE"
    skip_locked = " FOR UPDATE SKIP LOCKED"

    def __init__(self, url: str) -> None:
        self.url = safe_url(url)
        self._dsn = url
        try:
            self._conn: psycopg.Connection[Any] = _connect(url)
        except psycopg.Error as exc:
            said = f"Cannot connect to the store {self.url}: {_reason(exc)}."
            # The server answered that the URL is wrong (no such database or role, a refused
            # login): fixing it is the user's (exit 2), not a server that may come back.
            raise (StoreOpenError if _refused_login(exc) else StoreRefusedConnection)(said) from None
        # One connection, used from the runtime's store thread and the main thread.
        self._lock = threading.RLock()
        try:
            self._open()
        except BaseException:
            self._conn.close()
            raise

    def _open(self) -> None:
        """The migration check, tried again on a new connection when this one dropped (the
        server ended the session of a process paused while it waited here, or it blipped):
        OPEN_TRIES tries over a few seconds, as a store call's reconnects are, then the loss is said."""
        lost: StoreConnectionLost | None = None
        for delay in delays(0.1, tries=OPEN_TRIES):
            if lost is not None:
                time.sleep(delay)
                with contextlib.suppress(StoreConnectionLost):  # not yet: the next try says so
                    self.reconnect()
            try:
                return self._migrate()
            except StoreConnectionLost as exc:
                lost = exc
        assert lost is not None
        raise lost

    def _migrate(self) -> None:
        made: bool | None = None  # whether deepline's tables are there (known once checked)
        try:
            with self._write() as c:
                c.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
                made = _schema_of_its_own(c, self.url)
                migrate(c, POSTGRES, self.url, has_table=made)
        except StoreError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.InsufficientPrivilege):
                raise
            user, schema = self._read("SELECT current_user, current_schema()")[0]
            why = _reason(exc.__cause__)
            if made:
                raise StoreOpenError(
                    f"The store {self.url} needs its tables brought up to this deepline's, which {user} may not do "
                    f"({why}); run any deepline command on it once as a role that owns them (the one that made "
                    "them), then again as this one."
                ) from None
            raise StoreOpenError(
                f"The store {self.url} has no deepline tables in schema {schema} yet, and {user} may not make them "
                f"({why}); GRANT CREATE ON SCHEMA {schema} TO {user}, or make the store once as a role that may."
            ) from None

    def notify(self) -> None:
        with self._lock, self._errors("written"):
            self._conn.execute(f"NOTIFY {CHANNEL}")

    def try_now(self, work: Callable[[], R]) -> tuple[bool, R | None]:
        return False, None  # every statement is a round trip: never on the event loop

    def wait_for_notify(self, timeout_s: float) -> bool | None:
        """Block until a NOTIFY on the work channel (True) or the timeout (False)."""
        with self._lock, self._errors("read"):
            self._conn.execute(f"LISTEN {CHANNEL}")
            for _ in self._conn.notifies(timeout=timeout_s, stop_after=1):
                return True
            return False

    def reconnect(self, hurry: bool = False) -> None:
        """A new connection in place of one that dropped (StoreConnectionLost if it can't)."""
        with self._lock:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            try:
                self._conn = _connect(self._dsn, hurry)
            except psycopg.Error as exc:
                raise StoreConnectionLost(f"The store {self.url} is unreachable: {_reason(exc)}.") from None

    def abort(self) -> None:
        """Shut the connection's socket down under whatever waits on it (not taking the lock
        that thread holds): its statement fails at once, as a dropped connection does."""
        with contextlib.suppress(OSError, psycopg.Error, ValueError):
            sock = socket.socket(fileno=os.dup(self._conn.fileno()))
            try:
                sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.close()

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """psycopg's errors as the store's: a dropped connection is told apart (it may pass)."""
        try:
            yield
        except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as exc:
            raise StoreConflict(f"The store {self.url} aborted a transaction: {_reason(exc)}.") from exc
        except psycopg.Error as exc:
            if self._conn.closed or self._conn.broken or _cut(self._conn, exc):
                raise StoreConnectionLost(f"The store {self.url} dropped the connection: {_reason(exc)}.") from exc
            raise StoreError(f"The store {self.url} could not be {doing}: {_reason(exc)}.") from exc

    def _settle_all(self, c: Any, settlements: Sequence[Settlement], now: float) -> list[bool]:
        """The calls that ended (SETTLE_END, nearly all) in one statement over arrays, each
        applied where its lease is current (RETURNING says which); any other (a release, a
        skip) in a pipeline. The keys were locked in order already (`_load_for_update`)."""
        statements = [settle_statement(s, now) for s in settlements]
        ends = [i for i, (sql, _) in enumerate(statements) if sql is SETTLE_END]
        if len({(s.key, s.lease_id) for s in settlements}) < len(settlements):
            ends = []  # a lease settled twice in one batch: each on its own, in order
        applied = [False] * len(settlements)
        if ends:
            sent = [list(_no_nul(values)) for values in zip(*(statements[i][1] for i in ends), strict=True)]
            *_, credits, _, _, keys, leases = sent  # (… credits, completed_at, bump, key, lease): as written
            credits[:] = [None if v is None else float(v) for v in credits]  # one array type
            changed = {tuple(row) for row in c.execute(SETTLE_ENDS, sent).fetchall()}
            for i, key, lease in zip(ends, keys, leases, strict=True):
                applied[i] = (key, lease) in changed
        ended = set(ends)
        rest = [i for i in range(len(statements)) if i not in ended]
        if rest:
            for i, ok in zip(rest, c.changed_each([statements[i] for i in rest]), strict=True):
                applied[i] = ok
        return applied

    def _insert_claims(
        self, c: Any, inserts: list[tuple[int, Claim, Receipt]], now: float
    ) -> list[tuple[int, Claim, Receipt]]:
        """Insert new receipts (CLAIM_INSERTS); return the ones that lost a race to another process."""
        if not inserts:
            return []
        rows = [claim_row(claimed) for _, _, claimed in inserts]
        columns = [list(_no_nul(values)) for values in zip(*rows, strict=True)]
        for i, column in enumerate(columns):  # one element type an array (a play's description may be a number)
            cast = float if i in _FLOAT_COLUMNS else int if i == _INT_COLUMN else str
            columns[i] = [v if v is None or isinstance(v, cast) else cast(v) for v in column]
        inserted = {row[0] for row in c.execute(CLAIM_INSERTS, columns).fetchall()}
        return [item for item in inserts if item[1].key not in inserted]

    def _as_stored(self, text: str) -> str:
        return text.replace("\x00", "\ufffd")  # as `_no_nul` writes it

    def _in_texts(self, column: str, values: Sequence[str]) -> tuple[str, list[Any]]:
        """One array: a statement of a mark per value, over 50, is parsed and converted anew by
        psycopg on every call (a sheet read of 400 row keys: ~7 ms), and planned anew by the server."""
        return f"{column} = ANY(%b::text[])", [list(_no_nul(list(values)))]

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def now(self) -> float:
        """The database server's clock: every machine's leases are measured by it."""
        return float(self._read("SELECT extract(epoch from clock_timestamp())")[0][0])

    @contextmanager
    def _write(self) -> Iterator[_Tx]:
        with self._lock, self._errors("written"):
            try:
                tx = _Tx(self._conn)
                yield tx
                tx.commit()
            except BaseException:
                self._roll_back()
                raise

    def _roll_back(self) -> None:
        """End a transaction that failed; a connection that is gone has none left to end."""
        conn = self._conn
        if conn.closed or conn.broken:
            return
        with contextlib.suppress(psycopg.Error):
            if conn.info.transaction_status != pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock, self._errors("read"):
            return self._conn.execute(_pg(sql), _no_nul(params)).fetchall()  # a key as written
