"""One `TeamLoop.step` on micro models: HACPO for a qwen+llama pair and a team of three, every
registered method, update counts, the update index m, call order, Naive vs HACPO old log-probs,
and the metrics a step reports."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import hacrl.algo
import hacrl.engines.base
import hacrl.training.loop
from hacrl.algo import METHODS, LossConfig
from hacrl.algo.rollout import (
    RetokenizationOverflow,
    SamplingParams,
    Trajectory,
    eos_id,
    render_prompt_ids,
)
from hacrl.config.settings import LoopSettings, OptimizerSettings
from hacrl.data.arith import load_split
from hacrl.data.problem import Problem
from hacrl.engines.base import Engine, Generation, MiniBatchLoss
from hacrl.engines.local import LocalEngine
from hacrl.training.loop import (
    Agent,
    PromptSchedule,
    TeamLoop,
    prompt_messages,
    rng_state,
    seed_everything,
    set_rng_state,
)

QWEN, QWEN_SMALL, LLAMA = "qwen3-4b-base", "qwen3-1.7b-base", "llama3.2-1b-instruct"
P, MB, G = 4, 2, 4

pytestmark = pytest.mark.usefixtures("one_thread")


class Recorder(Engine):
    """A local engine that records every call (into a log shared by the team)."""

    def __init__(self, name: str, inner: LocalEngine, log: list[tuple]) -> None:
        self.name, self.inner, self.log = name, inner, log
        self.tokenizer = inner.tokenizer
        self.generated: list[tuple[int, ...]] = []
        self.generate_n: list[int] = []
        self.logprob_calls: list[tuple[list, bool]] = []
        self.train_calls: list[tuple[list, object, dict]] = []

    def generate(self, prompt_ids, n, sampling):
        self.log.append(("generate", self.name))
        self.generate_n.append(n)
        out = self.inner.generate(prompt_ids, n, sampling)
        self.generated.extend(tuple(g.token_ids) for group in out for g in group)
        return out

    def log_probs(self, views, reference=False):
        self.log.append(("log_probs", self.name))
        self.logprob_calls.append((list(views), reference))
        return self.inner.log_probs(views, reference)

    def train_minibatch(self, views, batch, loss_fn):
        self.log.append(("train", self.name))
        metrics = self.inner.train_minibatch(views, batch, loss_fn)
        self.train_calls.append((list(views), batch, metrics))
        return metrics

    def save(self, directory: Path) -> None:
        self.inner.save(directory)

    def load(self, directory: Path) -> None:
        self.inner.load(directory)

    def memory_metrics(self):
        return self.inner.memory_metrics()


class RemoteLoss(Recorder):
    """An engine whose loss runs elsewhere, as the verl engine's workers do: the loop's
    `MiniBatchLoss` is told the reported metrics' kinds but collects no outputs."""

    def train_minibatch(self, views, batch, loss_fn):
        remote = MiniBatchLoss(loss_fn.config, update_index=loss_fn.update_index)
        metrics = super().train_minibatch(views, batch, remote)
        loss_fn.kinds.update(remote.kinds)
        return metrics


def make_loop(zoo: Path, names: list[str], method: str, grade, *, prompts: int = P,
              minibatch: int = MB, group: int = G, kl: float = 0.0, max_new_tokens: int = 16,
              old_logprobs: str = "sampler", engine: type[Recorder] = Recorder, **settings):
    spec = METHODS[method]
    log: list[tuple] = []
    engines = [engine(n, LocalEngine(str(zoo / n), optimizer=OptimizerSettings(lr=1e-3),
                                     device="cpu", reference=kl > 0,
                                     old_logprobs=old_logprobs), log)
               for n in names]
    loss = LossConfig(ratio=spec.ratio, loss_agg=spec.loss_agg, clip_low=spec.clip_low,
                      clip_high=spec.clip_high, alpha=1.0, delta=0.2, delta_step=0.025,
                      stepwise=spec.stepwise, cross_clip=spec.cross_clip, kl_coef=kl)
    loop_settings = LoopSettings(prompts, minibatch, group, SamplingParams(max_new_tokens=max_new_tokens),
                                 loss, **settings)
    loop = TeamLoop([Agent(n, e) for n, e in zip(names, engines, strict=True)], spec, loop_settings,
                    PromptSchedule(load_split("train"), prompts, 0), grade)
    return loop, engines, log


def _finite(metrics: dict[str, float]) -> None:
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
    assert not bad, bad


