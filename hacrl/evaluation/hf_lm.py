"""lm-eval's `hf` model with one batch size for greedy requests and another for sampled ones.

Sampled responses follow torch's random stream batch by batch, so their batch size is part of
what a sampled score depends on (`eval.batch_size`, kept as it was). Greedy responses draw no
random numbers and come out the same at any batch size; on a CPU at tiny scale a few hundred
rows per `generate` call cost ~1.2-1.8x less than 64 (fewer forward passes; each pass's cost
grows with the rows it carries, so larger batches gain nothing more). `eval.greedy_batch_size`
sets them apart. Imported only when an hf evaluation runs (importing lm-eval's hf model loads
transformers' generation stack).
"""

from __future__ import annotations

from typing import Any

from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM

from hacrl.engines.attention import use_decode_attention


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
