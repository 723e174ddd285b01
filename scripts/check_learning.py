"""Does RL learn at this scale? Base vs trained held-out greedy accuracy, mean over seeds.

    python scripts/check_learning.py --pairs size model --methods gspo hacpo --seeds 0 1 2

Runs `hacrl train` for every (pair, method, seed) plus an evaluation-only base job per pair
(train.steps=0), `--jobs` at a time, each into its own output root, then prints per agent the
base accuracy, each method's mean over seeds, and the gain in points. Extra arguments after
`--` are Hydra overrides for every job.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def run(root: Path, overrides: list[str]) -> dict[str, dict[str, float]]:
    """Final evaluation per agent of one job (from its DONE.json files)."""
    log = root / "job.log"
    root.mkdir(parents=True, exist_ok=True)
    with log.open("w") as handle:
        code = subprocess.call([sys.executable, "-m", "hacrl.cli", "train",
                                f"output_root={root}", *overrides], stdout=handle, stderr=handle)
    if code != 0:
        raise RuntimeError(f"job failed ({code}), see {log}")
    final: dict[str, dict[str, float]] = {}
    for done in root.glob("runs/*/team-*/DONE.json"):
        final.update(json.loads(done.read_text())["final"])
    return final


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", nargs="+", default=["size"])
    parser.add_argument("--methods", nargs="+", default=["gspo", "hacpo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--metric", default="eval/main/avg/acc")
    parser.add_argument("--out", default="outputs/check_learning")
    parser.add_argument("--jobs", type=int, default=2)
    args, extra = parser.parse_known_args()
    extra = [e for e in extra if e != "--"]
    out = Path(args.out).resolve()

    cells = [(pair, "base", 0) for pair in args.pairs]
    cells += [(p, m, s) for p in args.pairs for m in args.methods for s in args.seeds]

    def job(cell: tuple[str, str, int]) -> dict[str, dict[str, float]]:
        pair, method, seed = cell
        overrides = [f"pair={pair}", f"seed={seed}", *extra]
        overrides += (["method=gspo", "train.steps=0"] if method == "base" else [f"method={method}"])
        return run(out / f"{pair}-{method}-s{seed}", overrides)

    with ThreadPoolExecutor(args.jobs) as pool:
        results = dict(zip(cells, pool.map(job, cells), strict=True))

    failed = False
    for pair in args.pairs:
        base = results[(pair, "base", 0)]
        print(f"\npair={pair} ({args.metric}, greedy, held-out; mean over seeds {args.seeds})")
        print(f"{'agent':<24}{'base':>8}" + "".join(f"{m:>16}" for m in args.methods))
        for agent, accs in base.items():
            row = f"{agent:<24}{accs[args.metric]:>8.3f}"
            for method in args.methods:
                values = [results[(pair, method, s)][agent][args.metric] for s in args.seeds]
                gain = 100 * (statistics.mean(values) - accs[args.metric])
                failed |= gain < 5.0
                row += f"{statistics.mean(values):>8.3f} ({gain:+4.1f})"
            print(row)
    print("\nevery agent gains >= 5 points" if not failed else "\nsome agent gains < 5 points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
