"""HACPO step 2 and the baselines' advantages, against hand-computed values and a loop reference."""

import math
import statistics

import pytest
import torch

from hacrl.algo.advantages import (
    broadcast_to_targets,
    capability_aware_advantages,
    capability_aware_baseline,
    group_relative_advantages,
    pooled_advantages,
)
from hacrl.algo.capability import omega_matrix

EPS = 1e-6
F64 = torch.float64


def _t(x):
    return torch.tensor(x, dtype=F64)


def test_group_relative_advantages_hand_values():
    rewards = _t([[[1, 0, 0, 1], [1, 1, 1, 0]], [[0, 0, 0, 0], [0, 1, 0, 0]]])
    adv = group_relative_advantages(rewards)
    assert adv.shape == rewards.shape
    s1 = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]
    a1 = 0.5 / (s1 + EPS)
    assert adv[0, 0].tolist() == pytest.approx([a1, -a1, -a1, a1])
    # [1,1,1,0]: mean 0.75, unbiased var (3*0.0625 + 0.5625)/3 = 0.25 -> std 0.5.
    assert adv[0, 1].tolist() == pytest.approx([0.25 / (0.5 + EPS)] * 3 + [-0.75 / (0.5 + EPS)])
    assert adv[1, 0].tolist() == [0.0] * 4  # all equal -> 0, no NaN
    s4 = math.sqrt(0.75 / 3)  # [0,1,0,0]: mean 0.25, squared deviations sum 0.75
    assert adv[1, 1].tolist() == pytest.approx(
        [-0.25 / (s4 + EPS), 0.75 / (s4 + EPS), -0.25 / (s4 + EPS), -0.25 / (s4 + EPS)])


def test_group_relative_advantages_eps_is_added_to_unbiased_std():
    # Tiny spread: std ~7.07e-7 so the eps placement changes the value a lot.
    adv = group_relative_advantages(_t([[[0.0, 1e-6]]]))
    std = statistics.stdev([0.0, 1e-6])  # ddof = 1
    assert adv[0, 0, 1].item() == pytest.approx(5e-7 / (std + 1e-6), rel=1e-9)
    assert adv[0, 0, 1].item() == pytest.approx(0.29289, rel=1e-4)
    adv = group_relative_advantages(_t([[[0.0, 1e-6]]]), eps=0.0)
    assert adv[0, 0, 1].item() == pytest.approx(1 / math.sqrt(2), rel=1e-9)


def test_group_of_one_gets_mean_zero_std_one():
    adv = group_relative_advantages(_t([[[1.0], [0.0]]]))
    assert adv.flatten().tolist() == pytest.approx([1 / (1 + EPS), 0.0])


def test_pooled_advantages_one_group_over_all_agents_samples():
    # Agent 0: [1, 1, 0]; agent 1: [0, 0, 0] -> pooled [1,1,0,0,0,0].
    rewards = _t([[[1, 1, 0]], [[0, 0, 0]]])
    adv = pooled_advantages(rewards)
    assert adv.shape == (2, 1, 3)
    std = math.sqrt(4 / 15)  # squared deviations 2*(4/9) + 4*(1/9) = 4/3, / (6-1)
    hi, lo = (1 - 1 / 3) / (std + EPS), (0 - 1 / 3) / (std + EPS)
    assert adv[0, 0].tolist() == pytest.approx([hi, hi, lo])
    assert adv[1, 0].tolist() == pytest.approx([lo, lo, lo])
    # Differs from per-agent group-relative advantages (agent 1's group alone is uniform).
    assert group_relative_advantages(rewards)[1].abs().max().item() == 0.0


# Two agents, G = 2, two prompts. capability [0.6, 0.3] -> omega = [[1, 2], [0.5, 1]].
REWARDS = [[[1, 0], [1, 1]],   # agent 0: prompt 0, prompt 1
           [[1, 1], [1, 1]]]   # agent 1
CAP = [0.6, 0.3]


def test_capability_aware_baseline_hand_values():
    base = capability_aware_baseline(_t(REWARDS), omega_matrix(_t(CAP)))
    # prompt 0: agent means 0.5 and 1.  mu^(0) = (1*0.5 + 2*1)/2, mu^(1) = (0.5*0.5 + 1*1)/2
    # prompt 1: agent means 1 and 1.    mu^(0) = (1 + 2)/2,       mu^(1) = (0.5 + 1)/2
    assert base.tolist()[0] == pytest.approx([1.25, 1.5])
    assert base.tolist()[1] == pytest.approx([0.625, 0.75])


def test_capability_aware_advantages_hand_values_and_layout():
    adv = capability_aware_advantages(_t(REWARDS), _t(CAP))
    assert adv.shape == (2, 2, 2, 2)  # [n_target, n_source, n_prompts, G]
    d = 0.5 + EPS  # prompt 0 pooled [1,0,1,1]: unbiased std 0.5
    assert adv[0, 0, 0].tolist() == pytest.approx([(1 - 1.25) / d, (0 - 1.25) / d])
    assert adv[0, 1, 0].tolist() == pytest.approx([(1 - 1.25) / d] * 2)
    assert adv[1, 0, 0].tolist() == pytest.approx([(1 - 0.625) / d, (0 - 0.625) / d])
    assert adv[1, 1, 0].tolist() == pytest.approx([(1 - 0.625) / d] * 2)
    # Prompt 1 is uniform (std 0): the bare paper formula gives (R - mu)/eps, huge but finite.
    assert adv[0, :, 1].flatten().tolist() == pytest.approx([(1 - 1.5) / EPS] * 4)
    assert adv[1, :, 1].flatten().tolist() == pytest.approx([(1 - 0.75) / EPS] * 4)