def _check_retok_metrics(metrics, borrowed, source_tokens) -> None:
    """retok/*: the mean length ratio (target tokens / source tokens) of the borrowed rows and
    the share of them cut at the target's budget."""
    ratios = [len(v.response_ids) / len(t) for v, t in zip(borrowed, source_tokens, strict=True)]
    assert metrics["retok/length_ratio"] == pytest.approx(sum(ratios) / len(ratios))
    assert metrics["retok/truncated_frac"] == pytest.approx(
        sum(v.truncated for v in borrowed) / len(borrowed))


def _check_update_widths(engine: Recorder) -> None:
    """Each update's loss inputs are as wide as the longest response among its rows (not the
    step's): no padded columns past them."""
    for views, batch, _ in engine.train_calls:
        width = max(len(v.response_ids) for v in views)
        for name in ("response_mask", "old_logp", "ref_logp"):
            tensor = getattr(batch, name)
            assert tensor is None or tensor.shape == (len(views), width), (name, tensor.shape)


def _step_messages(loop: TeamLoop, step: int):
    return [prompt_messages(p, loop.settings.prompt_template) for p in loop.schedule.batch(step)]


REQUIRED = ["reward/mean", "capability/P", "clip/own_frac", "clip/borrowed_frac", "clip/lower_bound",
            "loss/total", "loss/policy", "loss/kl", "grad_norm", "response/length_mean",
            "response/finished_frac", "tokens/own", "tokens/borrowed", "train/updates",
            "ratio/s_homo_mean", "ratio/s_homo_min", "ratio/s_homo_max",
            "time/generate_s", "time/logprob_s", "time/update_s", "memory/peak_rss_gb"]


def test_hacpo_step_qwen_llama(micro_zoo, lenient_grader):
    seed_everything(0)
    loop, engines, _ = make_loop(micro_zoo, [QWEN, LLAMA], "hacpo", lenient_grader, kl=1e-3,
                                   max_new_tokens=24, sample_order="own_first")
    result = loop.step(1)
    qwen_m, llama_m = result.agent_metrics
    for metrics, other in ((qwen_m, LLAMA), (llama_m, QWEN)):
        _finite(metrics)
        missing = [k for k in [*REQUIRED, f"omega/{other}", "ratio/s_hete_mean", "ratio/s_hete_min",
                               "ratio/s_hete_max", "retok/length_ratio", "retok/truncated_frac"]
                   if k not in metrics]
        assert not missing
        assert metrics["capability/P"] == pytest.approx(max(metrics["reward/mean"], 0.01))
        assert metrics["train/updates"] == 2 * P / MB
    assert {"time/verify_s", "time/step_s"} <= set(result.team_metrics)
    # a step's time is all its phases: the team's grading and every agent's own phases
    phases = [v for m in (result.team_metrics, qwen_m, llama_m) for k, v in m.items()
              if k.startswith("time/") and k != "time/step_s"]
    assert result.team_metrics["time/step_s"] == pytest.approx(sum(phases))
    assert result.team_metrics["time/step_s"] >= max(phases) > 0
    for name in [*qwen_m, *llama_m, *result.team_metrics]:
        assert "@" not in name and "%" not in name
    # omega^(k,j) = P_k / P_j
    assert qwen_m[f"omega/{LLAMA}"] == pytest.approx(qwen_m["capability/P"] / llama_m["capability/P"])
    assert llama_m[f"omega/{QWEN}"] == pytest.approx(1 / qwen_m[f"omega/{LLAMA}"])
    # char-level qwen needs more tokens for llama's text, BPE llama fewer for qwen's
    assert qwen_m["retok/length_ratio"] > 1.0 > llama_m["retok/length_ratio"]
    # the KL term saw the reference policy
    assert any(ref for e in engines for _, ref in e.logprob_calls)

    messages = _step_messages(loop, 1)
    for k, engine in enumerate(engines):
        source, tok = engines[1 - k], engine.tokenizer
        rows = [v for views, _, _ in engine.train_calls for v in views]
        assert engine.train_calls and all(len(views) == MB * G for views, _, _ in engine.train_calls)
        # own_first keeps generation order: own rows, then the source's rows
        own_rows, borrowed = rows[:P * G], rows[P * G:]
        assert [v.response_ids for v in own_rows] == engine.generated  # exact sampled tokens
        assert len(borrowed) == len(source.generated) == P * G
        # every row carries the target's own rendering of the prompt
        assert [v.prompt_ids for v in rows] == 2 * [
            tuple(render_prompt_ids(tok, m)) for m in messages for _ in range(G)]
        for view, src_tokens in zip(borrowed, source.generated, strict=True):
            text = source.tokenizer.decode(list(src_tokens), skip_special_tokens=True)
            finished = src_tokens[-1] == eos_id(source.tokenizer)
            ids = list(tok.encode(text, add_special_tokens=False)) + [eos_id(tok)] * finished
            assert view.truncated == (len(ids) > 24)
            assert list(view.response_ids) == ids[:24]
            if finished and not view.truncated:
                assert view.response_ids[-1] == eos_id(tok) != eos_id(source.tokenizer)
            if not view.truncated and tok.decode(tok.encode(text, add_special_tokens=False)) == text:
                assert tok.decode(list(view.response_ids), skip_special_tokens=True) == text
        metrics = result.agent_metrics[k]
        assert metrics["tokens/own"] == sum(len(t) for t in engine.generated)
        assert metrics["tokens/borrowed"] == sum(len(v.response_ids) for v in borrowed)
        _check_retok_metrics(metrics, borrowed, source.generated)
        _check_update_widths(engine)


