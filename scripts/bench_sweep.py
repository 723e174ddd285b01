"""The same small sweep the old way and the new way, side by side in one run; figures only.

    python scripts/bench_sweep.py [--methods gspo hacpo] [--pairs size] [--repeats 1]
                                  [--baseline REV] [-- extra overrides, e.g. train.steps=10]

Each repeat runs one `hacrl sweep` per way into its own fresh output root (the ways alternate,
so the machine's noise hits both alike):
  cold   one submitit process per cell (`hydra.sweeper.warm=false`): a new interpreter, its
         imports and submitit's polling per cell, as every sweep ran before;
  warm   the cells forked from one process that imported everything once (the default).
With `--baseline REV` the ways are instead `old`, the code of git revision REV (exported into a
temporary folder) as it ran its sweeps, and `new`, this tree as it runs them: every change
between the two at once (warm cells, cache-sized forwards, faster evaluation).
It prints each way's sweep wall time and the ratio cold / warm, then per way the median over
cells of each phase the job logs (startup = process start to job start, setup, validation,
train, eval, tracking) and `outside` = the cell's wall time as the sweep sees it minus the
phases (launch, exit, polling). Last, whether both ways logged the same final scores: a cell
is the same job either way, so cold and warm must agree bit for bit (exit 1 after a
"bench_sweep: FAIL" line when they do not, or when there are no scores to compare); against a
`--baseline` the differences are only reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

SWEEP = """# @package _global_
defaults:
  - override /hydra/sweeper: hacrl
  - override /launcher: local
hydra:
  sweep:
    dir: ${{output_root}}/sweeps/bench
    subdir: .jobs/${{hydra.job.num}}
  sweeper:
    name: bench
    grids:
      - pair: {pairs}
        method: {methods}
"""
TREE = Path(__file__).resolve().parents[1]
PHASES = ("startup_s", "setup_s", "validation_s", "train_s", "eval_s", "tracking_s")


def run_sweep(configs: Path, root: Path, way: str, tree: Path, overrides: list[str]) -> float:
    """Wall seconds of one `hacrl sweep bench` of the code in `tree` into `root`."""
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "hacrl.cli", "sweep", "bench",
                          f"hydra.searchpath=[file://{configs}]", f"output_root={root}",
                          *overrides],
                         capture_output=True, text=True, cwd=tree,
                         env={**os.environ, "HACRL_OUTPUTS": str(root), "PYTHONPATH": str(tree)})
    wall = time.perf_counter() - started
    if out.returncode != 0:
        sys.stderr.write(out.stdout[-4000:] + out.stderr[-4000:])
        raise SystemExit(f"the {way} sweep failed (exit {out.returncode})")
    return wall


def cell_rows(root: Path) -> list[dict]:
    """Each cell's state (phases) with its wall time as the sweep measured it."""
    status = json.loads((root / "sweeps" / "bench" / "status.json").read_text())
    rows = []
    for row in status["rows"]:
        state = json.loads((root / "sweeps" / "bench" / "cells" / f"{row['cell']}.json").read_text())
        rows.append({**state, "wall_s": row.get("wall_s", 0.0)})
    return rows


def final_scores(root: Path) -> dict[tuple[str, ...], dict[str, float]]:
    """(pair, method, seed, timing repeat, model) -> the run's eval/ and val/ metrics, from the
    MLflow store (not keyed by config hash: a revision may hash the same cell differently)."""
    from mlflow.tracking import MlflowClient

    from hacrl.schema import tags as T

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return {tuple(r.data.tags.get(t, "") for t in (T.PAIR, T.METHOD, T.SEED, T.TIMING_REPEAT,
                                                   T.MODEL)):
            {k: v for k, v in r.data.metrics.items() if k.startswith(("eval/", "val/"))}
            for r in runs if any(k.startswith(("eval/", "val/")) for k in r.data.metrics)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["gspo", "hacpo"])
    parser.add_argument("--pairs", nargs="+", default=["size"])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--baseline", metavar="REV", help="git revision to compare against")
    args, overrides = parser.parse_known_args(argv)
    overrides = [o for o in overrides if o != "--"]
    with tempfile.TemporaryDirectory(prefix="hacrl-bench-sweep-") as tmp:
        ways: dict[str, tuple[Path, list[str]]]
        if args.baseline:
            from revision import export_revision  # scripts/revision.py (this script's folder)

            ways = {"old": (export_revision(args.baseline, Path(tmp) / "old-src"), []),
                    "new": (TREE, [])}
        else:
            ways = {"cold": (TREE, ["hydra.sweeper.warm=false"]),
                    "warm": (TREE, ["hydra.sweeper.warm=true"])}
        return compare(ways, args, overrides, Path(tmp))


