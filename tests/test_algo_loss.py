"""policy_loss against independent GSPO / PPO / HACPO references written here from PAPER.md."""

import math

import pytest
import torch

from hacrl.algo.loss import LossBatch, LossConfig, aggregate, policy_loss

F64 = torch.float64
CLIP_LO, CLIP_HI = 3e-4, 4e-4


def _t(x):
    return torch.tensor(x, dtype=F64)


def _mask(lengths, T):
    return (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).to(F64)


def _mean(x, mask):
    return (x * mask).sum(-1) / mask.sum(-1)


def _batch(mask, old, src_mean, adv, omega, cross, own, ref=None):
    return LossBatch(response_mask=mask, old_logp=old, source_mean_logp=src_mean,
                     advantages=adv, omega=omega, cross=torch.tensor(cross),
                     own=torch.tensor(own), ref_logp=ref)


def _loss_and_grad(fn, logp):
    x = logp.detach().clone().requires_grad_(True)
    loss = fn(x)
    (g,) = torch.autograd.grad(loss, x)
    return loss.detach(), g


# ----- independent references --------------------------------------------------------------------

def gspo_rows(logp, old, mask, adv, lo=CLIP_LO, hi=CLIP_HI):
    """Per-sequence GSPO loss: max(-A s, -A clip(s, 1-lo, 1+hi)), s = exp(mean_t(logp - old))."""
    s = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))
    return torch.maximum(-adv * s, -adv * torch.clamp(s, 1 - lo, 1 + hi))


def hacpo_cross_rows(logp, mask, src_mean, adv, omega, alpha, lower):
    """Per-sequence J_hete loss: -clip(s, lower, 1) * sg(s)^alpha [s<1] * omega * A."""
    s = torch.exp(_mean(logp, mask) - src_mean)
    sd = s.detach()
    factor = torch.where(sd < 1, sd ** alpha, torch.ones_like(sd))
    return -torch.clamp(s, lower, 1.0) * factor * omega * adv


# ----- fixtures ------------------------------------------------------------------------------------

def _own_rows(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths, T = [5, 3, 4, 1, 5, 2], 5
    mask = _mask(lengths, T)
    old = -3 * torch.rand(6, T, generator=g, dtype=F64)
    d = _t([0.0, 2e-4, -2e-4, 1e-3, -1e-3, 5e-4])
    noise = 1e-4 * (torch.rand(6, T, generator=g, dtype=F64) - 0.5)
    logp = (old + d[:, None] + noise) * mask + 7.0 * (1 - mask)  # junk on padding
    adv = _t([1.0, -1.0, 1.0, 1.0, -1.0, -0.5])
    return logp, old, mask, adv


S_CROSS = [0.5, 0.9, 0.95, 1.1]


def _cross_rows(seed=1):
    g = torch.Generator().manual_seed(seed)
    lengths, T = [4, 2, 5, 3], 5
    mask = _mask(lengths, T)
    logp = -2 * torch.rand(4, T, generator=g, dtype=F64) * mask
    src_mean = _mean(logp, mask) - torch.log(_t(S_CROSS))  # source mean in the source's tokens
    adv = _t([1.0, -2.0, 0.5, 1.0])
    omega = _t([2.0, 0.5, 1.0, 3.0])
    return logp, mask, src_mean, adv, omega


def _mixed(kl=False):
    lo, oo, mo, ao = _own_rows()
    lc, mc, sc, ac, wc = _cross_rows()
    logp = torch.cat([lo, lc])
    mask = torch.cat([mo, mc])
    old = torch.cat([oo, torch.zeros_like(lc)])          # cross rows: 0 (documented)
    src = torch.cat([_mean(oo, mo), sc])
    ref = logp.detach() + 0.3 * torch.sin(torch.arange(logp.numel(), dtype=F64)).reshape(logp.shape)
    batch = _batch(mask, old, src, torch.cat([ao, ac]), torch.cat([torch.ones(6, dtype=F64), wc]),
                   [False] * 6 + [True] * 4, [True] * 6 + [False] * 4, ref if kl else None)
    return logp, batch


# ----- own rows --------------------------------------------------------------------------------------

def test_own_rows_equal_gspo_reference_values_and_gradients():
    logp, old, mask, adv = _own_rows()
    # source_mean_logp deliberately inconsistent: own rows must use old_logp.
    batch = _batch(mask, old, torch.full((6,), 5.0, dtype=F64), adv, torch.ones(6, dtype=F64),
                   [False] * 6, [True] * 6)
    cfg = LossConfig(ratio="sequence", clip_low=CLIP_LO, clip_high=CLIP_HI)
    got, g_got = _loss_and_grad(lambda x: policy_loss(x, batch, cfg, 0).loss, logp)
    want, g_want = _loss_and_grad(lambda x: gspo_rows(x, old, mask, adv).mean(), logp)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_got, g_want, rtol=1e-10, atol=1e-12)
    # The test is sharp: some rows are clipped (zero gradient), some are not.
    row_grad = g_want.abs().sum(-1)
    assert (row_grad == 0).any() and (row_grad > 0).any()
    assert (g_got * (1 - mask)).abs().max().item() == 0.0  # no gradient on padding
    out = policy_loss(logp, batch, cfg, 0)
    s_ref = torch.exp(_mean(logp - old, mask))
    torch.testing.assert_close(out.s_homo, s_ref)
    assert out.s_hete.numel() == 0