def test_hacpo_team_of_three(micro_zoo, lenient_grader):
    seed_everything(0)
    names = [QWEN_SMALL, QWEN, LLAMA]
    loop, engines, _ = make_loop(micro_zoo, names, "hacpo", lenient_grader)
    result = loop.step(1)
    assert len(result.agent_metrics) == 3
    for k, (metrics, engine) in enumerate(zip(result.agent_metrics, engines, strict=True)):
        _finite(metrics)
        others = [n for j, n in enumerate(names) if j != k]
        assert {f"omega/{o}" for o in others} == {m for m in metrics if m.startswith("omega/")}
        assert metrics["train/updates"] == 3 * P / MB == len(engine.train_calls)
        assert sum(len(views) for views, _, _ in engine.train_calls) == 3 * P * G
        assert "ratio/s_hete_mean" in metrics
        assert [m["clip/lower_bound"] for _, _, m in engine.train_calls] == pytest.approx(
            [0.8 + 0.025 * m for m in range(6)])


def _team(method: str) -> list[str]:
    return [QWEN, LLAMA] if METHODS[method].shares_rollouts else [QWEN]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_runs_a_step(micro_zoo, lenient_grader, method):
    spec = METHODS[method]
    seed_everything(0)
    loop, engines, _ = make_loop(micro_zoo, _team(method), method, lenient_grader)
    result = loop.step(1)
    n = len(engines)
    group = G * spec.rollout_multiplier
    expected_updates = n * P // (MB // spec.minibatch_divisor)
    for metrics, engine in zip(result.agent_metrics, engines, strict=True):
        _finite(metrics)
        assert metrics["train/updates"] == expected_updates == len(engine.train_calls)
        assert engine.generate_n == [group]
        assert all(len(views) == MB // spec.minibatch_divisor * group
                   for views, _, _ in engine.train_calls)
        assert ("ratio/s_hete_mean" in metrics) == (spec.borrowed == "cross")
        assert "ratio/s_homo_mean" in metrics and "grad_norm" in metrics
        # the time of each phase under its name (Naive's scoring of borrowed rows: logprob)
        assert {k for k in metrics if k.startswith("time/")} == {
            "time/generate_s", "time/logprob_s", "time/update_s"}
        assert (f"omega/{LLAMA}" in metrics) == (spec.shares_rollouts and engine.name == QWEN)
        for _, batch, _ in engine.train_calls:
            if spec.borrowed == "cross":
                assert torch.equal(batch.cross, ~batch.own)
            else:
                assert not batch.cross.any()
        bounds = [m["clip/lower_bound"] for _, _, m in engine.train_calls]
        if spec.stepwise:
            assert bounds == pytest.approx([0.8 + 0.025 * m for m in range(expected_updates)])
        else:
            assert bounds == pytest.approx([0.8] * expected_updates)


@pytest.mark.parametrize("minibatch", [1, 4])
def test_number_of_updates_follows_the_minibatch(micro_zoo, lenient_grader, minibatch):
    loop, engines, _ = make_loop(micro_zoo, [QWEN, LLAMA], "hacpo", lenient_grader,
                                 minibatch=minibatch)
    result = loop.step(1)
    for metrics, engine in zip(result.agent_metrics, engines, strict=True):
        assert metrics["train/updates"] == 2 * P / minibatch == len(engine.train_calls)


