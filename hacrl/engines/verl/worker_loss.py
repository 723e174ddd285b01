"""The loss callable verl's actor workers train with: HACPO's per-sample objective.

verl calls `loss(config, model_output, data, dp_group)` once per micro-batch on every
data-parallel rank and back-propagates the result; FSDP then averages gradients over the ranks.
A registered verl policy loss never sees per-row extra fields or the mini-batch index, hence
this callable (installed with the worker group's `set_loss_fn`). It computes
`hacrl.algo.policy_loss`, the function the local engine trains with, with:

- the mini-batch's denominators (rows, tokens, own-row tokens over *all* ranks), sent by the
  driver, so that micro-batches add up to the mini-batch loss exactly as in the local engine;
- `dp_size` as the factor that undoes FSDP's gradient averaging (verl's `agg_loss` does the same);
- the update index m from the batch (set per mini-batch by `workers.HacrlTrainingWorker`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from hacrl.algo import LOSS_METRICS, Denominators, LossConfig, LossOutput, loss_metrics, policy_loss
from hacrl.algo.metrics import COUNT, MAX, MIN, ROW_MEAN, SHARE, SUM
from hacrl.engines.verl.batch import loss_batch, response_logprobs
from hacrl.schema import metric_names as M

UPDATE_INDEX = "hacrl_update_index"
DENOMINATORS = "hacrl_denominators"
ROWS = "hacrl/rows"
# `policy_loss`'s own metrics by kind (derived from its declaration, `hacrl.algo.LOSS_METRICS`)
SUMMED = tuple(k for k, kind in LOSS_METRICS.items() if kind == SHARE)
WEIGHTED = tuple(k for k, kind in LOSS_METRICS.items() if kind == ROW_MEAN)
# the sequence-ratio statistics this callable adds (from `LossOutput.s_homo` / `s_hete`)
RATIO_STATS = {M.ratio(name, stat): kind for name in M.RATIOS
               for stat, kind in (("sum", SUM), ("count", COUNT), ("min", MIN), ("max", MAX))}
# verl's aggregation of each kind, over micro-batches and (SUM: averaged) over ranks
_VERL_AGGREGATION = {SHARE: "SUM", ROW_MEAN: "SUM", SUM: "SUM", COUNT: "SUM", MIN: "MIN", MAX: "MAX"}


def reported_metrics(loss_config: LossConfig) -> dict[str, str]:
    """Every metric the callable reports under `loss_config`, with its kind: `policy_loss`'s
    (`hacrl.algo.loss_metrics`) and the ratio statistics. `update_metrics.actor_metrics` reads
    verl's aggregates by these kinds."""
    return {**loss_metrics(loss_config), **RATIO_STATS}


def hacrl_loss_output(model_logp: Tensor, data: Any,
                      loss_config: LossConfig) -> tuple[LossOutput, int]:
    """`policy_loss` of one micro-batch as verl hands it over (any log-prob layout), over its
    real rows (filler rows add nothing to the loss and stay out of the metrics); and how many
    real rows there were."""
    from verl.utils import tensordict_utils as tu

    update_index = tu.get_non_tensor_data(data, UPDATE_INDEX, None)
    if update_index is None:
        raise KeyError(f"training batch has no {UPDATE_INDEX}: hacrl's loss needs the mini-batch "
                       "index m (set by hacrl.engines.verl.workers.HacrlTrainingWorker)")
    sizes = tu.get_non_tensor_data(data, DENOMINATORS, None)
    denominators = Denominators(*map(float, sizes)) if sizes is not None else None
    logp = response_logprobs(model_logp, data)
    rows = loss_batch(data)
    width = rows.response_mask.shape[1]
    logp = logp[:, :width].float()
    keys = data.keys()
    if "hacrl_real" in keys and not bool(data["hacrl_real"].all()):
        real = torch.nonzero(data["hacrl_real"].bool()).flatten()
        if real.numel() == 0:  # a micro-batch of filler rows only: no loss, graph kept
            empty = LossOutput(loss=logp.sum() * 0.0, metrics={}, s_homo=logp.new_zeros(0),
                               s_hete=logp.new_zeros(0))
            return empty, 0
        rows, logp = rows.select(real.cpu()), logp[real.to(logp.device)]
    out = policy_loss(logp, rows.to(logp.device), loss_config, update_index=int(update_index),
                      denominators=denominators)
    return out, int(rows.advantages.shape[0])


