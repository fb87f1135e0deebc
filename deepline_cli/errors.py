"""Every error deepline raises, under one root.

    DeeplineError                      exit 1 unless a subclass says otherwise
    ├── UsageError                     exit 2: bad flags, unknown run id, bad config
    │   ├── PlayLoadError              the play file cannot be loaded or has no play
    │   └── InputError                 bad --input/--csv, unreadable or invalid CSV
    │       └── MissingInputField      the play read an input field the run was not given
    ├── RunBusyError                   exit 4: another live process holds the run
    ├── RunInterrupted                 exit 130: Ctrl-C / SIGTERM
    ├── ToolExecutionError             a tool call failed (origin, category, retryable)
    │   └── ProviderTransientError     rate_limit / network / upstream: try the next provider
    ├── BudgetExceededError            --max-credits (or max_credits_per_run) would be exceeded
    ├── GovernanceError                depth, cycle or cap of child plays / tool calls
    ├── DeterminismError               a resumed play reached other durable calls than before
    ├── ReceiptLeaseLostError          another owner took a receipt or run this process held
    ├── SystemicFailure                a map's first rows all failed the same way: it stopped
    ├── MapAccountingError             a map input row is not accounted for
    ├── SheetVisibilityError           written sheet rows are not visible in the store
    └── StoreError                     the store cannot be read or written
        ├── StoreOpenError             exit 2: the store cannot be opened (path, URL, server)
        │   └── StoreRefusedConnection the server is down or refuses (a worker: exit 1, it may be back)
        ├── StoreLockedError           exit 2: another process holds the store's write lock too long
        ├── StoreConflict              a transaction aborted to break a deadlock: run it again
        ├── StoreConnectionLost        the connection dropped: reconnect and try again
        ├── StoreUnreachable           ... and did not come back in time
        └── StoreLostError             the store file was deleted or replaced under a run

Each class docstring is the user-facing meaning. The message of an instance is one
sentence a user can act on; the CLI prints it without a traceback (unless --debug).

Errors marked *fatal* (budget, governance, lease, store) are never isolated by a map:
they fail the run, and no failed cell is recorded for them.
"""

from __future__ import annotations

from typing import Any, Literal

Origin = Literal["caller", "provider", "runtime"]
Category = Literal[
    "validation",
    "authentication",
    "authorization",
    "rate_limit",
    "network",
    "upstream",
    "billing",
    "conflict",
    "internal",
]
TRANSIENT_CATEGORIES: frozenset[str] = frozenset({"rate_limit", "network", "upstream"})


class DeeplineError(Exception):
    """Something went wrong in a deepline run."""

    exit_code: int = 1
    fatal: bool = False
    # The call that raised it failed, and counts so (the calls ledger, a tool's `failed`),
    # though nothing is kept on its receipt: a resume makes it again (a child play's failure).
    counts_failed: bool = False


class UsageError(DeeplineError):
    """The command, its flags, the configuration or a run id is not valid."""

    exit_code = 2


class NoStoreError(UsageError):
    """A command that only reads was given a store file that is not there (a run creates it)."""

    def __init__(self, path: str) -> None:
        super().__init__(f"There is no store at {path} (a run creates it). Check --store (or DEEPLINE_STORE).")
        self.path = path


class PlayLoadError(UsageError):
    """The play file cannot be loaded, or does not define the requested play."""


class InputError(UsageError):
    """The play's input (JSON, CSV, --set) is missing or malformed."""


