"""One training job: teams of agents trained by `TeamLoop`, checkpointed, tracked in MLflow.

Layout of a job's run directory (`hacrl.core.layout.RunDir`, `<output_root>/runs/<hash>-<method>/`):
    config.yaml                  the resolved config
    team-<i>/ckpt/step_<t>/      the two newest checkpoints (`hacrl.checkpoint`)
    team-<i>/DONE.json           the team finished training and its final evaluation
Running the same command again resumes each team from its newest usable checkpoint; a finished
job is skipped unless `force=true`.

    assembly.py   `run_job`: puts the parts together (nothing else)
    agents.py     where the job writes, each agent's engine, the loop's settings
    listeners.py  what the job does with the loop's events: metrics, validation, checkpoints,
                  progress
    runs.py       the job's MLflow runs: tags, start, lookup, the order they end in
    finishing.py  final evaluation, DONE.json, repairing a job killed while finishing, and the
                  paths that train nothing (method=base, a finished job asked for again)
    lock.py       one trainer per job; SIGTERM as KILLED
    requeue.py    a SLURM job told to make way (USR2): stop at a step's end, requeue, resume
                  into the same runs
"""

from hacrl.job.agents import agent_engine, before_job, engine_context, job_dir
from hacrl.job.assembly import run_job
from hacrl.job.lock import evaluation_lock, job_lock, process_age_s

__all__ = ["agent_engine", "before_job", "engine_context", "job_dir", "evaluation_lock", "job_lock",
           "process_age_s", "run_job"]
