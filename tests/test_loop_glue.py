"""The glue between a method's definition and the loss it trains with.

A method is a registry entry (`hacrl.algo.methods`); a job turns it and the config into the
loop's and the loss's settings once (`hacrl.config.settings.method_settings`, into `JobSpec.settings`);
the loop turns a step's rewards into capabilities, omegas, advantages and per-row loss inputs
(`hacrl.training.loop.TeamLoop._target_rows`). These tests pin each link against the paper's definition
of every method (PAPER.md, "Baselines and ablations"), hard-coded here per method name, so that
a registry edit that flips a switch, a switch lost on its way into `LossConfig`, or a loop that
hands a borrowed row the wrong omega (omega^(k,j) instead of omega^(j,k), or omega while the
method switches modulation off) fails a test.

The loop test runs one real step of micro models (a team of three for sharing methods, so that
omega^(j,k) != omega^(k,j) and two sources differ), with the `lenient_grader` so rewards vary
and a capability window preloaded with clearly different histories, records what the loop hands
to each engine update and to `policy_loss`, and recomputes P, omega and the advantages here from
the recorded rewards.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import hacrl.engines.base
from hacrl.algo import METHODS, LossConfig
from hacrl.algo.rollout import eos_id
from hacrl.config import compose, validate
from hacrl.config.settings import OptimizerSettings
from hacrl.data.arith import load_split
from hacrl.engines.base import Engine
from hacrl.engines.local import LocalEngine
from hacrl.training.loop import Agent, PromptSchedule, TeamLoop, seed_everything

pytestmark = pytest.mark.usefixtures("one_thread")

TRIO = ["qwen3-1.7b-base", "qwen3-4b-base", "llama3.2-1b-instruct"]
SOLO = "qwen3-4b-base"
P, MB, G, MAX_NEW = 4, 2, 4, 16
ALPHA = 0.6  # not 1, so that a lost alpha shows
SIZES = (f"train.prompts_per_step={P}", f"train.minibatch_prompts={MB}",
         f"train.rollouts_per_prompt={G}", f"rollout.max_new_tokens={MAX_NEW}",
         f"algo.alpha={ALPHA}")
EPS = 1e-6  # the advantages' std epsilon


@dataclass(frozen=True)
class Paper:
    """A method as the paper defines it (PAPER.md), in the terms of what reaches the loss.

    team: shares rollouts (borrowed rows exist); ratio / agg / clip: the own-sample objective;
    advantage: "group" (per agent), "pooled" (one group of n*G), "capability" (HACPO's mu^(k));
    borrowed: how borrowed rows enter: "none", "as_own" (Naive), "cross" (J_hete);
    omega: borrowed advantages modulated by omega^(j,k); stepwise: the lower clip bound rises
    with m; cross_clip: borrowed ratios clipped at all; rollouts / updates: G and the number of
    optimizer updates relative to GSPO's.
    """

    team: bool = False
    ratio: str = "sequence"
    agg: str = "seq-mean-token-mean"
    clip: tuple[float, float] = (3e-4, 4e-4)
    advantage: str = "group"
    borrowed: str = "none"
    omega: bool = False
    stepwise: bool = False
    cross_clip: bool = False
    rollouts: int = 1
    updates: int = 1
    trains: bool = True


HACPO = Paper(team=True, advantage="capability", borrowed="cross", omega=True, stepwise=True,
              cross_clip=True)
PAPER = {
    "base": Paper(trains=False),
    "grpo": Paper(ratio="token", agg="token-mean", clip=(0.2, 0.28)),
    "gspo": Paper(),
    "gspo_x2": Paper(rollouts=2, updates=2),
    "gspo_updates_x2": Paper(updates=2),
    "naive": Paper(team=True, advantage="pooled", borrowed="as_own"),
    "hacpo": HACPO,
    "hacpo_no_adv": replace(HACPO, advantage="pooled"),
    "hacpo_no_omega": replace(HACPO, omega=False),  # omega stays in the baseline
    "hacpo_no_stepwise": replace(HACPO, stepwise=False),
    "hacpo_no_clip": replace(HACPO, stepwise=False, cross_clip=False),
}
TRAINING = sorted(m for m, p in PAPER.items() if p.trains)


def _job(zoo: Path, method: str, *overrides: str):
    team = "pair=trio" if PAPER[method].team else f"agents=[{SOLO}]"
    cfg = compose([f"method={method}", team, f"scale.model_root={zoo}", *SIZES, *overrides])
    return validate(cfg)


def test_every_paper_method_is_registered():
    assert set(PAPER) <= set(METHODS), sorted(set(PAPER) - set(METHODS))


@pytest.mark.parametrize("method", sorted(PAPER))
def test_method_switches_reach_the_loss_config(micro_zoo, method):
    """Registry entry + config -> the loop's settings and the LossConfig the engines get."""
    paper = PAPER[method]
    spec = _job(micro_zoo, method)
    m = spec.method
    assert m.name == method and m.trains == paper.trains
    assert m.shares_rollouts == paper.team
    assert m.advantage == paper.advantage
    assert m.borrowed == paper.borrowed
    assert m.omega_modulation == paper.omega
    assert len(spec.agents) == (3 if paper.team else 1)
    # the loss every engine trains with (JobSpec.loss, the engines' EngineContext.loss) and the
    # loop's copy of it are one config, and it carries each switch of the method
    settings = spec.settings
    assert settings.loss == spec.loss
    expected = LossConfig(ratio=paper.ratio, loss_agg=paper.agg, clip_low=paper.clip[0],
                          clip_high=paper.clip[1], alpha=ALPHA, delta=spec.loss.delta,
                          delta_step=0.025, stepwise=paper.stepwise, cross_clip=paper.cross_clip,
                          kl_coef=0.001, borrowed=paper.borrowed,
                          dual_clip_c=3.0 if paper.ratio == "token" else None)
    assert spec.loss == expected
    assert spec.loss.delta == pytest.approx(0.2)  # pair=trio: lower bound 0.8 at m = 0
    # the omega clamp, baseline guard, zeroing and capability floor of the as_run profile
    # reach the loop (and GRPO's dual clip its loss, above)
    assert settings.omega_clamp == (0.1, 10.0)
    assert settings.baseline_guard and settings.zero_uniform_groups
    assert settings.capability_window == 5 and settings.capability_floor == 1e-8
    assert m.group_size(G) == G * paper.rollouts
    assert P // m.update_prompts(MB) == paper.updates * P // MB



def test_config_values_reach_the_loop_and_the_loss(micro_zoo):
    """Each config key the loop or the loss reads arrives there: values set off every default of
    LoopSettings, LossConfig and SamplingParams, so a key dropped on the way (its default taken
    instead) shows."""
    spec = _job(micro_zoo, "hacpo", "seed=7", "algo.clip_low=0.1", "algo.clip_high=0.3",
                "algo.cross_clip_lower=0.7", "algo.delta_step=0.05",
                "algo.capability_window=3", "algo.capability_floor=0.05",
                "rollout.temperature=0.7", "rollout.top_p=0.9", "rollout.overflow=error",
                "task.prompt_template='Q: {question}'")
    loss = spec.loss
    # the own-sample clip the config sets replaces the method's default (3e-4, 4e-4)
    assert (loss.clip_low, loss.clip_high) == pytest.approx((0.1, 0.3))
    # the borrowed rows' lower bound: 1 - delta = cross_clip_lower at m = 0, rising by delta_step
    assert (loss.delta, loss.delta_step) == pytest.approx((0.3, 0.05))
    settings = spec.settings
    assert settings.loss == loss
    assert settings.seed == 7  # seeds the rows' order within a step (sample_order=mixed)
    assert settings.prompt_template == "Q: {question}"
    assert settings.overflow == "error"
    assert settings.capability_window == 3
    assert settings.capability_floor == pytest.approx(0.05)
    assert settings.sampling.max_new_tokens == MAX_NEW
    assert settings.sampling.temperature == pytest.approx(0.7)
    assert settings.sampling.top_p == pytest.approx(0.9)


OPTIMIZER = ("train.lr=3e-5", "train.betas=[0.8,0.95]", "train.weight_decay=0.05",
             "train.grad_clip=0.5")  # each off its default


def test_the_local_engine_gets_the_jobs_one_optimizer_settings(micro_zoo):
    """The optimizer settings are built once (`JobSpec.optimizer`) from values set off every
    default, travel in the agent's `EngineContext`, and are the local engine's AdamW and clip
    (verl's side: the test below)."""
    from hacrl.job import engine_context

    spec = _job(micro_zoo, "hacpo", *OPTIMIZER)
    assert spec.optimizer == OptimizerSettings(3e-5, (0.8, 0.95), 0.05, 0.5)
    context = engine_context(spec, spec.agents[0], 0, len(spec.agents), micro_zoo)
    assert context.optimizer is spec.optimizer and context.loss is spec.settings.loss
    local = LocalEngine(spec.agents[0].path, optimizer=context.optimizer, device="cpu")
    group = local.optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["weight_decay"], local.grad_clip) == (
        3e-5, (0.8, 0.95), 0.05, 0.5)


