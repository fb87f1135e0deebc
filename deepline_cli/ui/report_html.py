"""`deepline runs report RUN --html`: one self-contained HTML file.

No network: the CSS is inline and the charts are inline SVG drawn here; there is no
JavaScript. Every value from the store is escaped.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from deepline_cli import __version__
from deepline_cli._format import format_credits, kept_said
from deepline_cli.runtime.calls.batch import BATCH_SUFFIX
from deepline_cli.runtime.map.projection import CellCounts, describe
from deepline_cli.runtime.run.holders import holder_words
from deepline_cli.store.ledger import CallRow
from deepline_cli.store.records import MapRecord
from deepline_cli.ui.report_data import MapFigures, Report, ToolFigures, percentile, superseded
from deepline_cli.ui.text import printable

_T = TypeVar("_T")

TIMELINE_WIDTH = 1040
LANE = 22
LABEL = 170
MAX_MARKS = 6000  # calls drawn on the timeline; more are sampled evenly (the tables count all)
MAX_STACK = 16  # rows a lane stacks calls in flight together in
COLORS = {"live": "#2e7d32", "retried": "#ef6c00", "failed": "#c62828", "reused": "#78909c"}
SUPERSEDED = "#ef9a9a"  # a failed execution a later attempt tried again: not a final failure

CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
main{max-width:1120px;margin:0 auto;padding:24px 32px 48px}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:32px 0 10px;border-bottom:1px solid #dde1e7;padding-bottom:4px}
.sub{color:#5b6475;margin-bottom:18px}
.cards{display:flex;flex-wrap:wrap;gap:12px}
.card{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:10px 16px;min-width:120px}
.card b{display:block;font-size:22px}
.card span{color:#5b6475;font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.card small{display:block;color:#5b6475;font-size:12px}
table{border-collapse:collapse;background:#fff;border:1px solid #dde1e7;width:100%;margin:6px 0}
th,td{text-align:left;padding:5px 10px;border-bottom:1px solid #eef0f3;vertical-align:top}
th{background:#f0f2f5;font-weight:600;font-size:12px;color:#3a4354}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
svg{background:#fff;border:1px solid #dde1e7;border-radius:6px;display:block}
svg.timeline{width:100%;height:auto}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px;vertical-align:-1px}
.ok{color:#2e7d32}.bad{color:#c62828}.muted{color:#5b6475}code{font-size:12px}
.err{font-family:ui-monospace,monospace;font-size:12px;color:#8e1f1f;word-break:break-word}
"""


def render(report: Report) -> str:
    parts = [
        _header(report),
        _section("Timeline", _timeline(report)),
        _section("Tool latency", _latency(report)),
        _section("Credits and hit rate per provider", _providers(report)),
    ]
    parts += [_map_section(report, m) for m in report.maps]
    if report.stats.get("projection"):
        lines = describe(report.stats["projection"])
        parts.append(_section("Pilot projection", "".join(f"<p>{_e(line)}</p>" for line in lines)))
    parts.append(_section("Attempts", _attempts(report)))
    body = "\n".join(parts)
    title = f"deepline report {report.run.run_id}"
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{CSS}</style></head><body><main>{body}"
        f'<p class="muted">deepline {__version__} · generated {_when(_now())}</p></main></body></html>\n'
    )


# --- sections ---------------------------------------------------------------------------------


def _calls(report: Report) -> list[ToolFigures]:
    """The tools' calls, not the batch requests carrying a batch tool's calls (`tool#batch`)."""
    return [t for t in report.tools.values() if not t.tool.endswith(BATCH_SUFFIX)]


