"""One attempt of a run: from `run.started` to `run.finished`.

history of earlier attempts ─► parts ─► run.started ─► the play's body
    │  beside it: lease heartbeat · progress ticks · stop requests (signal, `runs stop`)
    ▼
outcome ─► calls in flight settle ─► record the end (unless taken over) ─► run.finished
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from deepline_cli._format import retry_causes
from deepline_cli.errors import (
    DeeplineError,
    ReceiptLeaseLostError,
    RunBusyError,
    RunInterrupted,
    StoreError,
    StoreLostError,
    StoreUnreachable,
    error_dict,
)
from deepline_cli.runtime.calls.budget import Budget
from deepline_cli.runtime.calls.caps import Caps
from deepline_cli.runtime.calls.events import EventBus
from deepline_cli.runtime.calls.identity import Identity
from deepline_cli.runtime.calls.receipts import RunTakenOver
from deepline_cli.runtime.calls.stats import RunStats
from deepline_cli.runtime.calls.store_thread import StoreIO, reconnecting
from deepline_cli.runtime.map.projection import projection_stats
from deepline_cli.runtime.providers.config import load_config
from deepline_cli.runtime.run.body import BodyOutcome, describe, execute_body
from deepline_cli.runtime.run.children import CHILDREN
from deepline_cli.runtime.run.holders import holder_id
from deepline_cli.runtime.run.options import RunOptions, RunResult
from deepline_cli.runtime.run.parts import Journal, RunParts, Settings, build_parts
from deepline_cli.runtime.run.play import PlayDef
from deepline_cli.runtime.run.snapshot import code_changed
from deepline_cli.runtime.run.suspension import next_wake, waiting_on
from deepline_cli.store.ledger import empty_tool_counts
from deepline_cli.store.records import CELL_KEYS, REFRESH_GIVEN_FOR, FailedCall, RunRecord
from deepline_cli.store.roles import Store

PROGRESS_EVERY_S = 0.5
# How often an attempt looks in the store for a stop asked by `deepline runs stop` (one
# indexed read of the run's row): the lease heartbeat, at a third of the lease, is too slow.
STOP_POLL_S = 0.4


class AttemptHost(Protocol):
    """What an attempt needs of the Runner that starts it."""

    options: RunOptions
    bus: EventBus
    borrowed_tools: dict[str, Any]  # the @tools of options.tools_from
    stop_pending: bool  # a stop asked before the attempt could hear it


@dataclass
class History:
    """What earlier attempts of a run did, read when an attempt starts."""

    spent: float
    journal: list[str]
    logged: set[str]
    stats: dict[str, Any]
    failures: list[FailedCall]  # calls whose final outcome so far is a failure
    tool_calls: int
    child_plays: int
    costs: dict[str, float]  # what answers of tools that say their cost have cost (the budget's guide)

    @staticmethod
    def read(store: Store, record: RunRecord, now: float) -> History:
        """On the store thread: record the attempt's start, then read its history. Each read
        is tried again on its own when the connection drops (as one unit, a server ending
        connections more often than the whole took was never got past)."""

        def each(fn: Callable[..., Any], *args: Any) -> Any:
            return reconnecting(store, fn, *args)

        each(store.runs.begin_attempt, record.run_id, record.attempt, record.holder or holder_id(), now)
        root = record.root_run_id or record.run_id
        tool_calls, child_plays = each(store.receipts.run_usage, root)
        failures = each(store.ledger.final_failures, record.run_id)  # read once: the stats count them too
        return History(
            spent=each(store.receipts.credits_spent, root),
            journal=each(store.suspension.journal, record.run_id),
            logged=each(store.suspension.logged, record.run_id),
            stats=each(store.ledger.run_stats, record.run_id, failures),
            failures=failures,
            tool_calls=tool_calls,
            child_plays=child_plays,
            costs=each(store.receipts.tool_costs),
        )


def env_folder(play: PlayDef, options: RunOptions, cwd: str, *, snapshot: bool = False) -> Path:
    """The folder whose `.env` a run reads: its play's; for an enqueued run (its play comes
    from a snapshot, which carries no secrets) the folder its worker or resume runs in; for
    a built-in play, the folder of the play file whose tools it calls, else of its config,
    else the one it started in."""
    if snapshot:
        return Path.cwd()
    if not play.builtin:
        return Path(play.file).parent
    source = options.tools_from or options.config
    return Path(source).parent if source else Path(cwd)


def run_budget(play: PlayDef, options: RunOptions, record: RunRecord, spent: float, costs: dict[str, float]) -> Budget:
    """`--max-credits` (given now or when the run started), else the play's
    `max_credits_per_run`. A child run spends its root's budget: a child play's own
    declaration counts only when it runs on its own. `costs`: what metered tools' answers
    have cost on this store (see budget.py)."""
    if options.max_credits is not None or record.parent_run_id or play.max_credits_per_run is None:
        return Budget(options.max_credits, spent, costs)
    return Budget(play.max_credits_per_run, spent, costs, declared_by=play.name)


class Attempt:
    """One execution of a play body, from `run.started` to `run.finished`."""

    def __init__(self, runner: AttemptHost, play: PlayDef, record: RunRecord, io: StoreIO) -> None:
        self.runner = runner
        self.options = runner.options
        self.bus = runner.bus
        self.play = play
        self.record = record
        self.io = io
        self.stats = RunStats()
        self.stop_requested = False
        self.stop_reason: str | None = None  # a stop asked through the store (`deepline runs stop`)
        # Ctrl-C or SIGTERM heard (`_heard`): not a worker's drain, `runs stop`, nor a --json
        # output that could not be written (a run that completes all the same says so).
        self.signalled = False
        self.task: asyncio.Task[BodyOutcome] | None = None
        self.services: RunParts | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lease_lost = False  # another process owns the run now: leave its record alone
        self.decided = False  # `run.finished` is out: a late stop request changes nothing
        self.cut_short = 0  # calls in flight when a second signal (or the grace's end) cancelled the body

    async def run(self) -> RunResult:
        store, record = self.io.store, self.record
        loop = asyncio.get_running_loop()

        def report(message: str) -> None:  # from the store thread: a reconnect
            loop.call_soon_threadsafe(partial(self._warn, message, "store.reconnected"))

        self.io.report = report
        history = await self.io.call(History.read, store, record, self.io.now())
        self.stats = RunStats.since(
            history.stats,
            recovered=record.stats.get("tools") or {},
            failures=history.failures,
            refresh_failed=self.options.refresh_failed,
        )
        try:
            services = attempt_parts(self.play, self.options, self.record, self.io, self.bus, self.stats, history,
                                      self.runner.borrowed_tools)  # fmt: skip
        except Exception as exc:  # recorded as the attempt's end, not left `running` with nobody at it
            error = error_dict(exc)
            if isinstance(exc, DeeplineError):
                error["exit_code"] = exc.exit_code
            return await self._finish(BodyOutcome("failed", error=error))
        book = services.effects.book  # its breaker is its child runs' too

        def outage(down: bool) -> None:  # from the store thread: its connection lost, or back
            loop.call_soon_threadsafe(book.store_outage, down)
            if down:  # said at once (the reconnect is said once it is made)
                lost = "the store cannot be reached: no call goes out until it is back"
                loop.call_soon_threadsafe(self._warn, lost, "store.lost")

        self.io.outage = outage
        self.bus.emit(
            "run.started",
            record.run_id,
            play=record.play,
            attempt=record.attempt,
            parent_run_id=record.parent_run_id,
        )
        await self.io.call(store.runs.set_status, record.run_id, "running", options=record.options)
        keeper = asyncio.create_task(self._keep_leases(services))
        ticker = asyncio.create_task(tick(self.bus, self.record.run_id, self.stats, services))
        self.task = asyncio.create_task(execute_body(self.play, services, record.input, CHILDREN))
        restore = self._install_signals(services)
        watcher = asyncio.create_task(self._watch_stop())
        try:
            outcome = await self._outcome(services)
            keeper.cancel()
            ticker.cancel()
            watcher.cancel()
            await settle(services, self.options.interrupt_grace_s)
            progress(self.bus, record.run_id, self.stats, services, final=True)  # the views' last frame
            tripped = next((b.tripped for b in services.effects.books if b.tripped is not None), None)
            if isinstance(tripped, RunTakenOver):  # found out at a claim, before the heartbeat did
                self.lease_lost = True
            if tripped is not None and outcome.status != "failed":
                # A completion could not be recorded after the body returned: fail loudly.
                outcome = BodyOutcome("failed", error=describe(tripped, services, self.play.file))
            return await self._finish(outcome)
        finally:
            restore()

    async def _outcome(self, services: RunParts) -> BodyOutcome:
        assert self.task is not None
        try:
            outcome = await self.task
        except asyncio.CancelledError:
            if self.stop_requested:
                return self._interrupted()
            tripped = services.effects.book.tripped
            if tripped is None:
                raise
            return BodyOutcome("failed", error=describe(tripped, services, self.play.file))
        except StoreError as exc:  # the store failed under the body itself (its journal's last write)
            outcome = BodyOutcome("failed", error=describe(exc, services, self.play.file), raised=exc)
        stopped = RunInterrupted | StoreError  # a store is given up on at once when the run is asked to stop
        # `signalled` comes first when the signal's own handler refused a call before the loop heard it.
        stopping = self.stop_requested or self.signalled
        if stopping and outcome.status == "failed" and isinstance(outcome.raised, stopped):
            return self._interrupted()
        if self.signalled and outcome.status == "completed":
            # Every call was out when the signal came, and the play ended with them: the run
            # was still interrupted (exit 130, as a CI job's timeout expects), and a resume
            # ends it from its receipts.
            return self._interrupted()
        if outcome.status == "waiting":
            # Siblings may be about to suspend too (several children at once): let them
            # reach their boundaries so every one is recorded.
            await services.effects.book.settle_all(self.options.interrupt_grace_s)
        return outcome

    def _interrupted(self) -> BodyOutcome:
        """How an interrupted attempt ends: a stop asked through the store keeps its reason."""
        error = error_dict(RunInterrupted(self._interrupt_message()))
        if self.stop_reason is not None:
            error["reason"] = self.stop_reason
        if self.cut_short:
            error["cut_short"] = self.cut_short
        return BodyOutcome("interrupted", error=error)

    def _interrupt_message(self) -> str:
        if self.stop_reason is None:
            return "The run was interrupted."
        return f"The run was stopped: {self.stop_reason}."

    async def _finish(self, outcome: BodyOutcome) -> RunResult:
        record, status = self.record, outcome.status
        if self.lease_lost:
            with contextlib.suppress(DeeplineError):  # it lived to hear it: not `killed` (runs show --full)
                await self.io.call(self.io.store.runs.end_attempt, record.run_id, record.attempt, "taken_over",
                                   self.io.now())  # fmt: skip
            return self._taken_over()
        try:
            stats = await self.io.call(
                record_end,
                self.io.store,
                self.record,
                outcome,
                self.stats,
                self.io.busy_s,
                self.options.max_inline_wait,
            )
        except StoreError as exc:
            # The outcome cannot be recorded (the store is gone or unreachable): say so,
            # and never report a run the store does not know finished as completed.
            if status == "interrupted":  # as asked; only its end is not recorded
                error = error_dict(
                    RunInterrupted(
                        f"The run was interrupted while its store was unreachable ({exc}); its end is not "
                        f"recorded: `deepline resume {record.run_id}` continues it once the store is back."
                    )
                )
                error["unrecorded"] = True
                live = {  # what this process counted: the store could not be asked
                    "tools": self.stats.tools_dict(),
                    "credits": self.stats.credits,
                    "duration_s": round(max(0.0, self.io.now() - (record.created_at or self.io.now())), 3),
                }
                result = RunResult(record.run_id, "interrupted", record.attempt, None, error, live)
                self._announce(result)
                return result
            error = {**error_dict(exc), "exit_code": 1}
            result = RunResult(record.run_id, "failed", record.attempt, None, error, {})
            self._announce(result)
            return result
        if stats is None:  # taken over after the last heartbeat: the new owner's record stands
            return self._taken_over()
        result = RunResult(
            record.run_id,
            status,
            record.attempt,
            outcome.output,
            outcome.error,
            stats,
            fail_on_row_errors=self.options.fail_on_row_errors,
            trigger=str(record.options.get("trigger") or ""),
            play=record.play,
        )
        if record.parent_run_id:
            await self.io.call(self.io.store.queue.notify)  # a scheduled child ended: its parent may be due
        if status == "waiting":
            result.waiting = await self.io.call(waiting_on, self.io.store, record.run_id)
            self.bus.emit("run.waiting", record.run_id, boundaries=result.waiting)
        self._announce(result)
        return result

    def _announce(self, result: RunResult) -> None:
        self.decided = True
        self.bus.emit("run.finished", result.run_id, **result.finished_event())

    def _warn(self, message: str, kind: str = "log") -> None:
        if self.services is not None:
            self.services.log(message, level="warning", kind=kind)

    def _taken_over(self) -> RunResult:
        record = self.record
        error = error_dict(RunBusyError(f"Run {record.run_id} was taken over by another process; this one stopped."))
        result = RunResult(record.run_id, "taken_over", record.attempt, None, {**error, "exit_code": 4}, {})
        self._announce(result)
        return result

    async def _keep_leases(self, services: RunParts) -> None:
        """Heartbeat the run's lease and every receipt lease in flight."""
        interval = max(0.05, self.options.lease_ttl / 3)
        record, store = self.record, self.io.store
        while True:
            await asyncio.sleep(interval)
            try:
                held = await self.io.call(
                    store.runs.heartbeat_run,
                    record.run_id,
                    holder=record.holder or holder_id(),
                    attempt=record.attempt,
                    expires_at=self.io.now() + self.options.lease_ttl,
                )
                if not held:
                    lost = ReceiptLeaseLostError(f"Run {record.run_id} was taken over by another process; stopping.")
                    self.lease_lost = True
                    services.effects.book.close(lost)
                    if self.task is not None:
                        self.task.cancel()
                    return
                for book in list(services.effects.books):
                    if book is not services.effects.book:  # a child run in this process: its lease too
                        scope = book.scope
                        await self.io.call(
                            store.runs.heartbeat_run,
                            scope.run_id,
                            holder=record.holder or holder_id(),
                            attempt=scope.attempt,
                            expires_at=self.io.now() + self.options.lease_ttl,
                        )
                    await book.heartbeat()
            except (StoreLostError, StoreUnreachable) as exc:
                services.effects.book.close(exc)  # nothing this run does can be recorded any more
                if self.task is not None:
                    self.task.cancel()
                return
            except DeeplineError as exc:
                # A store hiccup: keep trying; the lease is long enough to ride it out.
                services.log(f"lease heartbeat failed: {exc}", level="warning")

    async def _watch_stop(self) -> None:
        """`deepline runs stop`, from any terminal or host: a stop asked through the store is
        heard within STOP_POLL_S and taken as Ctrl-C is, with its reason; heard while the run
        is already stopping for no reason given (a drain, Ctrl-C), its reason is the run's."""
        record, store = self.record, self.io.store
        while self.stop_reason is None and not self.decided:
            await asyncio.sleep(STOP_POLL_S)
            try:
                reason = await self.io.call(store.runs.stop_requested, record.run_id, record.attempt)
            except DeeplineError:
                continue  # a store hiccup; the heartbeat finds out about a store that is gone
            if reason is not None:
                self.request_stop(reason, again=False)
                return

    def request_stop(self, reason: str | None = None, *, again: bool = True) -> None:
        """Ctrl-C, SIGTERM, a draining worker or `deepline runs stop` (with its reason): stop
        dispatching, finish calls in flight briefly, and end the run `interrupted`. A second
        Ctrl-C or SIGTERM (`again`) stops at once; a drain or a stop asked through the store
        while one is under way does not cut the calls in flight short, and a reason given
        then is the run's. Once the outcome is announced, a request changes nothing."""
        if self.decided:
            return
        if self.stop_requested:
            if reason is not None and self.stop_reason is None:
                self.stop_reason = reason
            if again:
                self._cancel()
            return
        self.stop_requested = True
        self.stop_reason = reason
        self.io.stopping.set()  # a store that is down now is not waited for the whole bound
        self._unstick(asyncio.get_running_loop())
        if self.services is not None:
            self.services.effects.book.close(RunInterrupted(self._interrupt_message()))
            said = "interrupt received" if reason is None else f"stop requested ({reason})"
            # A signal's: a second one cancels the calls still out (their answers unrecorded).
            again_said = " (Ctrl-C again stops at once; the resume sends again what that cuts short)"
            self.services.log(
                f"{said}: finishing calls in flight, then stopping{again_said if reason is None else ''}",
                level="warning",
                kind="run.interrupted",
                fields={"reason": reason or "interrupt"},
            )
        if self.task is not None:
            asyncio.get_running_loop().call_later(self.options.interrupt_grace_s, self._cancel)

    def _cancel(self) -> None:
        """Stop the body at once: the calls it has out are cut short (counted, for the verdict)."""
        if self.task is None or self.task.done():
            return
        if self.services is not None:
            self.cut_short = sum(book.in_flight for book in self.services.effects.books)
        self.task.cancel()

    def _heard(self) -> None:
        """In the signal handler, the moment Ctrl-C or SIGTERM comes (the loop may be held by
        calls that block it, one after another, before it hears the signal): no call starts
        from here. `request_stop` does the rest once the loop is free."""
        if not self.decided and self.services is not None:
            self.signalled = True
            self.services.effects.book.refuse_calls(RunInterrupted(self._interrupt_message()))

    def _unstick(self, loop: asyncio.AbstractEventLoop) -> None:
        """While the run stops: a store that holds a statement without answering is not
        waited on past the stop's bound (StoreIO.unstick), checked each second."""
        if self.decided:  # the run's end is recorded: nothing more to wait for
            return
        self.io.unstick()
        loop.call_later(1.0, self._unstick, loop)

    def _install_signals(self, services: RunParts) -> Callable[[], None]:
        """Ctrl-C and SIGTERM stop the attempt gracefully until it has finished."""
        self.services, self.loop = services, asyncio.get_running_loop()
        restore = install_signals(self.loop, self.request_stop, self._heard)
        if self.runner.stop_pending:  # a drain asked before this attempt could hear it
            self.request_stop()
        return restore


