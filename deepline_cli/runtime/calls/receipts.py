"""Receipts at run time: claim, invoke, settle — the path every paid call takes.

    execute(call)
      ├─ an identical call in flight in this process?  share its answer   (in_flight)
      ├─ claim the receipt (batched with other claims, one transaction)
      │    reused  → return the stored output, no provider call          (receipt)
      │    failed  → raise the stored failure (a permanent one)
      │    busy    → another live owner runs it: wait, then claim again
      │    claimed → we own a lease ─┐
      ├─ re-check the lease, then invoke the tool                         (live)
      └─ settle: completed / failed / released (batched, only by the lease owner)

A completed call that cannot be recorded trips the circuit breaker: no further
provider call is dispatched in this run, and the run fails loudly.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from deepline_cli import _json
from deepline_cli.errors import (
    TRANSIENT_CATEGORIES,
    BudgetExceededError,
    Category,
    DeeplineError,
    ProviderTransientError,
    ReceiptLeaseLostError,
    StoreError,
    ToolExecutionError,
    UsageError,
)
from deepline_cli.runtime.calls.breaker import Breaker
from deepline_cli.runtime.calls.budget import Budget, Reservation
from deepline_cli.runtime.calls.call_scope import current_cell, hold_back_cell
from deepline_cli.runtime.calls.events import EventBus
from deepline_cli.runtime.calls.identity import Identity
from deepline_cli.runtime.calls.leases import HeldLeases
from deepline_cli.runtime.calls.stats import RunStats
from deepline_cli.runtime.calls.store_thread import StoreIO, WriteQueue
from deepline_cli.runtime.calls.tally import CallTally
from deepline_cli.runtime.providers.secrets import Secrets
from deepline_cli.runtime.providers.tools import Execution, ToolCall
from deepline_cli.store.claims import given_back
from deepline_cli.store.records import (
    RESENT_AFTER_409,
    UNANSWERED,
    CallRecord,
    Claim,
    ClaimOutcome,
    LogLine,
    Receipt,
    Settlement,
    said_not_found,
)

BUSY_POLL_S = 0.25
KEY_CHARS = 32  # of a receipt key's SHA-256 hex digest: 128 bits
KEPT_INPUT_BYTES = 4096  # a call's input larger than this (as JSON) is not kept on its receipt


# Made for every call and never changed after; not `frozen`, which makes construction three
# times slower (a frozen dataclass sets each field through object.__setattr__).
@dataclass(slots=True)
class DurableCall:
    key: str
    kind: str
    label: str
    tool: str | None = None
    force: bool = False
    stale_after_s: float | None = None
    credits: float = 0.0
    metered: bool = False  # the answer says what the call cost (remote tools)
    receipt_wait_s: float | None = None
    # A batch aggregate: its members (key, lease id) and the request it sends.
    members: list[tuple[str, str]] | None = None
    request: Any = None
    description: str | None = None  # what the call is for, in the play's words (logs, report)
    input: Any = None  # what the call sends, kept on its receipt when small (`receipts inspect`)
    batched: bool = False  # a member of a batching tool: sent only inside a batch


class LeaseLost(ReceiptLeaseLostError):
    """The lease was lost before the call went out: claim the receipt again."""


class RunTakenOver(ReceiptLeaseLostError):
    """Another process took this run over (a later attempt): this one may claim nothing more."""


class MapStopped(DeeplineError):
    """The map this call's row belongs to stopped before the call went out: not sent, given back."""

    fatal = True


@dataclass(slots=True)  # one per call, never changed (not frozen: see DurableCall)
class Outcome:
    value: Any
    execution: Execution
    key: str
    credits: float = 0.0
    answered_at: float | None = None  # a receipt's answer reused: when it was made


def durable_id(id: Any, call: str) -> str:
    """A durable call's id as given: text (it names paid work across runs), else refused."""
    if not isinstance(id, str) or not id:
        raise UsageError(f'The id of {call} must be text that names the call, like "company", not {id!r}.')
    return id


