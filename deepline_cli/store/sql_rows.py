"""How the store's records map to SQL rows and back: column lists, encoders, decoders,
and the statements a receipt's claim and settlement are written with."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from deepline_cli import _json
from deepline_cli.store.claims import claim_idempotency_key
from deepline_cli.store.records import (
    Boundary,
    Claim,
    LogLine,
    MapRecord,
    MapRow,
    Receipt,
    RunRecord,
    Settlement,
    sent_again,
)

RUN_COLUMNS = (
    "run_id, play, play_ref, input, status, attempt, workspace, cwd, options, parent_run_id,"
    " root_run_id, holder, lease_expires_at, output, error, stats, created_at, updated_at,"
    " finished_at, wake_at, scheduled, ancestors, description, snapshot, failure_seen_by, stop_reason"
)
RUN_JSON = frozenset({"input", "options", "output", "error", "stats", "ancestors"})
RECEIPT_COLUMNS = (
    "key, kind, label, tool, status, run_id, attempt, lease_id, lease_expires_at,"
    " idempotency_key, output, error, failure_kind, retryable, credits, created_at, completed_at,"
    " batch_key, request, generation, description, input"
)
BOUNDARY_COLUMNS = "run_id, id, kind, status, due_at, event_id, child_run_id, payload, created_at, resolved_at"
# A run and every run below it (its children, theirs…): two parameters, the run's id twice.
TREE = (
    "(WITH RECURSIVE tree(run_id) AS (SELECT run_id FROM runs WHERE run_id = ? OR parent_run_id = ?"
    " UNION SELECT r.run_id FROM runs r JOIN tree t ON r.parent_run_id = t.run_id) SELECT run_id FROM tree)"
)
LOG_COLUMNS = "run_id, attempt, ts, level, message, key, kind, fields, id"
# The duplicates a map's input held before its rows recorded so far (over `map_rows`):
# distinct rows are numbered in input order, so before the row at input place i with number
# k the input held k + 1 distinct rows, i - k duplicates (the most is the furthest row's).
# What a map stopped before its input was read whole recorded none of.
DUPLICATES_SEEN = "max(input_index - idx)"
CHUNK = 400  # bound parameters per statement stay well under every backend's limit


# --- receipts: the write path ------------------------------------------------------------


SETTLE_RELEASE = (
    "UPDATE receipts SET status = 'released', lease_expires_at = NULL WHERE key = ? AND lease_id = ?"
    " AND status = 'running'"
)
# A claim given back before its call went out (see claims.given_back). A receipt that still
# holds an earlier answer is completed again with it, never emptied (a refresh of another
# run's answer is restored whole by SETTLE_RESTORE below).
SETTLE_SKIP = (
    "UPDATE receipts SET status = CASE WHEN output IS NOT NULL THEN 'completed' ELSE 'skipped' END,"
    " lease_expires_at = NULL WHERE key = ? AND lease_id = ? AND status = 'running'"
)
# A refresh given back before its call, of a receipt with an earlier answer or failure: the
# receipt is its earlier owner's again, as it was (a later attempt of the refreshing run
# refreshes it), a failure with the key it went out under.
SETTLE_RESTORE = (
    "UPDATE receipts SET status = ?, kind = ?, label = ?, tool = ?, run_id = ?, attempt = ?,"
    " idempotency_key = ?, batch_key = ?, request = ?, description = ?, input = ?, error = ?, failure_kind = ?,"
    " retryable = ?, lease_expires_at = NULL WHERE key = ? AND lease_id = ? AND status = 'running'"
)
SETTLE_END = (
    "UPDATE receipts SET status = ?, output = ?, error = ?, failure_kind = ?, retryable = ?, credits = ?,"
    " completed_at = ?, generation = generation + ?, lease_expires_at = NULL"
    " WHERE key = ? AND lease_id = ? AND status = 'running'"
)
KEEP_HISTORY = (
    "INSERT INTO receipt_history (key, generation, run_id, attempt, idempotency_key, output, credits,"
    " completed_at, replaced_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)


def settle_statement(s: Settlement, now: float) -> tuple[str, tuple[Any, ...]]:
    """The UPDATE that ends (or gives back) a claim — only while its lease is current."""
    if s.status == "released":
        return SETTLE_RELEASE, (s.key, s.lease_id)
    if s.status == "skipped":
        if (r := s.replaces) is not None and r.status in ("completed", "failed"):
            before = (r.status, r.kind, r.label, r.tool, r.run_id, r.attempt, r.idempotency_key, r.batch_key)
            kept = (json_or_none(r.request), r.description, json_or_none(r.input))
            failure = (json_or_none(r.error), r.failure_kind, int(r.retryable))
            return SETTLE_RESTORE, (*before, *kept, *failure, s.key, s.lease_id)
        return SETTLE_SKIP, (s.key, s.lease_id)
    # A completed call's answer is JSON text, null too (SETTLE_SKIP tells an answered receipt
    # by it), written for its receipt as it came where the runtime did (`output_json`).
    output = (s.output_json or _json.dumps_str(s.output)) if s.status == "completed" else None
    values = (s.status, output, json_or_none(s.error), s.failure_kind, int(s.retryable), s.credits, now)
    return SETTLE_END, (*values, 1 if s.replaces is not None else 0, s.key, s.lease_id)


# --- row mapping ------------------------------------------------------------------------


def position(order: list[str]) -> Any:
    return lambda name: order.index(name) if name in order else len(order)


def map_row_values(r: MapRow) -> tuple[Any, ...]:
    steps = json_or_none(r.steps) if r.steps else None
    found = json_or_none(r.found) if r.found else None
    fell_back = json_or_none(r.fell_back)
    # A kept row is an earlier attempt's work (which one the sheet does not say: the one
    # before, for the count of rows earlier attempts finished), wherever the input puts it now.
    attempt = r.attempt - 1 if r.kept and r.attempt > 1 else r.attempt or None
    return (r.run_id, r.map, r.idx, r.input_index, r.row_key, r.outcome, r.error, steps, attempt,
            int(r.reused_row), r.reused_cells, found, fell_back)  # fmt: skip


def map_from_row(r: Sequence[Any]) -> MapRecord:
    return MapRecord(
        run_id=r[0], map=r[1], sheet=r[2], input_columns=_json.loads(r[3]) or [], columns=_json.loads(r[4]) or [],
        status=r[5], total=r[6], succeeded=r[7], failed=r[8], duplicate=r[9], reused=r[10], started_at=r[11],
        finished_at=r[12], pilot=_json.loads(r[13]), steps=_json.loads(r[14]) or {}, description=r[15] or "",
        source=r[16],
    )  # fmt: skip


def log_from_row(r: Sequence[Any]) -> LogLine:
    run_id, attempt, ts, level, message, key, kind, fields, id = r
    return LogLine(run_id, attempt, ts, level, message, key, kind or "log", _json.loads(fields), int(id))


def boundary_from_row(row: Sequence[Any]) -> Boundary:
    values = list(row)
    values[7] = _json.loads(values[7])
    return Boundary(*values)


def run_fields() -> list[str]:
    return [name.strip() for name in RUN_COLUMNS.split(",")]


def encode_run_field(name: str, value: Any) -> Any:
    if name in RUN_JSON:
        return json_or_none(value)
    if name == "scheduled":
        return int(bool(value))
    return value


def json_or_none(value: Any) -> str | None:
    return None if value is None else _json.dumps_str(value)


def run_from_row(row: Sequence[Any]) -> RunRecord:
    values = {
        name: (_json.loads(value) if name in RUN_JSON else value) for name, value in zip(run_fields(), row, strict=True)
    }
    values["options"] = values["options"] or {}
    values["stats"] = values["stats"] or {}
    values["ancestors"] = values["ancestors"] or []
    values["scheduled"] = bool(values["scheduled"])
    values["description"] = values["description"] or ""
    return RunRecord(**values)


def receipt_from_row(row: Sequence[Any]) -> Receipt:
    (
        key,
        kind,
        label,
        tool,
        status,
        run_id,
        attempt,
        lease_id,
        lease_expires_at,
        idem,
        output,
        error,
        failure_kind,
        retryable,
        credits,
        created_at,
        completed_at,
        batch_key,
        request,
        generation,
        description,
        input,
    ) = row
    return Receipt(
        key=key,
        kind=kind,
        label=label or "",
        tool=tool,
        status=status,
        run_id=run_id,
        attempt=attempt,
        lease_id=lease_id,
        lease_expires_at=lease_expires_at,
        idempotency_key=idem,
        output=_json.loads(output),
        error=_json.loads(error),
        failure_kind=failure_kind,
        retryable=bool(retryable),
        credits=credits or 0.0,
        created_at=created_at,
        completed_at=completed_at,
        batch_key=batch_key,
        request=_json.loads(request),
        generation=generation or 1,
        description=description,
        input=_json.loads(input),
    )


CLAIM_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running', 0, 0)"
CLAIM_INSERT_COLUMNS = (
    "kind, label, tool, run_id, attempt, lease_id, lease_expires_at, idempotency_key, created_at, batch_key,"
    " request, description, input, key, status, retryable, credits"
)
CLAIM_UPDATE = (
    "UPDATE receipts SET kind = ?, label = ?, tool = ?, run_id = ?, attempt = ?, lease_id = ?,"
    " lease_expires_at = ?, idempotency_key = ?, created_at = ?, batch_key = ?, request = ?, description = ?,"
    " input = ?, status = 'running', error = NULL, failure_kind = NULL, retryable = 0 WHERE key = ?"
)


def claim_row(r: Receipt) -> tuple[Any, ...]:
    """A claimed receipt's values, in the order of CLAIM_INSERT_COLUMNS and CLAIM_UPDATE."""
    return (
        r.kind,
        r.label,
        r.tool,
        r.run_id,
        r.attempt,
        r.lease_id,
        r.lease_expires_at,
        r.idempotency_key,
        r.created_at,
        r.batch_key,
        json_or_none(r.request),
        r.description,
        json_or_none(r.input),
        r.key,
    )


