"""A job's MLflow runs: what they are tagged with, how they start, are found again and end.

A job has one `JOB` run and one nested `AGENT` run per model, all tagged with the job's
identity (`identity_tags`) so any of them can be placed in a table without the config.
Ending is ordered: agent runs first, the job run last, so a FINISHED job run means the whole
job is in the store (`finish`).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from hacrl import faults
from hacrl.config import JobSpec
from hacrl.schema import tags as T
from hacrl.tracking import Tracker, flatten


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


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
            T.TIMING_REPEAT: str(c.get("timing_repeat", 0))}
    cell = c.get("cell") or {}
    if cell.get("id"):
        tags[T.CELL] = str(cell.get("id"))
        tags[T.SWEEPS] = ",".join(str(x) for x in cell.get("sweeps") or [])
    return tags


def start_runs(spec: JobSpec, tracker: Tracker, directory: Path) -> tuple[str, dict[str, str]]:
    """A new job run and its agents' runs (params: the whole resolved config, flattened)."""
    c = spec.cfg
    tags = {**identity_tags(spec), T.RUN_DIR: str(directory), T.KIND: T.JOB}
    params = flatten(OmegaConf.to_container(c, resolve=True))  # type: ignore[arg-type]
    job_run = tracker.start_run(f"{spec.method.name}:{tags[T.PAIR]}:s{c.seed}", tags, params)
    agent_runs = {a.name: tracker.start_run(a.name, {**tags, T.MODEL: a.name, T.KIND: T.AGENT},
                                            params, parent_run_id=job_run)
                  for a in spec.agents}
    return job_run, agent_runs


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


def finish(tracker: Tracker, agent_runs: list[str], job_run: str, status: str) -> None:
    """Agent runs first, the job run last: a FINISHED job run means the whole job is in."""
    for run_id in agent_runs:
        tracker.finish(run_id, status)
    faults.point("agent_runs_finished")
    tracker.finish(job_run, status)
    faults.point("job_run_finished")
