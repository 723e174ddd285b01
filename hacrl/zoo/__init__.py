"""Tiny Hugging Face causal LMs standing in for the paper's models, built locally by SFT."""

from hacrl.zoo.build import (
    build_micro_model,
    build_model,
    build_models,
    build_zoo,
    default_zoo_dir,
    is_built,
    load_card,
    zoo_model_dir,
)
from hacrl.zoo.sft import SFTConfig, SFTResult, greedy_generate, probe_accuracy, render_prompt
from hacrl.zoo.specs import ZOO, ZooSpec, make_config
from hacrl.zoo.tokenizers import FAMILIES, build_tokenizer

__all__ = [
    "FAMILIES",
    "SFTConfig",
    "SFTResult",
    "ZOO",
    "ZooSpec",
    "build_micro_model",
    "build_model",
    "build_models",
    "build_tokenizer",
    "build_zoo",
    "default_zoo_dir",
    "greedy_generate",
    "is_built",
    "load_card",
    "make_config",
    "probe_accuracy",
    "render_prompt",
    "zoo_model_dir",
]
