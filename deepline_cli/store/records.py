"""The store's records: what runs, receipts, sheets, maps and logs hold, as the runtime and
the store exchange them. Plain data: no behaviour beyond a property or two."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from deepline_cli.store.run_states import RUN_STATUSES

# What a log line is about (logs.kind): `log` is a play's own line (`ctx.log`, `rc.log`) and
# the runtime's notes; the others are the runtime's, with fields a filter can use.
LOG_KINDS: tuple[str, ...] = (
    "log",
    "row.failed",  # map, row_key, error: a map's first failed rows
    "row.failed.omitted",  # map, omitted: the failed rows the map's log left out
    "map.completed",  # map, total, succeeded, failed, duplicate
    "run.interrupted",  # reason: Ctrl-C, SIGTERM, a draining worker, `deepline runs stop`
    "store.lost",  # the store's connection was found lost: no call goes out until it is back
    "store.reconnected",  # the store dropped its connection and the run reconnected
)
# released: given back after the provider may have been called (a crash, an interrupt, a
# lost lease); the next claim repeats the call under the same idempotency key.
RECEIPT_STATUSES: tuple[str, ...] = ("running", "completed", "failed", "skipped", "released")
FOUND_PREFIX = 16
NOT_FOUND = "none"  # a waterfall's rows that no step found a value for (its hits per step)
# A child run's option naming the map row it was made for ({"map": …, "row": …}): its calls count for that row.
MADE_FOR = "made_for"
# A run option: its map cells' `rc.step`s and `rc.fetch`es are keyed by the cell (a run begun
# before, without it, made them under the row's key: a resume looks there too).
CELL_KEYS = "cell_keys"
REFRESH_GIVEN_FOR = "refresh_given_for"  # a run option: the attempt a refresh flag was given to (queued again)
CODE = "code"  # a run option: the play's code when it started, its files and their digest (snapshot.code_record)


@dataclass(slots=True)
class RunRecord:
    run_id: str
    play: str
    play_ref: str
    input: Any
    status: str = "running"
    attempt: int = 1
    workspace: str = "default"
    cwd: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    parent_run_id: str | None = None
    root_run_id: str | None = None
    holder: str | None = None
    lease_expires_at: float = 0.0
    output: Any = None
    error: dict[str, Any] | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0
    finished_at: float | None = None
    # When a waiting run may get further (a timer due, an event or a child's result in):
    # what workers look up, by index, instead of scanning every waiting run.
    wake_at: float | None = None
    scheduled: bool = False  # a child play run as a queued run of its own (under workers)
    ancestors: list[str] = field(default_factory=list)  # play names from the root down to the parent
    description: str = ""
    snapshot: str | None = None  # the digest of the play's source in `snapshots` (enqueued runs)
    failure_seen_by: int | None = None  # a scheduled child's failure: the parent attempt that saw it
    # `deepline runs stop`: why the run was asked to stop (cleared when an attempt takes the lease)
    stop_reason: str | None = None


@dataclass(slots=True)
class Receipt:
    key: str
    kind: str
    label: str
    tool: str | None
    status: str
    run_id: str
    attempt: int
    lease_id: str | None = None
    lease_expires_at: float | None = None
    idempotency_key: str | None = None
    output: Any = None
    error: dict[str, Any] | None = None
    failure_kind: str | None = None
    retryable: bool = False
    credits: float = 0.0
    created_at: float = 0.0
    completed_at: float | None = None
    # A batch member: the aggregate receipt it was sent in ("" until its batch is formed);
    # None: a call claimed alone (see sql_rows.claimed_receipt).
    batch_key: str | None = None
    request: Any = None  # a batch aggregate: [[member key, input], ...] in the order sent
    generation: int = 1  # how many answers it has had: a refresh makes a new one
    description: str | None = None  # what the call is for, in the play's words
    input: Any = None  # the call's input, secrets redacted (None: not kept, see runtime/receipts.py)


@dataclass(slots=True)
class ReceiptGeneration:
    """An earlier answer of a receipt that was paid for again (its history)."""

    key: str
    generation: int
    run_id: str | None
    attempt: int | None
    idempotency_key: str | None
    output: Any
    credits: float
    completed_at: float | None
    replaced_at: float | None


@dataclass(slots=True)
class Claim:
    """A request to own a receipt for one execution.

    `idempotency_key` is the call's own key; `fresh_idempotency_key` (derived from the
    lease) is used instead when the claim makes a new paid call of a receipt that has
    an answer already (a forced or stale refresh), so a provider honouring keys does not
    replay its old answer.
    """

    key: str
    kind: str
    label: str
    tool: str | None
    run_id: str
    attempt: int
    lease_id: str
    lease_expires_at: float
    idempotency_key: str
    fresh_idempotency_key: str = ""
    force: bool = False
    stale_after_s: float | None = None
    # A stale map cell's call: an answer older than this, made by another run, is paid for
    # again (a refresh exists to get new data); a younger one, or this run's own, is reused.
    refresh_after_s: float | None = None
    refresh_failed: bool = False
    # This run's own failures the refresh (--refresh-failed, --force-refresh) asks again: those
    # of attempts before this one (None: the flag was given to this attempt), before attempt N
    # (given to attempt N, which stopped before it got to them all), or none (0: the flag only
    # kept from the run's start).
    refresh_own_before: int | None = None
    # A batch aggregate: the member receipts (key, lease id) it is sent for, and what is sent.
    members: list[tuple[str, str]] | None = None
    request: Any = None
    description: str | None = None
    input: Any = None  # kept on the receipt for `receipts inspect` (redacted, small)
    # A member of a batching tool: sent only inside a batch. Its receipt's batch_key says so
    # ("" until its batch is formed), so a resume tells it from a call that went out alone.
    batched: bool = False
    map: str | None = None  # the map row the call is made for (None: outside maps)
    row_key: str | None = None


# superseded: the claiming attempt's run was taken over by a later attempt (fencing).
ClaimVerdict = Literal["claimed", "reused", "failed", "busy", "superseded"]


@dataclass(slots=True)
class ClaimOutcome:
    verdict: ClaimVerdict
    receipt: Receipt
    # The receipt as it was before this claim took it (None: a new receipt).
    prior: Receipt | None = None
    # The earlier answer this claim may replace (a refresh, or a takeover of one): kept in
    # the receipt's history once the new answer is settled.
    replaces: Receipt | None = None
    # A receipt of another run this run had not used before (reused once, however often asked).
    first_use: bool = False

    @property
    def prior_status(self) -> str | None:
        return self.prior.status if self.prior is not None else None

    @property
    def prior_run_id(self) -> str | None:
        return self.prior.run_id if self.prior is not None else None

    @property
    def resumed(self) -> bool:
        """A call that may have been sent already, sent again (same idempotency key): taken
        over, or a failure that may have been processed asked again (sent_again)."""
        return self.verdict == "claimed" and sent_again(self.prior) and self._under_prior_key

    @property
    def maybe_processed(self) -> bool:
        """Sent again when an earlier send may have been processed with no answer seen: taken
        over from an owner that may have sent it, or a failure marked unanswered (not a 429,
        which the provider refused before doing anything)."""
        prior = self.prior
        if self.verdict != "claimed" or prior is None or not self._under_prior_key:
            return False
        return prior.status in ("running", "released") or (prior.status == "failed" and was_unanswered(prior))

    @property
    def _under_prior_key(self) -> bool:
        """Goes out under the idempotency key its prior receipt went out with (not a forced
        new call)."""
        return self.prior is not None and self.receipt.idempotency_key == self.prior.idempotency_key

    @property
    def prior_key_in_use(self) -> bool:
        """Claimed from a failure the provider refused as its key in use (key_in_use)."""
        return self.prior is not None and self.prior.status == "failed" and key_in_use(self.prior)


@dataclass(slots=True)
class Settlement:
    """The end of a claimed execution: completed, failed, or released unfinished."""

    key: str
    lease_id: str
    # released: given back, the call may have reached the provider; skipped: given back
    # before the provider was called.
    status: Literal["completed", "failed", "released", "skipped"]
    output: Any = None
    error: dict[str, Any] | None = None
    failure_kind: str | None = None
    retryable: bool = False
    credits: float = 0.0
    call: CallRecord | None = None  # an execution that ended (completed or failed): the ledger row
    ended: str | None = None  # the ledger's status when not `status`: "failed" for a failed call given back
    replaces: Receipt | None = None  # the earlier answer a new one ends (see ClaimOutcome)
    reported: bool = False  # the provider said what the call cost (remote tools): learned in tool_costs
    # `output` as JSON text, written as it was answered: what the play does with the answer
    # after (it is written to the store later, with its batch) never changes the receipt.
    output_json: str | None = None


@dataclass(slots=True)
class CallRecord:
    """One execution a run made: written to the calls ledger with its settlement."""

    run_id: str
    attempt: int
    kind: str
    tool: str | None
    started_at: float
    retries: int = 0
    map: str | None = None  # the map row the call was made for (see runtime/ledger.py)
    row_key: str | None = None
    waited_s: float = 0.0  # waiting, not the provider's time: slots, rate limit, 429 pauses, backoff


@dataclass(frozen=True, slots=True)
class FailedCall:
    """A call whose final outcome in a run is a failure: its last execution failed (an
    earlier failure an attempt retried is not one), or it reused another run's failure.

    `row` is how the map row it was made for ended: "succeeded" (the row got past it: a
    waterfall fell back), "failed", None while the row is not recorded (in flight when an
    attempt stopped), "" outside maps."""

    key: str
    tool: str  # the tool, or ctx.<kind> for a fetch or child play
    row: str | None
    retryable: bool
    # Whether its cell got past it (a waterfall's next step, and a value), where its row says
    # (MapRow.fell_back); None where it does not: a succeeded row's calls all were.
    fell_back: bool | None = None
    # Given back from an earlier run's failed receipt: the run made no request for it.
    kept: bool = False
    # The provider said it knows nothing of it (404, `said_not_found`).
    not_found: bool = False

    @property
    def recovered(self) -> bool:
        """Fallen back from: its cell got past it (its row, where the row does not say)."""
        return self.fell_back if self.fell_back is not None else self.row == "succeeded"

    @property
    def found_nothing(self) -> bool:
        """A "not found" answer (404) its row got past (a waterfall's next step, a row that
        succeeded all the same): an answer that found nothing, counted apart, not a failure.
        One its row failed in (a wrong URL 404s every call) is a failed call."""
        return self.not_found and (self.recovered or self.row == "succeeded")


def said_not_found(error: Mapping[str, Any] | None) -> bool:
    """Is this failure the provider saying it knows nothing of what was asked (a 404)?"""
    return bool(error) and error.get("status_code") == 404  # type: ignore[union-attr]


@dataclass(slots=True)
class LogLine:
    run_id: str
    attempt: int
    ts: float
    level: str
    message: str
    key: str | None = None  # a play body's line: where in the body (written once per run)
    # What kind of line (`log` for a play's own, `row.failed`, `map.completed`, …) and its
    # structured fields (JSON values): `deepline runs logs --kind --where`.
    kind: str = "log"
    fields: dict[str, Any] | None = None
    # Given by the store when written (not part of what the line says): lines are read back in
    # this order, and followed by it.
    id: int = field(default=0, compare=False)


class Cell(NamedTuple):
    """One cell of a sheet row: what its column gave for the row (or the error it raised),
    when, and the column's fingerprint then. Stored as the JSON list
    `[value, error, completed_at, fingerprint]`, with `meta` after it when there is any
    (the step of a waterfall that found the value; `{"run_if": false}`)."""

    value: Any
    error: str | None
    completed_at: float | None
    fingerprint: str | None
    meta: dict[str, Any] | None = None

    @property
    def step(self) -> str | None:
        """The waterfall step that found the value (None: none did, or not a waterfall)."""
        return self.meta.get("step") if self.meta else None

    @property
    def transient(self) -> bool:
        """Its error may pass (a provider down, rate-limited, unreachable): a resume asks again."""
        return bool(self.meta) and self.meta.get("transient") is True  # type: ignore[union-attr]

    @property
    def not_run(self) -> bool:
        """Its `run_if` said no: it holds None, and nothing was asked for it."""
        return bool(self.meta) and self.meta.get("run_if") is False  # type: ignore[union-attr]

    @property
    def from_input(self) -> bool:
        """Its error is the row's input's (a blank required cell, a line that did not fit the
        header): kept only while the input has it still. Cells kept before they said so are
        told by their message."""
        if self.meta:
            return self.meta.get("input") is True
        return self.error is not None and _INPUT_FAULT.match(self.error) is not None

    def stored(self) -> list[Any]:
        head = [self.value, self.error, self.completed_at, self.fingerprint]
        return [*head, self.meta] if self.meta else head


_new_tuple = tuple.__new__
# The failures a row's input gave it (runtime/map/rows.py, CsvSource.blank), as kept before
# their cells said so.
_INPUT_FAULT = re.compile(r"InputError: (required column .* is blank \(|.* line \d+: \d+ fields where the header has )")


def cells_of(stored: Any) -> dict[str, Cell]:
    """A sheet row's cells from their stored JSON form (`meta` padded in when absent; made
    with tuple.__new__, as NamedTuple._make does, without its per-call length check: a
    re-run reads every cell of every row)."""
    cells = {}
    for name, cell in (stored or {}).items():
        if len(cell) == 4:
            cell.append(None)  # a list just parsed, ours to change
        cells[name] = _new_tuple(Cell, cell)
    return cells


def stored_cells(cells: Mapping[str, Cell]) -> dict[str, list[Any]]:
    return {name: cell.stored() for name, cell in cells.items()}


@dataclass(slots=True)
class SheetRow:
    """One row of a map's persisted sheet, shared by every run of the play."""

    sheet: str
    row_key: str
    input: Any  # None when loaded `with_input=False`
    input_digest: str
    cells: dict[str, Cell]
    status: str  # succeeded | failed
    run_id: str
    updated_at: float
    rev: int = 1  # the revision: each write of the row makes a new one
    replaces: bool = False  # another run's revision is being recomputed: keep it in the history
    attempt: int = 0  # the run attempt writing it (fencing: a superseded one writes nothing)


