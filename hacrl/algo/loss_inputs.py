"""What the loss is given: the rows of a mini-batch (`LossBatch`) and a method's objective
parameters (`LossConfig`). Kept apart from `loss.py` so the registry of borrowed-sample
objectives can name these types without importing the loss that looks the objectives up."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor


@dataclass
class LossBatch:
    """What the loss needs besides the current log-probs; B rows, T target tokens.

    response_mask: [B, T] 1 on response tokens.
    old_logp: [B, T] pre-update log-probs in target tokens (own and Naive rows; 0 for cross rows).
    source_mean_logp: [B] mean rollout-policy log-prob over the *source's* tokens (used by cross
        rows only; own and Naive rows take their sequence ratio from old_logp).
    advantages: [B] A^(k) (target baseline).
    omega: [B] omega^(j,k) modulation (1 for own rows or when modulation is off).
    cross: [B] bool, row uses the cross-agent (HACPO) objective.
    own: [B] bool, row was sampled by the target itself (the KL term applies).
    ref_logp: [B, T] reference-policy log-probs, or None when there is no KL term.
    """

    response_mask: Tensor
    old_logp: Tensor
    source_mean_logp: Tensor
    advantages: Tensor
    omega: Tensor
    cross: Tensor
    own: Tensor
    ref_logp: Tensor | None = None

    def select(self, index: Tensor) -> LossBatch:
        """Rows `index` (e.g. one mini-batch)."""
        changes: dict[str, Any] = {f.name: _apply(getattr(self, f.name), lambda t: t[index])
                                   for f in fields(self)}
        return replace(self, **changes)

    def trim(self, width: int) -> LossBatch:
        """Drop token columns past `width` (the longest response among these rows)."""
        changes: dict[str, Any] = {f.name: _apply(getattr(self, f.name), lambda t: t[:, :width])
                                   for f in fields(self) if getattr(self, f.name) is not None
                                   and getattr(self, f.name).ndim == 2}
        return replace(self, **changes)

    def to(self, device: torch.device | str) -> LossBatch:
        changes: dict[str, Any] = {f.name: _apply(getattr(self, f.name), lambda t: t.to(device))
                                   for f in fields(self)}
        return replace(self, **changes)


def _apply(value: Tensor | None, fn: Callable[[Tensor], Tensor]) -> Tensor | None:
    return None if value is None else fn(value)


@dataclass(frozen=True)
class LossConfig:
    """Objective parameters of one method (see `hacrl.algo.methods`)."""

    ratio: str = "sequence"  # "sequence" (GSPO) or "token" (GRPO) for own rows
    loss_agg: str = "seq-mean-token-mean"  # or "token-mean"
    clip_low: float = 3e-4
    clip_high: float = 4e-4
    alpha: float = 1.0
    delta: float = 0.2  # lower bound of the first update is 1 - delta
    delta_step: float = 0.025
    stepwise: bool = True
    cross_clip: bool = True
    kl_coef: float = 0.0
    dual_clip_c: float | None = None  # token ratio (GRPO): verl's dual clip; None: none
    borrowed: str = "cross"  # the registered borrowed-sample objective whose term scores cross rows
