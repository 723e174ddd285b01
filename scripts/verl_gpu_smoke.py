"""GPU smoke check of engine=verl: two HACPO steps of two small local models, then asserts.

Needs one node with >= 1 CUDA GPU, `pip install -e '.[verl,vllm]'` (a CUDA torch first), and
two local Hugging Face checkpoints, e.g. Qwen3-0.6B and Llama-3.2-1B-Instruct:

    python scripts/verl_gpu_smoke.py --models /models/Qwen3-0.6B /models/Llama-3.2-1B-Instruct \
        --gpus 1 --output /tmp/verl-smoke

It runs `hacrl train` (scale=paper engine=verl method=hacpo) on the embedded arithmetic task
(no data download), 2 steps, small batches and short responses, no end-of-training evaluation,
checkpointing at step 2 through verl; then it reads the MLflow store and checks that both agents'
runs hold the loop's metrics (reward, capability, omega, HACPO's losses and clip bounds) and
verl's own (`verl/actor/...`) at step 2, and that a verl checkpoint with a Hugging Face copy
was written. Exit code 0 means all of that held; otherwise the exit code is 1 and the last
line ("verl smoke: FAIL: ...") names what failed.

`--device cpu` runs the same command with `engine.device=cpu` (verl's FSDP2 workers on CPU,
HF rollouts): the code path is the GPU one up to the device layer, so the script itself is
checked on any machine (e.g. on the tiny zoo's models).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

MUST = ("reward/mean", "capability/P", "loss/policy", "loss/borrowed", "clip/lower_bound",
        "grad_norm", "time/generate_s", "time/update_s", "train/updates")


def overrides(models: list[Path], gpus: int, output: Path, device: str = "cuda") -> list[str]:
    names = ["smoke-a", "smoke-b"]
    out = ["scale=paper", "engine=verl", "method=hacpo", "task=arith", f"output_root={output}",
           f"agents=[{','.join(names)}]", "train.steps=2", "train.prompts_per_step=8",
           "train.minibatch_prompts=4", "train.rollouts_per_prompt=4", "train.save_every=2",
           "train.micro_batch_rows=4", "rollout.max_new_tokens=256", "validation.every=0",
           "eval.at_end=false", f"engine.gpus_per_node={gpus}",
           "engine.rollout.gpu_memory_utilization=0.3", "engine.actor.max_token_len_per_gpu=4096",
           "tracking.experiment=verl-smoke", f"engine.device={device}"]
    if device == "cpu":  # the same job on CPU workers (the device layer of engine=verl)
        out += ["engine.dtype=float32", f"engine.cpu_workers={gpus}", "rollout.max_new_tokens=32"]
    for name, path in zip(names, models, strict=True):
        family = "llama" if "llama" in path.name.lower() else "qwen3"
        out.append(f"+models.{name}={{family: {family}, paper: '{path.resolve()}', tiny: null}}")
    return out


def check(output: Path) -> list[str]:
    """What is wrong with the runs in <output>/mlflow.db (empty: nothing)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{output / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("verl-smoke")
    if experiment is None:
        return ["no MLflow experiment verl-smoke"]
    runs = client.search_runs([experiment.experiment_id], "tags.`hacrl.kind` = 'agent'")
    problems = [] if len(runs) == 2 else [f"{len(runs)} agent runs, expected 2"]
    for run in runs:
        name = run.data.tags.get("model", run.info.run_id)
        metrics = run.data.metrics
        missing = [m for m in MUST if m not in metrics]
        if missing:
            problems.append(f"{name}: missing {', '.join(missing)}")
        if not any(k.startswith("verl/actor/") for k in metrics):
            problems.append(f"{name}: no verl/actor/* metrics")
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")]
        if sorted(steps) != [1, 2]:
            problems.append(f"{name}: reward/mean at steps {steps}, expected [1, 2]")
        if run.info.status != "FINISHED":
            problems.append(f"{name}: run status {run.info.status}")
    saved = list(output.glob("runs/*/team-0/ckpt/step_000002/*/verl"))
    if len(saved) != 2:
        problems.append(f"verl checkpoints of step 2: {len(saved)}, expected 2")
    hf = list(output.glob("runs/*/team-0/ckpt/step_000002/*/model/config.json"))
    if len(hf) != 2:
        problems.append(f"Hugging Face copies of step 2: {len(hf)}, expected 2")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs=2, type=Path, required=True, metavar="DIR")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs (CPU: worker processes)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the same job and checks through engine.device=cpu")
    parser.add_argument("--output", type=Path, default=Path("outputs/verl-smoke"))
    parser.add_argument("--check-only", action="store_true", help="only check an earlier run")
    args = parser.parse_args(argv)
    for path in args.models:
        if not (path / "config.json").is_file():
            parser.error(f"--models: {path} has no config.json (a local HF checkpoint is needed)")
    if not args.check_only:
        command = [sys.executable, "-m", "hacrl.cli", "train",
                   *overrides(args.models, args.gpus, args.output, args.device)]
        print("$", " ".join(command), flush=True)
        code = subprocess.run(command).returncode
        if code != 0:
            print(f"verl smoke: FAIL: training failed (exit {code}, see above)")
            return 1
    problems = check(args.output)
    if problems:
        print(f"verl smoke: FAIL: {len(problems)} problem(s): {'; '.join(problems)}")
        return 1
    print("verl smoke: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
