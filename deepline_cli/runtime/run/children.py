"""Child plays: `ctx.run_play(id, play_ref, input)`.

A child is a run of its own (deterministic id, its own receipts, `parent_run_id` and
`root_run_id` recorded) executed inside its parent's process. Its finished output is a
receipt of the parent, so a resumed parent never runs a finished child again. A child
that suspends suspends its parent; a failed child raises in the parent.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from deepline_cli import _json
from deepline_cli.errors import DeeplineError, GovernanceError, InputError, PlayLoadError, RunInterrupted
from deepline_cli.runtime.calls.call_scope import current_cell
from deepline_cli.runtime.calls.receipts import DurableCall, RunTakenOver, receipt_key
from deepline_cli.runtime.run.body import execute_body
from deepline_cli.runtime.run.holders import holder_id
from deepline_cli.runtime.run.parts import Journal, RunParts
from deepline_cli.runtime.run.play import PlayDef, find_play_by_name, load_play
from deepline_cli.runtime.run.snapshot import child_root, code_changed, code_record, take_snapshot
from deepline_cli.runtime.run.stop import stopped_with_parent
from deepline_cli.store.records import CELL_KEYS, CODE, MADE_FOR, Boundary, RunRecord


class ChildPlayError(DeeplineError):
    """A child play failed; its error is in the message. A tool's own failure in it says
    so (`category`, `retryable`), as the parent's error: a resume retries it only with
    --refresh-failed."""

    counts_failed = True  # among the parent's failed calls; given back, a resume runs it again

    def __init__(self, message: str, child_error: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.child_error = child_error or {}

    def to_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            key: self.child_error[key] for key in ("category", "retryable", "tool") if key in self.child_error
        }
        return {"type": type(self).__name__, "message": str(self), **found}


def resolve_play_ref(play_ref: str, parent_file: str) -> PlayDef:
    """A play name (this module or one it imports), or `path.py[:function]` relative to
    the parent play's file."""
    if ".py" not in play_ref:
        found = find_play_by_name(play_ref)
        if found is None:
            raise PlayLoadError(f"No play named {play_ref!r} is loaded; use its name or 'path/to/file.py[:function]'.")
        return found
    return load_play(play_ref, base=Path(parent_file).parent)


def child_run_id(parent_run_id: str, call_id: str, play: PlayDef, input: Any) -> str:
    try:
        content = _json.canonical(input)
    except TypeError as exc:
        raise InputError(f"The input of child play {play.name!r} has no run id: {exc}.") from None
    return "r-" + _json.digest("child", parent_run_id, call_id, play.name, content)[:12]


class ChildRunner:
    """How a run runs the child plays its body starts (the `ChildPlays` port of `ctx`)."""

    async def run_play(
        self, parts: RunParts, id: str, play_ref: str, input: Any, description: str, journal: bool
    ) -> Any:
        return await run_play(parts, id, play_ref, input, description, journal)


CHILDREN = ChildRunner()


def child_failed(play: PlayDef, child_id: str, error: dict[str, Any] | None) -> ChildPlayError:
    """The child's failure as its parent sees it: its message, and where in the child's code."""
    error = error or {}
    where = f" ({error['where']})" if error.get("where") else ""
    message = f"Child play {play.name!r} (run {child_id}) failed: {error.get('message', 'unknown error')}{where}"
    return ChildPlayError(message, error)


def child_options(s: RunParts) -> dict[str, Any]:
    """The flags a child run is kept with: its parent's (but whole: Settings.for_child), and
    the map row it was made for, if any (its calls count for that row: a pilot's credits per
    row, the pace of its rows)."""
    options = {**s.settings.for_child().persisted, CELL_KEYS: True}
    cell = current_cell()
    if cell is not None:
        options[MADE_FOR] = {"map": cell.map, "row": cell.row_key}
    return options


async def run_play(s: RunParts, id: str, play_ref: str, input: Any, description: str = "", journal: bool = True) -> Any:
    if journal:
        s.effects.journal.reach(f"run_play:{id}", s.identity.run_id)
    play = resolve_play_ref(play_ref, s.identity.play_file)
    # Before the child exists: a refused input or a missing secret fails the call in its parent.
    play.check_input(input, subject=f"Child play {play.name!r} (run_play {id!r}): input")
    play.require_secrets(s.infra.secrets.lookup, s.infra.secrets.env_file)
    if play.name in s.identity.ancestors:
        cycle = " → ".join([*s.identity.ancestors[s.identity.ancestors.index(play.name) :], play.name])
        raise GovernanceError(f"Play cycle: {cycle} (a play cannot call one of its ancestors).")
    if s.identity.depth + 1 > s.effects.caps.max_depth:
        deepest = s.effects.caps.max_depth
        raise GovernanceError(
            f"Child play {play.name!r} would be {s.identity.depth + 1} calls deep; the limit is {deepest}."
        )
    key = receipt_key("run_play", s.identity.workspace, s.identity.run_id, id)
    call = DurableCall(key=key, kind="run_play", label=id, input=input)
    child_id = child_run_id(s.identity.run_id, id, play, input)

    async def invoke(_: Any) -> Any:
        if s.settings.schedule_children:
            return await _schedule_child(s, id, play, child_id, input, description)
        return await _execute_child(s, id, play, child_id, input, description)

    return (await s.effects.book.execute(call, invoke)).value


