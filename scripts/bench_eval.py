"""Wall time to evaluate one tiny model on all seven tiny benchmarks through lm-eval.

    python scripts/bench_eval.py [--models qwen3-4b-base llama3.2-3b-instruct] [--repeats 2]

Each repeat is a fresh `hacrl eval --model <name> --force` process (what a user runs: imports,
model load, generation, grading, MLflow logging) into a temporary output root; the script prints
the process wall time and lm-eval's own share (`time/eval_main_s`) per model and repeat.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["qwen3-4b-base"])
    parser.add_argument("--repeats", type=int, default=2)
    args, overrides = parser.parse_known_args(argv)
    from mlflow.tracking import MlflowClient

    print(f"{'model':<24} {'repeat':>6} {'wall s':>8} {'lm-eval s':>10} {'avg acc':>8}")
    walls: list[float] = []
    with tempfile.TemporaryDirectory(prefix="hacrl-bench-eval-") as tmp:
        for model in args.models:
            for repeat in range(args.repeats):
                root = Path(tmp) / f"{model}-{repeat}"
                started = time.perf_counter()
                out = subprocess.run([sys.executable, "-m", "hacrl.cli", "eval", "--model", model,
                                      "--force", f"output_root={root}", *overrides],
                                     capture_output=True, text=True)
                wall = time.perf_counter() - started
                if out.returncode != 0:
                    print(out.stdout + out.stderr, file=sys.stderr)
                    return out.returncode
                client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
                run = client.search_runs([e.experiment_id for e in client.search_experiments()])[0]
                metrics = run.data.metrics
                print(f"{model:<24} {repeat:>6} {wall:>8.1f} {metrics['time/eval_main_s']:>10.1f} "
                      f"{metrics['eval/main/avg/acc']:>8.3f}")
                walls.append(wall)
    print(f"median wall time per model evaluation: {statistics.median(walls):.1f} s "
          f"({len(walls)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
