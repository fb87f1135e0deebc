"""`deepline worker`: processes that take queued and due runs from a shared store.

Each of `concurrency` threads loops: claim the oldest queued run (`FOR UPDATE SKIP
LOCKED` on PostgreSQL), else continue a waiting run whose timer is due or whose event
arrived, else take over a run whose holder died; run it; repeat. Claims are
compare-and-set on the run's attempt, so two workers never run one attempt. Workers
sleep until a PostgreSQL NOTIFY (a run enqueued, an event sent) or the next poll.

SIGTERM/SIGINT drains: no new claims; runs in progress are interrupted (calls in flight
finish and are recorded) and put back in the queue for another worker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from deepline_cli.backoff import delays
from deepline_cli.errors import (
    DeeplineError,
    RunBusyError,
    RunInterrupted,
    StoreConnectionLost,
    StoreError,
    StoreOpenError,
    store_down,
)
from deepline_cli.runtime.calls.events import Event, EventBus
from deepline_cli.runtime.calls.store_thread import reconnect_bound_s, reconnecting
from deepline_cli.runtime.run.holders import holder_alive, holder_id
from deepline_cli.runtime.run.options import RunOptions, RunResult, lease_ttl_from_env
from deepline_cli.runtime.run.play import PlayDef
from deepline_cli.runtime.run.runner import Runner
from deepline_cli.runtime.run.schedules import Ticks
from deepline_cli.runtime.run.stop import PARENT_STOPPED, stop_error
from deepline_cli.runtime.run.suspension import next_wake, ready_to_resume
from deepline_cli.store import open_store
from deepline_cli.store.records import RunRecord
from deepline_cli.store.roles import Store

POLL_S = 1.0  # how often an idle worker looks for due runs (PostgreSQL's NOTIFY wakes it sooner)
DUE_SCAN = 50
RECHECK_S = 5.0  # a run found not due yet is looked at again no sooner than this

Report = Callable[[str], None]
# A sleeping run is taken at most this long before its timer: a worker's slot does not sit
# out the run's whole inline wait (30 s by default) in a sleep another run could use.
WORKER_EARLY_S = 1.0


@dataclass
class WorkerStats:
    started: int = 0
    completed: int = 0
    failed: int = 0
    waiting: int = 0
    requeued: int = 0
    taken_over: int = 0  # runs another process took over while this one ran them (paused past the lease)
    stopped: int = 0  # interrupted and not re-queued: `runs stop`, or the worker stopping as the run began


class Worker:
    """`deepline worker`: claims queued and due runs from the store (PostgreSQL's NOTIFY
    wakes it, else it polls), runs up to `concurrency` at once with the play source they
    were enqueued with, and on SIGTERM drains: runs in flight stop and go back to the queue."""

    def __init__(
        self,
        store_url: str | None,
        *,
        concurrency: int = 1,
        once: bool = False,
        report: Report = print,
        fetch_public_only: bool = False,
        scheduled: Sequence[PlayDef] = (),
        finished: Callable[[RunResult], None] | None = None,
    ) -> None:
        self.store_url = store_url
        self.scheduled = [p for p in scheduled if p.schedule is not None]
        self.poll_s = float(os.environ.get("DEEPLINE_WORKER_POLL_S", POLL_S))
        self.fetch_public_only = fetch_public_only
        self.concurrency = max(1, concurrency)
        self.once = once
        self.report = report
        self.finished = finished  # each run's outcome, for the worker's log (its verdict)
        self.stats = WorkerStats()
        self._draining = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._runners: set[Runner] = set()
        self._idle: set[str] = set()
        self.failure: StoreError | None = None  # why the worker stopped on its own
        self.opened = False  # a thread opened the store (else its failure is all there is to say)

    # --- lifecycle -----------------------------------------------------------------------

    def run(self) -> WorkerStats:
        restore = self._install_signals()
        if self.scheduled:  # ticks missed while no worker ran go first (and with --once, only they)
            ticks = Ticks(self.store_url, self.scheduled, self.report, self._wake.set)
            started = time.time()
            ticks.catch_up(started)
            if not self.once:
                fire = threading.Thread(target=ticks.fire, args=(started, self._draining, self.poll_s), daemon=True)
                fire.start()
        threads = [threading.Thread(target=self._loop, name=f"deepline-worker-{i}") for i in range(self.concurrency)]
        for thread in threads:
            thread.start()
        waker = threading.Thread(target=self._listen, daemon=True, name="deepline-worker-listen")
        waker.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(timeout=0.2)
        finally:
            restore()
        return self.stats

    def drain(self, why: str | None = "draining — interrupting runs in progress, they will be re-queued") -> None:
        """Stop claiming; interrupt the runs in progress (they go back to the queue). `why`
        is said unless None."""
        if self._draining.is_set():
            return
        self._draining.set()
        self._wake.set()
        if why is not None:
            self.report(f"worker: {why}")
        with self._lock:
            for runner in self._runners:
                runner.request_stop(again=False)

    def _install_signals(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, lambda *_: self.drain())

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore

    def _listen(self) -> None:
        """Wake idle threads on a PostgreSQL NOTIFY; SQLite workers just poll (and so does
        this one if the store stays unreachable: the threads find that out themselves)."""
        try:
            store = open_store(self.store_url)
        except DeeplineError:
            return  # the threads open it too, and say why they cannot
        try:
            while not self._draining.is_set():
                woke = reconnecting(store, store.queue.wait_for_notify, self.poll_s)
                if woke is None:
                    return
                if woke:
                    self._wake.set()
        except DeeplineError:
            return
        finally:
            store.close()

    def _give_up(self, exc: StoreError) -> None:
        """The store stayed unreachable, or cannot be used (a newer deepline's schema): stop
        this worker (its runs can be taken over)."""
        with self._lock:
            if self.failure is None:
                self.failure = exc
        why = "cannot be opened" if isinstance(exc, StoreOpenError) else "cannot be used"
        why = "cannot be reached" if store_down(exc) else why
        self.drain(f"stopping: the store {why}" if self.opened else None)

    # --- one thread ------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            store = open_store(self.store_url)
        except StoreError as exc:  # refused (down, a wrong port), or a newer deepline's schema
            self._give_up(exc)
            return
        self.opened = True
        me = threading.current_thread().name
        try:
            while not self._draining.is_set():
                try:
                    took = self._take_one(store)
                except StoreError as exc:  # unreachable, or written by a newer deepline since
                    self._give_up(exc)
                    return
                if took:
                    with self._lock:
                        self._idle.discard(me)
                    continue
                with self._lock:
                    self._idle.add(me)
                    done = self.once and len(self._idle) == self.concurrency and not self._runners
                if done:  # --once: every thread found nothing due
                    return
                self._wake.wait(self.poll_s)
                self._wake.clear()
        finally:
            store.close()

    def _take_one(self, store: Store) -> bool:
        """One run to do: first a run already begun that is due (its timer, its event, a
        holder gone: a killed worker's runs do not wait behind the whole queue), then a
        queued one."""
        ttl = lease_ttl_from_env()
        here = socket.gethostname()
        due = reconnecting(store, lambda: store.queue.due_runs(DUE_SCAN, store.now(), here), report=self._reconnected)
        for candidate in due:
            if self._draining.is_set() or not reconnecting(store, self._is_due, store, candidate):
                continue
            run_id = candidate.run_id
            try:
                self._execute(run_id, lambda runner, run_id=run_id: runner.resume(run_id))  # type: ignore[misc]
            except RunBusyError:
                continue  # another worker took it first
            return True

        def claim() -> RunRecord | None:
            return store.queue.claim_queued_run(holder=holder_id(), expires_at=store.now() + ttl)

        record = reconnecting(store, claim, report=self._reconnected)
        if record is not None:
            claimed = record
            if not reconnecting(store, self._root_stopped, store, claimed):
                self._execute(claimed.run_id, lambda runner: runner.run_claimed(claimed))
            return True
        return False

    def _root_stopped(self, store: Store, record: RunRecord) -> bool:
        """A child run queued by a parent that was stopped since, or is being stopped (`runs
        stop`, just as it queued the child), or whose own parent was: it is not run but
        stopped with it; the parent's resume queues it again."""
        parent_id = record.parent_run_id if record.scheduled else None
        while parent_id:
            parent = store.runs.get_run(parent_id)
            if parent is None:
                return False
            if parent.status == "interrupted" or (parent.status == "running" and parent.stop_reason):
                reason = f"{PARENT_STOPPED}{parent_id} was stopped"
                store.runs.interrupt_run(record.run_id, reason, attempt=record.attempt, status="running",
                                         error=stop_error(reason), now=store.now())  # fmt: skip
                self.report(f"worker: {record.run_id} not run: {reason}")
                return True
            parent_id = parent.parent_run_id
        return False

    @staticmethod
    def _is_due(store: Store, record: RunRecord) -> bool:
        now = store.now()
        if record.status == "running":
            return not holder_alive(record, now)  # its holder died: take it over
        wait = record.options.get("max_inline_wait")
        wait = min(WORKER_EARLY_S, 30.0 if wait is None else float(wait))
        if ready_to_resume(store, record.run_id, now, wait):
            return True
        # Not yet after all: look again when it may be (never in a loop on the same run).
        wake = next_wake(store, record.run_id, record.root_run_id or record.run_id, now, wait)
        later = None if wake is None else max(wake, now + RECHECK_S)
        store.queue.set_wake(record.run_id, later, waiting_attempt=record.attempt)  # not if taken since
        # A child that ended or an event sent between the look above and this write set the
        # run due, and the write put that back: looked at once more, it is taken now.
        return ready_to_resume(store, record.run_id, store.now(), wait)

    def _runner(self, options: RunOptions, run_id: str) -> Runner:
        """A runner on its own store connection: a connection dropped as it opens (the server
        ending backends) is opened again, for the store's reconnect bound, before the worker
        gives up on the store (it stopped at once)."""
        deadline = time.monotonic() + reconnect_bound_s()
        for wait in delays(0.1, cap=2.0, tries=1_000):
            try:
                return Runner(options, self._bus(run_id))
            except StoreConnectionLost:
                if time.monotonic() + wait > deadline:
                    raise
                time.sleep(wait)
        raise AssertionError("unreachable")

    def _execute(self, run_id: str, action: Callable[[Runner], RunResult]) -> None:
        options = RunOptions(store=self.store_url, schedule_children=True)
        options.fetch_public_only = options.fetch_public_only or self.fetch_public_only
        runner = self._runner(options, run_id)
        with self._lock:
            self._runners.add(runner)
        if self._draining.is_set():
            runner.request_stop(again=False)
        self.stats.started += 1
        started = time.monotonic()
        try:
            result = action(runner)
            stopped = (result.error or {}).get("reason")  # `runs stop`, or its parent's: it stays stopped
            drained = result.status == "interrupted" and self._draining.is_set() and not stopped
            if drained and runner.store.runs.requeue(run_id, result.attempt):  # another worker continues it
                runner.store.queue.notify()
                self.stats.requeued += 1
                result.requeued = True
        except RunBusyError:
            self.stats.started -= 1  # another worker leased it first (a race for a due run): not this one's
            raise
        except RunInterrupted:  # the worker is stopping, and the run was not taken: it stays as it was
            self.stats.started -= 1
            self.report(f"worker: {run_id} not started: the worker is stopping")
            return
        except DeeplineError as exc:
            self.stats.failed += 1
            self.report(f"worker: {run_id} could not run: {exc}")
            return
        except BaseException as exc:
            # Never leave the run held by this (live) process: it would look busy forever.
            self.stats.failed += 1
            self.report(f"worker: {run_id} crashed: {type(exc).__name__}: {exc}")
            with contextlib.suppress(DeeplineError):
                runner.store.runs.set_status(run_id, "interrupted", holder=None, lease_expires_at=0.0)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            with self._lock:
                self._runners.discard(runner)
            runner.close()
        if result.status == "completed":
            self.stats.completed += 1
        elif result.status == "waiting":
            self.stats.waiting += 1
        elif result.status == "taken_over":
            self.stats.taken_over += 1
        elif result.status == "interrupted":
            if not result.requeued:  # a re-queued one is counted as such
                self.stats.stopped += 1
        else:
            self.stats.failed += 1
        said = "taken over by another process" if result.status == "taken_over" else result.status
        self.report(f"worker: {run_id} {said} (attempt {result.attempt}, {time.monotonic() - started:.1f}s)")
        if self.finished is not None:
            self.finished(result)

    def _reconnected(self, message: str) -> None:
        self.report(f"worker: {message}")

    def _bus(self, run_id: str) -> EventBus:
        def warn(event: Event) -> None:
            if event.event == "run.started" and event.run_id == run_id:  # leased: this worker runs it
                self.report(f"worker: running {run_id}")
            elif event.event == "log" and event.data.get("level") != "info":
                self.report(f"worker: {event.run_id}: {event.data.get('message')}")

        return EventBus([warn])
