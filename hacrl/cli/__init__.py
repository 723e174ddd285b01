"""The `hacrl` command: `main` parses and dispatches; one module per command family."""

from hacrl.cli.main import main

__all__ = ["main"]
