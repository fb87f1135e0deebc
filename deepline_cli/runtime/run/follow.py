"""Following a run through the store alone: what `deepline runs tail` shows.

Another process runs the play (`deepline run`, `resume`, a worker on another machine);
this one only reads the store: the run's new log lines by id (each once, in the order
they were written), each running map's rows done every few seconds while they change,
and the run's outcome once it has ended or waits.

    run status ─► new log lines ─► ended or waiting? ─► log lines up to the end ─► run.finished
                                        └─ no: map progress (every PROGRESS_EVERY_S) ─► poll again

The status is read before the log lines: a run records how it ended only after its last
line is committed, so the lines read after an ended status are all of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from deepline_cli.errors import UsageError
from deepline_cli.runtime.calls.events import Event
from deepline_cli.runtime.run.holders import holder_stale
from deepline_cli.runtime.run.options import RunResult
from deepline_cli.runtime.run.suspension import waiting_on
from deepline_cli.store.records import LogLine, RunRecord
from deepline_cli.store.roles import Store

ENDED = ("completed", "failed", "interrupted", "waiting")  # the run's process has stopped
POLL_S = 0.3
PROGRESS_EVERY_S = 2.0
PAGE = 500  # log lines per read


def log_event(line: LogLine) -> Event:
    """A stored log line as the run's own `log` event (with the line's id)."""
    data: dict[str, Any] = {
        "level": line.level,
        "message": line.message,
        "kind": line.kind,
        "attempt": line.attempt,
        "id": line.id,
    }
    if line.fields:
        data["fields"] = line.fields
    return Event("log", line.run_id, line.ts, data)


def result_of(store: Store, record: RunRecord) -> RunResult:
    """How a run ended, as the process that ran it reported it (its exit code included)."""
    result = RunResult.of_record(record)
    if record.status == "waiting":
        result.waiting = waiting_on(store, record.run_id)
    return result


class Follower:
    """The events of a run another process executes, read from the store as they happen."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        *,
        poll_s: float = POLL_S,
        progress_every_s: float = PROGRESS_EVERY_S,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.run_id = store, run_id
        self.poll_s, self.progress_every_s = poll_s, progress_every_s
        self._sleep, self._clock = sleep, clock
        self.after = 0  # the id of the last log line shown
        self._progress_due = 0.0
        self._shown: dict[str, tuple[int, int, int]] = {}  # map → (done, failed, total) last shown
        self._told_gone = False
        self.result: RunResult | None = None  # once the run has ended

    def events(self) -> Iterator[Event]:
        """Every event until the run has ended or waits (then `run.finished`, and stop)."""
        while True:
            status = self.store.runs.run_status(self.run_id)
            if status is None:
                raise UsageError(f"Run {self.run_id} is no longer in the store {self.store.url}.")
            yield from self._new_lines()
            if status in ENDED:
                record = self.store.runs.get_run(self.run_id)
                if record is not None and record.status in ENDED:  # (not resumed in between)
                    yield from self._new_lines()  # up to its end
                    self.result = result_of(self.store, record)
                    yield Event(
                        "run.finished", self.run_id, self.result.finished_at or time.time(),
                        self.result.finished_event(),
                    )  # fmt: skip
                    return
            if self._clock() >= self._progress_due:
                self._progress_due = self._clock() + self.progress_every_s
                yield from self._progress(status)
            self._sleep(self.poll_s)

    def _new_lines(self) -> Iterator[Event]:
        while True:
            lines = self.store.ledger.logs_after(self.run_id, self.after, PAGE)
            for line in lines:
                self.after = line.id
                yield log_event(line)
            if len(lines) < PAGE:
                return

    def _progress(self, status: str) -> Iterator[Event]:
        """A `map.progress` event per running map whose counts changed since the last one,
        counted from the rows the run's attempts finished."""
        for m in self.store.sheets.get_maps(self.run_id):
            if m.status != "running":
                continue
            counts = self.store.sheets.count_map_rows(self.run_id, m.map)
            succeeded, failed = counts.get("succeeded", 0), counts.get("failed", 0)
            now = (succeeded + failed, failed, m.total)
            if self._shown.get(m.map) == now:
                continue
            self._shown[m.map] = now
            yield Event(
                "map.progress", self.run_id, time.time(),
                {"map": m.map, "done": now[0], "total": m.total or None, "succeeded": succeeded, "failed": failed},
            )  # fmt: skip
        if status == "running" and not self._told_gone:
            record = self.store.runs.get_run(self.run_id)
            if record is not None and holder_stale(record, self.store.now()):
                self._told_gone = True  # said once; a resume or a worker may take it over
                yield Event("run.holder_gone", self.run_id, time.time(), {"holder": record.holder})
