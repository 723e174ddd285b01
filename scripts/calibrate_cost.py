"""Fit the cost model (hacrl.sweep.cost_model) on finished sweeps and print how well it predicts.

    python scripts/calibrate_cost.py OUTPUT_ROOT [--sweep table1 ...] [--slots 2] [--write]

For every finished sweep under OUTPUT_ROOT/sweeps (or the named ones): each done cell's work
(from its manifest, or composed again from its overrides for manifests older than the cost
model) against the seconds the sweep measured from its launch to its return. Prints the seconds
per unit, each method's mean leave-one-out error, and the sweep's wall time as the fit predicts
it (the cells on `--slots` slots, longest first) next to the one the sweep measured. `--write`
stores the fit as the shipped tiny calibration (hacrl/sweep/calibration_tiny.json), which
`hacrl plan` uses where an output root has measured too little of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from hacrl.config import compose
from hacrl.core.eta import duration
from hacrl.core.fileio import write_json
from hacrl.core.layout import Layout, SweepDir
from hacrl.schema.sweep_manifest import read_manifest
from hacrl.sweep.cost_model import UNITS, cell_work, fit, makespan
from hacrl.sweep.cost_plan import TINY_FILE


def sweep_rows(folder: Path) -> tuple[list[tuple[dict[str, float], float, str, bool]], float]:
    """(work, seconds, method, timing cell?) of a sweep's measured cells, and its wall time."""
    manifest = read_manifest(folder)
    status = json.loads(SweepDir(folder).status.read_text())
    if manifest is None:
        raise SystemExit(f"{folder}: no manifest")
    walls = {r["cell"]: r.get("wall_s") for r in status["rows"] if r.get("status") == "done"}
    own = [a for a in manifest.arguments if not a.startswith(("+sweep=", "hydra."))]
    rows = []
    for cell in manifest.cells:
        wall = walls.get(cell.id)
        if not wall:
            continue
        work = cell.work or cell_work(
            compose([f"+sweep={manifest.sweep}", *own, *cell.overrides]), cell.agents,
            cell.benchmarks, cell.protocols)
        rows.append((work, float(wall), cell.method, cell.cost))
    return rows, float(status.get("seconds") or 0.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output_root", type=Path)
    parser.add_argument("--sweep", nargs="*", help="sweep names (default: every finished one)")
    parser.add_argument("--slots", type=int, default=2, help="cells the sweeps ran at a time")
    parser.add_argument("--write", action="store_true", help=f"write hacrl/sweep/{TINY_FILE}")
    args = parser.parse_args()
    base = Layout.at(args.output_root).sweeps
    names = args.sweep or sorted(p.name for p in base.iterdir()
                                 if SweepDir(p).status.exists())
    rows: list[tuple[dict[str, float], float, str, bool]] = []
    for name in names:
        sweep, wall = sweep_rows(base / name)
        rows += sweep
        print(f"{name}: {len(sweep)} measured cells, sweep wall {duration(wall)}")
    if not rows:
        print("no measured cells", file=sys.stderr)
        return 2
    calibration = fit([(w, s) for w, s, _, _ in rows],
                      f"{len(rows)} cells of {', '.join(names)} measured on a "
                      f"{os.cpu_count()}-core {platform.machine()} machine "
                      f"({time.strftime('%Y-%m-%d')})")
    print("seconds per unit:", {u: round(v, 4) for u, v in
                                calibration.seconds_per_unit.items()})
    print(calibration.error_summary())
    if calibration.loo_total_error is not None:
        print(f"summed over the cells, left out one at a time: {calibration.loo_total_error:+.1%}")
    errors = np.asarray(calibration.loo_errors)
    for method in dict.fromkeys(m for _, _, m, _ in rows):
        index = [i for i, r in enumerate(rows) if r[2] == method]
        if len(errors):
            print(f"  {method:<16} {len(index):>4} cells, mean measured "
                  f"{np.mean([rows[i][1] for i in index]):6.1f} s, leave-one-out error mean "
                  f"{errors[index].mean():+.0%}, |error| median {np.median(abs(errors[index])):.0%}")
    for name in names:
        sweep, wall = sweep_rows(base / name)
        main_cells = [calibration.predict(w) for w, _, _, cost in sweep if not cost]
        timing = sum(calibration.predict(w) for w, _, _, cost in sweep if cost)
        predicted = makespan(main_cells, args.slots) + timing
        measured_cells = makespan([s for _, s, _, cost in sweep if not cost], args.slots) \
            + sum(s for _, s, _, cost in sweep if cost)
        print(f"{name}: predicted wall {duration(predicted)} on {args.slots} slots; measured "
              f"{duration(wall)} (the measured cells scheduled alike: "
              f"{duration(measured_cells)}); predicted / measured = {predicted / wall:.2f}")
    if args.write:
        target = Path(__file__).resolve().parents[1] / "hacrl" / "sweep" / TINY_FILE
        write_json(target, {"source": calibration.source, "rows": calibration.rows,
                            "units": list(UNITS),
                            "seconds_per_unit": calibration.seconds_per_unit,
                            "loo_errors": [round(e, 4) for e in calibration.loo_errors],
                            "loo_total_error": calibration.loo_total_error})
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