@dataclass(slots=True)
class MapRow:
    """A distinct row a run's map finished: its place in input order and its outcome."""

    run_id: str
    map: str
    idx: int  # position among the map's distinct rows
    input_index: int  # position in the input, duplicates included
    row_key: str
    outcome: str  # succeeded | failed
    error: str | None = None
    sheet: str = ""
    rev: int | None = None  # the sheet row revision it finished with (None: the one written with it)
    attempt: int = 0  # the run attempt writing it (fencing: a superseded one writes nothing)
    steps: dict[str, str | None] | None = None  # waterfall columns: the step that found each value
    reused_row: bool = False  # taken whole from a sheet row an earlier run wrote
    kept: bool = False  # taken whole from the row an earlier attempt of the run wrote: still its work
    reused_cells: int = 0  # cells taken from the sheet as they were
    # The answers the play found a value with: their receipt keys' first FOUND_PREFIX
    # characters (unique enough within a run, and small beside a million rows).
    found: list[str] | None = None
    # The failed calls its cells got past (a waterfall's next step): key prefixes. Said by a
    # failed row, and by a succeeded one where the play handled a failure itself (final);
    # None from a succeeded row: its cells got past all its failed calls.
    fell_back: list[str] | None = None
    # Where an earlier attempt wrote this row's key (a resume over rows in another order):
    # that row goes as this one is written, so the map never holds a key twice.
    moved_from: int | None = None


