"""Runs: start, resume, lease, interrupt, finish.

A run is leased like a receipt: its holder (host and pid) heartbeats the lease while
the play executes. `resume` refuses a run a live process holds, takes over at once a
run whose holder on this machine is gone, and one held elsewhere once its lease expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets as _secrets
import signal
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

from deepline_cli.errors import (
    DeeplineError,
    PlayLoadError,
    ReceiptLeaseLostError,
    RunBusyError,
    RunInterrupted,
    StoreError,
    StoreLostError,
    StoreUnreachable,
    UsageError,
    error_dict,
)
from deepline_cli.runtime.calls.budget import Budget
from deepline_cli.runtime.calls.caps import DEFAULT_MAX_DEPTH, Caps
from deepline_cli.runtime.calls.events import EventBus
from deepline_cli.runtime.calls.identity import Identity
from deepline_cli.runtime.calls.receipts import RunTakenOver
from deepline_cli.runtime.calls.stats import RunStats
from deepline_cli.runtime.calls.store_thread import Reconnecting, StoreIO, unwrapped
from deepline_cli.runtime.map.projection import projection_stats
from deepline_cli.runtime.providers.config import find_config, load_config
from deepline_cli.runtime.providers.secrets import Secrets
from deepline_cli.runtime.run.body import BodyOutcome, describe, execute_body
from deepline_cli.runtime.run.builtin import BUILTIN_PLAYS
from deepline_cli.runtime.run.children import CHILDREN
from deepline_cli.runtime.run.holders import holder_alive, holder_id, holder_words
from deepline_cli.runtime.run.parts import Journal, RunParts, Settings, build_parts
from deepline_cli.runtime.run.play import PlayDef, load_module, load_play, tools_in
from deepline_cli.runtime.run.snapshot import materialize_snapshot, take_snapshot
from deepline_cli.runtime.run.suspension import next_wake, ready_to_resume, waiting_on
from deepline_cli.store import open_store
from deepline_cli.store.records import FailedCall, RunRecord
from deepline_cli.store.roles import Store

PROGRESS_EVERY_S = 0.5
# How often an attempt looks in the store for a stop asked by `deepline runs stop` (one
# indexed read of the run's row): the lease heartbeat, at a third of the lease, is too slow.
STOP_POLL_S = 0.4
# taken_over: another process took the run's lease while this one ran it (this process
# stopped without recording anything); the run's own status is whatever the new owner makes it.
EXIT_CODES = {"completed": 0, "queued": 0, "failed": 1, "waiting": 3, "taken_over": 4, "interrupted": 130}


def lease_ttl_from_env() -> float:
    raw = os.environ.get("DEEPLINE_LEASE_TTL", "30")
    try:
        ttl = float(raw)
    except ValueError:
        raise UsageError(f"DEEPLINE_LEASE_TTL must be a number of seconds, not {raw!r}.") from None
    if ttl <= 0:
        raise UsageError("DEEPLINE_LEASE_TTL must be more than 0 seconds.")
    return ttl


@dataclass
class RunOptions:
    """Flags that shape a run; the persisted ones come back on resume."""

    store: str | None = None
    workspace: str = "default"
    run_id: str | None = None
    concurrency: int | None = None
    limit: int | None = None
    force_refresh: bool = False
    refresh_failed: bool = False
    max_credits: float | None = None
    max_inline_wait: float = 30.0
    fail_on_row_errors: bool = False
    interrupt_grace_s: float = 5.0
    lease_ttl: float = field(default_factory=lease_ttl_from_env)

    config: str | None = None
    # A play file whose @tools the run may call besides its own play's (and whose folder's
    # .env it reads): `deepline tools execute --play FILE`. Kept with the run for resumes.
    tools_from: str | None = None
    max_depth: int = DEFAULT_MAX_DEPTH
    max_child_plays: int | None = None
    max_tool_calls: int | None = None
    schedule_children: bool = False  # set by workers, not persisted: how this process runs children
    # ctx.fetch may reach public addresses only (no cloud metadata, private network or
    # loopback): for workers running plays others wrote. Not persisted: the process decides.
    fetch_public_only: bool = field(default_factory=lambda: os.environ.get("DEEPLINE_FETCH_PUBLIC_ONLY") == "1")

    PERSISTED = (  # snapshot: see take_snapshot
        "concurrency",
        "limit",
        "max_credits",
        "max_inline_wait",
        "fail_on_row_errors",
        "config",
        "tools_from",
        "max_depth",
        "max_child_plays",
        "max_tool_calls",
    )

    def persisted(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k in self.PERSISTED}


@dataclass
class RunResult:
    run_id: str
    status: str
    attempt: int
    output: Any = None
    error: dict[str, Any] | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    reported: bool = False  # an already-finished run, reported rather than run
    finished_at: float | None = None  # when a reported run finished (its run.finished ts)
    fail_on_row_errors: bool = False
    waiting: list[dict[str, Any]] = field(default_factory=list)  # boundaries of a waiting run

    @property
    def failed_rows(self) -> int:
        return int((self.stats.get("rows") or {}).get("failed", 0))

    @property
    def exit_code(self) -> int:
        if self.status == "failed" and self.error and "exit_code" in self.error:
            return int(self.error["exit_code"])
        if self.status == "completed" and self.fail_on_row_errors and self.failed_rows:
            return 1
        return EXIT_CODES.get(self.status, 1)

    def finished_event(self) -> dict[str, Any]:
        event = {
            "status": self.status,
            "attempt": self.attempt,
            "output": self.output,
            "error": self.error,
            "stats": self.stats,
        }
        if self.waiting:
            event["waiting"] = self.waiting
        return event


def new_run_id() -> str:
    return "r-" + _secrets.token_hex(6)


RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_run_id(run_id: str) -> str:
    """A run id becomes a file name (`runs report`) and is printed: letters, digits, `.`, `_`
    and `-`, starting with a letter or digit, at most 128 characters."""
    if not RUN_ID.fullmatch(run_id):
        raise UsageError(
            f"Run id {run_id!r} is not valid: use letters, digits, '.', '_' and '-', starting with a letter "
            "or digit, at most 128 characters."
        )
    return run_id


def find_play(ref: str) -> PlayDef:
    """A built-in play by its `builtin:NAME` ref, else the play file's."""
    return BUILTIN_PLAYS.get(ref) or load_play(ref)