@pytest.mark.verl
def test_verl_gets_the_same_optimizer_settings(micro_zoo):
    """verl's `actor.optim` section, built from the agent's `EngineContext` as the verl engine
    and the dry run build it, carries the job's `OptimizerSettings`, not a second reading of
    the config."""
    pytest.importorskip("verl", reason="verl's config needs the [verl] extra")
    from hacrl.engines.verl.translate import agent_verl_config
    from hacrl.job import engine_context

    spec = _job(micro_zoo, "hacpo", *OPTIMIZER, "engine=verl", "engine.device=cpu")
    context = engine_context(spec, spec.agents[0], 0, len(spec.agents), micro_zoo)
    assert context.optimizer is spec.optimizer
    optim = agent_verl_config(context, spec.agents[0].path).actor_rollout_ref.actor.optim
    assert (optim.lr, list(optim.betas), optim.weight_decay, optim.clip_grad) == (
        3e-5, [0.8, 0.95], 0.05, 0.5)

# -- one step of the loop: what every row of every update carries ------------------------------

# capability history preloaded per agent: the oldest row drops out of the K = 5 window at this
# step (it would change every P if it stayed); the others set P_0 < P_1 < P_2 whatever this
# step's rewards, so omega^(j,k) != omega^(k,j) for every pair
HISTORY = [[1.0, 0.0, 0.5]] + [[0.05, 0.4, 0.9]] * 4


