"""What an evaluation reuses instead of redoing must never show in its results (micro models).

`SplitBatchHFLM` tokenizes each context once for lm-eval's sort by length and its padded
batches, and keeps rendered chat templates for the next evaluation in the process;
`evaluate_suite` holds each task's rows in memory. Each test compares with lm-eval's own
path: token ids and tensors, rendered prompts, rows, and whole evaluations (responses, grades
and scores of a greedy and a sampled benchmark, both micro tokenizers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from hacrl.config import compose
from hacrl.config.protocol import Protocol
from hacrl.evaluation import hf_lm as hf_lm_module
from hacrl.evaluation import lmeval as lmeval_module
from hacrl.evaluation.lmeval import Backend, EvalOutcome, run_lm_eval, split_rows
from hacrl.evaluation.runner import data_files

MODELS = ["qwen3-4b-base", "llama3.2-1b-instruct"]  # char-level and byte-level BPE tokenizers
LIMIT = 6  # problems per benchmark; tiny_aime2025 is sampled 4 times each


def _lm(path: Path, **kwargs: Any) -> Any:
    from hacrl.evaluation.hf_lm import SplitBatchHFLM

    return SplitBatchHFLM.create_from_arg_obj({"pretrained": str(path), "dtype": "float32",
                                               "device": "cpu", "batch_size": 4,
                                               "enable_thinking": False, **kwargs})


def _contexts(lm: Any) -> list[str]:
    """Prompts of several lengths, rendered by the model's template or not, one starting with
    the BOS token's text and one with the prefix token's (lm-eval adds no BOS to those)."""
    plain = ["What is 2+2?", "Solve $x^2 = 4$ for the positive $x$.", "", " lead", "7" * 40]
    rendered = [lm.apply_chat_template([{"role": "user", "content": t}]) for t in plain]
    marked = [f"{lm.tokenizer.bos_token or ''}Q: 1+1?",
              f"{lm.tokenizer.decode(lm.prefix_token_id)}Q: 3+3?"]
    return plain + rendered + marked


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("add_bos_token", [None, True, False])
def test_each_context_tokenized_once_gives_lm_evals_ids_and_tensors(
        job_env: Path, one_thread: None, model: str, add_bos_token: bool | None) -> None:
    from lm_eval.models.huggingface import HFLM

    lm = _lm(job_env / model, add_bos_token=add_bos_token)
    texts = _contexts(lm)
    calls: list[int] = []
    real = lm.tokenizer.__class__.__call__

    def counting(tokenizer: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(tokenizer, *args, **kwargs)

    lm._encoded, lm._prefix = {}, lm.tokenizer.decode(lm.prefix_token_id)
    lm._encode_contexts(texts)
    # batches led by each kind of string (the first one decides lm-eval's BOS setting)
    batches = [texts[first:] + texts[:first] for first in range(len(texts))]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lm.tokenizer.__class__, "__call__", counting)
        ids = [lm.tok_encode(text) for text in texts]
        tensors = [lm.tok_batch_encode(batch, left_truncate_len=4096) for batch in batches]
    assert ids == [HFLM.tok_encode(lm, text) for text in texts]
    for batch, ours in zip(batches, tensors, strict=True):
        theirs = HFLM.tok_batch_encode(lm, batch, left_truncate_len=4096)
        for a, b in zip(ours, theirs, strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b), batch[0]
    # all of it from the ids `_encode_contexts` made, bar one more call for the batches led
    # by a BOS-prefixed string when the others were tokenized with special tokens
    assert len(calls) <= 2
    # a batch lm-eval would cut to `left_truncate_len` is left to lm-eval (with its warning)
    cut = lm.tok_batch_encode(texts, left_truncate_len=3)
    assert all(torch.equal(a, b) for a, b in
               zip(cut, HFLM.tok_batch_encode(lm, texts, left_truncate_len=3), strict=True))
    # outside generate_until: lm-eval's own tokenization
    lm._encoded = None
    assert lm.tok_encode(texts[1]) == HFLM.tok_encode(lm, texts[1])


@pytest.mark.parametrize("model", MODELS)
def test_rendered_prompts_are_kept_per_template_setting(job_env, one_thread, monkeypatch, model):
    from lm_eval.models.huggingface import HFLM

    monkeypatch.setattr(hf_lm_module, "_RENDERED", {})
    messages = [[{"role": "user", "content": f"Problem {i}: what is {i}+{i}?"}] for i in range(5)]
    lm = _lm(job_env / model)
    first = [lm.apply_chat_template(m) for m in messages]
    assert first == [HFLM.apply_chat_template(lm, m) for m in messages]
    again = _lm(job_env / model)  # the next evaluation in the process: nothing rendered anew
    with monkeypatch.context() as patch:
        patch.setattr(again.tokenizer, "apply_chat_template",
                      lambda *a, **k: pytest.fail("rendered again"))
        assert [again.apply_chat_template(m) for m in messages] == first
    # another setting of the template (the thinking switch, the continuation form) is its own
    thinking = _lm(job_env / model, enable_thinking=None,
                   chat_template_args={"enable_thinking": True})
    assert thinking._template_key != lm._template_key
    assert ([thinking.apply_chat_template(m) for m in messages]
            == [HFLM.apply_chat_template(thinking, m) for m in messages])
    assert (lm.apply_chat_template(messages[0], add_generation_prompt=False)
            == HFLM.apply_chat_template(lm, messages[0], add_generation_prompt=False))
    # full: it starts over rather than grow
    monkeypatch.setattr(hf_lm_module, "RENDERED_MAX", 3)
    lm.apply_chat_template([{"role": "user", "content": "one more"}])
    assert sum(map(len, hf_lm_module._RENDERED.values())) == 1


def test_rows_in_memory_are_the_rows_datasets_iterates(tmp_path):
    import datasets

    path = tmp_path / "rows.jsonl"
    rows = [{"uid": "a", "prompt": "p1", "answer": "[1, 2]", "n": 1, "x": 0.5, "tags": ["t"]},
            {"uid": "b", "prompt": "p2", "answer": "3", "n": 2, "x": 1, "tags": []}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    split = datasets.load_dataset("json", data_files={"test": str(path)})["test"]
    assert split_rows(split) == list(split)
    assert split_rows(split.select([1])) == list(split.select([1]))
    assert split_rows(["already", "rows"]) == ["already", "rows"]


def _evaluate(path: Path, protocol: Protocol, cfg: Any, tmp: Path) -> EvalOutcome:
    benchmarks = ["tiny_gsm8k", "tiny_aime2025"]
    return run_lm_eval(str(path), benchmarks, data_files(cfg, benchmarks), protocol,
                       Backend(batch_size=4), tmp, limit=LIMIT)


@pytest.mark.parametrize("model", MODELS)
def test_evaluation_gives_what_lm_evals_own_hflm_and_datasets_give(job_env, one_thread,
                                                                   monkeypatch, tmp_path, model):
    """Every response, grade and score as lm-eval's HFLM (each context tokenized twice, every
    prompt rendered) over Arrow rows gives them; and again with the renders kept."""
    from lm_eval.models.huggingface import HFLM

    cfg = compose([])
    protocol = Protocol.in_use(cfg.eval)[0]
    monkeypatch.setattr(hf_lm_module, "_RENDERED", {})
    ours = _evaluate(job_env / model, protocol, cfg, tmp_path / "ours")
    assert hf_lm_module._RENDERED  # the prompts are kept ...
    again = _evaluate(job_env / model, protocol, cfg, tmp_path / "again")  # ... and reused

    def plain_lm(self: Backend, model_path: str, protocol: Protocol, seed: int) -> Any:
        args = self.model_args(model_path, protocol, seed)
        args.pop("greedy_batch_size")
        return HFLM.create_from_arg_obj(args)

    with monkeypatch.context() as patch:
        patch.setattr(Backend, "make_lm", plain_lm)
        patch.setattr(lmeval_module, "rows_in_memory", lambda task: None)
        theirs = _evaluate(job_env / model, protocol, cfg, tmp_path / "theirs")
    assert len(theirs.samples["tiny_aime2025"]) == LIMIT
    for got in (ours, again):
        assert got.metrics == theirs.metrics and got.average == theirs.average
        for bench in theirs.samples:
            assert got.samples[bench] == theirs.samples[bench], bench
