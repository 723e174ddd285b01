"""Runtime guard: sympy never evaluates Python source while grading.

`sympy.sympify(str)` and `sympy.parsing.sympy_parser.parse_expr` both end in one function,
`sympy.parsing.sympy_parser.eval_expr(code, local_dict, global_dict)`, the only place in that
module that calls `eval` (sympy 1.14: `sympify` calls `parse_expr`, which calls `eval_expr`, a
module global looked up at call time). Replacing that global therefore intercepts every
string-to-Python evaluation sympy can do, whoever imported `parse_expr` by name.

The replacement evaluates nothing. One legitimate caller exists on math-verify's LaTeX path:
latex2sympy's `parse_number` turns a lexer NUMBER token (digits only, commas already removed)
into `sympy.Number(text)`, which sympifies the string; sympy's standard transformations turn it
into the code `Integer (123 )` or `Float ('1.5' )`. Exactly those two shapes are accepted, and the
value is built directly from the regex-checked numeral (the same object eval would return).
Anything else raises `UnsafeEvaluation` and is counted.

Sympy also sympifies its own constant strings at import time of lazily loaded modules: `simplify`
and `solve` import `sympy.physics.units`, whose prefixes call `sympify('yotta')` and so on. Those
modules are imported before the guard goes up (`_PRELOAD`), so that legitimate grading never
trips it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["UnsafeEvaluation", "armed", "hits", "install", "installed"]

_INTEGER_CODE = re.compile(r"Integer \((\d+) \)")
_FLOAT_CODE = re.compile(r"Float \('(\d+\.\d*|\.\d+)' \)")

# Imported before the guard is installed: modules that sympify constant strings when loaded.
_PRELOAD = ("sympy.physics.units",)

_lock = threading.Lock()
_hits = 0
_original: Any = None  # sympy's own eval_expr while the guard is in place


class UnsafeEvaluation(BaseException):
    """Sympy was about to evaluate Python source built from text.

    A BaseException on purpose: math-verify and sympy wrap parsing in ``except Exception``
    handlers, which would otherwise swallow the signal and let grading go on as if nothing
    happened.
    """


def _guarded_eval(code: Any, local_dict: Any, global_dict: Any) -> Any:
    """Stand-in for `sympy_parser.eval_expr`: build plain numerals, refuse everything else."""
    import sympy

    if isinstance(code, str):
        m = _INTEGER_CODE.fullmatch(code)
        if m is not None:
            return sympy.Integer(int(m.group(1)))
        m = _FLOAT_CODE.fullmatch(code)
        if m is not None:
            return sympy.Float(m.group(1))
    global _hits
    with _lock:
        _hits += 1
    shown = code if isinstance(code, str) else "<compiled code>"
    raise UnsafeEvaluation(f"sympy tried to evaluate {shown[:200]!r}")


def install() -> None:
    """Put the guard in place for the rest of this process (grading workers)."""
    global _original
    import importlib

    from sympy.parsing import sympy_parser

    for name in _PRELOAD:
        importlib.import_module(name)
    with _lock:
        if sympy_parser.eval_expr is not _guarded_eval:
            _original = sympy_parser.eval_expr
            sympy_parser.eval_expr = _guarded_eval


def _uninstall() -> None:
    global _original
    from sympy.parsing import sympy_parser

    with _lock:
        if sympy_parser.eval_expr is _guarded_eval and _original is not None:
            sympy_parser.eval_expr = _original
            _original = None


def installed() -> bool:
    """Whether the guard is in place in this process."""
    from sympy.parsing import sympy_parser

    return sympy_parser.eval_expr is _guarded_eval


@contextmanager
def armed() -> Iterator[None]:
    """The guard for the duration of a block; restored afterwards if it was not in place before.

    Used when grading in the calling process. It swaps a module global, so another thread that
    legitimately sympifies a string during the block would be refused too.
    """
    already = installed()
    if not already:
        install()
    try:
        yield
    finally:
        if not already:
            _uninstall()


def hits() -> int:
    """How many evaluations the guard refused in this process."""
    return _hits