class EarlierRow(NamedTuple):
    """A row an earlier attempt of the run finished, as a resume reads it: by its key (the
    input may come back in another order), whether it succeeded (then it is seeded), what
    it reused and its steps' hits."""

    idx: int
    row_key: str
    succeeded: bool
    reused_row: bool
    reused_cells: int
    steps: dict[str, str | None] | None
    found: list[str] | None = None  # the answers it found a value with (MapRow.found)
    fell_back: list[str] | None = None  # failed calls its cells got past (MapRow.fell_back)


@dataclass(slots=True)
class MapRecord:
    run_id: str
    map: str
    sheet: str
    input_columns: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    status: str = "running"
    total: int = 0
    succeeded: int = 0
    failed: int = 0
    duplicate: int = 0
    reused: int = 0
    started_at: float = 0.0
    finished_at: float | None = None
    pilot: dict[str, Any] | None = None  # cut short by a limit: the rest of its input (runtime/pilot.py)
    attempt: int = 0  # the run attempt saving it (fencing: a superseded one saves nothing)
    steps: dict[str, list[str]] = field(default_factory=dict)  # waterfall columns and their steps, in order
    description: str = ""  # what the rows are (ctx.csv(description=...)), for the views
    source: str | None = None  # the file the rows came from (a CSV): `export` never writes over it


