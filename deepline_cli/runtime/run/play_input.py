"""A play's input as its body sees it: a field the body reads that the run was not given
is a usage error naming the flag that gives it, not a bare `KeyError: 'csv'`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from deepline_cli.errors import MissingInputField
from deepline_cli.runtime.map.failures import is_play_file


class PlayInput(dict[str, Any]):
    """The input dict handed to a play body. Reading a missing field raises
    MissingInputField: exit 2 with one sentence, and still a KeyError for a play that
    catches one (`try: input["limit"] except KeyError: ...`)."""

    def __init__(self, given: dict[str, Any], *, child: bool = False, trigger: str = "") -> None:
        super().__init__(given)
        self.child = child
        self.trigger = trigger

    def __missing__(self, name: Any) -> Any:
        if not isinstance(name, str):
            raise KeyError(name)
        where = _caller()
        raise MissingInputField(
            f"The play's input has no field {name!r}{f' ({where})' if where else ''}; "
            f"{_how(name, self.child, self.trigger)}."
        )


def play_input(given: Any, *, child: bool = False, trigger: str = "") -> Any:
    """What the body gets: a dict input as a PlayInput, anything else as it is. `trigger`:
    what started the run, if no command did (a schedule, a webhook): it says how to give a field."""
    return PlayInput(given, child=child, trigger=trigger) if type(given) is dict else given


def _how(name: str, child: bool, trigger: str = "") -> str:
    if child:
        return "its parent gives it in the input of ctx.run_play"
    if trigger.startswith("schedule"):
        return "give it in the schedule's input (schedule_input=, or the input of its [schedules] table)"
    if trigger.startswith("webhook"):
        return "the delivery's body must hold it"
    return how_to_give(name)


def how_to_give(name: str) -> str:
    """The flag a run's input field is given with."""
    if name == "csv":
        return "give it with --csv FILE"
    return f"give it with --set {name}=VALUE or --input JSON"


def _caller() -> str | None:
    """`play.py line 5`: where the play's code read the field (the frame reading the dict)."""
    frame = sys._getframe(2)  # _caller ← __missing__ ← the subscript in the play's code
    if frame is None or not is_play_file(frame.f_code.co_filename):
        return None
    return f"{Path(frame.f_code.co_filename).name} line {frame.f_lineno}"