async def _schedule_child(s: RunParts, call_id: str, play: PlayDef, child_id: str, input: Any, description: str) -> Any:
    """Under workers: the child is its own queued run (any worker may take it); the parent
    waits at a child boundary until it has finished, then reads its result."""
    store, now = s.infra.io.store, s.infra.io.now()
    record = await s.infra.io.call(store.runs.get_run, child_id)
    if record is not None and not record.scheduled and record.status != "completed":
        # Begun in its parent's process by an earlier attempt (`deepline run`), not queued:
        # it goes on where it began, in the parent's attempt (no worker would take it).
        return await _execute_child(s, call_id, play, child_id, input, description)
    if record is None and s.effects.book.budgeted:
        # A credit budget is held in one process: the children of a budgeted run run here,
        # spending from it, not queued for workers that would each see the whole of it.
        return await _execute_child(s, call_id, play, child_id, input, description)
    if record is None:
        s.effects.caps.count_child_play()  # per run: children started by earlier attempts count too
        root = child_root(s.identity.play_file) if s.identity.play_file else None
        digest, snapshot = take_snapshot(play, Path(s.settings.config) if s.settings.config else None, root)
        record = RunRecord(
            run_id=child_id,
            play=play.name,
            play_ref=play.ref,
            input=input,
            status="queued",
            attempt=0,
            workspace=s.identity.workspace,
            cwd=s.identity.cwd,
            options=child_options(s),
            parent_run_id=s.identity.run_id,
            root_run_id=s.identity.root or s.identity.run_id,
            created_at=now,
            updated_at=now,
            scheduled=True,
            ancestors=list(s.identity.ancestors),
            description=description,
            snapshot=digest,
        )
        await s.infra.io.call(store.queue.put_snapshot, digest, snapshot)
        await s.infra.io.call(store.runs.insert_run, record)
        await s.infra.io.call(store.queue.notify)
    boundary_id = f"child:{call_id}"
    if record.status == "completed":
        await s.infra.io.call(store.suspension.resolve_boundary, s.identity.run_id, boundary_id, None, s.infra.io.now())
        return record.output
    if record.status == "failed":
        seen = record.failure_seen_by
        # A parent attempt that saw the failure and failed with it, then was resumed: someone
        # retried it, so the failed child gets one more go. Seen by an attempt that ended
        # otherwise (it waited for a sibling still running): reported again, not retried.
        retried = seen is not None and seen < s.identity.attempt
        if retried:
            retried = await s.infra.io.call(store.runs.attempt_status, s.identity.run_id, seen) == "failed"
        if not retried:
            # Report it (the parent fails, unless it catches this); remember which attempt saw
            # it. The parent waits at this boundary no more: a parent that caught the failure
            # and waits for something else is not woken for it again and again.
            await s.infra.io.call(store.runs.update_run, child_id, failure_seen_by=s.identity.attempt)
            await s.infra.io.call(store.suspension.resolve_boundary, s.identity.run_id, boundary_id, None, now)
            raise child_failed(play, child_id, record.error)
        await s.infra.io.call(store.runs.set_status, child_id, "queued", failure_seen_by=None, holder=None)
        await s.infra.io.call(store.queue.notify)
    if record.status == "interrupted" and stopped_with_parent(record.error):  # this resume runs it again
        await s.infra.io.call(store.runs.set_status, child_id, "queued", holder=None)
        await s.infra.io.call(store.queue.notify)
    boundary = await s.infra.io.call(
        store.suspension.put_boundary,
        Boundary(s.identity.run_id, boundary_id, "child", child_run_id=child_id, created_at=s.infra.io.now()),
    )
    raise s.effects.journal.suspend(boundary)