def _header(report: Report) -> str:
    run, stats = report.run, report.stats
    rows = stats.get("rows") or {}
    calls = _calls(report)
    live = sum(t.live for t in calls)
    reused = sum(t.reused for t in calls)
    failed = sum(t.failed for t in calls)
    recovered = sum(t.recovered for t in calls)
    kept = sum(t.kept for t in calls)  # failed, with no request: not calls made
    missed = sum(t.not_found for t in calls)  # "not found" answers (404): calls made
    batches = sum(t.live + t.failed - t.kept for t in report.tools.values() if t.tool.endswith(BATCH_SUFFIX))
    failed_note = f"{recovered:,} fell back · {failed - recovered:,} final" if failed else ""
    said = run.status
    if report.stale:
        said += f" — no live process holds it; deepline resume {run.run_id} continues it"
    status = f'<span class="{"ok" if run.status == "completed" else "bad"}">{_e(said)}</span>'
    cards = [
        ("credits", format_credits(stats.get("credits", 0)), ""),
        (
            "tool calls",
            f"{live + missed + failed - kept:,}",
            f"{live + missed:,} answered"
            + (f" ({missed:,} not found)" if missed else "")
            + f" · {failed - kept:,} failed"
            + (f" · {batches:,} batch requests" if batches else ""),
        ),
        ("reused", f"{reused:,}", "answers from receipts"),
        ("failed calls", f"{failed:,}", failed_note + (f" · {kept_said(kept)}" if kept else "")),
        ("rows", f"{rows.get('succeeded', 0) + rows.get('failed', 0):,}", _row_origin(rows)),
        ("failed rows", f"{rows.get('failed', 0):,}", ""),
        ("attempts", f"{len(report.attempts):,}", ""),
        ("duration", f"{stats.get('duration_s', 0):,.1f} s", ""),
    ]
    error = f'<p class="err">{_e((run.error or {}).get("message", ""))}</p>' if run.error else ""
    return (
        f"<h1>Run {_e(run.run_id)} · {_e(run.play)}</h1>"
        f'<div class="sub">{status} · started {_when(run.created_at)} · finished {_when(run.finished_at)}'
        f" · {_e(run.play_ref)}{_trigger(run.options.get('trigger'))}</div>{error}"
        '<div class="cards">'
        + "".join(
            f'<div class="card" id="card-{_e(k.replace(" ", "-"))}"><span>{k}</span><b>{v}</b>'
            + (f"<small>{_e(note)}</small>" if note else "")
            + "</div>"
            for k, v, note in cards
        )
        + "</div>"
        + f'<p id="failures-said">{_e(failures_said(report))}</p>'
    )


def failures_said(report: Report) -> str:
    """What failed, and what became of it, in one sentence a person can act on."""
    failed = sum(t.failed for t in _calls(report))
    recovered = sum(t.recovered for t in _calls(report))
    rows = int((report.stats.get("rows") or {}).get("failed", 0))
    row_words = f"{rows:,} row{'s' if rows != 1 else ''} failed"
    if not failed:
        return f"No call failed; {row_words}." if rows else "No call failed and no row failed."
    kept = sum(t.kept for t in _calls(report))
    calls = f"{failed:,} call{'s' if failed != 1 else ''} failed (counted once each, however many attempts tried"
    calls += f"; {kept_said(kept)}, not asked again)" if kept else ")"
    if recovered == failed:
        return f"{calls}; every one fell back to another provider of its cell, which answered; {row_words}."
    final = failed - recovered
    fell = f"{recovered:,} of them fell back to another provider of their cell, " if recovered else ""
    return f"{calls}: {fell}{final:,} {'were' if final != 1 else 'was'} final; {row_words}."


def _row_origin(rows: dict[str, Any]) -> str:
    """Where the rows came from: earlier attempts, earlier runs (reused), this attempt."""
    parts = []
    if rows.get("from_earlier_attempts"):
        parts.append(f"{rows['from_earlier_attempts']:,} from earlier attempts")
    if rows.get("reused"):
        parts.append(f"{rows['reused']:,} reused from earlier runs")
    return " · ".join(parts)


