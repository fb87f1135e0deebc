"""The same end-to-end run on every store backend."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

import pytest

from deepline_cli.runtime.calls.events import EventBus
from deepline_cli.runtime.run.options import RunOptions
from deepline_cli.runtime.run.runner import Runner
from deepline_cli.store import open_store
from deepline_cli.store.migrations import MIGRATIONS
from deepline_cli.store.records import RunRecord
from deepline_cli.store.roles import Store
from tests.conftest import ROOT, counts
from tests.helpers import wait_until


def test_hello_example_runs_and_replays_on_each_backend(store_url: str) -> None:
    play = str(ROOT / "examples/hello/play.py")
    first = Runner(RunOptions(store=store_url), EventBus())
    try:
        result = first.start(play, {})
    finally:
        first.close()
    assert result.status == "completed", result.error
    assert result.stats["tools"]["hello.company"]["live"] == 3
    again = Runner(RunOptions(store=store_url), EventBus())
    try:
        replay = again.start(play, {})
    finally:
        again.close()
    assert replay.output == result.output
    assert counts(replay.stats["tools"]["hello.company"]) == {
        "live": 0,
        "reused": 3,
        "failed": 0,
        "credits": 0.0,
        "retries": 0,
    }
    store = open_store(store_url)
    try:
        assert {r.run_id for r in store.runs.list_runs()} == {result.run_id, replay.run_id}
    finally:
        store.close()


FROZEN_IN_A_TRANSACTION = """
import sys, time
from deepline_cli.store import open_store
db = open_store(sys.argv[1])
with db._write() as c:
    LAST
    print("locked", flush=True)
    time.sleep(60)
"""
UPDATE = "UPDATE runs SET updated_at = ? WHERE run_id = ?"
# What the frozen process sent last: a statement; several rows' writes (executemany), then a
# read; settlements' updates (changed_each), each shape the store sends inside a transaction.
LAST_STATEMENTS = {
    "statement": f"c.execute({UPDATE!r}, (1, 'frozen'))",
    "rows": f"c.executemany({UPDATE!r}, [(1, 'frozen'), (2, 'frozen')])",
    "rows_then_read": (
        f"c.executemany({UPDATE!r}, [(1, 'frozen'), (2, 'frozen')]); c.execute('SELECT count(*) FROM runs').fetchall()"
    ),
    "settlements": f"c.changed_each([({UPDATE!r}, (1, 'frozen')), ({UPDATE!r}, (2, 'frozen'))])",
}


def frozen_then_written(db: Store, code: str, url: str, freeze: Callable[[subprocess.Popen[str]], None]) -> None:
    """Run `code` (a process inside a store transaction, DEEPLINE_PG_IDLE_IN_TRANSACTION_S=1);
    `freeze` it (SIGSTOP, once it is where the test wants it); then another session's write
    to the row it locked must go through while it is still frozen: the server ended its
    session after the idle bound (~1 s), not after the frozen one's 60 s."""
    env = {**os.environ, "DEEPLINE_PG_IDLE_IN_TRANSACTION_S": "1"}
    frozen = subprocess.Popen([sys.executable, "-c", code, url], env=env, stdout=subprocess.PIPE, text=True)
    written = threading.Event()
    writer = threading.Thread(target=lambda: (db.runs.set_status("frozen", "interrupted"), written.set()))
    try:
        freeze(frozen)
        writer.start()
        went_through = written.wait(timeout=20)
        still_frozen = frozen.poll() is None
    finally:
        frozen.kill()
        frozen.communicate()
        if writer.is_alive():
            writer.join()
    assert went_through and still_frozen  # its session was ended for it, while it was frozen
    record = db.runs.get_run("frozen")
    assert record is not None and record.status == "interrupted"


@pytest.mark.parametrize("last", sorted(LAST_STATEMENTS))
def test_a_process_frozen_inside_a_postgres_transaction_does_not_stall_the_others(pg_url: str, last: str) -> None:
    """A SIGSTOPped process holding a row lock: the server ends its session after the idle
    bound, so another process's write to that row goes through while it is still frozen,
    whatever the process sent last (psycopg ends a pipeline with a Flush after its Sync, which
    PostgreSQL takes as a new message: it stops the idle timer and starts no other)."""

    def freeze(frozen: subprocess.Popen[str]) -> None:
        assert frozen.stdout is not None and frozen.stdout.readline().strip() == "locked"
        os.kill(frozen.pid, signal.SIGSTOP)

    db = open_store(pg_url)
    try:
        db.runs.insert_run(RunRecord(run_id="frozen", play="p", play_ref="p.py:p", input={}, status="running"))
        frozen_then_written(db, FROZEN_IN_A_TRANSACTION.replace("LAST", LAST_STATEMENTS[last]), pg_url, freeze)
    finally:
        db.close()


