"""Runs: start, resume, lease, interrupt, finish.

A run is leased like a receipt: its holder (host and pid) heartbeats the lease while
the play executes. `resume` refuses a run a live process holds, takes over at once a
run whose holder on this machine is gone, and one held elsewhere once its lease expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets as _secrets
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, cast

from deepline_cli import _json
from deepline_cli.errors import (
    DeeplineError,
    PlayLoadError,
    RunBusyError,
    RunInterrupted,
    UsageError,
    error_dict,
)
from deepline_cli.runtime.calls.events import EventBus
from deepline_cli.runtime.calls.store_thread import Reconnecting, StoreIO, unwrapped
from deepline_cli.runtime.providers.config import find_config, load_config
from deepline_cli.runtime.providers.secrets import Secrets
from deepline_cli.runtime.run.attempt import Attempt, env_folder
from deepline_cli.runtime.run.builtin import BUILTIN_PLAYS
from deepline_cli.runtime.run.holders import holder_alive, holder_id, holder_words
from deepline_cli.runtime.run.input_files import changed, named_elsewhere, stamps
from deepline_cli.runtime.run.options import RunOptions, RunResult
from deepline_cli.runtime.run.play import PlayDef, load_module, load_play, tools_in
from deepline_cli.runtime.run.snapshot import code_record, materialize_snapshot, take_snapshot
from deepline_cli.runtime.run.suspension import ready_to_resume, waiting_on
from deepline_cli.store import open_store
from deepline_cli.store.records import CELL_KEYS, CODE, REFRESH_GIVEN_FOR, RunRecord
from deepline_cli.store.roles import Store


def new_run_id() -> str:
    return "r-" + _secrets.token_hex(6)


RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_run_id(run_id: str) -> str:
    """A run id becomes a file name (`runs report`) and is printed: letters, digits, `.`, `_`
    and `-`, starting with a letter or digit, at most 128 characters."""
    if not run_id.strip():
        raise UsageError(
            f"Run id {run_id!r} is empty (an unset variable?): give the run's id, or leave --run-id out for a new run."
        )
    if not RUN_ID.fullmatch(run_id):
        raise UsageError(
            f"Run id {run_id!r} is not valid: use letters, digits, '.', '_' and '-', starting with a letter "
            "or digit, at most 128 characters."
        )
    return run_id


def find_play(ref: str) -> PlayDef:
    """A built-in play by its `builtin:NAME` ref, else the play file's."""
    return BUILTIN_PLAYS.get(ref) or load_play(ref)


