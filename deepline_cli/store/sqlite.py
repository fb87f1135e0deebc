"""The SQLite store: one file, several processes, WAL.

Every write is one `BEGIN IMMEDIATE` transaction; the runtime batches claims and
settlements so a transaction carries many calls (group commit).
"""

from __future__ import annotations

import fcntl
import functools
import os
import socket
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from typing import Any, TypeVar

from deepline_cli.backoff import delays
from deepline_cli.errors import StoreError, StoreLockedError, StoreLostError, StoreOpenError
from deepline_cli.store.migrations import MIGRATIONS, SQLITE, migrate
from deepline_cli.store.records import Claim, Receipt, Settlement
from deepline_cli.store.sql import CLAIM_INSERT_COLUMNS, CLAIM_ROW, SqlStore, claim_row, settle_statement

R = TypeVar("R")

# sqlite3 binds int, float and str at once but sends None and bool through its adapter
# lookup, which raises and discards two AttributeErrors per parameter: ~5% of a map row's
# CPU (a receipt row holds a dozen NULLs). An adapter for each (both C callables, binding
# exactly what sqlite3 binds without one) answers from its registry instead.
_NULL: dict[None, None] = {}
sqlite3.register_adapter(type(None), _NULL.get)  # None -> None: bound as NULL
sqlite3.register_adapter(bool, int)  # True -> 1, as sqlite3 binds a bool anyway


class WouldWait(Exception):
    """(`SQLiteStore.try_now`) the work would have to wait for a lock; nothing was written."""


def configure(conn: sqlite3.Connection) -> None:
    """Connection pragmas, in one place.

    - WAL: readers (`runs list`, `receipts inspect`) never block the running play.
    - synchronous=NORMAL: in WAL mode a committed transaction survives a crash or
      SIGKILL of the process; only an OS crash or power loss can drop the last commits.
    - busy_timeout: several processes may share one file; wait for the writer lock
      (DEEPLINE_SQLITE_BUSY_S seconds, 30 by default), then say who holds it.
    """
    conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s() * 1000)}")
    _enable_wal(conn)
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA temp_store=MEMORY")
    conn.execute("PRAGMA cache_size=-65536")
    # Checkpoints (copying the WAL into the file) are what fsyncs; with a run committing
    # hundreds of batches a second, one every ~40 MB of WAL instead of every 4 MB.
    conn.execute("PRAGMA wal_autocheckpoint=10000")


def busy_timeout_s() -> float:
    return float(os.environ.get("DEEPLINE_SQLITE_BUSY_S", "30"))


# In WAL mode SQLite takes the write lock as a POSIX lock on byte 120 of the -shm file
# (WALINDEX_LOCK_OFFSET + WAL_WRITE_LOCK): F_GETLK there names the process that holds it.
_WAL_WRITE_LOCK_BYTE = 120
ROWS_PER_INSERT = 64  # rows in one INSERT (17 parameters each at most: far below the 32,766 allowed)


@functools.lru_cache(maxsize=256)
def _values(head: str, row: str, tail: str, count: int) -> str:
    """An INSERT of `count` rows (built once: a batch writes the same few shapes)."""
    return f"{head} VALUES {', '.join([row] * count)}{tail}"


def write_lock_holder(path: str) -> int | None:
    """The pid of the process on this machine holding the store's write lock, if any."""
    try:
        fd = os.open(path + "-shm", os.O_RDONLY)
    except OSError:
        return None
    try:
        asked = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, _WAL_WRITE_LOCK_BYTE, 1, 0)
        kind, _, _, _, pid = struct.unpack("hhqqi", fcntl.fcntl(fd, fcntl.F_GETLK, asked))
    except OSError:
        return None
    finally:
        os.close(fd)
    return pid if kind != fcntl.F_UNLCK and pid > 0 else None


def _enable_wal(conn: sqlite3.Connection) -> None:
    # Switching a brand-new file to WAL can fail at once with "database is locked" when
    # several processes open it together (the busy timeout does not cover it): retry.
    for wait in (*delays(0.02, factor=1, tries=49), None):
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or wait is None:
                raise
            time.sleep(wait)


def _not_another_programs(conn: sqlite3.Connection, path: str) -> None:
    """A SQLite file with tables and no deepline migrations is another program's database:
    refused before anything is written to it (WAL, deepline's tables)."""
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    if tables and not ("_migrations" in tables and _ours(conn)):
        shown = ", ".join(tables[:5]) + (", …" if len(tables) > 5 else "")
        raise StoreOpenError(
            f"The file {path} is another program's database (tables {shown}), not a deepline store; "
            "give a new file or an existing store with --store."
        )


