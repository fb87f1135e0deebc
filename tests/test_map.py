"""The map engine (SPEC §2): keys, resolvers, failures, logs, reuse, limits, barriers, resume.

Plays run in-process through the real `Runner` against a private SQLite file; the tests
of what a map keeps in the store (sheet reuse, failed cells, budgets, barriers, resume)
run on each backend (`store_url`: SQLite, then PostgreSQL when DEEPLINE_TEST_POSTGRES_URL
is set). Tools and resolvers record every invocation in `CALLS` (the play imports it from
this module), so a test can tell live work from reuse. Each test's tool ids carry the
test's own prefix `P`.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deepline_cli.runtime.calls.events import Event, EventBus
from deepline_cli.runtime.map import barriers
from deepline_cli.runtime.run.options import RunResult
from deepline_cli.store import open_store
from deepline_cli.store.records import FOUND_PREFIX
from deepline_cli.store.roles import Store
from deepline_cli.store.sqlite import SQLiteStore
from tests.helpers import is_postgres, resume_run, run_play

# Every tool and resolver invocation of the current test: "<what>:<row id>".
CALLS: list[str] = []

HEADER = """\
import asyncio
import os
from pathlib import Path

from deepline_cli import BudgetExceededError, Column, ToolExecutionError, play, tool
from tests.test_map import CALLS

P = {prefix!r}
"""


@pytest.fixture(autouse=True)
def _fresh_calls() -> Iterator[None]:
    CALLS.clear()
    yield
    CALLS.clear()


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> str:
    """`P` in the play: this test's own namespace for tool ids."""
    return "tm." + request.node.name


@pytest.fixture
def make_play(tmp_path: Path, prefix: str) -> Callable[..., Path]:
    """Write a play: HEADER, then `NAME = value` for each keyword, then the dedented body."""

    def write(body: str, name: str = "play.py", **consts: Any) -> Path:
        path = tmp_path / name
        lines = "".join(f"{key} = {value!r}\n" for key, value in consts.items())
        path.write_text(HEADER.format(prefix=prefix) + lines + textwrap.dedent(body))
        # A rewrite within the same second and of the same size would otherwise be
        # served from the bytecode cache.
        shutil.rmtree(tmp_path / "__pycache__", ignore_errors=True)
        return path

    return write


@dataclass
class Outcome:
    result: RunResult
    events: list[Event]

    @property
    def output(self) -> Any:
        assert self.result.status == "completed", self.result.error
        return self.result.output

    def of(self, name: str) -> list[dict[str, Any]]:
        return [e.data for e in self.events if e.event == name]

    def settled(self, barrier: str) -> list[dict[str, Any]]:
        """A barrier's outcome events (not the one saying it is being checked)."""
        return [e for e in self.of(barrier) if e["passed"] is not None]

    def logs(self) -> list[str]:
        return [e["message"] for e in self.of("log")]

    def map_logs(self) -> list[str]:
        return [
            line
            for line in self.logs()
            if line.startswith(("row ", "Map completed:")) or "additional row failure" in line
        ]


def run(
    play_file: Path,
    store: str | Path,
    input: dict[str, Any] | None = None,
    *,
    opened: Store | None = None,
    **options: Any,
) -> Outcome:
    events: list[Event] = []
    result = run_play(play_file, store, input, bus=EventBus([events.append]), opened=opened, **options)
    return Outcome(result, events)


def resume(run_id: str, store: str | Path, **options: Any) -> Outcome:
    events: list[Event] = []
    result = resume_run(run_id, store, bus=EventBus([events.append]), **options)
    return Outcome(result, events)


