"""The receipt state machine on a real SQLite file, then `ReceiptBook` through real plays.

Store tests pass explicit `now` values (T0 + n) so lease expiry never depends on the
wall clock. Play tests run the real `Runner` (it calls asyncio.run itself, so they are
plain sync tests); their local tools count invocations in `CALLS` below, which the
play files import, so counts survive the play module being re-imported on every run.
"""

from __future__ import annotations

import sqlite3
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deepline_cli.errors import StoreError
from deepline_cli.runtime.events import EventBus
from deepline_cli.runtime.runner import Runner, RunOptions, RunResult
from deepline_cli.store.base import (
    Claim,
    LogLine,
    Receipt,
    ReceiptQuery,
    RunRecord,
    Settlement,
    Writes,
    claim,
    decide_claim,
    settle,
)
from deepline_cli.store.sqlite import SQLiteStore

T0 = 1_700_000_000.0
TTL = 30.0

# Invocations of the play files' local tools: one entry (the tool id) per call.
CALLS: list[str] = []
# Idempotency keys seen by tools that take `(input, call)`.
KEYS: list[str] = []


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "receipts.db"


@pytest.fixture
def store(db: Path) -> Iterator[SQLiteStore]:
    opened = SQLiteStore(db)
    yield opened
    opened.close()


@pytest.fixture
def other(db: Path, store: SQLiteStore) -> Iterator[SQLiteStore]:
    """A second connection to the same file: another process's view of the store."""
    opened = SQLiteStore(db)
    yield opened
    opened.close()


def mk_claim(
    key: str,
    *,
    run_id: str = "r1",
    attempt: int = 1,
    lease: str = "L1",
    expires: float = T0 + TTL,
    tool: str | None = "demo.tool",
    **options: Any,
) -> Claim:
    return Claim(
        key=key,
        kind="tool",
        label=f"label-{key}",
        tool=tool,
        run_id=run_id,
        attempt=attempt,
        lease_id=lease,
        lease_expires_at=expires,
        idempotency_key=f"idem-{key}",
        fresh_idempotency_key=f"idem-{key}-{lease}",
        **options,
    )


def completed(key: str, lease: str = "L1", output: Any = None, credits: float = 0.0) -> Settlement:
    return Settlement(key, lease, "completed", output=output, credits=credits)


def failed(key: str, lease: str = "L1", *, retryable: bool, kind: str = "internal") -> Settlement:
    error = {"message": f"{key} broke", "category": kind, "retryable": retryable}
    return Settlement(key, lease, "failed", error=error, failure_kind=kind, retryable=retryable)


def one(store: SQLiteStore, c: Claim, now: float) -> tuple[str, Receipt]:
    [outcome] = claim(store, [c], now)
    return outcome.verdict, outcome.receipt


def stored(store: SQLiteStore, key: str) -> Receipt:
    receipt = store.get_receipt(key)
    assert receipt is not None, f"no receipt {key}"
    return receipt


def keys_of(receipts: list[Receipt]) -> set[str]:
    return {r.key for r in receipts}


# --- claims -------------------------------------------------------------------------------


def test_first_claim_creates_a_running_receipt_owned_by_the_claimer(store: SQLiteStore) -> None:
    verdict, receipt = one(store, mk_claim("k"), T0)

    assert verdict == "claimed"
    row = stored(store, "k")
    assert row == receipt
    assert (row.status, row.run_id, row.attempt, row.lease_id) == ("running", "r1", 1, "L1")
    assert row.lease_expires_at == T0 + TTL
    assert row.idempotency_key == "idem-k"
    assert (row.kind, row.label, row.tool) == ("tool", "label-k", "demo.tool")
    assert row.created_at == T0
    assert row.completed_at is None


def test_claim_of_a_live_lease_by_another_run_is_busy(store: SQLiteStore, other: SQLiteStore) -> None:
    one(store, mk_claim("k"), T0)

    verdict, receipt = one(other, mk_claim("k", run_id="r2", lease="L2", expires=T0 + 40), T0 + 10)

    assert verdict == "busy"
    assert (receipt.run_id, receipt.lease_id, receipt.lease_expires_at) == ("r1", "L1", T0 + TTL)
    assert stored(store, "k").lease_id == "L1"


