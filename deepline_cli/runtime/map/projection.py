"""Pilot projection: from a `--limit N` run, what the full list would cost and take.

For every map a limit cut short (see runtime/pilot.py), the pilot's own rows give:
- per column, how often a cell was found (runtime/found.py), not found, failed or not run;
- credits per row (from the calls ledger, which records the row of every call) and
  their spread, and seconds per row at the pilot's pace;
and the rest of the list (rows not yet processed, less those already paid for) is
projected from them. The ± is a 95% prediction interval under a normal approximation:
the pilot's rows are treated as a random sample of the list, so the error of the
projected total of `m` new rows is `1.96·s·√(m²/n + m)` (the uncertainty of the mean
over n pilot rows, plus the rows' own spread). A pilot of the first N rows of a list
sorted by something that matters (size, region) is not a random sample: shuffle first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from deepline_cli._format import format_credits
from deepline_cli.runtime.providers.found import is_found
from deepline_cli.store.records import Cell, MapRecord
from deepline_cli.store.roles import Store

Z95 = 1.96
PAGE = 1000


@dataclass
class CellCounts:
    """A column's cells (see runtime/found.py): found a value, found nothing, failed, or
    not run (its `run_if` said no, or an earlier column of the row failed)."""

    found: int = 0
    not_found: int = 0
    failed: int = 0
    not_run: int = 0

    def add(self, cell: Cell | None) -> None:
        if cell is None or cell.not_run:
            self.not_run += 1
        elif cell.error is not None:
            self.failed += 1
        elif is_found(cell.value):
            self.found += 1
        else:
            self.not_found += 1

    def rates(self) -> dict[str, float]:
        total = self.found + self.not_found + self.failed + self.not_run
        if not total:
            return {"found": 0.0, "not_found": 0.0, "failed": 0.0, "not_run": 0.0}
        return {
            "found": round(self.found / total, 4),
            "not_found": round(self.not_found / total, 4),
            "failed": round(self.failed / total, 4),
            "not_run": round(self.not_run / total, 4),
        }


@dataclass
class PilotSample:
    """What a pilot map's rows did: credits per row, cells per column, time."""

    map: str
    columns: dict[str, CellCounts] = field(default_factory=dict)
    row_credits: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    reused_rows: int = 0  # rows taken whole from the sheet (nothing paid in this run)
    # Rows that paid for some calls while earlier runs' receipts answered others (new
    # contacts at companies looked up before): what they paid, when no row was wholly new.
    partly_answered: list[float] = field(default_factory=list)
    # When each row that made calls had its last one answered, seconds after the map started.
    row_ends: list[float] = field(default_factory=list)


PACE_SHARE = 0.9  # a pilot's pace: the time its first 90% of rows took
PACE_ROWS = 10  # fewer rows than this: the pilot's whole time


def mean_sd(values: list[float]) -> tuple[float, float]:
    n = len(values)
    if n == 0:
        return 0.0, 0.0
    mean = sum(values) / n
    if n == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def project_map(sample: PilotSample, record: MapRecord, pilot: dict[str, Any]) -> dict[str, Any]:
    """The projection of one map's full list (a pure function of the pilot's figures)."""
    credits = list(sample.row_credits)
    # Rows taken whole from the sheet cost nothing here and would bias the mean down:
    # they stand for rows paid earlier, which the rest's "already paid" count covers.
    zeros = set(sorted(range(len(credits)), key=lambda i: credits[i])[: sample.reused_rows])
    paid_here = [c for i, c in enumerate(credits) if i not in zeros]
    partly = not paid_here and bool(sample.partly_answered)
    if partly:  # the best there is: rows like these (the rest may reuse as much, or less)
        paid_here = list(sample.partly_answered)
    n = len(paid_here)
    mean, sd = mean_sd(paid_here)
    failing = int(pilot.get("rest_failing", 0))  # rows that fail on their input: no call, no cost
    new_rows = max(0, int(pilot.get("rest_distinct", 0)) - int(pilot.get("rest_paid", 0)) - failing)
    # No row paid here: nothing says what a new row costs (None), unless there is none.
    known = bool(n) or not new_rows
    rest = round(new_rows * mean, 2) if known else None
    margin = round(Z95 * sd * math.sqrt(new_rows**2 / n + new_rows), 2) if n else 0.0 if known else None
    live_rows = record.total - sample.reused_rows
    seconds_per_row = sample.elapsed_s / live_rows if live_rows > 0 else 0.0
    ends = sorted(sample.row_ends)  # rows that made calls (a run_if that said no makes none)
    if len(ends) >= PACE_ROWS and live_rows > 0:  # the pace when 90% of them had finished: not a straggler's retries
        done = math.ceil(PACE_SHARE * len(ends))
        seconds_per_row = ends[done - 1] / (done / len(ends) * live_rows)  # the rows without calls kept pace
    pilot_rows = record.total
    return {
        "map": record.map,
        "fed_by": pilot.get("fed_by"),  # a map over this pilot map's rows (scaled with it)
        "pilot_rows": pilot_rows,
        "full_rows": pilot_rows + int(pilot.get("rest_distinct", 0)),
        "input_rows": pilot_rows + record.duplicate + int(pilot.get("rest_rows", 0)),
        "already_paid": int(pilot.get("rest_paid", 0)),
        "new_rows": new_rows,
        "failing_rows": failing,
        "columns": {name: counts.rates() for name, counts in sample.columns.items()},
        "credits_per_row": {"mean": round(mean, 4), "sd": round(sd, 4), "sample": n},
        "pilot_credits": round(sum(credits), 4),
        "rest_credits": rest,
        "rest_margin": margin,
        "seconds_per_row": round(seconds_per_row, 4),
        "rest_s": round(new_rows * seconds_per_row, 1),
        "note": _note(partly, n),
    }


