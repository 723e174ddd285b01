"""Shared fixtures: a micro model zoo (two qwen-family models with the char-level tokenizer, one
llama-family model with the BPE tokenizer), a ready MLflow store, job environments."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# zoo name (from experiments/models/catalog.yaml) -> (tokenizer family, seed)
MICRO_ZOO = {
    "qwen3-1.7b-base": ("qwen", 1),
    "qwen3-4b-base": ("qwen", 0),
    "llama3.2-1b-instruct": ("llama", 0),
}

# overrides for a job that takes a second or two on a CPU
TINY_JOB = (
    "train.steps=2",
    "train.prompts_per_step=4",
    "train.minibatch_prompts=2",
    "train.rollouts_per_prompt=4",
    "rollout.max_new_tokens=16",
    "validation.every=1",
    "validation.benchmark=tiny_amc23",
    "validation.problems=40",
    "eval.benchmarks=[tiny_gsm8k,tiny_aime2025]",
    "eval.protocols.main.limit=40",  # the tiny benchmarks are sized for precision, not tests
)


@pytest.fixture(scope="session")
def tiny_job() -> list[str]:
    return list(TINY_JOB)


SWEEP_FILE = """# @package _global_
defaults:
  - override /hydra/sweeper: hacrl
  - override /launcher: local
hydra:
  sweep:
    dir: ${{output_root}}/sweeps/{name}
    subdir: .jobs/${{hydra.job.num}}
  sweeper:
    name: {name}
{report}    grids:
      - pair: size
        method: {methods}
"""


@pytest.fixture(scope="session")
def sweep_file() -> Callable[..., Path]:
    """Writes `<folder>/<name>.yaml`: a sweep of the size pair over `methods` on the local
    launcher (`report`: extra YAML lines under `hydra.sweeper`, indented 4; `grids`: YAML lines
    after that grid, its own keys indented 8, more grids `- ...` indented 6)."""
    def write(folder: Path, name: str, methods: str = "hacpo", report: str = "",
              grids: str = "") -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.yaml"
        path.write_text(SWEEP_FILE.format(name=name, methods=methods, report=report) + grids)
        return path

    return write


@pytest.fixture(scope="session")
def micro_zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`<root>/<zoo name>/`: model + tokenizer saved like a built zoo, a few seconds to build."""
    import torch

    from hacrl.zoo import build_micro_model

    root = tmp_path_factory.mktemp("zoo")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is many times faster on a busy CPU
    try:
        for name, (family, seed) in MICRO_ZOO.items():
            build_micro_model(family, root / name, seed=seed)
    finally:
        torch.set_num_threads(threads)
    return root


@pytest.fixture(scope="session")
def tokenizers(micro_zoo: Path) -> dict[str, object]:
    """The two genuinely different tokenizers: `qwen` (char level) and `llama` (byte-level BPE)."""
    from transformers import AutoTokenizer

    return {"qwen": AutoTokenizer.from_pretrained(micro_zoo / "qwen3-4b-base"),
            "llama": AutoTokenizer.from_pretrained(micro_zoo / "llama3.2-1b-instruct")}


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow sqlite store with its schema created once (creating one costs seconds)."""
    from hacrl.tracking import Tracker

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    Tracker(f"sqlite:///{path}", "hacrl-tiny")
    return path


@pytest.fixture
def new_output_root(tmp_path: Path, mlflow_template: Path) -> Callable[[str], Path]:
    """A fresh output root whose default store `<root>/mlflow.db` is an empty, migrated store."""

    def make(name: str = "out") -> Path:
        root = tmp_path / name
        root.mkdir()
        shutil.copy(mlflow_template, root / "mlflow.db")
        return root

    return make


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Torch on one thread for the test (micro models; the jobs' own setting at scale=tiny)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def transformers_generate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sampling through transformers' `generate` (as on a GPU or for other architectures), not
    the lean decoder the zoo's models get on a CPU: for tests of that path."""
    from hacrl.engines import sampling
    from hacrl.evaluation import hf_lm

    monkeypatch.setattr(sampling, "lean_decoder", lambda model: None)
    monkeypatch.setattr(hf_lm, "lean_decoder", lambda model: None)


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """HACRL_DATA for tests: local data copies (tiny sources are written on demand) in tmp."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture
def job_env(micro_zoo: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Jobs composed in this process see the micro zoo; torch's thread count is restored."""
    import torch

    monkeypatch.setenv("HACRL_ZOO_DIR", str(micro_zoo))
    monkeypatch.setenv("HACRL_DATA", str(data_root))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    threads = torch.get_num_threads()  # run_job sets engine.threads (1 at scale=tiny)
    yield micro_zoo
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def hacrl_cmd() -> list[str]:
    """The `hacrl` console script of this environment (or the module when it is not installed)."""
    script = Path(sys.executable).parent / "hacrl"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "hacrl.cli"]


@pytest.fixture
def cli_env(micro_zoo: Path, data_root: Path) -> Callable[..., dict[str, str]]:
    def make(output_root: Path, zoo: Path | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        env.update(HACRL_ZOO_DIR=str(zoo or micro_zoo), HACRL_OUTPUTS=str(output_root),
                   HACRL_DATA=str(data_root), PYTHONUNBUFFERED="1")
        return env

    return make


def lenient_grade(responses: list[str], answers: list[str]) -> list[float]:
    """A deterministic stand-in verifier that micro models pass sometimes: reward 1 when the
    answer's last digit occurs in the response (the real verifier almost always says 0)."""
    return [float(a[-1] in r) for r, a in zip(responses, answers, strict=True)]


@pytest.fixture(scope="session")
def lenient_grader() -> Callable[[list[str], list[str]], list[float]]:
    return lenient_grade