def test_same_attempt_claiming_its_own_live_receipt_again_is_busy(store: SQLiteStore) -> None:
    one(store, mk_claim("k"), T0)

    assert one(store, mk_claim("k", lease="L1b"), T0 + 1)[0] == "busy"
    assert stored(store, "k").lease_id == "L1"


def test_expired_lease_is_taken_over_and_the_old_owner_can_no_longer_settle(
    store: SQLiteStore, other: SQLiteStore
) -> None:
    one(store, mk_claim("k"), T0)

    verdict, receipt = one(other, mk_claim("k", run_id="r2", lease="L2", expires=T0 + 100), T0 + TTL + 1)

    assert verdict == "claimed"
    assert (receipt.run_id, receipt.lease_id) == ("r2", "L2")
    assert settle(store, [completed("k", "L1", {"late": True})], T0 + TTL + 2) == [False]
    row = stored(store, "k")
    assert (row.status, row.run_id, row.lease_id, row.output) == ("running", "r2", "L2", None)
    assert settle(other, [completed("k", "L2", {"ok": 1})], T0 + TTL + 3) == [True]
    assert stored(store, "k").output == {"ok": 1}


def test_a_later_attempt_of_the_same_run_takes_over_at_once(store: SQLiteStore) -> None:
    one(store, mk_claim("k", attempt=1, lease="L1"), T0)

    verdict, receipt = one(store, mk_claim("k", attempt=2, lease="L2"), T0 + 1)

    assert verdict == "claimed"
    assert (receipt.attempt, receipt.lease_id) == (2, "L2")
    assert settle(store, [completed("k", "L1")], T0 + 2) == [False]
    # An earlier attempt never takes a receipt back from a later one.
    assert one(store, mk_claim("k", attempt=1, lease="L3"), T0 + 3)[0] == "busy"


def test_completed_receipt_is_reused_with_its_output_and_credits(store: SQLiteStore, other: SQLiteStore) -> None:
    one(store, mk_claim("k"), T0)
    assert settle(store, [completed("k", output={"email": "a@b.c"}, credits=2.5)], T0 + 5) == [True]

    verdict, receipt = one(other, mk_claim("k", run_id="r2", lease="L2"), T0 + 1000)

    assert verdict == "reused"
    assert receipt.status == "completed"
    assert receipt.output == {"email": "a@b.c"}
    assert receipt.credits == 2.5
    assert receipt.run_id == "r1"
    assert receipt.completed_at == T0 + 5
    assert stored(store, "k").lease_id == "L1"


@pytest.mark.parametrize(
    ("stale_after_s", "age", "verdict"),
    [
        (None, 10_000_000.0, "reused"),
        (0, 0.0, "claimed"),
        (0, 50.0, "claimed"),
        (100, 50.0, "reused"),
        (100, 100.0, "reused"),
        (100, 100.5, "claimed"),
    ],
)
def test_stale_after_decides_whether_a_completed_receipt_is_reused(
    store: SQLiteStore, stale_after_s: float | None, age: float, verdict: str
) -> None:
    one(store, mk_claim("k"), T0)
    settle(store, [completed("k", output=1)], T0 + 5)

    claim_ = mk_claim("k", run_id="r2", lease="L2", expires=T0 + 5 + age + TTL, stale_after_s=stale_after_s)

    assert one(store, claim_, T0 + 5 + age)[0] == verdict
    assert stored(store, "k").status == ("completed" if verdict == "reused" else "running")


def test_force_reclaims_a_completed_receipt(store: SQLiteStore) -> None:
    one(store, mk_claim("k"), T0)
    settle(store, [completed("k", output=1)], T0 + 1)

    verdict, receipt = one(store, mk_claim("k", run_id="r2", lease="L2", force=True), T0 + 2)

    assert verdict == "claimed"
    assert (receipt.status, receipt.lease_id) == ("running", "L2")
    row = stored(store, "k")
    assert (row.status, row.run_id, row.lease_id) == ("running", "r2", "L2")
    assert row.idempotency_key == "idem-k-L2"
    assert settle(store, [completed("k", "L2", output=2)], T0 + 3) == [True]
    assert stored(store, "k").output == 2