@dataclass(slots=True)
class DatasetRow:
    idx: int
    row_key: str
    outcome: str
    error: str | None
    input: Any
    cells: dict[str, Cell]


@dataclass(slots=True)
class Boundary:
    """Where a run waits: a timer, an event, or child plays (suspension)."""

    run_id: str
    id: str
    kind: str  # sleep | event | child
    status: str = "waiting"  # waiting | resolved
    due_at: float | None = None
    event_id: str | None = None
    child_run_id: str | None = None
    payload: Any = None
    created_at: float = 0.0
    resolved_at: float | None = None


@dataclass(slots=True)
class Writes:
    """One transaction's worth of hot writes (group commit).

    Applied in this order: settlements, claims, sheet rows, map rows, log lines — so a
    claim sees a receipt completed in the same batch.
    """

    settlements: list[Settlement] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    logs: list[LogLine] = field(default_factory=list)
    sheet_rows: list[SheetRow] = field(default_factory=list)
    map_rows: list[MapRow] = field(default_factory=list)


@dataclass(slots=True)
class Applied:
    settled: list[bool]
    outcomes: list[ClaimOutcome]


@dataclass(slots=True)
class ReceiptQuery:
    key_prefix: str | None = None
    run_id: str | None = None
    status: str | None = None
    tool: str | None = None
    limit: int | None = None


