"""Attention for one new token per row (decoding) without copying the key/value heads.

The tiny models use grouped-query attention (4 query heads, 2 key/value heads). Transformers'
`sdpa` path repeats each key/value head for its query heads before calling torch's kernel
whenever a mask is present (always, with left-padded batches), and on a CPU torch's fused
kernel then runs one small problem per (row, head). For a decoding step (one query per row)
that copy plus the per-head overhead are most of the step: measured on 2 cores, a 1024-row
decoding step of a tiny model spent 41% in the copy and 26% in the kernel against 4% in the
model's matrix products.

`grouped_decode_attention` computes the same softmax(q k^T * scale + mask) v for a single query
with the query heads of one key/value head side by side, as two batched matrix products over
(row, key/value head); longer queries (prefill, log-prob and update forwards) go to transformers'
`sdpa` function unchanged. Greedy generations were token-identical to `sdpa` on the zoo models
(1024 rows, `tests/test_decode_attention.py` checks it) and generation ran ~1.45x faster.
Used on CPUs only: on a GPU `sdpa` is what the kernels are built for.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["DECODE_ATTENTION", "grouped_decode_attention", "use_decode_attention"]

DECODE_ATTENTION = "hacrl_grouped_decode"


def grouped_decode_attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                             attention_mask: Tensor | None, dropout: float = 0.0,
                             scaling: float | None = None, is_causal: bool | None = None,
                             **kwargs: Any) -> tuple[Tensor, None]:
    """Attention output `[B, q_len, H, D]` (transformers' attention-function contract).

    query `[B, H, q_len, D]`; key, value `[B, H_kv, L, D]` with H a multiple of H_kv (query head
    h reads key/value head h // (H / H_kv), as transformers' `repeat_kv` lays them out);
    attention_mask `[B, 1, q_len, >=L]`, boolean (True = attend) or additive, as `sdpa` gets it.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, q_len, dim = query.shape
    if q_len != 1 or dropout > 0.0 or module.training:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    kv_heads = key.shape[1]
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)   # [B, H_kv, H/H_kv, D]
    scores = torch.matmul(grouped, key.transpose(-1, -2))              # [B, H_kv, H/H_kv, L]
    scores.mul_(scaling if scaling is not None else dim ** -0.5)
    if attention_mask is not None:
        mask = attention_mask[:, :, :, : key.shape[-2]]                # [B, 1, 1, L]
        if mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        else:
            scores.add_(mask)
    out = torch.matmul(torch.softmax(scores, dim=-1), value)           # [B, H_kv, H/H_kv, D]
    return out.reshape(batch, 1, heads, dim), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(DECODE_ATTENTION, grouped_decode_attention)
    # the masks are built as for sdpa, which the longer queries are handed to
    AttentionMaskInterface.register(DECODE_ATTENTION, sdpa_mask)


def use_decode_attention(model: Any, device: torch.device | str) -> None:
    """Switch a loaded transformers model to `grouped_decode_attention` when it runs on a CPU
    and currently uses `sdpa` (anything else, e.g. eager attention asked for on purpose, stays)."""
    if torch.device(device).type != "cpu":
        return
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return
    _register()
    model.set_attn_implementation(DECODE_ATTENTION)
