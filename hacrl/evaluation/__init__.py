"""Evaluation: fast greedy validation inside training, and lm-eval runs of the paper's benchmarks.

greedy.py         in-loop validation (greedy accuracy on one benchmark every k steps)
lmeval.py         the hacrl_* lm-eval tasks: materialised per protocol and run through lm-eval
hf_lm.py          lm-eval's model for the local engine's models (batched greedy and sampling)
outcome_table.py  one row per benchmark, problem and sample: the grade lm-eval counted
runner.py         `hacrl eval` targets and logging into MLflow runs
The protocol an evaluation follows is config: `hacrl.config.protocol`.
"""
