"""Call a provider for one input: tools, HTTP, pacing, secrets. No receipts, no store."""

__all__ = ["config", "found", "governor", "http", "secrets", "templates", "tools", "transport"]
