"""The store contract: one suite, every test on every backend (SQLite, then PostgreSQL).

Each test gets `store_url` (see conftest: a SQLite file, then, when
DEEPLINE_TEST_POSTGRES_URL is set, an emptied PostgreSQL database) and opens it with
`open_store`, so SQLite and PostgreSQL are held to the same behaviour: the receipt state
machine, leases and takeover, runs, queries, credits, logs, sheets and maps, boundaries,
events, the journal, child runs and schema versions. Times are explicit (`T0 + n`),
never the wall clock (PostgreSQL's `now()` is the server's), and no store test sleeps.
The last tests race two stores (two connections, two threads) and two `deepline run`
processes on the same calls: each distinct call is claimed, executed and paid once.
"""

from __future__ import annotations

import gc
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from deepline_cli import _json
from deepline_cli.errors import StoreError
from deepline_cli.store import open_store
from deepline_cli.store.claims import claim, given_back, settle
from deepline_cli.store.records import (
    Boundary,
    CallRecord,
    Cell,
    Claim,
    ClaimOutcome,
    LogLine,
    MapRecord,
    MapRow,
    Receipt,
    ReceiptQuery,
    RunRecord,
    Settlement,
    SheetRow,
    Writes,
)
from deepline_cli.store.roles import Store
from tests.helpers import is_postgres

T0 = 1_700_000_000.0
TTL = 30.0


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = open_store(store_url)
    yield opened
    opened.close()


@pytest.fixture
def other(store_url: str, store: Store) -> Iterator[Store]:
    """A second connection to the same store: another process's (or machine's) view."""
    opened = open_store(store_url)
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
    fields: dict[str, Any] = {"kind": "tool", "idempotency_key": f"idem-{key}", **options}
    return Claim(
        key=key,
        label=f"label-{key}",
        tool=tool,
        run_id=run_id,
        attempt=attempt,
        lease_id=lease,
        lease_expires_at=expires,
        fresh_idempotency_key=f"idem-{key}-{lease}",
        **fields,
    )


def completed(
    key: str, lease: str = "L1", output: Any = None, credits: float = 0.0, *, run_id: str = "r1"
) -> Settlement:
    return Settlement(
        key, lease, "completed", output=output, credits=credits, call=CallRecord(run_id, 1, "tool", "demo.tool", T0)
    )


def failed(key: str, lease: str = "L1", *, retryable: bool, kind: str = "internal") -> Settlement:
    error = {"message": f"{key} broke", "category": kind, "retryable": retryable}
    return Settlement(key, lease, "failed", error=error, failure_kind=kind, retryable=retryable)


def one(store: Store, c: Claim, now: float) -> tuple[str, Receipt]:
    [outcome] = claim(store, [c], now)
    return outcome.verdict, outcome.receipt


def stored(store: Store, key: str) -> Receipt:
    receipt = store.get_receipt(key)
    assert receipt is not None, f"no receipt {key}"
    return receipt


def keys_of(receipts: list[Receipt]) -> set[str]:
    return {r.key for r in receipts}


def seed(store: Any, record: RunRecord) -> bool:
    """Put a run in the store as it would be after its life so far: inserted running, then
    moved (through the run state machine) to the status the test wants."""
    status, record.status = record.status, "running"
    inserted = bool(store.insert_run(record))
    if inserted and status != "running":
        assert store.set_status(record.run_id, status), status
    return inserted


def make_run(run_id: str = "run-1", **fields: Any) -> RunRecord:
    base: dict[str, Any] = {
        "play": "demo",
        "play_ref": "/tmp/play.py:demo",
        "input": {"csv": "/tmp/leads.csv", "n": [1, 2]},
        "holder": "host:1",
        "lease_expires_at": T0 + TTL,
        "options": {"limit": 5},
        "root_run_id": run_id,
        "created_at": T0,
        "updated_at": T0,
    }
    return RunRecord(run_id=run_id, **{**base, **fields})


# --- the store itself -------------------------------------------------------------------


def test_open_store_picks_the_backend_from_the_url(store_url: str, store: Store) -> None:
    backend = type(store).__name__
    assert backend == ("PostgresStore" if is_postgres(store_url) else "SQLiteStore")
    if not is_postgres(store_url):
        assert store.url == f"sqlite:///{store_url}"


def test_now_is_a_wall_clock_in_epoch_seconds(store: Store) -> None:
    # PostgreSQL answers with the server's clock; this server runs on this machine.
    before = time.time()
    now = store.now()
    assert isinstance(now, float)
    assert before - 5 < now < time.time() + 5


# --- claims -------------------------------------------------------------------------------


def test_first_claim_creates_a_running_receipt_owned_by_the_claimer(store: Store) -> None:
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
    assert (row.output, row.error, row.failure_kind, row.retryable, row.credits) == (None, None, None, False, 0.0)


def test_claims_in_one_batch_whose_descriptions_are_text_and_a_number_are_each_kept(store: Store) -> None:
    """A play's `description=` comes from its own data (a cell that is a number in one row,
    text in the next): the batch claims both, each description kept as text."""
    outcomes = claim(store, [mk_claim("d1", description="find the CEO"), mk_claim("d2", description=5)], T0)

    assert [o.verdict for o in outcomes] == ["claimed", "claimed"]
    assert stored(store, "d1").description == "find the CEO"
    assert stored(store, "d2").description == "5"


def test_claim_of_a_live_lease_by_another_run_is_busy(store: Store, other: Store) -> None:
    one(store, mk_claim("k"), T0)

    verdict, receipt = one(other, mk_claim("k", run_id="r2", lease="L2", expires=T0 + 40), T0 + 10)

    assert verdict == "busy"
    assert (receipt.run_id, receipt.lease_id, receipt.lease_expires_at) == ("r1", "L1", T0 + TTL)
    assert stored(store, "k").lease_id == "L1"


def test_same_attempt_claiming_its_own_live_receipt_again_is_busy(store: Store) -> None:
    one(store, mk_claim("k"), T0)

    assert one(store, mk_claim("k", lease="L1b"), T0 + 1)[0] == "busy"
    assert stored(store, "k").lease_id == "L1"


def test_a_lease_expiring_exactly_now_is_taken_over(store: Store, other: Store) -> None:
    one(store, mk_claim("k"), T0)

    assert one(other, mk_claim("k", run_id="r2", lease="L2"), T0 + TTL - 0.5)[0] == "busy"
    assert one(other, mk_claim("k", run_id="r2", lease="L3", expires=T0 + 99), T0 + TTL)[0] == "claimed"
    assert stored(store, "k").lease_id == "L3"


def test_expired_lease_is_taken_over_and_the_old_owner_can_no_longer_settle(store: Store, other: Store) -> None:
    one(store, mk_claim("k"), T0)

    verdict, receipt = one(other, mk_claim("k", run_id="r2", lease="L2", expires=T0 + 100), T0 + TTL + 1)

    assert verdict == "claimed"
    assert (receipt.run_id, receipt.lease_id, receipt.lease_expires_at) == ("r2", "L2", T0 + 100)
    # The first owner may have sent the call: the new owner sends it under the same key.
    assert receipt.idempotency_key == "idem-k"
    assert settle(store, [completed("k", "L1", {"late": True})], T0 + TTL + 2) == [False]
    row = stored(store, "k")
    assert (row.status, row.run_id, row.lease_id, row.output) == ("running", "r2", "L2", None)
    assert row.created_at == T0  # a takeover keeps the receipt's birth time
    assert settle(other, [completed("k", "L2", {"ok": 1})], T0 + TTL + 3) == [True]
    assert stored(store, "k").output == {"ok": 1}


def test_a_later_attempt_of_the_same_run_takes_over_at_once(store: Store) -> None:
    one(store, mk_claim("k", attempt=1, lease="L1"), T0)

    verdict, receipt = one(store, mk_claim("k", attempt=2, lease="L2"), T0 + 1)

    assert verdict == "claimed"
    assert (receipt.attempt, receipt.lease_id) == (2, "L2")
    assert settle(store, [completed("k", "L1")], T0 + 2) == [False]
    # An earlier attempt never takes a receipt back from a later one.
    assert one(store, mk_claim("k", attempt=1, lease="L3"), T0 + 3)[0] == "busy"
    # Nor does a later attempt of another run while the lease is live.
    assert one(store, mk_claim("k", run_id="r2", attempt=5, lease="L4"), T0 + 3)[0] == "busy"


def test_completed_receipt_is_reused_with_its_output_and_credits(store: Store, other: Store) -> None:
    one(store, mk_claim("k"), T0)
    output = {"email": "a@b.c", "nested": [1, 2.5, None, "ü"], "flag": True}
    assert settle(store, [completed("k", output=output, credits=2.5)], T0 + 5) == [True]

    verdict, receipt = one(other, mk_claim("k", run_id="r2", lease="L2"), T0 + 1000)

    assert verdict == "reused"
    assert receipt.status == "completed"
    assert receipt.output == output
    assert receipt.credits == 2.5
    assert receipt.run_id == "r1"
    assert receipt.completed_at == T0 + 5
    assert stored(store, "k").lease_id == "L1"
    assert stored(store, "k").lease_expires_at is None


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
    store: Store, stale_after_s: float | None, age: float, verdict: str
) -> None:
    one(store, mk_claim("k"), T0)
    settle(store, [completed("k", output=1)], T0 + 5)

    claim_ = mk_claim("k", run_id="r2", lease="L2", expires=T0 + 5 + age + TTL, stale_after_s=stale_after_s)

    assert one(store, claim_, T0 + 5 + age)[0] == verdict
    assert stored(store, "k").status == ("completed" if verdict == "reused" else "running")


@pytest.mark.parametrize(("kind", "verdict"), [("tool", "reused"), ("step", "claimed"), ("fetch", "claimed")])
def test_a_stale_answer_of_the_same_run_is_replayed_unless_run_scoped(store: Store, kind: str, verdict: str) -> None:
    """A resume (a later attempt of the run) replays a tool call that run was answered,
    however stale: it is not paid for twice. A step's or fetch's key is its run's own,
    so its staleness can only be judged within its run."""
    one(store, replace(mk_claim("k"), kind=kind), T0)
    settle(store, [completed("k", output=1)], T0 + 5)

    resumed = replace(mk_claim("k", attempt=2, lease="L2", expires=T0 + 60 + TTL, stale_after_s=0), kind=kind)

    assert one(store, resumed, T0 + 60)[0] == verdict


@pytest.mark.parametrize("asked", [{"stale_after_s": 5.0}, {"refresh_after_s": 5.0}])
def test_another_runs_answer_a_run_took_is_replayed_by_its_resume_however_old(store: Store, asked: Any) -> None:
    """Staleness (a call's or its cell's) is judged once per run: an answer of another run
    this run took while it was fresh is what its resume replays, once it has gone stale
    (a nightly refresh resumed the next morning), not a call paid for again. A run that
    never took it pays for it; a force given to the resume (--force-refresh) asks it again."""
    one(store, mk_claim("k"), T0)
    settle(store, [completed("k", output=1)], T0 + 1)
    taken = mk_claim("k", run_id="r2", lease="L2", expires=T0 + 2 + TTL, stale_after_s=5.0)
    assert one(store, taken, T0 + 2)[0] == "reused"

    resumed = mk_claim("k", run_id="r2", attempt=2, lease="L3", expires=T0 + 60 + TTL, **asked)
    verdict, receipt = one(store, resumed, T0 + 60)

    assert (verdict, receipt.run_id, receipt.output) == ("reused", "r1", 1)
    forced = mk_claim("k", run_id="r2", attempt=3, lease="L5", expires=T0 + 60 + TTL, force=True)
    assert one(store, forced, T0 + 60)[0] == "claimed"
    settle(store, [completed("k", "L5", output=3, run_id="r2")], T0 + 61)
    another = mk_claim("k", run_id="r3", lease="L4", expires=T0 + 62 + TTL, **asked)
    assert one(store, another, T0 + 70)[0] == "claimed"


@pytest.mark.parametrize("asked", [{"stale_after_s": 0.0}, {"refresh_after_s": 0.0}, {"force": True}])
def test_a_run_whose_paid_answer_another_run_refreshed_replays_that_one_on_resume(store: Store, asked: Any) -> None:
    """A run pays for a call and is stopped before its row is written; another run then
    refreshes that receipt (stale, or forced). The first run's resume was answered once
    already: it takes the refreshed answer, it does not pay a third time."""
    one(store, mk_claim("k", **asked), T0)
    settle(store, [completed("k", output=1)], T0 + 1)
    assert one(store, mk_claim("k", run_id="r2", lease="L2", expires=T0 + 2 + TTL, **asked), T0 + 2)[0] == "claimed"
    settle(store, [completed("k", "L2", output=2, run_id="r2")], T0 + 3)

    resumed = mk_claim("k", attempt=2, lease="L3", expires=T0 + 60 + TTL, **asked)
    verdict, receipt = one(store, resumed, T0 + 60)

    assert (verdict, receipt.run_id, receipt.output) == ("reused", "r2", 2)