class Recorder(Engine):
    """A local engine that records its generations and what each update is handed."""

    def __init__(self, inner: LocalEngine) -> None:
        self.inner, self.tokenizer = inner, inner.tokenizer
        self.generations: list = []
        self.updates: list[tuple[list, object, LossConfig, int]] = []

    def generate(self, prompt_ids, n, sampling):
        out = self.inner.generate(prompt_ids, n, sampling)
        self.generations.extend(g for group in out for g in group)
        return out

    def log_probs(self, views, reference=False):
        return self.inner.log_probs(views, reference)

    def train_minibatch(self, views, batch, loss_fn):
        self.updates.append((list(views), batch, loss_fn.config, loss_fn.update_index))
        return self.inner.train_minibatch(views, batch, loss_fn)

    def save(self, directory):
        self.inner.save(directory)

    def load(self, directory):
        self.inner.load(directory)


def _capability(rewards: list[list[float]], window: int, floor: float) -> list[float]:
    n = len(rewards)
    history = [row[:n] for row in HISTORY] + [[statistics.fmean(r) for r in rewards]]
    recent = history[-window:]
    return [max(floor, statistics.fmean(row[k] for row in recent)) for k in range(n)]


def _clamp(x: float, bounds: tuple[float, float] | None) -> float:
    return x if bounds is None else min(max(x, bounds[0]), bounds[1])


def _zscore(value: float, mean: float, group: list[float]) -> float:
    std = statistics.stdev(group) if len(group) > 1 else 1.0
    return (value - mean) / (std + EPS)


def _advantage(kind: str, r: list[list[list[float]]], cap: list[float], k: int, j: int, p: int,
               i: int, settings) -> float:
    """A^(k)(y_i^(j)) of prompt p, from the paper's formulas (r[agent][prompt][sample])."""
    n = len(r)
    value = r[j][p][i]
    pooled = [x for a in range(n) for x in r[a][p]]
    if kind == "group":
        return _zscore(value, statistics.fmean(r[j][p]), r[j][p])
    if kind == "pooled":
        return _zscore(value, statistics.fmean(pooled), pooled)
    assert kind == "capability"
    if settings.zero_uniform_groups and len(set(pooled)) == 1:
        return 0.0
    mu = sum(_clamp(cap[k] / cap[a], settings.omega_clamp) * x
             for a in range(n) for x in r[a][p]) / len(pooled)
    if settings.baseline_guard and mu > 1.0:
        mu = statistics.fmean(r[k][p])
    return _zscore(value, mu, pooled)


