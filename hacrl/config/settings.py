"""A job's typed settings, derived from its validated config in one place, once per job.

`method_settings` is the only place that reads the `algo`, `train`, `rollout` and `task` keys
the loop and the loss need; `optimizer_settings` the only one that reads the optimizer's. The
validation builds both into the `JobSpec` (`spec.settings`, `spec.optimizer`); the loop gets
`spec.settings`, every engine `spec.settings.loss` (its `EngineContext.loss`) and
`spec.optimizer` (the local engine's optimizer, verl's `actor.optim` section).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hacrl.algo import LossConfig, MethodSpec
from hacrl.algo.rollout import SamplingParams


@dataclass(frozen=True)
class LoopSettings:
    """What `TeamLoop` needs besides its agents, prompts and grader (`method_settings` makes it)."""

    prompts_per_step: int
    minibatch_prompts: int  # before the method's divisor
    rollouts_per_prompt: int  # G, before the method's multiplier
    sampling: SamplingParams
    loss: LossConfig
    seed: int = 0
    prompt_template: str = "{question}"
    overflow: str = "truncate"
    sample_order: str = "mixed"  # or "own_first"
    capability_window: int = 5
    capability_floor: float = 1e-2
    omega_clamp: tuple[float, float] | None = None
    baseline_guard: bool = False
    zero_uniform_groups: bool = False


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW and gradient clipping, the same for every engine (`train.lr`, `train.betas`,
    `train.weight_decay`, `train.grad_clip`)."""

    lr: float
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    grad_clip: float = 1.0  # max global gradient norm per optimizer update


def optimizer_settings(cfg: Any) -> OptimizerSettings:
    """The optimizer's settings under config `cfg` (validated values)."""
    train = cfg.train
    return OptimizerSettings(lr=float(train.lr), betas=(float(train.betas[0]), float(train.betas[1])),
                             weight_decay=float(train.weight_decay),
                             grad_clip=float(train.grad_clip))


def method_settings(cfg: Any, method: MethodSpec) -> LoopSettings:
    """The loop's settings (with the loss's, `.loss`) of `method` under config `cfg` (validated
    values; a `null` clip in the config takes the method's default)."""
    algo, train, rollout = cfg.algo, cfg.train, cfg.rollout
    clip_low = algo.clip_low if algo.clip_low is not None else method.clip_low
    clip_high = algo.clip_high if algo.clip_high is not None else method.clip_high
    loss = LossConfig(ratio=method.ratio, loss_agg=method.loss_agg, clip_low=float(clip_low),
                      clip_high=float(clip_high), alpha=float(algo.alpha),
                      delta=1.0 - float(algo.cross_clip_lower), delta_step=float(algo.delta_step),
                      stepwise=method.stepwise, cross_clip=method.cross_clip,
                      kl_coef=float(algo.kl_coef), borrowed=method.borrowed,
                      dual_clip_c=(float(algo.dual_clip_c) if algo.get("dual_clip_c") is not None
                                   and method.ratio == "token" else None))
    clamp = tuple(algo.omega_clamp) if algo.omega_clamp is not None else None
    return LoopSettings(
        prompts_per_step=train.prompts_per_step, minibatch_prompts=train.minibatch_prompts,
        rollouts_per_prompt=train.rollouts_per_prompt,
        sampling=SamplingParams(max_new_tokens=rollout.max_new_tokens,
                                temperature=rollout.temperature, top_p=rollout.top_p),
        loss=loss, seed=cfg.seed, prompt_template=cfg.task.prompt_template,
        overflow=rollout.overflow, sample_order=algo.sample_order,
        capability_window=algo.capability_window, capability_floor=algo.capability_floor,
        omega_clamp=(float(clamp[0]), float(clamp[1])) if clamp else None,
        baseline_guard=algo.baseline_guard, zero_uniform_groups=algo.zero_uniform_groups)


__all__ = ["LoopSettings", "OptimizerSettings", "method_settings", "optimizer_settings"]
