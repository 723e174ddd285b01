"""The harness's own overhead per job (compose, launch, track) next to the job's training time.

    python scripts/bench_sweep_overhead.py [--method gspo] [--agent qwen3-4b-base] [overrides]

Runs one tiny cell twice, side by side: as a plain `hacrl train` process and as a one-cell
`hacrl sweep` (submitit local launcher, like every sweep cell). For each it prints the wall time,
the training loop, the end-of-job evaluation and the MLflow time measured inside the job; the
harness overhead is everything else (process start and imports, compose and validation, launch,
tracking; the MLflow share is shown on its own). Figures only, no assertion.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWEEP = """# @package _global_
defaults:
  - override /hydra/sweeper: hacrl
  - override /launcher: local
hydra:
  sweep:
    dir: ${{output_root}}/sweeps/overhead
    subdir: .jobs/${{hydra.job.num}}
  sweeper:
    name: overhead
    grids:
      - pair: size
        method: {method}
        agents: ["[{agent}]"]
"""


def _run(args: list[str]) -> float:
    tic = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "hacrl.cli", *args], capture_output=True, text=True)
    wall = time.perf_counter() - tic
    if out.returncode != 0:
        print(out.stdout[-3000:] + out.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"hacrl {args[0]} failed ({out.returncode})")
    return wall


def _job_figures(root: Path) -> dict[str, float]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    ids = [e.experiment_id for e in client.search_experiments()]
    (job,) = client.search_runs(ids, "tags.`hacrl.kind` = 'job'")
    m = job.data.metrics
    return {"train_s": m["time/train_s"], "eval_s": m["time/eval_s"],
            "tracking_s": m["time/tracking_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--method", default="gspo")
    parser.add_argument("--agent", default="qwen3-4b-base")
    args, overrides = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="hacrl-overhead-") as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "cfg" / "sweep").mkdir(parents=True)
        (tmp_path / "cfg" / "sweep" / "overhead.yaml").write_text(
            SWEEP.format(method=args.method, agent=args.agent))
        rows = []
        # plain job
        plain = tmp_path / "plain"
        wall = _run(["train", "pair=size", f"method={args.method}", f"agents=[{args.agent}]",
                     f"output_root={plain}", *overrides])
        rows.append(("hacrl train", wall, _job_figures(plain), None))
        # the same cell through a sweep
        swept = tmp_path / "sweep"
        wall = _run(["sweep", "overhead", f"hydra.searchpath=[file://{tmp_path / 'cfg'}]",
                     f"output_root={swept}", *overrides])
        status = json.loads((swept / "sweeps" / "overhead" / "status.json").read_text())
        (row,) = status["rows"]
        state = json.loads(next((swept / "sweeps" / "overhead" / "cells").glob("*.json"))
                           .read_text())
        rows.append(("hacrl sweep (cell)", float(row["wall_s"]), _job_figures(swept), state))
        sweep_wall = wall

    print(f"{'path':<20} {'wall s':>7} {'train s':>8} {'eval s':>7} {'mlflow s':>9} "
          f"{'overhead s':>11} {'overhead %':>11}")
    for name, wall, figures, _state in rows:
        tracking = figures["tracking_s"]
        overhead = wall - figures["train_s"] - figures["eval_s"]
        print(f"{name:<20} {wall:>7.1f} {figures['train_s']:>8.1f} {figures['eval_s']:>7.1f} "
              f"{tracking:>9.2f} {overhead:>11.1f} {100 * overhead / wall:>10.1f}%")
    print(f"whole `hacrl sweep` process (expansion, store, launch, table): {sweep_wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
