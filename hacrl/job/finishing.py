"""How a job ends, and the paths that train nothing: evaluation, DONE.json, repair.

Finishing is ordered so that a kill at any instant leaves a state the next run repairs
(`hacrl.core.faults.FINISHING` names the points a test kills at): final checkpoint, final evaluation
(into the agent runs), DONE.json, the job's time metrics, agent runs FINISHED, job run FINISHED.
A rerun that finds every DONE.json but no FINISHED job run completes the killed runs in place
(`repair`) instead of training again. `evaluate_base` (method=base) and `evaluate_finished`
(a finished job asked for again) evaluate without training.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hacrl.checkpoint import team as checkpoint
from hacrl.config import JobSpec
from hacrl.core import faults
from hacrl.core.fileio import write_atomic
from hacrl.core.layout import TeamDir
from hacrl.engines.memory import peak_memory_metrics
from hacrl.evaluation.runner import evaluate_into_run, latest_checkpoint, target_from_model
from hacrl.job.lock import evaluation_lock
from hacrl.job.runs import (
    agent_runs_of,
    finish,
    identity_tags,
    log_scores,
    newest_unfinished_job_run,
)
from hacrl.job.usage import job_totals, prices, take_usage, token_totals
from hacrl.schema import metric_names as M
from hacrl.schema import tags as T
from hacrl.tracking import Tracker

PHASES = ("setup_s", "validation_s", "train_s", "eval_s")  # the job's own work, per team


def finished(team: TeamDir, steps: int, agents: list[str] | None = None) -> dict[str, Any] | None:
    """The team's DONE.json record if it is whole, for `steps` steps and these `agents`; else
    None (with a warning when a file is there but unusable: the team then counts as not done)."""
    return checkpoint.read_done(team.done, steps, agents)


def evaluated_scores(tracker: Tracker, agent_runs: dict[str, str]) -> dict[str, dict[str, float]]:
    """Each agent's final evaluation metrics as its run holds them (what the evaluation logged),
    never a file's copy of them: the job's results are these."""
    scores: dict[str, dict[str, float]] = {}
    for name, run_id in agent_runs.items():
        metrics = tracker.client.get_run(run_id).data.metrics
        scores[name] = {k: float(v) for k, v in metrics.items() if M.parse_eval(k) is not None}
    return scores


def mark_done(team: TeamDir, record: dict[str, Any]) -> None:
    """The team's DONE.json: it trained and was evaluated (the last step before the runs end)."""
    # (the team's folder is made here when steps=0, evaluation only, saved nothing)
    write_atomic(team.done, json.dumps(record, indent=1))
    faults.point("done_json")


def evaluate_final(spec: JobSpec, tracker: Tracker, team: TeamDir, fallback: dict[str, str],
                   agent_runs: dict[str, str]) -> dict[str, dict[str, float]]:
    """Each agent's final checkpoint (or its base model when none was written) into its run;
    protocols the run holds already are kept (a job requeued by SLURM while it evaluated)."""
    steps = int(spec.cfg.train.steps)
    final: dict[str, dict[str, float]] = {}
    for name, base in fallback.items():
        weights = checkpoint.agent_weights(checkpoint.step_dir(team.ckpt, steps), name)
        model = str(weights) if (weights / "config.json").is_file() else base
        final[name] = {k: v for r in evaluate_into_run(spec.cfg, model, tracker, agent_runs[name],
                                                         steps)
                       for k, v in r.metrics.items()}
    faults.point("final_eval")
    return final


def evaluate_missing(spec: JobSpec, tracker: Tracker, directory: Path,
                     agent_runs: dict[str, str]) -> None:
    """Log the final evaluations an agent run lacks (protocols already logged are skipped)."""
    for agent in spec.agents:
        if agent.name not in agent_runs:
            continue  # an agent of another team
        found = latest_checkpoint(directory, agent.name)
        model, step = (str(found[1]), found[0]) if found else (agent.path, 0)
        evaluate_into_run(spec.cfg, model, tracker, agent_runs[agent.name], step)


