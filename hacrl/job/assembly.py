"""One training job, assembled: a lock, the store's runs, and per team an engine per agent, the
loop, and the listeners that act on its events. The parts are in this package's other modules;
this one only puts them together.
"""

from __future__ import annotations

import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from hacrl.checkpoint import team as checkpoint
from hacrl.config import AgentSpec, JobSpec
from hacrl.core import faults
from hacrl.core.errors import CheckpointError, StoreError, check_writable
from hacrl.core.eta import log_line
from hacrl.core.layout import RunDir, TeamDir
from hacrl.data.tasks import grader, load_problems, validation_problems
from hacrl.engines.memory import peak_memory_metrics
from hacrl.job import requeue
from hacrl.job.agents import agent_engine, before_job, job_dir, release_memory
from hacrl.job.finishing import (
    PHASES,
    evaluate_base,
    evaluate_final,
    evaluate_finished,
    evaluate_missing,
    evaluated_scores,
    finished,
    mark_done,
    repair,
)
from hacrl.job.listeners import (
    Checkpointing,
    DegenerateWarning,
    JobLog,
    Progress,
    Report,
    StepMetrics,
    Validation,
)
from hacrl.job.lock import (
    Terminated,
    job_lock,
    on_sigterm,
    process_age_s,
    raise_if_terminated,
)
from hacrl.job.runs import (
    carry_over,
    finish,
    finished_job_run,
    log_scores,
    previous_job_run,
    reopen_requeued,
    start_runs,
    system_metrics,
)
from hacrl.job.usage import log_job_cost, prices, take_usage
from hacrl.schema import metric_names as M
from hacrl.schema import tags as T
from hacrl.tracking import Tracker
from hacrl.tracking.mlflow_store import resolve_uri
from hacrl.training.events import Listener, Schedule, run_steps
from hacrl.training.loop import Agent, PromptSchedule, TeamLoop, seed_everything


def run_job(spec: JobSpec, progress: bool = True, report: Report | None = None) -> dict[str, Any]:
    """Train every team of the job; returns a summary (run ids, final metrics, phase times).

    `report` (a sweep cell's): the job's phase and step as they change, and readable lines on
    stdout instead of the progress bar (`JobLog`)."""
    startup_s = process_age_s()
    c = spec.cfg
    if (done := before_job(c)) is not None:
        return done
    if c.engine.get("threads"):
        torch.set_num_threads(int(c.engine.threads))
    layout = job_dir(spec)
    teams = [layout.team(i) for i in range(len(spec.teams))]
    check_writable(spec.output_root)
    tracker = Tracker(resolve_uri(c.tracking.uri, spec.output_root), c.tracking.experiment)
    if not spec.method.trains:
        tracker.reap_dead_runs(spec.config_hash)
        if report is not None:
            report({"phase": "evaluating"})
        return evaluate_base(spec, tracker)
    with job_lock(layout.path, spec.config_hash):
        # this process alone trains this job now: any run of it still RUNNING (on any host)
        # belongs to a process that died, e.g. on a lost node
        tracker.reap_config_runs(spec.config_hash)
        return _train_job(spec, tracker, layout, teams, startup_s,
                          progress and report is None, report)


