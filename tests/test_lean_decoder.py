"""The lean decoder (`hacrl.zoo.lean_decoder`) computes what transformers' `generate` does for
the zoo's model families on a CPU: the same logits up to float rounding, the same greedy and
sampled tokens (temperature, top-k, top-p) from the same random stream, the same log-probs; it
steps aside for anything else; the local engine and lm-eval's greedy requests use it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from hacrl.algo.rollout import SamplingParams
from hacrl.engines import sampling as sampling_module
from hacrl.engines.sampling import hf_sample
from hacrl.zoo.lean_decoder import lean_decoder, lean_generate

FAMILIES = ["qwen3-4b-base", "llama3.2-1b-instruct"]


def _counting(calls: list[int], real: Callable[..., Any]) -> Callable[..., Any]:
    """`real`, noting each call in `calls`."""
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)
    return counted


def _load(path: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def _rows(tokenizer: Any) -> list[list[int]]:
    texts = ["What is 12+34?", "What is 7*46?", "Hi", "What is 12+34+56? Think."]
    return [list(tokenizer(t).input_ids) for t in texts] * 3  # left padding matters


def _both(model: Any, rows: list[list[int]], sampling: SamplingParams, pad: int, eos: int,
          monkeypatch: pytest.MonkeyPatch, logprobs: float | None = None) -> tuple[Any, Any]:
    """The same call through the lean decoder and through transformers' `generate`."""
    torch.manual_seed(11)
    lean = hf_sample(model, rows, sampling, pad_id=pad, eos=eos, logprobs_temperature=logprobs)
    with monkeypatch.context() as patch:
        patch.setattr(sampling_module, "lean_decoder", lambda m: None)
        torch.manual_seed(11)
        hf = hf_sample(model, rows, sampling, pad_id=pad, eos=eos, logprobs_temperature=logprobs)
    return lean, hf


@pytest.mark.parametrize("model_name", FAMILIES)
def test_same_tokens_and_logprobs_as_generate(micro_zoo: Path, one_thread: None, model_name: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    model, tokenizer = _load(micro_zoo / model_name)
    assert lean_decoder(model) is not None
    rows, eos = _rows(tokenizer), tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    calls: list[int] = []
    real = sampling_module.lean_generate
    monkeypatch.setattr(sampling_module, "lean_generate", _counting(calls, real))
    for sampling in (SamplingParams(max_new_tokens=24, greedy=True),
                     SamplingParams(max_new_tokens=24, temperature=1.0),
                     SamplingParams(max_new_tokens=24, temperature=0.7, top_p=0.9)):
        lean, hf = _both(model, rows, sampling, pad, eos, monkeypatch,
                         logprobs=None if sampling.greedy else sampling.temperature)
        assert [g.token_ids for g in lean] == [g.token_ids for g in hf]
        assert [g.finished for g in lean] == [g.finished for g in hf]
        assert max(len(g.token_ids) for g in lean) > 4  # generation ran for a while (the micro models answer in ~5 tokens)
        if not sampling.greedy:
            for a, b in zip(lean, hf, strict=True):
                assert a.logprobs is not None and b.logprobs is not None
                assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs),
                                      atol=1e-4)
    assert len(calls) == 3  # the lean path did run


def test_rows_end_at_eos_and_pad_after(micro_zoo: Path, one_thread: None) -> None:
    model, tokenizer = _load(micro_zoo / "qwen3-4b-base")
    rows = _rows(tokenizer)
    ids = torch.tensor([[0] * (max(map(len, rows)) - len(r)) + r for r in rows])
    attention = torch.tensor([[0] * (ids.shape[1] - len(r)) + [1] * len(r) for r in rows])
    pad = 7  # not the EOS: what follows a row's EOS shows
    greedy = lean_generate(lean_decoder(model), ids, attention, max_new_tokens=40,  # type: ignore[arg-type]
                           eos=[tokenizer.eos_token_id], pad_id=pad, greedy=True)[0]
    ended = 0
    for tokens in greedy.tolist():
        if tokenizer.eos_token_id in tokens:
            end = tokens.index(tokenizer.eos_token_id)
            assert set(tokens[end + 1:]) <= {pad}  # nothing drawn after a row's EOS
            ended += 1
    assert ended > 0
    if ended == len(rows):  # every row ended: generation stopped at the last EOS
        assert greedy.shape[1] < 40


def test_same_logits_as_a_full_forward(micro_zoo: Path, one_thread: None) -> None:
    """Every step's logits equal those of transformers' forward over prompt + tokens so far."""
    model, tokenizer = _load(micro_zoo / "llama3.2-1b-instruct")
    rows = _rows(tokenizer)[:4]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    attention = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    tokens, logits = lean_generate(lean_decoder(model), ids, attention,  # type: ignore[arg-type]
                                   max_new_tokens=6, eos=[-1], pad_id=0, greedy=True,
                                   keep_logits=True)
    assert logits is not None and logits.shape[:2] == tokens.shape == (4, 6)
    full = torch.cat([ids, tokens], dim=1)
    mask = torch.cat([attention, torch.ones_like(tokens)], dim=1)
    with torch.no_grad():
        reference = model(input_ids=full, attention_mask=mask).logits[:, width - 1:-1]
    torch.testing.assert_close(logits, reference, rtol=1e-4, atol=1e-4)