def test_force_reclaims_a_completed_receipt(store: Store) -> None:
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


def test_force_does_not_take_a_live_lease(store: Store) -> None:
    one(store, mk_claim("k"), T0)

    assert one(store, mk_claim("k", run_id="r2", lease="L2", force=True), T0 + 1)[0] == "busy"
    assert stored(store, "k").lease_id == "L1"


def test_permanent_failure_is_reported_unless_refresh_failed(store: Store) -> None:
    one(store, mk_claim("k"), T0)
    assert settle(store, [failed("k", retryable=False, kind="validation")], T0 + 1) == [True]

    verdict, receipt = one(store, mk_claim("k", run_id="r2", lease="L2"), T0 + 2)
    assert verdict == "failed"
    assert receipt.status == "failed"
    assert receipt.failure_kind == "validation"
    assert receipt.retryable is False
    assert receipt.error == {"message": "k broke", "category": "validation", "retryable": False}
    assert receipt.output is None
    assert stored(store, "k").status == "failed"

    verdict, receipt = one(store, mk_claim("k", run_id="r3", lease="L3", refresh_failed=True), T0 + 3)
    assert verdict == "claimed"
    row = stored(store, "k")
    assert (row.status, row.run_id, row.error, row.failure_kind, row.retryable) == ("running", "r3", None, None, False)


def test_force_retries_a_permanent_failure(store: Store) -> None:
    one(store, mk_claim("k"), T0)
    settle(store, [failed("k", retryable=False)], T0 + 1)

    assert one(store, mk_claim("k", run_id="r2", lease="L2", force=True), T0 + 2)[0] == "claimed"


def test_transient_failure_is_claimed_again(store: Store) -> None:
    one(store, mk_claim("k"), T0)
    settle(store, [failed("k", retryable=True, kind="rate_limit")], T0 + 1)
    assert stored(store, "k").retryable is True

    verdict, receipt = one(store, mk_claim("k", run_id="r2", lease="L2"), T0 + 2)

    assert verdict == "claimed"
    assert (receipt.status, receipt.lease_id) == ("running", "L2")
    assert stored(store, "k").retryable is False


def test_a_failed_settlement_keeps_no_output(store: Store) -> None:
    one(store, mk_claim("k"), T0)
    bad = Settlement("k", "L1", "failed", output={"partial": 1}, error={"message": "x"}, failure_kind="internal")

    assert settle(store, [bad], T0 + 1) == [True]

    assert stored(store, "k").output is None


@pytest.mark.parametrize("status", ["completed", "failed", "released"])
def test_only_the_lease_owner_can_settle(store: Store, other: Store, status: str) -> None:
    one(store, mk_claim("k"), T0)
    before = stored(store, "k")

    wrong = Settlement("k", "not-the-lease", status, output={"x": 1}, credits=9)  # type: ignore[arg-type]
    assert settle(other, [wrong], T0 + 1) == [False]
    assert stored(store, "k") == before

    right = Settlement("k", "L1", status, output={"x": 1}, credits=9)  # type: ignore[arg-type]
    assert settle(store, [right], T0 + 2) == [True]
    if status != "released":
        # Settling again with the same lease (a transaction run again after its connection
        # dropped) is the same settlement: reported applied, and nothing changes.
        assert settle(store, [right], T0 + 3) == [True]
        row = stored(other, "k")
        assert row.status == status
        assert row.completed_at == T0 + 2
        assert row.credits == 9


def test_a_batch_of_settlements_applies_each_by_its_own_lease(store: Store, other: Store) -> None:
    """Many calls end in one transaction (a map's batch): each settlement applies only under
    its own lease, whatever else the batch holds (a stale lease of the same key, a release,
    an unknown key, whole-number and fractional credits, texts with NUL)."""
    claim(store, [mk_claim(k, lease=f"L-{k}") for k in ("a", "b", "c", "d", "e")], T0)
    batch = [
        completed("a", "L-a", {"n": "x\x00y"}, credits=50),
        failed("b", "L-b", retryable=True, kind="network"),
        completed("c", "stale-lease", {"late": 1}),
        completed("c", "L-c", {"n": 3}, credits=0.5),
        Settlement("d", "L-d", "released"),
        completed("nope", "L-nope", 1),
        completed("e", "L-e", None),
    ]
    assert settle(store, batch, T0 + 1) == [True, True, False, True, True, False, True]
    a, b, c, d, e = (stored(other, k) for k in "abcde")
    assert (a.status, a.output, a.credits, a.completed_at) == ("completed", {"n": "x\x00y"}, 50, T0 + 1)
    assert (b.status, b.output, b.failure_kind, b.retryable) == ("failed", None, "network", True)
    assert (c.status, c.output, c.credits) == ("completed", {"n": 3}, 0.5)
    assert (d.status, d.lease_expires_at) == ("released", None)
    assert (e.status, e.output, e.lease_expires_at) == ("completed", None, None)
    assert store.get_receipt("nope") is None
    # The same batch again (a transaction run again after its connection dropped): no change.
    assert settle(store, batch[:2] + batch[3:4], T0 + 2) == [True, True, True]
    assert stored(other, "c").completed_at == T0 + 1


def test_a_batch_settles_leases_with_a_nul_as_written(store: Store, other: Store) -> None:
    claim(store, [mk_claim(k, lease="L\x00" + k) for k in "ab"], T0)
    assert settle(store, [completed(k, "L\x00" + k, {"n": 1}) for k in "ab"], T0 + 1) == [True, True]
    assert [stored(other, k).status for k in "ab"] == ["completed", "completed"]


def test_a_lease_released_then_ended_in_one_batch_is_settled_in_that_order(store: Store, other: Store) -> None:
    claim(store, [mk_claim("k")], T0)
    released = Settlement("k", "L1", "released")
    assert settle(store, [released, completed("k", output=1)], T0 + 1) == [True, False]
    assert stored(other, "k").status == "released"


def test_settling_an_unknown_key_is_refused(store: Store) -> None:
    assert settle(store, [completed("nope")], T0) == [False]
    assert store.get_receipt("nope") is None


def test_released_receipt_says_so_and_is_claimed_again_under_its_key(store: Store, other: Store) -> None:
    one(store, mk_claim("k"), T0)

    assert settle(store, [Settlement("k", "L1", "released")], T0 + 1) == [True]

    row = stored(store, "k")
    assert row.status == "released"
    assert row.lease_expires_at is None
    assert row.output is None
    [outcome] = claim(other, [mk_claim("k", run_id="r2", lease="L2", expires=T0 + 100)], T0 + 2)
    assert outcome.verdict == "claimed"
    assert outcome.receipt.lease_id == "L2"
    assert outcome.resumed and (outcome.prior_status, outcome.prior_run_id) == ("released", "r1")
    assert outcome.receipt.idempotency_key == "idem-k"  # it may have been sent: the same key


def test_a_stale_refresh_sends_a_fresh_key_and_a_transient_retry_the_same(store: Store) -> None:
    one(store, mk_claim("k"), T0)
    settle(store, [completed("k", output=1)], T0 + 1)
    one(store, mk_claim("t"), T0)
    settle(store, [Settlement("t", "L1", "failed", error={"message": "5xx"}, retryable=True)], T0 + 1)
    one(store, mk_claim("p"), T0)
    settle(store, [Settlement("p", "L1", "failed", error={"message": "400"})], T0 + 1)

    stale = one(store, mk_claim("k", run_id="r2", lease="L2", stale_after_s=0.5), T0 + 5)[1]
    transient = one(store, mk_claim("t", run_id="r2", lease="L2"), T0 + 5)[1]
    refreshed = one(store, mk_claim("p", run_id="r2", lease="L2", refresh_failed=True), T0 + 5)[1]

    assert stale.idempotency_key == "idem-k-L2"  # a new paid call: a provider must not replay the old one
    assert transient.idempotency_key == "idem-t"  # the same call tried again
    assert refreshed.idempotency_key == "idem-p-L2"  # a failure the user asked to redo


def test_a_forced_claim_of_a_failure_that_may_have_been_processed_is_a_new_call_once_per_run(store: Store) -> None:
    """`--force-refresh` asks for new paid calls: one of another run's failure that may have
    been processed (unanswered) goes out under a fresh key, as a forced answer does. The
    forcing run's own failures keep the key they went out with, on a resume that only kept
    the flag and on one given it again (a force kept from an earlier attempt, beside a
    `--refresh-failed` given now, sent them under a fresh key)."""
    unanswered = {"message": "502", "unanswered": True}
    one(store, mk_claim("k"), T0)
    settle(store, [Settlement("k", "L1", "failed", error=unanswered, retryable=False)], T0 + 1)

    [forced] = claim(store, [mk_claim("k", run_id="r2", lease="L2", force=True)], T0 + 2)
    assert forced.verdict == "claimed" and forced.receipt.idempotency_key == "idem-k-L2"
    assert not forced.resumed and not forced.maybe_processed
    settle(store, [Settlement("k", "L2", "failed", error=unanswered, retryable=True)], T0 + 3)
    kept_flag = mk_claim("k", run_id="r2", attempt=2, lease="L3", force=True, refresh_own_before=0)
    [resumed] = claim(store, [kept_flag], T0 + 4)
    assert resumed.verdict == "claimed" and resumed.receipt.idempotency_key == "idem-k-L2"
    assert resumed.resumed and resumed.maybe_processed
    settle(store, [Settlement("k", "L3", "failed", error=unanswered, retryable=False)], T0 + 5)
    [again] = claim(store, [mk_claim("k", run_id="r2", attempt=3, lease="L4", force=True)], T0 + 6)
    assert again.verdict == "claimed" and again.receipt.idempotency_key == "idem-k-L2"


def test_a_forced_claim_of_a_failure_given_back_before_its_call_keeps_the_failure_and_its_key(store: Store) -> None:
    """A forced call of a failure that may have been processed, stopped before it went out (a
    budget, Ctrl-C): the failure stands as it was, with the key it went out under, so a
    later refresh sends that key (it emptied to `skipped`, and the next call paid again
    under the call's own key)."""
    unanswered = {"message": "502", "unanswered": True}
    one(store, mk_claim("k", lease="L1", idempotency_key="idem-k-sent"), T0)
    settle(store, [Settlement("k", "L1", "failed", error=unanswered, failure_kind="server", retryable=True)], T0 + 1)
    [forced] = claim(store, [mk_claim("k", run_id="r2", lease="L2", force=True)], T0 + 2)
    assert forced.receipt.idempotency_key == "idem-k-L2"

    assert settle(store, [given_back("k", forced, sent=False)], T0 + 3) == [True]

    kept = stored(store, "k")
    assert (kept.status, kept.run_id, kept.idempotency_key) == ("failed", "r1", "idem-k-sent")
    assert (kept.error, kept.failure_kind, kept.retryable) == (unanswered, "server", True)
    [again] = claim(store, [mk_claim("k", run_id="r3", lease="L3")], T0 + 4)
    assert again.verdict == "claimed" and again.receipt.idempotency_key == "idem-k-sent"


def test_a_refresh_under_the_same_key_given_back_before_its_call_keeps_the_failure(store: Store) -> None:
    """`--refresh-failed` of a failure that may have been processed asks it under its key;
    given back before the call went out (a budget, Ctrl-C), it was `released`: its error,
    and with it what the next refresh must do (a 409 asked once under its key, then under a
    fresh one), were lost, and it left `receipts inspect --status failed`."""
    in_use = {"message": "409", "status_code": 409, "origin": "provider"}
    one(store, mk_claim("k"), T0)
    settle(store, [Settlement("k", "L1", "failed", error=in_use, failure_kind="conflict")], T0 + 1)
    [refresh] = claim(store, [mk_claim("k", run_id="r2", lease="L2", refresh_failed=True)], T0 + 2)
    assert refresh.resumed and refresh.receipt.idempotency_key == "idem-k"

    assert settle(store, [given_back("k", refresh, sent=False)], T0 + 3) == [True]

    kept = stored(store, "k")
    assert (kept.status, kept.run_id, kept.error, kept.failure_kind) == ("failed", "r1", in_use, "conflict")
    [again] = claim(store, [mk_claim("k", run_id="r3", lease="L3")], T0 + 4)
    assert again.verdict == "failed"  # kept, as before the refresh that never went out