def _timeline(report: Report) -> str:
    """One lane per tool; calls in flight together stack in rows inside it (concurrency)."""
    calls = _sample([c for c in report.calls if c.kind != "step"], MAX_MARKS)
    reuses = _sample([r for r in report.reuses if r.kind != "step"], MAX_MARKS)
    lanes = list(dict.fromkeys([_lane(c.tool, c.kind) for c in calls] + [_lane(r.tool, r.kind) for r in reuses]))
    if not lanes:
        return '<p class="muted">No tool calls.</p>'
    start, span = report.start, max(report.end - report.start, 1e-3)
    plot = TIMELINE_WIDTH - LABEL - 20

    def x(t: float) -> float:
        return LABEL + (t - start) / span * plot

    rows = {lane: _pack([c for c in calls if _lane(c.tool, c.kind) == lane]) for lane in lanes}
    tried_again = {id(report.calls[i]) for i in superseded(report.calls)}
    tops, y = {}, 24
    for lane in lanes:
        tops[lane] = y
        y += max(LANE - 6, 4 * (max(rows[lane].values(), default=0) + 1)) + 8
    bottom = y
    marks = [_attempt_band(a.attempt, x(a.started_at or start), x(a.ended_at or a.seen_at or report.end), bottom)
             for a in report.attempts]  # fmt: skip
    for c in calls:
        lane = _lane(c.tool, c.kind)
        kind = "failed" if c.status != "completed" else "retried" if c.retries else "live"
        color = COLORS[kind]
        if id(c) in tried_again:
            kind, color = "tried-again", SUPERSEDED
        left = x(c.started_at)
        marks.append(
            f'<rect class="call {kind}" x="{left:.1f}" y="{tops[lane] + 4 * rows[lane][id(c)]}"'
            f' width="{max(1.0, x(c.ended_at) - left):.1f}" height="3" fill="{color}"/>'
        )
    for r in reuses:
        lane = _lane(r.tool, r.kind)
        height = max(LANE - 6, 4 * (max(rows[lane].values(), default=0) + 1))
        marks.append(
            f'<rect class="call reused" x="{x(r.used_at):.1f}" y="{tops[lane]}" width="1.5" height="{height}"'
            f' fill="{COLORS["reused"]}" fill-opacity="0.7"/>'
        )
    labels = [
        f'<text x="8" y="{tops[lane] + 11}" font-size="12" fill="#1d2330">{_e(_short(lane, 24))}</text>'
        for lane in lanes
    ]
    ticks = [
        f'<line x1="{x(start + span * f):.1f}" y1="20" x2="{x(start + span * f):.1f}" y2="{bottom}" stroke="#e3e6eb"/>'
        f'<text x="{x(start + span * f):.1f}" y="{bottom + 14}" font-size="11" text-anchor="middle"'
        f' fill="#5b6475">{span * f:,.1f} s</text>'
        for f in (0, 0.25, 0.5, 0.75, 1)
    ]
    total = sum(1 for c in report.calls if c.kind != "step")
    shown = "" if total <= MAX_MARKS else f" (showing {MAX_MARKS:,} of {total:,} calls, evenly sampled)"
    legend = "".join(f'<span><i style="background:{color}"></i>{kind}</span>' for kind, color in COLORS.items())
    if tried_again:
        legend += f'<span><i style="background:{SUPERSEDED}"></i>failed, tried again by a later attempt</span>'

    height = bottom + 24
    return (
        f'<div class="legend">{legend}<span class="muted">x: seconds since the run started; calls in flight'
        f" together stack{shown}</span></div>"
        f'<svg class="timeline" width="100%" viewBox="0 0 {TIMELINE_WIDTH} {height}"'
        f' preserveAspectRatio="xMinYMin meet" role="img" aria-label="tool calls over time">'
        f"{''.join(ticks)}{''.join(marks)}{''.join(labels)}</svg>"
    )


def _lane(tool: str | None, kind: str) -> str:
    return tool or f"ctx.{kind}"


def _pack(calls: list[CallRow]) -> dict[int, int]:
    """A row for each call (by id) so calls in flight at once do not overlap, at most
    MAX_STACK rows (busier moments share the last)."""
    ends: list[float] = []
    placed: dict[int, int] = {}
    for c in sorted(calls, key=lambda c: c.started_at):
        row = next((i for i, end in enumerate(ends) if end <= c.started_at), None)
        if row is None:
            row = len(ends) if len(ends) < MAX_STACK else min(range(len(ends)), key=ends.__getitem__)
            if row == len(ends):
                ends.append(0.0)
        ends[row] = max(ends[row], c.ended_at)
        placed[id(c)] = row
    return placed


def _attempt_band(attempt: int, left: float, right: float, bottom: float) -> str:
    return (
        f'<rect x="{left:.1f}" y="20" width="{max(1.0, right - left):.1f}" height="{bottom - 20}"'
        f' fill="{"#eef2f7" if attempt % 2 else "#f7f3ea"}"/><text x="{left + 3:.1f}" y="15"'
        f' font-size="10" fill="#5b6475">attempt {attempt}</text>'
    )


def _latency(report: Report) -> str:
    """The provider's own time per call; the time calls waited (for a concurrency slot,
    the rate limit, a 429 pause, Retry-After and backoff) apart."""
    tools = [t for t in report.tools.values() if t.latencies]
    if not tools:
        return '<p class="muted">No calls were made by this run (everything came from receipts).</p>'
    top = max(t.percentile(99) for t in tools) or 1e-3
    width = 320
    rows = []
    for t in tools:
        bars = "".join(
            f'<rect x="0" y="{i * 7}" width="{max(1.0, t.percentile(q) / top * width):.1f}" height="6" fill="{color}"/>'
            for i, (q, color) in enumerate(((50, "#42a5f5"), (90, "#1e88e5"), (99, "#0d47a1")))
        )
        waited = [w for w in t.waits if w > 0.0005]
        rows.append(
            [
                _e(t.tool),
                f"{len(t.latencies):,}",
                _ms(t.percentile(50)),
                _ms(t.percentile(90)),
                _ms(t.percentile(99)),
                _ms(max(t.latencies)),
                f"{len(waited):,} calls, {_s(sum(waited))} in all (p50 {_s(percentile(waited, 50))})"
                if waited
                else "none",
                _scaling_svg(width, 21, bars),
            ]
        )
    note = (
        "<p class=\"muted\">Latency is the provider's own time: from a call's start to its end, less the time "
        "it waited for a concurrency slot, its rate limit, a 429 pause, Retry-After and backoff between "
        "retries (shown apart). It counts each time a call was sent: one a later attempt sent again (it was in "
        "flight when an attempt stopped) counts again, where the tool calls above count each call once.</p>"
    )
    headers = ["tool", "sent", "p50", "p90", "p99", "max", "waited (not in the latency)", "p50 · p90 · p99"]
    return note + _table(headers, rows, numeric={1, 2, 3, 4, 5})


