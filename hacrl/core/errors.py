"""Errors a user reads: one line that names the key, file or value and says what to do.

A leaf module (imports nothing from hacrl), so any layer can raise them. The command line
prints `hacrl: <message>` and exits with the class's `exit_code`, without a traceback.
"""

from __future__ import annotations


class HacrlError(Exception):
    """A fault the user can act on; the message is one line."""

    exit_code = 1


class ConfigError(HacrlError, ValueError):
    """An invalid job config; the message is one line (key, value, what to do) per refusal."""

    exit_code = 2


class StoreError(HacrlError):
    """The MLflow store cannot be opened, created or written (URI, permissions, server)."""


class CheckpointError(HacrlError):
    """No usable checkpoint: the file that is bad and how to start over."""


class EngineError(HacrlError):
    """The engine lost a worker it trains with (a Ray actor or node died): what, and what to do."""


class OutputError(HacrlError):
    """An output path that hacrl refuses to write (outside the output root, not its own)."""


def print_error(err: BaseException, prefix: str = "hacrl: ") -> None:
    """Print `err` to stderr, `prefix` before each of its lines (a config with three values out
    of range is three lines, each naming its key)."""
    import sys

    lines = str(err).strip().splitlines() or [type(err).__name__]
    print("\n".join(prefix + line for line in lines), file=sys.stderr)


def one_line(err: BaseException) -> str:
    """The first line of an exception's message (its type when it has none)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def check_writable(folder: object, key: str = "output_root") -> None:
    """Create `folder` if needed and prove a file can be written in it; OutputError otherwise
    (before a job or sweep writes anything, instead of minutes of retries deep inside)."""
    import os
    from pathlib import Path

    path = Path(str(folder))
    probe = path / f".hacrl-write-probe-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise OutputError(f"{key}={path} is not writable ({type(err).__name__}: "
                          f"{err.strerror or err}); pass {key}=<a folder you can write>") from err
