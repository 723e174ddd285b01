"""hacrl.verify in one process: extraction, normalisation, fast paths, math-verify equivalence and
the tripwire. The worker pool, time bounds and adversarial batches are in test_verify_pool.py."""

from __future__ import annotations

import random

import pytest
from omegaconf import OmegaConf

from hacrl.verify import (
    UnsafeEvaluation,
    Verifier,
    default_verifier,
    equivalent,
    exact_match,
    extract_answer,
    extract_boxed,
    normalize_math_string,
    tripwire,
)
from hacrl.verify.equivalence import fast_equivalent

# -- extraction ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{42}", "42"),
        ("a \\boxed{1} b \\boxed{2} c", "2"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{{a}{b{c}}}", "{a}{b{c}}"),
        ("x \\boxed{1} then \\boxed{2", "1"),  # truncated last box: the earlier complete one
        ("\\boxed{12", None),
        ("no box here {}", None),
        ("", None),
        ("}}} \\boxed{7} }}", "7"),
        ("\\boxed{\\boxed{3}}", "3"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces are not grouping braces
        ("\\fbox{9}", "9"),
        ("so \\boxed 5", "5"),
        ("\\boxed{1} and later \\boxed 7.", "7."),
        ("\\boxed {x+1}", "x+1"),
        ("$\\boxed{ 85 }$", "85"),
        ("\\boxed{\\boxed 5}", "5"),  # the space box starts later, inside the braced one
        ("\\boxed 9 then \\boxed{1}", "1"),  # the later box wins, whatever its content
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("blah \\boxed{3} The answer is 4", "3"),  # a box beats any phrase
        ("The final answer is $\\frac{1}{2}$.", "\\frac{1}{2}"),
        ("So the answer is 12.", "12"),
        ("The answer is: **7**", "7"),
        ("Answer: $x=3$\n", "x=3"),
        ("the answer is 1. Actually, the answer is 2.", "2"),
        ("Natalia sold 48 clips.\n#### 72", "72"),
        ("answer: 5\n#### 6", "5"),  # phrases come before the GSM8K marker
        ("The answer is", None),
        ("nothing to see", None),
        ("x \\boxed{1} then \\boxed{2", "1"),
        # the phrase answer's clean-up: delimiters in pairs, `*`, `$` and trailing periods
        ("The answer is X", "X"),
        ("The answer is \\(5\\)", "5"),
        ("The answer is \\[5\\]", "5"),
        ("The answer is $\\(5\\)$", "5"),
        ("The answer is $5", "5"),
        ("The answer is \\(\\)", None),
        ("The answer is 5.$", "5"),
        ("The answer is 5. .", "5"),
        ("The answer is 5\nmore\nlines", "5"),  # to the end of its line
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_extract_fallbacks_read_only_the_tail() -> None:
    assert extract_answer("The answer is 5.\n" + "x" * 10_000) is None
    assert extract_answer("x" * 10_000 + "The answer is 5.") == "5"


# A blow-up on these sizes (backtracking, a quadratic scan) runs for hours: the timeout is the
# guard; scripts/bench_verifier.py prints how long extraction and grading take.
@pytest.mark.timeout(120)
def test_extraction_is_linear_on_huge_inputs() -> None:
    cases = {
        "nested": "\\boxed{" + "{" * 100_000 + "1" + "}" * 100_000 + "}",
        "open": "\\boxed{" * 200_000,
        "megabyte": "x" * 2_000_000 + "\\boxed{12}",
        "closers": "}" * 1_000_000,
        "spaces": "\\boxed" + " " * 1_000_000,
        "phrases": "The answer is " * 100_000,
    }
    got = {name: extract_answer(text) for name, text in cases.items()}
    assert got["nested"] == "{" * 100_000 + "1" + "}" * 100_000
    assert got["open"] is None and got["closers"] is None and got["spaces"] is None
    assert got["megabyte"] == "12"


def test_extraction_never_raises_on_random_strings() -> None:
    rng = random.Random(0)
    alphabet = ["\\boxed{", "\\boxed ", "\\fbox{", "{", "}", "\\{", "\\", "$", "1", "answer:",
                "####", " ", "\n", "é", "\x00", "\ud800"]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        got = extract_answer(text)
        assert got is None or isinstance(got, str)


# -- normalisation and exact match -----------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("\\dfrac{3}{4}", "\\frac{3}{4}"),
        ("\\tfrac12", "\\frac{1}{2}"),
        ("\\frac1{2}", "\\frac{1}{2}"),
        ("\\sqrt3", "\\sqrt{3}"),
        ("1/2", "\\frac{1}{2}"),
        ("-3/4", "\\frac{-3}{4}"),
        ("0.5", "\\frac{1}{2}"),
        (".25", "0.25"),
        ("x = 5", "5"),
        ("y=2x+1", "2x+1"),
        ("90^\\circ", "90"),
        ("90^{\\circ}", "90"),
        ("10\\text{ cm}", "10"),
        ("\\text{east}", "east"),
        ("50\\%", "50"),
        ("\\$5", "5"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("3\\!000", "3000"),
        ("a\nb", "ab"),
        ("12.", "12"),
        ("1\r\n2", "12"),
        ("a\\\\b", "a\\b"),  # a doubled backslash is one
        ("\\displaystyle\\frac{1}{2}", "\\frac{1}{2}"),
        ("45\\circ", "45"),
        ("$5$", "5"),
        ("50%", "50"),
        ("xy=5", "5"),  # a left side of 2 characters names the answer
        ("abc=5", "abc=5"),  # 3 are part of it
        ("x=", "x="),
        ("1\t2", "12"),
        ("1\\,000", "1000"),
        ("1\\;2", "12"),
        ("5..", "5"),
        (".", "."),
        ("\\frac{x}2", "\\frac{x}{2}"),
        ("5 \\text{m} \\text{s}", "5"),  # units after units
    ],
)
def test_normalize_math_string(raw: str, normal: str) -> None:
    assert normalize_math_string(raw) == normal


def test_normalize_and_exact_match_refuse_non_strings() -> None:
    assert normalize_math_string(None) == ""  # type: ignore[arg-type]
    assert exact_match("5", None) is False  # type: ignore[arg-type]
    assert exact_match("5", 5) is False  # type: ignore[arg-type]
    assert exact_match(5, "5") is False  # type: ignore[arg-type]


def test_exact_match_normalises_up_to_max_chars() -> None:
    from hacrl.verify.normalize import MAX_CHARS

    padded = "5" + " " * (MAX_CHARS - 1)  # exactly MAX_CHARS: still normalised
    assert exact_match(padded, "5") and exact_match("5", padded)
    assert not exact_match(padded + " ", "5") and not exact_match("5", padded + " ")


def test_normalize_is_bounded() -> None:
    s = normalize_math_string("1" * 1_000_000)
    assert len(s) == 10_000
    # the truncated copy must not make a long answer match a short one
    assert not exact_match("5" + " " * 20_000 + "wrong", "5")
    assert not equivalent("5" + " " * 20_000 + "wrong", "5")
    assert exact_match("7" * 20_000, "7" * 20_000)


@pytest.mark.parametrize(
    ("pred", "gold", "match"),
    [
        ("\\dfrac{1}{2}", "\\frac12", True),
        ("0.5", "\\frac{1}{2}", True),
        ("x=3", "3", True),
        ("10\\text{ cm}", "10", True),
        ("0.75", "\\frac{3}{4}", False),  # exact match is a string metric, not an equality
        ("-5", "5", False),
        (None, "5", False),
    ],
)
def test_exact_match(pred: str | None, gold: str, match: bool) -> None:
    assert exact_match(pred, gold) is match


# -- equivalence -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        ("5", "5", True),
        ("+05", "5", True),
        ("-0", "0", True),
        ("-5", "5", False),
        ("5", "-5", False),
        ("1,000", "1000", True),
        ("1,00", "100", False),  # not a thousands separator: decided by math-verify, not equal
        ("12345678901234567890123", "12345678901234567890123", True),
        ("2.50", "2.5", True),
        ("3", "3.0", True),
    ],
)
def test_fast_and_plain_numbers(pred: str, gold: str, expected: bool) -> None:
    assert equivalent(pred, gold) is expected


