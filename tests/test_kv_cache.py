"""The preallocated KV cache (`hacrl.engines.kv_cache`) changes how keys and values are stored,
not what `generate` computes: the same greedy and sampled tokens as transformers' own cache,
on both model families; a replaced cache (cropped, rows selected) is re-seated correctly; and the
lm-eval model drops its stop-string check only where `generate` already stops at EOS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hacrl.algo.rollout import SamplingParams
from hacrl.engines import sampling as sampling_module
from hacrl.engines.kv_cache import PreallocatedCache, PreallocatedLayer, preallocated_cache
from hacrl.engines.sampling import hf_sample

# transformers' `generate` path (GPUs, other architectures): the zoo's models on a CPU take the
# lean decoder (`tests/test_lean_decoder.py`)
pytestmark = pytest.mark.usefixtures("transformers_generate")


def _rows(tokenizer: Any) -> list[list[int]]:
    texts = ["What is 12+34?", "What is 7*46?", "Hi", "What is 12+34+56? Think."]
    return [list(tokenizer(t).input_ids) for t in texts] * 3  # left padding matters


@pytest.mark.parametrize("model", ["qwen3-4b-base", "llama3.2-1b-instruct"])
def test_same_tokens_as_transformers_cache(micro_zoo: Path, one_thread: None, model: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(micro_zoo / model)
    lm = AutoModelForCausalLM.from_pretrained(micro_zoo / model).eval()
    rows = _rows(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    made: list[Any] = []

    def counted(model: Any, capacity: int) -> Any:
        made.append(preallocated_cache(model, capacity))
        return made[-1]

    for params in (SamplingParams(max_new_tokens=24, greedy=True),
                   SamplingParams(max_new_tokens=24, temperature=1.0)):
        monkeypatch.setattr(sampling_module, "preallocated_cache", counted)
        torch.manual_seed(5)
        ours = hf_sample(lm, rows, params, pad_id=pad, eos=tokenizer.eos_token_id)
        monkeypatch.setattr(sampling_module, "preallocated_cache", lambda *_: None)
        torch.manual_seed(5)
        theirs = hf_sample(lm, rows, params, pad_id=pad, eos=tokenizer.eos_token_id)
        assert [g.token_ids for g in ours] == [g.token_ids for g in theirs]
        assert max(len(g.token_ids) for g in ours) > 4  # generation ran for a while (the micro models answer in ~5 tokens)
    assert len(made) == 2 and all(isinstance(c, PreallocatedCache) for c in made)
    layer = made[-1].layers[0]
    assert isinstance(layer, PreallocatedLayer)
    # the buffer was allocated once, for the prompt width and every new token
    assert layer._key_buffer is not None
    assert layer._key_buffer.shape[-2] == max(map(len, rows)) + 24


def test_layer_views_grow_and_reseat() -> None:
    layer = PreallocatedLayer(capacity=6)
    k = torch.arange(2 * 1 * 4 * 3, dtype=torch.float32).reshape(2, 1, 4, 3)
    keys, values = layer.update(k, -k)
    assert torch.equal(keys, k) and torch.equal(values, -k)
    buffer = layer._key_buffer
    step = torch.full((2, 1, 1, 3), 7.0)
    keys, _ = layer.update(step, step)
    assert layer._key_buffer is buffer  # written in place
    assert torch.equal(keys, torch.cat([k, step], dim=-2))
    # rows selected from outside (what beam search and contrastive search do): re-seated
    layer.batch_select_indices(torch.tensor([1]))
    keys, _ = layer.update(step[:1], step[:1])
    assert layer._key_buffer is not buffer
    assert torch.equal(keys, torch.cat([k[1:], step[1:], step[:1]], dim=-2))
    # past the planned capacity: the buffer doubles instead of failing
    keys, _ = layer.update(torch.ones(1, 1, 3, 3), torch.ones(1, 1, 3, 3))
    assert layer._key_buffer is not None
    assert keys.shape == (1, 1, 9, 3) and layer._key_buffer.shape[-2] == 18
    assert torch.equal(keys[:, :, :6], torch.cat([k[1:], step[1:], step[:1]], dim=-2))


def test_lm_eval_model_skips_only_the_eos_stop(micro_zoo: Path, one_thread: None,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from lm_eval.models.huggingface import HFLM

    from hacrl.evaluation.hf_lm import SplitBatchHFLM

    lm = SplitBatchHFLM(pretrained=str(micro_zoo / "qwen3-4b-base"), device="cpu",
                        batch_size=4)
    seen: list[tuple[list[str], Any]] = []

    def recorded(self: Any, context: Any, max_length: int, stop: list[str], **kw: Any) -> Any:
        seen.append((stop, kw.get("past_key_values")))
        return context

    monkeypatch.setattr(HFLM, "_model_generate", recorded)
    context = torch.zeros((1, 3), dtype=torch.long)
    eos = lm.tok_decode(lm.eot_token_id, skip_special_tokens=False)
    lm._model_generate(context, 10, [eos], do_sample=False)
    lm._model_generate(context, 10, [eos, "\n\n"], do_sample=False)
    assert seen[0][0] == [] and isinstance(seen[0][1], PreallocatedCache)
    assert seen[1][0] == [eos, "\n\n"]  # another stop string: lm-eval's check stays
    # a model whose generation config does not stop at the tokenizer's EOS keeps the check
    monkeypatch.setattr(lm.model.generation_config, "eos_token_id", lm.eot_token_id + 1)
    lm._model_generate(context, 10, [eos], do_sample=False)
    assert seen[2][0] == [eos]
