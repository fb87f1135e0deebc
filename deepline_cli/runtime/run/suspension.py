"""Suspension: durable timers and events. A run that must wait ends its process as
`waiting` (exit 3) and continues on `deepline resume` (or a worker) when it is due."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from deepline_cli.errors import DeeplineError
from deepline_cli.store.records import Boundary, RunRecord
from deepline_cli.store.roles import Store

if TYPE_CHECKING:
    from deepline_cli.runtime.run.parts import RunParts

EVENT_POLL_S = 0.25
# A run waiting on child plays queued for workers is resumed once every one of them has ended,
# or this long after the first of them ended while others go on: not once per child, each
# resume replaying the whole map (a map of 150 children made 151 attempts).
GATHER_S = 5.0
SAID_WAIT_S = 0.5  # an inline wait this long is said (a run that only waits looks hung otherwise)


class EventTimeoutError(DeeplineError):
    """An awaited event did not arrive in time."""


def _warn_if_again(s: RunParts, boundary_id: str, call: str, what: str, example: str) -> None:
    """An id names one timer or event: reached a second time by the play's body (a loop), it
    is the one already passed, at once and silently, which is seldom what the play meant."""
    if s.effects.journal.reached.get(boundary_id, 0) == 2:
        s.log(
            f"{call} was reached again: an id names one {what}, and this one has already passed, so it does not "
            f'wait again; give each its own id (f"{example}").',
            level="warning",
        )


async def sleep(s: RunParts, id: str, seconds: float) -> None:
    """Wait until a wake-up time stored on first reach; long waits suspend the run."""
    boundary_id = f"sleep:{id}"
    s.effects.journal.reach(boundary_id, s.identity.run_id)
    _warn_if_again(s, boundary_id, f"ctx.sleep({id!r})", "timer", f"{id}-{{i}}")
    now = s.infra.io.now()
    boundary = await s.infra.io.call(
        s.infra.io.store.suspension.put_boundary,
        Boundary(s.identity.run_id, boundary_id, "sleep", due_at=now + max(0.0, seconds), created_at=now),
    )
    if boundary.status == "resolved":
        return
    remaining = (boundary.due_at or now) - now
    if remaining > s.settings.max_inline_wait:
        raise s.effects.journal.suspend(boundary)
    if remaining > 0:
        _say_wait(s, f"timer {id!r}", remaining, boundary.due_at)
        await _wait(s, remaining)
    await s.infra.io.call(
        s.infra.io.store.suspension.resolve_boundary, s.identity.run_id, boundary_id, None, s.infra.io.now()
    )


async def wait_for_event(s: RunParts, id: str, timeout_s: float | None) -> Any:
    """The payload `deepline events send RUN_ID EVENT_ID` delivers; suspends until then."""
    boundary_id = f"event:{id}"
    run_id = s.identity.run_id
    s.effects.journal.reach(boundary_id, run_id)
    _warn_if_again(s, boundary_id, f"ctx.wait_for_event({id!r})", "event", f"{id}-{{i}}")
    now = s.infra.io.now()
    due = now + timeout_s if timeout_s is not None else None
    boundary = await s.infra.io.call(
        s.infra.io.store.suspension.put_boundary,
        Boundary(run_id, boundary_id, "event", due_at=due, event_id=id, created_at=now),
    )
    if boundary.status == "resolved":
        return boundary.payload
    if boundary.status == "timed_out":  # as it did the first time: the play went on without it
        raise _timed_out(id, boundary, run_id)
    said = False
    while True:
        delivered, payload = await s.infra.io.call(
            _event_for, s.infra.io.store, run_id, s.identity.root, id, boundary.due_at
        )
        if delivered:
            await s.infra.io.call(
                s.infra.io.store.suspension.resolve_boundary, run_id, boundary_id, payload, s.infra.io.now()
            )
            return payload
        now = s.infra.io.now()
        if boundary.due_at is not None and now >= boundary.due_at:
            # Recorded, so every replay takes the same way (an event sent later waits for nothing).
            await s.infra.io.call(
                s.infra.io.store.suspension.resolve_boundary, run_id, boundary_id, None, now, "timed_out"
            )
            raise _timed_out(id, boundary, run_id)
        if boundary.due_at is None or boundary.due_at - now > s.settings.max_inline_wait:
            raise s.effects.journal.suspend(boundary)
        if not said:
            said = True
            _say_wait(s, f"event {id!r} (deepline events send {run_id} {id})", boundary.due_at - now, boundary.due_at)
        await _wait(s, min(EVENT_POLL_S, boundary.due_at - now))


def _say_wait(s: RunParts, what: str, seconds: float, due_at: float | None) -> None:
    """A wait in this process long enough to be seen: said, with when it ends."""
    if seconds >= SAID_WAIT_S and due_at is not None:
        until = time.strftime("%H:%M:%S", time.localtime(due_at))
        s.log(f"waiting for {what} in this process: {seconds:.0f}s, until {until}")


def _timed_out(id: str, boundary: Boundary, run_id: str) -> EventTimeoutError:
    waited = (boundary.due_at or 0.0) - (boundary.created_at or 0.0)
    return EventTimeoutError(f"Event {id!r} did not arrive within {waited:g}s (run {run_id}).")


async def _wait(s: RunParts, seconds: float) -> None:
    """A wait in this process, cut short when the run stops (Ctrl-C, `runs stop`): nothing
    is out to finish, so the stop need not wait for it (it raises why the run stopped)."""
    book = s.effects.book
    await book.pause(seconds)
    book.check_open()


def _event_for(store: Store, run_id: str, root_run_id: str, event_id: str, due_at: float | None) -> tuple[bool, Any]:
    """An event delivered to this run, or sent to its root before anything waited for it;
    either in time for the wait's deadline (one sent later finds the wait timed out, as it
    would have if the run had been running then)."""
    delivered, payload = store.suspension.get_event(run_id, event_id, due_at)
    # Not one the root waits for itself (a manager's approval of the root is not its
    # children's, which wait for the same name later): only one sent for its children.
    if (
        not delivered
        and root_run_id
        and root_run_id != run_id
        and store.suspension.get_boundary(root_run_id, f"event:{event_id}") is None
    ):
        return store.suspension.get_event(root_run_id, event_id, due_at)
    return delivered, payload


def is_ready(boundary: Boundary, now: float, max_inline_wait: float, delivered: bool) -> bool:
    """Would resuming now get past this boundary (or at least reach it again in time)?"""
    if boundary.status in ("resolved", "timed_out"):
        return True
    if boundary.kind == "sleep":
        return (boundary.due_at or 0.0) - now <= max_inline_wait
    if boundary.kind == "event":
        timed_out = boundary.due_at is not None and boundary.due_at - now <= max_inline_wait
        return delivered or timed_out
    return False  # child boundaries: ready when the child is (checked by the caller)


def waiting_on(store: Store, run_id: str) -> list[dict[str, Any]]:
    """The boundaries a waiting run (and its waiting children) wait at, innermost included."""
    found: list[dict[str, Any]] = []
    for b in store.suspension.boundaries(run_id):
        if b.status != "waiting":
            continue
        found.append(
            {
                "run_id": b.run_id,
                "id": b.id,
                "kind": b.kind,
                "due_at": b.due_at,
                "event_id": b.event_id,
                "child_run_id": b.child_run_id,
            }
        )
        if b.kind == "child" and b.child_run_id:
            found.extend(waiting_on(store, b.child_run_id))
    return found


def next_wake(store: Store, run_id: str, root_run_id: str, now: float, max_inline_wait: float) -> float | None:
    """When a resume of this waiting run may get further: now, if a boundary is already
    passable (an event came, a scheduled child ended); else the earliest time one comes due
    by itself (a timer, an event's timeout), less the wait a resume sleeps inline; None
    while only an event or a child can wake it (they set it when they do)."""
    times = []
    scheduled = _Gathered()
    for b in store.suspension.boundaries(run_id):
        if b.status != "waiting":
            continue
        if b.kind == "event" and _event_for(store, run_id, root_run_id, b.event_id or "", b.due_at)[0]:
            times.append(now)
        elif b.kind in ("sleep", "event") and b.due_at is not None:
            times.append(b.due_at - max_inline_wait)
        elif b.kind == "child" and b.child_run_id:
            child = store.runs.get_run(b.child_run_id)
            if child is not None and child.scheduled:
                scheduled.add(child)
            elif child is not None:
                wake = next_wake(store, child.run_id, root_run_id, now, max_inline_wait)
                times.extend([wake] if wake is not None else [])
    gathered = scheduled.due(now)
    times.extend([gathered] if gathered is not None else [])
    return min(times) if times else None


class _Gathered:
    """The scheduled children a waiting run waits for: when their results make it due."""

    def __init__(self) -> None:
        self.ended: list[float] = []  # when each child that ended, ended
        self.going = False  # a child still queued, running or waiting

    def add(self, child: RunRecord) -> None:
        if child.status in ("completed", "failed"):
            self.ended.append(child.finished_at or child.updated_at)
        else:
            self.going = True

    def due(self, now: float) -> float | None:
        """Now once every child ended; GATHER_S after the first ended while others go on;
        None while none has ended."""
        if not self.ended:
            return None
        return now if not self.going else min(self.ended) + GATHER_S


def ready_to_resume(store: Store, run_id: str, now: float, max_inline_wait: float) -> bool:
    """Would a resume now get anywhere? False while every boundary still waits."""
    pending = [b for b in store.suspension.boundaries(run_id) if b.status == "waiting"]
    if not pending:
        return True
    scheduled = _Gathered()  # children run by workers of their own
    for b in pending:
        if b.kind == "child" and b.child_run_id:
            child = store.runs.get_run(b.child_run_id)
            if child is not None and child.scheduled:
                scheduled.add(child)
            elif ready_to_resume(store, b.child_run_id, now, max_inline_wait):
                return True
        elif is_ready(b, now, max_inline_wait, store.suspension.get_event(run_id, b.event_id or "", b.due_at)[0]):
            return True
    due = scheduled.due(now)
    return due is not None and due <= now


def timed_out_waits(store: Store, run_id: str, event_id: str, now: float) -> list[str]:
    """Every run, this one or a descendant, whose wait for `event_id` timed out, or whose
    deadline passed while it was not running (its resume will time it out)."""
    return _waits_for(store, run_id, event_id, lambda b: b.status == "timed_out" or _lapsed(b, now))


def event_takers(store: Store, run_id: str, event_id: str) -> list[str]:
    """Every run, this one or a descendant, whose wait for `event_id` took an event."""
    return _waits_for(store, run_id, event_id, lambda b: b.status == "resolved")


def event_targets(store: Store, run_id: str, event_id: str, now: float) -> list[str]:
    """Every run, this one or a descendant, that has reached `wait_for_event(event_id)`
    and not yet got past it, its deadline (if any) not passed."""
    return _waits_for(store, run_id, event_id, lambda b: b.status == "waiting" and not _lapsed(b, now))


def _lapsed(boundary: Boundary, now: float) -> bool:
    return boundary.status == "waiting" and boundary.due_at is not None and boundary.due_at < now


def _waits_for(store: Store, run_id: str, event_id: str, wanted: Callable[[Boundary], bool]) -> list[str]:
    found = [
        run_id
        for b in store.suspension.boundaries(run_id)
        if b.kind == "event" and b.event_id == event_id and wanted(b)
    ]
    for child in store.runs.child_runs(run_id):
        found.extend(_waits_for(store, child.run_id, event_id, wanted))
    return found
