"""The timing cells of Tables 7 and 8, cold and warm side by side in one run; figures only.

    python scripts/bench_timing_cells.py [--methods gspo hacpo] [--pairs size] [--repeats 4]
                                         [--timing-repeats 3] [-- extra overrides]

A timing (cost) cell trains scale.cost_steps steps alone, one at a time, after every other cell,
and logs the seconds Table 7 reads (`time/wall_s` of its job run) and the peak memory Table 8
reads (`memory/peak_rss_gb` on CPU). Each repeat runs one `hacrl sweep` of those cells per way,
on the zoo `hacrl` finds ($HACRL_ZOO_DIR or the built one), each into its own fresh output root,
the ways alternating (bench_sweep.py's `alternate`):
  cold   one submitit process per cell (`hydra.sweeper.warm=false`), as timing cells ran before;
  warm   each cell forked from the sweep's warm process (the default).
It prints, per method and team (as the tables place them), the median over cells of what the
tables read, cold vs warm, each way's range and the ratio warm / cold; Table 7's total per
method (single-agent methods: both agents' seconds summed per repeat); the job's other time/*
per team and way; and the wall time of the whole timing block (the sum of its cells'
dispatch-to-return seconds: they run one after the other) and of the whole sweep command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from bench_sweep import TREE, alternate, write_sweep  # scripts/bench_sweep.py (this folder)

TABLE7, TABLE8 = "time/wall_s", "memory/peak_rss_gb"  # analysis/tables_cost.py, scale=tiny
PHASES = ("time/startup_s", "time/setup_s", "time/validation_s", "time/train_s", "time/eval_s",
          "time/tracking_s")
COST = """        cost:
          repeats: {repeats}
          overrides: ["train.steps=${{scale.cost_steps}}"]
"""


def job_metrics(root: Path) -> list[dict]:
    """One row per timing cell of the sweep in `root`: its method, team, repeat, the metrics of
    its job run, and its wall time as the sweep saw it (dispatch to return)."""
    from mlflow.tracking import MlflowClient

    sweep = root / "sweeps" / "bench"
    cells = {c["id"]: c for c in json.loads((sweep / "manifest.json").read_text())["cells"]}
    walls = {r["cell"]: float(r.get("wall_s") or 0.0)
             for r in json.loads((sweep / "status.json").read_text())["rows"]}
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.`hacrl.kind` = 'job'")
    rows = []
    for run in runs:
        cell = cells.get(run.data.tags.get("config_hash", ""))
        if cell is None or not cell["cost"] or run.info.status != "FINISHED":
            continue
        rows.append({"method": cell["method"], "team": " + ".join(cell["agents"]),
                     "repeat": (str(root), int(cell["params"].get("timing_repeat") or 0)),
                     "cell_wall_s": walls.get(cell["id"], 0.0), **run.data.metrics})
    if len(rows) != sum(c["cost"] for c in cells.values()):
        raise SystemExit(f"{root}: {len(rows)} finished timing runs for "
                         f"{sum(c['cost'] for c in cells.values())} timing cells")
    return rows


def spread(values: list[float], digits: int) -> str:
    """`median (min-max)`."""
    return (f"{statistics.median(values):.{digits}f} "
            f"({min(values):.{digits}f}-{max(values):.{digits}f})")


def line(label: str, cold: list[float], warm: list[float], digits: int) -> str:
    ratio = statistics.median(warm) / statistics.median(cold) if statistics.median(cold) else 0.0
    return (f"  {label:<44}{spread(cold, digits):>22}{spread(warm, digits):>22}"
            f"{ratio:>10.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["gspo", "hacpo"])
    parser.add_argument("--pairs", nargs="+", default=["size"])
    parser.add_argument("--repeats", type=int, default=4, help="sweeps per way")
    parser.add_argument("--timing-repeats", type=int, default=3,
                        help="the grid's cost.repeats (sweeps/cost.yaml: 3)")
    args, overrides = parser.parse_known_args(argv)
    overrides = [o for o in overrides if o != "--"]
    ways = {"cold": (TREE, ["hydra.sweeper.warm=false"]),
            "warm": (TREE, ["hydra.sweeper.warm=true"])}
    rows: dict[str, list[dict]] = {w: [] for w in ways}
    sweeps: dict[str, list[float]] = {w: [] for w in ways}
    blocks: dict[str, list[float]] = {w: [] for w in ways}
    with tempfile.TemporaryDirectory(prefix="hacrl-bench-timing-") as tmp:
        configs = write_sweep(Path(tmp), args.pairs, args.methods,
                              COST.format(repeats=args.timing_repeats))
        for way, root, wall in alternate(ways, args.repeats, configs, Path(tmp), overrides):
            found = job_metrics(root)
            rows[way].extend(found)
            sweeps[way].append(wall)
            blocks[way].append(sum(r["cell_wall_s"] for r in found))
    report(rows, sweeps, blocks, args, overrides)
    return 0


def report(rows: dict[str, list[dict]], sweeps: dict[str, list[float]],
           blocks: dict[str, list[float]], args: argparse.Namespace, overrides: list[str]) -> None:
    cells = len(rows["cold"]) // args.repeats
    print(f"\n{cells} timing cells per sweep ({' '.join(args.methods)} x {' '.join(args.pairs)}, "
          f"{args.timing_repeats} repeats each{', ' + ' '.join(overrides) if overrides else ''}), "
          f"{args.repeats} sweeps per way, {os.cpu_count()} cores")
    print(f"\n{'median (min-max)':<46}{'cold':>22}{'warm':>22}{'warm/cold':>10}")
    print("wall time, seconds")
    print(line("timing block (its cells' walls summed)", blocks["cold"], blocks["warm"], 1))
    print(line("whole sweep command", sweeps["cold"], sweeps["warm"], 1))
    teams = list(dict.fromkeys((r["method"], r["team"]) for r in rows["cold"]))

    def values(way: str, method: str, team: str, metric: str) -> list[float]:
        return [float(r[metric]) for r in rows[way]
                if (r["method"], r["team"]) == (method, team) and metric in r]

    print(f"Table 7: {TABLE7} of each cell's job run, seconds")
    for method, team in teams:
        print(line(f"{method} {team}", values("cold", method, team, TABLE7),
                   values("warm", method, team, TABLE7), 2))
    for method in dict.fromkeys(m for m, _ in teams):
        if sum(m == method for m, _ in teams) > 1:  # Table 7's total: agents summed per repeat
            totals = {}
            for way in rows:
                summed: dict[tuple, float] = defaultdict(float)
                for r in rows[way]:
                    if r["method"] == method:
                        summed[r["repeat"]] += float(r[TABLE7])
                totals[way] = list(summed.values())
            print(line(f"{method} total (agents summed per repeat)", totals["cold"],
                       totals["warm"], 2))
    print(f"Table 8: {TABLE8} of each cell's job run, GB")
    for method, team in teams:
        print(line(f"{method} {team}", values("cold", method, team, TABLE8),
                   values("warm", method, team, TABLE8), 3))
    print(f"\nthe job runs' other time/*, median seconds{'':<22}"
          + "".join(f"{m[5:-2]:>11}" for m in PHASES))
    for method, team in teams:
        for way in rows:
            print(f"  {method + ' ' + team if way == 'cold' else '':<58}{way:<6}"
                  + "".join(f"{statistics.median(values(way, method, team, m) or [0.0]):>11.2f}"
                            for m in PHASES))


if __name__ == "__main__":
    sys.exit(main())
