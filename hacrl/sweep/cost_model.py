"""What a sweep will cost, before it runs: a cell's work in a few units, seconds per unit fitted
on measured cells, and the sweep's wall time on its slots.

A cell's work (`cell_work`, from its composed config) counts, over the agents it trains,
token budgets weighted by each model's size (billions of parameters, non-embedding at tiny):

    generate   rollout tokens sampled (steps x prompts x G x max_new_tokens) and in-loop
               validation's (validations x problems x max_new_tokens)
    evaluate   the final evaluation's tokens (problems x samples x max_new_tokens, over the
               benchmarks and protocols the cell evaluates)
    train      tokens trained on: own rollouts, and the ones borrowed from partners when the
               method shares rollouts (steps x prompts x rows x max_new_tokens)
    updates    optimizer updates (steps x rows / mini-batch rows)
    agents     one per agent (loading, checkpoints, evaluation start-up)
    cells      one per cell (process start-up, the store)

A cell's seconds are `seconds_per_unit . work` (`Calibration.predict`). The coefficients are a
non-negative least-squares fit on measured cells (`fit`): at paper scale the paper's Table 7
(runtime of the timing cells, 8 GPUs; `paper_calibration`), at tiny scale this machine's
finished sweeps (`hacrl.sweep.cost_plan`). Each calibration carries its leave-one-out error: the
fit without a row, predicting that row, over every row; that is the error an estimate states.
Budgets, not the tokens actually generated, enter the work: responses that stop early make a
cell cheaper than its budget says, which the fit absorbs as long as the cells it predicts stop
as often as the ones it was fitted on.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hacrl.algo.methods import METHODS

UNITS = ("generate", "evaluate", "train", "updates", "agents", "cells")

# published parameter counts (billions) of the paper's models, by hub id: the model cards'
# figures (Qwen3: total parameters; Llama 3.2: 1.24B and 3.21B)
PAPER_PARAMS_B = {
    "Qwen/Qwen3-1.7B-Base": 1.7, "Qwen/Qwen3-4B-Base": 4.0, "Qwen/Qwen3-8B-Base": 8.2,
    "Qwen/Qwen3-4B": 4.0, "Qwen/Qwen3-4B-Instruct-2507": 4.0,
    "meta-llama/Llama-3.2-1B-Instruct": 1.24, "meta-llama/Llama-3.2-3B-Instruct": 3.21,
}

# Table 7 of the paper (analysis/reference/paper/runtime.csv, a test checks they agree): wall
# minutes of the Qwen3-1.7B/4B-Base timing runs on 8 GPUs, per model where it is reported per
# model, the team's total for HACPO (one job trains both)
TABLE7_MINUTES: dict[tuple[str, str], float] = {
    ("gspo", "qwen3-1.7b-base"): 91, ("gspo", "qwen3-4b-base"): 158,
    ("gspo_updates_x2", "qwen3-1.7b-base"): 126, ("gspo_updates_x2", "qwen3-4b-base"): 179,
    ("gspo_x2", "qwen3-1.7b-base"): 163, ("gspo_x2", "qwen3-4b-base"): 241,
    ("hacpo", "total"): 331,
}
TABLE7_GPUS = 8


def model_size_b(cfg: Any, agent: str) -> float:
    """Agent `agent`'s size in billions of parameters: the published count at paper scale, the
    zoo spec's non-embedding count at tiny scale (its models are small enough that the
    embeddings' share says little about compute), 1.0 for a model neither knows."""
    entry = cfg.models.get(agent)
    if str(cfg.scale.name) == "tiny":
        from hacrl.zoo.specs import ZOO

        spec = ZOO.get(agent)
        if spec is not None:
            h = spec.hidden_size
            head = spec.head_dim or h // spec.num_heads
            attention = 2 * h * head * (spec.num_heads + spec.num_kv_heads)  # q, o; k, v
            per_layer = attention + 3 * h * spec.intermediate_size
            return spec.num_layers * per_layer / 1e9
        return 1.0
    hub = str(entry.paper) if entry is not None else agent
    return PAPER_PARAMS_B.get(hub, 1.0)


def job_gpus(cfg: Any) -> int:
    """GPUs a job of this config holds: the verl engine's allocation (nodes x GPUs per node)
    on cuda, one for the local engine on a GPU, none on a CPU. `engine.device=auto` counts as
    a GPU only where this process sees one."""
    engine = cfg.engine
    device = str(engine.get("device", "cpu"))
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not device.startswith("cuda"):
        return 0
    if str(engine.name) == "verl":
        return int(engine.nnodes) * int(engine.gpus_per_node)
    return 1


def _eval_tokens(cfg: Any, benchmarks: Sequence[str], protocols: Sequence[str]) -> float:
    """Tokens the final evaluation may generate, over every protocol the cell evaluates."""
    if not bool(cfg.eval.at_end) or not benchmarks:
        return 0.0
    total = 0.0
    sources = cfg.data.sources
    for name in protocols:
        protocol = cfg.eval.protocols[name]
        limit = protocol.get("limit")
        sampled = protocol.get("sampled") or {}
        for bench in benchmarks:
            rows = float(sources[bench].rows) if bench in sources else 0.0
            problems = min(rows, float(limit)) if limit is not None else rows
            paper_name = bench.removeprefix("tiny_")
            samples = float(sampled[paper_name].samples) if paper_name in sampled \
                else float(protocol.samples)
            total += problems * samples * float(protocol.max_new_tokens)
    return total


