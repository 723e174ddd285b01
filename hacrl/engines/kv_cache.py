"""A key/value cache for HF `generate` that writes each step in place instead of concatenating.

Transformers' default `DynamicCache` grows every layer's keys and values with `torch.cat` at
every decoding step, copying the whole cache each time: for the tiny models on a CPU that copy
was 21% of a 256-row greedy `generate` (torch profiler, `aten::cat`), more than the attention.
`PreallocatedCache` gives each layer buffers long enough for the prompt and every new token
(`generate`'s max length is known before it starts), writes each step's keys and values into
them, and hands the attention views of the filled part: the same numbers in the same order, so
the same tokens (greedy and sampled, `tests/test_kv_cache.py`), at ~1.15-1.25x the speed of a
256-row `generate` on the zoo models.

Used by every HF `generate` hacrl runs: `hf_sample` (training rollouts, validation, verl's `hf`
rollout) and lm-eval's `hf` model (`hacrl.evaluation.hf_lm`).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor
from transformers.cache_utils import DynamicCache, DynamicLayer

__all__ = ["PreallocatedCache", "PreallocatedLayer", "preallocated_cache"]


class PreallocatedLayer(DynamicLayer):
    """One layer's keys and values `[B, H_kv, capacity, D]`, filled from the left.

    `keys` / `values` are views `[B, H_kv, length, D]` of the buffers. Anything that replaces
    them from outside (`crop`, `batch_select_indices`, beam reordering) is noticed at the next
    `update`, which copies the replaced tensors into fresh buffers before writing.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self._key_buffer: Tensor | None = None
        self._value_buffer: Tensor | None = None
        self._view: Tensor | None = None  # the keys view this layer handed out last

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any,
               **kwargs: Any) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys, values = self.keys, self.values
        assert keys is not None and values is not None  # set by lazy_initialization
        start = keys.shape[-2] if keys.dim() == 4 else 0
        end = start + key_states.shape[-2]
        if (self._key_buffer is None or keys is not self._view
                or end > self._key_buffer.shape[-2]
                or self._key_buffer.shape[0] != key_states.shape[0]):
            self._reseat(start, end, key_states, value_states)
        assert self._key_buffer is not None and self._value_buffer is not None
        self._key_buffer[:, :, start:end] = key_states
        self._value_buffer[:, :, start:end] = value_states
        self.keys = self._key_buffer[:, :, :end]
        self.values = self._value_buffer[:, :, :end]
        self._view = self.keys
        return self.keys, self.values

    def _reseat(self, start: int, end: int, key_states: Tensor, value_states: Tensor) -> None:
        """New buffers with room for `end` positions (twice that past the planned capacity),
        holding the first `start` positions of the current keys and values."""
        length = self.capacity if end <= self.capacity else 2 * end
        batch = key_states.shape[0]
        self._key_buffer = key_states.new_empty((batch, key_states.shape[1], length,
                                                 key_states.shape[-1]))
        self._value_buffer = value_states.new_empty((batch, value_states.shape[1], length,
                                                     value_states.shape[-1]))
        if start:
            assert self.keys is not None and self.values is not None
            self._key_buffer[:, :, :start] = self.keys
            self._value_buffer[:, :, :start] = self.values


class PreallocatedCache(DynamicCache):
    """A `DynamicCache` whose full-attention layers are `PreallocatedLayer`s of `capacity`
    positions (other layer kinds, e.g. sliding windows, stay as transformers builds them)."""

    def __init__(self, config: Any, capacity: int) -> None:
        super().__init__(config=config)
        self.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer
                       for layer in self.layers]


def preallocated_cache(model: Any, capacity: int) -> PreallocatedCache | None:
    """A cache for one `generate` call of `model` over at most `capacity` positions (prompt
    width + new tokens); None for models whose cache transformers does not build from the
    config alone (encoder-decoders, models without a `num_hidden_layers`)."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        return None
    try:
        return PreallocatedCache(config.get_text_config(decoder=True), capacity)
    except (AttributeError, TypeError, ValueError):
        return None

