"""The `hacrl` command: train, zoo build, ui, bench."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path


def _train(overrides: list[str]) -> int:
    from hacrl.config import ConfigError, compose, validate

    try:
        spec = validate(compose(overrides))
    except ConfigError as err:
        print(f"hacrl: config error: {err}", file=sys.stderr)
        return 2
    from hacrl.job import run_job

    summary = run_job(spec)
    if not summary.get("skipped"):
        for team in summary["teams"]:
            for agent, accs in team["final"].items():
                print(f"{agent}: eval avg acc {accs.get('eval/avg/acc', float('nan')):.3f}")
        print(f"MLflow run {summary['job_run_id']}; run dir {summary['run_dir']}")
    return 0


def _zoo(args: argparse.Namespace) -> int:
    import logging

    from hacrl.zoo import build_zoo, default_zoo_dir
    from hacrl.zoo.specs import validate_names

    try:
        validate_names(args.names or None)
    except ValueError as err:
        print(f"hacrl: zoo build: {err}", file=sys.stderr)
        return 2

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    root = Path(args.root) if args.root else default_zoo_dir()
    print(f"building the tiny zoo in {root} ({args.workers} workers; about 4 minutes on 2 cores; "
          "models already built are kept)", file=sys.stderr)
    cards = build_zoo(root=root, names=args.names or None, seed=args.seed, workers=args.workers,
                      force=args.force)
    for name, card in cards.items():
        print(f"{name}: probe accuracy {card.get('probe_accuracy', float('nan')):.2f}, "
              f"{card.get('param_count', 0)} params")
    print(f"zoo at {root}")
    return 0


def _ui(args: argparse.Namespace) -> int:
    from hacrl.tracking import resolve_uri

    uri = resolve_uri(args.uri, Path(args.outputs).resolve())
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
           "MLFLOW_DISABLE_TELEMETRY": "true"}
    print(f"MLflow UI for {uri} at http://127.0.0.1:{args.port}", file=sys.stderr)
    return subprocess.call([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                            "--host", "127.0.0.1", "--port", str(args.port), "--workers", "1"],
                           env=env)


def _bench(args: argparse.Namespace) -> int:
    from hacrl.bench import step_cost

    return step_cost(args.overrides, repeats=args.repeats)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hacrl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train one job: hacrl train [hydra overrides]")
    train.add_argument("overrides", nargs="*", help="e.g. pair=size method=hacpo seed=1")
    zoo = sub.add_parser("zoo", help="the tiny model zoo")
    zoo_sub = zoo.add_subparsers(dest="zoo_command", required=True)
    build = zoo_sub.add_parser("build", help="build (or complete) the tiny zoo")
    build.add_argument("names", nargs="*", help="models to build (default: all)")
    build.add_argument("--root", default=None, help="zoo directory (default: $HACRL_ZOO_DIR or "
                       "~/.cache/hacrl/zoo/v1)")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--workers", type=int, default=2)
    build.add_argument("--force", action="store_true", help="rebuild models already built")
    ui = sub.add_parser("ui", help="serve the MLflow UI for the store on 127.0.0.1")
    ui.add_argument("--outputs", default=os.environ.get("HACRL_OUTPUTS", "outputs"))
    ui.add_argument("--uri", default=None, help="tracking URI (default: the job store)")
    ui.add_argument("--port", type=int, default=5000)
    bench = sub.add_parser("bench", help="benchmarks that print figures")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    step = bench_sub.add_parser("step", help="one step of gspo_x2 vs hacpo, phase by phase")
    step.add_argument("overrides", nargs="*", help="hydra overrides (default: tiny size pair)")
    step.add_argument("--repeats", type=int, default=3)

    args, unknown = parser.parse_known_args(argv)
    if args.command == "train":
        return _train([*args.overrides, *unknown])
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "zoo":
        return _zoo(args)
    if args.command == "ui":
        return _ui(args)
    return _bench(args)


if __name__ == "__main__":
    sys.exit(main())
