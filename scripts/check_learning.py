"""Does RL learn at this scale? Base vs trained held-out greedy accuracy, mean over seeds.

    python scripts/check_learning.py --pairs size model --methods gspo hacpo --seeds 0 1 2

Runs `hacrl train` for every (pair, method, seed) plus an evaluation-only base job per pair
(train.steps=0), `--jobs` at a time, each into its own output root, then prints per agent the
base accuracy, each method's mean over seeds, and the gain in points. Extra arguments after
`--` are Hydra overrides for every job.

The check: every agent of every pair gains at least `--min-gain` points (default 5) with every
method. Exit 0 when it holds; otherwise the last line says which agents and methods fell short
(or which job failed, or that a job reported no agent or no `--metric`) and the exit code is 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

Cell = tuple[str, str, int]  # (pair, method or "base", seed)
Final = dict[str, dict[str, float]]  # agent -> its final metrics


class JobFailed(RuntimeError):
    pass


def run(root: Path, overrides: list[str]) -> Final:
    """Final evaluation per agent of one job (from its DONE.json files)."""
    log = root / "job.log"
    root.mkdir(parents=True, exist_ok=True)
    with log.open("w") as handle:
        code = subprocess.call([sys.executable, "-m", "hacrl.cli", "train",
                                f"output_root={root}", *overrides], stdout=handle, stderr=handle)
    if code != 0:
        raise JobFailed(f"job {root.name} failed (exit {code}), see {log}")
    final: Final = {}
    for done in root.glob("runs/*/team-*/DONE.json"):
        final.update(json.loads(done.read_text())["final"])
    return final


def verdict(results: Mapping[Cell, Final], pairs: list[str], methods: list[str],
            seeds: list[int], metric: str, min_gain: float) -> tuple[list[str], list[str]]:
    """(the table's lines, what fails the check). It fails for each agent and method whose
    mean `metric` over `seeds` gains less than `min_gain` points over the agent's base, for an
    agent a job did not report or without `metric`, and for a pair whose base job reported no
    agent (nothing would be checked)."""
    lines: list[str] = []
    failures: list[str] = []
    for pair in pairs:
        base = results[(pair, "base", 0)]
        lines.append(f"\npair={pair} ({metric}, greedy, held-out; mean over seeds {seeds})")
        lines.append(f"{'agent':<24}{'base':>8}" + "".join(f"{m:>16}" for m in methods))
        if not base:
            failures.append(f"pair={pair}: the base job reported no agent")
        for agent, accs in base.items():
            if metric not in accs:
                failures.append(f"pair={pair} {agent}: the base job logged no {metric}")
                continue
            row = f"{agent:<24}{accs[metric]:>8.3f}"
            for method in methods:
                values = [results[(pair, method, s)].get(agent, {}).get(metric) for s in seeds]
                if any(v is None for v in values):
                    failures.append(f"pair={pair} {agent} {method}: no {metric} in some seed")
                    row += f"{'-':>16}"
                    continue
                mean = statistics.mean(float(v) for v in values if v is not None)
                gain = 100 * (mean - accs[metric])
                if not gain >= min_gain:  # a NaN gain fails too
                    failures.append(f"pair={pair} {agent} {method} {gain:+.1f}")
                row += f"{mean:>8.3f} ({gain:+4.1f})"
            lines.append(row)
    return lines, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", nargs="+", default=["size"])
    parser.add_argument("--methods", nargs="+", default=["gspo", "hacpo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--metric", default="eval/main/avg/acc")
    parser.add_argument("--out", default="outputs/check_learning")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--min-gain", type=float, default=5.0,
                        help="points every agent must gain with every method (default 5)")
    args, extra = parser.parse_known_args(argv)
    extra = [e for e in extra if e != "--"]
    out = Path(args.out).resolve()

    cells: list[Cell] = [(pair, "base", 0) for pair in args.pairs]
    cells += [(p, m, s) for p in args.pairs for m in args.methods for s in args.seeds]

    def job(cell: Cell) -> Final:
        pair, method, seed = cell
        overrides = [f"pair={pair}", f"seed={seed}", *extra]
        overrides += (["method=gspo", "train.steps=0"] if method == "base" else [f"method={method}"])
        return run(out / f"{pair}-{method}-s{seed}", overrides)

    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            results = dict(zip(cells, pool.map(job, cells), strict=True))
    except JobFailed as err:
        print(f"check_learning: FAIL: {err}")
        return 1

    lines, failures = verdict(results, args.pairs, args.methods, args.seeds, args.metric,
                              args.min_gain)
    print("\n".join(lines))
    if failures:
        print(f"\ncheck_learning: FAIL: {len(failures)} agent/method result(s) short of "
              f"+{args.min_gain:g} points: {'; '.join(failures)}")
        return 1
    print(f"\ncheck_learning: ok: every agent gains >= {args.min_gain:g} points with every "
          "method")
    return 0


if __name__ == "__main__":
    sys.exit(main())
