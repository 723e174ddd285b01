"""MLflow tags hacrl writes on its runs, and the queries that find runs by them.

Every run carries `KIND`: a `JOB` run (one training job) with one nested `AGENT` run per trained
model; `EVAL` runs (a model evaluated outside a job: base models, `hacrl eval --model`); `REPORT`
runs (`hacrl report`); `GROUP` runs (one per `SEED_GROUP`: the seeds of a sweep cell, their
job runs nested under it, `analysis.seed_groups`). Job and agent runs carry the identity tags
(`IDENTITY`), so any run can be placed in a table without its config; `CONFIG_HASH` is the key
that says a job is done, `SEED_GROUP` the same without the seed.
"""

from __future__ import annotations

from collections.abc import Mapping

# what a run is
KIND = "hacrl.kind"
JOB, AGENT, EVAL, REPORT = "job", "agent", "eval", "report"
GROUP = "seed_group"   # the seeds of one cell: mean and interval over them, jobs nested

# identity of a job (also on its agent runs): plain names, so UI filters read naturally
PAIR = "pair"
SETTING = "setting"
METHOD = "method"
SEED = "seed"
SCALE = "scale"
ENGINE = "engine"
PROFILE = "profile"
GIT_COMMIT = "git_commit"
CONFIG_HASH = "config_hash"
TIMING_REPEAT = "timing_repeat"
IDENTITY = (PAIR, SETTING, METHOD, SEED, SCALE, ENGINE, PROFILE, GIT_COMMIT, CONFIG_HASH,
            TIMING_REPEAT)
# the training identity without the seed (`hacrl.config.identity.seed_group`): equal on the
# job runs of one cell's seeds, and on their GROUP run
SEED_GROUP = "seed_group"
SEEDS = "seeds"        # a GROUP run: the seeds its values are over ("0,1,42")
INTERVAL = "interval"  # ... and what its low/high are ("95% t-interval", or why there are none)
REVISION = "hacrl.revision"  # ... and how often it was written (the step of its latest values)
MODEL = "model"        # an agent or evaluation run: the catalog name of its model
SWEEP = "sweep"        # a report run: the sweep it reports

# bookkeeping of hacrl's own
RUN_DIR = "hacrl.run_dir"            # a job's folder (`hacrl.core.layout.RunDir`)
MODEL_PATH = "hacrl.model_path"      # an evaluation run: the weights it scored
STEP = "hacrl.step"                  # ... and the training step they stand at
ZOO_SEED = "hacrl.zoo_seed"          # ... and the tiny zoo's draw they belong to (scale.zoo_seed)
CELL = "hacrl.cell"                  # the sweep cell a job serves
SWEEPS = "hacrl.sweeps"              # ... and the sweeps that asked for it (comma-separated)
RESUMED_AT_STEP = "hacrl.resumed_at_step"
# a job run that stopped for SLURM to requeue it ("1" until the requeued job reopens it), and
# how many times that happened: the requeued job carries on in the same runs
REQUEUED = "hacrl.requeued"
REQUEUES = "hacrl.requeues"
REPORT_DIR = "hacrl.report_dir"
PID = "hacrl.pid"                    # the process that runs it, to tell a dead run from a live one
PID_TOKEN = "hacrl.pid_token"
HOST = "hacrl.host"
GPU_TYPE = "hacrl.gpu_type"          # a job's (or base evaluation's) GPU model, when it had GPUs

# MLflow's own
PARENT = "mlflow.parentRunId"
RUN_NAME = "mlflow.runName"
SOURCE_COMMIT = "mlflow.source.git.commit"   # the UI's "Source" column and run page show these
SOURCE_NAME = "mlflow.source.name"
SOURCE_TYPE = "mlflow.source.type"
USER = "mlflow.user"


def zoo_draw(tags: dict[str, str]) -> str:
    """The zoo draw an evaluation run's tags name: runs from before draws were told apart (and
    runs at a scale without a zoo) belong to the default draw, "0"."""
    return tags.get(ZOO_SEED) or "0"


def job_run_name(method: str, pair: str, seed: object) -> str:
    """What the runs list shows for a job: `hacpo · qwen3-1.7b-base+qwen3-4b-base · seed 0`."""
    return f"{method} · {pair} · seed {seed}"


def group_run_name(method: str, pair: str, seeds: int) -> str:
    """... and for the seeds of one cell (a `GROUP` run), the job's name with the number of
    seeds for the seed: `hacpo · qwen3-1.7b-base+qwen3-4b-base · 8 seeds`."""
    return f"{method} · {pair} · {seeds} seed{'' if seeds == 1 else 's'}"


def agent_run_name(method: str, model: str) -> str:
    """... and for one of its agents (or a base model's evaluation): `hacpo · qwen3-4b-base`."""
    return f"{method} · {model}"


EVAL_FIELDS = ("key", "benchmarks", "protocol", "backend", "model_path", "lm_eval", "step")


def eval_tag(protocol: str, field: str) -> str:
    """`hacrl.eval.<protocol>.<field>`: what an evaluation under `protocol` was (its `key` says
    whether a later run may skip it)."""
    if field not in EVAL_FIELDS:
        raise ValueError(f"eval tag field {field!r}: one of {', '.join(EVAL_FIELDS)}")
    return f"hacrl.eval.{protocol}.{field}"


def is_eval_tag(tag: str) -> bool:
    return tag.startswith("hacrl.eval.")


def ref(tag: str) -> str:
    """A tag in an MLflow search filter (backquoted: our names hold dots)."""
    return f"tags.`{tag}`"


def where(tags: Mapping[str, str], status: str | None = None) -> str:
    """An MLflow search filter: every tag equals its value (and the run has `status`)."""
    for value in tags.values():
        if "'" in str(value):
            raise ValueError(f"tag value {value!r}: a quote cannot be searched for")
    clauses = [f"{ref(k)} = '{v}'" for k, v in tags.items()]
    if status is not None:
        clauses.append(f"attributes.status = '{status}'")
    return " and ".join(clauses)
