"""`hacrl sweep NAME` (the Hydra app in multirun mode with `+sweep=NAME`) and `hacrl status
NAME` (the table of its cells, from any shell)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

SWEEP_EXAMPLES = """examples:
  hacrl sweep table1                              Table 1 at tiny scale, 2 cells at a time
  hacrl sweep paper hydra.sweeper.dry_run=true    what would run and cost, launching nothing
  hacrl plan paper scale=paper launcher=slurm     the same (a sweep's dry run)
  hacrl sweep table2 --cfg hydra                  the sweep's Hydra config
  hacrl sweep paper scale=paper launcher=slurm    GPUs on a SLURM cluster"""


def add_parsers(sub: Any) -> None:
    sweep = sub.add_parser("sweep", help="run a paper sweep (sweeps/<name>.yaml): hacrl sweep "
                           "table1 [overrides], e.g. scale=paper launcher=slurm",
                           epilog=SWEEP_EXAMPLES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep.add_argument("name", help="table1 table2 table3 alpha seeds cost table9 figure3 "
                       "schedules paper")
    sweep.add_argument("overrides", nargs="*")
    sweep.set_defaults(command_run=None)  # `hacrl sweep NAME` reaches argparse only for --help
    plan = sub.add_parser("plan", help="what a sweep would run and cost, launching nothing "
                          "(its dry run): hacrl plan paper scale=paper launcher=slurm",
                          epilog="The estimate's seconds per unit come from the cells this "
                          "output root measured at the same scale, else from the shipped "
                          "calibration (tiny: a 2-core machine; paper: the paper's Table 7); "
                          "docs/COST.md says how.")
    plan.add_argument("name", help="a sweep, as for hacrl sweep")
    plan.add_argument("overrides", nargs="*")
    plan.set_defaults(command_run=None)  # reaches argparse only for --help
    status = sub.add_parser("status", help="the table of a sweep's cells (while it runs or after)")
    status.add_argument("name")
    status.add_argument("overrides", nargs="*", help="e.g. output_root=... (where it ran)")
    status.set_defaults(
        command_run=lambda args, unknown: run_status(args, [*args.overrides, *unknown]),
        takes_overrides=True)


def run_sweep(name: str, args: list[str]) -> int:
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


def run_status(args: argparse.Namespace, overrides: list[str]) -> int:
    import time

    from hacrl.config import ConfigError, compose
    from hacrl.core.layout import Layout
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
    print(_cost_line(manifest, str(cfg.tracking.experiment), statuses))
    return 0


def _cost_line(manifest: Any, experiment: str, statuses: dict[str, str]) -> str:
    """What the sweep's done cells cost so far, read from the store (`analysis.cost`)."""
    from analysis.cost import status_line
    from analysis.store import open_store
    from hacrl.core.errors import StoreError

    try:
        store = open_store(manifest.tracking_uri, experiment)
    except StoreError as err:
        return f"cost so far: not read ({err})"
    return status_line(store, manifest.cells, statuses)
