"""The mini-batch loss every engine trains with: own rows + borrowed rows of one target agent.

    loss = -(J_homo + J_hete) + kl_coef * KL(own rows)

Rows are responses in the *target's* tokens. An own row (or a Naive borrowed row, which is
treated as if the target had sampled it) uses the GSPO/GRPO clipped surrogate; a cross row uses
HACPO's clip(s, lower_m, 1) * sg(s)^alpha * omega^(j,k) * A^(k). Per-row losses are spread over
the row's tokens and aggregated like verl (`seq-mean-token-mean` or `token-mean`), so own and
borrowed rows of one mixed mini-batch share one mean.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch
from torch import Tensor

from hacrl.algo.loss_inputs import LossBatch, LossConfig
from hacrl.algo.metrics import ROW_MEAN, SHARE
from hacrl.algo.objectives import (
    clipped_surrogate_loss,
    dual_clipped_loss,
    low_variance_kl,
    stepwise_lower_bound,
)
from hacrl.algo.ratios import masked_mean, sequence_log_ratio, token_log_ratio
from hacrl.algo.registry import BorrowedTerm, get_borrowed
from hacrl.schema import metric_names as M

LOG_RATIO_BOUND = 20.0  # exp() stays finite even for wildly off-policy borrowed rows


# The metrics `policy_loss` reports and their kinds (`hacrl.algo.metrics`). With `denominators`
# the loss values and the means over own or borrowed rows are shares of the mini-batch's value
# (they add up over micro-batches and ranks exactly, however unevenly own and borrowed rows are
# spread); the lower bound is the same on every row. A borrowed objective declares its own.
LOSS_METRICS: dict[str, str] = {
    M.LOSS_TOTAL: SHARE, M.LOSS_POLICY: SHARE, M.LOSS_KL: SHARE,
    M.LOSS_OWN: SHARE, M.LOSS_BORROWED: SHARE, M.CLIP_OWN_FRAC: SHARE,
    M.CLIP_BORROWED_FRAC: SHARE, M.CLIP_LOWER_BOUND: ROW_MEAN,
}
SHARES = tuple(k for k, kind in LOSS_METRICS.items() if kind == SHARE)


def loss_metrics(cfg: LossConfig) -> dict[str, str]:
    """Every metric `policy_loss` reports under `cfg`, with its kind (the one declaration that
    engines aggregate by)."""
    return {**LOSS_METRICS, **get_borrowed(cfg.borrowed).metrics}


@dataclass
class LossOutput:
    loss: Tensor
    metrics: dict[str, float]
    s_homo: Tensor  # [n_own] detached sequence ratios of own rows
    s_hete: Tensor  # [n_cross] detached sequence ratios of cross rows
    kinds: dict[str, str] = field(default_factory=dict)  # each metric's kind (`loss_metrics`)


@dataclass(frozen=True)
class Denominators:
    """Sizes of a whole mini-batch, so that its micro-batches' losses add up to its loss.

    rows: B; tokens: response tokens of all rows; own_tokens: those of own rows (the KL term);
    cross_rows: rows flagged cross (the borrowed term's metrics; the others are "own-like").
    """

    rows: float
    tokens: float
    own_tokens: float
    cross_rows: float

    @staticmethod
    def of(batch: LossBatch) -> Denominators:
        mask = batch.response_mask
        return Denominators(rows=float(mask.shape[0]), tokens=float(mask.sum()),
                            own_tokens=float((mask * batch.own[:, None].to(mask.dtype)).sum()),
                            cross_rows=float(batch.cross.sum()))


def aggregate(token_loss: Tensor, mask: Tensor, mode: str, denominator: float | None = None) -> Tensor:
    """Reduce a [B, T] loss to a scalar the way verl's `agg_loss` does.

    `denominator` replaces this batch's own row count (seq-mean-token-mean) or token count
    (token-mean): a micro-batch then contributes its exact share of the mini-batch's loss.
    """
    if mode == "seq-mean-token-mean":
        rows = denominator if denominator is not None else token_loss.shape[0]
        return masked_mean(token_loss, mask, dim=-1).sum() / max(rows, 1.0)
    if mode == "token-mean":
        tokens = mask.sum() if denominator is None else torch.tensor(denominator)
        return (token_loss * mask).sum() / tokens.clamp_min(1.0)
    raise ValueError(f"unknown loss_agg {mode!r}; use 'seq-mean-token-mean' or 'token-mean'")


def policy_loss(logp: Tensor, batch: LossBatch, cfg: LossConfig, update_index: int,
                denominators: Denominators | None = None) -> LossOutput:
    """Loss of one mini-batch (or, with `denominators`, one micro-batch's share of it):

        loss = -(J_homo + J_hete) + kl_coef * KL(own rows)

    Args:
        logp: [B, T] current log-probs of the rows' response tokens (with grad).
        batch: the rows' fixed inputs.
        cfg: objective parameters.
        update_index: m, optimizer updates already made in this training step (from 0).
    """
    mask = batch.response_mask.to(logp.dtype)
    s = _sequence_ratios(logp, mask, batch)  # [B]
    own = _own_sample_term(logp, s, mask, batch, cfg)  # J_homo: own (and Naive borrowed) rows
    # J_hete: the borrowed objective's term (HACPO's stepwise-clipped, exponentially weighted,
    # omega-modulated cross-agent term); computed for every row, used on cross rows.
    lower = stepwise_lower_bound(update_index, cfg.delta, cfg.delta_step, cfg.stepwise)
    borrowed = _borrowed_term(s, batch, cfg, lower)

    token_loss = torch.where(batch.cross[:, None], borrowed.loss[:, None].expand_as(mask),
                             own.token_loss)
    pg_loss = aggregate(token_loss, mask, cfg.loss_agg, _policy_share(cfg, denominators))
    kl = _kl_term(logp, mask, batch, cfg, denominators)
    loss = pg_loss if kl is None else pg_loss + cfg.kl_coef * kl

    with torch.no_grad():
        kl_value = torch.zeros((), dtype=logp.dtype) if kl is None else kl
        metrics = _metric_values(pg_loss, kl_value, mask, batch.cross, own, borrowed, cfg, lower,
                                 denominators)
        s_own, s_cross = s[batch.own].detach(), s[batch.cross].detach()
    return _declared(LossOutput(loss=loss, metrics=metrics, s_homo=s_own, s_hete=s_cross), cfg)


def _sequence_ratios(logp: Tensor, mask: Tensor, batch: LossBatch) -> Tensor:
    """s [B], each row's sequence-level importance ratio, log clamped to +-LOG_RATIO_BOUND.

    Cross rows: s^(k,j) against the source's rollout policy, each mean in its own tokens.
    Own and Naive rows: GSPO's ratio against the target's own pre-update log-probs (old_logp),
    whatever source_mean_logp holds for them (Naive must not see the source's policy).
    """
    cross_log_s = sequence_log_ratio(logp, mask, batch.source_mean_logp)
    own_log_s = masked_mean(token_log_ratio(logp, batch.old_logp), mask, dim=-1)
    log_s = torch.where(batch.cross, cross_log_s, own_log_s).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return log_s.exp()


class OwnSampleTerm(NamedTuple):
    """The clipped surrogate of own (and Naive borrowed) rows, computed for every row.
    token_loss: [B, T]; clip_frac: [B] fraction of each row that the clip cut off."""

    token_loss: Tensor
    clip_frac: Tensor


def _own_sample_term(logp: Tensor, s: Tensor, mask: Tensor, batch: LossBatch,
                     cfg: LossConfig) -> OwnSampleTerm:
    """J_homo per token: GSPO's clipped sequence ratio `s` spread over the row's tokens, or
    GRPO's clipped per-token ratio."""
    if cfg.ratio == "sequence":
        row_loss, clipped = clipped_surrogate_loss(s, batch.advantages, cfg.clip_low, cfg.clip_high)
        return OwnSampleTerm(row_loss[:, None].expand_as(mask), clipped.float())
    if cfg.ratio == "token":
        log_r = token_log_ratio(logp, batch.old_logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        token_loss, tok_clipped = clipped_surrogate_loss(
            log_r.exp(), batch.advantages[:, None], cfg.clip_low, cfg.clip_high)
        if cfg.dual_clip_c is not None:  # as run: verl's vanilla loss caps a negative A's loss
            token_loss, capped = dual_clipped_loss(token_loss, batch.advantages[:, None],
                                                   cfg.dual_clip_c)
            tok_clipped = tok_clipped | capped
        return OwnSampleTerm(token_loss, masked_mean(tok_clipped.float(), mask, dim=-1))
    raise ValueError(f"unknown ratio {cfg.ratio!r}; use 'sequence' or 'token'")


def _policy_share(cfg: LossConfig, denominators: Denominators | None) -> float | None:
    """The mini-batch denominator of the policy loss (rows or tokens, by `cfg.loss_agg`)."""
    if denominators is None:
        return None
    return denominators.rows if cfg.loss_agg == "seq-mean-token-mean" else denominators.tokens


def _kl_term(logp: Tensor, mask: Tensor, batch: LossBatch, cfg: LossConfig,
             denominators: Denominators | None) -> Tensor | None:
    """KL(own rows): the low-variance KL to the reference policy, token-mean over own rows'
    tokens; None when there is no KL term (kl_coef 0, no reference, no own row)."""
    if not (cfg.kl_coef > 0 and batch.ref_logp is not None and bool(batch.own.any())):
        return None
    kl_mask = mask * batch.own[:, None].to(mask.dtype)
    return aggregate(low_variance_kl(logp, batch.ref_logp), kl_mask, "token-mean",
                     None if denominators is None else denominators.own_tokens)


def _subset_mean(values: Tensor, rows: Tensor, total: float | None) -> float:
    """Mean of `values` [B] over `rows` [B] bool; with `total` (the mini-batch's count of such
    rows) this micro-batch's share of the mini-batch's mean. 0 when there are no such rows."""
    count = float(rows.sum()) if total is None else total
    return float(values[rows].sum()) / count if count > 0 else 0.0


def _metric_values(pg_loss: Tensor, kl_value: Tensor, mask: Tensor, cross: Tensor,
                   own: OwnSampleTerm, borrowed: BorrowedTerm, cfg: LossConfig,
                   lower: float, denominators: Denominators | None) -> dict[str, float]:
    """The metrics of `LOSS_METRICS` and the borrowed objective's own (call without grad).

    With `denominators` the SHARE metrics are this micro-batch's share of the mini-batch's
    values, like the loss itself: engines add them up over micro-batches and ranks, exactly (a
    mean of micro-batch means would not be the mini-batch's, nor would a row-weighted one of
    means over own or borrowed rows when a micro-batch holds few of them).
    """
    own_like = ~cross
    n_cross = None if denominators is None else denominators.cross_rows
    n_own = None if denominators is None else denominators.rows - denominators.cross_rows
    return {
        M.LOSS_TOTAL: float(pg_loss + cfg.kl_coef * kl_value),
        M.LOSS_POLICY: float(pg_loss),
        M.LOSS_KL: float(kl_value),
        M.LOSS_OWN: _subset_mean(masked_mean(own.token_loss, mask, -1), own_like, n_own),
        M.LOSS_BORROWED: _subset_mean(borrowed.loss, cross, n_cross),
        M.CLIP_OWN_FRAC: _subset_mean(own.clip_frac, own_like, n_own),
        M.CLIP_BORROWED_FRAC: _subset_mean(borrowed.outside.float(), cross, n_cross),
        M.CLIP_LOWER_BOUND: lower,
        **borrowed.metrics,
    }


def _declared(out: LossOutput, cfg: LossConfig) -> LossOutput:
    """`out` with each metric's declared kind; a metric nobody declared is refused, not dropped."""
    kinds = loss_metrics(cfg)
    if undeclared := sorted(set(out.metrics) - set(kinds)):
        raise ValueError(f"borrowed objective {cfg.borrowed!r} reports undeclared metrics {undeclared}; "
                         "declare their kinds in register_borrowed(metrics=...)")
    return replace(out, kinds={k: kinds[k] for k in out.metrics})


def _borrowed_term(s: Tensor, batch: LossBatch, cfg: LossConfig, lower: float) -> BorrowedTerm:
    """The term of `cfg.borrowed` for all rows; an objective without one has no cross rows."""
    term = get_borrowed(cfg.borrowed).term
    if term is not None:
        return term(s, batch, cfg, lower)
    if bool(batch.cross.any()):
        raise ValueError(f"rows are flagged cross, but borrowed objective {cfg.borrowed!r} has "
                         "no cross-agent term")
    return BorrowedTerm(torch.zeros_like(s), torch.zeros_like(batch.cross))