def _response_ids(source: Recorder, target: Recorder, generation) -> tuple[int, ...]:
    """The target's tokens of a source's response (the paper's re-encoding)."""
    tokens = list(generation.token_ids)
    text = source.tokenizer.decode(tokens, skip_special_tokens=True)
    finished = bool(tokens) and tokens[-1] == eos_id(source.tokenizer)
    ids = list(target.tokenizer.encode(text, add_special_tokens=False))
    return tuple((ids + [eos_id(target.tokenizer)] * finished)[:MAX_NEW])


CASES = [pytest.param(m, (), id=m) for m in TRAINING] + [
    pytest.param("hacpo", ("profile=bare",), id="hacpo-bare"),
    pytest.param("hacpo", ("algo.omega_clamp=[0.5,2.0]", "algo.sample_order=own_first"),
                 id="hacpo-tight-clamp-own-first"),
    pytest.param("hacpo_no_omega", ("profile=bare",), id="hacpo_no_omega-bare"),
    # the as_run profile's two advantage switches one at a time (the first prompt's group is
    # all 1s: zeroing or the guard decides its advantages)
    pytest.param("hacpo", ("algo.zero_uniform_groups=false",), id="hacpo-guard-only"),
    pytest.param("hacpo", ("algo.baseline_guard=false",), id="hacpo-zeroing-only"),
]


