"""Hendrycks-style answer normalisation and the normalised exact-match metric.

The MATH benchmark (Hendrycks et al., 2021) compares answers after a fixed string clean-up; this
module applies the same idea so that exact match is comparable with published numbers. It is
pure string code on an input truncated to `MAX_CHARS`, so its cost is bounded for any input.
"""

from __future__ import annotations

import re

__all__ = ["MAX_CHARS", "exact_match", "normalize_math_string"]

MAX_CHARS = 10_000

_TRAILING_TEXT = re.compile(r"\\(?:text|mbox|textbf|mathrm)\{([^{}]*)\}$")
_SQRT_BARE = re.compile(r"\\sqrt(\w)")
_FRAC_BARE = re.compile(r"\\frac(?:(\d)(\d)|(\d)(\{)|(\{[^{}]*\})(\d))")
_INT_RATIO = re.compile(r"(-?\d+)/(\d+)")
_LEADING_DOT = re.compile(r"(^|[\s{(\[=,+-])\.(\d)")


def _strip_trailing_units(s: str) -> str:
    """Drop `\\text{...}` groups at the end (units), keeping a lone one's content (`\\text{east}`)."""
    while True:
        m = _TRAILING_TEXT.search(s)
        if m is None:
            return s
        head = s[: m.start()].rstrip()
        if not head:
            return m.group(1)
        s = head


def _fix_fracs(s: str) -> str:
    """Brace the arguments of `\\frac12`-style fractions: `\\frac12` -> `\\frac{1}{2}`."""

    def brace(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}"
        if m.group(3) is not None:
            return f"\\frac{{{m.group(3)}}}{{"
        return f"\\frac{m.group(5)}{{{m.group(6)}}}"

    return _FRAC_BARE.sub(brace, s)


def normalize_math_string(s: str) -> str:
    """Canonical string form of a final answer (the MATH benchmark's clean-up, plus a little).

    Drops line breaks, `\\!`, `\\left`/`\\right`, degrees, dollar signs, percent signs, trailing
    units in `\\text{...}` and all spaces; writes `\\tfrac`/`\\dfrac` as `\\frac`, braces bare
    `\\frac12` and `\\sqrt3`, turns an integer ratio `a/b` into `\\frac{a}{b}`, writes `.5` as
    `0.5`, keeps only the right side of a short assignment (`x = 5` -> `5`) and maps `0.5` to
    `\\frac{1}{2}` (the benchmark's classic special case).
    """
    if not isinstance(s, str):
        return ""
    s = s[:MAX_CHARS]
    s = s.replace("\r", "").replace("\n", "").replace("\\!", "")
    s = s.replace("\\\\", "\\")
    s = s.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac")
    s = s.replace("\\left", "").replace("\\right", "").replace("\\displaystyle", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    s = s.replace("\\%", "").replace("%", "")
    s = s.strip()
    s = _strip_trailing_units(s).strip()
    s = _LEADING_DOT.sub(r"\g<1>0.\2", s)
    # A short left-hand side (`x = 5`, `k=3`) names the answer rather than being part of it.
    if s.count("=") == 1:
        lhs, rhs = s.split("=")
        if len(lhs.strip()) <= 2 and rhs.strip():
            s = rhs
    s = _SQRT_BARE.sub(r"\\sqrt{\1}", s)
    s = s.replace(" ", "").replace("\t", "").replace("\\,", "").replace("\\;", "")
    s = _fix_fracs(s)
    while s.endswith(".") and len(s) > 1:
        s = s[:-1]
    if s == "0.5":
        s = "\\frac{1}{2}"
    m = _INT_RATIO.fullmatch(s)
    if m is not None:
        s = f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}"
    return s


def exact_match(pred: str | None, gold: str) -> bool:
    """Normalised exact match of a predicted final answer against the reference answer.

    Beyond `MAX_CHARS` only identical strings match: normalisation reads a truncated copy, and
    `5` followed by 10k spaces and then garbage must not pass as `5`.
    """
    if pred is None or not isinstance(gold, str) or not isinstance(pred, str):
        return False
    if len(pred) > MAX_CHARS or len(gold) > MAX_CHARS:
        return pred == gold
    return normalize_math_string(pred) == normalize_math_string(gold)
