"""Importance ratios (HACPO step 4; GSPO's sequence ratio and GRPO's token ratio).

Log-probabilities are of response tokens only; `mask` is 1 on response tokens and 0 on padding.
A response of length 0 (all-zero mask) gets a mean log-prob of 0, hence a ratio of exactly 1.
"""

from __future__ import annotations

from torch import Tensor


def masked_mean(values: Tensor, mask: Tensor, dim: int = -1) -> Tensor:
    """Mean of `values` where `mask` is 1; 0 where the mask is empty (no NaN)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum(dim=dim) / mask.sum(dim=dim).clamp_min(1.0)


def mean_sequence_logprob(logp: Tensor, mask: Tensor) -> Tensor:
    """log pi(y)^(1/L): per-sequence mean token log-prob in one tokenizer's tokens.

    Args:
        logp: [B, T] token log-probs.  mask: [B, T].
    Returns:
        [B].
    """
    return masked_mean(logp, mask, dim=-1)


def sequence_log_ratio(target_logp: Tensor, target_mask: Tensor, source_mean_logp: Tensor) -> Tensor:
    """log s^(k,j)(y) = mean target log-prob over target tokens - mean source log-prob over source tokens.

    The two means are taken in each agent's own tokens, so the ratio is comparable across
    tokenizers (paper Eq. for s^(k,j); for j == k it is GSPO's sequence ratio).

    Args:
        target_logp: [B, T_k] current target-policy log-probs of y in k's tokens (with grad).
        target_mask: [B, T_k].
        source_mean_logp: [B] mean rollout-policy log-prob of y in j's tokens (no grad).
    Returns:
        [B] log s.
    """
    return mean_sequence_logprob(target_logp, target_mask) - source_mean_logp.detach()


def token_log_ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    """GRPO's per-token log ratio log pi_theta(y_t) - log pi_old(y_t), shapes [B, T]."""
    return logp - old_logp.detach()
