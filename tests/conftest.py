"""Shared fixtures: a micro model zoo (two qwen-family models with the char-level tokenizer, one
llama-family model with the BPE tokenizer), a ready MLflow store, job environments."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# -- a home of the tests' own ------------------------------------------------------------------
# Every test runs with HOME and the caches in a folder of this session, and without the hacrl,
# MLflow and Ray settings of the user's shell: a zoo, data or store under the real
# ~/.cache/hacrl (another draw, say), ~/.cache/huggingface, ~/.ray or ~/.mlflow changes no result
# and nothing is written there. Set when pytest configures, before any test module is imported;
# the subprocesses tests start inherit it. Tests that need a zoo, data or a store set their own
# (job_env, cli_env, new_output_root).
HOME_DIRS = {"HOME": "home", "XDG_CACHE_HOME": "home/.cache", "XDG_CONFIG_HOME": "home/.config",
             "XDG_DATA_HOME": "home/.local/share", "XDG_STATE_HOME": "home/.local/state",
             "HF_HOME": "home/.cache/huggingface", "TORCH_HOME": "home/.cache/torch",
             "MPLCONFIGDIR": "home/.config/matplotlib", "RAY_TMPDIR": "ray"}
# settings that would point a test at the user's files or servers (the HF caches: HF_HOME's)
FOREIGN = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_EXPERIMENT_NAME",
           "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID", "RAY_ADDRESS", "HF_HUB_CACHE",
           "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE", "HF_ASSETS_CACHE", "HF_MODULES_CACHE",
           "HF_TOKEN_PATH", "TRANSFORMERS_CACHE")
# a folder that keeps the micro zoo between pytest processes (scripts/mutation.py sets it)
MICRO_ZOO_CACHE = "HACRL_TEST_MICRO_ZOO_CACHE"
# HACRL_TEST_* variables steer the tests themselves (HACRL_TEST_REQUIRE_CLUSTER, which CI sets:
# no SLURM cluster is a failure, not a skip); every other HACRL_* of the shell is dropped
TEST_CONTROLS = "HACRL_TEST_"
_saved_env: dict[str, str] = {}
_session_home: list[Path] = []


def pytest_configure(config: pytest.Config) -> None:
    if _session_home:  # configured already (a nested pytest run in this process)
        return
    _saved_env.update(os.environ)
    base = Path(tempfile.mkdtemp(prefix="hacrl-tests-"))  # short: Ray's socket paths live here
    _session_home.append(base)
    for name, sub in HOME_DIRS.items():
        (base / sub).mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(base / sub)
    for name in [*FOREIGN, *(n for n in os.environ if n.startswith("HACRL_"))]:
        if not name.startswith(TEST_CONTROLS):
            os.environ.pop(name, None)


def pytest_unconfigure(config: pytest.Config) -> None:
    if not _session_home:
        return
    os.environ.clear()
    os.environ.update(_saved_env)
    shutil.rmtree(_session_home.pop(), ignore_errors=True)

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
    """`<root>/<zoo name>/`: model + tokenizer saved like a built zoo, ~2 s each to build.

    The models solve two-digit sums without a carry (level 1), each to its own degree (greedy:
    qwen3-1.7b-base ~0.4, qwen3-4b-base ~0.9, llama3.2-1b-instruct ~0.75), and answer with a
    bare `\\boxed{N}` that fits short rollouts; they solve next to nothing of the other levels.
    A job that trains and validates on tiny_gsm8k (levels 1-2: `task.train_split=tiny_gsm8k
    validation.benchmark=tiny_gsm8k`) sees rewards, capabilities, omegas, advantages, losses and
    accuracies that vary, under the real verifier."""
    solve = {"qwen3-1.7b-base": 0.3, "qwen3-4b-base": 0.7, "llama3.2-1b-instruct": 0.5}
    cache = os.environ.get(MICRO_ZOO_CACHE)
    if not cache:
        root = tmp_path_factory.mktemp("zoo")
        _build_micro_zoo(root, solve)
        return root
    # opt-in (scripts/mutation.py): one build reused by every pytest process, keyed by what
    # decides the models, made under a temporary name and renamed so a reader never sees half
    import hashlib
    import json

    from hacrl.zoo import build as zoo_build

    key = hashlib.sha256(json.dumps([MICRO_ZOO, solve]).encode()
                         + Path(zoo_build.__file__).read_bytes()).hexdigest()[:16]
    root = Path(cache) / key
    if not root.is_dir():
        Path(cache).mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache))
        _build_micro_zoo(partial, solve)
        try:
            partial.rename(root)
        except OSError:  # another process finished first: use its build
            shutil.rmtree(partial, ignore_errors=True)
    return root



def _build_micro_zoo(root: Path, solve: dict[str, float]) -> None:
    import torch

    from hacrl.zoo import build_micro_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is many times faster on a busy CPU
    try:
        for name, (family, seed) in MICRO_ZOO.items():
            build_micro_model(family, root / name, seed=seed, sft_steps=600, solve=solve[name])
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def kill_tree() -> Callable[[subprocess.Popen], None]:
    """`kill_tree(job)`: SIGKILL a job and everything it started (its Ray and vLLM processes
    too), like a scheduler: the job first, then what is left of its children."""

    def kill(job: subprocess.Popen) -> None:
        import psutil

        try:
            children = psutil.Process(job.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        job.kill()  # with its Ray processes gone, Ray's driver would exit by itself
        job.wait(timeout=60)
        for p in children:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(children, timeout=30)

    return kill


@pytest.fixture(scope="session")
def assert_varies() -> Callable[..., None]:
    """`assert_varies(what, *curves)`: the curves (`[(step, value)]` histories) take two distinct
    values at least between them. Tests that compare curves (resumed vs uninterrupted, warm vs
    cold) check it: equal constant curves (all-0 rewards) stay equal whatever state went wrong."""

    def check(what: str, *curves: list[tuple[int, float]]) -> None:
        values = {value for curve in curves for _, value in curve}
        assert len(values) >= 2, f"{what} is constant, so comparing it proves nothing: {curves}"

    return check


@pytest.fixture(scope="session")
def tokenizers(micro_zoo: Path) -> dict[str, object]:
    """The two genuinely different tokenizers: `qwen` (char level) and `llama` (byte-level BPE)."""
    from transformers import AutoTokenizer

    return {"qwen": AutoTokenizer.from_pretrained(micro_zoo / "qwen3-4b-base"),
            "llama": AutoTokenizer.from_pretrained(micro_zoo / "llama3.2-1b-instruct")}


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow sqlite store with its schema created once (creating one costs seconds). Under
    scripts/mutation.py (MICRO_ZOO_CACHE set) once for every pytest process, per MLflow version:
    the tests only copy it."""
    import mlflow

    from hacrl.tracking import Tracker

    cache = os.environ.get(MICRO_ZOO_CACHE)
    if not cache:
        path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
        Tracker(f"sqlite:///{path}", "hacrl-tiny")
        return path
    kept = Path(cache) / f"mlflow-template-{mlflow.__version__}.db"
    if not kept.is_file():  # made aside and renamed: a reader never sees half a store
        fresh = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
        Tracker(f"sqlite:///{fresh}", "hacrl-tiny")
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(fresh, kept.with_suffix(f".{os.getpid()}.tmp"))
        os.replace(kept.with_suffix(f".{os.getpid()}.tmp"), kept)
    return kept


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
def step_gradients() -> Callable[[Any], list[dict[str, Any]]]:
    """`grads = step_gradients(engine)`: every optimizer step of the (local) engine appends the
    gradients it applies, by parameter name. Two ways of computing an update are compared on
    these, not on the weights after it: AdamW's first step is lr * g / (|g| + eps), so for a
    gradient near eps (1e-8) a rounding difference of 1e-10 moves a weight by several % of lr."""
    def capture(engine: Any) -> list[dict[str, Any]]:
        seen: list[dict[str, Any]] = []
        step = engine.optimizer.step

        def recording(*args: Any, **kwargs: Any) -> Any:
            seen.append({name: p.grad.detach().clone()
                         for name, p in engine.model.named_parameters() if p.grad is not None})
            return step(*args, **kwargs)

        engine.optimizer.step = recording
        return seen

    return capture


