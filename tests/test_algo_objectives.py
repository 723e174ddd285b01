"""HACPO steps 4-6 per sample: ratios, stepwise bound, borrowed loss, clipped surrogate, k3 KL."""

import math

import pytest
import torch

from hacrl.algo.objectives import (
    borrowed_sample_loss,
    clipped_surrogate_loss,
    exponential_is_weight,
    low_variance_kl,
    stepwise_lower_bound,
)
from hacrl.algo.ratios import (
    masked_mean,
    mean_sequence_logprob,
    sequence_log_ratio,
    token_log_ratio,
)

F64 = torch.float64


def _t(x, grad=False):
    return torch.tensor(x, dtype=F64, requires_grad=grad)


# ----- ratios (step 4) --------------------------------------------------------------------------

def test_sequence_ratio_normalises_each_side_by_its_own_tokenizer_length():
    # Target tokens (k's tokenizer): 3 and 2 real tokens (padded to T_k = 4).
    target_logp = _t([[-0.5, -1.0, -1.5, 99.0], [-2.0, -4.0, 7.0, 7.0]], grad=True)
    target_mask = _t([[1, 1, 1, 0], [1, 1, 0, 0]])
    # Source tokens (j's tokenizer): 5 and 6 real tokens, a different length from the target's.
    source_logp = _t([[-1, -2, -3, -4, -5, 0], [-1, -1, -1, -1, -1, -1]])
    source_mask = _t([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    src_mean = mean_sequence_logprob(source_logp, source_mask)
    assert src_mean.tolist() == pytest.approx([-3.0, -1.0])
    log_s = sequence_log_ratio(target_logp, target_mask, src_mean)
    # pi_k(y)^(1/L_k) / pi_j(y)^(1/L_j): row 0 exp(-1 - (-3)), row 1 exp(-3 - (-1)).
    assert log_s.exp().tolist() == pytest.approx([math.exp(2.0), math.exp(-2.0)])
    # Not the un-normalised ratio exp(sum_k - sum_j) (= exp(12) for row 0).
    assert log_s[0].item() != pytest.approx(-3.0 + 15.0)
    log_s.sum().backward()
    # d log s / d logp_t = 1/L_k on real tokens, 0 on padding.
    assert target_logp.grad.tolist()[0] == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0.0])
    assert target_logp.grad.tolist()[1] == pytest.approx([0.5, 0.5, 0.0, 0.0])


def test_sequence_ratio_passes_no_gradient_to_the_source():
    src = _t([-1.0], grad=True)
    logp = _t([[-1.0, -2.0]], grad=True)
    sequence_log_ratio(logp, torch.ones(1, 2, dtype=F64), src).sum().backward()
    assert src.grad is None


def test_self_ratio_is_gspo_ratio():
    logp = _t([[-1.0, -2.0, -3.0]])
    old = _t([[-1.1, -2.2, -2.7]])
    mask = torch.ones(1, 3, dtype=F64)
    s = sequence_log_ratio(logp, mask, mean_sequence_logprob(old, mask)).exp()
    assert s.item() == pytest.approx(math.exp((0.1 + 0.2 - 0.3) / 3))


def test_token_ratio_and_masked_mean():
    logp = _t([[-1.0, -2.0]], grad=True)
    old = _t([[-1.5, -1.0]], grad=True)
    r = token_log_ratio(logp, old)
    assert r[0].tolist() == pytest.approx([0.5, -1.0])
    r.sum().backward()
    assert old.grad is None and logp.grad.tolist() == [[1.0, 1.0]]
    # An empty response has mean 0 (ratio exactly 1), not NaN.
    assert masked_mean(_t([[3.0, 4.0], [1.0, 2.0]]), _t([[0, 0], [1, 0]])).tolist() == [0.0, 1.0]


# ----- stepwise lower bound (step 6) -------------------------------------------------------------

