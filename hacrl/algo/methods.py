"""The method registry, and the functions methods are made of (docs/ADDING_A_METHOD.md).

A method is one `MethodSpec`: the advantage estimator and borrowed-sample objective it uses
(registered by name: `register_advantage`, `register_borrowed`, `hacrl.algo.registry`) plus
its switches. Numeric parameters (alpha, delta, delta_step, clip ranges, K, omega clamp, KL
coefficient, sample order) come from the config; `hacrl.config.settings.method_settings` derives the
loop's and the loss's settings from a spec and a config, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import Tensor

from hacrl.algo.advantages import (
    broadcast_to_targets,
    capability_aware_advantages,
    group_relative_advantages,
    pooled_advantages,
)
from hacrl.algo.loss_inputs import LossBatch, LossConfig
from hacrl.algo.objectives import borrowed_sample_loss
from hacrl.algo.registry import (
    AdvantageEstimator,
    AdvantageOptions,
    BorrowedObjective,
    BorrowedTerm,
    get_advantage,
    get_borrowed,
    register_advantage,
    register_borrowed,
)


@dataclass(frozen=True)
class MethodSpec:
    """The switches that define a method.

    shares_rollouts: multi-agent (needs >= 2 agents); False trains each agent alone (n = 1).
    ratio: own-sample ratio, "sequence" (GSPO) or "token" (GRPO).
    loss_agg: how per-token losses are reduced (verl's names).
    advantage: a registered advantage estimator: "group" (per agent, GRPO/GSPO), "pooled"
        (one group of n*G), "capability" (HACPO).
    borrowed: a registered borrowed-sample objective: "none", "as_own" (Naive), "cross" (HACPO).
    omega_modulation: multiply borrowed advantages by omega^(j,k) (HACPO step 3).
    stepwise: lower clip bound tightens with the update index m (HACPO step 6).
    cross_clip: clip borrowed ratios to [lower_m, 1] at all.
    rollout_multiplier: G is multiplied by this (gspo_x2 samples 16 instead of 8).
    minibatch_divisor: mini-batch prompts are divided by this (x2 methods double the updates).
    clip_low, clip_high: default own-sample clip range of the method.
    trains: False for `base`, the model as it is (evaluation only; Table 1's first rows).
    """

    name: str
    description: str
    shares_rollouts: bool = False
    ratio: str = "sequence"
    loss_agg: str = "seq-mean-token-mean"
    advantage: str = "group"
    borrowed: str = "none"
    omega_modulation: bool = False
    stepwise: bool = False
    cross_clip: bool = False
    rollout_multiplier: int = 1
    minibatch_divisor: int = 1
    clip_low: float = 3e-4
    clip_high: float = 4e-4
    trains: bool = True

    @property
    def advantage_estimator(self) -> AdvantageEstimator:
        """The registered estimator `advantage` names (KeyError naming the choices)."""
        return get_advantage(self.advantage)

    @property
    def borrowed_objective(self) -> BorrowedObjective:
        """The registered objective `borrowed` names (KeyError naming the choices)."""
        return get_borrowed(self.borrowed)

    def group_size(self, rollouts_per_prompt: int) -> int:
        """G of this method: the config's rollouts per prompt times the multiplier."""
        return int(rollouts_per_prompt) * self.rollout_multiplier

    def update_prompts(self, minibatch_prompts: int) -> int:
        """Prompts per optimizer update: the config's mini-batch over the divisor."""
        return int(minibatch_prompts) // self.minibatch_divisor

    def row_sources(self, team_size: int) -> int:
        """Whose samples a target trains on: its own, plus each partner's when they enter."""
        return team_size if self.borrowed_objective.partners else 1


METHODS: dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec) -> MethodSpec:
    """Add a method to the registry (one entry per method)."""
    if spec.name in METHODS:
        raise ValueError(f"method {spec.name!r} is already registered")
    METHODS[spec.name] = spec
    return spec


def get_method(name: str) -> MethodSpec:
    try:
        return METHODS[name]
    except KeyError:
        raise KeyError(f"unknown method {name!r}; registered: {', '.join(sorted(METHODS))}") from None


# -- advantage estimators: rewards [n, P, G], capability [n] -> A [n_target, n_source, P, G] --

@register_advantage("group", min_group=2)
def group_advantage(rewards: Tensor, capability: Tensor, options: AdvantageOptions) -> Tensor:
    """GRPO/GSPO: A = (R - mean) / (std + eps) within each agent's own G samples of a prompt;
    the same for every target (a single agent is its own only target)."""
    return broadcast_to_targets(group_relative_advantages(rewards))


@register_advantage("pooled")
def pooled_advantage(rewards: Tensor, capability: Tensor, options: AdvantageOptions) -> Tensor:
    """Naive sharing and HACPO without the capability-aware baseline: one group-relative
    advantage over all n*G samples of a prompt, the same for every target."""
    return broadcast_to_targets(pooled_advantages(rewards))


@register_advantage("capability")
def capability_advantage(rewards: Tensor, capability: Tensor, options: AdvantageOptions) -> Tensor:
    """HACPO step 2: A^(k)(y) = (R(y) - mu^(k)(x)) / std(all n*G rewards of x), with
    mu^(k)(x) = 1/(nG) sum_j sum_i omega^(k,j) R(y_i^(j))  (the paper's mu_t^(k))."""
    return capability_aware_advantages(
        rewards, capability, omega_clamp=options.omega_clamp,
        baseline_guard=options.baseline_guard, zero_uniform_groups=options.zero_uniform_groups)


# -- borrowed-sample objectives: how a partner's samples enter a target's loss -----------------

register_borrowed("none", partners=False)(None)  # single-agent methods: partners' samples never enter
register_borrowed("as_own")(None)  # Naive: scored as if the target had sampled them (own clip, own old log-probs)


@register_borrowed("cross")
def hacpo_borrowed_term(s: Tensor, rows: LossBatch, cfg: LossConfig, lower: float) -> BorrowedTerm:
    """HACPO's J_hete (steps 3, 5, 6): -clip(s, lower_m, 1) * sg(s)^alpha * omega^(j,k) * A^(k)(y^(j)).

    s: [B] s^(k,j) against the source's rollout policy; rows.advantages, rows.omega: [B].
    `cfg.cross_clip=False` drops the clip (the no-clip ablation).
    """
    loss, outside = borrowed_sample_loss(s, rows.advantages, rows.omega, alpha=cfg.alpha,
                                         lower=lower, clip=cfg.cross_clip)
    return BorrowedTerm(loss, outside)


# -- methods -----------------------------------------------------------------------------------

register_method(MethodSpec("base", "the model before RL: evaluation only", trains=False))
register_method(MethodSpec("grpo", "GRPO: token ratio, group-relative advantage", ratio="token",
                           loss_agg="token-mean", clip_low=0.2, clip_high=0.28))
register_method(MethodSpec("gspo", "GSPO: sequence ratio, group-relative advantage"))
register_method(MethodSpec("gspo_x2", "GSPO with 2x rollouts per prompt and 2x updates",
                           rollout_multiplier=2, minibatch_divisor=2))
register_method(MethodSpec("gspo_updates_x2", "GSPO with 2x updates on the same rollouts",
                           minibatch_divisor=2))
register_method(MethodSpec("naive", "shared rollouts, pooled advantage, borrowed samples as own",
                           shares_rollouts=True, advantage="pooled", borrowed="as_own"))
_hacpo = register_method(MethodSpec(
    "hacpo", "HACPO: all four mechanisms", shares_rollouts=True, advantage="capability",
    borrowed="cross", omega_modulation=True, stepwise=True, cross_clip=True))
register_method(replace(_hacpo, name="hacpo_no_adv", advantage="pooled",
                        description="HACPO with the plain pooled baseline"))
register_method(replace(_hacpo, name="hacpo_no_omega", omega_modulation=False,
                        description="HACPO without omega in the gradient modulation"))
register_method(replace(_hacpo, name="hacpo_no_stepwise", stepwise=False,
                        description="HACPO with a fixed lower clip bound 1 - delta"))
register_method(replace(_hacpo, name="hacpo_no_clip", stepwise=False, cross_clip=False,
                        description="HACPO without clipping of borrowed ratios"))