def receipt_key(*parts: str | bytes) -> str:
    """A receipt's identity: 128 bits of SHA-256 over its parts (short keys keep the
    store's index small, which is most of what a durable call costs)."""
    return _json.digest(*parts)[:KEY_CHARS]


def idempotency_key(receipt_key: str, lease_id: str | None = None) -> str:
    """The provider idempotency key: the receipt key itself (so every retry, resume or
    other process sends the same one), or, for a new paid call of a receipt that has an
    answer already (forced or stale), the receipt key with the claim's lease (unique)."""
    if lease_id is None:
        return "dl-" + receipt_key
    return f"dl-{receipt_key}-{lease_id}"


class LeaseIds:
    """Unique lease ids without a system call each: a random process token + a counter."""

    def __init__(self) -> None:
        self._token = os.urandom(8).hex()
        self._next = itertools.count(1)

    def new(self) -> str:
        return f"{self._token}-{next(self._next)}"


class InFlight:
    """Identical calls at once in one process: the first makes the call, the others share
    its answer (or its error). The waiters' future is made only when a second one arrives."""

    def __init__(self) -> None:
        self._calls: dict[str, asyncio.Future[Outcome] | None] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._calls

    def start(self, key: str) -> None:
        self._calls[key] = None

    def end(self, key: str, outcome: Outcome | BaseException) -> bool:
        """The first caller's answer (or error), handed to the callers that shared it: were
        there any?"""
        shared = self._calls.pop(key, None)
        if shared is None:
            return False
        if isinstance(outcome, BaseException):
            shared.set_exception(outcome)
        else:
            shared.set_result(outcome)
        return True

    async def share(self, key: str) -> Outcome:
        shared = self._calls[key]
        if shared is None:
            shared = self._calls[key] = asyncio.get_running_loop().create_future()
            shared.add_done_callback(_retrieve)
        return await asyncio.shield(shared)