async def _execute_child(s: RunParts, call_id: str, play: PlayDef, child_id: str, input: Any, description: str) -> Any:
    store, now = s.infra.io.store, s.infra.io.now()
    record = await s.infra.io.call(store.runs.get_run, child_id)
    if record is None:
        s.effects.caps.count_child_play()
        record = RunRecord(
            run_id=child_id,
            play=play.name,
            play_ref=play.ref,
            input=s.infra.secrets.redact_json(input),  # its body is given the input itself, by its parent
            status="running",
            attempt=1,
            workspace=s.identity.workspace,
            cwd=s.identity.cwd,
            options={**child_options(s), CODE: code_record(play)},
            description=description,
            parent_run_id=s.identity.run_id,
            root_run_id=s.identity.root or s.identity.run_id,
            holder=holder_id(),  # the root's process runs its children
            lease_expires_at=now + s.identity.lease_ttl,
            created_at=now,
            updated_at=now,
        )
        await s.infra.io.call(store.runs.insert_run, record)
    elif record.status == "completed":  # finished meanwhile (its own resume): the parent's wait for it ends
        await s.infra.io.call(store.suspension.resolve_boundary, s.identity.run_id, f"child:{call_id}", None, now)
        return record.output
    else:
        record.attempt += 1
        await s.infra.io.call(
            store.runs.set_status,
            child_id,
            "running",
            attempt=record.attempt,
            holder=holder_id(),
            lease_expires_at=now + s.identity.lease_ttl,
            finished_at=None,
        )
    io = s.infra.io
    await io.call(store.runs.begin_attempt, child_id, record.attempt, holder_id(), now)
    journal = Journal(
        await io.call(store.suspension.journal, child_id),
        logged=await io.call(store.suspension.logged, child_id),
        strict=code_changed(play, record),
    )
    child = s.for_child(child_id, record.attempt, play.name, play.file, journal, play.tools())
    s.infra.bus.emit("child.started", s.identity.run_id, child_run_id=child_id, play=play.name, attempt=record.attempt)
    try:
        outcome = await execute_body(play, child, input, CHILDREN)
    except asyncio.CancelledError:  # its parent was stopped: the child stops with it, resumable
        await asyncio.shield(_interrupted(child))
        raise
    finally:
        s.effects.books.remove(child.effects.book)  # its calls are over: no more heartbeats for it
    # Interrupted with its parent (Ctrl-C, `runs stop`): resumed with it, not failed.
    status = "interrupted" if isinstance(outcome.raised, RunInterrupted) else outcome.status
    if isinstance(outcome.raised, RunTakenOver):  # the run is another process's: its children too
        await _taken_over(child)
    else:
        finished_at = s.infra.io.now() if outcome.status in ("completed", "failed") else None
        await _record_end(child, status, output=outcome.output, error=outcome.error, finished_at=finished_at)
    s.infra.bus.emit("child.finished", s.identity.run_id, child_run_id=child_id, status=outcome.status)
    if outcome.status == "waiting":
        boundary = await s.infra.io.call(
            store.suspension.put_boundary,
            Boundary(s.identity.run_id, f"child:{call_id}", "child", child_run_id=child_id, created_at=io.now()),
        )
        raise s.effects.journal.suspend(boundary)
    if outcome.raised is not None:
        s.effects.book.refusal_raised()  # a parent (or its row) that catches it keeps nothing
        raise outcome.raised  # interrupt, budget, lease…: the whole run stops
    if outcome.status == "failed":
        raise child_failed(play, child_id, outcome.error)
    await s.infra.io.call(
        store.suspension.resolve_boundary, s.identity.run_id, f"child:{call_id}", None, s.infra.io.now()
    )
    return outcome.output


async def _ended(child: RunParts, status: str) -> dict[str, Any]:
    """End the child's attempt; its figures, once its calls are recorded (the same ledger
    its parent's are counted from)."""
    io, run_id = child.infra.io, child.identity.run_id
    await child.effects.book.settle_all(0.0)
    await io.call(io.store.runs.end_attempt, run_id, child.identity.attempt, status, io.now())
    return await io.call(io.store.ledger.run_stats, run_id)


async def _interrupted(child: RunParts) -> None:
    await _record_end(child, "interrupted")


async def _record_end(child: RunParts, status: str, **fields: Any) -> None:
    """The child's end as this process's attempt of it saw it; if another process has taken
    the child since (this one paused past its lease), nothing of it: that attempt is theirs."""
    io = child.infra.io
    stats = await _ended(child, status)
    recorded = await io.call(io.store.runs.set_status, child.identity.run_id, status,
                             only_attempt=child.identity.attempt, stats=stats, holder=None, lease_expires_at=0.0,
                             **fields)  # fmt: skip
    if not recorded:
        await _taken_over(child)


async def _taken_over(child: RunParts) -> None:
    """Its attempt lived to hear another process has the child now (`runs show --full`):
    that attempt ends so, and nothing else of the child is written."""
    io = child.infra.io
    await child.effects.book.settle_all(0.0)
    await io.call(io.store.runs.end_attempt, child.identity.run_id, child.identity.attempt, "taken_over", io.now())
