"""Batched sampling for the zoo's model families on a CPU without transformers' per-step machinery.

A tiny model's decoding step is a few hundred operations on tensors of a few thousand numbers,
so what each operation costs to launch decides the step, not the arithmetic. Transformers'
`generate` spends most of a step around the model's matrix products: a mask and rotary
embeddings rebuilt per step, separate q/k/v and gate/up projections, RMSNorm as five
operations, dtype round trips, logits processors and stopping criteria. `LeanDecoder` runs the
same Llama / Qwen3 forward from the model's own weights with fused q/k/v and gate/up
projections, torch's RMSNorm, a rotary table and an additive padding mask built once per
call, and its own key/value buffers; `lean_generate` is `generate`'s sampling loop for what
hacrl asks of it (greedy, or temperature -> top-k -> top-p -> softmax -> `torch.multinomial`,
the order and the random draws of transformers' sampler). Logits equal transformers' up to
float rounding (~1e-5), so the same tokens come out (`tests/test_lean_decoder.py`) except at a
near-tie: in a whole tiny paper sweep, 130 of 132 cells scored exactly as under `generate` and
two moved by <= 0.11 points of AVG.

Only plain causal Llama and Qwen3 models in float32 on a CPU qualify (`lean_decoder` returns
None for anything else, and callers use `generate`): that is the whole tiny zoo. The weights
are read when the decoder is made, so make one per `generate`-sized call: training updates them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["LeanDecoder", "finish_block", "fused_layer", "lean_decoder", "lean_generate",
           "project_qkv", "rotary_frequencies", "rotary_table", "rotate", "zoo_family"]

PREFILL_ROWS = 32
_FAMILIES = {"LlamaForCausalLM": False, "Qwen3ForCausalLM": True}  # -> q/k RMSNorm per head


@dataclass(frozen=True)
class FusedLayer:
    attn_norm: Tensor  # [hidden]
    qkv: Tensor  # [(H + 2 H_kv) D, hidden]: q, k and v projections stacked
    q_norm: Tensor | None  # [D] (Qwen3)
    k_norm: Tensor | None  # [D] (Qwen3)
    out: Tensor  # [hidden, H D]
    mlp_norm: Tensor  # [hidden]
    gate_up: Tensor  # [2 I, hidden]: gate and up projections stacked
    down: Tensor  # [hidden, I]


def zoo_family(model: Any) -> tuple[bool, float] | None:
    """(q/k RMSNorm per head, rope theta) of a plain causal Llama / Qwen3 model in float32 on a
    CPU, whose forward the lean code here and `hacrl.engines.prompt_sharing` reproduce; None
    for anything else (another architecture or option, another dtype, a GPU)."""
    config = model.config
    arch = type(model).__name__
    rope = getattr(config, "rope_parameters", None) or {}
    plain = (arch in _FAMILIES
             and config.hidden_act == "silu" and not getattr(config, "attention_bias", False)
             and not getattr(config, "mlp_bias", False)
             and rope.get("rope_type", "default") == "default"
             and getattr(config, "sliding_window", None) is None
             and int(getattr(config, "pretraining_tp", 1) or 1) == 1)
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    weight = model.get_input_embeddings().weight
    if (not plain or theta is None or weight.dtype != torch.float32
            or weight.device.type != "cpu"):
        return None
    return _FAMILIES[arch], float(theta)


def lean_decoder(model: Any) -> LeanDecoder | None:
    """A `LeanDecoder` of `model`'s current weights, or None where it does not apply (not a
    `zoo_family` model, or in training mode)."""
    family = None if model.training else zoo_family(model)
    if family is None:
        return None
    qk_norm, theta = family
    return LeanDecoder(model, qk_norm=qk_norm, theta=theta)


class LeanDecoder:
    """Llama / Qwen3 forward over a batch of left-padded rows, with its own key/value buffers.

    Shapes: B rows, L positions in all (prompt width + new tokens), H query and H_kv key/value
    heads of D dims, hidden size E, MLP width I, vocabulary V.
    """

    def __init__(self, model: Any, *, qk_norm: bool, theta: float) -> None:
        config, base = model.config, model.model
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = float(config.rms_norm_eps)
        self.embed = base.embed_tokens.weight  # [V, E]
        self.lm_head = model.lm_head.weight  # [V, E] (the embedding when tied)
        self.final_norm = base.norm.weight
        self.layers = [fused_layer(block, qk_norm) for block in base.layers]
        self.inv_freq = rotary_frequencies(self.head_dim, theta)  # [D/2]

    def start(self, attention: Tensor, length: int) -> None:
        """Empty buffers for a batch whose prompts are `attention` [B, P] (1 = token, 0 = left
        pad), with room for `length` positions; every position past P is a generated token."""
        batch, width = attention.shape
        # keys [B, H_kv, D, L] (stored transposed: the score product reads them as they lie,
        # ~1.6x faster than a transposed view), values [B, H_kv, L, D]
        self.keys = [self.embed.new_zeros((batch, self.kv_heads, self.head_dim, length))
                     for _ in self.layers]
        self.values = [self.embed.new_zeros((batch, self.kv_heads, length, self.head_dim))
                       for _ in self.layers]
        valid = torch.ones((batch, length), dtype=torch.bool)
        valid[:, :width] = attention.bool()
        # [B, 1, 1, L]: 0 where a key may be attended, -inf on the left padding
        self.key_mask = torch.zeros((batch, 1, 1, length)).masked_fill_(~valid[:, None, None],
                                                                        float("-inf"))
        # each row's positions count its own tokens only (transformers: cumsum(mask) - 1)
        self.first_position = attention.sum(-1)  # [B] position of the first new token
        self.prompt_positions = (attention.cumsum(-1) - 1).clamp_min(0)  # [B, P]
        self.cos, self.sin = rotary_table(torch.arange(length), self.inv_freq)  # [L, D]

    def prefill(self, input_ids: Tensor) -> Tensor:
        """Logits [B, V] of the next token after the prompts [B, P]; fills the buffers."""
        width = input_ids.shape[1]
        causal = torch.full((width, width), float("-inf")).triu_(1)  # [P, P]
        mask = self.key_mask[..., :width] + causal
        # a left pad's query may see itself, so no row is fully masked (its output is unused)
        mask.diagonal(dim1=-2, dim2=-1).clamp_(min=0.0)
        # a few rows at a time: a chunk's activations stay in the core's cache (prompt-long
        # rows are what the engine's log-prob forwards batch by `engine.forward_rows` too)
        chunks = [slice(first, first + PREFILL_ROWS)
                  for first in range(0, input_ids.shape[0], PREFILL_ROWS)]
        return torch.cat([self._forward(input_ids[rows], self.prompt_positions[rows], 0,
                                        mask[rows], rows) for rows in chunks])

    def step(self, tokens: Tensor, index: int) -> Tensor:
        """Logits [B, V] after appending `tokens` [B] as new token `index` (from 0)."""
        start = self.prompt_width + index
        positions = (self.first_position + index)[:, None]  # [B, 1]
        return self._forward(tokens[:, None], positions, start, self.key_mask[..., :start + 1],
                             slice(None))

    @property
    def prompt_width(self) -> int:
        return int(self.prompt_positions.shape[1])

    def _forward(self, ids: Tensor, positions: Tensor, start: int, mask: Tensor,
                 rows: slice) -> Tensor:
        """Logits [B', V] after the last of ids [B', T] (the buffers' `rows`) at `positions`
        [B', T], their keys and values written into the buffers at start..start+T, attending
        to buffer positions < start + T under `mask` [B', 1, T|1, L']."""
        batch, new = ids.shape
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        group = heads // kv_heads
        end = start + new
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # [B, 1, T, D]
        x = F.embedding(ids, self.embed)  # [B, T, E]
        for layer, all_keys, all_values in zip(self.layers, self.keys, self.values, strict=True):
            keys, values = all_keys[rows], all_values[rows]
            q, k, v = project_qkv(layer, x, heads, kv_heads, dim, self.eps)
            keys[..., start:end] = rotate(k.transpose(1, 2), cos, sin).transpose(-1, -2)
            values[:, :, start:end] = v.transpose(1, 2)
            # the query heads of one key/value head side by side: no copies of keys or values
            q = rotate(q.transpose(1, 2), cos, sin).reshape(batch, kv_heads, group * new, dim)
            scores = torch.matmul(q, keys[..., :end]).mul_(dim ** -0.5)
            scores = scores.view(batch, kv_heads, group, new, end).add_(mask[:, :, None])
            attended = torch.matmul(torch.softmax(scores, dim=-1).view(batch, kv_heads,
                                                                       group * new, end),
                                    values[:, :, :end])  # [B, H_kv, group T, D]
            attended = attended.view(batch, heads, new, dim).transpose(1, 2)
            x = finish_block(layer, x, attended.reshape(batch, new, heads * dim), self.eps)
        last = x[:, -1]  # [B', E]: only the next token's logits are wanted
        return F.linear(F.rms_norm(last, last.shape[-1:], self.final_norm, self.eps),
                        self.lm_head)


def fused_layer(block: Any, qk_norm: bool) -> FusedLayer:
    """A decoder block's weights with q/k/v and gate/up stacked (a copy under no_grad; under
    autograd the stacking is part of the graph, so gradients reach the block's own weights)."""
    attn, mlp = block.self_attn, block.mlp
    return FusedLayer(
        attn_norm=block.input_layernorm.weight,
        qkv=torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
        q_norm=attn.q_norm.weight if qk_norm else None,
        k_norm=attn.k_norm.weight if qk_norm else None,
        out=attn.o_proj.weight, mlp_norm=block.post_attention_layernorm.weight,
        gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
        down=mlp.down_proj.weight)


def project_qkv(layer: FusedLayer, x: Tensor, heads: int, kv_heads: int, dim: int,
                eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """Queries [N, T, H, D], keys and values [N, T, H_kv, D] of x [N, T, E], before rotation
    (queries and keys RMS-normed per head in Qwen3)."""
    rows, length, _ = x.shape
    h = F.rms_norm(x, x.shape[-1:], layer.attn_norm, eps)
    q, k, v = F.linear(h, layer.qkv).split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k = q.view(rows, length, heads, dim), k.view(rows, length, kv_heads, dim)
    if layer.q_norm is not None and layer.k_norm is not None:
        q = F.rms_norm(q, (dim,), layer.q_norm, eps)
        k = F.rms_norm(k, (dim,), layer.k_norm, eps)
    return q, k, v.view(rows, length, kv_heads, dim)


def finish_block(layer: FusedLayer, x: Tensor, attended: Tensor, eps: float) -> Tensor:
    """The block after attention, for x [N, T, E] and its attention output [N, T, H D]:
    output projection and residual, then the MLP and its residual."""
    x = x + F.linear(attended, layer.out)
    gate, up = F.linear(F.rms_norm(x, x.shape[-1:], layer.mlp_norm, eps),
                        layer.gate_up).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, layer.down)


def rotary_frequencies(head_dim: int, theta: float) -> Tensor:
    """[D/2] rotary frequencies as transformers' default rope computes them."""
    steps = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    return 1.0 / (theta ** steps)


def rotary_table(positions: Tensor, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
    """cos, sin [..., D] of positions [...] (the halves repeated, transformers' layout)."""
    angles = positions[..., None].float() * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of x [B, heads, T, D] (halves rotated, transformers' layout)."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


def _warp(logits: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """Sampling scores [B, V]: logits / temperature, then the top-k, then the smallest set of
    tokens holding top_p of the probability (the rest -inf; at least one token kept)."""
    scores = logits / temperature if temperature != 1.0 else logits
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        ascending, order = torch.sort(scores, descending=False)
        dropped = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        dropped[:, -1] = False
        scores = scores.masked_fill(dropped.scatter(1, order, dropped), float("-inf"))
    return scores


@torch.no_grad()
def lean_generate(decoder: LeanDecoder, input_ids: Tensor, attention: Tensor, *,
                  max_new_tokens: int, eos: list[int], pad_id: int, greedy: bool,
                  temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                  keep_logits: bool = False) -> tuple[Tensor, Tensor | None]:
    """New tokens [B, T'] for left-padded prompts [B, P] (T' <= max_new_tokens: generation
    ends once every row has drawn an EOS; a row's tokens after its EOS are `pad_id`), and with
    `keep_logits` the raw logits [B, T', V] each token was drawn from.

    One `torch.multinomial` over every row per step, as transformers' sampler draws, so a seeded
    generator gives the same tokens as `generate` with the same settings.
    """
    batch, width = input_ids.shape
    decoder.start(attention, width + max_new_tokens)
    eos_ids = torch.tensor(eos, dtype=torch.long)
    running = torch.ones(batch, dtype=torch.bool)
    tokens: list[Tensor] = []
    kept: list[Tensor] = []
    logits = decoder.prefill(input_ids)
    for index in range(max_new_tokens):
        if keep_logits:
            kept.append(logits)
        if greedy:
            drawn = logits.argmax(dim=-1)
        else:
            probs = torch.softmax(_warp(logits, temperature, top_k, top_p), dim=-1)
            drawn = torch.multinomial(probs, num_samples=1).squeeze(1)
        drawn = torch.where(running, drawn, pad_id)
        tokens.append(drawn)
        running &= ~torch.isin(drawn, eos_ids)
        if not running.any() or index + 1 == max_new_tokens:
            break
        logits = decoder.step(drawn, index)
    new = torch.stack(tokens, dim=1) if tokens else input_ids.new_zeros((batch, 0))
    return new, (torch.stack(kept, dim=1) if keep_logits and kept else None)