def test_top_k_as_transformers(micro_zoo: Path, one_thread: None) -> None:
    model, tokenizer = _load(micro_zoo / "qwen3-1.7b-base")
    rows = _rows(tokenizer)
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    attention = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    eos = tokenizer.eos_token_id
    torch.manual_seed(4)
    ours = lean_generate(lean_decoder(model), ids, attention,  # type: ignore[arg-type]
                         max_new_tokens=20, eos=[eos], pad_id=0, greedy=False, temperature=0.6,
                         top_k=5, top_p=0.95)[0]
    torch.manual_seed(4)
    theirs = model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=20,
                            do_sample=True, temperature=0.6, top_k=5, top_p=0.95,
                            eos_token_id=eos, pad_token_id=0)[:, width:]
    assert torch.equal(ours, theirs)


def test_steps_aside_where_it_does_not_apply(micro_zoo: Path, one_thread: None,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen3Config, Qwen3ForCausalLM

    model, tokenizer = _load(micro_zoo / "qwen3-4b-base")
    model.train()
    assert lean_decoder(model) is None  # training mode (dropout would apply)
    model.eval()
    assert lean_decoder(model.to(torch.float64)) is None
    small: dict[str, Any] = dict(vocab_size=64, hidden_size=16, intermediate_size=32,
                                 num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=1)
    assert lean_decoder(Qwen3ForCausalLM(Qwen3Config(**small, attention_bias=True))) is None
    scaled = Qwen3Config(**small, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                   "rope_theta": 10000.0})
    assert lean_decoder(Qwen3ForCausalLM(scaled).eval()) is None
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2)).eval()
    assert lean_decoder(gpt2) is None
    # and sampling still works there, through transformers' generate
    out = hf_sample(gpt2, [[1, 2, 3], [4, 5]], SamplingParams(max_new_tokens=4, greedy=True),
                    pad_id=0, eos=63)
    assert len(out) == 2 and all(len(g.token_ids) >= 1 for g in out)


def test_lm_eval_greedy_requests_use_it(micro_zoo: Path, one_thread: None,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from hacrl.evaluation import hf_lm
    from hacrl.evaluation.hf_lm import SplitBatchHFLM

    lm = SplitBatchHFLM(pretrained=str(micro_zoo / "llama3.2-1b-instruct"), device="cpu",
                        batch_size=4)
    rows = _rows(lm.tokenizer)[:4]
    width, pad = max(map(len, rows)), int(lm.tokenizer.pad_token_id)
    context = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    ran: list[int] = []
    real = hf_lm.lean_generate
    monkeypatch.setattr(hf_lm, "lean_generate", _counting(ran, real))
    mask = context.ne(pad).long()
    # lm-eval passes the padding's mask (this version), or `generate` infers it
    for given in ({"attention_mask": mask}, {}):
        ours = lm._model_generate(context, width + 30, [], do_sample=False, temperature=0.0,
                                  **given)
        assert ours.shape[1] > width
        with monkeypatch.context() as patch:
            patch.setattr(hf_lm, "lean_decoder", lambda m: None)
            theirs = lm._model_generate(context, width + 30, [], do_sample=False, **given)
        assert torch.equal(ours, theirs)
    assert ran == [1, 1]
    # sampled requests, and other stop strings, stay with transformers' generate
    lm._model_generate(context, width + 5, [], attention_mask=mask, do_sample=True,
                       temperature=0.7)
    lm._model_generate(context, width + 5, ["\n\n"], attention_mask=mask, do_sample=False)
    assert ran == [1, 1]


def test_lm_eval_generate_until_takes_it(micro_zoo: Path, one_thread: None,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Through lm-eval's own `generate_until` (its kwargs as it builds them): greedy requests take
    the lean decoder and give the same texts; sampled ones keep `generate`."""
    from lm_eval.api.instance import Instance

    from hacrl.evaluation import hf_lm
    from hacrl.evaluation.hf_lm import SplitBatchHFLM

    lm = SplitBatchHFLM(pretrained=str(micro_zoo / "qwen3-4b-base"), device="cpu",
                        batch_size=4, greedy_batch_size=8)
    texts = ["What is 12+34?", "What is 7*46?", "Hi", "What is 12+34+56? Think."] * 2

    def requests(kwargs: dict[str, Any]) -> list[Instance]:
        return [Instance(request_type="generate_until", doc={}, arguments=(t, dict(kwargs)),
                         idx=i) for i, t in enumerate(texts)]

    ran: list[int] = []
    real = hf_lm.lean_generate
    monkeypatch.setattr(hf_lm, "lean_generate", _counting(ran, real))
    greedy = {"until": [], "do_sample": False, "max_gen_toks": 16}
    ours = lm.generate_until(requests(greedy), disable_tqdm=True)
    assert ran and any(ours)
    with monkeypatch.context() as patch:
        patch.setattr(hf_lm, "lean_decoder", lambda m: None)
        assert lm.generate_until(requests(greedy), disable_tqdm=True) == ours
    taken = len(ran)
    lm.generate_until(requests({"until": [], "do_sample": True, "temperature": 0.7,
                                "max_gen_toks": 8}), disable_tqdm=True)
    assert len(ran) == taken


def test_importing_the_decoder_leaves_the_zoo_builder_unloaded() -> None:
    # engines and evaluation import the decoder; the builder's model classes cost ~2 s more
    code = ("import sys, hacrl.engines.sampling, hacrl.zoo.lean_decoder; "
            "print(sorted(m for m in sys.modules if m.startswith('hacrl.zoo')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout.strip()
    assert out == "['hacrl.zoo', 'hacrl.zoo.lean_decoder']"
    from hacrl import zoo  # the package's names still load on first use

    assert zoo.build_zoo.__module__ == "hacrl.zoo.build" and "ZOO" in zoo.__all__
