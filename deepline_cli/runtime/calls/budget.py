"""Credits and `--max-credits` (or a play's `max_credits_per_run`): what a run spends,
across attempts, and the promise it keeps.

A call is sent only if what the run has spent, plus what the calls in flight are expected
to cost, plus this call's expected cost, stays within the budget. While the credits held for
calls in flight are what keeps it out, it waits for them to end (a call that fails is not
billed: its credits come back); it is refused once what was spent leaves it no room. A call's
expected cost:

- a tool whose cost is fixed (a local or HTTP tool): its declared credits;
- a tool whose answers say what they cost (remote tools, "metered"): the most any of its
  answers has cost — in this run, its earlier attempts, or earlier runs on this store —
  and never less than declared. With no answer known yet, its first call goes alone: the
  others wait for that answer before they are weighed.

An answer that costs more than expected raises the tool's expected cost at once, for the
calls in flight too, and a run whose spending passed the budget stops dispatching and says
by how much. So a run overspends only by what calls already in flight when an overrun was
learned cost beyond what was expected of them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from deepline_cli._format import add_credits, format_credits, sum_credits
from deepline_cli.errors import BudgetExceededError


def expected_cost(declared: float, learned: float) -> float:
    """What a call of a tool whose answers say what they cost is expected to cost: the most
    one of them has cost, never less than declared (the budget holds it, the plan bounds it)."""
    return max(declared, learned)


@dataclass(eq=False, slots=True)
class Reservation:
    """The credits held for one call in flight."""

    tool: str | None
    amount: float
    metered: bool
    probe: bool = False  # the first call of a metered tool of unknown cost
    expected: float = 0.0  # what it was expected to cost when admitted (`amount` may rise since)


class Budget:
    """`--max-credits` (or a play's `max_credits_per_run`): a call is admitted only if what
    is spent, plus what calls in flight may cost, plus its own cost fits; a tool that
    reports its cost is reserved at the most it has cost so far."""

    def __init__(
        self,
        max_credits: float | None,
        spent: float = 0.0,
        known: dict[str, float] | None = None,
        *,
        declared_by: str | None = None,
    ) -> None:
        self.max_credits = max_credits
        self.declared_by = declared_by  # the play whose max_credits_per_run this is (else --max-credits)
        self.spent = spent  # completed calls of this run, every attempt
        self.reserved = 0.0  # calls being made now
        self._known = dict(known or {})  # metered tool -> the most one answer has cost
        self._inflight: dict[Reservation, None] = {}  # in order; one is dropped without a search
        self._probes: dict[str, asyncio.Future[None]] = {}  # metered tool -> its first answer
        self._freed: asyncio.Future[None] | None = None  # set when held credits come back (a call ended)
        self._overrun: BudgetExceededError | None = None
        # The first call refused (the run stops with it), and what its message says of it: told
        # again as calls in flight end, so it says what the run spent in the end.
        self._refused: tuple[BudgetExceededError, str, float] | None = None  # its words then, and spent

    def expected(self, tool: str | None, declared: float, *, metered: bool) -> float | None:
        """A call's expected cost; None for a metered tool no answer has priced yet."""
        if not metered or tool is None:
            return declared
        learned = self._known.get(tool)
        return None if learned is None else expected_cost(declared, learned)

    async def admit(self, tool: str | None, declared: float, label: str, *, metered: bool = False) -> Reservation:
        """Hold credits for a call about to be made, or refuse it (BudgetExceededError):
        after the first answer of a metered tool of unknown cost when one is out, and while
        calls in flight hold the credits it needs."""
        while (reserved := self.reserve(tool, declared, label, metered=metered)) is None:
            if tool is not None and tool in self._probes:
                await asyncio.shield(self._probes[tool])  # the tool's first answer tells its cost
            else:
                if self._freed is None or self._freed.done():
                    self._freed = asyncio.get_running_loop().create_future()
                await asyncio.shield(self._freed)
        return reserved

    def reserve(self, tool: str | None, declared: float, label: str, *, metered: bool = False) -> Reservation | None:
        """`admit` without a wait: None when it must wait (for a metered tool's first answer,
        or for calls in flight to give back the credits it needs)."""
        expected = self.expected(tool, declared, metered=metered)
        if expected is None and tool in self._probes and self.max_credits is not None:
            return None
        probe = expected is None
        amount = declared if expected is None else expected
        if self._inflight and not self._fits(amount, probe, self.reserved) and self._fits(amount, probe, 0.0):
            return None  # it fits once the calls in flight have ended (or some failed, unbilled)
        self._check(amount, label, tool, unknown=probe)
        reservation = Reservation(tool, amount, metered, probe, amount)
        if probe and tool is not None and self.max_credits is not None:
            self._probes[tool] = asyncio.get_running_loop().create_future()
        self._inflight[reservation] = None
        self.reserved = add_credits(self.reserved, amount)
        return reservation

    def _fits(self, amount: float, unknown: bool, held: float) -> bool:
        limit = self.max_credits
        if limit is None or (not amount and not unknown):
            return True
        total = sum_credits((self.spent, held, amount))
        return not (total > limit or (unknown and total >= limit))

    def _check(self, amount: float, label: str, tool: str | None, *, unknown: bool) -> None:
        if not self._fits(amount, unknown, self.reserved):
            cost = "of unknown cost" if unknown else f"expected to cost {format_credits(amount)}"
            if tool and tool != label:  # the call's id says what it is for, the tool what it costs
                cost = f"{tool}, {cost}"
            said = (
                f"{self._limit()} would be exceeded by {label!r} ({cost}; {format_credits(self.spent)} spent, "
                f"{format_credits(self.reserved)} held for calls in flight)"
            )
            refused = BudgetExceededError(f"{said}; {self._advice()}")
            if self._refused is None:
                self._refused = (refused, said, self.spent)
            raise refused

    def _tell_refused(self) -> None:
        """The refusal the run stops with says, as calls held then end, what was spent in the
        end (its figures stay those of the moment it was made: they add up)."""
        if self._refused is not None:
            refused, said, spent = self._refused
            end = f"; {format_credits(self.spent)} spent in the end" if self.spent != spent else ""
            limit = self.max_credits
            if limit is not None and self.spent > limit:  # calls in flight cost more than expected: said
                end += f", {format_credits(add_credits(self.spent, -limit))} over"
            refused.args = (f"{said}{end}; {self._advice()}",)

    def release(self, reservation: Reservation) -> None:
        """The call was not made (or not billed): give its credits back."""
        self._drop(reservation)
        self._answered(reservation)
        self._tell_refused()

    def settle(self, reservation: Reservation, actual: float) -> BudgetExceededError | None:
        """A completed call cost `actual` (a metered tool's expected cost is learned from it).
        Returns the error to stop the run with when the spending went past the budget."""
        self._drop(reservation)
        self.spent = add_credits(self.spent, actual)
        if reservation.metered and reservation.tool is not None:
            self._learn(reservation.tool, actual)
        self._answered(reservation)
        self._tell_refused()
        limit = self.max_credits
        if limit is None or self.spent <= limit:
            return None
        message = (
            f"{self._limit()} was passed: {format_credits(self.spent)} credits spent, "
            f"{format_credits(add_credits(self.spent, -limit))} over, "
            f"because calls in flight cost more than expected (the last one {format_credits(actual)}, "
            f"{format_credits(reservation.expected)} expected); {self._advice()}"
        )
        # One error for the run (the first reason stops it): the calls still in flight
        # when it was raised add to it, so it says what the run spent in the end.
        if self._overrun is None:
            self._overrun = BudgetExceededError(message)
        else:
            self._overrun.args = (message,)
        return self._overrun

    def _limit(self) -> str:
        limit = format_credits(self.max_credits or 0)  # only said of a budget that was passed
        if self.declared_by is None:
            return f"--max-credits {limit}"
        return f"max_credits_per_run {limit} of play {self.declared_by!r}"

    def _advice(self) -> str:
        if self.declared_by is None:
            return "raise --max-credits and resume the run."
        return "resume the run with a higher --max-credits, or raise max_credits_per_run in the play and resume."

    def _learn(self, tool: str, actual: float) -> None:
        """A dearer answer than known raises the tool's expected cost, for calls in flight too."""
        if actual <= self._known.get(tool, -1.0):
            return
        self._known[tool] = actual
        for held in self._inflight:
            if held.tool == tool and held.metered and held.amount < actual:
                self.reserved = sum_credits((self.reserved, actual, -held.amount))
                held.amount = actual

    def _drop(self, reservation: Reservation) -> None:
        if reservation in self._inflight:
            del self._inflight[reservation]
            self.reserved = add_credits(self.reserved, -reservation.amount)
        if self._freed is not None and not self._freed.done():
            self._freed.set_result(None)  # the calls waiting for credits look again

    def _answered(self, reservation: Reservation) -> None:
        if reservation.probe and reservation.tool is not None:
            waiting = self._probes.pop(reservation.tool, None)
            if waiting is not None and not waiting.done():
                waiting.set_result(None)

    @property
    def known(self) -> dict[str, float]:
        return dict(self._known)