def test_gspo_x2_doubles_group_and_halves_minibatch(micro_zoo, lenient_grader):
    loop, (engine,), _ = make_loop(micro_zoo, [QWEN], "gspo_x2", lenient_grader)
    base, (base_engine,), _ = make_loop(micro_zoo, [QWEN], "gspo", lenient_grader)
    assert loop.group_size == 2 * base.group_size == 2 * G
    assert loop.rows_per_update == base.rows_per_update == MB * G  # MB/2 prompts of 2G rows
    metrics = loop.step(1).agent_metrics[0]
    base_metrics = base.step(1).agent_metrics[0]
    assert metrics["train/updates"] == 2 * base_metrics["train/updates"] == 2 * P / MB
    assert len(engine.generated) == 2 * len(base_engine.generated) == P * 2 * G


def test_update_index_reaches_the_loss(micro_zoo, lenient_grader, monkeypatch):
    seen: list[int] = []
    real = hacrl.algo.policy_loss

    def spy(logp, batch, cfg, update_index, denominators=None):
        seen.append(update_index)
        return real(logp, batch, cfg, update_index, denominators=denominators)

    monkeypatch.setattr(hacrl.engines.base, "policy_loss", spy)  # what MiniBatchLoss calls
    loop, engines, _ = make_loop(micro_zoo, [QWEN, LLAMA], "hacpo", lenient_grader)
    result = loop.step(1)
    updates = 2 * P // MB
    assert seen == list(range(updates)) * 2  # agent 0's updates, then agent 1's
    for metrics, engine in zip(result.agent_metrics, engines, strict=True):
        assert [m["clip/lower_bound"] for _, _, m in engine.train_calls] == pytest.approx(
            [0.8, 0.825, 0.85, 0.875])
        assert metrics["clip/lower_bound"] == pytest.approx(0.8375)


@pytest.mark.parametrize("method", ["hacpo", "naive"])
def test_all_log_probs_before_any_update(micro_zoo, lenient_grader, method):
    loop, _, log = make_loop(micro_zoo, [QWEN, LLAMA], method, lenient_grader, kl=1e-3)
    loop.step(1)
    kinds = [entry[0] for entry in log]
    first_train = kinds.index("train")
    assert "log_probs" in kinds[:first_train]
    assert "log_probs" not in kinds[first_train:]
    assert "generate" not in kinds[first_train:]
    assert kinds.count("generate") == 2


@pytest.mark.parametrize("old_logprobs", ["sampler", "recompute"])
def test_naive_scores_borrowed_rows_with_the_target_hacpo_does_not(micro_zoo, lenient_grader,
                                                                   old_logprobs):
    own_calls = 1 if old_logprobs == "recompute" else 0  # the sampler scored the own rows
    for method in ("naive", "hacpo"):
        seed_everything(0)
        loop, engines, _ = make_loop(micro_zoo, [QWEN, LLAMA], method, lenient_grader,
                                     old_logprobs=old_logprobs)
        loop.step(1)
        for engine in engines:
            # multisets, not sets: two agents may sample the same tokens for a prompt
            own = sorted(engine.generated)
            calls = [sorted(v.response_ids for v in views)
                     for views, ref in engine.logprob_calls if not ref]
            borrowed_rows = sorted(v.response_ids for views, batch, _ in engine.train_calls
                                   for v, o in zip(views, batch.own.tolist(), strict=True)
                                   if not o)
            assert all(len(v) == P * G for v in calls)
            assert len(borrowed_rows) == P * G
            if method == "naive":
                assert len(calls) == own_calls + 1
                assert calls[-1] == borrowed_rows  # the target scores exactly the borrowed rows
                assert calls[:own_calls] == [own] * own_calls
                # their old log-probs are the target's own, not zeros
                olds = [batch.old_logp[~batch.own] for _, batch, _ in engine.train_calls]
                assert any(bool((o != 0).any()) for o in olds)
            else:
                assert calls == [own] * own_calls  # only its own rows, when recomputing


