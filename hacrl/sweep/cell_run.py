"""The job side of a sweep cell: run it and keep its state file current.

Called by `hacrl.train` when a multirun job carries `cell.id`. The state file says whether the
cell runs (pid, host, log), finished or failed (with the error's first line), and how long the
job itself took, so `hacrl status` can show it from any shell.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from hacrl.core.eta import log_line
from hacrl.core.fileio import write_json
from hacrl.job import requeue
from hacrl.job.lock import Terminated, on_sigterm
from hacrl.schema import metric_names as M
from hacrl.sweep.state import HEARTBEAT_S, cell_state_path, read_json
from hacrl.sweep.warm import LOG_ENV
from hacrl.tracking import process_token


def slurm_job() -> dict[str, str]:
    """The SLURM job this cell runs in (`hacrl status` asks squeue about a requeued one)."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return {}
    if os.environ.get("SLURM_ARRAY_JOB_ID"):
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}"
    return {"slurm_job": job}


def _log_path() -> str:
    if os.environ.get(LOG_ENV):  # a warm cell: its log is next to its state
        return os.environ[LOG_ENV]
    try:
        import submitit

        env = submitit.JobEnvironment()
        return str(env.paths.stdout).replace("%t", "0")
    except Exception:  # not under submitit (e.g. Hydra's basic launcher)
        return ""


class Heartbeat:
    """Rewrites the cell's running state every HEARTBEAT_S seconds (a daemon thread), so that a
    sweep on any host can tell a live job from one whose node, memory or time ran out."""

    def __init__(self, path: Path, state: dict[str, Any]) -> None:
        self.path, self.state = path, state
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._beat, name="hacrl-heartbeat", daemon=True)
        self._written = 0.0

    def __enter__(self) -> Heartbeat:
        self.write(self.state)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:  # a beat being written finishes first; none starts after
            self._stop.set()
        self._thread.join()

    def write(self, state: dict[str, Any]) -> None:
        with self._lock:
            write_json(self.path, {**state, "heartbeat": time.time()})
            self._written = time.time()

    def update(self, fields: dict[str, Any]) -> None:
        """The job's progress (phase, step) into the state: written at once when the phase
        changes, else at most once a second (a tiny step takes about one)."""
        with self._lock:  # the heartbeat thread copies the state under the same lock
            changed = fields.get("phase") != self.state.get("phase")
            self.state.update(fields)
        if changed or time.time() - self._written >= 1.0:
            self.write(self.state)

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with self._lock:
                if self._stop.is_set():
                    return
                try:
                    write_json(self.path, {**self.state, "heartbeat": time.time()})
                except OSError:  # a full or flaky disk: the next beat tries again
                    pass


def quiet_third_parties() -> None:
    """A cell's log holds its own lines: progress bars (lm-eval's, transformers' weight
    loading) and library warnings off. Only in the cell's process: it is its own process under
    every launcher (a warm fork, a submitit job, a SLURM task)."""
    import logging
    import warnings

    import tqdm.std

    plain_init = tqdm.std.tqdm.__init__
    if not getattr(plain_init, "hacrl_quiet", False):
        def quiet_init(self: Any, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            plain_init(self, *args, **kwargs)

        quiet_init.hacrl_quiet = True  # type: ignore[attr-defined]
        tqdm.std.tqdm.__init__ = quiet_init  # type: ignore[method-assign]
    warnings.filterwarnings("ignore")
    for noisy in ("transformers", "datasets", "lm_eval", "lm-eval", "httpx", "urllib3",
                  "torch", "mlflow", "alembic"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _overrides() -> list[str]:
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except Exception:  # not under Hydra (tests call run_cell directly)
        return []


def print_scores(summary: dict[str, Any]) -> None:
    """Each agent's final AVG and its benchmarks, one line per agent and protocol."""
    for team in summary.get("teams") or []:
        for agent, metrics in (team.get("final") or {}).items():
            by_protocol: dict[str, dict[str, float]] = {}
            for name, value in metrics.items():
                parsed = M.parse_eval(name)
                if parsed is not None and parsed[2] == "acc":
                    by_protocol.setdefault(parsed[0], {})[parsed[1]] = value
            for protocol, scores in by_protocol.items():
                avg = scores.pop("avg", None)
                head = f"AVG {avg:.3f}  " if avg is not None else ""
                log_line(f"{agent} ({protocol}): {head}"
                         + "  ".join(f"{b} {v:.3f}" for b, v in sorted(scores.items())))


def run_cell(cfg: DictConfig, sweep_dir: Path) -> dict[str, Any]:
    from hacrl.config import validate
    from hacrl.job import before_job, run_job

    if before_job(cfg) is not None:  # another node of this cell's job trains and keeps its state
        return {"cell": str(cfg.cell.id), "status": "ray worker node"}
    if requeue.install():  # a SLURM job: USR2 stops at a step's end, requeues, resumes
        signal.signal(signal.SIGTERM, on_sigterm)  # scancel: killed (after requeue's grace)
    started = time.time()
    path = cell_state_path(sweep_dir, str(cfg.cell.id))
    previous = read_json(path)
    state: dict[str, Any] = {"cell": str(cfg.cell.id), "status": "running", "pid": os.getpid(),
                             "pid_token": process_token(os.getpid()),
                             "host": socket.gethostname(), "log": _log_path(),
                             "started": started, "attempt": int(previous.get("attempt", 0)) + 1,
                             **slurm_job()}
    quiet_third_parties()
    log_line(f"cell {cfg.cell.id}: {' '.join(_overrides())}")
    error: BaseException | None = None
    with Heartbeat(path, state) as heartbeat:
        try:
            summary = run_job(validate(cfg), progress=False, report=heartbeat.update)
        except requeue.Requeued as err:
            # not an error: the state says where it stopped while SLURM holds the job
            final = {**state, "status": "requeued", "ended": time.time(),
                     "seconds": time.time() - started}
            error = err
        except BaseException as err:
            traceback.print_exc()  # into the cell's log, below its last progress line
            kind = "killed" if isinstance(err, KeyboardInterrupt | Terminated) else "failed"
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            final = {**state, "status": kind, "error": f"{type(err).__name__}: {first}",
                     "ended": time.time(), "seconds": time.time() - started}
            error = err
        else:
            run = summary.get("job_run_id") or ",".join(
                (summary.get("agent_run_ids") or {}).values())
            final = {**state, "status": "done", "run": run or "", "ended": time.time(),
                     "seconds": time.time() - started, "skipped": bool(summary.get("skipped")),
                     **{k: summary.get(k) for k in ("startup_s", "setup_s", "validation_s",
                                                    "train_s", "eval_s", "tracking_s")}}
    write_json(path, final)  # after the heartbeat stopped: it cannot overwrite this
    if isinstance(error, requeue.Requeued):
        log_line(f"requeued by SLURM ({requeue.reason()}): resumes from its checkpoint after "
                 f"step {error.step}" if error.step is not None else
                 f"requeued by SLURM ({requeue.reason()}): resumes from its newest checkpoint")
        try:
            requeue.hand_over()  # submitit requeues the job and exits
        except SystemExit:
            raise
        except BaseException as err:  # e.g. out of requeues (max_num_timeout)
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            write_json(path, {**final, "status": "failed", "error": f"not requeued: {first}"})
            raise
    if error is not None:
        log_line(f"{final['status']}: {final['error']}")
        raise error
    print_scores(summary)
    log_line(f"done in {final['seconds']:.0f} s; MLflow run(s) {final['run']}")
    return {"cell": str(cfg.cell.id), "status": "done", "run": final["run"]}
