"""Degenerate inputs: no NaN / inf in values or gradients anywhere in the core."""

import pytest
import torch

from hacrl.algo.advantages import (
    capability_aware_advantages,
    group_relative_advantages,
    pooled_advantages,
)
from hacrl.algo.capability import CapabilityWindow, omega_matrix, smoothed_capability
from hacrl.algo.loss import LossBatch, LossConfig, policy_loss

AS_RUN = {"omega_clamp": (0.1, 10.0), "baseline_guard": True, "zero_uniform_groups": True}


def _finite(x):
    return bool(torch.isfinite(x).all())


@pytest.mark.parametrize("value", [0.0, 1.0])
@pytest.mark.parametrize("opts", [{}, AS_RUN])
def test_all_equal_rewards_give_finite_advantages(value, opts):
    rewards = torch.full((3, 4, 8), value)
    cap = smoothed_capability(rewards.mean(dim=(1, 2))[None], window=5)
    adv = capability_aware_advantages(rewards, cap, **opts)
    assert _finite(adv)
    if opts:
        assert adv.abs().max().item() == 0.0
    assert group_relative_advantages(rewards).abs().max().item() == 0.0
    assert pooled_advantages(rewards).abs().max().item() == 0.0


@pytest.mark.parametrize("n", [2, 3, 4])
def test_one_agent_scoring_zero_everywhere(n):
    g = torch.Generator().manual_seed(n)
    rewards = (torch.rand(n, 5, 4, generator=g) < 0.6).float()
    rewards[n - 1] = 0.0
    history = torch.stack([rewards.mean(dim=(1, 2))] * 6)  # P of the last agent would be 0
    cap = smoothed_capability(history, window=5)
    assert cap[n - 1].item() == pytest.approx(1e-2)
    omega = omega_matrix(cap)
    assert _finite(omega)
    for opts in ({}, AS_RUN):
        adv = capability_aware_advantages(rewards, cap, **opts)
        assert adv.shape == (n, n, 5, 4) and _finite(adv)
    win = CapabilityWindow(n, 5)
    for _ in range(3):
        p = win.update(torch.zeros(n))
    assert bool((p > 0).all())


def _batch(B, T, lengths, cross, own, seed=0, kl=True):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).float()
    old = -3 * torch.rand(B, T, generator=g) * mask
    src = -40 * torch.rand(B, generator=g)  # wildly off-policy sources included
    return LossBatch(
        response_mask=mask, old_logp=old, source_mean_logp=src,
        advantages=torch.randn(B, generator=g) * 1e5,  # e.g. (R - mu) / eps on a uniform prompt
        omega=torch.full((B,), 100.0), cross=torch.tensor(cross), own=torch.tensor(own),
        ref_logp=(old - 1.0) if kl else None)


CONFIGS = [
    LossConfig(kl_coef=0.001),
    LossConfig(ratio="token", loss_agg="token-mean", clip_low=0.2, clip_high=0.28, kl_coef=0.001),
    LossConfig(cross_clip=False, stepwise=False, alpha=3.0),
    LossConfig(alpha=0.0, loss_agg="token-mean"),
]


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize(
    "lengths,cross,own",
    [
        ([0, 3, 0, 5], [False, True, True, False], [True, False, False, True]),  # empty rows
        ([0, 0], [True, False], [False, True]),                                 # all empty
        ([4], [False], [True]),                                                  # single own row
        ([4], [True], [False]),                                                  # single cross row
        ([3, 5, 1], [False, False, True], [True, False, False]),                 # own/Naive/cross
    ],
)
def test_policy_loss_finite_values_and_gradients(cfg, lengths, cross, own):
    B, T = len(lengths), 6
    batch = _batch(B, T, lengths, cross, own)
    logp = (-torch.rand(B, T) * 30).requires_grad_(True)
    for m in (0, 3, 40):
        out = policy_loss(logp, batch, cfg, m)
        (grad,) = torch.autograd.grad(out.loss, logp)
        assert _finite(out.loss) and _finite(grad)
        assert all(v == v and abs(v) != float("inf") for v in out.metrics.values())
        assert (grad * (1 - batch.response_mask)).abs().max().item() == 0.0


def test_empty_response_has_ratio_one_and_no_gradient():
    batch = _batch(2, 4, [0, 0], [False, True], [True, False], kl=False)
    batch.source_mean_logp = torch.zeros(2)
    logp = torch.zeros(2, 4, requires_grad=True)
    out = policy_loss(logp, batch, LossConfig(), 0)
    assert out.s_homo.tolist() == [1.0] and out.s_hete.tolist() == [1.0]
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert grad.abs().max().item() == 0.0


def test_single_minibatch_selection_round_trip():
    batch = _batch(3, 5, [5, 2, 4], [False, True, False], [True, False, True])
    one = batch.select(torch.tensor([1]))
    assert one.response_mask.shape == (1, 5) and bool(one.cross.all())
    assert one.ref_logp is not None and one.ref_logp.shape == (1, 5)
    same = batch.to("cpu")
    assert torch.equal(same.advantages, batch.advantages)