def test_sample_order_own_first(micro_zoo, lenient_grader):
    loop, engines, _ = make_loop(micro_zoo, [QWEN, LLAMA], "hacpo", lenient_grader,
                                 sample_order="own_first")
    loop.step(1)
    for engine in engines:
        owns = [batch.own.tolist() for _, batch, _ in engine.train_calls]
        assert owns == [[True] * MB * G] * 2 + [[False] * MB * G] * 2
    mixed, engines, _ = make_loop(micro_zoo, [QWEN, LLAMA], "hacpo", lenient_grader)
    mixed.step(1)
    assert any(0 < sum(batch.own.tolist()) < MB * G
               for e in engines for _, batch, _ in e.train_calls)


def test_step_is_deterministic_given_the_seed(micro_zoo, lenient_grader):
    def run(seed: int) -> list[dict[str, float]]:
        seed_everything(seed)
        loop, _, _ = make_loop(micro_zoo, [QWEN, LLAMA], "hacpo", lenient_grader, seed=seed)
        out = [loop.step(1).agent_metrics, loop.step(2).agent_metrics]
        return [{k: v for k, v in m.items() if not k.startswith(("time/", "memory/"))}
                for step in out for m in step]

    first, again, other = run(0), run(0), run(1)
    assert first == again
    assert first != other


def test_combine_updates_keeps_extremes_and_weights_sums():
    from hacrl.training.loop import combine_updates

    per_update = [
        {"loss/policy": 1.0, "ratio/s_hete_sum": 3.0, "ratio/s_hete_count": 2.0,
         "ratio/s_hete_min": 0.9, "ratio/s_hete_max": 1.4},
        {"loss/policy": 3.0, "ratio/s_hete_sum": 1.0, "ratio/s_hete_count": 2.0,
         "ratio/s_hete_min": 0.7, "ratio/s_hete_max": 1.1},
        {"loss/policy": 2.0},  # an update without borrowed rows reports no ratio statistics
    ]
    out = combine_updates(per_update)
    assert out == {"loss/policy": 2.0, "ratio/s_hete_mean": 1.0, "ratio/s_hete_min": 0.7,
                   "ratio/s_hete_max": 1.4}
    assert combine_updates([{"ratio/s_homo_sum": 0.0, "ratio/s_homo_count": 0.0}]) == {}


# -- what a step hands on and refuses ------------------------------------------------------------

def test_prompt_messages_are_one_user_turn_of_the_template():
    problem = Problem("arith-7", "What is 12+30?", "42", 1, "\\boxed{42}")
    assert prompt_messages(problem, "Solve: {question} Box the answer.") == [
        {"role": "user", "content": "Solve: What is 12+30? Box the answer."}]


def test_borrowed_rows_carry_their_prompt_and_source(micro_zoo, lenient_grader, monkeypatch):
    """The trajectories a step re-encodes for a partner carry the prompt they answer (uid, the
    chat messages) and the agent that sampled them; with rollout.overflow=error the error names
    that agent and prompt."""
    template = "Q: {question}"
    seed_everything(0)
    loop, engines, _ = make_loop(micro_zoo, [QWEN, LLAMA], "hacpo", lenient_grader, prompts=2,
                                 group=2, max_new_tokens=4, overflow="error",
                                 prompt_template=template)
    problems = loop.schedule.batch(1)
    seen: list[tuple[int, Trajectory, Problem]] = []
    real = hacrl.training.loop.retokenize

    def spy(traj, tokenizer, prompt_ids, max_tokens, overflow):
        target = next(k for k, e in enumerate(engines) if e.tokenizer is tokenizer)
        # the prompt this row answers, found from the target's rendering of it
        problem = next(p for p in problems if render_prompt_ids(
            tokenizer, prompt_messages(p, template)) == list(prompt_ids))
        seen.append((target, traj, problem))
        return real(traj, tokenizer, prompt_ids, max_tokens, overflow)

    monkeypatch.setattr(hacrl.training.loop, "retokenize", spy)
    with pytest.raises(RetokenizationOverflow) as err:
        loop.step(1)
    for target, traj, problem in seen:
        assert traj.source == 1 - target
        # the source's log-probs of its own tokens (the rollout policy's), recorded before any
        # update
        assert traj.source_logprobs is not None
        assert len(traj.source_logprobs) == len(traj.source_tokens)
        assert all(lp <= 0 for lp in traj.source_logprobs)
        assert traj.prompt_uid == problem.uid
        assert traj.prompt_messages == [{"role": "user", "content": f"Q: {problem.question}"}]
    target, _, problem = seen[-1]  # the row that overflowed
    m = re.search(r"agent (\S+) for prompt (\S+) is", str(err.value))
    assert m is not None, err.value
    assert m.groups() == (str(1 - target), problem.uid)