def _train_job(spec: JobSpec, tracker: Tracker, layout: RunDir, teams: list[TeamDir],
               startup_s: float, progress: bool, report: Report | None) -> dict[str, Any]:
    c, directory = spec.cfg, layout.path
    steps = int(c.train.steps)
    if all(finished(t, steps, [a.name for a in team]) for t, team in zip(teams, spec.teams,
                                                                         strict=True)) \
            and not c.force:
        if done_run := finished_job_run(tracker, spec):
            print(f"hacrl: job {spec.config_hash} already finished ({directory}); force=true "
                  "re-trains", file=sys.stderr)
            return {"skipped": True, "run_dir": str(directory),
                    **evaluate_finished(spec, tracker, directory, done_run)}
        if (repaired := repair(spec, tracker, directory, teams)) is not None:
            return repaired
        # no earlier run to complete (e.g. a new store): new runs, evaluated from the checkpoints
    if c.force:
        shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)
    layout.config.write_text(OmegaConf.to_yaml(c))
    if not c.force and (reopened := reopen_requeued(spec, tracker)) is not None:
        # back from a SLURM requeue: the same runs carry on from the checkpoint they stopped at
        job_run, agent_runs = reopened
        previous = None
    else:
        job_run, agent_runs = start_runs(spec, tracker, directory)
        tracker.log_artifact(job_run, layout.config)
        layout.checkpoint_location.write_text(f"{directory}\n")
        tracker.log_artifact(job_run, layout.checkpoint_location)
        previous = previous_job_run(tracker, spec, job_run)

    handler_before = signal.signal(signal.SIGTERM, on_sigterm)
    status = "FAILED"
    team_results: list[dict] = []
    summary: dict[str, Any] = {"job_run_id": job_run, "agent_run_ids": agent_runs,
                               "run_dir": str(directory), "teams": team_results}
    started = time.perf_counter()
    phases = dict.fromkeys(PHASES, 0.0)
    monitor = system_metrics(c, tracker, job_run)
    try:
        with tqdm(total=steps * len(teams), disable=not progress, desc=spec.method.name,
                  unit="step", dynamic_ncols=True, file=sys.stderr) as bar:
            for team_agents, team in zip(spec.teams, teams, strict=True):
                result = _run_team(spec, team_agents, team, tracker, agent_runs, previous, bar,
                                   report)
                team_results.append(result)
                for phase in PHASES:
                    phases[phase] += float(result.get(phase, 0.0))
        usage = take_usage()
        tracker.log_metrics(job_run, {M.WALL: time.perf_counter() - started,
                                      M.STARTUP: startup_s,
                                      **{M.seconds(k): v for k, v in phases.items()},
                                      M.TRACKING: tracker.busy_s,
                                      **peak_memory_metrics()}, step=steps)
        summary["cost"] = log_job_cost(tracker, job_run, agent_runs, usage, prices(c), steps)
        log_scores(tracker, job_run, {m: v for r in team_results
                                      for m, v in (r.get("final") or {}).items()}, steps)
        faults.point("job_metrics")
        raise_if_terminated()  # a SIGTERM swallowed on the way still ends the job as killed
        status = "FINISHED"
    except (KeyboardInterrupt, Terminated):
        status = "KILLED"
        raise
    except requeue.Requeued:
        status = "KILLED"  # for now: the requeued job reopens these runs
        tracker.set_tags(job_run, {T.REQUEUED: "1"})
        raise
    finally:
        if monitor is not None:
            monitor.finish()
        if status != "KILLED":  # once killed, a repeated SIGTERM stays ignored (on_sigterm)
            signal.signal(signal.SIGTERM, handler_before)
        try:
            finish(tracker, list(agent_runs.values()), job_run, status)
        except StoreError:
            if status == "FINISHED":
                raise
            # the store is gone (a stopped server): the error on its way out says so; the runs
            # stay RUNNING with this process's pid, and the next command marks them KILLED
    summary["status"] = status
    summary.update(phases, tracking_s=tracker.busy_s, startup_s=startup_s)
    return summary