def test_grpo_token_mode_equals_token_mean_ppo_reference():
    g = torch.Generator().manual_seed(3)
    lengths, T = [6, 2, 4, 5], 6
    mask = _mask(lengths, T)
    old = -2 * torch.rand(4, T, generator=g, dtype=F64)
    logp = old + 0.3 * torch.randn(4, T, generator=g, dtype=F64)
    adv = _t([1.0, -1.0, 0.7, -0.2])
    batch = _batch(mask, old, _mean(old, mask), adv, torch.ones(4, dtype=F64), [False] * 4,
                   [True] * 4)
    cfg = LossConfig(ratio="token", loss_agg="token-mean", clip_low=0.2, clip_high=0.28)

    def ref(x):
        r = torch.exp(x - old)
        a = adv[:, None]
        per_tok = torch.maximum(-a * r, -a * torch.clamp(r, 0.8, 1.28))
        return (per_tok * mask).sum() / mask.sum()

    got, g_got = _loss_and_grad(lambda x: policy_loss(x, batch, cfg, 0).loss, logp)
    want, g_want = _loss_and_grad(ref, logp)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_got, g_want, rtol=1e-10, atol=1e-12)
    real = mask.bool()
    assert (g_want[real] == 0).any() and (g_want[real] != 0).any()
    # Token-mean: a long row weighs more than a short one, unlike seq-mean-token-mean.
    assert not torch.allclose(got, policy_loss(logp, batch, LossConfig(
        ratio="token", loss_agg="seq-mean-token-mean", clip_low=0.2, clip_high=0.28), 0).loss)


def test_naive_rows_use_targets_old_logp_and_self_clip_not_the_source_policy():
    logp, old, mask, adv = _own_rows()
    # Naive borrowed rows: cross=False, own=False; source_mean_logp carries the *source's* rollout
    # mean (far away) which Naive must ignore.
    batch = _batch(mask, old, _mean(old, mask) - 0.7, adv, torch.ones(6, dtype=F64),
                   [False] * 6, [False] * 6)
    cfg = LossConfig()
    got, g_got = _loss_and_grad(lambda x: policy_loss(x, batch, cfg, 0).loss, logp)
    want, g_want = _loss_and_grad(lambda x: gspo_rows(x, old, mask, adv).mean(), logp)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(g_got, g_want)


# ----- cross rows and mixing -------------------------------------------------------------------------