def test_permanent_failure_is_reported_unless_refresh_failed(store: SQLiteStore) -> None:
    one(store, mk_claim("k"), T0)
    assert settle(store, [failed("k", retryable=False, kind="validation")], T0 + 1) == [True]

    verdict, receipt = one(store, mk_claim("k", run_id="r2", lease="L2"), T0 + 2)
    assert verdict == "failed"
    assert receipt.status == "failed"
    assert receipt.failure_kind == "validation"
    assert receipt.retryable is False
    assert receipt.error == {"message": "k broke", "category": "validation", "retryable": False}
    assert stored(store, "k").status == "failed"

    verdict, receipt = one(store, mk_claim("k", run_id="r3", lease="L3", refresh_failed=True), T0 + 3)
    assert verdict == "claimed"
    row = stored(store, "k")
    assert (row.status, row.run_id, row.error, row.failure_kind) == ("running", "r3", None, None)


def test_transient_failure_is_claimed_again(store: SQLiteStore) -> None:
    one(store, mk_claim("k"), T0)
    settle(store, [failed("k", retryable=True, kind="rate_limit")], T0 + 1)
    assert stored(store, "k").retryable is True

    verdict, receipt = one(store, mk_claim("k", run_id="r2", lease="L2"), T0 + 2)

    assert verdict == "claimed"
    assert (receipt.status, receipt.lease_id) == ("running", "L2")


@pytest.mark.parametrize("status", ["completed", "failed", "released"])
def test_only_the_lease_owner_can_settle(store: SQLiteStore, status: str) -> None:
    one(store, mk_claim("k"), T0)
    before = stored(store, "k")

    wrong = Settlement("k", "not-the-lease", status, output={"x": 1}, credits=9)  # type: ignore[arg-type]
    assert settle(store, [wrong], T0 + 1) == [False]
    assert stored(store, "k") == before

    right = Settlement("k", "L1", status, output={"x": 1}, credits=9)  # type: ignore[arg-type]
    assert settle(store, [right], T0 + 2) == [True]
    if status != "released":
        # Settling again with the same lease (a transaction run again after its connection
        # dropped) is the same settlement: reported applied, and nothing changes.
        assert settle(store, [right], T0 + 3) == [True]
        assert stored(store, "k").status == status


def test_settling_an_unknown_key_is_refused(store: SQLiteStore) -> None:
    assert settle(store, [completed("nope")], T0) == [False]
    assert store.get_receipt("nope") is None


def test_heartbeat_extends_live_leases_and_reports_lost_ones(store: SQLiteStore, other: SQLiteStore) -> None:
    claim(store, [mk_claim("a"), mk_claim("b", lease="L2"), mk_claim("c", lease="L3")], T0)
    settle(store, [completed("c", "L3")], T0 + 1)
    c_before = stored(store, "c")
    # b's lease expires and another run takes it over.
    assert one(other, mk_claim("b", run_id="r2", lease="M2", expires=T0 + 200), T0 + 31)[0] == "claimed"

    lost = store.heartbeat_receipts([("a", "L1"), ("b", "L2"), ("c", "L3")], T0 + 500)

    assert lost == {"L2", "L3"}
    assert stored(store, "a").lease_expires_at == T0 + 500
    b = stored(store, "b")
    assert (b.lease_id, b.lease_expires_at) == ("M2", T0 + 200)
    assert stored(store, "c") == c_before
    assert store.heartbeat_receipts([], T0 + 600) == set()


def test_expire_run_receipts_frees_only_that_runs_running_receipts(store: SQLiteStore) -> None:
    claim(store, [mk_claim("a"), mk_claim("b", lease="L2"), mk_claim("c", run_id="r2", lease="M")], T0)
    settle(store, [completed("b", "L2")], T0 + 1)

    assert store.expire_run_receipts("r1") == 1

    assert one(store, mk_claim("a", run_id="r3", lease="N"), T0 + 2)[0] == "claimed"
    assert one(store, mk_claim("c", run_id="r3", lease="N2"), T0 + 2)[0] == "busy"


