"""A job's MLflow runs: what they are tagged with, how they start, are found again and end.

A job has one `JOB` run and one nested `AGENT` run per model, all tagged with the job's
identity (`identity_tags`) so any of them can be placed in a table without the config, and
with its `seed_group` (the identity without the seed): `analysis.seed_groups` later nests the
job runs of one cell's seeds under a group run holding the mean and interval over them.
Ending is ordered: agent runs first, the job run last, so a FINISHED job run means the whole
job is in the store (`finish`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from hacrl.config import JobSpec, seed_group
from hacrl.config.protocol import evaluated_benchmarks
from hacrl.core import faults
from hacrl.data.tasks import load_problems
from hacrl.schema import metric_names as M
from hacrl.schema import tags as T
from hacrl.tracking import Tracker, flatten, git_commit, standard_tags


def identity_tags(spec: JobSpec) -> dict[str, str]:
    """Tags that say what a run is (pair, method, seed, ...) and which sweep cell it serves."""
    c = spec.cfg
    names = [a.name for a in spec.agents]
    if names == list(c.pair.agents):
        pair, setting = str(c.pair.name), str(c.pair.setting)
    else:  # agents given directly: the team is its own "pair"
        pair, setting = "+".join(names), "single" if len(names) == 1 else "custom"
    tags = {T.PAIR: pair, T.SETTING: setting, T.METHOD: spec.method.name, T.SEED: str(c.seed),
            T.SCALE: str(c.scale.name), T.ENGINE: str(c.engine.name), T.PROFILE: str(c.profile),
            T.GIT_COMMIT: git_commit(), T.CONFIG_HASH: spec.config_hash,
            T.SEED_GROUP: seed_group(c), T.TIMING_REPEAT: str(c.get("timing_repeat", 0))}
    cell = c.get("cell") or {}
    if cell.get("id"):
        tags[T.CELL] = str(cell.get("id"))
        tags[T.SWEEPS] = ",".join(str(x) for x in cell.get("sweeps") or [])
    return tags


def training_params(spec: JobSpec) -> dict[str, str]:
    """The job's training config as MLflow params, flattened: every key except the catalogs
    (all models, data sources, evaluation protocols), the price table and where outputs go.
    The catalogs are in the job's config artifact; the job's own models and protocols are
    kept."""
    tree = OmegaConf.to_container(spec.cfg, resolve=True)
    assert isinstance(tree, dict)
    for key in ("output_root", "force", "cell", "models", "cost"):
        tree.pop(key, None)
    tree.get("data", {}).pop("sources", None)
    evaluation = tree.get("eval", {})
    protocols = evaluation.pop("protocols", {}) or {}
    evaluation["protocols"] = {k: v for k, v in protocols.items() if k in evaluation.get("use", [])}
    # (spec.cfg is resolved: its texts are literal, and re-creating a config from them would
    # resolve a `${...}` a user escaped)
    tree["models"] = {a.name: OmegaConf.to_container(spec.cfg.models.get(a.name), resolve=True)
                      for a in spec.agents}
    return flatten({str(k): v for k, v in tree.items()})


def start_runs(spec: JobSpec, tracker: Tracker, directory: Path) -> tuple[str, dict[str, str]]:
    """A new job run and its agents' runs, named for the runs list (`job_run_name`), with the
    training config as params and the datasets the job reads as inputs."""
    c = spec.cfg
    tags = {**identity_tags(spec), **standard_tags("hacrl train"), T.RUN_DIR: str(directory),
            T.KIND: T.JOB}
    params = training_params(spec)
    method = spec.method.name
    job_run = tracker.start_run(T.job_run_name(method, tags[T.PAIR], c.seed), tags, params)
    agent_runs = {a.name: tracker.start_run(T.agent_run_name(method, a.name),
                                            {**tags, T.MODEL: a.name, T.KIND: T.AGENT},
                                            params, parent_run_id=job_run)
                  for a in spec.agents}
    tracker.log_datasets(job_run, job_datasets(c))
    return job_run, agent_runs


def reopen_requeued(spec: JobSpec, tracker: Tracker) -> tuple[str, dict[str, str]] | None:
    """The job's runs again, RUNNING, when its newest job run stopped for a SLURM requeue
    (`hacrl.job.requeue`): that run stopped at a checkpoint with nothing logged after it, so
    the requeued job carries on in it. None otherwise (a new run, curves carried over)."""
    newest = tracker.find_runs(T.where({T.CONFIG_HASH: spec.config_hash, T.KIND: T.JOB}))[:1]
    if not newest or newest[0].info.status != "KILLED" \
            or newest[0].data.tags.get(T.REQUEUED) != "1":
        return None
    job_run = newest[0].info.run_id
    agent_runs = agent_runs_of(tracker, job_run)
    if set(agent_runs) != {a.name for a in spec.agents}:
        return None  # not the runs this job would make: start new ones
    times = int(newest[0].data.tags.get(T.REQUEUES, "0") or 0) + 1
    for run_id in (job_run, *agent_runs.values()):
        tracker.reopen(run_id)
    tracker.set_tags(job_run, {T.REQUEUED: "0", T.REQUEUES: str(times)})
    return job_run, agent_runs


def job_datasets(cfg: Any) -> list[tuple[str, str, str, int, str]]:
    """(context, name, source, rows, sha256) of each dataset the job reads: its training split
    and validation benchmark (files of `hacrl data prepare` under task=math; the embedded
    arith splits otherwise, hashed from their problems) and its evaluation benchmarks (files)."""
    from hacrl.data import local_file, local_state

    def from_file(context: str, name: str) -> tuple[str, str, str, int, str]:
        local_file(cfg.data, name)  # a synthetic benchmark is written on first use
        state = local_state(cfg.data, name)
        return (context, name, state.path.resolve().as_uri(), int(state.rows or 0),
                str(state.sha256))

    def embedded(context: str, name: str) -> tuple[str, str, str, int, str]:
        problems = load_problems(cfg, name)
        digest = hashlib.sha256()
        for p in problems:
            digest.update(json.dumps([p.uid, p.question, p.answer]).encode() + b"\n")
        return context, name, f"hacrl.data.arith:{name}", len(problems), digest.hexdigest()

    own = from_file if cfg.task.name == "math" else embedded
    out = [own("training", str(cfg.task.train_split))]
    if cfg.validation.every:
        out.append(own("validation", str(cfg.validation.benchmark)))
    if cfg.eval.at_end:
        out += [from_file("evaluation", b) for b in evaluated_benchmarks(cfg.eval)]
    return out


def log_scores(tracker: Tracker, job_run: str, final: dict[str, dict[str, float]],
               step: int) -> None:
    """Each agent's final scores on the job run: `avg/<model>` and `acc/<benchmark>/<model>`
    for the main protocol (`<protocol>/...` for others), so the runs list of job runs reads as
    a results table."""
    scores: dict[str, float] = {}
    for model, metrics in final.items():
        for name, value in metrics.items():
            parsed = M.parse_eval(name)
            if parsed is None or parsed[2] != "acc":
                continue
            protocol, benchmark, _ = parsed
            scores[M.job_score(benchmark, model, None if protocol == "main" else protocol)] = value
    if scores:
        tracker.log_metrics(job_run, scores, step)


def agent_runs_of(tracker: Tracker, job_run: str) -> dict[str, str]:
    """model name -> run id of a job run's agent runs."""
    return {ch.data.tags.get(T.MODEL, ""): ch.info.run_id
            for ch in tracker.find_runs(T.where({T.PARENT: job_run}))}


