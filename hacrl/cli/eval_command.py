"""`hacrl eval`: a catalog model, a checkpoint or an agent run on the protocols' benchmarks,
through lm-eval, into MLflow."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_parsers(sub: Any) -> None:
    ev = sub.add_parser("eval", help="evaluate a catalog model, a checkpoint or an agent run on the "
                        "configured benchmarks through lm-eval; scores go to MLflow")
    ev.add_argument("--model", help="catalog model before training, e.g. qwen3-4b-base")
    ev.add_argument("--checkpoint", help="a model directory, e.g. a job's .../ckpt/step_N/<agent>")
    ev.add_argument("--run", help="MLflow run id of a training job's agent run")
    ev.add_argument("--force", action="store_true", help="re-evaluate even if already logged")
    ev.add_argument("--limit", type=int, default=None,
                    help="first N problems per benchmark (quick checks; sets the protocols' "
                    "limit, so their key differs from the full evaluation's)")
    ev.add_argument("overrides", nargs="*", help="hydra overrides, e.g. eval.use=[ablation] scale=paper")
    ev.set_defaults(command_run=lambda args, unknown: run(args, [*args.overrides, *unknown]),
                    takes_overrides=True)


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from omegaconf import OmegaConf

    from hacrl.config import ConfigError, compose, model_path
    from hacrl.config.protocol import Protocol
    from hacrl.config.vllm_models import check_vllm_length, check_vllm_model
    from hacrl.core.layout import Layout
    from hacrl.evaluation import runner
    from hacrl.job.lock import evaluation_lock
    from hacrl.schema import tags as T
    from hacrl.tracking import Tracker
    from hacrl.tracking.mlflow_store import resolve_uri

    chosen = [flag for flag in ("model", "checkpoint", "run") if getattr(args, flag)]
    if len(chosen) != 1:
        print("hacrl: eval: give exactly one of --model NAME, --checkpoint DIR, --run RUN_ID",
              file=sys.stderr)
        return 2
    try:
        cfg = compose(overrides)
        if args.limit is not None:
            # a limited evaluation is its own protocol (its key differs), never mistaken for
            # the full one when the "already logged" check or a report reads it
            for name in cfg.eval.use:
                OmegaConf.update(cfg, f"eval.protocols.{name}.limit", args.limit, merge=False)
        Protocol.in_use(cfg.eval)
        runner.data_files(cfg, [str(b) for b in cfg.eval.benchmarks])  # missing data: stop here
        if cfg.engine.get("threads"):
            # as a training job does (engine.threads: 1 at scale=tiny): torch's default of a
            # thread per core made the tiny models' generation several times slower on a
            # busy 2-core CPU (threads waiting on each other), for the same responses
            import torch

            torch.set_num_threads(int(cfg.engine.threads))
        output_root = Layout.at(cfg.output_root).root
        tracker = Tracker(resolve_uri(cfg.tracking.uri, output_root), cfg.tracking.experiment)
        model = (model_path(cfg, 0, args.model) if args.model else
                 str(Path(args.checkpoint).expanduser().resolve()) if args.checkpoint else args.run)
        if str(cfg.eval.backend) == "vllm" and not args.run:  # (a run's model: below)
            check_vllm_model("eval.backend", args.model or args.checkpoint, model,
                             str(cfg.eval.dtype))
            check_vllm_length(args.model or args.checkpoint, model,
                              int(cfg.eval.vllm.max_prompt_tokens),
                              {f"eval.protocols.{p.name}.max_new_tokens": p.max_new_tokens
                               for p in Protocol.in_use(cfg.eval)})
        with evaluation_lock(output_root, model, args.model or args.checkpoint or args.run):
            if args.model:
                target = runner.target_from_model(tracker, cfg, args.model, model)
            elif args.checkpoint:
                target = runner.target_from_checkpoint(tracker, cfg, Path(args.checkpoint))
            else:
                target = runner.target_from_run(tracker, args.run)
                if str(cfg.eval.backend) == "vllm":
                    check_vllm_model("eval.backend", f"run {args.run}", target.model_path,
                                     str(cfg.eval.dtype))
            standalone = tracker.client.get_run(target.run_id).data.tags.get(T.KIND) == T.EVAL
            status = "FAILED"
            try:
                results = runner.evaluate_into_run(cfg, target.model_path, tracker,
                                                   target.run_id, target.step, force=args.force)
                status = "FINISHED"
            finally:
                if standalone:
                    tracker.finish(target.run_id, status)
    except ConfigError as err:
        print(f"hacrl: eval: {err}", file=sys.stderr)
        return 2
    for result in results:
        what = ("already logged (--force re-evaluates)" if result.skipped else
                f"same settings as {result.shared_with}, scores copied" if result.shared_with else
                f"evaluated in {result.seconds:.1f} s")
        print(f"{target.label} (step {target.step}), protocol {result.protocol.name} "
              f"[{result.protocol.key}]: {what}")
        print(runner.describe(result))
    print(f"MLflow run {target.run_id} in {tracker.uri}")
    return 0
