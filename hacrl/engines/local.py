"""Local engine: a Hugging Face causal LM in this process, on CPU or one GPU.

Sampling uses `generate` (batched, KV cache, left padding); log-probs and updates use forward
passes over right-padded prompt+response rows; AdamW with gradient clipping.

Row batches are sized for the hardware: generation wants many rows per forward (its per-token
cost is mostly fixed), while a log-prob or update forward of small models on a CPU is memory
bound and runs fastest when a batch's activations stay in the core's cache, so it goes
`forward_rows` rows at a time (measured on the tiny zoo, 2-core Xeon: 32-row forwards are ~1.4x
faster for log-probs and ~1.15x for updates than 256-512-row ones), rows of about the same
length together. Log-probs equal the one-pass ones up to float rounding (bit-identical on that
Xeon; within ~2e-6 on an AMD EPYC, whose BLAS rounds differently by row count); an update's
gradient is accumulated over the row batches with each row's exact share of the loss, equal to
the one-pass gradient up to float rounding.

For the zoo's models on a CPU a forward computes each distinct prompt of its rows once
(`hacrl.engines.prompt_sharing`; the rows of one prompt batched together): a step's rows are G
samples of each prompt (and the partners' samples of the same prompts), so this does ~half the
work of whole prompt + response rows, ~1.35-1.55x faster (`scripts/bench_prompt_sharing.py`),
with the same log-probs and gradients up to float rounding (~1e-5); its forwards take 64 rows
(`CPU_SHARED_FORWARD_ROWS`).

The old log-probs of an agent's own rows come from its sampler (`engine.old_logprobs=sampler`):
`generate` has computed every sampled token's logits already with the same weights, so a second
forward over those rows would only repeat that work up to float rounding (|diff| ~1e-5).
`recompute` runs that forward, as before the choice existed (and keeps those runs' hashes).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from hacrl.algo import Denominators, LossBatch
from hacrl.algo.metrics import add_micro_batch
from hacrl.algo.rollout import SamplingParams, TokenView, eos_id
from hacrl.checkpoint.pickle_audit import safe_torch_load
from hacrl.config import OLD_LOGPROBS, ConfigError
from hacrl.config.settings import OptimizerSettings
from hacrl.engines.attention import use_decode_attention
from hacrl.engines.base import Engine, Generation, MiniBatchLoss, register_engine
from hacrl.engines.memory import peak_memory_metrics
from hacrl.engines.prompt_sharing import by_prompt, prompt_sharing_applies, prompt_sharing_logprobs
from hacrl.engines.sampling import hf_sample
from hacrl.schema import metric_names as M

hf_logging.disable_progress_bar()  # per-load bars would bury the training progress bar


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


CPU_FORWARD_ROWS = 32
# with prompt sharing a row costs about half as much, and the tiny zoo's 64-row update
# mini-batches go ~1.1x faster in one forward than in two 32-row ones (`hacrl bench step`)
CPU_SHARED_FORWARD_ROWS = 64


def resolve_forward_rows(value: int | str | None, device: torch.device,
                         shares_prompts: bool = False) -> int | None:
    """`engine.forward_rows`: rows per log-prob / update forward; None means all at once.

    auto: on a CPU cache-sized batches (CPU_FORWARD_ROWS, or CPU_SHARED_FORWARD_ROWS where the
    forwards share prompts), all at once on a GPU.
    """
    if value in (None, "auto"):
        if device.type != "cpu":
            return None
        return CPU_SHARED_FORWARD_ROWS if shares_prompts else CPU_FORWARD_ROWS
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"engine.forward_rows={value!r}: must be a positive integer or auto")
    return value


def by_length(views: list[TokenView]) -> list[int]:
    """Row indices, shortest prompt + response first: the rows batched together have nearly
    the same length, so a forward pads (and computes) almost nothing past their ends."""
    return sorted(range(len(views)), key=lambda i: len(views[i].prompt_ids)
                  + len(views[i].response_ids))


@register_engine("local")
class LocalEngine(Engine):
    def __init__(self, model_path: str, *, optimizer: OptimizerSettings, device: str = "auto",
                 dtype: str = "float32", reference: bool = False, temperature: float = 1.0,
                 micro_batch_rows: int | None = None, chunk_rows: int = 512,
                 forward_rows: int | str | None = "auto", old_logprobs: str = "sampler",
                 context: Any = None) -> None:  # context: the job's, not needed here
        if old_logprobs not in OLD_LOGPROBS:
            raise ConfigError(f"engine.old_logprobs={old_logprobs!r}: use "
                              f"{' or '.join(OLD_LOGPROBS)}")
        self.old_logprobs = old_logprobs
        self.device = pick_device(device)
        self.model_path = model_path
        self.tokenizer: Any = AutoTokenizer.from_pretrained(model_path)
        model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
        self.model: Any = model.to(self.device)
        self.forward_rows = resolve_forward_rows(forward_rows, self.device,
                                                 prompt_sharing_applies(self.model, training=True))
        use_decode_attention(self.model, self.device)
        self.model.generation_config.pad_token_id = self.pad_id
        self.reference = copy.deepcopy(self.model).eval().requires_grad_(False) if reference else None
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=optimizer.lr,
                                           betas=optimizer.betas,
                                           weight_decay=optimizer.weight_decay)
        self.grad_clip = optimizer.grad_clip
        self.temperature = temperature
        self.micro_batch_rows = micro_batch_rows
        self.chunk_rows = chunk_rows

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad) if pad is not None else eos_id(self.tokenizer)

    # -- sampling ---------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int,
                 sampling: SamplingParams) -> list[list[Generation]]:
        self.model.eval()
        rows = [ids for ids in prompt_ids for _ in range(n)]
        out: list[Generation] = []
        for start in range(0, len(rows), self.chunk_rows):
            out.extend(self._generate_chunk(rows[start:start + self.chunk_rows], sampling))
        return [out[p * n:(p + 1) * n] for p in range(len(prompt_ids))]

    def _generate_chunk(self, rows: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        # the sampler's log-probs are the own rows' old log-probs: no second forward over them
        temperature = self.temperature if self.old_logprobs == "sampler" else None
        return hf_sample(self.model, rows, sampling, pad_id=self.pad_id,
                         eos=eos_id(self.tokenizer), device=self.device,
                         logprobs_temperature=temperature)

    # -- log-probs ----------------------------------------------------------------------------
    def _row_order(self, views: list[TokenView]) -> list[int]:
        """The order rows are batched in: by prompt where each forward computes its distinct
        prompts once (`hacrl.engines.prompt_sharing`), else by length (least padding)."""
        return by_prompt(views) if prompt_sharing_applies(self.model) else by_length(views)

    def _response_logprobs(self, model: torch.nn.Module, views: list[TokenView],
                           width_t: int) -> Tensor:
        """[B, width_t] log-probs of each view's response tokens (0 past a response's end)."""
        shared = prompt_sharing_logprobs(model, views, width_t, self.temperature, self.pad_id)
        if shared is not None:  # the zoo's models on a CPU: each distinct prompt once
            return shared
        seqs = [list(v.prompt_ids) + list(v.response_ids) for v in views]
        length = max(len(s) for s in seqs)
        input_ids = torch.full((len(seqs), length), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(seqs), length), dtype=torch.long)
        for b, s in enumerate(seqs):
            input_ids[b, :len(s)] = torch.tensor(s)
            attention[b, :len(s)] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        prompt_len = torch.tensor([len(v.prompt_ids) for v in views], device=self.device)
        resp_len = torch.tensor([len(v.response_ids) for v in views], device=self.device)
        logits = model(input_ids=input_ids, attention_mask=attention).logits
        steps = torch.arange(width_t, device=self.device)
        # response token t sits at prompt_len + t and is predicted from position prompt_len + t - 1
        pos = (prompt_len[:, None] - 1 + steps[None]).clamp(max=length - 2)
        picked = logits.gather(1, pos[..., None].expand(-1, -1, logits.shape[-1])).float()
        picked = picked / self.temperature
        targets = input_ids.gather(1, pos + 1)
        logp = torch.log_softmax(picked, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
        return logp * (steps[None] < resp_len[:, None])

    @torch.no_grad()
    def log_probs(self, views: list[TokenView], reference: bool = False) -> list[Tensor]:
        model = self.reference if reference else self.model
        if model is None:
            raise RuntimeError("no reference policy: build the engine with reference=True")
        model.eval()
        out: list[Tensor | None] = [None] * len(views)
        rows = self.forward_rows or self.chunk_rows
        order = self._row_order(views)
        for start in range(0, len(views), rows):
            index = order[start:start + rows]
            chunk = [views[i] for i in index]
            width_t = max(1, max(len(v.response_ids) for v in chunk))
            logp = self._response_logprobs(model, chunk, width_t).cpu()
            for b, i in enumerate(index):
                out[i] = logp[b, :len(views[i].response_ids)]
        return cast(list[Tensor], out)

    # -- training -----------------------------------------------------------------------------
    def train_minibatch(self, views: list[TokenView], batch: LossBatch,
                        loss_fn: MiniBatchLoss) -> dict[str, float]:
        self.model.train()
        rows = len(views)
        step = min(self.micro_batch_rows or rows, self.forward_rows or rows)
        # micro-batches (gradient accumulation) each add their exact share of the loss
        shares = Denominators.of(batch) if step < rows else None
        totals: dict[str, float] = {}
        order = self._row_order(views) if step < rows else list(range(rows))
        for start in range(0, rows, step):
            index = torch.tensor(order[start:start + step])
            micro = batch.select(index).to(self.device)
            logp = self._response_logprobs(self.model, [views[i] for i in index.tolist()],
                                           micro.response_mask.shape[1])
            out = loss_fn(logp, micro, denominators=shares)
            out.loss.backward()
            # by each metric's declared kind: shares add up, row means are row-weighted
            add_micro_batch(totals, out.metrics, out.kinds, len(index), rows)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        totals[M.GRAD_NORM] = float(grad_norm)
        return totals

    # -- state --------------------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory / "model")
        self.tokenizer.save_pretrained(directory / "model")
        torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")

    def load(self, directory: Path) -> None:
        loaded = AutoModelForCausalLM.from_pretrained(directory / "model",
                                                      dtype=next(self.model.parameters()).dtype)
        self.model.load_state_dict(loaded.state_dict())
        self.optimizer.load_state_dict(safe_torch_load(directory / "optimizer.pt"))

    def memory_metrics(self) -> dict[str, float]:
        return peak_memory_metrics(self.device)
