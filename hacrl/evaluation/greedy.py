"""Greedy accuracy of one agent on a split: in-loop validation and end-of-training evaluation.

This is the fast built-in path used at every scale during training; the lm-eval path with the
hardened verifier (evaluation issue) reports the published benchmarks.
"""

from __future__ import annotations

from collections.abc import Sequence

from hacrl.algo.rollout import ChatTokenizer, SamplingParams, render_prompt_ids
from hacrl.data.problem import Problem
from hacrl.data.tasks import Grader
from hacrl.engines.base import Engine


def render_prompts(tokenizer: ChatTokenizer, problems: Sequence[Problem],
                   template: str) -> list[list[int]]:
    """Each problem as the agent sees it: the template filled in, its own chat template."""
    return [render_prompt_ids(tokenizer,
                              [{"role": "user", "content": template.format(question=p.question)}])
            for p in problems]


def greedy_accuracy(engine: Engine, problems: Sequence[Problem], template: str,
                    max_new_tokens: int, grade: Grader,
                    prompts: Sequence[list[int]] | None = None) -> float:
    """Fraction of problems whose greedy response the verifier accepts.

    `prompts`: the problems already rendered for this engine's tokenizer (`render_prompts`);
    validation renders them once per agent instead of at every validation.
    """
    if not problems:
        return 0.0
    if prompts is None:
        prompts = render_prompts(engine.tokenizer, problems, template)
    groups = engine.generate(list(prompts), 1,
                             SamplingParams(max_new_tokens=max_new_tokens, greedy=True))
    texts = [engine.decode(group[0].token_ids) for group in groups]
    scores = grade(texts, [p.answer for p in problems])
    return sum(scores) / len(scores)
