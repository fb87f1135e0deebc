"""What every command shares: options, error handling, and running with a view."""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperArgument, TyperCommand

F = TypeVar("F", bound=Callable[..., Any])


class _Argument(TyperArgument):
    def display_type_rich(self, ctx: Any) -> str | None:
        return None  # `RUN_ID`, not `RUN_ID <str>`: arguments read like the options' metavars


class Command(TyperCommand):
    """Every command's class: its help names values the way a person types them (`RUN_ID`,
    `--csv FILE`, `--limit N`), never by Python type (`<str>`, `<int range>`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if type(param) is TyperArgument:
                param.__class__ = _Argument


StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        metavar="URL",
        envvar="DEEPLINE_STORE",
        show_envvar=True,
        help=(
            "Store: a path, sqlite:///relative/path, sqlite:////absolute/path or postgresql://… "
            "[default: deepline.db in the user data dir]"
        ),
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]


class Settings:
    debug = bool(os.environ.get("DEEPLINE_DEBUG"))


def fail(message: str, code: int) -> typer.Exit:
    from deepline_cli.ui.text import printable

    sys.stderr.write(f"Error: {printable(message)}\n")
    return typer.Exit(code)


def cli_errors(fn: F) -> F:
    """Turn deepline errors into one sentence and an exit code (traceback with --debug)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from deepline_cli.errors import DeeplineError

        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except DeeplineError as exc:
            if Settings.debug:
                traceback.print_exc()
            raise fail(str(exc), exc.exit_code) from None
        except BrokenPipeError:
            # The reader went away (`deepline export RUN | head`): stop quietly, like other tools.
            from deepline_cli.ui.streams import silence

            silence(sys.stdout.fileno())
            raise typer.Exit(0) from None
        except KeyboardInterrupt:
            raise fail("interrupted.", 130) from None
        except Exception as exc:
            if Settings.debug:
                traceback.print_exc()
            raise fail(
                f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback).",
                1,
            ) from None

    return wrapper  # type: ignore[return-value]


def at_least(least: float, *, number: Callable[[str], Any] = int, most: float | None = None) -> Callable[[str], Any]:
    """An option's parser: a whole number (or `number=float`) from `least` (to `most`), said
    in words when it is not: `--limit 0` → "must be 1 or more, not 0"."""
    kind = "a whole number" if number is int else "a number"
    bound = f"from {least:g} to {most:g}" if most is not None else f"{least:g} or more"

    def parse(text: str) -> Any:
        try:
            value = number(text)
        except (TypeError, ValueError):
            raise typer.BadParameter(f"must be {kind}, not {text!r}.") from None
        if value < least or (most is not None and value > most) or value != value:  # NaN is no number
            raise typer.BadParameter(f"must be {bound}, not {text}.")
        return value

    return parse


def one_of(*choices: str) -> Callable[[str], str]:
    """An option's parser: one of `choices`, said in words when it is not."""

    def parse(text: str) -> str:
        if text not in choices:
            raise typer.BadParameter(f"must be {' or '.join(choices)}, not {text!r}.")
        return text

    return parse