def _refreshed_before(record: RunRecord) -> int:
    """The attempt a refresh flag was last given to, by an earlier attempt's command: the
    run's own failures before it are still asked again (ones that attempt did not get to,
    a budget stopping it); 0: none."""
    given_for = record.options.get(REFRESH_GIVEN_FOR)
    return given_for if isinstance(given_for, int) else 0


def attempt_parts(
    play: PlayDef, options: RunOptions, record: RunRecord, io: StoreIO, bus: EventBus, stats: RunStats,
    history: History, borrowed_tools: dict[str, Any],
) -> RunParts:  # fmt: skip
    """The parts one attempt runs with: its identity, settings, caps (counted per run),
    budget and journal from what earlier attempts did."""
    budget = run_budget(play, options, record, history.spent, history.costs)
    identity = Identity(
        run_id=record.run_id,
        attempt=record.attempt,
        play=record.play,
        workspace=record.workspace,
        lease_ttl=options.lease_ttl,
        force_refresh=options.force_refresh,
        refresh_failed=options.refresh_failed,
        refresh_own_before=None if options.refresh_given else _refreshed_before(record),
        root_run_id=record.root_run_id or record.run_id,
        ancestors=(*record.ancestors, play.name),
        play_file=play.file,
        cwd=record.cwd,
        row_keyed_steps=not record.options.get(CELL_KEYS),
    )
    settings = Settings(
        concurrency=options.concurrency,
        limit=options.limit,
        max_inline_wait=options.max_inline_wait,
        schedule_children=options.schedule_children,
        config=options.config,
        # A child run started by this one (scheduled under workers) has this run's budget.
        persisted={**options.persisted(), "max_credits": budget.max_credits},
        trigger=str(record.options.get("trigger") or ""),
    )
    caps = Caps(  # counted per run: what earlier attempts did counts too
        max_depth=options.max_depth,
        max_child_plays=options.max_child_plays,
        max_tool_calls=options.max_tool_calls,
        tool_calls=history.tool_calls,
        child_plays=history.child_plays,
    )
    return build_parts(
        identity,
        io,
        bus,
        stats,
        config=load_config(Path(options.config) if options.config else None),
        budget=budget,
        caps=caps,
        journal=Journal(history.journal, logged=history.logged, strict=code_changed(play, record)),
        local_tools={**borrowed_tools, **play.tools()},
        settings=settings,
        env_folder=env_folder(play, options, record.cwd, snapshot=bool(record.snapshot)),
        fetch_public_only=options.fetch_public_only,
    )