def repair(spec: JobSpec, tracker: Tracker, directory: Path,
           teams: list[TeamDir]) -> dict[str, Any] | None:
    """Every team is done but no job run FINISHED: the job was killed while finishing. Complete
    its newest unfinished runs in place: evaluations it lacks, its time metrics, FINISHED.
    None when there is no such run (or it lacks an agent run): the caller starts new runs."""
    c, steps = spec.cfg, int(spec.cfg.train.steps)
    run = newest_unfinished_job_run(tracker, spec)
    if run is None:
        return None
    job_run = run.info.run_id
    agent_runs = agent_runs_of(tracker, job_run)
    if any(a.name not in agent_runs for a in spec.agents):
        return None
    print(f"hacrl: job {spec.config_hash} was killed while finishing; completing its runs "
          f"(job run {job_run})", file=sys.stderr, flush=True)
    records = [finished(t, steps, [a.name for a in team]) or {}
               for t, team in zip(teams, spec.teams, strict=True)]
    if c.eval.at_end:
        evaluate_missing(spec, tracker, directory, agent_runs)
    if M.WALL not in run.data.metrics:
        phases = {k: sum(float(r.get("phases", {}).get(k, 0.0)) for r in records)
                  for k in (*PHASES, "wall_s")}
        tracker.log_metrics(job_run, {M.seconds(k): v for k, v in phases.items()}, steps)
        log_scores(tracker, job_run, evaluated_scores(tracker, agent_runs), steps)
    if M.TOKENS_TRAINED not in run.data.metrics:  # the tokens are in the curves; CPU is lost
        tokens = token_totals(tracker.client, agent_runs)
        for run_id, metrics in tokens.items():
            tracker.log_metrics(run_id, metrics, steps)
        tracker.log_metrics(job_run, job_totals(tokens), steps)
    finish(tracker, list(agent_runs.values()), job_run, "FINISHED")
    return {"job_run_id": job_run, "agent_run_ids": agent_runs, "run_dir": str(directory),
            "teams": records, "status": "FINISHED", "repaired": True}


def evaluate_base(spec: JobSpec, tracker: Tracker) -> dict[str, Any]:
    """method=base: evaluate each agent as it is, into its own evaluation run."""
    c = spec.cfg
    eval_runs: dict[str, str] = {}
    final: dict[str, dict[str, float]] = {}
    for agent in spec.agents:
        with evaluation_lock(spec.output_root, agent.path, agent.name):
            target = target_from_model(tracker, c, agent.name, agent.path)
            tracker.set_tags(target.run_id, {k: v for k, v in identity_tags(spec).items()
                                             if k in (T.CELL, T.SWEEPS)})
            status = "FAILED"
            try:
                results = evaluate_into_run(c, target.model_path, tracker, target.run_id, 0,
                                            force=bool(c.force))
                if any(not r.skipped and r.shared_with is None for r in results):
                    _log_base_cost(tracker, target.run_id, prices(c))
                status = "FINISHED"
            finally:
                tracker.finish(target.run_id, status)
        eval_runs[agent.name] = target.run_id
        final[agent.name] = {k: v for r in results for k, v in r.metrics.items()}
    return {"status": "FINISHED", "agent_run_ids": eval_runs, "teams": [{"final": final}],
            "job_run_id": None, "run_dir": None}


def _log_base_cost(tracker: Tracker, run_id: str, table: dict[str, Any]) -> None:
    """What a base model's evaluation cost (seconds, CPU, GPUs, peak memory) into its run: this
    process's since it started or its previous evaluation ended (a later evaluation of the same
    run replaces them)."""
    usage = take_usage()
    tracker.log_metrics(run_id, {M.WALL: usage.seconds, **usage.metrics(table),
                                 **peak_memory_metrics()}, 0)
    if tags := usage.tags():
        tracker.set_tags(run_id, tags)


def evaluate_finished(spec: JobSpec, tracker: Tracker, directory: Path,
                      job_run: str) -> dict[str, Any]:
    """A finished job asked for again: log the evaluations it lacks (e.g. another protocol)."""
    c = spec.cfg
    if not c.eval.at_end:
        return {}
    agent_runs = agent_runs_of(tracker, job_run)
    final: dict[str, dict[str, float]] = {}
    for agent in spec.agents:
        found = latest_checkpoint(directory, agent.name)
        model = str(found[1]) if found else agent.path
        step = found[0] if found else 0
        if agent.name in agent_runs:
            results = evaluate_into_run(c, model, tracker, agent_runs[agent.name], step)
            final[agent.name] = {k: v for r in results for k, v in r.metrics.items()}
    return {"job_run_id": job_run, "agent_run_ids": agent_runs, "teams": [{"final": final}]}
