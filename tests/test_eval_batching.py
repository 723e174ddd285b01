"""How evaluation batches its work must never show in its results (micro models, hf backend).

Greedy requests run in batches of `eval.greedy_batch_size`, sampled ones in batches of
`eval.batch_size` (their random draws follow the batches); lm-eval runs through
`evaluate_suite` (simple_evaluate less its environment report); all benchmarks share one
generation pass; validation renders its prompts once per agent. Each test compares per-sample
records (responses and grades) with the way it was done before.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hacrl.config import compose
from hacrl.config.protocol import Protocol
from hacrl.config.settings import OptimizerSettings
from hacrl.evaluation import lmeval as lmeval_module
from hacrl.evaluation.lmeval import SUITE, Backend, EvalOutcome, run_lm_eval
from hacrl.evaluation.runner import data_files
from hacrl.schema import metric_names as M

MODEL = "qwen3-4b-base"
LIMIT = 6  # problems per benchmark: tiny_aime2025 is sampled 4 times each at tiny scale (24 rows)


@pytest.fixture
def setup(job_env: Path, one_thread: None) -> tuple[str, Protocol, Any]:
    cfg = compose([])
    return str(job_env / MODEL), Protocol.in_use(cfg.eval)[0], cfg


def _run(setup: tuple[str, Protocol, Any], tmp: Path, benchmarks: list[str],
         backend: Backend) -> EvalOutcome:
    path, protocol, cfg = setup
    return run_lm_eval(path, benchmarks, data_files(cfg, benchmarks), protocol, backend, tmp,
                       limit=LIMIT)


def _assert_same(a: EvalOutcome, b: EvalOutcome) -> None:
    assert a.metrics == b.metrics and a.average == b.average
    for bench in a.samples:
        assert a.samples[bench] == b.samples[bench], bench


@pytest.mark.parametrize("benchmarks", [["tiny_gsm8k", "tiny_aime2025"],
                                        ["tiny_aime2025", "tiny_gsm8k"]])
def test_greedy_batch_size_changes_no_response(setup, tmp_path, benchmarks):
    # batch_size=4 alone: every request in batches of 4 through lm-eval's own HFLM path
    plain = _run(setup, tmp_path / "plain", benchmarks, Backend(batch_size=4))
    assert len(plain.samples["tiny_aime2025"]) == LIMIT
    assert all(len(r["responses"]) == 4 for r in plain.samples["tiny_aime2025"])
    # greedy ones in one batch or in pairs; the sampled ones meet the same random draws
    # whether greedy ones run before them or (second order) after, as lm-eval ran them
    for greedy in (64, 2):
        split = _run(setup, tmp_path / f"split{greedy}", benchmarks,
                     Backend(batch_size=4, greedy_batch_size=greedy))
        _assert_same(plain, split)


def test_one_pass_across_benchmarks_scores_each_as_alone(setup, tmp_path):
    benchmarks = ["tiny_gsm8k", "tiny_aime2025", "tiny_amc23"]
    backend = Backend(batch_size=8, greedy_batch_size=16)
    together = _run(setup, tmp_path / "all", benchmarks, backend)
    for bench in benchmarks:
        alone = _run(setup, tmp_path / bench, [bench], backend)
        assert alone.metrics[bench] == together.metrics[bench], bench
        assert alone.samples[bench] == together.samples[bench], bench


def test_evaluate_suite_gives_what_simple_evaluate_gives(setup, tmp_path, monkeypatch):
    """The steps of simple_evaluate that evaluate_suite repeats (seeds, model, zero-shot tasks,
    few-shot seed) leave every response as lm-eval's own entry point gives it."""
    from lm_eval import simple_evaluate

    path = setup[0]
    backend = Backend(batch_size=4)

    def through_simple_evaluate(make_lm: Any, manager: Any, seed: int, limit: int | None) -> Any:
        return simple_evaluate(model="hf", model_args={
            "pretrained": path, "dtype": "float32", "enable_thinking": False, "device": "cpu",
            "batch_size": 4}, tasks=[SUITE], task_manager=manager, apply_chat_template=True,
            log_samples=True, bootstrap_iters=0, limit=limit, random_seed=seed,
            numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed,
            verbosity="ERROR")

    benchmarks = ["tiny_math500", "tiny_aime2025"]
    ours = _run(setup, tmp_path / "ours", benchmarks, backend)
    monkeypatch.setattr(lmeval_module, "evaluate_suite", through_simple_evaluate)
    theirs = _run(setup, tmp_path / "theirs", benchmarks, backend)
    _assert_same(ours, theirs)


def test_validation_renders_each_agents_prompts_once(
        job_env: Path, one_thread: None, monkeypatch: pytest.MonkeyPatch,
        lenient_grader: Callable[[list[str], list[str]], list[float]]) -> None:
    from hacrl.data.tasks import load_problems
    from hacrl.engines.local import LocalEngine
    from hacrl.evaluation.greedy import greedy_accuracy
    from hacrl.job import listeners
    from hacrl.training.events import ValidationDue
    from hacrl.training.loop import Agent

    cfg = compose([])
    problems = load_problems(cfg, "tiny_math500")[:12]
    agents = [Agent(n, LocalEngine(str(job_env / n), optimizer=OptimizerSettings(lr=1e-3), device="cpu"))
              for n in ("qwen3-4b-base", "llama3.2-1b-instruct")]
    rendered: list[str] = []
    real = listeners.render_prompts

    def counting(tokenizer: Any, problems: Any, template: str) -> list[list[int]]:
        rendered.append(tokenizer.name_or_path)
        return real(tokenizer, problems, template)

    monkeypatch.setattr(listeners, "render_prompts", counting)

    class Store:
        def __init__(self) -> None:
            self.logged: list[tuple[str, dict[str, float], int]] = []

        def log_metrics(self, run: str, metrics: dict[str, float], step: int) -> None:
            self.logged.append((run, metrics, step))

    store = Store()
    validation = listeners.Validation(agents, problems, "tiny_math500", "{question}", 8,
                                      lenient_grader, store,  # type: ignore[arg-type]
                                      {a.name: f"run-{a.name}" for a in agents})
    for step in (0, 5, 10):
        validation(ValidationDue(step))
    assert len(rendered) == 2  # once per agent, not once per validation
    expected = {f"run-{a.name}": greedy_accuracy(a.engine, problems, "{question}", 8,
                                                 lenient_grader) for a in agents}
    assert len(store.logged) == 6
    for run, metrics, _ in store.logged:
        assert metrics == {M.validation("tiny_math500"): expected[run]}