# --- batches ------------------------------------------------------------------------------


def test_a_batch_of_500_claims_gives_500_outcomes_in_order(store: SQLiteStore, other: SQLiteStore) -> None:
    keys = [f"key-{i:04d}" for i in range(500)]
    # Not sorted: outcomes must follow the claims, not the table's order.
    order = keys[::2] + keys[1::2][::-1]

    applied = store.apply(Writes(claims=[mk_claim(k, lease=f"L-{k}") for k in order]), T0)

    assert applied.settled == []
    assert [o.receipt.key for o in applied.outcomes] == order
    assert {o.verdict for o in applied.outcomes} == {"claimed"}
    assert len(store.query_receipts(ReceiptQuery())) == 500

    settle(store, [completed(k, f"L-{k}", output=k) for k in keys[:250]], T0 + 1)
    again = other.apply(Writes(claims=[mk_claim(k, run_id="r2", lease=f"M-{k}") for k in order]), T0 + 2)

    assert [o.receipt.key for o in again.outcomes] == order
    expected = ["reused" if k in set(keys[:250]) else "busy" for k in order]
    assert [o.verdict for o in again.outcomes] == expected
    assert [o.receipt.output for o in again.outcomes if o.verdict == "reused"] == [
        k for k in order if k in set(keys[:250])
    ]


def test_two_claims_for_one_new_key_in_one_batch(store: SQLiteStore) -> None:
    applied = store.apply(Writes(claims=[mk_claim("k"), mk_claim("k", run_id="r2", lease="L2", expires=T0 + 99)]), T0)

    assert [o.verdict for o in applied.outcomes] == ["claimed", "busy"]
    assert applied.outcomes[1].receipt.lease_id == "L1"
    assert stored(store, "k").lease_id == "L1"


def test_settlements_apply_before_claims_in_the_same_batch(store: SQLiteStore) -> None:
    one(store, mk_claim("k"), T0)

    applied = store.apply(
        Writes(
            settlements=[completed("k", output={"done": True}, credits=1)],
            claims=[mk_claim("k", run_id="r2", lease="L2")],
        ),
        T0 + 1,
    )

    assert applied.settled == [True]
    [outcome] = applied.outcomes
    assert outcome.verdict == "reused"
    assert outcome.receipt.output == {"done": True}
    assert outcome.receipt.credits == 1


def test_claim_survives_reopening_the_file(db: Path) -> None:
    first = SQLiteStore(db)
    one(first, mk_claim("k"), T0)
    settle(first, [completed("k", output=[1, 2])], T0 + 1)
    first.close()

    reopened = SQLiteStore(db)
    try:
        assert one(reopened, mk_claim("k", run_id="r2", lease="L2"), T0 + 2)[0] == "reused"
        assert stored(reopened, "k").output == [1, 2]
    finally:
        reopened.close()


# --- queries ------------------------------------------------------------------------------


def test_query_by_run_lists_owned_and_reused_receipts(store: SQLiteStore) -> None:
    claim(store, [mk_claim("owned-1"), mk_claim("owned-2", lease="L2")], T0)
    settle(store, [completed("owned-1"), completed("owned-2", "L2")], T0 + 1)
    claim(store, [mk_claim("r2-own", run_id="r2", lease="M1")], T0 + 2)

    assert one(store, mk_claim("owned-1", run_id="r2", lease="M2"), T0 + 3)[0] == "reused"

    assert keys_of(store.query_receipts(ReceiptQuery(run_id="r2"))) == {"owned-1", "r2-own"}
    assert keys_of(store.query_receipts(ReceiptQuery(run_id="r1"))) == {"owned-1", "owned-2"}
    assert store.query_receipts(ReceiptQuery(run_id="r9")) == []
    # The owner column still says who paid for it.
    [reused] = [r for r in store.query_receipts(ReceiptQuery(run_id="r2")) if r.key == "owned-1"]
    assert reused.run_id == "r1"


