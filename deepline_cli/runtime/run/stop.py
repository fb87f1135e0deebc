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
from deepline_cli.store.records import RunRecord
from deepline_cli.store.roles import Store

DEFAULT_REASON = "stopped by user"
POLL_S = 0.2
ENDED = ("completed", "failed", "interrupted")


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
    """Stop the run, and its child runs that workers run apart from it (queued ones would
    still start and pay); with `wait_s`, until its process has recorded it `interrupted`
    (or the time is up: the record then still says `running`)."""
    stopped = _stop_one(store, run_id, reason, wait_s=wait_s, sleep=sleep, clock=clock)
    _stop_children(store, run_id, reason)
    return stopped


def _stop_children(store: Store, run_id: str, reason: str) -> None:
    """The run's scheduled child runs, and theirs, not ended yet: stopped as it was (a
    resume of the parent queues them again). A child that runs in its parent's process
    stops with the parent."""
    for child in store.runs.child_runs(run_id):
        if child.scheduled and child.status not in ENDED:
            with contextlib.suppress(UsageError):  # ended meanwhile
                _stop_one(store, child.run_id, f"its parent run {run_id} was stopped: {reason}")
        _stop_children(store, child.run_id, reason)


def _stop_one(
    store: Store,
    run_id: str,
    reason: str,
    *,
    wait_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Stopped:
    deadline = clock() + (wait_s or 0.0)
    asked: int | None = None
    first = True
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
        store.runs.interrupt_run(run_id, reason, attempt=record.attempt, status=record.status,
                            error=stop_error(reason), now=now, expect_expires=expect)  # fmt: skip


def _read(store: Store, run_id: str) -> RunRecord:
    record = store.runs.get_run(run_id)
    if record is None:
        raise UsageError(f"No run {run_id!r} in the store {store.url}.")
    return record