WAITING_IN_A_TRANSACTION = """
import sys, time
from deepline_cli.store import open_store
db = open_store(sys.argv[1])
with db._write() as c:
    print("sending", flush=True)
    LAST
    time.sleep(60)
"""
# Statements that wait for a row lock another session holds, sent in a pipeline.
WAITING_STATEMENTS = {name: LAST_STATEMENTS[name] for name in ("settlements", "rows_then_read")}


@pytest.mark.parametrize("last", sorted(WAITING_STATEMENTS))
def test_a_process_frozen_while_its_statements_wait_for_a_lock_does_not_stall_the_others(
    pg_url: str, last: str
) -> None:
    """Frozen while its pipeline waits for a row lock: once the lock is free the server runs
    the statements and answers, and then its idle timer must still be running (a Flush sent
    with the pipeline's Sync would stop it), so the frozen session is ended and the row's
    lock with it."""
    import psycopg

    name = f"frozen-{last}-{os.getpid()}"
    url = f"{pg_url}{'&' if '?' in pg_url else '?'}application_name={name}"
    holder = psycopg.connect(pg_url)  # holds the row's lock in a transaction of its own

    def freeze(frozen: subprocess.Popen[str]) -> None:
        assert frozen.stdout is not None and frozen.stdout.readline().strip() == "sending"
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'"
        with psycopg.connect(pg_url, autocommit=True) as watch:
            wait_until(
                lambda: watch.execute(waiting, (name,)).fetchone() == (1,),
                what="the process's statements waiting for the row lock",
                alive=frozen,
            )
        os.kill(frozen.pid, signal.SIGSTOP)
        holder.commit()  # the frozen process's statements run now, and are answered

    db = open_store(pg_url)
    try:
        db.runs.insert_run(RunRecord(run_id="frozen", play="p", play_ref="p.py:p", input={}, status="running"))
        holder.execute("UPDATE runs SET updated_at = 0 WHERE run_id = 'frozen'")
        frozen_then_written(db, WAITING_IN_A_TRANSACTION.replace("LAST", WAITING_STATEMENTS[last]), url, freeze)
    finally:
        holder.close()
        db.close()