# A failed receipt's error says a try of it went unanswered (a timeout, a dropped connection).
UNANSWERED = "unanswered"
# ... or that it was sent again under its key once after a provider's 409 (see key_in_use).
RESENT_AFTER_409 = "resent_after_409"


def was_unanswered(receipt: Receipt) -> bool:
    """Does the receipt's error say a try of it went unanswered (it may have been processed)?"""
    return isinstance(receipt.error, dict) and receipt.error.get(UNANSWERED) is True


def key_in_use(receipt: Receipt) -> bool:
    """Did the provider refuse the call's idempotency key as in use (its 409), not yet asked
    again under that key? It has seen the key: an earlier try may have been processed (a
    failure recorded before the mark of an unanswered try existed: a 502, then a 409). Asked
    again once under it; a 409 that is a conflict of the provider's own (a record that exists
    already) then gets a fresh key, as any failure does."""
    error = receipt.error
    if not isinstance(error, dict) or error.get(RESENT_AFTER_409):
        return False
    return error.get("status_code") == 409 and error.get("origin", "provider") == "provider"


def failure_maybe_processed(receipt: Receipt) -> bool:
    """Does a failed receipt's error say its call may have been processed (unanswered, a 409)?"""
    return was_unanswered(receipt) or key_in_use(receipt)


def sent_again(existing: Receipt | None, claim: Claim | None = None) -> bool:
    """Is a claim of this receipt the same call sent again, under the key it may have gone
    out with: a takeover of a call that may have been sent (running, released), or the retry
    of a failure that may have been processed (a transient one, or one a try of which went
    unanswered: `--refresh-failed` of it must not pay for it again)? Not a forced claim of
    another run's failure: a new paid call, asked for (a provider that keeps its answer under
    the key, a 502 as well, gives that back to every call under it). A run's own failures
    keep their key, forced or not (a force kept from an earlier attempt is not asked again);
    a batch sent again is that batch, under its key (a forced member gets a fresh key, and
    so its batch a new one)."""
    if existing is None:
        return False
    if existing.status == "failed":
        if claim is not None and claim.force and claim.kind != "batch" and existing.run_id != claim.run_id:
            return False
        return existing.retryable or failure_maybe_processed(existing)
    return existing.status in ("running", "released")


__all__ = ["RUN_STATUSES"]  # the run statuses are drawn in run_states.py
