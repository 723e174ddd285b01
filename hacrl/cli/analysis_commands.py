"""`hacrl report`, `hacrl compare` and `hacrl plot` (wired into the `hacrl` command by
hacrl/cli/main.py)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

REGRESSION_EXIT = 3  # analysis.compare.REGRESSION_EXIT (not imported for --help's sake)
COMPARE_EPILOG = f"""A and B: a sweep folder (<output_root>/sweeps/NAME, with its manifest.json),
ROOT::NAME (sweep NAME under output root ROOT) or NAME (under output_root=...), each optionally
followed by @COMMIT (4-40 hex digits): only that sweep's runs made at a git commit starting with
them, e.g. hacrl compare table2@1a2b3c4 table2@5d6e7f8.

examples:
  hacrl compare alpha1 alpha2                   two sweeps under the same output root
  hacrl compare runs/old::table2 runs/new::table2
  hacrl compare table2@1a2b3c4 table2@5d6e7f8 --fail-on-regression

exit codes: 0 compared (also when B is worse, without --fail-on-regression); 2 bad input (no
such sweep, nothing finished, nothing pairs); {REGRESSION_EXIT} with --fail-on-regression: B is
significantly worse (Holm) than A by more than --tolerance points somewhere (listed)."""


def add_parsers(sub: Any) -> None:
    report = sub.add_parser("report", help="tables and figures of a sweep next to the paper's "
                            "numbers: hacrl report table1 [scale=paper] [output_root=...]")
    report.add_argument("name", help="a sweep: table1 ... paper")
    report.add_argument("--out", default=None,
                        help="folder (default: <output_root>/reports/<sweep>-<scale>)")
    report.add_argument("--no-mlflow", action="store_true",
                        help="do not log the report as an MLflow run's artifacts, nor write "
                        "the seed-group runs")
    report.add_argument("overrides", nargs="*", help="e.g. scale=paper output_root=...")
    compare = sub.add_parser(
        "compare", help="did a change help or hurt? B - A per cell, agent and benchmark, paired "
        "by seed and problem, with 95%% intervals and verdicts: hacrl compare A B",
        epilog=COMPARE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    compare.add_argument("a", help="the baseline: a sweep folder, ROOT::NAME or NAME, "
                         "optionally @COMMIT")
    compare.add_argument("b", help="the changed one, in the same forms")
    compare.add_argument("--protocol", default=None,
                         help="the evaluation protocol compared (default: main, or the one the "
                         "sweeps' cells evaluate when none evaluates main)")
    compare.add_argument("--ignore", action="append", default=[], metavar="KEY",
                         help="a grid key that differs between the sweeps and is not part of a "
                         "cell's identity (repeatable)")
    compare.add_argument("--fail-on-regression", action="store_true",
                         help=f"exit {REGRESSION_EXIT} when B is significantly worse (Holm) by "
                         "more than --tolerance points on any benchmark or AVG")
    compare.add_argument("--tolerance", type=float, default=0.5, metavar="POINTS",
                         help="regressions smaller than this many points do not fail (default 0.5)")
    compare.add_argument("--out", default=None,
                         help="folder (default: <output_root>/reports/compare-<A>-vs-<B>)")
    compare.add_argument("overrides", nargs="*", help="e.g. output_root=... scale=paper")
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
    for command in (report, compare, plot):
        command.set_defaults(
            command_run=lambda args, unknown: run(args, [*args.overrides, *unknown]),
            takes_overrides=True)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from hacrl.config import ConfigError
    from hacrl.core.errors import HacrlError, print_error

    try:
        if args.command == "report":
            return _report(args, overrides)
        if args.command == "compare":
            return _compare(args, overrides)
        return _plot(args, overrides)
    except HacrlError as err:
        print_error(err, f"hacrl: {args.command}: ")
        return err.exit_code
    except (ConfigError, ValueError, FileNotFoundError) as err:
        print_error(err, f"hacrl: {args.command}: ")
        return 2


def _report(args: argparse.Namespace, overrides: list[str]) -> int:
    from analysis.report import destination, make_report
    from hacrl.cli.sweep_report import no_table_line, report_record, write_seed_groups
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
    if not args.no_mlflow:  # each cell's seeds under one run with their mean and interval
        print(write_seed_groups(where.store.uri, where.store.experiment))
    for claim in report.claims:
        print(f"- {claim.text}: {claim.verdict}")
    missing = sum(1 for t in report.tables.values() for _, _, es in t.rows for e in es
                  if e.ours is not None and e.ours.mean is None and e.text is None)
    print(f"report of {args.name}: {len(report.tables)} tables ({missing} cells without a value), "
          f"{len(report.figures)} figures in {report.seconds:.1f} s -> {report.folder / 'index.html'}"
          + (f"; MLflow run {report.run_id}" if report.run_id else ""))
    return 0


def _compare(args: argparse.Namespace, overrides: list[str]) -> int:
    import math
    import sys

    from analysis import compare as C
    from analysis import compare_page as page
    from analysis.compare_sides import CompareError, check_folder, labels, parse_spec
    from hacrl.config import compose
    from hacrl.core.layout import Layout

    if not math.isfinite(args.tolerance) or args.tolerance < 0:
        raise CompareError(f"--tolerance {args.tolerance}: a number of points >= 0")
    assert C.REGRESSION_EXIT == REGRESSION_EXIT
    cfg = compose(overrides)
    layout = Layout.at(cfg.output_root)
    specs = [parse_spec(text, layout.root, side) for text, side in ((args.a, "A"), (args.b, "B"))]
    for spec, side in zip(specs, "AB", strict=True):
        check_folder(spec, side)
    names = labels(*specs)
    stores: dict[tuple[str, str], Any] = {}
    sides = [_compare_side(spec, side, name, overrides, cfg, stores)
             for spec, side, name in zip(specs, "AB", names, strict=True)]
    result = C.compare(*sides, ignore=args.ignore, protocol=args.protocol)
    folder = page.write(result, Path(args.out) if args.out else layout.comparison(*names),
                        args.tolerance if args.fail_on_regression else None)
    print(page.terminal(result))
    print(f"compared {result.tests} tests ({len(result.unpaired)} not compared) -> "
          f"{folder / 'index.html'}")
    code = C.exit_code(result, args.fail_on_regression, args.tolerance)
    if code:
        found = result.regressions(args.tolerance)
        print(f"hacrl: compare: {len(found)} significant regression(s) of B beyond "
              f"--tolerance {args.tolerance:g} pt (exit {code}):", file=sys.stderr)
        for row in found:
            print(f"hacrl: compare:   {page.regression_line(row)}", file=sys.stderr)
    return code


def _compare_side(spec: Any, side: str, label: str, overrides: list[str], cfg: Any,
                  stores: dict[tuple[str, str], Any]) -> Any:
    """One side: its manifest (paths re-based onto where the folder is now) and its store (the
    manifest's; the experiment its command line's scale and tracking.experiment name, unless
    this command line sets them), each store opened once."""
    from analysis.compare_sides import CompareError, Side
    from analysis.store import open_store
    from hacrl.config import compose
    from hacrl.core.layout import Layout
    from hacrl.sweep.state import read_rebased_manifest
    from hacrl.tracking.mlflow_store import resolve_uri

    manifest = read_rebased_manifest(spec.folder)
    if manifest is None:
        raise CompareError(f"{side}={spec.text!r}: {spec.folder} holds no readable manifest; "
                           f"run `hacrl sweep {spec.name}` again to write it")
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    own = [a for a in manifest.arguments if a.split("=", 1)[0].lstrip("+~") in
           ("scale", "tracking.experiment") and a.split("=", 1)[0].lstrip("+~") not in given]
    side_cfg = compose([*overrides, *own]) if own else cfg
    uri = manifest.tracking_uri or resolve_uri(side_cfg.tracking.uri,
                                               Layout.at(spec.folder.parent.parent).root)
    key = (uri, str(side_cfg.tracking.experiment))
    if key not in stores:
        stores[key] = open_store(*key)
    return Side(spec, manifest, stores[key], label)


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