def test_a_quote_heavy_answer_is_settled_well_within_the_idle_bound(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer of 6 MB of quotes (12 MB as JSON) settles in a store whose server ends a
    session idle in a transaction for 1 s: the client's work on a batch counts as idle, and
    escaping each quote in Python (text arrays) took ~4 s of it."""
    from deepline_cli.store import postgres
    from deepline_cli.store.claims import claim, settle
    from tests.test_store_contract import T0, completed, mk_claim, stored

    monkeypatch.setattr(postgres, "IDLE_IN_TRANSACTION_S", 1.0)
    db = open_store(pg_url)
    try:
        claim(db, [mk_claim(k) for k in "ab"], T0)
        answer = {"html": '"' * 6_000_000}
        assert settle(db, [completed("a", output=answer), completed("b", output=1)], T0 + 1) == [True, True]
        assert stored(db, "a").output == answer
    finally:
        db.close()


def test_postgres_plans_each_statement_with_its_own_values(pg_url: str) -> None:
    """psycopg prepares a statement after five runs, and PostgreSQL may then keep a generic
    plan for it, costed when the tables were empty (the first batches of a run): scans of
    every receipt and sheet row per batch, slower as they fill. The store plans each run of
    a statement with its values: no prepared statement of its connection uses a generic plan."""
    db = open_store(pg_url)
    try:
        keys = [f"k{n}" for n in range(256)]
        for _ in range(12):  # prepared from the sixth on; the plan cache decides after five custom plans
            assert db.sheets.load_sheet_rows("s", keys) == {}
        conn = db._conn  # type: ignore[attr-defined]
        plans = conn.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
            ("%FROM sheet_rows%",),
        ).fetchall()
        assert plans, "the sheet read was never prepared: nothing was checked"
        assert all(generic == 0 for _, generic, _ in plans), plans
    finally:
        db.close()


def test_a_postgres_schema_of_another_program_is_refused_and_left_as_it_was(deepline, pg_url: str) -> None:
    """`--store` naming an application's database (its own tables in the schema deepline
    would use): deepline added its tables beside the application's (a `runs` or `events`
    table of the application's would have been taken for its own). Refused, naming what is
    there, untouched; a schema of deepline's own (`search_path` in the URL) is used."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("DROP SCHEMA IF EXISTS crm CASCADE")
        admin.execute("DROP SCHEMA IF EXISTS dl CASCADE")
        admin.execute("CREATE SCHEMA crm")
        admin.execute("CREATE TABLE crm.customers (id int PRIMARY KEY, name text)")
        admin.execute("CREATE SCHEMA dl")
    try:
        crm = f"{pg_url}?options=-csearch_path%3Dcrm"
        for args in (("runs", "list"), ("receipts", "inspect")):
            result = deepline(*args, "--store", crm)
            assert result.code == 2, result.stderr
            assert "another program's" in result.stderr and "customers" in result.stderr, result.stderr
            assert "search_path" in result.stderr, result.stderr  # how to give deepline a schema of its own
        own = deepline("runs", "list", "--store", f"{pg_url}?options=-csearch_path%3Ddl")
        assert own.code == 0, own.stderr
        with psycopg.connect(pg_url, autocommit=True) as admin:
            tables = {
                (schema, name)
                for schema, name in admin.execute(
                    "SELECT schemaname, tablename FROM pg_tables WHERE schemaname IN ('crm', 'dl')"
                )
            }
        assert {name for schema, name in tables if schema == "crm"} == {"customers"}
        assert ("dl", "runs") in tables and ("dl", "receipts") in tables
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("DROP SCHEMA IF EXISTS crm CASCADE")
            admin.execute("DROP SCHEMA IF EXISTS dl CASCADE")


