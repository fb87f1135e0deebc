"""What "found" means: one definition for waterfalls, pilots, `plan` and the report.

A value is found when it holds something: not None, not an empty string, and, for a list
or an object, when at least one of its items or values is found. So `None`, `""`, `[]`,
`{}`, `{"email": None}` and `{"data": {"emails": []}}` found nothing; `0`, `False` and
`{"email": "ada@acme.com", "score": None}` are answers.

- A waterfall step found the value when what it returned is found (`steps(found=...)`
  decides otherwise for one waterfall).
- A cell found something when its value is found; a cell whose `run_if` said no was
  not run (neither found nor not found).
- A provider's call found something when the play found a value with its answer: the
  waterfall step it was made for found the value, or the cell it was made for holds a
  found value. A call made outside maps: when its answer is found. (An answer like
  `{"data": {"email": null, "domain": "acme.com"}}` is not empty, but a step that reads
  its email found nothing with it: the provider's hit rate follows the play.)
"""

from __future__ import annotations

from typing import Any


def is_found(value: Any) -> bool:
    if value is None or value == "":
        return False
    if isinstance(value, dict):
        return any(is_found(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(is_found(v) for v in value)
    return True
