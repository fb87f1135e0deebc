"""`deepline run` and `deepline resume`."""

from __future__ import annotations

import contextlib
import errno
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from deepline_cli.cli.common import JsonOption, Settings, StoreOption, at_least, cli_errors

if TYPE_CHECKING:
    from deepline_cli.runtime.run.options import RunOptions, RunResult
    from deepline_cli.runtime.run.runner import Runner

QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")]
ConcurrencyOption = Annotated[
    int | None,
    typer.Option("--concurrency", metavar="N", parser=at_least(1), help="Most tool calls in flight at once."),
]
RefreshFailedOption = Annotated[
    bool, typer.Option("--refresh-failed", help="Retry calls whose receipts failed for good.")
]
ForceRefreshOption = Annotated[
    bool, typer.Option("--force-refresh", help="Execute every tool call again (new paid calls).")
]
MaxCreditsOption = Annotated[
    float | None,
    typer.Option(
        "--max-credits",
        metavar="N",
        parser=at_least(0, number=float),
        help="Stop before the run's credits would exceed N (resume with more); overrides the play's "
        "max_credits_per_run.",
    ),
]
MaxInlineWaitOption = Annotated[
    float,
    typer.Option(
        "--max-inline-wait",
        metavar="SECONDS",
        parser=at_least(0, number=float),
        help="Longer waits suspend the run (exit 3) instead.",
    ),
]
FailOnRowErrorsOption = Annotated[
    bool, typer.Option("--fail-on-row-errors", help="Exit 1 when a map isolated failed rows (for CI).")
]
MaxDepthOption = Annotated[
    int, typer.Option("--max-depth", metavar="N", parser=at_least(1), help="Deepest chain of child plays.")
]
MaxChildPlaysOption = Annotated[
    int | None,
    typer.Option(
        "--max-child-plays", metavar="N", parser=at_least(0), help="Most child plays one run may start (all attempts)."
    ),
]
MaxToolCallsOption = Annotated[
    int | None,
    typer.Option(
        "--max-tool-calls", metavar="N", parser=at_least(0), help="Most tool calls one run may make (all attempts)."
    ),
]


def _workspace(name: str) -> str:
    """A workspace is part of every receipt key: an empty one (an unset variable) or one
    with spaces around it would be a workspace of its own, and every call paid again."""
    if not name.strip():
        raise typer.BadParameter(f"{name!r} is empty (an unset variable?): give a name, or leave it out for 'default'.")
    if name != name.strip():
        raise typer.BadParameter(f"{name!r} has spaces around it: a workspace of its own; give {name.strip()!r}.")
    return name


WorkspaceOption = Annotated[
    str,
    typer.Option(
        "--workspace",
        metavar="NAME",
        envvar="DEEPLINE_WORKSPACE",
        show_envvar=True,
        callback=_workspace,
        help="Workspace: part of every receipt key.",
    ),
]

# What the play gets as input, and its config: `run` and `plan` take them alike.
InputOption = Annotated[str | None, typer.Option("--input", metavar="JSON|@FILE", help="Input JSON, or @file.json.")]
CsvOption = Annotated[
    Path | None, typer.Option("--csv", metavar="FILE", help="A CSV file; the play gets its path as input['csv'].")
]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", metavar="KEY=VALUE", help="Set an input key: a.b=value (JSON values parse)."),
]
PlayConfigOption = Annotated[
    Path | None,
    typer.Option("--config", metavar="FILE", help="deepline.toml to use [default: the one next to the play]."),
]

RUN_EPILOG = """\b
Examples:
  deepline run examples/hello/play.py
  deepline run play.py --csv leads.csv --set tier=gold
  deepline run plays.py:lead_emails --input '{"limit": 10}' --json
  deepline run play.py --run-id nightly-2026-12-02   # idempotent CI rerun
"""


