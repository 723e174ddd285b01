"""Method registry: each method is a set of switches over the same core functions.

Adding a method is adding one `register_method(MethodSpec(...))` entry. Numeric parameters
(alpha, delta, delta_step, clip ranges, K, omega clamp, KL coefficient, sample order) come from
the config; a method only says which mechanisms are on and how rollouts / updates are sized.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class MethodSpec:
    """The switches that define a method.

    shares_rollouts: multi-agent (needs >= 2 agents); False trains each agent alone (n = 1).
    ratio: own-sample ratio, "sequence" (GSPO) or "token" (GRPO).
    loss_agg: how per-token losses are reduced (verl's names).
    advantage: "group" (per agent, GRPO/GSPO), "pooled" (one group of n*G), "capability" (HACPO).
    borrowed: how other agents' samples enter: "none", "as_own" (Naive), "cross" (HACPO).
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
