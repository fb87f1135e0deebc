"""Every effect is a receipt: claim, invoke (through providers/), settle; leases, budget, counts."""

__all__ = [
    "batch",
    "breaker",
    "budget",
    "call_scope",
    "caps",
    "events",
    "identity",
    "leases",
    "receipts",
    "stats",
    "store_thread",
    "tally",
    "tool_calls",
]