def test_a_batch_sent_again_under_a_forced_run_is_that_batch_under_its_key(store: Store) -> None:
    """A batch that may have been processed, recovered by a forced run (its members were taken
    over): that batch again, with what it sent, under its key."""
    sent = [["m1", {"d": 1}], ["m2", {"d": 2}]]
    one(store, mk_claim("B", kind="batch", request=sent), T0)
    settle(store, [Settlement("B", "L1", "failed", error={"message": "timeout", "unanswered": True})], T0 + 1)

    [recovered] = claim(store, [mk_claim("B", run_id="r2", lease="L2", kind="batch", force=True)], T0 + 2)

    assert recovered.verdict == "claimed"
    assert recovered.receipt.idempotency_key == "idem-B" and recovered.receipt.request == sent
    assert recovered.resumed and recovered.maybe_processed


def test_a_refresh_given_back_before_its_call_keeps_the_earlier_paid_result(store: Store, other: Store) -> None:
    one(store, mk_claim("k"), T0)
    settle(store, [completed("k", output={"paid": 1}, credits=2)], T0 + 1)
    # Another run forces a refresh, then gives the claim back before calling the provider.
    verdict, _ = one(other, mk_claim("k", run_id="r2", lease="L2", expires=T0 + 100, force=True), T0 + 2)
    assert verdict == "claimed"
    assert settle(other, [Settlement("k", "L2", "skipped")], T0 + 3) == [True]

    row = stored(store, "k")
    assert row.status == "completed"
    assert row.output == {"paid": 1}
    assert one(store, mk_claim("k", run_id="r3", lease="L3"), T0 + 4)[0] == "reused"


def test_a_refresh_given_back_before_its_call_keeps_an_earlier_answer_of_null(store: Store, other: Store) -> None:
    """A paid answer may be JSON null (a search that found no one): a refresh given back
    before its call keeps it, as any answer (stored as no text, it emptied to `skipped`)."""
    one(store, mk_claim("k"), T0)
    settle(store, [completed("k", output=None, credits=2)], T0 + 1)
    verdict, _ = one(other, mk_claim("k", run_id="r2", lease="L2", expires=T0 + 100, force=True), T0 + 2)
    assert verdict == "claimed"
    assert settle(other, [Settlement("k", "L2", "skipped")], T0 + 3) == [True]

    row = stored(store, "k")
    assert (row.status, row.output) == ("completed", None)
    assert one(store, mk_claim("k", run_id="r3", lease="L3"), T0 + 4)[0] == "reused"


def test_a_refresh_given_back_before_its_call_leaves_the_receipt_its_earlier_owners(store: Store, other: Store) -> None:
    """Given back with the answer it would have replaced, the receipt is as it was: the
    refreshing run's next attempt refreshes it (once per run counts answers it got)."""
    one(store, mk_claim("k"), T0)
    settle(store, [completed("k", output={"paid": 1}, credits=2)], T0 + 1)
    [outcome] = claim(other, [mk_claim("k", run_id="r2", lease="L2", expires=T0 + 100, force=True)], T0 + 2)
    assert outcome.verdict == "claimed" and outcome.replaces is not None
    assert settle(other, [Settlement("k", "L2", "skipped", replaces=outcome.replaces)], T0 + 3) == [True]

    row = stored(store, "k")
    assert (row.status, row.output, row.run_id, row.idempotency_key) == ("completed", {"paid": 1}, "r1", "idem-k")
    resumed = mk_claim("k", run_id="r2", attempt=2, lease="L3", expires=T0 + 100, force=True)
    assert one(other, resumed, T0 + 4)[0] == "claimed"


def test_a_call_that_may_have_been_sent_given_back_before_its_next_try_keeps_its_key(
    store: Store, other: Store
) -> None:
    """A refresh sent and then interrupted (released) is claimed again by the resume, under
    the key it was sent with; stopped again while it waits for its slot, it was given back
    as never sent (skipped): the receipt became `completed` again with the old answer, the
    refresh was lost and the call maybe paid under that key was never recovered. It stays
    released, its key kept for the next resume."""
    from deepline_cli.runtime.calls.receipts import DurableCall, failure_settlement
    from deepline_cli.runtime.providers.secrets import Secrets

    one(store, mk_claim("k"), T0)
    settle(store, [completed("k", output={"v": "old"}, credits=1)], T0 + 1)
    sent = one(other, mk_claim("k", run_id="r2", lease="L2", expires=T0 + 100, force=True), T0 + 2)[1]
    settle(other, [Settlement("k", "L2", "released")], T0 + 3)  # interrupted with the call out
    [again] = claim(other, [mk_claim("k", run_id="r2", attempt=2, lease="L3", expires=T0 + 100, force=True)], T0 + 4)
    assert again.verdict == "claimed" and again.resumed and again.receipt.idempotency_key == sent.idempotency_key
    call = DurableCall(key="k", kind="tool", label="label-k", tool="demo.tool", force=True)
    given_back = failure_settlement(call, again, KeyboardInterrupt(), CallRecord("r2", 2, "tool", "demo.tool", T0),
                                    Secrets(), queued=True)  # fmt: skip
    assert settle(other, [given_back], T0 + 5) == [True]
    row = stored(store, "k")
    assert (row.status, row.idempotency_key) == ("released", sent.idempotency_key)
    [third] = claim(other, [mk_claim("k", run_id="r2", attempt=3, lease="L4", expires=T0 + 100, force=True)], T0 + 6)
    assert third.verdict == "claimed" and third.receipt.idempotency_key == sent.idempotency_key


def test_a_refresh_kept_by_a_resume_retries_a_failure_once_per_run(store: Store, other: Store) -> None:
    """A `--refresh-failed` (or `--force-refresh`) run keeps its flag on resume: the rows it
    had not reached are refreshed. A failure it refreshed already, in an earlier attempt, is
    not paid for again on every resume; given again on the resume, the flag retries it."""
    one(store, mk_claim("k"), T0)
    settle(store, [failed("k", retryable=False)], T0 + 1)  # yesterday's run: a permanent failure
    assert one(other, mk_claim("k", run_id="r2", lease="L2", refresh_failed=True), T0 + 2)[0] == "claimed"
    settle(other, [failed("k", "L2", retryable=False)], T0 + 3)  # refreshed: failed again
    kept = mk_claim("k", run_id="r2", attempt=2, lease="L3", refresh_failed=True, refresh_own_before=0)
    assert one(other, kept, T0 + 4)[0] == "failed"  # the resume inherited the flag: not again
    forced = mk_claim("k", run_id="r2", attempt=2, lease="L3", force=True, refresh_own_before=0)
    assert one(other, forced, T0 + 4)[0] == "failed"
    given = mk_claim("k", run_id="r2", attempt=2, lease="L3", refresh_failed=True)  # given again: retried
    assert one(other, given, T0 + 4)[0] == "claimed"


def test_a_taken_over_attempts_receipt_leases_are_not_extended(store: Store, other: Store) -> None:
    """Between a new owner leasing the run and releasing the old attempt's receipts, the
    old attempt's heartbeat must not keep its receipts: it would go on dispatching them."""
    store.insert_run(make_run("r1", holder="A:1", attempt=1))
    claim(store, [mk_claim("a"), mk_claim("b", lease="L2")], T0)
    assert store.heartbeat_receipts([("a", "L1")], T0 + 10) == set()

    assert other.lease_run("r1", holder="B:2", expires_at=T0 + 90, attempt=2, expect_attempt=1)

    assert store.heartbeat_receipts([("a", "L1"), ("b", "L2")], T0 + 20) == {"L1", "L2"}
    assert stored(other, "a").lease_expires_at == T0 + 10


def test_an_attempt_that_died_unended_is_ended_killed_when_the_next_begins(store: Store) -> None:
    """A SIGKILLed attempt never ends itself: the next attempt ends it, `killed`, when it
    was last heard of (its last call here, later than its last heartbeat)."""
    store.insert_run(make_run("r1", holder="A:1", attempt=1))
    store.begin_attempt("r1", 1, "A:1", T0)
    one(store, mk_claim("k"), T0 + 1)
    settle(store, [completed("k")], T0 + 7)
    store.begin_attempt("r1", 2, "B:2", T0 + 60)

    first, second = store.attempt_rows("r1")
    assert (first.status, first.ended_at) == ("killed", T0 + 7)
    assert (second.status, second.ended_at) == ("running", None)


def test_a_claim_given_back_before_any_call_is_skipped(store: Store) -> None:
    one(store, mk_claim("k"), T0)
    assert settle(store, [Settlement("k", "L1", "skipped")], T0 + 1) == [True]
    assert stored(store, "k").status == "skipped"
    assert one(store, mk_claim("k", run_id="r2", lease="L2"), T0 + 2)[0] == "claimed"


def test_heartbeat_extends_live_leases_and_reports_lost_ones(store: Store, other: Store) -> None:
    claim(store, [mk_claim("a"), mk_claim("b", lease="L2"), mk_claim("c", lease="L3")], T0)
    settle(store, [completed("c", "L3")], T0 + 1)
    c_before = stored(store, "c")
    # b's lease expires and another run takes it over.
    assert one(other, mk_claim("b", run_id="r2", lease="M2", expires=T0 + 200), T0 + 31)[0] == "claimed"

    lost = store.heartbeat_receipts([("a", "L1"), ("b", "L2"), ("c", "L3"), ("gone", "L9")], T0 + 500)

    assert lost == {"L2", "L3", "L9"}
    assert stored(other, "a").lease_expires_at == T0 + 500
    b = stored(other, "b")
    assert (b.lease_id, b.lease_expires_at) == ("M2", T0 + 200)
    assert stored(other, "c") == c_before
    assert store.heartbeat_receipts([], T0 + 600) == set()
    # The extended lease is what a would-be taker sees.
    assert one(other, mk_claim("a", run_id="r3", lease="N"), T0 + 499)[0] == "busy"


def test_expire_run_receipts_frees_only_that_runs_running_receipts(store: Store, other: Store) -> None:
    claim(store, [mk_claim("a"), mk_claim("b", lease="L2"), mk_claim("c", run_id="r2", lease="M")], T0)
    claim(store, [mk_claim("d", attempt=2, lease="L3")], T0)  # a later attempt's: a live process took over
    settle(store, [completed("b", "L2")], T0 + 1)

    assert store.expire_run_receipts("r1", before_attempt=2) == 1
    assert store.expire_run_receipts("r-none", before_attempt=2) == 0

    assert one(other, mk_claim("d", run_id="r3", lease="N3"), T0 + 2)[0] == "busy"

    assert one(other, mk_claim("a", run_id="r3", lease="N"), T0 + 2)[0] == "claimed"
    assert one(other, mk_claim("b", run_id="r3", lease="N1"), T0 + 2)[0] == "reused"
    assert one(other, mk_claim("c", run_id="r3", lease="N2"), T0 + 2)[0] == "busy"


# --- batches ------------------------------------------------------------------------------


def test_a_batch_of_500_claims_gives_500_outcomes_in_order(store: Store, other: Store) -> None:
    keys = [f"key-{i:04d}" for i in range(500)]
    # Not sorted: outcomes must follow the claims, not the table's order.
    order = keys[::2] + keys[1::2][::-1]

    applied = store.apply(Writes(claims=[mk_claim(k, lease=f"L-{k}") for k in order]), T0)

    assert applied.settled == []
    assert [o.receipt.key for o in applied.outcomes] == order
    assert {o.verdict for o in applied.outcomes} == {"claimed"}
    assert [o.receipt.lease_id for o in applied.outcomes] == [f"L-{k}" for k in order]
    assert len(other.query_receipts(ReceiptQuery())) == 500

    done = set(keys[:250])
    assert settle(store, [completed(k, f"L-{k}", output=k) for k in keys[:250]], T0 + 1) == [True] * 250
    again = other.apply(Writes(claims=[mk_claim(k, run_id="r2", lease=f"M-{k}") for k in order]), T0 + 2)

    assert [o.receipt.key for o in again.outcomes] == order
    assert [o.verdict for o in again.outcomes] == ["reused" if k in done else "busy" for k in order]
    assert [o.receipt.output for o in again.outcomes if o.verdict == "reused"] == [k for k in order if k in done]
    # r2 reused 250 receipts it does not own: they are listed under it.
    assert done <= keys_of(other.query_receipts(ReceiptQuery(run_id="r2")))


