"""Wall time to evaluate one tiny model on all seven tiny benchmarks through lm-eval.

    python scripts/bench_eval.py [--models qwen3-4b-base llama3.2-3b-instruct] [--repeats 2]
    python scripts/bench_eval.py --baseline HEAD~1 [--repeats 3]     # old code vs this tree
    python scripts/bench_eval.py --baseline-overrides eval.greedy_batch_size=64  # old setting
    python scripts/bench_eval.py --cell --baseline HEAD~1 --repeats 1  # whole training cells
    python scripts/bench_eval.py --warm 4 --baseline HEAD~1   # evaluations in a running process

Each repeat is a fresh `hacrl eval --model <name> --force` process (what a user runs: imports,
model load, generation, grading, MLflow logging) into a temporary output root; the script prints
the process wall time and lm-eval's own share (`time/eval_main_s`) per model and repeat.

With `--baseline REV` (the code of a git revision, exported into a temporary folder) and/or
`--baseline-overrides` (other settings), every repeat runs the baseline and this tree side by
side, in alternating order (a busy machine drifts), prints the median of each and the ratio
old/new, and compares the two sides' results: every logged score and every per-sample record
(responses and grades) must be the same (exit 1 after a "bench_eval: FAIL" line when they
are not). `--cell` times whole training cells (`hacrl train`; the models are the cell's pair)
and reads the job's `time/eval_s` and `time/validation_s`.
`--warm N` runs N evaluations in one process per side (as a training job evaluates, its
imports done): the first (`cold_s`) and the median of the others (`warm_s`), no MLflow.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from revision import export_revision  # scripts/revision.py (this script's folder)

TREE = Path(__file__).resolve().parents[1]


@dataclass
class Side:
    """One version under test: the code (a source tree) and its extra overrides."""

    name: str
    tree: Path
    overrides: list[str]
    runs: list[dict[str, float]] = field(default_factory=list)


def run_once(side: Side, model: str, root: Path, overrides: list[str], cell: bool
             ) -> tuple[float, Any]:
    """One `hacrl` process of `side`; its wall time and MLflow client."""
    from mlflow.tracking import MlflowClient

    env = {**os.environ, "PYTHONPATH": str(side.tree)}
    args = (["train", *overrides, *side.overrides, f"output_root={root}", "force=true"] if cell
            else ["eval", "--model", model, "--force", f"output_root={root}", *overrides,
                  *side.overrides])
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "hacrl.cli", *args], capture_output=True,
                         text=True, cwd=side.tree, env=env)
    wall = time.perf_counter() - started
    if out.returncode != 0:
        raise RuntimeError(f"{side.name}: hacrl {args[0]} failed:\n{out.stdout}{out.stderr}")
    return wall, MlflowClient(f"sqlite:///{root / 'mlflow.db'}")


# run by `--warm` in a process of the side's tree: N evaluations, their seconds, the last one's
# scores and per-sample records (the same calls as the evaluation runner's, without MLflow)
WARM_DRIVER = """
import json, sys, tempfile, time
from pathlib import Path
import torch
from hacrl.config import compose, model_path
from hacrl.config.protocol import Protocol
from hacrl.evaluation.lmeval import Backend, run_lm_eval
from hacrl.evaluation.runner import data_files
model, evals, *overrides = sys.argv[1:]
cfg = compose(overrides)
if cfg.engine.get("threads"):
    torch.set_num_threads(int(cfg.engine.threads))
benchmarks = [str(b) for b in cfg.eval.benchmarks]
files = data_files(cfg, benchmarks)
protocol = Protocol.in_use(cfg.eval)[0]
backend = Backend.from_config(cfg.eval, str(cfg.engine.get("device", "cpu")))
seconds = []
for _ in range(int(evals)):
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        out = run_lm_eval(model_path(cfg, 0, model), benchmarks, files, protocol, backend,
                          Path(tmp), seed=int(cfg.seed))
        seconds.append(time.perf_counter() - started)
print(json.dumps({"seconds": seconds, "scores": out.metrics, "samples": out.samples},
                 default=str))
"""


def warm_run(side: Side, model: str, evals: int, overrides: list[str]
             ) -> tuple[dict[str, float], dict[str, Any]]:
    """`evals` evaluations of `model` in one process of `side`: times, results."""
    env = {**os.environ, "PYTHONPATH": str(side.tree)}
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", WARM_DRIVER, model, str(evals), *overrides,
                          *side.overrides], capture_output=True, text=True, cwd=side.tree,
                         env=env)
    wall = time.perf_counter() - started
    if out.returncode != 0:
        raise RuntimeError(f"{side.name}: evaluations failed:\n{out.stdout}{out.stderr}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    seconds = got["seconds"]
    measured = {"wall_s": wall, "cold_s": seconds[0],
                "warm_s": statistics.median(seconds[1:] or seconds)}
    return measured, {model: {"scores": got["scores"], "samples": got["samples"]}}


def results(client: Any, root: Path) -> dict[str, Any]:
    """What must not change: every run's scores and validation curve, every per-sample record
    (keyed by the run's model tag; time metrics left out)."""
    from hacrl.schema import metric_names as M
    from hacrl.schema import tags as T

    found: dict[str, Any] = {}
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    for run in runs:
        label = run.data.tags.get(T.MODEL)
        if not label:
            continue  # the job run: times only
        scores = {k: v for k, v in run.data.metrics.items() if k.startswith("eval/")}
        curves = {k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)]
                  for k in run.data.metrics if k.startswith("val/")}
        folder = Path(client.download_artifacts(run.info.run_id,
                                                f"{M.eval_prefix('main')}/samples",
                                                str(root / "dl" / label)))
        samples = {}
        for path in sorted(folder.iterdir()):
            if (read := _samples_file(path)) is not None:
                samples[read[0]] = read[1]
        found[label] = {"scores": scores, "validation": curves, "samples": samples}
    return found


