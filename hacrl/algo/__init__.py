"""HACPO's algorithm core: pure torch functions, no I/O (see docs/ARCHITECTURE.md)."""

from hacrl.algo.advantages import (
    broadcast_to_targets,
    capability_aware_advantages,
    capability_aware_baseline,
    degenerate_prompts,
    group_relative_advantages,
    pooled_advantages,
)
from hacrl.algo.capability import CapabilityWindow, omega_matrix, smoothed_capability
from hacrl.algo.loss import (
    LOSS_METRICS,
    SHARES,
    Denominators,
    LossOutput,
    aggregate,
    loss_metrics,
    policy_loss,
)
from hacrl.algo.loss_inputs import LossBatch, LossConfig
from hacrl.algo.methods import METHODS, MethodSpec, get_method, register_method
from hacrl.algo.objectives import (
    borrowed_sample_loss,
    clipped_surrogate_loss,
    dual_clipped_loss,
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
from hacrl.algo.registry import (
    ADVANTAGES,
    BORROWED,
    AdvantageOptions,
    BorrowedTerm,
    get_advantage,
    get_borrowed,
    register_advantage,
    register_borrowed,
)

__all__ = [
    "ADVANTAGES", "BORROWED", "LOSS_METRICS", "AdvantageOptions", "BorrowedTerm", "get_advantage",
    "get_borrowed", "loss_metrics", "register_advantage", "register_borrowed",
    "METHODS", "CapabilityWindow", "Denominators", "LossBatch", "LossConfig", "LossOutput", "MethodSpec",
    "SHARES", "aggregate", "borrowed_sample_loss", "broadcast_to_targets", "capability_aware_advantages",
    "capability_aware_baseline", "clipped_surrogate_loss", "degenerate_prompts",
    "dual_clipped_loss", "exponential_is_weight",
    "get_method", "group_relative_advantages", "low_variance_kl", "masked_mean",
    "mean_sequence_logprob", "omega_matrix", "policy_loss", "pooled_advantages",
    "register_method", "sequence_log_ratio", "smoothed_capability", "stepwise_lower_bound",
    "token_log_ratio",
]
