"""What a map needs from the run it runs in: a small port, so the map engine knows nothing
of runs, play bodies or child plays (the run implements it; `deepline plan` too)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from deepline_cli.runtime.calls.events import EventBus
from deepline_cli.runtime.calls.identity import Identity
from deepline_cli.runtime.calls.stats import RunStats
from deepline_cli.runtime.calls.store_thread import StoreIO, WriteQueue
from deepline_cli.runtime.calls.tool_calls import Tools
from deepline_cli.runtime.providers.secrets import Secrets


class MapHost(Protocol):
    """The calls a row's resolver makes through `rc` (`tools`, and `step`, `fetch` and
    `run_play` as `ctx` has them, called with `_journal=False`: rows finish in no fixed
    order), and the play input cells are keyed on."""

    @property
    def tools(self) -> Tools: ...
    @property
    def play_input(self) -> Any: ...
    @property
    def step(self) -> Callable[..., Awaitable[Any]]: ...
    @property
    def fetch(self) -> Callable[..., Awaitable[Any]]: ...
    @property
    def run_play(self) -> Callable[..., Awaitable[Any]]: ...


class Log(Protocol):
    def __call__(
        self,
        message: str,
        *,
        level: str = "info",
        key: str | None = None,
        kind: str = "log",
        fields: dict[str, Any] | None = None,
    ) -> None: ...


@dataclass(frozen=True)
class MapParts:
    """The parts of the run a map works with: who the run is, the store (the map reads its
    sheet and map rows), the write queue, events, stats, secrets to redact with, whether the
    run still dispatches, and its log."""

    identity: Identity
    io: StoreIO
    writes: WriteQueue
    bus: EventBus
    stats: RunStats
    secrets: Secrets
    check_open: Callable[[], None]  # raises once the run stops dispatching (interrupt, breaker…)
    log: Log
    concurrency: int | None = None  # the run's --concurrency
    limit: int | None = None  # the run's --limit
    # Where a running map puts the call that says its progress; the run makes it with its own.
    progress: list[Callable[[], None]] = field(default_factory=list)
    # The declared tools' versions (RunTools.versions): a cell's fingerprint has those its column calls.
    tool_versions: Mapping[str, str] | None = None
    # The fatal reason the run stopped for (a budget refusal, a lost lease…), if it did: a
    # row that ends after it may hold what a resolver caught of it, so it is not recorded.
    tripped: Callable[[], BaseException | None] = lambda: None
