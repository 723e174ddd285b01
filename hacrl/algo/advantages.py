"""Advantages (HACPO step 2 and the baselines' group-relative estimators).

All functions take binary (or real) verifier rewards shaped [n_agents, n_prompts, G]:
rewards[j, p, i] = R(y_i^(j)) for response i of agent j to prompt p.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hacrl.algo.capability import omega_matrix


def _group_stats(groups: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and unbiased std over the last dim; a group of one gets mean 0, std 1 (as verl)."""
    if groups.shape[-1] == 1:
        return torch.zeros_like(groups[..., 0]), torch.ones_like(groups[..., 0])
    return groups.mean(dim=-1), groups.std(dim=-1)


def _pooled(rewards: Tensor) -> Tensor:
    """[n_agents, P, G] -> [P, n*G]: every agent's samples of a prompt in one row."""
    n, p, g = rewards.shape
    return rewards.permute(1, 0, 2).reshape(p, n * g)


def group_relative_advantages(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """GRPO/GSPO: A = (R - mean) / (std + eps) within each agent's G samples of one prompt.

    Args:
        rewards: [n_agents, n_prompts, G].
    Returns:
        [n_agents, n_prompts, G].
    """
    mean, std = _group_stats(rewards)
    return (rewards - mean[..., None]) / (std[..., None] + eps)


def pooled_advantages(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """Naive sharing: one group-relative advantage over all n*G samples of a prompt.

    Args:
        rewards: [n_agents, n_prompts, G].
    Returns:
        [n_agents, n_prompts, G], the same value whichever agent trains on the sample.
    """
    n, p, g = rewards.shape
    pooled = _pooled(rewards)
    mean, std = _group_stats(pooled)
    adv = (pooled - mean[:, None]) / (std[:, None] + eps)
    return adv.reshape(p, n, g).permute(1, 0, 2)


def uniform_prompts(rewards: Tensor) -> Tensor:
    """[P] bool: prompts whose n*G rewards (all agents' samples of it) are all equal.

    Args:
        rewards: [n_agents, n_prompts, G].
    """
    pooled = _pooled(rewards)
    return (pooled == pooled[:, :1]).all(dim=-1)


def capability_aware_baseline(rewards: Tensor, omega: Tensor) -> Tensor:
    """mu^(k)(x) = 1/(nG) * sum_j sum_i omega^(k,j) R(y_i^(j))   (paper Eq. for mu_t^(k)).

    Args:
        rewards: [n_agents, n_prompts, G].
        omega: [n_agents, n_agents], omega[k, j] = P_k / P_j.
    Returns:
        [n_target, n_prompts] baseline of each target agent for each prompt.
    """
    per_source_mean = rewards.mean(dim=-1)  # [n_source, P]
    return (omega @ per_source_mean) / rewards.shape[0]


def capability_aware_advantages(
    rewards: Tensor,
    capability: Tensor,
    *,
    omega_clamp: tuple[float, float] | None = None,
    baseline_guard: bool = False,
    zero_uniform_groups: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """A^(k)(y_i^(j)) = (R(y_i^(j)) - mu^(k)(x)) / std(all n*G rewards of x), before omega modulation.

    Args:
        rewards: [n_agents, n_prompts, G].
        capability: [n_agents] smoothed P (strictly positive).
        omega_clamp: optional bounds on omega (as run: (0.1, 10)).
        baseline_guard: as run: where mu^(k) > 1, use the target's own mean reward instead.
        zero_uniform_groups: as run: advantage 0 for prompts whose n*G rewards are all equal.
        eps: added to the std.
    Returns:
        [n_target, n_source, n_prompts, G].
    """
    omega = omega_matrix(capability, omega_clamp)
    baseline = capability_aware_baseline(rewards, omega)  # [n_target, P]
    if baseline_guard:
        own_mean = rewards.mean(dim=-1)  # [n, P]; the target's own mean
        baseline = torch.where(baseline > 1.0, own_mean, baseline)
    _, std = _group_stats(_pooled(rewards))  # [P]
    adv = (rewards[None] - baseline[:, None, :, None]) / (std[None, None, :, None] + eps)
    if zero_uniform_groups:
        uniform = uniform_prompts(rewards)  # [P]
        adv = torch.where(uniform[None, None, :, None], torch.zeros_like(adv), adv)
    return adv


def degenerate_prompts(rewards: Tensor, advantages: Tensor) -> tuple[Tensor, Tensor]:
    """Prompts whose rewards have no spread and whose advantage is not 0 anyway.

    With all n*G rewards of a prompt equal, the std over them is 0; a capability-aware baseline
    mu^(k) that differs from the reward (agents' P differ) then gives A = (R - mu) / eps, e.g.
    -5e5 (the paper's formula taken literally: profile `bare`; `as_run` zeroes such prompts).

    Args:
        rewards: [n_agents, n_prompts, G].
        advantages: [n_target, n_source, n_prompts, G].
    Returns:
        (count [n_target]: such prompts in each target's advantages, largest [n_target]: the
        largest |A| on them, 0 where there are none).
    """
    uniform = uniform_prompts(rewards)  # [P]
    largest_per_prompt = advantages.abs().amax(dim=(1, 3))  # [n_target, P]
    degenerate = uniform[None, :] & (largest_per_prompt > 0)
    largest = torch.where(degenerate, largest_per_prompt, torch.zeros_like(largest_per_prompt))
    return degenerate.sum(dim=-1), largest.amax(dim=-1)


def broadcast_to_targets(adv: Tensor) -> Tensor:
    """[n_source, P, G] target-independent advantages -> [n_target, n_source, P, G]."""
    return adv[None].expand(adv.shape[0], *adv.shape)
