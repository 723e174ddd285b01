"""The engine interface: what the training loop needs from whatever runs one agent's model.

An engine owns one agent's policy (and optimizer, and reference policy when a KL term is on).
The loop never touches tensors of a model directly; the verl engine implements the same
methods over Ray worker groups. Engines are registered by name (`register_engine`), so adding
one is adding one entry.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from hacrl.algo import Denominators, LossBatch, LossConfig, LossOutput, policy_loss
from hacrl.algo.rollout import ChatTokenizer, SamplingParams, TokenView
from hacrl.config.settings import OptimizerSettings


@dataclass
class MiniBatchLoss:
    """The loss of optimizer update m of a step: `hacrl.algo.policy_loss` with update_index=m.

    In-process engines call it: loss(logp, rows, denominators=None); with the denominators of
    the whole mini-batch the result is one micro-batch's exact share of the mini-batch loss.
    Engines whose workers compute the loss elsewhere (verl) run the same `policy_loss` there
    with the config they were built with (`EngineContext.loss`, which must be `config`) and
    ship `update_index`. `outputs` collects what was computed here; `kinds`, each reported
    metric's kind (`hacrl.algo.metrics`), by which the loop combines a step's updates.
    """

    config: LossConfig
    update_index: int
    outputs: list[LossOutput] = field(default_factory=list)
    kinds: dict[str, str] = field(default_factory=dict)

    def __call__(self, logp: Tensor, rows: LossBatch,
                 denominators: Denominators | None = None) -> LossOutput:
        out = policy_loss(logp, rows, self.config, update_index=self.update_index,
                          denominators=denominators)
        self.outputs.append(out)
        self.kinds.update(out.kinds)
        return out



@dataclass(frozen=True)
class EngineContext:
    """What an engine may need about its job besides its model (the local engine needs only
    `optimizer`, which it is given as an argument; the verl engine builds its cluster config
    from all of it). `loss` and `optimizer` are the job's (`JobSpec.loss`, `JobSpec.optimizer`)."""

    cfg: Any  # the resolved job config
    agent_name: str
    agent_index: int  # place in the team (0..n_agents-1)
    n_agents: int
    loss: LossConfig
    optimizer: OptimizerSettings
    group_size: int  # G, the method's multiplier applied
    minibatch_prompts: int  # prompts per optimizer update, the method's divisor applied
    run_dir: Path | None = None
    updates_per_step: int = 1  # optimizer updates of this agent per training step


@dataclass(frozen=True)
class Generation:
    """One sampled response: token ids (EOS included when finished).

    `logprobs`, when the engine's sampler has them: the sampling policy's log-prob of each of
    `token_ids` (log-softmax of the logits at the rollout temperature, before top-p), which
    are the step's old log-probs of the agent's own rows; None makes the loop compute them
    with `Engine.log_probs`.
    """

    token_ids: list[int]
    finished: bool
    logprobs: list[float] | None = None


class Engine(ABC):
    """One agent's model behind the loop."""

    tokenizer: ChatTokenizer

    @abstractmethod
    def generate(self, prompt_ids: list[list[int]], n: int,
                 sampling: SamplingParams) -> list[list[Generation]]:
        """n responses per prompt, grouped per prompt: result[p][i]."""

    @abstractmethod
    def log_probs(self, views: list[TokenView], reference: bool = False) -> list[Tensor]:
        """Per-token log-probs of each view's response under the current (or reference) policy."""

    @abstractmethod
    def train_minibatch(self, views: list[TokenView], batch: LossBatch,
                        loss_fn: MiniBatchLoss) -> dict[str, float]:
        """One optimizer update on these rows; returns the loss's metrics plus grad_norm."""

    @abstractmethod
    def save(self, directory: Path) -> None:
        """Model, optimizer and engine state, enough to resume training exactly."""

    @abstractmethod
    def load(self, directory: Path) -> None: ...

    def memory_metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        """Free what the engine holds outside this process (workers, GPUs); no-op by default."""
        return None

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)


ENGINES: dict[str, Callable[..., Engine]] = {}
# Modules that register an engine when imported; imported only when that engine is asked for,
# so `import hacrl` never imports verl.
ENGINE_MODULES = {"local": "hacrl.engines.local", "verl": "hacrl.engines.verl"}


def register_engine(name: str) -> Callable[[Callable[..., Engine]], Callable[..., Engine]]:
    def add(factory: Callable[..., Engine]) -> Callable[..., Engine]:
        if name in ENGINES:
            raise ValueError(f"engine {name!r} is already registered")
        ENGINES[name] = factory
        return factory
    return add


def engine_hook(name: str, hook: str) -> Callable[..., Any] | None:
    """An optional function of engine `name`'s module (e.g. `describe` for dry runs,
    `before_job`), or None; importing the module is what registers the engine."""
    module = ENGINE_MODULES.get(name)
    return getattr(importlib.import_module(module), hook, None) if module else None


def make_engine(name: str, **kwargs: Any) -> Engine:
    if name not in ENGINES and name in ENGINE_MODULES:
        importlib.import_module(ENGINE_MODULES[name])  # engines register on import
    if name not in ENGINES:
        raise KeyError(f"unknown engine {name!r}; registered: {', '.join(sorted(ENGINES))}")
    return ENGINES[name](**kwargs)
