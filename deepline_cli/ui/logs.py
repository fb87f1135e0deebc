"""A run's log lines for people and programs (`runs logs`, `runs tail`), and the
`--where FIELD=VALUE` filters over their fields.

    2026-12-02 10:41:07  #1  warning row acme.com failed: upstream: 503 from demo.finder
    2026-12-02 10:41:09  #1  info    scored lead  [tier=gold score=0.82]

A play's own lines (`ctx.log(msg, **fields)`) show their fields after the message; the
runtime's lines (`row.failed`, `map.completed`, …) say theirs in the message already.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from deepline_cli import _json
from deepline_cli.errors import UsageError
from deepline_cli.runtime.calls.events import Event
from deepline_cli.runtime.run.holders import holder_words
from deepline_cli.store.records import LogLine, MapRow
from deepline_cli.store.roles import SheetStore
from deepline_cli.ui.text import printable
from deepline_cli.ui.verdict import verdict

# Besides a line's fields, --where can test these of the line itself.
LINE_ATTRIBUTES = ("level", "attempt")
FAILED_PAGE = 1000  # failed rows read from the store per query


def as_text(value: Any) -> str:
    """How a field's value compares in --where and reads in text: strings as they are,
    anything else as compact JSON (`3`, `true`, `null`, `{"a":1}`)."""
    return value if isinstance(value, str) else _json.dumps_str(value)


@dataclass(frozen=True)
class Where:
    """`--where FIELD=VALUE`: a field of the line (or its level or attempt) equals VALUE."""

    field: str
    value: str

    @staticmethod
    def parse(text: str) -> Where:
        name, sep, value = text.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--where takes FIELD=VALUE (e.g. --where row_key=acme.com), not {text!r}.")
        return Where(name.strip(), value)

    def matches(self, line: LogLine) -> bool:
        if self.field in LINE_ATTRIBUTES:
            return str(getattr(line, self.field)) == self.value
        fields = line.fields or {}
        return self.field in fields and as_text(fields[self.field]) == self.value


def matches_all(line: LogLine, wheres: Sequence[Where]) -> bool:
    return all(w.matches(line) for w in wheres)


def line_dict(line: LogLine) -> dict[str, Any]:
    """A line as `runs logs --json` writes it."""
    return {
        "id": line.id or None,  # None: a line listed from the store's rows, not a written one
        "run_id": line.run_id,
        "attempt": line.attempt,
        "ts": line.ts,
        "level": line.level,
        "kind": line.kind,
        "message": line.message,
        "fields": line.fields or {},
    }


def stamp(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def line_text(line: LogLine) -> str:
    return _text(line.ts, line.attempt, line.level, shown_message(line.run_id, line.kind, line.message), line.kind,
                 line.fields)  # fmt: skip


def shown_message(run_id: str, kind: str, message: str) -> str:
    """A line's message as a person reads it: a map's log names only its first failed rows,
    so the line saying how many it left out says where every one is."""
    if kind == "row.failed.omitted":
        return f"{message} (every one: deepline runs logs {run_id} --kind row.failed)"
    return message


def _text(ts: float, attempt: int, level: str, message: str, kind: str, fields: dict[str, Any] | None) -> str:
    text = f"{stamp(ts)}  #{attempt}  {level:<7} {message}"
    if kind == "log" and fields:
        text += "  [" + " ".join(f"{k}={as_text(v)}" for k, v in fields.items()) + "]"
    return printable(text)


def every_failed_row(lines: Iterable[LogLine], store: SheetStore, run_id: str, attempt: int) -> Iterator[LogLine]:
    """The run's log lines with every failed row of its maps as a `row.failed` line.

    A map logs only its first failed rows (and a count of the rest); the store keeps them
    all. Where a map's log names its first failed row, every failed row of the map is listed,
    read from the store in input order; the map's other logged `row.failed` lines (a resumed
    run logs them again) are left out. A map that logged none (stopped before its summary,
    or killed) has its failed rows listed last.
    """
    listed: set[str] = set()
    for line in lines:
        if line.kind != "row.failed" or not line.fields or "map" not in line.fields:
            yield line
            continue
        name = str(line.fields["map"])
        if name not in listed:
            listed.add(name)
            yield from _failed_lines(store, run_id, name, line)
    for record in store.get_maps(run_id):
        # Asked of the map's rows, not its failed count: a map killed before it ended wrote none.
        if record.map not in listed:
            at = LogLine(run_id, attempt, record.finished_at or record.started_at, "warning", "", kind="row.failed")
            yield from _failed_lines(store, run_id, record.map, at)


def _failed_lines(store: SheetStore, run_id: str, map_name: str, at: LogLine) -> Iterator[LogLine]:
    """The map's failed rows as `row.failed` lines worded as the map logs them, each with the attempt
    it failed in, dated like `at`."""
    after = -1
    while page := store.failed_map_rows(run_id, map_name, FAILED_PAGE, after_idx=after):
        after = page[-1].idx
        yield from (_failed_line(row, at) for row in page)


def _failed_line(row: MapRow, at: LogLine) -> LogLine:
    return replace(
        at,
        attempt=row.attempt or at.attempt,  # the attempt the row failed in
        id=0,  # read from the map's rows, not a line of the log: it has no id of its own
        message=f"row {row.row_key} failed: {row.error}",
        kind="row.failed",
        fields={"map": row.map, "row_key": row.row_key, "error": row.error},
    )


def followed_text(event: Event, play: str) -> list[str]:
    """`runs tail` for a person: the lines an event of a followed run reads as."""
    d = event.data
    if event.event == "log":
        message = shown_message(event.run_id, d["kind"], d["message"])
        return [_text(event.ts, d["attempt"], d["level"], message, d["kind"], d.get("fields"))]
    if event.event == "map.progress":
        total = f"/{d['total']:,}" if d.get("total") else ""
        return [printable(f"{stamp(event.ts)}  map {d['map']}: {d['done']:,}{total} rows done, {d['failed']:,} failed")]
    if event.event == "run.holder_gone":
        return [
            f"Run {event.run_id}'s process is gone ({holder_words(d['holder'])}); still following, "
            f"for `deepline resume {event.run_id}` or a worker to take it over."
        ]
    if event.event == "run.finished":
        stats = {**(d.get("stats") or {}), "waiting": d.get("waiting") or []}
        return verdict(event.run_id, d["status"], stats, d.get("error"), play)
    return []