@cli_errors
def run(
    context: typer.Context,
    play: Annotated[str, typer.Argument(metavar="PLAY", help="The play: PATH.py or PATH.py:FUNCTION.")],
    input: InputOption = None,
    csv: CsvOption = None,
    set_: SetOption = None,
    run_id: Annotated[
        str | None,
        typer.Option("--run-id", metavar="RUN_ID", help="Run id; an existing run is reported or resumed, not re-run."),
    ] = None,
    store: StoreOption = None,
    config: PlayConfigOption = None,
    workspace: WorkspaceOption = "default",
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit", metavar="N", parser=at_least(1), help="Pilot run: only the first N distinct rows of each map."
        ),
    ] = None,
    concurrency: ConcurrencyOption = None,
    force_refresh: ForceRefreshOption = False,
    refresh_failed: RefreshFailedOption = False,
    max_credits: MaxCreditsOption = None,
    max_inline_wait: MaxInlineWaitOption = 30.0,
    max_depth: MaxDepthOption = 8,
    max_child_plays: MaxChildPlaysOption = None,
    max_tool_calls: MaxToolCallsOption = None,
    fail_on_row_errors: FailOnRowErrorsOption = False,
    enqueue: Annotated[
        bool, typer.Option("--enqueue", help="Only record the run (with its play's source) for `deepline worker`.")
    ] = False,
    json: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Run a play. Every tool call goes through a durable receipt."""
    from deepline_cli.cli.inputs import build_input
    from deepline_cli.runtime.run.options import RunOptions

    cwd = Path.cwd()
    payload = build_input(input, csv, set_ or [], cwd=cwd)
    options = RunOptions(
        store=store,
        workspace=workspace,
        run_id=run_id,
        concurrency=concurrency,
        limit=limit,
        force_refresh=force_refresh,
        refresh_failed=refresh_failed,
        fail_on_row_errors=fail_on_row_errors,
        max_credits=max_credits,
        config=str(config) if config else None,
        max_inline_wait=max_inline_wait,
        max_depth=max_depth,
        max_child_plays=max_child_plays,
        max_tool_calls=max_tool_calls,
        given=given_flags(context),
    )
    execute(options, lambda runner: runner.start(play, payload, cwd=str(cwd), enqueue=enqueue), json, quiet)


@cli_errors
def resume(
    context: typer.Context,
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The run to continue.")],
    store: StoreOption = None,
    concurrency: ConcurrencyOption = None,
    force_refresh: ForceRefreshOption = False,
    refresh_failed: RefreshFailedOption = False,
    max_credits: MaxCreditsOption = None,
    max_inline_wait: MaxInlineWaitOption = 30.0,
    max_depth: MaxDepthOption = 8,
    max_child_plays: MaxChildPlaysOption = None,
    max_tool_calls: MaxToolCallsOption = None,
    fail_on_row_errors: FailOnRowErrorsOption = False,
    json: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Continue a run where it stopped; finished work replays from receipts.

    \b
    Examples:
      deepline resume r-8f2c1a9b3e4d
      deepline resume r-8f2c1a9b3e4d --refresh-failed --json
    """
    from deepline_cli.runtime.run.options import RunOptions

    options = RunOptions(
        store=store,
        concurrency=concurrency,
        force_refresh=force_refresh,
        refresh_failed=refresh_failed,
        fail_on_row_errors=fail_on_row_errors,
        max_credits=max_credits,
        max_inline_wait=max_inline_wait,
        max_depth=max_depth,
        max_child_plays=max_child_plays,
        max_tool_calls=max_tool_calls,
        given=given_flags(context),
    )
    root: list[str] = []

    def action(runner: Runner) -> RunResult:
        result = runner.resume(run_id)
        root.extend(runner.root_going_on(run_id))
        return result

    def report(result: RunResult, json_mode: bool, view: Any) -> None:
        report_run(result, json_mode, view)
        if root:  # resumed alone, it does not take its parent on: said, or the parent waits on unseen
            sys.stderr.write(
                f"Run {run_id} is a child play run inside run {root[0]}, which goes on with it: "
                f"deepline resume {root[0]}\n"
            )

    execute(options, action, json, quiet, report)


