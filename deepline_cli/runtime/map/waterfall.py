"""Waterfalls: a column that asks providers in turn until one finds the value.

    email = (
        steps()
        .step("hunter", lambda row, rc: rc.tools.execute("hunter", "hunter.email", person(row)))
        .step("apollo", find_with_apollo, run_if=lambda row: row["company"] is not None)
        .step("pattern", guess_from_pattern)
    )
    rows = await ctx.map("leads", leads, columns={"email": email})

A step is `(row)` or `(row, rc)`, sync or async, with an optional `run_if(row[, index])`.
It found the value when its answer (a ToolResult's output, or what it returned) is found
(runtime/found.py: not None, "", nor a list or object holding nothing found;
`steps(found=...)` decides otherwise). The first
step that finds it ends the waterfall, and the cell records which step that was (`runs
show`, the export's `<column>_step`, the live view, `plan` and the report count hits per
step). A step whose provider is unavailable (`ProviderTransientError`, after its retries)
or answers 404 passes to the next; if none found a value and some were unavailable, the
row fails with the last unavailability, so a later run asks again. Any other error fails
the row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deepline_cli._aio import is_awaitable
from deepline_cli.errors import ProviderTransientError, ToolExecutionError, UsageError
from deepline_cli.runtime.calls.call_scope import current_cell
from deepline_cli.runtime.map.columns import arity, check_arity, given_fewer
from deepline_cli.runtime.providers.found import is_found
from deepline_cli.runtime.providers.tools import ToolResult
from deepline_cli.store.records import NOT_FOUND


@dataclass(frozen=True, slots=True)
class Found:
    """A waterfall's answer: the value, and the step that found it (None: no step did)."""

    value: Any
    step: str | None
    keys: tuple[str, ...] = ()  # the receipts whose answers the step that found it used


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    fn: Callable[..., Any]
    run_if: Callable[..., Any] | None = None
    takes_rc: bool = True  # fn(row, rc), else fn(row)
    takes_index: bool = False  # run_if(row, index), else run_if(row)


class Waterfall:
    """A column built from ordered steps (see the module's doc). Immutable: `.step(...)`
    returns a new waterfall."""

    def __init__(self, steps: tuple[Step, ...] = (), found: Callable[[Any], bool] | None = None) -> None:
        self.steps = steps
        self.found = found

    def step(self, name: str, fn: Callable[..., Any], *, run_if: Callable[..., Any] | None = None) -> Waterfall:
        if not isinstance(name, str) or not name or name == NOT_FOUND:
            raise UsageError(f"A waterfall step needs a name (a non-empty string other than {NOT_FOUND!r}).")
        if any(s.name == name for s in self.steps):
            raise UsageError(f"The waterfall has two steps named {name!r}.")
        if not callable(fn):
            raise UsageError(f"Waterfall step {name!r} must be a function, not {type(fn).__name__}.")
        check_arity(fn, f"Waterfall step {name!r}", "(row) or (row, rc)")
        if run_if is not None:
            check_arity(run_if, f"Waterfall step {name!r}'s run_if", "(row) or (row, index)")
        added = Step(name, fn, run_if, arity(fn) >= 2, run_if is not None and arity(run_if) >= 2)
        return Waterfall((*self.steps, added), self.found)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.steps]

    def __fingerprint__(self) -> list[Any]:
        """What decides the cells it makes: the steps' names, order, code and predicates."""
        parts: list[Any] = []
        for s in self.steps:
            parts += [s.name, s.fn] + ([s.run_if] if s.run_if is not None else [])
            parts += given_fewer(s.fn, s.run_if)
        return parts + ([self.found] if self.found is not None else [])

    async def __call__(self, row: dict[str, Any], rc: Any) -> Found:
        if not self.steps:
            raise UsageError("A waterfall needs at least one step: steps().step(name, fn).")
        unavailable: tuple[str, ProviderTransientError] | None = None
        cell = current_cell()
        for step in self.steps:
            if step.run_if is not None and not await _ask(step.run_if, row, rc.index if step.takes_index else None):
                continue
            asked = len(cell.answered) if cell is not None else 0
            try:
                value = await _ask(step.fn, row, rc if step.takes_rc else None)
            except ProviderTransientError as down:
                unavailable = (step.name, down)
                continue
            except ToolExecutionError as failed:
                if failed.status_code == 404:
                    continue
                raise
            if isinstance(value, ToolResult):
                value = value.output
            if (self.found or is_found)(value):
                return Found(value, step.name, tuple(cell.answered[asked:]) if cell is not None else ())
        if unavailable is not None:
            name, last = unavailable
            raise ProviderTransientError(
                f"no step found a value, and step {name!r} was unavailable: {last}",
                category=last.category,
                status_code=last.status_code,
                tool=last.tool,
            ) from last
        return Found(None, None)

    def __repr__(self) -> str:
        return f"steps({' → '.join(self.names)})"


def steps(*, found: Callable[[Any], bool] | None = None) -> Waterfall:
    """Start a waterfall: `steps().step("hunter", fn).step("apollo", fn2, run_if=...)`."""
    return Waterfall(found=found)


async def _ask(fn: Callable[..., Any], row: dict[str, Any], second: Any) -> Any:
    """`fn(row, second)`, or `fn(row)` when there is no second argument to give; awaited
    if it returns an awaitable."""
    answer = fn(row) if second is None else fn(row, second)
    if is_awaitable(answer):
        answer = await answer
    return answer