def _note(partly: bool, sample: int) -> str | None:
    if partly:
        return "every pilot row reused some answers paid before: the rest is projected at what they paid"
    return None if sample else "every pilot row was paid before: nothing to learn credits per row from"


def combine(maps: list[dict[str, Any]], spent: float) -> dict[str, Any]:
    """The whole run's full-list figures: what was spent plus every map's projected rest
    (margins combined as independent errors); None where a map's rest cost is unknown."""
    known = all(m["rest_credits"] is not None for m in maps)
    rest = sum(m["rest_credits"] or 0.0 for m in maps)
    margin = math.sqrt(sum((m["rest_margin"] or 0.0) ** 2 for m in maps))
    return {
        "maps": maps,
        "credits": round(spent + rest, 2) if known else None,
        "margin": round(margin, 2) if known else None,
        "low": round(max(spent, spent + rest - margin), 2) if known else None,
        "high": round(spent + rest + margin, 2) if known else None,
        "spent": round(spent, 4),
        "rest_s": round(sum(m["rest_s"] for m in maps), 1),
        "confidence": 0.95,
    }


def read_sample(store: Store, run_id: str, record: MapRecord) -> PilotSample:
    """A pilot map's rows, cells and per-row credits, read back from the store. A row some
    call of which an earlier run's receipt answered (no credit here) says less of what a
    new row costs: its credits are kept apart (`partly_answered`, when it paid for other
    calls), as a row taken whole from the sheet is left out."""
    per_row = store.ledger.row_credits(run_id, record.map)
    answered = store.ledger.rows_reusing(run_id, record.map)
    sample = PilotSample(record.map, {c: CellCounts() for c in record.columns})
    sample.elapsed_s = max(0.0, (record.finished_at or record.started_at) - record.started_at)
    sample.row_ends = [max(0.0, end - record.started_at) for end in store.ledger.row_ends(run_id, record.map).values()]
    sample.reused_rows = record.reused
    after = -1
    while True:
        page = store.sheets.map_rows_page(run_id, record.map, record.sheet, after, PAGE)
        for row in page:
            for name, counts in sample.columns.items():
                counts.add(row.cells.get(name))
            paid = per_row.get(row.row_key, 0.0)
            if row.row_key not in answered:
                sample.row_credits.append(paid)
            elif paid:
                sample.partly_answered.append(paid)
        if len(page) < PAGE:
            return sample
        after = page[-1].idx


