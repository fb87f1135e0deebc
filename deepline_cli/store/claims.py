"""The receipt state machine: may a claim own a receipt, or what else happens, and which
provider idempotency key the winner sends. A pure function both stores share, so SQLite
and PostgreSQL cannot disagree about it.

    none, skipped, released ──claim──► running ──settle──► completed │ failed │ released │ skipped
    completed ──reuse (no call)      unless forced, stale, or refreshed by another run
    failed    ──report the failure   unless transient, --refresh-failed, forced or refreshed
    running   ──busy (wait)          unless its lease expired or an earlier attempt of this run holds it
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from deepline_cli.store.records import (
    Claim,
    ClaimOutcome,
    ClaimVerdict,
    Receipt,
    Settlement,
    Writes,
    sent_again,
)

if TYPE_CHECKING:
    from deepline_cli.store.roles import ReceiptStore


RUN_SCOPED = ("step", "fetch")  # kinds keyed by their run and id: reused by no other run


# How a claim's run had a receipt another run holds now: "used" (an earlier attempt was
# answered from it, fresh then: not judged stale again; a force given since refreshes it), or
# "owned" (it paid for it, and another run refreshed it since: as its own, never paid again).
Had = Literal["used", "owned"]


def decide_claim(existing: Receipt | None, claim: Claim, now: float, *, had: Had | None = None) -> ClaimVerdict:
    """The receipt state machine: may `claim` own the receipt, or what else happens.
    `had`: how the claim's run had the receipt before, if it did (see Had).

    - no receipt, a skipped or released one, or a transient (or explicitly refreshed)
      failure: claim
    - completed: reuse, unless stale (older than `stale_after_s`, or `refresh_after_s`) for
      a run that has not had it yet, or forced by a run that did not complete it (nor owned
      it before another run refreshed it); a step or fetch (its key is its run's own) goes
      stale within its run
    - failed for good (not transient, no --refresh-failed, not refreshed): report the
      stored failure
    - running: take over when its lease expired or it belongs to an earlier attempt of
      the same run (that attempt is dead: we hold the run's lease); else it is busy
    """
    if existing is None or existing.status in ("skipped", "released"):
        return "claimed"
    if existing.status == "running" and existing.lease_id == claim.lease_id:
        return "claimed"  # this very claim, applied before its connection dropped: it is ours
    # A forced or stale call is made once per run: a resume reuses what this run paid for,
    # and what it took from another run while it was fresh (a nightly refresh resumed later:
    # not judged stale again; a force given to this attempt refreshes it).
    other_run = existing.run_id != claim.run_id and had != "owned"
    judged = other_run and had is None
    refreshed = judged and claim.refresh_after_s is not None and _is_stale(existing, claim.refresh_after_s, now)
    if existing.status == "completed":
        forced = claim.force and other_run
        stale = (judged or claim.kind in RUN_SCOPED) and _is_stale(existing, claim.stale_after_s, now)
        if forced or refreshed or stale:
            return "claimed"
        return "reused"
    if existing.status == "failed":
        # Asked to refresh: another run's failure, or this run's of an earlier attempt when the
        # flag was given to this attempt (a resume that only kept it refreshes none twice).
        asked = (claim.refresh_failed or claim.force) and asks_anew(existing, claim)
        retry = existing.retryable or asked or refreshed
        return "claimed" if retry else "failed"
    expired = (existing.lease_expires_at or 0.0) <= now
    dead_attempt = existing.run_id == claim.run_id and existing.attempt < claim.attempt
    return "claimed" if (expired or dead_attempt) else "busy"


def asks_anew(existing: Receipt, claim: Claim) -> bool:
    """Does a refresh or force of `claim` apply to this receipt: another run's, or one of an
    earlier attempt of its run the refresh was asked of (`refresh_own_before`)? A resume that
    only kept the flag redoes nothing its run did already under it."""
    before = claim.attempt if claim.refresh_own_before is None else claim.refresh_own_before
    return existing.run_id != claim.run_id or existing.attempt < before


def claim_idempotency_key(existing: Receipt | None, claim: Claim) -> str:
    """The provider idempotency key a claim that won the receipt sends.

    - a takeover of a call that may have been sent (running, released), or the retry of
      a transient failure: the key it was sent with, so the provider bills it once;
    - a new paid call of a receipt that has an answer (forced or stale refresh), of a
      failure the user asked to refresh, or of another run's failure forced: a fresh key, so the
      provider does not replay;
    - otherwise: the call's own key.
    """
    if existing is None or existing.status == "skipped":
        return claim.idempotency_key
    if sent_again(existing, claim):
        return existing.idempotency_key or claim.idempotency_key
    return claim.fresh_idempotency_key or claim.idempotency_key


def _is_stale(receipt: Receipt, stale_after_s: float | None, now: float) -> bool:
    if stale_after_s is None:
        return False
    if stale_after_s <= 0:
        return True
    return now - (receipt.completed_at or 0.0) > stale_after_s


def claim(store: ReceiptStore, claims: Sequence[Claim], now: float) -> list[ClaimOutcome]:
    return store.apply(Writes(claims=list(claims)), now).outcomes


def settle(store: ReceiptStore, settlements: Sequence[Settlement], now: float) -> list[bool]:
    return store.apply(Writes(settlements=list(settlements)), now).settled


def given_back(key: str, claimed: ClaimOutcome, *, sent: bool) -> Settlement:
    """A claim given back unfinished: `skipped` when its call never went out, by this claim
    (`sent` False) or any before it (not `resumed`), the receipt's earlier answer or failure
    restored; else `released`, so the next claim sends it under the key it may have been
    sent with, and a provider bills it once."""
    lease_id = claimed.receipt.lease_id or ""
    prior = claimed.prior
    if not sent and prior is not None and prior.status == "failed":
        # A failure asked again (a transient one, a refresh, a forced call), given back before
        # its call: kept as it was, its error (what the next refresh does) and the key it
        # went out under (it may have been processed).
        return Settlement(key, lease_id, "skipped", replaces=prior)
    if sent or claimed.resumed:
        return Settlement(key, lease_id, "released")
    return Settlement(key, lease_id, "skipped", replaces=claimed.replaces)
