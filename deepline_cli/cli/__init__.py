"""The command line: the only package that imports typer."""

from __future__ import annotations


def main() -> None:
    from deepline_cli.cli.app import app

    app()