def test_query_by_run_includes_receipts_taken_over_from_the_run(store: SQLiteStore) -> None:
    one(store, mk_claim("k"), T0)
    one(store, mk_claim("k", run_id="r2", lease="L2", expires=T0 + 100), T0 + TTL + 1)

    assert keys_of(store.query_receipts(ReceiptQuery(run_id="r1"))) == {"k"}
    assert keys_of(store.query_receipts(ReceiptQuery(run_id="r2"))) == {"k"}


def test_query_filters_by_key_prefix_status_tool_and_limit(store: SQLiteStore) -> None:
    claim(
        store,
        [
            mk_claim("aa01", lease="1", tool="t.one"),
            mk_claim("aa02", lease="2", tool="t.two"),
            mk_claim("ab01", lease="3", tool="t.one"),
            mk_claim("b", lease="4", tool=None),
        ],
        T0,
    )
    settle(store, [completed("aa01", "1"), failed("ab01", "3", retryable=False)], T0 + 1)

    def q(**fields: Any) -> list[str]:
        return [r.key for r in store.query_receipts(ReceiptQuery(**fields))]

    assert q() == ["aa01", "aa02", "ab01", "b"]
    assert q(key_prefix="aa") == ["aa01", "aa02"]
    assert q(key_prefix="a") == ["aa01", "aa02", "ab01"]
    assert q(key_prefix="zz") == []
    assert q(status="completed") == ["aa01"]
    assert q(status="failed") == ["ab01"]
    assert q(status="running") == ["aa02", "b"]
    assert q(tool="t.one") == ["aa01", "ab01"]
    assert q(tool="t.one", status="failed") == ["ab01"]
    assert q(key_prefix="a", tool="t.two") == ["aa02"]
    assert q(limit=2) == ["aa01", "aa02"]
    assert q(run_id="r1", key_prefix="ab") == ["ab01"]


# --- runs, migrations, logs ---------------------------------------------------------------


def make_run(run_id: str = "run-1", **fields: Any) -> RunRecord:
    base: dict[str, Any] = {
        "play": "demo",
        "play_ref": "/tmp/play.py:demo",
        "input": {"csv": "/tmp/leads.csv", "n": [1, 2]},
        "holder": "host:1",
        "lease_expires_at": T0 + TTL,
        "options": {"limit": 5},
        "created_at": T0,
        "updated_at": T0,
    }
    return RunRecord(run_id=run_id, **{**base, **fields})


def test_insert_and_get_run_round_trip(store: SQLiteStore, other: SQLiteStore) -> None:
    record = make_run(stats={"credits": 3.0}, root_run_id="run-1", cwd="/work")
    store.insert_run(record)

    assert other.get_run("run-1") == record
    assert other.get_run("missing") is None


def test_lease_run_is_compare_and_set_on_the_attempt(store: SQLiteStore, other: SQLiteStore) -> None:
    store.insert_run(make_run(status="failed", holder=None))

    assert store.lease_run("run-1", holder="A:1", expires_at=T0 + 60, attempt=2, expect_attempt=1)
    assert not other.lease_run("run-1", holder="B:2", expires_at=T0 + 90, attempt=2, expect_attempt=1)

    record = other.get_run("run-1")
    assert record is not None
    assert (record.holder, record.attempt, record.status, record.lease_expires_at) == (
        "A:1",
        2,
        "running",
        T0 + 60,
    )
    # Knowing the current attempt is what it takes to lease it next.
    assert other.lease_run("run-1", holder="B:2", expires_at=T0 + 90, attempt=3, expect_attempt=2)
    assert not store.lease_run("run-9", holder="A:1", expires_at=T0, attempt=2, expect_attempt=1)


def test_heartbeat_run_only_for_the_current_holder_and_attempt(store: SQLiteStore) -> None:
    store.insert_run(make_run(holder="A:1", attempt=2))

    assert not store.heartbeat_run("run-1", holder="B:2", attempt=2, expires_at=T0 + 99)
    assert not store.heartbeat_run("run-1", holder="A:1", attempt=1, expires_at=T0 + 99)
    record = store.get_run("run-1")
    assert record is not None and record.lease_expires_at == T0 + TTL

    assert store.heartbeat_run("run-1", holder="A:1", attempt=2, expires_at=T0 + 99)
    record = store.get_run("run-1")
    assert record is not None and record.lease_expires_at == T0 + 99


