"""HTTP endpoints that start runs (`deepline serve`): beside the commands, above the runtime."""

__all__ = ["webhooks"]
