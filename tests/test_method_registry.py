"""A method added at test time, no file edited (docs/ADDING_A_METHOD.md): HACPO with each
agent's own std runs through the real loop on micro models and trains on the advantages it
defines; unknown function names are one-line config errors; a metric declared by a registered
borrowed objective survives the local engine's and verl's aggregation by its declared kind."""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import Tensor

from hacrl.algo import (
    ADVANTAGES,
    BORROWED,
    METHODS,
    AdvantageOptions,
    BorrowedTerm,
    LossBatch,
    LossConfig,
    MethodSpec,
    get_method,
    policy_loss,
    register_advantage,
    register_borrowed,
    register_method,
)
from hacrl.algo.methods import capability_advantage, hacpo_borrowed_term
from hacrl.algo.metrics import MAX, ROW_MEAN
from hacrl.algo.rollout import TokenView
from hacrl.config import ConfigError, JobSpec, compose, validate
from hacrl.config.settings import OptimizerSettings, method_settings
from hacrl.data.arith import load_split
from hacrl.engines.local import LocalEngine
from hacrl.training.loop import Agent, PromptSchedule, TeamLoop, seed_everything

QWEN, LLAMA = "qwen3-4b-base", "llama3.2-1b-instruct"
P, MB, G = 4, 2, 4
SMALL = (f"train.prompts_per_step={P}", f"train.minibatch_prompts={MB}",
         f"train.rollouts_per_prompt={G}", "rollout.max_new_tokens=16", f"agents=[{QWEN},{LLAMA}]",
         "method=hacpo")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def registries() -> Iterator[None]:
    """What a test registers is gone after it."""
    saved = [(registry, dict(registry)) for registry in (ADVANTAGES, BORROWED, METHODS)]
    yield
    for registry, before in saved:
        registry.clear()
        registry.update(before)  # type: ignore[arg-type]


def hash_grade(responses: list[str], answers: list[str]) -> list[float]:
    """A deterministic verifier giving mixed rewards whatever micro models write (1 in 4)."""
    return [float(zlib.crc32(r.encode()) % 4 == 0) for r in responses]


# -- the worked example of docs/ADDING_A_METHOD.md ---------------------------------------------

def capability_agent_std_advantage(rewards: Tensor, capability: Tensor,
                                   options: AdvantageOptions) -> Tensor:
    """HACPO step 2 with each target's own std: A^(k)(y_i^(j)) = (R(y_i^(j)) - mu^(k)(x)) /
    std_k(x), std_k the std of target k's own G rewards of x; the pooled std where k's own
    rewards are all equal. rewards [n, P, G] -> [n_target, n_source, P, G]."""
    n, p, g = rewards.shape
    pooled = rewards.permute(1, 0, 2).reshape(p, n * g).std(dim=-1)  # [P]
    own = rewards.std(dim=-1)  # [n_target, P]
    own = torch.where(own > 0, own, pooled)
    eps = 1e-6  # as in capability_aware_advantages
    scale = (pooled + eps) / (own + eps)  # [n_target, P]
    return capability_advantage(rewards, capability, options) * scale[:, None, :, None]


def register_agent_std(recorded: list[tuple] | None = None) -> MethodSpec:
    def estimator(rewards: Tensor, capability: Tensor, options: AdvantageOptions) -> Tensor:
        out = capability_agent_std_advantage(rewards, capability, options)
        if recorded is not None:
            recorded.append((rewards.clone(), capability.clone(), options, out.clone()))
        return out

    register_advantage("capability_agent_std", min_group=2)(estimator)
    return register_method(replace(get_method("hacpo"), name="hacpo_agent_std",
                                   advantage="capability_agent_std",
                                   description="HACPO, advantages over each agent's own std"))


class Spy(LocalEngine):
    """A local engine that keeps each update's loss inputs and metrics."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.updates: list[tuple[LossBatch, dict[str, float]]] = []

    def train_minibatch(self, views, batch, loss_fn):  # type: ignore[no-untyped-def]
        metrics = super().train_minibatch(views, batch, loss_fn)
        self.updates.append((batch, metrics))
        return metrics


def make_loop(spec: JobSpec, micro_batch_rows: int | None = None) -> tuple[TeamLoop, list[Spy]]:
    """The job's loop for `spec` (settings from `method_settings`) on spying local engines."""
    settings = method_settings(spec.cfg, spec.method)
    assert settings.loss == spec.loss
    engines = [Spy(a.path, optimizer=OptimizerSettings(lr=1e-3), device="cpu", reference=spec.loss.kl_coef > 0,
                   micro_batch_rows=micro_batch_rows) for a in spec.agents]
    agents = [Agent(a.name, e) for a, e in zip(spec.agents, engines, strict=True)]
    schedule = PromptSchedule(load_split("train"), settings.prompts_per_step, 0)
    return TeamLoop(agents, spec.method, settings, schedule, hash_grade), engines


