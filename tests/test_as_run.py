"""`profile=as_run` is the code behind the paper's numbers, item by item, against hand-computed
values; `profile=bare` is the paper's text (docs/FIDELITY.md has the whole table)."""

from __future__ import annotations

import math

import pytest
import torch

from hacrl.algo import (
    METHODS,
    AdvantageOptions,
    CapabilityWindow,
    LossBatch,
    degenerate_prompts,
    omega_matrix,
    policy_loss,
    smoothed_capability,
)
from hacrl.config import compose
from hacrl.config.identity import config_hash
from hacrl.config.settings import method_settings


def _settings(*overrides: str, method: str = "hacpo"):
    cfg = compose([f"method={method}", *overrides])
    return method_settings(cfg, METHODS[method])


def _omega(settings, history: list[list[float]]) -> torch.Tensor:
    window = CapabilityWindow(2, settings.capability_window, settings.capability_floor)
    for row in history:
        p = window.update(torch.tensor(row))
    return omega_matrix(p, settings.omega_clamp)


def test_the_capability_floor_is_the_authors_1e8_as_run_and_001_bare() -> None:
    """P = (0.003125, 0.0125): the authors' code (floor 1e-8, omega clamped to [0.1, 10]) gives
    omega^(1,0) = 0.0125 / 0.003125 = 4; a floor of 0.01 would give 0.0125 / 0.01 = 1.25."""
    as_run, bare = _settings(), _settings("profile=bare")
    assert (as_run.capability_floor, bare.capability_floor) == (1e-8, 0.01)
    history = [[0.003125, 0.0125]]
    omega = _omega(as_run, history)
    assert omega[1, 0].item() == pytest.approx(4.0, rel=1e-6)
    assert omega[0, 1].item() == pytest.approx(0.25, rel=1e-6)
    assert _omega(bare, history)[1, 0].item() == pytest.approx(1.25, rel=1e-6)
    # an agent at 0: P = 1e-8, omega = 0.0125 / 1e-8 clamped to 10 (as run); 1.25 (bare)
    assert _omega(as_run, [[0.0, 0.0125]])[1, 0].item() == pytest.approx(10.0)
    assert _omega(bare, [[0.0, 0.0125]])[1, 0].item() == pytest.approx(1.25, rel=1e-6)


def test_the_floor_bounds_the_window_mean_as_the_code_behind_the_paper() -> None:
    """The authors' `main` floors the window's mean: steps (0, 0.2) with floor 0.01 give
    max((0 + 0.2) / 2, 0.01) = 0.1 (their verl-v1 port floors each step first: 0.105)."""
    p = smoothed_capability(torch.tensor([[0.0, 1.0], [0.2, 1.0]], dtype=torch.float64), 5, 0.01)
    assert p.tolist() == pytest.approx([0.1, 1.0])
    p = smoothed_capability(torch.tensor([[0.0], [0.0]], dtype=torch.float64), 5, 1e-8)
    assert p.tolist() == [1e-8]


def _one_token_loss(settings, advantage: float, ratio: float) -> tuple[float, float]:
    """(loss, d loss / d logp) of one own token with old log-prob log(1/ratio) lower."""
    logp = torch.tensor([[math.log(0.5)]], dtype=torch.float64, requires_grad=True)
    batch = LossBatch(response_mask=torch.ones(1, 1, dtype=torch.float64),
                      old_logp=torch.tensor([[math.log(0.5) - math.log(ratio)]],
                                            dtype=torch.float64),
                      source_mean_logp=torch.zeros(1, dtype=torch.float64),
                      advantages=torch.tensor([advantage], dtype=torch.float64),
                      omega=torch.ones(1, dtype=torch.float64), cross=torch.tensor([False]),
                      own=torch.tensor([True]))
    from dataclasses import replace

    out = policy_loss(logp, batch, replace(settings.loss, kl_coef=0.0), update_index=0)
    out.loss.backward()
    assert logp.grad is not None
    return out.loss.item(), logp.grad.item()


