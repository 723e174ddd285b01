"""The local engine's log-prob and update forwards with and without prompt sharing, side by side.

    python scripts/bench_prompt_sharing.py [pair=size] [method=hacpo] [--repeats 5]

One real training step of the cell (tiny scale) records the rows of every update mini-batch and
log-prob call each agent's engine receives. Those rows are then scored both ways, alternating
(a busy machine drifts): with each distinct prompt computed once (`hacrl.engines.prompt_sharing`,
the default for the zoo's models on a CPU) and with whole prompt + response rows (transformers'
forward, as on a GPU). Per agent it prints the median seconds of all of the step's update
forwards + backwards and of its log-prob forwards, the ratio full / shared, and the largest
log-prob difference between the two ways.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch

from hacrl.algo.rollout import TokenView
from hacrl.bench.compute_floor import team_loops
from hacrl.config import compose, validate
from hacrl.engines import local as local_module
from hacrl.engines.local import LocalEngine
from hacrl.training.loop import seed_everything


def _recorded(engine: Any) -> tuple[list[list[TokenView]], list[list[TokenView]]]:
    """Wrap the engine so its update and log-prob rows are kept: (updates, log-prob calls)."""
    updates: list[list[TokenView]] = []
    scored: list[list[TokenView]] = []
    train, log_probs = engine.train_minibatch, engine.log_probs

    def train_minibatch(views: list[TokenView], *args: Any, **kwargs: Any) -> Any:
        updates.append(list(views))
        return train(views, *args, **kwargs)

    def scored_log_probs(views: list[TokenView], *args: Any, **kwargs: Any) -> Any:
        scored.append(list(views))
        return log_probs(views, *args, **kwargs)

    engine.train_minibatch, engine.log_probs = train_minibatch, scored_log_probs
    return updates, scored


def _pass(engine: Any, calls: list[list[TokenView]], grad: bool) -> list[torch.Tensor]:
    """Every call's rows in the engine's row batches: forwards (+ backwards with grad)."""
    out = []
    per = engine.forward_rows or 10**9
    for views in calls:
        order = engine._row_order(views)
        width = max(1, max(len(v.response_ids) for v in views))
        for first in range(0, len(views), per):
            chunk = [views[i] for i in order[first:first + per]]
            with torch.set_grad_enabled(grad):
                logp = engine._response_logprobs(engine.model, chunk, width)
            if grad:
                logp.sum().backward()
            out.append(logp.detach())
        if grad:
            engine.model.zero_grad(set_to_none=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="hydra overrides (default: pair=size "
                        "method=hacpo)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    spec = validate(compose(["method=hacpo", "pair=size", "validation.every=0",
                             "eval.at_end=false", *args.overrides]))
    torch.set_num_threads(int(spec.cfg.engine.get("threads") or 1))
    seed_everything(int(spec.cfg.seed))
    loops, _ = team_loops(spec)
    engines: list[tuple[str, LocalEngine]] = []
    for loop in loops:
        for agent in loop.agents:
            if not isinstance(agent.engine, LocalEngine):  # its rows are scored by its internals
                print(f"{agent.name}: this benchmark needs engine=local, not "
                      f"{type(agent.engine).__name__}", file=sys.stderr)
                return 2
            engines.append((agent.name, agent.engine))
    records = {name: _recorded(engine) for name, engine in engines}
    for loop in loops:
        loop.step(1)
    sharing = local_module.prompt_sharing_logprobs
    print(f"one {spec.method.name} step's rows, scored both ways (median of {args.repeats}, "
          f"threads={torch.get_num_threads()}), seconds:")
    print(f"{'agent':<24}{'pass':<8}{'rows':>6}{'prompts':>9}{'full':>9}{'shared':>9}"
          f"{'ratio':>7}{'max|dlogp|':>12}")
    for name, engine in engines:
        updates, scored = records[name]
        engine.model.train()
        for label, calls, grad in (("update", updates, True), ("logprob", scored, False)):
            if not calls:
                continue
            seconds: dict[str, list[float]] = {"full": [], "shared": []}
            logps: dict[str, list[torch.Tensor]] = {}
            for _ in range(args.repeats):
                for way in ("full", "shared"):
                    local_module.prompt_sharing_logprobs = (
                        sharing if way == "shared" else (lambda *a, **k: None))
                    tic = time.perf_counter()
                    logps[way] = _pass(engine, calls, grad)
                    seconds[way].append(time.perf_counter() - tic)
            local_module.prompt_sharing_logprobs = sharing
            full, shared = (statistics.median(seconds[w]) for w in ("full", "shared"))
            gap = max(float((a - b).abs().max()) for a, b in zip(logps["full"], logps["shared"],
                                                                  strict=True))
            rows = sum(map(len, calls))
            prompts = sum(len({v.prompt_ids for v in views}) for views in calls)
            print(f"{name:<24}{label:<8}{rows:>6}{prompts:>9}{full:>9.3f}{shared:>9.3f}"
                  f"{full / shared:>7.2f}{gap:>12.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