class Runner:
    """Starts and resumes runs against one store."""

    def __init__(self, options: RunOptions, bus: EventBus, store: Store | None = None) -> None:
        self.options = options
        self.bus = bus
        self.store = cast(Store, Reconnecting(store or open_store(options.store)))
        self.attempt: Attempt | None = None
        self.stop_pending = False
        # Called just before the run is recorded: the command hands Ctrl-C to the run then.
        self.before_recording: Callable[[], None] | None = None
        self.borrowed_tools: dict[str, Any] = {}  # the @tools of options.tools_from
        # A refresh flag given on this command line (not only kept from the run's start):
        # known before a run's stored flags are copied into the options.
        self._refresh_given: bool | None = None

    def close(self) -> None:
        self.store.close()

    # --- entry points ---------------------------------------------------------------------

    def start(self, play_ref: str, input: Any, *, cwd: str | None = None, enqueue: bool = False) -> RunResult:
        """`deepline run`: a new run, or with --run-id an existing one reported or resumed.

        With `enqueue`, the run is only recorded (`queued`, with a snapshot of the play's
        source and config) for a `deepline worker` to execute.
        """
        if self.options.run_id is not None:
            existing = self.store.runs.get_run(check_run_id(self.options.run_id))
            if existing is not None:
                loaded = self._same_run(existing, play_ref, input, cwd or os.getcwd())
                return self._requeue(existing) if enqueue else self.resume(existing.run_id, loaded)
        play = find_play(play_ref)
        if enqueue and play.builtin:
            raise UsageError(f"The built-in play {play.name!r} runs here only; it cannot be enqueued.")
        play.check_input(input)  # a refused input fails now, before the run exists
        config_path = find_config(Path(play.file), self.options.config)
        load_config(config_path)  # a broken deepline.toml fails now, before the run exists
        self.options.config = str(config_path) if config_path else None
        if not enqueue:  # a queued run's secrets are the worker's, checked when it runs
            self._prepare(play, cwd or os.getcwd())
        now = self.store.now()
        run_id = self.options.run_id if self.options.run_id is not None else new_run_id()
        options = {**self.options.persisted(), CELL_KEYS: True}
        if self.options.run_id is not None:  # only a run named again by `--run-id` is checked against its files
            options["input_files"] = stamps(input, cwd or os.getcwd())
        digest = None
        if enqueue:
            digest, snapshot = take_snapshot(play, config_path)
            self.store.queue.put_snapshot(digest, snapshot)
        else:  # run from its file: a resume may find it changed
            options[CODE] = code_record(play)
        record = RunRecord(
            run_id=run_id, play=play.name, play_ref=play.ref, input=input,
            status="queued" if enqueue else "running", attempt=0 if enqueue else 1,
            workspace=self.options.workspace, cwd=cwd or os.getcwd(), options=options, root_run_id=run_id,
            holder=None if enqueue else holder_id(), lease_expires_at=0.0 if enqueue else now + self.options.lease_ttl,
            created_at=now, updated_at=now, snapshot=digest,
        )  # fmt: skip
        self._recording()
        if not self.store.runs.insert_run(record):
            # Another process created this --run-id a moment ago: report it, or resume it
            # (which refuses while that process holds it: busy).
            return self._requeue(self.store.runs.get_run(run_id) or record) if enqueue else self.resume(run_id)
        if enqueue:
            self.store.queue.notify()
            return RunResult(run_id, "queued", 0)
        return self._execute(play, record)

    def _same_run(self, existing: RunRecord, play_ref: str, input: Any, cwd: str) -> PlayDef | None:
        """`--run-id` of an existing run names that run: the same play and input are reported
        or resumed (the play loaded here, for the resume); another play or input under it is
        refused (a nightly job with a fixed id must not be told last night's run completed)."""
        try:
            play: PlayDef | None = find_play(play_ref)
        except DeeplineError:
            play = None  # the play no longer loads: the run is reported or resumed as it was
        name = play.name if play is not None else existing.play
        run_id = existing.run_id
        if name != existing.play:
            differs = f"of play {existing.play!r}, not {name!r}"
        elif (existing.workspace or "default") != self.options.workspace:  # its receipts and sheets are another's
            differs = f"of workspace {existing.workspace or 'default'!r}, not {self.options.workspace!r}"
        elif _json.loads(_json.dumps(input)) != existing.input:  # as stored (JSON), in any key order
            differs = f"of play {existing.play!r} with another input"
        elif (elsewhere := named_elsewhere(input, existing.cwd, cwd, existing.options.get("input_files"))) is not None:
            raise UsageError(
                f"Run {run_id} read {elsewhere[0]}; from here its input names {elsewhere[1]}: run it from "
                f"{existing.cwd} to go on with that run, or give this run a new --run-id."
            )
        elif existing.status == "completed" and (rewritten := changed(existing.options.get("input_files"))):
            since = "has been written since" if Path(rewritten).exists() else "is gone since"
            raise UsageError(
                f"Run {run_id} completed on {rewritten} as it was then, and that file {since}; give "
                f"this run a new --run-id (say {run_id}-{time.strftime('%Y-%m-%d')}), or see that run's results "
                f"with `deepline export {run_id}`."
            )
        elif existing.options.get("limit") != self.options.limit:
            # A pilot (--limit 5) and the whole list under one id: never one told it is the other.
            was, now = existing.options.get("limit"), self.options.limit
            asked = "every row" if now is None else f"--limit {now}"
            done = "every row" if was is None else f"--limit {was} (the first {was} rows of each map)"
            then = "completed with" if existing.status == "completed" else "was started with"
            raise UsageError(
                f"Run {run_id} {then} {done}; this run asks for {asked}: give it a new --run-id, or "
                + (
                    f"see that run's results with `deepline export {run_id}`."
                    if existing.status == "completed"
                    else f"continue that one as it was with `deepline resume {run_id}`."
                )
            )
        else:
            return play
        raise UsageError(
            f"Run {run_id} is a run {differs}; give this run a new --run-id, or continue that one "
            f"as it was with `deepline resume {run_id}`."
        )

    def enqueue_new(
        self, play: PlayDef, input: Any, run_id: str, trigger: str, *, subject: str = "Input", folder: str | None = None
    ) -> bool:
        """Queue a run of `play` under `run_id` for a worker, unless a run with that id exists
        (a tick another worker fired, a delivery sent again): then nothing is queued, and
        nothing is re-queued either. True if this call queued it. `trigger` says what
        started it (`runs list`); `subject`, what a refused input is called. Its relative
        paths are `folder`'s (a deepline.toml's), else the play folder's: the same tick means
        the same file on every worker."""
        play.check_input(input, subject=subject)
        config_path = find_config(Path(play.file), self.options.config)
        load_config(config_path)
        self.options.config = str(config_path) if config_path else None
        if self.store.runs.get_run(check_run_id(run_id)) is not None:
            return False
        digest, snapshot = take_snapshot(play, config_path)
        self.store.queue.put_snapshot(digest, snapshot)
        now = self.store.now()
        record = RunRecord(
            run_id=run_id, play=play.name, play_ref=play.ref, input=input, status="queued", attempt=0,
            workspace=self.options.workspace, cwd=folder or str(Path(play.file).resolve().parent),
            options={**self.options.persisted(), "trigger": trigger, CELL_KEYS: True}, root_run_id=run_id,
            holder=None, lease_expires_at=0.0, created_at=now, updated_at=now, snapshot=digest,
        )  # fmt: skip
        if not self.store.runs.insert_run(record):
            return False
        self.store.queue.notify()
        return True

    def _requeue(self, record: RunRecord) -> RunResult:
        """`run --enqueue --run-id` of an existing run: report it, or queue it again for a
        worker (never run it here)."""
        if record.status in ("queued", "completed"):
            return RunResult.of_record(record, fail_on_row_errors=False)
        if record.status == "waiting":  # a worker continues it once its timer, event or child is due
            result = RunResult.of_record(record, fail_on_row_errors=False)
            result.waiting = waiting_on(self.store, record.run_id)
            return result
        if holder_alive(record, self.store.now()):
            raise RunBusyError(f"Run {record.run_id} is held by a live process ({holder_words(record.holder)}).")
        self._refuse_a_childs_budget(record)
        before = dict(record.options)
        self._apply_persisted(record)  # the flags given now (a higher --max-credits) hold for the worker
        if self.options.refresh_given:  # asked now: the next attempt refreshes the run's own failures
            record.options[REFRESH_GIVEN_FOR] = record.attempt + 1
        if record.options != before:
            self.store.runs.update_run(record.run_id, options=record.options)
        self.store.runs.set_status(record.run_id, "queued", holder=None, lease_expires_at=0.0)
        self.store.queue.notify()
        return RunResult(record.run_id, "queued", record.attempt)

    def root_going_on(self, run_id: str) -> list[str]:
        """The root of a child play run inside its parent's process, while the root has not
        completed (a resume of the child alone does not take the root on): [root id], or []."""
        record = self.store.runs.get_run(run_id)
        if record is None or record.parent_run_id is None or record.scheduled or not record.root_run_id:
            return []
        root = self.store.runs.get_run(record.root_run_id)
        return [root.run_id] if root is not None and root.status != "completed" else []

    def resume(self, run_id: str, loaded: PlayDef | None = None) -> RunResult:
        """`deepline resume`: the next attempt of a run, replaying what it already did
        (`loaded`: its play, if this command has loaded it already)."""
        record = self.store.runs.get_run(run_id)
        if record is None:
            raise UsageError(f"No run {run_id!r} in the store {self.store.url}.")
        self._refuse_a_childs_budget(record)
        if record.status == "completed":
            # Its failed rows fail the command as the run was started to, or as this one asks.
            return RunResult.of_record(record, fail_on_row_errors=self.options.fail_on_row_errors or None)
        if record.status == "waiting":
            before = dict(record.options)
            self._apply_persisted(record)
            if not ready_to_resume(self.store, run_id, self.store.now(), self.options.max_inline_wait):
                if self.options.refresh_given:  # asked now: the attempt that wakes it refreshes
                    record.options[REFRESH_GIVEN_FOR] = record.attempt + 1
                if record.options != before:
                    self.store.runs.update_run(run_id, options=record.options)  # flags given now hold later
                result = RunResult.of_record(record, fail_on_row_errors=False)
                result.waiting = waiting_on(self.store, run_id)
                return result
        if holder_alive(record, self.store.now()):
            raise RunBusyError(
                f"Run {run_id} is held by a live process ({holder_words(record.holder)}); "
                "wait for it to finish or stop that process first."
            )
        # A play that no longer loads, or a secret not set: refused before the run is taken,
        # so the run stays as it was (its attempts, status and error), to be resumed once fixed.
        play = self._ready(record, loaded)
        attempt = record.attempt + 1
        self._recording()
        holder, expires = holder_id(), self.store.now() + self.options.lease_ttl
        taken = self.store.runs.lease_run(run_id, holder=holder, expires_at=expires, attempt=attempt,
                                     expect_attempt=record.attempt,
                                     expect_expires=record.lease_expires_at or 0.0)  # fmt: skip
        if not taken:
            raise RunBusyError(f"Run {run_id} was just taken by another process.")
        record.holder, record.lease_expires_at = holder, expires  # this process holds it now
        record.attempt = attempt
        return self._run_taken(record, play)

    def run_claimed(self, record: RunRecord, loaded: PlayDef | None = None) -> RunResult:
        """Execute a run a worker has just leased. A play that no longer loads, or a secret
        not set, ends its attempt at once (the worker took the run: it says so)."""
        try:
            play = self._ready(record, loaded)
        except DeeplineError as exc:
            self.store.receipts.expire_run_receipts(record.run_id, before_attempt=record.attempt)
            now = self.store.now()
            self.store.runs.begin_attempt(record.run_id, record.attempt, record.holder or holder_id(), now)
            self.store.runs.end_attempt(record.run_id, record.attempt, "failed", now)
            self.store.runs.set_status(record.run_id, "failed", holder=None, error=error_dict(exc), finished_at=now)
            raise
        return self._run_taken(record, play)

    def _ready(self, record: RunRecord, loaded: PlayDef | None = None) -> PlayDef:
        """The run's play, ready for an attempt: the run's options applied (a snapshot's config
        among them), the play loaded, its secrets checked."""
        self._apply_persisted(record)
        play = self._load(record, loaded)
        self._prepare(play, record.cwd, snapshot=bool(record.snapshot))
        return play

    def _run_taken(self, record: RunRecord, play: PlayDef) -> RunResult:
        """Execute a run this process holds now (by `resume`, or a worker's claim), its play ready."""
        self.store.receipts.expire_run_receipts(record.run_id, before_attempt=record.attempt)
        record.status = "running"
        given_for = record.options.get(REFRESH_GIVEN_FOR)
        if given_for == record.attempt:  # queued again with --refresh-failed
            self.options.refresh_given = True
        if self.options.refresh_given:  # a later attempt asks what this one does not get to (a budget stop)
            record.options[REFRESH_GIVEN_FOR] = record.attempt
        return self._execute(play, record)

    def _prepare(self, play: PlayDef, cwd: str, *, snapshot: bool = False) -> None:
        """Before any call: every secret the play declares is set, and the tools the run
        borrows (`tools_from`) load."""
        secrets = Secrets(env_folder(play, self.options, cwd, snapshot=snapshot))
        play.require_secrets(secrets.lookup, secrets.env_file)
        tools_from = self.options.tools_from
        self.borrowed_tools = tools_in(vars(load_module(Path(tools_from)))) if tools_from else {}

    def _load(self, record: RunRecord, loaded: PlayDef | None = None) -> PlayDef:
        """The run's play: from its file (not imported a second time if `loaded` is it), or
        from its snapshot."""
        if not record.snapshot:
            return loaded if loaded is not None and loaded.ref == record.play_ref else find_play(record.play_ref)
        snapshot = self.store.queue.get_snapshot(record.snapshot)
        if snapshot is None:
            raise PlayLoadError(f"Run {record.run_id}'s play source ({record.snapshot}) is not in the store.")
        play_ref, config = materialize_snapshot(record.snapshot, snapshot)
        self.options.config = config
        return load_play(play_ref)

    def _refuse_a_childs_budget(self, record: RunRecord) -> None:
        """A child run spends its root's budget: a budget given to it alone is refused."""
        if record.parent_run_id and self.options.max_credits is not None:
            root = record.root_run_id or record.parent_run_id
            raise UsageError(
                f"Run {record.run_id} is a child play of run {root}, whose budget it spends: raise that one "
                f"(deepline resume {root} --max-credits {self.options.max_credits:g}), which resumes "
                "this one with it."
            )

    def _apply_persisted(self, record: RunRecord) -> None:
        """Flags not given again on resume come from the run's first start."""
        defaults = RunOptions(lease_ttl=self.options.lease_ttl)
        if self._refresh_given is None:  # applied twice (a waiting run resumed): the first time's
            self._refresh_given = self.options.force_refresh or self.options.refresh_failed
        self.options.refresh_given = self._refresh_given
        given = self.options.given
        for name, value in record.options.items():
            if name not in RunOptions.PERSISTED:
                continue
            if name not in given if given is not None else getattr(self.options, name) == getattr(defaults, name):
                setattr(self.options, name, value)
        self.options.workspace = record.workspace
        record.options = {**record.options, **self.options.persisted()}
        if "input_files" in record.options:  # the files its input names, as this attempt reads them
            record.options["input_files"] = stamps(record.input, record.cwd)

    # --- one attempt ----------------------------------------------------------------------

    def _execute(self, play: PlayDef, record: RunRecord) -> RunResult:
        io = StoreIO(unwrapped(self.store))  # the store thread reconnects by itself
        self.attempt = Attempt(self, play, record, io)
        try:
            return asyncio.run(self.attempt.run())
        finally:
            io.close()

    def _recording(self) -> None:
        """About to record the run (insert or lease it): from here a stop request ends it
        `interrupted`; one made already means it is not recorded at all."""
        if self.before_recording is not None:
            self.before_recording()
        if self.stop_pending:
            raise RunInterrupted("Interrupted before the run started; nothing was done.")

    def request_stop(self, *, again: bool = True) -> None:
        """From any thread or a signal handler: interrupt the attempt running now, or the
        next one as soon as it starts (a run not created yet is not created). `again`: a
        second such request stops at once (Ctrl-C twice); a worker's drain does not."""
        self.stop_pending = True
        attempt = self.attempt
        if attempt is not None and attempt.loop is not None:
            with contextlib.suppress(RuntimeError):  # its loop has closed: that attempt has ended
                attempt.loop.call_soon_threadsafe(partial(attempt.request_stop, again=again))
