"""Synthetic verifiable arithmetic task: problems, splits and a boxed-answer verifier."""

from hacrl.task.arith import (
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
from hacrl.task.verify import extract_boxed, grade, grade_many, normalize_answer

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
