"""`hacrl zoo build`: the tiny model zoo, built or completed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_parsers(sub: Any) -> None:
    zoo = sub.add_parser("zoo", help="the tiny model zoo")
    zoo_sub = zoo.add_subparsers(dest="zoo_command", required=True)
    build = zoo_sub.add_parser("build", help="build (or complete) the tiny zoo")
    build.add_argument("names", nargs="*", help="models to build (default: all)")
    build.add_argument("--root", default=None, help="zoo directory (default: $HACRL_ZOO_DIR or "
                       "~/.cache/hacrl/zoo/v1)")
    build.add_argument("--seed", type=int, default=0, help="initialisation and data order "
                       "(another seed is another draw of the zoo: give it its own --root, and "
                       "its jobs scale.zoo_seed=SEED)")
    build.add_argument("--workers", type=int, default=2)
    build.add_argument("--force", action="store_true", help="rebuild models already built")
    build.set_defaults(command_run=lambda args, unknown: run(args))


def run(args: argparse.Namespace) -> int:
    import logging

    from hacrl.zoo import build_zoo, default_zoo_dir, kept_models
    from hacrl.zoo.specs import validate_names

    root = Path(args.root) if args.root else default_zoo_dir()
    try:
        kept_models(root, validate_names(args.names or None), args.seed, args.force)
    except ValueError as err:
        print(f"hacrl: zoo build: {err}", file=sys.stderr)
        return 2

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    print(f"building the tiny zoo in {root} ({args.workers} workers; about 3.5-6 minutes on "
          "2 cores; models already built are kept)", file=sys.stderr)
    cards = build_zoo(root=root, names=args.names or None, seed=args.seed, workers=args.workers,
                      force=args.force)
    for name, card in cards.items():
        print(f"{name}: probe accuracy {card.get('probe_accuracy', float('nan')):.2f}, "
              f"{card.get('param_count', 0)} params")
    print(f"zoo at {root}")
    if args.seed:  # jobs check their models' cards against scale.zoo_seed
        print(f"its jobs: HACRL_ZOO_DIR={root} hacrl ... scale.zoo_seed={args.seed} (another "
              "zoo draw is other cells)")
    return 0
