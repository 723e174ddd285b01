"""Supervised fine-tuning of zoo models on the arithmetic train split.

The loss covers response tokens only: the prompt is the question rendered with the
model's own chat template, the response is the worked solution followed by EOS.
Training stops once greedy accuracy on a fixed probe set reaches a target.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from hacrl.arith import Problem, grade_many

__all__ = [
    "SFTConfig",
    "SFTResult",
    "encode_examples",
    "greedy_generate",
    "probe_accuracy",
    "render_prompt",
    "sft_train",
]


@dataclass(frozen=True)
class SFTConfig:
    lr: float = 3e-3
    batch_size: int = 32
    warmup_steps: int = 30
    max_steps: int = 3000
    eval_every: int = 25  # probe interval; doubled while accuracy is below half the target
    target_accuracy: float | None = None  # None: train exactly max_steps, no probing
    weight_decay: float = 0.01
    seed: int = 0


@dataclass
class SFTResult:
    steps: int
    probe_accuracy: float | None
    reached_target: bool
    seconds: float
    final_loss: float
    eval_seconds: float = 0.0
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, probe accuracy)


def render_prompt(tokenizer: PreTrainedTokenizerBase, question: str) -> str:
    """The question as a single user turn, ready for the assistant's reply."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    assert isinstance(text, str)
    return text


def encode_examples(
    tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem]
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids + EOS) per problem, tokenized separately."""
    eos = tokenizer.eos_token_id
    assert isinstance(eos, int)
    out = []
    for p in problems:
        prompt = tokenizer.encode(render_prompt(tokenizer, p.question), add_special_tokens=False)
        response = tokenizer.encode(p.solution, add_special_tokens=False) + [eos]
        out.append((prompt, response))
    return out


def _collate(
    examples: Sequence[tuple[list[int], list[int]]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask and labels (-100 outside responses)."""
    length = max(len(p) + len(r) for p, r in examples)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), length), dtype=torch.long)
    labels = torch.full((len(examples), length), -100, dtype=torch.long)
    for i, (p, r) in enumerate(examples):
        n = len(p) + len(r)
        ids[i, :n] = torch.tensor(p + r)
        mask[i, :n] = 1
        labels[i, len(p) : n] = torch.tensor(r)
    return ids, mask, labels


@torch.no_grad()
def greedy_generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    questions: Sequence[str],
    max_new_tokens: int = 40,
    batch_size: int = 256,
) -> list[str]:
    """Greedy responses (special tokens stripped), batched with left padding."""
    was_training = model.training
    model.eval()
    pad = tokenizer.pad_token_id
    eos = tokenizer.eos_token_id
    assert isinstance(pad, int) and isinstance(eos, int)
    responses: list[str] = []
    for start in range(0, len(questions), batch_size):
        chunk = questions[start : start + batch_size]
        prompts = [
            tokenizer.encode(render_prompt(tokenizer, q), add_special_tokens=False) for q in chunk
        ]
        length = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), length), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, length - len(p) :] = torch.tensor(p)
            mask[i, length - len(p) :] = 1
        out = cast(Any, model).generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
        )
        responses.extend(tokenizer.batch_decode(out[:, length:], skip_special_tokens=True))
    model.train(was_training)
    return responses


def probe_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    max_new_tokens: int = 40,
) -> float:
    """Mean greedy accuracy on ``problems``."""
    responses = greedy_generate(model, tokenizer, [p.question for p in problems], max_new_tokens)
    scores = grade_many(responses, [p.answer for p in problems])
    return sum(scores) / max(len(scores), 1)


def _max_response_tokens(examples: Sequence[tuple[list[int], list[int]]]) -> int:
    return max(len(r) for _, r in examples)


def sft_train(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train: Sequence[Problem],
    cfg: SFTConfig,
    probe: Sequence[Problem] = (),
) -> SFTResult:
    """Train ``model`` in place; deterministic for a given ``cfg.seed`` and thread count."""
    t0 = time.perf_counter()
    examples = encode_examples(tokenizer, train)
    max_new = _max_response_tokens(examples) + 4
    pad = tokenizer.pad_token_id
    assert isinstance(pad, int)
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = _optimizer(model, cfg)
    batches = _batches(examples, cfg.batch_size, gen)
    probing = _Probing(cfg, probe, max_new)
    loss_value, step = float("nan"), 0
    model.train()
    while step < cfg.max_steps:
        loss_value = _train_step(model, opt, _collate(next(batches), pad), _lr_at(cfg, step))
        step += 1
        if probing.due(step) and probing.reached(model, tokenizer, step):
            break
    model.eval()
    return SFTResult(
        step,
        probing.accuracy,
        probing.reached_target,
        time.perf_counter() - t0,
        loss_value,
        probing.seconds,
        probing.history,
    )


def _optimizer(model: PreTrainedModel, cfg: SFTConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices (ndim >= 2) only."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        betas=(0.9, 0.98),
    )


def _lr_at(cfg: SFTConfig, step: int) -> float:
    """Linear warmup, then cosine to 10 % at max_steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(cfg.max_steps - cfg.warmup_steps, 1)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def _batches(
    examples: Sequence[tuple[list[int], list[int]]], batch_size: int, gen: torch.Generator
) -> Iterator[list[tuple[list[int], list[int]]]]:
    """Batches in a random order drawn from ``gen``, endlessly: a new permutation whenever the
    rest of the current one is shorter than a batch."""
    order = torch.randperm(len(examples), generator=gen)
    cursor = 0
    while True:
        if cursor + batch_size > len(order):
            order, cursor = torch.randperm(len(examples), generator=gen), 0
        yield [examples[int(i)] for i in order[cursor : cursor + batch_size]]
        cursor += batch_size


def _train_step(
    model: PreTrainedModel,
    opt: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    lr: float,
) -> float:
    """One optimizer step (gradients clipped to norm 1) at ``lr``; the batch's loss."""
    ids, mask, labels = batch
    for group in opt.param_groups:
        group["lr"] = lr
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss.detach())


class _Probing:
    """When to probe greedy accuracy during SFT, and what the probes found.

    Probing runs only with a target accuracy and probe problems: first at step 2 * eval_every,
    then every eval_every steps once accuracy is at least half the target (2 * eval_every
    before that).
    """

    def __init__(self, cfg: SFTConfig, problems: Sequence[Problem], max_new_tokens: int) -> None:
        self.target = cfg.target_accuracy
        self.eval_every = cfg.eval_every
        self.problems = problems
        self.max_new_tokens = max_new_tokens
        self.next_eval = 2 * cfg.eval_every
        self.accuracy: float | None = None
        self.reached_target = False
        self.seconds = 0.0
        self.history: list[tuple[int, float]] = []

    def due(self, step: int) -> bool:
        return self.target is not None and bool(self.problems) and step >= self.next_eval

    def reached(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, step: int
    ) -> bool:
        """Probe now; True once the target is reached (training stops)."""
        assert self.target is not None
        t_eval = time.perf_counter()
        acc = probe_accuracy(model, tokenizer, self.problems, self.max_new_tokens)
        self.seconds += time.perf_counter() - t_eval
        self.accuracy = acc
        self.history.append((step, acc))
        if acc >= self.target:
            self.reached_target = True
            return True
        near = acc >= 0.5 * self.target
        self.next_eval = step + (self.eval_every if near else 2 * self.eval_every)
        return False
