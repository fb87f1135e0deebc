"""Executing a play body once, for a run or a child run, and naming how it ended."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from deepline_cli import _json
from deepline_cli.errors import BudgetExceededError, DeeplineError, InputError, RunInterrupted, UsageError, error_dict
from deepline_cli.runtime.calls.suspended import Suspended
from deepline_cli.runtime.map import failures
from deepline_cli.runtime.run.context import ChildPlays, Context
from deepline_cli.runtime.run.parts import RunParts
from deepline_cli.runtime.run.play import PlayDef
from deepline_cli.runtime.run.play_input import play_input


@dataclass
class BodyOutcome:
    status: str  # completed | failed | waiting
    output: Any = None
    error: dict[str, Any] | None = None
    raised: BaseException | None = None  # what must stop the whole run, not just this play


async def execute_body(play: PlayDef, s: RunParts, input: Any, children: ChildPlays) -> BodyOutcome:
    """Run the play's body once with a fresh `ctx`; `children` runs the child plays it starts."""
    try:
        given = play_input(input, child=s.identity.depth > 0, trigger=s.settings.trigger)
        ctx = Context(s, children, given)
        value = await play.fn(ctx, given)
        ctx.check_waits(ended=True)  # a sleep or wait never awaited: the run did not wait
    except Suspended:
        await _flush_journal(s)
        return BodyOutcome("waiting")
    except (Exception, SystemExit) as exc:  # `sys.exit(message)` in play code: a failure like any
        await _flush_journal(s)
        # When the circuit breaker tripped, its reason is the run's error, not the next
        # claim that failed after it.
        failure = s.effects.book.tripped or exc
        stop = (
            failure
            if isinstance(failure, RunInterrupted) or (isinstance(failure, DeeplineError) and failure.fatal)
            else None
        )
        if stop is None and s.effects.journal.waits:  # a wait the play caught: it still waits
            return BodyOutcome("waiting")
        return BodyOutcome("failed", error=describe(failure, s, play.file), raised=stop)
    await _flush_journal(s)
    tripped = s.effects.book.tripped
    if tripped is not None and (s.effects.book.refused or not isinstance(tripped, BudgetExceededError)):
        # The run stopped while the body ran: a refusal it met may have been caught, and its
        # value made of it. A budget other runs' calls spent leaves a child that met none whole.
        return BodyOutcome("failed", error=describe(tripped, s, play.file), raised=tripped)
    if s.effects.journal.waits:
        # The play caught a Suspended (`asyncio.gather(..., return_exceptions=True)` over
        # children that wait): what it returned holds no results yet. The run waits for them
        # all, and a resume gives the play their results.
        return BodyOutcome("waiting")
    if inspect.iscoroutine(value):  # `return ctx.map(...)`: nothing it names ever ran
        value.close()  # said here, not again as Python's "never awaited" warning
        missing = UsageError(
            f"The play returned {value.__qualname__}() without awaiting it, so it never ran: write `return await …`."
        )
        return BodyOutcome("failed", error=describe(missing, s, play.file))
    try:
        output = _json.plain(value, "The play's return value")
    except DeeplineError as exc:  # no JSON form: an object, a coroutine in a dict
        _close_coroutines(value)
        return BodyOutcome("failed", error=describe(exc, s, play.file))
    return BodyOutcome("completed", output=s.infra.secrets.redact_json(output))


def _close_coroutines(value: Any) -> None:
    """Coroutines an output holds (an `await` missing): closed, their error said once."""
    if inspect.iscoroutine(value):
        value.close()
    elif isinstance(value, dict):
        for item in value.values():
            _close_coroutines(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _close_coroutines(item)


async def _flush_journal(s: RunParts) -> None:
    pending, s.effects.journal.pending = s.effects.journal.pending, []
    for position, durable_id in pending:
        await s.infra.io.call(s.infra.io.store.suspension.append_journal, s.identity.run_id, position, durable_id)


def describe(exc: BaseException, s: RunParts, play_file: str) -> dict[str, Any]:
    """The error kept on the run: one sentence, secrets redacted, where in the play, and
    (for --debug) the traceback of an error the play's own code raised."""
    error = error_dict(exc)
    error["message"] = s.infra.secrets.redact(error["message"])
    if isinstance(exc, DeeplineError):
        error["exit_code"] = exc.exit_code
        place = failures.where(exc) if isinstance(exc, UsageError | InputError) else None
        if place and place not in error["message"]:  # a call the play made wrong (`limit=0`): where in its code
            error["where"] = place
        if isinstance(exc, BudgetExceededError):
            error["max_credits"] = s.effects.book.max_credits  # the budget a resume must raise
            if s.identity.root != s.identity.run_id:
                error["budget_of"] = s.identity.root  # a child spends its root's budget: that one is raised
    else:  # an error of the play's own code: named by its type, as a map row's is (KeyError: 'domain')
        said = str(exc)  # an exception with no message is named by its type already
        if said and not error["message"].startswith(f"{type(exc).__name__}:"):
            error["message"] = f"{type(exc).__name__}: {error['message']}"
        place = failures.where(exc)
        if place:
            error["where"] = place
    origin = exc.__cause__ if isinstance(exc, failures.PlayCodeError) and exc.__cause__ else exc
    if not isinstance(origin, DeeplineError):
        error["traceback"] = s.infra.secrets.redact(failures.formatted(origin))
    return error