def test_fast_path_decides_plain_integers_without_math_verify() -> None:
    assert fast_equivalent("41", "42") is False
    assert fast_equivalent("1,000", "1000") is True
    assert fast_equivalent("0.3", "0.30000") is True
    assert fast_equivalent("0.3", "0.31") is None  # unequal decimals: math-verify's call
    assert fast_equivalent("\\frac{1}{2}", "0.5") is True  # equal after normalisation
    assert fast_equivalent("x+1", "1+x") is None


# Hand-written expected verdicts (what a careful grader says), which math-verify must match.
EQUIVALENCES = [
    ("0.5", "\\frac{1}{2}", True),
    ("\\dfrac{3}{4}", "0.75", True),
    ("\\frac12", "1/2", True),
    ("(1, 2]", "(1,2]", True),
    ("[1,2]", "(1,2]", False),
    ("(1, 2)", "(1,2)", True),
    ("(2,1)", "(1,2)", False),
    ("10\\text{ cm}", "10", True),
    ("90^\\circ", "90", True),
    ("\\sqrt{2}/2", "\\frac{\\sqrt2}{2}", True),
    ("x=3", "3", True),
    ("\\{1,2\\}", "\\{2,1\\}", True),
    ("\\{1,2\\}", "\\{1,3\\}", False),
    ("-\\frac{1}{2}", "\\frac{1}{2}", False),
    ("-\\frac{3}{4}", "-0.75", True),
    ("1,000", "1000", True),
    ("50\\%", "50", True),
    ("50\\%", "50\\%", True),
    ("x^2+2x+1", "(x+1)^2", True),
    ("2\\sqrt{3}", "\\sqrt{12}", True),
    ("\\frac{\\pi}{4}", "\\pi/4", True),
    ("(-\\infty, 3)", "(-\\infty,3)", True),
    ("1.5\\times 10^{3}", "1500", True),
    ("\\text{(C)}", "C", True),
    ("\\frac{1}{3}", "0.33", False),
    ("3.14", "3.1416", False),
    ("x^2-1", "(x-1)(x+1)", True),
    ("\\sin x", "\\cos x", False),
    ("\\frac{1}{", "1", False),
]


