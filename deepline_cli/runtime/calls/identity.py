"""Who a run is: what every receipt, cell and log line of it is made on behalf of."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Identity:
    """A run's identity and the run-wide flags that decide what its calls may reuse.

    `run_id` and `attempt` fence every write (a superseded attempt writes nothing);
    `workspace` and `play` are part of every receipt key; `ancestors` are the play names
    from the root run down to this one (child plays' cycle and depth guards).
    """

    run_id: str
    attempt: int
    play: str
    workspace: str
    lease_ttl: float
    force_refresh: bool = False  # --force-refresh: every call is made again
    refresh_failed: bool = False  # --refresh-failed: failed receipts and cells are tried again
    # The run's own failures the refresh asks again: those of attempts before this one (None:
    # the flag was given to this attempt), before attempt N (given to N, which stopped before
    # it got to them all), or none (0: kept from the run's start).
    refresh_own_before: int | None = None
    root_run_id: str = ""  # "": this run is the root
    ancestors: tuple[str, ...] = ()
    play_file: str = ""
    cwd: str = ""  # where the run was started: relative paths resolve against it
    # Begun before a map cell's rc.step/rc.fetch were keyed by the cell (records.CELL_KEYS):
    # a resume looks for them under the row's key too.
    row_keyed_steps: bool = False

    @property
    def root(self) -> str:
        return self.root_run_id or self.run_id

    @property
    def depth(self) -> int:
        """How many child plays deep this run is (0: the root)."""
        return max(0, len(self.ancestors) - 1)

    def child(self, run_id: str, attempt: int, play: str, play_file: str) -> Identity:
        """The identity of a child run of this one: the same workspace, flags and root."""
        return replace(
            self,
            run_id=run_id,
            attempt=attempt,
            play=play,
            play_file=play_file,
            root_run_id=self.root,
            ancestors=(*self.ancestors, play),
            # A watermark is an attempt of this run, not of the child: a flag only kept asks
            # none of the child's own failures again (it may have asked them already).
            refresh_own_before=None if self.refresh_own_before is None else 0,
        )