def test_store_written_by_a_newer_deepline_refuses_to_open(db: Path) -> None:
    SQLiteStore(db).close()
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("INSERT INTO _migrations (name, applied_at) VALUES ('9999_from_the_future', 0)")
    conn.close()

    with pytest.raises(StoreError) as info:
        SQLiteStore(db)

    message = str(info.value)
    assert "newer deepline" in message
    assert str(db) in message
    assert "9999_from_the_future" in message


def test_logs_round_trip_in_order_per_run(store: SQLiteStore, other: SQLiteStore) -> None:
    lines = [
        LogLine("r1", 1, T0, "info", "first"),
        LogLine("r2", 1, T0, "info", "someone else"),
        LogLine("r1", 2, T0 + 1, "warning", "second: ünïcode ✓"),
    ]
    store.apply(Writes(logs=lines[:2]), T0)
    store.apply(Writes(logs=lines[2:]), T0 + 1)

    assert other.get_logs("r1") == [lines[0], lines[2]]
    assert other.get_logs("r2") == [lines[1]]
    assert other.get_logs("r3") == []


def test_decide_claim_treats_a_skipped_receipt_as_free() -> None:
    skipped = Receipt(key="k", kind="tool", label="", tool=None, status="skipped", run_id="r1", attempt=1)
    assert decide_claim(skipped, mk_claim("k", run_id="r2"), T0) == "claimed"
    assert decide_claim(None, mk_claim("k"), T0) == "claimed"


# --- ReceiptBook through real plays -------------------------------------------------------


def write_play(tmp_path: Path, body: str, name: str = "play.py") -> Path:
    header = """\
        import asyncio

        from deepline_cli import ProviderTransientError, play, tool
        from tests.test_receipts_store import CALLS, KEYS
        """
    path = tmp_path / name
    path.write_text(textwrap.dedent(header) + textwrap.dedent(body))
    return path


def run(play_file: Path, store: Path, input: dict[str, Any] | None = None, **options: Any) -> RunResult:
    runner = Runner(RunOptions(store=str(store), **options), EventBus())
    try:
        return runner.start(str(play_file), input or {})
    finally:
        runner.close()


def resume(run_id: str, store: Path, **options: Any) -> RunResult:
    runner = Runner(RunOptions(store=str(store), **options), EventBus())
    try:
        return runner.resume(run_id)
    finally:
        runner.close()


def receipts_of(store_file: Path, **query: Any) -> list[Receipt]:
    opened = SQLiteStore(store_file)
    try:
        return opened.query_receipts(ReceiptQuery(**query))
    finally:
        opened.close()


def test_identical_concurrent_calls_share_one_invocation_and_a_rerun_pays_nothing(tmp_path: Path, db: Path) -> None:
    tool_id = "rb.gather.lookup"
    play_file = write_play(
        tmp_path,
        f"""
        @tool("{tool_id}", credits=1)
        async def lookup(input):
            CALLS.append("{tool_id}")
            return {{"echo": input["q"]}}

        @play("gather")
        async def gather(ctx, input):
            same = await asyncio.gather(
                *(ctx.tools.execute(f"same-{{i}}", "{tool_id}", {{"q": "x"}}) for i in range(20))
            )
            seq = [await ctx.tools.execute(f"seq-{{i}}", "{tool_id}", {{"q": i}}) for i in range(3)]
            return {{
                "same": [r.execution for r in same],
                "outputs": [r.output for r in same],
                "seq": [r.execution for r in seq],
                "seq_outputs": [r.output for r in seq],
            }}
        """,
    )

    first = run(play_file, db)

    assert first.status == "completed", first.error
    assert CALLS.count(tool_id) == 4
    assert sorted(first.output["same"]) == ["in_flight"] * 19 + ["live"]
    assert first.output["outputs"] == [{"echo": "x"}] * 20
    assert first.output["seq"] == ["live"] * 3
    assert first.stats["tools"][tool_id]["live"] == 4
    assert first.stats["tools"][tool_id]["credits"] == 4

    second = run(play_file, db)

    assert second.status == "completed", second.error
    assert second.run_id != first.run_id
    assert CALLS.count(tool_id) == 4
    assert second.output["seq"] == ["receipt"] * 3
    assert second.output["seq_outputs"] == [{"echo": 0}, {"echo": 1}, {"echo": 2}]
    assert sorted(second.output["same"]) == ["in_flight"] * 19 + ["receipt"]
    assert second.output["outputs"] == [{"echo": "x"}] * 20
    assert second.stats["tools"][tool_id]["live"] == 0
    assert second.stats["tools"][tool_id]["credits"] == 0
    # `receipts inspect --run` of the rerun lists the four receipts it reused.
    used = receipts_of(db, run_id=second.run_id)
    assert len(used) == 4
    assert {r.run_id for r in used} == {first.run_id}
    assert {r.status for r in used} == {"completed"}


