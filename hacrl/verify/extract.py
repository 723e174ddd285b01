"""Final-answer extraction from a model response.

Both functions are total (never raise on a ``str``) and cost time linear in the length of the
response: the box search is one pass over regex tokens with a stack of open braces, and the
phrase fallbacks only look at a bounded tail of the text, so a megabyte response or 10^5 nested
braces costs a few milliseconds, never a backtracking blow-up.
"""

from __future__ import annotations

import re

__all__ = ["TAIL_CHARS", "extract_answer", "extract_boxed"]

TAIL_CHARS = 4000  # the phrase fallbacks read only this many trailing characters

# One token per structural event. Order matters: `\\` (a LaTeX line break) and the escaped
# braces `\{`, `\}` are consumed first so that they never count as grouping braces.
_TOKENS = re.compile(r"\\\\|\\[{}]|\\(?:boxed|fbox)\s*\{|[{}]")
# `\boxed 5`: the space form takes one run of non-space characters (no braces, no `$`).
_SPACE_BOX = re.compile(r"\\boxed +([^\s${}]+)")
# Markers only: the answer is the rest of the line after the *last* marker, so that "the answer
# is 1. Actually, the answer is 2." gives 2.
_PHRASE = re.compile(r"(?:final answer is|the answer is|answer[ \t]*:)[ \t:]*", re.IGNORECASE)
_GSM8K = re.compile(r"####[ \t]*")


def _last_brace_box(text: str) -> tuple[int, str] | None:
    """(start, content) of the last-starting `\\boxed{...}`/`\\fbox{...}` whose braces close."""
    if "\\boxed" not in text and "\\fbox" not in text:
        return None
    stack: list[tuple[int, int]] = []  # (content_start, box_start or -1 for a plain brace)
    best: tuple[int, int, int] | None = None  # (box_start, content_start, content_end)
    for match in _TOKENS.finditer(text):
        tok = match.group()
        if tok[0] == "\\" and len(tok) == 2:
            continue  # `\\`, `\{` or `\}`: not structural
        if tok == "}":
            if not stack:
                continue  # stray closing brace outside any group
            content_start, box_start = stack.pop()
            if box_start >= 0 and (best is None or box_start > best[0]):
                best = (box_start, content_start, match.start())
        elif tok == "{":
            stack.append((match.end(), -1))
        else:
            stack.append((match.end(), match.start()))
    if best is None:
        return None
    return best[0], text[best[1] : best[2]]


def extract_boxed(text: str) -> str | None:
    """Content of the last balanced ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``.

    Nested braces are kept (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``); among several boxes
    the one that starts last and closes wins, so a truncated final box falls back to an earlier
    complete one. The space form ``\\boxed 5`` counts too when it comes after every closed box.
    None when there is no box.
    """
    if not isinstance(text, str):
        return None
    braced = _last_brace_box(text)
    spaced: tuple[int, str] | None = None
    if "\\boxed " in text:
        for m in _SPACE_BOX.finditer(text):
            spaced = (m.start(), m.group(1))
    candidates = [c for c in (braced, spaced) if c is not None]
    if not candidates:
        return None
    return max(candidates, key=lambda c: c[0])[1].strip()


def _clean(answer: str) -> str:
    """Strip markdown bold, math delimiters and a trailing period around a phrase answer."""
    s = answer.strip().strip("*").strip()
    for left, right in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            s = s[len(left) : len(s) - len(right)].strip()
    s = s.strip("$").strip()
    while s.endswith("."):
        s = s[:-1].rstrip()
    return s.strip("$").strip()


def extract_answer(text: str) -> str | None:
    """The response's final answer: the last box, else a phrase in the tail of the text.

    Fallbacks, tried in order on the last `TAIL_CHARS` characters only: the last "final answer
    is X" / "the answer is X" / "Answer: X" (X runs to the end of its line), then the last
    GSM8K-style "#### X". Surrounding ``$`` and a trailing period are stripped. None when no
    rule finds a non-empty answer.
    """
    if not isinstance(text, str):
        return None
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    tail = text[-TAIL_CHARS:]
    for pattern in (_PHRASE, _GSM8K):
        last = None
        for m in pattern.finditer(tail):
            last = m
        if last is not None:
            end = tail.find("\n", last.end())
            got = _clean(tail[last.end() : end if end >= 0 else len(tail)])
            if got:
                return got
    return None
