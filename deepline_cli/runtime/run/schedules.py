"""Schedules fired by `deepline worker --play FILE`: one run per tick, across workers."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from deepline_cli.errors import DeeplineError
from deepline_cli.runtime.calls.events import EventBus
from deepline_cli.runtime.run.options import RunOptions
from deepline_cli.runtime.run.play import PlayDef
from deepline_cli.runtime.run.runner import Runner
from deepline_cli.runtime.run.triggers import tick_run_id


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
        worker ran across it): fired once; the ticks before it are not."""
        with self._runner() as runner:
            for play in self.plays:
                assert play.schedule is not None
                last = play.schedule.last_tick(now) if play.schedule.catch_up == "latest" else None
                if last is not None:
                    self._fire(runner, play, last)

    def fire(self, since: float, stop: threading.Event, poll_s: float) -> None:
        """The ticks after `since`, as they come (late ones at once, in order, none skipped),
        until `stop` is set."""
        with self._runner() as runner:
            due = {play.name: (play, play.schedule.next_tick(since)) for play in self.plays if play.schedule}
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
        run_id = tick_run_id(play.name, tick)
        try:
            queued = runner.enqueue_new(play, play.schedule.input, run_id, f"schedule {when} UTC")
        except DeeplineError as exc:
            self.report(f"worker: schedule of {play.name} at {when} UTC was not queued: {exc}")
            return
        if queued:
            self.report(f"worker: schedule of {play.name}: queued run {run_id} for {when} UTC")
            self.queued()