def test_stepwise_lower_bound_tightens_per_update_and_caps_at_one():
    got = [stepwise_lower_bound(m, 0.2, 0.025) for m in range(4)]
    assert got == pytest.approx([0.8, 0.825, 0.85, 0.875])
    assert stepwise_lower_bound(8, 0.2, 0.025) == pytest.approx(1.0)
    assert stepwise_lower_bound(9, 0.2, 0.025) == 1.0
    assert stepwise_lower_bound(50, 0.2, 0.025) == 1.0
    assert stepwise_lower_bound(3, 0.3, 0.05) == pytest.approx(0.85)


def test_no_stepwise_keeps_lower_bound_fixed():
    assert [stepwise_lower_bound(m, 0.2, 0.025, stepwise=False) for m in range(5)] == \
        pytest.approx([0.8] * 5)
    with pytest.raises(ValueError):
        stepwise_lower_bound(-1, 0.2, 0.025)


# ----- own-sample clipped surrogate ---------------------------------------------------------------

def test_clipped_surrogate_hand_values():
    r = _t([0.5, 1.0002, 1.001, 0.999, 1.001, 0.5], grad=True)
    a = _t([1.0, 1.0, -1.0, 1.0, 1.0, -1.0])
    loss, clipped = clipped_surrogate_loss(r, a, 3e-4, 4e-4)
    # max(-A r, -A clip(r, 0.9997, 1.0004)): the clip only bites in the improving direction
    # (r above 1 + eps_high with A > 0, r below 1 - eps_low with A < 0).
    assert loss.tolist() == pytest.approx([-0.5, -1.0002, 1.001, -0.999, -1.0004, 0.9997])
    assert clipped.tolist() == [False, False, False, False, True, True]
    loss.sum().backward()
    assert r.grad.tolist() == pytest.approx([-1.0, -1.0, 1.0, -1.0, 0.0, 0.0])


# ----- exponential importance sampling (step 5) and the borrowed loss ------------------------------

def test_exponential_is_weight_only_below_one_and_detached():
    s = _t([0.5, 0.9, 1.0, 2.0], grad=True)
    w = exponential_is_weight(s, 2.0)
    assert w.tolist() == pytest.approx([0.25, 0.81, 1.0, 1.0])
    assert not w.requires_grad
    assert exponential_is_weight(s, 0.0).tolist() == [1.0] * 4


def test_borrowed_loss_hand_values_and_gradients():
    s = _t([0.5, 0.9, 0.95, 1.2], grad=True)
    a = _t([1.0, -2.0, 0.5, 1.0])
    omega = _t([2.0, 0.5, 1.0, 3.0])
    loss, outside = borrowed_sample_loss(s, a, omega, alpha=1.0, lower=0.8)
    # -clip(s, 0.8, 1) * sg(s)^1 [s<1] * omega * A
    assert loss.tolist() == pytest.approx([-0.8 * 0.5 * 2.0, 0.9 * 0.9 * 0.5 * 2.0,
                                           -0.95 * 0.95 * 0.5, -3.0])
    assert outside.tolist() == [True, False, False, True]
    loss.sum().backward()
    # Inside (lower, 1): d/ds = -(s^alpha) * omega * A (sg blocks the s^alpha factor);
    # outside [lower, 1]: zero gradient.
    assert s.grad.tolist() == pytest.approx([0.0, 0.9 * 0.5 * 2.0, -0.95 * 0.5, 0.0])


@pytest.mark.parametrize("alpha", [1.0, 2.0, 3.0])
def test_borrowed_loss_gradient_is_not_that_of_s_to_the_one_plus_alpha(alpha):
    s = _t([0.85, 0.9, 0.97], grad=True)
    a, omega = _t([1.5, -0.7, 2.0]), _t([1.3, 0.4, 1.0])
    loss, _ = borrowed_sample_loss(s, a, omega, alpha=alpha, lower=0.8)
    (grad,) = torch.autograd.grad(loss.sum(), s)
    sv = s.detach()
    torch.testing.assert_close(grad, -(sv ** alpha) * omega * a)
    without_sg = -(1 + alpha) * sv ** alpha * omega * a
    assert not torch.allclose(grad, without_sg)


