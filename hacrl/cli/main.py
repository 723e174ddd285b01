"""The `hacrl` command: train, sweep, plan, status, report, compare, plot, eval, data, zoo build, ui,
bench."""

from __future__ import annotations

import argparse
import sys
from types import ModuleType

from hacrl.cli import (
    analysis_commands,
    bench_commands,
    data_commands,
    eval_command,
    sweep_commands,
    train_command,
    ui,
    zoo_command,
)

# One module per command family, in the order `hacrl --help` lists them: each adds its
# subcommands (`add_parsers`) and sets their `command_run(args, unknown) -> exit code`; a subcommand
# that reads Hydra overrides also sets `takes_overrides`, the others refuse unknown words.
FAMILIES: tuple[ModuleType, ...] = (train_command, eval_command, sweep_commands,
                                    analysis_commands, data_commands, zoo_command, ui,
                                    bench_commands)


def main(argv: list[str] | None = None) -> int:
    from hacrl.core.errors import HacrlError, print_error

    try:
        return _main(argv)
    except HacrlError as err:  # a fault the user can act on: one line, no traceback
        print_error(err)
        return err.exit_code
    except KeyboardInterrupt:  # Ctrl-C: stopped, not failed
        print("hacrl: stopped (Ctrl-C)", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] in ("-sc", "--shell-completion"):
        from hacrl.cli.hydra_app import complete

        return complete(words)
    # train and sweep hand their words to Hydra as they are (its flags, its override grammar)
    if words[:1] == ["train"] and not {"-h", "--help"} & set(words[1:]):
        return train_command.run_words(words[1:])
    if words[:1] == ["sweep"] and len(words) > 1 and not {"-h", "--help"} & set(words[1:]):
        return sweep_commands.run_sweep(words[1], words[2:])
    if words[:1] == ["plan"] and len(words) > 1 and not {"-h", "--help"} & set(words[1:]):
        return sweep_commands.run_sweep(words[1], [*words[2:], "hydra.sweeper.dry_run=true"])
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "takes_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    run: int = args.command_run(args, unknown)
    return run


def _parser() -> argparse.ArgumentParser:
    """The `hacrl` parser: each family's subcommands, in the order `hacrl --help` lists them."""
    from hacrl import __version__

    parser = argparse.ArgumentParser(prog="hacrl", description=__doc__)
    parser.add_argument("--version", action="version", version=f"hacrl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for family in FAMILIES:
        family.add_parsers(sub)
    return parser


if __name__ == "__main__":
    sys.exit(main())
