"""What `deepline runs show` says about a run, read from the store (no drawing here).

`--full` adds everything else the store knows, untruncated: each map's sheet, columns
and times, per-tool retries by cause, the attempts (who ran them, when, how they ended),
each boundary's payload, child runs, the whole output, the error's traceback, and why
the run was asked to stop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deepline_cli import _json
from deepline_cli._format import format_credits, kept_said, retry_causes
from deepline_cli.runtime.run.holders import holder_gone_here, holder_stale, holder_words
from deepline_cli.store.ledger import AttemptRow
from deepline_cli.store.records import Boundary, MapRecord, RunRecord
from deepline_cli.store.roles import Store

SHORT_OUTPUT = 2000  # characters of output `runs show` prints without --full


def run_dict(r: RunRecord) -> dict[str, Any]:
    return {
        "run_id": r.run_id,
        "play": r.play,
        "status": r.status,
        "attempt": r.attempt,
        "trigger": r.options.get("trigger"),  # "schedule …", "webhook …", or None: started by hand
        "parent_run_id": r.parent_run_id,
        "root_run_id": r.root_run_id,
        "play_ref": r.play_ref,
        "workspace": r.workspace,
        "input": r.input,
        "output": r.output,
        "error": r.error,
        "stats": r.stats,
        "holder": r.holder,
        "options": r.options,
        "scheduled": r.scheduled,
        "ancestors": r.ancestors,
        "description": r.description,
        "snapshot": r.snapshot,
        "wake_at": r.wake_at,
        "created_at": r.created_at,
        "updated_at": r.updated_at,
        "finished_at": r.finished_at,
    }


@dataclass
class Shown:
    run: RunRecord
    maps: list[MapRecord]
    boundaries: list[Boundary]
    children: list[RunRecord]
    full: bool = False
    attempts: list[AttemptRow] = field(default_factory=list)
    # --full: per tool, the ledger's counts with what only the run's outcome kept (retries by
    # cause, failures a waterfall got past)
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    stale: bool = False  # `running`, but no live process holds it (killed, paused past its lease, a machine lost)
    gone: bool = False  # stale, and the OS of this machine says its process is gone


def read_shown(store: Store, record: RunRecord, *, full: bool = False) -> Shown:
    recorded = record.stats or {}
    # Counted from the store, so a run killed mid-way shows what it really did.
    record.stats = {**recorded, **store.ledger.run_stats(record.run_id)}
    # The ledger counts a call's retries when it ends: an interrupted call's are in the run's stats.
    record.stats["tools"] = merged_tools(record.stats.get("tools") or {}, recorded.get("tools") or {})
    now = store.now()
    stale = holder_stale(record, now)
    if record.status == "running" and not stale:
        # Going on: how long so far (a run no process holds keeps the span its attempts were heard in).
        record.stats["duration_s"] = max(0.0, now - (record.created_at or now))
    maps = maps_now(store, record.run_id)
    shown = Shown(record, maps, store.suspension.boundaries(record.run_id), store.runs.child_runs(record.run_id), full)
    shown.stale = stale
    shown.gone = stale and holder_gone_here(record)
    if full:
        shown.attempts = store.ledger.attempt_rows(record.run_id)
        shown.tools = record.stats["tools"]
    return shown


def maps_now(store: Store, run_id: str) -> list[MapRecord]:
    """The run's maps as far as they got: a map's record is written when it starts and ends,
    so one that has not completed (still running, stopped, its process dead) is counted from
    the rows every attempt wrote, as the run's own row counts are."""
    maps = store.sheets.get_maps(run_id)
    for m in maps:
        if m.status != "completed":
            counts = store.sheets.count_map_rows(run_id, m.map)
            m.succeeded, m.failed = counts.get("succeeded", 0), counts.get("failed", 0)
            duplicates, reused = store.sheets.unfinished_counts(run_id, m.map)
            m.duplicate = max(m.duplicate, duplicates)  # a killed map wrote none
            m.reused = reused
    return maps


