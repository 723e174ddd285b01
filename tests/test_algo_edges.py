"""The core at its edges, value by value: bounds met exactly, extreme log-probs, the methods
without a cross-agent term, and the one-line errors a user sees for a wrong name. Each test
pins behaviour that a one-token slip (`<` for `<=`, a dropped clamp, a lost message) changes;
scripts/mutation.py found these slips unnoticed before."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch

from hacrl.algo import LossBatch, LossConfig, policy_loss
from hacrl.algo.metrics import SHARE, SUM, check_kinds, combine_updates
from hacrl.algo.objectives import borrowed_sample_loss, low_variance_kl, stepwise_lower_bound
from hacrl.algo.registry import (
    ADVANTAGES,
    BORROWED,
    BorrowedTerm,
    get_advantage,
    get_borrowed,
    register_advantage,
    register_borrowed,
)


def _batch(cross: list[bool], own: list[bool], width: int = 3, **fields: torch.Tensor) -> LossBatch:
    rows = len(cross)
    values = {"response_mask": torch.ones(rows, width, dtype=torch.float64),
              "old_logp": torch.full((rows, width), -1.0, dtype=torch.float64),
              "source_mean_logp": torch.full((rows,), -1.0, dtype=torch.float64),
              "advantages": torch.linspace(-1.0, 1.5, rows, dtype=torch.float64),
              "omega": torch.ones(rows, dtype=torch.float64),
              "cross": torch.tensor(cross), "own": torch.tensor(own)}
    values.update(fields)
    return LossBatch(**values)


# -- objectives --------------------------------------------------------------------------------

def test_kl_clamps_the_log_ratio_at_20_then_the_value_at_bound() -> None:
    """q = ref - logp is clamped to [-20, 20] (exp stays finite: a -inf log-prob gives the bound,
    not NaN); the k3 value then to the bound."""
    logp = torch.tensor([0.0, 0.0, 0.0, -math.inf], dtype=torch.float64)
    ref = torch.tensor([-25.0, 25.0, -1.0, 0.0], dtype=torch.float64)
    wide = low_variance_kl(logp, ref, bound=1e12)
    assert wide[0].item() == pytest.approx(math.exp(-20.0) + 20.0 - 1.0, rel=1e-12)
    assert wide[1].item() == pytest.approx(math.exp(20.0) - 20.0 - 1.0, rel=1e-12)
    assert wide[2].item() == pytest.approx(math.exp(-1.0), rel=1e-12)
    assert wide[3].item() == pytest.approx(math.exp(20.0) - 21.0, rel=1e-12)
    assert low_variance_kl(logp, ref).tolist() == pytest.approx([10.0, 10.0, math.exp(-1.0), 10.0])


def test_borrowed_rows_exactly_at_the_bounds_are_inside() -> None:
    """The clip keeps s in [lower_m, 1]: a ratio equal to either bound is inside (gradient), one
    just past it outside."""
    lower = 0.8
    ratio = torch.tensor([0.8, 1.0, 0.8 - 1e-6, 1.0 + 1e-6], dtype=torch.float64,
                         requires_grad=True)
    loss, outside = borrowed_sample_loss(ratio, torch.ones(4, dtype=torch.float64),
                                         torch.ones(4, dtype=torch.float64), alpha=0.5,
                                         lower=lower)
    assert outside.tolist() == [False, False, True, True]
    loss.sum().backward()
    assert ratio.grad is not None
    assert (ratio.grad[:2] != 0).all() and (ratio.grad[2:] == 0).all()


def test_stepwise_bound_refuses_a_negative_update_index() -> None:
    with pytest.raises(ValueError, match=r"update index m must be >= 0, got -1"):
        stepwise_lower_bound(-1, 0.2, 0.01, True)


# -- policy_loss -------------------------------------------------------------------------------

@pytest.mark.parametrize("borrowed", ["none", "as_own"])
def test_methods_without_a_cross_term_report_zero_borrowed_metrics(borrowed: str) -> None:
    cfg = LossConfig(borrowed=borrowed)
    batch = _batch([False, False, False], [True, True, borrowed == "none"])
    logp = torch.full((3, 3), -0.9, dtype=torch.float64, requires_grad=True)
    out = policy_loss(logp, batch, cfg, update_index=0)
    assert out.metrics["loss/borrowed"] == 0.0 and out.metrics["clip/borrowed_frac"] == 0.0
    out.loss.backward()
    assert logp.grad is not None and bool((logp.grad != 0).any())
    with pytest.raises(ValueError, match=rf"borrowed objective '{borrowed}' has no cross-agent"):
        policy_loss(logp, _batch([True, False, False], [False, True, True]), cfg, 0)


def test_own_and_borrowed_metrics_are_means_over_their_own_rows() -> None:
    """One own row and two cross rows, no denominators: each mean is over its rows only."""
    cfg = LossConfig(borrowed="cross", clip_low=0.2, clip_high=0.28, delta=0.5, alpha=1.0)
    batch = _batch([False, True, True], [True, False, False],
                   advantages=torch.tensor([2.0, 1.0, -1.0], dtype=torch.float64))
    # own row: s = exp(0.1) (inside the clip); cross rows: s = exp(0.5) (> 1: clipped), exp(-0.1)
    logp = torch.tensor([[-0.9] * 3, [-0.5] * 3, [-1.1] * 3], dtype=torch.float64)
    out = policy_loss(logp, batch, cfg, update_index=0)
    s_own, s_in = math.exp(0.1), math.exp(-0.1)
    assert out.metrics["loss/own"] == pytest.approx(-2.0 * s_own)
    assert out.metrics["clip/own_frac"] == 0.0
    # cross: clipped row (weight 1, s^alpha weight 1) and inside row (-s * s * (-1))
    assert out.metrics["loss/borrowed"] == pytest.approx((-1.0 * 1.0 * 1.0 + s_in * s_in) / 2)
    assert out.metrics["clip/borrowed_frac"] == pytest.approx(0.5)
    # an own row past the clip: the fraction is that row's
    far = policy_loss(torch.tensor([[-0.5] * 3, [-0.5] * 3, [-1.1] * 3], dtype=torch.float64),
                      batch, cfg, update_index=0)
    assert far.metrics["clip/own_frac"] == 1.0


def test_kl_metrics_and_total() -> None:
    """loss/total = loss/policy + kl_coef * loss/kl, and equals the loss; kl_coef 0 computes
    no KL even with reference log-probs."""
    ref = torch.full((2, 3), -1.3, dtype=torch.float64)
    batch = _batch([False, False], [True, True], ref_logp=ref)
    logp = torch.full((2, 3), -0.8, dtype=torch.float64)
    on = policy_loss(logp, batch, LossConfig(kl_coef=0.5), update_index=0)
    assert on.metrics["loss/kl"] == pytest.approx(math.exp(-0.5) + 0.5 - 1.0)
    assert on.metrics["loss/total"] == pytest.approx(
        on.metrics["loss/policy"] + 0.5 * on.metrics["loss/kl"])
    assert on.metrics["loss/total"] == pytest.approx(float(on.loss))
    off = policy_loss(logp, batch, LossConfig(kl_coef=0.0), update_index=0)
    assert off.metrics["loss/kl"] == 0.0


@pytest.mark.parametrize("ratio", ["sequence", "token"])
def test_log_ratios_are_clamped_both_ways(ratio: str) -> None:
    """log s is clamped to +-20 (LOG_RATIO_BOUND): a wildly off-policy row gives exp(+-20),
    not inf or 0, in float64 exactly."""
    cfg = LossConfig(ratio=ratio, clip_low=1e9, clip_high=1e30)  # no clip: the ratio shows
    for shift, expected in ((30.0, math.exp(20.0)), (-30.0, math.exp(-20.0))):
        batch = _batch([False], [True], width=2,
                       advantages=torch.tensor([1.0], dtype=torch.float64))
        logp = torch.full((1, 2), -1.0 + shift, dtype=torch.float64)
        out = policy_loss(logp, batch, cfg, update_index=0)
        assert out.metrics["loss/own"] == pytest.approx(-expected, rel=1e-12)


def test_token_mean_of_a_single_token_is_that_token() -> None:
    cfg = LossConfig(loss_agg="token-mean", ratio="token")
    batch = _batch([False], [True], width=2, response_mask=torch.tensor([[1.0, 0.0]],
                                                                       dtype=torch.float64),
                   advantages=torch.tensor([1.0], dtype=torch.float64))
    out = policy_loss(torch.full((1, 2), -1.0, dtype=torch.float64), batch, cfg, 0)
    assert float(out.loss) == pytest.approx(-1.0)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("ratio", "bogus", r"unknown ratio 'bogus'; use 'sequence' or 'token'"),
    ("loss_agg", "bogus", r"unknown loss_agg 'bogus'; use 'seq-mean-token-mean' or 'token-mean'"),
])
def test_unknown_loss_settings_name_the_value_and_the_choices(field: str, value: str,
                                                              message: str) -> None:
    settings: dict[str, Any] = {field: value}
    cfg = dataclasses.replace(LossConfig(), **settings)
    with pytest.raises(ValueError, match=message):
        policy_loss(torch.zeros(1, 3, dtype=torch.float64), _batch([False], [True]), cfg, 0)


def test_loss_batch_moves_every_field() -> None:
    batch = _batch([False, True], [True, False], ref_logp=torch.zeros(2, 3))
    moved = batch.to("meta")
    assert moved.ref_logp is not None
    assert all(t.device.type == "meta" for t in
               (moved.response_mask, moved.old_logp, moved.advantages, moved.cross, moved.ref_logp))


# -- metrics and registries --------------------------------------------------------------------

def test_combine_updates_sums_counts_and_extremes() -> None:
    per_update = [{"a_sum": 3.0, "a_count": 2.0, "b_min": 2.0, "c": 1.0, "d_sum": 4.0},
                  {"a_sum": 1.0, "a_count": 2.0, "b_min": 0.5, "c": 3.0, "d_sum": 2.0},
                  {"z_count": 0.0, "z_sum": 0.0, "e": 5.0}]
    assert combine_updates(per_update) == {"a_mean": 1.0, "b_min": 0.5, "c": 2.0, "d_sum": 3.0,
                                           "e": 5.0}
    # a count of one row is a mean of that row; a declared SUM pairs with its count
    assert combine_updates([{"x_sum": 3.0, "x_count": 1.0}]) == {"x_mean": 3.0}
    assert combine_updates([{"y": 2.0, "y_count": 4.0}], {"y": SHARE}) == {"y": 2.0}


def test_check_kinds_names_the_bad_kind_and_the_choices() -> None:
    check_kinds({"a": SHARE})
    with pytest.raises(ValueError, match=r"unknown metric kind\(s\) \{'a': 'mean'\}; use one of: "
                                         r"share, row_mean, min, max, sum, count"):
        check_kinds({"a": "mean", "b": SHARE})


def test_registries_name_what_they_hold() -> None:
    with pytest.raises(KeyError, match=r"unknown advantage estimator 'nope'; registered: .*, "):
        get_advantage("nope")
    with pytest.raises(KeyError, match=r"unknown borrowed-sample objective 'nope'; registered: "
                                       r"as_own, cross, none"):
        get_borrowed("nope")
    with pytest.raises(ValueError, match=r"advantage estimator 'group' is already registered"):
        register_advantage("group")(lambda r, p, o: r)
    with pytest.raises(ValueError, match=r"borrowed-sample objective 'cross' is already"):
        register_borrowed("cross")(None)


def test_registering_keeps_the_name_and_defaults() -> None:
    try:
        register_advantage("test_edges_adv")(lambda r, p, o: r)
        assert get_advantage("test_edges_adv").name == "test_edges_adv"
        assert get_advantage("test_edges_adv").min_group == 1
        register_borrowed("test_edges_solo", partners=False)(None)
        assert get_borrowed("test_edges_solo").name == "test_edges_solo"
        assert not get_borrowed("test_edges_solo").partners
        with pytest.raises(ValueError, match=r"borrowed objective 'test_edges_bad': a term needs "
                                             r"partners=True"):
            register_borrowed("test_edges_bad", partners=False)(
                lambda s, b, c, lower: BorrowedTerm(s, b.cross))
    finally:
        for registry, name in ((ADVANTAGES, "test_edges_adv"), (BORROWED, "test_edges_solo"),
                               (BORROWED, "test_edges_bad")):
            registry.pop(name, None)


def test_a_baseline_of_exactly_one_is_kept_by_the_guard() -> None:
    """baseline_guard replaces mu^(k) only where it exceeds 1: agent 0 (own mean 0.5) with
    omega[0, 1] = 0.75 / 0.5 = 1.5 over agent 1's mean 1 has mu = (0.5 + 1.5) / 2 = 1 exactly."""
    from hacrl.algo.advantages import capability_aware_advantages

    rewards = torch.tensor([[[1.0, 0.0]], [[1.0, 1.0]]], dtype=torch.float64)  # [2, 1, 2]
    capability = torch.tensor([0.75, 0.5], dtype=torch.float64)
    guarded = capability_aware_advantages(rewards, capability, baseline_guard=True, eps=0.0)
    plain = capability_aware_advantages(rewards, capability, eps=0.0)
    torch.testing.assert_close(guarded, plain)
    std = float(rewards.flatten().std())
    assert guarded[0, 0, 0].tolist() == pytest.approx([0.0, -1.0 / std])  # R - 1, not R - 0.5