def env_folder(play: PlayDef, options: RunOptions, cwd: str) -> Path:
    """The folder whose `.env` a run reads: its play's; for a built-in play, the folder of
    the play file whose tools it calls, else of its config, else the one it started in."""
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


class Runner:
    """Starts and resumes runs against one store."""

    def __init__(self, options: RunOptions, bus: EventBus, store: Store | None = None) -> None:
        self.options = options
        self.bus = bus
        self.store = cast(Store, Reconnecting(store or open_store(options.store)))
        self.attempt: _Attempt | None = None
        self.stop_pending = False
        # Called just before the run is recorded: the command hands Ctrl-C to the run then.
        self.before_recording: Callable[[], None] | None = None
        self.borrowed_tools: dict[str, Any] = {}  # the @tools of options.tools_from

    def close(self) -> None:
        self.store.close()

    # --- entry points ---------------------------------------------------------------------

    def start(self, play_ref: str, input: Any, *, cwd: str | None = None, enqueue: bool = False) -> RunResult:
        """`deepline run`: a new run, or with --run-id an existing one reported or resumed.

        With `enqueue`, the run is only recorded (`queued`, with a snapshot of the play's
        source and config) for a `deepline worker` to execute.
        """
        if self.options.run_id:
            existing = self.store.get_run(check_run_id(self.options.run_id))
            if existing is not None:
                return self._requeue(existing) if enqueue else self.resume(existing.run_id)
        play = find_play(play_ref)
        if enqueue and play.builtin:
            raise UsageError(f"The built-in play {play.name!r} runs here only; it cannot be enqueued.")
        play.check_input(input)  # a refused input fails now, before the run exists
        config_path = find_config(Path(play.file), self.options.config)
        load_config(config_path)  # a broken deepline.toml fails now, before the run exists
        self.options.config = str(config_path) if config_path else None
        if not enqueue:  # a queued run's secrets are the worker's, checked when it runs
            self._prepare(play, cwd or os.getcwd())
        now = self.store.now()
        run_id = self.options.run_id or new_run_id()
        options = self.options.persisted()
        digest = None
        if enqueue:
            digest, snapshot = take_snapshot(play, config_path)
            self.store.put_snapshot(digest, snapshot)
        record = RunRecord(
            run_id=run_id, play=play.name, play_ref=play.ref, input=input,
            status="queued" if enqueue else "running", attempt=0 if enqueue else 1,
            workspace=self.options.workspace, cwd=cwd or os.getcwd(), options=options, root_run_id=run_id,
            holder=None if enqueue else holder_id(), lease_expires_at=0.0 if enqueue else now + self.options.lease_ttl,
            created_at=now, updated_at=now, snapshot=digest,
        )  # fmt: skip
        self._recording()
        if not self.store.insert_run(record):
            # Another process created this --run-id a moment ago: report it, or resume it
            # (which refuses while that process holds it: busy).
            return self._requeue(self.store.get_run(run_id) or record) if enqueue else self.resume(run_id)
        if enqueue:
            self.store.notify()
            return RunResult(run_id, "queued", 0, reported=True)
        return self._execute(play, record)

    def _requeue(self, record: RunRecord) -> RunResult:
        """`run --enqueue --run-id` of an existing run: report it, or queue it again for a
        worker (never run it here)."""
        if record.status in ("queued", "completed"):
            return _result_of(record, reported=True)
        if holder_alive(record, self.store.now()):
            raise RunBusyError(f"Run {record.run_id} is held by a live process ({holder_words(record.holder)}).")
        self.store.set_status(record.run_id, "queued", holder=None, lease_expires_at=0.0)
        self.store.notify()
        return RunResult(record.run_id, "queued", record.attempt, reported=True)

    def resume(self, run_id: str) -> RunResult:
        """`deepline resume`: the next attempt of a run, replaying what it already did."""
        record = self.store.get_run(run_id)
        if record is None:
            raise UsageError(f"No run {run_id!r} in the store {self.store.url}.")
        if record.status == "completed":
            result = _result_of(record, reported=True)
            result.fail_on_row_errors = self.options.fail_on_row_errors
            return result
        if record.status == "waiting":
            self._apply_persisted(record)
            if not ready_to_resume(self.store, run_id, self.store.now(), self.options.max_inline_wait):
                result = _result_of(record, reported=True)
                result.waiting = waiting_on(self.store, run_id)
                return result
        if holder_alive(record, self.store.now()):
            raise RunBusyError(
                f"Run {run_id} is held by a live process ({holder_words(record.holder)}); "
                "wait for it to finish or stop that process first."
            )
        attempt = record.attempt + 1
        self._recording()
        holder, expires = holder_id(), self.store.now() + self.options.lease_ttl
        taken = self.store.lease_run(run_id, holder=holder, expires_at=expires, attempt=attempt,
                                     expect_attempt=record.attempt,
                                     expect_expires=record.lease_expires_at or 0.0)  # fmt: skip
        if not taken:
            raise RunBusyError(f"Run {run_id} was just taken by another process.")
        record.holder, record.lease_expires_at = holder, expires  # this process holds it now
        record.attempt = attempt
        return self.run_claimed(record)

    def run_claimed(self, record: RunRecord) -> RunResult:
        """Execute a run this process has just leased (by `resume`, or a worker's claim)."""
        self.store.expire_run_receipts(record.run_id)
        record.status = "running"
        self._apply_persisted(record)
        try:
            play = self._load(record)
            self._prepare(play, record.cwd)
        except DeeplineError as exc:
            self.store.set_status(record.run_id, "failed", holder=None, error=error_dict(exc))
            raise
        return self._execute(play, record)

    def _prepare(self, play: PlayDef, cwd: str) -> None:
        """Before any call: every secret the play declares is set, and the tools the run
        borrows (`tools_from`) load."""
        secrets = Secrets(env_folder(play, self.options, cwd))
        play.require_secrets(secrets.lookup, secrets.env_file)
        tools_from = self.options.tools_from
        self.borrowed_tools = tools_in(vars(load_module(Path(tools_from)))) if tools_from else {}

    def _load(self, record: RunRecord) -> PlayDef:
        if not record.snapshot:
            return find_play(record.play_ref)
        snapshot = self.store.get_snapshot(record.snapshot)
        if snapshot is None:
            raise PlayLoadError(f"Run {record.run_id}'s play source ({record.snapshot}) is not in the store.")
        play_ref, config = materialize_snapshot(record.snapshot, snapshot)
        self.options.config = config
        return load_play(play_ref)

    def _apply_persisted(self, record: RunRecord) -> None:
        """Flags not given again on resume come from the run's first start."""
        defaults = RunOptions(lease_ttl=self.options.lease_ttl)
        for name, value in record.options.items():
            if name in RunOptions.PERSISTED and getattr(self.options, name) == getattr(defaults, name):
                setattr(self.options, name, value)
        self.options.workspace = record.workspace
        record.options = {**record.options, **self.options.persisted()}

    # --- one attempt ----------------------------------------------------------------------

    def _execute(self, play: PlayDef, record: RunRecord) -> RunResult:
        io = StoreIO(unwrapped(self.store))  # the store thread reconnects by itself
        self.attempt = _Attempt(self, play, record, io)
        try:
            return asyncio.run(self.attempt.run())
        finally:
            io.close()

    def _recording(self) -> None:
        """About to record the run (insert or lease it): from here a stop request ends it
        `interrupted`; one made already means it is not recorded at all."""
        if self.before_recording is not None:
            self.before_recording()
        if self.stop_pending:
            raise RunInterrupted("Interrupted before the run started; nothing was done.")

    def request_stop(self) -> None:
        """From any thread or a signal handler: interrupt the attempt running now, or the
        next one as soon as it starts (a run not created yet is not created)."""
        self.stop_pending = True
        attempt = self.attempt
        if attempt is not None and attempt.loop is not None:
            attempt.loop.call_soon_threadsafe(attempt.request_stop)


