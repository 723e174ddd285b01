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

import math
from typing import Any

from torch import Tensor

from hacrl.algo import Denominators, LossConfig, LossOutput, policy_loss
from hacrl.engines.verl.batch import loss_batch, response_logprobs

UPDATE_INDEX = "hacrl_update_index"
DENOMINATORS = "hacrl_denominators"


def hacrl_loss_output(model_logp: Tensor, data: Any, loss_config: LossConfig) -> LossOutput:
    """`policy_loss` of one micro-batch as verl hands it over (any log-prob layout)."""
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
    return policy_loss(logp[:, :width].float(), rows.to(logp.device), loss_config,
                       update_index=int(update_index), denominators=denominators)


def hacrl_loss(config: Any, model_output: dict[str, Tensor], data: Any, dp_group: Any = None,
               *, loss_config: LossConfig) -> tuple[Tensor, dict[str, Any]]:
    """verl's loss-callable signature; bind `loss_config` with functools.partial."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import AggregationType, Metric

    out = hacrl_loss_output(model_output["log_probs"], data, loss_config)
    dp_size = int(tu.get_non_tensor_data(data, "dp_size", 1) or 1)
    metrics: dict[str, Any] = {k: Metric(value=v, aggregation=AggregationType.MEAN)
                               for k, v in out.metrics.items()}
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


__all__ = ["DENOMINATORS", "UPDATE_INDEX", "hacrl_loss", "hacrl_loss_output"]
