"""Synthetic verifiable arithmetic task: problems, splits and a boxed-answer verifier."""

from hacrl.data.arith.boxed import extract_boxed, grade, grade_many, normalize_answer
from hacrl.data.arith.problems import (
    BENCHMARKS,
    LEVELS,
    SPLITS,
    Problem,
    SplitSpec,
    is_heldout,
    load_probe,
    load_split,
    make_problem,
    write_split_jsonl,
)

__all__ = [
    "BENCHMARKS",
    "LEVELS",
    "SPLITS",
    "Problem",
    "SplitSpec",
    "extract_boxed",
    "grade",
    "grade_many",
    "is_heldout",
    "load_probe",
    "load_split",
    "make_problem",
    "normalize_answer",
    "write_split_jsonl",
]
