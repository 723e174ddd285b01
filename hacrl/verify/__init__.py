"""The hardened answer verifier used for RL rewards and for evaluation.

A response is graded in three steps: `extract_answer` finds its final answer (linear time in
any input), `fast_equivalent` settles the cheap cases in this process, and the rest go to
math-verify's LaTeX path in worker processes (`pool.GradingPool`) with a hard deadline per
item and a tripwire that refuses any Python evaluation of text (`tripwire`). Normalised exact
match (`exact_match`, Hendrycks-style) is reported alongside as a second metric.

    with Verifier(timeout_s=3.0, workers=2) as v:
        grades = v.grade_many(responses, answers)   # list[Grade]
        rewards = v.rewards(responses, answers)     # list[float]; a `hacrl.data.tasks.Grader`
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from hacrl.verify.equivalence import MAX_ANSWER_CHARS, cheap_verdict, fast_equivalent
from hacrl.verify.extract import extract_answer, extract_boxed
from hacrl.verify.normalize import exact_match, normalize_math_string
from hacrl.verify.pool import GradingPool, Outcome, Task
from hacrl.verify.tripwire import UnsafeEvaluation

__all__ = [
    "Grade",
    "UnsafeEvaluation",
    "Verifier",
    "default_verifier",
    "equivalent",
    "exact_match",
    "extract_answer",
    "extract_boxed",
    "normalize_math_string",
]


@dataclass(frozen=True)
class Grade:
    """The verdict on one response."""

    correct: bool  # mathematically equal to the reference (the reward)
    exact_match: bool  # Hendrycks-normalised string match (the second metric)
    extracted: str | None  # the final answer found in the response, if any
    timed_out: bool = False  # grading overran its time bound (then correct is False)
    error: str | None = None  # why grading failed, when it did

    @property
    def score(self) -> float:
        return 1.0 if self.correct else 0.0


def _reference(answer: str) -> str:
    """The reference answer as a bare expression (datasets sometimes keep the box or `$`, in
    either order: `$\\boxed{5}$`, `\\boxed{$5$}`); "" when there is none."""
    gold = answer.strip().strip("$").strip() if isinstance(answer, str) else ""
    if gold.startswith(("\\boxed", "\\fbox")):
        gold = extract_boxed(gold) or gold
    return gold.strip().strip("$").strip()


class Verifier:
    """Grades batches of responses against reference answers; never raises on `str` input.

    `timeout_s` bounds the grading of each response (a runaway grade scores 0 and its worker is
    replaced); `workers` grading processes are started on first need; answers longer than
    `max_answer_chars` are judged by normalised exact match only. Counters of how items were
    decided are in `stats` (fast_path, math_verify, long, no_answer, no_reference, timeouts,
    unsafe, errors).
    """

    def __init__(self, timeout_s: float = 3.0, workers: int = 2,
                 max_answer_chars: int = MAX_ANSWER_CHARS) -> None:
        self.max_answer_chars = int(max_answer_chars)
        self.pool = GradingPool(workers=workers, timeout_s=timeout_s)
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()

    @property
    def timeout_s(self) -> float:
        return self.pool.timeout_s

    def grade_many(self, responses: Sequence[str], answers: Sequence[str]) -> list[Grade]:
        """One `Grade` per response, against the answer at the same position."""
        if len(responses) != len(answers):
            raise ValueError(f"{len(responses)} responses but {len(answers)} answers")
        grades: dict[int, Grade] = {}
        tasks: list[Task] = []
        slot: dict[tuple[str, str], int] = {}  # identical (answer, reference) pairs: graded once
        waiting: list[tuple[int, int, str, bool]] = []  # (response, task, extracted, exact)
        counts: Counter[str] = Counter()
        for i, (response, answer) in enumerate(zip(responses, answers, strict=True)):
            pred = extract_answer(response)  # None for a non-string
            gold = _reference(answer)
            if not pred:  # an empty box is no answer (it would match an empty reference)
                counts["no_answer"] += 1
                grades[i] = Grade(False, False, None)
                continue
            if not gold:  # a missing reference: nothing is correct against it
                counts["no_reference"] += 1
                grades[i] = Grade(False, False, pred, error="no reference answer")
                continue
            exact = exact_match(pred, gold)
            fast = fast_equivalent(pred, gold)
            if fast is not None:
                counts["fast_path"] += 1
                grades[i] = Grade(fast, exact, pred)
            elif len(pred) > self.max_answer_chars or len(gold) > self.max_answer_chars:
                counts["long"] += 1
                grades[i] = Grade(exact, exact, pred)
            else:
                counts["math_verify"] += 1
                key = (pred, gold)
                if key not in slot:
                    slot[key] = len(tasks)
                    tasks.append(("grade", key))
                waiting.append((i, slot[key], pred, exact))
        outcomes: list[Outcome] = self.pool.run(tasks) if tasks else []
        for i, t, pred, exact in waiting:
            o = outcomes[t]
            grades[i] = Grade(o.value, exact, pred, o.timed_out, o.error)
        for o in outcomes:
            if o.timed_out:
                counts["timeouts"] += 1
            elif o.error is not None:
                counts["unsafe" if o.error.startswith("unsafe") else "errors"] += 1
        with self._lock:
            self.stats.update(counts)
        return [grades[i] for i in range(len(responses))]

    def rewards(self, responses: Sequence[str], answers: Sequence[str]) -> list[float]:
        """1.0 per correct response, else 0.0 (the project's `Grader` signature)."""
        return [g.score for g in self.grade_many(responses, answers)]

    def close(self) -> None:
        """Stop the grading workers (started again if the verifier is used afterwards)."""
        self.pool.close()

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_defaults: dict[tuple[float, int, int], Verifier] = {}
_defaults_lock = threading.Lock()


def default_verifier(timeout_s: float = 3.0, workers: int = 2,
                     max_answer_chars: int = MAX_ANSWER_CHARS) -> Verifier:
    """A shared verifier per setting, so repeated callers reuse one set of workers."""
    key = (float(timeout_s), int(workers), int(max_answer_chars))
    with _defaults_lock:
        if key not in _defaults:
            _defaults[key] = Verifier(*key)
        return _defaults[key]


def equivalent(pred: str, gold: str, max_chars: int = MAX_ANSWER_CHARS,
               timeout_s: float = 3.0) -> bool:
    """Whether answer `pred` equals reference `gold`, under the same bounds as `Verifier`.

    Fast paths in this process; answers longer than `max_chars` by normalised exact match; the
    rest in a worker of the shared pool (`default_verifier`) with a `timeout_s` deadline and the
    tripwire armed: a runaway or refused grade is False, and this call returns within about
    `timeout_s` whatever the text.
    """
    settled = cheap_verdict(pred, gold, max_chars)
    if settled is not None:
        return settled
    verifier = default_verifier(timeout_s)  # its pool only: max_chars was applied above
    (outcome,) = verifier.pool.run([("grade", (pred, gold))])
    return bool(outcome.value) and not outcome.timed_out and outcome.error is None