def test_baseline_guard_uses_target_own_mean_when_baseline_exceeds_one():
    adv = capability_aware_advantages(_t(REWARDS), _t(CAP), baseline_guard=True)
    d = 0.5 + EPS
    # Target 0, prompt 0: mu = 1.25 > 1 -> its own mean 0.5.
    assert adv[0, 0, 0].tolist() == pytest.approx([0.5 / d, -0.5 / d])
    assert adv[0, 1, 0].tolist() == pytest.approx([0.5 / d, 0.5 / d])
    # Target 1 (mu = 0.625 <= 1) is untouched.
    assert adv[1, 0, 0].tolist() == pytest.approx([0.375 / d, -0.625 / d])
    # Prompt 1: target 0's mu = 1.5 -> own mean 1 -> zero; target 1's mu = 0.75 stays.
    assert adv[0, :, 1].abs().max().item() == pytest.approx(0.0)
    assert adv[1, :, 1].flatten().tolist() == pytest.approx([0.25 / EPS] * 4)


def test_zero_uniform_groups_zeroes_prompts_whose_pooled_rewards_are_equal():
    adv = capability_aware_advantages(_t(REWARDS), _t(CAP), zero_uniform_groups=True)
    assert adv[:, :, 1].abs().max().item() == 0.0
    d = 0.5 + EPS
    assert adv[0, 0, 0].tolist() == pytest.approx([-0.25 / d, -1.25 / d])
    # A prompt uniform within one agent but not across agents is NOT zeroed.
    r = _t([[[0, 0]], [[1, 0]]])
    adv = capability_aware_advantages(r, _t([0.5, 0.5]), zero_uniform_groups=True)
    assert adv[0, 0, 0].abs().min().item() > 0.1


def test_omega_clamp_option_changes_baseline():
    r = _t([[[1, 0]], [[0, 1]]])  # both agents mean 0.5; pooled std sqrt(1/3)
    cap = _t([0.9, 0.05])         # raw omega [[1, 18], [1/18, 1]] -> clamped [[1, 10], [0.1, 1]]
    d = math.sqrt(1 / 3) + EPS
    raw = capability_aware_advantages(r, cap)
    assert raw[0, 0, 0, 0].item() == pytest.approx((1 - 0.5 * (0.5 + 9.0)) / d)
    assert raw[1, 0, 0, 0].item() == pytest.approx((1 - 0.5 * (0.5 / 18 + 0.5)) / d)
    cl = capability_aware_advantages(r, cap, omega_clamp=(0.1, 10.0))
    assert cl[0, 0, 0, 0].item() == pytest.approx((1 - 0.5 * (0.5 + 5.0)) / d)
    assert cl[1, 0, 0, 0].item() == pytest.approx((1 - 0.5 * (0.05 + 0.5)) / d)


def _reference(rewards, cap, clamp=None, guard=False, zero=False):
    """Loops straight from the paper's equations (plus the as-run switches)."""
    n, P, G = len(rewards), len(rewards[0]), len(rewards[0][0])
    out = [[[[0.0] * G for _ in range(P)] for _ in range(n)] for _ in range(n)]
    for p in range(P):
        pooled = [rewards[j][p][i] for j in range(n) for i in range(G)]
        std = statistics.stdev(pooled)
        for k in range(n):
            mu = 0.0
            for j in range(n):
                w = cap[k] / cap[j]
                if clamp is not None:
                    w = min(max(w, clamp[0]), clamp[1])
                mu += sum(w * rewards[j][p][i] for i in range(G))
            mu /= n * G
            if guard and mu > 1:
                mu = sum(rewards[k][p]) / G
            for j in range(n):
                for i in range(G):
                    a = (rewards[j][p][i] - mu) / (std + EPS)
                    out[k][j][p][i] = 0.0 if (zero and len(set(pooled)) == 1) else a
    return out


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("opts", [{}, {"clamp": (0.1, 10.0), "guard": True, "zero": True}])
def test_capability_aware_advantages_match_loop_reference(n, opts):
    g = torch.Generator().manual_seed(100 + n)
    rewards = (torch.rand(n, 6, 4, generator=g) < torch.linspace(0.1, 0.9, n)[:, None, None])
    rewards = rewards.to(F64)
    rewards[:, 0] = 1.0  # one uniform prompt (all correct)
    rewards[:, 1] = 0.0  # one uniform prompt (all wrong)
    cap = [0.03, 0.8, 0.4, 0.25][:n]
    got = capability_aware_advantages(
        rewards, _t(cap), omega_clamp=opts.get("clamp"), baseline_guard=opts.get("guard", False),
        zero_uniform_groups=opts.get("zero", False))
    ref = _reference(rewards.tolist(), cap, opts.get("clamp"), opts.get("guard", False),
                     opts.get("zero", False))
    assert got.shape == (n, n, 6, 4)
    torch.testing.assert_close(got, _t(ref), rtol=1e-9, atol=1e-9)


def test_equal_capabilities_reduce_to_the_pooled_advantage():
    g = torch.Generator().manual_seed(7)
    rewards = (torch.rand(3, 5, 8, generator=g) < 0.5).to(F64)
    adv = capability_aware_advantages(rewards, _t([0.4, 0.4, 0.4]))
    pooled = rewards.permute(1, 0, 2).reshape(5, 24)
    expected = (rewards - pooled.mean(-1)[None, :, None]) / (pooled.std(-1)[None, :, None] + EPS)
    for k in range(3):
        torch.testing.assert_close(adv[k], expected)


def test_broadcast_to_targets_repeats_for_every_target():
    a = torch.arange(12, dtype=F64).reshape(3, 2, 2)
    b = broadcast_to_targets(a)
    assert b.shape == (3, 3, 2, 2)
    for k in range(3):
        assert torch.equal(b[k], a)