def test_per_agent_std_method_registered_at_test_time_trains_through_the_loop(
        job_env: Path, registries: None) -> None:
    recorded: list[tuple] = []
    method = register_agent_std(recorded)
    spec = validate(compose([*SMALL, f"method.name={method.name}", "algo.sample_order=own_first"]))
    assert spec.method is method and spec.loss.borrowed == "cross"
    seed_everything(0)
    loop, engines = make_loop(spec)
    for step in (1, 2):
        for metrics in loop.step(step).agent_metrics:
            assert all(math.isfinite(v) for v in metrics.values())
    assert len(recorded) == 2
    moved = same = 0
    for rewards, capability, options, out in recorded:
        hacpo = capability_advantage(rewards, capability, options)
        n, p, g = rewards.shape
        pooled = rewards.permute(1, 0, 2).reshape(p, n * g).std(dim=-1)
        own = rewards.std(dim=-1)
        # where target k's own std is the pooled one (or k's own rewards are all equal, which
        # falls back to it), its advantages are HACPO's, exactly; elsewhere they are rescaled
        equal = ((own == 0) | (own == pooled))[:, None, :, None].expand_as(out)
        assert torch.equal(out[equal], hacpo[equal])
        rescaled = ~equal & (hacpo != 0)
        ratio = ((pooled + 1e-6) / (own + 1e-6))[:, None, :, None].expand_as(out)
        assert (out[rescaled] != hacpo[rescaled]).all()
        torch.testing.assert_close(out[rescaled], hacpo[rescaled] * ratio[rescaled])
        moved, same = moved + int(rescaled.sum()), same + int(equal.sum())
    assert moved > 0 and same > 0, (moved, same)
    # the loop trained on exactly these advantages: own rows first, then the partner's
    out = recorded[-1][3]
    updates = 2 * P // MB
    for k, engine in enumerate(engines):
        trained = torch.cat([batch.advantages for batch, _ in engine.updates[-updates:]])
        expected = torch.cat([out[k, k].reshape(-1), out[k, 1 - k].reshape(-1)]).float()
        assert torch.equal(trained, expected)


def test_unknown_function_names_and_too_small_groups_are_one_line_config_errors(job_env, registries):
    register_method(replace(get_method("hacpo"), name="hacpo_typo", advantage="capabilty"))
    register_method(replace(get_method("hacpo"), name="hacpo_typo2", borrowed="crosss"))
    for name, key, value, choices in (("hacpo_typo", "advantage", "capabilty", "capability, group, pooled"),
                                      ("hacpo_typo2", "borrowed", "crosss", "as_own, cross, none")):
        with pytest.raises(ConfigError) as err:
            validate(compose([*SMALL, f"method.name={name}"]))
        message = str(err.value)
        assert "\n" not in message
        assert f"method={name}: MethodSpec.{key}:" in message and repr(value) in message
        assert message.endswith(f"registered: {choices}")
    # the loop refuses one as well (built without validation)
    cfg = compose([*SMALL, "method.name=hacpo_typo"])
    with pytest.raises(KeyError, match="capability, group, pooled"):
        TeamLoop([Agent("a", None), Agent("b", None)], get_method("hacpo_typo"),  # type: ignore[arg-type]
                 method_settings(cfg, get_method("hacpo_typo")), PromptSchedule(load_split("train"), P, 0),
                 hash_grade)
    # the estimator's declared smallest group is checked at validation
    register_agent_std()
    with pytest.raises(ConfigError, match="advantage needs >= 2 rollouts per prompt .*capability_agent_std"):
        validate(compose([*SMALL, "method.name=hacpo_agent_std", "train.rollouts_per_prompt=1"]))
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("capability")(capability_advantage)


# -- a new metric, declared once where it is produced ------------------------------------------

PROBE = {"probe/s_highest": MAX, "probe/cross_frac": ROW_MEAN}


def register_probe() -> MethodSpec:
    """HACPO's borrowed term plus two metrics no engine or loop has heard of: the largest cross
    ratio (a MAX, named without `_max`) and the fraction of cross rows (a row mean)."""
    @register_borrowed("cross_probe", metrics=PROBE)
    def probe_term(s: Tensor, rows: LossBatch, cfg: LossConfig, lower: float) -> BorrowedTerm:
        # registered through `register_borrowed`, whose decorator is typed as returning an
        # Optional term (it also registers objectives without one)
        assert hacpo_borrowed_term is not None
        loss, outside, _ = hacpo_borrowed_term(s, rows, cfg, lower)
        metrics = {"probe/cross_frac": float(rows.cross.float().mean())}
        if bool(rows.cross.any()):
            metrics["probe/s_highest"] = float(s.detach()[rows.cross].max())
        return BorrowedTerm(loss, outside, metrics)

    return register_method(replace(get_method("hacpo"), name="hacpo_probe", borrowed="cross_probe"))


