"""One `TeamLoop.step` on micro models: HACPO for a qwen+llama pair and a team of three, every
registered method, update counts, the update index m, call order, Naive vs HACPO old log-probs,
and the metrics a step reports."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import hacrl.algo
import hacrl.engines.base
from hacrl.algo import METHODS, LossConfig
from hacrl.arith import load_split
from hacrl.engines.base import Engine
from hacrl.engines.local import LocalEngine
from hacrl.loop import (
    Agent,
    PromptSchedule,
    TeamLoop,
    prompt_messages,
    seed_everything,
)
from hacrl.rollout import SamplingParams, eos_id, render_prompt_ids
from hacrl.settings import LoopSettings

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


def make_loop(zoo: Path, names: list[str], method: str, grade, *, prompts: int = P,
              minibatch: int = MB, group: int = G, kl: float = 0.0, max_new_tokens: int = 16,
              old_logprobs: str = "sampler", **settings):
    spec = METHODS[method]
    log: list[tuple] = []
    engines = [Recorder(n, LocalEngine(str(zoo / n), lr=1e-3, device="cpu", reference=kl > 0,
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
    from hacrl.loop import combine_updates

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