@pytest.mark.parametrize(("pred", "gold", "expected"), EQUIVALENCES)
def test_equivalent(pred: str, gold: str, expected: bool) -> None:
    assert equivalent(pred, gold) is expected


def test_batch_agrees_with_hand_written_verdicts() -> None:
    """The same table graded by worker processes, in one parallel batch."""
    responses = [f"Thus \\boxed{{{pred}}}." for pred, _, _ in EQUIVALENCES]
    with Verifier(timeout_s=10.0, workers=2) as verifier:
        grades = verifier.grade_many(responses, [gold for _, gold, _ in EQUIVALENCES])
    assert [g.correct for g in grades] == [expected for _, _, expected in EQUIVALENCES]
    assert not any(g.timed_out for g in grades)
    assert all(g.error is None for g in grades), [g.error for g in grades if g.error]
    assert verifier.stats["math_verify"] > 0 and verifier.stats["fast_path"] > 0


@pytest.fixture(scope="module", autouse=True)
def _close_shared_verifiers():
    """`equivalent` grades in the shared pool: stop its workers when this module is done."""
    yield
    from hacrl import verify
    for verifier in verify._defaults.values():
        verifier.close()


def test_public_equivalent_is_bounded_like_the_pool() -> None:
    from hacrl.verify import default_verifier

    assert equivalent("2^{10^{100}}", "1", timeout_s=1.0) is False  # a runaway: cut off
    pool = default_verifier(timeout_s=1.0).pool  # the shared pool it graded in
    [cut] = pool.last_outcomes
    assert cut.timed_out and not cut.value  # by the deadline, not by an answer
    assert equivalent("\\frac13", "1/3") is True  # and it still grades


def test_long_answers_skip_math_verify() -> None:
    long = "x+" * 600 + "1"
    assert equivalent(long, long) is True  # identical: fast path
    assert equivalent(long, "1+" + "x+" * 600) is False  # would need sympy: exact match only
    assert equivalent("x+1", "1+x", max_chars=2) is False


# -- the tripwire in this process --------------------------------------------------------------


def test_tripwire_refuses_python_and_builds_numerals() -> None:
    import sympy

    assert not tripwire.installed()
    before = tripwire.hits()
    with tripwire.armed():
        assert tripwire.installed()
        assert sympy.sympify("12") == 12  # the one legitimate shape: built, not evaluated
        assert sympy.Number("2.5") == sympy.Float("2.5")
        with pytest.raises(UnsafeEvaluation):
            sympy.sympify("__import__('os').getcwd()")
        with pytest.raises(UnsafeEvaluation):
            sympy.parsing.sympy_parser.parse_expr("1+1", evaluate=False)
    assert tripwire.hits() == before + 2
    assert not tripwire.installed()
    assert sympy.sympify("x+1") == sympy.Symbol("x") + 1  # restored after the block


def test_legitimate_answers_do_not_trip() -> None:
    before = tripwire.hits()
    for pred, gold, expected in EQUIVALENCES:
        assert equivalent(pred, gold) is expected
    assert equivalent("\\lim_{x\\to 0} \\frac{\\sin x}{x}", "1")
    assert equivalent("\\sum_{k=1}^{10} k", "55")
    assert equivalent("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}")
    assert tripwire.hits() == before


# -- wiring ----------------------------------------------------------------------------------


def test_task_grader_is_the_shared_verifier() -> None:
    from hacrl.data.tasks import grader

    cfg = OmegaConf.create({"verify": {"timeout_s": 2.5, "workers": 1}})
    grade = grader(cfg)
    verifier = default_verifier(timeout_s=2.5, workers=1)
    assert grade == verifier.rewards
    assert default_verifier(timeout_s=2.5, workers=1) is verifier
    # integer answers (the arith task) are settled in this process: no worker is started
    assert grade(["\\boxed{85}", "\\boxed{-5}", "The answer is 7", "nothing"],
                 ["85", "5", "7", "1"]) == [1.0, 0.0, 1.0, 0.0]
    assert verifier.pool._workers == []
    verifier.close()