def test_idempotency_key_is_stable_across_runs_and_new_when_forced(tmp_path: Path, db: Path) -> None:
    tool_id = "rb.idem.echo"
    play_file = write_play(
        tmp_path,
        f"""
        @tool("{tool_id}")
        async def echo(input, call):
            CALLS.append("{tool_id}")
            KEYS.append(call.idempotency_key)
            if len(KEYS) == 1:
                raise ProviderTransientError("try again", category="rate_limit")
            return {{"key": call.idempotency_key, "receipt_key": call.receipt_key,
                     "run_id": call.run_id, "attempt": call.attempt}}

        @play("idem")
        async def idem(ctx, input):
            result = await ctx.tools.execute("echo", "{tool_id}", {{"q": 1}}, force=input["force"])
            return {{**result.output, "execution": result.execution, "key_of_result": result.receipt_key}}
        """,
    )
    KEYS.clear()

    first = run(play_file, db, {"force": False})  # transient failure: retried next run
    second = run(play_file, db, {"force": False})

    assert first.status == "failed"
    assert second.status == "completed", second.error
    assert KEYS[0] == KEYS[1]
    assert KEYS[0].startswith("dl-")
    assert second.output["key"] == KEYS[1]
    assert second.output["run_id"] == second.run_id
    assert second.output["attempt"] == 1
    assert second.output["receipt_key"] == second.output["key_of_result"]

    third = run(play_file, db, {"force": True})
    fourth = run(play_file, db, {"force": True})

    assert (third.status, fourth.status) == ("completed", "completed")
    assert (third.output["execution"], fourth.output["execution"]) == ("live", "live")
    assert CALLS.count(tool_id) == 4
    assert len(set(KEYS)) == 3  # forced calls each carry a fresh key
    assert third.output["receipt_key"] == second.output["receipt_key"]
    [receipt] = receipts_of(db, tool=tool_id)
    assert receipt.idempotency_key == KEYS[-1]


def test_local_tool_error_fails_for_good_until_refresh_failed(tmp_path: Path, db: Path) -> None:
    tool_id = "rb.value.boom"
    play_file = write_play(
        tmp_path,
        f"""
        @tool("{tool_id}")
        async def boom(input):
            CALLS.append("{tool_id}")
            if CALLS.count("{tool_id}") == 1:
                raise ValueError("bad shape")
            return {{"ok": True}}

        @play("value")
        async def value_play(ctx, input):
            result = await ctx.tools.execute("boom", "{tool_id}", {{"q": 1}})
            return result.output
        """,
    )

    first = run(play_file, db)

    assert first.status == "failed"
    assert first.error is not None
    assert "bad shape" in first.error["message"]
    [receipt] = receipts_of(db, tool=tool_id)
    assert (receipt.status, receipt.failure_kind, receipt.retryable) == ("failed", "internal", False)
    assert receipt.error is not None and receipt.error["category"] == "internal"
    assert CALLS.count(tool_id) == 1

    second = run(play_file, db)

    assert second.status == "failed"
    assert CALLS.count(tool_id) == 1
    assert second.error is not None and "bad shape" in second.error["message"]
    assert second.stats["tools"][tool_id]["failed"] == 1

    third = run(play_file, db, refresh_failed=True)

    assert third.status == "completed", third.error
    assert third.output == {"ok": True}
    assert CALLS.count(tool_id) == 2
    [receipt] = receipts_of(db, tool=tool_id)
    assert (receipt.status, receipt.failure_kind, receipt.error) == ("completed", None, None)