class _Attempt:
    """One execution of a play body, from `run.started` to `run.finished`."""

    def __init__(self, runner: Runner, play: PlayDef, record: RunRecord, io: StoreIO) -> None:
        self.runner = runner
        self.options = runner.options
        self.bus = runner.bus
        self.play = play
        self.record = record
        self.io = io
        self.stats = RunStats()
        self.stop_requested = False
        self.stop_reason: str | None = None  # a stop asked through the store (`deepline runs stop`)
        self.task: asyncio.Task[BodyOutcome] | None = None
        self.services: RunParts | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lease_lost = False  # another process owns the run now: leave its record alone
        self.decided = False  # `run.finished` is out: a late stop request changes nothing

    def _parts(self, history: _History) -> RunParts:
        options, record = self.options, self.record
        budget = run_budget(self.play, options, record, history.spent, history.costs)
        identity = Identity(
            run_id=record.run_id,
            attempt=record.attempt,
            play=record.play,
            workspace=record.workspace,
            lease_ttl=options.lease_ttl,
            force_refresh=options.force_refresh,
            refresh_failed=options.refresh_failed,
            root_run_id=record.root_run_id or record.run_id,
            ancestors=(*record.ancestors, self.play.name),
            play_file=self.play.file,
            cwd=record.cwd,
        )
        settings = Settings(
            concurrency=options.concurrency,
            limit=options.limit,
            max_inline_wait=options.max_inline_wait,
            schedule_children=options.schedule_children,
            config=options.config,
            # A child run started by this one (scheduled under workers) has this run's budget.
            persisted={**options.persisted(), "max_credits": budget.max_credits},
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
            self.io,
            self.bus,
            self.stats,
            config=load_config(Path(options.config) if options.config else None),
            budget=budget,
            caps=caps,
            journal=Journal(history.journal, logged=history.logged),
            local_tools={**self.runner.borrowed_tools, **self.play.tools()},
            settings=settings,
            env_folder=env_folder(self.play, options, record.cwd),
            fetch_public_only=options.fetch_public_only,
        )

    async def run(self) -> RunResult:
        store, record = self.io.store, self.record
        loop = asyncio.get_running_loop()

        def report(message: str) -> None:  # from the store thread: a reconnect
            loop.call_soon_threadsafe(partial(self._warn, message, "store.reconnected"))

        self.io.report = report
        history = await self.io.call(_History.read, store, record, self.io.now())
        self.stats = RunStats.since(
            history.stats,
            recovered=record.stats.get("tools") or {},
            failures=history.failures,
            refresh_failed=self.options.refresh_failed,
        )
        services = self._parts(history)
        self.bus.emit(
            "run.started",
            record.run_id,
            play=record.play,
            attempt=record.attempt,
            parent_run_id=record.parent_run_id,
        )
        await self.io.call(store.set_status, record.run_id, "running", options=record.options)
        keeper = asyncio.create_task(self._keep_leases(services))
        ticker = asyncio.create_task(self._tick(services))
        self.task = asyncio.create_task(execute_body(self.play, services, record.input, CHILDREN))
        restore = self._install_signals(services)
        watcher = asyncio.create_task(self._watch_stop())
        try:
            outcome = await self._outcome(services)
            keeper.cancel()
            ticker.cancel()
            watcher.cancel()
            await self._settle(services)
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
        if self.stop_requested and outcome.status == "failed" and isinstance(outcome.raised, RunInterrupted):
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
        return BodyOutcome("interrupted", error=error)

    def _interrupt_message(self) -> str:
        if self.stop_reason is None:
            return "The run was interrupted."
        return f"The run was stopped: {self.stop_reason}."

    async def _settle(self, services: RunParts) -> None:
        """Let calls in flight finish briefly, record them, and stop the stragglers."""
        await services.effects.book.settle_all(self.options.interrupt_grace_s)
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

    async def _finish(self, outcome: BodyOutcome) -> RunResult:
        record, status = self.record, outcome.status
        if self.lease_lost:
            return self._taken_over()
        try:
            stats = await self.io.call(self._record_end, outcome)
        except StoreError as exc:
            # The outcome cannot be recorded (the store is gone or unreachable): say so,
            # and never report a run the store does not know finished as completed.
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
        )
        if record.parent_run_id:
            await self.io.call(self.io.store.notify)  # a scheduled child ended: its parent may be due
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

    def _record_end(self, outcome: BodyOutcome) -> dict[str, Any] | None:
        """On the store thread: end the attempt, count the run's stats, record the outcome —
        unless another process took the run over meanwhile (then None: nothing recorded)."""
        record, store, now, status = self.record, self.io.store, self.io.now(), outcome.status
        store.end_attempt(record.run_id, record.attempt, status, now)
        stats = store.run_stats(record.run_id)
        stats.update(projection_stats(store, record.run_id))  # a pilot (--limit): the full list projected
        stats["store_s"] = round(record.stats.get("store_s", 0.0) + self.io.busy_s, 3)  # the store thread's busy time
        for tool_id in self.stats.tools:  # a tool whose calls all ended unrecorded too
            stats["tools"].setdefault(
                tool_id, {"live": 0, "reused": 0, "failed": 0, "credits": 0.0, "retries": 0, "recovered": 0}
            )
        for tool_id, counts in stats["tools"].items():  # counted in memory only
            known = self.stats.tool(tool_id)
            counts["retry_reasons"] = dict(known.retry_reasons)  # the attempts that ended with an outcome
            # The ledger counts a call's retries when it ends; one abandoned by an interrupt
            # retried too (and the live view showed it).
            counts["retries"] = max(counts["retries"], known.retries)
        wake = None
        if status == "waiting":
            wake = next_wake(
                store, record.run_id, record.root_run_id or record.run_id, now, self.options.max_inline_wait
            )
        recorded = store.set_status(
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
            store.end_attempt(record.run_id, record.attempt, "taken_over", now)
            return None
        if record.scheduled and record.parent_run_id and status in ("completed", "failed"):
            store.set_wake(record.parent_run_id, now)  # its parent waits for this result
        return stats

    async def _tick(self, services: RunParts) -> None:
        """Progress for the views: counters a few times a second, never per call."""
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            self.bus.emit(
                "run.progress",
                self.record.run_id,
                tools={t: c.to_dict() for t, c in self.stats.tools.items()},
                paced=services.effects.governor.paced(),
                paused=services.effects.governor.paused(),
            )

    async def _keep_leases(self, services: RunParts) -> None:
        """Heartbeat the run's lease and every receipt lease in flight."""
        interval = max(0.05, self.options.lease_ttl / 3)
        record, store = self.record, self.io.store
        while True:
            await asyncio.sleep(interval)
            try:
                held = await self.io.call(
                    store.heartbeat_run,
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
                            store.heartbeat_run,
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
        heard within STOP_POLL_S and taken as Ctrl-C is, with its reason."""
        record, store = self.record, self.io.store
        while not self.stop_requested:
            await asyncio.sleep(STOP_POLL_S)
            try:
                reason = await self.io.call(store.stop_requested, record.run_id, record.attempt)
            except DeeplineError:
                continue  # a store hiccup; the heartbeat finds out about a store that is gone
            if reason is not None:
                self.request_stop(reason)
                return

    def request_stop(self, reason: str | None = None) -> None:
        """Ctrl-C, SIGTERM, a draining worker or `deepline runs stop` (with its reason): stop
        dispatching, finish calls in flight briefly, and end the run `interrupted`. A second
        request stops at once. Once the outcome is announced, a request changes nothing."""
        if self.decided:
            return
        if self.stop_requested:
            if self.task is not None:
                self.task.cancel()
            return
        self.stop_requested = True
        self.stop_reason = reason
        if self.services is not None:
            self.services.effects.book.close(RunInterrupted(self._interrupt_message()))
            said = "interrupt received" if reason is None else f"stop requested ({reason})"
            self.services.log(
                f"{said}: finishing calls in flight, then stopping",
                level="warning",
                kind="run.interrupted",
                fields={"reason": reason or "interrupt"},
            )
        if self.task is not None:
            asyncio.get_running_loop().call_later(self.options.interrupt_grace_s, self.task.cancel)

    def _install_signals(self, services: RunParts) -> Any:
        """Ctrl-C and SIGTERM stop the attempt gracefully until it has finished; then the
        handlers the process had before come back (asyncio would put the defaults back)."""
        loop = asyncio.get_running_loop()
        self.services, self.loop = services, loop
        installed: dict[int, Any] = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                before = signal.getsignal(sig)
                loop.add_signal_handler(sig, self.request_stop)
                installed[sig] = before
        if self.runner.stop_pending:  # a drain asked before this attempt could hear it
            self.request_stop()

        def restore() -> None:
            for sig, before in installed.items():
                loop.remove_signal_handler(sig)
                signal.signal(sig, before)

        return restore


@dataclass
class _History:
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
    def read(store: Store, record: RunRecord, now: float) -> _History:
        """On the store thread: record the attempt's start, then read its history."""
        store.begin_attempt(record.run_id, record.attempt, record.holder or holder_id(), now)
        root = record.root_run_id or record.run_id
        tool_calls, child_plays = store.run_usage(root)
        return _History(
            spent=store.credits_spent(root),
            journal=store.journal(record.run_id),
            logged=store.logged(record.run_id),
            stats=store.run_stats(record.run_id),
            failures=store.final_failures(record.run_id),
            tool_calls=tool_calls,
            child_plays=child_plays,
            costs=store.tool_costs(),
        )


def _result_of(record: RunRecord, *, reported: bool) -> RunResult:
    return RunResult(
        record.run_id,
        record.status,
        record.attempt,
        record.output,
        record.error,
        record.stats,
        reported=reported,
        finished_at=record.finished_at or record.updated_at,
    )
