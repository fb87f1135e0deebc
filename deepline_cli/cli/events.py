"""`deepline events send`: deliver an event a waiting run (or one of its children) awaits."""

from __future__ import annotations

from typing import Annotated

import typer

from deepline_cli.cli.common import Command, StoreOption, cli_errors

app = typer.Typer(help="Deliver events to waiting runs.", no_args_is_help=True)


@app.command("send", cls=Command)
@cli_errors
def send(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The waiting run, or its root run.")],
    event_id: Annotated[
        str, typer.Argument(metavar="EVENT_ID", help="The id the play waits for (ctx.wait_for_event).")
    ],
    payload: Annotated[str | None, typer.Option("--payload", metavar="JSON", help="The event's JSON payload.")] = None,
    store: StoreOption = None,
) -> None:
    """Deliver EVENT_ID to RUN_ID; `deepline resume RUN_ID` then continues it.

    \b
    Examples:
      deepline events send r-8f2c1a9b3e4d approved --payload '{"by": "ana"}'
      deepline events send r-8f2c1a9b3e4d approved && deepline resume r-8f2c1a9b3e4d
    """
    from deepline_cli.cli.inputs import parse_json_flag
    from deepline_cli.errors import UsageError
    from deepline_cli.runtime.run.holders import holder_alive
    from deepline_cli.runtime.run.suspension import event_takers, event_targets, timed_out_waits
    from deepline_cli.store import open_store

    value = parse_json_flag(payload, flag="--payload") if payload is not None else None
    db = open_store(store, existing=True)
    try:
        record = db.runs.get_run(run_id)
        if record is None:
            raise UsageError(f"No run {run_id!r} in the store {db.url}.")
        now = db.now()
        gone = record.status == "running" and not holder_alive(record, now)
        targets = event_targets(db, run_id, event_id, now)
        lapsed = [] if targets else timed_out_waits(db, run_id, event_id, now)
        own = db.suspension.boundaries(run_id)
        # Taken by the run or a descendant, and nothing waits for it now: a send again (a retry
        # the sender did not hear back from) is that one, not one for a later wait to take.
        takers = [] if targets or lapsed else event_takers(db, run_id, event_id)
        awaited = [b.event_id for b in own if b.kind == "event" and b.status == "waiting" and b.event_id]
        if not targets and record.status == "completed" and not takers:
            raise UsageError(f"Run {run_id} has completed; nothing in it waits for events any more.")
        # Not waiting for it yet: kept for the run, and found when it (or a child) waits for it.
        to = [] if takers else targets or [run_id]
        delivered = [t for t in to if db.suspension.send_event(t, event_id, value, now)]
        # A child play run inside its parent's process goes on when its root is resumed.
        inline_child = record.parent_run_id is not None and not record.scheduled
        resumed = (record.root_run_id or run_id) if inline_child else run_id
        if targets and delivered:
            for woken in {*delivered, run_id, resumed}:  # the run that waits, and the root a worker resumes
                db.queue.set_wake(woken, now)
            db.queue.notify()  # wake workers: the waiting run is due
    finally:
        db.close()
    if lapsed:
        typer.echo(
            f"Run {run_id}{_which(lapsed, run_id)} waited for {event_id!r} and timed out before it was sent; the play "
            "goes on without it, and a resume takes that way. The event is kept, but that wait will not take it.",
            err=True,
        )
        return
    if takers:
        later = (
            ", and has completed since: nothing in it waits for events any more"
            if record.status == "completed"
            else "; no wait of it is left to take this one (send it again once a later wait for it is reached)"
        )
        typer.echo(f"Run {run_id}{_which(takers, run_id)} took {event_id!r} already{later}.", err=True)
        return
    if not targets:
        kept = "the event is kept for when it does" if delivered else "an earlier one is kept (the first wins)"
        waits = f" (it waits for {', '.join(repr(e) for e in awaited)})" if awaited else ""
        if record.status in ("failed", "interrupted"):  # resumable: its resume may reach the wait
            kept += f": deepline resume {resumed}"
        typer.echo(f"Run {run_id} is not waiting for {event_id!r} yet{waits}; {kept}.", err=True)
        return
    for target in targets:
        where = "" if target == run_id else f" to child run {target}"
        if target in delivered:
            typer.echo(f"Delivered {event_id!r}{where}.", err=True)
        else:
            typer.echo(f"Event {event_id!r} was already delivered{where}; the first payload is kept.", err=True)
    of_root = f" (run {run_id} is a child play run inside it)" if resumed != run_id else ""
    if delivered and gone:  # killed while it waited inline
        typer.echo(f"Run {run_id}'s process is gone; continue it with: deepline resume {resumed}{of_root}", err=True)
    elif delivered and record.status == "running":  # waiting inline: that process takes it
        typer.echo(f"Run {run_id} is running: the process running it takes the event.", err=True)
    elif delivered and record.status == "waiting" and (record.scheduled or record.snapshot):
        # enqueued: a worker takes it up, woken by the event (one stopped is resumed by hand)
        typer.echo(
            f"A `deepline worker` on this store continues run {run_id} (or: deepline resume {run_id}).", err=True
        )
    elif delivered:
        typer.echo(f"Continue the run with: deepline resume {resumed}{of_root}", err=True)


def _which(runs: list[str], run_id: str) -> str:
    """Which run of the tree it was, when not `run_id` itself: " (child run ID)"."""
    return "" if runs[0] == run_id else f" (child run {runs[0]})"
