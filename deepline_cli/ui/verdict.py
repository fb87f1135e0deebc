"""The last word on a run, for a person: how it ended, what it did, and the next command.

    ✓ Run r-8f2c completed in 0:42: 290 rows (281 succeeded, 9 failed, 12 duplicate), 714 credits.
      Next: deepline export r-8f2c --out lead-enrichment-export.csv · every failed row: deepline runs logs r-8f2c
        --kind row.failed

Plain text (no rich): `--quiet` and the plain view print it too.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from deepline_cli._format import format_credits
from deepline_cli.runtime.map.projection import describe
from deepline_cli.ui.state import step_hits
from deepline_cli.ui.text import printable


def verdict(
    run_id: str, status: str, stats: dict[str, Any], error: dict[str, Any] | None, play: str = "", trigger: str = ""
) -> list[str]:
    """One line saying how the run ended, then one with what to do next (stored text in
    them shown escaped: an error message may hold a provider's control characters). A run
    a schedule started says what it paid for: a nightly refresh pays only for rows that
    are new or stale since the last one."""
    said = _SAYS.get(status, _failed)
    lines = said(run_id, stats, error or {}, play)
    if trigger.startswith("schedule") and status == "completed":
        lines.insert(1, f"  Scheduled ({trigger.removeprefix('schedule ')}): {_paid_for(stats)}")
    return [printable(line) for line in lines]


def _paid_for(stats: dict[str, Any]) -> str:
    total, earlier, reused, now, _ = _origins(stats.get("rows") or {})
    attempts = f", {earlier:,} from earlier attempts" if earlier else ""
    if not total:
        return f"{_credits(stats)}."
    if not reused:
        return f"{now:,} rows computed now (none reused from earlier runs){attempts}, {_credits(stats)}."
    return (
        f"paid only for new or stale rows: {now:,} computed now, {reused:,} reused from earlier runs{attempts}, "
        f"{_credits(stats)}."
    )


def _completed(run_id: str, stats: dict[str, Any], error: dict[str, Any], play: str) -> list[str]:
    rows = stats.get("rows") or {}
    said = _rows(rows, len(stats.get("maps") or ()))
    lines = [f"✓ Run {run_id} completed in {clock(stats.get('duration_s', 0))}{said}, {_credits(stats)}."]
    tools = stats.get("tools") or {}
    # Calls made: failures given back from earlier runs' receipts made no request.
    live = sum(c.get("live", 0) + c.get("failed", 0) - c.get("kept", 0) for c in tools.values())
    reused = sum(c.get("reused", 0) + c.get("kept", 0) for c in tools.values())
    if live == 0 and (reused or rows.get("reused")):
        came = [counted(n, what) for n, what in ((rows.get("reused", 0), "row"), (reused, "call")) if n]
        lines.append(f"  Nothing was paid: {' and '.join(came)} came from earlier runs.")
    elif origin := row_origin(rows):
        lines.append(f"  Rows: {origin}.")
    for map_name, columns in (stats.get("waterfalls") or {}).items():
        for column, hits in columns.items():
            lines.append(f"  {map_name} {column} found by: {step_hits([], hits)}")
    if stats.get("projection"):  # a pilot (--limit): what the full list would cost and take
        lines.extend(f"  {line}" for line in describe(stats["projection"]))
    steps = []
    if rows.get("succeeded") or rows.get("failed"):
        steps.append(_export(run_id, play or "rows", stats.get("maps") or []))
    if rows.get("failed"):
        steps.append(f"every failed row: deepline runs logs {run_id} --kind row.failed")
    if stats.get("projection"):  # a pilot: a resume keeps its limit, the full list is a run of its own
        steps.append("the full list: the same command without --limit (the pilot's rows are not paid again)")
    if steps:
        lines.append("  Next: " + " · ".join(steps))
    return lines


def _export(run_id: str, play: str, maps: list[str]) -> str:
    """The export command to run next: with several maps, the last one's (usually the list
    the play made), naming the others. Named after the play, never `{play}.csv`: a play is
    often named like the CSV it reads."""
    if len(maps) < 2:
        return f"deepline export {run_id} --out {play}-export.csv"
    *others, last = maps
    return f"deepline export {run_id} --map {last} --out {play}-{last}.csv · other maps: {', '.join(others)}"


def _failed(run_id: str, stats: dict[str, Any], error: dict[str, Any], play: str) -> list[str]:
    where = f" ({error['where']})" if error.get("where") else ""
    lines = [f"✗ Run {run_id} failed: {error.get('message', 'unknown error')}{where}"]
    if error.get("type") == "StoreLostError":
        if "was moved or deleted" in error.get("message", ""):
            lines.append(f"  Next: if the store file was moved, put it back, then: deepline resume {run_id}")
            lines.append("  If it was deleted, start the run again on a store that stays.")
        else:
            lines.append("  Next: start the run again on a store that stays.")
    elif error.get("type") == "MissingInputField":
        if "the schedule's input" in error.get("message", ""):
            lines.append("  Next: fix the schedule's input; its next tick runs with it.")
        else:
            lines.append("  Next: start a new run that gives it (a resume keeps this run's input).")
    elif error.get("type") == "BudgetExceededError":  # the budget stays with the run: a plain resume stops again
        owner = error.get("budget_of") or run_id  # a child's is its root's, raised there (which resumes it)
        limit = error.get("max_credits")
        budget = f"{format_credits(limit)}, " if limit else ""
        above = f"N above {budget}the budget it stopped at"
        lines.append(f"  Next: deepline resume {owner} --max-credits N ({above})")
    elif "deepline resume" not in error.get("message", ""):
        # A tool's own failure that is not transient is kept on its receipt: a plain resume
        # replays it, the flag asks the tool again.
        kept = error.get("category") is not None and not error.get("retryable")
        lines.append(f"  Next: fix the cause, then: deepline resume {run_id}" + (" --refresh-failed" if kept else ""))
    return lines


def _interrupted(run_id: str, stats: dict[str, Any], error: dict[str, Any], play: str) -> list[str]:
    rows = stats.get("rows") or {}
    done = f", {rows['succeeded'] + rows.get('failed', 0):,} rows done" if rows.get("succeeded") is not None else ""
    how = f"stopped ({error['reason']})" if error.get("reason") else "interrupted"  # `deepline runs stop`
    if error.get("unrecorded"):  # the store was unreachable: nothing could say how it ended
        return [
            f"■ Run {run_id} {how} after {clock(stats.get('duration_s', 0))}, {_credits(stats)}, while its store "
            "was unreachable: its end is not recorded, and answers that came after the store went down are asked "
            "again by the resume (under the same idempotency keys).",
            f"  Next: once the store is back: deepline resume {run_id}",
        ]
    cut, lost = int(error.get("cut_short") or 0), "nothing finished is lost"
    if cut:  # a second Ctrl-C: their answers, if any came, were not recorded
        s, were, them = ("", "was", "it") if cut == 1 else ("s", "were", "them")
        lost = f"{cut:,} call{s} in flight {were} cut short (the resume sends {them} again, under the same "
        lost += f"idempotency key{s})"
    return [
        f"■ Run {run_id} {how} after {clock(stats.get('duration_s', 0))}{done}, {_credits(stats)}; {lost}.",
        f"  Next: deepline resume {run_id}",
    ]


def _requeued(run_id: str, stats: dict[str, Any], error: dict[str, Any], play: str) -> list[str]:
    """A run a draining worker stopped and put back in the queue: not for a person to resume."""
    return [
        _interrupted(run_id, stats, error, play)[0],
        f"  Next: nothing; it is queued again, a worker goes on with it: deepline runs show {run_id}",
    ]


def _waiting(run_id: str, stats: dict[str, Any], error: dict[str, Any], play: str) -> list[str]:
    waiting = stats.get("waiting") or []
    when = "once its event is sent" if any(b["kind"] == "event" for b in waiting) else "once it is due"
    return [
        f"… Run {run_id} is waiting: {describe_waiting(waiting)}.",
        # Nothing resumes it by itself unless a worker runs on the store: said as the condition it is.
        f"  Next: {when} (if a worker runs on this store, it resumes the run by itself): deepline resume {run_id}",
    ]


def _taken_over(run_id: str, stats: dict[str, Any], error: dict[str, Any], play: str) -> list[str]:
    return [
        f"■ Run {run_id} was taken over by another process (this one was paused past its lease); this one "
        "stopped. What it finished is kept, and the other process goes on with the run: deepline runs show "
        f"{run_id}"
    ]


_SAYS = {
    "completed": _completed,
    "failed": _failed,
    "interrupted": _interrupted,
    "requeued": _requeued,
    "waiting": _waiting,
    "taken_over": _taken_over,
}


def _rows(rows: dict[str, Any], maps: int = 1) -> str:
    """`: 290 rows (281 succeeded, 9 failed, 12 duplicate)`; the rows of several maps are said to be theirs."""
    total = rows.get("succeeded", 0) + rows.get("failed", 0)
    if not total and not rows.get("duplicate"):
        return ""
    parts = [f"{rows.get('succeeded', 0):,} succeeded", f"{rows.get('failed', 0):,} failed"]
    if rows.get("duplicate"):
        parts.append(f"{rows['duplicate']:,} duplicate")
    of = f" of {maps} maps" if maps > 1 else ""
    return f": {counted(total, 'row')}{of} ({', '.join(parts)})"


def row_origin(rows: dict[str, Any]) -> str:
    """Where a run's rows came from, when not all from this attempt's work:
    `170 from earlier attempts · 30 reused from earlier runs · 90 computed now; 45 cells reused`
    (earlier attempts: rows an earlier attempt of this run finished; reused: rows taken
    whole from the sheet as earlier runs left them; cells reused: cells taken from the
    sheet, in those rows and inside rows computed again)."""
    _, earlier, reused, now, cells = _origins(rows)
    if not (earlier or reused):
        return f"{cells:,} cells reused from earlier runs" if cells else ""
    parts = [f"{n:,} {what}" for n, what in ((earlier, "from earlier attempts"), (reused, "reused from earlier runs"))
             if n]  # fmt: skip
    parts.append(f"{now:,} computed now")
    return " · ".join(parts) + (f"; {cells:,} cells reused" if cells else "")


def _origins(rows: dict[str, Any]) -> tuple[int, int, int, int, int]:
    """A run's rows: all of them, from earlier attempts, reused from earlier runs, computed
    now; and cells reused."""
    total = int(rows.get("succeeded", 0)) + int(rows.get("failed", 0))
    earlier, reused, cells = (int(rows.get(k, 0)) for k in ("from_earlier_attempts", "reused", "reused_cells"))
    return total, earlier, reused, max(0, total - earlier - reused), cells


def _credits(stats: dict[str, Any]) -> str:
    attempts = stats.get("attempts") or 1
    over = f" over {attempts} attempts" if attempts > 1 else ""
    credits = stats.get("credits", 0)
    return f"{format_credits(credits)} credit{'' if credits == 1 else 's'}{over}"


def counted(n: int, word: str) -> str:
    """`1 row`, `2 rows`, `1,000 rows`."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def describe_waiting(boundaries: list[dict[str, Any]]) -> str:
    """One phrase a person can act on: until when, or for which event. The same timer of
    several child plays (a map of them) is said once, with how many wait for it."""
    parts: dict[str, int] = {}
    for b in boundaries:
        if b["kind"] == "sleep" and b.get("due_at"):
            due = dt.datetime.fromtimestamp(b["due_at"]).strftime("%Y-%m-%d %H:%M:%S")
            part = f"timer {b['id'].removeprefix('sleep:')!r} is due at {due}"
        elif b["kind"] == "event":
            part = f"for event {b['event_id']!r} (deepline events send {b['run_id']} {b['event_id']})"
        else:
            continue
        parts[part] = parts.get(part, 0) + 1
    said = [part + (f" ({n} child plays)" if n > 1 else "") for part, n in parts.items()]
    return "; ".join(said) or "for its child plays"
