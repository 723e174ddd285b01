"""Is a predicted final answer mathematically equal to the reference? Fast paths, then math-verify.

Why no model text is ever executed (math-verify 0.9.0, latex2sympy2_extended 1.11.0, sympy 1.14):

* math-verify has two parsers. `ExprExtractionConfig` calls sympy's `parse_expr` on the raw
  text (math_verify/parser.py, `parse_expr_cached`), which is Python `eval`; it is never used
  here. Only `LatexExtractionConfig` is: its text goes through regex extraction, string
  normalisation and latex2sympy's ANTLR grammar, which builds sympy objects by calling
  constructors, not by evaluating source.
* latex2sympy2.py calls `parse_expr` only for `variable_values` (`_Latex2Sympy.__init__`), which
  math-verify never passes; logic.py (`And`) and sets.py (`FiniteSet`) call `sympify` on
  objects the converter already built, which returns them unchanged.
* One string does reach `sympify`: `parse_number` passes a lexer NUMBER token (digits only) to
  `sympy.Number(text)`. `tripwire` accepts exactly the two code shapes that produces and builds
  the number without `eval`; any other attempt raises `UnsafeEvaluation`, and the grade is 0.

The tripwire is permanent in grading worker processes and armed around the call when
`equivalent` runs in the calling process. The cheap exact cases (equal normalised strings, plain
integers, plain decimals) are decided here without math-verify at all.
"""

from __future__ import annotations

import logging
import re
from fractions import Fraction
from functools import lru_cache
from typing import Any

from hacrl.verify.normalize import exact_match
from hacrl.verify.tripwire import UnsafeEvaluation, armed

__all__ = ["MAX_ANSWER_CHARS", "cheap_verdict", "fast_equivalent", "load_math_verify",
           "math_verify_equal"]

MAX_ANSWER_CHARS = 1000  # longer answers are judged by normalised exact match only

# Thousands separators only in the strict `1,234,567` form; `1,2` is a list, not a number.
_PLAIN_INT = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)")
_PLAIN_DEC = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d*)?")


def _canonical_int(s: str) -> str:
    """`+0,012` -> `12`, `-0` -> `0`; string-only so that 10^5-digit answers cost nothing."""
    negative = s.startswith("-")
    digits = s.lstrip("+-").replace(",", "").lstrip("0") or "0"
    return "-" + digits if negative and digits != "0" else digits


def _plain(s: str) -> str:
    return s.strip().strip("$").strip()


def fast_equivalent(pred: str, gold: str) -> bool | None:
    """Decide the cheap cases: True/False when certain, None when math-verify must look.

    Equal normalised strings are equal; two plain integers compare exactly (that answer is
    final); two plain decimals that are equal as fractions are equal (unequal ones go on to
    math-verify, whose numeric comparison tolerates rounding).
    """
    if exact_match(pred, gold):
        return True
    p, g = _plain(pred), _plain(gold)
    if _PLAIN_INT.fullmatch(p) and _PLAIN_INT.fullmatch(g):
        return _canonical_int(p) == _canonical_int(g)
    numeric = all(_PLAIN_DEC.fullmatch(x) and any(c.isdigit() for c in x) for x in (p, g))
    if numeric:
        try:
            if Fraction(p.replace(",", "")) == Fraction(g.replace(",", "")):
                return True
        except (ValueError, ZeroDivisionError):
            pass  # e.g. beyond int()'s digit limit: let math-verify (or its timeout) decide
    return None


@lru_cache(maxsize=1)
def load_math_verify() -> tuple[Any, Any, list[Any]]:
    """Import math-verify once: (parse, verify, LaTeX-only extraction config)."""
    from math_verify import LatexExtractionConfig, parse, verify

    # Timeouts are ours (a killable worker per grade), so math-verify's signal-based ones are
    # off; it logs a warning about that on every first call, which is noise here.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return parse, verify, [LatexExtractionConfig()]


def _as_latex(answer: str) -> str:
    """Wrap an extracted answer as inline math for the LaTeX extractor."""
    return "$" + answer.replace("\\$", "").replace("$", "") + "$"


def math_verify_equal(pred: str, gold: str) -> bool:
    """math-verify's verdict through its LaTeX path only (no time bound, no guard of its own).

    Callers arm the tripwire (`tripwire.armed` or `tripwire.install`); an `UnsafeEvaluation`
    raised inside propagates to them.
    """
    parse, verify, config = load_math_verify()
    gold_parsed = parse(_as_latex(gold), extraction_config=config, parsing_timeout=None)
    pred_parsed = parse(_as_latex(pred), extraction_config=config, parsing_timeout=None)
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def cheap_verdict(pred: object, gold: object, max_chars: int) -> bool | None:
    """The verdict when math-verify is not needed: non-strings and empty answers are False,
    then the fast paths, then answers longer than `max_chars` by normalised exact match;
    None: ask math-verify."""
    if not isinstance(pred, str) or not isinstance(gold, str):
        return False
    if not _plain(pred) or not _plain(gold):
        return False  # no answer, or no reference: never a match (not even "" to "")
    fast = fast_equivalent(pred, gold)
    if fast is not None:
        return fast
    if len(pred) > max_chars or len(gold) > max_chars:
        return False  # normalised strings differ (fast path above), so exact match failed
    return None


def _equivalent_in_process(pred: str, gold: str, max_chars: int = MAX_ANSWER_CHARS) -> bool:
    """Whether answer `pred` equals reference `gold`, graded in this process (private: the
    public `hacrl.verify.equivalent` runs math-verify in a bounded worker instead).

    Fast paths first; answers longer than `max_chars` are judged by normalised exact match; the
    rest go to math-verify with the tripwire armed (a refused evaluation grades False). There is
    no time bound here: untrusted text in bulk belongs in `Verifier`, which grades in killable
    worker processes.
    """
    settled = cheap_verdict(pred, gold, max_chars)
    if settled is not None:
        return settled
    try:
        with armed():
            return math_verify_equal(pred, gold)
    except UnsafeEvaluation:
        return False
    except Exception:
        return False
