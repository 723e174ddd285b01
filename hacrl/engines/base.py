"""The engine interface: what the training loop needs from whatever runs one agent's model.

An engine owns one agent's policy (and optimizer, and reference policy when a KL term is on).
The loop never touches tensors of a model directly; the verl engine implements the same
methods over Ray worker groups. Engines are registered by name (`register_engine`), so adding
one is adding one entry.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from torch import Tensor

from hacrl.algo import Denominators, LossBatch, LossOutput
from hacrl.rollout import ChatTokenizer, TokenView


class LossFn(Protocol):
    """loss_fn(logp, rows, denominators=None): with denominators (of the whole mini-batch) the
    result is this micro-batch's exact share of the mini-batch loss (`hacrl.algo.policy_loss`)."""

    def __call__(self, logp: Tensor, rows: LossBatch,
                 denominators: Denominators | None = None) -> LossOutput: ...


@dataclass(frozen=True)
class Generation:
    """One sampled response: token ids (EOS included when finished)."""

    token_ids: list[int]
    finished: bool


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False


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
    def train_minibatch(self, views: list[TokenView], batch: LossBatch, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer update on these rows; returns the loss's metrics plus grad_norm."""

    @abstractmethod
    def save(self, directory: Path) -> None:
        """Model, optimizer and engine state, enough to resume training exactly."""

    @abstractmethod
    def load(self, directory: Path) -> None: ...

    def memory_metrics(self) -> dict[str, float]:
        return {}

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)


ENGINES: dict[str, Callable[..., Engine]] = {}


def register_engine(name: str) -> Callable[[Callable[..., Engine]], Callable[..., Engine]]:
    def add(factory: Callable[..., Engine]) -> Callable[..., Engine]:
        if name in ENGINES:
            raise ValueError(f"engine {name!r} is already registered")
        ENGINES[name] = factory
        return factory
    return add


def make_engine(name: str, **kwargs: Any) -> Engine:
    if name not in ENGINES:
        # engines register on import; the local one is always available
        import hacrl.engines.local  # noqa: F401
    if name not in ENGINES:
        raise KeyError(f"unknown engine {name!r}; registered: {', '.join(sorted(ENGINES))}")
    return ENGINES[name](**kwargs)
