"""engine.forward_rows: cache-sized row batches give the same log-probs and the same update."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from hacrl.algo import LossBatch, LossConfig
from hacrl.algo.rollout import TokenView
from hacrl.config import ConfigError, compose, validate
from hacrl.config.settings import OptimizerSettings
from hacrl.engines.base import MiniBatchLoss
from hacrl.engines.local import (
    CPU_FORWARD_ROWS,
    CPU_SHARED_FORWARD_ROWS,
    LocalEngine,
    resolve_forward_rows,
)


def _rows(n: int, seed: int = 0) -> tuple[list[TokenView], LossBatch]:
    """n rows of different prompt and response lengths (so batches pad differently)."""
    gen = torch.Generator().manual_seed(seed)
    views = [TokenView(tuple(int(t) for t in torch.randint(3, 40, (int(p),), generator=gen)),
                       tuple(int(t) for t in torch.randint(3, 40, (int(r),), generator=gen)))
             for p, r in zip(torch.randint(3, 9, (n,), generator=gen),
                             torch.randint(1, 7, (n,), generator=gen), strict=True)]
    width = max(len(v.response_ids) for v in views)
    mask = torch.tensor([[1.0] * len(v.response_ids) + [0.0] * (width - len(v.response_ids))
                         for v in views])
    batch = LossBatch(response_mask=mask, old_logp=-2.0 * mask,
                      source_mean_logp=torch.full((n,), -2.0),
                      advantages=torch.randn(n, generator=gen), omega=torch.ones(n),
                      cross=torch.zeros(n, dtype=torch.bool), own=torch.ones(n, dtype=torch.bool))
    return views, batch


def _engine(path: Path, forward_rows: int) -> LocalEngine:
    torch.manual_seed(0)
    return LocalEngine(str(path), optimizer=OptimizerSettings(lr=1e-3), device="cpu", forward_rows=forward_rows)


def test_log_probs_are_the_same_in_small_row_batches(micro_zoo: Path) -> None:
    views, _ = _rows(21)
    whole = _engine(micro_zoo / "qwen3-4b-base", 10_000).log_probs(views)
    small = _engine(micro_zoo / "qwen3-4b-base", 4).log_probs(views)
    assert len(whole) == len(small) == 21
    assert [len(a) for a in whole] == [len(v.response_ids) for v in views]
    # bit-identical on some CPUs; others' BLAS rounds differently by row count (~2e-6), while
    # a padding or alignment slip would move a log-prob by far more
    for a, b in zip(whole, small, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_an_update_in_small_row_batches_equals_the_one_pass_update(
        micro_zoo: Path, step_gradients, assert_same_gradients) -> None:
    views, batch = _rows(21, seed=1)
    # on-policy (ratio 1): every row has a gradient, so a row left out of the update shows
    old = _engine(micro_zoo / "qwen3-4b-base", 10_000).log_probs(views)
    old_logp = torch.zeros_like(batch.old_logp)
    for row, logp in enumerate(old):
        old_logp[row, :len(logp)] = logp
    batch = dataclasses.replace(batch, old_logp=old_logp)
    after, metrics, grads = [], [], []
    for rows in (10_000, 4):  # one pass; 4 + 4 + 4 + 4 + 4 + 1 rows
        engine = _engine(micro_zoo / "qwen3-4b-base", rows)
        grads.append(step_gradients(engine))
        metrics.append(engine.train_minibatch(views, batch, MiniBatchLoss(LossConfig(), 0)))
        after.append([p.detach().clone() for p in engine.model.parameters()])
    before = [p.detach() for p in _engine(micro_zoo / "qwen3-4b-base", 1).model.parameters()]
    moved = max(float((a - b).abs().max()) for a, b in zip(after[0], before, strict=True))
    assert moved > 1e-4  # the update did something
    (one_pass,), (batched,) = grads  # one optimizer step each
    assert_same_gradients(one_pass, batched, rel=1e-4)  # equal up to float rounding
    assert metrics[1]["grad_norm"] == pytest.approx(metrics[0]["grad_norm"], rel=1e-4)


def test_auto_is_cache_sized_on_cpu_and_whole_on_gpu() -> None:
    assert resolve_forward_rows("auto", torch.device("cpu")) == CPU_FORWARD_ROWS
    assert resolve_forward_rows("auto", torch.device("cpu"), shares_prompts=True) == \
        CPU_SHARED_FORWARD_ROWS
    assert resolve_forward_rows("auto", torch.device("cuda"), shares_prompts=True) is None
    assert resolve_forward_rows(None, torch.device("cuda")) is None
    assert resolve_forward_rows(8, torch.device("cuda")) == 8
    for bad in (0, -3, "many", 2.5, True):
        with pytest.raises(ConfigError, match="engine.forward_rows"):
            resolve_forward_rows(bad, torch.device("cpu"))  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["0", "abc", "1.5"])
def test_a_bad_forward_rows_is_refused_before_the_job(job_env, value: str) -> None:
    with pytest.raises(ConfigError, match=f"engine.forward_rows={value}"):
        validate(compose([f"engine.forward_rows={value}"]))