def _providers(report: Report) -> str:
    if not report.tools:
        return '<p class="muted">No tool calls.</p>'
    rows = [
        [
            _e(t.tool) + "".join(f'<br><span class="muted">{_e(d)}</span>' for d in t.descriptions),
            f"{t.live:,}",
            f"{t.reused:,}",
            f"{t.not_found:,}",
            f"{t.failed:,}"
            + (f' <span class="muted">({t.recovered:,} fell back)</span>' if t.recovered else "")
            + (f' <span class="muted">({kept_said(t.kept)})</span>' if t.kept else ""),
            f"{t.retried:,} ({t.retries:,} retries)",
            format_credits(t.credits),
            f"{_rate(t.found, t.answered)}"
            + (f' <span class="muted">{t.found:,}/{t.answered:,}</span>' if t.answered else ""),
            _bar([t.found, t.answered - t.found, t.failed], ["#2e7d32", "#b0bec5", "#c62828"]),
        ]
        for t in sorted(report.tools.values(), key=_by_credits)
    ]
    headers = [
        "tool", "live", "reused", "not found", "failed", "retried", "credits", "found", "found · nothing found · failed"
    ]  # fmt: skip
    note = (
        '<p class="muted">Found: answers the play found a value with (the waterfall step that made the call '
        "found the value, or the cell it was made for holds a value: not empty, nor a list or object holding "
        "only empty values), of the answers live, reused and not found. Not found: the provider said it knows "
        "nothing of what was asked (404) and the row went on (a waterfall's next step): an answer that found "
        "nothing, not a failure. Failed: calls whose final outcome is a failure, each once; those that fell back "
        "were got past by another provider of their cell, which answered.</p>"
    )
    return note + _table(headers, rows, numeric={1, 2, 3, 4, 6, 7})


def _map_section(report: Report, m: MapFigures) -> str:
    r = m.record
    outcome = _table(
        ["rows", "succeeded", "failed", "duplicate keys", "rows reused whole", "cells reused", "status"],
        [
            [
                f"{r.total:,}",
                f"{r.succeeded:,}",
                f"{r.failed:,}",
                f"{r.duplicate:,}",
                f"{m.reused_rows:,}",
                f"{m.reused_cells:,}",
                _e(r.status),
            ]
        ],
        numeric={0, 1, 2, 3, 4, 5},
    )
    reuse = (
        '<p class="muted">Rows reused whole: taken from the sheet as an earlier run left them (no resolver ran). '
        "Cells reused: cells taken from the sheet, in those rows and in rows whose other cells were computed "
        "again.</p>"
    )
    columns = _table(
        ["column", "found", "not found", "failed", "not run", ""],
        [
            [
                _e(name),
                _rate(c.found, _total(c)),
                _rate(c.not_found, _total(c)),
                _rate(c.failed, _total(c)),
                _rate(c.not_run, _total(c)),
                _bar([c.found, c.not_found, c.failed, c.not_run], ["#2e7d32", "#b0bec5", "#c62828", "#eceff1"]),
            ]
            for name, c in m.columns.items()
        ],
        numeric={1, 2, 3, 4},
    )
    not_run = (
        '<p class="muted">Not run: the column\'s <code>run_if</code> said no, or an earlier column of the row '
        "failed. Not found: the column ran and its value is empty.</p>"
    )
    failures = (
        _table(
            ["input row", "row key", "error"],
            [[f"{f.input_index + 1:,}", _e(_short(f.row_key, 60)), _error(f.error)] for f in m.failures],
            numeric={0},
        )
        if m.failures
        else '<p class="muted">No failed rows.</p>'
    )
    return _section(
        f"Map {r.map}" + (f" ({r.description})" if r.description else ""),
        f"<h3>Row outcomes</h3>{outcome}{reuse}<h3>Columns</h3>{columns}{not_run}{_waterfalls(report, r)}"
        f"<h3>Barriers</h3>{_barriers(r)}<h3>First failures</h3>{failures}",
    )


