"""Zoo build speed-ups that must not change a model: shared SFT runs and the run order."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from hacrl.data.arith import load_split
from hacrl.zoo import ZOO, SFTConfig, ZooSpec, build_model, build_tokenizer, build_zoo, make_config
from hacrl.zoo import build as build_mod
from hacrl.zoo import sft as sft_mod
from hacrl.zoo.schedule import expected_steps, finish_time, group_runs, run_cost, schedule
from hacrl.zoo.specs import shares_sft


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_stages_stop_where_separate_runs_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    tok = build_tokenizer("qwen")
    spec = ZooSpec("t", "", "qwen", 32, 1, 2, 1, 64, 0.0)
    train, probe = load_split("train")[:200], load_split("train")[200:208]
    # target 0 stops at the first probe (step 4), target 1 is never reached (step 10)
    cfg = SFTConfig(lr=1e-2, batch_size=8, warmup_steps=2, max_steps=10, eval_every=2, seed=3)
    probes = []
    real_probe = sft_mod.probe_accuracy

    def counting_probe(*args: Any, **kwargs: Any) -> float:
        probes.append(1)
        return real_probe(*args, **kwargs)

    monkeypatch.setattr(sft_mod, "probe_accuracy", counting_probe)

    def fresh() -> PreTrainedModel:
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(make_config(spec, tok))

    alone = []
    for target in (0.0, 1.0):
        model = fresh()
        run_cfg = dataclasses.replace(cfg, target_accuracy=target)
        result = sft_mod.sft_train(model, tok, train, run_cfg, probe)
        alone.append((result, {k: v.clone() for k, v in model.state_dict().items()}))
    assert len(probes) == 3  # step 4; steps 4 and 8
    probes.clear()

    seen: dict[int, tuple[sft_mod.SFTResult, dict[str, torch.Tensor]]] = {}
    model = fresh()

    def on_stop(i: int, result: sft_mod.SFTResult) -> None:
        assert not model.training
        seen[i] = (result, {k: v.clone() for k, v in model.state_dict().items()})

    results = sft_mod.sft_train_stages(model, tok, train, cfg, probe, [0.0, 1.0], on_stop)
    assert len(probes) == 2  # the step-4 probe serves both targets
    assert [r.steps for r in results] == [4, 10]
    for i, (result, weights) in enumerate(alone):
        got, got_weights = seen[i]
        assert got is results[i]
        for field in ("steps", "history", "final_loss", "probe_accuracy", "reached_target"):
            assert getattr(got, field) == getattr(result, field), field
        assert all(torch.equal(weights[k], got_weights[k]) for k in weights)
    with pytest.raises(ValueError, match="target"):
        sft_mod.sft_train_stages(fresh(), tok, train, cfg, probe, [])


@pytest.fixture
def fast_pair(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """Two zoo entries sharing an init that stop at different steps, trained in seconds."""
    names = ("qwen3-4b", "qwen3-4b-instruct")
    for name, target in zip(names, (0.0, 1.0), strict=True):
        fast = dataclasses.replace(
            ZOO[name], hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
            intermediate_size=32, target_accuracy=target, max_steps=8, eval_every=2,
            warmup_steps=1,
        )
        monkeypatch.setitem(ZOO, name, fast)
    monkeypatch.setattr(build_mod, "load_split", lambda split: load_split(split)[:64])
    monkeypatch.setattr(build_mod, "load_probe", lambda: load_split("train")[:8])
    return names


def test_shared_run_builds_the_models_separate_builds_give(
    fast_pair: tuple[str, str], tmp_path: Path
) -> None:
    assert group_runs(list(fast_pair)) == [list(fast_pair)]
    cards = build_zoo(root=tmp_path / "shared", names=list(fast_pair), workers=1)
    assert [cards[n]["sft_steps"] for n in fast_pair] == [4, 8]
    for name in fast_pair:
        card = build_model(ZOO[name], tmp_path / "alone" / name)
        assert card["sft_steps"] == cards[name]["sft_steps"]
        assert card["probe_history"] == cards[name]["probe_history"]
        for file in ("model.safetensors", "config.json", "generation_config.json"):
            alone = (tmp_path / "alone" / name / file).read_bytes()
            assert (tmp_path / "shared" / name / file).read_bytes() == alone, (name, file)


def test_only_trajectory_twins_share_a_run() -> None:
    assert shares_sft(ZOO["qwen3-4b"], ZOO["qwen3-4b-instruct"])
    assert not shares_sft(ZOO["qwen3-4b"], ZOO["qwen3-4b-base"])  # same shape, own init
    other_lr = dataclasses.replace(ZOO["qwen3-4b-instruct"], lr=1e-3)
    assert not shares_sft(ZOO["qwen3-4b"], other_lr)
    runs = group_runs(list(ZOO))
    pair = ["qwen3-4b", "qwen3-4b-instruct"]
    assert sorted(map(sorted, runs)) == sorted([pair] + [[n] for n in ZOO if n not in pair])
    with pytest.raises(ValueError, match="share"):
        build_mod.build_models([ZOO["qwen3-4b"], ZOO["qwen3-4b-base"]], ["a", "b"])


def test_schedule_beats_longest_first_when_it_idles() -> None:
    runs = [["a"], ["b"], ["c"], ["d"], ["e"]]
    cost = {0: 3.0, 1: 3.0, 2: 2.0, 3: 2.0, 4: 2.0}
    assert finish_time([3, 3, 2, 2, 2], 2) == 7  # longest first: a worker idles for 2
    order = schedule(runs, 2, cost)
    assert sorted(order) == runs
    assert finish_time([cost[runs.index(r)] for r in order], 2) == 6
    # nothing to gain: longest first is kept
    assert schedule([["x"], ["y"], ["z"]], 2, {0: 1.0, 1: 5.0, 2: 2.0}) == [["y"], ["z"], ["x"]]


def test_zoo_schedule_keeps_both_workers_busy() -> None:
    runs = schedule(group_runs(list(ZOO)), 2)
    costs = [run_cost(r) for r in runs]
    # the workers finish within 5 % of an even split of the work
    assert finish_time(costs, 2) <= 1.05 * sum(costs) / 2
    assert finish_time(costs, 2) <= finish_time(sorted(costs, reverse=True), 2)


def test_progress_line_shows_the_expected_steps_only_while_short_of_them() -> None:
    specs = [ZOO["qwen3-4b"], ZOO["qwen3-4b-instruct"]]
    expected = expected_steps("qwen3-4b-instruct")  # the run's last stop, not its first
    assert expected is not None and expected > (expected_steps("qwen3-4b") or 0)
    early = build_mod._progress_line(specs, 100, 0.031, 12.4)
    assert early == (f"[zoo] qwen3-4b+qwen3-4b-instruct: SFT step 100 of ~{expected}, "
                     "probe accuracy 0.03 (target 0.55), 12 s")
    # a machine whose build runs past the recorded steps: no "of ~N" smaller than the step
    late = build_mod._progress_line(specs, expected + 50, 0.2, 99.0)
    assert f"SFT step {expected + 50}, probe" in late and " of ~" not in late