def finished_job_run(tracker: Tracker, spec: JobSpec) -> str | None:
    runs = tracker.find_runs(T.where({T.CONFIG_HASH: spec.config_hash, T.KIND: T.JOB}, "FINISHED"))
    return runs[0].info.run_id if runs else None


def newest_unfinished_job_run(tracker: Tracker, spec: JobSpec) -> Any | None:
    """The newest run of the job if it ended KILLED or FAILED (RUNNING ones were reaped: the
    caller holds the job's lock)."""
    runs = tracker.find_runs(T.where({T.CONFIG_HASH: spec.config_hash, T.KIND: T.JOB}))[:1]
    runs = [r for r in runs if r.info.status in ("KILLED", "FAILED")]
    return runs[0] if runs else None


def previous_job_run(tracker: Tracker, spec: JobSpec, current: str) -> dict[str, str] | None:
    """The latest earlier job run of this config that did not finish, with its agents' runs
    (`{"job": id, <model>: id, ...}`): the run a resumed job carries curves over from."""
    for run in tracker.find_runs(T.where({T.CONFIG_HASH: spec.config_hash, T.KIND: T.JOB})):
        if run.info.run_id != current and run.info.status in ("KILLED", "FAILED"):
            return {"job": run.info.run_id, **agent_runs_of(tracker, run.info.run_id)}
    return None


def carry_over(tracker: Tracker, previous: dict[str, str] | None, agent: str, run: str,
               step: int, evaluations: bool = False) -> None:
    """A resumed agent run: mark where it resumed and copy the earlier run's curves (and, for a
    team that had finished, its evaluation records) up to `step`."""
    tracker.set_tags(run, {T.RESUMED_AT_STEP: str(step)})
    if previous and agent in previous:
        tracker.copy_history(previous[agent], run, step)
        if evaluations:
            tracker.copy_eval_tags(previous[agent], run)


def system_metrics(cfg: Any, tracker: Tracker, run_id: str) -> Any:
    """MLflow's system-metrics sampler on `run_id`, started, when `tracking.system_metrics` is
    on (else None); the caller calls its `finish()`."""
    if not cfg.tracking.get("system_metrics"):
        return None
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(run_id, sampling_interval=10, tracking_uri=tracker.uri)
    monitor.start()
    return monitor


def finish(tracker: Tracker, agent_runs: list[str], job_run: str, status: str) -> None:
    """Agent runs first, the job run last: a FINISHED job run means the whole job is in."""
    for run_id in agent_runs:
        tracker.finish(run_id, status)
    faults.point("agent_runs_finished")
    tracker.finish(job_run, status)
    faults.point("job_run_finished")
