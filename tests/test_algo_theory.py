"""Monte-Carlo check of the paper's theorem: with the true success probabilities as capabilities,
the capability-aware baseline mu^(k)(x) is unbiased for agent k's expected reward p_k."""

import math

import pytest
import torch

from hacrl.algo.advantages import capability_aware_advantages, capability_aware_baseline
from hacrl.algo.capability import omega_matrix

N_PROMPTS, G = 20000, 8


def _simulate(p, seed):
    g = torch.Generator().manual_seed(seed)
    probs = torch.tensor(p, dtype=torch.float64)[:, None, None].expand(len(p), N_PROMPTS, G)
    return torch.bernoulli(probs, generator=g), torch.tensor(p, dtype=torch.float64)


def _sigma(p, k):
    """Std of the prompt-average of mu^(k): Var mu^(k)(x) = sum_j (p_k/p_j)^2 p_j(1-p_j) / (G n^2)."""
    n = len(p)
    var = sum((p[k] / pj) ** 2 * pj * (1 - pj) for pj in p) / (G * n * n)
    return math.sqrt(var / N_PROMPTS)


@pytest.mark.parametrize("p", [[0.3, 0.7], [0.15, 0.5, 0.85]])
def test_oracle_capability_baseline_is_unbiased(p):
    rewards, cap = _simulate(p, seed=1234 + len(p))
    mu = capability_aware_baseline(rewards, omega_matrix(cap))  # [n, P]
    for k in range(len(p)):
        tol = 5 * _sigma(p, k)
        assert abs(mu[k].mean().item() - p[k]) < tol, (k, mu[k].mean().item(), p[k], tol)
        # Same statement through the advantage: E[R^(k) - mu^(k)(x)] = 0 over k's own samples.
        assert abs((rewards[k].mean(-1) - mu[k]).mean().item()) < tol + 5 * math.sqrt(
            p[k] * (1 - p[k]) / (G * N_PROMPTS))


@pytest.mark.parametrize("p", [[0.3, 0.7], [0.15, 0.5, 0.85]])
def test_plain_pooled_baseline_is_biased_for_heterogeneous_agents(p):
    # Negative control: the check above has the power to detect a biased baseline.
    rewards, _ = _simulate(p, seed=99)
    pooled_mu = rewards.mean(dim=(0, 2))  # one mean over all n*G samples of each prompt
    for k in range(len(p)):
        bias = abs(sum(p) / len(p) - p[k])
        if bias > 0.05:
            assert abs(pooled_mu.mean().item() - p[k]) > 20 * _sigma(p, k)


def test_oracle_advantage_numerator_is_centred_per_target():
    # Via the full advantage with G large: std(all nG rewards) is almost constant per prompt,
    # so the mean advantage of k's own samples is ~0 while the source's is not.
    p = [0.25, 0.75]
    g = torch.Generator().manual_seed(5)
    probs = torch.tensor(p, dtype=torch.float64)[:, None, None].expand(2, 4000, 64)
    rewards = torch.bernoulli(probs, generator=g)
    adv = capability_aware_advantages(rewards, torch.tensor(p, dtype=torch.float64))
    for k in range(2):
        assert abs(adv[k, k].mean().item()) < 0.02
    # Target 0 borrowing from the stronger agent 1: those samples look better than its baseline.
    assert adv[0, 1].mean().item() > 0.5
    assert adv[1, 0].mean().item() < -0.5