def test_receipts_are_read_a_page_at_a_time_in_the_order_they_are_listed(store: Store, other: Store) -> None:
    """`receipts inspect` of a run of 200,000 calls held them all (600 MB): they are read a
    page at a time. Every receipt comes once, oldest first (ties by key), across pages,
    under filters and a limit; a listing left half read leaves the store usable."""
    keys = [f"k{i:03d}" for i in range(23)]
    for n, key in enumerate(keys):  # created in threes: ties of created_at cross the pages
        store.apply(Writes(claims=[mk_claim(key, lease=f"L-{key}")]), T0 + n // 3)
    listed = [r.key for r in other.receipts.iter_receipts(ReceiptQuery(), page=4)]
    assert listed == keys
    assert [r.key for r in other.receipts.iter_receipts(ReceiptQuery(limit=10), page=4)] == keys[:10]
    assert [r.key for r in other.receipts.iter_receipts(ReceiptQuery(key_prefix="k01"), page=3)] == keys[10:20]
    half = other.receipts.iter_receipts(ReceiptQuery(), page=4)
    assert next(half).key == keys[0]
    half.close()
    assert other.query_receipts(ReceiptQuery(run_id="r1", limit=2)) == other.query_receipts(ReceiptQuery(limit=2))
    assert one(other, mk_claim("after", lease="M"), T0 + 99)[0] == "claimed"


def test_a_listing_read_slowly_is_not_cut_off(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A listing read a page at a time held a transaction open between pages: on PostgreSQL
    a reader slower than the idle-in-transaction limit (`receipts inspect | less`) had
    its connection ended and the listing stopped half way."""
    from deepline_cli.store import postgres

    monkeypatch.setattr(postgres, "IDLE_IN_TRANSACTION_S", 0.5)
    store.apply(Writes(claims=[mk_claim(f"k{i:02d}", lease=f"L{i}") for i in range(9)]), T0)
    if is_postgres(store.url):
        store.reconnect()  # a connection of the short limit
    listed = []
    for receipt in store.receipts.iter_receipts(ReceiptQuery(), page=3):
        listed.append(receipt.key)
        time.sleep(0.35)  # past the limit over two pages
    assert listed == [f"k{i:02d}" for i in range(9)]


def test_two_claims_for_one_new_key_in_one_batch(store: Store) -> None:
    applied = store.apply(Writes(claims=[mk_claim("k"), mk_claim("k", run_id="r2", lease="L2", expires=T0 + 99)]), T0)

    assert [o.verdict for o in applied.outcomes] == ["claimed", "busy"]
    assert applied.outcomes[1].receipt.lease_id == "L1"
    assert stored(store, "k").lease_id == "L1"


def test_settlements_apply_before_claims_in_the_same_batch(store: Store, other: Store) -> None:
    one(store, mk_claim("k"), T0)

    applied = other.apply(
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


def test_a_failing_batch_writes_nothing(store: Store) -> None:
    """`apply` is one transaction: a write that fails takes the whole batch back."""
    one(store, mk_claim("k"), T0)
    bad_log = LogLine("r1", 0, T0, "info", "x")  # attempt 0: written unfenced
    bad_log.run_id = object()  # type: ignore[assignment]  # no database can store this

    with pytest.raises(StoreError):
        store.apply(
            Writes(
                settlements=[completed("k", output=1)],
                claims=[mk_claim("new")],
                logs=[bad_log],
            ),
            T0 + 1,
        )

    assert stored(store, "k").status == "running"
    assert store.get_receipt("new") is None
    # The store is still usable after a failed transaction.
    assert settle(store, [completed("k", output=2)], T0 + 2) == [True]


def test_claim_survives_reopening_the_store(store_url: str) -> None:
    first = open_store(store_url)
    one(first, mk_claim("k"), T0)
    settle(first, [completed("k", output=[1, 2])], T0 + 1)
    first.close()

    reopened = open_store(store_url)
    try:
        assert one(reopened, mk_claim("k", run_id="r2", lease="L2"), T0 + 2)[0] == "reused"
        assert stored(reopened, "k").output == [1, 2]
    finally:
        reopened.close()


# --- receipt queries and credits ----------------------------------------------------------


def test_query_by_run_lists_owned_and_reused_receipts(store: Store, other: Store) -> None:
    claim(store, [mk_claim("owned-1"), mk_claim("owned-2", lease="L2")], T0)
    settle(store, [completed("owned-1"), completed("owned-2", "L2")], T0 + 1)
    claim(other, [mk_claim("r2-own", run_id="r2", lease="M1")], T0 + 2)

    assert one(other, mk_claim("owned-1", run_id="r2", lease="M2"), T0 + 3)[0] == "reused"

    assert keys_of(store.query_receipts(ReceiptQuery(run_id="r2"))) == {"owned-1", "r2-own"}
    assert keys_of(store.query_receipts(ReceiptQuery(run_id="r1"))) == {"owned-1", "owned-2"}
    assert store.query_receipts(ReceiptQuery(run_id="r9")) == []
    # The owner column still says who paid for it.
    [reused] = [r for r in store.query_receipts(ReceiptQuery(run_id="r2")) if r.key == "owned-1"]
    assert reused.run_id == "r1"
    # Reusing the same receipt again lists it once.
    assert one(other, mk_claim("owned-1", run_id="r2", lease="M3"), T0 + 4)[0] == "reused"
    assert [r.key for r in store.query_receipts(ReceiptQuery(run_id="r2"))].count("owned-1") == 1


def test_query_by_run_includes_receipts_taken_over_from_the_run(store: Store, other: Store) -> None:
    one(store, mk_claim("k"), T0)
    one(other, mk_claim("k", run_id="r2", lease="L2", expires=T0 + 100), T0 + TTL + 1)

    assert keys_of(store.query_receipts(ReceiptQuery(run_id="r1"))) == {"k"}
    assert keys_of(store.query_receipts(ReceiptQuery(run_id="r2"))) == {"k"}


def test_query_filters_by_key_prefix_status_tool_and_limit(store: Store) -> None:
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
    assert q(key_prefix="aa01") == ["aa01"]
    assert q(key_prefix="zz") == []
    assert q(status="completed") == ["aa01"]
    assert q(status="failed") == ["ab01"]
    assert q(status="running") == ["aa02", "b"]
    assert q(tool="t.one") == ["aa01", "ab01"]
    assert q(tool="t.one", status="failed") == ["ab01"]
    assert q(key_prefix="a", tool="t.two") == ["aa02"]
    assert q(limit=2) == ["aa01", "aa02"]
    assert q(run_id="r1", key_prefix="ab") == ["ab01"]


def test_query_orders_by_creation_time_then_key(store: Store) -> None:
    claim(store, [mk_claim("z-late", lease="1")], T0 + 5)
    claim(store, [mk_claim("y", lease="2"), mk_claim("x", lease="3")], T0)

    assert [r.key for r in store.query_receipts(ReceiptQuery())] == ["x", "y", "z-late"]


def test_credits_spent_sums_completed_receipts_of_the_run_and_its_children(store: Store, other: Store) -> None:
    store.insert_run(make_run("root"))
    store.insert_run(make_run("child", parent_run_id="root", root_run_id="root", created_at=T0 + 1))
    store.insert_run(make_run("grandchild", parent_run_id="child", root_run_id="root", created_at=T0 + 2))
    store.insert_run(make_run("stranger", created_at=T0 + 3))
    claim(
        store,
        [
            mk_claim("a", run_id="root", lease="A"),
            mk_claim("a2", run_id="root", attempt=2, lease="A2"),
            mk_claim("b", run_id="child", lease="B"),
            mk_claim("c", run_id="grandchild", lease="C"),
            mk_claim("s", run_id="stranger", lease="S"),
            mk_claim("f", run_id="root", lease="F"),
            mk_claim("open", run_id="root", lease="O"),
        ],
        T0,
    )
    settle(
        store,
        [
            completed("a", "A", credits=1.5, run_id="root"),
            completed("a2", "A2", credits=2, run_id="root"),
            completed("b", "B", credits=4, run_id="child"),
            completed("c", "C", credits=8, run_id="grandchild"),
            completed("s", "S", credits=100, run_id="stranger"),
            Settlement(
                "f", "F", "failed", error={"message": "no"}, credits=50, call=CallRecord("root", 1, "tool", "t", T0)
            ),
        ],
        T0 + 1,
    )

    assert other.credits_spent("root") == 15.5  # every attempt and every descendant
    assert other.credits_spent("stranger") == 100
    assert other.credits_spent("nobody") == 0
    # Reusing a receipt costs the reusing run nothing.
    store.insert_run(make_run("reuser", created_at=T0 + 4))
    assert one(other, mk_claim("s", run_id="reuser", lease="R"), T0 + 5)[0] == "reused"
    assert other.credits_spent("reuser") == 0


# --- runs ---------------------------------------------------------------------------------


def test_insert_and_get_run_round_trip(store: Store, other: Store) -> None:
    record = make_run(
        stats={"credits": 3.0, "tools": {"t": {"live": 1}}},
        cwd="/work",
        workspace="team-a",
        output={"rows": [1, "ü", None]},
        error={"message": "x", "category": "internal"},
        finished_at=T0 + 9.25,
    )
    store.insert_run(record)

    assert other.get_run("run-1") == record
    assert other.get_run("missing") is None


def test_insert_run_twice_is_refused(store: Store) -> None:
    assert store.insert_run(make_run())

    assert not store.insert_run(make_run(play="other"))

    got = store.get_run("run-1")
    assert got is not None and got.play == "demo"


def test_lease_run_is_compare_and_set_on_the_attempt(store: Store, other: Store) -> None:
    seed(store, make_run(status="failed", holder=None))

    assert store.lease_run("run-1", holder="A:1", expires_at=T0 + 60, attempt=2, expect_attempt=1)
    assert not other.lease_run("run-1", holder="B:2", expires_at=T0 + 90, attempt=2, expect_attempt=1)

    record = other.get_run("run-1")
    assert record is not None
    assert (record.holder, record.attempt, record.status, record.lease_expires_at) == ("A:1", 2, "running", T0 + 60)
    # Knowing the current attempt is what it takes to lease it next.
    assert other.lease_run("run-1", holder="B:2", expires_at=T0 + 90, attempt=3, expect_attempt=2)
    assert not store.lease_run("run-9", holder="A:1", expires_at=T0, attempt=2, expect_attempt=1)


def test_a_new_attempt_of_a_finished_run_clears_when_it_finished(store: Store, other: Store) -> None:
    """A failed run resumed: `runs show` said "finished <the failure's time>" beside
    "running" while its new attempt ran (and after it was killed)."""
    seed(store, make_run(status="failed", holder=None, finished_at=T0 + 5, error={"message": "budget"}))

    assert store.lease_run("run-1", holder="A:1", expires_at=T0 + 60, attempt=2, expect_attempt=1)

    record = other.get_run("run-1")
    assert record is not None
    assert (record.status, record.finished_at, record.error) == ("running", None, None)


def test_an_attempt_whose_run_was_taken_over_writes_nothing(store: Store, other: Store) -> None:
    """Fencing: once attempt 2 holds the run, attempt 1's rows, log lines, map record and
    outcome are refused in the same transaction; attempt 2's, and unfenced ones, go in."""
    store.insert_run(make_run(holder="A:1", attempt=1))
    assert other.lease_run("run-1", holder="B:2", expires_at=T0 + 90, attempt=2, expect_attempt=1)

    def writes(attempt: int, key: str) -> Writes:
        row = sheet_row(key, run_id="run-1")
        row.attempt = attempt
        return Writes(
            logs=[LogLine("run-1", attempt, T0, "info", f"from {attempt}")],
            sheet_rows=[row],
            map_rows=[MapRow("run-1", "leads", attempt, attempt, key, "succeeded", attempt=attempt)],
        )

    store.apply(writes(1, "stale"), T0)
    store.save_map(MapRecord("run-1", "leads", "play/leads", status="interrupted", attempt=1))
    assert not store.set_status("run-1", "completed", only_attempt=1)
    other.apply(Writes(map_rows=[MapRow("run-1", "leads", 5, 5, "new", "succeeded", attempt=2)]), T0)
    assert store.trim_map_rows("run-1", "leads", 1, 0) == 0  # attempt 2's row is not attempt 1's to drop
    assert other.trim_map_rows("run-1", "leads", 2, 0) == 1

    assert store.load_sheet_rows("play/leads", ["stale"]) == {}
    assert other.count_map_rows("run-1", "leads") == {}
    assert other.get_logs("run-1") == []
    assert other.get_maps("run-1") == []
    record = other.get_run("run-1")
    assert record is not None and record.status == "running"

    other.apply(writes(2, "fresh"), T0)
    other.save_map(MapRecord("run-1", "leads", "play/leads", status="completed", attempt=2))
    assert other.set_status("run-1", "completed", only_attempt=2)
    store.apply(Writes(logs=[LogLine("run-1", 0, T0, "info", "outside any attempt")]), T0)

    assert list(store.load_sheet_rows("play/leads", ["fresh"])) == ["fresh"]
    assert store.count_map_rows("run-1", "leads") == {"succeeded": 1}
    assert [line.message for line in store.get_logs("run-1")] == ["from 2", "outside any attempt"]
    assert [m.status for m in store.get_maps("run-1")] == ["completed"]
    record = store.get_run("run-1")
    assert record is not None and record.status == "completed"


def test_heartbeat_run_only_for_the_current_holder_and_attempt(store: Store) -> None:
    store.insert_run(make_run(holder="A:1", attempt=2))

    assert not store.heartbeat_run("run-1", holder="B:2", attempt=2, expires_at=T0 + 99)
    assert not store.heartbeat_run("run-1", holder="A:1", attempt=1, expires_at=T0 + 99)
    assert not store.heartbeat_run("run-9", holder="A:1", attempt=2, expires_at=T0 + 99)
    record = store.get_run("run-1")
    assert record is not None and record.lease_expires_at == T0 + TTL

    assert store.heartbeat_run("run-1", holder="A:1", attempt=2, expires_at=T0 + 99)
    record = store.get_run("run-1")
    assert record is not None and record.lease_expires_at == T0 + 99


def test_update_run_sets_the_given_fields_and_touches_updated_at(store: Store, other: Store) -> None:
    store.insert_run(make_run())
    before = store.get_run("run-1")

    store.set_status(
        "run-1",
        "completed",
        output={"rows": 3, "list": [1, 2]},
        stats={"credits": 1.5},
        error=None,
        finished_at=T0 + 7,
    )

    after = other.get_run("run-1")
    assert after is not None and before is not None
    assert (after.status, after.output, after.stats, after.error, after.finished_at) == (
        "completed",
        {"rows": 3, "list": [1, 2]},
        {"credits": 1.5},
        None,
        T0 + 7,
    )
    assert after.updated_at > before.updated_at
    # Everything not named is untouched.
    assert (after.play, after.input, after.options, after.holder, after.attempt, after.created_at) == (
        before.play,
        before.input,
        before.options,
        before.holder,
        before.attempt,
        before.created_at,
    )
    assert not store.set_status("run-1", "failed", error={"message": "later"})  # completed is final
    store.update_run("run-1", error={"message": "later"})  # a field that is not the status: as it is
    again = other.get_run("run-1")
    assert again is not None and (again.status, again.error) == ("completed", {"message": "later"})


def test_list_runs_newest_first_with_status_play_and_limit_filters(store: Store) -> None:
    seed(store, make_run("a", play="p1", status="completed", created_at=T0 + 1))
    seed(store, make_run("b", play="p2", status="failed", created_at=T0 + 3))
    seed(store, make_run("c", play="p1", status="failed", created_at=T0 + 2))
    store.insert_run(make_run("d", play="p1", status="queued", created_at=T0 + 4))

    def ids(**filters: Any) -> list[str]:
        return [r.run_id for r in store.list_runs(**filters)]

    assert ids() == ["d", "b", "c", "a"]
    assert ids(status="failed") == ["b", "c"]
    assert ids(play="p1") == ["d", "c", "a"]
    assert ids(play="p1", status="failed") == ["c"]
    assert ids(limit=2) == ["d", "b"]
    assert ids(play="p1", limit=1) == ["d"]
    assert ids(status="waiting") == []
    assert ids(play="nope") == []
    assert store.list_runs(status="queued")[0] == make_run("d", play="p1", status="queued", created_at=T0 + 4)


def test_child_runs_are_the_direct_children_oldest_first(store: Store, other: Store) -> None:
    store.insert_run(make_run("root"))
    store.insert_run(make_run("c2", parent_run_id="root", root_run_id="root", created_at=T0 + 2))
    store.insert_run(make_run("c1", parent_run_id="root", root_run_id="root", created_at=T0 + 1))
    store.insert_run(make_run("g1", parent_run_id="c1", root_run_id="root", created_at=T0 + 3))

    assert [r.run_id for r in other.child_runs("root")] == ["c1", "c2"]
    assert [r.run_id for r in other.child_runs("c1")] == ["g1"]
    assert other.child_runs("g1") == []
    assert other.child_runs("root")[0] == make_run("c1", parent_run_id="root", root_run_id="root", created_at=T0 + 1)


# --- workers: queued runs, due runs, shared rate slots ---------------------------------------


def test_claim_queued_run_takes_the_oldest_queued_run_once(store: Store, other: Store) -> None:
    store.insert_run(make_run("q2", status="queued", attempt=0, holder=None, created_at=T0 + 2))
    store.insert_run(make_run("q1", status="queued", attempt=0, holder=None, created_at=T0 + 1))
    store.insert_run(make_run("busy", status="running", created_at=T0))

    first = other.claim_queued_run(holder="W1:1", expires_at=T0 + 60)
    second = store.claim_queued_run(holder="W2:2", expires_at=T0 + 70)

    assert first is not None and second is not None
    assert (first.run_id, first.status, first.attempt, first.holder, first.lease_expires_at) == (
        "q1",
        "running",
        1,
        "W1:1",
        T0 + 60,
    )
    assert (second.run_id, second.holder) == ("q2", "W2:2")
    assert store.claim_queued_run(holder="W1:1", expires_at=T0 + 60) is None
    # A run put back in the queue (a drained worker) is taken again as its next attempt.
    store.set_status("q1", "queued")
    again = other.claim_queued_run(holder="W3:3", expires_at=T0 + 80)
    assert again is not None and (again.run_id, again.attempt, again.holder) == ("q1", 2, "W3:3")


def test_two_workers_claiming_queued_runs_at_once_never_share_one(store_url: str, store: Store) -> None:
    for i in range(40):
        store.insert_run(make_run(f"q{i:02d}", status="queued", attempt=0, holder=None, created_at=T0 + i))
    taken: dict[str, list[str]] = {"A": [], "B": []}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    stores = {name: open_store(store_url) for name in taken}

    def worker(name: str) -> None:
        try:
            barrier.wait(timeout=10)
            while (record := stores[name].claim_queued_run(holder=f"{name}:1", expires_at=T0 + 60)) is not None:
                taken[name].append(record.run_id)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(name,)) for name in taken]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        for opened in stores.values():
            opened.close()

    assert errors == [], errors
    assert sorted(taken["A"] + taken["B"]) == [f"q{i:02d}" for i in range(40)]
    for name, ids in taken.items():
        assert ids == sorted(ids)  # each worker takes the oldest left
        for run_id in ids:
            record = store.get_run(run_id)
            assert record is not None and (record.holder, record.attempt) == (f"{name}:1", 1)