@pytest.mark.parametrize("off_by", [-1, 1])
def test_a_grader_returning_the_wrong_number_of_rewards_fails(micro_zoo, lenient_grader, off_by):
    """Rewards are matched to responses by position: one too few or too many is an error, not
    a silently shifted or default reward."""

    def grade(responses, answers):
        rewards = lenient_grader(responses, answers)
        return rewards[:-1] if off_by < 0 else [*rewards, 1.0]

    loop, _, _ = make_loop(micro_zoo, [QWEN], "gspo", grade, prompts=2, group=2,
                           max_new_tokens=4)
    with pytest.raises(ValueError, match="zip"):
        loop.step(1)


def test_step_with_the_loss_computed_elsewhere(micro_zoo, lenient_grader):
    """An engine whose workers compute the loss (verl) hands the loop no sequence ratios: the
    step reports none of its own rather than failing or inventing them."""
    seed_everything(0)
    loop, engines, _ = make_loop(micro_zoo, [QWEN, LLAMA], "hacpo", lenient_grader, prompts=2,
                                 group=2, max_new_tokens=8, engine=RemoteLoss)
    result = loop.step(1)
    for metrics, engine in zip(result.agent_metrics, engines, strict=True):
        _finite(metrics)
        assert metrics["train/updates"] == len(engine.train_calls) == 2
        assert not {f"ratio/s_{kind}_{stat}" for kind in ("homo", "hete")
                    for stat in ("min", "max")} & set(metrics)


# -- the prompt schedule --------------------------------------------------------------------------

def test_prompt_schedule_order_is_fixed_by_the_seed():
    """Step t's prompts are a function of (seed, t) alone, the same in every run and version:
    resumed runs and methods compared on one seed train on the same prompts. Five problems,
    three a step: each epoch (five positions) is a permutation of its own."""
    problems = [Problem(f"p{i}", f"{i}+1", str(i + 1), 1, "") for i in range(5)]
    schedule = PromptSchedule(problems, 3, seed=1)
    steps = [[p.uid for p in schedule.batch(t)] for t in range(1, 6)]
    assert steps == [["p1", "p4", "p0"], ["p3", "p2", "p2"], ["p0", "p3", "p4"],
                     ["p1", "p0", "p2"], ["p1", "p3", "p4"]]
    flat = [uid for step in steps for uid in step]
    for epoch in range(3):
        assert sorted(flat[5 * epoch:5 * epoch + 5]) == [f"p{i}" for i in range(5)]
    fresh = PromptSchedule(problems, 3, seed=1)  # no state: a resumed run asks for step 4 first
    assert [p.uid for p in fresh.batch(4)] == steps[3]
    other = PromptSchedule(problems, 3, seed=2)
    assert [[p.uid for p in other.batch(t)] for t in range(1, 6)] != steps


def test_prompt_schedule_refuses_an_empty_split():
    with pytest.raises(ValueError, match="^the training split is empty$"):
        PromptSchedule([], 3, seed=0)


# -- random state: seeding, and carrying it over a resume ----------------------------------------

def _draws() -> tuple[float, float, float]:
    """One draw from each stream the jobs use: Python's, numpy's and torch's."""
    return random.random(), float(np.random.rand()), float(torch.rand(()))


@pytest.mark.parametrize("seed", [3, 2**32 + 3])  # config seeds are any integer >= 0
def test_seed_everything_seeds_every_stream(seed):
    seed_everything(seed)
    first = [_draws() for _ in range(2)]
    seed_everything(seed)
    assert [_draws() for _ in range(2)] == first
    seed_everything(seed + 2)
    other = _draws()
    assert all(a != b for a, b in zip(first[0], other, strict=True)), (first[0], other)


def test_restored_rng_state_continues_the_stream():
    seed_everything(11)
    _draws()
    saved = rng_state()
    straight = [_draws() for _ in range(3)]
    seed_everything(12)  # a new process after a crash draws from its own seed first
    _draws()
    set_rng_state(saved)
    assert [_draws() for _ in range(3)] == straight


