"""lm-eval's `hf` model with one batch size for greedy requests and another for sampled ones.

Sampled responses follow torch's random stream batch by batch, so their batch size is part of
what a sampled score depends on (`eval.batch_size`, kept as it was). Greedy responses draw no
random numbers and come out the same at any batch size; on a CPU at tiny scale 512 rows per
`generate` call cost ~1.1x less than 256 and 256 ~1.2-1.8x less than 64 (fewer forward passes,
each with a fixed cost; 1024 gains nothing more). `eval.greedy_batch_size` sets them apart. Imported only when an hf evaluation runs (importing lm-eval's hf model loads
transformers' generation stack).
"""

from __future__ import annotations

from typing import Any

import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM

from hacrl.engines.attention import use_decode_attention
from hacrl.engines.kv_cache import preallocated_cache


def is_greedy(request: Instance) -> bool:
    """A request that draws nothing: generation kwargs with `do_sample: false` (every hacrl_*
    task says so explicitly; anything else keeps the sampled batch size, as before)."""
    kwargs = request.args[1] if len(request.args) > 1 else {}
    return isinstance(kwargs, dict) and kwargs.get("do_sample") is False


class SplitBatchHFLM(HFLM):
    """`HFLM` whose `generate_until` runs greedy requests in batches of `greedy_batch_size` and
    the others in batches of `batch_size`, each part exactly as `HFLM` runs it."""

    batch_size_per_gpu: int | str  # HFLM's batch size (an int here: hacrl never asks for auto)

    def __init__(self, *args: Any, greedy_batch_size: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.greedy_batch_size = greedy_batch_size
        # decoding on a CPU without copying key/value heads (same tokens, ~1.45x faster)
        use_decode_attention(self.model, self.device)

    def _model_generate(self, context: torch.Tensor, max_length: int, stop: list[str],
                        **generation_kwargs: Any) -> torch.Tensor:
        """`HFLM._model_generate` with a preallocated KV cache, and without lm-eval's stop-string
        check when the only stop string is the EOS token's text.

        That check decodes the last tokens of every row at every step (7% of a tiny `generate`)
        to end the batch once each row holds a stop string; `generate` already ends each row at
        the model's EOS token and the batch when all rows have ended, and lm-eval cuts every
        response at its stop strings afterwards, so the responses are the same.
        """
        if stop and all(text == self._eos_text() for text in stop) and self._stops_at_eos():
            stop = []
        cache = preallocated_cache(self.model, max_length)
        if cache is not None:
            generation_kwargs["past_key_values"] = cache
        return super()._model_generate(context, max_length, stop, **generation_kwargs)

    def _eos_text(self) -> str:
        return str(self.tok_decode(self.eot_token_id, skip_special_tokens=False))

    def _stops_at_eos(self) -> bool:
        """Whether `generate` ends a row at the tokenizer's EOS on its own (the model's
        generation config names it)."""
        ids = getattr(self.model.generation_config, "eos_token_id", None)
        ids = ids if isinstance(ids, list) else [ids]
        return self.eot_token_id is not None and self.eot_token_id in ids

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        greedy = [i for i, r in enumerate(requests) if is_greedy(r)]
        if not self.greedy_batch_size or not greedy:
            return super().generate_until(requests, disable_tqdm)
        chosen = set(greedy)
        others = [i for i in range(len(requests)) if i not in chosen]
        out: list[str] = [""] * len(requests)
        # HFLM batches each set of generation kwargs on its own, in the order they first occur;
        # the sampled ones keep that order among themselves, and the greedy ones consume no
        # random numbers, so every sampled batch meets the random state it met before.
        for part, size in ((greedy, self.greedy_batch_size), (others, self.batch_size_per_gpu)):
            if not part:
                continue
            saved, self.batch_size_per_gpu = self.batch_size_per_gpu, size
            try:
                texts = super().generate_until([requests[i] for i in part], disable_tqdm)
            finally:
                self.batch_size_per_gpu = saved
            for i, text in zip(part, texts, strict=True):
                out[i] = text
        return out