# -- the in-process path and the cheap verdicts' edges -----------------------------------------


def test_in_process_grading_agrees_with_math_verify_and_refuses_python() -> None:
    """`_equivalent_in_process` and `math_verify_equal` (what a worker runs) on the hand-written
    table, inline math wrapped once, and a refused evaluation graded False here too."""
    from hacrl.verify.equivalence import _as_latex, _equivalent_in_process, math_verify_equal

    assert _as_latex("\\$5$") == "$5$" and _as_latex("x") == "$x$"
    for pred, gold, expected in EQUIVALENCES[:12]:
        assert _equivalent_in_process(pred, gold) is expected, (pred, gold)
    with tripwire.armed():
        assert math_verify_equal("\\frac{2}{4}", "0.5") is True
        assert math_verify_equal("x+2", "1+x") is False
        assert math_verify_equal("\\$3$", "3") is True  # the `$`s would split the math
    assert _equivalent_in_process("x+1", "1+x", max_chars=2) is False  # too long for sympy
    assert _equivalent_in_process("x+1", "1+x", max_chars=3) is True
    assert _equivalent_in_process("__import__('os').getcwd()", "1") is False


@pytest.mark.parametrize(
    ("pred", "gold", "max_chars", "verdict"),
    [
        (None, "1", 10, False), ("1", None, 10, False), (1, 1, 10, False),
        ("", "", 10, False), (" $ $ ", "", 10, False), ("5", " ", 10, False),
        ("5", "5", 10, True), ("4", "5", 10, False),
        ("x+1", "1+x", 3, None),  # 3 characters: math-verify's
        ("x+1", "1+x", 2, False), ("xx+1", "1+x", 3, False), ("x+1", "1+xx", 3, False),
    ],
)
def test_cheap_verdict(pred: object, gold: object, max_chars: int, verdict: bool | None) -> None:
    from hacrl.verify.equivalence import cheap_verdict

    assert cheap_verdict(pred, gold, max_chars) is verdict


def test_plain_numbers_are_read_between_dollars_only() -> None:
    assert fast_equivalent("$-5$", "-05") is True  # `$` around a plain integer
    assert fast_equivalent("$ 1,000 $", "1000.0") is True
    assert fast_equivalent("5X", "5") is None  # not a plain number: math-verify decides
    assert fast_equivalent("X5", "5") is None
    assert equivalent("", "") is False and equivalent("\\boxed{}", "") is False


def test_math_verify_runs_without_signals_so_any_thread_can_grade() -> None:
    """Our deadlines are the pool's: math-verify's own (signal.alarm, main thread only) are off
    for parsing and for verifying, so a grade in another thread works."""
    import threading

    from hacrl.verify.equivalence import math_verify_equal

    got: list[object] = []

    def grade() -> None:
        try:
            with tripwire.armed():
                got.append(math_verify_equal("\\frac{2}{4}", "0.5"))
        except Exception as exc:  # noqa: BLE001 - the failure is the finding
            got.append(exc)

    thread = threading.Thread(target=grade)
    thread.start()
    thread.join()
    assert got == [True]


def test_a_failure_inside_math_verify_grades_false(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused evaluation or any library error is a wrong answer, not an exception."""
    from hacrl.verify import equivalence

    errors: list[BaseException] = [UnsafeEvaluation("eval"), RuntimeError("sympy")]
    for error in errors:
        def fail(pred: str, gold: str, error: BaseException = error) -> bool:
            raise error

        monkeypatch.setattr(equivalence, "math_verify_equal", fail)
        assert equivalence._equivalent_in_process("x+1", "1+x") is False


def test_decimals_with_thousands_separators_on_either_side() -> None:
    assert fast_equivalent("1000.5", "1,000.5") is True
    assert fast_equivalent("1,000.5", "1000.5") is True


def test_public_equivalent_grades_in_the_default_shared_pool() -> None:
    """`equivalent`'s default deadline is the shared verifier's (3 s): the pool it grades in is
    `default_verifier()`'s."""
    pool = default_verifier().pool
    before = pool.stats["items"]
    assert equivalent("x+1", "1+x") is True
    assert pool.stats["items"] == before + 1


def test_answers_are_read_as_latex_never_as_python() -> None:
    """math-verify's expression parser (Python syntax, sympy's eval) is off for both sides:
    `2**3` is not LaTeX, so it equals nothing, not the 2 a Python reading of it gives."""
    from hacrl.verify.equivalence import math_verify_equal

    with tripwire.armed():
        assert math_verify_equal("2**3", "2") is False
        assert math_verify_equal("2", "2**3") is False
        assert math_verify_equal("2^3", "8") is True
