"""verl's `update_actor` metrics in the local engine's names (`actor_metrics`)."""

from __future__ import annotations

import math
from typing import Any

import torch

from hacrl.algo import LossConfig
from hacrl.algo.metrics import MAX, MIN, ROW_MEAN
from hacrl.engines.verl.worker_loss import ROWS, reported_metrics
from hacrl.schema import metric_names as M


def actor_metrics(raw: dict[str, Any], kinds: dict[str, str] | None = None) -> dict[str, float]:
    """verl's update metrics in the local engine's names; verl's own under `verl/actor/`.

    Ours are the metrics the loss callable reports (`kinds`, by default those of HACPO's loss:
    `worker_loss.reported_metrics`), read by their declared kind: SHARE sums of micro-batch
    shares are the mini-batch's values; ROW_MEAN sums of value x rows are divided by the row
    count (row-weighted means, as the local engine reports them); SUM / COUNT / MIN / MAX stay
    for the loop to combine over a step's updates (`hacrl.algo.metrics.combine_updates`), an
    infinite extreme (no such rows) left out."""
    kinds = reported_metrics(LossConfig()) if kinds is None else kinds
    flat = {k: _mean(v) for k, v in raw.items()}
    rows = flat.pop(ROWS, 0.0)
    out: dict[str, float] = {}
    for key, value in flat.items():
        kind = kinds.get(key)
        if kind is None:
            out[key if key == M.GRAD_NORM else f"verl/actor/{key}"] = value
        elif kind == ROW_MEAN:
            if rows > 0:
                out[key] = value / rows
        elif not (kind in (MIN, MAX) and math.isinf(value)):
            out[key] = value
    return out


def _mean(value: Any) -> float:
    if isinstance(value, list | tuple):
        values = [float(v) for v in value]
        return sum(values) / len(values) if values else 0.0
    if isinstance(value, torch.Tensor):
        return float(value.float().mean())
    return float(value)


__all__ = ["actor_metrics"]