class ReceiptBook:
    """Every durable call of one run (or child run) goes through its book: claim the
    receipt, invoke the tool while holding its lease, settle the outcome, count it. The
    module docstring draws the path."""

    def __init__(
        self,
        io: StoreIO,
        writes: WriteQueue,
        scope: Identity,
        bus: EventBus,
        stats: RunStats,
        *,
        budget: Budget | None = None,
        secrets: Secrets | None = None,
        release_if_dead: Callable[[str], bool] | None = None,
    ) -> None:
        # (on the store) the calls a run held, given up if its process on this machine is gone;
        # asked once per owner and BUSY_POLL_S (many calls held by one run find it busy at once)
        self._release_if_dead = release_if_dead
        self._owners_asked: dict[str, float] = {}
        self._budget = budget or Budget(None)
        self._secrets = secrets or Secrets()
        self._io = io
        self._writes = writes
        self._scope = scope
        self._bus = bus
        self._stats = stats
        self._lease_ids = LeaseIds()
        self._inflight = InFlight()
        self._leases = HeldLeases(io, scope.lease_ttl)
        self._tally = CallTally(stats, bus, scope.run_id)
        self._breaker = Breaker()  # shared with child runs: stopping one stops them all
        # A refusal (the breaker's, the budget's, a child's) was raised into this run's code:
        # what it returns after that may be made of one (a caught refusal), and is not kept.
        self.refused = False
        self._unpriced: set[str] = set()  # metered tools whose answers say no price, warned of once
        # Calls answered after another process took them over (this one paused past its leases):
        # the first is said with its label, the rest in one line once the calls are settled.
        self._late, self._late_said = 0, 0

    @property
    def scope(self) -> Identity:
        return self._scope

    @property
    def max_credits(self) -> float | None:
        """The budget this run (and the children that share its book) spends within."""
        return self._budget.max_credits

    @property
    def budgeted(self) -> bool:
        """Does a credit budget bound this run (and the children that share its book)?"""
        return self._budget.max_credits is not None

    def for_scope(self, scope: Identity) -> ReceiptBook:
        """A book for a child run: its own claims, the same writes, budget and secrets."""
        child = ReceiptBook(
            self._io, self._writes, scope, self._bus, self._stats, budget=self._budget, secrets=self._secrets,
            release_if_dead=self._release_if_dead,
        )  # fmt: skip
        child._breaker = self._breaker
        return child

    # --- the call path -------------------------------------------------------------------

    async def execute(self, call: DurableCall, invoke: Callable[[ToolCall], Awaitable[Any]]) -> Outcome:
        """One durable call: its answer from a receipt, from an identical call in flight, or
        from the provider (then settled on a receipt)."""
        if self._secrets.active:  # an id may hold a secret: it is stored, shown and logged as redacted
            call.label = self._secrets.redact(call.label)
        if not call.force and call.key in self._inflight:
            outcome = await self._inflight.share(call.key)
            # One call answered both: it is counted once, by how it was answered.
            self._tally.count(call, "in_flight", outcome.credits, counted=True)
            _aged(outcome.answered_at)
            return Outcome(outcome.value, "in_flight", call.key, outcome.credits, outcome.answered_at)
        self._inflight.start(call.key)
        try:
            outcome = await self._execute(call, invoke)
        except BaseException as exc:
            self._inflight.end(call.key, exc)
            raise
        if self._inflight.end(call.key, outcome) and outcome.execution == "live":
            # Others share this answer (each takes a copy of it as its row resumes): this
            # caller's row gets its own copy now, before it changes anything in it.
            outcome = Outcome(_json.as_stored(outcome.value), "live", call.key, outcome.credits, outcome.answered_at)
        return outcome

    async def _execute(self, call: DurableCall, invoke: Callable[[ToolCall], Awaitable[Any]]) -> Outcome:
        waited = 0.0
        while True:
            self.check_open()
            outcome = await self._claim(call)
            receipt = outcome.receipt
            # A receipt this run paid for in an earlier attempt is already in its counts.
            own = receipt.run_id == self._scope.run_id
            if outcome.verdict == "reused":
                # Reused: a receipt of an earlier run, counted once however often this run asks.
                self._tally.count(call, "reused", receipt.credits, counted=own or not outcome.first_use)
                _aged(receipt.completed_at)
                kind: Execution = "checkpoint" if call.kind == "step" else "receipt"
                return Outcome(receipt.output, kind, call.key, receipt.credits, receipt.completed_at)
            if outcome.verdict == "failed":
                self._tally.count(
                    call, "failed", 0.0, counted=own, kept=not own, not_found=said_not_found(receipt.error)
                )
                raise stored_failure(receipt)
            if outcome.verdict == "busy":
                if not waited and await self._owner_gone(receipt):
                    continue  # a killed run held it: taken over at once, as its resume would
                waited = await wait_busy(call, receipt, waited, self._io.now())
                continue
            if outcome.verdict == "superseded":
                raise self._breaker.trip(
                    RunTakenOver(f"Run {self._scope.run_id} was taken over by another process; this one stopped.")
                )
            try:
                return await self._invoke(call, outcome, invoke)
            except LeaseLost:
                continue  # taken over before it went out: wait for the new owner's answer

    async def _owner_gone(self, receipt: Receipt) -> bool:
        """Did the receipt's run die on this machine (its calls given up just now)?"""
        if self._release_if_dead is None or receipt.run_id == self._scope.run_id:
            return False
        now = time.monotonic()
        if now - self._owners_asked.get(receipt.run_id, -BUSY_POLL_S) < BUSY_POLL_S:
            return False  # asked just now for another of its calls
        self._owners_asked[receipt.run_id] = now
        return await self._io.call(self._release_if_dead, receipt.run_id)

    async def _claim(self, call: DurableCall) -> ClaimOutcome:
        scope = self._scope
        lease_id = self._lease_ids.new()
        force = call.force or (scope.force_refresh and call.kind != "step")
        cell = current_cell()
        claim = Claim(
            key=call.key,
            kind=call.kind,
            label=call.label,
            tool=call.tool,
            run_id=scope.run_id,
            attempt=scope.attempt,
            lease_id=lease_id,
            lease_expires_at=self._io.now() + scope.lease_ttl,
            idempotency_key=idempotency_key(call.key),
            fresh_idempotency_key=idempotency_key(call.key, lease_id),
            force=force,
            stale_after_s=call.stale_after_s,
            refresh_after_s=cell.refresh_after_s if cell is not None else None,
            refresh_failed=scope.refresh_failed,
            refresh_own_before=scope.refresh_own_before,
            members=call.members,
            request=call.request,
            description=call.description,
            input=kept_input(call.input, self._secrets),
            batched=call.batched,
            map=cell.map if cell is not None else None,
            row_key=cell.row_key if cell is not None else None,
        )
        # If this waiter is cancelled, the write queue releases the claim once written.
        return await self._writes.claim(claim)

    async def _invoke(
        self, call: DurableCall, claimed: ClaimOutcome, invoke: Callable[[ToolCall], Awaitable[Any]]
    ) -> Outcome:
        receipt = claimed.receipt
        lease_id = receipt.lease_id or ""
        self._leases.hold(lease_id, call.key, receipt.lease_expires_at or 0.0)
        info = ToolCall(
            idempotency_key=receipt.idempotency_key or "",
            run_id=self._scope.run_id,
            attempt=self._scope.attempt,
            receipt_key=call.key,
            resumed=claimed.resumed,
            lease_id=lease_id,
            batch_key=receipt.batch_key,
            _owner=self,
            _call=call,
        )
        reserved: Reservation | None = None
        try:
            try:
                asked = (call.tool, call.credits, call.label)
                reserved = self._budget.reserve(*asked, metered=call.metered) or await self._budget.admit(
                    *asked, metered=call.metered
                )
                await info.ready()  # after a wait for the budget too
            except BaseException as exc:
                if reserved is not None:
                    self._budget.release(reserved)
                self._writes.settle(given_back(call.key, claimed, sent=False))
                if isinstance(exc, BudgetExceededError):
                    # The run stops on it even if the play catches it (`except Exception`):
                    # nothing more is sent, and the run fails on the budget, resumable.
                    self._breaker.trip(exc)
                    self.refusal_raised()
                raise
            started = self._io.now()
            try:
                value = self._secrets.redact_json(await invoke(info))
            except BaseException as exc:
                self._budget.release(reserved)
                record = call_record(self._scope, call, started, info)
                # A try of it unanswered (a batch's member: the batch carrying it), or sent again
                # under the key it may have gone out with (a stopped attempt's, a failure that may
                # have been processed): it may have been processed. A member resumed, not known to
                # have gone out, is not said to be: it goes out again as its batch does.
                unanswered = info.unanswered or (claimed.maybe_processed and not call.batched)
                failed = failure_settlement(call, claimed, exc, record, self._secrets, queued=info.queued,
                                            unanswered=unanswered)  # fmt: skip
                self._settle_failure(call, failed, info.held_s)
                if _is_call_failure(call, exc):
                    # The same error type live as when replayed from the failed receipt.
                    error = tool_error(exc, call.tool)
                    error.unanswered = unanswered  # a batch's members learn it from their batch's
                    if error is not exc:
                        raise error from exc
                raise
        finally:
            self._leases.release(lease_id)
        # Write-behind: the completion commits with the next batch, in order, before any
        # later claim of this run; a crash before that commit makes this call one of
        # those "in flight", repeated on resume under the same idempotency key.
        credits = call.credits if info.credits is None else info.credits  # what the provider said it cost
        if call.metered and info.credits is None and not call.credits and self._budget.max_credits is not None:
            self._warn_unpriced(call.tool or call.label)
        overrun = self._budget.settle(reserved, credits)
        if overrun is not None:
            self._breaker.trip(overrun)  # nothing more is sent; the calls in flight finish and are recorded
        settlement = Settlement(
            call.key,
            lease_id,
            "completed",
            output=value,
            credits=credits,
            call=call_record(self._scope, call, started, info),
            replaces=claimed.replaces,
            reported=info.credits is not None,
            output_json=written(value),
        )
        self._writes.settle(settlement, partial(self._check_recorded, call), info.held_s)
        self._tally.count(call, "live", credits)
        return Outcome(value, "live", call.key, credits)

    def _warn_unpriced(self, tool: str) -> None:
        """A budget cannot hold calls that cost nothing it knows of: said once per tool."""
        if tool not in self._unpriced:
            self._unpriced.add(tool)
            self._log(
                f"{tool} answered without a price and declares no credits: the budget counts its calls as free; "
                f"declare its credits in deepline.toml ([remote] credits) for --max-credits to hold them",
                level="warning",
            )

    def _check_recorded(self, call: DurableCall, applied: bool | BaseException) -> None:
        """The circuit breaker: a billed call that was not recorded stops the run."""
        if isinstance(applied, BaseException):
            self._breaker.trip(
                StoreError(
                    f"A completed call ({call.label}) could not be recorded in the "
                    f"store ({applied}); stopping this run so nothing is paid twice."
                )
            )
        elif not applied:
            # Our lease lapsed while the call was out (a paused process) and another owner
            # took the receipt: it sends the call under the same idempotency key and records
            # the answer, so nothing is paid twice and nothing is lost.
            self._late += 1
            if self._late == 1:
                self._log(
                    f"{call.label}: answered after another process took the call over; its record is kept",
                    level="warning",
                )
                self._late_said = 1

    def _say_late(self) -> None:
        """The calls answered after a takeover not said one by one: in one line."""
        more = self._late - self._late_said
        if more > 0:
            self._late_said = self._late
            self._log(
                f"{more:,} more call{'s' if more != 1 else ''} answered after another process took "
                f"{'them' if more != 1 else 'it'} over; their records are kept",
                level="warning",
            )

    def _log(self, message: str, *, level: str = "info") -> None:
        scope = self._scope
        self._writes.log(LogLine(scope.run_id, scope.attempt, time.time(), level, message))
        self._bus.emit("log", scope.run_id, level=level, message=message, kind="log", attempt=scope.attempt)

    async def stored(self, key: str) -> Receipt | None:
        """The receipt as the store has it now."""
        return await self._io.call(self._io.store.receipts.get_receipt, key)

    def _settle_failure(self, call: DurableCall, settlement: Settlement, held_s: float) -> None:
        if (settlement.ended or settlement.status) == "failed":
            self._tally.count(call, "failed", 0.0, not_found=said_not_found(settlement.error))
        # If this write fails the lease simply expires: the call's own error is what matters.
        self._writes.settle(settlement, held_s=held_s)

    # --- leases ---------------------------------------------------------------------------

    def note_retry(self, call: DurableCall, reason: str) -> None:
        self._tally.note_retry(call, reason)

    async def pause(self, seconds: float) -> None:
        """A call's wait before its next attempt, cut short when the run stops dispatching."""
        await self._breaker.pause(seconds)

    @property
    def store_up(self) -> bool:
        """Can the store record what a call answers (its connection is not lost)?"""
        return self._breaker.store_up

    async def until_store_up(self) -> None:
        await self._breaker.until_store_up()

    def store_outage(self, down: bool) -> None:
        """The store's connection was lost (True: no call goes out) or is back (False)."""
        self._breaker.store_outage(down)

    def ensure_owned(self, call: DurableCall, lease_id: str) -> None:
        """At the moment of dispatch and before every retry: is the run still dispatching,
        and the lease still ours? The lease counts as ours until the expiry the store last
        confirmed: a process paused past it (SIGSTOP, a laptop lid) sends nothing."""
        self.check_open()
        cell = current_cell()
        if cell is not None and (reason := cell.halted_call()) is not None:
            raise MapStopped(f"Map {cell.map!r} stopped ({reason}); {call.label!r} was not sent.")
        if not self._leases.owned(lease_id):
            raise LeaseLost(f"The lease on {call.kind} {call.label!r} was lost before the call was made.")

    async def heartbeat(self) -> None:
        """Extend every lease of a call in flight; remember the ones another owner took."""
        await self._leases.heartbeat()

    # --- lifecycle ------------------------------------------------------------------------

    def check_open(self) -> None:
        try:
            self._breaker.check()
        except BaseException:
            self.refusal_raised()  # a call of a map row's cell that was not sent: the row is not recorded
            raise

    def refusal_raised(self) -> None:
        """A refusal is about to be raised into the play's code (this run's, and the map row
        it runs for, if any): what the play returns after catching it is not kept."""
        self.refused = True
        hold_back_cell()

    @property
    def in_flight(self) -> int:
        """This book's calls being invoked now: an interrupt that cancels the run cuts them short."""
        return self._leases.invoking

    def close(self, reason: BaseException) -> None:
        """Stop dispatching: every later claim raises `reason`."""
        self._breaker.stop(reason)

    def refuse_calls(self, reason: BaseException) -> None:
        """From a signal handler (it only sets a flag): no call starts from now, each raising
        `reason`, until `close` stops dispatching on the event loop."""
        self._breaker.refuse(reason)

    @property
    def tripped(self) -> BaseException | None:
        return self._breaker.tripped

    async def settle_all(self, timeout: float) -> bool:
        """Wait (up to `timeout`) for calls being invoked to finish, then flush writes."""
        idle = await self._leases.idle(timeout)
        await self._writes.flushed()
        if self._late > self._late_said:
            self._say_late()
            await self._writes.flushed()
        return idle