def merged_tools(counted: dict[str, Any], recorded: dict[str, Any]) -> dict[str, dict[str, Any]]:
    tools: dict[str, dict[str, Any]] = {}
    for tool_id in sorted({*counted, *recorded}):
        ledger, kept = counted.get(tool_id) or {}, recorded.get(tool_id) or {}
        tools[tool_id] = {
            "live": int(ledger.get("live", 0)),
            "reused": int(ledger.get("reused", 0)),
            "failed": int(ledger.get("failed", 0)),
            "kept": int(ledger.get("kept", 0)),  # of the failed, given back from earlier runs' receipts
            "credits": float(ledger.get("credits", 0.0)),
            # The ledger counts a call's retries when it ends; an interrupted call's are kept
            # with the run's outcome.
            "retries": (retries := max(int(ledger.get("retries", 0)), int(kept.get("retries", 0)))),
            "retry_reasons": retry_causes(kept.get("retry_reasons"), retries),
            "recovered": int(ledger.get("recovered", 0)),  # of the failed, those whose cell got past them
            "not_found": int(ledger.get("not_found", 0)),  # "not found" answers (404) a row got past
        }
    return tools


# --- JSON -----------------------------------------------------------------------------------


def shown_dict(s: Shown) -> dict[str, Any]:
    out = run_dict(s.run)
    out["stale"] = s.stale
    out["boundaries"] = [_boundary_dict(b, s.full) for b in s.boundaries]
    out["children"] = [c.run_id for c in s.children]
    out["maps"] = [_map_dict(m, s.full) for m in s.maps]
    if s.full:
        out["stop_reason"] = s.run.stop_reason
        out["tools"] = s.tools
        out["attempts"] = [
            {"attempt": a.attempt, "holder": a.holder, "started_at": a.started_at, "seen_at": a.seen_at,
             "ended_at": a.ended_at, "status": a.status}
            for a in s.attempts
        ]  # fmt: skip
        out["child_runs"] = [
            {"run_id": c.run_id, "play": c.play, "status": c.status, "attempt": c.attempt} for c in s.children
        ]
    return out


def _boundary_dict(b: Boundary, full: bool) -> dict[str, Any]:
    out = {"id": b.id, "kind": b.kind, "status": b.status, "due_at": b.due_at, "event_id": b.event_id,
           "child_run_id": b.child_run_id}  # fmt: skip
    if full:
        out.update(payload=b.payload, created_at=b.created_at, resolved_at=b.resolved_at)
    return out


def _map_dict(m: MapRecord, full: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"map": m.map, "rows": m.total, "succeeded": m.succeeded, "failed": m.failed,
                           "duplicate": m.duplicate, "reused": m.reused, "status": m.status}  # fmt: skip
    if full:
        out.update(sheet=m.sheet, input_columns=m.input_columns, columns=m.columns, started_at=m.started_at,
                   finished_at=m.finished_at, pilot=m.pilot)  # fmt: skip
    return out


# --- text -----------------------------------------------------------------------------------


def _stale_words(s: Shown) -> str:
    """Why no process holds a `running` run: its process is gone (the OS says so), or it
    let its lease run out (stopped: Ctrl-Z, a debugger; or on a machine that was lost)."""
    return "its process is gone" if s.gone else "its process let its lease run out (stopped, or its machine lost)"