def test_a_postgres_schema_that_is_missing_or_not_deeplines_is_refused_and_a_dml_role_may_use_one(
    deepline, pg_url: str
) -> None:
    """A search_path naming no schema that exists said "could not be written: no schema has
    been selected to create in" (exit 1); an application's own `_migrations` table made
    deepline take its schema over (its tables added, rows in the app's table); a role that
    may only read and write deepline's tables could not open an up-to-date store (it
    created `_migrations` "if not exists", which needs CREATE on the schema)."""
    import os

    import psycopg

    role = f"dl_dml_{os.getpid()}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        for schema in ("app", "dl2", "dl3"):
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        admin.execute(f"DROP ROLE IF EXISTS {role}")
        admin.execute("CREATE SCHEMA app")
        admin.execute("CREATE TABLE app.customers (id int)")
        admin.execute("CREATE TABLE app._migrations (id serial PRIMARY KEY, name text, applied_at double precision)")
        admin.execute("CREATE SCHEMA dl2")
    try:
        missing = deepline("runs", "list", "--store", f"{pg_url}?options=-csearch_path%3Dnosuch")
        assert missing.code == 2, missing.stderr
        assert "nosuch" in missing.stderr and "CREATE SCHEMA" in missing.stderr, missing.stderr
        app = deepline("runs", "list", "--store", f"{pg_url}?options=-csearch_path%3Dapp")
        assert app.code == 2 and "another program's" in app.stderr, app.stderr
        assert "&options=" in app.stderr, app.stderr  # the URL has a query already: added with &
        own = f"{pg_url}?options=-csearch_path%3Ddl2"
        assert deepline("runs", "list", "--store", own).code == 0  # deepline's tables made in dl2
        with psycopg.connect(pg_url, autocommit=True) as admin:
            tables = {name for (name,) in admin.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'app'")}
            assert tables == {"customers", "_migrations"}
            assert admin.execute("SELECT count(*) FROM app._migrations").fetchone()[0] == 0
            admin.execute(f"CREATE ROLE {role} LOGIN")
            admin.execute(f"GRANT USAGE ON SCHEMA dl2 TO {role}")
            admin.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA dl2 TO {role}")
            admin.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA dl2 TO {role}")
        as_role = own.replace("postgres@", f"{role}@", 1)
        listed = deepline("runs", "list", "--store", as_role)
        assert listed.code == 0, listed.stderr
        # A store a newer deepline must upgrade first: that role may not; it is told who may.
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("ALTER TABLE dl2.run_receipts DROP COLUMN status")
            admin.execute("DELETE FROM dl2._migrations WHERE name = %s", (MIGRATIONS[-1][0],))
        behind = deepline("runs", "list", "--store", as_role)
        assert behind.code == 2, behind.stderr
        assert "needs its tables brought up" in behind.stderr and "as a role that owns them" in behind.stderr
        assert deepline("runs", "list", "--store", own).code == 0  # the owner upgrades it
        assert deepline("runs", "list", "--store", as_role).code == 0
        # An empty schema that role may use but not create in: it is told what to grant.
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("CREATE SCHEMA dl3")
            admin.execute(f"GRANT USAGE ON SCHEMA dl3 TO {role}")
        empty = deepline("runs", "list", "--store", as_role.replace("dl2", "dl3"))
        assert empty.code == 2, empty.stderr
        assert f"GRANT CREATE ON SCHEMA dl3 TO {role}" in empty.stderr, empty.stderr
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            for schema in ("app", "dl2", "dl3"):
                admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            admin.execute(f"DROP OWNED BY {role}") if admin.execute(
                "SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)
            ).fetchone() else None
            admin.execute(f"DROP ROLE IF EXISTS {role}")


def test_a_store_password_in_the_query_is_never_shown(deepline) -> None:
    """libpq takes `?password=` as well as `user:password@`: only the second was hidden, so a
    store error (and a dropped connection's warning, kept in the run's log) showed it."""
    from deepline_cli.store import safe_url

    assert safe_url("postgresql://u@h/db?sslmode=require&password=S3cretPassw0rd&x=1") == (
        "postgresql://u@h/db?sslmode=require&password=***&x=1"
    )
    assert safe_url("postgresql://u@h/db?sslpassword=K3y") == "postgresql://u@h/db?sslpassword=***"
    result = deepline("runs", "list", "--store", "postgresql://postgres@127.0.0.1:9/x?password=S3cretPassw0rd")
    assert result.code == 2 and "S3cretPassw0rd" not in result.stderr + result.stdout, result.stderr


def test_a_key_holding_a_nul_character_runs_and_resumes_on_each_backend(store_url: str, tmp_path) -> None:
    """A CSV key cell with a NUL byte: PostgreSQL's writes replaced it, but its reads sent it
    as it was ("text fields cannot contain NUL"): the run failed, and every resume with it."""
    from tests.helpers import run_play

    (tmp_path / "keys.csv").write_bytes(b"domain,name\nco2\x00x.example.com,C\nco3.example.com,D\n")
    play = tmp_path / "play.py"
    play.write_text(
        "from deepline_cli import play\n\n"
        '@play("nul")\n'
        "async def nul(ctx, input):\n"
        '    columns = {"n": lambda row: len(row["name"])}\n'
        '    rows = await ctx.map("m", ctx.csv(input["csv"]), key="domain", columns=columns)\n'
        "    return len(rows)\n"
    )
    first = run_play(play, store_url, {"csv": str(tmp_path / "keys.csv")})
    assert (first.status, first.output) == ("completed", 2), first.error
    again = run_play(play, store_url, {"csv": str(tmp_path / "keys.csv")})  # its sheet rows read back
    assert (again.status, again.output) == ("completed", 2), again.error


def test_a_resumed_map_keeps_a_row_whose_key_holds_a_nul_as_seeded_on_each_backend(store_url: str, tmp_path) -> None:
    """PostgreSQL keeps a NUL as U+FFFD: a resumed attempt compared the input's key with the
    stored one, found them different, and did that row again (from its sheet row, nothing
    paid), so its progress said 1 row seeded of the 2 it started with (SQLite: 2)."""
    from deepline_cli.runtime.calls.events import Event
    from tests.helpers import resume_run, run_play

    (tmp_path / "keys.csv").write_bytes(b"domain,name\nco2\x00x.example.com,C\nco3.example.com,D\n")
    play = tmp_path / "play.py"
    play.write_text(
        "import os\n"
        "from deepline_cli import play\n\n"
        '@play("nul")\n'
        "async def nul(ctx, input):\n"
        '    columns = {"n": lambda row: len(row["name"])}\n'
        '    rows = await ctx.map("m", ctx.csv(input["csv"]), key="domain", columns=columns)\n'
        '    if not os.path.exists(input["go"]):\n'
        '        raise RuntimeError("stopped after the map")\n'
        "    return len(rows)\n"
    )
    go = tmp_path / "go"
    first = run_play(play, store_url, {"csv": str(tmp_path / "keys.csv"), "go": str(go)})
    assert first.status == "failed", first.error
    go.touch()
    events: list[Event] = []
    bus = EventBus()
    bus.subscribe(events.append)
    again = resume_run(first.run_id, store_url, bus=bus)
    assert (again.status, again.output) == ("completed", 2), again.error
    (started,) = [e for e in events if e.event == "map.started"]
    *_, progress = [e for e in events if e.event == "map.progress"]
    assert (started.data["seeded"], progress.data["seeded"], progress.data["done"]) == (2, 2, 2)


def test_runs_show_of_a_map_that_did_not_complete_on_each_backend(store_url: str, tmp_path) -> None:
    """Its counts are read from the rows written (duplicates, reused rows): the query was
    SQLite's only, and `runs show` of any such run failed on PostgreSQL."""
    from deepline_cli.ui.run_show import read_shown
    from tests.helpers import run_play

    play = tmp_path / "play.py"
    play.write_text(
        "from deepline_cli import play\n\n"
        "def check(row):\n"
        "    if row['id'] == 3:\n"
        "        raise ValueError('stop here')\n"
        "    return row['id']\n\n"
        '@play("stops")\n'
        "async def stops(ctx, input):\n"
        "    rows = [{'id': i} for i in (1, 1, 2, 3, 4)]\n"
        "    await ctx.map('m', rows, key='id', columns={'v': check}, on_row_error='fail', concurrency=1)\n"
    )
    result = run_play(play, store_url, run_id="stops")
    assert result.status == "failed", result.error
    db = open_store(store_url)
    try:
        record = db.runs.get_run("stops")
        assert record is not None
        (shown,) = read_shown(db, record).maps
    finally:
        db.close()
    assert (shown.status, shown.duplicate, shown.reused) == ("failed", 1, 0)


def test_a_connection_the_server_ended_inside_a_pipeline_is_taken_as_dropped() -> None:
    """PostgreSQL ending backends during a batch of settlements (a pipeline): psycopg said
    "cannot exit pipeline mode while busy" before marking the connection broken; taken as a
    store error, the run failed with its paid answers unrecorded (sent again on resume)."""
    import psycopg
    from psycopg import pq

    from deepline_cli.store.postgres import _cut

    class Conn:
        def __init__(self, status: int) -> None:
            self.pgconn = type("PgConn", (), {"status": status})()

    busy = psycopg.OperationalError("sending query failed: cannot exit pipeline mode while busy")
    assert _cut(Conn(pq.ConnStatus.OK), busy)  # type: ignore[arg-type]
    assert _cut(Conn(pq.ConnStatus.BAD), psycopg.OperationalError("server closed the connection"))  # type: ignore[arg-type]
    assert not _cut(Conn(pq.ConnStatus.OK), psycopg.OperationalError("canceling statement"))  # type: ignore[arg-type]
    assert not _cut(Conn(pq.ConnStatus.OK), psycopg.errors.UniqueViolation("duplicate key"))  # type: ignore[arg-type]


def test_a_maps_dataset_reads_through_a_dropped_connection() -> None:
    """A play iterating its first map's Dataset (to feed a second map) while PostgreSQL
    ended connections: its reads went to the store without reconnecting, and the run failed
    ("the connection is closed") seconds after the store thread had reconnected."""
    from deepline_cli.errors import StoreConnectionLost
    from deepline_cli.runtime.calls.store_thread import Reconnecting
    from deepline_cli.runtime.map.dataset import Dataset
    from deepline_cli.store.records import DatasetRow, MapRecord

    class Dropping:
        url = "postgresql://example/drops"

        def __init__(self) -> None:
            self.dropped = 0

        def reconnect(self, hurry: bool = False) -> None:
            pass

        def map_rows_page(self, *args: object, **kwargs: object) -> list[DatasetRow]:
            if self.dropped < 2:  # the connection ended twice, then the rows
                self.dropped += 1
                raise StoreConnectionLost("The store dropped the connection: the connection is closed.")
            after = args[3]  # run, map, sheet, after, page size
            return [] if after != -1 else [DatasetRow(0, "a", "succeeded", None, {"id": "a"}, {})]

    store = Dropping()
    record = MapRecord("r-1", "m", "w/p/m", ["id"], [], succeeded=1)
    rows = list(Dataset(Reconnecting(store).sheets, record))  # type: ignore[arg-type]
    assert rows == [{"id": "a"}] and store.dropped == 2


def test_a_run_iterating_its_maps_dataset_rides_out_a_dropped_connection(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine hands the play a Dataset that reads through reconnects (it read the store raw)."""
    from deepline_cli.errors import StoreConnectionLost
    from deepline_cli.store.sqlite import SQLiteStore
    from tests.helpers import run_play

    real = SQLiteStore.map_rows_page
    dropped: list[bool] = []

    def dropping(self: SQLiteStore, *args: object, **kwargs: object) -> object:
        if not dropped:
            dropped.append(True)
            raise StoreConnectionLost("The store dropped the connection: the connection is closed.")
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(SQLiteStore, "map_rows_page", dropping)
    play = tmp_path / "play.py"
    play.write_text(
        "from deepline_cli import play\n\n"
        '@play("two")\n'
        "async def two(ctx, input):\n"
        "    first = await ctx.map('a', [{'id': 1}, {'id': 2}], key='id', columns={'v': lambda row: row['id']})\n"
        "    return [row['v'] for row in first]\n"
    )
    result = run_play(play, tmp_path / "store.db")
    assert (result.status, result.output, dropped) == ("completed", [1, 2], [True]), result.error


def test_a_postgres_notify_that_arrives_while_the_listener_runs_a_statement_still_wakes_it(pg_url: str) -> None:
    """A worker's listener is woken by every NOTIFY on the store (other runs' too) and goes back
    to listening each time: one read off its connection while that runs another statement (its
    next LISTEN) must wake it still, not wait for the next poll (psycopg keeps it for the next
    `notifies()`; versions before 3.2 dropped it)."""
    import psycopg

    listener = open_store(pg_url)
    try:
        assert listener.queue.wait_for_notify(0.01) is False  # listening, nothing said yet
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute("NOTIFY deepline_work")  # committed: on its way to the listener's connection
        # A statement of the listener's own reads it off the connection, outside `notifies()`.
        listener.queue._conn.execute("SELECT pg_sleep(0.1)")
        assert listener.queue.wait_for_notify(1.0) is True
        assert listener.queue.wait_for_notify(0.05) is False  # heard once, not again
    finally:
        listener.close()


def test_a_postgres_store_opens_through_a_connection_dropped_while_it_checked_its_tables(pg_url: str) -> None:
    """A process paused while it opened the store (its migration check waiting for the
    migration lock, or frozen inside it) past the server's idle bound: the server ended
    its session, and the process, woken, failed with "dropped the connection" (exit 1)
    instead of connecting again and going on (a run taken over meanwhile: exit 4)."""
    import psycopg

    from deepline_cli.store.postgres import _MIGRATION_LOCK
    from tests.pgproxy import PgProxy

    open_store(pg_url).close()  # the tables are there: only the check runs
    opened: list[Store | BaseException] = []
    with PgProxy(pg_url) as proxy, psycopg.connect(pg_url) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))  # another process migrating

        def opening() -> None:
            try:
                opened.append(open_store(proxy.url))
            except BaseException as exc:
                opened.append(exc)

        thread = threading.Thread(target=opening)
        thread.start()
        waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        with psycopg.connect(pg_url, autocommit=True) as watch:
            wait_until(lambda: watch.execute(waiting).fetchone() == (1,), what="the open waiting", timeout=10)
        assert proxy.cut()  # the session ends while the open waits inside its transaction
        holder.rollback()
        thread.join(timeout=30)
        (store,) = opened
        assert not isinstance(store, BaseException), store
        try:
            assert store.runs.get_run("none") is None  # on its new connection
        finally:
            store.close()