def test_methods_registry_names_the_method() -> None:
    from hacrl.algo import get_method
    from hacrl.algo.methods import register_method

    with pytest.raises(KeyError, match=r"unknown method 'nope'; registered: .*gspo, .*hacpo, "):
        get_method("nope")
    with pytest.raises(ValueError, match=r"method 'hacpo' is already registered"):
        register_method(get_method("hacpo"))


def test_an_undeclared_metric_is_refused_with_the_fix() -> None:
    def term(s: torch.Tensor, batch: LossBatch, cfg: LossConfig, lower: float) -> BorrowedTerm:
        return BorrowedTerm(torch.zeros_like(s), torch.zeros_like(batch.cross), {"extra/x": 1.0})

    try:
        register_borrowed("test_edges_undeclared")(term)
        with pytest.raises(ValueError, match=r"borrowed objective 'test_edges_undeclared' reports "
                                             r"undeclared metrics \['extra/x'\]; declare their "
                                             r"kinds in register_borrowed\(metrics=\.\.\.\)"):
            policy_loss(torch.zeros(1, 3, dtype=torch.float64), _batch([True], [False]),
                        LossConfig(borrowed="test_edges_undeclared"), 0)
    finally:
        BORROWED.pop("test_edges_undeclared", None)


def test_an_unpaired_sum_is_not_paired_by_a_shorter_name() -> None:
    """A declared SUM without a `<name>_count` is averaged over updates, whatever other counts
    exist (only a `*_sum` name is cut to find its count)."""
    assert combine_updates([{"total": 4.0, "t_count": 2.0}], {"total": SUM}) == {"total": 4.0}
