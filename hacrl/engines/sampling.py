"""Sampling from a Hugging Face causal LM: token ids in, token ids out.

One function for every place that samples from an HF model: the local engine, and the verl
engine's `hf` rollout inside its workers (`hacrl.engines.verl.hf_rollout`), so both engines
turn the same prompts, weights and random state into the same responses.
"""

from __future__ import annotations

from typing import Any

import torch

from hacrl.algo.rollout import SamplingParams
from hacrl.engines.base import Generation
from hacrl.engines.kv_cache import preallocated_cache
from hacrl.zoo.lean_decoder import lean_decoder, lean_generate


@torch.no_grad()
def hf_sample(model: Any, rows: list[list[int]], sampling: SamplingParams, *, pad_id: int,
              eos: int, device: torch.device | str = "cpu",
              logprobs_temperature: float | None = None) -> list[Generation]:
    """One response per row of prompt ids, batched with left padding: the lean decoder for the
    zoo's models on a CPU (`hacrl.zoo.lean_decoder`), else `generate` with a preallocated
    KV cache (`hacrl.engines.kv_cache`); the same tokens either way.

    A response ends with its EOS (kept, `finished`) or at `max_new_tokens` (unfinished).
    Sampling draws from torch's global RNG on `device`: seed it for reproducible responses.
    With `logprobs_temperature` (and sampling), each response also carries its tokens'
    log-probs from the logits `generate` computed anyway: log-softmax(logits / temperature),
    the same quantity a forward over prompt + response gives (`LocalEngine.log_probs`, equal
    up to float rounding), so the step need not run that forward again.
    """
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for b, ids in enumerate(rows):  # left padding: the prompts end where generation starts
        input_ids[b, width - len(ids):] = torch.tensor(ids)
        attention[b, width - len(ids):] = 1
    score_at = None if sampling.greedy else logprobs_temperature
    decoder = lean_decoder(model) if torch.device(device).type == "cpu" else None
    if decoder is not None:  # the zoo's models on a CPU: the same tokens, 1.2-1.6x faster
        new_tokens, logits = lean_generate(
            decoder, input_ids, attention, max_new_tokens=sampling.max_new_tokens, eos=[eos],
            pad_id=pad_id, greedy=sampling.greedy, temperature=sampling.temperature,
            top_p=sampling.top_p, keep_logits=score_at is not None)
    else:
        new_tokens, logits = _generate(model, input_ids.to(device), attention.to(device),
                                       sampling, pad_id=pad_id, eos=eos,
                                       keep_logits=score_at is not None)
    token_logp: list[list[float]] | None = None
    if logits is not None and score_at is not None:
        token_logp = (torch.log_softmax(logits.float() / score_at, dim=-1)
                      .gather(-1, new_tokens[..., None]).squeeze(-1).cpu().tolist())
    gens = []
    for b, tokens in enumerate(new_tokens.tolist()):
        finished = eos in tokens
        end = tokens.index(eos) + 1 if finished else len(tokens)
        logp = token_logp[b][:end] if token_logp is not None else None
        gens.append(Generation(tokens[:end], finished, logp))
    return gens


def _generate(model: Any, input_ids: torch.Tensor, attention: torch.Tensor,
              sampling: SamplingParams, *, pad_id: int, eos: int,
              keep_logits: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HF `generate`: the new tokens [B, T'] and, with `keep_logits`, the raw logits [B, T', V]
    of every step, before temperature and top-p."""
    width = input_ids.shape[1]
    kwargs: dict[str, Any] = dict(max_new_tokens=sampling.max_new_tokens, eos_token_id=eos,
                                  pad_token_id=pad_id)
    cache = preallocated_cache(model, width + sampling.max_new_tokens)
    if cache is not None:  # keys and values written in place, not concatenated per token
        kwargs.update(past_key_values=cache)
    if sampling.greedy:
        kwargs.update(do_sample=False)
    else:
        kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                      top_k=0)
    if keep_logits:
        kwargs.update(output_logits=True, return_dict_in_generate=True)
    out = model.generate(input_ids=input_ids, attention_mask=attention, **kwargs)
    if not keep_logits:
        return out[:, width:], None
    return out.sequences[:, width:], torch.stack(out.logits, dim=1)


__all__ = ["hf_sample"]
