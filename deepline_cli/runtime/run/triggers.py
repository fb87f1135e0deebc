"""What starts a run besides a person: a schedule's tick or a webhook's delivery.

Exactly once comes from the run id: it is derived from what triggered the run (the play
and the tick, or the play and the delivery id), so a second worker firing the same tick,
or a sender retrying the same delivery, inserts a run that already exists and starts
nothing new (`Runner.enqueue_new`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from deepline_cli.errors import PlayLoadError
from deepline_cli.runtime.run.schema import Schema, violation

if TYPE_CHECKING:
    from croniter import croniter

CatchUp = Literal["latest", "none"]
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Schedule:
    """`@play(schedule="0 6 * * *", schedule_input={...}, timezone="Europe/Paris")`: a cron
    expression (five fields, or six with seconds last), read in `timezone`."""

    cron: str
    input: Any
    timezone: str = "UTC"
    catch_up: CatchUp = "latest"  # a tick missed while no worker ran: fire the latest once, or none
    name: str = ""  # what its run ids are named after: the play's name, or the table's in deepline.toml
    folder: str = ""  # where its input's relative paths are: deepline.toml's folder ("": the play's)

    def next_tick(self, after: float) -> float:
        """The first tick strictly after `after` (a Unix time)."""
        ticks = _croniter()(self.cron, self._at(after))
        tick = float(ticks.get_next(float))
        while self._repeated(tick):
            tick = float(ticks.get_next(float))
        return tick

    def last_tick(self, at: float) -> float:
        """The latest tick at or before `at` (croniter starts a millisecond on, so a tick at
        `at` itself counts; from a second's last millisecond, that can be the next second's)."""
        ticks = _croniter()(self.cron, self._at(at + 0.001))
        tick = float(ticks.get_prev(float))
        while tick > at or self._repeated(tick):
            tick = float(ticks.get_prev(float))
        return tick

    def _repeated(self, tick: float) -> bool:
        """A tick at a set hour that falls in the hour the clocks go back to, whose wall-clock
        time came an hour before: it fired then (as cron, a nightly run runs once that night).
        A schedule over every hour goes on through the repeated one."""
        local = self._at(tick)
        if not local.fold or _croniter()(self.cron).expanded[1] == ["*"]:  # every hour (`*`, @hourly)
            return False
        return local.replace(fold=0).timestamp() != tick

    def words(self) -> str:
        return f"{self.cron} ({self.timezone})"

    def _at(self, when: float) -> dt.datetime:
        return dt.datetime.fromtimestamp(when, ZoneInfo(self.timezone))


def _croniter() -> type[croniter]:
    """croniter (with dateutil, ~10 ms to import), for the plays and commands that have a schedule."""
    from croniter import croniter

    return croniter


def schedule_of(
    name: str,
    cron: str | None,
    input: Any,
    timezone: str | None,
    catch_up: str | None,
    *,
    schema: Schema | None = None,
    owner: str = "",
    input_key: str = "schedule_input",
) -> Schedule | None:
    """A schedule as declared (`@play(schedule=...)` or `[schedules.NAME]`), checked now: a
    bad one fails when it is loaded, its input against the play's `schema` too. `owner`
    starts each error (default: the play), naming the input as `input_key`."""
    owner = owner or f"Play {name!r}"
    if cron is None:
        if input is not None or timezone is not None or catch_up is not None:
            raise PlayLoadError(f"{owner}: schedule_input, timezone and catch_up need a schedule=.")
        return None
    if not isinstance(cron, str) or not _croniter().is_valid(cron):
        raise PlayLoadError(
            f'{owner}: schedule {cron!r} is not a cron expression; write it like "0 6 * * *" '
            "(minute hour day month weekday), with an optional sixth field for seconds."
        )
    zone = timezone or "UTC"
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise PlayLoadError(f'{owner}: timezone {zone!r} is not known; use a name like "Europe/Paris".') from None
    if catch_up not in (None, "latest", "none"):
        raise PlayLoadError(f'{owner}: catch_up must be "latest" or "none", not {catch_up!r}.')
    chosen: CatchUp = "none" if catch_up == "none" else "latest"
    given = {} if input is None else input
    if schema is not None and (found := violation(schema, given)) is not None:
        raise PlayLoadError(f"{owner}: {input_key}: {found.sentence('Input')}")
    return Schedule(cron, given, zone, chosen, name)


def tick_run_ids(schedule: str, tick: float) -> list[str]:
    """`sched-<schedule>-<UTC time of the tick>`, the same for every worker that fires it; then
    the id an earlier deepline gave the tick (if another): see `_slugs`."""
    stamp = dt.datetime.fromtimestamp(tick, dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return [f"{prefix}{stamp}" for prefix in tick_prefixes(schedule)]


def tick_prefixes(schedule: str) -> list[str]:
    """What every run id of the schedule's ticks starts with (now, and before)."""
    return [f"sched-{slug}-" for slug in _slugs(schedule)]


def is_tick_of(run_id: str, schedule: str) -> bool:
    """Is this run one of the schedule's ticks (`daily`'s, not `daily-eu`'s)?"""
    return any(
        run_id.startswith(prefix) and re.fullmatch(r"\d{8}T\d{6}Z", run_id[len(prefix) :]) is not None
        for prefix in tick_prefixes(schedule)
    )


def delivery_run_ids(play: str, delivery_id: str) -> list[str]:
    """`hook-<play>-<digest of the delivery id>`, the same for every retry of a delivery; then
    the id an earlier deepline gave it (if another): see `_slugs`."""
    digest = hashlib.sha256(delivery_id.encode()).hexdigest()[:20]
    return [f"hook-{slug}-{digest}" for slug in _slugs(play)]


def is_delivery_run(run_id: str, play: str) -> bool:
    """Is `run_id` one `delivery_run_ids` gives for `play`?"""
    for slug in _slugs(play):
        head = f"hook-{slug}-"
        digest = run_id[len(head) :]
        if run_id.startswith(head) and len(digest) == 20 and all(c in "0123456789abcdef" for c in digest):
            return True
    return False


SLUG_MAX = 60  # characters of a name a run id holds
SLUG_DIGEST = 8  # hex characters of the whole name's digest, for a name cut or changed


def _slugs(name: str) -> list[str]:
    """The name as run ids hold it: itself when it is safe and short; else cut, with a digest
    of the whole name, so names alike up to the cut (or but for characters taken out) stay
    apart. Then, if another, the slug deepline gave such a name before (cut, no digest): the
    runs a schedule or webhook play had under it are its runs still (its ticks and deliveries
    are not queued again under the new one); names alike up to the cut shared it."""
    safe = _UNSAFE.sub("-", name).strip("-")
    if safe and safe == name and len(safe) <= SLUG_MAX:
        return [safe]
    digest = hashlib.sha256(name.encode()).hexdigest()[:SLUG_DIGEST]
    return [f"{safe[: SLUG_MAX - SLUG_DIGEST - 1].rstrip('-') or 'play'}-{digest}", safe[:SLUG_MAX] or "play"]