def test_a_declared_metric_survives_the_local_engine_and_the_loop(job_env, registries):
    method = register_probe()
    spec = validate(compose([*SMALL, f"method.name={method.name}"]))
    assert spec.loss.borrowed == "cross_probe"
    seed_everything(0)
    loop, engines = make_loop(spec, micro_batch_rows=3)  # 8-row mini-batches: 3 + 3 + 2
    for metrics, engine in zip(loop.step(1).agent_metrics, engines, strict=True):
        # a MAX over micro-batches and updates: the largest cross ratio of the step
        assert metrics["probe/s_highest"] == metrics["ratio/s_hete_max"]
        per_update = [m["probe/s_highest"] for _, m in engine.updates]
        assert metrics["probe/s_highest"] == max(per_update) > min(per_update)
        # row-weighted over micro-batches (the mini-batch's fraction), a mean over the updates
        for batch, m in engine.updates:
            assert m["probe/cross_frac"] == pytest.approx(float(batch.cross.float().mean()))
        assert metrics["probe/cross_frac"] == pytest.approx(0.5)


def _rows(n: int, seed: int = 0) -> tuple[list[TokenView], LossBatch, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 7, (n,), generator=gen)
    views = [TokenView((3, 4), tuple(range(5, 5 + int(length)))) for length in lengths]
    mask = (torch.arange(int(lengths.max()))[None] < lengths[:, None]).float()
    cross = torch.arange(n) % 3 == 2
    batch = LossBatch(response_mask=mask, old_logp=-1.5 * mask * (~cross)[:, None],
                      source_mean_logp=torch.randn(n, generator=gen) * 0.2 - 1.5,
                      advantages=torch.randn(n, generator=gen), omega=torch.ones(n), cross=cross,
                      own=torch.arange(n) % 3 == 0)
    logp = (-1.5 + 0.3 * torch.randn(mask.shape, generator=gen)) * mask
    return views, batch, logp


def test_a_declared_metric_survives_verls_aggregation(registries: None) -> None:
    pytest.importorskip("verl", reason="the verl side needs the [verl] extra")
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import Metric

    from hacrl.algo import Denominators
    from hacrl.engines.verl import batch as vb
    from hacrl.engines.verl.update_metrics import actor_metrics
    from hacrl.engines.verl.worker_loss import (
        DENOMINATORS,
        UPDATE_INDEX,
        loss_callable,
        reported_metrics,
    )

    register_probe()
    config = LossConfig(alpha=0.7, borrowed="cross_probe")
    views, batch, logp = _rows(12)
    whole = policy_loss(logp, batch, config, update_index=1)
    d = Denominators.of(batch)
    fields = vb.loss_fields(batch, batch.response_mask.shape[1])
    fields["row"] = torch.arange(len(views))
    data = vb.to_tensordict(views, 0, fields, {UPDATE_INDEX: 1, "dp_size": 2,
                                               DENOMINATORS: dataclasses.astuple(d)})
    ranks = []
    for rank in tu.chunk_tensordict(data, 2):  # verl: micro-batches on each data-parallel rank
        merged: dict[str, Metric] = {}
        for micro in tu.chunk_tensordict(rank, 3):
            _, metrics = loss_callable(config)(model_output={"log_probs": logp[micro["row"]]},
                                               data=micro, dp_group=None)
            for key, metric in metrics.items():
                merged.setdefault(key, Metric(metric.aggregation)).append(metric)
        ranks.append(merged)
    raw = {key: Metric.aggregate_dp([r[key] for r in ranks]) for key in ranks[0]}
    out = actor_metrics(raw, reported_metrics(config))
    for key in PROBE:
        assert out[key] == pytest.approx(whole.metrics[key], abs=1e-7), key
    assert out["loss/total"] == pytest.approx(whole.metrics["loss/total"], abs=1e-6)
    # what a second list used to cost: undeclared, the metric is verl's, not ours
    assert "probe/s_highest" not in actor_metrics(raw)


def test_an_undeclared_metric_is_refused_not_dropped(registries):
    @register_borrowed("cross_loud")
    def loud_term(s: Tensor, rows: LossBatch, cfg: LossConfig, lower: float) -> BorrowedTerm:
        # registered through `register_borrowed`, whose decorator is typed as returning an
        # Optional term (it also registers objectives without one)
        assert hacpo_borrowed_term is not None
        loss, outside, _ = hacpo_borrowed_term(s, rows, cfg, lower)
        return BorrowedTerm(loss, outside, {"probe/undeclared": 1.0})

    _, batch, logp = _rows(6)
    with pytest.raises(ValueError, match=r"undeclared metrics \['probe/undeclared'\]"):
        policy_loss(logp, batch, LossConfig(borrowed="cross_loud"), 0)
    # a term-less objective cannot score cross rows
    with pytest.raises(ValueError, match="no cross-agent term"):
        policy_loss(logp, batch, LossConfig(borrowed="as_own"), 0)


def test_job_settings_come_from_method_settings(job_env):
    spec = validate(compose([*SMALL, "method=naive"]))
    settings = spec.settings
    assert settings == method_settings(spec.cfg, spec.method) and settings.loss is spec.loss
    assert spec.loss.borrowed == "as_own" and not spec.loss.stepwise
    assert Path(spec.agents[0].path).name == QWEN
