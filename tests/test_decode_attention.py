"""The CPU decoding attention (`hacrl.engines.attention`) computes what transformers' sdpa path
computes: same logits at every decoding step, same greedy and sampled tokens, and it is what the
local engine and the lm-eval model use on a CPU (not written into saved checkpoints)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hacrl.algo.rollout import SamplingParams
from hacrl.config.settings import OptimizerSettings
from hacrl.engines.attention import DECODE_ATTENTION, use_decode_attention
from hacrl.engines.sampling import hf_sample

# transformers' `generate` path (GPUs, other architectures): the zoo's models on a CPU take the
# lean decoder (`tests/test_lean_decoder.py`)
pytestmark = pytest.mark.usefixtures("transformers_generate")


def _models(path: Path) -> tuple[torch.nn.Module, torch.nn.Module]:
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(path).eval()
    grouped = AutoModelForCausalLM.from_pretrained(path).eval()
    use_decode_attention(grouped, "cpu")
    assert plain.config._attn_implementation == "sdpa"
    assert grouped.config._attn_implementation == DECODE_ATTENTION
    # the micro models use grouped-query attention, the case the function exists for
    assert grouped.config.num_key_value_heads < grouped.config.num_attention_heads
    return plain, grouped


def _prompts(tokenizer: object) -> list[list[int]]:
    texts = ["What is 12+34?", "What is 7*46?", "Hi", "What is 12+34+56? Think."]
    return [list(tokenizer(t).input_ids) for t in texts]  # type: ignore[operator]


@pytest.mark.parametrize("model", ["qwen3-4b-base", "llama3.2-1b-instruct"])
def test_same_tokens_greedy_and_sampled(micro_zoo: Path, one_thread: None, model: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(micro_zoo / model)
    plain, grouped = _models(micro_zoo / model)
    rows = _prompts(tokenizer) * 3  # different prompt lengths: left padding and masks matter
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eos = tokenizer.eos_token_id
    for sampling in (SamplingParams(max_new_tokens=24, greedy=True),
                     SamplingParams(max_new_tokens=24, temperature=1.0)):
        torch.manual_seed(3)  # sampling draws from torch's global stream
        a = hf_sample(plain, rows, sampling, pad_id=pad, eos=eos, device=torch.device("cpu"))
        torch.manual_seed(3)
        b = hf_sample(grouped, rows, sampling, pad_id=pad, eos=eos, device=torch.device("cpu"))
        assert [g.token_ids for g in a] == [g.token_ids for g in b]
        assert any(len(g.token_ids) > 1 for g in a)


def test_same_logits_each_decoding_step(micro_zoo: Path, one_thread: None) -> None:
    from transformers import AutoTokenizer

    path = micro_zoo / "qwen3-1.7b-base"
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    plain, grouped = _models(path)
    texts = ["What is 12+34?", "Hi", "What is 99-12? Show the steps."]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.inference_mode():
        caches, ids, mask = [], None, batch.attention_mask
        for model in (plain, grouped):
            out = model(**batch, use_cache=True)
            caches.append(out.past_key_values)
            ids = out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(8):  # the same next tokens fed to both
            mask = torch.cat([mask, torch.ones(len(texts), 1, dtype=mask.dtype)], dim=1)
            logits = [m(input_ids=ids, attention_mask=mask, past_key_values=c, use_cache=True)
                      .logits[:, -1] for m, c in zip((plain, grouped), caches, strict=True)]
            torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-5)
            ids = logits[0].argmax(-1, keepdim=True)


def test_engine_uses_it_on_cpu_and_saves_plain_config(micro_zoo: Path, tmp_path: Path,
                                                      one_thread: None) -> None:
    from hacrl.engines.local import LocalEngine

    engine = LocalEngine(str(micro_zoo / "qwen3-4b-base"), optimizer=OptimizerSettings(lr=1e-4), device="cpu")
    assert engine.model.config._attn_implementation == DECODE_ATTENTION
    engine.save(tmp_path / "ckpt")
    saved = json.loads((tmp_path / "ckpt" / "model" / "config.json").read_text())
    assert DECODE_ATTENTION not in json.dumps(saved)  # a checkpoint loads anywhere
    # a model asked for eager attention on purpose keeps it
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(micro_zoo / "qwen3-4b-base",
                                                 attn_implementation="eager")
    use_decode_attention(eager, "cpu")
    assert eager.config._attn_implementation == "eager"