def projection_stats(store: Store, run_id: str) -> dict[str, Any]:
    """`{"projection": …}` for a run whose maps a limit cut short, else `{}` (run stats).
    A map over a pilot map's rows is projected with it: for the full list it runs on as
    many rows per row of that map as in the pilot. A map after the first pilot map over a
    list of its own (run whole) or over a list that is no CSV (it may be made from the
    pilot's rows) is named as not projected: its cost is what it spent."""
    records = [m for m in store.sheets.get_maps(run_id) if m.status == "completed"]
    if not any(m.pilot and "fed_by" not in m.pilot for m in records):
        return {}
    maps: list[dict[str, Any]] = []
    unprojected: list[str] = []
    for record in records:
        pilot = dict(record.pilot or {})
        source = next((m for m in maps if m["map"] == pilot.get("fed_by")), None)
        if source is not None:
            per_row = record.total / source["pilot_rows"] if source["pilot_rows"] else 0.0
            rest = max(0, round(source["full_rows"] * per_row) - record.total)
            # The rows it gets from the source's rows paid before were paid with them, as a
            # full run makes them: as many of its rest, in proportion.
            source_rest = source["full_rows"] - source["pilot_rows"]
            paid = round(rest * source["already_paid"] / source_rest) if source_rest > 0 else 0
            pilot.update(rest_rows=rest, rest_distinct=rest, rest_paid=min(rest, paid))
        elif "rest_distinct" not in pilot or (maps and record.source is None):
            # After a pilot map, a list that is no CSV may be made from the pilot's rows
            # (people found for its companies): what is left of it is not the full list's rest.
            if maps:
                unprojected.append(record.map)
            continue
        maps.append(project_map(read_sample(store, run_id, record), record, pilot))
    return {"projection": {**combine(maps, store.receipts.credits_spent(run_id)), "unprojected": unprojected}}


def describe(projection: dict[str, Any]) -> list[str]:
    """The projection in a few lines for people (the run's final summary)."""
    lines = []
    for m in projection["maps"]:
        found = ", ".join(
            f"{name} {rates['found']:.0%}" + (f" (failed {rates['failed']:.0%})" if rates["failed"] else "")
            for name, rates in m["columns"].items()
        )
        per_row = m["credits_per_row"]
        # Measured on fewer rows than the pilot ran (the others answered, wholly or in part, by
        # earlier runs' receipts): said, as a ± from five rows is not one from a hundred.
        over = f" (from {per_row['sample']:,} new rows)" if 0 < per_row["sample"] < m["pilot_rows"] else ""
        lines.append(
            f"pilot {m['map']}: {m['pilot_rows']:,} of {m['full_rows']:,} rows · found: {found} · "
            f"{per_row['mean']:.3g} credits/row{over} · {m['seconds_per_row']:.3g} s/row"
        )
        if m.get("note"):
            lines.append(f"pilot {m['map']}: {m['note']}")
    if projection.get("unprojected"):
        names = ", ".join(projection["unprojected"])
        lines.append(
            f"not projected: {names} (lists of their own, or made from the pilot's rows; counted as spent — "
            "more if they follow the pilot's rows)"
        )
    lists = [m for m in projection["maps"] if not m.get("fed_by")]  # a map over another's rows is no new list
    full = sum(m["full_rows"] for m in lists)
    paid = sum(m["already_paid"] for m in lists)
    if projection["credits"] is None:
        new = sum(m["new_rows"] for m in lists)
        cost = f": the cost of its {new:,} new rows is unknown (no pilot row was paid for), "
    else:
        # From this run's start: what it paid, and what the rest will (the pilot's rows an
        # earlier pilot paid for are in neither: a second pilot's figure is lower than the first's).
        spent = projection.get("spent") or 0.0
        more = max(0.0, projection["credits"] - spent)
        cost = (
            f" ≈ {_about(projection['credits'])} credits (±{_about(projection['margin'])}, 95%): "
            f"{format_credits(spent)} spent by this run, ≈ {_about(more)} more; "
        )
    besides = f" (not counting {', '.join(projection['unprojected'])})" if projection.get("unprojected") else ""
    failing = sum(m.get("failing_rows", 0) for m in lists)
    unpaid = f"; {failing:,} failing on their input (nothing called)" if failing else ""
    lines.append(
        f"full list of {full:,} rows{cost}≈ {_duration(projection['rest_s'])} more at the current rate; "
        f"{paid:,} rows already paid{unpaid}{besides}"
    )
    return lines


def _about(credits: float) -> str:
    """An estimate as figures it can stand for: whole credits from 100 up, else two
    significant digits (a list of cheap calls costs 0.5, not "≈ 0")."""
    if credits >= 100:
        return f"{credits:,.0f}"
    return format_credits(float(f"{credits:.2g}"))


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
