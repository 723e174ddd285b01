"""The harness's own overhead per job (compose, launch, track) next to the job's own work.

    python scripts/bench_sweep_overhead.py [--method gspo] [--agent qwen3-4b-base] [--repeats 2]

Runs one tiny cell three ways, side by side, `--repeats` times each (alternating):
  bare         the same job code (models, training loop, validation, checkpoints, lm-eval
               evaluation) from an already composed config, with no Hydra, no MLflow and no
               submitit: what the job costs without the harness;
  hacrl train  the plain command (Hydra compose, MLflow tracking);
  sweep cell   the same cell as a one-cell `hacrl sweep` (a warm cell forked from the sweep's
               forkserver, like every local sweep cell); its wall time is dispatch -> result,
               as the sweep sees it.
Every path logs its phase times (setup, validation, training, evaluation) from inside the job;
`rest` is wall minus those phases: process start, imports, compose, launch, tracking, exit.
The harness overhead of a path is its `rest` minus the bare job's `rest` (measured phases are
subtracted run by run, so the training loop's own noise does not enter the difference). The
store is created before the jobs, as `hacrl sweep` does. Figures only, no assertion.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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
PHASES = ("setup_s", "validation_s", "train_s", "eval_s")


class _NoTracking:
    """The bare job's tracker: every call does nothing."""

    busy_s = 0.0

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def bare_job(config: Path) -> None:
    """Child process of the bare path: the job's own work, nothing of the harness."""
    from omegaconf import OmegaConf
    from tqdm import tqdm

    from hacrl.config import validate
    from hacrl.job import job_dir, process_age_s
    from hacrl.job.assembly import _run_team

    startup_s = process_age_s()
    spec = validate(OmegaConf.load(config))  # type: ignore[arg-type]
    if spec.cfg.engine.get("threads"):  # as run_job does
        import torch

        torch.set_num_threads(int(spec.cfg.engine.threads))
    layout = job_dir(spec)
    totals = dict.fromkeys(PHASES, 0.0)
    for i, team in enumerate(spec.teams):
        with tqdm(disable=True) as bar:
            result = _run_team(spec, team, layout.team(i),
                               _NoTracking(),  # type: ignore[arg-type]
                               {a.name: "-" for a in spec.agents}, None, bar)
        for phase in PHASES:
            totals[phase] += float(result[phase])
    (config.parent / "phases.json").write_text(json.dumps({**totals, "startup_s": startup_s}))


def _run(args: list[str]) -> float:
    tic = time.perf_counter()
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True)
    wall = time.perf_counter() - tic
    if out.returncode != 0:
        print(out.stdout[-3000:] + out.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{' '.join(args[:3])} failed ({out.returncode})")
    return wall


def _job_phases(root: Path) -> dict[str, float]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    ids = [e.experiment_id for e in client.search_experiments()]
    (job,) = client.search_runs(ids, "tags.`hacrl.kind` = 'job'")
    m = job.data.metrics
    return {**{p: m[f"time/{p}"] for p in PHASES}, "tracking_s": m["time/tracking_s"],
            "startup_s": m["time/startup_s"]}


def _store(root: Path, experiment: str) -> None:
    from hacrl.tracking import Tracker

    Tracker(f"sqlite:///{root / 'mlflow.db'}", experiment)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--method", default="gspo")
    parser.add_argument("--agent", default="qwen3-4b-base")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--bare", type=Path, help=argparse.SUPPRESS)  # the bare child
    args, overrides = parser.parse_known_args(argv)
    if args.bare:
        bare_job(args.bare)
        return 0
    from omegaconf import OmegaConf

    from hacrl.config import compose

    cell = ["pair=size", f"method={args.method}", f"agents=[{args.agent}]", *overrides]
    rows: list[tuple[str, float, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="hacrl-overhead-") as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "cfg" / "sweep").mkdir(parents=True)
        (tmp_path / "cfg" / "sweep" / "overhead.yaml").write_text(
            SWEEP.format(method=args.method, agent=args.agent))
        for repeat in range(args.repeats):
            # bare: compose here, the child only loads the resolved config
            bare = tmp_path / f"bare{repeat}"
            bare.mkdir()
            cfg = compose([*cell, f"output_root={bare}"])
            (bare / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
            wall = _run([__file__, "--bare", str(bare / "config.yaml")])
            phases = json.loads((bare / "phases.json").read_text())
            rows.append(("bare", wall, {**phases, "tracking_s": 0.0}))
            # plain `hacrl train`
            plain = tmp_path / f"plain{repeat}"
            _store(plain, str(cfg.tracking.experiment))
            wall = _run(["-m", "hacrl.cli", "train", *cell, f"output_root={plain}"])
            rows.append(("hacrl train", wall, _job_phases(plain)))
            # the same cell through a sweep (the sweep creates the store itself)
            swept = tmp_path / f"sweep{repeat}"
            _run(["-m", "hacrl.cli", "sweep", "overhead", *overrides,
                  f"hydra.searchpath=[file://{tmp_path / 'cfg'}]", f"output_root={swept}"])
            status = json.loads((swept / "sweeps" / "overhead" / "status.json").read_text())
            (row,) = status["rows"]
            rows.append(("sweep cell", float(row["wall_s"]), _job_phases(swept)))

    def rest(wall: float, phases: dict[str, float]) -> float:
        return wall - sum(phases[p] for p in PHASES)

    bare_rest = statistics.median(rest(w, ph) for name, w, ph in rows if name == "bare")
    print(f"{args.method} on {args.agent}, {args.repeats} repeat(s) per path; "
          "phases measured inside the job")
    print(f"{'path':<12} {'wall':>6} {'setup':>6} {'valid':>6} {'train':>6} {'eval':>6} "
          f"{'rest':>6} {'start':>6} {'mlflow':>7} {'overhead s':>11} {'% of wall':>10}")
    for name, wall, ph in rows:
        overhead = rest(wall, ph) - bare_rest
        print(f"{name:<12} {wall:>6.1f} {ph['setup_s']:>6.1f} {ph['validation_s']:>6.1f} "
              f"{ph['train_s']:>6.1f} {ph['eval_s']:>6.1f} {rest(wall, ph):>6.1f} "
              f"{ph.get('startup_s', 0.0):>6.1f} "
              f"{ph['tracking_s']:>7.2f} {overhead:>11.2f} {100 * overhead / wall:>9.1f}%")
    for name in ("hacrl train", "sweep cell"):
        mine = [(w, rest(w, ph) - bare_rest) for n, w, ph in rows if n == name]
        over = statistics.median(o for _, o in mine)
        wall = statistics.median(w for w, _ in mine)
        print(f"median harness overhead, {name}: {over:.2f} s = {100 * over / wall:.1f}% of "
              f"the {wall:.1f} s job (bare job's own start/exit: {bare_rest:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