def test_grpo_as_run_has_verls_dual_clip_and_bare_the_plain_clip() -> None:
    """One token, A = -1, ratio 4: verl's vanilla loss caps the loss at c |A| = 3 with no
    gradient; the plain clipped surrogate gives -min(4 * -1, 1.2 * -1) = 4, gradient 4
    (d(-A r)/d logp = -A r)."""
    as_run, bare = _settings(method="grpo"), _settings("profile=bare", method="grpo")
    assert (as_run.loss.dual_clip_c, bare.loss.dual_clip_c) == (3.0, None)
    assert _one_token_loss(as_run, -1.0, 4.0) == pytest.approx((3.0, 0.0))
    assert _one_token_loss(bare, -1.0, 4.0) == pytest.approx((4.0, 4.0))
    # below the cap (ratio 2: loss 2 < 3) both are the plain clipped surrogate
    assert _one_token_loss(as_run, -1.0, 2.0) == pytest.approx((2.0, 2.0))
    # a positive advantage is never capped (ratio 4 is clipped at 1 + clip_high: no gradient)
    loss, grad = _one_token_loss(as_run, 1.0, 4.0)
    assert grad == 0.0 and loss == pytest.approx(-(1 + as_run.loss.clip_high))
    # c is a setting
    assert _one_token_loss(_settings("algo.dual_clip_c=2.5", method="grpo"), -1.0, 4.0) == \
        pytest.approx((2.5, 0.0))


def test_the_dual_clip_bounds_token_ratios_only_and_only_grpos_identity_has_it() -> None:
    """verl's GSPO loss has no dual clip: a sequence-ratio method's settings carry none, and
    its cells keep their identity whatever c is; GRPO's identity changes with c."""
    assert _settings().loss.dual_clip_c is None
    assert _settings(method="gspo").loss.dual_clip_c is None
    for method, changes in (("gspo", False), ("hacpo", False), ("grpo", True)):
        a = config_hash(compose([f"method={method}"]))
        b = config_hash(compose([f"method={method}", "algo.dual_clip_c=5"]))
        assert (a != b) == changes, method


def test_a_prompt_whose_rewards_have_no_spread_is_counted_when_its_advantage_is_not_zero() -> None:
    """Two agents, two prompts, G = 2: prompt 0's four rewards are all 1; agents' P differ
    (0.2, 0.8), so HACPO's baseline for agent 0 is (0.2/0.2 * 1 + 0.2/0.8 * 1) / 2 = 0.625 and
    the std is 0: A = (1 - 0.625) / 1e-6 = 3.75e5 (bare). as_run zeroes the prompt."""
    rewards = torch.tensor([[[1.0, 1.0], [0.0, 1.0]], [[1.0, 1.0], [1.0, 0.0]]])
    capability = torch.tensor([0.2, 0.8])
    hacpo = METHODS["hacpo"].advantage_estimator.fn
    bare = hacpo(rewards, capability, AdvantageOptions(None, False, False))
    count, largest = degenerate_prompts(rewards, bare)
    assert count.tolist() == [1, 1]
    # agent 1's baseline: (0.8/0.2 + 0.8/0.8) / 2 = 2.5: A = (1 - 2.5) / 1e-6
    assert largest.tolist() == pytest.approx([0.375 / 1e-6, 1.5 / 1e-6], rel=1e-5)
    as_run = hacpo(rewards, capability, AdvantageOptions((0.1, 10.0), True, True))
    assert degenerate_prompts(rewards, as_run)[0].tolist() == [0, 0]
    # the group-relative baselines never have them: a uniform group's advantage is 0
    grpo = METHODS["grpo"].advantage_estimator.fn(rewards[:1], capability[:1],
                                                  AdvantageOptions(None, False, False))
    assert degenerate_prompts(rewards[:1], grpo)[0].tolist() == [0]


def test_the_first_step_with_degenerate_prompts_is_one_warning(capsys) -> None:
    """The job's log says it once, naming each agent's count and largest |A|; steps without
    any, and later steps with some, say nothing (the metrics count them every step)."""
    from hacrl.job.listeners import DegenerateWarning
    from hacrl.schema import metric_names as M
    from hacrl.training.events import StepDone
    from hacrl.training.loop import StepResult

    def step(k: int, counts: list[float]) -> StepDone:
        return StepDone(k, StepResult([{M.ADV_DEGENERATE_PROMPTS: c,
                                        M.ADV_DEGENERATE_MAX_ABS: 3.75e5 * c} for c in counts]))

    warn = DegenerateWarning(["qwen3-4b", "qwen3-4b-instruct"])
    warn(step(1, [0, 0]))
    assert capsys.readouterr().err == ""
    warn(step(2, [0, 2]))
    warn(step(3, [1, 1]))
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hacrl: warning: step 2: prompts whose rewards are all equal got a non-zero "
                   "advantage: qwen3-4b-instruct 2 (largest |A| 7.5e+05); the std is 0, so "
                   "A = (R - baseline) / eps (the paper's formula as written; profile=as_run "
                   "zeroes them). Counted each step as adv/degenerate_prompts; warned once"]
