"""How long `hacrl report paper` takes on a store of ~1,000 runs (target: under 30 s here).

    python scripts/bench_report.py [--runs 1000] [--root DIR]

Builds a synthetic but realistic sqlite MLflow store: the real cells of the `paper` sweep (its
manifest, as `hacrl sweep` writes it), each with a finished job run and agent runs carrying both
protocols' evaluation metrics and 30-step curves, earlier killed attempts, base-model
evaluations, and runs of another scale, up to `--runs` runs. Then times `hacrl report paper`
in a fresh process (imports included) and prints the figures. No assertion.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS = 30
CURVES = ("reward/mean", "capability/P", "ratio/s_homo_mean", "ratio/s_hete_mean",
          "ratio/s_hete_min", "ratio/s_hete_max", "response/length_mean")


def _build(root: Path, target: int, seed: int = 0) -> int:
    from hacrl.config import compose
    from hacrl.config.protocol import Protocol  # noqa: F401  (cells need it when expanding)
    from hacrl.schema.sweep_manifest import SweepManifest, write_manifest
    from hacrl.sweep.grid import expand
    from hacrl.tracking import Tracker

    rng = random.Random(seed)
    overrides = [f"output_root={root}"]
    cells = expand("paper", lambda extra: compose([*overrides, *extra])).cells
    uri = f"sqlite:///{root / 'mlflow.db'}"
    write_manifest(root / "sweeps" / "paper", SweepManifest(
        "paper", list(cells), arguments=overrides, asked=len(cells), tracking_uri=uri))
    tracker = Tracker(uri, "hacrl")
    benches = ["tiny_math500", "tiny_math", "tiny_gsm8k", "tiny_aime2025", "tiny_amc23",
               "tiny_minerva", "tiny_olympiad"]
    made = 0

    def agent_run(cell, agent: str, status: str, job: str | None, scale: str = "tiny") -> None:
        nonlocal made
        kind = "agent" if cell.trains else "eval"
        tags = {"hacrl.kind": kind, "config_hash": cell.id, "method": cell.method,
                "model": agent, "scale": scale, "seed": str(cell.seed),
                "hacrl.model_path": cell.model_paths.get(agent, "")}
        if job:
            tags["mlflow.parentRunId"] = job
        run = tracker.start_run(agent, tags, {"algo.alpha": str(cell.params.get("algo.alpha"))})
        level = rng.uniform(0.1, 0.6)
        from mlflow.entities import Metric

        points = [Metric(key, rng.uniform(0.0, 1.0), 0, step)
                  for key in (*CURVES, "val/tiny_math500/acc") for step in range(1, STEPS + 1)
                  if cell.trains and (not key.startswith("val/") or step % 5 == 0)]
        for start in range(0, len(points), 1000):
            tracker.client.log_batch(run, metrics=points[start:start + 1000])
        if status == "FINISHED":
            tracker.log_metrics(run, {f"eval/{p}/{b}/{m}": min(1.0, level + rng.uniform(0, 0.2))
                                      for p in ("main", "ablation") for b in benches
                                      for m in ("acc", "exact_match", "pass_at_k")}, STEPS)
        tracker.finish(run, status)
        made += 1

    def job_run(cell, status: str, scale: str = "tiny") -> str:
        nonlocal made
        run = tracker.start_run(cell.method, {"hacrl.kind": "job", "config_hash": cell.id,
                                              "method": cell.method, "scale": scale})
        tracker.log_metrics(run, {"time/wall_s": rng.uniform(10, 60),
                                  "memory/peak_rss_gb": rng.uniform(0.7, 0.9)}, STEPS)
        tracker.finish(run, status)
        made += 1
        return run

    attempt = 0
    while made < target:
        status = "FINISHED" if attempt == 0 else rng.choice(["KILLED", "FAILED"])
        scale = "tiny" if attempt < 3 else "paper"  # later rounds: another scale's runs
        for cell in cells:
            if made >= target:
                break
            job = job_run(cell, status, scale) if cell.trains else None
            for agent in cell.agents:
                agent_run(cell, agent, status, job, scale)
        attempt += 1
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--root", type=Path, default=None, help="keep the store here")
    args = parser.parse_args(argv)
    root = args.root or Path(tempfile.mkdtemp(prefix="hacrl-bench-report-"))
    tic = time.perf_counter()
    made = _build(root, args.runs) if not (root / "mlflow.db").exists() else -1
    print(f"store: {root / 'mlflow.db'}: {made if made >= 0 else 'existing'} runs "
          f"({time.perf_counter() - tic:.0f} s to build)")
    tic = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "hacrl.cli", "report", "paper",
                          f"output_root={root}"], capture_output=True, text=True)
    wall = time.perf_counter() - tic
    print(out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:])
    if out.returncode != 0:
        print(out.stderr[-3000:], file=sys.stderr)
        return 1
    folder = root / "reports" / "paper-tiny"
    files = sum(1 for _ in folder.rglob("*") if _.is_file())
    print(json.dumps({"runs_in_store": made, "report_wall_s": round(wall, 1),
                      "files_written": files, "target_s": 30}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