def test_provider_transient_error_is_retried_on_the_next_run(tmp_path: Path, db: Path) -> None:
    tool_id = "rb.transient.flaky"
    play_file = write_play(
        tmp_path,
        f"""
        @tool("{tool_id}")
        async def flaky(input):
            CALLS.append("{tool_id}")
            if CALLS.count("{tool_id}") == 1:
                raise ProviderTransientError("503 from upstream", category="upstream", status_code=503)
            return {{"ok": True}}

        @play("transient")
        async def transient(ctx, input):
            return (await ctx.tools.execute("flaky", "{tool_id}", {{"q": 1}})).output
        """,
    )

    first = run(play_file, db)

    assert first.status == "failed"
    [receipt] = receipts_of(db, tool=tool_id)
    assert (receipt.status, receipt.failure_kind, receipt.retryable) == ("failed", "upstream", True)

    second = run(play_file, db)

    assert second.status == "completed", second.error
    assert second.output == {"ok": True}
    assert CALLS.count(tool_id) == 2


def test_step_runs_once_per_run_and_a_resume_replays_its_value(tmp_path: Path, db: Path) -> None:
    marker = "rb.step.compute"
    play_file = write_play(
        tmp_path,
        f"""
        @play("stepper")
        async def stepper(ctx, input):
            def compute():
                CALLS.append("{marker}")
                return {{"n": CALLS.count("{marker}")}}

            async def compute_async():
                return compute()

            first = await ctx.step("compute", compute)
            again = await ctx.step("compute", compute)
            other = await ctx.step("other", compute_async)
            if ctx.run.attempt == 1 and input["fail"]:
                raise RuntimeError("the play failed after its steps")
            return {{"first": first, "again": again, "other": other, "attempt": ctx.run.attempt}}
        """,
    )

    failed_run = run(play_file, db, {"fail": True})

    assert failed_run.status == "failed"
    assert failed_run.error is not None
    assert "the play failed after its steps" in failed_run.error["message"]
    assert CALLS.count(marker) == 2  # "compute" once, "other" once

    resumed = resume(failed_run.run_id, db)

    assert resumed.status == "completed", resumed.error
    assert resumed.run_id == failed_run.run_id
    assert resumed.output == {"first": {"n": 1}, "again": {"n": 1}, "other": {"n": 2}, "attempt": 2}
    assert CALLS.count(marker) == 2

    fresh = run(play_file, db, {"fail": False})

    assert fresh.status == "completed", fresh.error
    assert fresh.output == {"first": {"n": 3}, "again": {"n": 3}, "other": {"n": 4}, "attempt": 1}
    assert CALLS.count(marker) == 4


def test_a_local_tool_error_reaches_the_play_as_the_same_tool_error_live_and_replayed(tmp_path: Path, db: Path) -> None:
    """The play sees one error type for a failed call, whether it just ran or was replayed."""
    tool_id = "rb.value.typed"
    play_file = write_play(
        tmp_path,
        f"""
        from deepline_cli import ToolExecutionError

        @tool("{tool_id}")
        async def boom(input):
            CALLS.append("{tool_id}")
            raise ValueError("bad shape")

        @play("typed")
        async def typed(ctx, input):
            try:
                await ctx.tools.execute("boom", "{tool_id}", {{"q": 1}})
            except ToolExecutionError as exc:
                return {{"type": type(exc).__name__, "category": exc.category,
                         "retryable": exc.retryable, "message": str(exc)}}
            return "no error"
        """,
    )

    first = run(play_file, db)
    second = run(play_file, db)

    assert CALLS.count(tool_id) == 1
    assert second.status == "completed", second.error
    assert second.output["category"] == "internal"
    assert second.output["retryable"] is False
    assert first.status == "completed", f"the live failure escaped as {first.error}"
    assert first.output == second.output
