"""`rollout.name=hf`: generation with Hugging Face `generate` inside verl's actor workers.

A verl rollout (a `BaseRollout`) lives in the actor's worker processes and receives the
actor's current weights through verl's own weight sync (`ActorRolloutRefWorker.update_weights`,
naive mode: `engine.get_per_tensor_param()` gathers the full FSDP tensors, the rollout's
`update_weights` takes them). This one loads them into an HF model of the same architecture
and samples with `hacrl.engines.sampling.hf_sample`, the local engine's sampler: token ids in,
token ids out, like the vLLM servers. It is what `engine.device=cpu` uses, where vLLM's GPU
server cannot run; `HacrlActorRolloutRefWorker.hf_generate` is its entry point.

verl finds rollouts by (name, mode) in `verl.workers.rollout.base._ROLLOUT_REGISTRY`
(verl/workers/rollout/base.py:89-93, read by `get_rollout_class` at :96); importing this
module adds ("hf", "async"). verl imports it in every worker when it is named in
`VERL_USE_EXTERNAL_MODULES` (`hacrl.engines.verl.cpu_platform.environment`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from hacrl.algo.rollout import SamplingParams
from hacrl.engines.base import Generation
from hacrl.engines.sampling import hf_sample

NAME = "hf"


def _base() -> type:
    from verl.workers.rollout.base import BaseRollout

    return BaseRollout


class HFRollout(_base()):  # type: ignore[misc]
    """An fp32 HF copy of the actor, refreshed from the actor's weights before every rollout."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any,
                 **kwargs: Any) -> None:
        super().__init__(config, model_config, device_mesh, *args, **kwargs)
        from transformers import AutoModelForCausalLM

        hf_config = self.model_config.hf_config
        self.model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval()
        self.model.requires_grad_(False)
        self.tokenizer = self.model_config.tokenizer
        self.loaded = False

    async def resume(self, tags: list[str]) -> None:
        return None  # nothing is freed between rollouts (no device memory to give back)

    async def release(self) -> None:
        return None

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]],
                             wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"hf rollout takes full named tensors, not {wire_format!r}")
        load_named(self.model, weights)
        self.loaded = True

    def generate(self, rows: list[list[int]], sampling: SamplingParams, *, pad_id: int,
                 eos: int) -> list[Generation]:
        if not self.loaded:
            raise RuntimeError("hf rollout has no weights: call the worker group's "
                               "update_weights before generating")
        return hf_sample(self.model, rows, sampling, pad_id=pad_id, eos=eos)


def load_named(model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy named full tensors into `model` (state-dict names, tied aliases included); every
    parameter must be covered and every name must exist."""
    state = model.state_dict(keep_vars=True)
    seen: set[str] = set()
    with torch.no_grad():
        for name, tensor in weights:
            if name not in state:
                raise KeyError(f"hf rollout: the actor sent {name!r}, which the model lacks")
            state[name].copy_(tensor.to(state[name].dtype))
            seen.add(name)
    names = {id(p): n for n, p in state.items() if n in seen}
    missing = [n for n, p in model.named_parameters() if id(p) not in names]
    if missing:
        raise KeyError(f"hf rollout: no weights for {missing[:5]}")


def register() -> None:
    from verl.workers.rollout import base

    base._ROLLOUT_REGISTRY[(NAME, "async")] = f"{__name__}.HFRollout"


register()

__all__ = ["HFRollout", "NAME", "load_named", "register"]
