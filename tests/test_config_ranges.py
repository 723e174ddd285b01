"""Every leaf of the config has a range, and every value outside it is refused before anything
is written: one line per refusal naming the key, the value and the range (exit 2). The walk sets
each leaf of the default compositions (tiny and paper scale, both engines) to each way out of
its range (`Range.outside`: below, above, the open bound itself, nan, inf, a fraction for an
integer, null, a wrong choice, a list of the wrong length or with an item out of range)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hacrl.config import CONFIG_DIR, ConfigError, compose, model_path, validate
from hacrl.config.leaves import leaves
from hacrl.config.ranges import RANGES, count, items, one_of, range_of, real, refusals, text

# (the price table is an empty mapping by default: one reference prices a GPU, so that its
# entries' range is walked too)
REFERENCES = [[], ["scale=paper"], ["engine=verl"], ["+cost.gpu_hour_usd={H100: 2.5}"]]


def _leaves(overrides: list[str]) -> dict[str, object]:
    return dict(leaves(OmegaConf.to_container(compose(overrides), resolve=True)))


def _ranged_keys() -> dict[str, list[str]]:
    """Every leaf key with a range -> the overrides of the first reference that has it."""
    out: dict[str, list[str]] = {}
    for overrides in REFERENCES:
        for key in _leaves(overrides):
            if range_of(key) is not None:
                out.setdefault(key, overrides)
    return out


def _options() -> list[str]:
    """One override per option of every config group a job composes."""
    groups = ("pair", "method", "profile", "engine", "task", "scale", "tracking")
    return [f"{g}={f.stem}" for g in groups for f in sorted((CONFIG_DIR / g).glob("*.yaml"))]


@pytest.mark.parametrize("option", _options())
def test_every_leaf_of_every_option_has_a_range_its_default_is_in(option: str) -> None:
    cfg = compose([option, *(["engine=verl"] if option.startswith("scale") else [])])
    plain = dict(leaves(OmegaConf.to_container(cfg, resolve=True)))
    # bools are checked fully by their type; engine.overrides is verl's own mapping
    unranged = [k for k, v in plain.items() if range_of(k) is None
                and not isinstance(v, bool) and not (isinstance(v, dict) and not v)]
    assert unranged == []
    assert list(refusals(cfg)) == []


def test_every_range_entry_matches_a_leaf() -> None:
    keys = {k for overrides in REFERENCES for k in _leaves(overrides)}
    unused = [p for p in RANGES if not any(range_of(k) is RANGES[p] and
                                           (p == k or "*" in p) for k in keys)]
    assert unused == []


def test_every_leaf_refuses_every_value_outside_its_range(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HACRL_OUTPUTS", str(tmp_path / "outputs"))
    composed = {tuple(o): compose(o) for o in REFERENCES}
    accepted, tried, keys = [], 0, 0
    for key, overrides in sorted(_ranged_keys().items()):
        keys += 1
        for value in range_of(key).outside():  # type: ignore[union-attr]
            cfg = composed[tuple(overrides)].copy()
            OmegaConf.update(cfg, key, value, force_add=True)
            tried += 1
            try:
                validate(cfg)
            except ConfigError as err:
                lines = str(err).splitlines()
                if any(line.startswith(f"{key}=") and ": must be " in line for line in lines):
                    continue
                accepted.append(f"{key}={value!r}: {lines}")
                continue
            accepted.append(f"{key}={value!r}: accepted")
    print(f"{keys} leaves, {tried} values outside their ranges, {tried - len(accepted)} refused")
    assert not accepted, "\n".join(accepted)
    assert keys >= 250 and tried >= 2 * keys  # ~250 leaves (~130 of them the catalogs), ~680 values
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize(("key", "inside", "outside"), [
    ("train.lr", [1e-6, 1.0], [0.0, -1e-6, 1.0001, math.nan, -math.inf]),
    ("train.grad_clip", [1e-9, 1.0], [0.0, -1.0]),
    ("rollout.temperature", [1e-3, 1.0, 100.0], [0.0, -0.5]),
    ("rollout.top_p", [1e-3, 1.0], [0.0, 1.0001]),
    ("eval.protocols.main.temperature", [0.0, 0.6], [-1e-3]),
    ("algo.cross_clip_lower", [1.0, 0.5], [0.0]),
    ("algo.capability_floor", [1e-8, 0.5], [0.0, 1.0]),
    ("train.betas", [[0.0, 0.999], [0.9, 0.0]], [[0.9, 1.0], [-0.1, 0.9], [0.9], [0.9, 0.99, 0.9]]),
    ("algo.omega_clamp", [[0.1, 10.0], [2.0, 2.0], None], [[10.0, 0.1], [0.0, 1.0], [1.0]]),
    ("seed", [0, 2**32 - 1], [-1, 2**32, 1.5, True]),
    ("engine.forward_rows", ["auto", 1, 64], [0, "all", 1.5, -1]),
    ("engine.actor.fsdp_size", [-1, 1, 8], [0, -2]),
    ("engine.device", ["auto", "cpu", "cuda", "cuda:1"], ["gpu", "cuda:x", ""]),
    ("train.micro_batch_rows", [None, 0, 4], [-1]),
    ("eval.only", [None, ["math500"]], [[]]),
    ("task.prompt_template", ["{question}", "Q: {question}\nA:"], ["{problem}", "{question} {}",
                                                                  "no field"]),
    ("data.sources.math500.sha256", [None, "a" * 64], ["A" * 64, "a" * 63]),
])
def test_bounds_are_open_or_closed_as_the_key_means(key, inside, outside) -> None:
    found = range_of(key)
    assert found is not None
    assert [v for v in inside if found.refuses(v)] == []
    assert [v for v in outside if not found.refuses(v)] == []


def test_the_range_in_words() -> None:
    assert real(0.0, 1.0, open_low=True).describe() == "a finite number in (0, 1]"
    assert real(0.0, 1.0, open_high=True).describe() == "a finite number in [0, 1)"
    assert real(0.5).describe() == "a finite number in [0.5, inf)"
    assert count(1, 8, null=True).describe() == "an integer in [1, 8], or null"
    assert count(1, 8, extra=("auto",)).describe() == "auto or an integer in [1, 8]"
    assert one_of("a", "b").describe() == "one of: a, b"
    assert items(count(0, 1), 2, 2, ordered=True).describe() == \
        "a list of 2, each an integer in [0, 1], low <= high"
    assert items(text(), 1).describe() == "a non-empty list, each a non-empty text"
    assert items(text()).describe() == "a list, each a non-empty text"
    assert items(text(), 1, 3).describe() == "a list of 1 to 3, each a non-empty text"


def test_all_refusals_one_line_each_naming_the_key_written(tmp_path) -> None:
    cfg = compose(["train.grad_clip=-1", "rollout.top_p=1.5", "pair.alpha=-2", "train.lr=nan"])
    lines = list(refusals(cfg))
    assert lines == [
        "pair.alpha=-2 (read as algo.alpha): must be a finite number in [0, 100]",
        "train.lr=nan: must be a finite number in (0, 1]",
        "train.grad_clip=-1: must be a finite number in (0, 1000000]",
        "rollout.top_p=1.5: must be a finite number in (0, 1]"]


def test_a_sweep_cell_out_of_range_names_the_sweep_and_the_cell() -> None:
    from hacrl.sweep.grid import _check_ranges

    with pytest.raises(ConfigError) as caught:
        _check_ranges("alpha", ["pair=size", "pair.alpha=-1"], compose(["pair.alpha=-1"]))
    assert str(caught.value) == ("sweeps/alpha.yaml, cell pair=size pair.alpha=-1: pair.alpha=-1 "
                                 "(read as algo.alpha): must be a finite number in [0, 100]")


def test_a_budget_longer_than_an_agents_positions_is_refused(job_env: Path) -> None:
    agent = "qwen3-1.7b-base"
    path = Path(model_path(compose([]), 0, agent))
    positions = json.loads((path / "config.json").read_text())["max_position_embeddings"]
    validate(compose([f"agents=[{agent}]", "method=gspo", f"rollout.max_new_tokens={positions - 1}",
                      "validation.every=0", "eval.at_end=false"]))
    with pytest.raises(ConfigError, match=rf"^rollout.max_new_tokens={positions}: agent {agent} "
                                          rf".* holds at most {positions} positions"):
        validate(compose([f"agents=[{agent}]", "method=gspo", f"rollout.max_new_tokens={positions}"]))
    with pytest.raises(ConfigError, match=rf"^eval.protocols.main.max_new_tokens={positions}: "):
        validate(compose([f"agents=[{agent}]", "method=gspo", f"scale.eval_tokens.main={positions}"]))


@pytest.mark.slow
def test_out_of_range_values_through_the_cli_are_one_line_each_and_write_nothing(
        tmp_path, hacrl_cmd, cli_env) -> None:
    for dry in ([], ["--dry-run"]):
        out = subprocess.run([*hacrl_cmd, "train", *dry, "train.grad_clip=-1", "rollout.top_p=1.5",
                              "train.lr=inf"], env=cli_env(tmp_path / "outputs"), cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, out.stderr
        assert out.stdout == "" and out.stderr.splitlines() == [
            "hacrl: config error: train.lr=inf: must be a finite number in (0, 1]",
            "hacrl: config error: train.grad_clip=-1: must be a finite number in (0, 1000000]",
            "hacrl: config error: rollout.top_p=1.5: must be a finite number in (0, 1]"]
        assert list(Path(tmp_path).iterdir()) == []


@pytest.mark.slow
def test_a_sweep_with_a_value_out_of_range_is_refused_before_anything_is_written(
        tmp_path, hacrl_cmd, cli_env, sweep_file) -> None:
    configs = tmp_path / "configs"
    sweep_file(configs / "sweep", "mini", grids="        algo.alpha: [1, -1]\n")
    root = tmp_path / "outputs"
    for extra in ([], ["train.lr=0"]):
        out = subprocess.run([*hacrl_cmd, "sweep", "mini", f"hydra.searchpath=[file://{configs}]",
                              *extra], env=cli_env(root), cwd=tmp_path, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 2, out.stdout + out.stderr
        lines = out.stderr.strip().splitlines()
        expected = ("hacrl: sweep: train.lr=0: must be a finite number in (0, 1]" if extra else
                    "hacrl: sweep: sweeps/mini.yaml, cell pair=size method=hacpo algo.alpha=-1: "
                    "algo.alpha=-1: must be a finite number in [0, 100]")
        assert lines[-1] == expected, out.stderr
        assert not root.exists() or list(root.iterdir()) == []  # no store, no sweep folder