def failure_settlement(
    call: DurableCall,
    claimed: ClaimOutcome,
    exc: BaseException,
    record: CallRecord,
    secrets: Secrets,
    *,
    queued: bool = False,
    unanswered: bool = False,
) -> Settlement:
    """A call that raised: `failed` (kept, with its error) when the failure is the call's
    own; otherwise (interrupt, lost lease, budget…) given back so a resume runs it again
    (`given_back`). `unanswered`: a try of it may have been processed with no answer seen
    (kept with the error: it is asked again only under its key, see records.sent_again)."""
    lease_id = claimed.receipt.lease_id or ""
    if not _is_call_failure(call, exc):
        settlement = given_back(call.key, claimed, sent=not queued)
        if isinstance(exc, DeeplineError) and exc.counts_failed:  # a failed child play: counted, run again
            settlement.call, settlement.ended = record, "failed"
        return settlement
    error = tool_error(exc, call.tool)
    recorded = error.to_dict()
    recorded["message"] = secrets.redact(recorded["message"])  # never a secret in clear
    if unanswered:
        recorded[UNANSWERED] = True
    if claimed.prior_key_in_use:  # asked again once under the key a 409 refused: not again
        recorded[RESENT_AFTER_409] = True
    return Settlement(
        call.key,
        lease_id,
        "failed",
        error=recorded,
        failure_kind=error.category,
        retryable=error.retryable,
        call=record,
        replaces=claimed.replaces,
    )


