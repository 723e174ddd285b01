"""Prompt sharing (`hacrl.engines.prompt_sharing`): a forward that computes each distinct prompt
once gives the full-row forward's log-probs and gradients up to float rounding, for the zoo's
two families, at any temperature; the local engine's log-probs and updates use it; it steps
aside where the full-row forward must run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hacrl.algo import LossBatch, LossConfig
from hacrl.algo.rollout import TokenView
from hacrl.config.settings import OptimizerSettings
from hacrl.engines import local as local_module
from hacrl.engines.base import MiniBatchLoss
from hacrl.engines.local import LocalEngine
from hacrl.engines.prompt_sharing import by_prompt, prompt_sharing_applies, prompt_sharing_logprobs

FAMILIES = ["qwen3-4b-base", "llama3.2-1b-instruct"]


def _views(pad: int, seed: int = 0) -> list[TokenView]:
    """Rows as a step has them: groups sharing a prompt (prompts of different lengths),
    responses of different lengths (one empty, one holding the pad token: transformers' embedding
    gives its row no gradient from the input side), rows interleaved."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [tuple(int(t) for t in torch.randint(3, 40, (n,), generator=gen))
               for n in (7, 4, 9, 4)]
    views = []
    for g in range(5):
        for p, prompt in enumerate(prompts):
            length = (g * 3 + p * 2) % 8
            response = [int(t) for t in torch.randint(3, 40, (length,), generator=gen)]
            if g == 1 and p == 2:
                response[2] = pad
            views.append(TokenView(prompt, tuple(response)))
    return views


def _engine(path: Path, temperature: float = 1.0, forward_rows: int | str = "auto") -> LocalEngine:
    torch.manual_seed(0)
    return LocalEngine(str(path), optimizer=OptimizerSettings(lr=1e-3), device="cpu", temperature=temperature,
                       forward_rows=forward_rows)