@pytest.mark.parametrize("alpha", [0.0, 1.0, 2.0])
def test_cross_rows_equal_hacpo_reference(alpha):
    logp, mask, src, adv, omega = _cross_rows()
    batch = _batch(mask, torch.zeros_like(logp), src, adv, omega, [True] * 4, [False] * 4)
    cfg = LossConfig(alpha=alpha)
    got, g_got = _loss_and_grad(lambda x: policy_loss(x, batch, cfg, 0).loss, logp)
    want, g_want = _loss_and_grad(
        lambda x: hacpo_cross_rows(x, mask, src, adv, omega, alpha, 0.8).mean(), logp)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(g_got, g_want)
    # s = 0.5 (below 0.8) and s = 1.1 (above 1) get no gradient; 0.9 and 0.95 do.
    row_grad = g_got.abs().sum(-1)
    assert row_grad[0] == 0 and row_grad[3] == 0 and row_grad[1] > 0 and row_grad[2] > 0
    out = policy_loss(logp, batch, cfg, 0)
    assert out.s_hete.tolist() == pytest.approx(S_CROSS)
    assert out.metrics["clip/borrowed_frac"] == pytest.approx(0.5)


def test_mixed_minibatch_is_row_weighted_combination_seq_mean():
    logp, batch = _mixed()
    cfg = LossConfig()
    own_idx, cross_idx = torch.arange(6), torch.arange(6, 10)
    full, g_full = _loss_and_grad(lambda x: policy_loss(x, batch, cfg, 0).loss, logp)
    l_own, g_own = _loss_and_grad(
        lambda x: policy_loss(x, batch.select(own_idx), cfg, 0).loss, logp[own_idx])
    l_cross, g_cross = _loss_and_grad(
        lambda x: policy_loss(x, batch.select(cross_idx), cfg, 0).loss, logp[cross_idx])
    torch.testing.assert_close(full, (6 * l_own + 4 * l_cross) / 10)
    torch.testing.assert_close(g_full, torch.cat([6 * g_own, 4 * g_cross]) / 10)
    # And against the references directly: J = -(J_homo + J_hete) over one shared mean.
    lo, oo, mo, ao = _own_rows()
    lc, mc, sc, ac, wc = _cross_rows()
    ref = (gspo_rows(lo, oo, mo, ao).sum() + hacpo_cross_rows(lc, mc, sc, ac, wc, 1.0, 0.8).sum()) / 10
    torch.testing.assert_close(full, ref)


def test_mixed_minibatch_token_mean_weights_rows_by_length():
    logp, batch = _mixed()
    cfg = LossConfig(loss_agg="token-mean")
    mask = batch.response_mask
    per_row_own = gspo_rows(*_own_rows()[:3], _own_rows()[3])
    lc, mc, sc, ac, wc = _cross_rows()
    per_row = torch.cat([per_row_own, hacpo_cross_rows(lc, mc, sc, ac, wc, 1.0, 0.8)])
    ref = (per_row * mask.sum(-1)).sum() / mask.sum()
    torch.testing.assert_close(policy_loss(logp, batch, cfg, 0).loss, ref)


def test_kl_term_applies_to_own_rows_only():
    logp, batch = _mixed(kl=True)
    # Rows 4, 5 become Naive borrowed rows: own-like objective, but no KL.
    batch.own = torch.tensor([True] * 4 + [False] * 6)
    coef = 0.1
    with_kl, g_kl = _loss_and_grad(lambda x: policy_loss(x, batch, LossConfig(kl_coef=coef), 0).loss,
                                   logp)
    no_kl, g_no = _loss_and_grad(lambda x: policy_loss(x, batch, LossConfig(), 0).loss, logp)
    own_mask = batch.response_mask * batch.own[:, None].to(F64)
    q = batch.ref_logp - logp
    k3 = (q.exp() - q - 1) * own_mask
    kl_ref = k3.sum() / own_mask.sum()
    assert kl_ref.item() > 1e-3
    torch.testing.assert_close(with_kl - no_kl, coef * kl_ref)
    diff = g_kl - g_no
    assert diff[4:].abs().max().item() == 0.0      # Naive and cross rows: no KL gradient
    assert diff[:4].abs().max().item() > 0.0
    out = policy_loss(logp, batch, LossConfig(kl_coef=coef), 0)
    assert out.metrics["loss/kl"] == pytest.approx(kl_ref.item())
    # No ref log-probs or coefficient 0: no KL.
    batch.ref_logp = None
    assert policy_loss(logp, batch, LossConfig(kl_coef=coef), 0).loss.item() == \
        pytest.approx(no_kl.item())


