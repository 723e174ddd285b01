"""One training job: teams of agents trained by `TeamLoop`, checkpointed, tracked in MLflow.

Layout of a job's run directory (`<output_root>/runs/<config_hash>-<method>/`):
    config.yaml                  the resolved config
    team-<i>/ckpt/step_<t>/      the two newest checkpoints (`hacrl.checkpoint`)
    team-<i>/DONE.json           the team finished training and its final evaluation
Running the same command again resumes each team from its newest usable checkpoint; a finished
job is skipped unless `force=true`.

Finishing is ordered so that a kill at any instant leaves a state the next run repairs
(`hacrl.faults.FINISHING` names the points a test kills at): final checkpoint, final evaluation
(into the agent runs), DONE.json, the job's time metrics, agent runs FINISHED, job run FINISHED.
A rerun that finds every DONE.json but no FINISHED job run completes the killed runs in place
(`_repair`) instead of training again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from hacrl import checkpoint, faults
from hacrl.config import AgentSpec, JobSpec
from hacrl.engines.base import EngineContext, engine_hook, make_engine
from hacrl.errors import HacrlError, check_writable
from hacrl.evaluation.greedy import greedy_accuracy
from hacrl.evaluation.runner import evaluate_into_run
from hacrl.layout import Layout, RunDir, TeamDir
from hacrl.loop import Agent, PromptSchedule, TeamLoop, seed_everything
from hacrl.mlflow_store import resolve_uri
from hacrl.schema import metrics as M
from hacrl.schema import tags as T
from hacrl.settings import LoopSettings, method_settings
from hacrl.tasks import grader, load_problems
from hacrl.telemetry import peak_memory_metrics
from hacrl.tracking import Tracker, flatten


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_dir(spec: JobSpec) -> Path:
    return job_dir(spec).path


def job_dir(spec: JobSpec) -> RunDir:
    return Layout(spec.output_root).run(spec.config_hash, spec.method.name)


def finished(team: TeamDir, steps: int) -> dict[str, Any] | None:
    """The team's DONE.json record if it is whole and for `steps` steps; else None (with a
    warning when a file is there but unusable: the team then counts as not done)."""
    return checkpoint.read_done(team.done, steps)


def _settings(spec: JobSpec) -> LoopSettings:
    """The loop's settings: `method_settings`, whose loss settings are `spec.loss`."""
    return replace(method_settings(spec.cfg, spec.method), loss=spec.loss)