def claimed_receipt(current: Receipt | None, cl: Claim, now: float) -> Receipt:
    """The receipt `cl` owns now. A call sent again under the key it may have gone out with
    (taken over from an owner that may have sent it, or retried after a transient failure:
    see claim_idempotency_key) keeps its batch, so it goes out again only as that batch; one
    taken over keeps that it was claimed alone (batch_key None: it may have gone out alone)."""
    again = current if sent_again(current, cl) else None
    # What it sends (a batch's members): the stored request when the claim carries none (a
    # batch sent again as it was).
    request = cl.request if cl.request is not None else current.request if current is not None else None
    # Sent again: its batch (that batch again, under its key), or None (claimed alone). Else
    # (a new call, or a batch member whose batch was never formed): "" for a batch member.
    fresh = "" if cl.batched else None
    batch_key = again.batch_key if again is not None and again.batch_key != "" else fresh
    return Receipt(
        key=cl.key,
        kind=cl.kind,
        label=cl.label,
        tool=cl.tool,
        status="running",
        run_id=cl.run_id,
        attempt=cl.attempt,
        lease_id=cl.lease_id,
        lease_expires_at=cl.lease_expires_at,
        idempotency_key=claim_idempotency_key(current, cl),
        created_at=current.created_at if current else now,
        batch_key=batch_key,
        request=request,
        generation=current.generation if current else 1,
        description=cl.description,
        input=cl.input if cl.input is not None else current.input if current else None,
    )


def replaced_answer(current: Receipt | None, cl: Claim) -> Receipt | None:
    """The earlier answer a winning claim may replace: a receipt holding output that is not
    this very claim (applied before its connection dropped)."""
    if current is None or current.output is None or current.lease_id == cl.lease_id:
        return None
    return current


def where_clause(filters: dict[str, Any]) -> tuple[str, list[Any]]:
    present = {k: v for k, v in filters.items() if v is not None}
    if not present:
        return "", []
    return " WHERE " + " AND ".join(f"{k} = ?" for k in present), list(present.values())


def chunks(items: Sequence[str]) -> Iterator[list[str]]:
    for i in range(0, len(items), CHUNK):
        yield list(items[i : i + CHUNK])


CONFLICT_RETRIES = 8  # a transaction the database aborted to break a deadlock is run again