def test_due_runs_are_waiting_runs_whose_wake_up_came_and_running_ones_whose_lease_expired(store: Store) -> None:
    seed(store, make_run("w", status="waiting", wake_at=T0 + 3))
    seed(store, make_run("w-later", status="waiting", wake_at=T0 + 50))
    seed(store, make_run("w-event", status="waiting", wake_at=None))  # woken only by an event or child
    store.insert_run(make_run("r", status="running", lease_expires_at=T0 + 1))
    store.insert_run(make_run("r-held", status="running", lease_expires_at=T0 + 60))
    seed(store, make_run("child", status="waiting", parent_run_id="r", wake_at=T0))
    seed(store, make_run("scheduled", status="waiting", parent_run_id="r", scheduled=True, wake_at=T0 + 1))
    seed(store, make_run("done", status="completed", wake_at=T0))
    store.insert_run(make_run("q", status="queued"))
    seed(store, make_run("w2", status="waiting", wake_at=T0 + 2))

    assert [r.run_id for r in store.due_runs(10, T0 + 10)] == ["scheduled", "w2", "w", "r"]
    assert [r.run_id for r in store.due_runs(2, T0 + 10)] == ["scheduled", "w2", "r"]  # each kind, by limit
    store.set_wake("w-event", T0 + 4)  # an event came
    assert "w-event" in [r.run_id for r in store.due_runs(10, T0 + 10)]


def test_rate_slots_are_paced_and_shared_by_every_store(store: Store, other: Store) -> None:
    slots = [store.take_rate_slot("t.paced", 0.25, T0), other.take_rate_slot("t.paced", 0.25, T0)]
    slots.append(store.take_rate_slot("t.paced", 0.25, T0 + 0.1))

    assert slots == pytest.approx([T0, T0 + 0.25, T0 + 0.5])
    # Another tool has its own pace; an idle tool starts again from now.
    assert other.take_rate_slot("t.other", 1.0, T0 + 0.1) == pytest.approx(T0 + 0.1)
    assert store.take_rate_slot("t.paced", 0.25, T0 + 60) == pytest.approx(T0 + 60)
    assert other.take_rate_slot("t.paced", 0.25, T0 + 60) == pytest.approx(T0 + 60.25)


def test_rate_slots_taken_at_once_by_two_stores_are_all_distinct(store_url: str) -> None:
    got: dict[str, list[float]] = {"A": [], "B": []}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    stores = {name: open_store(store_url) for name in got}

    def taker(name: str) -> None:
        try:
            barrier.wait(timeout=10)
            for _ in range(50):
                got[name].append(stores[name].take_rate_slot("t.race", 0.5, T0))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=taker, args=(name,)) for name in got]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        for opened in stores.values():
            opened.close()

    assert errors == [], errors
    assert sorted(got["A"] + got["B"]) == pytest.approx([T0 + 0.5 * i for i in range(100)])


# --- logs ---------------------------------------------------------------------------------


def test_logs_round_trip_in_order_per_run(store: Store, other: Store) -> None:
    lines = [
        LogLine("r1", 1, T0, "info", "first"),
        LogLine("r2", 1, T0, "info", "someone else"),
        LogLine("r1", 2, T0 + 1, "warning", "second: ünïcode ✓ 'quoted' ?"),
        LogLine("r1", 2, T0 - 5, "error", "third, with an older timestamp"),
    ]
    store.apply(Writes(logs=lines[:2]), T0)
    store.apply(Writes(logs=lines[2:]), T0 + 1)

    assert other.get_logs("r1") == [lines[0], lines[2], lines[3]]  # written order, not ts order
    assert other.get_logs("r2") == [lines[1]]
    assert other.get_logs("r3") == []


def test_any_text_round_trips_and_never_sinks_the_batch_it_rides_in(store: Store, other: Store) -> None:
    """Log messages and row errors are whatever a play or a provider produced (a NUL
    from a binary CSV field, say). They share one transaction with the settlements of
    paid calls, so a text a backend cannot hold must not lose those calls."""
    one(store, mk_claim("k"), T0)
    text = "nul:\x00 tab:\t emoji:\U0001f600 rtl:\u05d0"
    applied = store.apply(
        Writes(
            settlements=[completed("k", output={"text": text}, credits=1)],
            logs=[LogLine("r1", 1, T0 + 1, "info", text)],
            map_rows=[MapRow("r1", "leads", 0, 0, "k0", "failed", text)],
        ),
        T0 + 1,
    )

    assert applied.settled == [True]
    assert stored(other, "k").output == {"text": text}
    [line] = other.get_logs("r1")
    before_nul, after_nul = text.split("\x00")
    # A backend that cannot hold a NUL may drop or replace it; the rest is kept.
    assert line.message.startswith(before_nul) and line.message.endswith(after_nul)
    [row] = other.failed_map_rows("r1", "leads", 10)
    assert row.error is not None and "emoji:\U0001f600" in row.error


# --- sheets and maps ----------------------------------------------------------------------


def sheet_row(
    key: str, *, status: str = "succeeded", value: Any = None, run_id: str = "r1", at: float = T0
) -> SheetRow:
    cells = {"email": Cell(value if value is not None else f"{key}@x.io", None, at, "fp1")}
    if status == "failed":
        cells = {"email": Cell(None, f"{key} broke", at, "fp1")}
    return SheetRow("play/leads", key, {"domain": f"{key}.io", "n": 1}, f"digest-{key}", cells, status, run_id, at)


def test_sheet_rows_are_written_and_loaded_by_key(store: Store, other: Store) -> None:
    rows = [sheet_row("a"), sheet_row("b", status="failed"), sheet_row("c")]
    assert store.apply(Writes(sheet_rows=rows), T0).outcomes == []

    loaded = other.load_sheet_rows("play/leads", ["a", "b", "missing"])

    assert loaded == {"a": rows[0], "b": rows[1]}
    assert other.load_sheet_rows("play/other", ["a"]) == {}
    assert other.load_sheet_rows("play/leads", []) == {}


def test_a_sheet_row_whose_key_holds_a_nul_is_found_by_that_key(store: Store) -> None:
    """A messy CSV's key cell may hold a NUL (a backend that cannot store one keeps a stand-in):
    the row is found again under the key the map asks by, so a resume or a re-run reuses it."""
    store.apply(Writes(sheet_rows=[sheet_row("a\x00b"), sheet_row("c")]), T0)

    loaded = store.load_sheet_rows("play/leads", ["a\x00b", "c"])

    assert sorted(loaded) == ["a\x00b", "c"]
    assert loaded["a\x00b"].row_key == "a\x00b"
    assert loaded["a\x00b"].status == "succeeded"


