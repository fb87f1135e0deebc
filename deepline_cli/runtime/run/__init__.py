"""A run: start, resume, lease, interrupt, finish (runner.py, attempt.py), the play and its ctx,
child plays, suspension, and the worker."""

__all__ = [
    "attempt",
    "body",
    "builtin",
    "catalog",
    "children",
    "context",
    "follow",
    "holders",
    "options",
    "parts",
    "play",
    "play_input",
    "runner",
    "schema",
    "snapshot",
    "stop",
    "suspension",
    "worker",
]
