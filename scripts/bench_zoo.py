"""Wall and CPU time of `hacrl zoo build`, the old code against this checkout, in one run.

    python scripts/bench_zoo.py [qwen3-4b qwen3-4b-instruct ...] [--old-rev REV] [--workers 2]

Each side builds the zoo (or the named models) from scratch into its own temporary directory
in a fresh process, one side after the other (they would compete for the cores if run
together). The old side is the ``hacrl`` package of ``--old-rev`` (default: the commit before
the zoo speed-ups), extracted with ``git archive``. The script prints per-model card seconds
and SFT steps side by side, whether the weights are byte-identical (sha256), and for each side
the wall time, the CPU time of all its processes, and how busy the workers were (summed run
seconds over workers x wall). On a shared machine compare the ratios, not the seconds.
The weights must be identical: exit 1 after a "bench_zoo: FAIL" line naming the models whose
weights differ, 0 when none does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from revision import export_revision  # scripts/revision.py (this script's folder)

REPO = Path(__file__).resolve().parents[1]
# The last commit before the zoo speed-ups: its builds are the v1 zoo as first published.
OLD_REV = "efee3c5ce609ad576ed3369901cd60f5c60e4d3c"


def _child(root: str, names: list[str], workers: int) -> None:
    """Build in this process (the source tree comes from PYTHONPATH); print cards and runs."""
    from hacrl.zoo import build_zoo

    cards = build_zoo(root=root, names=names or None, workers=workers, force=True)
    try:  # the shared SFT runs exist in the new code only
        from hacrl.zoo.schedule import group_runs

        runs = group_runs(list(cards))
    except ImportError:
        runs = [[name] for name in cards]
    print("BENCH-RESULT " + json.dumps({"cards": cards, "runs": runs}))


def _build(tree: Path, root: Path, names: list[str], workers: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, __file__, "--child", str(root), "--workers", str(workers), *names]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = next(x for x in out.splitlines() if x.startswith("BENCH-RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("BENCH-RESULT "))
    result["wall"] = wall
    result["cpu"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result["sha256"] = {
        name: hashlib.sha256((root / name / "model.safetensors").read_bytes()).hexdigest()
        for name in result["cards"]
    }
    return result


def _busy(result: dict[str, Any], workers: int) -> float:
    """Share of worker time spent in SFT runs (a shared run counts once: its last card)."""
    cards = result["cards"]
    run_seconds = sum(max(cards[n]["seconds"] for n in run) for run in result["runs"])
    return run_seconds / (min(workers, len(result["runs"])) * result["wall"])


def _report(old: dict[str, Any], new: dict[str, Any], workers: int) -> bool:
    print(f"{'model':<22} {'old s':>7} {'new s':>7} {'old steps':>9} {'new steps':>9}  weights")
    differ: list[str] = []
    for name, card in new["cards"].items():
        was = old["cards"][name]
        equal = old["sha256"][name] == new["sha256"][name]
        if not equal:
            differ.append(name)
        print(f"{name:<22} {was['seconds']:>7.1f} {card['seconds']:>7.1f} "
              f"{was['sft_steps']:>9} {card['sft_steps']:>9}  "
              f"{'identical' if equal else 'DIFFERENT'}")
    for key, label in (("wall", "wall s"), ("cpu", "CPU s (all processes)")):
        print(f"{label:<22} {old[key]:>7.1f} {new[key]:>7.1f}   new/old {new[key] / old[key]:.2f}")
    print(f"{'workers busy':<22} {_busy(old, workers):>7.0%} {_busy(new, workers):>7.0%}")
    if differ:
        print(f"bench_zoo: FAIL: the old and new weights differ for {', '.join(differ)}")
        return False
    print("weights: all byte-identical")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help="zoo models (default: all)")
    parser.add_argument("--old-rev", default=OLD_REV)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--new-first", action="store_true", help="build the new side first")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        _child(args.child, args.names, args.workers)
        return 0
    with tempfile.TemporaryDirectory(prefix="hacrl-bench-zoo-") as tmp:
        trees = {"old": export_revision(args.old_rev, Path(tmp) / "old-src", "hacrl"), "new": REPO}
        results: dict[str, dict[str, Any]] = {}
        for side in (("new", "old") if args.new_first else ("old", "new")):
            print(f"building the {side} side ...", file=sys.stderr, flush=True)
            results[side] = _build(trees[side], Path(tmp) / side, args.names, args.workers)
        same = _report(results["old"], results["new"], args.workers)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