def engine_context(spec: JobSpec, agent: AgentSpec, index: int, team_size: int,
                   root: Path) -> EngineContext:
    """What the engine of agent `index` of a team of `team_size` gets to know about the job."""
    c, method = spec.cfg, spec.method
    group = method.group_size(c.train.rollouts_per_prompt)
    minibatch = method.update_prompts(c.train.minibatch_prompts)
    rows = int(c.train.prompts_per_step) * group * method.row_sources(team_size)
    return EngineContext(cfg=c, agent_name=agent.name, agent_index=index, n_agents=team_size,
                         loss=spec.loss, group_size=group, minibatch_prompts=minibatch,
                         run_dir=root, updates_per_step=-(-rows // (minibatch * group)))


def _engine(spec: JobSpec, agent: AgentSpec, index: int, team_size: int, root: Path) -> Any:
    c = spec.cfg
    context = engine_context(spec, agent, index, team_size, root)
    return make_engine(c.engine.name, model_path=agent.path, lr=float(c.train.lr),
                       betas=tuple(c.train.betas), weight_decay=float(c.train.weight_decay),
                       grad_clip=float(c.train.grad_clip), device=c.engine.device,
                       dtype=c.engine.dtype, reference=context.loss.kl_coef > 0,
                       temperature=float(c.rollout.temperature),
                       micro_batch_rows=c.train.micro_batch_rows, chunk_rows=c.engine.chunk_rows,
                       context=context)


class _Terminated(BaseException):
    """SIGTERM (e.g. a scheduler's kill) becomes an exception so runs end as KILLED."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated()


def process_age_s() -> float:
    """Seconds since this process started (interpreter start, imports, compose, launch)."""
    import psutil

    return max(0.0, time.time() - psutil.Process().create_time())


def before_job(cfg: Any) -> dict[str, Any] | None:
    """The engine's say before a job starts: a summary means "this process does not train"
    (a worker node of a multi-node verl job serves Ray and ends with the cluster)."""
    hook = engine_hook(str(cfg.engine.name), "before_job")
    return hook(cfg) if hook is not None else None


PHASES = ("setup_s", "validation_s", "train_s", "eval_s")  # the job's own work, per team


def run_job(spec: JobSpec, progress: bool = True) -> dict[str, Any]:
    """Train every team of the job; returns a summary (run ids, final metrics, phase times)."""
    startup_s = process_age_s()
    c = spec.cfg
    if (done := before_job(c)) is not None:
        return done
    if c.engine.get("threads"):
        torch.set_num_threads(int(c.engine.threads))
    layout = job_dir(spec)
    directory = layout.path
    teams = [layout.team(i) for i in range(len(spec.teams))]
    check_writable(spec.output_root)
    tracker = Tracker(resolve_uri(c.tracking.uri, spec.output_root), c.tracking.experiment)
    if not spec.method.trains:
        tracker.reap_dead_runs(spec.config_hash)
        return _evaluate_base(spec, tracker)
    with job_lock(directory, spec.config_hash):
        # this process alone trains this job now: any run of it still RUNNING (on any host)
        # belongs to a process that died, e.g. on a lost node
        reaped = tracker.reap_config_runs(spec.config_hash)
        return _train_job(spec, tracker, directory, teams, startup_s, reaped, progress)


@contextlib.contextmanager
def job_lock(directory: Path, config_hash: str) -> Iterator[None]:
    """An exclusive lock on the job for the life of this process's work on it (flock: released
    when the process ends, however it ends; on NFS when the lost client's lease expires), so
    two processes never train into one run directory, whatever a sweep's state files say."""
    path = RunDir(directory).lock
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise HacrlError(f"job {config_hash} is being trained by {holder} (it holds "
                             f"{path}); wait for it to end or stop it") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        yield
    finally:
        os.close(fd)


def _train_job(spec: JobSpec, tracker: Tracker, directory: Path, teams: list[TeamDir],
               startup_s: float, reaped: list[str], progress: bool) -> dict[str, Any]:
    c = spec.cfg
    steps = int(c.train.steps)
    if all(finished(t, steps) for t in teams) and not c.force:
        if done_run := _finished_job_run(tracker, spec):
            print(f"hacrl: job {spec.config_hash} already finished ({directory}); force=true "
                  "re-trains", file=sys.stderr)
            return {"skipped": True, "run_dir": str(directory),
                    **_evaluate_finished(spec, tracker, directory, done_run)}
        if (repaired := _repair(spec, tracker, directory, teams)) is not None:
            return repaired
        # no earlier run to complete (e.g. a new store): new runs, evaluated from the checkpoints
    if c.force:
        shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)
    RunDir(directory).config.write_text(OmegaConf.to_yaml(c))

    tags = {**_identity_tags(spec), T.RUN_DIR: str(directory), T.KIND: T.JOB}
    params = flatten(OmegaConf.to_container(c, resolve=True))  # type: ignore[arg-type]
    job_run = tracker.start_run(f"{spec.method.name}:{tags[T.PAIR]}:s{c.seed}", tags, params)
    agent_runs = {a.name: tracker.start_run(a.name, {**tags, T.MODEL: a.name, T.KIND: T.AGENT},
                                            params, parent_run_id=job_run)
                  for a in spec.agents}
    tracker.log_artifact(job_run, RunDir(directory).config)
    (directory / "checkpoint_location.txt").write_text(f"{directory}\n")
    tracker.log_artifact(job_run, directory / "checkpoint_location.txt")
    previous = _previous_job_run(tracker, spec, job_run, reaped)

    signal.signal(signal.SIGTERM, _on_sigterm)
    status = "FAILED"
    team_results: list[dict] = []
    summary: dict[str, Any] = {"job_run_id": job_run, "agent_run_ids": agent_runs,
                               "run_dir": str(directory), "teams": team_results}
    started = time.perf_counter()
    phases = dict.fromkeys(PHASES, 0.0)
    try:
        total = int(c.train.steps) * len(teams)
        with tqdm(total=total, disable=not progress, desc=spec.method.name, unit="step",
                  dynamic_ncols=True, file=sys.stderr) as bar:
            for team_agents, paths in zip(spec.teams, teams, strict=True):
                result = _run_team(spec, team_agents, paths, tracker, agent_runs, previous, bar)
                team_results.append(result)
                for phase in PHASES:
                    phases[phase] += float(result.get(phase, 0.0))
        tracker.log_metrics(job_run, {M.WALL: time.perf_counter() - started,
                                      M.STARTUP: startup_s,
                                      **{M.seconds(k): v for k, v in phases.items()},
                                      M.TRACKING: tracker.busy_s,
                                      **peak_memory_metrics()}, step=int(c.train.steps))
        faults.point("job_metrics")
        status = "FINISHED"
    except (KeyboardInterrupt, _Terminated):
        status = "KILLED"
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _finish(tracker, list(agent_runs.values()), job_run, status)
    summary["status"] = status
    summary.update(phases, tracking_s=tracker.busy_s, startup_s=startup_s)
    return summary


def _finish(tracker: Tracker, agent_runs: list[str], job_run: str, status: str) -> None:
    """Agent runs first, the job run last: a FINISHED job run means the whole job is in."""
    for run_id in agent_runs:
        tracker.finish(run_id, status)
    faults.point("agent_runs_finished")
    tracker.finish(job_run, status)
    faults.point("job_run_finished")


def _finished_job_run(tracker: Tracker, spec: JobSpec) -> str | None:
    runs = tracker.find_runs(T.where({T.CONFIG_HASH: spec.config_hash, T.KIND: T.JOB}, "FINISHED"))
    return runs[0].info.run_id if runs else None


def _repair(spec: JobSpec, tracker: Tracker, directory: Path,
            teams: list[TeamDir]) -> dict[str, Any] | None:
    """Every team is done but no job run FINISHED: the job was killed while finishing. Complete
    its newest unfinished runs in place: evaluations it lacks, its time metrics, FINISHED.
    None when there is no such run (or it lacks an agent run): the caller starts new runs."""
    c, steps = spec.cfg, int(spec.cfg.train.steps)
    # the newest run of the job (RUNNING ones were reaped: this process holds the job's lock)
    runs = tracker.find_runs(T.where({T.CONFIG_HASH: spec.config_hash, T.KIND: T.JOB}))[:1]
    runs = [r for r in runs if r.info.status in ("KILLED", "FAILED")]
    if not runs:
        return None
    job_run = runs[0].info.run_id
    agent_runs = _agent_runs(tracker, job_run)
    if any(a.name not in agent_runs for a in spec.agents):
        return None
    print(f"hacrl: job {spec.config_hash} was killed while finishing; completing its runs "
          f"(job run {job_run})", file=sys.stderr, flush=True)
    records = [finished(t, steps) or {} for t in teams]
    if c.eval.at_end:
        _evaluate_missing(spec, tracker, directory, agent_runs)
    if M.WALL not in runs[0].data.metrics:
        phases = {k: sum(float(r.get("phases", {}).get(k, 0.0)) for r in records)
                  for k in (*PHASES, "wall_s")}
        tracker.log_metrics(job_run, {M.seconds(k): v for k, v in phases.items()}, steps)
    _finish(tracker, list(agent_runs.values()), job_run, "FINISHED")
    return {"job_run_id": job_run, "agent_run_ids": agent_runs, "run_dir": str(directory),
            "teams": records, "status": "FINISHED", "repaired": True}


def _evaluate_missing(spec: JobSpec, tracker: Tracker, directory: Path,
                      agent_runs: dict[str, str]) -> None:
    """Log the final evaluations an agent run lacks (protocols already logged are skipped)."""
    from hacrl.evaluation.runner import latest_checkpoint

    for agent in spec.agents:
        if agent.name not in agent_runs:
            continue  # an agent of another team
        found = latest_checkpoint(directory, agent.name)
        model, step = (str(found[1]), found[0]) if found else (agent.path, 0)
        evaluate_into_run(spec.cfg, model, tracker, agent_runs[agent.name], step)


def _agent_runs(tracker: Tracker, job_run: str) -> dict[str, str]:
    """model name -> run id of a job run's agent runs."""
    return {ch.data.tags.get(T.MODEL, ""): ch.info.run_id
            for ch in tracker.find_runs(T.where({T.PARENT: job_run}))}


def _identity_tags(spec: JobSpec) -> dict[str, str]:
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


def _evaluate_base(spec: JobSpec, tracker: Tracker) -> dict[str, Any]:
    """method=base: evaluate each agent as it is, into its own evaluation run."""
    from hacrl.evaluation.runner import target_from_model

    c = spec.cfg
    eval_runs: dict[str, str] = {}
    final: dict[str, dict[str, float]] = {}
    for agent in spec.agents:
        target = target_from_model(tracker, c, agent.name, agent.path)
        tracker.set_tags(target.run_id, {k: v for k, v in _identity_tags(spec).items()
                                         if k in (T.CELL, T.SWEEPS)})
        status = "FAILED"
        try:
            results = evaluate_into_run(c, target.model_path, tracker, target.run_id, 0,
                                        force=bool(c.force))
            status = "FINISHED"
        finally:
            tracker.finish(target.run_id, status)
        eval_runs[agent.name] = target.run_id
        final[agent.name] = {k: v for r in results for k, v in r.metrics.items()}
    return {"status": "FINISHED", "agent_run_ids": eval_runs, "teams": [{"final": final}],
            "job_run_id": None, "run_dir": None}


def _evaluate_finished(spec: JobSpec, tracker: Tracker, directory: Path,
                       job_run: str) -> dict[str, Any]:
    """A finished job asked for again: log the evaluations it lacks (e.g. another protocol)."""
    from hacrl.evaluation.runner import latest_checkpoint

    c = spec.cfg
    if not c.eval.at_end:
        return {}
    agent_runs = _agent_runs(tracker, job_run)
    final: dict[str, dict[str, float]] = {}
    for agent in spec.agents:
        found = latest_checkpoint(directory, agent.name)
        model = str(found[1]) if found else agent.path
        step = found[0] if found else 0
        if agent.name in agent_runs:
            results = evaluate_into_run(c, model, tracker, agent_runs[agent.name], step)
            final[agent.name] = {k: v for r in results for k, v in r.metrics.items()}
    return {"job_run_id": job_run, "agent_run_ids": agent_runs, "teams": [{"final": final}]}


def _previous_job_run(tracker: Tracker, spec: JobSpec, current: str,
                      reaped: list[str]) -> dict[str, str] | None:
    """The latest earlier job run of this config that did not finish, with its agents' runs."""
    runs = tracker.find_runs(T.where({T.CONFIG_HASH: spec.config_hash, T.KIND: T.JOB}))
    for run in runs:
        if run.info.run_id != current and run.info.status in ("KILLED", "FAILED"):
            return {"job": run.info.run_id, **_agent_runs(tracker, run.info.run_id)}
    return None


def _run_team(spec: JobSpec, team: tuple[AgentSpec, ...], paths: TeamDir, tracker: Tracker,
              agent_runs: dict[str, str], previous: dict[str, str] | None, bar: tqdm) -> dict:
    c = spec.cfg
    steps = int(c.train.steps)
    if (record := finished(paths, steps)) is not None:
        # finished by an earlier run of this job: carry its curves and evaluations into this
        # run's agent runs, and evaluate what they still lack
        for a in team:
            if previous and a.name in previous:
                tracker.set_tags(agent_runs[a.name], {T.RESUMED_AT_STEP: str(steps)})
                tracker.copy_history(previous[a.name], agent_runs[a.name], steps)
                tracker.copy_eval_tags(previous[a.name], agent_runs[a.name])
        if c.eval.at_end:
            _evaluate_missing(spec, tracker, paths.path.parent,
                              {a.name: agent_runs[a.name] for a in team})
        bar.update(steps)
        return record
    setup_start = time.perf_counter()
    seed_everything(int(c.seed))
    agents = [Agent(a.name, _engine(spec, a, i, len(team), paths.path))
              for i, a in enumerate(team)]
    grade = grader(c)
    loop = TeamLoop(agents, spec.method, _settings(spec),
                    PromptSchedule(load_problems(c, c.task.train_split), c.train.prompts_per_step,
                                   int(c.seed)), grade)
    start = 0

    def load(folder: Path) -> None:
        for agent in agents:
            agent.engine.load(folder / agent.name)
        loop.load_state_dict(checkpoint.load_state(folder))

    latest = checkpoint.restore(paths.ckpt, load)
    if latest is not None:
        start, _ = latest
        for agent in agents:
            tracker.set_tags(agent_runs[agent.name], {T.RESUMED_AT_STEP: str(start)})
            if previous and agent.name in previous:
                tracker.copy_history(previous[agent.name], agent_runs[agent.name], start)
        bar.update(start)

    val_every = int(c.validation.every)
    val_problems = load_problems(c, c.validation.benchmark) if val_every else []
    setup_s = time.perf_counter() - setup_start
    validation_s = 0.0

    def validate(step: int) -> None:
        nonlocal validation_s
        tic = time.perf_counter()
        for agent in agents:
            acc = greedy_accuracy(agent.engine, val_problems, c.task.prompt_template,
                                  int(c.validation.max_new_tokens), grade)
            tracker.log_metrics(agent_runs[agent.name], {M.validation(str(c.validation.benchmark)): acc}, step)
        validation_s += time.perf_counter() - tic

    if val_every and start == 0:
        validate(0)
    job_start = time.perf_counter()
    for step in range(start + 1, steps + 1):
        result = loop.step(step)
        for agent, metrics in zip(agents, result.agent_metrics, strict=True):
            metrics.update(result.team_metrics)
            metrics[M.WALL] = time.perf_counter() - job_start
            tracker.log_metrics(agent_runs[agent.name], metrics, step)
        if val_every and (step % val_every == 0 or step == steps):
            validate(step)
        if step % int(c.train.save_every) == 0 or step == steps:
            _save_checkpoint(paths, step, agents, loop)
            if step == steps:
                faults.point("final_checkpoint")
        bar.set_postfix_str(" ".join(f"{a.name}={m['reward/mean']:.2f}"
                                     for a, m in zip(agents, result.agent_metrics, strict=True)))
        bar.update(1)
    train_s = time.perf_counter() - job_start - validation_s

    final: dict[str, dict[str, float]] = {}
    eval_start = time.perf_counter()
    if c.eval.at_end:
        # free the training engines first: evaluation loads each final checkpoint itself
        # (on GPUs, vLLM needs the memory)
        names = [a.name for a in agents]
        fallback = {a.name: a.path for a in team}
        for agent in agents:
            agent.engine.close()
        del loop, agents
        _release_memory()
        for name in names:
            ckpt = checkpoint.agent_weights(checkpoint.step_dir(paths.ckpt, steps), name)
            model = str(ckpt) if (ckpt / "config.json").is_file() else fallback[name]
            final[name] = {k: v for r in evaluate_into_run(c, model, tracker, agent_runs[name],
                                                             steps, force=True)
                           for k, v in r.metrics.items()}
        agents_done = names
        faults.point("final_eval")
    else:
        agents_done = [a.name for a in agents]
    # seconds of this process (not of an earlier, resumed one): for the overhead benchmark
    phases = {"setup_s": setup_s, "validation_s": validation_s, "train_s": train_s,
              "eval_s": time.perf_counter() - eval_start,
              "wall_s": time.perf_counter() - setup_start}
    result_json = {"agents": agents_done, "steps": steps, "final": final, "phases": phases}
    paths.path.mkdir(parents=True, exist_ok=True)  # steps=0 (evaluation only) saved nothing yet
    write_atomic(paths.done, json.dumps(result_json, indent=1))
    faults.point("done_json")
    return {**result_json, **phases}


def _release_memory() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _save_checkpoint(paths: TeamDir, step: int, agents: list[Agent], loop: TeamLoop) -> None:
    def save_agents(folder: Path) -> None:
        for agent in agents:
            agent.engine.save(folder / agent.name)

    checkpoint.save(paths.ckpt, step, save_agents, loop.state_dict())


def write_atomic(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
