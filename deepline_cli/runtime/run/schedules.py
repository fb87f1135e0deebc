"""Schedules fired by `deepline worker --play FILE`: one run per tick, across workers.

A schedule is declared on the play (`@play(schedule="0 6 * * *", schedule_input={...})`)
or in a `deepline.toml`, where one play can have several, each with its input:

    [schedules.enterprise]
    play = "refresh.py"          # relative to the deepline.toml (`file.py:NAME` picks a play)
    cron = "0 6 * * *"
    timezone = "Europe/Paris"    # default UTC
    input = { segment = "enterprise" }
    catch_up = "latest"          # or "none"
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from deepline_cli.errors import DeeplineError, UsageError
from deepline_cli.runtime.calls.events import EventBus
from deepline_cli.runtime.providers.config import check_keys, read_toml
from deepline_cli.runtime.run.options import RunOptions
from deepline_cli.runtime.run.play import PlayDef, load_play, load_plays
from deepline_cli.runtime.run.runner import Runner
from deepline_cli.runtime.run.triggers import is_tick_of, schedule_of, tick_prefixes, tick_run_ids
from deepline_cli.store.records import RunRecord

NEW_SCHEDULE_GRACE_S = 60.0  # a schedule that never ran fires a tick this recent when its first worker starts
SCHEDULE_KEYS: dict[str, type | tuple[type, ...]] = {
    "play": str, "cron": str, "input": dict, "timezone": str, "catch_up": str,
}  # fmt: skip


def scheduled_plays(ref: str, *, required: bool = True) -> list[PlayDef]:
    """The schedules of a play file's plays (or of the one `file.py:NAME` picks), or every
    `[schedules.NAME]` of a `deepline.toml`: each a play with the schedule it is fired on. A
    play file with none is an error if `required`."""
    if ref.endswith(".toml"):
        return schedules_in(Path(ref).expanduser().resolve())
    plays = load_plays(ref)
    scheduled = [play for play in plays if play.schedule is not None]
    if not scheduled and required:
        raise UsageError(f'{plays[0].file} has no schedule: declare one with @play(..., schedule="0 6 * * *").')
    return scheduled


def schedules_in(path: Path) -> list[PlayDef]:
    """The `[schedules.NAME]` tables of a `deepline.toml`, each checked whole (its play loads,
    its cron parses, its input fits the play's input schema) before anything is fired."""
    tables = read_toml(path).get("schedules")
    if not tables or not isinstance(tables, dict):
        raise UsageError(f"{path} declares no schedule: add a [schedules.NAME] table with play = and cron =.")
    plays = []
    for name, spec in tables.items():
        owner = f"{path}: schedule {name!r}"
        check_keys(path, f"schedule {name!r}", spec, SCHEDULE_KEYS)
        for needed, example in (("play", '"refresh.py"'), ("cron", '"0 6 * * *"')):
            if needed not in spec:
                raise UsageError(f"{owner} needs {needed} = {example}.")
        play = load_play(spec["play"], base=path.parent)
        # Its runs are named after the play and the table: `sched-refresh.enterprise-<tick>`.
        when = schedule_of(f"{play.name}.{name}", spec["cron"], spec.get("input", {}), spec.get("timezone"),
                           spec.get("catch_up"), schema=play.input_schema, owner=owner, input_key="input")  # fmt: skip
        # Its input's relative paths are the toml's, as its `play` is (not the play's folder).
        plays.append(replace(play, schedule=replace(when, folder=str(path.parent.resolve())) if when else when))
    return plays


class Ticks:
    """A worker's schedules: each play's ticks fired as runs queued for the workers. However
    many workers fire a tick, it is one run: its id is the play's and the tick's, and only
    the first insert queues it."""

    def __init__(
        self, store_url: str | None, plays: Sequence[PlayDef], report: Callable[[str], None], queued: Callable[[], None]
    ) -> None:
        self.store_url, self.plays, self.report, self.queued = store_url, plays, report, queued

    def catch_up(self, now: float) -> None:
        """Each schedule's latest tick at or before `now`, unless a run has it already (no
        worker ran across it): fired once; the ticks before it are not. A schedule that
        never ran has missed nothing but a tick of the last minute: a nightly play deployed
        in the afternoon first runs at its next tick, not at once."""
        with self._runner() as runner:
            for play in self.plays:
                assert play.schedule is not None
                last = play.schedule.last_tick(now) if play.schedule.catch_up == "latest" else None
                if last is not None and (now - last <= NEW_SCHEDULE_GRACE_S or self._has_run(runner, play)):
                    self._fire(runner, play, last)

    @staticmethod
    def _has_run(runner: Runner, play: PlayDef) -> bool:
        assert play.schedule is not None
        return any(
            (record := runner.store.runs.get_run(run_id)) is not None and is_its_tick(record, play)
            for prefix in tick_prefixes(play.schedule.name)
            for run_id in runner.store.runs.tick_run_ids(prefix, 10)
        )

    def fire(self, since: float, stop: threading.Event, poll_s: float) -> None:
        """The ticks after `since`, as they come (late ones at once, in order, none skipped),
        until `stop` is set."""
        with self._runner() as runner:
            due = {play.schedule.name: (play, play.schedule.next_tick(since)) for play in self.plays if play.schedule}
            while due and not stop.is_set():
                for name, (play, tick) in list(due.items()):
                    if tick <= time.time():
                        self._fire(runner, play, tick)
                        assert play.schedule is not None
                        due[name] = (play, play.schedule.next_tick(tick))
                soonest = min(tick for _, tick in due.values())
                stop.wait(max(0.0, min(soonest - time.time(), poll_s)))

    @contextlib.contextmanager
    def _runner(self) -> Iterator[Runner]:
        runner = Runner(RunOptions(store=self.store_url), EventBus([]))
        try:
            yield runner
        finally:
            runner.close()

    def _fire(self, runner: Runner, play: PlayDef, tick: float) -> None:
        assert play.schedule is not None
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(tick))
        run_id, *before = tick_run_ids(play.schedule.name, tick)
        if any((record := runner.store.runs.get_run(earlier)) is not None and is_its_tick(record, play)
               for earlier in before):  # fmt: skip
            return  # queued already, under the id an earlier deepline gave the tick
        try:
            queued = runner.enqueue_new(
                play, play.schedule.input, run_id, f"schedule {when} UTC", folder=play.schedule.folder or None
            )
        except DeeplineError as exc:
            self.report(f"worker: schedule of {play.name} at {when} UTC was not queued: {exc}")
            return
        if queued:
            self.report(f"worker: schedule of {play.name}: queued run {run_id} for {when} UTC")
            self.queued()


def is_its_tick(record: RunRecord, play: PlayDef) -> bool:
    """Is this run one of the play's schedule's ticks? Under the id an earlier deepline gave
    (the name cut alone: another name's id now, perhaps), only a run of this play with the
    schedule's input is."""
    assert play.schedule is not None
    name = play.schedule.name
    if not is_tick_of(record.run_id, name) or record.play != play.name:
        return False
    return record.run_id.startswith(tick_prefixes(name)[0]) or record.input == play.schedule.input