def given_flags(context: typer.Context) -> frozenset[str]:
    """The command's options given on its command line or by their environment variable
    (`resume --max-inline-wait 30` is given, though 30 is the default)."""
    sources = {name: context.get_parameter_source(name) for name in context.params}
    return frozenset(name for name, source in sources.items() if source is not None and "DEFAULT" not in source.name)


def execute(
    options: RunOptions,
    action: Callable[[Runner], RunResult],
    json_mode: bool,
    quiet: bool,
    report: Callable[[RunResult, bool, Any], None] | None = None,
) -> None:
    """Run `action` with the right view attached, print the outcome (`report`), exit with its code."""
    from deepline_cli.runtime.calls.events import EventBus
    from deepline_cli.runtime.run.runner import Runner
    from deepline_cli.ui.streams import own_stdout

    view = _view(json_mode, quiet)
    finished = threading.Event()

    def on_event(event: Any) -> None:
        if event.event == "run.finished":
            finished.set()

    # Under --json, one `tool.call` event per durable call, as the NDJSON contract lists. The
    # outcome is known before anyone can read it: `finished` hears run.finished first.
    bus = EventBus([on_event, *([view.handle] if view is not None else [])], per_call=json_mode)
    runner = Runner(options, bus)
    runner.before_recording = lambda: _hand_signals_to(runner, finished)
    if view is not None:
        view.on_closed = runner.request_stop  # `--json | head -1`, `2>&1 | head`: interrupt, resumable
    try:
        # stdout is the run's own (NDJSON under --json, else its output at the end): what the
        # play and its tools print goes to stderr, beside the live view.
        with own_stdout() as stdout:
            if json_mode:
                view.stream = stdout
            if view is None:
                result = action(runner)
            else:
                with view:
                    result = action(runner)
    finally:
        if json_mode:
            view.stream = sys.stdout
        runner.close()
        finished.set()
    # The outcome is decided: a late Ctrl-C or SIGTERM changes nothing (`on_signal` ignores
    # them already), and ignoring them outright keeps it so while the interpreter shuts
    # down, when Python puts the default action (death by the signal) back.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    for failure in bus.failures:  # a view that failed (its listener was dropped): said, not hidden
        sys.stderr.write(f"Warning: the run's view stopped: {type(failure).__name__}: {failure}.\n")
    (report or report_run)(result, json_mode, view)
    if result.reported and result.status == "completed":
        _not_applied(result.run_id, options)
    raise typer.Exit(result.exit_code)


def _print_output(result: RunResult) -> None:
    """The completed run's output on stdout; where stdout is closed or cannot be written, it
    is said where to read it (the run completed: its output is stored)."""
    from deepline_cli import _json

    try:
        if sys.stdout is None:
            raise OSError(errno.EBADF, "stdout is closed")
        sys.stdout.write(_json.dumps_str(result.output) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        closed = exc.errno == errno.EBADF  # `>&-`: nobody asked for it
        with contextlib.suppress(OSError, ValueError, AttributeError):  # stderr closed too (`2>&-`)
            sys.stderr.write(
                f"{'Warning' if closed else 'Error'}: the run's output could not be written ({exc.strerror or exc}); "
                f"it is stored: deepline runs show {result.run_id} --json\n"
            )
        if not closed:  # `> out.json && upload out.json` must not go on with an empty file
            raise typer.Exit(1) from None


def _not_applied(run_id: str, options: RunOptions) -> None:
    """A refresh or a budget asked of a run that completed already: nothing ran, and it says
    so (and how the failed or stale rows are asked again), instead of dropping the flag
    without a word."""
    for flag, given in (("--refresh-failed", options.refresh_failed), ("--force-refresh", options.force_refresh)):
        if given:
            sys.stderr.write(
                f"Warning: {flag} did not apply: run {run_id} already completed, and a completed run is not run "
                f"again. To ask again, start a new run of the play with {flag} (without --run-id): its receipts "
                "answer everything else.\n"
            )
    if options.max_credits is not None:
        sys.stderr.write(
            f"Warning: --max-credits did not apply: run {run_id} already completed; nothing was run again, nor spent.\n"
        )


def _hand_signals_to(runner: Runner, finished: threading.Event) -> None:
    """From just before the run is recorded, Ctrl-C or SIGTERM asks the runner to stop:
    the run ends `interrupted`, recorded and resumable (or, if the request came before the
    record was written, is not created: exit 130). While the play runs, the attempt hears
    signals itself. Once `run.finished` is out, the outcome is decided and a late signal
    changes nothing (the process ends with the run's exit code). Nothing is ever raised
    into the runtime's work, where it could be lost."""

    def on_signal(signum: int, frame: Any) -> None:
        if not finished.is_set():
            runner.request_stop()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)


