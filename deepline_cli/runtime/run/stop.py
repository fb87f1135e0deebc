"""Stopping a run from any terminal or host (`deepline runs stop`), through the store.

A run a live process is executing is asked to stop: the reason is recorded on the run for
the attempt it was meant for, and that process hears it within a second (the attempt
polls for it) and stops as on Ctrl-C: no new calls, calls in flight finished and
recorded, the run `interrupted` with the reason. A run nobody is executing (queued,
waiting, or held by a process that died) is ended `interrupted` here. Either way
`deepline resume` continues it, and the new attempt starts with no stop request.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deepline_cli.errors import UsageError
from deepline_cli.runtime.run.holders import holder_alive
from deepline_cli.store.records import LogLine, RunRecord, Writes
from deepline_cli.store.roles import Store

DEFAULT_REASON = "stopped by user"
POLL_S = 0.2
ENDED = ("completed", "failed", "interrupted")


PARENT_STOPPED = "its parent run "  # how the reason of a child stopped with its parent starts


def stopped_with_parent(error: dict[str, Any] | None) -> bool:
    """Was the run interrupted because its parent was stopped (not stopped on its own)? Its
    reason says so, whoever recorded it: `runs stop`, a worker, or the attempt that heard it."""
    return error is not None and str(error.get("reason", "")).startswith(PARENT_STOPPED)


def stop_error(reason: str) -> dict[str, Any]:
    """The error a stopped run keeps (the same an attempt that heard the request records)."""
    return {"type": "RunInterrupted", "message": f"The run was stopped: {reason}.", "reason": reason}


@dataclass
class Stopped:
    """Where a stop left the run: `record` as last read; `asked`: its process was asked
    (rather than the run ended here); `attempt`: the attempt asked."""

    record: RunRecord
    asked: bool
    attempt: int


def stop_run(
    store: Store,
    run_id: str,
    reason: str = DEFAULT_REASON,
    *,
    wait_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Stopped:
    """Stop the run, and the child runs workers run apart from it (a queued one would still
    start and pay): the run is asked (or ended here), then its children, then, with
    `wait_s`, its process is waited for until it recorded the run `interrupted` (or the time
    is up: the record then still says `running`)."""
    try:
        stopped = _stop_one(store, run_id, reason, sleep=sleep, clock=clock)
    except UsageError:
        record = _read(store, run_id)
        if not _stop_children(store, record, reason):  # an ended run whose children still run
            raise
        return Stopped(record, False, record.attempt)
    _stop_children(store, stopped.record, reason)
    if stopped.asked and wait_s is not None:
        with contextlib.suppress(UsageError):  # it ended meanwhile: as asked
            stopped = _stop_one(store, run_id, reason, wait_s=wait_s, sleep=sleep, clock=clock, asked=stopped.attempt)
        stopped.record = _read(store, run_id)
    return stopped


def _stop_children(store: Store, record: RunRecord, reason: str) -> int:
    """The run's scheduled descendants not ended yet, stopped as it was (one read of the
    run's tree); how many. Their reasons say their parent was stopped, so the parent's resume
    queues them again. A child that runs in its parent's process stops with the parent."""
    run_id = record.run_id
    tree = store.runs.tree_runs(record.root_run_id or run_id)
    children: dict[str, list[RunRecord]] = {}
    for run in tree:
        if run.parent_run_id:
            children.setdefault(run.parent_run_id, []).append(run)
    stopped, below = 0, list(children.get(run_id, []))
    while below:
        child = below.pop()
        below.extend(children.get(child.run_id, []))
        if child.scheduled and child.status not in ENDED:
            with contextlib.suppress(UsageError):  # ended meanwhile
                _stop_one(store, child.run_id, f"{PARENT_STOPPED}{run_id} was stopped: {reason}")
                stopped += 1
    return stopped


def _stop_one(
    store: Store,
    run_id: str,
    reason: str,
    *,
    wait_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    asked: int | None = None,
) -> Stopped:
    """Ask the run's process to stop (`asked`: it was, that attempt), or end the run here if
    nobody executes it; with `wait_s`, wait for it to end."""
    deadline = clock() + (wait_s or 0.0)
    first = asked is None
    while True:
        record = _read(store, run_id)
        if record.status in ENDED or (asked is not None and record.attempt != asked):
            if first:
                raise UsageError(f"Run {run_id} already {record.status}; nothing to stop.")
            return Stopped(record, asked is not None, asked or record.attempt)  # ended, or a later attempt runs
        first = False
        if record.parent_run_id and not record.scheduled:
            root = record.root_run_id or record.parent_run_id
            raise UsageError(f"Run {run_id} is a child play run inside its parent's process; stop its root run {root}.")
        now = store.now()
        if record.status == "running" and holder_alive(record, now):
            if asked is None:
                if not store.runs.ask_stop(run_id, reason, attempt=record.attempt):
                    continue  # it moved on meanwhile (a new attempt, suspended, ended): look again
                asked = record.attempt
            if wait_s is None or clock() >= deadline:
                return Stopped(record, True, asked)
            sleep(POLL_S)
            continue
        # Nobody executes it (or its process died, or it suspended before it heard): end it here.
        expect = (record.lease_expires_at or 0.0) if record.status == "running" else None
        if store.runs.interrupt_run(run_id, reason, attempt=record.attempt, status=record.status,
                                    error=stop_error(reason), now=now, expect_expires=expect):  # fmt: skip
            was = "running, its process gone" if record.status == "running" else record.status
            line = LogLine(run_id, record.attempt, time.time(), "warning",
                           f"stop requested ({reason}): the run was {was}; it ends here",
                           kind="run.interrupted", fields={"reason": reason})  # fmt: skip
            store.receipts.apply(Writes(logs=[line]), now)
            if record.status == "running":  # its process died: the calls it held are given up now
                store.receipts.expire_run_receipts(run_id, before_attempt=record.attempt + 1)


def _read(store: Store, run_id: str) -> RunRecord:
    record = store.runs.get_run(run_id)
    if record is None:
        raise UsageError(f"No run {run_id!r} in the store {store.url}.")
    return record