class FakeCuda:
    """torch.cuda's generator states as on a machine with two GPUs (or none)."""

    def __init__(self, available: bool) -> None:
        self.available = available
        self.states = [torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([3, 4], dtype=torch.uint8)]
        self.restored: list[list[torch.Tensor]] = []

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [s.clone() for s in self.states]

    def set_rng_state_all(self, states) -> None:
        self.states = [s.clone() for s in states]
        self.restored.append(self.states)

    def patch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: self.available)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", self.get_rng_state_all)
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", self.set_rng_state_all)


def test_rng_state_carries_the_gpu_generators(monkeypatch):
    cuda = FakeCuda(available=True)
    cuda.patch(monkeypatch)
    before = cuda.get_rng_state_all()
    saved = rng_state()
    cuda.states = [torch.tensor([9, 9], dtype=torch.uint8)] * 2  # the GPUs drew on
    set_rng_state(saved)
    assert [s.tolist() for s in cuda.states] == [s.tolist() for s in before]


def test_rng_state_moves_between_cpu_and_gpu_machines(monkeypatch):
    """A checkpoint written without GPUs resumes on a GPU machine (the GPUs keep their seeded
    state) and one written with GPUs resumes on a CPU machine: the CPU streams are restored
    either way and nothing is set that was not saved."""
    seed_everything(5)
    cpu_saved = rng_state()
    expected = _draws()
    gpu = FakeCuda(available=True)
    gpu.patch(monkeypatch)
    set_rng_state(cpu_saved)
    assert gpu.restored == [] and _draws() == expected

    gpu_saved = rng_state()
    assert "cuda" in gpu_saved
    cpu = FakeCuda(available=False)
    cpu.patch(monkeypatch)
    after = _draws()
    set_rng_state(gpu_saved)
    assert cpu.restored == [] and _draws() == after


def test_team_size_must_fit_the_method(micro_zoo, lenient_grader):
    with pytest.raises(ValueError, match="^method hacpo shares rollouts and needs >= 2 agents$"):
        make_loop(micro_zoo, [QWEN], "hacpo", lenient_grader)
    with pytest.raises(ValueError, match="^method gspo trains one agent per team, got 2$"):
        make_loop(micro_zoo, [QWEN, LLAMA], "gspo", lenient_grader)


def test_unknown_sample_order_is_named(micro_zoo, lenient_grader):
    loop, _, _ = make_loop(micro_zoo, [QWEN], "gspo", lenient_grader, prompts=1, group=2,
                           max_new_tokens=2, sample_order="shuffled")
    with pytest.raises(ValueError, match=r"^algo\.sample_order must be 'mixed' or 'own_first', "
                                         r"got 'shuffled'$"):
        loop.step(1)


def test_mixed_row_order_is_fixed_by_seed_step_and_agent(micro_zoo, lenient_grader):
    """sample_order=mixed: the rows of target k at step t are shuffled by (seed, t, k) alone, the
    same in every run and version (a resumed step trains in the uninterrupted run's order)."""
    loop, _, _ = make_loop(micro_zoo, [QWEN, LLAMA], "hacpo", lenient_grader, seed=3)
    batch = SimpleNamespace(own=torch.tensor([True] * 4 + [False] * 4))
    orders = {(step, k): loop._order(k, step, batch).tolist() for step, k in [(2, 1), (2, 0), (3, 1)]}
    assert orders == {(2, 1): [3, 5, 7, 2, 1, 6, 0, 4], (2, 0): [7, 1, 0, 3, 6, 5, 2, 4],
                      (3, 1): [5, 2, 0, 4, 7, 6, 1, 3]}


def test_capability_never_below_the_floor(micro_zoo):
    loop, _, _ = make_loop(micro_zoo, [QWEN], "gspo", lambda r, a: [0.0] * len(r), prompts=2,
                           group=2, max_new_tokens=2, capability_floor=0.3)
    metrics = loop.step(1).agent_metrics[0]
    assert metrics["reward/mean"] == 0.0
    assert metrics["capability/P"] == pytest.approx(0.3)


class ShortLogProbs(Recorder):
    """An engine whose log_probs drops the last row (a broken engine)."""

    def log_probs(self, views, reference=False):
        return super().log_probs(views, reference)[:-1]


def test_an_engine_returning_too_few_log_probs_fails(micro_zoo, lenient_grader):
    """The log-probs are matched to the responses by position: one missing is an error where
    it happens, not a row without old log-probs or a shifted one."""
    loop, _, _ = make_loop(micro_zoo, [QWEN], "gspo", lenient_grader, prompts=2, group=2,
                           max_new_tokens=4, old_logprobs="recompute", engine=ShortLogProbs)
    with pytest.raises(ValueError, match="zip"):
        loop.step(1)