def _full_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's full-row forward (transformers' model call), as on a GPU."""
    monkeypatch.setattr(local_module, "prompt_sharing_logprobs", lambda *a, **k: None)
    monkeypatch.setattr(local_module, "prompt_sharing_applies", lambda *a, **k: False)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("model_name", FAMILIES)
def test_log_probs_and_gradients_equal_the_full_row_forward(
        micro_zoo: Path, one_thread: None, model_name: str, temperature: float,
        monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(micro_zoo / model_name, temperature)
    model = engine.model.train()
    views = _views(engine.pad_id)
    width = max(len(v.response_ids) for v in views)
    weights = torch.randn(len(views), width, generator=torch.Generator().manual_seed(3))
    assert prompt_sharing_applies(model)

    results = []
    for full in (False, True):
        with monkeypatch.context() as patch:
            if full:
                _full_rows(patch)
            logp = engine._response_logprobs(model, views, width)
            (logp * weights).sum().backward()
            results.append((logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
            model.zero_grad(set_to_none=True)
    (shared, shared_grads), (full_logp, full_grads) = results
    mask = torch.tensor([[t < len(v.response_ids) for t in range(width)] for v in views])
    assert bool((shared[~mask] == 0).all())
    torch.testing.assert_close(shared, full_logp, rtol=0, atol=2e-5)
    for name, grad in full_grads.items():
        scale = float(grad.abs().max())
        assert scale > 0, name  # every weight takes part
        gap = float((shared_grads[name] - grad).abs().max())
        assert gap <= 1e-4 * scale, (name, gap, scale)


def test_log_probs_of_a_wrong_prompt_differ(micro_zoo: Path, one_thread: None) -> None:
    """The responses really read their own prompt: scored after another prompt they change."""
    engine = _engine(micro_zoo / "qwen3-4b-base")
    views = _views(engine.pad_id)
    swapped = [TokenView(views[(i + 1) % len(views)].prompt_ids, v.response_ids)
               for i, v in enumerate(views)]
    width = max(len(v.response_ids) for v in views)
    with torch.no_grad():
        ours = prompt_sharing_logprobs(engine.model, views, width, 1.0, engine.pad_id)
        other = prompt_sharing_logprobs(engine.model, swapped, width, 1.0, engine.pad_id)
    assert ours is not None and other is not None
    assert float((ours - other).abs().max()) > 1e-3


@pytest.mark.parametrize("model_name", FAMILIES)
def test_the_engine_scores_and_updates_as_with_full_rows(
        micro_zoo: Path, one_thread: None, model_name: str, monkeypatch: pytest.MonkeyPatch,
        step_gradients, assert_same_gradients) -> None:
    calls: list[int] = []
    real = local_module.prompt_sharing_logprobs

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor | None:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(local_module, "prompt_sharing_logprobs", counted)
    probe = _engine(micro_zoo / model_name)
    views = _views(probe.pad_id, seed=1)
    width = max(len(v.response_ids) for v in views)
    mask = torch.tensor([[1.0] * len(v.response_ids) + [0.0] * (width - len(v.response_ids))
                         for v in views])
    n = len(views)
    batch = LossBatch(response_mask=mask, old_logp=-2.0 * mask,
                      source_mean_logp=torch.full((n,), -2.0),
                      advantages=torch.randn(n, generator=torch.Generator().manual_seed(2)),
                      omega=torch.ones(n), cross=torch.zeros(n, dtype=torch.bool),
                      own=torch.ones(n, dtype=torch.bool))
    outcomes = []
    for full in (False, True):
        with monkeypatch.context() as patch:
            if full:
                _full_rows(patch)
            engine = _engine(micro_zoo / model_name, forward_rows=8)  # 3 row batches
            before = [p.detach().clone() for p in engine.model.parameters()]
            grads = step_gradients(engine)
            logp = engine.log_probs(views)
            metrics = engine.train_minibatch(views, batch, MiniBatchLoss(LossConfig(), 0))
            after = [p.detach().clone() for p in engine.model.parameters()]
            outcomes.append((logp, metrics, after, grads))
    assert calls, "the engine did not share prompts"
    (logp_s, metrics_s, _, (grads_s,)), (logp_f, metrics_f, after_f, (grads_f,)) = outcomes
    for a, b, v in zip(logp_s, logp_f, views, strict=True):
        assert len(a) == len(v.response_ids)
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)
    assert metrics_s["grad_norm"] == pytest.approx(metrics_f["grad_norm"], rel=1e-4)
    moved = max(float((a - b).abs().max()) for a, b in zip(after_f, before, strict=True))
    assert moved > 1e-4  # the update did something
    assert_same_gradients(grads_s, grads_f, rel=1e-4)


def test_rows_of_one_prompt_are_batched_together() -> None:
    views = [TokenView((1, 2, 3), (5,)), TokenView((9,), (5, 6)), TokenView((1, 2, 3), (7, 8)),
             TokenView((9,), (1,)), TokenView((4, 4, 4), ())]
    order = by_prompt(views)
    prompts = [views[i].prompt_ids for i in order]
    assert prompts == [(9,), (9,), (1, 2, 3), (1, 2, 3), (4, 4, 4)]
    assert sorted(order) == list(range(len(views)))


def test_it_steps_aside_where_the_full_row_forward_must_run(micro_zoo: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    engine = _engine(micro_zoo / "qwen3-4b-base")
    views = _views(engine.pad_id)
    model: Any = engine.model
    model.config.attention_dropout = 0.1
    assert not prompt_sharing_applies(model.train())  # dropout would apply
    assert prompt_sharing_applies(model.eval())  # not in eval mode
    model.config.attention_dropout = 0.0
    assert prompt_sharing_logprobs(model.to(torch.float64), views, 8, 1.0, 0) is None
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=50))
    assert prompt_sharing_logprobs(gpt2, views, 8, 1.0, 0) is None
