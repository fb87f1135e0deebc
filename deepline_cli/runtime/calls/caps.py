"""Governance: the caps on one root run's tool calls and child plays, counted across its
attempts and its child runs (`--max-tool-calls`, `--max-child-plays`, `--max-depth`)."""

from __future__ import annotations

from dataclasses import dataclass

from deepline_cli.errors import GovernanceError

DEFAULT_MAX_DEPTH = 8


@dataclass
class Caps:
    """The limits of a root run and the counts against them, shared with its child runs."""

    max_depth: int = DEFAULT_MAX_DEPTH
    max_child_plays: int | None = None
    max_tool_calls: int | None = None
    child_plays: int = 0
    tool_calls: int = 0

    def count_tool_call(self) -> None:
        self.tool_calls += 1
        if self.max_tool_calls is not None and self.tool_calls > self.max_tool_calls:
            raise GovernanceError(
                f"This run made its {self.max_tool_calls} tool calls (--max-tool-calls {self.max_tool_calls}): "
                "the next one was not made; raise the limit and resume the run."
            )

    def count_child_play(self) -> None:
        self.child_plays += 1
        if self.max_child_plays is not None and self.child_plays > self.max_child_plays:
            raise GovernanceError(
                f"This run started its {self.max_child_plays} child plays (--max-child-plays "
                f"{self.max_child_plays}): the next one was not started; raise the limit and resume the run."
            )