class MissingInputField(InputError, KeyError):
    """The play read a field of its input that the run was not given (`--csv`, `--set`).

    Also a KeyError, so a play that catches one to use a default still does."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class RunBusyError(DeeplineError):
    """The run is held by another live process."""

    exit_code = 4


class RunInterrupted(DeeplineError):
    """The run was interrupted (Ctrl-C or SIGTERM); `deepline resume` continues it."""

    exit_code = 130


class ToolExecutionError(DeeplineError):
    """A tool call failed."""

    replayed = False  # the stored failure of a receipt, given back with no call made
    unanswered = False  # a try of the call may have been processed with no answer seen (kept on its receipt)
    at_once = False  # retried with no backoff (a kept connection the server had closed)

    def __init__(
        self,
        message: str,
        *,
        origin: Origin = "provider",
        category: Category = "internal",
        retryable: bool | None = None,
        status_code: int | None = None,
        retry_after_s: float | None = None,
        tool: str | None = None,
    ) -> None:
        super().__init__(message)
        self.origin: Origin = origin
        self.category: Category = category
        self.retryable = category in TRANSIENT_CATEGORIES if retryable is None else retryable
        self.status_code = status_code
        self.retry_after_s = retry_after_s
        self.tool = tool

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "message": str(self),
            "origin": self.origin,
            "category": self.category,
            "retryable": self.retryable,
            "status_code": self.status_code,
            "retry_after_s": self.retry_after_s,
            "tool": self.tool,
            **({"replayed": True} if self.replayed else {}),  # from its receipt: no call made
        }


class ProviderTransientError(ToolExecutionError):
    """A provider failed in a way that may pass (rate limit, network, upstream 5xx).

    The one valid reason for a waterfall to fall through to the next provider.
    """

    def __init__(
        self,
        message: str,
        *,
        category: Category = "upstream",
        status_code: int | None = None,
        retry_after_s: float | None = None,
        tool: str | None = None,
    ) -> None:
        super().__init__(
            message,
            origin="provider",
            category=category,
            retryable=True,
            status_code=status_code,
            retry_after_s=retry_after_s,
            tool=tool,
        )


class BudgetExceededError(DeeplineError):
    """The run would spend more credits than --max-credits (or its play's max_credits_per_run) allows."""

    fatal = True


class GovernanceError(DeeplineError):
    """A child-play depth, cycle or per-run cap was exceeded."""

    fatal = True


class DeterminismError(DeeplineError):
    """A resumed play reached a different durable id than its earlier attempt did: its code
    changed since the run started."""


class ReceiptLeaseLostError(DeeplineError):
    """Another owner took over a receipt or run this process held."""

    fatal = True


class SystemicFailure(DeeplineError):
    """A map's first rows all failed the same way (a revoked key, a provider down): it
    stopped instead of paying for the whole list to fail."""

    fatal = True


class MapAccountingError(DeeplineError):
    """A map finished without accounting for every input row."""

    fatal = True


class SheetVisibilityError(DeeplineError):
    """Rows written to a sheet are not visible when read back from the store."""

    fatal = True


class StoreError(DeeplineError):
    """The store cannot be opened, migrated, read or written."""

    fatal = True


class StoreOpenError(StoreError):
    """The store cannot be opened: a directory, not a deepline store, a server that refuses."""

    exit_code = 2


class StoreRefusedConnection(StoreOpenError):
    """The store's server cannot be connected to: down, a wrong host or port."""


def store_down(exc: BaseException) -> bool:
    """A store that may come back (its server down or unreachable), not one that cannot be
    used as it is (another program's, a newer deepline's, a wrong URL)."""
    return isinstance(exc, StoreUnreachable | StoreRefusedConnection)


class StoreLockedError(StoreError):
    """Another process has held the store's write lock for longer than this one may wait
    (it may be stopped: Ctrl-Z, a debugger, a closed laptop)."""

    exit_code = 2


class StoreConflict(StoreError):
    """The database aborted a transaction to break a deadlock; it can be run again."""


class StoreConnectionLost(StoreError):
    """The connection to the store dropped (a failover, a network blip); reconnecting may help."""


class StoreUnreachable(StoreError):
    """The store's connection dropped and could not be made again in time."""


class StoreLostError(StoreError):
    """The store was deleted or replaced while a run was using it; what it held is gone."""


def error_dict(exc: BaseException) -> dict[str, Any]:
    """The JSON form of an error, as kept on receipts and in `run.finished`."""
    to_dict = getattr(exc, "to_dict", None)
    if isinstance(exc, DeeplineError) and callable(to_dict):  # a tool's failure, a child play's
        return dict(to_dict())
    return {"type": type(exc).__name__, "message": str(exc) or type(exc).__name__}