def test_update_index_moves_the_lower_bound():
    T = 3
    mask = torch.ones(2, T, dtype=F64)
    logp = -torch.ones(2, T, dtype=F64)
    s = _t([0.81, 0.9])
    src = -1.0 - torch.log(s)
    adv, omega = _t([1.0, 1.0]), _t([1.0, 1.0])
    batch = _batch(mask, torch.zeros_like(logp), src, adv, omega, [True, True], [False, False])
    cfg = LossConfig(alpha=1.0, delta=0.2, delta_step=0.025)

    def run(m, c=cfg):
        out = policy_loss(logp, batch, c, m)
        return out.loss.item(), out.metrics["clip/lower_bound"]

    (l0, b0), (l1, b1), (_, b5) = run(0), run(1), run(5)
    assert (b0, b1, b5) == pytest.approx((0.8, 0.825, 0.925))
    assert l0 == pytest.approx(-(0.81 * 0.81 + 0.9 * 0.9) / 2)
    assert l1 == pytest.approx(-(0.825 * 0.81 + 0.9 * 0.9) / 2)

    def grads(m, c=cfg):
        x = logp.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(policy_loss(x, batch, c, m).loss, x)
        return g.abs().sum(-1)

    assert (grads(0) > 0).all()
    assert grads(1)[0] == 0 and grads(1)[1] > 0
    assert (grads(5) == 0).all()
    fixed = LossConfig(alpha=1.0, stepwise=False)
    assert run(5, fixed)[1] == pytest.approx(0.8)
    assert (grads(5, fixed) > 0).all()


def test_no_cross_clip_config_lets_gradient_through_above_one():
    logp, mask, src, adv, omega = _cross_rows()
    batch = _batch(mask, torch.zeros_like(logp), src, adv, omega, [True] * 4, [False] * 4)
    _, g = _loss_and_grad(lambda x: policy_loss(x, batch, LossConfig(cross_clip=False), 0).loss,
                          logp)
    assert (g.abs().sum(-1) > 0).all()
    # s = 1.1: d loss/d s = -omega * A = -3; spread as s / (L * B) over its 3 tokens.
    assert g[3, 0].item() == pytest.approx(-3.0 * 1.1 / (3 * 4))


def test_aggregate_modes():
    loss = _t([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = _t([[1, 1, 1], [1, 0, 0]])
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2.0 + 4.0) / 2)
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(10.0 / 4)
    with pytest.raises(ValueError):
        aggregate(loss, mask, "seq-sum")
    with pytest.raises(ValueError):
        policy_loss(loss, _batch(mask, loss, _t([0.0, 0.0]), _t([1.0, 1.0]), _t([1.0, 1.0]),
                                 [False, False], [True, True]), LossConfig(ratio="word"), 0)


def test_gradient_of_own_row_is_sequence_level():
    # GSPO: every token of a sequence gets the same gradient s * (-A) / L (unclipped row).
    T = 4
    mask = torch.ones(1, T, dtype=F64)
    old = _t([[-1.0, -2.0, -0.5, -1.5]])
    logp = old + 1e-4
    batch = _batch(mask, old, _mean(old, mask), _t([2.0]), _t([1.0]), [False], [True])
    _, g = _loss_and_grad(lambda x: policy_loss(x, batch, LossConfig(), 0).loss, logp)
    assert g[0].tolist() == pytest.approx([-2.0 * math.exp(1e-4) / T] * T)


