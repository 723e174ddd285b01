"""Response log-probs with every distinct prompt computed once, for the zoo's models on a CPU.

The rows a step scores come in groups that share a prompt: G samples of each prompt, and in
HACPO the partners' samples of the same prompt as well (a 64-row update mini-batch of the tiny
zoo holds about 16 prompts of ~33 tokens and responses of ~22). A forward over whole prompt +
response rows computes each prompt once per row. Here the distinct prompts go through the model
once, [U, P], and the responses, [B, R], attend to their own prompt's keys and values (gathered
per row, so an update's gradient flows back through the prompt's pass) and causally to their
own tokens: 16 x 33 + 64 x 22 positions instead of 64 x 55, ~1.5x faster forward + backward
(`scripts/bench_prompt_sharing.py`).

It is the same Llama / Qwen3 forward as transformers' (right padding: positions count from 0;
the pad token's embedding row gets no gradient, as `nn.Embedding(padding_idx)` gives none), so
log-probs and gradients equal the full-row forward's up to float rounding
(`tests/test_prompt_sharing.py`). Where `zoo_family` says no (another model, dtype or device),
or where dropout would apply in training, `prompt_sharing_logprobs` returns None and the caller
runs the full-row forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from hacrl.algo.rollout import TokenView
from hacrl.zoo.lean_decoder import (
    FusedLayer,
    finish_block,
    fused_layer,
    project_qkv,
    rotary_frequencies,
    rotary_table,
    rotate,
    zoo_family,
)

__all__ = ["prompt_sharing_applies", "prompt_sharing_logprobs", "by_prompt"]


def prompt_sharing_applies(model: Any, training: bool | None = None) -> bool:
    """Whether `prompt_sharing_logprobs` computes `model`'s log-probs, in its current mode or
    in training mode (`training`: True) or eval mode (False)."""
    return zoo_family(model) is not None and _dropout_free(model, training)


def _dropout_free(model: Any, training: bool | None = None) -> bool:
    """No attention dropout applies: none configured, or not in training mode."""
    training = model.training if training is None else training
    return float(getattr(model.config, "attention_dropout", 0.0) or 0.0) == 0.0 or not training


def by_prompt(views: Sequence[TokenView]) -> list[int]:
    """Row indices with the rows of one prompt together (shorter prompts first, then by
    response length): forwards of consecutive rows share as many prompts as they can."""
    return sorted(range(len(views)), key=lambda i: (len(views[i].prompt_ids),
                                                    tuple(views[i].prompt_ids),
                                                    len(views[i].response_ids)))


def prompt_sharing_logprobs(model: Any, views: Sequence[TokenView], width_t: int,
                            temperature: float, pad_id: int) -> Tensor | None:
    """[B, width_t] log-softmax(logits / temperature) of each view's response tokens (0 past a
    response's end), in autograd's graph when grad is enabled; None where it does not apply."""
    family = zoo_family(model)
    if family is None or not _dropout_free(model):
        return None
    qk_norm, theta = family
    return _PromptSharedForward(model, qk_norm, theta)(views, width_t, temperature, pad_id)


class _PromptSharedForward:
    """U distinct prompts of up to P tokens, B rows with responses of up to R tokens; H query and
    H_kv key/value heads of D dims."""

    def __init__(self, model: Any, qk_norm: bool, theta: float) -> None:
        config = model.config
        self.model, self.qk_norm = model, qk_norm
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = float(config.rms_norm_eps)
        self.inv_freq = rotary_frequencies(self.head_dim, theta)

    def __call__(self, views: Sequence[TokenView], width_t: int, temperature: float,
                 pad_id: int) -> Tensor:
        index: dict[tuple[int, ...], int] = {}
        which = torch.tensor([index.setdefault(tuple(v.prompt_ids), len(index)) for v in views])
        prompts = list(index)  # [U] distinct prompts, in order of first use
        prompt_len = torch.tensor([len(p) for p in prompts])  # [U]
        prompt_ids = _right_padded(prompts, max(map(len, prompts)), pad_id)  # [U, P]
        response_ids = _right_padded([v.response_ids for v in views], width_t, pad_id)  # [B, R]
        response_len = torch.tensor([len(v.response_ids) for v in views])  # [B]

        width = prompt_ids.shape[1]
        # prompts: causal attention among their own tokens (right padding: no row is empty)
        prompt_mask = torch.full((width, width), float("-inf")).triu_(1)  # [P, P]
        # responses: their prompt's real tokens, then their own tokens causally
        row_len = prompt_len[which]  # [B]
        hidden_prompt = torch.arange(width)[None] >= row_len[:, None]  # [B, P]
        response_mask = torch.cat([
            torch.zeros((len(views), width_t, width)).masked_fill_(hidden_prompt[:, None],
                                                                   float("-inf")),
            torch.full((width_t, width_t), float("-inf")).triu_(1).expand(len(views), -1, -1),
        ], dim=-1)[:, None]  # [B, 1, R, P + R]
        prompt_rot = self._rotary(torch.arange(width)[None])
        response_rot = self._rotary(row_len[:, None] + torch.arange(width_t)[None])

        base = self.model.model
        embed = base.embed_tokens
        x_prompt = F.embedding(prompt_ids, embed.weight, embed.padding_idx)  # [U, P, E]
        x_response = F.embedding(response_ids, embed.weight, embed.padding_idx)  # [B, R, E]
        for block in base.layers:
            layer = fused_layer(block, self.qk_norm)
            q, k, v = self._qkv(layer, x_prompt, *prompt_rot)
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=prompt_mask,
                                                      enable_gqa=True)
            q_r, k_r, v_r = self._qkv(layer, x_response, *response_rot)
            attended_r = F.scaled_dot_product_attention(
                q_r, torch.cat([k[which], k_r], dim=2), torch.cat([v[which], v_r], dim=2),
                attn_mask=response_mask, enable_gqa=True)
            x_prompt = finish_block(layer, x_prompt, _merge_heads(attended), self.eps)
            x_response = finish_block(layer, x_response, _merge_heads(attended_r), self.eps)
        # response token t is predicted from the position before it: the prompt's last token
        # for t = 0, response token t - 1 after that
        last = x_prompt[torch.arange(len(prompts)), prompt_len - 1][which]  # [B, E]
        before = torch.cat([last[:, None], x_response[:, :-1]], dim=1)  # [B, R, E]
        logits = F.linear(F.rms_norm(before, before.shape[-1:], base.norm.weight, self.eps),
                          self.model.lm_head.weight) / temperature
        logp = torch.log_softmax(logits, dim=-1).gather(-1, response_ids[..., None]).squeeze(-1)
        return logp * (torch.arange(width_t)[None] < response_len[:, None])

    def _rotary(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin [N, 1, T, D] of positions [N, T]."""
        cos, sin = rotary_table(positions, self.inv_freq)
        return cos[:, None], sin[:, None]

    def _qkv(self, layer: FusedLayer, x: Tensor, cos: Tensor,
             sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Rotated queries [N, H, T, D], keys and values [N, H_kv, T, D] of x [N, T, E]."""
        q, k, v = project_qkv(layer, x, self.heads, self.kv_heads, self.head_dim, self.eps)
        return (rotate(q.transpose(1, 2), cos, sin), rotate(k.transpose(1, 2), cos, sin),
                v.transpose(1, 2))


def _merge_heads(attended: Tensor) -> Tensor:
    """[N, H, T, D] -> [N, T, H D]."""
    rows, _, length, _ = attended.shape
    return attended.transpose(1, 2).reshape(rows, length, -1)


def _right_padded(rows: Sequence[Sequence[int]], width: int, pad_id: int) -> Tensor:
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for b, ids in enumerate(rows):
        out[b, :len(ids)] = torch.tensor(list(ids), dtype=torch.long)
    return out
