"""One backoff schedule for everything that waits before trying again: a provider's
retries, a store reconnect, a deadlocked transaction, a busy file, the visibility barrier.

    delays(0.1)                          0.1, 0.2, 0.4, 0.8, …        doubling, for ever
    delays(0.5, cap=30, jitter=True)     each drawn from the upper half of 0.5, 1, 2, … ≤ 30
    delays(0.02, factor=1, tries=50)     0.02 fifty times
    delays(0.1, cap=5, until=60)         until the waits add up to 60 s
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator


def delays(
    first: float,
    *,
    factor: float = 2.0,
    cap: float = math.inf,
    tries: int | None = None,
    until: float | None = None,
    jitter: bool = False,
) -> Iterator[float]:
    """The waits between tries: `first`, then × `factor` each time, never over `cap`; at most
    `tries` of them, or as many as fit before their sum passes `until`. With `jitter`, each
    wait is drawn from the upper half of its value (full jitter would let some tries come
    at once; half keeps them spread while still apart)."""
    wait, given, waited = first, 0, 0.0
    while (tries is None or given < tries) and (until is None or waited < until):
        drawn = random.uniform(min(wait, cap) / 2, min(wait, cap)) if jitter else min(wait, cap)
        yield drawn
        given += 1
        waited += drawn
        wait *= factor


# The visibility barrier reads at once, then after these waits (about 1.5 s in all).
VISIBILITY_WAITS: tuple[float, ...] = (0.0, *delays(0.05, tries=5))
