"""What one attempt of a run shares between its context, maps and child plays."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from deepline_cli import _json
from deepline_cli.errors import DeeplineError, GovernanceError, UsageError
from deepline_cli.runtime.calls.events import EventBus
from deepline_cli.runtime.calls.receipts import ReceiptBook, RunScope
from deepline_cli.runtime.calls.stats import RunStats
from deepline_cli.runtime.calls.store_thread import StoreIO, WriteQueue
from deepline_cli.runtime.providers.governor import Governor
from deepline_cli.runtime.providers.http import Http, HttpTools
from deepline_cli.runtime.providers.secrets import Secrets
from deepline_cli.store.records import LogLine

DEFAULT_MAX_DEPTH = 8


class DeterminismError(DeeplineError):
    """A resumed play reached a different durable id than its earlier attempt did."""


@dataclass
class Caps:
    """Per-root-run governance limits and the counts against them (shared with children)."""

    max_depth: int = DEFAULT_MAX_DEPTH
    max_child_plays: int | None = None
    max_tool_calls: int | None = None
    child_plays: int = 0
    tool_calls: int = 0

    def count_tool_call(self) -> None:
        self.tool_calls += 1
        if self.max_tool_calls is not None and self.tool_calls > self.max_tool_calls:
            raise GovernanceError(f"This run made more than {self.max_tool_calls} tool calls (--max-tool-calls).")

    def count_child_play(self) -> None:
        self.child_plays += 1
        if self.max_child_plays is not None and self.child_plays > self.max_child_plays:
            raise GovernanceError(f"This run started more than {self.max_child_plays} child plays (--max-child-plays).")


@dataclass
class Journal:
    """The order in which a run reached its id-addressed durable calls (step, fetch,
    run_play, sleep, wait_for_event), to notice a resume running changed code."""

    recorded: list[str]
    position: int = 0
    pending: list[tuple[int, str]] = field(default_factory=list)
    logged: set[str] = field(default_factory=set)  # the play body's log lines earlier attempts wrote
    logs_here: int = 0  # log lines since the last durable call

    def log_key(self) -> str:
        """Where a log line of the play body is: after which durable call, and which line
        after it. A resume replaying the body reaches the same places: a line it already
        wrote is not written (or shown) again."""
        self.logs_here += 1
        return f"{self.position}.{self.logs_here}"

    def reach(self, durable_id: str, run_id: str) -> None:
        position = self.position
        self.position += 1
        self.logs_here = 0
        if position >= len(self.recorded):
            self.recorded.append(durable_id)
            self.pending.append((position, durable_id))
            return
        before = self.recorded[position]
        if before != durable_id and durable_id not in self.recorded:
            raise DeterminismError(
                f"Run {run_id} reached {durable_id!r} where its earlier attempt reached {before!r}: "
                "the play's code changed since the run started. Start a new run, or restore the old code "
                "to resume this one."
            )


def log_fields(fields: dict[str, Any]) -> dict[str, Any] | None:
    """The fields a play attached to a log line (`ctx.log(msg, **fields)`): JSON values only,
    so they read back the same from either store."""
    for name, value in fields.items():
        try:
            _json.canonical(value)
        except TypeError as exc:
            raise UsageError(f"Log field {name!r} is not a JSON value: {exc}.") from None
    return dict(fields) or None


@dataclass
class RunServices:
    io: StoreIO
    scope: RunScope
    bus: EventBus
    book: ReceiptBook
    governor: Governor
    secrets: Secrets
    writes: WriteQueue
    stats: RunStats
    http: Http
    http_tools: HttpTools
    play_file: str
    play_name: str
    cwd: str
    options: dict[str, Any] = field(default_factory=dict)
    root_run_id: str = ""
    ancestors: tuple[str, ...] = ()  # play names from the root down to this run's play
    caps: Caps = field(default_factory=Caps)
    journal: Journal = field(default_factory=lambda: Journal([]))
    books: list[ReceiptBook] = field(default_factory=list)  # every book whose leases need heartbeats
    local_tools: dict[str, Any] = field(default_factory=dict)  # the play module's own @tools
    schedule_children: bool = False  # under workers: child plays become queued runs of their own

    def log(
        self,
        message: str,
        *,
        level: str = "info",
        key: str | None = None,
        kind: str = "log",
        fields: dict[str, Any] | None = None,
    ) -> None:
        """A run log line: kept in the store (with its kind and fields, for `runs logs
        --kind --where`) and shown live."""
        if key is not None and key in self.journal.logged:
            return  # written by an earlier attempt
        text = self.secrets.redact(str(message))
        shown = self.secrets.redact_json(fields) if fields else None
        scope = self.scope
        self.writes.log(LogLine(scope.run_id, scope.attempt, time.time(), level, text, key, kind, shown))
        extra = {"fields": shown} if shown else {}
        self.bus.emit("log", scope.run_id, level=level, message=text, kind=kind, attempt=scope.attempt, **extra)

    @property
    def depth(self) -> int:
        return len(self.ancestors) - 1

    @property
    def max_inline_wait(self) -> float:
        value = self.options.get("max_inline_wait")
        return 30.0 if value is None else float(value)

    def for_child(
        self, run_id: str, attempt: int, play_name: str, play_file: str, journal: Journal, tools: dict[str, Any]
    ) -> RunServices:
        """The services of a child run: its own identity and receipts, the rest shared."""
        scope = replace(self.scope, run_id=run_id, attempt=attempt, play=play_name)
        book = self.book.for_scope(scope)
        self.books.append(book)
        return replace(
            self,
            scope=scope,
            book=book,
            play_file=play_file,
            play_name=play_name,
            ancestors=(*self.ancestors, play_name),
            journal=journal,
            local_tools=tools,
        )