def _samples_file(path: Path) -> tuple[str, list[Any]] | None:
    """(benchmark, records) of one samples artifact: `<benchmark>.jsonl.gz`, or `.jsonl` as an
    older revision (a baseline) wrote them; None for any other file."""
    if path.name.endswith(".jsonl.gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return path.name.removesuffix(".jsonl.gz"), [json.loads(line) for line in f]
    if path.suffix == ".jsonl":
        return path.stem, [json.loads(line) for line in path.open(encoding="utf-8")]
    return None


def measure(side: Side, model: str, root: Path, overrides: list[str], args: Any,
            compare: bool) -> tuple[dict[str, float], dict[str, Any]]:
    """One measurement of `side`: the seconds to report, and the results when comparing."""
    if args.warm:
        return warm_run(side, model, args.warm, overrides)
    wall, client = run_once(side, model, root, overrides, args.cell)
    return ({"wall_s": wall, **times(client, args.cell)},
            results(client, root) if compare else {})


def times(client: Any, cell: bool) -> dict[str, float]:
    """The seconds to report of one process's store: the job's phases (cell) or lm-eval's."""
    from hacrl.schema import metric_names as M
    from hacrl.schema import tags as T

    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    if cell:
        job = next(r for r in runs if r.data.tags.get(T.KIND) == T.JOB).data.metrics
        return {k: job[M.seconds(k)] for k in ("eval_s", "validation_s", "train_s")}
    return {"lm_eval_s": runs[0].data.metrics[M.eval_seconds("main")],
            "avg_acc": runs[0].data.metrics[M.eval_avg("main")]}


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Where two sides' results differ (scores, curves, per-sample records), in words."""
    out = []
    for label in sorted(set(old) | set(new)):
        a, b = old.get(label, {}), new.get(label, {})
        for part in ("scores", "validation"):
            if a.get(part) != b.get(part):
                out.append(f"{label}: {part} differ")
        for bench in sorted(set(a.get("samples", {})) | set(b.get("samples", {}))):
            x, y = a["samples"].get(bench, []), b["samples"].get(bench, [])
            n = sum(r != s for r, s in zip(x, y, strict=False)) + abs(len(x) - len(y))
            if n:
                out.append(f"{label}: {bench}: {n} of {max(len(x), len(y))} samples differ")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["qwen3-4b-base"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--baseline", metavar="REV", help="git revision to compare against")
    parser.add_argument("--baseline-overrides", nargs="+", default=[], metavar="KEY=VALUE",
                        help="overrides of the baseline side only (e.g. an old setting)")
    parser.add_argument("--cell", action="store_true", help="time `hacrl train` cells")
    parser.add_argument("--warm", type=int, default=0, metavar="N",
                        help="N evaluations in one process per side (no MLflow)")
    args, overrides = parser.parse_known_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    with tempfile.TemporaryDirectory(prefix="hacrl-bench-eval-") as tmp:
        sides = [Side("new", TREE, [])]
        if args.baseline or args.baseline_overrides:
            tree = export_revision(args.baseline, Path(tmp) / "baseline") if args.baseline else TREE
            sides.insert(0, Side("old", tree, list(args.baseline_overrides)))
        models = ["cell"] if args.cell else args.models
        print(f"{'model':<24} {'side':<4} {'repeat':>6} {'wall s':>8}  seconds")
        mismatches: list[str] = []
        for model in models:
            for repeat in range(args.repeats):
                order = sides if repeat % 2 == 0 else sides[::-1]
                found: dict[str, Any] = {}
                for side in order:
                    root = Path(tmp) / f"{model}-{side.name}-{repeat}"
                    seconds, found[side.name] = measure(side, model, root, overrides, args,
                                                        len(sides) > 1)
                    side.runs.append(seconds)
                    shown = " ".join(f"{k}={v:.3f}" if k == "avg_acc" else f"{k}={v:.2f}"
                                     for k, v in seconds.items() if k != "wall_s")
                    print(f"{model:<24} {side.name:<4} {repeat:>6} {seconds['wall_s']:>8.1f}  "
                          f"{shown}", flush=True)
                if len(sides) > 1:
                    mismatches += [f"{model} repeat {repeat}: {d}"
                                   for d in differences(found["old"], found["new"])]
        summarize(sides, mismatches)
    if mismatches:
        print(f"bench_eval: FAIL: the old and new sides' results differ in {len(mismatches)} "
              "place(s) (listed above)")
        return 1
    return 0


def summarize(sides: list[Side], mismatches: list[str]) -> None:
    """Median of each measure per side; with two sides the ratio old/new and the comparison."""
    keys = [k for k in sides[0].runs[0] if k != "avg_acc"]
    for side in sides:
        medians = {k: statistics.median(r[k] for r in side.runs) for k in keys}
        print(f"median {side.name} ({len(side.runs)} runs): "
              + ", ".join(f"{k} {v:.2f}" for k, v in medians.items()))
    if len(sides) == 2:
        old, new = sides
        ratios = {k: statistics.median(r[k] for r in old.runs) /
                  max(statistics.median(r[k] for r in new.runs), 1e-9) for k in keys}
        print("speed-up old/new: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
        print("results identical: " + ("yes (scores, validation curves, every sample)"
                                       if not mismatches else "NO"))
        for line in mismatches:
            print(f"  {line}")


if __name__ == "__main__":
    sys.exit(main())