def test_a_sheet_row_written_again_replaces_the_old_one(store: Store, other: Store) -> None:
    store.apply(Writes(sheet_rows=[sheet_row("a", status="failed")]), T0)

    newer = sheet_row("a", value="fixed@x.io", run_id="r2", at=T0 + 10)
    store.apply(Writes(sheet_rows=[newer]), T0 + 10)

    newer.rev = 2  # every write is a new revision
    assert other.load_sheet_rows("play/leads", ["a"]) == {"a": newer}


def test_a_runs_rows_keep_the_revision_it_finished_with(store: Store, other: Store) -> None:
    """A later run recomputing a row does not change what an earlier run's dataset reads."""
    first = sheet_row("a", value="old@x.io", run_id="r1")
    store.apply(
        Writes(sheet_rows=[first], map_rows=[MapRow("r1", "leads", 0, 0, "a", "succeeded", sheet="play/leads")]), T0
    )
    second = sheet_row("a", value="new@x.io", run_id="r2", at=T0 + 5)
    second.replaces = True
    store.apply(
        Writes(sheet_rows=[second], map_rows=[MapRow("r2", "leads", 0, 0, "a", "succeeded", sheet="play/leads")]),
        T0 + 5,
    )
    reuse = MapRow("r3", "leads", 0, 0, "a", "succeeded", sheet="play/leads", rev=2)  # reused whole, no write
    store.apply(Writes(map_rows=[reuse]), T0 + 6)

    def email(run_id: str) -> Any:
        [row] = other.map_rows_page(run_id, "leads", "play/leads", -1, 10)
        return row.cells["email"].value

    assert (email("r1"), email("r2"), email("r3")) == ("old@x.io", "new@x.io", "new@x.io")


def test_rows_of_one_batch_that_share_a_key_apply_one_after_the_other(store: Store, other: Store) -> None:
    """A batch's rows may go many to a statement; two writes of one sheet row (or one map
    row) in a batch still apply in order, as separate statements would (an upsert that
    touched one row twice in a statement would fail on PostgreSQL)."""
    first, second = sheet_row("a", value="first@x.io"), sheet_row("a", value="second@x.io", at=T0 + 1)
    rows = [sheet_row(f"k{i:03d}") for i in range(150)]  # more than one statement's worth
    map_rows = [MapRow("r1", "leads", 0, 0, "a", "failed", "boom"), MapRow("r1", "leads", 0, 0, "a", "succeeded")]

    store.apply(Writes(sheet_rows=[first, *rows, second], map_rows=map_rows), T0 + 1)

    second.rev = 2  # written twice: two revisions
    assert other.load_sheet_rows("play/leads", ["a"]) == {"a": second}
    assert len(other.load_sheet_rows("play/leads", [r.row_key for r in rows])) == 150
    [row] = other.map_rows_page("r1", "leads", "play/leads", -1, 10)
    assert (row.outcome, row.error, row.cells["email"].value) == ("succeeded", None, "second@x.io")


def test_load_sheet_rows_handles_more_keys_than_one_statement_binds(store: Store) -> None:
    rows = [sheet_row(f"k{i:04d}") for i in range(1000)]
    store.apply(Writes(sheet_rows=rows), T0)

    wanted = [f"k{i:04d}" for i in range(0, 1200, 2)]
    loaded = store.load_sheet_rows("play/leads", wanted)

    assert sorted(loaded) == [f"k{i:04d}" for i in range(0, 1000, 2)]
    assert loaded["k0998"] == rows[998]


def test_a_map_row_moved_by_a_resume_leaves_its_old_place(store: Store, other: Store) -> None:
    """A resume did key k0 again at place 4 (its input came back in another order): the
    row at its old place goes in the same write, and only if that place still holds k0."""
    store.apply(Writes(map_rows=_map_rows()[:2]), T0)  # k0 at 0, k1 at 1
    moved = MapRow("r1", "leads", 4, 4, "k0", "succeeded", attempt=2, moved_from=0)
    stale = MapRow("r1", "leads", 5, 5, "k1", "succeeded", attempt=2, moved_from=0)  # 0 is not k1's place
    store.apply(Writes(map_rows=[moved, stale]), T0 + 1)
    assert [(r.idx, r.row_key) for r in other.earlier_map_rows("r1", "leads", -1, 10)] == [
        (1, "k1"), (4, "k0"), (5, "k1")
    ]  # fmt: skip


def _map_rows(run_id: str = "r1", map: str = "leads") -> list[MapRow]:
    # Distinct rows 0..5 of the input; rows 2 and 4 failed; input index skips a duplicate.
    return [
        MapRow(run_id, map, idx, idx + (1 if idx >= 3 else 0), f"k{idx}", outcome, error)
        for idx, outcome, error in [
            (0, "succeeded", None),
            (1, "succeeded", None),
            (2, "failed", "k2 broke"),
            (3, "succeeded", None),
            (4, "failed", "k4 broke"),
            (5, "succeeded", None),
        ]
    ]


def test_map_rows_report_finished_succeeded_failed_and_counts(store: Store, other: Store) -> None:
    rows = _map_rows()
    # Written out of order and in two batches, plus another run's and another map's rows.
    store.apply(Writes(map_rows=rows[3:][::-1]), T0)
    store.apply(
        Writes(map_rows=rows[:3] + _map_rows(run_id="r2")[:2] + _map_rows(map="other")[:1]),
        T0 + 1,
    )

    assert sorted(other.finished_map_rows("r1", "leads")) == [0, 1, 2, 3, 4, 5]
    earlier = other.earlier_map_rows("r1", "leads", -1, 10)
    assert [(r.idx, r.row_key, r.succeeded) for r in earlier] == [
        (0, "k0", True), (1, "k1", True), (2, "k2", False), (3, "k3", True), (4, "k4", False), (5, "k5", True)
    ]  # fmt: skip
    assert [r.idx for r in other.earlier_map_rows("r1", "leads", 0, 2)] == [1, 2]  # paged by idx
    assert other.count_map_rows("r1", "leads") == {"succeeded": 4, "failed": 2}
    assert other.count_map_rows("r2", "leads") == {"succeeded": 2}
    assert other.count_map_rows("r1", "nope") == {}
    assert other.finished_map_rows("r9", "leads") == []
    assert other.failed_map_rows("r1", "leads", 10) == [rows[2], rows[4]]
    assert other.failed_map_rows("r1", "leads", 1) == [rows[2]]
    assert other.failed_map_rows("r1", "leads", 1, after_idx=rows[2].idx) == [rows[4]]  # paging
    assert other.failed_map_rows("r1", "leads", 10, after_idx=rows[4].idx) == []
    assert other.failed_map_rows("r2", "leads", 10) == []
    # A resume whose input ends at row 4 drops the rows past it.
    assert other.trim_map_rows("r1", "leads", 0, 4) == 2
    assert other.count_map_rows("r1", "leads") == {"succeeded": 3, "failed": 1}
    assert other.count_map_rows("r2", "leads") == {"succeeded": 2}


def test_trimming_map_rows_to_the_input_keys_keeps_a_key_holding_a_nul(store: Store, other: Store) -> None:
    """A resume that read its input whole drops the map rows of keys the input lost. On
    PostgreSQL a stored key holding a NUL (kept as U+FFFD) was never among the input's keys:
    its row was dropped and done again on every resume."""
    rows = [MapRow("r1", "leads", idx, idx, key, "succeeded", None) for idx, key in enumerate(["a\x00b", "c", "gone"])]
    store.apply(Writes(map_rows=rows), T0)
    assert other.trim_map_rows("r1", "leads", 0, 3, {"a\x00b", "c"}) == 1
    assert [r.idx for r in other.earlier_map_rows("r1", "leads", -1, 10)] == [0, 1]
    assert other.stored_key("a\x00b") == other.earlier_map_rows("r1", "leads", -1, 1)[0].row_key


def test_a_receipt_keeps_the_input_it_was_claimed_with(store: Store, other: Store) -> None:
    given = {"domain": "acme.com", "tags": ["a", 1]}
    assert one(store, mk_claim("k", input=given), T0)[0] == "claimed"
    assert stored(other, "k").input == given
    assert one(store, mk_claim("plain"), T0)[0] == "claimed"
    assert stored(other, "plain").input is None


def test_a_map_row_written_again_takes_the_new_outcome(store: Store) -> None:
    store.apply(Writes(map_rows=[MapRow("r1", "leads", 0, 0, "k0", "failed", "boom")]), T0)
    store.apply(Writes(map_rows=[MapRow("r1", "leads", 0, 0, "k0", "succeeded", None)]), T0 + 1)

    assert store.count_map_rows("r1", "leads") == {"succeeded": 1}
    assert store.failed_map_rows("r1", "leads", 10) == []


def test_map_rows_page_joins_the_sheet_and_pages_in_idx_order(store: Store, other: Store) -> None:
    sheet = [sheet_row(f"k{i}", status="failed" if i in (2, 4) else "succeeded") for i in range(6) if i != 5]
    # k5's sheet row is missing: the page still lists it, with no input and no cells.
    store.apply(Writes(sheet_rows=sheet, map_rows=_map_rows()[::-1]), T0)

    def page(after: int, limit: int, **kw: Any) -> list[tuple[int, str, str, Any]]:
        return [
            (d.idx, d.row_key, d.outcome, d.error)
            for d in other.map_rows_page("r1", "leads", "play/leads", after, limit, **kw)
        ]

    assert page(-1, 2) == [(0, "k0", "succeeded", None), (1, "k1", "succeeded", None)]
    assert page(1, 2) == [(2, "k2", "failed", "k2 broke"), (3, "k3", "succeeded", None)]
    assert page(3, 2) == [(4, "k4", "failed", "k4 broke"), (5, "k5", "succeeded", None)]
    assert page(5, 2) == []
    assert page(-1, 100, failed_only=True) == [(2, "k2", "failed", "k2 broke"), (4, "k4", "failed", "k4 broke")]
    assert page(2, 100, failed_only=True) == [(4, "k4", "failed", "k4 broke")]

    first = other.map_rows_page("r1", "leads", "play/leads", -1, 1)[0]
    assert first.input == {"domain": "k0.io", "n": 1}
    assert first.cells == sheet[0].cells
    last = other.map_rows_page("r1", "leads", "play/leads", 4, 1)[0]
    assert (last.input, last.cells) == (None, {})
    # Another sheet name joins nothing.
    assert other.map_rows_page("r1", "leads", "play/else", -1, 1)[0].cells == {}


def test_save_map_upserts_and_get_maps_lists_a_runs_maps_by_start(store: Store, other: Store) -> None:
    second = MapRecord("r1", "emails", "play/emails", ["domain"], ["email"], started_at=T0 + 5)
    first = MapRecord("r1", "leads", "play/leads", ["domain", "name"], ["company", "email"], total=6, started_at=T0)
    store.save_map(second)
    store.save_map(first)
    store.save_map(MapRecord("r2", "leads", "play/leads", started_at=T0))

    assert other.get_maps("r1") == [first, second]

    done = MapRecord(
        "r1",
        "leads",
        "play/leads",
        ["domain", "name"],
        ["company", "email", "score"],
        status="completed",
        total=6,
        succeeded=4,
        failed=2,
        duplicate=1,
        reused=3,
        started_at=T0 + 100,  # a later save keeps the first start time
        finished_at=T0 + 9,
    )
    store.save_map(done)

    [leads, emails] = other.get_maps("r1")
    assert emails == second
    assert leads.started_at == T0
    done.started_at = T0
    assert leads == done
    assert other.get_maps("r9") == []


# --- boundaries, events, journal ----------------------------------------------------------


def test_put_boundary_inserts_once_and_keeps_the_first_due_time(store: Store, other: Store) -> None:
    b = Boundary("r1", "sleep:nap", "sleep", due_at=T0 + 60, payload={"seconds": 60}, created_at=T0)

    assert store.put_boundary(b) == b
    again = other.put_boundary(Boundary("r1", "sleep:nap", "sleep", due_at=T0 + 999, created_at=T0 + 5))

    assert again == b
    assert store.get_boundary("r1", "sleep:nap") == b
    assert store.get_boundary("r1", "nope") is None
    assert store.get_boundary("r2", "sleep:nap") is None


