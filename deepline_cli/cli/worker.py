"""`deepline worker`: run queued and due runs from a shared store."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Annotated

import typer

from deepline_cli.cli.common import StoreOption, at_least, cli_errors

if TYPE_CHECKING:
    from rich.console import Console

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

    report = reporter(sys.stderr)

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


def reporter(stream: IO[str], console: Console | None = None) -> Callable[[str], None]:
    """How the worker says a line: as it is in a log; on a terminal, wrapped at words, a
    verdict's commands never broken (as `deepline run` says them)."""
    from rich.console import Console
    from rich.text import Text

    from deepline_cli.ui.console import NEXT, next_lines

    shown = console or Console(file=stream, highlight=False, markup=False)

    def report(line: str) -> None:
        if not shown.is_terminal:
            stream.write(line + "\n")
            stream.flush()
            return
        inner = line.removeprefix("  ")  # a run's verdict, under the worker's own lines
        if inner.startswith(NEXT):
            for part in next_lines(inner, shown.width - 2):
                shown.print(Text("  " + part), soft_wrap=True)  # fitted; a command too wide is whole
        else:
            shown.print(Text(line), soft_wrap=False)  # wrapped at words

    return report