def _causes_of_queued_children(store: Store, run_id: str) -> dict[str, Counter[str]]:
    """Retries by cause, per tool, of the child plays below this run that workers ran as
    queued runs of their own (each recorded its own, theirs below it included); those run
    in this process are counted in its memory."""
    causes: dict[str, Counter[str]] = {}
    for stats in store.ledger.queued_children_stats(run_id):
        for tool_id, counts in (stats.get("tools") or {}).items():
            known = {k: int(v) for k, v in (counts.get("retry_reasons") or {}).items() if k != "earlier"}
            causes[tool_id] = causes.get(tool_id, Counter()) + Counter(known)
    return causes


def record_end(
    store: Store, record: RunRecord, outcome: BodyOutcome, known: RunStats, busy_s: float, max_inline_wait: float
) -> dict[str, Any] | None:
    """On the store thread: end the attempt, count the run's stats, record the outcome —
    unless another process took the run over meanwhile (then None: nothing recorded)."""
    now, status = store.now(), outcome.status
    store.runs.end_attempt(record.run_id, record.attempt, status, now)
    stats = store.ledger.run_stats(record.run_id)
    stats.update(projection_stats(store, record.run_id))  # a pilot (--limit): the full list projected
    stats["store_s"] = round(record.stats.get("store_s", 0.0) + busy_s, 3)  # the store thread's busy time
    for tool_id in known.tools:  # a tool whose calls all ended unrecorded too
        stats["tools"].setdefault(tool_id, empty_tool_counts())
    elsewhere = _causes_of_queued_children(store, record.run_id)
    for tool_id, counts in stats["tools"].items():  # counted in memory only
        counted = known.tool(tool_id)
        # The ledger counts a call's retries when it ends; one abandoned by an interrupt
        # retried too (and the live view showed it).
        counts["retries"] = max(counts["retries"], counted.retries)
        # By cause, as every view shows them: those of attempts killed before an outcome as
        # `earlier`, so the causes add up to the retries (--json's run.finished too). Child
        # plays a worker ran (the ledger's retries count theirs) said theirs in their records.
        causes = Counter(counted.retry_reasons) + elsewhere.get(tool_id, Counter())
        counts["retry_reasons"] = retry_causes(dict(causes), counts["retries"])
    wake = None
    if status == "waiting":
        wake = next_wake(store, record.run_id, record.root_run_id or record.run_id, now, max_inline_wait)
    recorded = store.runs.set_status(
        record.run_id,
        status,
        only_attempt=record.attempt,
        output=outcome.output,
        error=outcome.error,
        stats=stats,
        holder=None,
        lease_expires_at=0.0,
        finished_at=now if status in ("completed", "failed") else None,
        wake_at=wake,
    )
    if not recorded:
        store.runs.end_attempt(record.run_id, record.attempt, "taken_over", now)
        return None
    if status == "waiting" and wake != now:
        # An event sent between the look above and this record set the run due, and the
        # record put its wake time back: looked at once more, the event is there now.
        again = next_wake(store, record.run_id, record.root_run_id or record.run_id, now, max_inline_wait)
        if again is not None and (wake is None or again < wake):
            store.queue.set_wake(record.run_id, again, waiting_attempt=record.attempt)  # not taken since
    if record.scheduled and record.parent_run_id and status in ("completed", "failed"):
        store.queue.set_wake(record.parent_run_id, now)  # its parent waits for this result
    return stats