def test_resolve_boundary_resolves_a_waiting_boundary_once(store: Store, other: Store) -> None:
    store.put_boundary(Boundary("r1", "event:approval", "event", event_id="approval", created_at=T0))
    store.put_boundary(Boundary("r1", "child:c", "child", child_run_id="c-1", created_at=T0 + 1))

    other.resolve_boundary("r1", "event:approval", {"approved": True}, T0 + 10)
    other.resolve_boundary("r1", "event:approval", {"approved": False}, T0 + 20)  # no effect
    other.resolve_boundary("r1", "missing", 1, T0 + 20)  # no effect, no error

    got = store.get_boundary("r1", "event:approval")
    assert got is not None
    assert (got.status, got.payload, got.resolved_at, got.event_id) == (
        "resolved",
        {"approved": True},
        T0 + 10,
        "approval",
    )
    child = store.get_boundary("r1", "child:c")
    assert child is not None
    assert (child.status, child.child_run_id, child.resolved_at) == ("waiting", "c-1", None)
    # A resolved boundary is not put back by a later put.
    assert store.put_boundary(Boundary("r1", "event:approval", "event", created_at=T0 + 30)).status == "resolved"


def test_boundaries_are_listed_by_creation_time_then_id(store: Store) -> None:
    store.put_boundary(Boundary("r1", "b", "sleep", due_at=T0 + 1, created_at=T0 + 2))
    store.put_boundary(Boundary("r1", "c", "sleep", due_at=T0 + 1, created_at=T0 + 1))
    store.put_boundary(Boundary("r1", "a", "sleep", due_at=T0 + 1, created_at=T0 + 2))
    store.put_boundary(Boundary("r2", "z", "sleep", due_at=T0 + 1, created_at=T0))

    assert [b.id for b in store.boundaries("r1")] == ["c", "a", "b"]
    assert [b.id for b in store.boundaries("r2")] == ["z"]
    assert store.boundaries("r3") == []


def test_send_event_delivers_once_and_the_first_payload_wins(store: Store, other: Store) -> None:
    assert store.get_event("r1", "approval") == (False, None)

    assert store.send_event("r1", "approval", {"approved": True, "by": "ada"}, T0) is True
    assert other.send_event("r1", "approval", {"approved": False}, T0 + 1) is False

    assert other.get_event("r1", "approval") == (True, {"approved": True, "by": "ada"})
    assert other.get_event("r2", "approval") == (False, None)
    assert other.send_event("r2", "approval", None, T0) is True
    assert store.get_event("r2", "approval") == (True, None)
    assert store.send_event("r1", "other", [1, "two"], T0) is True
    assert store.get_event("r1", "other") == (True, [1, "two"])


def test_an_event_sent_after_a_deadline_is_not_found_by_it(store: Store) -> None:
    assert store.send_event("r1", "approval", {"ok": True}, T0 + 10) is True
    assert store.get_event("r1", "approval", T0 + 10) == (True, {"ok": True})
    assert store.get_event("r1", "approval", T0 + 9.5) == (False, None)
    assert store.get_event("r1", "approval") == (True, {"ok": True})


def test_append_journal_is_idempotent_per_position_and_read_in_order(store: Store, other: Store) -> None:
    store.append_journal("r1", 1, "step:b")
    store.append_journal("r1", 0, "step:a")
    store.append_journal("r1", 10, "tool:c")
    other.append_journal("r1", 1, "step:DIFFERENT")  # the first id at a position stays
    store.append_journal("r2", 0, "x")

    assert other.journal("r1") == ["step:a", "step:b", "tool:c"]
    assert store.journal("r2") == ["x"]
    assert store.journal("r3") == []


# --- schema versions ----------------------------------------------------------------------


FUTURE = "9999_from_the_future"


@contextmanager
def written_by_a_newer_deepline(store_url: str) -> Iterator[None]:
    """The store as a newer deepline leaves it: `_migrations` names a migration we don't know."""
    open_store(store_url).close()
    if is_postgres(store_url):
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as conn:
            conn.execute("INSERT INTO _migrations (name, applied_at) VALUES (%s, 0)", (FUTURE,))
        try:
            yield
        finally:  # the session's database is shared by the tests that follow
            with psycopg.connect(store_url, autocommit=True) as conn:
                conn.execute("DELETE FROM _migrations WHERE name = %s", (FUTURE,))
    else:
        conn = sqlite3.connect(store_url)
        with conn:
            conn.execute("INSERT INTO _migrations (name, applied_at) VALUES (?, 0)", (FUTURE,))
        conn.close()
        yield


def test_store_written_by_a_newer_deepline_refuses_to_open(store_url: str) -> None:
    with written_by_a_newer_deepline(store_url):
        with pytest.raises(StoreError) as info:
            open_store(store_url)
        message = str(info.value)
        # The traceback holds the half-opened store; collect it here, quietly: whether it
        # left its connection open is the next test's business, not a later test's.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            del info
            gc.collect()

    assert "newer deepline" in message
    assert FUTURE in message
    assert "upgrade deepline" in message
    if not is_postgres(store_url):
        assert store_url in message
    else:
        # Once the unknown migration is gone the store opens again.
        open_store(store_url).close()