def hacrl_loss(config: Any = None, model_output: dict[str, Tensor] | None = None,
               data: Any = None, dp_group: Any = None, *,
               loss_config: LossConfig) -> tuple[Tensor, dict[str, Any]]:
    """verl's loss-callable signature (verl calls it with keywords: model_output=, data=,
    dp_group=); bind `loss_config` with functools.partial. `config` (verl's actor config) is
    not needed: the objective is `loss_config`.

    Each metric goes to verl by its declared kind (`reported_metrics`): a SHARE of the
    mini-batch value as a SUM (over micro-batches and ranks it is the mini-batch's); a ROW_MEAN
    as a SUM of value x real rows next to `hacrl/rows`, which `update_metrics.actor_metrics`
    divides by (row-weighted, like the local engine); SUM / COUNT as SUMs, MIN / MAX as such."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import AggregationType, Metric

    if model_output is None or data is None:
        raise TypeError("hacrl_loss needs model_output and data")
    out, real_rows = hacrl_loss_output(model_output["log_probs"], data, loss_config)
    dp_size = int(tu.get_non_tensor_data(data, "dp_size", 1) or 1)
    values = {**out.metrics, **_ratio_stats(out)}
    metrics: dict[str, Any] = {ROWS: Metric(value=float(real_rows), aggregation=AggregationType.SUM)}
    # Every rank reports every key (verl aggregates per key across ranks): a key without a value
    # here (no rows of its kind) counts 0, and +-inf for min and max ("no such rows here").
    for key, kind in reported_metrics(loss_config).items():
        value = float(values.get(key, {MIN: math.inf, MAX: -math.inf}.get(kind, 0.0)))
        if kind == SHARE:
            # verl sums a SUM metric over micro-batches but averages it over data-parallel ranks
            # (`Metric.aggregate_dp`, verl/utils/metric/utils.py:151-154), hence x dp_size, as
            # the loss. (SUM / COUNT and ROW_MEAN / rows are averaged alike: ratios stay exact.)
            value *= dp_size
        elif kind == ROW_MEAN:
            value *= real_rows
        metrics[key] = Metric(value=value, aggregation=AggregationType[_VERL_AGGREGATION[kind]])
    return out.loss * dp_size, metrics


def _ratio_stats(out: LossOutput) -> dict[str, float]:
    """Sum, count, min and max of the own and cross rows' sequence ratios (RATIO_STATS)."""
    stats: dict[str, float] = {}
    for name, ratios in ((M.S_HOMO, out.s_homo), (M.S_HETE, out.s_hete)):
        stats[M.ratio(name, "sum")] = float(ratios.sum())
        stats[M.ratio(name, "count")] = float(ratios.numel())
        if ratios.numel():
            stats[M.ratio(name, "min")] = float(ratios.min())
            stats[M.ratio(name, "max")] = float(ratios.max())
    return stats


def loss_callable(loss_config: LossConfig) -> Callable[..., tuple[Tensor, dict[str, Any]]]:
    """What the engine installs with `set_loss_fn`: verl calls it as
    fn(model_output=..., data=..., dp_group=...)."""
    return functools.partial(hacrl_loss, loss_config=loss_config)  # config: None by default


__all__ = ["DENOMINATORS", "RATIO_STATS", "ROWS", "SUMMED", "UPDATE_INDEX", "WEIGHTED", "hacrl_loss",
           "hacrl_loss_output", "loss_callable", "reported_metrics"]