def _run_team(spec: JobSpec, team: tuple[AgentSpec, ...], team_dir: TeamDir, tracker: Tracker,
              agent_runs: dict[str, str], previous: dict[str, str] | None, bar: Any,
              report: Report | None = None) -> dict:
    """Train one team from its last checkpoint, evaluate it, mark it done."""
    c = spec.cfg
    steps = int(c.train.steps)
    if (record := finished(team_dir, steps, [a.name for a in team])) is not None:
        # finished by an earlier run of this job: carry its curves and evaluations into this
        # run's agent runs, and evaluate what they still lack
        own = {a.name: agent_runs[a.name] for a in team}
        for a in team:
            if previous and a.name in previous:
                carry_over(tracker, previous, a.name, agent_runs[a.name], steps, evaluations=True)
        if c.eval.at_end:
            evaluate_missing(spec, tracker, team_dir.path.parent, own)
        bar.update(steps)
        return {**record, "final": evaluated_scores(tracker, own) if c.eval.at_end else {}}
    setup_start = time.perf_counter()
    seed_everything(int(c.seed))
    agents = [Agent(a.name, agent_engine(spec, a, i, len(team), team_dir.path))
              for i, a in enumerate(team)]
    grade = grader(c)
    loop = TeamLoop(agents, spec.method, spec.settings,
                    PromptSchedule(load_problems(c, c.task.train_split), c.train.prompts_per_step,
                                   int(c.seed)), grade)
    start = _resume(team_dir, agents, loop)
    if start:
        for agent in agents:
            carry_over(tracker, previous, agent.name, agent_runs[agent.name], start)
    val_every = int(c.validation.every)
    validation = Validation(agents, validation_problems(c) if val_every else [],
                            str(c.validation.benchmark), c.task.prompt_template,
                            int(c.validation.max_new_tokens), grade, tracker, agent_runs)
    metrics = StepMetrics(tracker, agent_runs, [a.name for a in agents])
    setup_s = time.perf_counter() - setup_start
    listeners: list[Listener] = [metrics, Progress(bar, [a.name for a in agents]), validation,
                                 DegenerateWarning([a.name for a in agents])]
    if report is not None:
        team_name = f"team {team_dir.path.name}: " if len(spec.teams) > 1 else ""
        listeners.append(JobLog([a.name for a in agents], steps, validation, report, team_name))
    with requeue.steps_stop_at_their_end():
        last = run_steps(loop.step, start, Schedule(steps, val_every, int(c.train.save_every)),
                         # last, after every event: a SIGTERM whose exception was swallowed
                         # ends it here
                         [*listeners, Checkpointing(team_dir, agents, loop),
                          lambda event: raise_if_terminated()],
                         stop=requeue.requested)
    if last < steps or requeue.requested():  # a SLURM requeue: checkpointed at `last`
        raise requeue.Requeued(last)
    validation_s = validation.seconds
    # (validation before the first step is subtracted too, as it always was: Table 7's train_s)
    train_s = time.perf_counter() - metrics.started - validation_s

    final: dict[str, dict[str, float]] = {}
    eval_start = time.perf_counter()
    names = [a.name for a in agents]
    if c.eval.at_end:
        # free the training engines first: evaluation loads each final checkpoint itself
        # (on GPUs, vLLM needs the memory)
        for agent in agents:
            agent.engine.close()
        del loop, agents, validation, metrics, listeners
        release_memory()
        if report is not None:
            report({"phase": "evaluating"})
            log_line(f"evaluating {', '.join(names)}")
        final = evaluate_final(spec, tracker, team_dir, {a.name: a.path for a in team}, agent_runs)
    # seconds of this process (not of an earlier, resumed one): for the overhead benchmark
    phases = {"setup_s": setup_s, "validation_s": validation_s,
              "train_s": train_s, "eval_s": time.perf_counter() - eval_start,
              "wall_s": time.perf_counter() - setup_start}
    record = {"agents": names, "steps": steps, "final": final, "phases": phases}
    mark_done(team_dir, record)
    return {**record, **phases}


def _resume(team_dir: TeamDir, agents: list[Agent], loop: TeamLoop) -> int:
    """Load the team's newest usable checkpoint; the step it stands at (0: none)."""

    def load(folder: Path) -> None:
        checkpoint.check_team(folder, [a.name for a in agents])
        state = checkpoint.load_state(folder)
        try:  # the loop's state first: a state of another team loads no weights
            loop.load_state_dict(state)
        except (KeyError, ValueError, TypeError, IndexError, RuntimeError) as err:
            raise CheckpointError(f"{folder / checkpoint.STATE_FILE} does not fit this team "
                                  f"({type(err).__name__}: {err})") from None
        for agent in agents:
            agent.engine.load(folder / agent.name)

    latest = checkpoint.restore(team_dir.ckpt, load)
    return latest[0] if latest is not None else 0
