"""The signal that the run must wait: raised where a play reaches a boundary it cannot pass
yet (a long `ctx.sleep`, an event not sent, a child play that waits). Below the run layer,
so a map can tell a row that waits from a row that failed."""

from __future__ import annotations

from deepline_cli.store.records import Boundary


class Suspended(BaseException):
    """The play reached a boundary it must wait at; the run becomes `waiting`.

    A BaseException, so a play's `except Exception` cannot swallow it.
    """

    def __init__(self, boundary: Boundary) -> None:
        super().__init__(f"waiting at {boundary.id}")
        self.boundary = boundary
