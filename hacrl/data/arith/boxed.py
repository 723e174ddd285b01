"""Boxed-answer verifier for the synthetic arithmetic task.

Both functions are total: they never raise on any ``str`` input and run in time
linear in the length of the response.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["extract_boxed", "normalize_answer", "grade", "grade_many"]

_BOXED = "\\boxed{"
_TOKENS = re.compile(r"\\boxed\{|[{}]")
_INT = re.compile(r"[+-]?[0-9]+")
_WS = re.compile(r"\s+")


def extract_boxed(text: str) -> str | None:
    """Content of the last balanced ``\\boxed{...}`` in ``text``.

    Nested braces inside the box are kept (``\\boxed{\\frac{1}{2}}`` gives
    ``\\frac{1}{2}``). Among several boxes, the one that starts last and whose
    braces close is used, so a truncated trailing box falls back to an earlier
    complete one. Returns None when there is no balanced box.
    """
    if not isinstance(text, str):
        return None
    first = text.find(_BOXED)
    if first < 0:
        return None
    # Stack of (content_start, is_box) for every open brace seen so far.
    stack: list[tuple[int, bool]] = []
    best: tuple[int, int] | None = None
    for match in _TOKENS.finditer(text, first):
        tok = match.group()
        if tok == "}":
            if not stack:
                continue  # stray closing brace outside any group
            start, is_box = stack.pop()
            if is_box and (best is None or start > best[0]):
                best = (start, match.start())
        else:
            stack.append((match.end(), tok != "{"))
    if best is None:
        return None
    return text[best[0] : best[1]]


def normalize_answer(answer: str) -> str:
    """Remove all whitespace; write integers canonically (``+05`` -> ``5``, ``-0`` -> ``0``)."""
    s = _WS.sub("", answer)
    if _INT.fullmatch(s):
        negative = s[0] == "-"
        digits = s.lstrip("+-").lstrip("0") or "0"
        return "-" + digits if negative and digits != "0" else digits
    return s


def grade(response: str, answer: str) -> float:
    """1.0 if the boxed answer in ``response`` equals ``answer`` after normalisation, else 0.0."""
    if not isinstance(response, str) or not isinstance(answer, str):
        return 0.0
    got = extract_boxed(response)
    if got is None:
        return 0.0
    return 1.0 if normalize_answer(got) == normalize_answer(answer) else 0.0


def grade_many(responses: Sequence[str], answers: Sequence[str]) -> list[float]:
    """Grade each response against the answer at the same position."""
    if len(responses) != len(answers):
        raise ValueError(f"{len(responses)} responses but {len(answers)} answers")
    return [grade(r, a) for r, a in zip(responses, answers, strict=True)]
