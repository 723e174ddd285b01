"""Our rows <-> verl's batch layout.

verl's workers take a TensorDict in the "no padding" layout: `input_ids`, `position_ids` and
`loss_mask` are jagged nested tensors of each row's prompt + response tokens, while `prompts`,
`responses`, `attention_mask` and `response_mask` keep the left/right padded [B, P] / [B, R]
shape that `no_padding_2_padding` slices log-probs back with. We build the padded batch the way
verl's own trainer does (prompts left-padded, responses right-padded) and convert it with
verl's `left_right_2_no_padding`, so the workers see exactly what verl's trainer sends them.

HACPO's per-row inputs travel as extra fields of the same TensorDict ([B] tensors and [B, R]
padded token tensors), named in `ROW_FIELDS` / `TOKEN_FIELDS`; `loss_batch` rebuilds a `LossBatch` from them on the
worker. Rows added to fill a data-parallel split (`pad_rows`) carry `hacrl_real = False` and
a zero response mask, so they add nothing to the loss.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from hacrl.algo import LossBatch
from hacrl.algo.rollout import TokenView

# [B] per-row fields of a training batch (besides verl's own)
ROW_FIELDS = {
    "hacrl_source_mean_logp": "source_mean_logp",
    "hacrl_advantages": "advantages",
    "hacrl_omega": "omega",
    "hacrl_cross": "cross",
    "hacrl_own": "own",
}
# [B, R] per-token fields, named as verl's trainer names them
TOKEN_FIELDS = {"old_log_probs": "old_logp", "ref_log_prob": "ref_logp"}


def padded_batch(views: Sequence[TokenView], pad_id: int) -> dict[str, Tensor]:
    """Left/right padded tensors of verl's trainer for these rows.

    prompts [B, P] (left-padded), responses [B, R] (right-padded), input_ids = prompts|responses,
    attention_mask, position_ids (0 at each row's first real token), response_mask [B, R].
    """
    if not views:
        raise ValueError("an empty batch has no verl layout")
    width_p = max(len(v.prompt_ids) for v in views)
    width_r = max(1, max(len(v.response_ids) for v in views))
    rows = len(views)
    prompts = torch.full((rows, width_p), pad_id, dtype=torch.long)
    responses = torch.full((rows, width_r), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((rows, width_p), dtype=torch.long)
    response_mask = torch.zeros((rows, width_r), dtype=torch.long)
    for b, v in enumerate(views):
        if not v.prompt_ids:
            raise ValueError(f"row {b} has an empty prompt; verl needs at least one prompt token")
        prompts[b, width_p - len(v.prompt_ids):] = torch.tensor(v.prompt_ids)
        prompt_mask[b, width_p - len(v.prompt_ids):] = 1
        if v.response_ids:
            responses[b, :len(v.response_ids)] = torch.tensor(v.response_ids)
            response_mask[b, :len(v.response_ids)] = 1
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp_min(0) * attention_mask
    return {"prompts": prompts, "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask, "position_ids": position_ids,
            "response_mask": response_mask}


def loss_fields(batch: LossBatch, width: int) -> dict[str, Tensor]:
    """HACPO's per-row inputs as TensorDict fields ([B] and [B, width])."""
    fields: dict[str, Tensor] = {}
    for name, attr in ROW_FIELDS.items():
        fields[name] = getattr(batch, attr)
    for name, attr in TOKEN_FIELDS.items():
        value = getattr(batch, attr)
        if value is not None:
            fields[name] = _widen(value.float(), width)
    fields["hacrl_real"] = torch.ones(batch.advantages.shape[0], dtype=torch.bool)
    return fields


def _widen(t: Tensor, width: int) -> Tensor:
    if t.shape[1] >= width:
        return t[:, :width]
    return torch.nn.functional.pad(t, (0, width - t.shape[1]))


def pad_rows(views: list[TokenView], fields: dict[str, Tensor],
             multiple: int) -> tuple[list[TokenView], dict[str, Tensor]]:
    """Append copies of row 0 until the row count divides by `multiple` (data-parallel ranks).

    The copies are marked not real and get no advantage, omega, own or cross flag; the loss
    masks them out (their response mask is cleared in `to_tensordict`).
    """
    extra = (-len(views)) % multiple
    if extra == 0:
        return views, fields
    padded = {k: torch.cat([v, torch.zeros_like(v[:1]).expand(extra, *v.shape[1:])])
              for k, v in fields.items()}
    return views + [views[0]] * extra, padded


def row_multiple(config: Any, world_size: int) -> int:
    """Rows every worker-group call is padded to: the data-parallel ranks times, unless
    micro-batches are sized by tokens, a common multiple of the actor's, the rollout's and the
    reference's micro-batch sizes (each rank must hold whole micro-batches)."""
    a = config.actor_rollout_ref
    if a.actor.use_dynamic_bsz:
        return world_size
    sizes = [a.actor.ppo_micro_batch_size_per_gpu, a.rollout.log_prob_micro_batch_size_per_gpu,
             a.ref.log_prob_micro_batch_size_per_gpu]
    return world_size * math.lcm(*(int(s) for s in sizes if s))


def to_tensordict(views: Sequence[TokenView], pad_id: int,
                  fields: Mapping[str, Tensor] | None = None,
                  meta: Mapping[str, Any] | None = None) -> Any:
    """verl's no-padding TensorDict for these rows, with extra per-row `fields` and non-tensor
    `meta` (e.g. temperature, compute_loss) attached."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    tensors: dict[str, Any] = padded_batch(views, pad_id)
    if fields:
        tensors.update(fields)
        if "hacrl_real" in fields:  # filler rows: nothing to learn from
            tensors["response_mask"] = tensors["response_mask"] * fields["hacrl_real"][:, None]
    data = tu.get_tensordict(tensors)
    data = left_right_2_no_padding(data)
    if meta:
        tu.assign_non_tensor(data, **dict(meta))
    return data


def response_logprobs(model_logp: Tensor, data: Any) -> Tensor:
    """[B, R] log-probs of each row's response tokens from a model output in any of verl's
    layouts: jagged nested [B, j], flat [total_tokens] (padding removed), or padded [B, R]."""
    from verl.workers.utils.padding import no_padding_2_padding

    if not model_logp.is_nested and model_logp.dim() == 2:
        return model_logp
    return no_padding_2_padding(model_logp, data)


def split_logprobs(padded: Tensor, views: Sequence[TokenView]) -> list[Tensor]:
    """Per-view 1-D log-probs of exactly its response tokens (the engine interface's shape)."""
    return [padded[b, :len(v.response_ids)].float().cpu() for b, v in enumerate(views)]


def loss_batch(data: Any) -> LossBatch:
    """The LossBatch a training TensorDict carries (on the worker, inside the loss)."""
    missing = [k for k in (*ROW_FIELDS, "old_log_probs") if k not in data.keys()]
    if missing:
        raise KeyError(f"training batch lacks {', '.join(missing)}: it was not built by "
                       "hacrl.engines.verl.batch.to_tensordict with loss fields")
    token_keys = ["response_mask", *(k for k in TOKEN_FIELDS if k in data.keys())]
    padded = data.select(*token_keys).to_padded_tensor()
    mask = padded["response_mask"].float()
    real = data["hacrl_real"].bool() if "hacrl_real" in data.keys() else None
    if real is not None:
        mask = mask * real[:, None]
    ref = padded["ref_log_prob"].float() if "ref_log_prob" in padded.keys() else None
    return LossBatch(
        response_mask=mask,
        old_logp=_widen(padded["old_log_probs"].float(), mask.shape[1]),
        source_mean_logp=data["hacrl_source_mean_logp"].float(),
        advantages=data["hacrl_advantages"].float(),
        omega=data["hacrl_omega"].float(),
        cross=data["hacrl_cross"].bool(),
        own=data["hacrl_own"].bool(),
        ref_logp=_widen(ref, mask.shape[1]) if ref is not None else None,
    )


__all__ = ["ROW_FIELDS", "TOKEN_FIELDS", "loss_batch", "loss_fields", "pad_rows", "padded_batch",
           "response_logprobs", "row_multiple", "split_logprobs", "to_tensordict"]