def _waterfalls(report: Report, r: MapRecord) -> str:
    """Each waterfall column: how many rows each step found a value for."""
    hits = (report.stats.get("waterfalls") or {}).get(r.map) or {}
    parts = []
    for column, steps in r.steps.items():
        found = hits.get(column) or {}
        total = sum(found.values())
        rows = []
        for name in [*steps, "none"]:
            n, color = found.get(name, 0), "#2e7d32" if name != "none" else "#b0bec5"
            label = name if name != "none" else "not found"
            rows.append([_e(label), f"{n:,}", _rate(n, total), _bar([n, total - n], [color, "#eceff1"])])
        parts.append(
            f"<h3>Waterfall {_e(column)}: hits per step</h3>" + _table(["step", "rows", "share", ""], rows, {1, 2})
        )
    return "".join(parts)


def _barriers(r: MapRecord) -> str:
    # A map is recorded completed only after both barriers passed; what each checked
    # follows from its counts (the barriers' own events are not stored).
    if r.status == "completed":
        rows = [
            [
                "visibility",
                '<span class="ok">passed</span>',
                f"{r.total:,} of {r.total:,} finished rows visible in the store",
            ],
            [
                "finalization",
                '<span class="ok">passed</span>',
                f"{r.total + r.duplicate:,} input rows = {r.succeeded:,} succeeded + {r.failed:,} failed + "
                f"{r.duplicate:,} duplicate",
            ],
        ]
    else:
        reason = f"the map did not complete (status {r.status}); see the run's error"
        rows = [[name, '<span class="bad">not passed</span>', _e(reason)] for name in ("visibility", "finalization")]
    return _table(["barrier", "result", "what it checked"], rows)


def _attempts(report: Report) -> str:
    rows = [
        [
            str(a.attempt),
            _e(holder_words(a.holder)),
            _when(a.started_at),
            _when(a.ended_at) or f"last seen {_when(a.seen_at)}",
            _e("ended: no live process holds it" if report.stale and a.status == "running" else a.status or ""),
            f"{((a.ended_at or a.seen_at or 0) - (a.started_at or 0)):,.1f} s" if a.started_at else "",
        ]
        for a in report.attempts
    ]
    return _table(["attempt", "holder", "started", "ended", "status", "duration"], rows, numeric={0, 5})


# --- small pieces -----------------------------------------------------------------------------


def _section(title: str, content: str) -> str:
    return f"<section><h2>{_e(title)}</h2>{content}</section>"


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(f"<th{' class=n' if i in numeric else ''}>{_e(h)}</th>" for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f"<td{' class=n' if i in numeric else ''}>{v}</td>" for i, v in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _bar(values: Sequence[int], colors: Sequence[str], width: int = 200) -> str:
    total = sum(values) or 1
    x, rects = 0.0, []
    for value, color in zip(values, colors, strict=True):
        w = value / total * width
        if w > 0:
            rects.append(f'<rect x="{x:.1f}" y="2" width="{w:.1f}" height="12" fill="{color}"/>')
        x += w
    return _scaling_svg(width, 16, "".join(rects))


def _scaling_svg(width: int, height: int, content: str) -> str:
    """A small chart that shrinks with its column on a narrow page (never wider than `width`)."""
    return (
        f'<svg viewBox="0 0 {width} {height}" width="100%" preserveAspectRatio="xMinYMid meet"'
        f' style="border:0;max-width:{width}px;min-width:{width // 3}px">{content}</svg>'
    )


def _sample(items: list[_T], limit: int) -> list[_T]:
    if len(items) <= limit:
        return items
    step = len(items) / limit
    return [items[int(i * step)] for i in range(limit)]


def _total(c: CellCounts) -> int:
    return c.found + c.not_found + c.failed + c.not_run


def _by_credits(t: ToolFigures) -> tuple[float, str]:
    return (-t.credits, t.tool)


def _rate(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "–"


def _s(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms" if seconds < 1 else f"{seconds:,.1f} s"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _trigger(trigger: Any) -> str:
    """What started the run, when not a person: ` · started by schedule 2026-12-05 06:00:00 UTC`."""
    return f' · <span id="trigger">started by {_e(str(trigger))}</span>' if trigger else ""


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else ""


def _now() -> float:
    return dt.datetime.now().timestamp()


def _error(text: str | None) -> str:
    return f'<span class="err">{_e(text or "")}</span>'


def _e(value: object) -> str:
    return html.escape(printable(value, newlines=True), quote=True)
