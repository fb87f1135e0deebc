"""The run state machine: the statuses a run moves between, and from where. Every status
write goes through it (`set_status`, and the statements that take a run: a lease, a
worker's claim, a stop); a move it does not allow changes nothing.

    (new) ──────────► queued ──claim──► running ──► completed
      │                 ▲  │              │ ▲ │───► failed ──┐
      └──► running      │  └──stop──┐     │ │ └───► waiting ─┤ resume / worker / requeue
                        │           ▼     │ └──take over──┘  │
                        └─ requeue ── interrupted ◄──stop──────┘

- running → running: a resume or worker taking over a run whose holder is gone;
- running → queued: a draining worker puts its run back for another;
- failed, interrupted, waiting → running (resume) or queued (`run --enqueue --run-id`);
- queued and waiting → interrupted: `deepline runs stop` of a run no process holds;
- completed is final.
"""

from __future__ import annotations

RUN_STATUSES: tuple[str, ...] = ("queued", "running", "waiting", "completed", "failed", "interrupted")

# status → the statuses a run may move to it from
TRANSITIONS: dict[str, frozenset[str]] = {
    "queued": frozenset({"running", "waiting", "failed", "interrupted"}),
    "running": frozenset({"queued", "running", "waiting", "failed", "interrupted"}),
    "waiting": frozenset({"running"}),
    "completed": frozenset({"running"}),
    "failed": frozenset({"running"}),
    "interrupted": frozenset({"queued", "running", "waiting"}),
}
STARTS = frozenset({"queued", "running"})  # what a new run is inserted as


def allowed_from(status: str) -> frozenset[str]:
    """The statuses a run may move to `status` from (ValueError for an unknown status)."""
    try:
        return TRANSITIONS[status]
    except KeyError:
        raise ValueError(f"{status!r} is not a run status ({', '.join(RUN_STATUSES)})") from None


def from_clause(status: str) -> str:
    """`status IN ('running', …)`: the SQL condition of a move to `status`."""
    return "status IN (" + ", ".join(f"'{s}'" for s in sorted(allowed_from(status))) + ")"