@pytest.mark.parametrize("lower", [0.8, 0.875])
def test_borrowed_samples_outside_range_get_no_gradient(lower):
    s = _t([0.1, 0.5, lower - 1e-3, 1.0 + 1e-3, 1.5, 40.0], grad=True)
    loss, outside = borrowed_sample_loss(s, torch.ones(6, dtype=F64), torch.full((6,), 2.0,
                                         dtype=F64), alpha=1.0, lower=lower)
    (grad,) = torch.autograd.grad(loss.sum(), s)
    assert grad.abs().max().item() == 0.0
    assert bool(outside.all())


@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.0, 3.0])
@pytest.mark.parametrize("lower", [0.8, 0.9, 1.0])
def test_borrowed_sample_effective_weight_never_above_one(alpha, lower):
    s = torch.cat([torch.linspace(1e-4, 5.0, 400, dtype=F64), _t([1.0, lower])])
    ones = torch.ones_like(s)
    loss, _ = borrowed_sample_loss(s, ones, ones, alpha=alpha, lower=lower)
    weight = -loss  # clip(s, lower, 1) * sg(s)^alpha with omega = A = 1
    assert weight.max().item() <= 1.0 + 1e-12
    assert weight.min().item() >= 0.0
    # And the weight really is clip(s) * s^alpha below 1, clip(s) above.
    expected = s.clamp(lower, 1.0) * torch.where(s < 1, s ** alpha, ones)
    torch.testing.assert_close(weight, expected)


def test_no_clip_variant_passes_gradient_everywhere_including_above_one():
    s = _t([0.3, 0.9, 1.5, 3.0], grad=True)
    a, omega = _t([1.0, 1.0, -1.0, 2.0]), _t([2.0, 1.0, 0.5, 1.0])
    loss, outside = borrowed_sample_loss(s, a, omega, alpha=1.0, lower=0.8, clip=False)
    assert not bool(outside.any())
    assert loss.tolist() == pytest.approx([-0.3 * 0.3 * 2.0, -0.81, 1.5 * 0.5, -6.0])
    (grad,) = torch.autograd.grad(loss.sum(), s)
    assert grad.tolist() == pytest.approx([-0.3 * 2.0, -0.9, 0.5, -2.0])
    assert grad[2].item() != 0.0 and grad[3].item() != 0.0


# ----- low-variance KL (k3) ------------------------------------------------------------------------

def test_low_variance_kl_hand_values_and_gradient():
    logp = _t([[-1.0, -2.0, -0.3]], grad=True)
    ref = _t([[-1.5, -2.0, -0.1]])
    kl = low_variance_kl(logp, ref)
    q = [-0.5, 0.0, 0.2]
    assert kl.tolist()[0] == pytest.approx([math.exp(x) - x - 1 for x in q])
    assert bool((kl >= 0).all())
    (grad,) = torch.autograd.grad(kl.sum(), logp)
    assert grad.tolist()[0] == pytest.approx([1 - math.exp(x) for x in q])
    # verl clamps the estimate to [-10, 10].
    assert low_variance_kl(_t([[-30.0]]), _t([[-5.0]])).item() == pytest.approx(10.0)


def test_low_variance_kl_is_unbiased_for_kl_under_the_policy():
    # E_{y ~ pi}[k3(y)] = KL(pi || ref), exactly, for a discrete distribution.
    pi = _t([0.5, 0.3, 0.15, 0.05])
    ref = _t([0.25, 0.25, 0.25, 0.25])
    k3 = low_variance_kl(pi.log()[None], ref.log()[None])[0]
    assert (pi * k3).sum().item() == pytest.approx((pi * (pi / ref).log()).sum().item(), rel=1e-12)
