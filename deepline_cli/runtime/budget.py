"""Credits and `--max-credits`: spend per run, across attempts, reserved while in flight."""

from __future__ import annotations

from deepline_cli.errors import BudgetExceededError


class Budget:
    def __init__(self, max_credits: float | None, spent: float = 0.0) -> None:
        self.max_credits = max_credits
        self.spent = spent  # completed calls of this run, every attempt
        self.reserved = 0.0  # calls being made now

    def reserve(self, credits: float, label: str) -> None:
        """Hold `credits` for a call about to be made, or refuse it."""
        if not credits:
            return
        if self.max_credits is not None and self.spent + self.reserved + credits > self.max_credits:
            raise BudgetExceededError(
                f"--max-credits {self.max_credits:g} would be exceeded by {label!r} "
                f"({self.spent:g} spent, {self.reserved:g} in flight, this call costs {credits:g}); "
                "raise --max-credits and resume the run."
            )
        self.reserved += credits

    def settle(self, credits: float, *, spent: bool) -> None:
        if not credits:
            return
        self.reserved -= credits
        if spent:
            self.spent += credits
