"""The parts one attempt of a run is made of, typed by what they are, and the one function
that builds them, for a run and for `deepline plan` alike.

    Identity        who: the run, its attempt, play, workspace, root and flags   (calls/identity.py)
    Infrastructure  where things go: the store thread, the write queue, events, stats, secrets
    Effects         what has an effect: receipts, the governor, HTTP, the run's tools, caps, the journal
    Settings        how: concurrency, limit, how long to wait inline, how child plays run

A child play run in its parent's process gets parts of its own identity, receipts and
journal; everything else is its parent's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from deepline_cli.errors import DeterminismError
from deepline_cli.runtime.calls.budget import Budget
from deepline_cli.runtime.calls.call_scope import CellScope, current_cell
from deepline_cli.runtime.calls.caps import Caps
from deepline_cli.runtime.calls.events import EventBus
from deepline_cli.runtime.calls.identity import Identity
from deepline_cli.runtime.calls.receipts import ReceiptBook
from deepline_cli.runtime.calls.stats import RunStats
from deepline_cli.runtime.calls.store_thread import StoreIO, WriteQueue
from deepline_cli.runtime.calls.suspended import Suspended
from deepline_cli.runtime.calls.tool_calls import RunTools
from deepline_cli.runtime.providers.config import Config
from deepline_cli.runtime.providers.governor import Governor
from deepline_cli.runtime.providers.http import Http, HttpTools
from deepline_cli.runtime.providers.secrets import Secrets
from deepline_cli.runtime.providers.tools import ToolDef
from deepline_cli.runtime.providers.transport import Transport
from deepline_cli.runtime.run.holders import release_if_dead
from deepline_cli.store.records import Boundary, LogLine


@dataclass
class Journal:
    """The order in which a run reached its id-addressed durable calls (step, fetch,
    run_play, sleep, wait_for_event), to notice a resume running changed code."""

    recorded: list[str]
    position: int = 0
    pending: list[tuple[int, str]] = field(default_factory=list)
    logged: set[str] = field(default_factory=set)  # the play body's log lines earlier attempts wrote
    logs_here: int = 0  # log lines since the last durable call
    after: str = ""  # the last durable call reached, and how many times (a log line's place)
    reached: dict[str, int] = field(default_factory=dict)
    # The boundaries this attempt reached and could not pass: the run waits, even when the
    # play caught the Suspended (`asyncio.gather(..., return_exceptions=True)`).
    waits: list[Suspended] = field(default_factory=list)
    # An id may hold a secret (`ctx.step(f"step-{token}", ...)`): kept and compared as redacted.
    redact: Callable[[str], str] | None = None
    # The play's code changed since the run started (or is not known not to have): the calls
    # are held to the order earlier attempts reached them in. Unchanged code may reach them
    # in another (a set's order, by the hash seed): ids name them.
    strict: bool = True
    # The map cell the run's body runs in: none for a root run, its parent's row's for a child
    # play run from a map row in-process (the child's body is in its order all the same).
    home: CellScope | None = field(default_factory=current_cell)

    def __post_init__(self) -> None:
        self.logged = {_placed(key, self.recorded) for key in self.logged}

    def suspend(self, boundary: Boundary) -> Suspended:
        """The run must wait at `boundary`: the Suspended to raise, and remembered."""
        waits = Suspended(boundary)
        self.waits.append(waits)
        cell = current_cell()
        if cell is not None and cell.waits is None:
            cell.waits = waits
        return waits

    def log_key(self) -> str | None:
        """Where a log line of the play body is: after which durable call (its id, and the
        how-manieth time it was reached), and which line after it. A resume replaying the
        body reaches the same places, in whatever order: a line it already wrote is not
        written (or shown) again. None for a map row's line (a column calling ctx.log): rows
        finish in no fixed order, every line of every attempt is kept."""
        if self._in_a_row():
            return None
        self.logs_here += 1
        return f"{self.after}#{self.logs_here}"

    def _in_a_row(self) -> bool:
        """Is the call made in a row of one of the run's maps (a column calling ctx.*)?"""
        cell = current_cell()
        return cell is not None and cell is not self.home

    def reach(self, durable_id: str, run_id: str) -> None:
        if self._in_a_row():
            return  # rows finish in no fixed order
        if self.redact is not None:
            durable_id = self.redact(durable_id)
        position = self.position
        self.position += 1
        self.logs_here = 0
        self.reached[durable_id] = self.reached.get(durable_id, 0) + 1
        self.after = f"{durable_id}@{self.reached[durable_id]}"
        if position >= len(self.recorded):
            self.recorded.append(durable_id)
            self.pending.append((position, durable_id))
            return
        before = self.recorded[position]
        if self.strict and before != durable_id and durable_id not in self.recorded:
            raise DeterminismError(
                f"Run {run_id} reached {durable_id!r} where its earlier attempt reached {before!r}: "
                "the play's code changed since the run started. Start a new run, or restore the old code "
                "to resume this one."
            )


