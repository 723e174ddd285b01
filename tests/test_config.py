"""Config composition and validation: defaults give a JobSpec; invalid configs fail through the
real CLI with one line on stderr and nothing on disk; pair configs match the paper's Table 4;
the config hash tracks training settings only."""

from __future__ import annotations

import csv
import os
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hacrl.algo import METHODS
from hacrl.config import ConfigError, compose, config_hash, validate

REPO = Path(__file__).resolve().parents[1]
PAIRS = REPO / "experiments" / "pair"
PAPER_HYPERPARAMETERS = REPO / "analysis" / "reference" / "paper" / "hyperparameters.csv"


@pytest.fixture
def zoo_env(micro_zoo, monkeypatch, tmp_path):
    monkeypatch.setenv("HACRL_ZOO_DIR", str(micro_zoo))
    monkeypatch.setenv("HACRL_OUTPUTS", str(tmp_path / "outputs"))
    return micro_zoo


def test_defaults_validate_to_a_job_spec(zoo_env, tmp_path):
    spec = validate(compose())
    assert spec.method is METHODS["hacpo"]
    assert [a.name for a in spec.agents] == ["qwen3-1.7b-base", "qwen3-4b-base"]
    for agent in spec.agents:
        assert Path(agent.path) == zoo_env / agent.name
    assert spec.teams == [spec.agents]
    assert spec.output_root == (tmp_path / "outputs").resolve()
    assert spec.loss.delta == pytest.approx(0.2) and spec.loss.delta_step == pytest.approx(0.025)
    assert spec.loss.alpha == 1.0 and spec.loss.stepwise and spec.loss.cross_clip
    assert (spec.loss.clip_low, spec.loss.clip_high) == (3e-4, 4e-4)
    assert spec.loss.kl_coef == pytest.approx(1e-3)  # as_run profile
    assert spec.cfg.scale.name == "tiny"
    assert len(spec.config_hash) == 12
    assert not (tmp_path / "outputs").exists()  # validation creates nothing


def test_single_agent_method_trains_each_agent_alone(zoo_env):
    spec = validate(compose(["method=gspo", "pair=model_small"]))
    assert [[a.name for a in team] for team in spec.teams] == [["qwen3-1.7b-base"],
                                                               ["llama3.2-1b-instruct"]]
    grpo = validate(compose(["method=grpo", "agents=[qwen3-4b-base]"]))
    assert (grpo.loss.clip_low, grpo.loss.clip_high, grpo.loss.ratio) == (0.2, 0.28, "token")


def test_invalid_configs_raise_config_error_in_process(zoo_env):
    with pytest.raises(ConfigError, match="method"):
        compose(["method=foo"])
    with pytest.raises(ConfigError, match="train.minibatch_prompts"):
        validate(compose(["train.minibatch_prompts=5"]))
    with pytest.raises(ConfigError, match="train.minibatch_prompts"):
        validate(compose(["method=gspo_x2", "agents=[qwen3-4b-base]", "train.minibatch_prompts=3",
                          "train.prompts_per_step=6"]))


def _tokenizerless_zoo(micro_zoo: Path, root: Path) -> Path:
    zoo = root / "zoo-no-tokenizer"
    for name in ("qwen3-1.7b-base", "qwen3-4b-base"):
        shutil.copytree(micro_zoo / name, zoo / name)
    for f in zoo.glob("qwen3-4b-base/tokenizer*"):
        f.unlink()
    return zoo


# (id, overrides, zoo: None = micro zoo / "empty" / "no_tokenizer", text the line must contain)
INVALID = [
    ("unknown_method_group", ["method=foo"], None, "method"),
    ("unknown_method_name", ["method.name=foo"], None, "method.name=foo"),
    ("minibatch_not_dividing", ["train.minibatch_prompts=5"], None, "train.minibatch_prompts=5"),
    ("multi_agent_method_one_agent", ["method=hacpo", "agents=[qwen3-4b-base]"], None, "agents"),
    ("negative_alpha", ["algo.alpha=-1"], None, "algo.alpha"),
    ("validation_problems", ["validation.problems=abc"], None, "validation.problems=abc"),
    ("alpha_not_a_number", ["algo.alpha=abc"], None, "algo.alpha=abc: must be a number"),
    ("delta_step_not_a_number", ["algo.delta_step=abc"], None, "algo.delta_step=abc"),
    ("seed_not_an_integer", ["seed=abc"], None, "seed=abc: must be a number"),
    ("window_not_an_integer", ["algo.capability_window=2.5"], None,
     "algo.capability_window=2.5"),
    ("eval_limit", ["eval.protocols.main.limit=0"], None, "eval.protocols.main.limit=0"),
    ("eval_only_unknown", ["eval.only=[mmlu]"], None, "eval.only: mmlu is not one of"),
    ("eval_only_empty", ["eval.only=[]"], None, "eval.only=[]: must be a non-empty list"),
    ("missing_model", [], "empty", "agents[0]=qwen3-1.7b-base"),
    ("no_tokenizer", [], "no_tokenizer", "agents[1]=qwen3-4b-base"),
]


