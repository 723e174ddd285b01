"""Tokenizer-neutral rollout records and their per-target token views (HACPO step 4).

A `Trajectory` is what one agent produced for one prompt: the prompt as chat messages, the
response as text, and the source agent's own tokens and rollout log-probs. Any agent can train
on it through a `TokenView`: the prompt rendered with *that* agent's chat template and the
response text re-encoded with *its* tokenizer. The agent that sampled the response keeps its
exact tokens (no round trip through text).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class ChatTokenizer(Protocol):
    """The slice of a Hugging Face tokenizer that views need."""

    eos_token_id: Any

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, **kwargs: Any) -> list[int]: ...

    def decode(self, token_ids: Any, **kwargs: Any) -> str: ...


@dataclass(frozen=True)
class SamplingParams:
    """How responses are drawn (every engine's `generate` takes these)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False


class RetokenizationOverflow(ValueError):
    """A borrowed response is longer than the target's response budget (overflow='error')."""


@dataclass
class Trajectory:
    """One sampled response, independent of any tokenizer but its source's.

    prompt_messages: chat messages, e.g. [{"role": "user", "content": "What is 2+3?"}].
    response_text: the decoded response without special tokens.
    source: index of the agent that sampled it (in the job's agent list).
    source_tokens: the source's response token ids, EOS included when `finished`.
    finished: the response ended with the source's EOS (False: cut at the length limit).
    reward: verifier reward, filled in after scoring.
    source_logprobs: the rollout policy's per-token log-probs of `source_tokens`.
    """

    prompt_uid: str
    prompt_messages: list[dict[str, str]]
    response_text: str
    source: int
    source_tokens: list[int]
    finished: bool
    reward: float = 0.0
    source_logprobs: list[float] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TokenView:
    """A trajectory in one agent's tokens: prompt ids + response ids (EOS included if finished)."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    truncated: bool = False


def render_prompt_ids(tokenizer: ChatTokenizer, messages: list[dict[str, str]]) -> list[int]:
    """The prompt as the agent sees it: its own chat template, generation prompt appended."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def eos_id(tokenizer: ChatTokenizer) -> int:
    eos = tokenizer.eos_token_id
    if isinstance(eos, list):
        eos = eos[0]
    if eos is None:
        raise ValueError("tokenizer has no eos_token_id; set eos_token in its tokenizer_config.json")
    return int(eos)


def own_view(traj: Trajectory, prompt_ids: list[int]) -> TokenView:
    """The source's exact view of its own sample."""
    return TokenView(tuple(prompt_ids), tuple(traj.source_tokens))


def retokenize(traj: Trajectory, tokenizer: ChatTokenizer, prompt_ids: list[int],
               max_response_tokens: int, overflow: str = "truncate") -> TokenView:
    """The target's view of a borrowed sample: response text re-encoded, EOS made the target's.

    EOS is handled consistently: a response the source finished gets the target's EOS; one the
    source cut at its length limit gets none. If the re-encoded response exceeds the target's
    budget, `overflow="truncate"` cuts it (and drops the EOS: the response is then unfinished to
    the target too), `overflow="error"` raises RetokenizationOverflow.
    """
    if overflow not in ("truncate", "error"):
        raise ValueError(f"rollout.overflow must be 'truncate' or 'error', got {overflow!r}")
    ids = list(tokenizer.encode(traj.response_text, add_special_tokens=False))
    if traj.finished:
        ids.append(eos_id(tokenizer))
    truncated = False
    if len(ids) > max_response_tokens:
        if overflow == "error":
            raise RetokenizationOverflow(
                f"borrowed response of agent {traj.source} for prompt {traj.prompt_uid} is "
                f"{len(ids)} target tokens, over rollout.max_new_tokens={max_response_tokens}; "
                "raise it or set rollout.overflow=truncate")
        ids, truncated = ids[:max_response_tokens], True
    return TokenView(tuple(prompt_ids), tuple(ids), truncated)
