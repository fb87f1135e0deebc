"""`deepline worker`: run queued and due runs from a shared store."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from deepline_cli.cli.common import StoreOption, at_least, cli_errors

if TYPE_CHECKING:
    from deepline_cli.runtime.run.options import RunResult


@cli_errors
def worker(
    store: StoreOption = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", metavar="N", parser=at_least(1), help="Runs executed at once.")
    ] = 1,
    once: Annotated[bool, typer.Option("--once", help="Run what is due now, then exit.")] = False,
    fetch_public_only: Annotated[
        bool,
        typer.Option(
            "--fetch-public-only",
            envvar="DEEPLINE_FETCH_PUBLIC_ONLY",
            help="ctx.fetch may reach public addresses only (no cloud metadata, private network or loopback).",
        ),
    ] = False,
    plays: Annotated[
        list[str] | None,
        typer.Option(
            "--play",
            metavar="FILE",
            help="A play file whose @play(schedule=...) this worker fires, or a deepline.toml with "
            "[schedules.NAME] tables (repeat for several).",
        ),
    ] = None,
) -> None:
    """Take queued runs (deepline run --enqueue), due timers, delivered events and runs whose
    holder died, and run them. SIGTERM drains: runs in progress are interrupted and re-queued.

    \b
    Examples:
      deepline worker --store postgresql://user@db.internal/deepline --concurrency 4
      deepline worker --once          # drain what is due on the default SQLite store
      deepline worker --play refresh.py   # and fire refresh.py's schedule: one run per tick
      deepline worker --play deepline.toml   # the [schedules.NAME] it declares
    """
    from deepline_cli.runtime.run.worker import Worker

    def report(line: str) -> None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    from deepline_cli.cli.common import fail
    from deepline_cli.errors import store_down
    from deepline_cli.runtime.run.schedules import scheduled_plays
    from deepline_cli.ui.verdict import verdict

    scheduled = [play for path in plays or [] for play in scheduled_plays(path)]

    def finished(result: RunResult) -> None:
        for line in verdict(
            result.run_id,
            "requeued" if result.requeued else result.status,
            {**result.stats, "waiting": result.waiting},
            result.error,
            result.play,
            result.trigger,
        ):
            report(f"  {line}")

    running = Worker(
        store, concurrency=concurrency, once=once, report=report, fetch_public_only=fetch_public_only,
        scheduled=scheduled, finished=finished,
    )  # fmt: skip
    stats = running.run()
    if running.failure is None or running.opened:  # else it never had the store: its error says it all
        report(
            f"worker: done — {stats.started} started, {stats.completed} completed, {stats.failed} failed, "
            f"{stats.waiting} waiting, {stats.requeued} re-queued"
            + (f", {stats.stopped} stopped" if stats.stopped else "")
            + (f", {stats.taken_over} taken over by another process" if stats.taken_over else "")
        )
    if running.failure is not None:  # a store it cannot use is exit 2; one that may be back, 1
        raise fail(
            f"the worker stopped: {running.failure}", 1 if store_down(running.failure) else running.failure.exit_code
        )
