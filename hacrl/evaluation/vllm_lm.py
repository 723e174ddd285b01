"""lm-eval's `vllm` model, refusing prompts longer than the protocol's prompt budget.

vLLM allocates `max_model_len` = eval.vllm.max_prompt_tokens + the protocol's max_new_tokens
(`Backend.model_args`). lm-eval's `vllm` model cuts a longer prompt from the left to make it
fit (`maybe_truncate`, a log line), so the model would answer a question whose start it never
saw, and the hf backend, which has no such limit, would answer the whole one: the scores of the
two backends would differ for a reason no table shows. Here such an evaluation stops before
vLLM generates anything, with one line naming the benchmark, how many prompts are too long,
the longest, and the key to raise (`PromptBudgetError`); nothing is logged, and the same
command with the key raised evaluates (a job's rerun skips the training it finished).

The refusal itself (`budget_refusal`) imports nothing; the model class is made where a vllm
evaluation runs (lm-eval's vllm module imports vLLM).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from hacrl.core.errors import ConfigError

PROMPT_KEY = "eval.vllm.max_prompt_tokens"


class PromptBudgetError(ConfigError):
    """Prompts longer than eval.vllm.max_prompt_tokens: which benchmark, how many, the longest."""


def budget_refusal(prompt_tokens: Sequence[tuple[str, int, int]], max_model_len: int) -> str | None:
    """The refusal line for (task, prompt length, max new tokens) triples when any prompt
    and its response budget do not fit in `max_model_len`; None when all fit."""
    over: dict[str, list[int]] = defaultdict(list)
    total: dict[str, int] = defaultdict(int)
    budget = max_model_len
    for task, length, new_tokens in prompt_tokens:
        total[task] += 1
        if length + new_tokens > max_model_len:
            over[task].append(length)
            budget = min(budget, max_model_len - new_tokens)
    if not over:
        return None
    longest = max(max(lengths) for lengths in over.values())
    parts = "; ".join(f"{task.removeprefix('hacrl_')}: {len(lengths)} of {total[task]} prompts, "
                      f"the longest {max(lengths)} tokens" for task, lengths in sorted(over.items()))
    return (f"{PROMPT_KEY}={budget}: some prompts are longer, and vLLM would cut them from the "
            f"left ({parts}); set {PROMPT_KEY}={longest} or more")


@functools.cache
def budgeted_vllm_class() -> Any:
    """lm-eval's `VLLM`, whose `generate_until` first checks every prompt against
    `max_model_len` as lm-eval would cut it (same tokens, same response budget)."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.vllm_causallms import VLLM

    class BudgetedVLLM(VLLM):  # type: ignore[misc, valid-type]
        def generate_until(self, requests: list[Instance],
                           disable_tqdm: bool = False) -> list[str]:
            if requests:
                lengths = [len(t) for t in self.tok_encode([req.args[0] for req in requests])]
                triples = [(req.task_name or "?", length,
                            self.modify_gen_kwargs(dict(req.args[1]),
                                                   default_max_gen_toks=self.max_gen_toks)[2])
                           for req, length in zip(requests, lengths, strict=True)]
                if (line := budget_refusal(triples, int(self.max_length))) is not None:
                    raise PromptBudgetError(line)
            return list(super().generate_until(requests, disable_tqdm))

    return BudgetedVLLM


def make_vllm_lm(args: dict[str, Any]) -> Any:
    return budgeted_vllm_class().create_from_arg_obj(args)


__all__ = ["PromptBudgetError", "budget_refusal", "budgeted_vllm_class", "make_vllm_lm"]