def cell_work(cfg: Any, team: Sequence[str], benchmarks: Sequence[str],
              protocols: Sequence[str] | None = None) -> dict[str, float]:
    """The work (`UNITS`) of one cell: `cfg` its composed config, `team` the agents it trains
    (all of them: shared rollouts; one: a single-agent method), `benchmarks` it evaluates with
    `protocols` (None: the config's `eval.use`)."""
    method = METHODS[str(cfg.method.name)]
    steps = float(cfg.train.steps) if method.trains else 0.0
    prompts = float(cfg.train.prompts_per_step)
    group = float(method.group_size(int(cfg.train.rollouts_per_prompt)))
    tokens = float(cfg.rollout.max_new_tokens)
    rows_per_update = float(method.update_prompts(int(cfg.train.minibatch_prompts))) * group
    every = int(cfg.validation.every)
    validations = (math.floor(steps / every) + 1) if every and method.trains else 0
    bench = str(cfg.validation.benchmark)
    problems = cfg.validation.problems
    if problems is None:
        problems = cfg.data.sources[bench].rows if bench in cfg.data.sources else 0
    validation = validations * float(problems) * float(cfg.validation.max_new_tokens)
    evaluation = _eval_tokens(cfg, benchmarks,
                              [str(p) for p in (protocols or cfg.eval.use)])
    work = dict.fromkeys(UNITS, 0.0)
    for agent in team:
        size = model_size_b(cfg, agent)
        rows = group * (len(team) if method.shares_rollouts else 1)  # own + borrowed
        work["generate"] += size * (steps * prompts * group * tokens + validation)
        work["evaluate"] += size * evaluation
        work["train"] += size * steps * prompts * rows * tokens
        work["updates"] += size * steps * prompts * rows / max(rows_per_update, 1.0)
        work["agents"] += 1.0
    work["cells"] = 1.0
    return work


@dataclass
class Calibration:
    """Seconds per unit of work, where they came from, and how well they predict."""

    seconds_per_unit: dict[str, float]
    source: str                         # e.g. "paper Table 7 (7 rows)"
    rows: int = 0
    # each calibration row's leave-one-out relative error (predicted / measured - 1)
    loo_errors: list[float] = field(default_factory=list)
    # the rows' sum predicted leave-one-out over their measured sum, - 1: a total's error
    loo_total_error: float | None = None
    # per row, where the rows have names: (name, measured s, fitted s, leave-one-out s)
    checks: list[tuple[str, float, float, float]] = field(default_factory=list)

    def predict(self, work: Mapping[str, float]) -> float:
        return sum(self.seconds_per_unit.get(u, 0.0) * float(work.get(u, 0.0)) for u in UNITS)

    def error_summary(self) -> str:
        """"±x% (leave-one-out: median |error| y%, largest z%, n rows)"."""
        if not self.loo_errors:
            return "error unknown (no leave-one-out: fewer than 3 rows)"
        errors = np.abs(np.asarray(self.loo_errors))
        return (f"leave-one-out error over {len(errors)} rows: median {np.median(errors):.0%}, "
                f"largest {errors.max():.0%}")

    def typical_error(self) -> float | None:
        """The median leave-one-out |relative error|; None without one."""
        return float(np.median(np.abs(self.loo_errors))) if self.loo_errors else None


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    from scipy.optimize import nnls

    # columns scaled to unit norm first: units differ by orders of magnitude
    norms = np.linalg.norm(x, axis=0)
    norms[norms == 0] = 1.0
    coef, _ = nnls(x / norms, y)
    return np.asarray(coef / norms)


def fit(rows: Sequence[tuple[Mapping[str, float], float]], source: str,
        units: Sequence[str] = UNITS, names: Sequence[str] | None = None) -> Calibration:
    """Seconds per unit (`units`; the others 0) fitted to measured (work, seconds) rows by
    non-negative least squares on relative error (each row weighted by 1 / its seconds, so a
    10 s cell counts as much as a 10 h one), with each row's leave-one-out error."""
    if not rows:
        raise ValueError("a calibration needs at least one measured row")
    x = np.array([[float(w.get(u, 0.0)) for u in units] for w, _ in rows])
    y = np.array([float(s) for _, s in rows])
    weight = 1.0 / np.maximum(y, 1e-9)
    coef = _nnls(x * weight[:, None], y * weight)
    predicted: list[float] = []
    if len(rows) >= 3:
        for i in range(len(rows)):
            keep = np.arange(len(rows)) != i
            c = _nnls(x[keep] * weight[keep, None], y[keep] * weight[keep])
            predicted.append(float(x[i] @ c))
    calibration = Calibration({u: float(c) for u, c in zip(units, coef, strict=True)}, source,
                              len(rows), [p / m - 1.0 for p, m in zip(predicted, y, strict=False)])
    if predicted:
        calibration.loo_total_error = float(sum(predicted) / y.sum() - 1.0)
        if names is not None:
            calibration.checks = [(n, float(m), float(x[i] @ coef), predicted[i])
                                  for i, (n, m) in enumerate(zip(names, y, strict=True))]
    return calibration


def makespan(seconds: Sequence[float], slots: int) -> float:
    """Wall time of cells run longest first on `slots` parallel slots (as the sweep orders
    them): each cell starts on the first slot free."""
    free = [0.0] * max(1, slots)
    for s in sorted(seconds, reverse=True):
        heapq.heapreplace(free, free[0] + s)
    return max(free) if seconds else 0.0
