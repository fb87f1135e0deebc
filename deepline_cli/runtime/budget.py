"""Credits and `--max-credits` (or a play's `max_credits_per_run`): spend per run, across
attempts, reserved while in flight."""

from __future__ import annotations

from deepline_cli.errors import BudgetExceededError


class Budget:
    def __init__(self, max_credits: float | None, spent: float = 0.0, *, declared_by: str | None = None) -> None:
        self.max_credits = max_credits
        self.declared_by = declared_by  # the play whose max_credits_per_run this is (else --max-credits)
        self.spent = spent  # completed calls of this run, every attempt
        self.reserved = 0.0  # calls being made now
        self._reported: dict[str, tuple[int, float]] = {}  # metered tool -> (answers, credits)

    def expected(self, tool: str | None, declared: float, *, metered: bool) -> float:
        """What to reserve for a call: its declared credits, or for a tool whose answers
        say what they cost (remote tools) without a declaration, the mean it reported so far."""
        if declared or not metered or tool is None:
            return declared
        answers, credits = self._reported.get(tool, (0, 0.0))
        return credits / answers if answers else 0.0

    def reserve(self, credits: float, label: str, *, metered: bool = False) -> None:
        """Hold `credits` for a call about to be made, or refuse it. A metered call of
        unknown cost is refused once the budget is used up."""
        if not credits and not metered:
            return
        over = self.spent + self.reserved + credits
        if self.max_credits is not None and (over > self.max_credits or (not credits and over >= self.max_credits)):
            raise BudgetExceededError(
                f"{self._limit()} would be exceeded by {label!r} "
                f"({self.spent:g} spent, {self.reserved:g} in flight, this call costs {credits:g}); " + self._advice()
            )
        self.reserved += credits

    def settle(self, credits: float, *, spent: bool, actual: float | None = None, tool: str | None = None) -> None:
        """Release a reservation; a completed call adds what it cost (`actual`, else what
        was reserved). `tool` is given when the provider said the cost: it is learned."""
        self.reserved -= credits
        if not spent:
            return
        cost = credits if actual is None else actual
        self.spent += cost
        if actual is not None and tool is not None:
            answers, total = self._reported.get(tool, (0, 0.0))
            self._reported[tool] = (answers + 1, total + actual)

    def _limit(self) -> str:
        if self.declared_by is None:
            return f"--max-credits {self.max_credits:g}"
        return f"max_credits_per_run {self.max_credits:g} of play {self.declared_by!r}"

    def _advice(self) -> str:
        if self.declared_by is None:
            return "raise --max-credits and resume the run."
        return "resume the run with a higher --max-credits, or raise max_credits_per_run in the play and resume."
