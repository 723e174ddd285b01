"""engine.old_logprobs=sampler: the local engine's sampler scores the tokens it draws, and those
log-probs are what a forward over prompt + response gives (the old log-probs of own rows)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import open_dict

from hacrl.algo.rollout import SamplingParams, TokenView, render_prompt_ids
from hacrl.config import ConfigError, compose, config_hash, validate
from hacrl.config.settings import OptimizerSettings
from hacrl.engines.local import LocalEngine
from hacrl.training.loop import seed_everything

pytestmark = pytest.mark.usefixtures("one_thread")

QUESTIONS = ["What is 2+3?", "What is 17-9? Think step by step.", "Compute 6*7."]


def _sample(engine: LocalEngine, sampling: SamplingParams, n: int = 5):
    prompts = [render_prompt_ids(engine.tokenizer, [{"role": "user", "content": q}])
               for q in QUESTIONS]
    seed_everything(0)
    groups = engine.generate(prompts, n, sampling)
    return [(prompts[p], g) for p, group in enumerate(groups) for g in group]


@pytest.mark.parametrize("model", ["qwen3-4b-base", "llama3.2-1b-instruct"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_log_probs_equal_a_forward_over_the_response(micro_zoo: Path, model: str,
                                                             temperature: float) -> None:
    engine = LocalEngine(str(micro_zoo / model), optimizer=OptimizerSettings(lr=1e-3), device="cpu", temperature=temperature)
    rows = _sample(engine, SamplingParams(max_new_tokens=12, temperature=temperature, top_p=0.9))
    assert any(g.finished for _, g in rows) or all(len(g.token_ids) == 12 for _, g in rows)
    views = [TokenView(tuple(p), tuple(g.token_ids)) for p, g in rows]
    forward = engine.log_probs(views)
    for (_, g), lp in zip(rows, forward, strict=True):
        assert g.logprobs is not None and len(g.logprobs) == len(g.token_ids)
        # at the engine's temperature and before top-p, as the loss scores them
        torch.testing.assert_close(torch.tensor(g.logprobs), lp, rtol=0, atol=1e-4)
    assert max(-min(g.logprobs or [0.0]) for _, g in rows) > 0.5  # real draws, not all certain


def test_the_sampler_draws_the_same_tokens_whether_it_scores_them(micro_zoo: Path) -> None:
    path = str(micro_zoo / "qwen3-4b-base")
    sampling = SamplingParams(max_new_tokens=12)
    scored = _sample(LocalEngine(path, optimizer=OptimizerSettings(lr=1e-3), device="cpu"), sampling)
    plain = _sample(LocalEngine(path, optimizer=OptimizerSettings(lr=1e-3), device="cpu", old_logprobs="recompute"), sampling)
    assert [g.token_ids for _, g in scored] == [g.token_ids for _, g in plain]
    assert all(g.logprobs is None for _, g in plain)
    greedy = _sample(LocalEngine(path, optimizer=OptimizerSettings(lr=1e-3), device="cpu"), SamplingParams(12, greedy=True))
    assert all(g.logprobs is None for _, g in greedy)  # validation needs no scores


def test_old_logprobs_is_checked_and_only_sampler_enters_the_identity(job_env: Path) -> None:
    # job_env: validate checks the agents' models first, so it needs a zoo (the micro one)
    with pytest.raises(ConfigError, match=r"engine\.old_logprobs=forward: must be one of: sampler, recompute"):
        validate(compose(["engine.old_logprobs=forward"]))
    with pytest.raises(ConfigError, match="engine.old_logprobs"):
        LocalEngine("unused", optimizer=OptimizerSettings(lr=1e-3), old_logprobs="forward")
    sampler, recompute = (compose([f"engine.old_logprobs={v}"]) for v in ("sampler", "recompute"))
    assert config_hash(sampler) != config_hash(recompute)
    # recompute is what runs did before the key existed: their hashes stay
    before = compose([])
    with open_dict(before):
        del before.engine["old_logprobs"]
    assert config_hash(recompute) == config_hash(before)
