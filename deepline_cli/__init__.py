"""deepline: durable plays for go-to-market data work.

    from deepline_cli import Column, play, tool

The public names load lazily, so `deepline --help` starts without importing the
runtime, the store or an HTTP client. Nothing is imported here at all: the command
installs its Ctrl-C handling first thing, and this module runs before it.
"""

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (type checkers read it as True)
if TYPE_CHECKING:
    from typing import Any

    from deepline_cli.errors import (
        BudgetExceededError,
        DeeplineError,
        GovernanceError,
        InputError,
        MapAccountingError,
        PlayLoadError,
        ProviderTransientError,
        ReceiptLeaseLostError,
        SheetVisibilityError,
        StoreError,
        ToolExecutionError,
    )
    from deepline_cli.runtime.map.columns import Column
    from deepline_cli.runtime.map.dataset import Dataset
    from deepline_cli.runtime.map.waterfall import Waterfall, steps
    from deepline_cli.runtime.providers.tools import ToolCall, ToolResult, tool
    from deepline_cli.runtime.run.context import Context
    from deepline_cli.runtime.run.play import play
    from deepline_cli.runtime.run.suspension import EventTimeoutError

__version__ = "0.1.0"

_EXPORTS = {
    "play": "deepline_cli.runtime.run.play",
    "tool": "deepline_cli.runtime.providers.tools",
    "ToolCall": "deepline_cli.runtime.providers.tools",
    "ToolResult": "deepline_cli.runtime.providers.tools",
    "Context": "deepline_cli.runtime.run.context",
    "Column": "deepline_cli.runtime.map.columns",
    "Dataset": "deepline_cli.runtime.map.dataset",
    "Waterfall": "deepline_cli.runtime.map.waterfall",
    "steps": "deepline_cli.runtime.map.waterfall",
    "BudgetExceededError": "deepline_cli.errors",
    "DeeplineError": "deepline_cli.errors",
    "GovernanceError": "deepline_cli.errors",
    "InputError": "deepline_cli.errors",
    "MapAccountingError": "deepline_cli.errors",
    "PlayLoadError": "deepline_cli.errors",
    "ProviderTransientError": "deepline_cli.errors",
    "ReceiptLeaseLostError": "deepline_cli.errors",
    "SheetVisibilityError": "deepline_cli.errors",
    "StoreError": "deepline_cli.errors",
    "ToolExecutionError": "deepline_cli.errors",
    "EventTimeoutError": "deepline_cli.runtime.run.suspension",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> "Any":
    import importlib

    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'deepline_cli' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