def write_sweep(tmp: Path, pairs: list[str], methods: list[str], grid: str = "") -> Path:
    """The folder (for hydra.searchpath) holding sweep/bench.yaml: one grid of `pairs` x
    `methods`, plus `grid` (more YAML lines of that grid, indented 8)."""
    configs = tmp / "configs"
    (configs / "sweep").mkdir(parents=True)
    (configs / "sweep" / "bench.yaml").write_text(SWEEP.format(
        pairs=json.dumps(pairs), methods=json.dumps(methods)) + grid)
    return configs


def alternate(ways: dict[str, tuple[Path, list[str]]], repeats: int, configs: Path, tmp: Path,
              overrides: list[str]) -> Iterator[tuple[str, Path, float]]:
    """Each way's sweep `repeats` times, the order turned around every repeat so the machine's
    noise hits both alike: (way, its output root, wall seconds) after each sweep."""
    for repeat in range(repeats):
        order = list(ways) if repeat % 2 == 0 else list(reversed(ways))
        for way in order:
            root = tmp / f"{way}-{repeat}"
            tree, own = ways[way]
            wall = run_sweep(configs, root, way, tree, [*own, *overrides])
            print(f"repeat {repeat} {way}: {wall:.1f} s", flush=True)
            yield way, root, wall


def compare(ways: dict[str, tuple[Path, list[str]]], args: argparse.Namespace,
            overrides: list[str], tmp: Path) -> int:
    """Run the ways in turn, `args.repeats` times, and print the comparison."""
    walls: dict[str, list[float]] = {w: [] for w in ways}
    rows: dict[str, list[dict]] = {w: [] for w in ways}
    scores: dict[str, list[dict]] = {w: [] for w in ways}
    configs = write_sweep(tmp, args.pairs, args.methods)
    for way, root, wall in alternate(ways, args.repeats, configs, tmp, overrides):
        walls[way].append(wall)
        rows[way].extend(cell_rows(root))
        scores[way].append(final_scores(root))
    first, second = ways
    cells = len(rows[first]) // args.repeats
    print(f"\n{cells} cells ({' '.join(args.methods)} x {' '.join(args.pairs)}"
          f"{' ' + ' '.join(overrides) if overrides else ''}), {args.repeats} repeat(s), "
          f"{os.cpu_count()} cores")
    before, after = statistics.median(walls[first]), statistics.median(walls[second])
    print(f"sweep wall (median): {first} {before:.1f} s, {second} {after:.1f} s, "
          f"ratio {first}/{second} {before / after:.2f}")
    print(f"\nper cell, median seconds: {'way':<6}" + "".join(f"{p[:-2]:>11}" for p in PHASES)
          + f"{'outside':>9}{'wall':>8}")
    for way in ways:
        medians = [statistics.median(float(r.get(p) or 0.0) for r in rows[way]) for p in PHASES]
        outside = statistics.median(float(r["wall_s"]) - sum(float(r.get(p) or 0.0)
                                                            for p in PHASES) for r in rows[way])
        wall = statistics.median(float(r["wall_s"]) for r in rows[way])
        print(f"{'':<26}{way:<6}" + "".join(f"{m:>11.2f}" for m in medians)
              + f"{outside:>9.2f}{wall:>8.2f}")
    return _compare_scores(scores[first], scores[second], first, second, exact=not args.baseline)


def _compare_scores(a: list[dict], b: list[dict], first: str, second: str, exact: bool) -> int:
    """Cold and warm run the same job: their scores must agree bit for bit, and there must be
    scores to compare (exit code 1 otherwise, after a FAIL line). Another revision may round
    differently: how many scores moved and by how much (exit code 0)."""
    pairs = [(x.get(key, {}).get(name), y.get(key, {}).get(name))
             for x, y in zip(a, b, strict=True) for key in sorted(x.keys() | y.keys())
             for name in sorted(x.get(key, {}).keys() | y.get(key, {}).keys())]
    moved = [(u, v) for u, v in pairs if u != v]
    if not pairs:
        print(f"\nbench_sweep: {'FAIL: ' if exact else ''}no final scores to compare, {first} vs "
              f"{second}")
        return 1 if exact else 0
    if not moved:
        print(f"\nfinal scores of every cell identical, {first} vs {second}: yes "
              f"({len(pairs)} scores)")
        return 0
    largest = max(abs(u - v) if u is not None and v is not None else float("inf")
                  for u, v in moved)
    print(f"\nfinal scores, {first} vs {second}: {len(moved)} of {len(pairs)} differ, "
          f"largest difference {largest:.4f}")
    if exact:
        print(f"bench_sweep: FAIL: the {first} and {second} sweeps ran the same jobs, yet "
              f"{len(moved)} of {len(pairs)} final scores differ")
        return 1
    return 0

if __name__ == "__main__":
    sys.exit(main())
