"""Specifications of the tiny model zoo: one small analog per model of the paper."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from transformers import LlamaConfig, PretrainedConfig, PreTrainedTokenizerBase, Qwen3Config

__all__ = ["ZOO", "ZooSpec", "make_config", "shares_sft", "validate_names"]


@dataclass(frozen=True)
class ZooSpec:
    """Architecture and SFT recipe of one zoo model.

    ``init_key`` names the random initialisation and data order: models sharing it
    (``qwen3-4b`` and ``qwen3-4b-instruct``) follow the same SFT trajectory and differ
    only in how long they train (their ``target_accuracy``).
    """

    name: str
    paper_model: str
    family: str  # tokenizer family: "qwen" or "llama"
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    target_accuracy: float  # SFT stops once greedy probe accuracy reaches this
    init_key: str = ""  # defaults to ``name``
    lr: float = 3e-3
    batch_size: int = 32
    warmup_steps: int = 30
    max_steps: int = 4000
    eval_every: int = 25
    max_position_embeddings: int = 256
    # None: hidden_size // num_heads. vLLM's CPU attention takes only some sizes (32, 64, 80,
    # ...; not the zoo's 8-20), so the vLLM micro models set 32
    head_dim: int | None = None

    @property
    def architecture(self) -> str:
        return "Qwen3ForCausalLM" if self.family == "qwen" else "LlamaForCausalLM"

    def to_dict(self) -> dict[str, Any]:
        fields = asdict(self)
        if fields["head_dim"] is None:  # the zoo's cards (and identities) as before it existed
            del fields["head_dim"]
        return {**fields, "architecture": self.architecture}


def _spec(
    name: str, paper: str, family: str, hidden: int, layers: int, target: float, **kw: Any
) -> ZooSpec:
    """4 query / 2 key-value heads, MLP 2x wide; narrow models take a larger learning rate.

    Most of a build is each model's SFT plateau (copy the question, then learn to add), 600-2200
    steps depending on the draw. Recipes measured against it did not shorten it for every model
    and draw: lr 1.5e-3 to 1e-2, batch 16 or 64, easy levels first, weight decay 0.1, init std
    0.125, a 6x larger SFT set. Growing larger models from a trained smaller one does, but the
    grown models are alike and Table 1's "Naive sharing hurts" disappeared with them.
    """
    kw.setdefault("lr", 5e-3 if hidden <= 64 else 3e-3)
    return ZooSpec(name, paper, family, hidden, layers, 4, 2, 2 * hidden, target, **kw)


ZOO: dict[str, ZooSpec] = {
    s.name: s
    for s in (
        # size family: one architecture, growing width/depth
        _spec("qwen3-1.7b-base", "Qwen/Qwen3-1.7B-Base", "qwen", 48, 3, 0.25),
        _spec("qwen3-4b-base", "Qwen/Qwen3-4B-Base", "qwen", 64, 3, 0.40),
        _spec("qwen3-8b-base", "Qwen/Qwen3-8B-Base", "qwen", 96, 3, 0.50),
        # state family: same architecture, init and data order; instruct trains longer
        _spec("qwen3-4b", "Qwen/Qwen3-4B", "qwen", 64, 3, 0.30, init_key="qwen3-4b"),
        _spec(
            "qwen3-4b-instruct",
            "Qwen/Qwen3-4B-Instruct-2507",
            "qwen",
            64,
            3,
            0.55,
            init_key="qwen3-4b",
        ),
        # other vendor: byte-level BPE tokenizer, Llama architecture, two sizes
        _spec("llama3.2-1b-instruct", "meta-llama/Llama-3.2-1B-Instruct", "llama", 48, 3, 0.25),
        _spec("llama3.2-3b-instruct", "meta-llama/Llama-3.2-3B-Instruct", "llama", 80, 3, 0.45),
    )
}


def shares_sft(a: ZooSpec, b: ZooSpec) -> bool:
    """Whether ``a`` and ``b`` follow one SFT trajectory (same init, data order, architecture
    and recipe) and differ only in where they stop (``target_accuracy``) and naming."""
    def recipe(s: ZooSpec) -> ZooSpec:
        return replace(s, name="", paper_model="", target_accuracy=0.0, init_key="")

    return (a.init_key or a.name) == (b.init_key or b.name) and recipe(a) == recipe(b)


def validate_names(names: list[str] | tuple[str, ...] | None) -> list[str]:
    """The given zoo names (all when None); unknown names raise ValueError naming the valid ones."""
    if names is None:
        return list(ZOO)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        raise ValueError(f"unknown zoo model(s) {unknown}; valid names: {', '.join(ZOO)}")
    return list(names)


def make_config(spec: ZooSpec, tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
    """Hugging Face config for ``spec`` with token ids taken from ``tokenizer``."""
    common: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim or spec.hidden_size // spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        attention_dropout=0.0,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        dtype="float32",
    )
    if spec.family == "qwen":
        return Qwen3Config(**common)
    if spec.family == "llama":
        return LlamaConfig(**common)
    raise ValueError(f"unknown family {spec.family!r}")
