"""lm-eval's `hf` model with one batch size for greedy requests and another for sampled ones.

Sampled responses follow torch's random stream batch by batch, so their batch size is part of
what a sampled score depends on (`eval.batch_size`, kept as it was). Greedy responses draw no
random numbers and come out the same at any batch size; on a CPU at tiny scale 512 rows per
`generate` call cost ~1.1x less than 256 and 256 ~1.2-1.8x less than 64 (fewer forward passes,
each with a fixed cost; 1024 gains nothing more). `eval.greedy_batch_size` sets them apart.

Two fixed costs of every evaluation are cut here as well, the prompts and tokens unchanged:
lm-eval's `generate_until` tokenizes each context twice (one string at a time to sort the
requests by length, then each batch again into padded tensors), and renders every prompt's
chat template anew in each evaluation. Here each context is tokenized once, all in one call
of the fast tokenizer, and rendered prompts are kept for the next evaluation in the process
with the same template (the second agent of a cell, a model evaluated again).

Imported only when an hf evaluation runs (importing lm-eval's hf model loads transformers'
generation stack).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM

from hacrl.engines.attention import use_decode_attention
from hacrl.engines.kv_cache import preallocated_cache
from hacrl.engines.lean_decoder import lean_decoder, lean_generate

# Rendered prompts, per chat-template setting (`SplitBatchHFLM._template_key`), then per
# message list: the same problems are rendered by every evaluation of a process, and the
# rendering is a pure function of the template, its arguments and the messages.
_RENDERED: dict[tuple[str, ...], dict[tuple[Any, ...], str]] = {}
# generation config keys that leave greedy `generate` as argmax until EOS or the length limit
_PLAIN_GENERATION = {"eos_token_id", "pad_token_id", "bos_token_id", "use_cache",
                     "output_attentions", "output_hidden_states", "transformers_version",
                     "_from_model_config"}
RENDERED_MAX = 200_000  # prompts kept in all (~1 KB each at tiny scale); past it, start over


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
        # token ids per (special-token setting, context) while `generate_until` runs
        self._encoded: dict[tuple[Any, ...], dict[str, list[int]]] | None = None
        self._prefix = ""  # the prefix token's text, which `tok_encode` looks for
        self._template_key: tuple[str, ...] | None = _template_key(self)
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
        if not stop:
            sequences = self._lean_greedy(context, max_length, generation_kwargs)
            if sequences is not None:
                return sequences
        cache = preallocated_cache(self.model, max_length)
        if cache is not None:
            generation_kwargs["past_key_values"] = cache
        return super()._model_generate(context, max_length, stop, **generation_kwargs)

    def _lean_greedy(self, context: torch.Tensor, max_length: int,
                     generation_kwargs: dict[str, Any]) -> torch.Tensor | None:
        """Greedy sequences [B, max_length or less] of the zoo's models on a CPU from
        `lean_generate` (the same tokens as `generate`, ~1.4x faster), or None where `generate`
        would do more than argmax and stop at EOS (sampling, any other generation setting)."""
        settings = dict(generation_kwargs)
        attention = settings.pop("attention_mask", None)  # lm-eval passes the padding's mask
        decoder = lean_decoder(self.model) if self.device.type == "cpu" else None
        width = context.shape[1]
        config = self.model.generation_config
        eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
        # greedy as lm-eval asks for it: do_sample false, temperature 0 or unset (it drops it)
        greedy = settings.pop("do_sample", None) is False and settings.pop("temperature", 0.0) == 0.0
        if (decoder is None or not greedy or settings or max_length <= width
                or None in eos or not set(config.to_diff_dict()) <= _PLAIN_GENERATION):
            return None
        pad = self.tokenizer.pad_token_id
        pad = eos[0] if pad is None else int(pad)
        if attention is None:  # `generate` infers one from the padding, unless pad is an EOS
            padded = bool((context == pad).any()) and pad not in eos
            attention = context.ne(pad).long() if padded else torch.ones_like(context)
        if not bool(attention[:, -1].all()):  # right padding: leave it to `generate`
            return None
        new, _ = lean_generate(decoder, context, attention, max_new_tokens=max_length - width,
                               eos=eos, pad_id=pad, greedy=True)
        return torch.cat([context, new], dim=1)

    def _eos_text(self) -> str:
        return str(self.tok_decode(self.eot_token_id, skip_special_tokens=False))

    def _stops_at_eos(self) -> bool:
        """Whether `generate` ends a row at the tokenizer's EOS on its own (the model's
        generation config names it)."""
        ids = getattr(self.model.generation_config, "eos_token_id", None)
        ids = ids if isinstance(ids, list) else [ids]
        return self.eot_token_id is not None and self.eot_token_id in ids

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        """`HFLM.generate_until` (greedy and sampled parts apart), every context tokenized once
        up front and the ids reused by `tok_encode` (the sort by length) and `tok_batch_encode`
        (each batch's padded tensors); the ids are dropped when the call ends."""
        self._encoded, self._prefix = {}, self.tokenizer.decode(self.prefix_token_id)
        try:
            self._encode_contexts([r.args[0] for r in requests])
            return self._generate_in_parts(requests, disable_tqdm)
        finally:
            self._encoded = None

    def _generate_in_parts(self, requests: list[Instance], disable_tqdm: bool) -> list[str]:
        """Greedy requests in batches of `greedy_batch_size`, the others of `batch_size`."""
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

    def _encode_contexts(self, contexts: list[Any]) -> None:
        """Tokenize the distinct contexts in one call per special-token setting, the setting
        `tok_encode` picks for each (all contexts share it in practice)."""
        by_setting: dict[tuple[Any, ...], list[str]] = {}
        for text in dict.fromkeys(c for c in contexts if isinstance(c, str)):
            by_setting.setdefault(_setting(self._single_special(text)), []).append(text)
        for setting, texts in by_setting.items():
            self._ids(texts, dict(setting))

    def _ids(self, texts: list[str], special: dict[str, bool]) -> list[list[int]]:
        """Token ids of `texts` under `special` (add_special_tokens or nothing), those not
        tokenized yet in one batch call (per text the same ids as `tokenizer.encode`)."""
        assert self._encoded is not None
        known = self._encoded.setdefault(_setting(special), {})
        missing = list(dict.fromkeys(t for t in texts if t not in known))
        if missing:
            ids = self.tokenizer(missing, return_attention_mask=False,
                                 return_token_type_ids=False, **special)["input_ids"]
            known.update(zip(missing, ids, strict=True))
        return [known[t] for t in texts]

    def _single_special(self, text: str) -> dict[str, bool]:
        """The special-token setting `HFLM.tok_encode` uses for one string: no special tokens
        when it starts with the prefix token's text, else `add_bos_token` when one is set."""
        if text.startswith(self._prefix):
            return {"add_special_tokens": False}
        return {} if self.add_bos_token is None else {"add_special_tokens": self.add_bos_token}

    def _batch_special(self, texts: list[str]) -> dict[str, bool] | None:
        """The setting `HFLM.tok_batch_encode` uses for a batch (decided by its first string
        and the BOS token's text); None where this class leaves the batch to lm-eval."""
        bos = self.tokenizer.bos_token
        if self.backend != "causal" or not (bos is None or isinstance(bos, str)):
            return None
        if bos is not None and texts[0].startswith(bos):
            return {"add_special_tokens": False}
        return {} if self.add_bos_token is None else {"add_special_tokens": self.add_bos_token}

    def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                   left_truncate_len: int | None = None, **kwargs: Any) -> list[int]:
        """`HFLM.tok_encode`, from the ids of `_encode_contexts` while `generate_until` runs."""
        if (self._encoded is None or add_special_tokens is not None or left_truncate_len
                or kwargs or not isinstance(string, str)):
            return super().tok_encode(string, add_special_tokens, left_truncate_len, **kwargs)
        return list(self._ids([string], self._single_special(string))[0])

    def tok_batch_encode(self, strings: list[str], padding_side: str = "left",
                         left_truncate_len: int | None = None, truncation: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """`HFLM.tok_batch_encode` from known ids: left-padded with the pad token, the mask 0
        on the padding. Anything else (truncation, right padding, a batch longer than
        `left_truncate_len`, which lm-eval cuts with a warning) goes to lm-eval's own."""
        special = (self._batch_special(strings)
                   if self._encoded is not None and strings and not truncation
                   and padding_side == "left" else None)
        pad = self.tokenizer.pad_token_id
        if special is None or pad is None:
            return super().tok_batch_encode(strings, padding_side, left_truncate_len, truncation)
        ids = self._ids(list(strings), special)
        if left_truncate_len and max(map(len, ids)) > left_truncate_len:
            return super().tok_batch_encode(strings, padding_side, left_truncate_len, truncation)
        return left_padded(ids, int(pad))

    def apply_chat_template(self, chat_history: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        """`HFLM.apply_chat_template`, each message list rendered once per template setting
        in this process (see `_RENDERED`)."""
        key = _messages_key(chat_history, add_generation_prompt)
        if self._template_key is None or key is None:
            return super().apply_chat_template(chat_history, add_generation_prompt)
        rendered = _RENDERED.setdefault(self._template_key, {})
        text = rendered.get(key)
        if text is None:
            text = super().apply_chat_template(chat_history, add_generation_prompt)
            if sum(map(len, _RENDERED.values())) >= RENDERED_MAX:
                _RENDERED.clear()
                rendered = _RENDERED.setdefault(self._template_key, {})
            rendered[key] = text
        return text


def _setting(special: dict[str, bool]) -> tuple[Any, ...]:
    return tuple(sorted(special.items()))


def left_padded(ids: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ids as one left-padded int64 tensor and its attention mask (what the fast
    tokenizer returns with `padding="longest"` on the left, without its per-token Python)."""
    longest = max(map(len, ids))
    tokens = np.full((len(ids), longest), pad, dtype=np.int64)
    mask = np.zeros((len(ids), longest), dtype=np.int64)
    for row, seq in enumerate(ids):
        if seq:
            tokens[row, longest - len(seq):] = seq
            mask[row, longest - len(seq):] = 1
    return torch.from_numpy(tokens), torch.from_numpy(mask)


def _template_key(lm: HFLM) -> tuple[str, ...] | None:
    """What a rendering depends on besides the messages: the template, its arguments (the
    thinking switch) and the special tokens it is given. None where a rendering may differ
    between calls (a template that reads the clock) or no template is found."""
    try:
        template = lm.tokenizer.get_chat_template()
    except (ValueError, AttributeError):
        return None
    if not isinstance(template, str) or "strftime_now" in template:
        return None
    specials = sorted((k, str(v)) for k, v in lm.tokenizer.special_tokens_map.items())
    return template, repr(sorted(lm.chat_template_args.items())), repr(specials)


def _messages_key(chat_history: list[dict[str, str]], add_generation_prompt: bool
                  ) -> tuple[Any, ...] | None:
    """A hashable copy of a message list (None if a message holds something unhashable)."""
    try:
        key = (add_generation_prompt,
               tuple(tuple(message.items()) for message in chat_history))
        hash(key)
    except (TypeError, AttributeError):
        return None
    return key