def test_one_token_responses(micro_zoo, lenient_grader):
    """At a budget of one token every response is one token long: the retokenization metrics
    and each update's width still describe the rows (qwen's char-level tokens cut every llama
    token longer than one character)."""
    seed_everything(0)
    loop, engines, _ = make_loop(micro_zoo, [QWEN, LLAMA], "hacpo", lenient_grader,
                                 max_new_tokens=1, sample_order="own_first")
    result = loop.step(1)
    for k, engine in enumerate(engines):
        borrowed = [v for views, _, _ in engine.train_calls for v in views][P * G:]
        _check_retok_metrics(result.agent_metrics[k], borrowed, engines[1 - k].generated)
        _check_update_widths(engine)
    assert result.agent_metrics[0]["retok/truncated_frac"] > 0


class SpecialTokens(Recorder):
    """Its first response of a step is one special token (not EOS) cut at the length limit:
    text that re-encodes to no tokens at all in a partner's tokenizer."""

    def generate(self, prompt_ids, n, sampling):
        out = super().generate(prompt_ids, n, sampling)
        special = next(i for i in self.tokenizer.all_special_ids if i != eos_id(self.tokenizer))
        out[0][0] = Generation([special], False, [-0.5])
        return out


@pytest.mark.parametrize("method", ["naive", "hacpo"])
def test_borrowed_response_with_no_tokens(micro_zoo, lenient_grader, method):
    seed_everything(0)
    loop, engines, _ = make_loop(micro_zoo, [QWEN, LLAMA], method, lenient_grader,
                                 max_new_tokens=4, engine=SpecialTokens)
    result = loop.step(1)
    empty = 0
    for metrics, engine in zip(result.agent_metrics, engines, strict=True):
        _finite(metrics)
        for views, batch, _ in engine.train_calls:
            assert bool(torch.isfinite(batch.source_mean_logp).all())
            for b, view in enumerate(views):
                if not view.response_ids:
                    empty += 1
                    assert not batch.response_mask[b].any()
    assert empty == 2  # one borrowed row of each target


class SilentQwen(Recorder):
    """qwen answers nothing (EOS at once, a collapsed policy); its partners answer as usual."""

    def generate(self, prompt_ids, n, sampling):
        out = super().generate(prompt_ids, n, sampling)
        if self.name != QWEN:
            return out
        return [[Generation([eos_id(self.tokenizer)], True) for _ in group] for group in out]


def test_update_width_follows_its_own_rows(micro_zoo, lenient_grader):
    """qwen's own rows (one token each) fill its first updates (own_first), llama's re-encoded
    answers its last ones: each update is as wide as its own rows, whatever the step's longest."""
    seed_everything(0)
    loop, engines, _ = make_loop(micro_zoo, [QWEN, LLAMA], "hacpo", lenient_grader,
                                 sample_order="own_first", engine=SilentQwen)
    loop.step(1)
    widths = [batch.response_mask.shape[1] for _, batch, _ in engines[0].train_calls]
    assert widths[:2] == [1, 1] and min(widths[2:]) > 1
    for engine in engines:
        _check_update_widths(engine)


@pytest.mark.parametrize("zero_uniform_groups, counted", [(False, 1), (True, 0)])
def test_a_prompt_with_equal_rewards_and_unequal_capabilities_is_counted_per_agent(
        micro_zoo, zero_uniform_groups: bool, counted: int) -> None:
    """The loop reports each target's degenerate prompts (algo.degenerate_prompts) as step
    metrics: agent 0 solves only prompt 0, agent 1 everything, so prompt 0's 2G rewards are
    all 1 while P = (1/P, 1): the bare formula gives it a huge advantage; zeroing gives none."""
    calls: list[int] = []

    def grade(responses: list[str], answers: list[str]) -> list[float]:
        calls.append(1)
        first_agent = len(calls) % 2 == 1
        return [float(not first_agent or i < G) for i in range(len(responses))]

    seed_everything(0)
    loop, _, _ = make_loop(micro_zoo, [QWEN, LLAMA], "hacpo", grade,
                           zero_uniform_groups=zero_uniform_groups)
    result = loop.step(1)
    for metrics in result.agent_metrics:
        assert metrics["adv/degenerate_prompts"] == counted
        assert (metrics["adv/degenerate_max_abs"] > 1e4) == bool(counted)