def query(store: str | Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows of `sql` (with `?` placeholders) on either backend."""
    if is_postgres(str(store)):
        import psycopg

        with psycopg.connect(str(store)) as pg:
            return [tuple(row) for row in pg.execute(sql.replace("?", "%s"), params).fetchall()]
    conn = sqlite3.connect(store)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def map_rows(store: str | Path, run_id: str) -> list[tuple[int, int, str, str, str | None]]:
    """(idx, input_index, row_key, outcome, error) of every finished row of a run."""
    return query(
        store,
        "SELECT idx, input_index, row_key, outcome, error FROM map_rows WHERE run_id = ? ORDER BY idx",
        run_id,
    )


def stored_logs(store: str | Path, run_id: str) -> list[str]:
    opened = open_store(str(store))
    try:
        return [line.message for line in opened.ledger.get_logs(run_id)]
    finally:
        opened.close()


def summary(total: int, succeeded: int, failed: int, duplicate: int) -> str:
    return (
        f"Map completed: {total} results ({succeeded} succeeded, {failed} failed, {duplicate} duplicate keys skipped)"
    )


# --- row keys ------------------------------------------------------------------------------------


def test_key_by_field_skips_duplicates_and_keeps_input_order(make_play, store_path: Path) -> None:
    play_file = make_play(
        """
        async def slow_first(row, rc):
            CALLS.append("enrich:" + row["email"])
            # earlier rows finish later: the result must still be in input order
            await asyncio.sleep(0.002 * (10 - int(row["n"])))
            return row["n"] + "!"

        @play("keys")
        async def keys(ctx, input):
            rows = [{"email": e, "n": str(i)} for i, e in enumerate(
                ["a@x", "b@x", "a@x", "c@x", "b@x", "d@x", "a@x"])]
            ds = await ctx.map("people", rows, key="email", columns={"tag": slow_first})
            return {"rows": list(ds), "len": len(ds), "failed": ds.failed_count}
        """
    )

    out = run(play_file, store_path)

    assert out.output["rows"] == [
        {"email": "a@x", "n": "0", "tag": "0!"},
        {"email": "b@x", "n": "1", "tag": "1!"},
        {"email": "c@x", "n": "3", "tag": "3!"},
        {"email": "d@x", "n": "5", "tag": "5!"},
    ]
    assert out.output["len"] == 4
    assert out.output["failed"] == 0
    assert sorted(CALLS) == ["enrich:a@x", "enrich:b@x", "enrich:c@x", "enrich:d@x"]
    assert out.map_logs() == [summary(4, 4, 0, 3)]
    [completed] = out.of("map.completed")
    assert (completed["total"], completed["succeeded"], completed["failed"], completed["duplicate"]) == (
        4,
        4,
        0,
        3,
    )
    assert [(r[0], r[1], r[2]) for r in map_rows(store_path, out.result.run_id)] == [
        (0, 0, "a@x"),
        (1, 1, "b@x"),
        (2, 3, "c@x"),
        (3, 5, "d@x"),
    ]


def test_key_by_list_of_fields(make_play, store_path: Path) -> None:
    play_file = make_play(
        """
        @play("keys")
        async def keys(ctx, input):
            rows = [
                {"first": "Ada", "domain": "a.com", "note": "1"},
                {"first": "Ada", "domain": "b.com", "note": "2"},
                {"first": "Bob", "domain": "a.com", "note": "3"},
                {"first": "Ada", "domain": "a.com", "note": "4"},
                {"first": "Bob", "domain": "a.com", "note": "5"},
            ]
            def seen(row, rc):
                CALLS.append("col:" + row["note"])
                return rc.row_key
            ds = await ctx.map("people", rows, key=["first", "domain"], columns={"k": seen})
            return list(ds)
        """
    )

    out = run(play_file, store_path)

    assert [r["note"] for r in out.output] == ["1", "2", "3"]
    assert sorted(CALLS) == ["col:1", "col:2", "col:3"]
    keys = [r["k"] for r in out.output]
    assert len(set(keys)) == 3
    assert all("Ada" in k or "Bob" in k for k in keys)
    assert out.map_logs() == [summary(3, 3, 0, 2)]


def test_key_by_callable(make_play, store_path: Path) -> None:
    play_file = make_play(
        """
        @play("keys")
        async def keys(ctx, input):
            rows = [{"email": e} for e in ["Ada@X.com", "bob@x.com", "ada@x.com ", "BOB@x.com", "cy@x.com"]]
            ds = await ctx.map("people", rows, key=lambda row: row["email"].strip().lower(),
                               columns={"k": lambda row, rc: rc.row_key})
            by_number = await ctx.map("numbers", [{"n": i} for i in [1, 2, 1, 3]], key=lambda row: row["n"],
                                      columns={"k": lambda row, rc: rc.row_key})
            return {"people": list(ds), "numbers": [r["k"] for r in by_number]}
        """
    )

    out = run(play_file, store_path)

    assert out.output["people"] == [
        {"email": "Ada@X.com", "k": "ada@x.com"},
        {"email": "bob@x.com", "k": "bob@x.com"},
        {"email": "cy@x.com", "k": "cy@x.com"},
    ]
    # a non-string key is turned into a string key
    assert len(out.output["numbers"]) == 3
    assert all(isinstance(k, str) for k in out.output["numbers"])
    assert out.map_logs() == [summary(3, 3, 0, 2), summary(3, 3, 0, 1)]


def test_key_none_is_a_digest_of_the_row_content(make_play, store_path: Path) -> None:
    play_file = make_play(
        """
        @play("keys")
        async def keys(ctx, input):
            rows = [
                {"a": "1", "b": "x"},
                {"a": "1", "b": "y"},
                {"b": "x", "a": "1"},   # same content as the first row
                {"a": "2", "b": "x"},
                {"a": "1", "b": "y"},
            ]
            def col(row, rc):
                CALLS.append("col:" + row["a"] + row["b"])
                return rc.row_key
            ds = await ctx.map("content", rows, columns={"k": col})
            return list(ds)
        """
    )

    first = run(play_file, store_path)

    assert [(r["a"], r["b"]) for r in first.output] == [("1", "x"), ("1", "y"), ("2", "x")]
    keys = [r["k"] for r in first.output]
    assert len(set(keys)) == 3
    assert all(len(k) >= 16 and all(c in "0123456789abcdef" for c in k) for k in keys)
    assert sorted(CALLS) == ["col:1x", "col:1y", "col:2x"]
    assert first.map_logs() == [summary(3, 3, 0, 2)]

    # The digest is stable: a second run finds every row's cells and calls nothing.
    second = run(play_file, store_path)
    assert [r["k"] for r in second.output] == keys
    assert len(CALLS) == 3


def test_a_missing_key_field_fails_the_run_as_an_input_error(make_play, store_path: Path) -> None:
    play_file = make_play(
        """
        @play("keys")
        async def keys(ctx, input):
            await ctx.map("people", [{"email": "a@x"}], key="domain", columns={"k": lambda row: 1})
        """
    )

    out = run(play_file, store_path)

    assert out.result.status == "failed"
    assert out.result.error["type"] == "InputError"
    assert "domain" in out.result.error["message"]
    assert out.result.exit_code == 2


# --- resolvers ------------------------------------------------------------------------------------


def test_resolver_kinds_see_earlier_columns_and_know_their_row(make_play, store_path: Path, prefix: str) -> None:
    play_file = make_play(
        """
        @tool(P + ".company")
        async def company(input):
            CALLS.append("company:" + input["domain"])
            return {"name": input["domain"].split(".")[0].title()}

        def sync_col(row, rc):
            return row["company"]["name"] + " Inc"

        async def async_col(row, rc):
            await asyncio.sleep(0)
            return {"legal": row["legal"], "index": rc.index, "key": rc.row_key}

        async def stepped(row, rc):
            return await rc.step("slug", lambda: row["domain"].replace(".", "-"))

        @play("kinds")
        async def kinds(ctx, input):
            rows = [{"domain": d} for d in ["acme.com", "globex.io", "initech.dev"]]
            ds = await ctx.map("companies", rows, key="domain", columns={
                "company": lambda row, rc: rc.tools.execute("company", P + ".company",
                                                            {"domain": row["domain"]}),
                "legal": sync_col,
                "meta": async_col,
                "one_arg": lambda row: len(row["legal"]),
                "stepped": stepped,
            })
            return list(ds)
        """
    )

    out = run(play_file, store_path)

    assert out.output == [
        {
            "domain": "acme.com",
            "company": {"name": "Acme"},  # a ToolResult is stored as its .output
            "legal": "Acme Inc",
            "meta": {"legal": "Acme Inc", "index": 0, "key": "acme.com"},
            "one_arg": 8,
            "stepped": "acme-com",
        },
        {
            "domain": "globex.io",
            "company": {"name": "Globex"},
            "legal": "Globex Inc",
            "meta": {"legal": "Globex Inc", "index": 1, "key": "globex.io"},
            "one_arg": 10,
            "stepped": "globex-io",
        },
        {
            "domain": "initech.dev",
            "company": {"name": "Initech"},
            "legal": "Initech Inc",
            "meta": {"legal": "Initech Inc", "index": 2, "key": "initech.dev"},
            "one_arg": 11,
            "stepped": "initech-dev",
        },
    ]
    assert sorted(CALLS) == ["company:acme.com", "company:globex.io", "company:initech.dev"]
    assert out.result.stats["tools"][f"{prefix}.company"]["live"] == 3


def test_run_if_false_leaves_none_and_makes_no_call(make_play, store_path: Path) -> None:
    play_file = make_play(
        """
        @tool(P + ".email")
        def email(input):
            CALLS.append("email:" + input["domain"])
            return {"email": "hi@" + input["domain"]}

        @play("runif")
        async def runif(ctx, input):
            rows = [{"domain": "a.com", "known": "yes"}, {"domain": "b.com", "known": "no"},
                    {"domain": "c.com", "known": "yes"}]
            ds = await ctx.map("m", rows, key="domain", columns={
                "company": lambda row: row["domain"] if row["known"] == "yes" else None,
                "email": Column(
                    lambda row, rc: rc.tools.execute("email", P + ".email", {"domain": row["domain"]}),
                    run_if=lambda row: row["company"] is not None,
                ),
            })
            return list(ds)
        """
    )

    out = run(play_file, store_path)

    assert [r["email"] for r in out.output] == [{"email": "hi@a.com"}, None, {"email": "hi@c.com"}]
    assert sorted(CALLS) == ["email:a.com", "email:c.com"]
    assert out.map_logs() == [summary(3, 3, 0, 0)]


def test_rows_from_a_generator_and_concurrency_bound(make_play, store_path: Path) -> None:
    play_file = make_play(
        """
        STATE = {"now": 0, "max": 0}

        async def col(row, rc):
            STATE["now"] += 1
            STATE["max"] = max(STATE["max"], STATE["now"])
            await asyncio.sleep(0.002)
            STATE["now"] -= 1
            return row["i"] * 2

        @play("gen")
        async def gen(ctx, input):
            rows = ({"i": i} for i in range(40))
            ds = await ctx.map("m", rows, key="i", concurrency=3, columns={"double": col})
            return {"values": [r["double"] for r in ds], "max": STATE["max"]}
        """
    )

    out = run(play_file, store_path)

    assert out.output["values"] == [i * 2 for i in range(40)]
    assert 1 <= out.output["max"] <= 3


def test_a_quick_sync_tool_runs_on_the_loop_and_a_blocking_one_on_threads(make_play, store_path: Path) -> None:
    """A thread hop costs more than a quick sync tool's call: once it proved quick, it runs on
    the event loop; a tool that blocks (sleeps, waits on I/O) stays on threads, so the map's
    other rows go on while it waits."""
    play_file = make_play(
        """
        import threading
        import time

        @tool(P + ".quick")
        def quick(input):
            CALLS.append("quick:" + ("loop" if threading.current_thread() is threading.main_thread() else "thread"))
            return input["i"] + 1

        @tool(P + ".timed")
        def timed(input):  # quick, but called under a timeout: only a thread can be given up on
            CALLS.append("timed:" + ("loop" if threading.current_thread() is threading.main_thread() else "thread"))
            return input["i"]

        @tool(P + ".blocking")
        def blocking(input):
            CALLS.append("blocking:" + ("loop" if threading.current_thread() is threading.main_thread() else "thread"))
            time.sleep(0.003)
            return input["i"] - 1

        @play("places")
        async def places(ctx, input):
            ds = await ctx.map("m", [{"i": i} for i in range(200)], key="i", concurrency=10, columns={
                "up": lambda row, rc: rc.tools.execute("q", P + ".quick", {"i": row["i"]}),
                "down": lambda row, rc: rc.tools.execute("b", P + ".blocking", {"i": row["i"]}),
                "same": lambda row, rc: rc.tools.execute("t", P + ".timed", {"i": row["i"]}, timeout_s=30),
            })
            return {"up": [r["up"] for r in ds], "down": [r["down"] for r in ds]}
        """
    )

    out = run(play_file, store_path)

    assert out.output == {"up": [i + 1 for i in range(200)], "down": [i - 1 for i in range(200)]}
    where = Counter(CALLS)
    assert where["blocking:loop"] == 0 and where["blocking:thread"] == 200, where
    assert where["timed:loop"] == 0 and where["timed:thread"] == 200, where
    assert where["quick:loop"] >= 150 and where["quick:thread"] >= 16, where  # proven quick first, then inline


def test_a_call_that_held_the_loop_is_committed_before_anything_else_runs(make_play, store_path: Path) -> None:
    """A sync tool proven quick runs on the event loop; the call of it that blocked (a pause,
    a slow input) held every other row up, and its answer waited for the loop to be free
    again to be committed: a kill in between paid it again. It is committed as it ends."""
    play_file = make_play(
        """
        import sqlite3
        import time

        @tool(P + ".mostly_quick")
        def mostly_quick(input):
            if input["i"] == 60:
                time.sleep(0.05)
            return input["i"]

        async def status_after(row, rc):
            result = await rc.tools.execute("q", P + ".mostly_quick", {"i": row["i"]})
            if row["i"] != 60:
                return None
            store = sqlite3.connect(f"file:{STORE}?mode=ro", uri=True)
            try:
                [(status,)] = store.execute(
                    "SELECT status FROM receipts WHERE key = ?", (result.receipt_key,)).fetchall()
            finally:
                store.close()
            return status

        @play("held")
        async def held(ctx, input):
            ds = await ctx.map("m", [{"i": i} for i in range(80)], key="i", concurrency=10, columns={
                "status": status_after,
            })
            return [r["status"] for r in ds if r["status"] is not None]
        """,
        STORE=str(store_path),
    )

    out = run(play_file, store_path)

    assert out.output == ["completed"]


@pytest.mark.parametrize("kind", ["def", "async def"])
def test_answers_of_short_blocking_steps_are_committed_once_they_add_up(make_play, store_path: Path, kind: str) -> None:
    """Steps of a sync client under 20 ms each (one that blocks 8 ms) were never committed at
    once: 80 in a gather held the loop for half a second with nothing written, and a kill
    paid again every answer since the last commit. They are, once their waits add up; in an
    `async def` that calls the sync client too (it awaits nothing while it waits)."""
    source = """
        import asyncio
        import sqlite3
        import time

        def committed():
            store = sqlite3.connect(f"file:{STORE}?mode=ro", uri=True)
            try:
                [(n,)] = store.execute(
                    "SELECT count(*) FROM receipts WHERE kind = 'step' AND status = 'completed'").fetchall()
            finally:
                store.close()
            return n

        def lookup(i):  # a sync SDK's call: 8 ms of waiting on the provider
            seen = committed()
            time.sleep(0.008)
            return {"i": i, "committed_before": seen}

        @play("short")
        async def short(ctx, input):
            found = await asyncio.gather(*[ctx.step(f"s{i}", lambda i=i: lookup(i)) for i in range(12)])
            return [f["committed_before"] for f in found]
        """
    play_file = make_play(source.replace("def lookup(i):", f"{kind} lookup(i):"), STORE=str(store_path))

    seen = run(play_file, store_path).output

    # Three 8 ms waits pass 20 ms: at most the two answers since the last commit and the one
    # running are not in the store yet.
    assert all(n >= i - 3 for i, n in enumerate(seen)), seen


# --- failed rows and the map log -------------------------------------------------------------------

FAILING = """
async def check(row, rc):
    n = int(row["n"])
    CALLS.append("check:" + row["n"])
    # later rows fail first: the log must still list failures in input order
    await asyncio.sleep(0.001 * (30 - n))
    if row["n"] in input_failing():
        raise ValueError("bad row " + row["n"])
    return "ok"

def input_failing():
    return set(FAIL)

@play("failing")
async def failing(ctx, input):
    rows = [{"n": str(i)} for i in range(20)] + [{"n": "3"}, {"n": "5"}]
    ds = await ctx.map("m", rows, key="n", columns={"check": check, "after": lambda row: "after"})
    return {"len": len(ds), "failed": ds.failed_count, "failed_rows": list(ds.failed_rows()),
            "rows": list(ds)}
"""


def test_isolated_failures_are_recorded_and_the_run_completes(make_play, store_url: str) -> None:
    play_file = make_play(FAILING, FAIL=["17", "3", "11", "5", "8"])

    out = run(play_file, store_url)

    assert out.result.status == "completed"
    assert out.result.exit_code == 0
    assert out.output["len"] == 20
    assert out.output["failed"] == 5
    assert out.output["failed_rows"] == [
        {"n": n, "check": None, "after": None, "_error": f"ValueError: bad row {n} (play.py line 17)"}
        for n in ["3", "5", "8", "11", "17"]
    ]
    rows = out.output["rows"]
    assert [r["n"] for r in rows] == [str(i) for i in range(20)]
    assert rows[3]["_error"] == "ValueError: bad row 3 (play.py line 17)"
    assert rows[4] == {"n": "4", "check": "ok", "after": "after"}
    assert out.map_logs() == [
        "row 3 failed: ValueError: bad row 3 (play.py line 17)",
        "row 5 failed: ValueError: bad row 5 (play.py line 17)",
        "row 8 failed: ValueError: bad row 8 (play.py line 17)",
        "2 additional row failure(s) omitted from map log",
        summary(20, 15, 5, 2),
    ]
    # the same lines are kept in the store, in the same order
    assert [
        line
        for line in stored_logs(store_url, out.result.run_id)
        if line.startswith(("row ", "Map completed")) or "omitted" in line
    ] == out.map_logs()
    outcomes = Counter(r[3] for r in map_rows(store_url, out.result.run_id))
    assert outcomes == {"succeeded": 15, "failed": 5}
    assert out.result.stats["rows"]["failed"] == 5


def failed(n: str) -> str:
    return f"row {n} failed: ValueError: bad row {n} (play.py line 17)"


@pytest.mark.parametrize(
    ("failing", "expected"),
    [
        ([], []),
        (["9"], [failed("9")]),
        (["9", "2", "4"], [failed("2"), failed("4"), failed("9")]),
        (
            ["9", "2", "4", "0"],
            [failed("0"), failed("2"), failed("4"), "1 additional row failure(s) omitted from map log"],
        ),
    ],
)
def test_map_log_lines(make_play, store_path: Path, failing: list[str], expected: list[str]) -> None:
    play_file = make_play(FAILING, FAIL=failing)

    out = run(play_file, store_path)

    n = len(failing)
    assert out.map_logs() == [*expected, summary(20, 20 - n, n, 2)]


def test_fail_on_row_errors_makes_a_completed_run_exit_1(make_play, store_path: Path) -> None:
    play_file = make_play(FAILING, FAIL=["7"])

    out = run(play_file, store_path, fail_on_row_errors=True)

    assert out.result.status == "completed"
    assert out.output["failed"] == 1
    assert out.result.exit_code == 1

    # the same play without failures, in a store of its own (the error cell would be kept)
    clean = make_play(FAILING, name="clean.py", FAIL=[])
    assert run(clean, store_path.with_name("clean.db"), fail_on_row_errors=True).result.exit_code == 0


def test_on_row_error_fail_stops_the_map_and_fails_the_run(make_play, store_path: Path) -> None:
    play_file = make_play(
        """
        def check(row, rc):
            CALLS.append("check:" + row["n"])
            if row["n"] == "4":
                raise ValueError("row four is bad")
            return "ok"

        @play("strict")
        async def strict(ctx, input):
            rows = [{"n": str(i)} for i in range(50)]
            await ctx.map("m", rows, key="n", concurrency=1, on_row_error="fail", columns={"check": check})
            CALLS.append("after the map")
        """
    )

    out = run(play_file, store_path)

    assert out.result.status == "failed"
    assert out.result.exit_code == 1
    assert "row four is bad" in out.result.error["message"]
    # Its failed cell is kept: a plain resume would fail at once, so the way on is named.
    assert out.result.error["message"].endswith(f"deepline resume {out.result.run_id} --refresh-failed")
    assert "after the map" not in CALLS
    # rows after the failing one were not dispatched (one worker: nothing was in flight)
    assert [f"check:{i}" for i in range(5)] == CALLS
    recorded = {r[2]: r[3] for r in map_rows(store_path, out.result.run_id)}
    assert recorded["4"] == "failed"
    assert set(recorded) <= {str(i) for i in range(5)}


def test_a_map_stopped_early_counts_only_the_rows_it_reached(make_play, store_path: Path) -> None:
    """The map reads its input a chunk ahead (to look the next rows up in the sheet while
    these run); a map that stops counts only the rows it reached: `runs show` and the
    report say what the store holds."""
    play_file = make_play(
        """
        def check(row, rc):
            if row["n"] == "4":
                raise ValueError("row four is bad")
            return "ok"

        @play("strict-long")
        async def strict_long(ctx, input):
            rows = [{"n": str(i)} for i in range(1000)] + [{"n": str(i)} for i in range(100)]  # 100 duplicates, late
            rows = rows[:300] + rows[1000:] + rows[300:1000]  # the duplicates come in the second chunk
            await ctx.map("m", rows, key="n", concurrency=1, on_row_error="fail", columns={"check": check})
        """
    )

    out = run(play_file, store_path)

    assert out.result.status == "failed"
    opened = open_store(str(store_path))
    try:
        [record] = opened.sheets.get_maps(out.result.run_id)
    finally:
        opened.close()
    finished = map_rows(store_path, out.result.run_id)
    assert record.duplicate == 0, record  # the duplicates were read ahead, never reached
    assert record.succeeded + record.failed == len(finished) == 5, (record, len(finished))


# --- reuse across runs -----------------------------------------------------------------------------

REUSE = """
@tool(P + ".a")
async def tool_a(input):
    CALLS.append("tool_a:" + input["id"])
    return {"a": input["id"] + "-a"}

@tool(P + ".b")
async def tool_b(input):
    CALLS.append("tool_b:" + input["id"])
    return {"b": input["id"] + "-b"}

def col_c(row, rc):
    CALLS.append("col_c:" + row["id"])
    return row["a"]["a"] + "+" + row["id"]

async def wrap(pending):
    return {"wrapped": (await pending).output}

@play("reuse")
async def reuse(ctx, input):
    rows = [{"id": str(i)} for i in range(8)] + [{"id": "1"}]
    ds = await ctx.map("m", rows, key="id", columns={
        "a": lambda row, rc: (CALLS.append("col_a:" + row["id"]),
                              rc.tools.execute("a", P + ".a", {"id": row["id"]}))[1],
        "c": col_c,
        "b": Column(COLUMN_B, stale_after_seconds=STALE_B),
        "d": lambda row: "d" + row["id"],
    })
    return list(ds)
"""

# Column `b` as first written, and two edits of it: one that keeps its value (another
# label for the same call) and one that changes it.
COLUMN_B = 'lambda row, rc: (CALLS.append("col_b:" + row["id"]), rc.tools.execute("b", P + ".b", {"id": row["id"]}))[1]'
COLUMN_B_RELABELLED = (
    'lambda row, rc: (CALLS.append("col_b:" + row["id"]), rc.tools.execute("b-lookup", P + ".b", {"id": row["id"]}))[1]'
)
COLUMN_B_WRAPPED = (
    'lambda row, rc: (CALLS.append("col_b:" + row["id"]), wrap(rc.tools.execute("b", P + ".b", {"id": row["id"]})))[1]'
)


def reuse_play(make_play: Callable[..., Path], *, column_b: str = COLUMN_B, stale_b: Any = None) -> Path:
    return make_play(REUSE.replace("COLUMN_B", column_b), STALE_B=stale_b)


def kinds(prefix: str) -> list[str]:
    return sorted(c for c in CALLS if c.startswith(prefix))


def test_a_second_run_reuses_every_cell(make_play, store_url: str) -> None:
    play_file = reuse_play(make_play)
    first = run(play_file, store_url)
    assert len(kinds("tool_")) == 16
    assert first.output[1] == {"id": "1", "a": {"a": "1-a"}, "c": "1-a+1", "b": {"b": "1-b"}, "d": "d1"}
    CALLS.clear()

    second = run(play_file, store_url)

    assert second.result.run_id != first.result.run_id
    assert CALLS == []  # no tool and no resolver was invoked
    assert second.output == first.output
    [completed] = second.of("map.completed")
    assert completed["reused"] == 8
    assert second.result.stats["rows"]["reused"] == 8
    assert second.map_logs() == [summary(8, 8, 0, 1)]


@pytest.mark.parametrize("edit", ["same value", "new value"])
def test_changed_column_code_recomputes_that_column_through_its_receipts(
    make_play, store_url: str, prefix: str, edit: str
) -> None:
    first = run(reuse_play(make_play), store_url)
    CALLS.clear()

    column_b = COLUMN_B_RELABELLED if edit == "same value" else COLUMN_B_WRAPPED
    out = run(reuse_play(make_play, column_b=column_b), store_url)

    assert kinds("col_b:") == sorted(f"col_b:{i}" for i in range(8))  # recomputed
    assert kinds("tool_") == []  # its tool calls hit their receipts: nothing paid again
    assert out.result.stats["tools"][f"{prefix}.b"]["reused"] == 8
    assert out.result.stats["tools"][f"{prefix}.b"]["live"] == 0
    assert kinds("col_a:") == []  # the other columns were reused
    assert kinds("col_c:") == []
    if edit == "same value":
        assert out.output == first.output
    else:
        assert [r["b"] for r in out.output] == [{"wrapped": {"b": f"{i}-b"}} for i in range(8)]
        assert [r["d"] for r in out.output] == [f"d{i}" for i in range(8)]


@pytest.mark.parametrize("depends_on", [None, []])
def test_changed_input_recomputes_the_row_without_paying_again(make_play, store_url: str, depends_on) -> None:
    """A new play input: a column keyed on the whole input (the default) recomputes every
    row, through its receipts; one that declares it reads no input field recomputes only
    the row whose own content changed."""
    play_file = make_play(
        """
        @tool(P + ".t")
        def t(input):
            CALLS.append("tool:" + input["id"])
            return input["id"]

        def note(row, rc):
            CALLS.append("note:" + row["id"])
            return row["note"]

        @play("inputs")
        async def inputs(ctx, input):
            rows = [{"id": "1", "note": "x"}, {"id": "2", "note": input["note"]}]
            ds = await ctx.map("m", rows, key="id", columns={
                "t": lambda row, rc: rc.tools.execute("t", P + ".t", {"id": row["id"]}),
                "note": Column(note, depends_on=DEPENDS_ON),
            })
            return [r["note"] for r in ds]
        """,
        DEPENDS_ON=depends_on,
    )
    run(play_file, store_url, {"note": "old"})
    CALLS.clear()

    out = run(play_file, store_url, {"note": "new"})

    assert out.output == ["x", "new"]
    assert sorted(CALLS) == (["note:1", "note:2"] if depends_on is None else ["note:2"])  # no tool paid again


def test_stale_after_zero_recomputes_the_column_every_run(make_play, store_url: str) -> None:
    play_file = reuse_play(make_play, stale_b=0)
    run(play_file, store_url)
    CALLS.clear()

    out = run(play_file, store_url)

    assert kinds("col_b:") == sorted(f"col_b:{i}" for i in range(8))
    assert kinds("tool_") == sorted(f"tool_b:{i}" for i in range(8))  # a stale cell's calls are made fresh
    assert kinds("col_a:") == []
    assert [r["b"] for r in out.output] == [{"b": f"{i}-b"} for i in range(8)]


def test_a_stale_cell_holding_an_error_is_kept_not_paid_again(make_play, store_url: str, prefix: str) -> None:
    """SPEC §2: a cell holding an error is kept on later runs unless recompute_on_error or
    --refresh-failed, and §3: a failed receipt is retried only so (or when transient). A
    column always stale (stale_after_seconds=0) paid its failed call again on every run,
    under a new idempotency key."""
    play_file = make_play(
        """
        @tool(P + ".v")
        def validate(input):
            CALLS.append("validate:" + input["id"])
            if input["id"] == "bad":
                raise ValueError("not a domain")
            return input["id"]

        @play("stale-errors")
        async def stale_errors(ctx, input):
            rows = [{"id": "ok"}, {"id": "bad"}]
            ds = await ctx.map("m", rows, key="id", columns={
                "v": Column(lambda row, rc: rc.tools.execute("v", P + ".v", {"id": row["id"]}), stale_after_seconds=0),
            })
            return [r.get("_error") for r in ds]
        """
    )
    run(play_file, store_url)
    assert kinds("validate:") == ["validate:bad", "validate:ok"]
    CALLS.clear()

    again = run(play_file, store_url)

    assert kinds("validate:") == ["validate:ok"]  # the stale value is refreshed; the error is kept
    assert again.result.stats["tools"][f"{prefix}.v"]["live"] == 1
    CALLS.clear()
    run(play_file, store_url, refresh_failed=True)
    assert kinds("validate:") == ["validate:bad", "validate:ok"]  # asked: the failure is tried again


def test_a_tool_version_bumped_recomputes_the_cells_that_call_it(make_play, store_url: str) -> None:
    """README: bump a tool's version "when the provider's answers change meaning: calls are
    paid again". A map's cells were reused from the sheet, so the new version was never asked."""
    body = """
        @tool(P + ".t", version=VERSION)
        def t(input):
            CALLS.append("t:" + input["id"])
            return VERSION + "-" + input["id"]

        @play("versions")
        async def versions(ctx, input):
            ds = await ctx.map("m", [{"id": "a"}, {"id": "b"}], key="id", columns={
                "v": lambda row, rc: rc.tools.execute("t", P + ".t", {"id": row["id"]}),
            })
            return [row["v"] for row in ds]
        """
    assert run(make_play(body, VERSION="1"), store_url).output == ["1-a", "1-b"]
    assert run(make_play(body, VERSION="1"), store_url).output == ["1-a", "1-b"]
    assert kinds("t:") == ["t:a", "t:b"]  # once: the second run reused every cell

    assert run(make_play(body, VERSION="2"), store_url).output == ["2-a", "2-b"]
    assert kinds("t:") == ["t:a", "t:a", "t:b", "t:b"]


def test_a_long_stale_after_reuses_the_column(make_play, store_url: str) -> None:
    play_file = reuse_play(make_play, stale_b=3600)
    run(play_file, store_url)
    CALLS.clear()

    run(play_file, store_url)

    assert CALLS == []


def test_a_short_stale_after_recomputes_once_it_has_passed(make_play, store_url: str) -> None:
    play_file = reuse_play(make_play, stale_b=0.05)
    run(play_file, store_url)
    CALLS.clear()
    time.sleep(0.1)  # not a wait for something to happen: the cells must be older than 0.05 s

    run(play_file, store_url)

    assert kinds("col_b:") == sorted(f"col_b:{i}" for i in range(8))
    assert kinds("tool_") == sorted(f"tool_b:{i}" for i in range(8))


def test_force_refresh_recomputes_and_pays_again(make_play, store_url: str) -> None:
    play_file = reuse_play(make_play)
    first = run(play_file, store_url)
    CALLS.clear()

    out = run(play_file, store_url, force_refresh=True)

    assert kinds("tool_a:") == sorted(f"tool_a:{i}" for i in range(8))
    assert kinds("tool_b:") == sorted(f"tool_b:{i}" for i in range(8))
    assert out.output == first.output


ERROR_CELL = """
def flaky(row, rc):
    CALLS.append("flaky:" + row["id"])
    if row["id"] == "2" and Path(FLAG).exists():
        raise ValueError("provider said no")
    return "fine"

@play("errors")
async def errors(ctx, input):
    rows = [{"id": str(i)} for i in range(4)]
    ds = await ctx.map("m", rows, key="id", columns={
        "flaky": Column(flaky, recompute_on_error=RECOMPUTE),
        "after": lambda row: "after",
    })
    return {"failed": ds.failed_count, "rows": list(ds)}
"""


@pytest.mark.parametrize("how", ["kept", "recompute_on_error", "refresh_failed"])
def test_error_cell_is_kept_unless_asked_to_recompute(make_play, store_url: str, tmp_path: Path, how: str) -> None:
    flag = tmp_path / "flag"
    flag.touch()
    play_file = make_play(ERROR_CELL, FLAG=str(flag), RECOMPUTE=how == "recompute_on_error")
    first = run(play_file, store_url)
    assert first.output["failed"] == 1
    assert first.output["rows"][2]["_error"] == "ValueError: provider said no (play.py line 15)"
    flag.unlink()  # the cause is gone
    CALLS.clear()

    second = run(play_file, store_url, refresh_failed=how == "refresh_failed")

    if how == "kept":
        assert CALLS == []
        assert second.output["failed"] == 1
        assert second.output["rows"][2] == {
            "id": "2",
            "flaky": None,
            "after": None,
            "_error": "ValueError: provider said no (play.py line 15)",
        }
        said_no = "row 2 failed: ValueError: provider said no (play.py line 15)"
        assert second.map_logs() == [said_no, summary(4, 3, 1, 0)]
    else:
        assert CALLS == ["flaky:2"]
        assert second.output["failed"] == 0
        assert second.output["rows"][2] == {"id": "2", "flaky": "fine", "after": "after"}
        assert second.map_logs() == [summary(4, 4, 0, 0)]


def test_fixing_a_failing_columns_code_recomputes_its_error_cells(make_play, store_url: str) -> None:
    body = """
        def parse(row, rc):
            CALLS.append("parse:" + row["id"])
            return int(row["id"]) BODY

        @play("fix")
        async def fix(ctx, input):
            rows = [{"id": "1"}, {"id": "0"}, {"id": "2"}]
            ds = await ctx.map("m", rows, key="id", columns={"parse": parse})
            return {"failed": ds.failed_count, "values": [r["parse"] for r in ds]}
        """
    broken = run(make_play(body.replace("BODY", "// int(row['id'])")), store_url)
    assert broken.output == {"failed": 1, "values": [1, None, 1]}
    CALLS.clear()

    fixed = run(make_play(body.replace("BODY", "* 10")), store_url)

    assert fixed.output == {"failed": 0, "values": [10, 0, 20]}
    assert sorted(CALLS) == ["parse:0", "parse:1", "parse:2"]


# --- limit ------------------------------------------------------------------------------------------

LIMITED = """
def col(row, rc):
    CALLS.append("col:" + row["id"])
    return int(row["id"])

@play("limited")
async def limited(ctx, input):
    rows = [{"id": i} for i in ["0", "1", "0", "2", "1", "3", "4", "5", "6"]]
    ds = await ctx.map("m", rows, key="id", limit=input.get("limit"), columns={"v": col})
    return [r["v"] for r in ds]
"""


def test_map_limit_processes_only_the_first_distinct_rows(make_play, store_path: Path) -> None:
    play_file = make_play(LIMITED)

    out = run(play_file, store_path, {"limit": 3})

    assert out.output == [0, 1, 2]
    assert sorted(CALLS) == ["col:0", "col:1", "col:2"]
    assert out.map_logs() == [summary(3, 3, 0, 1)]


def test_run_option_limit_processes_only_the_first_distinct_rows(make_play, store_path: Path) -> None:
    play_file = make_play(LIMITED)

    out = run(play_file, store_path, limit=4)

    assert out.output == [0, 1, 2, 3]
    assert sorted(CALLS) == ["col:0", "col:1", "col:2", "col:3"]
    [started] = out.of("map.started")
    assert started["limit"] == 4

    # the smaller of the two limits wins
    CALLS.clear()
    assert run(play_file, store_path, {"limit": 2}, limit=4).output == [0, 1]


def test_a_full_run_after_a_pilot_reuses_the_pilot_rows(make_play, store_url: str) -> None:
    play_file = make_play(LIMITED)
    run(play_file, store_url, limit=2)
    CALLS.clear()

    out = run(play_file, store_url)

    assert out.output == [0, 1, 2, 3, 4, 5, 6]
    assert sorted(CALLS) == ["col:2", "col:3", "col:4", "col:5", "col:6"]
    assert out.map_logs() == [summary(7, 7, 0, 2)]


# --- fatal errors ------------------------------------------------------------------------------------


def test_a_fatal_error_fails_the_run_and_records_no_failed_row(make_play, store_url: str) -> None:
    play_file = make_play(
        """
        @tool(P + ".spend")
        async def spend(input):
            await asyncio.sleep(0.001)
            if input["id"] == "5":
                raise BudgetExceededError("the run would spend more than --max-credits 10")
            CALLS.append("spend:" + input["id"])
            return 1

        @play("fatal")
        async def fatal(ctx, input):
            rows = [{"id": str(i)} for i in range(12)]
            await ctx.map("m", rows, key="id", concurrency=4, columns={
                "spend": lambda row, rc: rc.tools.execute("spend", P + ".spend", {"id": row["id"]}),
            })
        """
    )

    out = run(play_file, store_url)

    assert out.result.status == "failed"
    assert out.result.exit_code == 1
    assert out.result.error["type"] == "BudgetExceededError"
    assert "max-credits" in out.result.error["message"]
    assert "spend:5" not in CALLS
    recorded = map_rows(store_url, out.result.run_id)
    assert "5" not in {r[2] for r in recorded}
    assert all(r[3] == "succeeded" for r in recorded)
    cells = query(store_url, "SELECT row_key FROM sheet_rows WHERE row_key = '5'")
    assert cells == []
    assert not [line for line in out.logs() if line.startswith("row 5 failed")]


def test_max_credits_fails_the_map_and_a_resume_with_more_budget_pays_nothing_twice(
    make_play, store_url: str, prefix: str
) -> None:
    play_file = make_play(
        """
        @tool(P + ".paid", credits=1)
        async def paid(input):
            CALLS.append("paid:" + input["id"])
            await asyncio.sleep(0.001)
            return {"id": input["id"]}

        @play("budget")
        async def budget(ctx, input):
            rows = [{"id": str(i)} for i in range(20)]
            ds = await ctx.map("m", rows, key="id", concurrency=2, columns={
                "paid": lambda row, rc: rc.tools.execute("paid", P + ".paid", {"id": row["id"]}),
            })
            return {"len": len(ds), "failed": ds.failed_count}
        """
    )

    first = run(play_file, store_url, max_credits=5)

    assert first.result.status == "failed"
    assert first.result.error["type"] == "BudgetExceededError"
    assert 0 < len(CALLS) <= 5
    recorded = map_rows(store_url, first.result.run_id)
    assert {r[3] for r in recorded} == {"succeeded"}  # no row was failed for the budget
    assert not [line for line in first.logs() if " failed: " in line and line.startswith("row ")]
    # The view's last frame counts every row that finished, as the store does.
    assert first.of("map.progress")[-1]["done"] == len(recorded)

    second = resume(first.result.run_id, store_url, max_credits=100)

    assert second.result.status == "completed", second.result.error
    assert second.output == {"len": 20, "failed": 0}
    assert sorted(Counter(CALLS).values()) == [1] * 20  # every call paid exactly once
    assert second.result.stats["credits"] == 20


def test_a_maps_progress_says_the_same_of_its_rows_on_every_attempt(make_play, store_url: str, prefix: str) -> None:
    """Progress events count rows alike in every attempt: `succeeded` and `failed` both hold
    the rows earlier attempts finished (succeeded never goes down on a resume, and the two
    add up to `done`). A map stopped early says how many distinct rows it holds of how many
    the input has (duplicates counted once)."""
    play_file = make_play(
        """
        @tool(P + ".paid", credits=1)
        async def paid(input):
            if input["id"] == "3":
                raise ValueError("no such company")
            return {"id": input["id"]}

        @play("again")
        async def again(ctx, input):
            rows = [{"id": str(i)} for i in range(20)] * 2
            ds = await ctx.map("m", rows, key="id", concurrency=1, columns={
                "paid": lambda row, rc: rc.tools.execute("paid", P + ".paid", {"id": row["id"]}),
            })
            return {"len": len(ds), "failed": ds.failed_count}
        """
    )
    first = run(play_file, store_url, max_credits=8)
    assert first.result.status == "failed"
    opened = open_store(store_url)
    try:
        [record] = opened.sheets.get_maps(first.result.run_id)
    finally:
        opened.close()
    assert (record.total, record.duplicate) == (20, 20), record  # 40 input rows, 20 distinct

    second = resume(first.result.run_id, store_url, max_credits=100)
    assert second.result.status == "completed", second.result.error
    before = first.of("map.progress")[-1]
    during = second.of("map.progress")
    for event in [before, *during]:
        assert event["succeeded"] + event["failed"] == event["done"], event
    assert all(e["succeeded"] >= before["succeeded"] for e in during), (before, during)
    assert during[-1]["succeeded"] == 19 and during[-1]["failed"] == 1


@pytest.mark.parametrize(("limit", "distinct"), [(5, 5), (30, 20)])
def test_a_pilot_with_duplicates_counts_its_progress_in_distinct_rows(
    make_play, store_url: str, limit: int, distinct: int
) -> None:
    """A limit counts distinct rows: the progress of a pilot over a list of duplicates says
    how many of them are done, never more than its total ("36/20" at 100%), and a list
    with fewer distinct rows than the limit ends at those (not at its input rows)."""
    from deepline_cli.ui.console import map_pieces
    from deepline_cli.ui.state import RunView

    play_file = make_play(
        """
        @play("pilot")
        async def pilot(ctx, input):
            rows = [{"id": str(i)} for i in range(20) for _ in range(2)]  # each twice, one after the other
            ds = await ctx.map("m", rows, key="id", concurrency=1, limit=input["limit"],
                               columns={"v": lambda row: row["id"]})
            return len(ds)
        """
    )
    out = run(play_file, store_url, {"limit": limit})
    assert out.output == distinct
    progress = out.of("map.progress")
    assert all(e["done"] <= e["total"] for e in progress), progress
    assert (progress[-1]["done"], progress[-1]["total"]) == (distinct, distinct), progress[-1]
    view = RunView()
    for event in out.events:
        view.apply(event)
    pieces = [text for text, *_ in map_pieces(view.maps["m"])]
    assert pieces[1] == f"{distinct}/{distinct}", pieces


def test_fatal_errors_on_every_worker_fail_the_run_instead_of_hanging(deepline, write_play) -> None:
    """Regression: when every map worker died of a fatal error, the producer blocked forever
    on the full row queue and the run hung instead of failing. Run in a subprocess so a
    regression shows as a timeout, not a stuck test session."""
    play_file = write_play(
        """
        from deepline_cli import BudgetExceededError, play

        def spend(row):
            raise BudgetExceededError("the run would spend more than --max-credits 1")

        @play("fatal")
        async def fatal(ctx, input):
            rows = [{"id": str(i)} for i in range(10)]
            await ctx.map("m", rows, key="id", concurrency=1, columns={"spend": spend})
        """
    )

    try:
        result = deepline("run", str(play_file), "--quiet", timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("the run hung after a fatal error in its only map worker")
    assert result.code == 1, result.stderr
    assert "max-credits" in result.stderr


# --- fail mode and earlier failures ----------------------------------------------------------------

STRICT = """
def check(row, rc):
    CALLS.append("check:" + row["id"])
    if row["id"] == "2" and Path(FLAG).exists():
        raise ValueError("row two is bad")
    return "ok"

@play("strict")
async def strict(ctx, input):
    rows = [{"id": str(i)} for i in range(6)]
    ds = await ctx.map("m", rows, key="id", concurrency=1, on_row_error="fail", columns={"check": check})
    return {"failed": ds.failed_count, "rows": list(ds)}
"""


def test_fail_mode_fails_on_an_error_cell_kept_from_an_earlier_run(make_play, store_url: str, tmp_path: Path) -> None:
    """Regression: a failed cell reused from the sheet did not stop an `on_row_error="fail"`
    map, so the second run completed (exit 0) with a failed row."""
    flag = tmp_path / "flag"
    flag.touch()
    play_file = make_play(STRICT, FLAG=str(flag))
    assert run(play_file, store_url).result.status == "failed"

    again = run(play_file, store_url)  # the error cell is kept (no --refresh-failed)

    assert again.result.status == "failed", again.result.output
    assert again.result.exit_code == 1
    assert "row two is bad" in again.result.error["message"]


def test_resuming_a_fail_mode_run_does_not_complete_with_the_failed_row(
    make_play, store_url: str, tmp_path: Path
) -> None:
    """Regression: the failed row of attempt 1 was seeded as "finished" on resume, so the map
    of an `on_row_error="fail"` run completed (exit 0) with that failed row inside. Its error
    cell is kept (no --refresh-failed), so the map must fail again."""
    flag = tmp_path / "flag"
    flag.touch()
    play_file = make_play(STRICT, FLAG=str(flag))
    first = run(play_file, store_url)
    assert first.result.status == "failed"
    flag.unlink()  # even with the cause gone, the error cell is kept without --refresh-failed
    CALLS.clear()

    again = resume(first.result.run_id, store_url)

    assert again.result.status == "failed", again.result.output
    assert again.result.exit_code == 1
    assert "row two is bad" in again.result.error["message"]
    assert "check:2" not in CALLS


def test_resume_with_refresh_failed_retries_a_row_failed_in_an_earlier_attempt(
    make_play, store_url: str, tmp_path: Path
) -> None:
    """Regression: rows finished by an earlier attempt were seeded and skipped before the
    sheet was consulted, so `resume --refresh-failed` never retried a row failed in attempt 1."""
    flag = tmp_path / "flag"
    flag.touch()
    play_file = make_play(STRICT, FLAG=str(flag))
    first = run(play_file, store_url)
    assert first.result.status == "failed"
    flag.unlink()  # the cause is fixed
    CALLS.clear()

    again = resume(first.result.run_id, store_url, refresh_failed=True)

    assert again.result.status == "completed", again.result.error
    assert "check:2" in CALLS
    assert again.output["failed"] == 0
    assert again.output["rows"][2] == {"id": "2", "check": "ok"}


def test_a_resumed_rows_reused_cells_keep_the_answers_they_found(
    make_play, store_url: str, tmp_path: Path, prefix: str
) -> None:
    """Row 2's company was found in attempt 1, its check failed; the resume reuses the
    company cell and recomputes the check. The map row keeps the company's found answer
    (the report's found rate per provider said 2 of 3 for a lookup that found all 3)."""
    flag = tmp_path / "flag"
    flag.touch()
    play_file = make_play(
        """
        @tool(P + ".co")
        def co(input):
            return {"name": input["id"]}

        @tool(P + ".check")
        def check(input):
            if input["id"] == "2" and Path(FLAG).exists():
                raise ValueError("not yet")
            return "ok"

        @play("found")
        async def found(ctx, input):
            ds = await ctx.map("m", [{"id": str(i)} for i in range(3)], key="id", on_row_error="fail",
                               concurrency=1, columns={
                "co": lambda row, rc: rc.tools.execute("co", P + ".co", {"id": row["id"]}),
                "check": lambda row, rc: rc.tools.execute("check", P + ".check", {"id": row["id"]}),
            })
            return len(ds)
        """,
        FLAG=str(flag),
    )
    first = run(play_file, store_url)
    assert first.result.status == "failed"
    flag.unlink()

    again = resume(first.result.run_id, store_url, refresh_failed=True)

    assert again.output == 3
    keys = [key for (key,) in query(store_url, "SELECT key FROM receipts WHERE tool = ?", f"{prefix}.co")]
    opened = open_store(str(store_url))
    try:
        found = opened.ledger.found_answers(first.result.run_id)
    finally:
        opened.close()
    assert len(keys) == 3 and all(key[:FOUND_PREFIX] in found for key in keys), (keys, found)


# --- events ------------------------------------------------------------------------------------------


def test_map_and_barrier_events(make_play, store_url: str) -> None:
    play_file = make_play(
        """
        @play("events")
        async def events(ctx, input):
            rows = [{"id": str(i % 10)} for i in range(12)]
            await ctx.map("m", rows, key="id", columns={"v": lambda row: row["id"]})
        """
    )

    out = run(play_file, store_url)

    names = [e.event for e in out.events if e.event.startswith(("map.", "barrier."))]
    assert names[0] == "map.started"
    assert names[-1] == "map.completed"
    assert names.index("barrier.visibility") < names.index("barrier.finalization")
    assert "map.progress" in names
    [started] = out.of("map.started")
    assert started["map"] == "m"
    assert started["columns"] == ["v"]
    assert started["total"] == 12
    last_progress = out.of("map.progress")[-1]
    assert last_progress["done"] == 10
    assert last_progress["duplicate"] == 2
    pending, visibility = out.of("barrier.visibility")  # announced while it reads back, then its result
    assert (pending["passed"], pending["expected"]) == (None, 10)
    assert (visibility["passed"], visibility["expected"], visibility["visible"]) == (True, 10, 10)
    pending, finalization = out.of("barrier.finalization")
    assert pending["passed"] is None
    assert finalization["passed"] is True
    assert (finalization["rows"], finalization["distinct"], finalization["duplicate"]) == (12, 10, 2)
    [completed] = out.of("map.completed")
    assert (completed["total"], completed["succeeded"], completed["duplicate"]) == (10, 10, 2)
    assert all(e.run_id == out.result.run_id for e in out.events)


# --- barriers through a test double of the store --------------------------------------------------

BARRIER_PLAY = """
@play("barriers")
async def barriers(ctx, input):
    rows = [{"id": i} for i in ["a", "a", "b", "c", "c", "d", "e"]]
    ds = await ctx.map("leads", rows, key="id", columns={"v": lambda row: row["id"].upper()})
    return len(ds)
"""


class UnderCounting:
    """Reports `missing` fewer finished rows than there are, for the first `reads` reads."""

    missing, reads, counted = 0, 10**6, 0

    def count_map_rows(self, run_id: str, map: str) -> dict[str, int]:
        counts = super().count_map_rows(run_id, map)  # type: ignore[misc]
        self.counted += 1
        if self.counted <= self.reads:
            counts["succeeded"] -= self.missing
        return counts


class Hiding:
    """Hides the finished row `hidden` from `finished_map_rows` while its counts report one
    row too many, so the visibility barrier passes and only reconciliation can notice."""

    hidden = -1

    def count_map_rows(self, run_id: str, map: str) -> dict[str, int]:
        counts = super().count_map_rows(run_id, map)  # type: ignore[misc]
        counts["succeeded"] = counts.get("succeeded", 0) + 1
        return counts

    def finished_map_rows(self, run_id: str, map: str) -> list[int]:
        return [idx for idx in super().finished_map_rows(run_id, map) if idx != self.hidden]  # type: ignore[misc]


def double_of(behaviour: type, url: str, **settings: Any) -> Any:
    """The real store of `url`'s backend, with `behaviour` (a class above) over it."""
    if is_postgres(url):
        from deepline_cli.store.postgres import PostgresStore

        backend: type[Store] = PostgresStore
    else:
        backend = SQLiteStore
    store = type(behaviour.__name__ + backend.__name__, (behaviour, backend), {})(url)
    for name, value in settings.items():
        setattr(store, name, value)
    return store


@pytest.fixture
def quick_visibility(monkeypatch: pytest.MonkeyPatch) -> tuple[float, ...]:
    tries = (0.0, 0.01, 0.01, 0.01)
    monkeypatch.setattr(barriers, "VISIBILITY_WAITS", tries)
    return tries


def test_rows_not_visible_in_the_store_raise_sheet_visibility_error(
    make_play, store_url: str, quick_visibility: tuple[float, ...]
) -> None:
    play_file = make_play(BARRIER_PLAY)
    double = double_of(UnderCounting, store_url, missing=1)

    out = run(play_file, store_url, opened=double, run_id="run-visible")

    assert out.result.status == "failed"
    assert out.result.exit_code == 1
    assert out.result.error["type"] == "SheetVisibilityError"
    message = out.result.error["message"]
    assert "'leads'" in message
    assert "run-visible" in message
    assert "5 rows" in message  # expected
    assert "only 4" in message  # seen
    assert double.counted == len(quick_visibility)  # it retried before giving up
    [visibility] = out.settled("barrier.visibility")
    assert visibility == {
        "map": "leads",
        "expected": 5,
        "visible": 4,
        "reads": len(quick_visibility),
        "passed": False,
    }
    assert out.of("map.completed") == []
    assert not [line for line in out.logs() if line.startswith("Map completed")]


def test_visibility_barrier_retries_until_rows_are_visible(
    make_play, store_url: str, quick_visibility: tuple[float, ...]
) -> None:
    play_file = make_play(BARRIER_PLAY)
    double = double_of(UnderCounting, store_url, missing=2, reads=2)

    out = run(play_file, store_url, opened=double)

    assert out.output == 5
    [visibility] = out.settled("barrier.visibility")
    assert (visibility["passed"], visibility["reads"], visibility["visible"]) == (True, 3, 5)


def test_an_unaccounted_row_raises_map_accounting_error_naming_its_input_index(make_play, store_url: str) -> None:
    play_file = make_play(BARRIER_PLAY)
    # distinct row 3 ("d") is input row 5 (two duplicates come before it)
    double = double_of(Hiding, store_url, hidden=3)

    out = run(play_file, store_url, opened=double, run_id="run-accounting")

    assert out.result.status == "failed"
    assert out.result.exit_code == 1
    assert out.result.error["type"] == "MapAccountingError"
    message = out.result.error["message"]
    assert "'leads'" in message
    assert "run-accounting" in message
    assert "missing input indexes: 5." in message
    [visibility] = out.settled("barrier.visibility")
    assert visibility["passed"] is True
    [finalization] = out.settled("barrier.finalization")
    assert finalization["passed"] is False
    assert finalization["missing"] == [5]
    assert out.of("map.completed") == []


# --- resume -----------------------------------------------------------------------------------------


def test_resume_seeds_rows_finished_by_the_failed_attempt(
    make_play, store_url: str, tmp_path: Path, prefix: str
) -> None:
    flag = tmp_path / "fail-row-150"
    flag.touch()
    play_file = make_play(
        """
        @tool(P + ".work")
        async def work(input):
            await asyncio.sleep(0.0005)
            if input["id"] == "150" and Path(FLAG).exists():
                raise BudgetExceededError("out of credits at row 150")
            CALLS.append("work:" + input["id"])
            return {"id": input["id"], "score": int(input["id"]) * 3}

        @play("seeded")
        async def seeded(ctx, input):
            rows = []
            for i in range(300):
                rows.append({"id": str(i)})
                if i % 15 == 0:
                    rows.append({"id": str(i // 2)})  # a duplicate of an earlier row
            ds = await ctx.map("m", rows, key="id", concurrency=4, columns={
                "work": lambda row, rc: rc.tools.execute("work", P + ".work", {"id": row["id"]}),
                "double": lambda row: row["work"]["score"] * 2,
            })
            return {"len": len(ds), "failed": ds.failed_count, "ids": [r["id"] for r in ds],
                    "scores": [r["double"] for r in ds]}
        """,
        FLAG=str(flag),
    )
    first = run(play_file, store_url)
    assert first.result.status == "failed"
    assert first.result.error["type"] == "BudgetExceededError"
    run_id = first.result.run_id
    finished = {r[2] for r in map_rows(store_url, run_id)}
    assert 0 < len(finished) < 300
    assert "150" not in finished
    before = Counter(CALLS)
    assert all(before[f"work:{key}"] == 1 for key in finished)
    flag.unlink()

    second = resume(run_id, store_url)

    assert second.result.status == "completed", second.result.error
    assert second.result.attempt == 2
    assert second.output["len"] == 300
    assert second.output["failed"] == 0
    assert second.output["ids"] == [str(i) for i in range(300)]
    assert second.output["scores"] == [i * 6 for i in range(300)]
    calls = Counter(CALLS)
    assert all(calls[f"work:{key}"] == 1 for key in finished), "a finished row ran again"
    assert all(calls[f"work:{i}"] == 1 for i in range(300))
    [started] = second.of("map.started")
    assert started["seeded"] == len(finished)
    rows = map_rows(store_url, run_id)
    assert [r[0] for r in rows] == list(range(300))
    assert {r[3] for r in rows} == {"succeeded"}
    assert second.map_logs() == [summary(300, 300, 0, 20)]
    assert second.result.stats["tools"][f"{prefix}.work"]["live"] == 300


RESORTED = """
@tool(P + ".upper", credits=1)
async def upper(input):
    CALLS.append("upper:" + input["name"])
    return {"upper": input["name"].upper()}

async def shout(row, rc):
    return (await rc.tools.execute("upper", P + ".upper", {"name": row["name"]})).output["upper"] + SUFFIX

@play("shout")
async def shout_play(ctx, input):
    rows = await ctx.map("people", ctx.csv(input["csv"]), key="id", columns={"shout": shout}, concurrency=1)
    return [[r["id"], r["name"], r["shout"]] for r in rows]
"""


def test_a_resume_redoes_the_finished_rows_whose_input_or_code_changed_since(
    make_play, store_url: str, tmp_path: Path
) -> None:
    """The budget stops the map after two rows; then the sheet is re-sorted (ids renumbered:
    row 1 is now alice, not dave) and the column's code changes for one setting. The resume
    kept the first attempt's rows at their places whole: dave and carol twice, alice and bob
    never asked. A resume reuses a row's cells only while its input and code still match."""
    people = tmp_path / "people.csv"
    people.write_text("id,name\n1,dave\n2,carol\n3,bob\n4,alice\n")
    play_file = make_play(RESORTED, SUFFIX="")
    first = run(play_file, store_url, {"csv": str(people)}, max_credits=2)
    assert first.result.status == "failed" and CALLS == ["upper:dave", "upper:carol"], CALLS
    people.write_text("id,name\n1,alice\n2,bob\n3,carol\n4,dave\n")
    second = resume(first.result.run_id, store_url, max_credits=100)
    expected = [["1", "alice", "ALICE"], ["2", "bob", "BOB"], ["3", "carol", "CAROL"], ["4", "dave", "DAVE"]]
    assert second.output == expected
    assert sorted(CALLS) == ["upper:alice", "upper:bob", "upper:carol", "upper:dave"]  # each name paid once
    assert [second.result.stats["rows"][k] for k in ("succeeded", "failed")] == [4, 0]
    # The code changes (a setting the resolver reads): the rows an attempt finished are redone.
    play_file = make_play(RESORTED, SUFFIX="!")
    (tmp_path / "people2.csv").write_text("id,name\n1,erin\n2,frank\n3,gina\n")
    third = run(play_file, store_url, {"csv": str(tmp_path / "people2.csv")}, max_credits=1)
    assert third.result.status == "failed"
    play_file = make_play(RESORTED, SUFFIX="?")
    fourth = resume(third.result.run_id, store_url, max_credits=100)
    assert fourth.output == [["1", "erin", "ERIN?"], ["2", "frank", "FRANK?"], ["3", "gina", "GINA?"]]
    assert sorted(CALLS)[-3:] == ["upper:erin", "upper:frank", "upper:gina"] and len(CALLS) == 7  # erin once


def test_a_resume_stopped_again_over_a_shorter_input_keeps_no_row_the_input_lost(
    make_play, store_url: str, tmp_path: Path
) -> None:
    """20 leads, 12 done; the first 10 leads are dropped from the CSV; the resume stops again
    after 3 more. Rows 5–9 (no longer in the file) were still the map's, the export held them
    and not 15–19, and said the map had "all its 10 rows"."""
    people = tmp_path / "people.csv"
    people.write_text("id,name\n" + "".join(f"{i},u{i}\n" for i in range(20)))
    play_file = make_play(RESORTED, SUFFIX="")
    first = run(play_file, store_url, {"csv": str(people)}, max_credits=12)
    assert first.result.status == "failed"
    people.write_text("id,name\n" + "".join(f"{i},u{i}\n" for i in range(10, 20)))
    second = resume(first.result.run_id, store_url, max_credits=15)
    assert second.result.status == "failed"
    kept = sorted(int(r[2]) for r in map_rows(store_url, first.result.run_id))
    assert kept == [10, 11, 12, 13, 14], kept  # 10, 11 from the first attempt; 12-14 from the resume
    third = resume(first.result.run_id, store_url, max_credits=100)
    assert [r[0] for r in third.output] == [str(i) for i in range(10, 20)]
    assert sorted(Counter(CALLS).values()) == [1] * 20  # 0-11, then 12-14 and 15-19: each name paid once


def test_a_resume_given_force_refresh_asks_again_the_rows_its_run_failed(
    make_play, store_url: str, tmp_path: Path
) -> None:
    """Attempt 1 failed row 2 for good (the provider refused it), then stopped after the map;
    the account fixed, `resume --force-refresh` took the row back whole as failed, no call."""
    flag = tmp_path / "refuse"
    flag.touch()
    play_file = make_play(
        """
        @tool(P + ".check", credits=1)
        async def check(input):
            CALLS.append("check:" + input["id"])
            if input["id"] == "2" and Path(FLAG).exists():
                raise ValueError("refused")
            return {"ok": input["id"]}

        @play("forced")
        async def forced(ctx, input):
            rows = await ctx.map("m", [{"id": str(i)} for i in range(4)], key="id", columns={
                "ok": lambda row, rc: rc.tools.execute("c", P + ".check", {"id": row["id"]}),
            })
            if ctx.run.attempt == 1:
                raise RuntimeError("after the map")
            return rows.failed_count
        """,
        FLAG=str(flag),
    )
    first = run(play_file, store_url)
    assert first.result.status == "failed" and CALLS.count("check:2") == 1
    flag.unlink()
    second = resume(first.result.run_id, store_url, force_refresh=True)
    assert second.output == 0, second.result.error
    assert CALLS.count("check:2") == 2


def test_a_value_with_no_json_form_is_refused_naming_its_column_or_step(make_play, store_url: str) -> None:
    """A column or a step returning an object: it was stored as its repr ("<Thing object at
    0x7f…>"), exported so, and different in every run. The run fails, saying where."""
    play_file = make_play(
        """
        class Thing:
            pass

        @play("odd")
        async def odd(ctx, input):
            if input.get("step"):
                return await ctx.step("o", lambda: {"thing": Thing()})
            if input.get("keyed"):
                return len(await ctx.map("k", [{"id": "1"}], key="id", columns={"k": lambda row: {Thing(): 1}}))
            return len(await ctx.map("m", [{"id": "1"}], key="id", columns={"t": lambda row: Thing()}))
        """
    )
    column = run(play_file, store_url)
    assert column.result.status == "failed"
    assert "column 't' holds a Thing, which has no JSON form" in column.result.error["message"]
    step = run(play_file, store_url, {"step": True})
    assert step.result.status == "failed"
    assert "step 'o' holds a Thing, which has no JSON form" in step.result.error["message"]
    keyed = run(play_file, store_url, {"keyed": True})  # it was stored keyed by the object's repr
    assert keyed.result.status == "failed"
    assert "column 'k' holds a dict keyed by an object" in keyed.result.error["message"]


def test_a_tool_of_a_module_the_play_imports_whole_is_versioned_too(make_play, store_url: str, tmp_path: Path) -> None:
    """`import providers` (not `from providers import lookup`): bumping the tool's version
    there left the map's cells as they were."""
    providers = tmp_path / "providers_v.py"
    body = """
        import providers_v

        @play("imported")
        async def imported(ctx, input):
            ds = await ctx.map("m", [{"id": "a"}], key="id", columns={
                "v": lambda row, rc: rc.tools.execute("t", "pv.lookup", {"id": row["id"]}),
            })
            return [row["v"] for row in ds]
        """
    tool = 'from deepline_cli import tool\n\n@tool("pv.lookup", version={v!r})\ndef lookup(input):\n    return {v!r}\n'
    providers.write_text(tool.format(v="1"))
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        assert run(make_play(body), store_url).output == ["1"]
        providers.write_text(tool.format(v="2"))
        sys.modules.pop("providers_v", None)
        shutil.rmtree(tmp_path / "__pycache__", ignore_errors=True)
        assert run(make_play(body), store_url).output == ["2"]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("providers_v", None)


def test_a_parameter_with_a_default_is_left_to_its_default(make_play, store_path: Path) -> None:
    """`run_if=has` with `def has(row, field="domain")` got the row's index as `field`, and
    a resolver `def enrich(row, provider="hunter")` got `rc` (a memory address stored in
    the sheet); columns made in a loop (`lambda row, p=p: …`) likewise. Only parameters
    without a default are given (row; rc, or the index), and one named `rc` or `index`."""
    play_file = make_play(
        """
        from deepline_cli import Column

        def has(row, field="domain"):
            return bool(row.get(field))

        def enrich(row, provider="hunter"):
            return f"{provider}:{row['domain']}"

        @play("defaults")
        async def defaults(ctx, input):
            columns = {"x": Column(lambda row: "ran", run_if=has), "y": enrich}
            for p in ("a", "b"):
                columns[p] = lambda row, p=p: p
            columns["rc"] = lambda row, rc, p="c": (p, rc.row_key)
            columns["opt"] = lambda row, rc=None: rc.row_key if rc is not None else "no rc"
            rows = await ctx.map("m", [{"domain": "d.com"}, {"domain": ""}], key="domain", columns=columns)
            return [dict(r) for r in rows]
        """
    )
    out = run(play_file, store_path)
    assert out.output == [
        {"domain": "d.com", "x": "ran", "y": "hunter:d.com", "a": "a", "b": "b", "rc": ["c", "d.com"], "opt": "d.com"},
        {"domain": "", "x": None, "y": "hunter:", "a": "a", "b": "b", "rc": ["c", "row 2"], "opt": "row 2"},
    ], out.output


def test_only_the_columns_given_fewer_arguments_than_before_are_computed_again() -> None:
    """Cells an earlier deepline computed with the row's index or rc in a parameter that
    has a default (`def has(row, field="domain")`) are computed again after the upgrade;
    columns called as before keep their cells."""

    def has(row, field="domain"):
        return bool(row.get(field))

    def plain(row):
        return 1

    def with_rc(row, rc):
        return 2

    def optional_rc(row, rc=None):
        return 3

    def looped(row, rc, p="c"):
        return p

    from deepline_cli.runtime.map.columns import _given_before, arity

    # (given before, given now): only `has` is given fewer, and only its cells are recomputed.
    assert [(_given_before(f), arity(f)) for f in (has, plain, with_rc, optional_rc, looped)] == [
        (2, 1), (1, 1), (2, 2), (2, 2), (2, 2)
    ]  # fmt: skip
    from deepline_cli import _json
    from deepline_cli.runtime.map.columns import code_fingerprint, input_fingerprint, resolve_columns

    def as_before(fn) -> str:  # the fingerprint with no mark of how it is called
        return _json.digest(code_fingerprint(fn), input_fingerprint({}, None))[:16]

    from deepline_cli import steps

    resolved = {  # the part a cell an earlier deepline stored is judged by (same_fingerprint)
        c.name: c.fingerprint.partition(":")[0] for c in resolve_columns({"h": has, "p": plain, "l": looped}, {})
    }
    marked = steps().step("a", plain).step("b", lambda row, provider="hunter": provider).__fingerprint__()
    assert marked.count("given 1") == 1  # the step given fewer (rc was its `provider`), not the other
    assert resolved["h"] != as_before(has)
    assert (resolved["p"], resolved["l"]) == (as_before(plain), as_before(looped))


def test_a_cell_recomputed_from_an_old_answer_is_as_old_as_that_answer(
    make_play, store_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Column `a` went stale and changed, so `b` was recomputed from its receipt (younger
    than its 5 s): the cell took the time of its recompute, and at 5.6 s the next run found
    it young and served the answer from 0 s, older than `b` may be. A cell is as old as the
    answers it was made from."""
    import time as clock

    now = [clock.time()]
    monkeypatch.setattr(clock, "time", lambda: now[0])
    play_file = make_play(
        """
        @tool(P + ".a")
        def tool_a(input):
            CALLS.append("a")
            return {"t": time.time()}

        @tool(P + ".b")
        def tool_b(input):
            CALLS.append("b")
            return {"t": time.time()}

        @play("stale-chain")
        async def chain(ctx, input):
            rows = await ctx.map("m", [{"id": "1"}], key="id", columns={
                "a": Column(lambda row, rc: rc.tools.execute("a", P + ".a", {"id": row["id"]}), stale_after_seconds=3),
                "b": Column(lambda row, rc: rc.tools.execute("b", P + ".b", {"id": row["id"]}), stale_after_seconds=5),
            })
            return [dict(r) for r in rows]
        """
    ).read_text()
    path = store_path.parent / "play.py"
    path.write_text("import time\n" + play_file)
    start = now[0]
    for at in (0.0, 3.3, 5.6):
        now[0] = start + at
        run(path, store_path)
    assert CALLS == ["a", "b", "a", "b"], CALLS  # b paid again at 5.6 s: its answer was 5.6 s old


SLASHED_PLAY = """
from deepline_cli import play, tool

@tool("slash.score", credits=1)
def score(input):
    with open(input["log"], "a") as f:
        f.write(input["d"] + "\\n")
    return len(input["d"]) + OFFSET

@play(PLAY)
async def scored(ctx, input):
    rows = await ctx.map(MAP, [{"d": "x.com"}, {"d": "yy.com"}], key="d", columns={
        "s": lambda row, rc: rc.tools.execute("s", "slash.score", {"d": row["d"], "log": input["log"]}),
    })
    return [row["s"] for row in rows]
"""


def test_a_play_and_a_map_with_a_slash_in_their_names_keep_their_own_sheet(deepline, write_play, tmp_path) -> None:
    """Play "acme" with map "q1/leads" and play "acme/q1" with map "leads" shared one sheet
    (its name was workspace/play/map): the second play was given the first's cells, and
    called nothing."""
    log = str(tmp_path / "calls.log")

    def source(play: str, map_name: str, offset: int) -> str:
        return SLASHED_PLAY.replace("PLAY", repr(play)).replace("MAP", repr(map_name)).replace("OFFSET", str(offset))

    first = write_play(source("acme", "q1/leads", 0), "a.py")
    second = write_play(source("acme/q1", "leads", 100), "b.py")
    a = deepline("run", str(first), "--set", f"log={log}", "--json")
    b = deepline("run", str(second), "--set", f"log={log}", "--json")
    assert a.code == 0 and b.code == 0, (a.stderr, b.stderr)
    assert a.json_lines()[-1]["output"] == [5, 6]
    assert b.json_lines()[-1]["output"] == [105, 106]  # its own tool's answers, not play acme's cells
    assert sorted((tmp_path / "calls.log").read_text().split()) == ["x.com", "x.com", "yy.com", "yy.com"]


ORDERED_PLAY = """
from deepline_cli import Column, play

def a(row):
    return int(row["id"]) * 10

def b(row):
    return (row.get("a") or 0) + 1

@play("ordered")
async def ordered(ctx, input):
    chosen = {"a": Column(a, depends_on=[]), "b": Column(b, depends_on=[])}
    columns = {name: chosen[name] for name in input["order"]}
    rows = await ctx.map("m", [{"id": "1"}, {"id": "2"}], key="id", columns=columns)
    return [row.get("b") for row in rows]
"""


@pytest.mark.parametrize("then", ["ba", "b"])
def test_a_column_moved_or_removed_before_another_recomputes_it(deepline, write_play, tmp_path, then: str) -> None:
    """Column b reads column a. With a moved after b, or taken out, b's cells were given back
    as a computed them before (11, 21), where a fresh store gives 1, 1: b sees the columns
    before it, and those changed."""
    write_play(ORDERED_PLAY)
    first = deepline("run", "play.py", "--input", '{"order": "ab"}', "--json")
    assert first.json_lines()[-1]["output"] == [11, 21], first.stderr
    again = deepline("run", "play.py", "--input", json.dumps({"order": then}), "--json")
    fresh = deepline(
        "run", "play.py", "--input", json.dumps({"order": then}), "--json", DEEPLINE_STORE=str(tmp_path / "fresh.db")
    )
    assert again.json_lines()[-1]["output"] == fresh.json_lines()[-1]["output"] == [1, 1], (again.stderr, fresh.stderr)
    # Nothing before it changed: a third run gives every cell back.
    third = deepline("run", "play.py", "--input", json.dumps({"order": then}), "--json")
    assert third.json_lines()[-1]["stats"]["rows"]["reused"] == 2, third.json_lines()[-1]["stats"]["rows"]


def test_a_cell_stored_before_cells_named_the_columns_before_them_is_still_reused() -> None:
    """Cells stored by an earlier deepline carry one fingerprint, made with every declared
    tool's version: they are judged by it (an upgrade recomputes nothing while the tools are
    as they were), and new cells by the columns before them and the tools they call."""
    from deepline_cli import _json
    from deepline_cli.runtime.map.columns import code_fingerprint, input_fingerprint, resolve_columns, same_fingerprint

    def plain(row):
        return 1

    tools = {"t.a": "1", "t.b": "2"}
    (column,) = resolve_columns({"p": plain}, {}, tools=tools)
    every = _json.digest("t.a\0" + "1", "t.b\0" + "2")[:16]  # RunTools.versions() as it was
    stored_then = _json.digest(code_fingerprint(plain), input_fingerprint({}, None), every)[:16]
    assert column.legacy == stored_then and same_fingerprint(stored_then, column)
    assert same_fingerprint(column.fingerprint, column)
    code, _, before = column.fingerprint.partition(":")
    assert not same_fingerprint(f"{code}:{'1' * len(before)}", column)  # the columns before it changed
    assert not same_fingerprint("cd34" * 4, column) and not same_fingerprint(None, column)
    assert not same_fingerprint("[redacted]", column)  # a cell a secret was redacted from
    (bumped,) = resolve_columns({"p": plain}, {}, tools={**tools, "t.b": "3"})
    assert not same_fingerprint(stored_then, bumped)  # as before: a tool bumped, old cells recomputed
    # A map over another map's rows: its cells were keyed with the CSV's path in the input then.
    given = {"csv": "/data/leads.csv"}
    (chained,) = resolve_columns({"p": plain}, given, rows_path="/data/leads.csv", tools=tools, own_path=False)
    then = _json.digest(code_fingerprint(plain), input_fingerprint(given, None), every)[:16]
    assert same_fingerprint(then, chained) and chained.fingerprint.partition(":")[0] != then


TOOLED_PLAY = """
from deepline_cli import play, tool

def logged(what):
    with open(LOG, "a") as f:
        f.write(what + "\\n")

@tool("t.a", credits=1, version=VERSION)
def a(input):
    logged("a")
    return input["d"].upper()

def noted(row, rc):
    return rc.step("note", lambda: logged("step") or "n")

@play("tooled")
async def tooled(ctx, input):
    rows = await ctx.map("m", [{"d": "x"}, {"d": "y"}], key="d", columns={
        "A": lambda row, rc: rc.tools.execute("a", "t.a", {"d": row["d"]}),
        "S": noted,
    })
    return len(rows)
"""


def test_a_tool_added_or_bumped_recomputes_only_the_columns_that_call_it(deepline, write_play, tmp_path) -> None:
    """A provider added to deepline.toml recomputed every cell of every map (the steps in
    them ran again), and a tool's version bumped every column, its own or not."""
    log = tmp_path / "calls.log"

    def run(version: str) -> list[str]:
        write_play(TOOLED_PLAY.replace("LOG", repr(str(log))).replace("VERSION", repr(version)))
        before = log.read_text().split() if log.exists() else []
        assert deepline("run", "play.py").code == 0
        return sorted(log.read_text().split()[len(before) :])

    assert run("1") == ["a", "a", "step", "step"]
    (tmp_path / "deepline.toml").write_text('[tools."t.new"]\nurl = "http://127.0.0.1:9/new"\n')
    assert run("1") == []  # a tool no column calls: nothing computed again
    assert run("2") == ["a", "a"]  # its version bumped: the column calling it, not the other
