"""What a failure is — a bug in the play's own code, or one row's bad luck — and where in
the play it happened.

A row whose provider failed, or whose data the play rejected, is isolated: the map goes
on. But Python's programming errors raised by the play's own code (a typo in a column
name, a wrong attribute, a bad call) would fail every row the same way: the map stops at
the first one, naming the file and line, and the run fails instead of billing the whole
list for nothing.
"""

from __future__ import annotations

import sysconfig
import traceback
from pathlib import Path

from deepline_cli.errors import TRANSIENT_CATEGORIES, DeeplineError, ToolExecutionError

PROGRAMMING_ERRORS: tuple[type[BaseException], ...] = (
    NameError,
    AttributeError,
    TypeError,
    KeyError,
    IndexError,
    ImportError,
    SyntaxError,
)
_PACKAGE = str(Path(__file__).resolve().parents[2])  # deepline_cli/: every module of deepline's own
_LIBRARIES = tuple(
    {str(Path(p).resolve()) for p in (sysconfig.get_path(name) for name in ("stdlib", "purelib", "platlib")) if p}
)


class PlayCodeError(DeeplineError):
    """The play's own code raised a programming error: fix the play, then resume."""

    fatal = True


def where(exc: BaseException) -> str | None:
    """`play.py line 14`: the innermost frame of the play's own code (not deepline's, not
    a library's) in the error's traceback, or in the one it was raised from."""
    for error in (exc, exc.__cause__):
        if error is None:
            continue
        for frame in reversed(traceback.extract_tb(error.__traceback__)):
            if is_play_file(frame.filename):
                return f"{Path(frame.filename).name} line {frame.lineno}"
    return None


def is_play_file(filename: str) -> bool:
    """Is this source file the play's own (not deepline's, not the standard library's or a
    package's)?"""
    if filename.startswith("<"):
        return False
    path = str(Path(filename).resolve())
    return not path.startswith(_PACKAGE) and not path.startswith(_LIBRARIES)


def is_play_bug(exc: BaseException) -> bool:
    """A programming error raised by the play's own code (not by a tool: those arrive
    wrapped in ToolExecutionError)."""
    return isinstance(exc, PROGRAMMING_ERRORS) and where(exc) is not None


def describe(exc: BaseException) -> str:
    """A row's error as kept and shown: a tool's failure by its category (the same words
    live and when replayed from its receipt), any other by its type and where in the play
    it was raised."""
    if isinstance(exc, ToolExecutionError):
        return f"{exc.category}: {exc}"
    place = where(exc)
    return f"{type(exc).__name__}: {exc}" + (f" ({place})" if place else "")


def transient(exc: BaseException) -> bool:
    """A provider's failure that may pass (rate limit, network, 5xx, after its retries):
    a resume of its run asks its cell again (its receipt is retried, SPEC §3)."""
    return isinstance(exc, ToolExecutionError) and exc.retryable and exc.category in TRANSIENT_CATEGORIES


def replayed(exc: BaseException) -> bool:
    """A failure given back from its receipt, no call made (it says nothing of the provider now)."""
    return isinstance(exc, ToolExecutionError) and exc.replayed


def signature(exc: BaseException) -> tuple[object, ...]:
    """What makes two failures "the same error", whatever row they came from."""
    if isinstance(exc, ToolExecutionError):
        return (exc.tool, exc.category, exc.status_code)
    return (type(exc).__name__, where(exc))


def formatted(exc: BaseException) -> str:
    """The traceback, for --debug."""
    return "".join(traceback.format_exception(exc))