def _view(json_mode: bool, quiet: bool) -> Any:
    if json_mode:
        from deepline_cli.ui.ndjson import NdjsonView

        return NdjsonView()
    if quiet:
        return None
    from deepline_cli.ui.console import ConsoleView

    return ConsoleView()


def report_run(result: RunResult, json_mode: bool, view: Any) -> None:
    """After the run: the output on stdout; for a person, how it ended (the live view
    says it itself when it ran the attempt)."""
    from deepline_cli.ui.verdict import verdict

    err = sys.stderr
    if result.status == "queued":
        if json_mode:
            view.write({"event": "run.queued", "run_id": result.run_id, "ts": time.time()})
            if view.said_unwritten(result.run_id, result.status):  # its id, the one output, is lost
                raise typer.Exit(1)
        else:
            sys.stdout.write(result.run_id + "\n")
            queued = f"Run {result.run_id} is already queued" if result.reported else f"Queued run {result.run_id}"
            err.write(f"{queued}; a `deepline worker` on this store will run it.\n")
        return
    if json_mode:
        if result.reported:
            view.write(
                {
                    "event": "run.finished",
                    "run_id": result.run_id,
                    "ts": result.finished_at,
                    "reported": True,
                    **result.finished_event(),
                }
            )
        if view.said_unwritten(result.run_id, result.status):  # `> out.ndjson && upload` must not go on
            raise typer.Exit(1)
        if result.status in ("failed", "interrupted", "taken_over"):
            # The NDJSON says it; a CI log shows stderr (a job's timeout, its SIGTERM, included): there too.
            err.write("\n".join(verdict(result.run_id, result.status, result.stats, result.error, play=result.play)))
            err.write("\n")
        elif result.status == "completed" and result.exit_code == 1:
            err.write(_failed_rows(result))
        return
    if result.status == "completed":
        _print_output(result)
    if result.status == "failed" and Settings.debug and (result.error or {}).get("traceback"):
        err.write(result.error["traceback"])  # type: ignore[index]
    if result.reported and result.status == "completed":
        err.write(f"Run {result.run_id} already completed (attempt {result.attempt}); not running it again.\n")
    if view is None or result.reported:  # --quiet, or nothing ran: no live view said how it ended
        stats = {**result.stats, "waiting": result.waiting}
        lines = verdict(result.run_id, result.status, stats, result.error, play=result.play)
        err.write("\n".join(lines[:1] if view is None and result.status == "completed" else lines) + "\n")
    if result.status == "completed" and result.exit_code == 1:
        err.write(_failed_rows(result))


def _failed_rows(result: RunResult) -> str:
    """Why a completed run exits 1 (under --json too: a CI log shows stderr)."""
    return f"Run {result.run_id} completed with {result.failed_rows} failed row(s) (--fail-on-row-errors).\n"
