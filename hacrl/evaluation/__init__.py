"""Evaluation: fast greedy validation inside training, and lm-eval runs of the paper's benchmarks.

greedy.py         in-loop validation (greedy accuracy on one benchmark every k steps)
protocol.py       the evaluation protocol (tokens, greedy or k samples at temperature T), hashed
lmeval.py         the hacrl_* lm-eval tasks: materialised per protocol and run through lm-eval
outcome_table.py  one row per benchmark, problem and sample: the grade lm-eval counted
runner.py         `hacrl eval` targets and logging into MLflow runs
"""

# Only the protocol here: it sits below the config (layer `resources`); greedy.py, lmeval.py and
# runner.py use engines and the store and are imported by their own names.
from hacrl.evaluation.protocol import Protocol, Sampling, paper_benchmark

__all__ = ["Protocol", "Sampling", "paper_benchmark"]
