"""The compact outcomes of one evaluation: one row per (benchmark, problem, sample).

Paired comparisons between runs (per problem, per sample) need each sample's grade; the verbose
samples (prompts and responses) are far too large to read back for hundreds of runs, so every
evaluation also logs this table (columns and artifact name: `hacrl.schema.eval_artifacts`).

The grade of a sample is the one lm-eval's `acc` counted: the task's filter
(`lm_eval_tasks/utils.grade_responses`) grades each response into `{correct, extracted, ...}`,
lm-eval keeps them in order as the document's `filtered_resps`, and `process_results` averages
`correct` over the k of them. `check_outcomes` redoes that arithmetic from the table, in
lm-eval's order, and requires the logged `acc` bit for bit: any difference is a bug.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from hacrl.schema.eval_artifacts import OUTCOME_COLUMNS

SCHEMA = pa.schema([(name, getattr(pa, kind)()) for name, kind in OUTCOME_COLUMNS])


class OutcomesMismatch(RuntimeError):
    """The per-sample grades do not give the logged scores (a bug, never a user's fault)."""


@dataclass
class BenchmarkScore:
    """What one benchmark's rows add up to."""

    acc: float = 0.0
    problems: int = 0
    samples: set[int] = field(default_factory=set)  # the sample counts seen per problem
    numbered: bool = True  # every problem's samples are 0..k-1 in order


def outcomes_table(records: Mapping[str, list[dict[str, Any]]]) -> pa.Table:
    """The table from each benchmark's per-sample records (`lmeval._sample_record`: the doc's
    `uid` and `grades`, its k graded responses in lm-eval's order), documents in order."""
    columns: dict[str, list[Any]] = {name: [] for name, _ in OUTCOME_COLUMNS}
    for benchmark, docs in records.items():
        for doc in docs:
            for sample, grade in enumerate(doc["grades"]):
                columns["benchmark"].append(benchmark)
                columns["problem"].append(str(doc["uid"]))
                columns["sample"].append(sample)
                columns["answer"].append(grade.get("extracted") or "")
                columns["correct"].append(int(bool(grade["correct"])))
    return pa.table(columns, schema=SCHEMA)


def benchmark_scores(table: pa.Table) -> dict[str, BenchmarkScore]:
    """Per benchmark, `acc` as lm-eval computes it from these rows: per document the mean of
    its samples (`process_results`), then the mean of the documents (lm-eval's `mean`: a plain
    sum in document order, divided). Rows of one document are consecutive, as written."""
    bench, problem, sample, correct = (table.column(c).to_pylist() for c in
                                       ("benchmark", "problem", "sample", "correct"))
    per_doc: dict[str, list[float]] = {}
    found: dict[str, BenchmarkScore] = {}
    seen: set[tuple[str, str]] = set()
    at = 0
    while at < len(bench):
        end = at
        while end < len(bench) and (bench[end], problem[end]) == (bench[at], problem[at]):
            end += 1
        key = (bench[at], problem[at])
        if key in seen:
            raise OutcomesMismatch(f"{key[0]}: problem {key[1]!r} appears twice (two documents "
                                   "with one uid, or its samples apart)")
        seen.add(key)
        score = found.setdefault(bench[at], BenchmarkScore())
        score.samples.add(end - at)
        score.numbered &= sample[at:end] == list(range(end - at))
        per_doc.setdefault(bench[at], []).append(sum(correct[at:end]) / (end - at))
        at = end
    for name, values in per_doc.items():
        found[name].problems = len(values)
        found[name].acc = sum(values) / len(values)
    return found


def check_outcomes(table: pa.Table, metrics: Mapping[str, Mapping[str, float]],
                   samples: Mapping[str, int]) -> None:
    """The table gives exactly the logged `acc` of every benchmark, with `samples[b]` samples
    (numbered 0..k-1) per problem; OutcomesMismatch naming the benchmark otherwise."""
    got = benchmark_scores(table)
    if set(got) != set(metrics):
        raise OutcomesMismatch(f"the outcomes hold benchmarks {sorted(got)}, the scores "
                               f"{sorted(metrics)}")
    for benchmark, score in got.items():
        k = samples[benchmark]
        if score.samples != {k} or not score.numbered:
            raise OutcomesMismatch(f"{benchmark}: {sorted(score.samples)} samples per problem "
                                   f"(numbered 0..k-1: {score.numbered}), the protocol asks "
                                   f"for {k}")
        logged = metrics[benchmark]["acc"]
        if score.acc != logged:
            raise OutcomesMismatch(f"{benchmark}: the per-sample grades give acc={score.acc!r} "
                                   f"over {score.problems} problems, lm-eval logged {logged!r}")


def write_outcomes(table: pa.Table, metrics: Mapping[str, Mapping[str, float]],
                   samples: Mapping[str, int], path: Path) -> Path:
    """Check the table against the scores (`check_outcomes`), then write it as parquet."""
    check_outcomes(table, metrics, samples)
    path.parent.mkdir(parents=True, exist_ok=True)
    # zstd: benchmark and problem columns repeat, answers are short; ~8000 rows stay small
    pq.write_table(table, path, compression="zstd")
    return path
