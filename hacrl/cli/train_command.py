"""`hacrl train`: one job through the Hydra app, or `--dry-run`: compose, validate, build
each agent's config, and stop."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

TRAIN_EXAMPLES = """examples:
  hacrl train pair=size method=hacpo              one job: the size pair with HACPO
  hacrl train --dry-run pair=size method=gspo     compose and validate, then stop
  hacrl train --cfg job pair=size train.lr=1e-4   the job's config, as Hydra composes it
  hacrl train -m method=gspo,hacpo seed=0,1       a Hydra multirun: four jobs in turn
  eval "$(hacrl -sc install=bash)"               shell completion of overrides (Hydra's)

Every Hydra flag works as under `python -m hacrl.train` (--cfg, --info, -m, --resolve,
--config-dir, -sc, --hydra-help); overrides use Hydra's grammar (+key=v, ~key, a,b, range())."""


def add_parsers(sub: Any) -> None:
    train = sub.add_parser("train", help="train one job: hacrl train [hydra overrides and flags]",
                           epilog=TRAIN_EXAMPLES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("overrides", nargs="*", help="e.g. pair=size method=hacpo seed=1")
    train.add_argument("--dry-run", action="store_true",
                       help="compose and validate everything (engine=verl: build each agent's "
                       "verl config through verl's own classes), then stop")
    train.add_argument("--dry-run-dir", default=None,
                       help="with --dry-run: write the per-agent configs here")
    train.set_defaults(command_run=None)  # `hacrl train` reaches argparse only for --help


def run_words(args: list[str]) -> int:
    """`hacrl train ARGS`: `--dry-run [--dry-run-dir DIR]` here; anything else is the Hydra app
    (`hacrl.cli.hydra_app`), a plain run validated first (one line, exit 2, nothing written)."""
    from hacrl.cli.hydra_app import hydra_flags, run_app

    dry = "--dry-run" in args
    dry_dir, rest = None, []
    words = iter(args)
    for word in words:
        if word == "--dry-run-dir":
            dry_dir = next(words, None)
        elif word.startswith("--dry-run-dir="):
            dry_dir = word.split("=", 1)[1]
        elif word != "--dry-run":
            rest.append(word)
    flags = hydra_flags(rest)
    if dry and flags:
        print(f"hacrl: train: --dry-run takes overrides, not Hydra's {flags[0]} (run "
              f"`hacrl train {flags[0]} ...` without --dry-run)", file=sys.stderr)
        return 2
    if dry or not flags:
        status = _validate(rest, dry, dry_dir)
        if dry or status:
            return status
    return run_app(rest)


def _validate(overrides: list[str], dry: bool, dry_dir: str | None) -> int:
    from hacrl.config import ConfigError, compose, validate
    from hacrl.core.errors import print_error

    try:
        spec = validate(compose(overrides))
        if dry:
            from hacrl.job.dryrun import dry_run

            for record in dry_run(spec, Path(dry_dir) if dry_dir else None):
                print(" ".join(f"{k}={v}" for k, v in record.items()))
            print(f"hacrl: dry run of job {spec.config_hash} ({spec.cfg.engine.name}): ok")
    except ConfigError as err:
        print_error(err, "hacrl: config error: ")
        return 2
    return 0