def test_micro_batch_shares_add_up_to_the_mini_batch_loss_and_gradient():
    """Gradient accumulation: with the mini-batch's denominators, micro-batch losses (and their
    gradients) sum exactly to the full mini-batch's, for both aggregations and the KL term."""
    from hacrl.algo import Denominators, LossBatch, LossConfig, policy_loss
    from hacrl.algo.metrics import add_micro_batch

    gen = torch.Generator().manual_seed(7)
    rows, width = 6, 5
    lengths = torch.tensor([5, 2, 4, 1, 3, 5])
    mask = (torch.arange(width)[None] < lengths[:, None]).float()
    old = -torch.rand(rows, width, generator=gen) * mask
    batch = LossBatch(
        response_mask=mask, old_logp=old,
        source_mean_logp=(old.sum(-1) / lengths) - 0.1 * torch.rand(rows, generator=gen),
        advantages=torch.randn(rows, generator=gen), omega=torch.rand(rows, generator=gen) + 0.5,
        cross=torch.tensor([False, False, True, False, True, True]),
        own=torch.tensor([True, True, False, True, False, False]),
        ref_logp=(old - 0.05 * torch.rand(rows, width, generator=gen)) * mask)
    base = (old + 0.01 * torch.randn(rows, width, generator=gen)) * mask
    for agg, ratio in (("seq-mean-token-mean", "sequence"), ("token-mean", "token")):
        cfg = LossConfig(ratio=ratio, loss_agg=agg, clip_low=0.2, clip_high=0.28, kl_coef=0.5,
                         delta=0.5)
        full_logp = base.clone().requires_grad_(True)
        full_out = policy_loss(full_logp, batch, cfg, update_index=0)
        full = full_out.loss
        full.backward()
        micro_logp = base.clone().requires_grad_(True)
        shares = Denominators.of(batch)
        total = torch.zeros(())
        metrics: dict[str, float] = {}
        # uneven: the first micro-batch holds own rows only, the last a borrowed row only
        for index in (torch.tensor([0, 1]), torch.tensor([2, 3, 4]), torch.tensor([5])):
            out = policy_loss(micro_logp[index], batch.select(index), cfg, update_index=0,
                              denominators=shares)
            out.loss.backward()
            total = total + out.loss.detach()
            add_micro_batch(metrics, out.metrics, out.kinds, len(index), rows)
        torch.testing.assert_close(total, full.detach())
        torch.testing.assert_close(micro_logp.grad, full_logp.grad)
        # every metric, means over own or borrowed rows included, is the mini-batch's
        assert metrics.keys() == full_out.metrics.keys()
        for key, value in full_out.metrics.items():
            assert metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
        assert full_out.metrics["loss/borrowed"] != 0 and full_out.metrics["loss/own"] != 0
    # own rows past the clip (ratios e^+-0.5) in uneven micro-batches: the own clip fraction
    # is the mini-batch's too
    far = (old + 0.5 * torch.tensor([1.0, -1.0, 0.0, 1.0, 0.0, 0.0])[:, None]) * mask
    cfg = LossConfig(clip_low=0.2, clip_high=0.28, delta=0.5)
    whole = policy_loss(far, batch, cfg, update_index=0).metrics["clip/own_frac"]
    parts: dict[str, float] = {}
    for index in (torch.tensor([0, 1]), torch.tensor([2, 3, 4]), torch.tensor([5])):
        out = policy_loss(far[index], batch.select(index), cfg, update_index=0,
                          denominators=Denominators.of(batch))
        add_micro_batch(parts, out.metrics, out.kinds, len(index), rows)
    assert 0 < whole < 1 and parts["clip/own_frac"] == pytest.approx(whole)
