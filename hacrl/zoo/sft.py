"""Supervised fine-tuning of zoo models on the arithmetic train split.

The loss covers response tokens only: the prompt is the question rendered with the
model's own chat template, the response is the worked solution followed by EOS.
Training stops once greedy accuracy on a fixed probe set reaches a target; one run can
serve several targets (``sft_train_stages``), stopping once for each along the way.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from hacrl.data.arith import grade_many
from hacrl.data.problem import Problem
from hacrl.zoo.lean_decoder import lean_decoder, lean_generate

__all__ = [
    "SFTConfig",
    "SFTResult",
    "encode_examples",
    "greedy_generate",
    "probe_accuracy",
    "render_prompt",
    "sft_train",
    "sft_train_stages",
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


class _PaddedExamples:
    """Every example collated once, right-padded to the longest; a batch is then a row gather
    and a cut to the batch's longest example: the very tensors ``_collate`` would build for
    those rows, without rebuilding them from Python lists at every step."""

    def __init__(self, examples: Sequence[tuple[list[int], list[int]]], pad_id: int) -> None:
        self.ids, self.mask, self.labels = _collate(examples, pad_id)
        self.lengths = torch.tensor([len(p) + len(r) for p, r in examples])

    def __len__(self) -> int:
        return len(self.lengths)

    def batch(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        length = int(self.lengths[rows].max())
        return (
            self.ids[rows, :length].contiguous(),
            self.mask[rows, :length].contiguous(),
            self.labels[rows, :length].contiguous(),
        )


@torch.no_grad()
def greedy_generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    questions: Sequence[str],
    max_new_tokens: int = 40,
    batch_size: int = 256,
) -> list[str]:
    """Greedy responses (special tokens stripped), batched with left padding; `lean_generate`
    where it applies (the zoo's models on a CPU: `generate`'s tokens up to a near-tie)."""
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
        decoder = lean_decoder(model)
        if decoder is not None:
            new, _ = lean_generate(decoder, ids, mask, max_new_tokens=max_new_tokens, eos=[eos],
                                   pad_id=pad, greedy=True)
        else:
            new = cast(Any, model).generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=eos,
                pad_token_id=pad,
            )[:, length:]
        responses.extend(tokenizer.batch_decode(new, skip_special_tokens=True))
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


StopHook = Callable[[int, SFTResult], None]


def sft_train(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train: Sequence[Problem],
    cfg: SFTConfig,
    probe: Sequence[Problem] = (),
) -> SFTResult:
    """Train ``model`` in place; deterministic for a given ``cfg.seed`` and thread count."""
    return sft_train_stages(model, tokenizer, train, cfg, probe, [cfg.target_accuracy])[0]


def sft_train_stages(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train: Sequence[Problem],
    cfg: SFTConfig,
    probe: Sequence[Problem],
    targets: Sequence[float | None],
    on_stop: StopHook | None = None,
    on_probe: Callable[[int, float], None] | None = None,
) -> list[SFTResult]:
    """One SFT run standing in for ``sft_train`` runs with ``target_accuracy`` = each of
    ``targets`` (``cfg.target_accuracy`` is not used); a result per target.

    Probing only reads the weights and the data order comes from ``cfg.seed`` alone, so these
    runs share one trajectory up to where each stops: the run goes on until the last target
    stops, and ``on_stop(i, result)`` sees the model exactly as ``sft_train`` with target i
    would return it (same step, same weights, eval mode). A probe due for several targets at
    one step runs once. `on_probe(step, accuracy)` sees every probe (progress lines).
    """
    if not targets:
        raise ValueError("sft_train_stages needs at least one target")
    t0 = time.perf_counter()
    examples = encode_examples(tokenizer, train)
    pad = tokenizer.pad_token_id
    assert isinstance(pad, int)
    data = _PaddedExamples(examples, pad)
    stages = [_Probing(t, cfg.eval_every, probe) for t in targets]
    max_new = _max_response_tokens(examples) + 4
    opt = _optimizer(model, cfg)
    rows = _batch_rows(len(data), cfg.batch_size, torch.Generator().manual_seed(cfg.seed))
    results: dict[int, SFTResult] = {}

    def stop(i: int, step: int, loss: float) -> None:
        model.eval()
        results[i] = stages[i].result(step, loss, time.perf_counter() - t0)
        if on_stop is not None:
            on_stop(i, results[i])

    loss_value, step = float("nan"), 0
    model.train()
    while step < cfg.max_steps and len(results) < len(stages):
        loss_value = _train_step(model, opt, data.batch(next(rows)), _lr_at(cfg, step))
        step += 1
        due = [i for i, s in enumerate(stages) if i not in results and s.due(step)]
        if due:
            t_eval = time.perf_counter()
            acc = probe_accuracy(model, tokenizer, probe, max_new)
            seconds = time.perf_counter() - t_eval
            if on_probe is not None:
                on_probe(step, acc)
            for i in due:
                if stages[i].record(step, acc, seconds):
                    stop(i, step, loss_value)
            model.train()
    for i in range(len(stages)):
        if i not in results:  # max_steps reached first
            stop(i, step, loss_value)
    model.eval()
    return [results[i] for i in range(len(stages))]


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


def _batch_rows(n: int, batch_size: int, gen: torch.Generator) -> Iterator[torch.Tensor]:
    """Row indices of batches in a random order drawn from ``gen``, endlessly: a new
    permutation whenever the rest of the current one is shorter than a batch."""
    order = torch.randperm(n, generator=gen)
    cursor = 0
    while True:
        if cursor + batch_size > n:
            order, cursor = torch.randperm(n, generator=gen), 0
        yield order[cursor : cursor + batch_size]
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
    """When to probe greedy accuracy for one target, and what the probes found.

    Probing runs only with a target accuracy and probe problems: first at step 2 * eval_every,
    then every eval_every steps once accuracy is at least half the target (2 * eval_every
    before that).
    """

    def __init__(self, target: float | None, eval_every: int, problems: Sequence[Problem]) -> None:
        self.target = target
        self.eval_every = eval_every
        self.enabled = target is not None and bool(problems)
        self.next_eval = 2 * eval_every
        self.accuracy: float | None = None
        self.reached_target = False
        self.seconds = 0.0
        self.history: list[tuple[int, float]] = []

    def due(self, step: int) -> bool:
        return self.enabled and step >= self.next_eval

    def record(self, step: int, acc: float, seconds: float) -> bool:
        """Take the probe result at ``step``; True once the target is reached (stop here)."""
        assert self.target is not None
        self.seconds += seconds
        self.accuracy = acc
        self.history.append((step, acc))
        if acc >= self.target:
            self.reached_target = True
            return True
        near = acc >= 0.5 * self.target
        self.next_eval = step + (self.eval_every if near else 2 * self.eval_every)
        return False

    def result(self, step: int, loss: float, seconds: float) -> SFTResult:
        return SFTResult(
            step,
            self.accuracy,
            self.reached_target,
            seconds,
            loss,
            self.seconds,
            list(self.history),
        )
