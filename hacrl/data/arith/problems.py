"""Synthetic verifiable arithmetic problems with short worked solutions.

Five difficulty levels, ordered by how hard they are for a tiny model that writes
the answer left to right (on the built zoo, greedy accuracy is highest on levels
1-2 and falls through 3, 4 and 5):

1. two-digit + two-digit without any carry (``42+35``): digit-wise sums
2. two-digit + two-digit with a carry out of the ones only (``47+38``)
3. two-digit + two-digit with a three-digit result (``76+58``, ``64+45``)
4. two-digit - two-digit, possibly negative (``23-87``)
5. one-digit * two-digit, or a sum of three two-digit numbers (``7*46``, ``12+34+56``)

Every question string is assigned once and for all to a *train* pool (70 %) or a
*held-out* pool (30 %) by a hash of the string, so the training split and the
seven benchmarks are disjoint by construction (the smallest level spaces, 1980 and
1260 questions for levels 1 and 2, leave room for both). All splits are drawn with their
own string-seeded ``random.Random`` and do not touch the global RNG.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from hacrl.data.problem import Problem

__all__ = [
    "BENCHMARKS",
    "LEVELS",
    "SPLITS",
    "Problem",
    "SplitSpec",
    "is_heldout",
    "load_probe",
    "load_split",
    "make_problem",
    "write_split_jsonl",
]

LEVELS: tuple[int, ...] = (1, 2, 3, 4, 5)
HELDOUT_PERCENT = 30
_VERSION = "v1"


@dataclass(frozen=True)
class SplitSpec:
    """How a split is drawn: its size, allowed levels (with relative weights) and pool."""

    name: str
    size: int
    levels: tuple[int, ...]
    heldout: bool
    weights: tuple[float, ...] | None = None  # per level; None = equal


SPLITS: dict[str, SplitSpec] = {
    s.name: s
    for s in (
        SplitSpec("train", 5000, LEVELS, heldout=False, weights=(0.18, 0.16, 0.22, 0.22, 0.22)),
        # benchmark sizes: large enough that AVG's standard error over problems is <= 0.5
        # points for every zoo agent (one greedy sample per problem; AIME2025 is sampled 16
        # times, so fewer problems carry its share); GSM8K leans to level 1 because the
        # held-out pool has only 615 level-1 and 409 level-2 questions
        SplitSpec("tiny_math500", 1300, LEVELS, heldout=True),
        SplitSpec("tiny_math", 1300, LEVELS, heldout=True),
        SplitSpec("tiny_gsm8k", 900, (1, 2), heldout=True, weights=(0.6, 0.4)),
        SplitSpec("tiny_aime2025", 200, (5,), heldout=True),
        SplitSpec("tiny_amc23", 1000, (4, 5), heldout=True),
        SplitSpec("tiny_minerva", 1300, (3, 4, 5), heldout=True),
        SplitSpec("tiny_olympiad", 1300, (3, 4, 5), heldout=True),
    )
}

BENCHMARKS: tuple[str, ...] = (
    "tiny_math500",
    "tiny_math",
    "tiny_gsm8k",
    "tiny_aime2025",
    "tiny_amc23",
    "tiny_minerva",
    "tiny_olympiad",
)

# Probe set used to decide when SFT stops: train-pool questions not in ``train``.
_PROBE_SPEC = SplitSpec("probe", 200, LEVELS, heldout=False)


def _draw_level(level: int, rng: random.Random) -> str:
    """Draw one expression (e.g. ``"47+38"``) of the given level."""
    r = rng.randint
    if level in (1, 2, 3):
        while True:
            a, b = r(10, 99), r(10, 99)
            ones_carry = a % 10 + b % 10 >= 10
            if level == 1 and not ones_carry and a + b < 100:
                return f"{a}+{b}"
            if level == 2 and ones_carry and a + b < 100:
                return f"{a}+{b}"
            if level == 3 and a + b >= 100:
                return f"{a}+{b}"
    if level == 4:
        return f"{r(10, 99)}-{r(10, 99)}"
    if level == 5:
        if rng.random() < 0.5:
            a, b = r(2, 9), r(10, 99)
            return f"{a}*{b}" if rng.random() < 0.5 else f"{b}*{a}"
        return f"{r(10, 99)}+{r(10, 99)}+{r(10, 99)}"
    raise ValueError(f"level must be one of {LEVELS}, got {level}")


def _evaluate(expr: str) -> int:
    """Value of an expression made of integers joined by ``+``, ``-`` or ``*`` (no precedence mix)."""
    if "*" in expr:
        a, b = expr.split("*")
        return int(a) * int(b)
    if "-" in expr:
        a, b = expr.split("-")
        return int(a) - int(b)
    return sum(int(t) for t in expr.split("+"))


def make_problem(uid: str, expr: str, level: int) -> Problem:
    """Build the problem for an expression such as ``"47+38"``."""
    ans = str(_evaluate(expr))
    return Problem(
        uid=uid,
        question=f"What is {expr}?",
        answer=ans,
        level=level,
        solution=f"{expr}={ans}. \\boxed{{{ans}}}",
    )


def is_heldout(question: str) -> bool:
    """Whether a question string belongs to the held-out (benchmark) pool."""
    digest = hashlib.blake2b(question.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 100 < HELDOUT_PERCENT


def _level_quotas(spec: SplitSpec) -> list[int]:
    """Problems per level (largest-remainder rounding of the weights)."""
    weights = spec.weights or tuple(1.0 for _ in spec.levels)
    total = sum(weights)
    raw = [spec.size * w / total for w in weights]
    quotas = [int(x) for x in raw]
    order = sorted(range(len(raw)), key=lambda i: (quotas[i] - raw[i], i))
    for i in order[: spec.size - sum(quotas)]:
        quotas[i] += 1
    return quotas


def _draw_split(spec: SplitSpec, exclude: frozenset[str] = frozenset()) -> tuple[Problem, ...]:
    # the seed string keeps the package's old name: the splits (and their pinned sha256) are unchanged
    rng = random.Random(f"hacrl.task/{_VERSION}/{spec.name}")
    exprs: list[tuple[str, int]] = []
    seen: set[str] = set()
    for level, quota in zip(spec.levels, _level_quotas(spec), strict=True):
        got, attempts = 0, 0
        while got < quota:
            attempts += 1
            if attempts > 200 * quota + 10_000:
                raise RuntimeError(f"cannot draw {quota} level-{level} problems for {spec.name}")
            expr = _draw_level(level, rng)
            question = f"What is {expr}?"
            if question in seen or question in exclude or is_heldout(question) != spec.heldout:
                continue
            seen.add(question)
            exprs.append((expr, level))
            got += 1
    rng.shuffle(exprs)
    return tuple(
        make_problem(f"{spec.name}-{i:05d}", expr, level) for i, (expr, level) in enumerate(exprs)
    )


@cache
def _cached_split(name: str) -> tuple[Problem, ...]:
    if name == _PROBE_SPEC.name:
        train = frozenset(p.question for p in _cached_split("train"))
        return _draw_split(_PROBE_SPEC, exclude=train)
    return _draw_split(SPLITS[name])


def load_split(name: str) -> list[Problem]:
    """Problems of a split (``train`` or one of ``BENCHMARKS``); deterministic and cached."""
    if name not in SPLITS:
        raise ValueError(f"unknown split {name!r}; valid splits: {', '.join(SPLITS)}")
    return list(_cached_split(name))


def load_probe() -> list[Problem]:
    """200 train-distribution problems, disjoint from ``train`` and from the benchmarks.

    Used by SFT to decide when a zoo model has reached its target accuracy.
    """
    return list(_cached_split(_PROBE_SPEC.name))


def write_split_jsonl(name: str, path: str | Path) -> Path:
    """Write a split as JSON lines with fields uid, problem, answer, level, solution."""
    problems = load_split(name)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for p in problems:
            row = {
                "uid": p.uid,
                "problem": p.question,
                "answer": p.answer,
                "level": p.level,
                "solution": p.solution,
            }
            f.write(json.dumps(row) + "\n")
    return out
