"""Per-sample surrogate objectives (HACPO steps 3, 5, 6 and the own-sample GSPO/GRPO terms).

Every function returns a *loss* (the negated objective) per sample or per token, so an engine
can aggregate it the way its trainer does. `hacrl.algo.loss` assembles them for a mini-batch.
"""

from __future__ import annotations

import torch
from torch import Tensor


def stepwise_lower_bound(update_index: int, delta: float, delta_step: float,
                         stepwise: bool = True) -> float:
    """lower_m = min(1, 1 - delta + m * delta_step), m = optimizer updates already made this step.

    With `stepwise=False` the bound stays at 1 - delta (the "no stepwise" ablation).
    """
    if update_index < 0:
        raise ValueError(f"update index m must be >= 0, got {update_index}")
    m = update_index if stepwise else 0
    return min(1.0, 1.0 - delta + m * delta_step)


def clipped_surrogate_loss(ratio: Tensor, advantage: Tensor, clip_low: float,
                           clip_high: float) -> tuple[Tensor, Tensor]:
    """PPO-style clipped loss -min(r A, clip(r, 1-clip_low, 1+clip_high) A).

    Used with GSPO's sequence ratio (shapes [B]) or GRPO's token ratio ([B, T] with the
    advantage broadcast). Returns (loss, clipped) where `clipped` marks where the clipped
    branch is the active one (its gradient is zero).
    """
    unclipped = -advantage * ratio
    clipped = -advantage * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def dual_clipped_loss(loss: Tensor, advantage: Tensor, c: float) -> tuple[Tensor, Tensor]:
    """verl's dual clip on a clipped surrogate loss (its vanilla policy loss, which the paper's
    GRPO ran on): where A < 0 the loss is at most c * |A|, so a token whose ratio ran far
    above 1 gets no gradient. (Ye et al. 2020's dual-clip PPO; verl's clip_ratio_c, 3.)

    Args:
        loss: [...] -min(r A, clip(r) A) from `clipped_surrogate_loss`.
        advantage: broadcastable to `loss`.
        c: the bound's factor (> 1).
    Returns:
        (loss, capped: where the bound is the active branch).
    """
    bound = -advantage * c
    capped = (advantage < 0) & (bound < loss)
    return torch.where(capped, bound.expand_as(loss), loss), capped


def exponential_is_weight(ratio: Tensor, alpha: float) -> Tensor:
    """sg(s)^alpha for s < 1, else 1 (paper step 5). No gradient flows through it."""
    s = ratio.detach()
    return torch.where(s < 1.0, s.clamp_min(0.0).pow(alpha), torch.ones_like(s))


def borrowed_sample_loss(ratio: Tensor, advantage: Tensor, omega: Tensor, *, alpha: float,
                         lower: float, clip: bool = True) -> tuple[Tensor, Tensor]:
    """-clip(s, lower_m, 1) * sg(s)^alpha [s < 1] * omega^(j,k) * A^(k)(y^(j))   (J_hete).

    Args:
        ratio: [B] s^(k,j) of borrowed responses (with grad).
        advantage: [B] A^(k) of those responses (target baseline).
        omega: [B] modulation omega^(j,k) = P_j / P_k (1 to switch modulation off).
        alpha: exponent of the exponential importance weight (>= 0).
        lower: lower_m from `stepwise_lower_bound`; the upper bound is 1 so a borrowed
            sample is never up-weighted, and outside [lower, 1] it gets no gradient.
        clip: False removes the clip entirely (the "no clip" ablation).
    Returns:
        (loss [B], outside [B] bool: rows whose ratio fell outside [lower, 1]).
    """
    outside = (ratio.detach() < lower) | (ratio.detach() > 1.0)
    weight = ratio.clamp(lower, 1.0) if clip else ratio
    if not clip:
        outside = torch.zeros_like(outside)
    loss = -weight * exponential_is_weight(ratio, alpha) * omega * advantage
    return loss, outside


def low_variance_kl(logp: Tensor, ref_logp: Tensor, bound: float = 10.0) -> Tensor:
    """k3 estimator of KL(pi_theta || pi_ref) per token: exp(q) - q - 1 with q = ref - logp.

    Clamped to [-bound, bound] like verl's low_var_kl so one extreme token cannot dominate.
    """
    q = (ref_logp - logp).clamp(-20.0, 20.0)
    return (q.exp() - q - 1.0).clamp(-bound, bound)
