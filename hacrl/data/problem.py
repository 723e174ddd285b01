"""`Problem`: one training or evaluation prompt with its verified answer, whatever task made it
(the synthetic arithmetic of `hacrl.data.arith`, or MATH and the benchmarks read by
`hacrl.data.read`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One problem; ``solution`` is a target response ending in ``\\boxed{answer}``."""

    uid: str
    question: str
    answer: str
    level: int  # difficulty level
    solution: str