def _placed(key: str, recorded: list[str]) -> str:
    """A log line's key as `Journal.log_key` makes it: one an earlier deepline wrote by
    position (`2.1`: the first line after the second durable call) is read through the
    calls the run recorded in that order, so a run resumed after an upgrade does not write
    its lines again."""
    position, dot, line = key.partition(".")
    if not (dot and position.isdigit() and line.isdigit()) or int(position) > len(recorded):
        return key
    before = recorded[: int(position)]
    return f"{before[-1]}@{before.count(before[-1])}#{line}" if before else f"#{line}"


@dataclass
class Infrastructure:
    """Where a run's records go: the store (one thread), the write queue, events, stats."""

    io: StoreIO
    writes: WriteQueue
    bus: EventBus
    stats: RunStats
    secrets: Secrets
    # The maps running now (the run's and its child runs'): each says its progress when the
    # run says its own, so a view's frame shows counts of one moment.
    progress: list[Callable[[], None]] = field(default_factory=list)


@dataclass
class Effects:
    """What a run does that has an effect, each through a receipt."""

    book: ReceiptBook
    governor: Governor
    http: Http
    tools: RunTools  # where its tools' definitions come from
    caps: Caps
    journal: Journal
    books: list[ReceiptBook]  # every book whose leases need heartbeats (child runs in this process too)


@dataclass(frozen=True)
class Settings:
    """How a run goes: its flags, as given or as the run was started with."""

    concurrency: int | None = None
    limit: int | None = None
    max_inline_wait: float = 30.0
    schedule_children: bool = False  # under workers: child plays become queued runs of their own
    config: str | None = None  # the deepline.toml in use
    persisted: dict[str, Any] = field(default_factory=dict)  # the flags kept with the run (a child's too)
    trigger: str = ""  # what started the run when no command did ("schedule …", "webhook …")

    def for_child(self) -> Settings:
        """A child play's: the same, but whole. A pilot's limit is on the list it runs over;
        a child run made for one of its rows is that row's cell, which the full run takes
        from the sheet as it is."""
        return replace(self, limit=None, persisted={k: v for k, v in self.persisted.items() if k != "limit"})


@dataclass
class RunParts:
    """One attempt of a run: who it is, where its records go, what it does and how."""

    identity: Identity
    infra: Infrastructure
    effects: Effects
    settings: Settings

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
        --kind --where`) and shown live. A play body's line (`key`) is written once per run."""
        if key is not None and key in self.effects.journal.logged:
            return  # written by an earlier attempt
        infra, who = self.infra, self.identity
        text = infra.secrets.redact(str(message))
        shown = infra.secrets.redact_json(fields) if fields else None
        infra.writes.log(LogLine(who.run_id, who.attempt, time.time(), level, text, key, kind, shown))
        extra = {"fields": shown} if shown else {}
        infra.bus.emit("log", who.run_id, level=level, message=text, kind=kind, attempt=who.attempt, **extra)

    def for_child(self, run_id: str, attempt: int, play: str, play_file: str, journal: Journal,
                  tools: dict[str, ToolDef]) -> RunParts:  # fmt: skip
        """The parts of a child run in this process: its own identity, receipts, journal and
        tools; the rest is its parent's."""
        identity = self.identity.child(run_id, attempt, play, play_file)
        journal.redact = self.infra.secrets.redact
        book = self.effects.book.for_scope(identity)
        self.effects.books.append(book)
        effects = replace(
            self.effects, book=book, journal=journal, tools=RunTools(tools, self.effects.tools.http_tools)
        )
        return replace(self, identity=identity, effects=effects, settings=self.settings.for_child())


def build_parts(
    identity: Identity,
    io: StoreIO,
    bus: EventBus,
    stats: RunStats,
    *,
    config: Config,
    budget: Budget,
    caps: Caps,
    journal: Journal,
    local_tools: dict[str, ToolDef],
    settings: Settings,
    env_folder: Path,
    fetch_public_only: bool = False,
) -> RunParts:
    """Everything an attempt needs, wired once: a run and the planner both build theirs here.
    `env_folder`: where the run's `.env` is (its play's folder)."""
    writes = WriteQueue(io)
    secrets = Secrets(env_folder)

    async def shared_slot(tool: str, interval: float, count: int) -> float:
        start = await io.call(io.store.receipts.take_rate_slot, tool, interval, io.now(), count)
        return start - io.now()

    governor = Governor(settings.concurrency, shared_slot=shared_slot)
    http = Http(Transport(max(64, settings.concurrency or 0)), secrets, governor, public_only=fetch_public_only)
    book = ReceiptBook(io, writes, identity, bus, stats, budget=budget, secrets=secrets,
                       release_if_dead=partial(release_if_dead, io.store))  # fmt: skip
    parts = RunParts(
        identity,
        Infrastructure(io, writes, bus, stats, secrets),
        Effects(book, governor, http, RunTools(local_tools, HttpTools(config, http)), caps, journal, [book]),
        settings,
    )
    secrets.warn = partial(parts.log, level="warning")
    journal.redact = secrets.redact  # a secret read later is redacted from then on
    return parts