def test_a_store_that_refuses_to_open_closes_its_connection(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed open must not leave a database connection (or file handle) behind."""
    opened: list[Any] = []
    if is_postgres(store_url):
        import psycopg

        real_connect = psycopg.connect

        def tracking_connect(*args: Any, **kwargs: Any) -> Any:
            conn = real_connect(*args, **kwargs)
            opened.append(conn)
            return conn

        monkeypatch.setattr(psycopg, "connect", tracking_connect)

        def is_closed(conn: Any) -> bool:
            return bool(conn.closed)
    else:
        real_sqlite_connect = sqlite3.connect

        def tracking_sqlite_connect(*args: Any, **kwargs: Any) -> Any:
            conn = real_sqlite_connect(*args, **kwargs)
            opened.append(conn)
            return conn

        monkeypatch.setattr(sqlite3, "connect", tracking_sqlite_connect)

        def is_closed(conn: Any) -> bool:
            try:
                conn.execute("SELECT 1")
            except sqlite3.ProgrammingError:
                return True
            return False

    with written_by_a_newer_deepline(store_url):
        opened.clear()  # only the connections of the refused open count
        with pytest.raises(StoreError):
            open_store(store_url)
        refused = list(opened)
        left_open = [conn for conn in refused if not is_closed(conn)]
        for conn in left_open:
            conn.close()

    assert len(refused) == 1
    assert left_open == [], "the refused store left its connection open"


def test_opening_a_store_twice_migrates_once(store_url: str) -> None:
    first = open_store(store_url)
    second = open_store(store_url)
    try:
        one(first, mk_claim("k"), T0)
        assert one(second, mk_claim("k", run_id="r2", lease="L2"), T0 + 1)[0] == "busy"
    finally:
        first.close()
        second.close()


@contextmanager
def fresh_stores(store_url: str, count: int) -> Iterator[list[str]]:
    """`count` brand-new, never-opened stores on the same backend as `store_url`."""
    if not is_postgres(store_url):
        base = Path(store_url)
        yield [str(base.with_name(f"fresh-{i}.db")) for i in range(count)]
        return
    import psycopg

    head = store_url.rpartition("/")[0]
    names = [f"{store_url.rpartition('/')[2]}_fresh{i}" for i in range(count)]
    with psycopg.connect(store_url, autocommit=True) as admin:
        for name in names:
            admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield [f"{head}/{name}" for name in names]
    finally:
        with psycopg.connect(store_url, autocommit=True) as admin:
            for name in names:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_new_store_opened_by_several_processes_at_once_opens_for_all(store_url: str) -> None:
    """Two workers (or `deepline run`s) started together on a store nobody opened yet:
    each must wait for the other to create and migrate it, not fail."""
    rounds = 3 if is_postgres(store_url) else 40
    failures: list[str] = []
    with fresh_stores(store_url, rounds) as urls:
        for url in urls:
            barrier = threading.Barrier(4)

            def opener(url: str = url, barrier: threading.Barrier = barrier) -> None:
                barrier.wait(timeout=10)
                try:
                    open_store(url).close()
                except StoreError as exc:
                    failures.append(str(exc))

            threads = [threading.Thread(target=opener) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            # Whoever opened it, it is one store, fully migrated.
            check = open_store(url)
            try:
                one(check, mk_claim("k"), T0)
            finally:
                check.close()

    assert failures == [], f"{len(failures)} of {rounds * 4} opens failed, e.g. {failures[0]}"


# --- concurrency: two connections, then two processes --------------------------------------


def race(
    store_url: str, plans: dict[str, list[list[str]]], *, settle_some: bool = False
) -> dict[str, list[ClaimOutcome]]:
    """Two stores (two connections) in two threads, each applying its batches of claims
    for the same keys at the same moment; with `settle_some`, each batch also completes
    a random share of the receipts that racer already holds (as the runtime's group
    commit does). Returns every claim outcome per racer; fails on any store error."""
    stores = {name: open_store(store_url) for name in plans}
    outcomes: dict[str, list[ClaimOutcome]] = {name: [] for name in plans}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(plans))

    def racer(name: str) -> None:
        rng = random.Random(name)
        held: list[str] = []
        try:
            barrier.wait(timeout=10)
            for batch in plans[name]:
                rng.shuffle(held)
                done, held = (held[: rng.randint(0, len(held))], held) if settle_some else ([], held)
                held = [k for k in held if k not in set(done)]
                claims = [mk_claim(k, run_id=f"run-{name}", lease=f"{name}-{k}", expires=T0 + 300) for k in batch]
                settlements = [completed(k, f"{name}-{k}", output=name) for k in done]
                applied = stores[name].apply(Writes(settlements=settlements, claims=claims), T0)
                assert applied.settled == [True] * len(settlements)
                outcomes[name] += applied.outcomes
                held += [o.receipt.key for o in applied.outcomes if o.verdict == "claimed"]
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=racer, args=(name,)) for name in plans]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "a racer hung"
        assert errors == [], f"a racer failed: {errors[0]}"
    finally:
        for opened in stores.values():
            opened.close()
    return outcomes


def assert_each_key_claimed_once(store_url: str, keys: list[str], outcomes: dict[str, list[ClaimOutcome]]) -> None:
    by_key: dict[str, dict[str, ClaimOutcome]] = {k: {} for k in keys}
    for name, got in outcomes.items():
        assert sorted(o.receipt.key for o in got) == sorted(keys)
        for o in got:
            by_key[o.receipt.key][name] = o
    check = open_store(store_url)
    try:
        for key, seen in by_key.items():
            winners = [name for name, o in seen.items() if o.verdict == "claimed"]
            assert len(winners) == 1, (key, {n: o.verdict for n, o in seen.items()})
            [winner] = winners
            for name, o in seen.items():
                if name != winner:
                    # The loser is told who holds it (or is handed its finished result).
                    assert o.verdict in ("busy", "reused"), (key, name, o.verdict)
                    assert (o.receipt.run_id, o.receipt.lease_id) == (f"run-{winner}", f"{winner}-{key}")
            row = stored(check, key)
            assert (row.run_id, row.lease_id) == (f"run-{winner}", f"{winner}-{key}")
    finally:
        check.close()


@pytest.mark.parametrize("order", ["same", "reversed"])
def test_two_stores_racing_for_the_same_new_keys_each_key_is_claimed_once(store_url: str, order: str) -> None:
    keys = [f"race-{i:03d}" for i in range(200)]
    b_keys = keys if order == "same" else keys[::-1]
    plans = {
        "A": [keys[i : i + 20] for i in range(0, 200, 20)],
        "B": [b_keys[i : i + 20] for i in range(0, 200, 20)],
    }

    outcomes = race(store_url, plans)

    assert_each_key_claimed_once(store_url, keys, outcomes)
    for got in outcomes.values():
        assert {o.verdict for o in got} <= {"claimed", "busy"}


def test_claims_and_settlements_racing_in_any_order_never_fail(store_url: str) -> None:
    """Two processes' group commits interleave in whatever order their calls come: the
    store must sort that out itself (no deadlock surfacing as a StoreError, which would
    fail a run), and still give each key to exactly one of them."""
    for round_ in range(3):
        keys = [f"mix{round_}-{i:03d}" for i in range(300)]
        plans: dict[str, list[list[str]]] = {}
        for name in ("A", "B"):
            rng = random.Random(f"{name}{round_}")
            mine = keys[:]
            rng.shuffle(mine)
            batches: list[list[str]] = []
            while mine:
                size = rng.randint(5, 40)
                batches.append(mine[:size])
                mine = mine[size:]
            plans[name] = batches

        outcomes = race(store_url, plans, settle_some=True)

        assert_each_key_claimed_once(store_url, keys, outcomes)


RACE_PLAY = """\
import asyncio
import os
import time

from deepline_cli import play, tool

LOG = {log!r}


@tool("contract.race.echo", credits=1)
async def echo(input):
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{{input['id']}} {{os.getpid()}}\\n".encode())
    finally:
        os.close(fd)
    await asyncio.sleep(0.01)
    return {{"id": input["id"]}}


@play("contract-race")
async def race(ctx, input):
    # Both processes start their work at the same instant, whatever their import times.
    await asyncio.sleep(max(0.0, input["start_at"] - time.time()))
    rows = [{{"id": i}} for i in range(input["n"])]
    if input["reverse"]:  # the two runs meet in the middle: both execute calls
        rows.reverse()
    done = await ctx.map(
        "rows",
        rows,
        key="id",
        columns={{"echo": lambda row, rc: rc.tools.execute("echo", "contract.race.echo", {{"id": row["id"]}})}},
    )
    return {{"rows": len(done), "failed": done.failed_count, "ids": sorted(r["echo"]["id"] for r in done)}}
"""


@pytest.mark.process
@pytest.mark.parametrize("order", ["same", "opposite"])
def test_two_processes_running_the_same_rows_pay_each_call_once(store_url: str, tmp_path: Path, order: str) -> None:
    """Issue 6: two `deepline run` processes started at once on the same rows pay each
    distinct call once. In the same order, one mostly leads and the other mostly waits
    and reuses; in opposite orders they meet in the middle and both execute calls."""
    n = 300
    log = tmp_path / "calls.log"
    play_file = tmp_path / "play.py"
    play_file.write_text(RACE_PLAY.format(log=str(log)))
    open_store(store_url).close()  # migrate before the race
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPLINE_")}
    env["DEEPLINE_LEASE_TTL"] = "5"
    env["PYTHONUNBUFFERED"] = "1"
    start_at = time.time() + 2.0

    procs = {
        run_id: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "deepline_cli",
                "run",
                str(play_file),
                "--store",
                store_url,
                "--run-id",
                run_id,
                "--input",
                _json.dumps_str({"n": n, "start_at": start_at, "reverse": order == "opposite" and run_id == "race-b"}),
                "--concurrency",
                "16",
                "--json",
                "--quiet",
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        for run_id in ("race-a", "race-b")
    }
    outputs: dict[str, tuple[int, str, str]] = {}
    for run_id, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"{run_id} did not finish: {err[-2000:]}")
        outputs[run_id] = (proc.returncode, out, err)

    # Paid once, first: even if a run failed, no call may have been executed twice.
    lines = log.read_text().splitlines() if log.exists() else []
    per_id = Counter(int(line.split()[0]) for line in lines)
    pids = {line.split()[1] for line in lines}
    twice = sorted(i for i, c in per_id.items() if c > 1)
    assert twice == [], f"{len(twice)} calls executed more than once, e.g. {twice[:10]}"
    for run_id, (code, out, err) in outputs.items():
        assert code == 0, f"{run_id} exited {code}:\n{err[-3000:]}\n{out[-3000:]}"
    assert sorted(per_id) == list(range(n))
    assert len(lines) == n

    finished: dict[str, dict[str, Any]] = {}
    for run_id, (_, out, _) in outputs.items():
        [end] = [e for e in map(_json.loads, filter(None, out.splitlines())) if e.get("event") == "run.finished"]
        finished[run_id] = end
    for end in finished.values():
        assert end["status"] == "completed", end
        assert end["output"]["rows"] == n
        assert end["output"]["failed"] == 0
        assert end["output"]["ids"] == list(range(n))
        # A run whose rows the other one finished first reuses the shared sheet's cells
        # and makes no tool call at all (no stats entry for the tool).
        assert end["stats"]["tools"].get("contract.race.echo", {}).get("failed", 0) == 0
    live = {
        run_id: end["stats"]["tools"].get("contract.race.echo", {}).get("live", 0) for run_id, end in finished.items()
    }
    assert sum(live.values()) == n, live

    store = open_store(store_url)
    try:
        for run_id in procs:
            record = store.get_run(run_id)
            assert record is not None and record.status == "completed"
            assert store.count_map_rows(run_id, "rows") == {"succeeded": n}
        receipts = store.query_receipts(ReceiptQuery(tool="contract.race.echo"))
        assert len(receipts) == n
        assert {r.status for r in receipts} == {"completed"}
        assert sum(store.credits_spent(run_id) for run_id in procs) == n
        assert store.credits_spent("race-a") == live["race-a"]
    finally:
        store.close()
    # Both processes really raced (each executed some calls) — informative, not required.
    print(f"live calls per run: {live}, executing pids: {len(pids)}")


# --- the run state machine ------------------------------------------------------------------


def test_a_run_moves_only_as_the_run_state_machine_allows(store_url: str) -> None:
    """Every status write goes through it: a move it does not draw changes nothing."""
    from deepline_cli.store.run_states import TRANSITIONS

    store = open_store(store_url)
    try:
        now = store.now()
        with pytest.raises(ValueError, match="starts"):
            store.insert_run(RunRecord("born-done", "p", "p.py", {}, status="completed", created_at=now))
        with pytest.raises(ValueError, match="set_status"):
            store.update_run("anything", status="failed")
        statuses = sorted(TRANSITIONS)
        for start in ("queued", "running"):
            for to in statuses:
                for via in statuses:
                    run_id = f"sm-{start}-{via}-{to}"
                    assert store.insert_run(RunRecord(run_id, "p", "p.py", {}, status=start, created_at=now))
                    reached = start
                    if via != start and start in TRANSITIONS[via]:
                        assert store.set_status(run_id, via)
                        reached = via
                    moved = store.set_status(run_id, to)
                    assert moved == (reached in TRANSITIONS[to]), (start, via, to)
                    assert store.get_run(run_id).status == (to if moved else reached)  # type: ignore[union-attr]
        assert not TRANSITIONS["completed"] - {"running"}
        assert all("completed" not in allowed for allowed in TRANSITIONS.values())  # completed is final
    finally:
        store.close()


def test_sheet_rows_loaded_without_their_input_keep_everything_else(store: Store) -> None:
    """What a map's reuse reads: every field but the stored input (None)."""
    rows = [sheet_row("a"), sheet_row("b", status="failed")]
    store.apply(Writes(sheet_rows=rows), T0)

    loaded = store.load_sheet_rows("play/leads", ["a", "b"], with_input=False)

    for row in rows:
        row.input = None
    assert loaded == {"a": rows[0], "b": rows[1]}


def test_tick_run_ids_are_a_schedules_ticks_only(store: Store, other: Store) -> None:
    for run_id in ("sched-daily-20261205T060000Z", "sched-daily-eu-20261205T060000Z", "sched-dai_y-20261205T060000Z"):
        store.insert_run(make_run(run_id))
    assert other.tick_run_ids("sched-daily-", 10) == ["sched-daily-20261205T060000Z"]
    assert other.tick_run_ids("sched-daily-eu-", 10) == ["sched-daily-eu-20261205T060000Z"]
    assert other.tick_run_ids("sched-d%", 10) == []  # the prefix is text, not a pattern


def test_a_run_that_died_holding_a_call_counts_the_answer_another_run_paid_for_as_reused(
    store: Store, other: Store
) -> None:
    """Run r1 died with a call out; r2 took the call over (its lease expired) and paid for
    it; r1's resume is answered by r2's receipt. r1 reused it: counted once, as a reuse, both
    when it claims (first use) and in its figures from the store."""
    seed(store, make_run("r1"))
    claim(store, [mk_claim("k")], T0)  # r1, attempt 1: killed before it settled
    [taken] = claim(other, [mk_claim("k", run_id="r2", lease="M")], T0 + TTL + 1)
    assert taken.verdict == "claimed"
    settle(other, [completed("k", "M", output={"v": 1}, credits=2, run_id="r2")], T0 + TTL + 2)

    [again] = claim(store, [mk_claim("k", attempt=2, lease="L2")], T0 + TTL + 3)
    assert (again.verdict, again.first_use) == ("reused", True)
    stats = store.ledger.run_stats("r1")
    assert stats["tools"]["demo.tool"]["reused"] == 1, stats


def _failed_rows(store: Store, n: int, run_id: str = "r1") -> None:
    """A run's map `m` of n rows, each with a failed call; rows alternate succeeded (a
    waterfall got past the failure) and failed. Plus one failure outside maps."""
    seed(store, make_run(run_id))
    claims = [mk_claim(f"{run_id}-k{i}", run_id=run_id, lease=f"L{i}") for i in range(n)]
    claim(store, [*claims, mk_claim(f"{run_id}-body", run_id=run_id, lease="LB")], T0)
    settlements = [
        Settlement(f"{run_id}-k{i}", f"L{i}", "failed", error={"message": "no"}, failure_kind="not_found",
                   call=CallRecord(run_id, 1, "tool", "demo.tool", T0, map="m", row_key=f"row{i}"))
        for i in range(n)
    ] + [Settlement(f"{run_id}-body", "LB", "failed", error={"message": "no"}, failure_kind="internal",
                    call=CallRecord(run_id, 1, "tool", "demo.tool", T0))]  # fmt: skip
    settle(store, settlements, T0 + 1)
    rows = [MapRow(run_id, "m", i, i, f"row{i}", "succeeded" if i % 2 else "failed", rev=1) for i in range(n - 1)]
    store.apply(Writes(map_rows=rows), T0 + 2)  # the last row is not recorded (in flight at a stop)


def test_final_failures_say_how_each_calls_row_ended(store: Store) -> None:
    _failed_rows(store, 5)
    by_key = {f.key: f.row for f in store.ledger.final_failures("r1")}
    assert by_key == {"r1-k0": "failed", "r1-k1": "succeeded", "r1-k2": "failed", "r1-k3": "succeeded",
                      "r1-k4": None, "r1-body": ""}  # fmt: skip


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_final_failures_read_a_map_once_not_once_per_failed_call(store: Store) -> None:
    """A waterfall whose first provider misses a third of 50,000 rows: each miss is a failed
    call. Reading how their rows ended grows with the rows, not with rows × failures (it
    took minutes at the end of every such run). Counted in SQLite's own steps, not time."""
    conn = store.receipts._conn  # type: ignore[attr-defined]
    counted = Counter[str]()
    steps = []
    for run_id, n in (("small", 1000), ("large", 4000)):
        _failed_rows(store, n, run_id)
        conn.set_progress_handler(lambda: counted.update([run_id]), 1000)  # noqa: B023 - set anew each turn
        try:
            assert len(store.ledger.final_failures(run_id)) == n + 1
        finally:
            conn.set_progress_handler(None, 0)
        steps.append(counted[run_id])
    assert steps[1] < 6 * steps[0], steps  # 4× the rows: about 4× the work, not 16×


def test_only_a_holder_the_os_says_is_gone_gives_up_its_calls_to_another_run(store: Store, other: Store) -> None:
    """A run holding a call: another run wanting the same call takes it over at once only if
    the holder is a process of this machine that is gone. A live holder whose run lease
    lapsed (a store hiccup held its heartbeat), or one on another machine, keeps the call
    until the receipt's own lease ends: its call may be out."""
    import subprocess
    import sys

    from deepline_cli.runtime.run.holders import holder_id, release_if_dead

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = f"{holder_id().rsplit(':', 2)[0]}:{int(dead.stdout)}"  # this machine, a process that ended
    now = store.now()
    for run_id, holder in (("alive", holder_id()), ("elsewhere", "build-7.other:4242"), ("gone", gone)):
        seed(store, make_run(run_id, holder=holder, lease_expires_at=now - 1))  # its run lease lapsed
        claim(store, [mk_claim(f"{run_id}-k", run_id=run_id, expires=now + 600)], now)
    runs = ("alive", "elsewhere", "gone")
    assert [release_if_dead(other, run_id) for run_id in runs] == [False, False, True]
    assert [stored(other, f"{run_id}-k").status for run_id in runs] == ["running", "running", "released"]


def test_stopping_a_run_whose_process_died_gives_up_the_calls_it_held(store: Store, other: Store) -> None:
    """`runs stop` ends a run whose process was killed: the calls it held are given up with
    it, so the next run wanting them does not wait out their leases."""
    import subprocess
    import sys

    from deepline_cli.runtime.run.holders import holder_id
    from deepline_cli.runtime.run.stop import stop_run

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    now = store.now()
    seed(store, make_run("killed", holder=f"{holder_id().rsplit(':', 2)[0]}:{int(dead.stdout)}",
                         lease_expires_at=now + 600))  # fmt: skip
    claim(store, [mk_claim("killed-k", run_id="killed", expires=now + 600)], now)
    stop_run(store, "killed", "not needed")
    assert (other.runs.get_run("killed").status, stored(other, "killed-k").status) == ("interrupted", "released")
