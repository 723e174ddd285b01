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

from hacrl.algo import SHARES, Denominators, LossConfig, LossOutput, policy_loss
from hacrl.engines.verl.batch import loss_batch, response_logprobs

UPDATE_INDEX = "hacrl_update_index"
DENOMINATORS = "hacrl_denominators"
ROWS = "hacrl/rows"
# the metrics `policy_loss` reports: shares of the mini-batch value (summed over micro-batches
# and ranks), and row means (row-weighted)
SUMMED = SHARES
WEIGHTED = ("loss/own", "loss/borrowed", "clip/own_frac", "clip/borrowed_frac", "clip/lower_bound")


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

    Loss metrics are shares of the mini-batch value (SUM over micro-batches and ranks is the
    mini-batch's); the row means are reported as a SUM of value x real rows next to
    `hacrl/rows`, and `engine.actor_metrics` divides (row-weighted, like the local engine)."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import AggregationType, Metric

    if model_output is None or data is None:
        raise TypeError("hacrl_loss needs model_output and data")
    out, real_rows = hacrl_loss_output(model_output["log_probs"], data, loss_config)
    dp_size = int(tu.get_non_tensor_data(data, "dp_size", 1) or 1)
    metrics: dict[str, Any] = {ROWS: Metric(value=float(real_rows), aggregation=AggregationType.SUM)}
    # This micro-batch's share; summed over micro-batches and ranks it is the mini-batch's value.
    # verl sums a SUM metric over micro-batches but averages it over data-parallel ranks
    # (`Metric.aggregate_dp`, verl/utils/metric/utils.py:151-154), hence x dp_size, as the loss.
    for key in SUMMED:
        metrics[key] = Metric(value=float(out.metrics.get(key, 0.0)) * dp_size,
                              aggregation=AggregationType.SUM)
    for key in WEIGHTED:  # every rank reports every key, with weight 0 when it had no rows
        value = out.metrics.get(key, 0.0)
        metrics[key] = Metric(value=float(value) * real_rows, aggregation=AggregationType.SUM)
    # Every rank reports every key (verl aggregates per key across ranks): sums and counts give
    # the mean over all rows, and +-inf marks "no such rows here" for min and max.
    for name, ratios in (("s_homo", out.s_homo), ("s_hete", out.s_hete)):
        empty = ratios.numel() == 0
        metrics[f"ratio/{name}_sum"] = Metric(value=float(ratios.sum()), aggregation=AggregationType.SUM)
        metrics[f"ratio/{name}_count"] = Metric(value=float(ratios.numel()),
                                                aggregation=AggregationType.SUM)
        metrics[f"ratio/{name}_min"] = Metric(value=math.inf if empty else float(ratios.min()),
                                              aggregation=AggregationType.MIN)
        metrics[f"ratio/{name}_max"] = Metric(value=-math.inf if empty else float(ratios.max()),
                                              aggregation=AggregationType.MAX)
    return out.loss * dp_size, metrics


def loss_callable(loss_config: LossConfig) -> Callable[..., tuple[Tensor, dict[str, Any]]]:
    """What the engine installs with `set_loss_fn`: verl calls it as
    fn(model_output=..., data=..., dp_group=...)."""
    return functools.partial(hacrl_loss, config=None, loss_config=loss_config)


__all__ = ["DENOMINATORS", "loss_callable", "ROWS", "SUMMED", "UPDATE_INDEX", "WEIGHTED", "hacrl_loss", "hacrl_loss_output"]
