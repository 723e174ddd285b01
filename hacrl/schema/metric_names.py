"""Metric names: the rules writers follow and the report reads by. This module is the one home
of every metric name hacrl logs and reads: tests/test_schema.py fails on a string that starts
with one of PREFIXES anywhere else.

    eval/<protocol>/<benchmark>/<measure>   an lm-eval score (measure: acc, ...)
    eval/<protocol>/avg/<measure>           the mean over the protocol's benchmarks
    val/<benchmark>/acc                     in-loop greedy validation
    time/<phase>_s, time/wall_s, ...        seconds (time/step_s: a team's whole training step)
    memory/<what>_gb, memory/device_used_frac   peak memory
    ratio/<name>_<stat>                     HACPO's sequence ratios (name: s_homo, s_hete; stat:
                                            mean, min, max; sum, count within one update)
Per-agent training metrics, one value a step (the report draws some as curves):
    reward/mean, capability/P, omega/<partner>   the mean reward, P_k, omega^(k, partner)
    response/length_mean, response/finished_frac the agent's own responses
    tokens/own, tokens/borrowed             response tokens it trained on
    retok/length_ratio, retok/truncated_frac     borrowed rows in its tokens vs the source's
    train/updates                           optimizer updates in the step
    loss/<part>, clip/<what>                `hacrl.algo.policy_loss`'s (its LOSS_METRICS)
    grad_norm                               the engine's gradient norm (a name, no family)
A job run's final scores (the MLflow runs list as a results table, `hacrl.tracking.ui_views`):
    avg/<model>, acc/<benchmark>/<model>    the main protocol's; `<protocol>/...` for others
... and over the seeds of a cell, on its seed-group run (`analysis.seed_groups`), per score S:
    S                                       the mean over seeds (the seeds' column, nested below)
    ci_low/S, ci_high/S                     its 95% t-interval over seeds, in [0, 1] (none: one seed)
    seeds/S                                 the number of seeds
What a job cost, measured (`hacrl.job.usage`; seconds and memory are time/ and memory/'s):
    cost/cpu_s, cost/gpus, cost/gpu_s, cost/usd   on the job run (a base model's: its eval run)
    cost/tokens_sampled, cost/tokens_trained      on the job run (all agents) and each agent run
The report reads REPORTED_PREFIXES' names and the training curves it draws. verl's own metrics
keep verl's names under `verl/actor/` (`hacrl.engines.verl.update_metrics`): not ours to name.
"""

from __future__ import annotations

REPORTED_PREFIXES = ("eval/", "time/", "memory/", "ratio/", "val/", "cost/")
# every family of metric names hacrl writes: a string that starts with one is built here only
PREFIXES = (*REPORTED_PREFIXES, "reward/", "capability/", "omega/", "response/", "tokens/",
            "retok/", "train/", "loss/", "clip/", "avg/", "acc/", "adv/", "ci_low/", "ci_high/",
            "seeds/")
AVG = "avg"

# seconds
WALL = "time/wall_s"
STARTUP = "time/startup_s"
TRACKING = "time/tracking_s"
STEP = "time/step_s"

# peak memory (`hacrl.engines.memory`, the verl engine)
PEAK_RSS = "memory/peak_rss_gb"
TORCH_MAX_ALLOCATED = "memory/torch_max_allocated_gb"
DEVICE_USED = "memory/device_used_gb"
DEVICE_TOTAL = "memory/device_total_gb"
DEVICE_USED_FRAC = "memory/device_used_frac"

# what a job cost (`hacrl.job.usage`): CPU seconds of its process and children, the GPUs its
# allocation holds and GPU seconds (GPUs x the process's seconds), the money when cost.gpu_hour_usd
# prices its GPU type; response tokens sampled and trained on (own + borrowed), summed over steps
CPU_S = "cost/cpu_s"
GPUS = "cost/gpus"
GPU_S = "cost/gpu_s"
USD = "cost/usd"
TOKENS_SAMPLED = "cost/tokens_sampled"
TOKENS_TRAINED = "cost/tokens_trained"

# per-agent training metrics (`hacrl.training.loop`, the engines)
REWARD_MEAN = "reward/mean"
CAPABILITY = "capability/P"
RESPONSE_LENGTH_MEAN = "response/length_mean"
RESPONSE_FINISHED_FRAC = "response/finished_frac"
TOKENS_OWN = "tokens/own"
TOKENS_BORROWED = "tokens/borrowed"
RETOK_LENGTH_RATIO = "retok/length_ratio"
RETOK_TRUNCATED_FRAC = "retok/truncated_frac"
UPDATES = "train/updates"
GRAD_NORM = "grad_norm"
# prompts whose n*G rewards are all equal but whose advantage is not 0 (`algo.degenerate_prompts`)
ADV_DEGENERATE_PROMPTS = "adv/degenerate_prompts"
ADV_DEGENERATE_MAX_ABS = "adv/degenerate_max_abs"

