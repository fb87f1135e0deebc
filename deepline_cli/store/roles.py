"""What the runtime needs from a store, by role: each consumer sees only the roles it uses.

`Store` (what `open_store` returns) is a connection and six roles, each a protocol of at
most 15 methods: `runs` (records, attempts, leases, stop requests), `queue` (queued runs
and play snapshots for workers), `receipts` (claims and settlements), `sheets` (sheet and
map rows), `suspension` (boundaries, events, the journal) and `ledger` (what was paid,
reused and logged, for the views). A consumer calls `store.runs.get_run(...)`: the role
is in the call, and mypy checks it is the only role's method used. Every method is one
transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Protocol, TypeVar

from deepline_cli.store.ledger import AttemptRow, CallRow, ReuseRow
from deepline_cli.store.records import (
    Applied,
    Boundary,
    DatasetRow,
    EarlierRow,
    FailedCall,
    LogLine,
    MapRecord,
    MapRow,
    Receipt,
    ReceiptGeneration,
    ReceiptQuery,
    RunRecord,
    SheetRow,
    Writes,
)

R = TypeVar("R")


class Connection(Protocol):
    """What every role of the store has: its URL, its clock, and its connection."""

    url: str

    def close(self) -> None: ...

    def reconnect(self, hurry: bool = False) -> None:
        """After StoreConnectionLost: connect again (raises StoreConnectionLost if it can't);
        in a hurry (the run was asked to stop), giving up on a silent server sooner."""
        ...

    def abort(self) -> None:
        """From any thread: end the connection under a statement the store never answers,
        so that statement fails as a lost connection (nothing to do for a file)."""
        ...

    def now(self) -> float:
        """The store's clock (seconds since the epoch) used for every lease."""
        ...

    def try_now(self, work: Callable[[], R]) -> tuple[bool, R | None]:
        """`work()` in this thread when nothing makes it wait (True, its result); (False,
        None), nothing written, when it would wait on a lock or the network: the caller
        runs it where waiting is allowed. PostgreSQL always says False."""
        ...


class RunStore(Protocol):
    """Runs: their records, attempts and leases, how they end, and stop requests."""

    # runs
    def insert_run(self, run: RunRecord) -> bool:
        """Insert a new run; False (and nothing written) when its id exists already."""
        ...

    def get_run(self, run_id: str) -> RunRecord | None: ...

    def list_runs(
        self, *, status: str | None = None, play: str | None = None, limit: int | None = None
    ) -> list[RunRecord]: ...

    def child_runs(self, run_id: str) -> list[RunRecord]: ...

    def tick_run_ids(self, prefix: str, limit: int) -> list[str]:
        """Up to `limit` run ids of a schedule's ticks: `prefix` and then a digit (its time)."""
        ...

    def tree_runs(self, root_run_id: str) -> list[RunRecord]:
        """Every run of a root run's tree: the root and its descendants, each child once."""
        ...

    def update_run(self, run_id: str, *, only_attempt: int | None = None, **fields: Any) -> bool:
        """Set `fields`; with `only_attempt`, only while the run is still at that attempt
        (fencing: a process whose run was taken over records nothing). True if it was set."""
        ...

    def set_status(self, run_id: str, status: str, *, only_attempt: int | None = None, **fields: Any) -> bool:
        """Move the run to `status` (with `fields`) if the run state machine allows it from
        the status it is in (store/run_states.py), and, with `only_attempt`, only while the
        run is at that attempt. True if it moved."""
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

    def end_attempt(self, run_id: str, attempt: int, status: str, now: float) -> None: ...

    def attempt_status(self, run_id: str, attempt: int) -> str | None:
        """How that attempt of the run ended (running while it goes on; None: no such attempt)."""
        ...

    # stopping a run from anywhere (`deepline runs stop`)
    def run_status(self, run_id: str) -> str | None:
        """The run's status alone (a cheap read for whoever polls it)."""
        ...

    def ask_stop(self, run_id: str, reason: str, *, attempt: int) -> bool:
        """Ask the process running the run to stop: recorded only while the run is still
        running `attempt` (a stop meant for one attempt never lands on the next)."""
        ...

    def requeue(self, run_id: str, attempt: int) -> bool:
        """Put a run a draining worker interrupted back in the queue, unless someone asked
        that attempt to stop (`ask_stop`): a stopped run stays stopped."""
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


class QueueStore(Protocol):
    """The work queue: runs waiting for a worker, due runs, wake-ups, play snapshots."""

    def claim_queued_run(self, *, holder: str, expires_at: float) -> RunRecord | None:
        """Take the oldest queued run (attempt becomes 1), skipping runs others are taking."""
        ...

    def due_runs(self, limit: int, now: float, host: str = "") -> list[RunRecord]:
        """Runs a worker might continue (roots and scheduled children): waiting ones whose
        wake-up time has come, running ones whose lease expired, and running ones held on
        `host` (this machine can tell whether their holder still lives)."""
        ...

    def set_wake(self, run_id: str, wake_at: float | None, *, waiting_attempt: int | None = None) -> None:
        """When the waiting run may get further (None: only when an event or child wakes it);
        `waiting_attempt`: only while that attempt's record of waiting is the run's."""
        ...

    def notify(self) -> None:
        """Wake idle workers (PostgreSQL NOTIFY; nothing to do where workers poll)."""
        ...

    def wait_for_notify(self, timeout_s: float) -> bool | None:
        """Block until `notify` is called anywhere (True) or the timeout (False); None at
        once from a store that cannot notify (SQLite: workers poll)."""
        ...

    def put_snapshot(self, digest: str, snapshot: dict[str, Any]) -> None: ...

    def get_snapshot(self, digest: str) -> dict[str, Any] | None: ...


class ReceiptStore(Protocol):
    """Receipts: claims and settlements (group commit), leases, rate slots, credits."""

    # receipts and logs, written together in one transaction
    def apply(self, writes: Writes, now: float) -> Applied:
        """Settle (only where the lease is still current), claim, and append logs."""
        ...

    def heartbeat_receipts(self, leases: Sequence[tuple[str, str]], expires_at: float) -> set[str]:
        """Extend the given (key, lease id) leases; return the lease ids no longer held."""
        ...

    def expire_run_receipts(self, run_id: str, before_attempt: int) -> int:
        """Expire the leases of receipts the run's (dead) attempts before `before_attempt`
        still hold; a later attempt's (a live process that took the run over) are kept."""
        ...

    def get_receipt(self, key: str) -> Receipt | None: ...

    def receipt_history(self, key: str) -> list[ReceiptGeneration]:
        """The earlier answers of a receipt, oldest first."""
        ...

    def query_receipts(self, query: ReceiptQuery) -> list[Receipt]: ...

    def iter_receipts(self, query: ReceiptQuery, page: int = 2000) -> Generator[Receipt, None, None]:
        """As query_receipts, read a page at a time."""
        ...

    def take_rate_slot(self, tool: str, interval_s: float, now: float, count: int = 1) -> float:
        """The start time of the next `count` calls of `tool` paced every `interval_s` (the
        first of them; the others follow one interval apart), shared by every process using
        this store."""
        ...

    def tool_costs(self) -> dict[str, float]:
        """For tools whose answers say what they cost: the most one answer has cost."""
        ...

    def credits_spent(self, run_id: str) -> float:
        """Credits of the calls a run and its child runs completed (every attempt)."""
        ...

    def run_usage(self, run_id: str) -> tuple[int, int]:
        """(tool calls made, child plays started) by the run and its child runs, every attempt."""
        ...


class SheetStore(Protocol):
    """Sheets and maps: sheet rows, a run's map rows and map records."""

    # sheets and maps
    def load_sheet_rows(self, sheet: str, row_keys: Sequence[str], *, with_input: bool = True) -> dict[str, SheetRow]:
        """The sheet rows of these keys (absent: none). `with_input=False` leaves each row's
        stored input out (None): reuse needs only its digest, and a re-run reads every row."""

    def finished_map_rows(self, run_id: str, map: str) -> list[int]:
        """The distinct-row indexes this run's map already finished (earlier attempts)."""
        ...

    def stored_key(self, row_key: str) -> str:
        """A row key as this store keeps it, as map rows read back hold it (PostgreSQL's text
        cannot hold a NUL: one becomes U+FFFD)."""
        ...

    def earlier_map_rows(self, run_id: str, map: str, after_idx: int, limit: int) -> list[EarlierRow]:
        """The rows earlier attempts finished (a resume seeds those that succeeded), in index
        order after `after_idx`, up to `limit`."""
        ...

    def trim_map_rows(
        self, run_id: str, map: str, attempt: int, keep: int, keys: AbstractSet[str] | None = None
    ) -> int:
        """Drop the map's rows at index `keep` and beyond, and (given `keys`, the input's) those
        whose key the input no longer has: earlier attempts' rows that the input of this one
        no longer has (fenced: nothing, once the run was taken over)."""
        ...

    def count_map_rows(self, run_id: str, map: str) -> dict[str, int]:
        """Visible finished rows of this run's map by outcome (the visibility barrier)."""
        ...

    def unfinished_counts(self, run_id: str, map: str) -> tuple[int, int]:
        """For a map not completed (its record counts these only when it ends): the input rows
        skipped as duplicates before its furthest finished row, and its rows taken whole from
        sheet rows earlier runs wrote."""
        ...

    def failed_map_rows(self, run_id: str, map: str, limit: int, *, after_idx: int = -1) -> list[MapRow]:
        """The map's failed rows in input order, at most `limit`, after the distinct row
        `after_idx` (paging through every one: `runs logs --kind row.failed`)."""
        ...

    def map_rows_page(
        self, run_id: str, map: str, sheet: str, after_idx: int, limit: int, *, failed_only: bool = False
    ) -> list[DatasetRow]: ...

    def save_map(self, record: MapRecord) -> None: ...

    def get_maps(self, run_id: str) -> list[MapRecord]: ...

    def map_steps(self, run_id: str) -> dict[str, dict[str, dict[str, int]]]:
        """Waterfall hits of a run's maps: map → column → step (or "none") → rows."""
        ...

    def map_reuse(self, run_id: str, map: str) -> tuple[int, int]:
        """A map of a run: rows taken whole from sheet rows earlier runs wrote, and cells
        taken from the sheet."""
        ...


class SuspensionStore(Protocol):
    """Suspension: boundaries, events, the journal of durable ids, the play body's log keys."""

    # suspension: boundaries, events, the journal of durable ids
    def get_boundary(self, run_id: str, id: str) -> Boundary | None: ...

    def put_boundary(self, boundary: Boundary) -> Boundary:
        """Insert the boundary unless it exists; return the stored one (due times are kept)."""
        ...

    def resolve_boundary(self, run_id: str, id: str, payload: Any, now: float, status: str = "resolved") -> None: ...

    def boundaries(self, run_id: str) -> list[Boundary]: ...

    def send_event(self, run_id: str, event_id: str, payload: Any, now: float) -> bool:
        """Deliver an event; False when one was already delivered (the first is kept)."""
        ...

    def get_event(self, run_id: str, event_id: str, by: float | None = None) -> tuple[bool, Any]:
        """The event delivered to the run (sent no later than `by`, when given: a wait that
        timed out at its deadline does not take an event sent after it)."""
        ...

    def journal(self, run_id: str) -> list[str]: ...

    def append_journal(self, run_id: str, position: int, id: str) -> None: ...

    def logged(self, run_id: str) -> set[str]:
        """The keys of the play body's log lines the run wrote (ctx.log, once per run)."""
        ...


class LedgerStore(Protocol):
    """What runs did, read back: stats, the calls ledger, reuse, attempts, log lines."""

    def run_stats(self, run_id: str, failures: list[FailedCall] | None = None) -> dict[str, Any]:
        """What the run (and its child runs) did over every attempt, from the calls ledger,
        the receipts it reused, its map rows and its attempts (`failures`: its
        `final_failures`, when read already)."""
        ...

    def final_failures(self, run_id: str) -> list[FailedCall]:
        """Every call of the run (and its child runs) whose final outcome is a failure,
        each once (see store/ledger.py)."""
        ...

    def get_logs(self, run_id: str) -> list[LogLine]: ...

    def logs_after(self, run_id: str, after_id: int, limit: int, *, kinds: Sequence[str] = ()) -> list[LogLine]:
        """The run's log lines with an id above `after_id`, oldest first, at most `limit` (only
        those of `kinds`, when given): `runs tail` follows a run with it, `runs logs` pages."""
        ...

    def call_rows(self, run_id: str) -> list[CallRow]: ...
    def reuse_rows(self, run_id: str) -> list[ReuseRow]: ...
    def attempt_rows(self, run_id: str) -> list[AttemptRow]: ...
    def row_credits(self, run_id: str, map: str) -> dict[str, float]: ...

    def row_ends(self, run_id: str, map: str) -> dict[str, float]: ...
    def rows_reusing(self, run_id: str, map: str) -> set[str]: ...
    def tool_rows(self, play: str, workspace: str, map: str) -> tuple[int, dict[str, int], dict[str, int]]: ...
    def step_rows(self, play: str, workspace: str, map: str) -> dict[str, dict[str, int]]: ...
    def call_descriptions(self, run_id: str) -> dict[str, list[str]]: ...
    def found_answers(self, run_id: str) -> set[str]: ...
    def queued_children_stats(self, run_id: str) -> list[dict[str, Any]]: ...
    def recorded_rows(self, run_id: str) -> set[tuple[str, str, str]]: ...
    def answers(self, keys: Sequence[str]) -> dict[str, Any]: ...


class Store(Connection, Protocol):
    """A whole store, as `open_store` returns it: its connection, and each role by name
    (`store.runs.get_run(...)`, `store.sheets.save_map(...)`), so a consumer names the
    role it calls and sees at most that role's methods."""

    @property
    def runs(self) -> RunStore: ...
    @property
    def queue(self) -> QueueStore: ...
    @property
    def receipts(self) -> ReceiptStore: ...
    @property
    def sheets(self) -> SheetStore: ...
    @property
    def suspension(self) -> SuspensionStore: ...
    @property
    def ledger(self) -> LedgerStore: ...


ROLES = frozenset(name for name, member in vars(Store).items() if isinstance(member, property))
"""The role names a store answers to (`runs`, `queue`, ...), as `Store` declares them."""
