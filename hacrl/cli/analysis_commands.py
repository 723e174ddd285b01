"""`hacrl report` and `hacrl plot` (wired into the `hacrl` command by hacrl/cli/main.py)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any


def add_parsers(sub: Any) -> None:
    report = sub.add_parser("report", help="tables and figures of a sweep next to the paper's "
                            "numbers: hacrl report table1 [scale=paper] [output_root=...]")
    report.add_argument("name", help="a sweep: table1 ... paper")
    report.add_argument("--out", default=None,
                        help="folder (default: <output_root>/reports/<sweep>-<scale>)")
    report.add_argument("--no-mlflow", action="store_true",
                        help="do not log the report as an MLflow run's artifacts")
    report.add_argument("overrides", nargs="*", help="e.g. scale=paper output_root=...")
    plot = sub.add_parser("plot", help="a logged metric against step, one line per run, coloured "
                          "by a tag: hacrl plot reward/mean --by method --where pair=...")
    plot.add_argument("metric", help="e.g. reward/mean, val/tiny_math500/acc, capability/P")
    plot.add_argument("--by", default="method",
                      help="tag or setting to colour by: method, model, pair, seed, alpha, ...")
    plot.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                      help="keep runs with this tag/setting value (repeatable)")
    plot.add_argument("--pair", default=None, metavar="NAME",
                      help="a pair's view (size, state, model, ...): its HACPO/Naive runs and "
                      "its agents' single-agent baselines; a line style per agent")
    plot.add_argument("--kind", default="agent", help="agent (default), job, eval, or any")
    plot.add_argument("--out", default=None, help="file stem (default: <output_root>/plots/...)")
    plot.add_argument("overrides", nargs="*", help="e.g. output_root=... (where the store is)")
    for command in (report, plot):
        command.set_defaults(
            command_run=lambda args, unknown: run(args, [*args.overrides, *unknown]),
            takes_overrides=True)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from hacrl.config import ConfigError
    from hacrl.core.errors import HacrlError, print_error

    try:
        if args.command == "report":
            return _report(args, overrides)
        return _plot(args, overrides)
    except HacrlError as err:
        print_error(err, f"hacrl: {args.command}: ")
        return err.exit_code
    except (ConfigError, ValueError, FileNotFoundError) as err:
        print_error(err, f"hacrl: {args.command}: ")
        return 2


def _report(args: argparse.Namespace, overrides: list[str]) -> int:
    from analysis.report import destination, make_report
    from hacrl.cli.sweep_report import no_table_line, report_record
    from hacrl.config import compose
    from hacrl.sweep.grid import searchpath_of, sweep_dirs, sweep_file

    # `+sweep=<name>` (plain Hydra multirun) selects the sweep; it is not a training setting
    overrides = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != "sweep"]
    # a user's sweep: its file is in the `sweep` folder of a hydra.searchpath entry, as when
    # it ran (`hacrl sweep NAME hydra.searchpath=[file://DIR]`)
    dirs = sweep_dirs(searchpath_of(overrides))
    overrides = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != "hydra.searchpath"]
    sweep_file(args.name, dirs)  # an unknown sweep stops here, naming the known ones
    cfg = compose(overrides)
    where = destination(args.name, cfg, Path(args.out) if args.out else None, require_runs=True)
    record = report_record(args.name, overrides, cfg, dirs)
    if line := no_table_line(record, where.store.uri):
        print(line)
        return 0
    report = make_report(record, log=not args.no_mlflow, where=where)
    for claim in report.claims:
        print(f"- {claim.text}: {claim.verdict}")
    missing = sum(1 for t in report.tables.values() for _, _, es in t.rows for e in es
                  if e.ours is not None and e.ours.mean is None and e.text is None)
    print(f"report of {args.name}: {len(report.tables)} tables ({missing} cells without a value), "
          f"{len(report.figures)} figures in {report.seconds:.1f} s -> {report.folder / 'index.html'}"
          + (f"; MLflow run {report.run_id}" if report.run_id else ""))
    return 0


def _plot(args: argparse.Namespace, overrides: list[str]) -> int:
    from analysis.plot import plot_metric
    from analysis.store import open_store
    from hacrl.config import compose
    from hacrl.core.layout import Layout
    from hacrl.tracking.mlflow_store import resolve_uri

    cfg = compose(overrides)
    layout = Layout.at(cfg.output_root)
    store = open_store(resolve_uri(cfg.tracking.uri, layout.root), str(cfg.tracking.experiment))
    if store.runs.empty:
        raise ValueError(f"no runs in {store.uri} (experiment {store.experiment}); pass "
                         "output_root=... where the runs are")
    view = f"-pair-{args.pair}" if args.pair else ""
    stem = re.sub(r"[^\w.-]+", "_", f"{args.metric}-by-{args.by}{view}")
    out = Path(args.out) if args.out else layout.plot(stem)
    pair = None
    if args.pair:  # the pair as this command line composes it (ConfigError: an unknown one)
        from analysis.context import Pair
        from hacrl.sweep.grid import pair_record

        pair = Pair.of(args.pair, pair_record(args.pair, lambda extra: compose([*overrides, *extra])))
    files, drawn = plot_metric(store, args.metric, args.by, args.where, out, kind=args.kind,
                               pair=pair)
    print(f"{drawn} runs -> {', '.join(str(f) for f in files)}")
    return 0
