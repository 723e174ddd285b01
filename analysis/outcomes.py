"""Per-sample outcomes of evaluated runs, read back for paired comparisons between runs.

Every evaluation logs a compact table into the run that holds its scores (artifact
`hacrl.schema.eval_artifacts.outcomes(protocol)`: one row per benchmark, problem and sample, the
extracted answer and the grade lm-eval counted). `read_outcomes` gathers it for many runs into
one DataFrame; a run without it (evaluated before the table existed, or not under this
protocol) is listed apart, never read as zeros. `problem_means` turns one run's rows into
per-problem accuracies, `aligned_problem_means` several runs' into rows of one matrix per
benchmark, problem by problem.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.store import Store
from hacrl.core.errors import HacrlError
from hacrl.schema import eval_artifacts as A

COLUMNS = ("run_id", *(name for name, _ in A.OUTCOME_COLUMNS))
_STRING = pd.api.types.is_string_dtype
# pandas' dtype of each pyarrow type the schema names (an empty table keeps them)
_DTYPES = {"string": "str", "int32": "int32", "int8": "int8"}


class OutcomesError(HacrlError):
    """Outcomes that cannot be read or compared as asked (another format, unequal problems)."""


@dataclass
class Outcomes:
    """Runs' outcomes under one protocol; every run asked for is in `found` or in `missing`."""

    table: pd.DataFrame  # COLUMNS, each run's rows in the order its evaluation wrote them
    found: list[str] = field(default_factory=list)    # runs with the artifact (maybe no rows)
    missing: list[str] = field(default_factory=list)  # runs without it: no outcomes, not zeros


def read_outcomes(store: Store, run_ids: Iterable[str], protocol: str) -> Outcomes:
    """The outcomes of `run_ids` under `protocol` (each file fetched once per store).

    A run without the artifact (evaluated before outcomes were logged, or not under this
    protocol) is in `missing`; one whose table is empty is in `found` with no rows. A file
    without the expected columns raises OutcomesError.
    """
    import pyarrow.parquet as pq

    path = A.outcomes(protocol)
    out = Outcomes(_empty())
    frames = []
    for run_id in dict.fromkeys(run_ids):
        local = store.artifact(run_id, path)
        if local is None:
            out.missing.append(run_id)
            continue
        frame = pq.read_table(local).to_pandas()
        _check_columns(frame, run_id, path)
        frame.insert(0, "run_id", run_id)
        frames.append(frame[list(COLUMNS)])
        out.found.append(run_id)
    if frames:
        out.table = pd.concat(frames, ignore_index=True)
    return out


def _check_columns(frame: pd.DataFrame, run_id: str, path: str) -> None:
    for name, kind in A.OUTCOME_COLUMNS:
        fits = _STRING if kind == "string" else pd.api.types.is_integer_dtype
        if name not in frame or not fits(frame[name]):
            raise OutcomesError(f"run {run_id}: {path} has no {kind} column {name!r} "
                                f"(columns: {', '.join(map(str, frame.columns))}); it was not "
                                "written by this hacrl")


def _empty() -> pd.DataFrame:
    dtypes = {"run_id": "str", **{name: _DTYPES[kind] for name, kind in A.OUTCOME_COLUMNS}}
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in dtypes.items()})


def _per_problem(table: pd.DataFrame) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """run -> benchmark -> (problem ids sorted, mean correctness per problem in that order),
    from one grouping of the whole table rather than a filter per run."""
    means = table.groupby(["run_id", "benchmark", "problem"], sort=True)["correct"].mean()
    out: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for (run_id, benchmark), one in means.groupby(level=[0, 1], sort=False):
        out.setdefault(str(run_id), {})[str(benchmark)] = (
            one.index.get_level_values("problem").to_numpy(dtype=str),
            one.to_numpy(dtype=np.float64))
    return out


def problem_means(table: pd.DataFrame, run_id: str | None = None) -> dict[str, np.ndarray]:
    """One run's mean correctness per problem (mean over its samples), per benchmark, problems
    sorted by id, so that two runs on the same benchmark align problem by problem
    (`aligned_problem_means` checks that they do). `run_id` picks the run from a table of
    several; a run without rows gives {}. The mean of a benchmark's array is its logged `acc`
    (to rounding; exactly when k is a power of two, every term then being exact)."""
    if "run_id" not in table:  # one run's rows as its file holds them
        table = table.assign(run_id=run_id or "")
    if run_id is None:
        runs = table["run_id"].unique()
        if len(runs) > 1:
            raise OutcomesError(f"outcomes of {len(runs)} runs: name the run_id to take")
        run_id = str(runs[0]) if len(runs) else ""
    rows = table[table["run_id"] == run_id]
    return {b: means for b, (_, means) in _per_problem(rows).get(run_id, {}).items()}


def aligned_problem_means(table: pd.DataFrame, run_ids: Sequence[str],
                          benchmarks: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Per benchmark a matrix [run, problem] of mean correctness, rows in `run_ids`' order,
    problems sorted by id. Every run must hold the same problems of every benchmark asked for
    (default: those of the first run); OutcomesError names the benchmark otherwise."""
    if not run_ids:
        return {}
    per_run = _per_problem(table[table["run_id"].isin(run_ids)])
    first = run_ids[0]
    names = list(benchmarks) if benchmarks is not None else sorted(per_run.get(first, {}))
    out = {}
    for benchmark in names:
        rows, ids = [], None
        for run_id in run_ids:
            if benchmark not in per_run.get(run_id, {}):
                raise OutcomesError(f"{benchmark}: run {run_id} has no outcomes of it")
            problems, means = per_run[run_id][benchmark]
            if ids is None:
                ids = problems
            elif not np.array_equal(ids, problems):
                extra = len(set(problems) - set(ids))
                lacking = len(set(ids) - set(problems))
                raise OutcomesError(
                    f"{benchmark}: run {run_id} was evaluated on other problems than run "
                    f"{first} ({extra} not in {first}'s, {lacking} of {first}'s lacking); "
                    "were they evaluated with a --limit or on other data?")
            rows.append(means)
        out[benchmark] = np.vstack(rows)
    return out