@pytest.mark.parametrize("overrides,zoo,needle", [case[1:] for case in INVALID],
                         ids=[case[0] for case in INVALID])
@pytest.mark.slow
def test_invalid_config_fails_fast_through_the_cli(hacrl_cmd, cli_env, micro_zoo, tmp_path,
                                                   import_log, overrides, zoo, needle):
    zoo_dir = micro_zoo
    if zoo == "empty":
        zoo_dir = tmp_path / "empty-zoo"
        zoo_dir.mkdir()
    elif zoo == "no_tokenizer":
        zoo_dir = _tokenizerless_zoo(micro_zoo, tmp_path)
    output_root = tmp_path / "outputs"
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    proc = subprocess.run([*hacrl_cmd, "train", *overrides],
                          env={**cli_env(output_root, zoo_dir), **import_log.env},
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    imported, stderr = import_log.split(proc.stderr)
    assert proc.returncode == 2, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("hacrl: config error: ")
    assert needle in lines[0]
    assert proc.stdout == ""
    # fast: refused before any model, tokenizer or store is opened
    assert not {"transformers", "mlflow"} & imported
    assert not output_root.exists()
    # nothing written anywhere else either (the command ran in tmp_path)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_the_tests_do_not_see_the_real_home(tmp_path):
    """tests/conftest.py gives the session a home of its own, inherited by subprocesses: the
    zoo, data and caches a job finds by default are under it, so a zoo of another draw (or
    data, a store) in the user's real ~/.cache changes no result of the tests."""
    from huggingface_hub import constants

    from hacrl.zoo import default_zoo_dir

    home, real = Path.home(), Path(pwd.getpwuid(os.getuid()).pw_dir)
    assert home != real and not home.is_relative_to(real)
    # (HACRL_TEST_* steer the tests themselves, e.g. CI's HACRL_TEST_REQUIRE_CLUSTER)
    assert not [name for name in os.environ
                if name.startswith("HACRL_") and not name.startswith("HACRL_TEST_")]
    assert "MLFLOW_TRACKING_URI" not in os.environ
    cfg = compose()
    assert default_zoo_dir() == Path(cfg.scale.model_root) == home / ".cache/hacrl/zoo/v1"
    assert Path(cfg.data.root) == home / ".cache/hacrl/data"
    for cache in (constants.HF_HUB_CACHE, os.environ["XDG_CACHE_HOME"], os.environ["TORCH_HOME"],
                  os.environ["MPLCONFIGDIR"]):
        assert Path(cache).is_relative_to(home), cache
    # a job composed without a zoo of its own finds none there (the user's is never used)
    with pytest.raises(ConfigError, match=re.escape(f"no model at {home}/.cache/hacrl/zoo/v1/")):
        validate(cfg)
    child = subprocess.run([sys.executable, "-c", "import pathlib; print(pathlib.Path.home())"],
                           capture_output=True, text=True, check=True, cwd=tmp_path)
    assert child.stdout.strip() == str(home)


def _paper_rows() -> dict[str, dict[str, str]]:
    with PAPER_HYPERPARAMETERS.open() as f:
        return {row["pair"]: row for row in csv.DictReader(f)}


def _pair_configs() -> dict[str, dict]:
    return {p.stem: yaml.safe_load(p.read_text()) for p in sorted(PAIRS.glob("*.yaml"))}


def test_reference_copy_of_paper_table_is_complete():
    rows = _paper_rows()
    assert len(rows) == 6
    assert {r["source"] for r in rows.values()} == {"paper"}


def test_every_paper_pair_has_a_config_with_its_hyperparameters():
    by_name = {cfg["name"]: (stem, cfg) for stem, cfg in _pair_configs().items()}
    for pair, row in _paper_rows().items():
        assert pair in by_name, f"no experiments/pair/*.yaml for paper pair {pair}"
        stem, cfg = by_name[pair]
        assert cfg["agents"] == pair.split("+")
        assert cfg["alpha"] == float(row["alpha"]), stem
        assert cfg["cross_clip_lower"] == float(row["cross_clip_lower"]), stem
        assert cfg["cross_clip_step"] == float(row["cross_clip_step"]), stem


def test_pair_hyperparameters_reach_the_composed_config():
    by_name = {cfg["name"]: stem for stem, cfg in _pair_configs().items()}
    for pair, row in _paper_rows().items():
        cfg = compose([f"pair={by_name[pair]}"])
        assert cfg.pair.name == pair
        assert cfg.algo.alpha == float(row["alpha"])
        assert cfg.algo.cross_clip_lower == float(row["cross_clip_lower"])
        assert cfg.algo.delta_step == float(row["cross_clip_step"])
        assert list(cfg.agents) == pair.split("+")


def test_every_agent_of_every_pair_is_in_the_catalog():
    catalog = yaml.safe_load((REPO / "experiments" / "models" / "catalog.yaml").read_text())
    for stem, cfg in _pair_configs().items():
        assert len(cfg["agents"]) >= 2, stem
        for agent in cfg["agents"]:
            assert agent in catalog, f"{stem}: {agent}"
            assert {"paper", "tiny"} <= set(catalog[agent]), agent
    settings = {cfg["setting"] for cfg in _pair_configs().values()}
    assert {"state", "size", "model"} <= settings


BASE = ["train.steps=2", "train.prompts_per_step=4", "train.minibatch_prompts=2"]


@pytest.mark.parametrize("change", ["seed=1", "method=naive", "train.lr=1e-3", "train.steps=3",
                                    "algo.alpha=2.0", "pair=model_small", "profile=bare",
                                    "rollout.max_new_tokens=40"])
def test_config_hash_changes_with_training_settings(change):
    assert config_hash(compose([*BASE, change])) != config_hash(compose(BASE))


@pytest.mark.parametrize("change", ["output_root=/somewhere/else", "tracking.experiment=other",
                                    "tracking.uri=sqlite:////tmp/x.db", "force=true",
                                    "validation.problems=50", "eval.protocols.main.limit=5"])
def test_config_hash_ignores_tracking_and_output_settings(change):
    assert config_hash(compose([*BASE, change])) == config_hash(compose(BASE))


def test_config_hash_ignores_where_the_zoo_lives(monkeypatch, tmp_path):
    monkeypatch.setenv("HACRL_ZOO_DIR", str(tmp_path / "a"))
    first = config_hash(compose(BASE))
    monkeypatch.setenv("HACRL_ZOO_DIR", str(tmp_path / "b"))
    assert config_hash(compose(BASE)) == first


def test_validation_runs_on_the_first_problems_of_its_benchmark():
    from hacrl.data.arith import load_split
    from hacrl.data.tasks import validation_problems

    full = load_split("tiny_math500")
    assert validation_problems(compose([])) == full[:200]  # scale=tiny: 200 of 1300
    assert validation_problems(compose(["validation.problems=7"])) == full[:7]
    assert validation_problems(compose(["validation.problems=null"])) == full


@pytest.mark.parametrize(("override", "literal"), [
    ("tracking.experiment=\\${seed}x", "${seed}x"),
    ("tracking.experiment=a\\b\\${seed}", "a\\b${seed}"),
    ("data.instruction='Answer in \\${unit}.'", "Answer in ${unit}."),
])
def test_an_escaped_interpolation_stays_literal(job_env, override, literal) -> None:
    from omegaconf import OmegaConf

    from hacrl.job.runs import training_params

    spec = validate(compose([override]))
    key = override.split("=", 1)[0]
    assert OmegaConf.select(spec.cfg, key) == literal
    assert OmegaConf.select(OmegaConf.create(OmegaConf.to_yaml(spec.cfg)), key) == literal
    if key.startswith("data."):
        assert training_params(spec)[key] == literal