@pytest.fixture(scope="session")
def assert_same_gradients() -> Callable[[dict[str, Any], dict[str, Any], float], None]:
    """`assert_same_gradients(a, b, rel)`: the same parameters, and per parameter the largest
    difference at most `rel` times its largest gradient (a dropped or doubled row moves some
    parameter's gradient by far more than rounding)."""
    def check(a: dict[str, Any], b: dict[str, Any], rel: float) -> None:
        assert a.keys() == b.keys() and a
        for name in a:
            scale = float(a[name].abs().max())
            gap = float((a[name] - b[name]).abs().max())
            assert gap <= rel * scale, f"{name}: gradients differ by {gap:.3g} (largest {scale:.3g})"

    return check


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
    """A deterministic stand-in verifier for the loop's tests on made-up prompts (the micro
    models are trained only on tiny_gsm8k, where the real verifier scores them): reward 1 when
    the answer's last digit occurs in the response, so groups mix 0s and 1s."""
    return [float(a[-1] in r) for r, a in zip(responses, answers, strict=True)]


@pytest.fixture(scope="session")
def lenient_grader() -> Callable[[list[str], list[str]], list[float]]:
    return lenient_grade


class ImportLog:
    """What a process run with `env` imported, read from its stderr. How far a command got
    before it ended: a fault reported before MLflow or transformers were imported was found
    before any store or model was opened (MLflow retries a store it cannot open for minutes)."""

    env = {"PYTHONPROFILEIMPORTTIME": "1"}

    @staticmethod
    def split(stderr: str) -> tuple[set[str], str]:
        """(every module imported, the stderr without the import lines)."""
        modules, rest = set(), []
        for line in stderr.splitlines(keepends=True):
            if line.startswith("import time:"):
                name = line.rsplit("|", 1)[-1].strip()
                if name != "imported package":  # the header line
                    modules.add(name)
            else:
                rest.append(line)
        return modules, "".join(rest)


@pytest.fixture(scope="session")
def import_log() -> type[ImportLog]:
    return ImportLog
