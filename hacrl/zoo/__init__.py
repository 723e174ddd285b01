"""Tiny Hugging Face causal LMs standing in for the paper's models, built locally by SFT.

The names below load on first use: `hacrl.zoo.lean_decoder` (pure torch, imported by the
engines and evaluation) must not pull the builder's transformers model classes in with it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hacrl.zoo.build import (
        VLLM_MICRO_ZOO,
        build_micro_model,
        build_model,
        build_models,
        build_vllm_micro_zoo,
        build_zoo,
        default_zoo_dir,
        is_built,
        kept_models,
        load_card,
        zoo_model_dir,
    )
    from hacrl.zoo.cards import zoo_draw
    from hacrl.zoo.sft import SFTConfig, SFTResult, greedy_generate, probe_accuracy, render_prompt
    from hacrl.zoo.specs import ZOO, ZooSpec, make_config
    from hacrl.zoo.tokenizers import FAMILIES, build_tokenizer

_HOME = {
    **dict.fromkeys(("VLLM_MICRO_ZOO", "build_micro_model", "build_model", "build_models",
                     "build_vllm_micro_zoo", "build_zoo",
                     "default_zoo_dir", "is_built", "kept_models", "load_card", "zoo_model_dir"),
                    "build"),
    **dict.fromkeys(("SFTConfig", "SFTResult", "greedy_generate", "probe_accuracy",
                     "render_prompt"), "sft"),
    **dict.fromkeys(("ZOO", "ZooSpec", "make_config"), "specs"),
    **dict.fromkeys(("FAMILIES", "build_tokenizer"), "tokenizers"),
    "zoo_draw": "cards",
}
__all__ = [
    "FAMILIES",
    "SFTConfig",
    "SFTResult",
    "ZOO",
    "VLLM_MICRO_ZOO",
    "ZooSpec",
    "build_micro_model",
    "build_model",
    "build_models",
    "build_tokenizer",
    "build_vllm_micro_zoo",
    "build_zoo",
    "default_zoo_dir",
    "greedy_generate",
    "is_built",
    "kept_models",
    "load_card",
    "make_config",
    "probe_accuracy",
    "render_prompt",
    "zoo_draw",
    "zoo_model_dir",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'hacrl.zoo' has no attribute {name!r}")
    return getattr(import_module(f"hacrl.zoo.{_HOME[name]}"), name)