async def wait_busy(call: DurableCall, receipt: Receipt, waited: float, now: float) -> float:
    """Another live owner runs the call: wait a little (no longer than its lease), or give
    up with a `conflict` once the call's `receipt_wait_s` has passed."""
    if call.receipt_wait_s is not None and waited >= call.receipt_wait_s:
        raise ToolExecutionError(
            f"{call.label}: the same call is running under run {receipt.run_id} and did not "
            f"finish within {call.receipt_wait_s:g}s.",
            origin="runtime",
            category="conflict",
            retryable=True,
            tool=call.tool,
        )
    expires = receipt.lease_expires_at or 0.0
    delay = max(0.01, min(BUSY_POLL_S, expires - now + 0.01))
    await asyncio.sleep(delay)
    return waited + delay


def written(value: Any) -> str | None:
    """A completed call's answer as its receipt keeps it, written now (None: a value that
    holds itself, which the store then refuses as it would have)."""
    try:
        return _json.dumps_str(value)
    except TypeError:
        return None


def kept_input(value: Any, secrets: Secrets) -> Any:
    """A call's input as its receipt keeps it, for a person to see (`receipts inspect`):
    secrets redacted, and only when small — the receipt is not a copy of a large payload."""
    if value is None:
        return None
    kept = secrets.redact_json(value)
    try:
        size = len(_json.dumps(kept))
    except TypeError:  # not JSON (a fetch body the request encodes itself): not kept
        return None
    return kept if size <= KEPT_INPUT_BYTES else None


