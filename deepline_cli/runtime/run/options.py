"""What shapes a run (RunOptions: flags, the persisted ones kept for resumes) and what
a run ends with (RunResult: status, output, error, stats, and the exit code)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from deepline_cli.errors import UsageError
from deepline_cli.runtime.calls.caps import DEFAULT_MAX_DEPTH
from deepline_cli.store.records import RunRecord

# taken_over: another process took the run's lease while this one ran it (this process
# stopped without recording anything); the run's own status is whatever the new owner makes it.
EXIT_CODES = {"completed": 0, "queued": 0, "failed": 1, "waiting": 3, "taken_over": 4, "interrupted": 130}


def lease_ttl_from_env() -> float:
    raw = os.environ.get("DEEPLINE_LEASE_TTL", "30")
    try:
        ttl = float(raw)
    except ValueError:
        raise UsageError(f"DEEPLINE_LEASE_TTL must be a number of seconds, not {raw!r}.") from None
    if ttl <= 0:
        raise UsageError("DEEPLINE_LEASE_TTL must be more than 0 seconds.")
    return ttl


@dataclass
class RunOptions:
    """Flags that shape a run; the persisted ones come back on resume."""

    store: str | None = None
    workspace: str = "default"
    run_id: str | None = None
    concurrency: int | None = None
    limit: int | None = None
    force_refresh: bool = False
    refresh_failed: bool = False
    # A refresh flag was given to this attempt (not only kept from the run's start): the run's
    # own failures of earlier attempts are tried again too. Not persisted.
    refresh_given: bool = True
    max_credits: float | None = None
    # The flags given on this command line (None: not known, a flag at its default value
    # counts as not given): on resume, the others come from the run's start. Not persisted.
    given: frozenset[str] | None = None
    max_inline_wait: float = 30.0
    fail_on_row_errors: bool = False
    interrupt_grace_s: float = 5.0
    lease_ttl: float = field(default_factory=lease_ttl_from_env)

    config: str | None = None
    # A play file whose @tools the run may call besides its own play's (and whose folder's
    # .env it reads): `deepline tools execute --play FILE`. Kept with the run for resumes.
    tools_from: str | None = None
    max_depth: int = DEFAULT_MAX_DEPTH
    max_child_plays: int | None = None
    max_tool_calls: int | None = None
    schedule_children: bool = False  # set by workers, not persisted: how this process runs children
    # ctx.fetch may reach public addresses only (no cloud metadata, private network or
    # loopback): for workers running plays others wrote. Not persisted: the process decides.
    fetch_public_only: bool = field(default_factory=lambda: os.environ.get("DEEPLINE_FETCH_PUBLIC_ONLY") == "1")

    PERSISTED = (  # snapshot: see take_snapshot
        "concurrency",
        "limit",
        "force_refresh",  # a resume goes on refreshing the rows the run had not reached
        "refresh_failed",
        "max_credits",
        "max_inline_wait",
        "fail_on_row_errors",
        "config",
        "tools_from",
        "max_depth",
        "max_child_plays",
        "max_tool_calls",
    )

    def persisted(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k in self.PERSISTED}


@dataclass
class RunResult:
    run_id: str
    status: str
    attempt: int
    output: Any = None
    error: dict[str, Any] | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    reported: bool = False  # an already-finished run, reported rather than run
    finished_at: float | None = None  # when a reported run finished (its run.finished ts)
    fail_on_row_errors: bool = False
    waiting: list[dict[str, Any]] = field(default_factory=list)  # boundaries of a waiting run
    trigger: str = ""  # what started it, when not a person: "schedule 2026-12-05 06:00:00 UTC", "webhook <id>"
    play: str = ""  # the play's name (the export the verdict suggests is named after it)
    requeued: bool = False  # interrupted by a draining worker and put back in the queue

    @property
    def failed_rows(self) -> int:
        return int((self.stats.get("rows") or {}).get("failed", 0))

    @property
    def exit_code(self) -> int:
        if self.status == "failed" and self.error and "exit_code" in self.error:
            return int(self.error["exit_code"])
        if self.status == "completed" and self.fail_on_row_errors and self.failed_rows:
            return 1
        return EXIT_CODES.get(self.status, 1)

    @classmethod
    def of_record(cls, record: RunRecord, *, fail_on_row_errors: bool | None = None) -> RunResult:
        """A run that is not run here, reported as its record says; its exit code counts
        failed rows as the run was started to (or as `fail_on_row_errors` says)."""
        if fail_on_row_errors is None:
            fail_on_row_errors = bool(record.options.get("fail_on_row_errors"))
        return cls(
            record.run_id, record.status, record.attempt, record.output, record.error, record.stats,
            reported=True, finished_at=record.finished_at or record.updated_at, fail_on_row_errors=fail_on_row_errors,
            trigger=str(record.options.get("trigger") or ""), play=record.play,
        )  # fmt: skip

    def finished_event(self) -> dict[str, Any]:
        event = {
            "status": self.status,
            "attempt": self.attempt,
            "output": self.output,
            "error": self.error,
            "stats": self.stats,
            "exit_code": self.exit_code,  # what the process exits with (--fail-on-row-errors: 1)
        }
        if self.waiting:
            event["waiting"] = self.waiting
        return event