async def settle(services: RunParts, grace_s: float) -> None:
    """Let calls in flight finish briefly, record them, and stop the stragglers."""
    await services.effects.book.settle_all(grace_s)
    current = asyncio.current_task()
    stragglers = [
        t for t in asyncio.all_tasks() if t is not current and not t.done() and not services.infra.writes.owns(t)
    ]
    for task in stragglers:
        task.cancel()
    await asyncio.gather(*stragglers, return_exceptions=True)
    await services.effects.book.settle_all(0)
    await services.infra.writes.flushed()
    await services.effects.http.aclose()


def install_signals(
    loop: asyncio.AbstractEventLoop, handler: Callable[[], None], at_once: Callable[[], None] | None = None
) -> Callable[[], None]:
    """Ctrl-C and SIGTERM call `handler` on the loop, and `at_once` (only setting a flag:
    it runs wherever the loop's thread was) in the signal's own handler; the returned
    function puts back the handlers the process had before.

    asyncio's `remove_signal_handler` puts Python's default back first (for SIGINT, the one
    raising KeyboardInterrupt), and a signal landing before the handler the process had is
    back would raise into the attempt's end: a run already finished would exit 130 (seen in
    about 1 of 300 signals sent just after `run.finished`, under load). Such a signal is
    handed to the process's own handler instead, as if it had come a moment later."""
    installed: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            before = signal.getsignal(sig)
            loop.add_signal_handler(sig, handler)
            installed[sig] = before
            if at_once is not None:
                # In place of asyncio's do-nothing Python handler: the signal still wakes the
                # loop (its wakeup fd is written whatever the handler), which calls `handler`.
                signal.signal(sig, lambda *_: at_once())
                signal.siginterrupt(sig, False)  # as asyncio had it: system calls restart

    def restore() -> None:
        for sig, before in installed.items():
            try:
                loop.remove_signal_handler(sig)
                signal.signal(sig, before)
            except KeyboardInterrupt:  # the default handler heard a SIGINT in between
                signal.signal(sig, before)
                if callable(before):
                    before(sig, None)
                elif before != signal.SIG_IGN:
                    raise
        if installed:
            signal.set_wakeup_fd(-1)  # as asyncio does once its last handler is gone (an interrupted removal did not)

    return restore


async def tick(bus: EventBus, run_id: str, stats: RunStats, services: RunParts) -> None:
    """Progress for the views: counters a few times a second, never per call."""
    while True:
        await asyncio.sleep(PROGRESS_EVERY_S)
        progress(bus, run_id, stats, services)


def progress(bus: EventBus, run_id: str, stats: RunStats, services: RunParts, *, final: bool = False) -> None:
    """One frame of progress: the run's counters, and each map running now, at one moment
    (`final`: the last, once every call has settled; run.finished follows)."""
    governor = services.effects.governor
    counters = {"tools": stats.tools_dict(), "paced": governor.paced(), "paused": governor.paused()}
    bus.emit("run.progress", run_id, **counters, **({"final": True} if final else {}))
    for said in list(services.infra.progress):
        said()
