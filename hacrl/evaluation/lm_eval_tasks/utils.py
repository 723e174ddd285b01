"""Scoring for the hacrl_* lm-eval tasks: every response goes through hacrl.verify.

Grading settings come from the environment so the tasks also work from the lm_eval CLI:
HACRL_VERIFY_TIMEOUT_S (seconds per response, default 3) and HACRL_VERIFY_WORKERS (default 2).
"""

from __future__ import annotations

import os
from typing import Any


def grade_responses(resps: list[list[str]], docs: list[dict[str, Any]]) -> list[list[dict]]:
    """Grade all responses of a task in one batch; per document, one record per response."""
    from hacrl.verify import default_verifier

    verifier = default_verifier(timeout_s=float(os.environ.get("HACRL_VERIFY_TIMEOUT_S", "3")),
                                workers=int(os.environ.get("HACRL_VERIFY_WORKERS", "2")))
    flat = [(str(r), str(doc["answer"])) for rs, doc in zip(resps, docs, strict=True) for r in rs]
    grades = verifier.grade_many([r for r, _ in flat], [a for _, a in flat])
    out: list[list[dict]] = []
    at = 0
    for rs in resps:
        out.append([{"correct": g.correct, "exact_match": g.exact_match, "extracted": g.extracted,
                     "timed_out": g.timed_out} for g in grades[at:at + len(rs)]])
        at += len(rs)
    return out


def process_results(doc: dict[str, Any], results: list[list[dict]]) -> dict[str, float]:
    """avg@k (`acc`), normalised exact match and pass@k of one document's k graded responses."""
    grades = results[0]
    k = max(len(grades), 1)
    correct = [bool(g["correct"]) for g in grades]
    return {"acc": sum(correct) / k,
            "exact_match": sum(bool(g["exact_match"]) for g in grades) / k,
            "pass_at_k": float(any(correct))}
