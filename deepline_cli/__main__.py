"""`python -m deepline_cli` is the `deepline` command."""

from deepline_cli.cli import main

main()
