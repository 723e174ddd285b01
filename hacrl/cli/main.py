"""The `hacrl` command: train, sweep, status, report, plot, eval, data, zoo build, ui, bench."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any


def _train_command(args: list[str]) -> int:
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
    from hacrl.errors import print_error

    try:
        spec = validate(compose(overrides))
        if dry:
            from hacrl.dryrun import dry_run

            for record in dry_run(spec, Path(dry_dir) if dry_dir else None):
                print(" ".join(f"{k}={v}" for k, v in record.items()))
            print(f"hacrl: dry run of job {spec.config_hash} ({spec.cfg.engine.name}): ok")
    except ConfigError as err:
        print_error(err, "hacrl: config error: ")
        return 2
    return 0


def _eval(args: argparse.Namespace, overrides: list[str]) -> int:
    from hacrl.config import ConfigError, compose, model_path
    from hacrl.evaluation import Protocol, runner
    from hacrl.job.lock import evaluation_lock
    from hacrl.layout import Layout
    from hacrl.mlflow_store import resolve_uri
    from hacrl.schema import tags as T
    from hacrl.tracking import Tracker

    chosen = [flag for flag in ("model", "checkpoint", "run") if getattr(args, flag)]
    if len(chosen) != 1:
        print("hacrl: eval: give exactly one of --model NAME, --checkpoint DIR, --run RUN_ID",
              file=sys.stderr)
        return 2
    try:
        cfg = compose(overrides)
        if args.limit is not None:
            # a limited evaluation is its own protocol (its key differs), never mistaken for
            # the full one when the "already logged" check or a report reads it
            overrides = [*overrides, *(f"eval.protocols.{name}.limit={args.limit}"
                                       for name in cfg.eval.use)]
            cfg = compose(overrides)
        Protocol.in_use(cfg.eval)
        runner.data_files(cfg, [str(b) for b in cfg.eval.benchmarks])  # missing data: stop here
        if cfg.engine.get("threads"):
            # as a training job does (engine.threads: 1 at scale=tiny): torch's default of a
            # thread per core made the tiny models' generation several times slower on a
            # busy 2-core CPU (threads waiting on each other), for the same responses
            import torch

            torch.set_num_threads(int(cfg.engine.threads))
        output_root = Layout.at(cfg.output_root).root
        tracker = Tracker(resolve_uri(cfg.tracking.uri, output_root), cfg.tracking.experiment)
        model = (model_path(cfg, 0, args.model) if args.model else
                 str(Path(args.checkpoint).expanduser().resolve()) if args.checkpoint else args.run)
        with evaluation_lock(output_root, model, args.model or args.checkpoint or args.run):
            if args.model:
                target = runner.target_from_model(tracker, cfg, args.model, model)
            elif args.checkpoint:
                target = runner.target_from_checkpoint(tracker, cfg, Path(args.checkpoint))
            else:
                target = runner.target_from_run(tracker, args.run)
            standalone = tracker.client.get_run(target.run_id).data.tags.get(T.KIND) == T.EVAL
            status = "FAILED"
            try:
                results = runner.evaluate_into_run(cfg, target.model_path, tracker,
                                                   target.run_id, target.step, force=args.force)
                status = "FINISHED"
            finally:
                if standalone:
                    tracker.finish(target.run_id, status)
    except ConfigError as err:
        print(f"hacrl: eval: {err}", file=sys.stderr)
        return 2
    for result in results:
        what = ("already logged (--force re-evaluates)" if result.skipped else
                f"same settings as {result.shared_with}, scores copied" if result.shared_with else
                f"evaluated in {result.seconds:.1f} s")
        print(f"{target.label} (step {target.step}), protocol {result.protocol.name} "
              f"[{result.protocol.key}]: {what}")
        print(runner.describe(result))
    print(f"MLflow run {target.run_id} in {tracker.uri}")
    return 0


def _sweep(name: str, args: list[str]) -> int:
    """`hacrl sweep NAME ARGS`: the Hydra app in multirun mode with `+sweep=NAME`; ARGS are
    overrides and Hydra flags (`--cfg job`, ...) as `hacrl train` takes them."""
    from hacrl.cli.hydra_app import PRINT_ONLY, hydra_flags, run_app
    from hacrl.config import ConfigError
    from hacrl.sweep.grid import check_sweep_file, searchpath_of, sweep_dirs, sweep_file

    try:  # the sweep's file (a user's, in a hydra.searchpath folder, too): before Hydra starts
        check_sweep_file(sweep_file(name, sweep_dirs(searchpath_of(args))), entry=True)
    except ConfigError as err:
        print(f"hacrl: sweep: {err}", file=sys.stderr)
        return 2
    rest = [a for a in args if a not in ("-m", "--multirun")]
    # a sweep is a multirun, unless a flag only prints (Hydra takes one mode at a time)
    mode = [] if {f.split("=", 1)[0] for f in hydra_flags(rest)} & PRINT_ONLY else ["-m"]
    return run_app([*mode, f"+sweep={name}", *rest])


def _status(args: argparse.Namespace, overrides: list[str]) -> int:
    import time

    from hacrl.config import ConfigError, compose
    from hacrl.layout import Layout
    from hacrl.sweep.progress import Tally
    from hacrl.sweep.state import cell_status, format_table, read_cells
    from hacrl.tracking import Tracker

    try:
        cfg = compose(overrides)
    except ConfigError as err:
        print(f"hacrl: status: {err}", file=sys.stderr)
        return 2
    sweep_dir = Layout.at(cfg.output_root).sweep(args.name).path
    manifest, cells = read_cells(sweep_dir)
    if manifest is None or not cells:
        print(f"hacrl: status: sweep {args.name} has not started in {sweep_dir.parent}; "
              f"run `hacrl sweep {args.name}` (or pass output_root=...)", file=sys.stderr)
        return 2
    tracker = Tracker(manifest.tracking_uri, str(cfg.tracking.experiment))
    tracker.reap_dead_runs()  # a run whose process died is KILLED, not RUNNING
    rows = [cell_status(cell, sweep_dir, tracker) for cell in cells]
    print(format_table(rows))
    # a cell that ended before the sweep's latest start took none of its time: out of the ETA
    statuses = {r["cell"]: "skipped" if r["status"] == "done" and (r.get("ended") or 0)
                < manifest.created else r["status"] for r in rows}
    # elapsed and ETA since the sweep's latest start, while any of its cells runs
    elapsed = time.time() - manifest.created if "running" in statuses.values() else 0.0
    summary = Tally(cells, 1).summary(args.name, statuses, {r["cell"]: r for r in rows},
                                      {c.id: c for c in cells}, elapsed)
    if not elapsed:
        summary = summary.split(" · ")[0]
    print(f"{summary} ({len(rows)} cells, asked {manifest.asked}; state in {sweep_dir})")
    return 0


def _zoo(args: argparse.Namespace) -> int:
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


def _ui(args: argparse.Namespace) -> int:
    from hacrl.cli.ui import parse_overrides, serve

    try:
        settings = parse_overrides(args.overrides)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    output_root = settings.get("output_root") or args.outputs or os.environ.get(
        "HACRL_OUTPUTS", "outputs")
    return serve(args.uri, output_root, args.port)


def _bench(args: argparse.Namespace) -> int:
    if args.bench_command == "floor":
        from hacrl.compute_floor import floor_report

        return floor_report(args.overrides, repeats=args.repeats)
    from hacrl.bench import step_cost

    return step_cost(args.overrides, repeats=args.repeats)


def main(argv: list[str] | None = None) -> int:
    from hacrl.errors import HacrlError, print_error

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
    if words[:1] == ["train"] and not {"-h", "--help"} & set(words[1:]):
        return _train_command(words[1:])
    if words[:1] == ["sweep"] and len(words) > 1 and not {"-h", "--help"} & set(words[1:]):
        return _sweep(words[1], words[2:])
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command == "eval":
        return _eval(args, [*args.overrides, *unknown])
    if args.command == "status":
        return _status(args, [*args.overrides, *unknown])
    if args.command in ("report", "plot"):
        from hacrl.cli.analysis_commands import run as run_analysis

        return run_analysis(args, [*args.overrides, *unknown])
    if args.command == "data":
        from hacrl.cli.data import run as run_data

        return run_data(args, unknown)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "zoo":
        return _zoo(args)
    if args.command == "ui":
        return _ui(args)
    return _bench(args)


def _parser() -> argparse.ArgumentParser:
    """The `hacrl` parser: one subcommand each, in the order `hacrl --help` lists them."""
    from hacrl import __version__
    from hacrl.cli.analysis_commands import add_parsers as add_analysis_parsers
    from hacrl.cli.data import add_parser as add_data_parser

    parser = argparse.ArgumentParser(prog="hacrl", description=__doc__)
    parser.add_argument("--version", action="version", version=f"hacrl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train_parser(sub)
    _add_eval_parser(sub)
    _add_sweep_parser(sub)
    _add_status_parser(sub)
    add_analysis_parsers(sub)
    add_data_parser(sub)
    _add_zoo_parser(sub)
    _add_ui_parser(sub)
    _add_bench_parser(sub)
    return parser


TRAIN_EXAMPLES = """examples:
  hacrl train pair=size method=hacpo              one job: the size pair with HACPO
  hacrl train --dry-run pair=size method=gspo     compose and validate, then stop
  hacrl train --cfg job pair=size train.lr=1e-4   the job's config, as Hydra composes it
  hacrl train -m method=gspo,hacpo seed=0,1       a Hydra multirun: four jobs in turn
  eval "$(hacrl -sc install=bash)"               shell completion of overrides (Hydra's)

Every Hydra flag works as under `python -m hacrl.train` (--cfg, --info, -m, --resolve,
--config-dir, -sc, --hydra-help); overrides use Hydra's grammar (+key=v, ~key, a,b, range())."""


def _add_train_parser(sub: Any) -> None:
    train = sub.add_parser("train", help="train one job: hacrl train [hydra overrides and flags]",
                           epilog=TRAIN_EXAMPLES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("overrides", nargs="*", help="e.g. pair=size method=hacpo seed=1")
    train.add_argument("--dry-run", action="store_true",
                       help="compose and validate everything (engine=verl: build each agent's "
                       "verl config through verl's own classes), then stop")
    train.add_argument("--dry-run-dir", default=None,
                       help="with --dry-run: write the per-agent configs here")


def _add_eval_parser(sub: Any) -> None:
    ev = sub.add_parser("eval", help="evaluate a catalog model, a checkpoint or an agent run on the "
                        "configured benchmarks through lm-eval; scores go to MLflow")
    ev.add_argument("--model", help="catalog model before training, e.g. qwen3-4b-base")
    ev.add_argument("--checkpoint", help="a model directory, e.g. a job's .../ckpt/step_N/<agent>")
    ev.add_argument("--run", help="MLflow run id of a training job's agent run")
    ev.add_argument("--force", action="store_true", help="re-evaluate even if already logged")
    ev.add_argument("--limit", type=int, default=None,
                    help="first N problems per benchmark (quick checks; sets the protocols' "
                    "limit, so their key differs from the full evaluation's)")
    ev.add_argument("overrides", nargs="*", help="hydra overrides, e.g. eval.use=[ablation] scale=paper")


SWEEP_EXAMPLES = """examples:
  hacrl sweep table1                              Table 1 at tiny scale, 2 cells at a time
  hacrl sweep paper hydra.sweeper.dry_run=true    what would run, launching nothing
  hacrl sweep table2 --cfg hydra                  the sweep's Hydra config
  hacrl sweep paper scale=paper launcher=slurm    GPUs on a SLURM cluster"""


def _add_sweep_parser(sub: Any) -> None:
    sweep = sub.add_parser("sweep", help="run a paper sweep (sweeps/<name>.yaml): hacrl sweep "
                           "table1 [overrides], e.g. scale=paper launcher=slurm",
                           epilog=SWEEP_EXAMPLES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep.add_argument("name", help="table1 table2 table3 alpha seeds cost table9 figure3 "
                       "schedules paper")
    sweep.add_argument("overrides", nargs="*")


def _add_status_parser(sub: Any) -> None:
    status = sub.add_parser("status", help="the table of a sweep's cells (while it runs or after)")
    status.add_argument("name")
    status.add_argument("overrides", nargs="*", help="e.g. output_root=... (where it ran)")


def _add_zoo_parser(sub: Any) -> None:
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


def _add_ui_parser(sub: Any) -> None:
    ui = sub.add_parser("ui", help="serve the MLflow UI for the store on 127.0.0.1 (stops "
                        "with Ctrl-C, SIGTERM or its parent): hacrl ui [output_root=PATH]")
    ui.add_argument("overrides", nargs="*", help="output_root=PATH (default: outputs, or "
                    "$HACRL_OUTPUTS), as for every other command")
    ui.add_argument("--outputs", default=None, help=argparse.SUPPRESS)  # the old spelling
    ui.add_argument("--uri", default=None, help="tracking URI (default: the job store)")
    ui.add_argument("--port", type=int, default=5000)


def _add_bench_parser(sub: Any) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print figures")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    step = bench_sub.add_parser("step", help="one step of gspo_x2 vs hacpo, phase by phase, and "
                                "(local engine) each phase against its compute floor")
    step.add_argument("overrides", nargs="*", help="hydra overrides (default: tiny size pair)")
    step.add_argument("--repeats", type=int, default=3)
    floor = bench_sub.add_parser("floor", help="each phase of one step (local engine) next to its "
                                 "compute floor: the same shapes as bare model calls")
    floor.add_argument("overrides", nargs="*", help="hydra overrides (default: method=hacpo, "
                       "tiny size pair)")
    floor.add_argument("--repeats", type=int, default=3)


if __name__ == "__main__":
    sys.exit(main())