def call_record(scope: Identity, call: DurableCall, started: float, info: ToolCall) -> CallRecord:
    """The calls ledger's line for one call made (a live answer or a failure)."""
    cell = current_cell()
    return CallRecord(
        scope.run_id,
        scope.attempt,
        call.kind,
        call.tool,
        started,
        info.retries,
        map=cell.map if cell is not None else None,
        row_key=cell.row_key if cell is not None else None,
        waited_s=info.waited_s,
    )


def _aged(answered_at: float | None) -> None:
    """The cell the call is made for is as old as the oldest answer it reuses (its staleness)."""
    cell = current_cell()
    if cell is not None and answered_at is not None:
        cell.oldest = answered_at if cell.oldest is None else min(cell.oldest, answered_at)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _is_call_failure(call: DurableCall, exc: BaseException) -> bool:
    """Is `exc` the call's own failure (recorded on its receipt), or something else —
    an interrupt, a lost lease, a budget or configuration error — that records nothing
    so a resume runs the call again? Steps never record failures."""
    if call.kind == "step" or not isinstance(exc, Exception):
        return False
    return isinstance(exc, ToolExecutionError) or not isinstance(exc, DeeplineError)


def tool_error(exc: BaseException, tool: str | None) -> ToolExecutionError:
    """The ToolExecutionError a failed call is recorded and raised as."""
    if isinstance(exc, ToolExecutionError):
        if exc.tool is None:
            exc.tool = tool
        return exc
    if isinstance(exc, TimeoutError):
        return ProviderTransientError(f"{tool}: timed out", category="network", tool=tool)
    return ToolExecutionError(
        f"{tool}: {type(exc).__name__}: {exc}",
        origin="provider",
        category="internal",
        retryable=False,
        tool=tool,
    )


def stored_failure(receipt: Receipt) -> ToolExecutionError:
    """Rebuild the error of a receipt that failed for good on an earlier run (`replayed`:
    given back with no call made)."""
    error = receipt.error or {}
    message = str(error.get("message") or f"{receipt.label} failed")
    category: Category = error.get("category") or receipt.failure_kind or "internal"  # type: ignore[assignment]
    failure: ToolExecutionError
    if category in TRANSIENT_CATEGORIES:
        failure = ProviderTransientError(
            message, category=category, tool=receipt.tool, status_code=error.get("status_code")
        )
    else:
        failure = ToolExecutionError(
            message,
            origin=error.get("origin", "provider"),
            category=category,
            retryable=bool(error.get("retryable")),
            status_code=error.get("status_code"),
            tool=receipt.tool,
        )
    failure.replayed = True
    failure.unanswered = error.get(UNANSWERED) is True
    return failure


__all__ = ["DurableCall", "Identity", "Outcome", "ReceiptBook", "idempotency_key", "receipt_key"]
