"""Artifact names of an evaluation: what `hacrl eval` and a job's final evaluation log into the
run that gets the scores, and the report reads back. Per protocol name P, beside the metrics'
names (`hacrl.schema.metric_names.eval_prefix`):

    eval/P/protocol.json                    the protocol, backend, model args, data files
    eval/P/scores.json                      the scores as lm-eval gave them
    eval/P/tasks/                           the resolved lm-eval task files that made them
    eval/P/samples/<benchmark>.jsonl.gz     every prompt, response and grade (verbose)
    eval/P/outcomes.parquet                 the compact table below, one row per sample

The outcomes table, one row per (benchmark, problem, sample), in lm-eval's document order:

    benchmark   string  the benchmark as in the metric names (`tiny_math500`)
    problem     string  the problem's uid in the benchmark's data file
    sample      int32   0..k-1 for a benchmark sampled k times; 0 for greedy
    answer      string  the final answer the grader extracted ("" when none)
    correct     int8    1 when graded correct: the grade lm-eval's `acc` counted

Per benchmark, the mean over problems of the mean over samples is the logged `acc` (avg@k);
the writer checks this before anything is logged. Leaf module: the standard library and the
other leaves only, so the column types are pyarrow's factory names, not pyarrow types.
"""

from __future__ import annotations

from hacrl.schema.metric_names import eval_prefix

OUTCOMES_FILE = "outcomes.parquet"
PROTOCOL_FILE = "protocol.json"
SCORES_FILE = "scores.json"
TASKS = "tasks"
SAMPLES = "samples"
SAMPLES_SUFFIX = ".jsonl.gz"

# (column, pyarrow type factory name), in file order
OUTCOME_COLUMNS: tuple[tuple[str, str], ...] = (
    ("benchmark", "string"), ("problem", "string"), ("sample", "int32"), ("answer", "string"),
    ("correct", "int8"))


def folder(protocol: str) -> str:
    """`eval/<protocol>`: the artifacts sit beside the metrics' names."""
    return eval_prefix(protocol)


def outcomes(protocol: str) -> str:
    """`eval/<protocol>/outcomes.parquet`."""
    return f"{folder(protocol)}/{OUTCOMES_FILE}"


def samples_file(benchmark: str) -> str:
    """The verbose samples' file name of one benchmark (inside `<folder>/samples/`)."""
    return f"{benchmark}{SAMPLES_SUFFIX}"