def _ours(conn: sqlite3.Connection) -> bool:
    """Is this file's `_migrations` deepline's (it lists deepline's first migration)?"""
    try:
        return conn.execute("SELECT 1 FROM _migrations WHERE name = ?", (MIGRATIONS[0][0],)).fetchone() is not None
    except sqlite3.Error:  # another program's table of that name
        return False


def _identity(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


class SQLiteStore(SqlStore):
    """The store in one SQLite file (WAL): one writer at a time, readers never blocked;
    opened without a lock, so a busy file names the process holding it."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.url = f"sqlite:///{self.path}"
        if Path(self.path).is_dir():
            raise StoreOpenError(f"Cannot open the store {self.path}: it is a directory; give a file path.")
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except (sqlite3.Error, OSError) as exc:
            raise StoreOpenError(f"Cannot open the store {self.path}: {exc}.") from exc
        try:
            _not_another_programs(self._conn, self.path)
            configure(self._conn)
            self._migrate()
        except BaseException as exc:
            self._conn.close()
            if (isinstance(exc, sqlite3.DatabaseError) and "not a database" in str(exc)) or "malformed" in str(exc):
                raise StoreOpenError(
                    f"The store {self.path} is not a deepline store: not a SQLite database, or a damaged one."
                ) from exc
            if isinstance(exc, sqlite3.Error):
                raise StoreOpenError(f"Cannot open the store {self.path}: {exc}.") from exc
            raise
        # One connection, used from the runtime's store thread and the main thread.
        self._lock = threading.RLock()
        self._identity = _identity(self.path)
        self._logs: dict[str, tuple[int, int] | None] = {"-wal": None, "-shm": None}  # known once they exist
        self._nowait = False  # inside `try_now` before its first commit: a lock to wait for is WouldWait
        # Whether the connection waits for a lock (busy_timeout), or gives up at once (0) as
        # `try_now` has it. Set back only when a caller that may wait comes (`_waits_as_usual`):
        # the loop's batches follow one another in `try_now`, and each PRAGMA costs ~25 µs.
        self._waiting = True

    def try_now(self, work: Callable[[], R]) -> tuple[bool, R | None]:
        """Run `work` in this thread at once when nothing makes it wait: (True, its result).
        (False, None), with nothing of it written, when another thread is using the store or
        another process holds the write lock: then run it where waiting is allowed (the
        runtime's store thread). A local file answers in microseconds; a hop to another
        thread costs more than that, and the event loop stays free to hear Ctrl-C."""
        if not self._lock.acquire(blocking=False):
            return False, None
        try:
            if self._waiting:
                self._conn.execute("PRAGMA busy_timeout=0")
                self._waiting = False
            self._nowait = True
            try:
                return True, work()
            except WouldWait:
                return False, None
        finally:
            self._nowait = False
            self._lock.release()

    def _waits_as_usual(self) -> None:
        """Before a statement (the lock held): outside `try_now`'s no-wait mode (or after its
        first commit), the connection waits for a lock as every caller does."""
        if not self._nowait and not self._waiting:
            self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s() * 1000)}")
            self._waiting = True

    def _waited(self, exc: sqlite3.Error) -> None:
        """Inside `try_now`, before anything was committed: a lock to wait for hands the work
        to a thread that may wait (WouldWait)."""
        if self._nowait and ("locked" in str(exc) or "busy" in str(exc)):
            raise WouldWait() from exc

    def _migrate(self) -> None:
        """Bring the schema up to date. A store already current is opened without the write
        lock (its `user_version` says so), so a reader never waits for a writer, even one
        stopped while it held the lock."""
        conn = self._conn
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == len(MIGRATIONS) and self._applied() == len(MIGRATIONS):
            return
        if version > len(MIGRATIONS):
            raise StoreError(f"The store {self.path} was written by a newer deepline; upgrade deepline to open it.")
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise self._locked(exc) from exc
        try:
            migrate(conn, SQLITE, self.path)
            conn.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _applied(self) -> int:
        """How many migrations the store lists as applied (a read: no lock)."""
        try:
            return int(self._conn.execute("SELECT count(*) FROM _migrations").fetchone()[0])
        except sqlite3.OperationalError:  # no such table: a new file
            return 0

    def _locked(self, exc: sqlite3.Error) -> StoreError:
        """The error for a write that waited for the lock in vain, naming who holds it."""
        if "locked" not in str(exc) and "busy" not in str(exc):
            return StoreError(f"The store {self.path} could not be written: {exc}.")
        pid = write_lock_holder(self.path)
        who = "another process"
        if pid is not None:
            who = f"process {pid} on this machine ({socket.gethostname()})"
            runs = self._runs_held_by(pid)
            if runs:
                who += f", running {', '.join(runs)}"
        hint = f"continue it (kill -CONT {pid}) or end it, then try again" if pid else "try again when it is done"
        return StoreLockedError(
            f"The store {self.path} is locked by {who}, which has held its write lock for over "
            f"{busy_timeout_s():g}s (it may be stopped: Ctrl-Z, a debugger, a closed laptop); {hint}."
        )

    def _runs_held_by(self, pid: int) -> list[str]:
        try:
            rows = self._conn.execute(
                "SELECT run_id FROM runs WHERE holder LIKE ? AND status = 'running' ORDER BY updated_at DESC LIMIT 3",
                (f"{socket.gethostname()}:{pid}:%",),
            ).fetchall()
            rows += self._conn.execute(
                "SELECT run_id FROM runs WHERE holder = ? AND status = 'running' LIMIT 3",
                (f"{socket.gethostname()}:{pid}",),
            ).fetchall()
        except sqlite3.Error:
            return []
        return [r[0] for r in rows]

    def _insert_claims(
        self, c: Any, inserts: list[tuple[int, Claim, Receipt]], now: float
    ) -> list[tuple[int, Claim, Receipt]]:
        # BEGIN IMMEDIATE holds the only write lock: no other process can have inserted
        # these keys since we read them, so a plain batch insert is enough (and faster).
        self._insert(
            c, f"INSERT INTO receipts ({CLAIM_INSERT_COLUMNS})", CLAIM_ROW, "", [claim_row(cl) for _, _, cl in inserts]
        )
        return []

    def _insert(self, c: Any, head: str, row: str, tail: str, rows: Sequence[Sequence[Any]]) -> None:
        """Up to ROWS_PER_INSERT rows in one statement: SQLite runs its rows one after the
        other as separate statements would (an upsert sees the rows before it), at a fraction
        of the cost of a statement each."""
        for start in range(0, len(rows), ROWS_PER_INSERT):
            part = rows[start : start + ROWS_PER_INSERT]
            c.execute(_values(head, row, tail, len(part)), list(chain.from_iterable(part)))

    def _insert_returning(
        self, c: Any, head: str, row: str, tail: str, rows: Sequence[Sequence[Any]]
    ) -> list[tuple[Any, ...]] | None:
        returned: list[tuple[Any, ...]] = []
        for start in range(0, len(rows), ROWS_PER_INSERT):
            part = rows[start : start + ROWS_PER_INSERT]
            returned += c.execute(_values(head, row, tail, len(part)), list(chain.from_iterable(part))).fetchall()
        return returned

    def _settle_all(self, c: Any, settlements: Sequence[Settlement], now: float) -> list[bool]:
        """Each kind of settlement in one executemany: when every one of them changed its
        row (the usual case: our leases), they all applied; otherwise each is tried on its
        own to tell which (one already applied reports False; the caller sorts it out)."""
        groups: dict[str, list[tuple[int, tuple[Any, ...]]]] = {}
        for index, settlement in enumerate(settlements):
            sql, params = settle_statement(settlement, now)
            groups.setdefault(sql, []).append((index, params))
        applied = [False] * len(settlements)
        for sql, items in groups.items():
            cursor = c.executemany(sql, [params for _, params in items])
            if cursor.rowcount == len(items):
                for index, _ in items:
                    applied[index] = True
            else:
                for index, params in items:
                    applied[index] = c.execute(sql, params).rowcount == 1 or applied[index]
        return applied

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def now(self) -> float:
        return time.time()

    def _check_file(self) -> None:
        """A store file deleted, moved or replaced under an open connection still takes
        writes, into a file nobody will ever read again: refuse them, loudly. Its `-wal`
        too: it holds every write since the last checkpoint (the whole run, often), and
        `-shm` (how processes share it); deleting them under a run loses what it wrote."""
        now = _identity(self.path)
        if now != self._identity:
            if now is None:
                raise StoreLostError(
                    f"The store {self.path} was moved or deleted while this process was using it; nothing more "
                    "is recorded in it."
                )
            raise StoreLostError(f"The store {self.path} was replaced while this process was using it.")
        for suffix, known in self._logs.items():
            found = _identity(self.path + suffix)
            if known is None:
                self._logs[suffix] = found
            elif found != known:
                raise StoreLostError(
                    f"The store's {self.path}{suffix} file was deleted or replaced while this process was using it; "
                    "what the store held in it since its last checkpoint is gone."
                )

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._check_file()
            self._waits_as_usual()
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._waited(exc)
                raise self._locked(exc) from exc
            self._nowait = False  # written: from here `try_now` waits like any caller, never hands over

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            self._waits_as_usual()
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                self._waited(exc)
                raise StoreError(f"The store {self.path} could not be read: {exc}.") from exc
