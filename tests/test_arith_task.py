"""The synthetic arithmetic task: splits and the boxed-answer verifier."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from hacrl.data.arith import (
    BENCHMARKS,
    SPLITS,
    extract_boxed,
    grade,
    grade_many,
    is_heldout,
    load_probe,
    load_split,
    normalize_answer,
    write_split_jsonl,
)
from hacrl.data.arith.problems import _draw_split

EXPECTED_SIZES = {
    "tiny_math500": (1300, {1, 2, 3, 4, 5}),
    "tiny_math": (1300, {1, 2, 3, 4, 5}),
    "tiny_gsm8k": (900, {1, 2}),
    "tiny_aime2025": (200, {5}),
    "tiny_amc23": (1000, {4, 5}),
    "tiny_minerva": (1300, {3, 4, 5}),
    "tiny_olympiad": (1300, {3, 4, 5}),
}


def _all_problems():
    return [p for name in SPLITS for p in load_split(name)] + load_probe()


def test_benchmarks_names_order_sizes_and_levels() -> None:
    assert BENCHMARKS == tuple(EXPECTED_SIZES)
    assert set(SPLITS) == {"train", *BENCHMARKS}
    for name, (size, levels) in EXPECTED_SIZES.items():
        problems = load_split(name)
        assert len(problems) == size, name
        assert {p.level for p in problems} == levels, name
    train = load_split("train")
    assert len(train) == 5000
    assert {p.level for p in train} == {1, 2, 3, 4, 5}
    assert len(load_probe()) == 200


def test_splits_deterministic_and_independent_of_global_rng() -> None:
    random.seed(123)
    first = _draw_split(SPLITS["tiny_math"])
    random.seed(456)
    _ = [random.random() for _ in range(10)]
    second = _draw_split(SPLITS["tiny_math"])
    assert first == second
    assert tuple(load_split("tiny_math")) == first


def test_load_split_returns_fresh_lists() -> None:
    a = load_split("tiny_amc23")
    a.clear()
    assert len(load_split("tiny_amc23")) == 1000


def test_benchmarks_and_probe_disjoint_from_train() -> None:
    train = {p.question for p in load_split("train")}
    for name in BENCHMARKS:
        questions = [p.question for p in load_split(name)]
        assert len(set(questions)) == len(questions), f"duplicates in {name}"
        assert not train & set(questions), name
        assert all(is_heldout(q) for q in questions)
    probe = {p.question for p in load_probe()}
    assert len(probe) == 200
    assert not probe & train
    assert not probe & {p.question for n in BENCHMARKS for p in load_split(n)}
    assert len(train) == 5000  # unique questions


def test_uids_unique_per_split() -> None:
    for name in SPLITS:
        uids = [p.uid for p in load_split(name)]
        assert len(set(uids)) == len(uids)


def test_solutions_short_correct_and_graded_one() -> None:
    for p in _all_problems():
        assert p.question.startswith("What is ") and p.question.endswith("?")
        expr = p.question[len("What is ") : -1]
        assert str(eval(expr)) == p.answer  # plain integer arithmetic
        assert p.solution == f"{expr}={p.answer}. \\boxed{{{p.answer}}}"
        assert len(p.solution) <= 32
        assert extract_boxed(p.solution) == p.answer
        assert grade(p.solution, p.answer) == 1.0


def test_level_definitions() -> None:
    by_level: dict[int, list[str]] = {}
    for p in load_split("train") + load_split("tiny_math"):
        by_level.setdefault(p.level, []).append(p.question[len("What is ") : -1])
    for level in (1, 2, 3):
        for expr in by_level[level]:
            a, b = (int(t) for t in expr.split("+"))
            assert 10 <= a <= 99 and 10 <= b <= 99
            ones_carry = a % 10 + b % 10 >= 10
            if level == 1:  # no carry at all
                assert not ones_carry and a + b < 100
            elif level == 2:  # ones carry, two-digit result
                assert ones_carry and a + b < 100
            else:  # three-digit result
                assert a + b >= 100
    assert all("-" in e for e in by_level[4])
    assert any(eval(e) < 0 for e in by_level[4]) and any(eval(e) > 0 for e in by_level[4])
    assert all("*" in e or e.count("+") == 2 for e in by_level[5])
    assert any("*" in e for e in by_level[5]) and any("+" in e for e in by_level[5])
    assert Counter(p.level for p in load_split("tiny_math500")) == {i: 260 for i in range(1, 6)}
    # GSM8K leans to level 1 (the held-out pool has 615 level-1 and 409 level-2 questions)
    assert Counter(p.level for p in load_split("tiny_gsm8k")) == {1: 540, 2: 360}


def test_write_split_jsonl(tmp_path: Path) -> None:
    path = write_split_jsonl("tiny_aime2025", tmp_path / "sub" / "aime.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    problems = load_split("tiny_aime2025")
    assert len(rows) == len(problems)
    assert set(rows[0]) == {"uid", "problem", "answer", "level", "solution"}
    assert [r["problem"] for r in rows] == [p.question for p in problems]
    assert [r["answer"] for r in rows] == [p.answer for p in problems]


def test_unknown_split() -> None:
    with pytest.raises(ValueError, match="tiny_math500"):
        load_split("math500")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{42}", "42"),
        ("a \\boxed{1} b \\boxed{2} c", "2"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{{a}{b{c}}}", "{a}{b{c}}"),
        ("x \\boxed{1} then \\boxed{2", "1"),  # truncated last box: fall back
        ("\\boxed{12", None),
        ("\\boxed{", None),
        ("no box here {}", None),
        ("", None),
        ("\\boxed 5", None),
        ("}}} \\boxed{7} }}", "7"),
        ("\\boxed{}", ""),
        ("\\boxed{\\boxed{3}}", "3"),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    ("response", "answer", "score"),
    [
        ("47+38=85. \\boxed{85}", "85", 1.0),
        ("\\boxed{ 85 }", "85", 1.0),
        ("\\boxed{+5}", "5", 1.0),
        ("\\boxed{05}", "5", 1.0),
        ("\\boxed{-0}", "0", 1.0),
        ("\\boxed{-05}", "-5", 1.0),
        ("\\boxed{-5}", "5", 0.0),
        ("\\boxed{86}", "85", 0.0),
        ("85", "85", 0.0),
        ("\\boxed{85", "85", 0.0),
        ("\\boxed{8 5}", "85", 1.0),
        ("\\boxed{x}", "x", 1.0),
        ("\\boxed{1}\\boxed{2}", "1", 0.0),
    ],
)
def test_grade(response: str, answer: str, score: float) -> None:
    assert grade(response, answer) == score


def test_normalize_answer_huge_integer() -> None:
    digits = "0" * 10 + "7" * 20_000  # far beyond int()'s digit limit
    assert normalize_answer(digits) == "7" * 20_000


def test_grade_many() -> None:
    assert grade_many(["\\boxed{1}", "\\boxed{3}", ""], ["1", "2", "3"]) == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        grade_many(["a"], [])


# A blow-up on these sizes (backtracking, a quadratic scan) runs for hours: the timeout is the
# guard; scripts/bench_verifier.py prints how long extraction takes.
@pytest.mark.timeout(120)
def test_verifier_fast_on_huge_strings() -> None:
    cases = [
        "{" * 500_000 + "\\boxed{3}",
        "\\boxed{" * 200_000,
        "x" * 2_000_000 + "\\boxed{12}",
        "\\boxed{" + "{}" * 300_000 + "}",
        "}" * 500_000,
        "\\boxed{" + "9" * 1_000_000 + "}",
    ]
    results = [grade(c, "3") for c in cases]
    assert results == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert extract_boxed(cases[3]) == "{}" * 300_000


def test_verifier_never_raises_on_random_strings() -> None:
    rng = random.Random(0)
    alphabet = ["\\boxed{", "{", "}", "\\", "b", "1", "-", "+", " ", "\n", "é", "\x00"]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        answer = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5)))
        score = grade(text, answer)
        assert score in (0.0, 1.0)
        got = extract_boxed(text)
        if got is not None:
            assert f"\\boxed{{{got}}}" in text