def shown_lines(s: Shown, when: Any) -> list[str]:
    """The text of `runs show` (`when` formats a timestamp)."""
    r, stats = s.run, s.run.stats or {}
    lines = [
        f"run       {r.run_id}",
        f"play      {r.play}  ({r.play_ref})",
        f"status    {r.status}"
        + (f" (stale: {_stale_words(s)}; deepline resume {r.run_id} continues it)" if s.stale else ""),
    ]
    if s.full and r.stop_reason:
        lines.append(f"stop      {r.stop_reason}")
    lines += [
        f"attempts  {r.attempt}",
        f"created   {when(r.created_at)}",
        f"finished  {when(r.finished_at)}",
        f"duration  {stats.get('duration_s', 0):.2f}s",
        f"credits   {format_credits(stats.get('credits', 0))}",
    ]
    if r.parent_run_id:
        lines.append(f"parent    {r.parent_run_id}  (root {r.root_run_id})")
    for m in s.maps:
        lines.append(
            f"map       {m.map}: {m.total:,} rows ({m.succeeded:,} succeeded, {m.failed:,} failed, "
            f"{m.duplicate:,} duplicate, {m.reused:,} reused)  [{m.status}]"
        )
        if s.full:
            lines.append(f"          sheet {m.sheet}  columns {', '.join(m.columns) or '-'}  "
                         f"started {when(m.started_at)}  finished {when(m.finished_at) or '-'}")  # fmt: skip
    rows = stats.get("rows") or {}
    if any(rows.values()):
        lines.append("rows      " + "  ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in rows.items()))
    lines += _tool_lines(s, stats)
    for a in s.attempts:
        status = a.status or "running"
        if status == "running" and s.stale and a.attempt == r.attempt:
            status = _stale_words(s)
        lines.append(f"attempt   #{a.attempt}  {holder_words(a.holder) or '-'}  started {when(a.started_at)}  "
                     f"ended {when(a.ended_at) or '-'}  [{status}]")  # fmt: skip
    for b in s.boundaries:
        detail = {
            "sleep": f"due {when(b.due_at)}",
            "event": f"event {b.event_id!r}",
            "child": f"child run {b.child_run_id}",
        }.get(b.kind, "")
        lines.append(f"boundary  {b.kind:<6} {b.id}  {detail}  [{b.status}]")
        if s.full and b.payload is not None:
            lines.append(f"          payload {_json.dumps_str(b.payload)}")
    for child in s.children:
        lines.append(f"child     {child.run_id}  {child.play}  {child.status}")
    lines += _error_lines(s)
    if r.output is not None:
        text = _json.dumps_str(r.output)
        lines.append(f"output    {text if s.full else text[:SHORT_OUTPUT]}")
    return lines


def _tool_lines(s: Shown, stats: dict[str, Any]) -> list[str]:
    """As the live view says it: `failed` the final failures, `fell back` those a later
    step got past (the JSON's `failed` counts both, `recovered` the latter)."""
    if not s.full:
        return [
            f"tool      {tool_id}: live {c['live']:,}  reused {c['reused']:,}  {_failures(c)}  "
            f"credits {format_credits(c['credits'])}"
            for tool_id, c in sorted((stats.get("tools") or {}).items())
        ]
    lines = []
    for tool_id, c in s.tools.items():
        reasons = ", ".join(f"{k} {v:,}" for k, v in c["retry_reasons"].items())
        lines.append(
            f"tool      {tool_id}: live {c['live']:,}  reused {c['reused']:,}  {_failures(c)}  "
            f"retries {c['retries']:,}{f' ({reasons})' if reasons else ''}  credits {format_credits(c['credits'])}"
        )
    return lines


def _failures(c: dict[str, Any]) -> str:
    recovered, kept, missed = int(c.get("recovered", 0)), int(c.get("kept", 0)), int(c.get("not_found", 0))
    said = f"not found {missed:,}  " if missed else ""  # "not found" answers (404) a row got past
    said += f"failed {int(c.get('failed', 0)) - recovered:,}"
    said += f"  fell back {recovered:,}" if recovered else ""
    return said + (f" ({kept_said(kept)})" if kept else "")


def _error_lines(s: Shown) -> list[str]:
    error = s.run.error
    if not error:
        return []
    lines = [f"error     {error.get('message')}"]
    if s.full:
        lines += [f"          {k}: {as_text}" for k, as_text in _error_details(error)]
        trace = error.get("traceback")
        if trace:
            lines += ["          " + line for line in str(trace).rstrip("\n").splitlines()]
    return lines


def _error_details(error: dict[str, Any]) -> list[tuple[str, str]]:
    skip = ("message", "traceback")
    return [(k, v if isinstance(v, str) else _json.dumps_str(v)) for k, v in error.items() if k not in skip and v]
