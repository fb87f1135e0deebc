"""The store's records and the narrow interface the runtime talks to.

Only `deepline_cli.runtime` (and the read-only CLI commands) call a store. Both
backends implement `Store`; the receipt state machine itself (`decide_claim`) is a pure
function shared by them, so SQLite and PostgreSQL cannot disagree about it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

RUN_STATUSES: tuple[str, ...] = (
    "queued",
    "running",
    "waiting",
    "completed",
    "failed",
    "interrupted",
)
# What a log line is about (logs.kind): `log` is a play's own line (`ctx.log`, `rc.log`) and
# the runtime's notes; the others are the runtime's, with fields a filter can use.
LOG_KINDS: tuple[str, ...] = (
    "log",
    "row.failed",  # map, row_key, error: a map's first failed rows
    "row.failed.omitted",  # map, omitted: the failed rows the map's log left out
    "map.completed",  # map, total, succeeded, failed, duplicate
    "run.interrupted",  # reason: Ctrl-C, SIGTERM, a draining worker, `deepline runs stop`
    "store.reconnected",  # the store dropped its connection and the run reconnected
)
# released: given back after the provider may have been called (a crash, an interrupt, a
# lost lease); the next claim repeats the call under the same idempotency key.
RECEIPT_STATUSES: tuple[str, ...] = ("running", "completed", "failed", "skipped", "released")
FOUND_PREFIX = 16
NOT_FOUND = "none"  # a waterfall's rows that no step found a value for (its hits per step)


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
    batch_key: str | None = None  # a batch member: the aggregate receipt it was sent in
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
    # A batch aggregate: the member receipts (key, lease id) it is sent for, and what is sent.
    members: list[tuple[str, str]] | None = None
    request: Any = None
    description: str | None = None
    input: Any = None  # kept on the receipt for `receipts inspect` (redacted, small)
    map: str | None = None  # the map row the call is made for (None: outside maps)
    row_key: str | None = None


# superseded: the claiming attempt's run was taken over by a later attempt (fencing).
ClaimVerdict = Literal["claimed", "reused", "failed", "busy", "superseded"]


@dataclass(slots=True)
class ClaimOutcome:
    verdict: ClaimVerdict
    receipt: Receipt
    # The receipt as it was before this claim took it (None: a new receipt).
    prior_status: str | None = None
    prior_run_id: str | None = None
    # The earlier answer this claim may replace (a refresh, or a takeover of one): kept in
    # the receipt's history once the new answer is settled.
    replaces: Receipt | None = None

    @property
    def resumed(self) -> bool:
        """A takeover of a call that may have been sent already (same idempotency key)."""
        return self.verdict == "claimed" and self.prior_status in ("running", "released")


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
    replaces: Receipt | None = None  # the earlier answer a new one ends (see ClaimOutcome)
    reported: bool = False  # the provider said what the call cost (remote tools): learned in tool_costs


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


@dataclass(slots=True)
class SheetRow:
    """One row of a map's persisted sheet, shared by every run of the play.

    `cells` maps a column to `[value, error, completed_at, fingerprint]`.
    """

    sheet: str
    row_key: str
    input: Any
    input_digest: str
    cells: dict[str, list[Any]]
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


@dataclass(slots=True)
class DatasetRow:
    idx: int
    row_key: str
    outcome: str
    error: str | None
    input: Any
    cells: dict[str, list[Any]]


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


def decide_claim(existing: Receipt | None, claim: Claim, now: float) -> ClaimVerdict:
    """The receipt state machine: may `claim` own the receipt, or what else happens.

    - no receipt, a skipped or released one, or a transient (or explicitly refreshed)
      failure: claim
    - completed: reuse, unless older than `stale_after_s`, or forced (or older than
      `refresh_after_s`) by a run that did not complete it itself
    - failed for good (not transient, no --refresh-failed, not refreshed): report the
      stored failure
    - running: take over when its lease expired or it belongs to an earlier attempt of
      the same run (that attempt is dead: we hold the run's lease); else it is busy
    """
    if existing is None or existing.status in ("skipped", "released"):
        return "claimed"
    if existing.status == "running" and existing.lease_id == claim.lease_id:
        return "claimed"  # this very claim, applied before its connection dropped: it is ours
    # A forced or refreshed call is made once per run: a resume reuses what this run paid for.
    other_run = existing.run_id != claim.run_id
    refreshed = other_run and claim.refresh_after_s is not None and _is_stale(existing, claim.refresh_after_s, now)
    if existing.status == "completed":
        forced = claim.force and other_run
        if forced or refreshed or _is_stale(existing, claim.stale_after_s, now):
            return "claimed"
        return "reused"
    if existing.status == "failed":
        retry = claim.refresh_failed or existing.retryable or claim.force or refreshed
        return "claimed" if retry else "failed"
    expired = (existing.lease_expires_at or 0.0) <= now
    dead_attempt = existing.run_id == claim.run_id and existing.attempt < claim.attempt
    return "claimed" if (expired or dead_attempt) else "busy"


def claim_idempotency_key(existing: Receipt | None, claim: Claim) -> str:
    """The provider idempotency key a claim that won the receipt sends.

    - a takeover of a call that may have been sent (running, released), or the retry of
      a transient failure: the key it was sent with, so the provider bills it once;
    - a new paid call of a receipt that has an answer (forced or stale refresh), or of a
      failure the user asked to refresh: a fresh key, so the provider does not replay;
    - otherwise: the call's own key.
    """
    if existing is None or existing.status == "skipped":
        return claim.idempotency_key
    if existing.status in ("running", "released") or (existing.status == "failed" and existing.retryable):
        return existing.idempotency_key or claim.idempotency_key
    return claim.fresh_idempotency_key or claim.idempotency_key


def _is_stale(receipt: Receipt, stale_after_s: float | None, now: float) -> bool:
    if stale_after_s is None:
        return False
    if stale_after_s <= 0:
        return True
    return now - (receipt.completed_at or 0.0) > stale_after_s


@dataclass(slots=True)
class ReceiptQuery:
    key_prefix: str | None = None
    run_id: str | None = None
    status: str | None = None
    tool: str | None = None
    limit: int | None = None


class Store(Protocol):
    """What the runtime needs from a store. Every method is one transaction."""

    url: str

    def close(self) -> None: ...

    def reconnect(self) -> None:
        """After StoreConnectionLost: connect again (raises StoreConnectionLost if it can't)."""
        ...

    def now(self) -> float:
        """The store's clock (seconds since the epoch) used for every lease."""
        ...

    # runs
    def insert_run(self, run: RunRecord) -> bool:
        """Insert a new run; False (and nothing written) when its id exists already."""
        ...

    def get_run(self, run_id: str) -> RunRecord | None: ...
    def claim_queued_run(self, *, holder: str, expires_at: float) -> RunRecord | None:
        """Take the oldest queued run (attempt becomes 1), skipping runs others are taking."""
        ...

    def due_runs(self, limit: int, now: float, host: str = "") -> list[RunRecord]:
        """Runs a worker might continue (roots and scheduled children): waiting ones whose
        wake-up time has come, running ones whose lease expired, and running ones held on
        `host` (this machine can tell whether their holder still lives)."""
        ...

    def set_wake(self, run_id: str, wake_at: float | None) -> None:
        """When the waiting run may get further (None: only when an event or child wakes it)."""
        ...

    def put_snapshot(self, digest: str, snapshot: dict[str, Any]) -> None: ...
    def get_snapshot(self, digest: str) -> dict[str, Any] | None: ...

    def notify(self) -> None:
        """Wake idle workers (PostgreSQL NOTIFY; nothing to do where workers poll)."""
        ...

    def take_rate_slot(self, tool: str, interval_s: float, now: float, count: int = 1) -> float:
        """The start time of the next `count` calls of `tool` paced every `interval_s` (the
        first of them; the others follow one interval apart), shared by every process using
        this store."""
        ...

    def lease_run(
        self,
        run_id: str,
        *,
        holder: str,
        expires_at: float,
        attempt: int,
        expect_attempt: int,
        expect_expires: float | None = None,
    ) -> bool:
        """Take the run's lease for `attempt` if its attempt is still `expect_attempt` (and,
        given `expect_expires`, its lease was not extended since it was read)."""
        ...

    def heartbeat_run(self, run_id: str, *, holder: str, attempt: int, expires_at: float) -> bool:
        """Extend the run's lease if `holder` still holds `attempt` (and note the attempt seen)."""
        ...

    def begin_attempt(self, run_id: str, attempt: int, holder: str, now: float) -> None: ...
    def attempt_status(self, run_id: str, attempt: int) -> str | None:
        """How that attempt of the run ended (running while it goes on; None: no such attempt)."""
        ...

    def end_attempt(self, run_id: str, attempt: int, status: str, now: float) -> None: ...
    def run_stats(self, run_id: str) -> dict[str, Any]:
        """What the run (and its child runs) did over every attempt, from the calls ledger,
        the receipts it reused, its map rows and its attempts."""
        ...

    def run_usage(self, run_id: str) -> tuple[int, int]:
        """(tool calls made, child plays started) by the run and its child runs, every attempt."""
        ...

    def update_run(self, run_id: str, *, only_attempt: int | None = None, **fields: Any) -> bool:
        """Set `fields`; with `only_attempt`, only while the run is still at that attempt
        (fencing: a process whose run was taken over records nothing). True if it was set."""
        ...

    def list_runs(
        self, *, status: str | None = None, play: str | None = None, limit: int | None = None
    ) -> list[RunRecord]: ...

    # receipts and logs, written together in one transaction
    def apply(self, writes: Writes, now: float) -> Applied:
        """Settle (only where the lease is still current), claim, and append logs."""
        ...

    def heartbeat_receipts(self, leases: Sequence[tuple[str, str]], expires_at: float) -> set[str]:
        """Extend the given (key, lease id) leases; return the lease ids no longer held."""
        ...

    def expire_run_receipts(self, run_id: str) -> int:
        """Expire the leases of receipts a (dead) earlier attempt of the run still holds."""
        ...

    def get_receipt(self, key: str) -> Receipt | None: ...
    def receipt_history(self, key: str) -> list[ReceiptGeneration]:
        """The earlier answers of a receipt, oldest first."""
        ...

    def credits_spent(self, run_id: str) -> float:
        """Credits of the calls a run and its child runs completed (every attempt)."""
        ...

    def tool_costs(self) -> dict[str, float]:
        """For tools whose answers say what they cost: the most one answer has cost."""
        ...

    def query_receipts(self, query: ReceiptQuery) -> list[Receipt]: ...

    # sheets and maps
    def load_sheet_rows(self, sheet: str, row_keys: Sequence[str]) -> dict[str, SheetRow]: ...
    def finished_map_rows(self, run_id: str, map: str) -> list[int]:
        """The distinct-row indexes this run's map already finished (earlier attempts)."""
        ...

    def succeeded_map_rows(self, run_id: str, map: str) -> list[int]:
        """The distinct-row indexes an earlier attempt finished successfully (seeded on resume)."""
        ...

    def count_map_rows(self, run_id: str, map: str) -> dict[str, int]:
        """Visible finished rows of this run's map by outcome (the visibility barrier)."""
        ...

    def failed_map_rows(self, run_id: str, map: str, limit: int, *, after_idx: int = -1) -> list[MapRow]:
        """The map's failed rows in input order, at most `limit`, after the distinct row
        `after_idx` (paging through every one: `runs logs --kind row.failed`)."""
        ...

    def map_steps(self, run_id: str, *, succeeded_only: bool = False) -> dict[str, dict[str, dict[str, int]]]:
        """Waterfall hits of a run's maps: map → column → step (or "none") → rows."""
        ...

    def map_reuse(self, run_id: str, map: str, succeeded_only: bool = False) -> tuple[int, int]:
        """A map of a run: rows taken whole from sheet rows earlier runs wrote, and cells
        taken from the sheet (of its succeeded rows only, with `succeeded_only`)."""
        ...

    def final_failures(self, run_id: str) -> list[FailedCall]:
        """Every call of the run (and its child runs) whose final outcome is a failure,
        each once (see store/ledger.py)."""
        ...

    def map_rows_page(
        self, run_id: str, map: str, sheet: str, after_idx: int, limit: int, *, failed_only: bool = False
    ) -> list[DatasetRow]: ...
    def save_map(self, record: MapRecord) -> None: ...
    def get_maps(self, run_id: str) -> list[MapRecord]: ...

    # suspension: boundaries, events, the journal of durable ids
    def get_boundary(self, run_id: str, id: str) -> Boundary | None: ...
    def put_boundary(self, boundary: Boundary) -> Boundary:
        """Insert the boundary unless it exists; return the stored one (due times are kept)."""
        ...

    def resolve_boundary(self, run_id: str, id: str, payload: Any, now: float) -> None: ...
    def boundaries(self, run_id: str) -> list[Boundary]: ...
    def send_event(self, run_id: str, event_id: str, payload: Any, now: float) -> bool:
        """Deliver an event; False when one was already delivered (the first is kept)."""
        ...

    def get_event(self, run_id: str, event_id: str) -> tuple[bool, Any]: ...
    def journal(self, run_id: str) -> list[str]: ...
    def logged(self, run_id: str) -> set[str]:
        """The keys of the play body's log lines the run wrote (ctx.log, once per run)."""
        ...

    def append_journal(self, run_id: str, position: int, id: str) -> None: ...
    def child_runs(self, run_id: str) -> list[RunRecord]: ...

    def get_logs(self, run_id: str) -> list[LogLine]: ...
    def logs_after(self, run_id: str, after_id: int, limit: int, *, kinds: Sequence[str] = ()) -> list[LogLine]:
        """The run's log lines with an id above `after_id`, oldest first, at most `limit` (only
        those of `kinds`, when given): `runs tail` follows a run with it, `runs logs` pages."""
        ...

    # stopping a run from anywhere (`deepline runs stop`)
    def run_status(self, run_id: str) -> str | None:
        """The run's status alone (a cheap read for whoever polls it)."""
        ...

    def ask_stop(self, run_id: str, reason: str, *, attempt: int) -> bool:
        """Ask the process running the run to stop: recorded only while the run is still
        running `attempt` (a stop meant for one attempt never lands on the next)."""
        ...

    def stop_requested(self, run_id: str, attempt: int) -> str | None:
        """Why this attempt of the run was asked to stop (None: it was not): its owner polls it."""
        ...

    def interrupt_run(
        self,
        run_id: str,
        reason: str,
        *,
        attempt: int,
        status: str,
        error: dict[str, Any],
        now: float,
        expect_expires: float | None = None,
    ) -> bool:
        """End `interrupted` a run no live process owns (queued, waiting, or running under a
        holder that died), if it is still at `attempt` in `status` (and, given
        `expect_expires`, its lease was not extended since it was read)."""
        ...


def claim(store: Store, claims: Sequence[Claim], now: float) -> list[ClaimOutcome]:
    return store.apply(Writes(claims=list(claims)), now).outcomes


def settle(store: Store, settlements: Sequence[Settlement], now: float) -> list[bool]:
    return store.apply(Writes(settlements=list(settlements)), now).settled
