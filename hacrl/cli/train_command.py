"""`hacrl train`: one job, composed and validated once (a plain run), or through the Hydra app
(any Hydra flag: `--cfg`, `-m`, ...), or `--dry-run`: compose, validate, build each agent's
config, and stop."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hacrl.config import JobSpec

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
    """`hacrl train ARGS`: `--dry-run [--dry-run-dir DIR]` and a plain run (overrides only) are
    composed and validated here, once, and the plain run's job runs from that spec
    (`hacrl.train.run_spec`); with a Hydra flag ARGS go to the Hydra app (`hacrl.cli.hydra_app`),
    which composes and validates each of its jobs itself. A bad value is one line and exit 2,
    before anything is written."""
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
    if flags:
        return run_app(rest)
    spec = _validate(rest)
    if spec is None:
        return 2
    if dry:
        return _dry_run(spec, Path(dry_dir) if dry_dir else None)
    if (spec.cfg.get("cell") or {}).get("id"):  # a sweep's cell (the sweep's launchers run it)
        return run_app(rest)
    from hacrl.train import run_spec

    return run_spec(spec)[0]


def _validate(overrides: list[str]) -> JobSpec | None:
    """The job's spec, composed and validated; None after one line naming what is wrong."""
    from hacrl.config import ConfigError, compose, validate
    from hacrl.core.errors import print_error

    try:
        return validate(compose(overrides))
    except ConfigError as err:
        print_error(err, "hacrl: config error: ")
        return None


def _dry_run(spec: JobSpec, directory: Path | None) -> int:
    """Build each agent's engine config (verl: through verl's own classes), print one line
    per agent, and stop; a config error is one line and exit 2."""
    from hacrl.config import ConfigError
    from hacrl.core.errors import print_error
    from hacrl.job.dryrun import dry_run

    try:
        for record in dry_run(spec, directory):
            print(" ".join(f"{k}={v}" for k, v in record.items()))
    except ConfigError as err:
        print_error(err, "hacrl: config error: ")
        return 2
    print(f"hacrl: dry run of job {spec.config_hash} ({spec.cfg.engine.name}): ok")
    return 0