@pytest.mark.parametrize(("method", "overrides"), CASES)
def test_loop_hands_every_row_its_omega_advantage_and_switches(micro_zoo, lenient_grader,
                                                               monkeypatch, method, overrides):
    paper = PAPER[method]
    spec = _job(micro_zoo, method, *overrides)
    settings = spec.settings
    seed_everything(0)
    engines = [Recorder(LocalEngine(a.path, optimizer=OptimizerSettings(lr=1e-3), device="cpu", old_logprobs="sampler",
                                    reference=settings.loss.kl_coef > 0)) for a in spec.agents]
    n = len(engines)
    group = G * paper.rollouts
    graded: list[list[float]] = []

    def grade(responses, answers):
        # every agent solves the first prompt every time: one uniform pooled group
        out = [1.0] * group + lenient_grader(responses, answers)[group:]
        graded.append(list(out))
        return out

    seen: list[tuple[LossConfig, int]] = []
    real_loss = hacrl.engines.base.policy_loss

    def spy(logp, batch, cfg, update_index, denominators=None):
        seen.append((cfg, update_index))
        return real_loss(logp, batch, cfg, update_index, denominators=denominators)

    monkeypatch.setattr(hacrl.engines.base, "policy_loss", spy)  # what MiniBatchLoss calls
    loop = TeamLoop([Agent(a.name, e) for a, e in zip(spec.agents, engines, strict=True)],
                    spec.method, settings, PromptSchedule(load_split("train"), P, 0), grade)
    assert loop.capability.window == 5
    loop.capability.load_state_dict({"n_agents": n, "history": [row[:n] for row in HISTORY]})
    result = loop.step(1)

    # what the loop graded, and P, omega from it (paper step 1, K = 5, floor)
    assert len(graded) == n and all(len(g) == P * group for g in graded)
    rewards = [[g[p * group:(p + 1) * group] for p in range(P)] for g in graded]
    cap = _capability(graded, settings.capability_window, settings.capability_floor)
    clamp = settings.omega_clamp
    if n > 1:
        assert len({round(c, 6) for c in cap}) == n, cap
    for k, metrics in enumerate(result.agent_metrics):
        assert metrics["capability/P"] == pytest.approx(cap[k], rel=1e-6)
        for j in range(n):
            if j != k:  # the metric is omega^(k,j) = P_k / P_j
                assert metrics[f"omega/{spec.agents[j].name}"] == pytest.approx(
                    _clamp(cap[k] / cap[j], clamp), rel=1e-5)

    updates_per_target = n * P // (MB // spec.method.minibatch_divisor)
    assert updates_per_target == paper.updates * n * P // MB
    # the loss receives the method's switches (the config test pins the whole LossConfig)
    assert [cfg for cfg, _ in seen] == [settings.loss] * len(seen)
    assert (settings.loss.stepwise, settings.loss.cross_clip, settings.loss.borrowed,
            settings.loss.alpha) == (paper.stepwise, paper.cross_clip, paper.borrowed, ALPHA)
    assert [m for _, m in seen] == list(range(updates_per_target)) * n
    omegas_off_one = 0
    for k, engine in enumerate(engines):
        assert [u[3] for u in engine.updates] == list(range(updates_per_target))
        assert all(u[2] == settings.loss for u in engine.updates)
        # the rows of the step in the order the updates got them, back in the loop's layout:
        # own rows, then each source's (j = 0..n-1, j != k), prompt by prompt
        views = [v for u in engine.updates for v in u[0]]
        rows = [(u[1], b) for u in engine.updates for b in range(len(u[0]))]
        sources = [k] + [j for j in range(n) if j != k] if paper.team else [k]
        assert len(views) == len(sources) * P * group
        own = torch.tensor([s == k for s in sources for _ in range(P * group)])
        order = loop._order(k, 1, SimpleNamespace(own=own)).tolist()
        layout = [None] * len(views)
        for q, r in enumerate(order):
            layout[r] = (views[q], *rows[q])
        for r, (view, batch, b) in enumerate(layout):
            j, i = sources[r // (P * group)], r % (P * group)
            p, g = divmod(i, group)
            gen = engines[j].generations[i]
            length = int(batch.response_mask[b].sum())
            borrowed = j != k
            if borrowed:
                assert view.response_ids == _response_ids(engines[j], engine, gen), (k, j, i)
            else:
                assert view.response_ids == tuple(gen.token_ids), (k, i)
            assert length == len(view.response_ids)
            # the modulation: omega^(j,k) = P_j / P_k on borrowed rows where the method has it
            omega = float(batch.omega[b])
            if borrowed and paper.omega:
                assert omega == pytest.approx(_clamp(cap[j] / cap[k], clamp), rel=1e-5), (k, j)
                omegas_off_one += abs(omega - 1.0) > 1e-3
            else:
                assert omega == 1.0, (method, k, j)
            # the advantage: the method's estimator, target k's baseline
            expected = _advantage(paper.advantage, rewards, cap, k, j, p, g, settings)
            assert float(batch.advantages[b]) == pytest.approx(expected, rel=1e-4, abs=1e-4), (
                method, k, j, i)
            assert bool(batch.own[b]) == (not borrowed)
            assert bool(batch.cross[b]) == (borrowed and paper.borrowed == "cross")
            old = batch.old_logp[b, :length]
            if not borrowed:  # the sampler's log-probs are the own rows' old log-probs
                assert torch.allclose(old, torch.tensor(gen.logprobs), atol=1e-6)
                assert float(batch.source_mean_logp[b]) == pytest.approx(
                    statistics.fmean(gen.logprobs), abs=1e-5)
            elif paper.borrowed == "cross":  # J_hete: against the source's rollout policy
                assert not old.any()
                assert float(batch.source_mean_logp[b]) == pytest.approx(
                    statistics.fmean(gen.logprobs), abs=1e-5)
            else:  # Naive: the target's own pre-update log-probs, the own-sample clip
                assert paper.borrowed == "as_own" and bool((old != 0).all())
            # the reference's log-probs where there is a KL term, on own rows only; at step 1
            # the reference is the policy that sampled them
            assert (batch.ref_logp is not None) == (settings.loss.kl_coef > 0)
            if batch.ref_logp is not None and borrowed:
                assert not batch.ref_logp[b].any()
            elif batch.ref_logp is not None:
                assert torch.allclose(batch.ref_logp[b, :length], old, atol=1e-4), (k, i)
        # the stepwise bound each update reports follows the method's switch
        bounds = [m["clip/lower_bound"] for m in [result.agent_metrics[k]]]
        assert bounds[0] == pytest.approx(0.8 + 0.025 * (updates_per_target - 1) / 2
                                          if paper.stepwise else 0.8)
    if paper.team and paper.omega:
        assert omegas_off_one > 0, "the capabilities left every omega at 1: the test has no teeth"
