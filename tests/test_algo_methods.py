"""Method registry: every method of PAPER.md exists with the switches the paper describes."""

import dataclasses

import pytest

import hacrl.algo.methods as methods_mod
from hacrl.algo.methods import METHODS, MethodSpec, get_method, register_method

PAPER_METHODS = ["grpo", "gspo", "gspo_x2", "gspo_updates_x2", "naive", "hacpo", "hacpo_no_adv",
                 "hacpo_no_omega", "hacpo_no_stepwise", "hacpo_no_clip"]

HACPO_SWITCHES = {"shares_rollouts": True, "ratio": "sequence", "advantage": "capability",
                  "borrowed": "cross", "omega_modulation": True, "stepwise": True,
                  "cross_clip": True, "rollout_multiplier": 1, "minibatch_divisor": 1,
                  "clip_low": 3e-4, "clip_high": 4e-4}


def _switches(spec):
    return {k: v for k, v in dataclasses.asdict(spec).items() if k not in ("name", "description")}


def test_all_paper_methods_registered():
    for name in PAPER_METHODS:
        assert get_method(name).name == name
    assert set(PAPER_METHODS) <= set(METHODS)


def test_single_agent_baselines():
    grpo = get_method("grpo")
    assert (grpo.ratio, grpo.clip_low, grpo.clip_high) == ("token", 0.2, 0.28)
    assert grpo.loss_agg == "token-mean"
    gspo = get_method("gspo")
    assert (gspo.ratio, gspo.clip_low, gspo.clip_high) == ("sequence", 3e-4, 4e-4)
    for name in ("grpo", "gspo", "gspo_x2", "gspo_updates_x2"):
        spec = get_method(name)
        assert not spec.shares_rollouts and spec.borrowed == "none" and spec.advantage == "group"
        assert not (spec.omega_modulation or spec.stepwise or spec.cross_clip)


def _rollouts_and_updates(spec, prompts=128, minibatch_prompts=64, n=8):
    g = n * spec.rollout_multiplier
    responses = prompts * g
    return g, responses // ((minibatch_prompts // spec.minibatch_divisor) * g)


def test_x2_variants_size_rollouts_and_updates_as_the_paper():
    assert _rollouts_and_updates(get_method("gspo")) == (8, 2)
    # gspo_x2: n = 16 rollouts, mini-batch 32 prompts -> double rollouts and double updates.
    assert _rollouts_and_updates(get_method("gspo_x2")) == (16, 4)
    assert get_method("gspo_x2").minibatch_divisor == 2
    # gspo_updates_x2: n = 8, mini-batch 32 -> same rollouts, double updates.
    assert _rollouts_and_updates(get_method("gspo_updates_x2")) == (8, 4)
    for name in ("gspo_x2", "gspo_updates_x2"):
        assert (get_method(name).ratio, get_method(name).clip_low) == ("sequence", 3e-4)


def test_naive_is_pooled_advantage_with_borrowed_samples_as_own():
    naive = get_method("naive")
    assert naive.shares_rollouts and naive.advantage == "pooled" and naive.borrowed == "as_own"
    assert not (naive.omega_modulation or naive.stepwise or naive.cross_clip)
    assert (naive.ratio, naive.clip_low, naive.clip_high) == ("sequence", 3e-4, 4e-4)


@pytest.mark.parametrize("name,changes", [
    ("hacpo", {}),
    ("hacpo_no_adv", {"advantage": "pooled"}),
    ("hacpo_no_omega", {"omega_modulation": False}),   # baseline keeps capability
    ("hacpo_no_stepwise", {"stepwise": False}),         # fixed lower bound, still clipped
    ("hacpo_no_clip", {"stepwise": False, "cross_clip": False}),
])
def test_hacpo_and_ablations_differ_only_in_their_switch(name, changes):
    expected = {**HACPO_SWITCHES, **changes}
    got = _switches(get_method(name))
    for key, value in expected.items():
        assert got[key] == value, (name, key)


def test_unknown_method_raises_keyerror_naming_registered():
    with pytest.raises(KeyError) as info:
        get_method("hacpo_typo")
    msg = str(info.value)
    assert "hacpo_typo" in msg
    for name in PAPER_METHODS:
        assert name in msg


def test_register_new_method_is_one_call_and_duplicates_fail(monkeypatch):
    monkeypatch.setattr(methods_mod, "METHODS", dict(METHODS))
    spec = register_method(MethodSpec("hacpo_alpha0_demo", "demo", shares_rollouts=True,
                                      advantage="capability", borrowed="cross"))
    assert methods_mod.get_method("hacpo_alpha0_demo") is spec
    with pytest.raises(ValueError):
        register_method(MethodSpec("hacpo_alpha0_demo", "again"))
    with pytest.raises(ValueError):
        register_method(MethodSpec("hacpo", "shadowing an existing method"))
    assert methods_mod.get_method("hacpo").description != "shadowing an existing method"


def test_specs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_method("hacpo").alpha = 2.0  # type: ignore[attr-defined]