# `hacrl.algo.policy_loss`'s own metrics
LOSS_TOTAL = "loss/total"
LOSS_POLICY = "loss/policy"
LOSS_KL = "loss/kl"
LOSS_OWN = "loss/own"
LOSS_BORROWED = "loss/borrowed"
CLIP_OWN_FRAC = "clip/own_frac"
CLIP_BORROWED_FRAC = "clip/borrowed_frac"
CLIP_LOWER_BOUND = "clip/lower_bound"

# the sequence ratios of `ratio`: own rows' (s_homo) and cross rows' (s_hete)
S_HOMO = "s_homo"
S_HETE = "s_hete"
RATIOS = (S_HOMO, S_HETE)

# a job run's final scores (`job_score`); the UI's views pick the AVG columns by JOB_AVG
JOB_AVG = "avg/"


def eval_prefix(protocol: str) -> str:
    return f"eval/{protocol}"


def eval_metric(protocol: str, benchmark: str, measure: str = "acc") -> str:
    return f"{eval_prefix(protocol)}/{benchmark}/{measure}"


def eval_avg(protocol: str, measure: str = "acc") -> str:
    return eval_metric(protocol, AVG, measure)


def parse_eval(name: str) -> tuple[str, str, str] | None:
    """(protocol, benchmark or `avg`, measure) of an `eval_metric` name; None for others."""
    parts = name.split("/")
    if len(parts) != 4 or parts[0] != "eval":
        return None
    return parts[1], parts[2], parts[3]


def eval_seconds(protocol: str) -> str:
    return f"time/eval_{protocol}_s"


def validation(benchmark: str) -> str:
    return f"val/{benchmark}/acc"


def seconds(phase: str) -> str:
    """`time/<phase>` for a phase name that already ends in `_s` (as the timers give them)."""
    return f"time/{phase}"


def phase_seconds(phase: str) -> str:
    """`time/<phase>_s` for a bare phase name (generate, verify, ...: `PhaseTimer`'s)."""
    return seconds(f"{phase}_s")


def omega(partner: str) -> str:
    """omega^(k, partner) on agent k's run."""
    return f"omega/{partner}"


def ratio(name: str, stat: str) -> str:
    """`ratio/<name>_<stat>`: a statistic (mean, min, max; sum, count) of S_HOMO or S_HETE."""
    return f"ratio/{name}_{stat}"


def parse_job_score(name: str) -> tuple[str | None, str, str] | None:
    """(protocol or None for the main one, benchmark or `avg`, model) of a `job_score` name;
    None for any other name (a seed group's `seed_stat`s included)."""
    parts = name.split("/")
    if len(parts) in (3, 4) and parts[1] in (AVG, "acc") and f"{parts[0]}/" not in PREFIXES:
        protocol, parts = parts[0], parts[1:]
    else:
        protocol = None
    if len(parts) == 2 and parts[0] == AVG and parts[1]:
        return protocol, AVG, parts[1]
    if len(parts) == 3 and parts[0] == "acc" and parts[1] and parts[1] != AVG and parts[2]:
        return protocol, parts[1], parts[2]
    return None


SEED_STATS = ("low", "high", "n")
_SEED_STAT_FAMILY = {"low": "ci_low", "high": "ci_high", "n": "seeds"}


def seed_stat(score: str, stat: str) -> str:
    """A seed group's statistic of job score `score`: `low`/`high`, the ends of the mean's 95%
    t-interval over seeds (`ci_low/avg/<model>`, `ci_high/...`); `n`, the number of seeds
    (`seeds/...`). The mean itself is logged under `score`. The statistic comes first: the
    MLflow UI's narrow column headers show a name's start."""
    if stat not in SEED_STATS:
        raise ValueError(f"seed statistic {stat!r}: one of {', '.join(SEED_STATS)}")
    return f"{_SEED_STAT_FAMILY[stat]}/{score}"


def job_score(benchmark: str, model: str, protocol: str | None = None) -> str:
    """A job run's final accuracy of agent `model`: `avg/<model>` (benchmark AVG) or
    `acc/<benchmark>/<model>`, under `<protocol>/` unless protocol is None (the main one)."""
    key = f"{JOB_AVG}{model}" if benchmark == AVG else f"acc/{benchmark}/{model}"
    return key if protocol is None else f"{protocol}/{key}"
